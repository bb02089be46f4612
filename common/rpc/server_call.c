/* A call's state and the call API for handlers.
 *
 * The state's life: created on the completion-queue thread that received the call
 * (srv_call_new), released there if the call never reaches the loop (srv_call_release), else
 * freed on the loop when its last reference goes (sl_rpc_call_unref). The send path: a queue of
 * up to SEND_WINDOW messages per call, whose sends are chained by whichever thread sees the
 * previous one complete (srv_chain_next). Also the push side of the queue to the loop
 * (srv_push_event), which every other file of the server uses; the loop drains it in
 * server_cq.c. This file calls no other file of the server.
 */
#include "server_internal.h"

#include "../err.h"
#include "../log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the queue to the loop: push side (any thread) ---- */

void srv_push_event(sl_rpc_server *srv, tag *t, int ok)
{
    pthread_mutex_lock(&srv->mu);
    if (srv->q_len == srv->q_cap) {
        size_t cap = srv->q_cap ? srv->q_cap * 2 : 256;
        event *q = realloc(srv->q, cap * sizeof(*q));
        if (!q) {
            /* Losing a completion would leak a call forever; there is no way to continue. */
            sl_log_error("rpc_queue_oom", "capacity=%zu", cap);
            abort();
        }
        srv->q = q;
        srv->q_cap = cap;
    }
    srv->q[srv->q_len].tag = t;
    srv->q[srv->q_len].ok = ok;
    srv->q_len++;
    pthread_mutex_unlock(&srv->mu);
    uv_async_send(&srv->async);
}

/* Drop a reference unless it is the last one (which must be dropped on the loop, where the state
 * is freed). Returns 1 if dropped. Any thread. */
int srv_drop_ref_unless_last(sl_rpc_call *c)
{
    int refs = atomic_load(&c->refs);

    while (refs > 1)
        if (atomic_compare_exchange_weak(&c->refs, &refs, refs - 1))
            return 1;
    return 0;
}

/* ---- a call's life ---- */

/* State for a new call of a registered method; takes `call` and `md`. Returns NULL if memory ran
 * out (the call is then answered and released). */
