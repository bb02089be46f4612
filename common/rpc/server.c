/* The RPC server: gRPC C core completion queue -> threads -> queue -> libuv loop -> handlers.
 *
 * Every completion carries a tag that names what finished: a request slot (a new call arrived),
 * or one of a call's three operation kinds (send, receive, close). A new call is admitted on the
 * completion-queue thread that received it (see "admission" below): the slot is armed again at
 * once, and calls that can be answered without a handler never reach the loop. Past admission,
 * completion-queue threads only forward (tag, ok) pairs to the loop, which owns the call from
 * then on; the exceptions are send chains (see chain_next) and the reference count, atomic for
 * them.
 *
 * A call's state lives until (a) its RECV_CLOSE_ON_SERVER operation completed, (b) no send or
 * receive batch is outstanding and (c) no handler holds a reference. The close operation is how a
 * client's cancellation is learned, so it is started as soon as the call is handed to the loop.
 * A call is handed over only once its request (a streaming call's first message, or its end)
 * arrived: until then a receive is its only operation, and if that fails (the client reset the
 * stream) the call is freed on the completion-queue thread.
 */
#include "server.h"

#include "internal.h"
#include "keys.h"
#include "../err.h"
#include "../log.h"

#include <errno.h>
#include <grpc/compression.h>
#include <grpc/support/alloc.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum tag_kind {
    TAG_SLOT,
    TAG_SEND,
    TAG_RECV,
    TAG_CLOSE,
    TAG_WRITABLE,
    TAG_START, /* an admitted call for the loop (queued by a completion-queue thread) */
    TAG_KICK,  /* a completion-queue thread freed the last call: check for shutdown */
    TAG_SHUTDOWN
};

/* Where a call is: waiting for its request (or first message) on the completion-queue threads,
 * or handed to the loop. */
enum stage { STAGE_PREFETCH, STAGE_LOOP };

/* Default bound of calls that arrived and that the loop has not started. */
#define MAX_PENDING 8192

/* A connection that, within a second, resets this many calls before their request, ends them
 * without one or calls unknown methods is cut (HTTP/2 rapid reset and its kin): no client has a
 * reason to, and gRPC 1.51 has no limit of its own. */
#define RESET_FLOOD 500

/* The address of a connection cut for a flood is refused this long: a kernel filter on the
 * listening socket drops its packets, and a call from it that was parsed already is dropped. */
#define BAN_MS 10000

/* A call may queue this many messages; the handler is told it may send more (on_writable) when
 * the queue has drained to half. */
#define SEND_WINDOW 64

typedef struct tag {
    enum tag_kind kind;
    void *ptr;
} tag;

/* A registered method: the handler table entry and the C core's handle for it. */
typedef struct reg {
    const sl_rpc_service *svc;
    const sl_rpc_method *m;
    size_t svc_idx; /* index of svc in the server's services */
    char *path;
    void *handle;
} reg;

/* An armed request: waits for the next call of one registered method (reg != NULL) or of any
 * method nobody registered (reg == NULL, answered UNIMPLEMENTED). */
typedef struct slot {
    tag tag;
    sl_rpc_server *srv;
    const reg *reg;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_call_details details;
    /* Bumped (release) by the thread that arms the slot, read (acquire) by the one its
     * completion comes to: the core's own synchronisation is invisible to ThreadSanitizer. */
    atomic_uint armed;
} slot;

typedef struct event {
    tag *tag; /* NULL: a completion-queue thread has exited */
    int ok;
} event;

struct sl_rpc_call {
    sl_rpc_server *srv;
    const reg *reg;
    grpc_call *call;
    grpc_metadata_array md;
    char *path;
    char *peer;
    uint64_t start_us;
    /* Atomic because a completion-queue thread drops the reference of a finished send chain;
     * it never drops the last one, so the state is always freed on the loop. */
    atomic_int refs;
    unsigned send_busy : 1, recv_busy : 1, finished : 1, done : 1, status_pending : 1, sent_md : 1,
        has_details : 1;
    int close_cancelled;
    tag tag_send, tag_recv, tag_close, tag_writable, tag_start;

    /* The send queue. Queued messages are started by whichever thread sees the previous send
     * complete: a completion-queue thread keeps the chain going without a trip through the loop,
     * which is what makes streaming fast. Everything below `mu` is guarded by it; the loop owns
     * send_busy (a chain is running and holds one reference). */
    pthread_mutex_t mu;
    grpc_byte_buffer *send_buf; /* the message in flight */
    grpc_byte_buffer *sq[SEND_WINDOW];
    size_t sq_head, sq_len;
    int writable_posted;
    int status_sent; /* the batch in flight carries the final status */
    grpc_byte_buffer *recv_buf;
    sl_rpc_code status_code;
    grpc_slice status_details;
    void *data;
    void (*data_free)(void *);
    ProtobufCMessage *cur_msg; /* the message being delivered, unless the handler took it */
    sl_rpc_bytes *cur_bytes;   /* its bytes_field, unless the handler took them */
    uint64_t bytes_in, bytes_out;

    /* Admission (completion-queue threads until the loop starts the call). `stage` moves from
     * STAGE_PREFETCH to STAGE_LOOP once, on the thread that received the request; `peer_key` is its
     * count under its peer address (srv->peers_mu), `pending` says it counts as waiting for the
     * loop (until the loop starts it), `budget_idx` that it does so as a call of that service with
     * a budget of its own (-1: not). A prefetching call is on the server's prefetch list
     * (srv->pf_mu, with pf_cancelled) for the idle sweep. */
    atomic_int stage;
    sl_rpc_key *peer_key;
    int pending;
    int budget_idx;
    grpc_byte_buffer *payload; /* the request of a unary or server-streaming call */
    grpc_byte_buffer *first;   /* the first message of a streaming call, read before the loop */
    int has_first;             /* loop: `first` (NULL: the client closed at once) not yet read */
    uint64_t arrived_us;
    int pf_cancelled;
    struct sl_rpc_call *pf_prev, *pf_next;

