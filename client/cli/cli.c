/* Helpers shared by the subcommands, and the common options' table. See cli.h and opt.h. */
#include "cli.h"

#include "err.h"
#include "opt.h"
#include "sluice.h"
#include "util/buf.h"
#include "util/json.h"
#include "util/lengths.h"
#include "util/num.h"

#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static int set_addr(void *field, const char *arg)
{
    if (!*arg)
        return -1;
    memcpy(field, &arg, sizeof(arg));
    return 0;
}

/* --timeout: seconds in (0, 86400], fractions allowed, into milliseconds (at least 1). */
static int set_timeout(void *field, const char *arg)
{
    char *end;
    double s;
    int64_t ms;

    errno = 0;
    s = strtod(arg, &end);
    if (errno || end == arg || *end || !(s > 0) || s > 86400)
        return -1;
    ms = (int64_t)(s * 1000.0);
    ms = ms ? ms : 1;
    memcpy(field, &ms, sizeof(ms));
    return 0;
}

const sl_cli_opt sl_cli_common_opts[] = {
    {"addr", SL_CLI_CALL, "HOST:PORT",
     "daemon address [SLUICE_ADDR] (default 127.0.0.1:7700), or replicas\n"
     "H1:P1,H2:P2,...: a call that finds one UNAVAILABLE goes on to the\n"
     "next, a stream (indices, batches, ckpt up/download) at its position",
     SL_CLI_AT(sl_cli, addr), .call = set_addr, .err = "must not be empty", .flags = SL_CLI_PLAIN},
    {"json", SL_CLI_FLAG, NULL, "print JSON instead of text", SL_CLI_AT(sl_cli, json)},
    {"timeout", SL_CLI_CALL, "SECONDS", "per-call deadline (default 10)",
     SL_CLI_AT(sl_cli, timeout_ms), .call = set_timeout,
     .err = "is not a number of seconds in (0, 86400]"},
    {"tls", SL_CLI_FLAG, NULL, "connect with TLS (implied by --tls-ca/--tls-cert)",
     SL_CLI_AT(sl_cli, tls)},
    {"tls-ca", SL_CLI_STR, "FILE", "PEM CA that signed the daemon's certificate [SLUICE_TLS_CA]",
     SL_CLI_AT(sl_cli, tls_ca)},
    {"tls-cert", SL_CLI_STR, "FILE", "PEM client certificate for mTLS [SLUICE_TLS_CERT]",
     SL_CLI_AT(sl_cli, tls_cert)},
    {"tls-key", SL_CLI_STR, "FILE", "PEM key of --tls-cert [SLUICE_TLS_KEY]",
     SL_CLI_AT(sl_cli, tls_key)},
    {"token-file", SL_CLI_STR, "FILE",
     "bearer token (first line of FILE) [SLUICE_TOKEN_FILE; or SLUICE_TOKEN]",
     SL_CLI_AT(sl_cli, token_file)},
    {"help", SL_CLI_HELP, NULL, "show this help", .letter = 'h'},
    SL_CLI_OPTS_END,
};

int sl_cli_fail(const char *cmd, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "sluice %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return SL_CLI_ERROR;
}

int sl_cli_call_fail(const sl_cli *cli, const char *cmd)
{
    return sl_cli_fail(cmd, "%s (daemon %s)", sl_client_error(), cli->addr);
}

int sl_cli_bad_opt(const char *cmd, int c, char **argv)
{
    const char *opt = argv[optind - 1], *sp = *cmd ? " " : "";

    if (c == ':')
        fprintf(stderr, "sluice%s%s: option '%s' needs a value\n", sp, cmd, opt);
    else
        fprintf(stderr, "sluice%s%s: unknown option '%s'\n", sp, cmd, opt);
    fprintf(stderr, "Try 'sluice%s%s --help'.\n", sp, cmd);
    return SL_CLI_USAGE;
}