sl_rpc_call *srv_call_new(sl_rpc_server *srv, const reg *r, grpc_call *call,
                          grpc_metadata_array *md, const char *peer)
{
    sl_rpc_call *c = calloc(1, sizeof(*c));

    if (c)
        c->path = strdup(r->path);
    if (!c || !c->path) {
        free(c);
        grpc_metadata_array_destroy(md);
        srv_refuse(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    c->srv = srv;
    c->reg = r;
    c->call = call;
    c->md = *md;
    c->start_us = c->arrived_us = now_us();
    c->tag_send = (tag){TAG_SEND, c};
    c->tag_recv = (tag){TAG_RECV, c};
    c->tag_close = (tag){TAG_CLOSE, c};
    c->tag_writable = (tag){TAG_WRITABLE, c};
    c->tag_start = (tag){TAG_START, c};
    c->budget_idx = -1;
    pthread_mutex_init(&c->mu, NULL);
    atomic_init(&c->refs, 1); /* the close operation's, once the loop has the call */
    atomic_init(&c->stage, STAGE_PREFETCH);
    c->peer = peer ? strdup(peer) : NULL;
    atomic_fetch_add(&srv->live_calls, 1);
    if (r->m->kind != SL_RPC_UNARY)
        atomic_fetch_add(&srv->live_streams, 1);
    return c;
}

/* Answer a call the server keeps no state for, and let it go. */
void srv_refuse(grpc_call *call, grpc_status_code code, const char *msg)
{
    grpc_call_cancel_with_status(call, code, msg, NULL);
    grpc_call_unref(call);
}

/* Answer an admitted call before any operation was started on it, and free it. */
void srv_refuse_call(sl_rpc_call *c, grpc_status_code code, const char *msg)
{
    grpc_call_cancel_with_status(c->call, code, msg, NULL);
    srv_call_release(c, 0);
}

/* Free what every call has, whichever thread frees it, and count it gone. The last call freed
 * during shutdown lets the loop finish it (directly, or through a kick from another thread). */
void srv_call_release(sl_rpc_call *c, int on_loop)
{
    sl_rpc_server *srv = c->srv;
    int streaming = c->reg->m->kind != SL_RPC_UNARY;

    if (c->pending)
        atomic_fetch_sub(&srv->pending, 1);
    if (c->budget_idx >= 0)
        atomic_fetch_sub(&srv->svc_pending[c->budget_idx], 1);
    if (c->peer_key) {
        pthread_mutex_lock(&srv->peers_mu);
        sl_rpc_keys_release(&srv->peers, c->peer_key);
        pthread_mutex_unlock(&srv->peers_mu);
    }
    if (c->call)
        grpc_call_unref(c->call);
    grpc_metadata_array_destroy(&c->md);
    if (c->payload)
        grpc_byte_buffer_destroy(c->payload);
    if (c->first)
        grpc_byte_buffer_destroy(c->first);
    if (c->recv_buf)
        grpc_byte_buffer_destroy(c->recv_buf);
    pthread_mutex_destroy(&c->mu);
    free(c->path);
    free(c->peer);
    free(c);
    if (streaming)
        atomic_fetch_sub(&srv->live_streams, 1);
    if (atomic_fetch_sub(&srv->live_calls, 1) == 1 && atomic_load(&srv->stopping)) {
        if (on_loop)
            srv_maybe_finish_shutdown(srv);
        else
            srv_push_event(srv, &srv->kick_tag, 1);
    }
}

void srv_maybe_finish_shutdown(sl_rpc_server *srv)
{
    if (srv->shutdown_seen && srv->live_calls == 0 && !srv->cq_shut) {
        srv->cq_shut = 1;
        grpc_completion_queue_shutdown(srv->cq);
    }
}

/* Free a call the loop owns. Loop thread. */
static void call_free(sl_rpc_call *c)
{
    sl_rpc_server *srv = c->srv;
    size_t i = c->reg->svc_idx;

    if (c->data_free)
        c->data_free(c->data);
    pthread_mutex_lock(&c->mu);
    srv_send_buf_free(c);
    srv_drain_queue(c);
    pthread_mutex_unlock(&c->mu);
    if (c->has_details)
        grpc_slice_unref(c->status_details);
    if (c->admitted == 1) {
        srv->admitted--;
    } else if (c->admitted == 2) {
        srv->svc_calls[i]--;
        srv->svc_streams[i] -= c->reg->m->kind != SL_RPC_UNARY;
    }
    sl_rpc_keys_release(&srv->keys, c->key);
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->calls = c->next;
    if (c->next)
        c->next->prev = c->prev;
    srv_call_release(c, 1);
}

void sl_rpc_call_ref(sl_rpc_call *call)
{
    atomic_fetch_add(&call->refs, 1);
}

void sl_rpc_call_unref(sl_rpc_call *call)
{
    if (call && atomic_fetch_sub(&call->refs, 1) == 1)
        call_free(call);
}

/* ---- the send path ---- */

/* Start a batch on the call's send path: initial metadata if not yet sent, then the message
 * (may be NULL; `len` bytes, already counted in sq_bytes), then the status (if with_status).
 * Takes ownership of bb. Loop thread, with c->mu held; the batch's completion owns the reference
 * it takes. */
int srv_start_send(sl_rpc_call *c, grpc_byte_buffer *bb, size_t len, int with_status)
{
    grpc_op ops[3];
    size_t n = 0;
    grpc_call_error e;

    memset(ops, 0, sizeof(ops));
    if (!c->sent_md) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n].data.send_initial_metadata.count = 0;
        n++;
    }
    if (bb) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = bb;
        n++;
    }
    if (with_status) {
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n].data.send_status_from_server.trailing_metadata_count = 0;
        ops[n].data.send_status_from_server.status = (grpc_status_code)c->status_code;
        ops[n].data.send_status_from_server.status_details =
            c->has_details ? &c->status_details : NULL;
        n++;
    }
    c->send_buf = bb;
    c->send_size = len;
    c->send_busy = 1;
    c->status_sent = with_status;
    atomic_fetch_add(&c->refs, 1);
    e = grpc_call_start_batch(c->call, ops, n, &c->tag_send, NULL);
    if (e != GRPC_CALL_OK) {
        sl_log_warn("rpc_start_batch_failed", "method=%s error=%d", c->path, (int)e);
        c->send_busy = 0;
        c->status_sent = 0;
        srv_send_buf_free(c);
        atomic_fetch_sub(&c->refs, 1);
        return SL_ERPC;
    }
    c->sent_md = 1;
    return 0;
}

/* The message in flight is gone (sent or dropped): it no longer counts. With c->mu held. */
void srv_send_buf_free(sl_rpc_call *c)
{
    if (c->send_buf)
        grpc_byte_buffer_destroy(c->send_buf);
    c->send_buf = NULL;
    c->sq_bytes -= c->send_size;
    c->send_size = 0;
}

/* Continue a send chain with the next queued message. Any thread, with c->mu held. The write
 * hint lets the transport coalesce this message with the ones queued behind it; the last queued
 * message goes without it, so nothing is held back. Returns 1 if a send was started. */
