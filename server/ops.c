#include "ops.h"

#include "catalog/ckpt.h"
#include "daemon.h"
#include "err.h"
#include "log.h"
#include "store/s3.h"
#include "store/store.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

/* Every method that needs the trainer or admin role writes (to the catalog, to the store or
 * both) and every reader method only reads (docs/checkpoints.md and docs/feeding.md list them).
 * Before such a call the catalog file is checked (sl_cat_check: two stat calls); once it was
 * removed or replaced, the call is refused before its handler runs, with the problem in the
 * message. */
static int authorize(const char *method, unsigned access, const char *token, const char *scope,
                     char *msg, size_t len, void *arg)
{
    sl_ops *ops = arg;
    int err = sl_auth_check(ops->auth, method, access, token, scope, msg, len);

    if (err)
        sl_log_limited(SL_LOG_WARN, 1000, "rpc_refused", "method=%s reason=%s", method,
                       err == SL_EPERM ? "permission_denied" : "unauthenticated");
    else if ((access == SL_ACCESS_TRAINER || access == SL_ACCESS_ADMIN) && ops->d->cat &&
             sl_cat_check(ops->d->cat) != 0) {
        snprintf(msg, len, "%s: writes are refused until sluiced is restarted",
                 sl_cat_problem(ops->d->cat));
        sl_log_limited(SL_LOG_WARN, 1000, "rpc_refused", "method=%s reason=catalog_lost", method);
        err = SL_ECATLOST;
    }
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
    else if (st->end == SL_RPC_END_BUDGET)
        sl_metrics_add(ops->metrics, "sluice_rpc_refused_total", "limit=\"health\"", 1);
    else if (st->end == SL_RPC_END_IDLE)
        atomic_fetch_add(&ops->idle_timeouts, 1);
    /* Every observed call is of a registered method (the RPC layer answers unknown ones itself),
     * so method labels come from the service tables, never from a client. */
    {
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

/* What the RPC layer counts itself: calls it answered before the loop (so the call observer never
 * saw them), and its gauges. */
static void collect_rpc(sl_metrics *m, sl_ops *ops)
{
    sl_rpc_server *rpc = ops->d->rpc;
    sl_rpc_server_counters n;

    sl_rpc_server_get_counters(rpc, &n);
    sl_metrics_set(m, "sluice_rpc_idle_timeouts_total", NULL,
                   (double)(atomic_load(&ops->idle_timeouts) + n.idle));
    sl_metrics_set(m, "sluice_rpc_active_streams", NULL, (double)sl_rpc_server_live_streams(rpc));
    sl_metrics_set(m, "sluice_rpc_pending_calls", NULL, (double)n.pending);
    sl_metrics_set(m, "sluice_rpc_requests_total", "method=\"unknown\",code=\"UNIMPLEMENTED\"",
                   (double)n.unknown);
    sl_metrics_set(m, "sluice_rpc_dropped_total", "reason=\"reset\"", (double)n.reset);
    sl_metrics_set(m, "sluice_rpc_dropped_total", "reason=\"no_request\"", (double)n.no_request);
    sl_metrics_set(m, "sluice_rpc_dropped_total", "reason=\"blocked_address\"", (double)n.blocked);
    sl_metrics_set(m, "sluice_rpc_refused_total", "limit=\"max_peer_calls\"", (double)n.peer_limit);
    sl_metrics_set(m, "sluice_rpc_refused_total", "limit=\"max_pending\"", (double)n.busy);
    sl_metrics_set(m, "sluice_rpc_flood_connections_closed_total", NULL, (double)n.cut);
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
    if (ops->d->cat) {
        sl_metrics_set(m, "sluice_catalog_errors_total", NULL, (double)sl_cat_errors(ops->d->cat));
        sl_metrics_set(m, "sluice_catalog_blocking_total", NULL,
                       (double)sl_cat_blocking(ops->d->cat));
    }
    if (ops->d->quar) {
        sl_quar_counts q;
        sl_quar_get_counts(ops->d->quar, &q);
        sl_metrics_set(m, "sluice_quarantined_files_total", NULL, (double)q.moved);
        sl_metrics_set(m, "sluice_quarantine_files", NULL, (double)q.files);
        sl_metrics_set(m, "sluice_quarantine_bytes", NULL, (double)q.bytes);
    }
    if (ops->d->rpc)
        collect_rpc(m, ops);
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

/* Every connection costs an fd, and gRPC 1.51 never accepts again once accept4 failed with EMFILE:
 * use all the fds the hard limit allows (the soft limit is often 1024). */
static void raise_nofile(void)
{
    struct rlimit rl;
    rlim_t was;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max)
        return;
    was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    /* An unlimited hard limit is refused above the kernel's nr_open (1 Mi by default). */
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        rl.rlim_cur = 1 << 20;
        if (rl.rlim_cur <= was || setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            sl_log_warn("fd_limit_not_raised", "soft=%llu error=\"%s\"", (unsigned long long)was,
                        strerror(errno));
            return;
        }
    }
    sl_log_info("fd_limit_raised", "from=%llu to=%llu", (unsigned long long)was,
                (unsigned long long)rl.rlim_cur);
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

/* The store settings as the daemon would use them, without connecting: the URL, the
 * addressing, the credentials (file or environment). */
int sl_ops_s3_cfg(const sl_config *c, sl_s3_cfg *s3, char *msg, size_t msglen)
{
    int err = 0;

    memset(s3, 0, sizeof(*s3));
    if (strncmp(c->store, "s3://", 5) != 0) {
        snprintf(msg, msglen, "--store '%.256s' is not s3://BUCKET[/PREFIX]", c->store);
        err = SL_EINVAL;
    }
    if (!err)
        err = sl_s3_cfg_url(s3, c->store, msg, msglen);
    if (!err && strcmp(c->s3_addressing, "path") != 0 && strcmp(c->s3_addressing, "virtual") != 0 &&
        strcmp(c->s3_addressing, "auto") != 0) {
        snprintf(msg, msglen, "--s3-addressing '%.32s' is not path, virtual or auto",
                 c->s3_addressing);
        err = SL_EINVAL;
    }
    if (err)
        return err;
    snprintf(s3->endpoint, sizeof(s3->endpoint), "%s", c->s3_endpoint);
    snprintf(s3->region, sizeof(s3->region), "%s", c->s3_region);
    snprintf(s3->ca_file, sizeof(s3->ca_file), "%s", c->s3_ca_file);
    s3->path_style = strcmp(c->s3_addressing, "path") == 0 ||
                     (strcmp(c->s3_addressing, "auto") == 0 && c->s3_endpoint[0]);
    s3->tls_no_verify = !c->s3_tls_verify;
    s3->retry_deadline_ms = (uint32_t)c->s3_retry_deadline_ms;
    s3->request_timeout_ms = (uint32_t)c->s3_request_timeout_ms;
    s3->list_max_pages = (uint32_t)c->s3_list_max_pages;
    return sl_s3_cfg_credentials(s3, c->s3_credentials_file, msg, msglen);
}

static int check_store(const sl_config *cfg)
{
    char msg[512] = "";
    sl_s3_cfg s3;
    int err = sl_ops_s3_cfg(cfg, &s3, msg, sizeof(msg));

    if (!err && cfg->s3_ca_file[0])
        err = check_pem("--s3-ca-file", cfg->s3_ca_file);
    explicit_bzero(&s3, sizeof(s3));
    if (err && msg[0])
        fprintf(stderr, "sluiced: %s\n", msg);
    return err;
}

int sl_ops_check_replica(const sl_config *cfg, char *msg, size_t len)
{
    for (const char *c = cfg->replica_id; *c; c++)
        if (!isalnum((unsigned char)*c) && !strchr("._:-", *c)) {
            /* It becomes a metric label and a log value unquoted. */
            snprintf(msg, len,
                     "--replica-id '%.64s': only letters, digits and . _ : - (the character at "
                     "offset %d is not)",
                     cfg->replica_id, (int)(c - cfg->replica_id));
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
    if (cfg->store[0] && (err = check_store(cfg)) != 0)
        return err;
    if ((err = sl_ops_check_replica(cfg, msg, sizeof(msg))) != 0 ||
        (err = sl_cat_spec_check(cfg->catalog, cfg->catalog_password_file, msg, sizeof(msg))) !=
            0) {
        fprintf(stderr, "sluiced: %s\n", msg);
        return err;
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
     "Calls refused with RESOURCE_EXHAUSTED by a limit (max_calls, max_job_streams, "
     "max_peer_calls, max_pending, health, deep_verifies)."},
    {"sluice_rpc_dropped_total", SL_METRIC_COUNTER,
     "Calls the RPC layer ended before any handler saw them, by reason: reset (the client reset "
     "it before its request), no_request (ended without one), blocked_address (from an address "
     "blocked after a flood)."},
    {"sluice_rpc_flood_connections_closed_total", SL_METRIC_COUNTER,
     "Connections closed for a flood (500 calls reset, without a request or to unknown methods "
     "within a second, or 1024 calls waiting for their request); their address is then blocked "
     "for 10 s."},
    {"sluice_rpc_pending_calls", SL_METRIC_GAUGE,
     "Calls that arrived and that the event loop has not started yet."},
    {"sluice_self_check_failures_total", SL_METRIC_COUNTER,
     "Listener self-checks (a connection to the daemon's own address) that got no answer."},
    {"sluice_store_healthy", SL_METRIC_GAUGE,
     "With object storage: 1 while the store answers, 0 once every request failed for "
     "--s3-unhealthy-after (sluice.v1.Checkpoints is then NOT_SERVING)."},
    {"sluice_listener_accepting", SL_METRIC_GAUGE,
     "1 while the listener self-check passes, 0 once it failed 3 times in a row (health is then "
     "NOT_SERVING and the systemd watchdog is not fed)."},
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
    {"sluice_verify_hash_jobs", SL_METRIC_GAUGE,
     "Shards being hashed by deep verifications on the worker pool (at most max-deep-verifies)."},
    {"sluice_catalog_errors_total", SL_METRIC_COUNTER, "Catalog statements that failed."},
    {"sluice_replica_info", SL_METRIC_GAUGE,
     "1, labelled with this replica's identity (--replica-id) and its catalog engine."},
    {"sluice_catalog_lost", SL_METRIC_GAUGE,
     "1 once the catalog file was found removed or replaced while the daemon ran (writes are "
     "then refused and health is NOT_SERVING until a restart), else 0."},
    {"sluice_catalog_reachable", SL_METRIC_GAUGE,
     "0 while the catalog server has answered nothing for the catalog timeout (health is then "
     "NOT_SERVING), else 1."},
    {"sluice_quarantined_files_total", SL_METRIC_COUNTER,
     "Files the catalog did not know, moved to <data dir>/quarantine instead of being removed."},
    {"sluice_quarantine_files", SL_METRIC_GAUGE,
     "Files in <data dir>/quarantine (as of the last walk of it, at start or Admin.GetInfo, plus "
     "the files moved since)."},
    {"sluice_quarantine_bytes", SL_METRIC_GAUGE, "Bytes of the files in <data dir>/quarantine."},
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
    raise_nofile();
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
    const sl_config *cfg = &ops->d->cfg;

    opts->max_peer_calls = cfg->max_peer_calls;
    opts->max_connection_idle_ms = cfg->max_connection_idle_ms;
    opts->max_connection_age_ms = cfg->max_connection_age_ms;
    opts->tls = ops->tls.cert_file ? &ops->tls : NULL;
    opts->authorize = authorize;
    opts->authorize_arg = ops;
    opts->observer = observe_call;
    opts->observer_arg = ops;
}

/* ---- the catalog file ---- */

/* Save the catalog the daemon has open, the only copy left of a removed one and the newest of a
 * replaced one, as <data dir>/quarantine/catalog-lost-<UTC time>.db; but not into a data dir that
 * is no longer the one this daemon locked (its path may be another daemon's now). The file is
 * made new (0600, never replacing anything) with no link followed on its way, and the catalog
 * writes into that fd: a link planted at the quarantine cannot send the copy elsewhere. */
static int save_catalog(sl_daemon *d, const char *path)
{
    int fd, err;

    if ((err = sl_store_mkdirs(sl_quar_path(d->quar))) != 0)
        return err;
    fd = sl_store_open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return fd;
    if ((err = sl_cat_copy(d->cat, fd)) == 0 && fsync(fd) != 0)
        err = -errno;
    if (close(fd) != 0 && !err)
        err = -errno;
    if (err)
        sl_store_unlink(path); /* the partial copy this call made */
    else
        err = sl_store_fsync_dir(sl_quar_path(d->quar));
    return err;
}

static void rescue_catalog(sl_ops *ops)
{
    sl_daemon *d = ops->d;
    char path[PATH_MAX + 64], stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    int err;

    if (d->lock_fd >= 0 && sl_store_same_file(d->lock_fd, d->data_dir) != 1) {
        sl_log_warn("catalog_not_rescued", "reason=\"the data dir is not this daemon's any more\"");
        return;
    }
    gmtime_r(&now, &tm);
    strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
    snprintf(path, sizeof(path), "%s/catalog-lost-%s.db", sl_quar_path(d->quar), stamp);
    if ((err = save_catalog(d, path)) != 0)
        sl_log_error("catalog_not_rescued", "path=%s error=\"%s\"", path, sl_store_strerror(err));
    else
        sl_log_warn("catalog_rescued",
                    "path=%s hint=\"a copy of the catalog this daemon had open: restore it (stop, "
                    "move it to catalog.db, start) to keep what it knew\"",
                    path);
}

static void on_catalog_lost(const char *problem, void *arg)
{
    sl_ops *ops = arg;

    ops->catalog_lost = 1;
    if (ops->d->quar)
        rescue_catalog(ops);
    sl_metrics_set(ops->metrics, "sluice_catalog_lost", NULL, 1);
    if (ops->d->health)
        sl_health_set_all(ops->d->health, SL_HEALTH_NOT_SERVING);
    /* Under systemd, restart now: a restart opens the file now at the path. */
    if (ops->watchdog_open)
        sd_notify(0, "WATCHDOG=trigger\nSTATUS=catalog file removed or replaced: writes refused");
}

/* Health follows whether the catalog server answers; each change is logged once. */
static void check_catalog_reach(sl_ops *ops)
{
    int down = sl_cat_unreachable(ops->d->cat);

    if (down == ops->catalog_down)
        return;
    ops->catalog_down = down;
    sl_metrics_set(ops->metrics, "sluice_catalog_reachable", NULL, down ? 0 : 1);
    if (down) {
        sl_log_error("catalog_down",
                     "timeout_ms=%llu hint=\"the catalog server answered nothing for the catalog "
                     "timeout: health is NOT_SERVING until it answers again\"",
                     (unsigned long long)ops->d->cfg.catalog_timeout_ms);
        sl_health_set_all(ops->d->health, SL_HEALTH_NOT_SERVING);
        return;
    }
    sl_log_info("catalog_up", NULL);
    if (sl_ops_healthy(ops))
        sl_health_set_all(ops->d->health, SL_HEALTH_SERVING);
}

static void on_catalog_check(uv_timer_t *t)
{
    sl_ops *ops = t->data;

    if (!ops->d->cat)
        return;
    sl_cat_check(ops->d->cat);
    if (ops->d->health && !ops->d->stopping)
        check_catalog_reach(ops);
}

void sl_ops_watch_catalog(sl_ops *ops)
{
    sl_cat_on_lost(ops->d->cat, on_catalog_lost, ops);
}

int sl_ops_healthy(const sl_ops *ops)
{
    return !ops->listener_broken && !ops->catalog_lost && !ops->catalog_down && !ops->d->stopping;
}

void sl_ops_health_update(sl_ops *ops)
{
    int ok = sl_ops_healthy(ops);

    if (!ops->d->health)
        return;
    sl_health_set_all(ops->d->health, ok ? SL_HEALTH_SERVING : SL_HEALTH_NOT_SERVING);
    if (ok && ops->store_unhealthy)
        sl_health_set(ops->d->health, "sluice.v1.Checkpoints", SL_HEALTH_NOT_SERVING);
}

/* Gauges that need the catalog are refreshed on the loop, which owns it, in the catalog lane. */
static void refresh(void *a, int b)
{
    static const char *const names[] = {NULL, "WRITING", "COMPLETE", "INCOMPLETE"};
    sl_ops *ops = a;
    uint64_t counts[4];
    char labels[32];

    (void)b;
    if (!ops->d->cat || sl_cat_ckpt_count_states(ops->d->cat, counts) != 0)
        return;
    for (int i = 1; i < 4; i++) {
        snprintf(labels, sizeof(labels), "state=\"%s\"", names[i]);
        sl_metrics_set(ops->metrics, "sluice_checkpoints", labels, (double)counts[i]);
    }
}

static void on_refresh(uv_timer_t *t)
{
    sl_ops *ops = t->data;

    if (ops->d->cat)
        sl_cat_lane_run(ops->d->cat, refresh, ops, 0);
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
    sl_metrics_set(ops->metrics, "sluice_catalog_lost", NULL, ops->catalog_lost);
    sl_metrics_set(ops->metrics, "sluice_catalog_reachable", NULL, !ops->catalog_down);
    {
        /* The replica id has only [A-Za-z0-9._:-] (checked at start): no escaping needed. */
        char labels[400];
        snprintf(labels, sizeof(labels), "replica=\"%s\",catalog=\"%s\"", ops->d->replica,
                 sl_cat_engine(ops->d->cat));
        sl_metrics_set(ops->metrics, "sluice_replica_info", labels, 1);
    }
    uv_timer_init(&ops->d->loop, &ops->catalog_timer);
    ops->catalog_timer.data = ops;
    uv_timer_start(&ops->catalog_timer, on_catalog_check, 1000, 1000);
    ops->catalog_timer_open = 1;
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
    sl_ops *ops = t->data;

    /* Runs on the loop: a ping proves the loop is not stuck. None while the listener is broken
     * or the catalog file is lost: a daemon nobody can connect to, or that cannot write, is of
     * no use, and a restart mends it. */
    if (!ops->listener_broken && !ops->catalog_lost)
        sd_notify(0, "WATCHDOG=1");
}

/* ---- the listener self-check ---- */

/* The address a client on this host reaches the daemon at: the bound one, a wildcard host
 * replaced by loopback; a host name is resolved once, here. Returns 0, or -1 (no check). */
static int check_target(sl_ops *ops)
{
    const char *listen = ops->d->listen, *colon = strrchr(listen, ':');
    char host[256];
    size_t n;
    int port;
    uv_getaddrinfo_t gai;

    if (!colon || strncmp(listen, "unix:", 5) == 0 || (port = atoi(colon + 1)) <= 0 ||
        (size_t)(colon - listen) >= sizeof(host))
        return -1;
    snprintf(host, sizeof(host), "%.*s", (int)(colon - listen), listen);
    n = strlen(host);
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']') {
        memmove(host, host + 1, n - 2);
        host[n - 2] = '\0';
    }
    if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "") == 0 || strcmp(host, "localhost") == 0)
        snprintf(host, sizeof(host), "127.0.0.1");
    else if (strcmp(host, "::") == 0)
        snprintf(host, sizeof(host), "::1");
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ops->check_addr) == 0 ||
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ops->check_addr) == 0)
        return 0;
    /* Without a callback uv_getaddrinfo runs synchronously: once, at start. */
    if (uv_getaddrinfo(&ops->d->loop, &gai, NULL, host, NULL, NULL) != 0)
        return -1;
    memcpy(&ops->check_addr, gai.addrinfo->ai_addr, gai.addrinfo->ai_addrlen);
    if (ops->check_addr.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&ops->check_addr)->sin6_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in *)&ops->check_addr)->sin_port = htons((uint16_t)port);
    uv_freeaddrinfo(gai.addrinfo);
    return 0;
}

