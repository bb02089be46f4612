/* New calls, on the completion-queue thread that received them: a request slot completed, the
 * slot is armed again at once, and the call is dropped (blocked address), answered (unknown
 * method, a limit of server_limits.c) or admitted; an admitted call's request (a streaming
 * call's first message, or its end) is read here before the loop hears of the call (prefetch),
 * then the call is handed to the loop and its close operation started.
 */
#include "server_internal.h"

#include "../log.h"

#include <grpc/support/alloc.h>
#include <stdio.h>
#include <string.h>

/* Hand an admitted call to the loop, then start its close operation: the close's completion is
 * queued after the start, and its reference (the call's first) keeps the call alive meanwhile. */
static void to_loop(sl_rpc_call *c)
{
    grpc_op op;

    atomic_store_explicit(&c->stage, STAGE_LOOP, memory_order_release);
    srv_push_event(c->srv, &c->tag_start, 1);
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    if (grpc_call_start_batch(c->call, &op, 1, &c->tag_close, NULL) != GRPC_CALL_OK) {
        /* Not seen in practice; without a close the call would never be freed. */
        sl_log_error("rpc_start_batch_failed", "method=%s op=close", c->path);
        grpc_call_cancel(c->call, NULL);
        c->close_cancelled = 1;
        srv_push_event(c->srv, &c->tag_close, 0);
    }
}

static void prefetch_unlink(sl_rpc_call *c)
{
    sl_rpc_server *srv = c->srv;

    if (c->pf_prev)
        c->pf_prev->pf_next = c->pf_next;
    else
        srv->prefetch = c->pf_next;
    if (c->pf_next)
        c->pf_next->pf_prev = c->pf_prev;
}

/* Read the first message of a client- or bidi-streaming call before the loop hears of it. */
static void prefetch(sl_rpc_call *c)
{
    sl_rpc_server *srv = c->srv;
    grpc_op op;

    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_buf;
    /* Listed before the batch starts: its completion may be handled on another thread at once,
     * which reads the call after an acquire load of `stage` (the core's own synchronisation is
     * invisible to ThreadSanitizer). */
    atomic_store_explicit(&c->stage, STAGE_PREFETCH, memory_order_release);
    pthread_mutex_lock(&srv->pf_mu);
    c->pf_next = srv->prefetch;
    if (srv->prefetch)
        srv->prefetch->pf_prev = c;
    srv->prefetch = c;
    pthread_mutex_unlock(&srv->pf_mu);
    if (grpc_call_start_batch(c->call, &op, 1, &c->tag_recv, NULL) != GRPC_CALL_OK) {
        sl_log_error("rpc_start_batch_failed", "method=%s op=recv", c->path);
        pthread_mutex_lock(&srv->pf_mu);
        prefetch_unlink(c);
        pthread_mutex_unlock(&srv->pf_mu);
        srv_refuse_call(c, GRPC_STATUS_INTERNAL, "cannot read the request");
    }
}

/* The first read of a prefetching call completed: hand the call to the loop with the message (or
 * with the client's end of stream), or free it here if the read failed (the client reset the
 * stream, or the idle sweep ended it). Returns 0 if the call is not prefetching (a read the loop
 * asked for). Completion-queue thread. */