    /* Limits (loop thread, except `progress`). The call is on the server's list of calls from
     * the loop's start until freed; `admitted` says it counts against max_calls (1) or its
     * service's budget (2), `key` is its claim. */
    struct sl_rpc_call *prev, *next;
    int admitted;
    sl_rpc_key *key;
    sl_rpc_end end;
    /* Bumped by whichever thread sees a message arrive, a read start or a send complete; the idle
     * sweep compares it with the value it saw last (`idle_seen`, at `idle_since_us`). */
    atomic_uint progress;
    unsigned idle_seen;
    uint64_t idle_since_us;
};

struct sl_rpc_server {
    uv_loop_t *loop;
    grpc_server *server;
    grpc_completion_queue *cq;
    sl_rpc_server_opts opts;
    const sl_rpc_service **services; /* copied array; the services themselves are borrowed */
    size_t n_services;
    reg *regs;
    size_t n_regs;
    slot *slots;
    size_t n_slots;
    int port;

    /* Hand-off from completion-queue threads to the loop. */
    pthread_mutex_t mu;
    event *q;
    size_t q_len, q_cap;
    event *work;
    size_t work_cap;
    uv_async_t async;

    pthread_t *threads;
    int n_threads;
    int threads_exited;

    atomic_size_t live_calls;
    atomic_size_t live_streams;
    atomic_int stopping; /* shutdown started: slots are not armed again */
    int shutting_down;
    int shutdown_seen;
    int cq_shut;
    int torn_down;
    int handles_open;
    uv_timer_t grace;
    tag shutdown_tag, kick_tag;
    void (*done)(void *);
    void *done_arg;

    /* Limits, loop thread: every call the loop started, admitted calls (all, and per service:
     * calls and streams), the per-key counts of sl_rpc_call_claim, and the idle sweep. */
    sl_rpc_call *calls;
    size_t admitted;
    size_t *svc_calls, *svc_streams;
    sl_rpc_keys keys;
    uv_timer_t idle_timer;
    uv_timer_t guard_timer;

    /* Admission, any thread: calls per peer address, calls waiting for their first message,
     * calls not yet started by the loop (the server's count, and one per service with a budget
     * of its own), and what was answered before the loop (sl_rpc_server_counters). */
    pthread_mutex_t peers_mu;
    sl_rpc_keys peers;
    pthread_mutex_t pf_mu;
    sl_rpc_call *prefetch;
    atomic_size_t pending;
    atomic_size_t *svc_pending;
    atomic_uint_least64_t n_reset, n_no_request, n_unknown, n_peer_limit, n_busy, n_idle, n_cut,
        n_banned;
    sl_rpc_resets resets, cuts;
    sl_rpc_bans bans;
    unsigned filter_gen; /* loop: the bans the listener's filter was built from */
    unsigned long long filter_next_ms;
    int filter_n;
};

static uint64_t now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ---- completion-queue threads ---- */

static void push_event(sl_rpc_server *srv, tag *t, int ok)
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

static int chain_next(sl_rpc_call *c);

/* Drop a reference unless it is the last one (which must be dropped on the loop, where the state
 * is freed). Returns 1 if dropped. Any thread. */
static int drop_ref_unless_last(sl_rpc_call *c)
{
    int refs = atomic_load(&c->refs);

    while (refs > 1)
        if (atomic_compare_exchange_weak(&c->refs, &refs, refs - 1))
            return 1;
    return 0;
}

static void on_slot(slot *s, int ok);
static int on_prefetched(sl_rpc_call *c, int ok);

static void *cq_thread(void *arg)
{
    sl_rpc_server *srv = arg;

    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        if (((tag *)ev.tag)->kind == TAG_SLOT) {
            on_slot(((tag *)ev.tag)->ptr, ev.success);
            continue;
        }
        if (((tag *)ev.tag)->kind == TAG_RECV && on_prefetched(((tag *)ev.tag)->ptr, ev.success))
            continue;
        if (ev.success && ((tag *)ev.tag)->kind == TAG_SEND) {
            sl_rpc_call *c = ((tag *)ev.tag)->ptr;
            int more;
            atomic_fetch_add_explicit(&c->progress, 1, memory_order_relaxed);
            pthread_mutex_lock(&c->mu);
            more = chain_next(c);
            if (!more && c->status_sent && drop_ref_unless_last(c))
                more = 1; /* the call is over: nothing for the loop to do */
            pthread_mutex_unlock(&c->mu);
            if (more)
                continue;
        }
        push_event(srv, ev.tag, ev.success);
    }
    push_event(srv, NULL, 0);
    return NULL;
}

/* ---- call lifecycle ---- */

static void maybe_finish_shutdown(sl_rpc_server *srv);
static void drain_queue(sl_rpc_call *c);

/* Free what every call has, whichever thread frees it, and count it gone. The last call freed
 * during shutdown lets the loop finish it (directly, or through a kick from another thread). */
static void call_release(sl_rpc_call *c, int on_loop)
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
            maybe_finish_shutdown(srv);
        else
            push_event(srv, &srv->kick_tag, 1);
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
    if (c->send_buf)
        grpc_byte_buffer_destroy(c->send_buf);
    drain_queue(c);
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
    call_release(c, 1);
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

/* Start a batch on the call's send path: initial metadata if not yet sent, then the message
 * (may be NULL), then the status (if with_status). Takes ownership of bb. Loop thread, with c->mu
 * held; the batch's completion owns the reference it takes. */
static int start_send(sl_rpc_call *c, grpc_byte_buffer *bb, int with_status)
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
    c->send_busy = 1;
    c->status_sent = with_status;
    atomic_fetch_add(&c->refs, 1);
    e = grpc_call_start_batch(c->call, ops, n, &c->tag_send, NULL);
    if (e != GRPC_CALL_OK) {
        sl_log_warn("rpc_start_batch_failed", "method=%s error=%d", c->path, (int)e);
        c->send_busy = 0;
        c->send_buf = NULL;
        c->status_sent = 0;
        if (bb)
            grpc_byte_buffer_destroy(bb);
        atomic_fetch_sub(&c->refs, 1);
        return SL_ERPC;
    }
    c->sent_md = 1;
    return 0;
}

/* Continue a send chain with the next queued message. Any thread, with c->mu held. The write
 * hint lets the transport coalesce this message with the ones queued behind it; the last queued
 * message goes without it, so nothing is held back. Returns 1 if a send was started. */
