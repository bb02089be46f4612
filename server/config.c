#include "config.h"

#include "err.h"

#include <errno.h>
#include <getopt.h>
#include <ini.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef enum kind { K_STR, K_INT, K_BYTES, K_SECONDS, K_LEVEL, K_FORMAT, K_BOOL } kind;

/* One setting: flag name (also its config-file key), variable, and where it lands in sl_config. */
typedef struct setting {
    const char *name;
    const char *env;
    kind kind;
    size_t off;
    size_t size;  /* K_STR: buffer size */
    long long lo; /* K_INT / K_BYTES / K_SECONDS: range */
    long long hi;
    int optional; /* K_STR: may be empty */
    const char *usage;
} setting;

#define STR(field, opt)                                                                            \
    K_STR, offsetof(sl_config, field), sizeof(((sl_config *)0)->field), 0, 0, opt

static const setting settings[] = {
    {"listen", "SLUICE_LISTEN", STR(listen, 0),
     "ADDR      gRPC address; port 0 picks a free one (default 127.0.0.1:7700)"},
    {"data-dir", "SLUICE_DATA_DIR", STR(data_dir, 0),
     "DIR     catalog and shard store, created if missing (default ./sluice-data)"},
    {"port-file", "SLUICE_PORT_FILE", STR(port_file, 1),
     "FILE   write the bound port there once listening"},
    {"log-level", "SLUICE_LOG_LEVEL", K_LEVEL, offsetof(sl_config, log_level), 0, 0, 0, 0,
     "L      debug, info, warn or error (default info)"},
    {"log-format", "SLUICE_LOG_FORMAT", K_FORMAT, offsetof(sl_config, log_format), 0, 0, 0, 0,
     "F     logfmt or json (default logfmt)"},
    {"grace-period", "SLUICE_GRACE_PERIOD", K_SECONDS, offsetof(sl_config, grace_ms), 0, 0, 86400,
     0, "S   on SIGTERM/SIGINT, seconds in-flight calls may finish (default 10)"},
    {"max-message-bytes", "SLUICE_MAX_MESSAGE_BYTES", K_INT, offsetof(sl_config, max_message_bytes),
     0, 1024, 1LL << 30, 0, "N largest accepted gRPC message (default 8388608)"},
    {"rpc-threads", "SLUICE_RPC_THREADS", K_INT, offsetof(sl_config, rpc_threads), 0, 2, 64, 0,
     "N       completion-queue threads, at least 2 (default 4)"},
    {"max-shard-bytes", "SLUICE_MAX_SHARD_BYTES", K_BYTES, offsetof(sl_config, max_shard_bytes), 0,
     0, INT64_MAX, 0, "N   largest checkpoint shard accepted (default 1099511627776)"},
    {"upload-timeout", "SLUICE_UPLOAD_TIMEOUT", K_SECONDS, offsetof(sl_config, upload_timeout_ms),
     0, 0, 86400 * 30, 0, "S  idle partial uploads are removed after S seconds (default 3600)"},
    {"upload-lease", "SLUICE_UPLOAD_LEASE", K_SECONDS, offsetof(sl_config, upload_lease_ms), 0, 2,
     3600, 0,
     "S    with a shared (PostgreSQL) catalog: an upload's lease lives S\n"
     "                     seconds after its last renewal, by the catalog's clock, and\n"
     "                     holds back commits meanwhile; a new attempt on any replica\n"
     "                     takes it over at once (default 30)"},
    {"catalog-timeout", "SLUICE_CATALOG_TIMEOUT", K_SECONDS,
     offsetof(sl_config, catalog_timeout_ms), 0, 1, 3600, 0,
     "S with a PostgreSQL catalog: a statement unanswered after S seconds\n"
     "                     fails with UNAVAILABLE and the connection is made again\n"
     "                     (default 5)"},
    {"upload-memory", "SLUICE_UPLOAD_MEMORY", K_BYTES, offsetof(sl_config, upload_memory), 0,
     8 << 20, INT64_MAX, 0,
     "N     upload data held in memory, all uploads together (default 1 GiB)"},
    {"metrics-listen", "SLUICE_METRICS_LISTEN", STR(metrics_listen, 1),
     "ADDR Prometheus /metrics over HTTP on ADDR (default: off)"},
    {"tls-cert", "SLUICE_TLS_CERT", STR(tls_cert, 1),
     "FILE    PEM certificate chain; with --tls-key enables TLS"},
    {"tls-key", "SLUICE_TLS_KEY", STR(tls_key, 1), "FILE     PEM private key of --tls-cert"},
    {"tls-client-ca", "SLUICE_TLS_CLIENT_CA", STR(tls_client_ca, 1),
     "FILE PEM CA: client certificates are required and verified (mTLS)"},
    {"token-file", "SLUICE_TOKEN_FILE", STR(token_file, 1),
     "FILE  bearer tokens with roles, '<reader|trainer|admin> <token>' per line;\n"
     "                            without it every call is allowed (reloaded on SIGHUP)"},
    {"max-calls", "SLUICE_MAX_CALLS", K_INT, offsetof(sl_config, max_calls), 0, 0, 1000000, 0,
     "N      calls open at once, more are refused (RESOURCE_EXHAUSTED);\n"
     "                     health checks have a reserve; 0 = unlimited (default 16384)"},
    {"max-job-streams", "SLUICE_MAX_JOB_STREAMS", K_INT, offsetof(sl_config, max_job_streams), 0, 0,
     1000000, 0,
     "N streams open at once per job and kind (index/batch streams, shard\n"
     "                     uploads, shard downloads: each kind its own N); 0 = unlimited\n"
     "                     (default 8192)"},
    {"max-deep-verifies", "SLUICE_MAX_DEEP_VERIFIES", K_INT, offsetof(sl_config, max_deep_verifies),
     0, 1, 64, 0,
     "N shards hashed at once by deep verifications, all calls together, so\n"
     "                     uploads keep workers (libuv's pool has 4); more wait (default 2)"},
    {"idle-timeout", "SLUICE_IDLE_TIMEOUT", K_SECONDS, offsetof(sl_config, idle_timeout_ms), 0, 0,
     86400, 0,
     "S   end a stream that waits S seconds for its client (an upload that\n"
     "                     sends nothing, a reader that stopped reading); 0 = never (default 300)"},
    {"max-peer-calls", "SLUICE_MAX_PEER_CALLS", K_INT, offsetof(sl_config, max_peer_calls), 0, 0,
     1000000, 0,
     "N  calls open at once from one client address (IPv6: per /64), health\n"
     "                     checks apart; 0 = unlimited, e.g. behind a proxy (default 4096)"},
    {"max-connection-idle", "SLUICE_MAX_CONNECTION_IDLE", K_SECONDS,
     offsetof(sl_config, max_connection_idle_ms), 0, 0, 86400 * 30, 0,
     "S close a connection without calls for S seconds; clients reconnect\n"
     "                     when they next call; 0 = never (default 300)"},
    {"max-connection-age", "SLUICE_MAX_CONNECTION_AGE", K_SECONDS,
     offsetof(sl_config, max_connection_age_ms), 0, 0, 86400 * 365, 0,
     "S  ask clients to reconnect after S seconds (calls in flight finish);\n"
     "                     0 = never (default 0)"},
    {"self-check-interval", "SLUICE_SELF_CHECK_INTERVAL", K_SECONDS,
     offsetof(sl_config, self_check_ms), 0, 0, 3600, 0,
     "S check every S seconds that the listener still accepts connections\n"
     "                     (the daemon connects to itself); after 3 failures in a row health\n"
     "                     turns NOT_SERVING and the systemd watchdog is no longer fed;\n"
     "                     0 = off (default 10)"},
    /* A switch: the flag alone means true ("--allow-shared-data-dir=false" also parses). */
    {"allow-shared-data-dir", "SLUICE_ALLOW_SHARED_DATA_DIR", K_BOOL,
     offsetof(sl_config, allow_shared_data_dir), 0, 0, 0, 0,
     "  start even if the data dir is writable by other users (mode o+w):\n"
     "                     any of them could plant links or replace files in it; without\n"
     "                     this sluiced refuses such a dir (environment and config file:\n"
     "                     true or false)"},
    {"catalog", "SLUICE_CATALOG", STR(catalog, 1),
     "SPEC      where the catalog is: sqlite:PATH (default sqlite:<data\n"
     "                     dir>/catalog.db) or a PostgreSQL URI postgresql://USER@HOST[:PORT]/DB\n"
     "                     [?sslmode=...] shared by any number of replicas; never with a\n"
     "                     password (see --catalog-password-file)"},
    {"catalog-password-file", "SLUICE_CATALOG_PASSWORD_FILE", STR(catalog_password_file, 1),
     "FILE the PostgreSQL password, its first line; not readable by\n"
     "                     others (default: libpq's PGPASSFILE or ~/.pgpass)"},
    {"replica-id", "SLUICE_REPLICA_ID", STR(replica_id, 1),
     "ID     this replica's name in GetInfo, logs and metrics, of letters,\n"
     "                     digits and . _ : - (default\n"
     "                     <hostname>:<port>); with a PostgreSQL catalog every line of the log\n"
     "                     carries it"},
    {"store", "SLUICE_STORE", STR(store, 1),
     "URL         where checkpoint shards go: s3://BUCKET[/PREFIX] for S3-compatible\n"
     "                     object storage (see the s3-* settings); default: <data "
     "dir>/checkpoints"},
    {"s3-endpoint", "SLUICE_S3_ENDPOINT", STR(s3_endpoint, 1),
     "URL   the S3 endpoint, http(s)://HOST[:PORT] (default: AWS for --s3-region)"},
    {"s3-region", "SLUICE_S3_REGION", STR(s3_region, 0),
     "NAME    the region requests are signed for (default us-east-1)"},
    {"s3-addressing", "SLUICE_S3_ADDRESSING", STR(s3_addressing, 0),
     "A   path (ENDPOINT/BUCKET/KEY), virtual (BUCKET.HOST/KEY) or auto: path\n"
     "                     with --s3-endpoint, virtual without (default auto)"},
    {"s3-credentials-file", "SLUICE_S3_CREDENTIALS_FILE", STR(s3_credentials_file, 1),
     "FILE 'access_key_id = ...', 'secret_access_key = ...', optional\n"
     "                     'session_token = ...', not readable by others; default: the\n"
     "                     AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN variables"},
    {"s3-ca-file", "SLUICE_S3_CA_FILE", STR(s3_ca_file, 1),
     "FILE    PEM CAs the store's certificate is checked against (default: the system's)"},
    {"s3-tls-verify", "SLUICE_S3_TLS_VERIFY", K_BOOL, offsetof(sl_config, s3_tls_verify), 0, 0, 0,
     0, "     verify the store's TLS certificate (default true; =false for tests only)"},
    {"s3-part-size", "SLUICE_S3_PART_SIZE", K_BYTES, offsetof(sl_config, s3_part_size), 0, 5 << 20,
     5LL << 30, 0, "N   multipart part size, 5 MiB to 5 GiB (default 8388608)"},
    {"s3-parts-in-flight", "SLUICE_S3_PARTS_IN_FLIGHT", K_INT,
     offsetof(sl_config, s3_parts_in_flight), 0, 1, 64, 0,
     "N parts of one upload sent at once (default 4)"},
    {"s3-retry-deadline", "SLUICE_S3_RETRY_DEADLINE", K_SECONDS,
     offsetof(sl_config, s3_retry_deadline_ms), 0, 1, 3600, 0,
     "S request retries (5xx, SlowDown, resets) with backoff for S seconds,\n"
     "                     then the upload fails with UNAVAILABLE and can resume (default 30)"},
    {"s3-request-timeout", "SLUICE_S3_REQUEST_TIMEOUT", K_SECONDS,
     offsetof(sl_config, s3_request_timeout_ms), 0, 1, 3600, 0,
     "S one attempt of a request may take S seconds in all, plus 1 s per MiB\n"
     "                     of its body, however slowly the store answers; then it is\n"
     "                     retried within --s3-retry-deadline (default 60)"},
    {"s3-list-max-pages", "SLUICE_S3_LIST_MAX_PAGES", K_INT, offsetof(sl_config, s3_list_max_pages),
     0, 1, 1000000, 0,
     "N  a listing of the bucket (sweeps) stops with an error after N pages of\n"
     "                     1000 keys, against a store that paginates forever (default 10000)"},
    {"s3-store-jobs", "SLUICE_S3_STORE_JOBS", K_INT, offsetof(sl_config, s3_store_jobs), 0, 1, 64,
     0,
     "N     removals, UploadStatus and sweeps on the store hold at most N worker\n"
     "                     threads at once, so that a slow store leaves the others to\n"
     "                     uploads (default 4)"},
    {"s3-unhealthy-after", "SLUICE_S3_UNHEALTHY_AFTER", K_SECONDS,
     offsetof(sl_config, s3_unhealthy_after_ms), 0, 0, 3600, 0,
     "S health reports sluice.v1.Checkpoints NOT_SERVING once every store\n"
     "                     request for S seconds failed (3 at least), SERVING after the\n"
     "                     next success; 0 = never (default 30)"},
};

