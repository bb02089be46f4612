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

/* The four service tables, in the order Datasets, Jobs, Epochs, Feed; their arg is f. */
const sl_rpc_service *sl_feed_service(sl_feed *f, int i);

/* Count indices and batches served into `m` (sluice_indices_served_total,
 * sluice_batches_served_total). Loop thread. */
struct sl_metrics;
void sl_feed_set_metrics(sl_feed *f, struct sl_metrics *m);

#define SL_FEED_N_SERVICES 4

#endif
