#include "ops.h"

#include "catalog/ckpt.h"
#include "daemon.h"
#include "err.h"
#include "log.h"

#include <dirent.h>
#include <systemd/sd-daemon.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int authorize(const char *method, unsigned access, const char *token, char *msg, size_t len,
                     void *arg)
{
    sl_ops *ops = arg;
    int err = sl_auth_check(ops->auth, method, access, token, msg, len);

    if (err)
        sl_log_limited(SL_LOG_WARN, 1000, "rpc_refused", "method=%s reason=%s", method,
                       err == SL_EPERM ? "permission_denied" : "unauthenticated");
    return err;
}

static void observe_call(const sl_rpc_call_stats *st, void *arg)
{
    sl_ops *ops = arg;
    char labels[200];

    sl_metrics_observe_rpc(ops->metrics, st->method, st->code, st->duration_us);
    if (st->end == SL_RPC_END_MAX_CALLS)
        sl_metrics_add(ops->metrics, "sluice_rpc_refused_total", "limit=\"max_calls\"", 1);
    else if (st->end == SL_RPC_END_MAX_KEY)
        sl_metrics_add(ops->metrics, "sluice_rpc_refused_total", "limit=\"max_job_streams\"", 1);
    else if (st->end == SL_RPC_END_IDLE)
        sl_metrics_add(ops->metrics, "sluice_rpc_idle_timeouts_total", NULL, 1);
    if (st->code != SL_RPC_UNIMPLEMENTED) {
        snprintf(labels, sizeof(labels), "method=\"%s\"", st->method);
        if (st->bytes_in)
            sl_metrics_add(ops->metrics, "sluice_rpc_received_bytes_total", labels,
                           (double)st->bytes_in);
        if (st->bytes_out)
            sl_metrics_add(ops->metrics, "sluice_rpc_sent_bytes_total", labels,
                           (double)st->bytes_out);
    }
    if (st->code == SL_RPC_OK || st->code == SL_RPC_CANCELLED)
        sl_log_debug("rpc",
                     "method=%s peer=%s status=%s duration_us=%llu bytes_in=%llu "
                     "bytes_out=%llu",
                     st->method, st->peer, sl_rpc_code_name(st->code),
                     (unsigned long long)st->duration_us, (unsigned long long)st->bytes_in,
                     (unsigned long long)st->bytes_out);
    else
        sl_log_limited(SL_LOG_INFO, 200, "rpc", "method=%s peer=%s status=%s duration_us=%llu",
                       st->method, st->peer, sl_rpc_code_name(st->code),
                       (unsigned long long)st->duration_us);
}

/* Scrape-time gauges about the process; /proc is read on the HTTP thread. */
static void collect(sl_metrics *m, void *arg)
{
    sl_ops *ops = arg;
    long pages = 0, resident = 0;
    size_t fds = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    DIR *dir;

    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    if (ops->d->cat)
        sl_metrics_set(m, "sluice_catalog_errors_total", NULL, (double)sl_cat_errors(ops->d->cat));
    if (ops->d->rpc)
        sl_metrics_set(m, "sluice_rpc_active_streams", NULL,
                       (double)sl_rpc_server_live_streams(ops->d->rpc));
    sl_metrics_set(m, "sluice_process_resident_memory_bytes", NULL,
                   (double)resident * (double)sysconf(_SC_PAGESIZE));
    dir = opendir("/proc/self/fd");
    if (dir) {
        struct dirent *e;
        while ((e = readdir(dir)) != NULL)
            if (e->d_name[0] != '.')
                fds++;
        closedir(dir);
        /* The directory stream itself is one of them. */
        sl_metrics_set(m, "sluice_process_open_fds", NULL, (double)(fds ? fds - 1 : 0));
    }
}

static int load_tokens(sl_ops *ops, const char *path, sl_auth **out)
{
    char msg[512];
    int err = sl_auth_load(out, path, msg, sizeof(msg));

    if (err)
        sl_log_error("token_file_invalid", "msg=\"%s\"", msg);
    return err;
}

static void on_sighup(uv_signal_t *s, int signum)
{
    sl_ops *ops = s->data;
    sl_config cfg;
    sl_auth *auth = NULL;
    FILE *devnull = fopen("/dev/null", "w");
    int err;

    /* Re-read the whole configuration, but only the log level and tokens change at run time. */
    err = sl_config_parse(&cfg, ops->argc, ops->argv, devnull ? devnull : stdout, stderr);
    if (devnull)
        fclose(devnull);
    if (err) {
        sl_log_error("reload_failed", "reason=\"configuration invalid, nothing changed\"");
        return;
    }
    if (cfg.token_file[0] && load_tokens(ops, cfg.token_file, &auth) != 0) {
        sl_log_error("reload_failed", "reason=\"token file invalid, nothing changed\"");
        return;
    }
    sd_notify(0, "RELOADING=1");
    sl_log_set_level(cfg.log_level);
    sl_auth_free(ops->auth);
    ops->auth = auth;
    sd_notify(0, "READY=1");
    sl_log_info("reloaded", "log_level=%s tokens=%zu", sl_log_level_name(cfg.log_level),
                sl_auth_count(ops->auth));
}