/* The first line of the token file, without its newline. */
static int read_token(sl_cli *cli, const char *cmd)
{
    char line[1024];
    FILE *f = fopen(cli->token_file, "r");
    size_t n;

    if (!f)
        return sl_cli_fail(cmd, "cannot read token file %s: %s", cli->token_file, strerror(errno));
    if (!fgets(line, sizeof(line), f))
        line[0] = '\0';
    fclose(f);
    n = strcspn(line, "\r\n");
    line[n] = '\0';
    if (n == 0)
        return sl_cli_fail(cmd, "token file %s is empty", cli->token_file);
    free(cli->token);
    cli->token = strdup(line);
    memset(line, 0, sizeof(line));
    return cli->token ? 0 : SL_CLI_ERROR;
}

int sl_cli_connect(sl_client **out, sl_cli *cli, const char *cmd)
{
    sl_client_opts opts = SL_CLIENT_OPTS_INIT;
    int err;

    if (!!cli->tls_cert != !!cli->tls_key)
        return sl_cli_fail(cmd, "--tls-cert and --tls-key go together");
    if (cli->token_file && read_token(cli, cmd) != 0)
        return SL_CLI_ERROR;
    opts.timeout_ms = cli->timeout_ms;
    opts.tls = cli->tls;
    opts.tls_ca = cli->tls_ca;
    opts.tls_cert = cli->tls_cert;
    opts.tls_key = cli->tls_key;
    opts.token = cli->token;
    err = sl_client_connect(out, cli->addr, &opts);
    if (err)
        return sl_cli_fail(cmd, "cannot create a client for '%s': %s", cli->addr,
                           *sl_client_error() ? sl_client_error() : sl_strerror(err));
    return 0;
}

void sl_cli_json_str(FILE *f, const char *s)
{
    /* Escaped a piece at a time into stack memory: worst case 6 bytes per input byte. */
    char mem[6 * 256 + 1];
    size_t n = strlen(s);
    sl_buf b;

    sl_buf_init_fixed(&b, mem, sizeof(mem));
    fputc('"', f);
    for (size_t i = 0; i < n; i += 256) {
        sl_buf_setlen(&b, 0);
        sl_json_esc(&b, s + i, n - i < 256 ? n - i : 256);
        fwrite(b.p, 1, b.len, f);
    }
    fputc('"', f);
}

int sl_cli_mesh(const char *arg, uint32_t *dp, uint32_t *tp, uint32_t *cp, uint32_t *pp)
{
    uint64_t v[4];
    int err = sl_parse_u64_list(v, 4, arg, ',', 1, UINT32_MAX);

    if (err)
        return err;
    *dp = (uint32_t)v[0];
    *tp = (uint32_t)v[1];
    *cp = (uint32_t)v[2];
    *pp = (uint32_t)v[3];
    return 0;
}

int sl_cli_labels_read(uint32_t **out, size_t *n, FILE *f, int u32, const char *path,
                       const char *cmd)
{
    size_t cap = 0;
    char line[64];
    uint8_t b[4];

    *out = NULL;
    *n = 0;
    for (;;) {
        unsigned long long v;
        char *end;
        if (u32) {
            size_t got = fread(b, 1, 4, f);
            if (got == 0)
                break;
            if (got != 4)
                return sl_cli_fail(cmd,
                                   "%s: %zu bytes after label %zu (a u32 file holds "
                                   "4 bytes per label)",
                                   path, got, *n);
            v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
        } else {
            if (!fgets(line, sizeof(line), f))
                break;
            line[strcspn(line, "\r\n")] = '\0';
            errno = 0;
            v = strtoull(line, &end, 10);
            if (!line[0] || *end || errno || line[0] == '-' || v > UINT32_MAX)
                return sl_cli_fail(cmd, "%s:%zu: '%s' is not a class id", path, *n + 1, line);
        }
        if (*n == SL_LENGTHS_MAX)
            return sl_cli_fail(cmd, "%s: more than %zu labels", path, SL_LENGTHS_MAX);
        if (*n == cap) {
            size_t ncap = cap ? 2 * cap : 4096;
            uint32_t *nv = realloc(*out, ncap * sizeof(*nv));
            if (!nv)
                return sl_cli_fail(cmd, "out of memory");
            *out = nv;
            cap = ncap;
        }
        (*out)[(*n)++] = (uint32_t)v;
    }
    return ferror(f) ? sl_cli_fail(cmd, "%s: read error", path) : 0;
}
