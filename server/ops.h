/* Operations: TLS settings, bearer-token authorization (reloaded on SIGHUP), Prometheus metrics
 * and the call observer that feeds logs and metrics. Loop thread unless noted. */
#ifndef SL_OPS_H
#define SL_OPS_H

#include "auth.h"
#include "config.h"
#include "metrics.h"
#include "rpc/server.h"

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
    int argc;
    char **argv;
} sl_ops;

/* Apply the log settings, load the token file and create the metrics registry. Returns 0 or an
 * error after logging what was wrong. */
int sl_ops_init(sl_ops *ops, struct sl_daemon *d, int argc, char **argv);

/* --check-config: load the token file, read the TLS files, check the metrics address, then
 * print the effective configuration to `out`. Returns 0 if all is well, else the first error
 * (printed to stderr). */
int sl_ops_check_config(const sl_config *cfg, FILE *out);

/* Fill the RPC server options that belong to operations: TLS, authorization and the observer. */
void sl_ops_rpc_opts(sl_ops *ops, sl_rpc_server_opts *opts);

/* Start the metrics endpoint (if configured) and the SIGHUP handler. */
int sl_ops_start(sl_ops *ops);

/* Tell systemd (if it supervises us) that the daemon serves, with a status line. */
void sl_ops_ready(sl_ops *ops, const char *status);

/* Tell systemd the daemon is stopping. */
void sl_ops_stopping(sl_ops *ops);

/* Close the SIGHUP handler and the watchdog timer (when the daemon stops). */
void sl_ops_stop(sl_ops *ops);

/* Free everything (after the loop has run its last callbacks). */
void sl_ops_free(sl_ops *ops);

#endif