#define N_SETTINGS (sizeof(settings) / sizeof(settings[0]))

enum { OPT_CONFIG = 1000, OPT_CHECK = 1001, OPT_FIRST = 2000 };

void sl_config_usage(FILE *f)
{
    fprintf(f, "Usage: sluiced [options]\n"
               "\n"
               "The sluice coordinator daemon: datasets, jobs and epochs in a SQLite catalog,\n"
               "per-rank index streams and checkpoint shards over gRPC.\n"
               "\n"
               "Every option is also a SLUICE_* environment variable (in brackets) and a key of\n"
               "the config file (the option name without dashes, e.g. 'listen = ...').\n"
               "Precedence: flags > environment > config file > defaults.\n"
               "\n");
    for (size_t i = 0; i < N_SETTINGS; i++)
        fprintf(f, "  --%s %s\n      [%s]\n", settings[i].name, settings[i].usage, settings[i].env);
    fprintf(f,
            "  --config FILE   read settings from FILE (INI: 'key = value', optional [sluiced]\n"
            "                  section; unknown keys are errors) [SLUICE_CONFIG]\n"
            "  --check-config  validate the configuration, print the effective settings, exit\n"
            "  -h, --help      show this help and exit\n"
            "  -V, --version   print the version and exit\n"
            "\n"
            "Signals: SIGTERM/SIGINT stop gracefully; SIGHUP reloads the token file and the log\n"
            "level.\n");
}

