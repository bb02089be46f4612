#include "config.h"

#include "err.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void sl_config_usage(FILE *f)
{
    fprintf(
        f,
        "Usage: sluiced [options]\n"
        "\n"
        "The sluice coordinator daemon: datasets, jobs and epochs in a SQLite catalog, per-rank\n"
        "index streams and checkpoint shards over gRPC.\n"
        "\n"
        "Options (environment variable in brackets; flags win over the environment):\n"
        "  --listen ADDR            address to serve gRPC on [SLUICE_LISTEN]\n"
        "                           (default 127.0.0.1:7700; port 0 picks a free port)\n"
        "  --data-dir DIR           catalog and shard store [SLUICE_DATA_DIR]\n"
        "                           (default ./sluice-data, created if missing)\n"
        "  --port-file FILE         write the bound port to FILE once listening\n"
        "                           [SLUICE_PORT_FILE]\n"
        "  --log-level LEVEL        debug, info, warn or error [SLUICE_LOG_LEVEL] (default info)\n"
        "  --grace-period SECONDS   on SIGTERM/SIGINT, how long in-flight calls may finish\n"
        "                           before they are cancelled [SLUICE_GRACE_PERIOD] (default 10)\n"
        "  --max-message-bytes N    largest accepted gRPC message [SLUICE_MAX_MESSAGE_BYTES]\n"
        "                           (default 8388608)\n"
        "  --rpc-threads N          completion-queue threads, at least 2 [SLUICE_RPC_THREADS]\n"
        "                           (default 2)\n"
        "  --max-shard-bytes N      largest checkpoint shard accepted, in bytes\n"
        "                           [SLUICE_MAX_SHARD_BYTES] (default 1099511627776)\n"
        "  --upload-timeout SECONDS partial shard uploads idle this long are removed\n"
        "                           [SLUICE_UPLOAD_TIMEOUT] (default 3600)\n"
        "  -h, --help               show this help and exit\n"
        "  -V, --version            print the version and exit\n");
}

static int set_str(char *dst, size_t len, const char *v, const char *name, FILE *err)
{
    if (!v || !*v || strlen(v) >= len) {
        fprintf(err, "sluiced: %s: value '%s' is empty or too long\n", name, v ? v : "");
        return SL_EINVAL;
    }
    strcpy(dst, v);
    return 0;
}

static int set_int(int *dst, const char *v, long lo, long hi, const char *name, FILE *err)
{
    char *end;
    long n;

    errno = 0;
    n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < lo || n > hi) {
        fprintf(err, "sluiced: %s: '%s' is not an integer in [%ld, %ld]\n", name, v, lo, hi);
        return SL_EINVAL;
    }
    *dst = (int)n;
    return 0;
}

static int set_grace(uint64_t *dst, const char *v, const char *name, FILE *err)
{
    char *end;
    double s;

    errno = 0;
    s = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(s) || s < 0 || s > 86400) {
        fprintf(err, "sluiced: %s: '%s' is not a number of seconds in [0, 86400]\n", name, v);
        return SL_EINVAL;
    }
    *dst = (uint64_t)(s * 1000.0);
    return 0;
}

static int set_u64(uint64_t *dst, const char *v, const char *name, FILE *err)
{
    char *end;
    unsigned long long n;

    errno = 0;
    n = strtoull(v, &end, 10);
    if (errno || end == v || *end || *v == '-' || n > (unsigned long long)INT64_MAX) {
        fprintf(err, "sluiced: %s: '%s' is not a byte count in [0, %lld]\n", name, v,
                (long long)INT64_MAX);
        return SL_EINVAL;
    }
    *dst = (uint64_t)n;
    return 0;
}

static int set_level(sl_log_level *dst, const char *v, const char *name, FILE *err)
{
    if (sl_log_parse_level(dst, v) != 0) {
        fprintf(err, "sluiced: %s: '%s' is not one of debug, info, warn, error\n", name, v);
        return SL_EINVAL;
    }
    return 0;
}

enum {
    OPT_LISTEN = 256,
    OPT_DATA_DIR,
    OPT_PORT_FILE,
    OPT_LOG_LEVEL,
    OPT_GRACE,
    OPT_MAX_MSG,
    OPT_THREADS,
    OPT_MAX_SHARD,
    OPT_UPLOAD_TIMEOUT
};

