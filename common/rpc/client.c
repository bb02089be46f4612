/* Blocking client calls: each call gets its own pluck completion queue, and every operation is
 * a batch followed by a pluck of its tag. The final status operation is started when a stream
 * opens and plucked by sl_rpc_stream_finish (or on free). */
#include "client.h"

#include "internal.h"
#include "../err.h"

#include <errno.h>
#include <grpc/support/alloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Unary calls reuse pluck queues: creating and draining one per call cost a tenth of a call. */
#define CQ_POOL_MAX 64

struct sl_rpc_client {
    grpc_channel *ch;
    grpc_metadata md; /* the authorization header, when a token is set */
    size_t n_md;
    pthread_mutex_t mu;
    grpc_completion_queue *pool[CQ_POOL_MAX];
    size_t n_pool;
};

struct sl_rpc_stream {
    grpc_completion_queue *cq;
    grpc_call *call;
    grpc_metadata_array init_md;
    grpc_metadata_array trailing;
    grpc_status_code status;
    grpc_slice details;
    const char *error_string;
    int got_init_md;
    int status_plucked;
    /* Distinct addresses serve as tags. */
    char t_md, t_write, t_read, t_close, t_status;
};

int sl_rpc_client_new(sl_rpc_client **out, const char *target, const sl_rpc_client_opts *opts)
{
    sl_rpc_client *c;
    grpc_channel_credentials *creds;
    grpc_arg args[5];
    grpc_channel_args chargs;
    int err;

    *out = NULL;
    if (!target || !*target)
        return SL_EINVAL;
    c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    grpc_init();
    err = sl_rpc_channel_creds(&creds, opts ? opts->tls : NULL);
    if (err) {
        free(c);
        grpc_shutdown_blocking();
        return err;
    }
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = opts && opts->max_recv_bytes > 0 ? opts->max_recv_bytes : 64 << 20;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = opts && opts->max_send_bytes > 0 ? opts->max_send_bytes : -1;
    /* sluice never compresses and its calls are not idempotent by default: without these the
     * per-call filters cost a measurable share of a unary call. */
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_ENABLE_RETRIES;
    args[2].value.integer = 0;
    args[3].type = GRPC_ARG_INTEGER;
    args[3].key = GRPC_ARG_ENABLE_PER_MESSAGE_COMPRESSION;
    args[3].value.integer = 0;
    chargs.num_args = 4;
    if (opts && opts->own_connection) {
        /* gRPC shares one connection among channels whose arguments are equal; a local
         * subchannel pool gives this channel connections of its own. */
        args[4].type = GRPC_ARG_INTEGER;
        args[4].key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
        args[4].value.integer = 1;
        chargs.num_args = 5;
    }
    chargs.args = args;
    c->ch = grpc_channel_create(target, creds, &chargs);
    pthread_mutex_init(&c->mu, NULL);
    if (opts && opts->token && *opts->token) {
        size_t len = strlen(opts->token) + 8;
        char *v = malloc(len);
        if (!v) {
            sl_rpc_client_free(c);
            return -ENOMEM;
        }
        snprintf(v, len, "Bearer %s", opts->token);
        c->md.key = grpc_slice_from_static_string("authorization");
        c->md.value = grpc_slice_from_copied_string(v);
        c->n_md = 1;
        /* The header holds a secret: wipe the temporary copy. */
        memset(v, 0, len);
        free(v);
    }
    grpc_channel_credentials_release(creds);
    *out = c;
    return 0;
}

static void drain_and_destroy(grpc_completion_queue *cq)
{
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
}

/* A pluck queue with nothing pending, from the pool or new. */
static grpc_completion_queue *cq_get(sl_rpc_client *c)
{
    grpc_completion_queue *cq = NULL;

    pthread_mutex_lock(&c->mu);
    if (c->n_pool > 0)
        cq = c->pool[--c->n_pool];
    pthread_mutex_unlock(&c->mu);
    return cq ? cq : grpc_completion_queue_create_for_pluck(NULL);
}

