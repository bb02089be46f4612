/* Limits on calls: calls waiting for the loop (max_pending) and calls per peer address
 * (max_peer_calls), counted on the completion-queue thread that received the call; calls open at
 * once (max_calls) or within a service's own budget (sl_rpc_budget), and calls per key
 * (sl_rpc_call_claim), counted on the loop; and the send budget in bytes of a call's queued
 * messages (sl_rpc_call_send_room).
 */
#include "server_internal.h"

#include "../err.h"
#include "../log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Count the call as waiting for the loop (apart for a service with a budget of its own) and
 * under its peer. At a limit the call is answered RESOURCE_EXHAUSTED and freed. Returns 1 if
 * admitted. */
int srv_admit_early(sl_rpc_call *c)
{
    sl_rpc_server *srv = c->srv;
    const sl_rpc_service *svc = c->reg->svc;
    size_t i = c->reg->svc_idx;
    char key[SL_RPC_PEER_KEY_MAX], msg[256];
    int err;

    if (svc->budget) {
        /* Counted apart, so that calls of other services waiting for the loop cannot keep
         * these out; the budget itself applies once the loop has the call (srv_admit). */
        if (atomic_fetch_add(&srv->svc_pending[i], 1) < (size_t)srv->opts.max_pending) {
            c->budget_idx = (int)i;
            return 1;
        }
        atomic_fetch_sub(&srv->svc_pending[i], 1);
        atomic_fetch_add(&srv->n_busy, 1);
        snprintf(msg, sizeof(msg), "server busy: %d calls to %s waiting to start",
                 srv->opts.max_pending, svc->name);
        srv_refuse_call(c, GRPC_STATUS_RESOURCE_EXHAUSTED, msg);
        return 0;
    }
    if (atomic_fetch_add(&srv->pending, 1) >= (size_t)srv->opts.max_pending) {
        atomic_fetch_sub(&srv->pending, 1);
        atomic_fetch_add(&srv->n_busy, 1);
        snprintf(msg, sizeof(msg), "server busy: %d calls waiting to start", srv->opts.max_pending);
        sl_log_limited(SL_LOG_WARN, 1000, "rpc_limit",
                       "limit=max_pending value=%d method=%s peer=%s", srv->opts.max_pending,
                       c->path, sl_rpc_call_peer(c));
        srv_refuse_call(c, GRPC_STATUS_RESOURCE_EXHAUSTED, msg);
        return 0;
    }
    c->pending = 1;
    if (srv->opts.max_peer_calls <= 0)
        return 1;
    sl_rpc_peer_key(key, sizeof(key), sl_rpc_call_peer(c));
    pthread_mutex_lock(&srv->peers_mu);
    err = sl_rpc_keys_acquire(&srv->peers, &c->peer_key, key, (size_t)srv->opts.max_peer_calls);
    pthread_mutex_unlock(&srv->peers_mu);
    if (err == 0)
        return 1;
    if (err == SL_ELIMIT) {
        atomic_fetch_add(&srv->n_peer_limit, 1);
        snprintf(msg, sizeof(msg), "too many concurrent calls from %s (limit %d)", key,
                 srv->opts.max_peer_calls);
        sl_log_limited(SL_LOG_WARN, 1000, "rpc_limit",
                       "limit=max_peer_calls value=%d method=%s peer=%s", srv->opts.max_peer_calls,
                       c->path, sl_rpc_call_peer(c));
    } else {
        snprintf(msg, sizeof(msg), "out of memory");
    }
    srv_refuse_call(c, GRPC_STATUS_RESOURCE_EXHAUSTED, msg);
    return 0;
}

/* Count the call against max_calls, or against its service's budget (sl_rpc_budget). On refusal
 * the call is finished. Returns 1 if admitted. */
