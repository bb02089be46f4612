/* The loop's side of a call: an admitted call's start (authorization, admission by srv_admit,
 * the request decoded for the handler) and the completions of its operations. Every handler
 * callback (on_start, on_message, on_bad_message, on_writable, on_cancel) and the call observer
 * run from here. Loop thread.
 */
#include "server_internal.h"

#include "../err.h"

#include <stdio.h>
#include <string.h>

/* Ask the server's authorize callback (`scope` as sl_rpc_authorize_fn says); on refusal the call
 * is finished. Returns 1 if allowed. */
static int authorized(sl_rpc_call *c, const char *scope)
{
    static const char bearer[] = "Bearer ";
    char value[1024], msg[512] = "";
    const char *token = NULL;
    int n, err;

    n = sl_rpc_call_metadata(c, "authorization", value, sizeof(value));
    if (n >= (int)sizeof(bearer) - 1 && strncmp(value, bearer, sizeof(bearer) - 1) == 0)
        token = value + sizeof(bearer) - 1;
    err = c->srv->opts.authorize(c->path, c->reg->m->access, token, scope, msg, sizeof(msg),
                                 c->srv->opts.authorize_arg);
    if (err == 0)
        return 1;
    if (err != SL_EPERM && err != SL_ECATLOST)
        err = SL_EAUTH;
    sl_rpc_call_fail(c, err, "%s", msg[0] ? msg : sl_strerror(err));
    return 0;
}

static void dispatch(sl_rpc_call *c, grpc_byte_buffer *payload)
{
    const sl_rpc_method *m = c->reg->m;
    ProtobufCMessage *req;
    char why[256];
    int err;

    /* Authorization first: a call without a valid token never counts against max_calls. */
    if (c->srv->opts.authorize && !authorized(c, NULL))
        return;
    if (!srv_admit(c))
        return;
    if (m->kind == SL_RPC_CLIENT_STREAM || m->kind == SL_RPC_BIDI_STREAM) {
        m->on_start(c, NULL, c->reg->svc->arg);
        return;
    }
    c->bytes_in += grpc_byte_buffer_length(payload);
    if ((err = sl_rpc_decode(&req, m->request, payload, why, sizeof(why))) != 0) {
        sl_rpc_call_finish(c, sl_rpc_code_from_err(err), "request is %s", why);
        return;
    }
    /* A method that names what it acts on is authorized again for that (a job's bound tokens). */
    if (c->srv->opts.authorize && m->scope) {
        const char *scope = m->scope(req);
        if (scope && *scope && !authorized(c, scope)) {
            protobuf_c_message_free_unpacked(req, NULL);
            return;
        }
    }
    c->cur_msg = req;
    m->on_start(c, req, c->reg->svc->arg);
    if (c->cur_msg)
        protobuf_c_message_free_unpacked(c->cur_msg, NULL);
    c->cur_msg = NULL;
}

/* An admitted call reached the loop: from now on the loop owns it. */
void srv_on_start(sl_rpc_call *c)
{
    sl_rpc_server *srv = c->srv;
    grpc_byte_buffer *payload = c->payload;

    c->payload = NULL;
    if (c->pending) {
        atomic_fetch_sub(&srv->pending, 1);
        c->pending = 0;
    }
    if (c->budget_idx >= 0) {
        atomic_fetch_sub(&srv->svc_pending[c->budget_idx], 1);
        c->budget_idx = -1;
    }
    c->idle_since_us = now_us();
    c->next = srv->calls;
    if (srv->calls)
        srv->calls->prev = c;
    srv->calls = c;
    sl_rpc_call_ref(c);
    dispatch(c, payload);
    sl_rpc_call_unref(c);
    if (payload)
        grpc_byte_buffer_destroy(payload);
}