int srv_chain_next(sl_rpc_call *c)
{
    grpc_byte_buffer *bb;
    grpc_op op;

    srv_send_buf_free(c);
    if (c->sq_len == 0)
        return 0;
    bb = c->sq[c->sq_head];
    c->send_size = c->sq_size[c->sq_head];
    c->sq_head = (c->sq_head + 1) % SEND_WINDOW;
    c->sq_len--;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = bb;
    op.flags = c->sq_len > 0 ? GRPC_WRITE_BUFFER_HINT : 0;
    c->send_buf = bb;
    /* Queue the writable event before starting the batch: once started, the batch may fail at
     * once (a cancelled call) and another completion-queue thread queue the chain's end, whose
     * reference may be the call's last; the loop must see this event first. */
    if (c->sq_len <= SEND_WINDOW / 2 && !c->writable_posted) {
        c->writable_posted = 1;
        srv_push_event(c->srv, &c->tag_writable, 1);
    }
    if (grpc_call_start_batch(c->call, &op, 1, &c->tag_send, NULL) != GRPC_CALL_OK) {
        srv_send_buf_free(c);
        return 0;
    }
    return 1;
}

/* Drop every queued message (the call is failing). With c->mu held. */
void srv_drain_queue(sl_rpc_call *c)
{
    while (c->sq_len > 0) {
        c->sq_bytes -= c->sq_size[c->sq_head];
        grpc_byte_buffer_destroy(c->sq[c->sq_head]);
        c->sq_head = (c->sq_head + 1) % SEND_WINDOW;
        c->sq_len--;
    }
}

/* ---- the call API for handlers (loop thread) ---- */

static void set_status(sl_rpc_call *c, sl_rpc_code code, const char *msg)
{
    c->status_code = code;
    if (c->has_details)
        grpc_slice_unref(c->status_details);
    c->has_details = msg && *msg;
    if (c->has_details)
        c->status_details = grpc_slice_from_copied_string(msg);
    c->finished = 1;
}

static int call_finish_msg(sl_rpc_call *c, sl_rpc_code code, const char *msg)
{
    int err;

    if (c->done)
        return SL_ECANCELLED;
    if (c->finished)
        return SL_ESTATE;
    set_status(c, code, msg);
    if (c->send_busy) {
        c->status_pending = 1;
        return 0;
    }
    pthread_mutex_lock(&c->mu);
    err = srv_start_send(c, NULL, 0, 1);
    pthread_mutex_unlock(&c->mu);
    return err;
}

int sl_rpc_call_finish(sl_rpc_call *call, sl_rpc_code code, const char *fmt, ...)
{
    char msg[1024] = "";
    va_list ap;

    if (fmt) {
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
    }
    return call_finish_msg(call, code, msg);
}

int sl_rpc_call_fail(sl_rpc_call *call, int err, const char *fmt, ...)
{
    char msg[1024] = "";
    va_list ap;

    if (fmt) {
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
    }
    return call_finish_msg(call, sl_rpc_code_from_err(err), msg);
}

static grpc_byte_buffer *pack_limited(sl_rpc_call *c, const ProtobufCMessage *msg, int *err)
{
    int max = c->srv->opts.max_send_bytes;
    size_t size = protobuf_c_message_get_packed_size(msg);
    grpc_byte_buffer *bb;

    if (max > 0 && size > (size_t)max) {
        *err = SL_ELIMIT;
        return NULL;
    }
    c->bytes_out += size;
    bb = sl_rpc_pack(msg);
    *err = bb ? 0 : -ENOMEM;
    return bb;
}

size_t sl_rpc_call_send_bytes(const sl_rpc_call *call)
{
    sl_rpc_call *c = (sl_rpc_call *)call;
    size_t bytes;

    pthread_mutex_lock(&c->mu);
    bytes = c->sq_bytes;
    pthread_mutex_unlock(&c->mu);
    return bytes;
}

int sl_rpc_call_send(sl_rpc_call *call, const ProtobufCMessage *msg)
{
    grpc_byte_buffer *bb;
    size_t len;
    int err;

    if (call->done)
        return SL_ECANCELLED;
    if (call->finished)
        return SL_ESTATE;
    bb = pack_limited(call, msg, &err);
    if (!bb)
        return err;
    len = grpc_byte_buffer_length(bb);
    pthread_mutex_lock(&call->mu);
    if (!call->send_busy) {
        call->sq_bytes += len;
        err = srv_start_send(call, bb, len, 0);
    } else if (call->sq_len == SEND_WINDOW) {
        grpc_byte_buffer_destroy(bb);
        err = SL_ELIMIT;
    } else {
        call->sq_bytes += len;
        call->sq[(call->sq_head + call->sq_len) % SEND_WINDOW] = bb;
        call->sq_size[(call->sq_head + call->sq_len) % SEND_WINDOW] = len;
        call->sq_len++;
    }
    pthread_mutex_unlock(&call->mu);
    if (!err)
        call->send_last = len;
    return err;
}