int srv_on_prefetched(sl_rpc_call *c, int ok)
{
    sl_rpc_server *srv;
    int idle;

    if (atomic_load_explicit(&c->stage, memory_order_acquire) != STAGE_PREFETCH)
        return 0;
    srv = c->srv;
    pthread_mutex_lock(&srv->pf_mu);
    prefetch_unlink(c);
    idle = c->pf_cancelled;
    pthread_mutex_unlock(&srv->pf_mu);
    /* A read on a call the client reset before the read started succeeds with no message, as a
     * graceful end of stream would: the core tells the two apart. */
    if (ok && !c->recv_buf && grpc_call_failed_before_recv_message(c->call))
        ok = 0;
    if (!ok) {
        atomic_fetch_add(idle ? &srv->n_idle : &srv->n_reset, 1);
        if (!idle)
            srv_junk(srv, c->peer);
        srv_call_release(c, 0);
        return 1;
    }
    if (c->reg->m->kind == SL_RPC_UNARY || c->reg->m->kind == SL_RPC_SERVER_STREAM) {
        if (!c->recv_buf) {
            /* The client half-closed without sending its request. */
            char msg[SL_RPC_TEXT_MAX + 64];
            atomic_fetch_add(&srv->n_no_request, 1);
            srv_junk(srv, c->peer);
            snprintf(msg, sizeof(msg), "request message missing for %s", c->path);
            srv_refuse_call(c, GRPC_STATUS_INVALID_ARGUMENT, msg);
            return 1;
        }
        c->payload = c->recv_buf;
    } else {
        c->first = c->recv_buf;
        c->has_first = 1;
    }
    c->recv_buf = NULL;
    to_loop(c);
    return 1;
}

/* A request slot completed: a new call arrived (or, when !ok, the server is shutting down). The
 * slot is armed again before anything else, then the call is admitted or answered here. */
void srv_on_slot(slot *s, int ok)
{
    sl_rpc_server *srv;
    const reg *r;
    grpc_call *call;
    grpc_metadata_array md;
    char path[SL_RPC_TEXT_MAX], msg[SL_RPC_TEXT_MAX + 64];
    sl_rpc_call *c;
    char *peer;

    atomic_load_explicit(&s->armed, memory_order_acquire);
    srv = s->srv;
    r = s->reg;
    call = s->call;
    md = s->md;
    s->call = NULL;
    grpc_metadata_array_init(&s->md);
    if (!r) {
        sl_rpc_text_clean(path, sizeof(path), (const char *)GRPC_SLICE_START_PTR(s->details.method),
                          GRPC_SLICE_LENGTH(s->details.method));
        grpc_call_details_destroy(&s->details);
        grpc_call_details_init(&s->details);
    }
    if (ok && !atomic_load(&srv->stopping))
        srv_arm_slot(s);
    if (!ok) {
        /* Pending requests complete unsuccessfully when the server shuts down. */
        grpc_metadata_array_destroy(&md);
        if (!atomic_load(&srv->stopping))
            sl_log_warn("rpc_slot_failed", NULL);
        return;
    }
    peer = grpc_call_get_peer(call);
    if (srv_blocked(srv, call, peer)) {
        grpc_metadata_array_destroy(&md);
    } else if (!r) {
        /* The path is the client's: cleaned, it names the method in the status and the log,
         * never in metrics. */
        atomic_fetch_add(&srv->n_unknown, 1);
        grpc_metadata_array_destroy(&md);
        snprintf(msg, sizeof(msg), "unknown method %s", path);
        sl_log_limited(SL_LOG_INFO, 1000, "rpc_unknown_method", "method=\"%s\"", path);
        srv_refuse(call, GRPC_STATUS_UNIMPLEMENTED, msg);
        srv_junk(srv, peer);
    } else if ((c = srv_call_new(srv, r, call, &md, peer)) != NULL && srv_admit_early(c)) {
        prefetch(c);
    }
    gpr_free(peer);
}

void srv_arm_slot(slot *s)
{
    sl_rpc_server *srv = s->srv;
    grpc_call_error e;

    atomic_fetch_add_explicit(&s->armed, 1, memory_order_release);
    if (s->reg) {
        e = grpc_server_request_registered_call(srv->server, s->reg->handle, &s->call, &s->deadline,
                                                &s->md, NULL, srv->cq, srv->cq, &s->tag);
    } else {
        e = grpc_server_request_call(srv->server, &s->call, &s->details, &s->md, srv->cq, srv->cq,
                                     &s->tag);
    }
    if (e != GRPC_CALL_OK)
        sl_log_error("rpc_request_call_failed", "error=%d", (int)e);
}
