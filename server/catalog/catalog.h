/* The SQLite catalog: the only code that includes <sqlite3.h>.
 *
 * The catalog is one SQLite file in the data dir, in WAL mode with synchronous=FULL, so a
 * committed row survives a crash. Its schema evolves by numbered migrations, applied in order at
 * open, each in its own transaction; the schema_version table records how far it got.
 * A catalog handle belongs to the loop thread.
 *
 * A statement that fails returns SL_EDB with SQLite's message logged, except two failures a
 * client can do something about: a full disk (SQLITE_FULL) returns -ENOSPC, answered
 * RESOURCE_EXHAUSTED, and a lock another process held longer than the busy timeout (5 s, during
 * which the loop thread waits) returns SL_EDBBUSY, answered UNAVAILABLE. Either way the failed
 * transaction is rolled back and the catalog stays as it was.
 */
#ifndef SL_CATALOG_H
#define SL_CATALOG_H

typedef struct sl_cat sl_cat;

/* Open (creating if needed) the catalog at `path` and migrate it to the newest schema.
 * Returns 0 and *out (close with sl_cat_close), SL_ESTATE if the file was written by a newer
 * sluiced, SL_EDB for any SQLite failure (logged with SQLite's message). Loop thread. */
int sl_cat_open(sl_cat **out, const char *path);

/* Close the catalog. Accepts NULL. Loop thread. */
void sl_cat_close(sl_cat *cat);

/* The schema version after migrations. */
int sl_cat_schema_version(const sl_cat *cat);

/* Statements that failed since the catalog was opened. Thread-safe. */
unsigned long sl_cat_errors(const sl_cat *cat);

/* The newest schema version this build knows. */
int sl_cat_latest_version(void);

#endif
