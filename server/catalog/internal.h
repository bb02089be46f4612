/* Private to server/catalog/: the catalog handle's layout, shared by its query files. */
#ifndef SL_CATALOG_INTERNAL_H
#define SL_CATALOG_INTERNAL_H

#include "catalog.h"
#include "feed.h"

#include <sqlite3.h>
#include <stdatomic.h>
#include <stddef.h>

struct sl_cat {
    sqlite3 *db;
    int version;
    atomic_ulong errors; /* failed statements, for the metrics endpoint */
};

/* The sluice code for a SQLite result code: -ENOSPC for SQLITE_FULL (the disk is full),
 * SL_EDBBUSY for SQLITE_BUSY and SQLITE_LOCKED (another process held the lock longer than the
 * busy timeout), SL_EDB for anything else. */
int sl_cat_code(int rc);

/* Count and log a failed statement of `op` with SQLite's message; returns sl_cat_code of the
 * connection's last error. */
int sl_cat_fail(sl_cat *cat, const char *op);

/* Prepare `sql` into *st, or sl_cat_fail. */
int sl_cat_prepare(sl_cat *cat, sqlite3_stmt **st, const char *sql, const char *op);

/* Copy text column `col` (NULL as "") into dst, cut to fit. */
void sl_cat_copy_col(char *dst, size_t len, sqlite3_stmt *st, int col);

/* Copy a blob column into b (malloc'd; NULL or empty: b->p NULL, len 0). 0 or -ENOMEM. */
int sl_cat_copy_blob(sl_cat_blob *b, sqlite3_stmt *st, int col);

#endif
