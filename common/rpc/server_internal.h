/* The RPC server's internals, shared by its files. Private to common/rpc/.
 *
 * The server: gRPC C core completion queue -> threads -> queue -> libuv loop -> handlers.
 *
 * Every completion carries a tag that names what finished: a request slot (a new call arrived),
 * or one of a call's three operation kinds (send, receive, close). A new call is admitted on the
 * completion-queue thread that received it (server_accept.c, server_limits.c): the slot is armed
 * again at once, and calls that can be answered without a handler never reach the loop. Past
 * admission, completion-queue threads only forward (tag, ok) pairs to the loop, which owns the
 * call from then on; the exceptions are send chains (see srv_chain_next) and the reference count,
 * atomic for them.
 *
 * A call's state lives until (a) its RECV_CLOSE_ON_SERVER operation completed, (b) no send or
 * receive batch is outstanding and (c) no handler holds a reference. The close operation is how a
 * client's cancellation is learned, so it is started as soon as the call is handed to the loop.
 * A call is handed over only once its request (a streaming call's first message, or its end)
 * arrived: until then a receive is its only operation, and if that fails (the client reset the
 * stream) the call is freed on the completion-queue thread.
 *
 * One concern per file; calls point one way, from the top of this list down (a file calls only
 * files below it; the upper ones are reached through the timers and threads server.c starts):
 *
 *   server.c          construction, channel arguments, graceful shutdown, counters, free
 *   server_cq.c       the completion-queue threads and the loop's side of the queue: every
 *                     completion is routed from here; teardown once the threads have ended
 *   server_accept.c   new calls on the completion-queue threads: request slots, the request read
 *                     before the loop (prefetch), the hand-off to the loop
 *   server_dispatch.c the loop's side of a call: authorization, admission, and every handler
 *                     callback (on_start, on_message, on_writable, on_cancel) and the observer
 *   server_limits.c   max_pending and max_peer_calls (completion-queue threads), max_calls and
 *                     service budgets, per-key claims, send budgets in bytes (loop thread)
 *   server_idle.c     the idle timeout: progress, the idle sweep, ending prefetching calls
 *   server_flood.c    the flood guard: reset floods, blocked addresses, the listener's filter
 *   server_call.c     a call's state (new, release, references), the push side of the queue to
 *                     the loop, send chains, and the call API for handlers
 */
#ifndef SL_RPC_SERVER_INTERNAL_H
#define SL_RPC_SERVER_INTERNAL_H

#include "server.h"

#include "internal.h"
#include "keys.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
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

/* A call may queue this many messages; the handler is told it may send more (on_writable) when
 * the queue has drained to half. */
#define SEND_WINDOW 64

/* Every GUARD_TICK_MS the loop runs the flood guard (srv_on_guard). */
#define GUARD_TICK_MS 100

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
    /* Methods with handler_progress: the last message delivered has not been called progress
     * (sl_rpc_call_progress), so reading the next one does not restart the idle clock. */
    unsigned msg_stale : 1;
    int close_cancelled;
    tag tag_send, tag_recv, tag_close, tag_writable, tag_start;

    /* The send queue. Queued messages are started by whichever thread sees the previous send
     * complete: a completion-queue thread keeps the chain going without a trip through the loop,
     * which is what makes streaming fast. Everything below `mu` is guarded by it; the loop owns
     * send_busy (a chain is running and holds one reference). */
    pthread_mutex_t mu;
    grpc_byte_buffer *send_buf; /* the message in flight */
    grpc_byte_buffer *sq[SEND_WINDOW];
    size_t sq_size[SEND_WINDOW]; /* their sizes: the core empties a buffer it sends */
    size_t sq_head, sq_len;
    size_t send_size; /* of send_buf */
    size_t sq_bytes;  /* of the queued messages and the one in flight */
    int writable_posted;
    int status_sent; /* the batch in flight carries the final status */
    grpc_byte_buffer *recv_buf;
    sl_rpc_code status_code;
    grpc_slice status_details;
    void *data;
    void (*data_free)(void *);
    size_t send_last;          /* loop: size of the last message sl_rpc_call_send queued */
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
    /* Events of this call handed to the server's lane and not run yet (loop thread). */
    unsigned lane_n;
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

static inline uint64_t now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ---- server_cq.c ---- */

/* The body of a completion-queue thread: blocks in grpc_completion_queue_next, admits new calls
 * (srv_on_slot, srv_on_prefetched), keeps send chains going, and queues every other completion
 * for the loop. `arg` is the server. */
void *srv_cq_thread(void *arg);