int srv_admit(sl_rpc_call *c)
{
    sl_rpc_server *srv = c->srv;
    const sl_rpc_service *svc = c->reg->svc;
    size_t i = c->reg->svc_idx;
    int max = srv->opts.max_calls;

    if (svc->budget) {
        int stream = c->reg->m->kind != SL_RPC_UNARY;
        if (srv->svc_calls[i] < (size_t)svc->budget->calls &&
            (!stream || srv->svc_streams[i] < (size_t)svc->budget->streams)) {
            srv->svc_calls[i]++;
            srv->svc_streams[i] += stream;
            c->admitted = 2;
            return 1;
        }
        c->end = SL_RPC_END_BUDGET;
        sl_log_limited(SL_LOG_WARN, 1000, "rpc_limit", "limit=budget value=%d/%d method=%s peer=%s",
                       svc->budget->calls, svc->budget->streams, c->path, sl_rpc_call_peer(c));
        if (srv->svc_calls[i] >= (size_t)svc->budget->calls)
            sl_rpc_call_finish(c, SL_RPC_RESOURCE_EXHAUSTED,
                               "too many concurrent calls to %s (limit %d)", svc->name,
                               svc->budget->calls);
        else
            sl_rpc_call_finish(c, SL_RPC_RESOURCE_EXHAUSTED,
                               "too many concurrent streams of %s (limit %d)", svc->name,
                               svc->budget->streams);
        return 0;
    }
    if (max <= 0 || srv->admitted < (size_t)max) {
        srv->admitted++;
        c->admitted = 1;
        return 1;
    }
    c->end = SL_RPC_END_MAX_CALLS;
    sl_log_limited(SL_LOG_WARN, 1000, "rpc_limit", "limit=max_calls value=%d method=%s peer=%s",
                   max, c->path, sl_rpc_call_peer(c));
    sl_rpc_call_finish(c, SL_RPC_RESOURCE_EXHAUSTED, "too many concurrent calls (limit %d)", max);
    return 0;
}

int sl_rpc_call_claim(sl_rpc_call *call, const char *kind, const char *key, const char *what)
{
    sl_rpc_server *srv = call->srv;
    size_t len = strlen(kind) + strlen(key) + 2;
    char *name;
    int err;

    if (call->key || call->finished || call->done)
        return SL_ESTATE;
    /* One count per kind: "upload:j" and "feed:j" never meet (a kind has no ':'). */
    name = malloc(len);
    if (!name) {
        sl_rpc_call_finish(call, SL_RPC_RESOURCE_EXHAUSTED, "out of memory");
        return -ENOMEM;
    }
    snprintf(name, len, "%s:%s", kind, key);
    err = sl_rpc_keys_acquire(&srv->keys, &call->key, name, (size_t)srv->opts.max_key_calls);
    free(name);
    if (err == SL_ELIMIT) {
        call->end = SL_RPC_END_MAX_KEY;
        sl_log_limited(SL_LOG_WARN, 1000, "rpc_limit",
                       "limit=max_key_calls value=%d kind=%s %s=%s method=%s peer=%s",
                       srv->opts.max_key_calls, kind, what, key, call->path,
                       sl_rpc_call_peer(call));
        sl_rpc_call_finish(call, SL_RPC_RESOURCE_EXHAUSTED,
                           "too many concurrent %s streams for %s '%s' (limit %d)", kind, what, key,
                           srv->opts.max_key_calls);
    } else if (err) {
        sl_rpc_call_finish(call, SL_RPC_RESOURCE_EXHAUSTED, "out of memory");
    }
    return err;
}

int sl_rpc_call_send_room(const sl_rpc_call *call)
{
    sl_rpc_call *c = (sl_rpc_call *)call;
    size_t budget = c->reg->m->send_budget;
    size_t used, bytes;

    if (c->done || c->finished)
        return 0;
    pthread_mutex_lock(&c->mu);
    used = c->sq_len;
    bytes = c->sq_bytes;
    pthread_mutex_unlock(&c->mu);
    if (budget && bytes > 0 && bytes + c->send_last > budget)
        return 0;
    return (int)(SEND_WINDOW - used);
}
