/* The feeding service: sluice.v1.Datasets, Jobs, Epochs and Feed (docs/feeding.md).
 *
 * Datasets, jobs, epochs and per-rank progress live in the catalog; the service keeps every job
 * in memory for the streams. Index chunks are produced from (seed, epoch, rank, position) when
 * the previous ones drained, so memory stays flat; an epoch's batch plan is computed once on the
 * worker pool and shared by every rank. Loop thread only.
 */
#ifndef SL_FEED_H
#define SL_FEED_H

#include "catalog/catalog.h"
#include "catalog/feed.h"
#include "rpc/server.h"

#include <uv.h>

typedef struct sl_feed sl_feed;
struct sl_quar;

/* Load every job from the catalog. `data_dir` holds datasets/<name>.lengths (created if
 * missing); lengths uploads a crash interrupted are finished or undone first, and lengths files
 * the catalog does not know go to `quarantine` (NULL: they stay; the batch is left open for the
 * caller to end). Returns 0 and *out (free with sl_feed_free after the RPC server stopped), SL_EDB
 * or -errno. Loop thread. */
int sl_feed_new(sl_feed **out, uv_loop_t *loop, sl_cat *cat, const char *data_dir,
                struct sl_quar *quarantine);

/* Free the service. Accepts NULL. */
void sl_feed_free(sl_feed *f);
/* For a start that failed before the loop ran: runs the loop until no labels are being read on
 * the worker pool (reads that jobs loaded from the catalog started), so that nothing completes
 * after the feed, the catalog or the services it reaches are freed. Call it first when tearing
 * down; a no-op once the loop ran to its end. NULL is fine. */
void sl_feed_drain(sl_feed *f);

/* The four service tables, in the order Datasets, Jobs, Epochs, Feed; their arg is f. */
const sl_rpc_service *sl_feed_service(sl_feed *f, int i);

/* Count indices and batches served into `m` (sluice_indices_served_total,
 * sluice_batches_served_total). Loop thread. */
struct sl_metrics;
/* Group commits of progress go to `wcat` (a second connection to the same shared catalog, owned
 * by the caller, closed after the feed) on the worker pool instead of the loop's connection. */
void sl_feed_set_writer(sl_feed *f, sl_cat *wcat);

void sl_feed_set_metrics(sl_feed *f, struct sl_metrics *m);

#define SL_FEED_N_SERVICES 4

/* ---- checkpoints that carry the data position (server/feed/restore.c) ---- */

/* 1 if the feed job exists. */
int sl_feed_job_exists(sl_feed *f, const char *name);

/* If feed job `name` exists but is not loaded yet (its dataset's labels are being read on the
 * worker pool, as after a start), park `call`: h(call, a copy of m, arg) runs again once the
 * labels are read (or failed), and 1 is returned; else 0, or -ENOMEM if parking failed. Loop
 * thread (the catalog lane with a shared catalog). */
int sl_feed_park_job(sl_feed *f, const char *name, sl_rpc_call *call, const ProtobufCMessage *m,
                     void (*h)(sl_rpc_call *call, const ProtobufCMessage *m, void *arg), void *arg);

/* The feed state of a checkpoint whose `world` ranks were at positions rank_pos[0..world) of
 * `epoch` of feed job `job`: *state a packed sluice.v1.FeedState (positions per dp rank, the
 * lowest of each dp rank's replicas; the dataset's sample count and lengths checksum), *spec and
 * *elastic the job's spec and elastic state of that epoch (from the catalog's epoch records).
 * Returns 0, or SL_ENOTFOUND (no such job), SL_EUNAVAILABLE (the job is being loaded: retry),
 * SL_ESTATE (no record of the epoch, another world),
 * SL_EINVAL (a position past the dataset) with msg. Free the blobs with sl_cat_blob_free. */
int sl_feed_capture(sl_feed *f, const char *job, uint64_t epoch, uint32_t world,
                    const uint64_t *rank_pos, sl_cat_blob *state, sl_cat_blob *spec,
                    sl_cat_blob *elastic, char *msg, size_t len);

typedef struct sl_feed_restore_req {
    const sl_cat_blob *state, *spec, *elastic; /* as sl_feed_capture made them */
    uint32_t world;                            /* 0: the checkpoint's world */
    const struct Sluice__V1__Mesh *mesh;       /* with world, for jobs with a mesh */
} sl_feed_restore_req;

/* Put the feed job back to a checkpoint's state: one catalog transaction (epoch, spec, elastic
 * state, each dp rank's position as its reported progress, later progress discarded), streams of
 * the job ended with ABORTED, then a resize into req->world if it differs, and the next epoch if
 * the state ends its epoch. *epoch and *world: the job's epoch and world after. Returns 0, or
 * SL_ENOTFOUND, SL_ESTATE (the dataset or the job's settings changed, a resize that cannot be
 * done), SL_ECORRUPT with msg. */
int sl_feed_restore(sl_feed *f, const sl_feed_restore_req *req, uint64_t *epoch, uint32_t *world,
                    char *msg, size_t len);

#endif
