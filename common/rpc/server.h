/* A table-driven gRPC server on the gRPC C core and protobuf-c, driven by a libuv loop.
 *
 * Services are tables of methods. Handlers run on the loop thread only, receive decoded
 * protobuf-c messages and answer through the sl_rpc_call API; they never see gRPC types.
 * Two or more completion-queue threads block in the C core and hand every completion to the loop
 * (a queue plus uv_async_send), so all call state is owned by the loop thread.
 *
 * A new call is admitted on the completion-queue thread that received it, before the loop hears
 * of it: calls to unknown methods, calls without their request message, calls over the per-peer
 * limit or beyond the bound of calls waiting for the loop are answered there and never reach it;
 * a client- or bidi-streaming call reaches the loop only once its first message (or its end)
 * arrived, so a call the client resets at once (HTTP/2 rapid reset) costs the loop nothing.
 *
 * Per call, a handler queues at most a window of messages and produces more on on_writable; it
 * asks for each incoming message with sl_rpc_call_read(). That is the flow control: a slow client
 * slows the handler, memory stays flat. Send completions are chained on the completion-queue
 * threads, so a streaming handler is woken once per half window, not once per message.
 */
#ifndef SL_RPC_SERVER_H
#define SL_RPC_SERVER_H

#include "rpc.h"

#include <protobuf-c/protobuf-c.h>
#include <stdint.h>
#include <uv.h>

typedef struct sl_rpc_server sl_rpc_server;
typedef struct sl_rpc_call sl_rpc_call;

typedef enum sl_rpc_kind {
    SL_RPC_UNARY = 0,
    SL_RPC_SERVER_STREAM = 1,
    SL_RPC_CLIENT_STREAM = 2,
    SL_RPC_BIDI_STREAM = 3,
} sl_rpc_kind;

/* A service's own call budget: its calls count neither against the server's max_calls nor
 * against the per-peer limit (nor, while they wait for the loop, against max_pending: they have a
 * count of their own with the same bound), but against `calls` calls of the service open at
 * once, of which at most `streams` may be streaming calls. One more is answered
 * RESOURCE_EXHAUSTED "too many concurrent calls to <service> (limit N)" (or "streams of"). */
typedef struct sl_rpc_budget {
    int calls;
    int streams;
} sl_rpc_budget;

/* One method of a service. All callbacks run on the loop thread; `svc_arg` is the service's arg. */
typedef struct sl_rpc_method {
    const char *name; /* "GetInfo" */
    sl_rpc_kind kind;
    const ProtobufCMessageDescriptor *request;
    const ProtobufCMessageDescriptor *response;
    /* Who may call it: opaque to the layer, handed to the server's authorize callback (the
     * daemon's roles; 0 is the most restrictive there, so a forgotten entry fails closed). */
    unsigned access;
    /* The call arrived. For unary and server-streaming methods `req` is the decoded request,
     * owned by the layer and valid only during the callback; for client-streaming and bidi
     * methods it is NULL and the handler calls sl_rpc_call_read() to receive. Required. */
    void (*on_start)(sl_rpc_call *call, const ProtobufCMessage *req, void *svc_arg);
    /* A message asked for with sl_rpc_call_read() arrived (valid only during the callback), or
     * NULL when the client closed its side. Required for client-streaming and bidi methods. */
    void (*on_message)(sl_rpc_call *call, const ProtobufCMessage *msg, void *svc_arg);
    /* The send queue drained to half or emptied; the handler may send more. Optional. */
    void (*on_writable)(sl_rpc_call *call, void *svc_arg);
    /* The call ended before the handler finished it (client cancel, deadline, shutdown). Sends
     * and reads fail from now on. Optional; per-call data is freed when the last reference goes. */
    void (*on_cancel)(sl_rpc_call *call, void *svc_arg);
    /* Optional, client-streaming and bidi methods: the number of a singular bytes field of the
     * request type (a oneof member is fine) whose bytes are handed over in the buffers they
     * arrived in instead of being copied into the message (large upload chunks). In a message
     * delivered to on_message that field keeps its len but its data is NULL; the handler takes
     * the bytes with sl_rpc_call_take_bytes(). 0: decode as usual. */
    uint32_t bytes_field;
    /* Optional, client-streaming and bidi methods: a message asked for with sl_rpc_call_read()
     * could not be decoded (`err` SL_EPROTO, or -ENOMEM; `why` says what was wrong). The handler
     * must end the call with sl_rpc_call_fail(), now or once it has released what the call holds
     * (so a client that retries at once does not find its old call's state still in place).
     * Without it the layer answers at once with the status of `err`. */
    void (*on_bad_message)(sl_rpc_call *call, int err, const char *why, void *svc_arg);
    /* Optional, server-streaming and bidi methods: a budget in bytes for the call's response
     * messages that are queued or in flight (not yet taken by the transport), so that a client
     * that stops reading holds that much of the server's memory and no more.
     * sl_rpc_call_send_room() answers 0 while one more message, estimated as large as the last
     * one sent, would take them over the budget; an empty queue always takes a message, so a
     * handler keeps its messages well under the budget. 0: counted in messages only. */
    size_t send_budget;
    /* Optional, client-streaming and bidi methods: 1 if a message arriving is not progress by
     * itself for the idle timeout: the handler calls sl_rpc_call_progress() for the messages
     * that moved the call forward (an upload's data), so a client that sends empty messages is
     * ended as idle all the same. 0: every message is progress. */
    int handler_progress;
    /* Optional, unary and server-streaming methods: what the call acts on (a job's name) in its
     * decoded request, handed to the authorize callback as its `scope` once the request is
     * decoded; NULL or "" from it: none. */
    const char *(*scope)(const ProtobufCMessage *req);
} sl_rpc_method;

