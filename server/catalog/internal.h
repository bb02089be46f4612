/* Private to server/catalog/: the catalog handle's layout, shared by its query files. */
#ifndef SL_CATALOG_INTERNAL_H
#define SL_CATALOG_INTERNAL_H

#include "catalog.h"
#include "feed.h"

#include <limits.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/types.h>

struct sl_cat {
    sqlite3 *db;
    int version;
    atomic_ulong errors; /* failed statements, for the metrics endpoint */
    /* The file opened, to notice it removed or replaced under the daemon (sl_cat_check): an fd
     * of our own on it (closed only after SQLite's, so SQLite's POSIX locks stay), its path and
     * identity at open. */
    int fd;
    char path[PATH_MAX];
    dev_t dev;
    ino_t ino;
    int lost; /* sticky once found: every write is refused with SL_ECATLOST */
    char problem[PATH_MAX + 160];
    sl_cat_lost_fn on_lost;
    void *on_lost_arg;
};

/* The sluice code for a SQLite result code: -ENOSPC for SQLITE_FULL (the disk is full),
 * SL_EDBBUSY for SQLITE_BUSY and SQLITE_LOCKED (another process held the lock longer than the
 * busy timeout), SL_EDB for anything else. */
int sl_cat_code(int rc);

/* Count and log a failed statement of `op` with SQLite's message; returns sl_cat_code of the
 * connection's last error. */
int sl_cat_fail(sl_cat *cat, const char *op);

/* Prepare `sql` into *st, or sl_cat_fail. A statement that writes, outside a transaction, is
 * first checked with sl_cat_check: refused with SL_ECATLOST (nothing prepared) once the file is
 * gone. */
int sl_cat_prepare(sl_cat *cat, sqlite3_stmt **st, const char *sql, const char *op);

/* BEGIN IMMEDIATE after sl_cat_check (SL_ECATLOST once the file is gone), and its end: COMMIT if
 * err is 0, else ROLLBACK of whatever is still open. sl_cat_tx_end returns err or the COMMIT's
 * error. */
int sl_cat_tx_begin(sl_cat *cat);
int sl_cat_tx_end(sl_cat *cat, int err);

/* Copy text column `col` (NULL as "") into dst, cut to fit. */
void sl_cat_copy_col(char *dst, size_t len, sqlite3_stmt *st, int col);

/* Copy a blob column into b (malloc'd; NULL or empty: b->p NULL, len 0). 0 or -ENOMEM. */
int sl_cat_copy_blob(sl_cat_blob *b, sqlite3_stmt *st, int col);

#endif
