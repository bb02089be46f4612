/* The idle timeout (idle_timeout_ms): a call that waits for its client and makes no progress is
 * ended with DEADLINE_EXCEEDED by a sweep on the loop, and so is a call still waiting for its
 * first message. Connections without calls, and old ones, are closed by the core itself
 * (max_connection_idle_ms, max_connection_age_ms: server.c's channel arguments).
 */
#include "server_internal.h"

#include "../log.h"

#include <stdio.h>

void sl_rpc_call_progress(sl_rpc_call *call)
{
    call->msg_stale = 0;
    atomic_fetch_add_explicit(&call->progress, 1, memory_order_relaxed);
}

/* End a call that waited for its client longer than the idle timeout. The core sends the status
 * and completes the call's operations; the handler learns it through on_cancel. */
static void end_idle(sl_rpc_call *c)
{
    double secs = (double)c->srv->opts.idle_timeout_ms / 1000.0;
    char msg[160];

    c->end = SL_RPC_END_IDLE;
    if (c->recv_busy && c->msg_stale)
        snprintf(msg, sizeof(msg), "no progress for %g s: messages without data do not count",
                 secs);
    else if (c->recv_busy)
        snprintf(msg, sizeof(msg), "no message for %g s", secs);
    else
        snprintf(msg, sizeof(msg), "no send progress for %g s: the client stopped reading", secs);
    sl_log_limited(SL_LOG_INFO, 1000, "rpc_idle_timeout", "method=%s peer=%s reason=\"%s\"",
                   c->path, sl_rpc_call_peer(c), msg);
    grpc_call_cancel_with_status(c->call, GRPC_STATUS_DEADLINE_EXCEEDED, msg, NULL);
}

/* End every prefetching call (waiting for its first message) that arrived before `before_us`
 * (every one: UINT64_MAX) with `code` and `msg`. Its read then fails and the call is freed on a
 * completion-queue thread. */
void srv_cancel_prefetching(sl_rpc_server *srv, uint64_t before_us, grpc_status_code code,
                            const char *msg)
{
    pthread_mutex_lock(&srv->pf_mu);
    for (sl_rpc_call *c = srv->prefetch; c; c = c->pf_next) {
        if (c->pf_cancelled || c->arrived_us >= before_us)
            continue;
        c->pf_cancelled = 1;
        sl_log_limited(SL_LOG_INFO, 1000, "rpc_idle_timeout", "method=%s peer=%s reason=\"%s\"",
                       c->path, sl_rpc_call_peer(c), msg);
        grpc_call_cancel_with_status(c->call, code, msg, NULL);
    }
    pthread_mutex_unlock(&srv->pf_mu);
}

/* The idle sweep: a call that waits for its client (a read or a send outstanding) and made no
 * progress since the sweep that first saw it waiting is ended once the timeout has passed; so is
 * a streaming call whose first message has not come within the timeout. */
void srv_on_idle_sweep(uv_timer_t *t)
{
    sl_rpc_server *srv = t->data;
    uint64_t now = now_us(), limit = srv->opts.idle_timeout_ms * 1000u;
    char msg[96];

    for (sl_rpc_call *c = srv->calls; c; c = c->next) {
        unsigned p = atomic_load_explicit(&c->progress, memory_order_relaxed);
        if (c->done || c->end == SL_RPC_END_IDLE)
            continue;
        if (p != c->idle_seen || !(c->recv_busy || c->send_busy)) {
            c->idle_seen = p;
            c->idle_since_us = now;
        } else if (now - c->idle_since_us >= limit) {
            end_idle(c);
        }
    }
    if (now > limit) {
        snprintf(msg, sizeof(msg), "no message for %g s",
                 (double)srv->opts.idle_timeout_ms / 1000.0);
        srv_cancel_prefetching(srv, now - limit, GRPC_STATUS_DEADLINE_EXCEEDED, msg);
    }
}