/* Why a string value cannot be written in a config file (sl_config_print's output must parse back
 * to the same value, and inih strips spaces at both ends, ends a value at a newline and starts a
 * comment at a ';' after a space), or NULL if it can. */
static const char *str_unwritable(const char *v)
{
    size_t n = strlen(v);

    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        if (c < 0x20 || c == 0x7f)
            return "has a control character";
        /* "key = ;x": the ';' follows the space after '=' in the file. */
        if (c == ';' && (i == 0 || v[i - 1] == ' '))
            return "has a ';' at its start or after a space (a comment in a config file)";
    }
    if (n && (v[0] == ' ' || v[n - 1] == ' '))
        return "starts or ends with a space";
    return NULL;
}

static int apply(sl_config *cfg, const setting *s, const char *v, const char *src, char *msg,
                 size_t len)
{
    const char *why;
    char *p = (char *)cfg + s->off;
    char *end;

    switch (s->kind) {
    case K_STR:
        if ((!*v && !s->optional) || strlen(v) >= s->size) {
            snprintf(msg, len, "%s: value '%.64s' is %s", src, v, *v ? "too long" : "empty");
            return SL_EINVAL;
        }
        if ((why = str_unwritable(v)) != NULL) {
            snprintf(msg, len, "%s: value '%.64s' %s", src, v, why);
            return SL_EINVAL;
        }
        strcpy(p, v);
        return 0;
    case K_INT:
    case K_BYTES: {
        long long n;
        errno = 0;
        n = strtoll(v, &end, 10);
        if (errno || end == v || *end || n < s->lo || n > s->hi) {
            snprintf(msg, len, "%s: '%.64s' is not an integer in [%lld, %lld]", src, v, s->lo,
                     s->hi);
            return SL_EINVAL;
        }
        if (s->kind == K_INT)
            *(int *)p = (int)n;
        else
            *(uint64_t *)p = (uint64_t)n;
        return 0;
    }
    case K_SECONDS: {
        double d;
        errno = 0;
        d = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(d) || d < (double)s->lo || d > (double)s->hi) {
            snprintf(msg, len, "%s: '%.64s' is not a number of seconds in [%lld, %lld]", src, v,
                     s->lo, s->hi);
            return SL_EINVAL;
        }
        /* Rounded, not truncated: 1.001 * 1000.0 is 1000.999..., and 1.001 s means 1001 ms. */
        *(uint64_t *)p = (uint64_t)llround(d * 1000.0);
        return 0;
    }
    case K_LEVEL:
        if (sl_log_parse_level((sl_log_level *)p, v) != 0) {
            snprintf(msg, len, "%s: '%.64s' is not one of debug, info, warn, error", src, v);
            return SL_EINVAL;
        }
        return 0;
    case K_FORMAT:
        if (sl_log_parse_format((sl_log_format *)p, v) != 0) {
            snprintf(msg, len, "%s: '%.64s' is not one of logfmt, json", src, v);
            return SL_EINVAL;
        }
        return 0;
    case K_BOOL:
        if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0 || strcmp(v, "yes") == 0) {
            *(int *)p = 1;
        } else if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0 || strcmp(v, "no") == 0) {
            *(int *)p = 0;
        } else {
            snprintf(msg, len, "%s: '%.64s' is not one of true, false, yes, no, 1, 0", src, v);
            return SL_EINVAL;
        }
        return 0;
    }
    return SL_EINVAL;
}

