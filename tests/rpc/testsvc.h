/* The test-only service (tests/rpc/test.proto) and a harness that runs it in a server on its own
 * libuv loop thread. Used by tests/unit/rpc_test.c and tests/bench/rpc_bench.c. */
#ifndef SL_TESTSVC_H
#define SL_TESTSVC_H

#include "rpc/server.h"

#include <stdint.h>

typedef struct sl_testsrv sl_testsrv;

/* Start a test server on 127.0.0.1:0 with `max_recv_bytes` (0 = default) and `tls` (NULL:
 * plaintext) on a new loop thread. Returns 0 and *out. */
int sl_testsrv_start(sl_testsrv **out, int max_recv_bytes, const sl_rpc_tls *tls);

/* As sl_testsrv_start, with bearer tokens required: "r-token" may call Echo (reader), "w-token"
 * everything (writer); Stats is public. */
int sl_testsrv_start_auth(sl_testsrv **out);

/* As sl_testsrv_start, with the max_calls, max_key_calls and idle_timeout_ms of `limits`; with
 * max_key_calls set, Echo claims its text as the key (sl_rpc_call_claim). Count has a
 * send_budget of SL_TESTSRV_COUNT_BUDGET bytes there, and Digest handler_progress (a piece
 * with data is progress, a label or empty data is not). */
#define SL_TESTSRV_COUNT_BUDGET (64u << 10)
int sl_testsrv_start_limits(sl_testsrv **out, const sl_rpc_server_opts *limits);

/* Set before starting: servers started from then on hand their handlers' events to a lane
 * (sl_rpc_server_opts.lane) that runs them on a later turn of the loop, as a daemon's catalog
 * lane busy with a statement would. */
extern int sl_testsrv_laned;

/* The most bytes a Count call had queued or in flight right after one of its sends. */
size_t sl_testsrv_max_send_bytes(sl_testsrv *s);

/* The bound port. */
int sl_testsrv_port(const sl_testsrv *s);

/* Shut down gracefully with `grace_ms`, join the loop thread and free everything. Returns the
 * number of calls still allocated when shutdown completed (0 is correct). */
size_t sl_testsrv_stop(sl_testsrv *s, uint64_t grace_ms);

#endif
