/* Private to server/catalog/: the catalog handle's layout, shared by its query files. */
#ifndef SL_CATALOG_INTERNAL_H
#define SL_CATALOG_INTERNAL_H

#include "catalog.h"

#include <sqlite3.h>

struct sl_cat {
    sqlite3 *db;
    int version;
};

#endif
