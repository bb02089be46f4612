/* Operations: TLS settings, bearer-token authorization (reloaded on SIGHUP), Prometheus metrics
 * and the call observer that feeds logs and metrics. Loop thread unless noted. */
#ifndef SL_OPS_H
#define SL_OPS_H

#include "auth.h"
#include "config.h"
#include "metrics.h"
#include "rpc/server.h"

#include <stdatomic.h>
#include <stdio.h>
#include <uv.h>

struct sl_daemon;

typedef struct sl_ops {
    struct sl_daemon *d;
    sl_rpc_tls tls;
    sl_auth *auth; /* NULL: no token file, every call allowed */
    sl_metrics *metrics;
    int metrics_port;
    uv_signal_t sighup;
    int sighup_open;
    uv_timer_t watchdog; /* systemd watchdog pings, when WatchdogSec is set */
    int watchdog_open;
    uv_timer_t refresh; /* catalog-derived gauges (checkpoints by state) */
    int refresh_open;
    /* The catalog file watch (sl_cat_check every second). Once the file was removed or replaced
     * (catalog_lost), write calls are refused, health is NOT_SERVING and the watchdog is no
     * longer fed: only a restart mends it. */
    uv_timer_t catalog_timer;
    int catalog_timer_open;
    int catalog_lost;
    /* The same timer looks whether the catalog server answers (sl_cat_unreachable): while it has
     * answered nothing for the catalog timeout, every call that needs it fails, so health is
     * NOT_SERVING (a load balancer sends no new work here); SERVING again at its first answer.
     * The watchdog is still fed: a restart would not bring the server back. */
    int catalog_down;
    /* The listener self-check: every cfg.self_check_ms the daemon connects to its own address
     * and expects an answer (gRPC 1.51 stops accepting for good after accept4 fails with
     * EMFILE, while everything else keeps working). After SELF_CHECK_FAILS failures in a row
     * the listener counts as broken: health turns NOT_SERVING and the watchdog is no longer
     * fed, so the supervisor restarts the daemon. */
    uv_timer_t check_timer;
    int check_timer_open;
    uv_tcp_t check_conn;
    uv_timer_t check_deadline;
    uv_connect_t check_req;
    uv_write_t check_write;
    int check_busy;  /* a check's handles are open */
    int check_ok;    /* the current check got an answer */
    int check_fails; /* failures in a row */
    int listener_broken;
    struct sockaddr_storage check_addr; /* where the daemon listens, as a client reaches it */
    char check_buf[256];
    /* The store's health (store_health.c): every second the loop reads how the remote
     * store's requests ended; once they all failed for cfg.s3_unhealthy_after_ms (3 at least),
     * sluice.v1.Checkpoints turns NOT_SERVING until one succeeds. While requests fail, or none
     * succeeded for a while, a probe (one HEAD of the bucket) runs on the worker pool, one at a
     * time, so that a failure is confirmed and a recovery seen without traffic. */
    uv_timer_t store_timer;
    int store_timer_open;
    uv_work_t store_probe;
    int store_probe_busy;
    int store_unhealthy;
    int64_t store_probed_ms; /* when the last probe started */
    int argc;
    char **argv;
    /* Idle timeouts the call observer saw (loop thread writes, the HTTP thread reads); those of
     * calls ended before their first message come from the RPC layer's counters. */
    atomic_uint_least64_t idle_timeouts;
} sl_ops;

/* Failures in a row after which the listener counts as broken. */
#define SL_SELF_CHECK_FAILS 3

/* Apply the log settings, raise the soft limit of open files to the hard one, load the token
 * file and create the metrics registry. Returns 0 or an error after logging what was wrong. */
int sl_ops_init(sl_ops *ops, struct sl_daemon *d, int argc, char **argv);

/* --check-config: load the token file, read the TLS files, check the metrics address, then
 * print the effective configuration to `out`. Returns 0 if all is well, else the first error
 * (printed to stderr). */
int sl_ops_check_config(const sl_config *cfg, FILE *out);

/* --replica-id has only letters, digits and . _ : - (it is a metric label and a log value):
 * 0, or SL_EINVAL and a sentence in msg. */
int sl_ops_check_replica(const sl_config *cfg, char *msg, size_t len);

/* Set health from everything ops watches: every service SERVING while sl_ops_healthy, else
 * NOT_SERVING; sluice.v1.Checkpoints also NOT_SERVING while the store is unhealthy. */
void sl_ops_health_update(sl_ops *ops);

/* Start and stop the store's health watch (store_health.c; nothing with a local store). */
void sl_ops_store_watch_start(sl_ops *ops);
void sl_ops_store_watch_stop(sl_ops *ops);

/* The S3 client's settings from the configuration (store URL, addressing, endpoint, region,
 * CA, TLS, retry deadline, credentials), as the daemon and --check-config both use them.
 * Returns 0, or an error with msg (never a secret). The caller clears *s3 (explicit_bzero). */
struct sl_s3_cfg;
int sl_ops_s3_cfg(const sl_config *cfg, struct sl_s3_cfg *s3, char *msg, size_t msglen);

/* Fill the RPC server options that belong to operations: TLS, authorization and the observer. */
void sl_ops_rpc_opts(sl_ops *ops, sl_rpc_server_opts *opts);

/* Be told when the catalog file is removed or replaced (sl_cat_on_lost); call once the catalog
 * is open. From then on calls that write (trainer and admin methods) are refused with
 * FAILED_PRECONDITION naming the catalog's problem. */
void sl_ops_watch_catalog(sl_ops *ops);

/* Whether health should say SERVING: the listener accepts, the catalog file is the one opened, the
 * catalog server answers and the daemon is not stopping. */
int sl_ops_healthy(const sl_ops *ops);

/* Start the metrics endpoint (if configured), the SIGHUP handler and the catalog file check
 * (every second). */
int sl_ops_start(sl_ops *ops);

/* Tell systemd (if it supervises us) that the daemon serves, with a status line; start the
 * watchdog pings (when WatchdogSec is set) and the listener self-check (d->listen must hold the
 * bound address). */
void sl_ops_ready(sl_ops *ops, const char *status);

/* Tell systemd the daemon is stopping. */
void sl_ops_stopping(sl_ops *ops);

/* Close the SIGHUP handler, the watchdog timer and the self-check (when the daemon stops). */
void sl_ops_stop(sl_ops *ops);

/* Free everything (after the loop has run its last callbacks). */
void sl_ops_free(sl_ops *ops);

#endif