static const setting *find_setting(const char *key)
{
    char norm[64];
    size_t n = strlen(key);

    if (n >= sizeof(norm))
        return NULL;
    /* Config files may spell keys with '_' or '-'. */
    for (size_t i = 0; i <= n; i++)
        norm[i] = key[i] == '_' ? '-' : key[i];
    for (size_t i = 0; i < N_SETTINGS; i++)
        if (strcmp(settings[i].name, norm) == 0)
            return &settings[i];
    return NULL;
}

typedef struct file_ctx {
    sl_config *cfg;
    const char *path;
    FILE *f;
    int lines;       /* lines read so far */
    const char *bad; /* why the reader stopped early, NULL if it did not */
    char msg[512];
    char long_msg[64];
} file_ctx;

static int on_ini(void *user, const char *section, const char *name, const char *value)
{
    file_ctx *ctx = user;
    const setting *s;
    char src[PATH_MAX + 64];

    if (*section && strcmp(section, "sluiced") != 0) {
        snprintf(ctx->msg, sizeof(ctx->msg), "unknown section [%.64s] (only [sluiced])", section);
        return 0;
    }
    s = find_setting(name);
    if (!s) {
        snprintf(ctx->msg, sizeof(ctx->msg), "unknown key '%.64s'", name);
        return 0;
    }
    snprintf(src, sizeof(src), "key '%s'", s->name);
    return apply(ctx->cfg, s, value, src, ctx->msg, sizeof(ctx->msg)) == 0;
}

