/* Prometheus metrics: a registry of counters, gauges and RPC latency histograms, exposed in the
 * text exposition format over HTTP by libmicrohttpd on its own listen address.
 *
 * Every function is thread-safe: the loop thread updates, the HTTP thread renders.
 */
#ifndef SL_METRICS_H
#define SL_METRICS_H

#include "rpc/rpc.h"

#include <stddef.h>
#include <stdint.h>

typedef struct sl_metrics sl_metrics;

typedef enum sl_metric_type {
    SL_METRIC_COUNTER = 0,
    SL_METRIC_GAUGE = 1,
} sl_metric_type;

/* Called at every scrape, before rendering, to refresh gauges (e.g. process RSS). Runs on the
 * HTTP thread: it may only use thread-safe state. */
typedef void (*sl_metrics_collect_fn)(sl_metrics *m, void *arg);

/* Create an empty registry. Returns 0 or -ENOMEM. Free with sl_metrics_free. */
int sl_metrics_new(sl_metrics **out);

/* Stop serving (if started) and free. Accepts NULL. */
void sl_metrics_free(sl_metrics *m);

/* Serve GET /metrics on `addr` ("host:port", IPv4 or [IPv6]; port 0 picks one); *port receives
 * the bound port. Returns 0, SL_EINVAL for a bad address, SL_EUNAVAILABLE if it cannot bind. */
int sl_metrics_listen(sl_metrics *m, const char *addr, int *port);

/* Check that `addr` is a valid listen address for sl_metrics_listen. Returns 0 or SL_EINVAL. */
int sl_metrics_parse_addr(const char *addr);

/* Declare a metric family; series of undeclared families are refused. Returns 0, SL_ELIMIT when
 * the registry is full. */
int sl_metrics_declare(sl_metrics *m, const char *name, sl_metric_type type, const char *help);

/* Add to a counter / set a gauge. `labels` is the inside of the braces ("state=\"COMPLETE\""), or
 * NULL; a value that did not come from the daemon itself goes through sl_metrics_label_escape.
 * Unknown families and a full registry (4096 series, 1024 per family) are ignored (metrics never
 * fail a request) and counted in sluice_metrics_series_dropped_total. */
void sl_metrics_add(sl_metrics *m, const char *name, const char *labels, double v);
void sl_metrics_set(sl_metrics *m, const char *name, const char *labels, double v);

/* Escape a label value for the exposition format (\\, \" and \n), cut to fit len. */
void sl_metrics_label_escape(char *dst, size_t len, const char *value);

/* Record a finished RPC: sluice_rpc_requests_total{method,code} and
 * sluice_rpc_duration_seconds{method}. `method` is a registered method's path; NULL, a path that
 * is not of the form "/package.Service/Method" and any UNIMPLEMENTED call are counted as method
 * "unknown" (without a histogram), so clients cannot add series. */
void sl_metrics_observe_rpc(sl_metrics *m, const char *method, sl_rpc_code code,
                            uint64_t duration_us);

/* Register the scrape-time collector (one). */
void sl_metrics_on_collect(sl_metrics *m, sl_metrics_collect_fn fn, void *arg);

/* Render the exposition text into a new NUL-terminated buffer (caller frees). NULL on OOM. */
char *sl_metrics_render(sl_metrics *m);

#endif