static int chain_next(sl_rpc_call *c)
{
    grpc_byte_buffer *bb;
    grpc_op op;

    if (c->send_buf) {
        grpc_byte_buffer_destroy(c->send_buf);
        c->send_buf = NULL;
    }
    if (c->sq_len == 0)
        return 0;
    bb = c->sq[c->sq_head];
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
        push_event(c->srv, &c->tag_writable, 1);
    }
    if (grpc_call_start_batch(c->call, &op, 1, &c->tag_send, NULL) != GRPC_CALL_OK) {
        c->send_buf = NULL;
        grpc_byte_buffer_destroy(bb);
        return 0;
    }
    return 1;
}

/* Drop every queued message (the call is failing). With c->mu held. */
static void drain_queue(sl_rpc_call *c)
{
    while (c->sq_len > 0) {
        grpc_byte_buffer_destroy(c->sq[c->sq_head]);
        c->sq_head = (c->sq_head + 1) % SEND_WINDOW;
        c->sq_len--;
    }
}

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
    err = start_send(c, NULL, 1);
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

int sl_rpc_call_send_room(const sl_rpc_call *call)
{
    sl_rpc_call *c = (sl_rpc_call *)call;
    size_t used;

    if (c->done || c->finished)
        return 0;
    pthread_mutex_lock(&c->mu);
    used = c->sq_len;
    pthread_mutex_unlock(&c->mu);
    return (int)(SEND_WINDOW - used);
}

int sl_rpc_call_send(sl_rpc_call *call, const ProtobufCMessage *msg)
{
    grpc_byte_buffer *bb;
    int err;

    if (call->done)
        return SL_ECANCELLED;
    if (call->finished)
        return SL_ESTATE;
    bb = pack_limited(call, msg, &err);
    if (!bb)
        return err;
    pthread_mutex_lock(&call->mu);
    if (!call->send_busy) {
        err = start_send(call, bb, 0);
    } else if (call->sq_len == SEND_WINDOW) {
        grpc_byte_buffer_destroy(bb);
        err = SL_ELIMIT;
    } else {
        call->sq[(call->sq_head + call->sq_len) % SEND_WINDOW] = bb;
        call->sq_len++;
    }
    pthread_mutex_unlock(&call->mu);
    return err;
}

int sl_rpc_call_reply(sl_rpc_call *call, const ProtobufCMessage *msg)
{
    grpc_byte_buffer *bb;
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
    err = start_send(call, bb, 1);
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
        atomic_fetch_add_explicit(&call->progress, 1, memory_order_relaxed);
        atomic_fetch_add(&call->refs, 1);
        push_event(call->srv, &call->tag_recv, 1);
        return 0;
    }
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &call->recv_buf;
    call->recv_busy = 1;
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

/* ---- completions (loop thread) ---- */

/* A send chain ended: its last batch completed with nothing queued behind it, or failed. */
static void on_send_done(sl_rpc_call *c, int ok)
{
    int more;

    pthread_mutex_lock(&c->mu);
    if (ok && !c->done) {
        /* The handler may have queued messages since the completion thread looked. */
        more = chain_next(c);
    } else {
        more = 0;
        if (c->send_buf) {
            grpc_byte_buffer_destroy(c->send_buf);
            c->send_buf = NULL;
        }
        drain_queue(c);
    }
    pthread_mutex_unlock(&c->mu);
    if (more)
        return;
    c->send_busy = 0;
    if (c->status_pending) {
        c->status_pending = 0;
        if (ok && !c->done) {
            pthread_mutex_lock(&c->mu);
            start_send(c, NULL, 1);
            pthread_mutex_unlock(&c->mu);
        }
    } else if (ok && !c->finished && !c->done && c->reg && c->reg->m->on_writable) {
        c->reg->m->on_writable(c, c->reg->svc->arg);
    }
    sl_rpc_call_unref(c);
}

/* The queue drained to half while a chain runs: the handler may produce more. The chain's
 * reference keeps the call alive: the event that ends the chain is queued after this one. */
static void on_writable(sl_rpc_call *c)
{
    pthread_mutex_lock(&c->mu);
    c->writable_posted = 0;
    pthread_mutex_unlock(&c->mu);
    if (!c->finished && !c->done && c->reg && c->reg->m->on_writable)
        c->reg->m->on_writable(c, c->reg->svc->arg);
}