typedef struct sl_rpc_service {
    const char *name; /* fully qualified: "sluice.v1.Admin" */
    const sl_rpc_method *methods;
    size_t n_methods;
    void *arg; /* passed to every callback of this service */
    /* Called on the loop thread when graceful shutdown starts, so the service can end its
     * long-lived streams (they would otherwise be cancelled when the grace period ends). */
    void (*on_shutdown)(void *arg);
    /* A call budget of its own (for services anyone may call, such as health checks), or NULL:
     * the service shares max_calls and max_peer_calls with the others. See sl_rpc_budget. */
    const struct sl_rpc_budget *budget;
    /* 1: its handlers never wait on anything but the loop (health checks): they run as their
     * events arrive even while the server's lane (sl_rpc_server_opts.lane) is busy. */
    int outside_lane;
} sl_rpc_service;

/* Decide whether a call may proceed, before its handler sees it (loop thread). `token` is the
 * bearer token of the "authorization: Bearer <token>" metadata, or NULL if absent. Called with
 * `scope` NULL before the request is read; for a method with a `scope` function, once more with
 * its result after the request is decoded (both must allow). Returns 0 to allow, SL_EAUTH
 * (UNAUTHENTICATED), SL_EPERM (PERMISSION_DENIED) or SL_ECATLOST (FAILED_PRECONDITION: the
 * daemon refuses this kind of call now) with a message in msg. */
typedef int (*sl_rpc_authorize_fn)(const char *method, unsigned access, const char *token,
                                   const char *scope, char *msg, size_t msg_len, void *arg);

/* Why the layer ended a call, if it did. */
typedef enum sl_rpc_end {
    SL_RPC_END_HANDLER = 0,   /* the handler or the client ended it */
    SL_RPC_END_MAX_CALLS = 1, /* refused: max_calls calls were open */
    SL_RPC_END_MAX_KEY = 2,   /* refused by sl_rpc_call_claim: max_key_calls under its key */
    SL_RPC_END_IDLE = 3,      /* no progress for idle_timeout_ms */
    SL_RPC_END_BUDGET = 4,    /* refused: its service's budget_calls or budget_streams were open */
} sl_rpc_end;

/* What a finished call did, for logs and metrics. */
typedef struct sl_rpc_call_stats {
    const char *method; /* full path */
    const char *peer;
    sl_rpc_code code;
    uint64_t duration_us;
    uint64_t bytes_in;  /* serialized request messages received */
    uint64_t bytes_out; /* serialized response messages queued */
    sl_rpc_kind kind;
    sl_rpc_end end;
} sl_rpc_call_stats;

/* Observer of finished calls, loop thread. */
typedef void (*sl_rpc_call_observer)(const sl_rpc_call_stats *stats, void *arg);

