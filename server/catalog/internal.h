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

#endif