static void check_set_broken(sl_ops *ops, int broken)
{
    if (broken == ops->listener_broken)
        return;
    ops->listener_broken = broken;
    sl_metrics_set(ops->metrics, "sluice_listener_accepting", NULL, broken ? 0 : 1);
    if (broken) {
        sl_log_error("listener_broken",
                     "failures=%d hint=\"new connections get no answer (gRPC stops accepting "
                     "once it ran out of file descriptors): health is NOT_SERVING and the "
                     "watchdog is no longer fed, so that the supervisor restarts the daemon\"",
                     ops->check_fails);
        sl_health_set_all(ops->d->health, SL_HEALTH_NOT_SERVING);
        /* Ask systemd to act now rather than at the next missed ping. */
        if (ops->watchdog_open)
            sd_notify(0, "WATCHDOG=trigger\nSTATUS=listener broken: not accepting connections");
    } else {
        sl_log_info("listener_recovered", NULL);
        sl_ops_health_update(ops);
    }
}

/* Both handles of a check closed: count its outcome. */
static void check_closed(uv_handle_t *h)
{
    sl_ops *ops = h->data;

    if (--ops->check_busy > 0 || ops->d->stopping)
        return;
    if (ops->check_ok) {
        sl_log_debug("self_check_ok", NULL);
        ops->check_fails = 0;
        check_set_broken(ops, 0);
        return;
    }
    ops->check_fails++;
    sl_metrics_add(ops->metrics, "sluice_self_check_failures_total", NULL, 1);
    sl_log_warn("self_check_failed", "addr=%s failures_in_a_row=%d", ops->d->listen,
                ops->check_fails);
    if (ops->check_fails >= SL_SELF_CHECK_FAILS && !ops->d->stopping)
        check_set_broken(ops, 1);
}