/* A TLS file must exist and look like PEM; the RPC layer reads it again when it starts. */
static int check_pem(const char *what, const char *path)
{
    char head[4096];
    size_t n;
    FILE *f;

    if (!path[0])
        return 0;
    f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "sluiced: %s %s: %s\n", what, path, strerror(errno));
        return -errno;
    }
    n = fread(head, 1, sizeof(head) - 1, f);
    fclose(f);
    head[n] = '\0';
    if (!strstr(head, "-----BEGIN ")) {
        fprintf(stderr, "sluiced: %s %s: not a PEM file\n", what, path);
        return SL_EINVAL;
    }
    return 0;
}

int sl_ops_check_config(const sl_config *cfg, FILE *out)
{
    char msg[512];
    sl_auth *auth = NULL;
    int err;

    if ((err = check_pem("--tls-cert", cfg->tls_cert)) != 0 ||
        (err = check_pem("--tls-key", cfg->tls_key)) != 0 ||
        (err = check_pem("--tls-client-ca", cfg->tls_client_ca)) != 0)
        return err;
    if (cfg->token_file[0]) {
        err = sl_auth_load(&auth, cfg->token_file, msg, sizeof(msg));
        if (err) {
            fprintf(stderr, "sluiced: %s\n", msg);
            return err;
        }
        sl_auth_free(auth);
    }
    if (cfg->metrics_listen[0]) {
        err = sl_metrics_parse_addr(cfg->metrics_listen);
        if (err) {
            fprintf(stderr, "sluiced: --metrics-listen '%s' is not host:port\n",
                    cfg->metrics_listen);
            return err;
        }
    }
    sl_config_print(cfg, out);
    return 0;
}

/* The families the daemon exports besides the RPC layer's (declared once, at start). */
static const struct {
    const char *name;
    sl_metric_type type;
    const char *help;
} families[] = {
    {"sluice_process_resident_memory_bytes", SL_METRIC_GAUGE, "Resident set size of sluiced."},
    {"sluice_process_open_fds", SL_METRIC_GAUGE, "Open file descriptors of sluiced."},
    {"sluice_rpc_active_streams", SL_METRIC_GAUGE, "Streaming calls in progress."},
    {"sluice_rpc_refused_total", SL_METRIC_COUNTER,
     "Calls refused with RESOURCE_EXHAUSTED by a limit (max_calls, max_job_streams)."},
    {"sluice_rpc_idle_timeouts_total", SL_METRIC_COUNTER,
     "Streams ended because their client sent or read nothing for the idle timeout."},
    {"sluice_rpc_received_bytes_total", SL_METRIC_COUNTER,
     "Request message bytes received, by method (upload data included)."},
    {"sluice_rpc_sent_bytes_total", SL_METRIC_COUNTER,
     "Response message bytes sent, by method (downloads and streams included)."},
    {"sluice_indices_served_total", SL_METRIC_COUNTER, "Sample indices streamed to ranks."},
    {"sluice_batches_served_total", SL_METRIC_COUNTER, "Token-budget batches streamed to ranks."},
    {"sluice_checkpoints", SL_METRIC_GAUGE,
     "Checkpoints in the catalog by state (refreshed every 5 s)."},
    {"sluice_verify_verdicts_total", SL_METRIC_COUNTER,
     "Checkpoint verification verdicts per shard and metadata file, by mode."},
    {"sluice_catalog_errors_total", SL_METRIC_COUNTER, "Catalog (SQLite) statements that failed."},
};

int sl_ops_init(sl_ops *ops, sl_daemon *d, int argc, char **argv)
{
    const sl_config *cfg = &d->cfg;
    int err;

    memset(ops, 0, sizeof(*ops));
    ops->d = d;
    ops->argc = argc;
    ops->argv = argv;
    sl_log_set_level(cfg->log_level);
    sl_log_set_format(cfg->log_format);
    if (cfg->tls_cert[0]) {
        ops->tls.cert_file = cfg->tls_cert;
        ops->tls.key_file = cfg->tls_key;
        ops->tls.ca_file = cfg->tls_client_ca[0] ? cfg->tls_client_ca : NULL;
    }
    if (cfg->token_file[0] && (err = load_tokens(ops, cfg->token_file, &ops->auth)) != 0)
        return err;
    if ((err = sl_metrics_new(&ops->metrics)) != 0)
        return err;
    for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++)
        sl_metrics_declare(ops->metrics, families[i].name, families[i].type, families[i].help);
    sl_metrics_on_collect(ops->metrics, collect, ops);
    return 0;
}