static void on_recv_done(sl_rpc_call *c, int ok)
{
    grpc_byte_buffer *bb = c->recv_buf;
    const sl_rpc_method *m = c->reg->m;

    c->recv_buf = NULL;
    c->recv_busy = 0;
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

static void on_close_done(sl_rpc_call *c)
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

static void arm_slot(slot *s);

/* ---- admission (completion-queue threads) ---- */

/* Answer a call the server keeps no state for, and let it go. */
static void refuse(grpc_call *call, grpc_status_code code, const char *msg)
{
    grpc_call_cancel_with_status(call, code, msg, NULL);
    grpc_call_unref(call);
}

/* Answer an admitted call before any operation was started on it, and free it. */
static void refuse_call(sl_rpc_call *c, grpc_status_code code, const char *msg)
{
    grpc_call_cancel_with_status(c->call, code, msg, NULL);
    call_release(c, 0);
}

/* State for a new call of a registered method; takes `call` and `md`. Returns NULL if memory ran
 * out (the call is then answered and released). */
static sl_rpc_call *call_new(sl_rpc_server *srv, const reg *r, grpc_call *call,
                             grpc_metadata_array *md, const char *peer)
{
    sl_rpc_call *c = calloc(1, sizeof(*c));

    if (c)
        c->path = strdup(r->path);
    if (!c || !c->path) {
        free(c);
        grpc_metadata_array_destroy(md);
        refuse(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
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

/* Count the call as waiting for the loop (apart for a service with a budget of its own) and
 * under its peer. At a limit the call is answered RESOURCE_EXHAUSTED and freed. Returns 1 if
 * admitted. */
static int admit_early(sl_rpc_call *c)
{
    sl_rpc_server *srv = c->srv;
    const sl_rpc_service *svc = c->reg->svc;
    size_t i = c->reg->svc_idx;
    char key[SL_RPC_PEER_KEY_MAX], msg[256];
    int err;

    if (svc->budget) {
        /* Counted apart, so that calls of other services waiting for the loop cannot keep
         * these out; the budget itself applies once the loop has the call (admit). */
        if (atomic_fetch_add(&srv->svc_pending[i], 1) < (size_t)srv->opts.max_pending) {
            c->budget_idx = (int)i;
            return 1;
        }
        atomic_fetch_sub(&srv->svc_pending[i], 1);
        atomic_fetch_add(&srv->n_busy, 1);
        snprintf(msg, sizeof(msg), "server busy: %d calls to %s waiting to start",
                 srv->opts.max_pending, svc->name);
        refuse_call(c, GRPC_STATUS_RESOURCE_EXHAUSTED, msg);
        return 0;
    }
    if (atomic_fetch_add(&srv->pending, 1) >= (size_t)srv->opts.max_pending) {
        atomic_fetch_sub(&srv->pending, 1);
        atomic_fetch_add(&srv->n_busy, 1);
        snprintf(msg, sizeof(msg), "server busy: %d calls waiting to start", srv->opts.max_pending);
        sl_log_limited(SL_LOG_WARN, 1000, "rpc_limit",
                       "limit=max_pending value=%d method=%s peer=%s", srv->opts.max_pending,
                       c->path, sl_rpc_call_peer(c));
        refuse_call(c, GRPC_STATUS_RESOURCE_EXHAUSTED, msg);
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
    refuse_call(c, GRPC_STATUS_RESOURCE_EXHAUSTED, msg);
    return 0;
}

/* Hand an admitted call to the loop, then start its close operation: the close's completion is
 * queued after the start, and its reference (the call's first) keeps the call alive meanwhile. */
static void to_loop(sl_rpc_call *c)
{
    grpc_op op;

    atomic_store_explicit(&c->stage, STAGE_LOOP, memory_order_release);
    push_event(c->srv, &c->tag_start, 1);
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    if (grpc_call_start_batch(c->call, &op, 1, &c->tag_close, NULL) != GRPC_CALL_OK) {
        /* Not seen in practice; without a close the call would never be freed. */
        sl_log_error("rpc_start_batch_failed", "method=%s op=close", c->path);
        grpc_call_cancel(c->call, NULL);
        c->close_cancelled = 1;
        push_event(c->srv, &c->tag_close, 0);
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
        refuse_call(c, GRPC_STATUS_INTERNAL, "cannot read the request");
    }
}

/* Close the connection of `peer`, which flooded the server (`why`), and refuse its address for
 * BAN_MS. Any thread. */
static void cut_connection(sl_rpc_server *srv, const char *peer, const char *why)
{
    char key[SL_RPC_PEER_KEY_MAX];
    int n;

    sl_rpc_peer_key(key, sizeof(key), peer);
    if (sl_rpc_bans_check(&srv->bans, key, now_us() / 1000))
        return; /* already cut, with every connection from its address */
    sl_rpc_bans_add(&srv->bans, key, now_us() / 1000 + BAN_MS);
    n = sl_rpc_conn_shutdown_key(key, srv->port);
    atomic_fetch_add(&srv->n_cut, 1);
    sl_log_limited(SL_LOG_WARN, 1000, "rpc_flood",
                   "peer=%s reason=\"%s\" action=close_connections closed=%d blocked=%s "
                   "blocked_s=%d",
                   peer, why, n, key, BAN_MS / 1000);
}

/* Count a call of `peer` that did nothing but cost: reset before its request, ended without
 * one, or to an unknown method. RESET_FLOOD of them within a second cut the connection. */
static void junk(sl_rpc_server *srv, const char *peer)
{
    if (peer && sl_rpc_resets_add(&srv->resets, peer, now_us() / 1000, RESET_FLOOD))
        cut_connection(srv, peer,
                       "500 calls reset, without a request or to unknown methods "
                       "within a second");
}

/* 1 if the call comes from a blocked address: it is then dropped, and its connection closed
 * (once a second at most). Completion-queue thread. */
static int blocked(sl_rpc_server *srv, grpc_call *call, const char *peer)
{
    char key[SL_RPC_PEER_KEY_MAX];
    uint64_t now_ms = now_us() / 1000;

    if (!peer)
        return 0;
    sl_rpc_peer_key(key, sizeof(key), peer);
    if (!sl_rpc_bans_check(&srv->bans, key, now_ms))
        return 0;
    atomic_fetch_add(&srv->n_banned, 1);
    if (sl_rpc_resets_add(&srv->cuts, peer, now_ms, 1))
        sl_rpc_conn_shutdown(peer, srv->port);
    /* No status: the connection is going away, and an answer would only cost more work. */
    grpc_call_unref(call);
    return 1;
}

/* The first read of a prefetching call completed: hand the call to the loop with the message (or
 * with the client's end of stream), or free it here if the read failed (the client reset the
 * stream, or the idle sweep ended it). Returns 0 if the call is not prefetching (a read the loop
 * asked for). Completion-queue thread. */
static int on_prefetched(sl_rpc_call *c, int ok)
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
            junk(srv, c->peer);
        call_release(c, 0);
        return 1;
    }
    if (c->reg->m->kind == SL_RPC_UNARY || c->reg->m->kind == SL_RPC_SERVER_STREAM) {
        if (!c->recv_buf) {
            /* The client half-closed without sending its request. */
            char msg[SL_RPC_TEXT_MAX + 64];
            atomic_fetch_add(&srv->n_no_request, 1);
            junk(srv, c->peer);
            snprintf(msg, sizeof(msg), "request message missing for %s", c->path);
            refuse_call(c, GRPC_STATUS_INVALID_ARGUMENT, msg);
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
static void on_slot(slot *s, int ok)
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
        arm_slot(s);
    if (!ok) {
        /* Pending requests complete unsuccessfully when the server shuts down. */
        grpc_metadata_array_destroy(&md);
        if (!atomic_load(&srv->stopping))
            sl_log_warn("rpc_slot_failed", NULL);
        return;
    }
    peer = grpc_call_get_peer(call);
    if (blocked(srv, call, peer)) {
        grpc_metadata_array_destroy(&md);
    } else if (!r) {
        /* The path is the client's: cleaned, it names the method in the status and the log,
         * never in metrics. */
        atomic_fetch_add(&srv->n_unknown, 1);
        grpc_metadata_array_destroy(&md);
        snprintf(msg, sizeof(msg), "unknown method %s", path);
        sl_log_limited(SL_LOG_INFO, 1000, "rpc_unknown_method", "method=\"%s\"", path);
        refuse(call, GRPC_STATUS_UNIMPLEMENTED, msg);
        junk(srv, peer);
    } else if ((c = call_new(srv, r, call, &md, peer)) != NULL && admit_early(c)) {
        prefetch(c);
    }
    gpr_free(peer);
}

static void arm_slot(slot *s)
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

/* ---- the loop's side of a call's start ---- */

/* Ask the server's authorize callback; on refusal the call is finished. Returns 1 if allowed. */
static int authorized(sl_rpc_call *c)
{
    static const char bearer[] = "Bearer ";
    char value[1024], msg[512] = "";
    const char *token = NULL;
    int n, err;

    n = sl_rpc_call_metadata(c, "authorization", value, sizeof(value));
    if (n >= (int)sizeof(bearer) - 1 && strncmp(value, bearer, sizeof(bearer) - 1) == 0)
        token = value + sizeof(bearer) - 1;
    err = c->srv->opts.authorize(c->path, c->reg->m->access, token, msg, sizeof(msg),
                                 c->srv->opts.authorize_arg);
    if (err == 0)
        return 1;
    if (err != SL_EPERM && err != SL_ECATLOST)
        err = SL_EAUTH;
    sl_rpc_call_fail(c, err, "%s", msg[0] ? msg : sl_strerror(err));
    return 0;
}

/* Count the call against max_calls, or against its service's budget (sl_rpc_budget). On refusal
 * the call is finished. Returns 1 if admitted. */
static int admit(sl_rpc_call *c)
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

int sl_rpc_call_claim(sl_rpc_call *call, const char *key, const char *what)
{
    sl_rpc_server *srv = call->srv;
    int err;

    if (call->key || call->finished || call->done)
        return SL_ESTATE;
    err = sl_rpc_keys_acquire(&srv->keys, &call->key, key, (size_t)srv->opts.max_key_calls);
    if (err == SL_ELIMIT) {
        call->end = SL_RPC_END_MAX_KEY;
        sl_log_limited(SL_LOG_WARN, 1000, "rpc_limit",
                       "limit=max_key_calls value=%d %s=%s method=%s peer=%s",
                       srv->opts.max_key_calls, what, key, call->path, sl_rpc_call_peer(call));
        sl_rpc_call_finish(call, SL_RPC_RESOURCE_EXHAUSTED,
                           "too many concurrent streams for %s '%s' (limit %d)", what, key,
                           srv->opts.max_key_calls);
    } else if (err) {
        sl_rpc_call_finish(call, SL_RPC_RESOURCE_EXHAUSTED, "out of memory");
    }
    return err;
}

/* End a call that waited for its client longer than the idle timeout. The core sends the status
 * and completes the call's operations; the handler learns it through on_cancel. */
static void end_idle(sl_rpc_call *c)
{
    double secs = (double)c->srv->opts.idle_timeout_ms / 1000.0;
    char msg[160];

    c->end = SL_RPC_END_IDLE;
    if (c->recv_busy)
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
static void cancel_prefetching(sl_rpc_server *srv, uint64_t before_us, grpc_status_code code,
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
static void on_idle_sweep(uv_timer_t *t)
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
        cancel_prefetching(srv, now - limit, GRPC_STATUS_DEADLINE_EXCEEDED, msg);
    }
}

static void dispatch(sl_rpc_call *c, grpc_byte_buffer *payload)
{
    const sl_rpc_method *m = c->reg->m;
    ProtobufCMessage *req;
    char why[256];
    int err;

    /* Authorization first: a call without a valid token never counts against max_calls. */
    if (c->srv->opts.authorize && !authorized(c))
        return;
    if (!admit(c))
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
    c->cur_msg = req;
    m->on_start(c, req, c->reg->svc->arg);
    if (c->cur_msg)
        protobuf_c_message_free_unpacked(c->cur_msg, NULL);
    c->cur_msg = NULL;
}

/* An admitted call reached the loop: from now on the loop owns it. */
static void on_start(sl_rpc_call *c)
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

/* ---- shutdown ---- */

static void on_handle_closed(uv_handle_t *h)
{
    sl_rpc_server *srv = h->data;

    if (--srv->handles_open == 0 && srv->done)
        srv->done(srv->done_arg);
}

static void teardown(sl_rpc_server *srv)
{
    for (int i = 0; i < srv->n_threads; i++)
        pthread_join(srv->threads[i], NULL);
    srv->n_threads = 0;
    grpc_server_destroy(srv->server);
    srv->server = NULL;
    grpc_completion_queue_destroy(srv->cq);
    srv->cq = NULL;
    srv->torn_down = 1;
    uv_close((uv_handle_t *)&srv->async, on_handle_closed);
    uv_close((uv_handle_t *)&srv->grace, on_handle_closed);
    uv_close((uv_handle_t *)&srv->idle_timer, on_handle_closed);
    uv_close((uv_handle_t *)&srv->guard_timer, on_handle_closed);
}

static void maybe_finish_shutdown(sl_rpc_server *srv)
{
    if (srv->shutdown_seen && srv->live_calls == 0 && !srv->cq_shut) {
        srv->cq_shut = 1;
        grpc_completion_queue_shutdown(srv->cq);
    }
}

static void on_grace_expired(uv_timer_t *t)
{
    sl_rpc_server *srv = t->data;

    sl_log_info("rpc_grace_expired", "cancelling=%zu", atomic_load(&srv->live_calls));
    grpc_server_cancel_all_calls(srv->server);
}

void sl_rpc_server_shutdown(sl_rpc_server *srv, uint64_t grace_ms, void (*done)(void *arg),
                            void *arg)
{
    if (srv->shutting_down)
        return;
    srv->shutting_down = 1;
    atomic_store(&srv->stopping, 1);
    {
        sl_rpc_server_counters n;
        sl_rpc_server_get_counters(srv, &n);
        sl_log_info("rpc_answered_early",
                    "reset=%llu no_request=%llu unknown=%llu peer_limit=%llu busy=%llu "
                    "idle=%llu cut=%llu blocked=%llu",
                    (unsigned long long)n.reset, (unsigned long long)n.no_request,
                    (unsigned long long)n.unknown, (unsigned long long)n.peer_limit,
                    (unsigned long long)n.busy, (unsigned long long)n.idle,
                    (unsigned long long)n.cut, (unsigned long long)n.blocked);
    }
    srv->done = done;
    srv->done_arg = arg;
    for (size_t i = 0; i < srv->n_services; i++)
        if (srv->services[i]->on_shutdown)
            srv->services[i]->on_shutdown(srv->services[i]->arg);
    grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->shutdown_tag);
    /* Calls still waiting for their first message have not started: nothing to finish. */
    cancel_prefetching(srv, UINT64_MAX, GRPC_STATUS_UNAVAILABLE, "server shutting down");
    uv_timer_start(&srv->grace, on_grace_expired, grace_ms, 0);
}

/* ---- the flood guard (loop thread) ---- */

/* Every GUARD_TICK_MS the loop looks for connections with BACKLOG_CALLS calls that arrived
 * BACKLOG_MS ago or earlier and still wait for their first message. */
#define GUARD_TICK_MS 100
#define BACKLOG_CALLS 1024
#define BACKLOG_MS    200

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Cut the connections with BACKLOG_CALLS or more calls that arrived BACKLOG_MS ago or earlier
 * and still wait for their first message. A client sends a call's request right behind its
 * headers, so such a backlog means the core cannot deliver what the connection sends: a reset
 * flood it is still parsing. Returns how many connections were cut. */
static int cut_backlogged_peers(sl_rpc_server *srv, uint64_t now_us_)
{
    char(*cut)[SL_RPC_PEER_KEY_MAX] = NULL;
    const char **peers = NULL;
    size_t n = 0, n_cut = 0, cap = 0;

    pthread_mutex_lock(&srv->pf_mu);
    for (sl_rpc_call *c = srv->prefetch; c; c = c->pf_next) {
        if (!c->peer || now_us_ - c->arrived_us < (uint64_t)BACKLOG_MS * 1000u)
            continue;
        if (n == cap) {
            const char **p = realloc(peers, (cap = cap ? cap * 2 : 256) * sizeof(*p));
            if (!p)
                break;
            peers = p;
        }
        peers[n++] = c->peer;
    }
    if (n >= BACKLOG_CALLS) {
        qsort(peers, n, sizeof(*peers), cmp_str);
        cut = malloc((n / BACKLOG_CALLS) * sizeof(*cut));
        for (size_t i = 0, j; cut && i < n; i = j) {
            for (j = i; j < n && strcmp(peers[i], peers[j]) == 0; j++) {
            }
            if (j - i >= BACKLOG_CALLS)
                snprintf(cut[n_cut++], sizeof(cut[0]), "%s", peers[i]);
        }
    }
    pthread_mutex_unlock(&srv->pf_mu);
    for (size_t i = 0; i < n_cut; i++)
        cut_connection(srv, cut[i], "calls waiting for their first message");
    free(cut);
    free(peers);
    return (int)n_cut;
}

/* Keep the listener's kernel filter in step with the blocked addresses: rebuilt when one is
 * added or the first of them expires. */
static void refresh_filter(sl_rpc_server *srv, uint64_t now_ms)
{
    char keys[SL_RPC_BAN_SLOTS][SL_RPC_PEER_KEY_MAX];
    unsigned long long next;
    unsigned gen;
    int n;

    if (srv->filter_gen == sl_rpc_bans_gen(&srv->bans) && now_ms < srv->filter_next_ms)
        return;
    n = sl_rpc_bans_active(&srv->bans, keys, now_ms, &gen, &next);
    if (n == 0 && srv->filter_n == 0) {
        srv->filter_gen = gen;
        srv->filter_next_ms = next;
        return;
    }
    if (sl_rpc_listener_filter(srv->port, keys, n) <= 0)
        sl_log_limited(SL_LOG_WARN, 60000, "rpc_filter_failed", "blocked=%d", n);
    else
        sl_log_info("rpc_blocked_addresses", "count=%d", n);
    srv->filter_gen = gen;
    srv->filter_next_ms = next;
    srv->filter_n = n;
}

static void on_guard(uv_timer_t *t)
{
    sl_rpc_server *srv = t->data;
    uint64_t now = now_us();

    if (srv->cq_shut)
        return;
    cut_backlogged_peers(srv, now);
    refresh_filter(srv, now / 1000u);
}

/* ---- the loop side of the hand-off ---- */

static void on_async(uv_async_t *a)
{
    sl_rpc_server *srv = a->data;
    size_t n;

    for (;;) {
        pthread_mutex_lock(&srv->mu);
        n = srv->q_len;
        if (n > 0) {
            /* Swap buffers so the threads can keep pushing while we work. */
            event *tmp = srv->work;
            size_t cap = srv->work_cap;
            srv->work = srv->q;
            srv->work_cap = srv->q_cap;
            srv->q = tmp;
            srv->q_cap = cap;
            srv->q_len = 0;
        }
        pthread_mutex_unlock(&srv->mu);
        if (n == 0)
            break;
        for (size_t i = 0; i < n; i++) {
            tag *t = srv->work[i].tag;
            int ok = srv->work[i].ok;
            if (!t) {
                if (++srv->threads_exited == srv->n_threads)
                    teardown(srv);
                continue;
            }
            switch (t->kind) {
            case TAG_SLOT: /* handled on the completion-queue threads */
                break;
            case TAG_START:
                on_start(t->ptr);
                break;
            case TAG_KICK:
                maybe_finish_shutdown(srv);
                break;
            case TAG_SEND:
                on_send_done(t->ptr, ok);
                break;
            case TAG_RECV:
                on_recv_done(t->ptr, ok);
                break;
            case TAG_CLOSE:
                on_close_done(t->ptr);
                break;
            case TAG_WRITABLE:
                on_writable(t->ptr);
                break;
            case TAG_SHUTDOWN:
                srv->shutdown_seen = 1;
                uv_timer_stop(&srv->grace);
                maybe_finish_shutdown(srv);
                break;
            }
        }
        if (srv->torn_down)
            break;
    }
}

/* ---- construction ---- */

static void set_arg(grpc_arg *a, const char *key, int value)
{
    a->type = GRPC_ARG_INTEGER;
    a->key = (char *)key;
    a->value.integer = value;
}

static int ms_arg(uint64_t ms)
{
    return ms == 0 || ms > INT_MAX ? INT_MAX : (int)ms;
}

/* The server's channel arguments (at most 8). Returns how many. */
static size_t server_args(grpc_arg *args, const sl_rpc_server_opts *o)
{
    size_t n = 0;

    set_arg(&args[n++], GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, o->max_recv_bytes);
    set_arg(&args[n++], GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
            o->max_send_bytes ? o->max_send_bytes : -1);
    set_arg(&args[n++], GRPC_ARG_ENABLE_PER_MESSAGE_COMPRESSION, 0);
    /* Identity encoding only: the core answers a message compressed with anything else
     * UNIMPLEMENTED before inflating it, and with decompression off it never inflates one
     * either (gRPC 1.51 inflates in full before applying the message limit: a 512 KiB gzip body
     * became 512 MiB). A compressed message that slipped through anyway reaches sl_rpc_decode
     * still compressed, which refuses it. */
    set_arg(&args[n++], GRPC_COMPRESSION_CHANNEL_ENABLED_ALGORITHMS_BITSET,
            1 << GRPC_COMPRESS_NONE);
    set_arg(&args[n++], GRPC_ARG_ENABLE_PER_MESSAGE_DECOMPRESSION, 0);
    set_arg(&args[n++], GRPC_ARG_MAX_CONNECTION_IDLE_MS, ms_arg(o->max_connection_idle_ms));
    set_arg(&args[n++], GRPC_ARG_MAX_CONNECTION_AGE_MS, ms_arg(o->max_connection_age_ms));
    /* A connection that has not finished its HTTP/2 (and TLS) handshake holds an fd: 20 s instead
     * of the core's 120 s. */
    set_arg(&args[n++], GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 20000);
    return n;
}

int sl_rpc_server_new(sl_rpc_server **out, uv_loop_t *loop, const sl_rpc_server_opts *opts,
                      const sl_rpc_service *const *services, size_t n_services)
{
    sl_rpc_server *srv = NULL;
    grpc_server_credentials *creds;
    grpc_arg args[8];
    grpc_channel_args chargs;
    size_t n_generic = 4, k = 0;
    int err = 0, per;

    *out = NULL;
    if (!opts || !opts->listen || !*opts->listen || opts->max_recv_bytes < 0 ||
        opts->max_send_bytes < 0 || opts->cq_threads < 0 || opts->slots_per_method < 0 ||
        opts->max_calls < 0 || opts->max_key_calls < 0 || opts->max_peer_calls < 0 ||
        opts->max_pending < 0)
        return SL_EINVAL;
    srv = calloc(1, sizeof(*srv));
    if (!srv)
        return -ENOMEM;
    grpc_init();
    srv->loop = loop;
    srv->opts = *opts;
    srv->opts.listen = NULL;
    srv->opts.tls = NULL; /* only used here; the caller's struct need not outlive the call */
    if (srv->opts.cq_threads == 0)
        srv->opts.cq_threads = 4;
    if (srv->opts.cq_threads < 2)
        srv->opts.cq_threads = 2;
    if (srv->opts.max_recv_bytes == 0)
        srv->opts.max_recv_bytes = 4 << 20;
    if (srv->opts.max_pending == 0)
        srv->opts.max_pending = MAX_PENDING;
    per = srv->opts.slots_per_method ? srv->opts.slots_per_method : 16;
    srv->services = calloc(n_services ? n_services : 1, sizeof(*srv->services));
    if (!srv->services) {
        free(srv);
        grpc_shutdown_blocking();
        return -ENOMEM;
    }
    memcpy(srv->services, services, n_services * sizeof(*services));
    srv->n_services = n_services;
    srv->shutdown_tag = (tag){TAG_SHUTDOWN, srv};
    srv->kick_tag = (tag){TAG_KICK, srv};
    pthread_mutex_init(&srv->mu, NULL);
    pthread_mutex_init(&srv->peers_mu, NULL);
    pthread_mutex_init(&srv->pf_mu, NULL);
    sl_rpc_resets_init(&srv->resets);
    sl_rpc_resets_init(&srv->cuts);
    sl_rpc_bans_init(&srv->bans);

    for (size_t i = 0; i < n_services; i++)
        srv->n_regs += services[i]->n_methods;
    srv->regs = calloc(srv->n_regs ? srv->n_regs : 1, sizeof(*srv->regs));
    srv->n_slots = srv->n_regs * (size_t)per + n_generic;
    srv->slots = calloc(srv->n_slots, sizeof(*srv->slots));
    srv->threads = calloc((size_t)srv->opts.cq_threads, sizeof(*srv->threads));
    srv->svc_calls = calloc(n_services ? n_services : 1, sizeof(*srv->svc_calls));
    srv->svc_streams = calloc(n_services ? n_services : 1, sizeof(*srv->svc_streams));
    srv->svc_pending = calloc(n_services ? n_services : 1, sizeof(*srv->svc_pending));
    if (!srv->regs || !srv->slots || !srv->threads || !srv->svc_calls || !srv->svc_streams ||
        !srv->svc_pending) {
        err = -ENOMEM;
        goto out;
    }

    chargs.num_args = server_args(args, &srv->opts);
    chargs.args = args;
    srv->server = grpc_server_create(&chargs, NULL);
    srv->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(srv->server, srv->cq, NULL);

    for (size_t i = 0; i < n_services; i++) {
        for (size_t j = 0; j < services[i]->n_methods; j++) {
            const sl_rpc_method *m = &services[i]->methods[j];
            reg *r = &srv->regs[k++];
            size_t len = strlen(services[i]->name) + strlen(m->name) + 3;
            r->svc = services[i];
            r->svc_idx = i;
            r->m = m;
            r->path = malloc(len);
            if (!r->path) {
                err = -ENOMEM;
                goto out;
            }
            snprintf(r->path, len, "/%s/%s", services[i]->name, m->name);
            if (m->bytes_field &&
                ((m->kind != SL_RPC_CLIENT_STREAM && m->kind != SL_RPC_BIDI_STREAM) ||
                 !sl_rpc_bytes_field(m->request, m->bytes_field))) {
                sl_log_error("rpc_bad_bytes_field", "method=%s field=%u", r->path,
                             (unsigned)m->bytes_field);
                err = SL_EINVAL;
                goto out;
            }
            /* The request is read by the server itself (prefetch), for every kind: the core's
             * own read of it (GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER) stopped publishing new
             * calls altogether under a reset flood, while they piled up in its memory. */
            r->handle =
                grpc_server_register_method(srv->server, r->path, NULL, GRPC_SRM_PAYLOAD_NONE, 0);
            if (!r->handle) {
                sl_log_error("rpc_register_failed", "method=%s", r->path);
                err = SL_EINVAL;
                goto out;
            }
        }
    }

    err = sl_rpc_server_creds(&creds, opts->tls);
    if (err)
        goto out;
    srv->port = grpc_server_add_http2_port(srv->server, opts->listen, creds);
    grpc_server_credentials_release(creds);
    if (srv->port <= 0) {
        sl_log_error("rpc_bind_failed", "listen=%s", opts->listen);
        err = SL_EUNAVAILABLE;
        goto out;
    }

    if (uv_async_init(loop, &srv->async, on_async) != 0) {
        err = SL_EINVAL;
        goto out;
    }
    srv->async.data = srv;
    uv_timer_init(loop, &srv->grace);
    srv->grace.data = srv;
    uv_timer_init(loop, &srv->idle_timer);
    srv->idle_timer.data = srv;
    uv_timer_init(loop, &srv->guard_timer);
    srv->guard_timer.data = srv;
    srv->handles_open = 4;
    uv_timer_start(&srv->guard_timer, on_guard, GUARD_TICK_MS, GUARD_TICK_MS);
    if (srv->opts.idle_timeout_ms > 0) {
        /* A few sweeps per timeout, at most one a second: ends come at most a quarter late. */
        uint64_t every = srv->opts.idle_timeout_ms / 4;
        every = every < 50 ? 50 : every > 1000 ? 1000 : every;
        uv_timer_start(&srv->idle_timer, on_idle_sweep, every, every);
    }

    grpc_server_start(srv->server);
    k = 0;
    for (size_t i = 0; i < srv->n_regs; i++) {
        for (int j = 0; j < per; j++) {
            slot *s = &srv->slots[k++];
            s->tag = (tag){TAG_SLOT, s};
            s->srv = srv;
            s->reg = &srv->regs[i];
            grpc_metadata_array_init(&s->md);
            arm_slot(s);
        }
    }
    for (size_t i = 0; i < n_generic; i++) {
        slot *s = &srv->slots[k++];
        s->tag = (tag){TAG_SLOT, s};
        s->srv = srv;
        grpc_metadata_array_init(&s->md);
        grpc_call_details_init(&s->details);
        arm_slot(s);
    }
    for (int i = 0; i < srv->opts.cq_threads; i++) {
        if (pthread_create(&srv->threads[i], NULL, cq_thread, srv) != 0) {
            /* The server runs with the threads it has; at least one is needed. */
            if (i == 0)
                abort();
            break;
        }
        srv->n_threads++;
    }
    *out = srv;
    return 0;

out:
    if (srv->server) {
        grpc_server_destroy(srv->server);
        grpc_completion_queue_shutdown(srv->cq);
        while (grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
               GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(srv->cq);
        srv->server = NULL;
    }
    sl_rpc_server_free(srv);
    return err;
}

int sl_rpc_server_port(const sl_rpc_server *srv)
{
    return srv->port;
}

size_t sl_rpc_server_live_calls(const sl_rpc_server *srv)
{
    return atomic_load(&((sl_rpc_server *)srv)->live_calls);
}

size_t sl_rpc_server_live_streams(const sl_rpc_server *srv)
{
    return atomic_load(&((sl_rpc_server *)srv)->live_streams);
}

void sl_rpc_server_get_counters(const sl_rpc_server *srv, sl_rpc_server_counters *out)
{
    sl_rpc_server *s = (sl_rpc_server *)srv;

    out->reset = atomic_load(&s->n_reset);
    out->no_request = atomic_load(&s->n_no_request);
    out->unknown = atomic_load(&s->n_unknown);
    out->peer_limit = atomic_load(&s->n_peer_limit);
    out->busy = atomic_load(&s->n_busy);
    out->idle = atomic_load(&s->n_idle);
    out->cut = atomic_load(&s->n_cut);
    out->blocked = atomic_load(&s->n_banned);
    out->pending = atomic_load(&s->pending);
}

void sl_rpc_server_free(sl_rpc_server *srv)
{
    if (!srv)
        return;
    for (size_t i = 0; srv->slots && i < srv->n_slots; i++) {
        if (srv->slots[i].srv) {
            grpc_metadata_array_destroy(&srv->slots[i].md);
            if (!srv->slots[i].reg)
                grpc_call_details_destroy(&srv->slots[i].details);
        }
    }
    for (size_t i = 0; srv->regs && i < srv->n_regs; i++)
        free(srv->regs[i].path);
    free(srv->regs);
    free(srv->services);
    free(srv->slots);
    free(srv->threads);
    free(srv->svc_calls);
    free(srv->svc_streams);
    free(srv->svc_pending);
    sl_rpc_keys_clear(&srv->keys);
    sl_rpc_keys_clear(&srv->peers);
    free(srv->q);
    free(srv->work);
    pthread_mutex_destroy(&srv->mu);
    pthread_mutex_destroy(&srv->peers_mu);
    pthread_mutex_destroy(&srv->pf_mu);
    sl_rpc_resets_destroy(&srv->resets);
    sl_rpc_resets_destroy(&srv->cuts);
    sl_rpc_bans_destroy(&srv->bans);
    free(srv);
    grpc_shutdown_blocking();
}