/* A send chain ended: its last batch completed with nothing queued behind it, or failed. */
void srv_on_send_done(sl_rpc_call *c, int ok)
{
    int more;

    pthread_mutex_lock(&c->mu);
    if (ok && !c->done) {
        /* The handler may have queued messages since the completion thread looked. */
        more = srv_chain_next(c);
    } else {
        more = 0;
        srv_send_buf_free(c);
        srv_drain_queue(c);
    }
    pthread_mutex_unlock(&c->mu);
    if (more)
        return;
    c->send_busy = 0;
    if (c->status_pending) {
        c->status_pending = 0;
        if (ok && !c->done) {
            pthread_mutex_lock(&c->mu);
            srv_start_send(c, NULL, 0, 1);
            pthread_mutex_unlock(&c->mu);
        }
    } else if (ok && !c->finished && !c->done && c->reg && c->reg->m->on_writable) {
        c->reg->m->on_writable(c, c->reg->svc->arg);
    }
    sl_rpc_call_unref(c);
}

/* The queue drained to half while a chain runs: the handler may produce more. The chain's
 * reference keeps the call alive: the event that ends the chain is queued after this one. */
void srv_on_writable(sl_rpc_call *c)
{
    pthread_mutex_lock(&c->mu);
    c->writable_posted = 0;
    pthread_mutex_unlock(&c->mu);
    if (!c->finished && !c->done && c->reg && c->reg->m->on_writable)
        c->reg->m->on_writable(c, c->reg->svc->arg);
}

void srv_on_recv_done(sl_rpc_call *c, int ok)
{
    grpc_byte_buffer *bb = c->recv_buf;
    const sl_rpc_method *m = c->reg->m;

    c->recv_buf = NULL;
    c->recv_busy = 0;
    if (m->handler_progress)
        c->msg_stale = 1;
    else
        atomic_fetch_add_explicit(&c->progress, 1, memory_order_relaxed);
    if (!ok || c->finished || c->done) {
        if (bb)
            grpc_byte_buffer_destroy(bb);
    } else if (!bb) {
        m->on_message(c, NULL, c->reg->svc->arg);
    } else {
        ProtobufCMessage *msg;
        char why[256];
        int err;
        c->bytes_in += grpc_byte_buffer_length(bb);
        if (m->bytes_field)
            err = sl_rpc_decode_bytes(&msg, m->request, m->bytes_field, bb, &c->cur_bytes, why,
                                      sizeof(why));
        else
            err = sl_rpc_decode(&msg, m->request, bb, why, sizeof(why));
        grpc_byte_buffer_destroy(bb);
        if (err && m->on_bad_message) {
            char text[300];
            snprintf(text, sizeof(text), "message is %s", why);
            m->on_bad_message(c, err, text, c->reg->svc->arg);
        } else if (err) {
            /* INVALID_ARGUMENT, or RESOURCE_EXHAUSTED when memory ran out. */
            sl_rpc_call_finish(c, sl_rpc_code_from_err(err), "message is %s", why);
        } else {
            c->cur_msg = msg;
            m->on_message(c, msg, c->reg->svc->arg);
            if (c->cur_msg)
                protobuf_c_message_free_unpacked(c->cur_msg, NULL);
            c->cur_msg = NULL;
            sl_rpc_bytes_free(c->cur_bytes);
            c->cur_bytes = NULL;
        }
    }
    sl_rpc_call_unref(c);
}

void srv_on_close_done(sl_rpc_call *c)
{
    sl_rpc_server *srv = c->srv;
    int handler_finished = c->finished;
    sl_rpc_code code;

    c->done = 1;
    code = (!handler_finished || c->close_cancelled) ? SL_RPC_CANCELLED : c->status_code;
    if (c->end == SL_RPC_END_IDLE)
        code = SL_RPC_DEADLINE_EXCEEDED;
    if (!handler_finished) {
        c->finished = 1;
        if (c->reg && c->reg->m->on_cancel)
            c->reg->m->on_cancel(c, c->reg->svc->arg);
    }
    if (srv->opts.observer) {
        sl_rpc_call_stats st = {c->path,
                                sl_rpc_call_peer(c),
                                code,
                                now_us() - c->start_us,
                                c->bytes_in,
                                c->bytes_out,
                                c->reg ? c->reg->m->kind : SL_RPC_UNARY,
                                c->end};
        srv->opts.observer(&st, srv->opts.observer_arg);
    }
    sl_rpc_call_unref(c);
}
