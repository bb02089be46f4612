/* The remote store's health (sl_ops_store_watch_start in ops.h).
 *
 * Requests to object storage end on worker threads, and each one records whether the store
 * answered (server/store/s3.h, sl_s3_health). Here the loop reads those counts every second
 * (no I/O, a mutex) and decides: once every request for --s3-unhealthy-after failed, three at
 * least, the store is unhealthy and grpc.health.v1 reports sluice.v1.Checkpoints NOT_SERVING,
 * until a request succeeds. The other services stay SERVING: feeding does not need the store.
 *
 * A store nobody talks to tells nothing, so while its requests fail (to confirm it, and to see
 * it come back without waiting for traffic a NOT_SERVING replica no longer gets), and once no
 * request succeeded for PROBE_IDLE_MS, a probe (HEAD of the bucket) runs on the worker pool,
 * one at a time. A probe is bounded like any request (--s3-request-timeout, retries to
 * --s3-retry-deadline), so it holds one worker at most that long.
 */
#include "daemon.h"
#include "ops.h"

#include "log.h"
#include "store/sstore.h"
#include "util/clock.h"

#include <stddef.h>
#include <stdlib.h>

#define TICK_MS         1000
#define PROBE_IDLE_MS   10000 /* probe a store no request succeeded on for this long */
#define UNHEALTHY_FAILS 3     /* failures in a row before the time counts */

typedef struct probe_job {
    sl_sstore *store;
    int err;
    char msg[512];
} probe_job;

static void probe_work(uv_work_t *w)
{
    probe_job *p = w->data;

    p->err = p->store->ops->probe(p->store, p->msg, sizeof(p->msg));
}

static void probe_done(uv_work_t *w, int status)
{
    sl_ops *ops = (sl_ops *)((char *)w - offsetof(sl_ops, store_probe));
    probe_job *p = w->data;

    (void)status;
    if (p->err)
        sl_log_limited(SL_LOG_WARN, 10000, "store_probe_failed", "error=\"%s\"", p->msg);
    free(p);
    ops->store_probe_busy = 0;
}

static void probe_start(sl_ops *ops)
{
    probe_job *p = calloc(1, sizeof(*p));

    if (!p)
        return;
    p->store = ops->d->store;
    ops->store_probe.data = p;
    ops->store_probed_ms = sl_now_ms();
    if (uv_queue_work(&ops->d->loop, &ops->store_probe, probe_work, probe_done) != 0) {
        free(p);
        return;
    }
    ops->store_probe_busy = 1;
}

static void set_unhealthy(sl_ops *ops, int bad, const sl_sstore_health *h, int64_t now)
{
    if (bad == ops->store_unhealthy)
        return;
    ops->store_unhealthy = bad;
    sl_metrics_set(ops->metrics, "sluice_store_healthy", NULL, bad ? 0 : 1);
    if (bad)
        sl_log_error("store_unhealthy",
                     "store=\"%s\" failures_in_a_row=%llu failing_ms=%lld hint=\"no request to "
                     "the store got an answer: health reports sluice.v1.Checkpoints NOT_SERVING "
                     "until one does\"",
                     ops->d->store_desc, (unsigned long long)h->failures,
                     (long long)(now - h->failing_since_ms));
    else
        sl_log_info("store_recovered", "store=\"%s\"", ops->d->store_desc);
    sl_ops_health_update(ops);
}

static void on_tick(uv_timer_t *t)
{
    sl_ops *ops = t->data;
    sl_sstore *st = ops->d->store;
    uint64_t after = ops->d->cfg.s3_unhealthy_after_ms;
    int64_t now = sl_now_ms();
    sl_sstore_health h;

    if (ops->d->stopping)
        return;
    st->ops->health(st, &h);
    set_unhealthy(ops,
                  after > 0 && h.failures >= UNHEALTHY_FAILS &&
                      now - h.failing_since_ms >= (int64_t)after,
                  &h, now);
    if (!ops->store_probe_busy && (h.failures > 0 || (now - h.last_ok_ms >= PROBE_IDLE_MS &&
                                                      now - ops->store_probed_ms >= PROBE_IDLE_MS)))
        probe_start(ops);
}

void sl_ops_store_watch_start(sl_ops *ops)
{
    sl_sstore *st = ops->d->store;

    if (!st || !st->ops->health || !st->ops->probe)
        return;
    sl_metrics_set(ops->metrics, "sluice_store_healthy", NULL, 1);
    uv_timer_init(&ops->d->loop, &ops->store_timer);
    ops->store_timer.data = ops;
    uv_timer_start(&ops->store_timer, on_tick, TICK_MS, TICK_MS);
    /* The watch must not keep the loop alive once the server has stopped. */
    uv_unref((uv_handle_t *)&ops->store_timer);
    ops->store_timer_open = 1;
}

void sl_ops_store_watch_stop(sl_ops *ops)
{
    if (!ops->store_timer_open)
        return;
    ops->store_timer_open = 0;
    uv_close((uv_handle_t *)&ops->store_timer, NULL);
}
