/* sluice: the command-line client. */
#include "cli.h"

#include "err.h"
#include "sluice.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct command {
    const char *name;
    int (*run)(sl_cli *cli, int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"health", cmd_health, "check the daemon's health (grpc.health.v1)"},
    {"info", cmd_info, "show the daemon's version, uptime, data dir and schema version"},
    {"sample", cmd_sample, "list a rank's sample indices for an epoch (local, no daemon)"},
    {"batch", cmd_batch, "plan token-budget batches from sequence lengths (local, no daemon)"},
    {"ckpt", cmd_ckpt, "checkpoint shards: begin, upload, commit, verify, ls, download, ..."},
    {"dataset", cmd_dataset, "datasets on the daemon: create, lengths, ls, show, rm"},
    {"job", cmd_job, "training jobs: create, ls, show, rm, resize"},
    {"epoch", cmd_epoch, "a job's epoch and per-rank progress: show, next, report"},
    {"indices", cmd_indices, "stream a rank's sample indices from the daemon"},
    {"batches", cmd_batches, "stream a rank's token-budget batches from the daemon"},
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *f)
{
    fprintf(f, "Usage: sluice [--addr HOST:PORT] [--json] [--timeout SECONDS] <command> [options]\n"
               "\n"
               "Commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nOptions:\n" SL_CLI_COMMON_HELP "  -V, --version      print the version\n"
               "\n'sluice <command> --help' describes a command. Exit codes: 0 ok, 1 error, "
               "2 usage.\n");
}

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

int sl_cli_bad_opt(const char *cmd, int c, char **argv)
{
    const char *opt = argv[optind - 1];

    if (c == ':')
        fprintf(stderr, "sluice %s: option '%s' needs a value\n", cmd, opt);
    else
        fprintf(stderr, "sluice %s: unknown option '%s'\n", cmd, opt);
    fprintf(stderr, "Try 'sluice %s --help'.\n", cmd);
    return SL_CLI_USAGE;
}

int sl_cli_common_opt(sl_cli *cli, const char *cmd, int c, const char *arg)
{
    char *end;
    double s;

    switch (c) {
    case SL_CLI_OPT_ADDR:
        if (!*arg) {
            fprintf(stderr, "sluice %s: --addr must not be empty\n", cmd);
            return SL_CLI_USAGE;
        }
        cli->addr = arg;
        return 0;
    case SL_CLI_OPT_JSON:
        cli->json = 1;
        return 0;
    case SL_CLI_OPT_TLS:
        cli->tls = 1;
        return 0;
    case SL_CLI_OPT_TLS_CA:
        cli->tls_ca = arg;
        return 0;
    case SL_CLI_OPT_TLS_CERT:
        cli->tls_cert = arg;
        return 0;
    case SL_CLI_OPT_TLS_KEY:
        cli->tls_key = arg;
        return 0;
    case SL_CLI_OPT_TOKEN_FILE:
        cli->token_file = arg;
        return 0;
    case SL_CLI_OPT_TIMEOUT:
        errno = 0;
        s = strtod(arg, &end);
        if (errno || end == arg || *end || !(s > 0) || s > 86400) {
            fprintf(stderr, "sluice %s: --timeout '%s' is not a number of seconds in (0, 86400]\n",
                    cmd, arg);
            return SL_CLI_USAGE;
        }
        cli->timeout_ms = (int64_t)(s * 1000.0);
        if (cli->timeout_ms == 0)
            cli->timeout_ms = 1;
        return 0;
    default:
        return 1;
    }
}

/* The first line of the token file, without its newline. */
static int read_token(sl_cli *cli, const char *cmd)
{
    char line[1024];
    FILE *f = fopen(cli->token_file, "r");
    size_t n;

    if (!f) {
        sl_cli_fail(cmd, "cannot read token file %s: %s", cli->token_file, strerror(errno));
        return SL_CLI_ERROR;
    }
    if (!fgets(line, sizeof(line), f))
        line[0] = '\0';
    fclose(f);
    n = strcspn(line, "\r\n");
    line[n] = '\0';
    if (n == 0) {
        sl_cli_fail(cmd, "token file %s is empty", cli->token_file);
        return SL_CLI_ERROR;
    }
    free(cli->token);
    cli->token = strdup(line);
    memset(line, 0, sizeof(line));
    return cli->token ? 0 : SL_CLI_ERROR;
}

int sl_cli_connect(sl_client **out, sl_cli *cli, const char *cmd)
{
    sl_client_opts opts;
    int err;

    if (!!cli->tls_cert != !!cli->tls_key)
        return sl_cli_fail(cmd, "--tls-cert and --tls-key go together");
    if (cli->token_file && read_token(cli, cmd) != 0)
        return SL_CLI_ERROR;
    memset(&opts, 0, sizeof(opts));
    opts.timeout_ms = cli->timeout_ms;
    opts.tls = cli->tls;
    opts.tls_ca = cli->tls_ca;
    opts.tls_cert = cli->tls_cert;
    opts.tls_key = cli->tls_key;
    opts.token = cli->token;
    err = sl_client_connect(out, cli->addr, &opts);
    if (err)
        return sl_cli_fail(cmd, "cannot create a client for '%s': %s", cli->addr, sl_strerror(err));
    return 0;
}

void sl_cli_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        SL_CLI_COMMON_OPTS, {"version", no_argument, NULL, 'V'}, {NULL, 0, NULL, 0}};
    sl_cli cli = {.addr = "127.0.0.1:7700", .json = 0, .timeout_ms = 10000};
    const char *env = getenv("SLUICE_ADDR");
    int c, r;

    if (env && *env)
        cli.addr = env;
    cli.tls_ca = getenv("SLUICE_TLS_CA");
    cli.tls_cert = getenv("SLUICE_TLS_CERT");
    cli.tls_key = getenv("SLUICE_TLS_KEY");
    cli.token_file = getenv("SLUICE_TOKEN_FILE");
    if (getenv("SLUICE_TOKEN") && *getenv("SLUICE_TOKEN"))
        cli.token = strdup(getenv("SLUICE_TOKEN"));
    opterr = 0;
    /* '+' stops at the subcommand; its options are parsed by the subcommand. */
    while ((c = getopt_long(argc, argv, "+:hV", opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return SL_CLI_OK;
        }
        if (c == 'V') {
            printf("sluice %s\n", SLUICE_VERSION);
            return SL_CLI_OK;
        }
        if (c == '?' || c == ':') {
            const char *opt = argv[optind - 1];
            fprintf(stderr,
                    c == ':' ? "sluice: option '%s' needs a value\n"
                             : "sluice: unknown option '%s'\n",
                    opt);
            fprintf(stderr, "Try 'sluice --help'.\n");
            return SL_CLI_USAGE;
        }
        r = sl_cli_common_opt(&cli, "", c, optarg);
        if (r)
            return SL_CLI_USAGE;
    }
    if (optind >= argc) {
        usage(stderr);
        return SL_CLI_USAGE;
    }
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(argv[optind], commands[i].name) == 0) {
            int sub_argc = argc - optind;
            char **sub_argv = argv + optind;
            /* 0, not 1: GNU getopt only forgets the '+' (stop at the first argument) mode of
             * the global parse when fully reinitialised, and subcommands take options after
             * their positional arguments. */
            optind = 0;
            r = commands[i].run(&cli, sub_argc, sub_argv);
            free(cli.token);
            return r;
        }
    }
    fprintf(stderr, "sluice: unknown command '%s'\nTry 'sluice --help'.\n", argv[optind]);
    return SL_CLI_USAGE;
}
