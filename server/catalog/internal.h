/* Private to server/catalog/: the catalog handle, shared by the engine-neutral query files and
 * the two engines (sqlite/, pg/). */
#ifndef SL_CATALOG_INTERNAL_H
#define SL_CATALOG_INTERNAL_H

#include "catalog.h"
#include "db.h"
#include "lane.h"

#include <stdatomic.h>

struct sl_cat {
    const sl_db_engine *eng;
    void *conn; /* the engine's connection state */
    int version;
    atomic_ulong errors; /* failed statements, for the metrics endpoint */
    sl_cat_lost_fn on_lost;
    void *on_lost_arg;
    /* A shared catalog's lane (lane.h) and whether work goes through it (from sl_cat_lane_start
     * to the unlisten at shutdown): meanwhile a statement outside it is an error (logged and
     * counted, `blocking`). */
    sl_lane *lane;
    int lane_on;
    atomic_ulong blocking;
};

/* A statement was about to wait for the catalog server on the loop's own stack although the lane
 * is on: logged (op) and counted. Returns 1 then, else 0 (a statement may wait: startup,
 * shutdown, a worker's own connection, or inside the lane). */
int sl_db_outside_lane(sl_cat *cat, const char *op);

/* Lock checkpoint `id`'s row for a change that needs it WRITING with no live commit claim, in
 * the caller's transaction (ckpt.c; lease.c uses it too). 0, or SL_ENOTFOUND, SL_ESTATE (its
 * state into *state), SL_EUNAVAILABLE (a live claim; the claimer into who). Loop thread. */
int sl_cat_fence_ckpt(sl_cat *cat, int64_t id, int *state, char *who, size_t len);

#endif
