/* sluice.v1.Checkpoints: streamed shard uploads with inline SHA-256, a durable store under
 * <data dir>/checkpoints/<job>/, the catalog lifecycle (WRITING -> COMPLETE | INCOMPLETE),
 * verification, downloads and retention.
 *
 * Handlers run on the loop thread and own all service state; hashing, writing, fsync and deep
 * verification run on libuv's worker pool, one job at a time per upload or shard, with results
 * back on the loop.
 */
#ifndef SL_CHECKPOINTS_H
#define SL_CHECKPOINTS_H

#include "rpc/server.h"

struct sl_daemon;
typedef struct sl_ckpt_svc sl_ckpt_svc;

/* Create the service: makes <data dir>/checkpoints, removes temp files left by a previous run
 * (keeping the partial uploads of WRITING checkpoints younger than the upload timeout, so they
 * can be resumed) and files of checkpoints the catalog no longer knows, and starts the timer that
 * removes abandoned partial uploads. Returns 0 and *out (free with sl_ckpt_svc_free) or -errno.
 * Loop thread, after the catalog is open. */
int sl_ckpt_svc_new(sl_ckpt_svc **out, struct sl_daemon *d);

/* The service table; its arg is the service. */
const sl_rpc_service *sl_ckpt_service(sl_ckpt_svc *s);

/* Stop the timer and free the service once its handle closed (the loop must run afterwards).
 * Call after the RPC server has stopped (no call is alive). Accepts NULL. Loop thread. */
void sl_ckpt_svc_free(sl_ckpt_svc *s);

#endif
