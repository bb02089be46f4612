/* Private to server/catalog/: the catalog handle's layout, shared by its query files. */
#ifndef SL_CATALOG_INTERNAL_H
#define SL_CATALOG_INTERNAL_H

#include "catalog.h"

#include <sqlite3.h>
#include <stdatomic.h>

struct sl_cat {
    sqlite3 *db;
    int version;
    atomic_ulong errors; /* failed statements, for the metrics endpoint */
};

#endif
