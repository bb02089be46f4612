/* sluice.v1.Checkpoints: streamed shard uploads with inline SHA-256, a durable store under
 * <data dir>/checkpoints/<job>/, the catalog lifecycle (WRITING -> COMPLETE | INCOMPLETE),
 * verification, downloads and retention (docs/checkpoints.md).
 *
 * Handlers run on the loop thread and own all service state; hashing, writing, fsync and deep
 * verification run on libuv's worker pool, one job at a time per upload lane or shard, with
 * results back on the loop.
 */
#ifndef SL_CKPT_H
#define SL_CKPT_H

#include "catalog/catalog.h"
#include "rpc/server.h"

#include <stdint.h>
#include <uv.h>

struct sl_metrics;
struct sl_quar;
struct sl_sstore;

typedef struct sl_ckpt_svc sl_ckpt_svc;

/* What the service needs besides the loop, the catalog and the data dir. Every field is set by
 * the caller (sluiced takes them from its configuration). */
typedef struct sl_ckpt_opts {
    uint64_t max_shard_bytes;   /* largest shard accepted, data bytes (RESOURCE_EXHAUSTED) */
    uint64_t upload_timeout_ms; /* partial uploads untouched this long are removed */
    uint64_t upload_memory;     /* upload chunks held in memory by all uploads together */
    /* The data dir itself, open (and locked) by the caller, or -1. While the data dir's path
     * still names this directory the sweeps run; once it does not (the data dir was removed or
     * replaced under the daemon), they stop for good, since the files there are no longer this
     * catalog's. */
    int lock_fd;
    /* Deep-verify shard hash jobs on the worker pool at once, all Verify calls together, so
     * that uploads always find workers; more wait their turn. 0 means 2. */
    int max_deep_verifies;
    struct sl_metrics *metrics; /* sluice_verify_*; NULL: not counted */
    /* The feeding service whose data positions checkpoints carry (Begin's feed_job, Commit's
     * feed state, Restore); NULL: checkpoints cannot be bound to feed jobs. */
    struct sl_feed *feed;
    /* Where checkpoint files the catalog does not know go (server/store/quarantine.h); NULL:
     * they stay where they are. The startup sweep leaves its batch open for the caller to end
     * with sl_quar_end; later sweeps end theirs. */
    struct sl_quar *quarantine;
    /* Where shard and metadata files live (server/store/sstore.h): the directory backend on
     * <data dir>/checkpoints, or object storage. Must outlive the service. */
    struct sl_sstore *store;
    /* This replica's identity (upload leases of a shared catalog name their holder) and how long
     * a lease holds after its last renewal (0: 30 s). */
    const char *replica;
    uint64_t lease_ms;
    /* Small jobs on a remote store on the worker pool at once (removals, UploadStatus, sweeps:
     * server/ckpt/gate.c); more wait their turn. 0 means 4. */
    int store_jobs;
} sl_ckpt_opts;

/* Create the service: makes <data_dir>/checkpoints and sweeps it (server/ckpt/sweep.c): removes
 * temp files left by a previous run, partial uploads abandoned for the upload timeout and the
 * files of checkpoints whose removal the catalog recorded; keeps the partial uploads of WRITING
 * checkpoints younger than the upload timeout, so they can be resumed; moves every other file the
 * catalog does not know to the quarantine. Then starts the timer that sweeps partial uploads.
 * `loop`, `cat`, opts->metrics and opts->quarantine must outlive the service; data_dir and opts
 * are copied. Returns 0 and *out (free with sl_ckpt_svc_free), -ENAMETOOLONG or -errno. Loop
 * thread, after the catalog is open. */
int sl_ckpt_svc_new(sl_ckpt_svc **out, uv_loop_t *loop, sl_cat *cat, const char *data_dir,
                    const sl_ckpt_opts *opts);

/* The service table; its arg is the service. Valid until sl_ckpt_svc_free. */
const sl_rpc_service *sl_ckpt_service(sl_ckpt_svc *s);

/* Stop the timer and free the service once its handle closed (the loop must run afterwards).
 * Call after the RPC server has stopped (no call is alive). Accepts NULL. Loop thread. */
void sl_ckpt_svc_free(sl_ckpt_svc *s);

#endif