typedef struct sl_rpc_server_opts {
    const char *listen;            /* "host:port"; port 0 picks a free port */
    int cq_threads;                /* completion-queue threads; 0 means 4, minimum 2 */
    int max_recv_bytes;            /* largest accepted message; 0 means 4 MiB */
    int max_send_bytes;            /* largest sent message; 0 means unlimited */
    int slots_per_method;          /* calls kept armed per method; 0 means 16 */
    const sl_rpc_tls *tls;         /* NULL: plaintext */
    sl_rpc_authorize_fn authorize; /* NULL: every call is allowed */
    void *authorize_arg;
    sl_rpc_call_observer observer; /* optional */
    void *observer_arg;
    /* Calls open at once (all kinds, counted from the authorize callback's yes until their state
     * is freed); one more is answered RESOURCE_EXHAUSTED "too many concurrent calls (limit N)"
     * before its handler sees it. Calls refused by the authorize callback never count. 0:
     * unlimited. Services with a budget of their own do not count. */
    int max_calls;
    /* Calls open at once from one peer address (the port is ignored; IPv6 addresses by their
     * /64), counted from arrival until freed, services with a budget of their own excepted. One
     * more is answered RESOURCE_EXHAUSTED "too many concurrent calls from <peer> (limit N)" on
     * the completion-queue thread. 0: unlimited. */
    int max_peer_calls;
    /* Calls that arrived but that the loop has not started yet (a streaming call waiting for its
     * first message, or a call queued for the loop); one more is answered RESOURCE_EXHAUSTED
     * "server busy: N calls waiting to start" on the completion-queue thread. This bounds the
     * queue between those threads and the loop. 0 means 8192. */
    int max_pending;
    /* Calls open at once under one key of sl_rpc_call_claim. 0: unlimited. */
    int max_key_calls;
    /* A call that waits for the client this long is ended with DEADLINE_EXCEEDED: a read is
     * outstanding and no message arrived, or a send is outstanding and none completed (the
     * client stopped reading). Handlers see on_cancel. Checked a few times per period, at most
     * once a second. 0: never. */
    uint64_t idle_timeout_ms;
    /* A connection without calls for this long is closed (HTTP/2 GOAWAY; clients reconnect when
     * they next call). 0: never. */
    uint64_t max_connection_idle_ms;
    /* A connection is closed after this long whatever it does: GOAWAY, then its calls may
     * finish (no grace limit). 0: never. */
    uint64_t max_connection_age_ms;
    /* Optional: where handlers run (the daemon's catalog lane, which lets them wait for a
     * catalog server without blocking the loop). lane(lane_arg, fn, a, b) calls fn(a, b) on the
     * loop thread, now or later, in the order given. A call's start, messages and end are handed
     * to it, and so are its send completions while any of its events wait there, so a call's
     * events keep their order and a handler suspended in the lane never sees its call change
     * under it. NULL: every handler runs as its event arrives. */
    void (*lane)(void *lane_arg, void (*fn)(void *a, int b), void *a, int b);
    void *lane_arg;
} sl_rpc_server_opts;

/* Create a server bound to opts->listen serving `services` (the array is copied; the services
 * must outlive the server), with completions delivered to `loop`. Starts the completion-queue
 * threads. Returns 0 and *out, SL_EINVAL for a bad option, or SL_EUNAVAILABLE if the address cannot
 * be bound, or the error of unreadable TLS files. Caller frees with sl_rpc_server_free after
 * shutdown completed. Loop thread. */
int sl_rpc_server_new(sl_rpc_server **out, uv_loop_t *loop, const sl_rpc_server_opts *opts,
                      const sl_rpc_service *const *services, size_t n_services);

/* The port actually bound. Any thread. */
int sl_rpc_server_port(const sl_rpc_server *srv);

/* Begin graceful shutdown: stop accepting calls, call each service's on_shutdown, let in-flight
 * calls finish for up to grace_ms, then cancel the rest. `done` runs on the loop thread once every
 * call is freed and the threads are joined; then sl_rpc_server_free may be called. Loop thread;
 * a second call is ignored. */
void sl_rpc_server_shutdown(sl_rpc_server *srv, uint64_t grace_ms, void (*done)(void *arg),
                            void *arg);

/* Free a server whose shutdown completed (or that never started a call). Accepts NULL. */
void sl_rpc_server_free(sl_rpc_server *srv);

/* Calls the server answered or dropped on its completion-queue threads, before the loop and any
 * handler saw them (so the call observer never does), since the server started; and the calls
 * waiting for the loop now. */
typedef struct sl_rpc_server_counters {
    uint64_t reset;      /* ended by the client before their first message arrived */
    uint64_t no_request; /* unary or server-streaming calls that ended without their request */
    uint64_t unknown;    /* to methods nobody registered: UNIMPLEMENTED */
    uint64_t peer_limit; /* refused by max_peer_calls */
    uint64_t busy;       /* refused by max_pending */
    uint64_t idle;       /* calls ended by idle_timeout_ms before their first message */
    uint64_t cut;        /* connections closed for resetting 1000 calls within a second */
    uint64_t blocked;    /* calls dropped because their address was blocked after a flood */
    uint64_t pending;    /* now: calls that arrived and that the loop has not started */
} sl_rpc_server_counters;

/* Fill *out. Thread-safe. */
void sl_rpc_server_get_counters(const sl_rpc_server *srv, sl_rpc_server_counters *out);

/* Number of calls whose state is still allocated (tests use it to check that cancelled calls
 * are freed), and of those, the streaming ones. Thread-safe. */
size_t sl_rpc_server_live_calls(const sl_rpc_server *srv);
size_t sl_rpc_server_live_streams(const sl_rpc_server *srv);

