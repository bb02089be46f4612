/* A blocking gRPC client on the gRPC C core and protobuf-c.
 *
 * A client (one channel) is thread-safe: many threads may run calls on it at once. A stream is
 * used by one thread at a time, except that a bidi stream may have one reader thread and one
 * writer thread.
 */
#ifndef SL_RPC_CLIENT_H
#define SL_RPC_CLIENT_H

#include "rpc.h"

#include <protobuf-c/protobuf-c.h>
#include <stdint.h>

typedef struct sl_rpc_client sl_rpc_client;
typedef struct sl_rpc_stream sl_rpc_stream;

typedef struct sl_rpc_client_opts {
    int max_recv_bytes;    /* largest accepted message; 0 means 64 MiB */
    int max_send_bytes;    /* largest sent message; 0 means unlimited */
    const sl_rpc_tls *tls; /* NULL: plaintext */
    const char *token;     /* sent as "authorization: Bearer <token>" on every call; NULL: none */
    int own_connection;    /* 1: never share the TCP connection with other channels of this
                            * process (by default channels with equal options share one) */
} sl_rpc_client_opts;

/* Open a channel to `target` ("host:port"). Connection happens lazily on the first call.
 * Returns 0 and *out (free with sl_rpc_client_free), SL_EINVAL for an empty target, the error of
 * unreadable TLS files, -ENOMEM. */
int sl_rpc_client_new(sl_rpc_client **out, const char *target, const sl_rpc_client_opts *opts);

/* Close the channel. Streams must be freed first. Accepts NULL. */
void sl_rpc_client_free(sl_rpc_client *c);

/* Unary call. `method` is the full path ("/sluice.v1.Admin/GetInfo"); timeout_ms <= 0 waits
 * forever. On OK, *resp is the decoded response (free with protobuf_c_message_free_unpacked).
 * Returns 0, or the sluice error for the status (sl_rpc_err_from_code); `st` (may be NULL)
 * receives code and message either way. Thread-safe. */
int sl_rpc_client_unary(sl_rpc_client *c, const char *method, const ProtobufCMessage *req,
                        const ProtobufCMessageDescriptor *resp_desc, ProtobufCMessage **resp,
                        int64_t timeout_ms, sl_rpc_status *st);

/* Unary call with raw request bytes; the response is discarded. For tests of hostile input. */
int sl_rpc_client_unary_raw(sl_rpc_client *c, const char *method, const void *buf, size_t len,
                            int64_t timeout_ms, sl_rpc_status *st);

/* Asynchronous unary calls: many in flight from one thread. Start calls with
 * sl_rpc_async_start, collect each outcome with sl_rpc_async_wait. An sl_rpc_async is used by
 * one thread at a time. */
typedef struct sl_rpc_async sl_rpc_async;

/* Create an async context on client `c` (which must outlive it). Returns 0 or -ENOMEM. */
int sl_rpc_async_new(sl_rpc_async **out, sl_rpc_client *c);

/* Start a unary call; `user` comes back from sl_rpc_async_wait. Returns 0 or SL_ERPC. */
int sl_rpc_async_start(sl_rpc_async *a, const char *method, const ProtobufCMessage *req,
                       int64_t timeout_ms, void *user);

/* Calls started and not yet collected. */
size_t sl_rpc_async_pending(const sl_rpc_async *a);

/* Wait for any started call to finish. On OK, *resp (if resp_desc is not NULL) is the decoded
 * response (free with protobuf_c_message_free_unpacked). *user is the call's user pointer.
 * Returns 0, the mapped sluice error of the status (st, if not NULL, has code and message), or
 * SL_ESTATE when nothing is pending. */
int sl_rpc_async_wait(sl_rpc_async *a, const ProtobufCMessageDescriptor *resp_desc,
                      ProtobufCMessage **resp, void **user, sl_rpc_status *st);

/* Cancel and collect every pending call, then free. Accepts NULL. */
void sl_rpc_async_free(sl_rpc_async *a);

/* Start a streaming call (any kind). Returns 0 and *out (free with sl_rpc_stream_free). */
int sl_rpc_stream_open(sl_rpc_stream **out, sl_rpc_client *c, const char *method,
                       int64_t timeout_ms);

/* Send one message; blocks until the transport accepted it. flags: SL_RPC_SEND_MORE (the write may
 * be buffered until a later write without it). Returns 0, or SL_ERPC if the call has ended
 * (sl_rpc_stream_finish tells why). */
int sl_rpc_stream_write(sl_rpc_stream *s, const ProtobufCMessage *msg, int flags);
int sl_rpc_stream_write_raw(sl_rpc_stream *s, const void *buf, size_t len, int flags);

/* Send a message that is exactly one length-delimited field: field number `field` (a bytes field,
 * or a oneof member of bytes type, of the request type) holding `len` bytes, which
 * fill(dst, len, arg) writes straight into the buffer that is sent (e.g. reads them from a file).
 * This saves the copy sl_rpc_stream_write makes when it packs a message; the receiver decodes the
 * same message. fill runs on the calling thread before anything is sent and returns 0 or an error,
 * which is returned as is with nothing sent. Otherwise as sl_rpc_stream_write; SL_EINVAL for a
 * field number outside [1, 2^29) or a length above 4 GiB. */
int sl_rpc_stream_write_bytes(sl_rpc_stream *s, uint32_t field, size_t len, int flags,
                              int (*fill)(void *dst, size_t len, void *arg), void *arg);

/* Half-close: no more messages from this side. */
int sl_rpc_stream_close_send(sl_rpc_stream *s);

/* Receive one message into *msg (free with protobuf_c_message_free_unpacked). Returns 1 with a
 * message, 0 at the end of the stream (call sl_rpc_stream_finish for the status), SL_EPROTO if
 * the bytes do not decode, SL_ERPC if the call failed. */
int sl_rpc_stream_read(sl_rpc_stream *s, const ProtobufCMessageDescriptor *desc,
                       ProtobufCMessage **msg);

/* sl_rpc_stream_read for a message whose singular bytes field number `field` is delivered as an
 * sl_rpc_bytes (*bytes, NULL when the field is empty; free with sl_rpc_bytes_free): a message
 * that begins with that field keeps the received slices, no copy (rpc/internal.h,
 * sl_rpc_unpack_bytes). The message's field keeps its len with data NULL. */
int sl_rpc_stream_read_bytes(sl_rpc_stream *s, const ProtobufCMessageDescriptor *desc,
                             uint32_t field, ProtobufCMessage **msg, sl_rpc_bytes **bytes);

/* Wait for the call's final status. Returns 0 for OK or the mapped sluice error; `st` may be
 * NULL. May be called once. */
int sl_rpc_stream_finish(sl_rpc_stream *s, sl_rpc_status *st);

/* Cancel the call; pending and later operations fail. Thread-safe with a blocked reader. */
void sl_rpc_stream_cancel(sl_rpc_stream *s);

/* Free the stream, cancelling it if it has not finished. Accepts NULL. */
void sl_rpc_stream_free(sl_rpc_stream *s);

#endif