int sl_rpc_call_reply(sl_rpc_call *call, const ProtobufCMessage *msg)
{
    grpc_byte_buffer *bb;
    size_t len;
    int err;

    if (call->done)
        return SL_ECANCELLED;
    if (call->finished || call->send_busy)
        return SL_ESTATE;
    bb = pack_limited(call, msg, &err);
    if (!bb)
        return call_finish_msg(call, sl_rpc_code_from_err(err),
                               err == SL_ELIMIT ? "response exceeds the send limit"
                                                : "out of memory");
    set_status(call, SL_RPC_OK, NULL);
    pthread_mutex_lock(&call->mu);
    len = grpc_byte_buffer_length(bb);
    call->sq_bytes += len;
    err = srv_start_send(call, bb, len, 1);
    pthread_mutex_unlock(&call->mu);
    return err;
}

int sl_rpc_call_read(sl_rpc_call *call)
{
    grpc_op op;
    grpc_call_error e;

    if (call->done)
        return SL_ECANCELLED;
    if (call->finished || call->recv_busy ||
        (call->reg->m->kind != SL_RPC_CLIENT_STREAM && call->reg->m->kind != SL_RPC_BIDI_STREAM))
        return SL_ESTATE;
    if (call->has_first) {
        /* The first message was read before the loop saw the call: deliver it as a completed
         * read, through the queue, so on_message never runs inside this call. */
        call->has_first = 0;
        call->recv_buf = call->first;
        call->first = NULL;
        call->recv_busy = 1;
        if (!call->msg_stale)
            atomic_fetch_add_explicit(&call->progress, 1, memory_order_relaxed);
        atomic_fetch_add(&call->refs, 1);
        srv_push_event(call->srv, &call->tag_recv, 1);
        return 0;
    }
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &call->recv_buf;
    call->recv_busy = 1;
    if (!call->msg_stale)
        atomic_fetch_add_explicit(&call->progress, 1, memory_order_relaxed);
    atomic_fetch_add(&call->refs, 1);
    e = grpc_call_start_batch(call->call, &op, 1, &call->tag_recv, NULL);
    if (e != GRPC_CALL_OK) {
        call->recv_busy = 0;
        atomic_fetch_sub(&call->refs, 1);
        return SL_ERPC;
    }
    return 0;
}

ProtobufCMessage *sl_rpc_call_take_message(sl_rpc_call *call)
{
    ProtobufCMessage *msg = call->cur_msg;

    call->cur_msg = NULL;
    return msg;
}

sl_rpc_bytes *sl_rpc_call_take_bytes(sl_rpc_call *call)
{
    sl_rpc_bytes *b = call->cur_bytes;

    call->cur_bytes = NULL;
    return b;
}

void sl_rpc_call_set_data(sl_rpc_call *call, void *data, void (*free_fn)(void *))
{
    call->data = data;
    call->data_free = free_fn;
}

void *sl_rpc_call_data(const sl_rpc_call *call)
{
    return call->data;
}

int sl_rpc_call_is_done(const sl_rpc_call *call)
{
    return call->done || call->finished;
}

const char *sl_rpc_call_method(const sl_rpc_call *call)
{
    return call->path;
}

const char *sl_rpc_call_peer(const sl_rpc_call *call)
{
    return call->peer ? call->peer : "unknown";
}

int sl_rpc_call_metadata(const sl_rpc_call *call, const char *key, char *buf, size_t len)
{
    size_t klen = strlen(key);

    for (size_t i = 0; i < call->md.count; i++) {
        const grpc_metadata *m = &call->md.metadata[i];
        size_t vlen = GRPC_SLICE_LENGTH(m->value);
        if (GRPC_SLICE_LENGTH(m->key) != klen ||
            memcmp(GRPC_SLICE_START_PTR(m->key), key, klen) != 0)
            continue;
        if (vlen >= len)
            return SL_ELIMIT;
        memcpy(buf, GRPC_SLICE_START_PTR(m->value), vlen);
        buf[vlen] = '\0';
        return (int)vlen;
    }
    return SL_ENOTFOUND;
}