/* The loop's side of the queue (the server's uv_async_t): runs every queued event. Loop thread. */
void srv_on_async(uv_async_t *a);

/* ---- server_accept.c (completion-queue threads) ---- */

/* Arm a request slot: ask the core for the next call of its method (or of any unregistered one). */
void srv_arm_slot(slot *s);

/* A request slot completed: a new call arrived (or, when !ok, the server is shutting down). */
void srv_on_slot(slot *s, int ok);

/* The first read of a prefetching call completed. Returns 0 if the call is not prefetching (a
 * read the loop asked for, which goes to the loop). */
int srv_on_prefetched(sl_rpc_call *c, int ok);

/* ---- server_dispatch.c (loop thread) ---- */

/* An admitted call reached the loop: from now on the loop owns it. */
void srv_on_start(sl_rpc_call *c);

/* A send chain ended: its last batch completed with nothing queued behind it, or failed. */
void srv_on_send_done(sl_rpc_call *c, int ok);

/* The queue drained to half while a chain runs: the handler may produce more. */
void srv_on_writable(sl_rpc_call *c);

/* A read the handler asked for completed. */
void srv_on_recv_done(sl_rpc_call *c, int ok);

/* The call's close operation completed: the call is over. */
void srv_on_close_done(sl_rpc_call *c);

/* ---- server_limits.c ---- */

/* Count a new call as waiting for the loop and under its peer address. At a limit the call is
 * answered RESOURCE_EXHAUSTED and freed. Returns 1 if admitted. Completion-queue thread. */
int srv_admit_early(sl_rpc_call *c);

/* Count the call against max_calls, or against its service's budget. On refusal the call is
 * finished. Returns 1 if admitted. Loop thread. */
int srv_admit(sl_rpc_call *c);

/* ---- server_idle.c ---- */

/* End every prefetching call that arrived before `before_us` (every one: UINT64_MAX) with `code`
 * and `msg`. Loop thread. */
void srv_cancel_prefetching(sl_rpc_server *srv, uint64_t before_us, grpc_status_code code,
                            const char *msg);

/* The idle sweep (the server's idle_timer). Loop thread. */
void srv_on_idle_sweep(uv_timer_t *t);

/* ---- server_flood.c ---- */

/* Count a call of `peer` that did nothing but cost; a flood of them cuts its connections. Any
 * thread. */
void srv_junk(sl_rpc_server *srv, const char *peer);

/* 1 if the call comes from a blocked address: it is then dropped (and unreffed). Completion-queue
 * thread. */
int srv_blocked(sl_rpc_server *srv, grpc_call *call, const char *peer);

/* The flood guard's tick (the server's guard_timer). Loop thread. */
void srv_on_guard(uv_timer_t *t);

/* ---- server_call.c ---- */

/* Queue an event for the loop (t NULL: a completion-queue thread has exited) and wake it. Any
 * thread. */
void srv_push_event(sl_rpc_server *srv, tag *t, int ok);

/* Drop a reference unless it is the last one. Returns 1 if dropped. Any thread. */
int srv_drop_ref_unless_last(sl_rpc_call *c);

/* State for a new call of a registered method; takes `call` and `md`. Returns NULL if memory ran
 * out (the call is then answered and released). Completion-queue thread. */
sl_rpc_call *srv_call_new(sl_rpc_server *srv, const reg *r, grpc_call *call,
                          grpc_metadata_array *md, const char *peer);

/* Answer a call the server keeps no state for, and let it go. */
void srv_refuse(grpc_call *call, grpc_status_code code, const char *msg);

/* Answer an admitted call before any operation was started on it, and free it. */
void srv_refuse_call(sl_rpc_call *c, grpc_status_code code, const char *msg);

/* Free what every call has and count it gone (`on_loop`: called on the loop thread). */
void srv_call_release(sl_rpc_call *c, int on_loop);

/* Shut the completion queue down once shutdown was seen and no call is left. Loop thread. */
void srv_maybe_finish_shutdown(sl_rpc_server *srv);

/* Start a batch on the call's send path (status too if with_status); takes bb. Loop thread,
 * with c->mu held. */
int srv_start_send(sl_rpc_call *c, grpc_byte_buffer *bb, size_t len, int with_status);

/* The message in flight is gone (sent or dropped). With c->mu held. */
void srv_send_buf_free(sl_rpc_call *c);

/* Continue a send chain with the next queued message. Returns 1 if a send was started. Any
 * thread, with c->mu held. */
int srv_chain_next(sl_rpc_call *c);

/* Drop every queued message. With c->mu held. */
void srv_drain_queue(sl_rpc_call *c);

#endif