/* inih's line reader. inih reads a line longer than its buffer as several lines, so the tail of
 * a long value was parsed as a line of its own: "data-dir = /<186 x>listen = evil" was read as
 * "data-dir = /<186 x>l" and "isten = evil"; a blank or comment tail cut the value silently. A
 * line that does not fit, or a NUL byte (fgets would hide what follows it), ends the parse here
 * instead. */
static char *read_line(char *str, int num, void *stream)
{
    file_ctx *ctx = stream;
    int c = EOF, i = 0;

    if (ctx->bad)
        return NULL;
    while (i < num - 1 && (c = getc(ctx->f)) != EOF) {
        if (c == '\0') {
            ctx->bad = "a NUL byte";
            return NULL;
        }
        str[i++] = (char)c;
        if (c == '\n')
            break;
    }
    if (i == 0)
        return NULL;
    ctx->lines++;
    /* A full buffer without the newline: the line fits only if it ends right here. */
    if (c != '\n' && i == num - 1 && (c = getc(ctx->f)) != EOF && c != '\n') {
        snprintf(ctx->long_msg, sizeof(ctx->long_msg), "more than %d characters", num - 2);
        ctx->bad = ctx->long_msg;
        return NULL;
    }
    str[i] = '\0';
    return str;
}

static int load_file(sl_config *cfg, const char *path, FILE *err)
{
    file_ctx ctx = {cfg, path, NULL, 0, NULL, "", ""};
    int line = -1;

    if ((ctx.f = fopen(path, "r")) != NULL) {
        line = ini_parse_stream(read_line, &ctx, on_ini, &ctx);
        fclose(ctx.f);
    }
    if (line == 0 && ctx.bad) {
        fprintf(err, "sluiced: config file %s line %d: %s\n", path, ctx.lines, ctx.bad);
        return SL_EINVAL;
    }
    if (line == 0)
        return 0;
    if (line < 0)
        fprintf(err, "sluiced: config file %s: %s\n", path,
                line == -1 ? strerror(errno) : "out of memory");
    else
        fprintf(err, "sluiced: config file %s line %d: %s\n", path, line,
                ctx.msg[0] ? ctx.msg : "syntax error");
    return SL_EINVAL;
}