/* ---- The call API for handlers. Loop thread only. ---- */

/* Count the call under (`kind`, `key`) (e.g. "upload" and a job name) until it ends, unless
 * max_key_calls calls of that kind already are: then the call is finished with
 * RESOURCE_EXHAUSTED "too many concurrent <kind> streams for <what> '<key>' (limit N)" and
 * SL_ELIMIT returned; the handler just returns. Each kind has its own count, so calls of one kind
 * cannot use up another's. `kind` is a word without ':'. Returns 0, SL_ELIMIT, SL_ESTATE if the
 * call already claimed a key or was finished, -ENOMEM (the call is finished). */
int sl_rpc_call_claim(sl_rpc_call *call, const char *kind, const char *key, const char *what);

/* The call made progress for the idle timeout (methods with handler_progress: a message that
 * moved it forward). */
void sl_rpc_call_progress(sl_rpc_call *call);

/* Take ownership of the message being delivered (only inside on_start or on_message), e.g. to
 * hand a large upload chunk to a worker without copying it. Returns it, or NULL outside those
 * callbacks; the caller frees it with protobuf_c_message_free_unpacked(msg, NULL). */
ProtobufCMessage *sl_rpc_call_take_message(sl_rpc_call *call);

/* Take the bytes of the method's bytes_field in the message being delivered (only inside
 * on_start or on_message). Returns them, or NULL if the method has no bytes_field, the field is
 * absent or empty, or outside those callbacks. The caller frees them with sl_rpc_bytes_free (any
 * thread, before the server is freed); bytes not taken are freed after the callback. */
sl_rpc_bytes *sl_rpc_call_take_bytes(sl_rpc_call *call);

/* Attach per-call handler state; `free_fn` (may be NULL) runs when the call is freed. */
void sl_rpc_call_set_data(sl_rpc_call *call, void *data, void (*free_fn)(void *));

/* The per-call state set above, or NULL. */
void *sl_rpc_call_data(const sl_rpc_call *call);

/* Ask for the next incoming message; it arrives through on_message. Returns 0, SL_ESTATE if a
 * read is outstanding or the method does not stream requests, SL_ECANCELLED if the call ended. */
int sl_rpc_call_read(sl_rpc_call *call);

/* Queue one response message (streaming methods). Up to sl_rpc_call_send_room() messages may
 * be queued; they are written in order, coalesced by the transport while more are queued, and
 * on_writable follows when the queue has drained to half (or emptied). Returns 0, SL_ESTATE if
 * the call was finished, SL_ECANCELLED if it ended, SL_ELIMIT if the queue is full or the message
 * exceeds the send limit. Queued messages hold memory: handlers sending large messages keep only
 * a few queued, or declare a send_budget. */
int sl_rpc_call_send(sl_rpc_call *call, const ProtobufCMessage *msg);

/* How many more messages sl_rpc_call_send accepts now: 0 once the call ended, or while the
 * method's send_budget is used up. */
int sl_rpc_call_send_room(const sl_rpc_call *call);

/* Bytes of the call's response messages queued or in flight now. */
size_t sl_rpc_call_send_bytes(const sl_rpc_call *call);

/* Send the response and status OK in one step (unary and client-streaming methods). */
int sl_rpc_call_reply(sl_rpc_call *call, const ProtobufCMessage *msg);

/* End the call with a status and a printf-style message. If a send is outstanding, the status
 * follows it. Returns 0, SL_ESTATE if already finished, SL_ECANCELLED if the call ended. */
int sl_rpc_call_finish(sl_rpc_call *call, sl_rpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* sl_rpc_call_finish with the status mapped from a sluice error code. */
int sl_rpc_call_fail(sl_rpc_call *call, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Keep the call's state alive across asynchronous work (e.g. a worker-pool job). Every ref needs
 * an unref; the state (and its data) is freed when the last reference goes. */
void sl_rpc_call_ref(sl_rpc_call *call);
void sl_rpc_call_unref(sl_rpc_call *call);

/* 1 once the call has ended (finished, cancelled or failed), else 0. */
int sl_rpc_call_is_done(const sl_rpc_call *call);

/* The full method path ("/sluice.v1.Admin/GetInfo") and the peer ("ipv4:127.0.0.1:5555"). Valid
 * while the call is. */
const char *sl_rpc_call_method(const sl_rpc_call *call);
const char *sl_rpc_call_peer(const sl_rpc_call *call);

/* Copy the value of request metadata `key` (lowercase) into buf, NUL-terminated. Returns its
 * length, SL_ENOTFOUND if absent, SL_ELIMIT if it does not fit. */
int sl_rpc_call_metadata(const sl_rpc_call *call, const char *key, char *buf, size_t len);

#endif
