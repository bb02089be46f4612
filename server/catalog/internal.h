/* Private to server/catalog/: the catalog handle, shared by the engine-neutral query files and
 * the two engines (sqlite/, pg/). */
#ifndef SL_CATALOG_INTERNAL_H
#define SL_CATALOG_INTERNAL_H

#include "catalog.h"
#include "db.h"

#include <stdatomic.h>

struct sl_cat {
    const sl_db_engine *eng;
    void *conn; /* the engine's connection state */
    int version;
    atomic_ulong errors; /* failed statements, for the metrics endpoint */
    sl_cat_lost_fn on_lost;
    void *on_lost_arg;
};

#endif