static void set_defaults(sl_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    strcpy(cfg->listen, "127.0.0.1:7700");
    strcpy(cfg->data_dir, "./sluice-data");
    cfg->log_level = SL_LOG_INFO;
    cfg->log_format = SL_LOG_LOGFMT;
    cfg->grace_ms = 10000;
    cfg->max_message_bytes = 8 << 20;
    cfg->rpc_threads = 4;
    cfg->max_shard_bytes = 1ULL << 40;
    cfg->upload_timeout_ms = 3600 * 1000;
    cfg->upload_lease_ms = 30 * 1000;
    cfg->catalog_timeout_ms = 5 * 1000; /* SL_CAT_TIMEOUT_MS */
    cfg->upload_memory = 1ULL << 30;
    cfg->max_calls = 16384;
    cfg->max_job_streams = 8192;
    cfg->max_deep_verifies = 2;
    cfg->idle_timeout_ms = 300 * 1000;
    cfg->max_peer_calls = 4096;
    cfg->max_connection_idle_ms = 300 * 1000;
    cfg->self_check_ms = 10 * 1000;
    strcpy(cfg->s3_region, "us-east-1");
    strcpy(cfg->s3_addressing, "auto");
    cfg->s3_tls_verify = 1;
    cfg->s3_part_size = 8 << 20;
    cfg->s3_parts_in_flight = 4;
    cfg->s3_retry_deadline_ms = 30 * 1000;
    cfg->s3_request_timeout_ms = 60 * 1000;
    cfg->s3_list_max_pages = 10000;
    cfg->s3_store_jobs = 4;
    cfg->s3_unhealthy_after_ms = 30 * 1000;
}

int sl_config_parse(sl_config *cfg, int argc, char **argv, FILE *out, FILE *err)
{
    struct option opts[N_SETTINGS + 5];
    const char *config = getenv("SLUICE_CONFIG");
    char msg[512], src[96];
    size_t k = 0;
    int c, idx;

    set_defaults(cfg);
    for (size_t i = 0; i < N_SETTINGS; i++)
        opts[k++] = (struct option){
            settings[i].name, settings[i].kind == K_BOOL ? optional_argument : required_argument,
            NULL, OPT_FIRST + (int)i};
    opts[k++] = (struct option){"config", required_argument, NULL, OPT_CONFIG};
    opts[k++] = (struct option){"check-config", no_argument, NULL, OPT_CHECK};
    opts[k++] = (struct option){"help", no_argument, NULL, 'h'};
    opts[k++] = (struct option){"version", no_argument, NULL, 'V'};
    opts[k] = (struct option){NULL, 0, NULL, 0};

    /* First pass: only find --config, --help and --version and catch usage errors, since the
     * file's settings rank below the environment and the flags. */
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":hV", opts, NULL)) != -1) {
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
        case OPT_CONFIG:
            config = optarg;
            break;
        default:
            break;
        }
    }
    if (optind < argc) {
        fprintf(err, "sluiced: unexpected argument '%s'\n", argv[optind]);
        goto usage;
    }
    if (config && *config) {
        if (strlen(config) >= sizeof(cfg->config_file)) {
            fprintf(err, "sluiced: config file path too long\n");
            return SL_EINVAL;
        }
        strcpy(cfg->config_file, config);
        if (load_file(cfg, config, err) != 0)
            return SL_EINVAL;
    }
    for (size_t i = 0; i < N_SETTINGS; i++) {
        const char *v = getenv(settings[i].env);
        if (v && apply(cfg, &settings[i], v, settings[i].env, msg, sizeof(msg)) != 0) {
            fprintf(err, "sluiced: %s\n", msg);
            return SL_EINVAL;
        }
    }
    optind = 1;
    while ((idx = -1, c = getopt_long(argc, argv, ":hV", opts, &idx)) != -1) {
        if (c == OPT_CHECK) {
            cfg->check_config = 1;
        } else if (c >= OPT_FIRST) {
            const setting *s = &settings[c - OPT_FIRST];
            snprintf(src, sizeof(src), "--%s", s->name);
            if (apply(cfg, s, optarg ? optarg : "true", src, msg, sizeof(msg)) != 0) {
                fprintf(err, "sluiced: %s\n", msg);
                goto usage;
            }
        }
    }
    if (!cfg->tls_cert[0] != !cfg->tls_key[0]) {
        fprintf(err, "sluiced: --tls-cert and --tls-key go together\n");
        return SL_EINVAL;
    }
    if (cfg->tls_client_ca[0] && !cfg->tls_cert[0]) {
        fprintf(err, "sluiced: --tls-client-ca needs --tls-cert and --tls-key\n");
        return SL_EINVAL;
    }
    return 0;