void sl_ops_rpc_opts(sl_ops *ops, sl_rpc_server_opts *opts)
{
    opts->tls = ops->tls.cert_file ? &ops->tls : NULL;
    opts->authorize = authorize;
    opts->authorize_arg = ops;
    opts->observer = observe_call;
    opts->observer_arg = ops;
}

/* Gauges that need the catalog are refreshed on the loop, which owns it. */
static void on_refresh(uv_timer_t *t)
{
    static const char *const names[] = {NULL, "WRITING", "COMPLETE", "INCOMPLETE"};
    sl_ops *ops = t->data;
    uint64_t counts[4];
    char labels[32];

    if (!ops->d->cat || sl_cat_ckpt_count_states(ops->d->cat, counts) != 0)
        return;
    for (int i = 1; i < 4; i++) {
        snprintf(labels, sizeof(labels), "state=\"%s\"", names[i]);
        sl_metrics_set(ops->metrics, "sluice_checkpoints", labels, (double)counts[i]);
    }
}

int sl_ops_start(sl_ops *ops)
{
    const sl_config *cfg = &ops->d->cfg;
    int err;

    if (cfg->metrics_listen[0]) {
        err = sl_metrics_listen(ops->metrics, cfg->metrics_listen, &ops->metrics_port);
        if (err) {
            sl_log_error("metrics_failed", "listen=%s error=\"%s\"", cfg->metrics_listen,
                         sl_strerror(err));
            return err;
        }
        sl_log_info("metrics_listening", "addr=%s port=%d", cfg->metrics_listen, ops->metrics_port);
    }
    uv_timer_init(&ops->d->loop, &ops->refresh);
    ops->refresh.data = ops;
    uv_timer_start(&ops->refresh, on_refresh, 0, 5000);
    ops->refresh_open = 1;
    uv_signal_init(&ops->d->loop, &ops->sighup);
    ops->sighup.data = ops;
    uv_signal_start(&ops->sighup, on_sighup, SIGHUP);
    ops->sighup_open = 1;
    if (!ops->auth && !ops->tls.cert_file && strncmp(cfg->listen, "127.", 4) != 0 &&
        strncmp(cfg->listen, "localhost:", 10) != 0 && strncmp(cfg->listen, "[::1]", 5) != 0)
        sl_log_warn("insecure_listen",
                    "listen=%s hint=\"no TLS and no token file: anyone who "
                    "reaches this address can call every RPC\"",
                    cfg->listen);
    return 0;
}

static void on_watchdog(uv_timer_t *t)
{
    /* Runs on the loop: a ping proves the loop is not stuck. */
    sd_notify(0, "WATCHDOG=1");
}

void sl_ops_ready(sl_ops *ops, const char *status)
{
    uint64_t usec = 0;

    sd_notifyf(0, "READY=1\nSTATUS=%s", status);
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
        uint64_t every_ms = usec / 2000 ? usec / 2000 : 1;
        uv_timer_init(&ops->d->loop, &ops->watchdog);
        uv_timer_start(&ops->watchdog, on_watchdog, every_ms, every_ms);
        ops->watchdog_open = 1;
        sl_log_info("watchdog", "interval_ms=%llu", (unsigned long long)every_ms);
    }
}

void sl_ops_stopping(sl_ops *ops)
{
    sd_notify(0, "STOPPING=1\nSTATUS=stopping: finishing in-flight calls");
}

void sl_ops_stop(sl_ops *ops)
{
    if (ops->refresh_open) {
        uv_close((uv_handle_t *)&ops->refresh, NULL);
        ops->refresh_open = 0;
    }
    if (ops->watchdog_open) {
        uv_close((uv_handle_t *)&ops->watchdog, NULL);
        ops->watchdog_open = 0;
    }
    if (ops->sighup_open) {
        uv_close((uv_handle_t *)&ops->sighup, NULL);
        ops->sighup_open = 0;
    }
}

void sl_ops_free(sl_ops *ops)
{
    sl_metrics_free(ops->metrics);
    ops->metrics = NULL;
    sl_auth_free(ops->auth);
    ops->auth = NULL;
}