static void cq_put(sl_rpc_client *c, grpc_completion_queue *cq)
{
    pthread_mutex_lock(&c->mu);
    if (c->n_pool < CQ_POOL_MAX) {
        c->pool[c->n_pool++] = cq;
        cq = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    if (cq)
        drain_and_destroy(cq);
}

void sl_rpc_client_free(sl_rpc_client *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n_pool; i++)
        drain_and_destroy(c->pool[i]);
    if (c->n_md) {
        grpc_slice_unref(c->md.key);
        grpc_slice_unref(c->md.value);
    }
    pthread_mutex_destroy(&c->mu);
    grpc_channel_destroy(c->ch);
    free(c);
    grpc_shutdown_blocking();
}

static int pluck(grpc_completion_queue *cq, void *t)
{
    grpc_event ev = grpc_completion_queue_pluck(cq, t, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

static grpc_call *create_call(sl_rpc_client *c, grpc_completion_queue *cq, const char *method,
                              int64_t timeout_ms)
{
    grpc_slice m = grpc_slice_from_copied_string(method);
    grpc_call *call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL,
                                               sl_rpc_deadline(timeout_ms), NULL);
    grpc_slice_unref(m);
    return call;
}

static int fill_status(sl_rpc_status *st, grpc_status_code code, grpc_slice details)
{
    if (st) {
        st->code = (sl_rpc_code)code;
        sl_rpc_slice_copy(st->message, sizeof(st->message), details);
    }
    return sl_rpc_err_from_code((sl_rpc_code)code);
}

/* One unary exchange with an already-serialized request; on OK, *resp_bb holds the response. */
static int unary_bb(sl_rpc_client *c, const char *method, grpc_byte_buffer *req,
                    grpc_byte_buffer **resp_bb, int64_t timeout_ms, sl_rpc_status *st)
{
    grpc_completion_queue *cq = cq_get(c);
    grpc_call *call = create_call(c, cq, method, timeout_ms);
    grpc_metadata_array init_md, trailing;
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    const char *error_string = NULL;
    grpc_op ops[6];
    char t;
    int err;

    grpc_metadata_array_init(&init_md);
    grpc_metadata_array_init(&trailing);
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = c->n_md;
    ops[0].data.send_initial_metadata.metadata = &c->md;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = req;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = resp_bb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &details;
    ops[5].data.recv_status_on_client.error_string = &error_string;
    if (grpc_call_start_batch(call, ops, 6, &t, NULL) != GRPC_CALL_OK) {
        status = GRPC_STATUS_INTERNAL;
        details = grpc_slice_from_static_string("could not start the call");
    } else {
        pluck(cq, &t);
    }
    err = fill_status(st, status, details);
    grpc_slice_unref(details);
    gpr_free((void *)error_string);
    grpc_metadata_array_destroy(&init_md);
    grpc_metadata_array_destroy(&trailing);
    grpc_call_unref(call);
    /* The one batch completed and was plucked: the queue is empty and can serve again. */
    cq_put(c, cq);
    return err;
}

/* Decode a response; a message that does not decode is SL_EPROTO with INTERNAL in st. */
static int unpack_resp(ProtobufCMessage **resp, const ProtobufCMessageDescriptor *desc,
                       grpc_byte_buffer *bb, sl_rpc_status *st)
{
    *resp = sl_rpc_unpack(desc, bb, NULL, 0);
    if (*resp)
        return 0;
    if (st) {
        st->code = SL_RPC_INTERNAL;
        snprintf(st->message, sizeof(st->message), "response is not a valid %s", desc->name);
    }
    return SL_EPROTO;
}

int sl_rpc_client_unary(sl_rpc_client *c, const char *method, const ProtobufCMessage *req,
                        const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                        int64_t timeout_ms, sl_rpc_status *st)
{
    grpc_byte_buffer *req_bb = sl_rpc_pack(req);
    grpc_byte_buffer *resp_bb = NULL;
    int err;

    *resp = NULL;
    err = unary_bb(c, method, req_bb, &resp_bb, timeout_ms, st);
    grpc_byte_buffer_destroy(req_bb);
    if (err == 0)
        err = unpack_resp(resp, resp_desc, resp_bb, st);
    if (resp_bb)
        grpc_byte_buffer_destroy(resp_bb);
    return err;
}

int sl_rpc_client_unary_raw(sl_rpc_client *c, const char *method, const void *buf, size_t len,
                            int64_t timeout_ms, sl_rpc_status *st)
{
    grpc_byte_buffer *req_bb = sl_rpc_pack_raw(buf, len);
    grpc_byte_buffer *resp_bb = NULL;
    int err = unary_bb(c, method, req_bb, &resp_bb, timeout_ms, st);

    grpc_byte_buffer_destroy(req_bb);
    if (resp_bb)
        grpc_byte_buffer_destroy(resp_bb);
    return err;
}

/* ---- asynchronous unary calls ---- */

typedef struct async_call {
    grpc_call *call;
    grpc_byte_buffer *req, *resp;
    grpc_metadata_array init_md, trailing;
    grpc_status_code status;
    grpc_slice details;
    const char *error_string;
    void *user;
    struct async_call *prev, *next;
} async_call;

struct sl_rpc_async {
    sl_rpc_client *c;
    grpc_completion_queue *cq;
    async_call *calls; /* pending, doubly linked, so free can cancel them */
    size_t pending;
};

int sl_rpc_async_new(sl_rpc_async **out, sl_rpc_client *c)
{
    sl_rpc_async *a = calloc(1, sizeof(*a));

    *out = NULL;
    if (!a)
        return -ENOMEM;
    a->c = c;
    a->cq = grpc_completion_queue_create_for_next(NULL);
    *out = a;
    return 0;
}

static void async_call_free(async_call *ac)
{
    grpc_byte_buffer_destroy(ac->req);
    if (ac->resp)
        grpc_byte_buffer_destroy(ac->resp);
    grpc_metadata_array_destroy(&ac->init_md);
    grpc_metadata_array_destroy(&ac->trailing);
    grpc_slice_unref(ac->details);
    gpr_free((void *)ac->error_string);
    grpc_call_unref(ac->call);
    free(ac);
}

int sl_rpc_async_start(sl_rpc_async *a, const char *method, const ProtobufCMessage *req,
                       int64_t timeout_ms, void *user)
{
    async_call *ac = calloc(1, sizeof(*ac));
    grpc_op ops[6];

    if (!ac)
        return -ENOMEM;
    ac->call = create_call(a->c, a->cq, method, timeout_ms);
    ac->req = sl_rpc_pack(req);
    ac->details = grpc_empty_slice();
    ac->status = GRPC_STATUS_UNKNOWN;
    ac->user = user;
    grpc_metadata_array_init(&ac->init_md);
    grpc_metadata_array_init(&ac->trailing);
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = a->c->n_md;
    ops[0].data.send_initial_metadata.metadata = &a->c->md;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = ac->req;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &ac->init_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &ac->resp;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &ac->trailing;
    ops[5].data.recv_status_on_client.status = &ac->status;
    ops[5].data.recv_status_on_client.status_details = &ac->details;
    ops[5].data.recv_status_on_client.error_string = &ac->error_string;
    if (grpc_call_start_batch(ac->call, ops, 6, ac, NULL) != GRPC_CALL_OK) {
        async_call_free(ac);
        return SL_ERPC;
    }
    ac->next = a->calls;
    if (a->calls)
        a->calls->prev = ac;
    a->calls = ac;
    a->pending++;
    return 0;
}

size_t sl_rpc_async_pending(const sl_rpc_async *a)
{
    return a->pending;
}

int sl_rpc_async_wait(sl_rpc_async *a, const ProtobufCMessageDescriptor *resp_desc,
                      ProtobufCMessage **resp, void **user, sl_rpc_status *st)
{
    grpc_event ev;
    async_call *ac;
    int err;

    if (resp)
        *resp = NULL;
    if (a->pending == 0)
        return SL_ESTATE;
    ev = grpc_completion_queue_next(a->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE)
        return SL_ERPC;
    ac = ev.tag;
    if (ac->prev)
        ac->prev->next = ac->next;
    else
        a->calls = ac->next;
    if (ac->next)
        ac->next->prev = ac->prev;
    a->pending--;
    if (user)
        *user = ac->user;
    err = fill_status(st, ac->status, ac->details);
    if (err == 0 && resp_desc && resp)
        err = unpack_resp(resp, resp_desc, ac->resp, st);
    async_call_free(ac);
    return err;
}

void sl_rpc_async_free(sl_rpc_async *a)
{
    if (!a)
        return;
    for (async_call *ac = a->calls; ac; ac = ac->next)
        grpc_call_cancel(ac->call, NULL);
    while (a->pending > 0)
        sl_rpc_async_wait(a, NULL, NULL, NULL, NULL);
    grpc_completion_queue_shutdown(a->cq);
    while (grpc_completion_queue_next(a->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(a->cq);
    free(a);
}

int sl_rpc_stream_open(sl_rpc_stream **out, sl_rpc_client *c, const char *method,
                       int64_t timeout_ms)
{
    sl_rpc_stream *s = calloc(1, sizeof(*s));
    grpc_op op;

    *out = NULL;
    if (!s)
        return -ENOMEM;
    s->cq = grpc_completion_queue_create_for_pluck(NULL);
    s->call = create_call(c, s->cq, method, timeout_ms);
    s->details = grpc_empty_slice();
    s->status = GRPC_STATUS_UNKNOWN;
    grpc_metadata_array_init(&s->init_md);
    grpc_metadata_array_init(&s->trailing);

    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &s->trailing;
    op.data.recv_status_on_client.status = &s->status;
    op.data.recv_status_on_client.status_details = &s->details;
    op.data.recv_status_on_client.error_string = &s->error_string;
    if (grpc_call_start_batch(s->call, &op, 1, &s->t_status, NULL) != GRPC_CALL_OK) {
        s->status_plucked = 1;
        sl_rpc_stream_free(s);
        return SL_ERPC;
    }
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_INITIAL_METADATA;
    op.data.send_initial_metadata.count = c->n_md;
    op.data.send_initial_metadata.metadata = &c->md;
    if (grpc_call_start_batch(s->call, &op, 1, &s->t_md, NULL) != GRPC_CALL_OK ||
        !pluck(s->cq, &s->t_md)) {
        /* The failure shows in the status; keep the stream so finish can report it. */
    }
    *out = s;
    return 0;
}

static int write_bb(sl_rpc_stream *s, grpc_byte_buffer *bb, int flags)
{
    grpc_op op;
    int ok = 0;

    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = bb;
    op.flags = (flags & SL_RPC_SEND_MORE) ? GRPC_WRITE_BUFFER_HINT : 0;
    if (grpc_call_start_batch(s->call, &op, 1, &s->t_write, NULL) == GRPC_CALL_OK)
        ok = pluck(s->cq, &s->t_write);
    grpc_byte_buffer_destroy(bb);
    return ok ? 0 : SL_ERPC;
}

int sl_rpc_stream_write(sl_rpc_stream *s, const ProtobufCMessage *msg, int flags)
{
    return write_bb(s, sl_rpc_pack(msg), flags);
}

int sl_rpc_stream_write_raw(sl_rpc_stream *s, const void *buf, size_t len, int flags)
{
    return write_bb(s, sl_rpc_pack_raw(buf, len), flags);
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;

    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

int sl_rpc_stream_write_bytes(sl_rpc_stream *s, uint32_t field, size_t len, int flags,
                              int (*fill)(void *dst, size_t len, void *arg), void *arg)
{
    uint8_t head[16];
    size_t hlen;
    grpc_slice slice;
    grpc_byte_buffer *bb;
    int err;

    if (field == 0 || field > 0x1fffffff || (uint64_t)len > UINT32_MAX)
        return SL_EINVAL;
    hlen = put_varint(head, ((uint64_t)field << 3) | 2);
    hlen += put_varint(head + hlen, len);
    slice = grpc_slice_malloc(hlen + len);
    memcpy(GRPC_SLICE_START_PTR(slice), head, hlen);
    err = fill(GRPC_SLICE_START_PTR(slice) + hlen, len, arg);
    if (err) {
        grpc_slice_unref(slice);
        return err;
    }
    bb = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    return write_bb(s, bb, flags);
}

int sl_rpc_stream_close_send(sl_rpc_stream *s)
{
    grpc_op op;

    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    if (grpc_call_start_batch(s->call, &op, 1, &s->t_close, NULL) != GRPC_CALL_OK)
        return SL_ERPC;
    return pluck(s->cq, &s->t_close) ? 0 : SL_ERPC;
}

/* The next message's bytes into *bb (NULL at the end of the stream). Returns 0 or SL_ERPC. */
static int stream_recv(sl_rpc_stream *s, grpc_byte_buffer **out)
{
    grpc_byte_buffer *bb = NULL;
    grpc_op ops[2];
    size_t n = 0;

    *out = NULL;
    memset(ops, 0, sizeof(ops));
    if (!s->got_init_md) {
        ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[n].data.recv_initial_metadata.recv_initial_metadata = &s->init_md;
        n++;
        s->got_init_md = 1;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n].data.recv_message.recv_message = &bb;
    n++;
    if (grpc_call_start_batch(s->call, ops, n, &s->t_read, NULL) != GRPC_CALL_OK)
        return SL_ERPC;
    if (!pluck(s->cq, &s->t_read)) {
        if (bb)
            grpc_byte_buffer_destroy(bb);
        return SL_ERPC;
    }
    *out = bb;
    return 0;
}

int sl_rpc_stream_read(sl_rpc_stream *s, const ProtobufCMessageDescriptor *desc,
                       ProtobufCMessage **msg)
{
    grpc_byte_buffer *bb;
    int err = stream_recv(s, &bb);

    *msg = NULL;
    if (err || !bb)
        return err;
    *msg = sl_rpc_unpack(desc, bb, NULL, 0);
    grpc_byte_buffer_destroy(bb);
    return *msg ? 1 : SL_EPROTO;
}

int sl_rpc_stream_read_bytes(sl_rpc_stream *s, const ProtobufCMessageDescriptor *desc,
                             uint32_t field, ProtobufCMessage **msg, sl_rpc_bytes **bytes)
{
    grpc_byte_buffer *bb;
    int err = stream_recv(s, &bb);

    *msg = NULL;
    *bytes = NULL;
    if (err || !bb)
        return err;
    err = sl_rpc_decode_bytes(msg, desc, field, bb, bytes, NULL, 0);
    grpc_byte_buffer_destroy(bb);
    return err == 0 ? 1 : err == -ENOMEM ? err : SL_EPROTO;
}

int sl_rpc_stream_finish(sl_rpc_stream *s, sl_rpc_status *st)
{
    if (!s->got_init_md) {
        /* The status of a call whose initial metadata nobody asked for may never complete. */
        grpc_op op;
        memset(&op, 0, sizeof(op));
        op.op = GRPC_OP_RECV_INITIAL_METADATA;
        op.data.recv_initial_metadata.recv_initial_metadata = &s->init_md;
        s->got_init_md = 1;
        if (grpc_call_start_batch(s->call, &op, 1, &s->t_read, NULL) == GRPC_CALL_OK)
            pluck(s->cq, &s->t_read);
    }
    if (!s->status_plucked) {
        pluck(s->cq, &s->t_status);
        s->status_plucked = 1;
    }
    return fill_status(st, s->status, s->details);
}

void sl_rpc_stream_cancel(sl_rpc_stream *s)
{
    grpc_call_cancel(s->call, NULL);
}

void sl_rpc_stream_free(sl_rpc_stream *s)
{
    if (!s)
        return;
    if (!s->status_plucked) {
        grpc_call_cancel(s->call, NULL);
        pluck(s->cq, &s->t_status);
    }
    grpc_call_unref(s->call);
    drain_and_destroy(s->cq);
    grpc_slice_unref(s->details);
    gpr_free((void *)s->error_string);
    grpc_metadata_array_destroy(&s->init_md);
    grpc_metadata_array_destroy(&s->trailing);
    free(s);
}