usage:
    fprintf(err, "Try 'sluiced --help'.\n");
    return SL_EINVAL;
}

void sl_config_print(const sl_config *cfg, FILE *f)
{
    fprintf(f, "# sluiced %s effective configuration\n", SLUICE_VERSION);
    if (cfg->config_file[0])
        fprintf(f, "# config file: %s\n", cfg->config_file);
    fprintf(f, "[sluiced]\n");
    for (size_t i = 0; i < N_SETTINGS; i++) {
        const setting *s = &settings[i];
        const char *p = (const char *)cfg + s->off;
        fprintf(f, "%s = ", s->name);
        switch (s->kind) {
        case K_STR:
            fprintf(f, "%s\n", p);
            break;
        case K_INT:
            fprintf(f, "%d\n", *(const int *)p);
            break;
        case K_BYTES:
            fprintf(f, "%llu\n", (unsigned long long)*(const uint64_t *)p);
            break;
        case K_SECONDS: {
            /* Exact milliseconds: "%g" would print 2591999 s as 2.592e+06. */
            unsigned long long ms = *(const uint64_t *)p;
            if (ms % 1000)
                fprintf(f, "%llu.%03llu\n", ms / 1000, ms % 1000);
            else
                fprintf(f, "%llu\n", ms / 1000);
            break;
        }
        case K_LEVEL:
            fprintf(f, "%s\n", sl_log_level_name(*(const sl_log_level *)p));
            break;
        case K_FORMAT:
            fprintf(f, "%s\n", sl_log_format_name(*(const sl_log_format *)p));
            break;
        case K_BOOL:
            fprintf(f, "%s\n", *(const int *)p ? "true" : "false");
            break;
        }
    }
}

/* 1 if setting s has the same value in a and b. */
static int same_value(const setting *s, const sl_config *a, const sl_config *b)
{
    const char *pa = (const char *)a + s->off, *pb = (const char *)b + s->off;

    switch (s->kind) {
    case K_STR:
        return strcmp(pa, pb) == 0;
    case K_INT:
    case K_BOOL:
        return *(const int *)pa == *(const int *)pb;
    case K_BYTES:
    case K_SECONDS:
        return *(const uint64_t *)pa == *(const uint64_t *)pb;
    case K_LEVEL:
        return *(const sl_log_level *)pa == *(const sl_log_level *)pb;
    case K_FORMAT:
        return *(const sl_log_format *)pa == *(const sl_log_format *)pb;
    }
    return 0;
}

const char *sl_config_diff(const sl_config *a, const sl_config *b)
{
    for (size_t i = 0; i < N_SETTINGS; i++)
        if (!same_value(&settings[i], a, b))
            return settings[i].name;
    return NULL;
}

const char *sl_config_env_name(size_t i)
{
    return i < N_SETTINGS ? settings[i].env : NULL;
}