static void check_end(sl_ops *ops, int ok)
{
    if (uv_is_closing((uv_handle_t *)&ops->check_conn))
        return;
    ops->check_ok = ok;
    uv_close((uv_handle_t *)&ops->check_conn, check_closed);
    uv_close((uv_handle_t *)&ops->check_deadline, check_closed);
}

static void check_alloc(uv_handle_t *h, size_t size, uv_buf_t *buf)
{
    sl_ops *ops = h->data;

    buf->base = ops->check_buf;
    buf->len = sizeof(ops->check_buf);
}

/* Any answer means that the daemon accepted the connection: gRPC's SETTINGS frame in plaintext;
 * with TLS, the connection closed on a preface the handshake did not expect. */
static void check_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    if (n != 0)
        check_end(s->data, 1);
}

static void check_written(uv_write_t *w, int status)
{
}

static void check_connected(uv_connect_t *req, int status)
{
    /* The HTTP/2 client preface and an empty SETTINGS frame. */
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\4\0\0\0\0\0";
    sl_ops *ops = req->data;
    uv_buf_t buf = uv_buf_init((char *)preface, sizeof(preface) - 1);

    if (status == UV_ECANCELED)
        return;
    if (status != 0 ||
        uv_write(&ops->check_write, (uv_stream_t *)&ops->check_conn, &buf, 1, check_written) != 0 ||
        uv_read_start((uv_stream_t *)&ops->check_conn, check_alloc, check_read) != 0)
        check_end(ops, 0);
}