/* Apply one setting by option id; `name` is the flag or variable, for messages. */
static int apply(sl_config *cfg, int id, const char *v, const char *name, FILE *err)
{
    switch (id) {
    case OPT_LISTEN:
        return set_str(cfg->listen, sizeof(cfg->listen), v, name, err);
    case OPT_DATA_DIR:
        return set_str(cfg->data_dir, sizeof(cfg->data_dir), v, name, err);
    case OPT_PORT_FILE:
        return set_str(cfg->port_file, sizeof(cfg->port_file), v, name, err);
    case OPT_LOG_LEVEL:
        return set_level(&cfg->log_level, v, name, err);
    case OPT_GRACE:
        return set_grace(&cfg->grace_ms, v, name, err);
    case OPT_MAX_MSG:
        return set_int(&cfg->max_message_bytes, v, 1024, 1L << 30, name, err);
    case OPT_THREADS:
        return set_int(&cfg->rpc_threads, v, 2, 64, name, err);
    case OPT_MAX_SHARD:
        return set_u64(&cfg->max_shard_bytes, v, name, err);
    case OPT_UPLOAD_TIMEOUT:
        return set_grace(&cfg->upload_timeout_ms, v, name, err);
    default:
        return SL_EINVAL;
    }
}

static const struct {
    int id;
    const char *env;
} env_vars[] = {
    {OPT_LISTEN, "SLUICE_LISTEN"},
    {OPT_DATA_DIR, "SLUICE_DATA_DIR"},
    {OPT_PORT_FILE, "SLUICE_PORT_FILE"},
    {OPT_LOG_LEVEL, "SLUICE_LOG_LEVEL"},
    {OPT_GRACE, "SLUICE_GRACE_PERIOD"},
    {OPT_MAX_MSG, "SLUICE_MAX_MESSAGE_BYTES"},
    {OPT_THREADS, "SLUICE_RPC_THREADS"},
    {OPT_MAX_SHARD, "SLUICE_MAX_SHARD_BYTES"},
    {OPT_UPLOAD_TIMEOUT, "SLUICE_UPLOAD_TIMEOUT"},
};

int sl_config_parse(sl_config *cfg, int argc, char **argv, FILE *out, FILE *err)
{
    static const struct option opts[] = {
        {"listen", required_argument, NULL, OPT_LISTEN},
        {"data-dir", required_argument, NULL, OPT_DATA_DIR},
        {"port-file", required_argument, NULL, OPT_PORT_FILE},
        {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
        {"grace-period", required_argument, NULL, OPT_GRACE},
        {"max-message-bytes", required_argument, NULL, OPT_MAX_MSG},
        {"rpc-threads", required_argument, NULL, OPT_THREADS},
        {"max-shard-bytes", required_argument, NULL, OPT_MAX_SHARD},
        {"upload-timeout", required_argument, NULL, OPT_UPLOAD_TIMEOUT},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    char name[64];
    int c, idx;

    memset(cfg, 0, sizeof(*cfg));
    strcpy(cfg->listen, "127.0.0.1:7700");
    strcpy(cfg->data_dir, "./sluice-data");
    cfg->log_level = SL_LOG_INFO;
    cfg->grace_ms = 10000;
    cfg->max_message_bytes = 8 << 20;
    cfg->rpc_threads = 2;
    cfg->max_shard_bytes = 1ULL << 40;
    cfg->upload_timeout_ms = 3600 * 1000;

    for (size_t i = 0; i < sizeof(env_vars) / sizeof(env_vars[0]); i++) {
        const char *v = getenv(env_vars[i].env);
        if (v && apply(cfg, env_vars[i].id, v, env_vars[i].env, err) != 0)
            return SL_EINVAL;
    }

    optind = 1;
    opterr = 0;
    while ((idx = -1, c = getopt_long(argc, argv, ":hV", opts, &idx)) != -1) {
        switch (c) {
        case 'h':
            sl_config_usage(out);
            return SL_CONFIG_EXIT_OK;
        case 'V':
            fprintf(out, "sluiced %s\n", SLUICE_VERSION);
            return SL_CONFIG_EXIT_OK;
        case ':':
            fprintf(err, "sluiced: option '%s' needs a value\n", argv[optind - 1]);
            goto usage;
        case '?':
            fprintf(err, "sluiced: unknown option '%s'\n", argv[optind - 1]);
            goto usage;
        default:
            snprintf(name, sizeof(name), "--%s", idx >= 0 ? opts[idx].name : "?");
            if (apply(cfg, c, optarg, name, err) != 0)
                goto usage;
        }
    }
    if (optind < argc) {
        fprintf(err, "sluiced: unexpected argument '%s'\n", argv[optind]);
        goto usage;
    }
    return 0;
usage:
    fprintf(err, "Try 'sluiced --help'.\n");
    return SL_EINVAL;
}