static void check_timeout(uv_timer_t *t)
{
    check_end(t->data, 0);
}

static void on_check(uv_timer_t *t)
{
    sl_ops *ops = t->data;
    uint64_t limit = ops->d->cfg.self_check_ms < 5000 ? ops->d->cfg.self_check_ms : 5000;

    if (ops->check_busy || ops->d->stopping)
        return;
    ops->check_ok = 0;
    ops->check_busy = 2;
    uv_tcp_init(&ops->d->loop, &ops->check_conn);
    uv_timer_init(&ops->d->loop, &ops->check_deadline);
    ops->check_conn.data = ops->check_deadline.data = ops->check_req.data = ops;
    uv_timer_start(&ops->check_deadline, check_timeout, limit, 0);
    /* Out of fds counts as a failure: the listener has then most likely run out of them too. */
    if (uv_tcp_connect(&ops->check_req, &ops->check_conn, (struct sockaddr *)&ops->check_addr,
                       check_connected) != 0)
        check_end(ops, 0);
}

static void check_start(sl_ops *ops)
{
    uint64_t every = ops->d->cfg.self_check_ms;

    sl_metrics_set(ops->metrics, "sluice_listener_accepting", NULL, 1);
    if (every == 0 || check_target(ops) != 0)
        return;
    uv_timer_init(&ops->d->loop, &ops->check_timer);
    ops->check_timer.data = ops;
    uv_timer_start(&ops->check_timer, on_check, every, every);
    ops->check_timer_open = 1;
}

void sl_ops_ready(sl_ops *ops, const char *status)
{
    uint64_t usec = 0;

    sd_notifyf(0, "READY=1\nSTATUS=%s", status);
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
        uint64_t every_ms = usec / 2000 ? usec / 2000 : 1;
        uv_timer_init(&ops->d->loop, &ops->watchdog);
        ops->watchdog.data = ops;
        uv_timer_start(&ops->watchdog, on_watchdog, every_ms, every_ms);
        ops->watchdog_open = 1;
        sl_log_info("watchdog", "interval_ms=%llu", (unsigned long long)every_ms);
    }
    check_start(ops);
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
    if (ops->catalog_timer_open) {
        uv_close((uv_handle_t *)&ops->catalog_timer, NULL);
        ops->catalog_timer_open = 0;
    }
    if (ops->watchdog_open) {
        uv_close((uv_handle_t *)&ops->watchdog, NULL);
        ops->watchdog_open = 0;
    }
    if (ops->check_timer_open) {
        uv_close((uv_handle_t *)&ops->check_timer, NULL);
        ops->check_timer_open = 0;
    }
    if (ops->check_busy)
        check_end(ops, ops->check_ok);
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
