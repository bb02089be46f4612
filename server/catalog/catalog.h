/* The catalog: datasets, jobs, progress, checkpoints and their shards, in one of two engines
 * behind one interface: SQLite (the embedded default, server/catalog/sqlite/) or PostgreSQL
 * (server/catalog/pg/, shared by any number of replicas). The query files (feed.c, ckpt.c) are
 * written once against the engine-neutral statement layer (db.h).
 *
 * The schema evolves by numbered migrations, the same numbers for both engines, applied in order
 * at open, each in its own transaction; the schema_version table records how far it got.
 * Daemons that open one PostgreSQL catalog at once take turns (an advisory lock). A catalog
 * handle belongs to the loop thread.
 *
 * SQLite: one file in the data dir, in WAL mode with synchronous=FULL, so a committed row
 * survives a crash. A statement that fails returns SL_EDB with the engine's message logged,
 * except failures a client can do something about: a full disk returns -ENOSPC, answered
 * RESOURCE_EXHAUSTED; a lock another process held longer than the busy timeout (5 s, during
 * which the loop thread waits) returns SL_EDBBUSY, answered UNAVAILABLE. Either way the failed
 * transaction is rolled back and the catalog stays as it was.
 *
 * PostgreSQL: a serialization failure or deadlock returns SL_EDBBUSY, a server that cannot be
 * reached (or a connection it terminated) SL_ECATDOWN (UNAVAILABLE); the connection is made again
 * by the next statement.
 *
 * The daemon writes through the SQLite file it opened. If that file is removed or another file is
 * put at its path while the daemon runs (a restore done the wrong way, an rm), the writes would go
 * to a file nobody will ever open again and the next start would find a catalog that does not
 * know them. sl_cat_check notices it (before every write transaction, and on the daemon's timer)
 * and from then on every write fails with SL_ECATLOST (FAILED_PRECONDITION); reads go on from the
 * file still open. With PostgreSQL there is no file and sl_cat_check always returns 0.
 */
#ifndef SL_CATALOG_H
#define SL_CATALOG_H

#include <stddef.h>
#include <uv.h>

typedef struct sl_cat sl_cat;
struct uv_loop_s;

/* Told once that the catalog file was removed or replaced; `problem` says which (a sentence
 * naming the path, valid while the catalog is). */
typedef void (*sl_cat_lost_fn)(const char *problem, void *arg);

/* Open (creating if needed) the catalog at `path` and migrate it to the newest schema.
 * Returns 0 and *out (close with sl_cat_close), SL_ESTATE if the file was written by a newer
 * sluiced, SL_EDB for any SQLite failure (logged with SQLite's message). Loop thread. */
int sl_cat_open(sl_cat **out, const char *path);

/* sl_cat_open migrating no further than schema `version` (0 .. sl_cat_latest_version()): a
 * catalog as an older sluiced left it, for the tests of migrations. SL_EINVAL for a version out
 * of range. Loop thread. */
int sl_cat_open_upto(sl_cat **out, const char *path, int version);

/* Open the catalog `spec` names: "sqlite:PATH" or a plain path (SQLite), or a PostgreSQL URI
 * ("postgresql://user@host:port/db?sslmode=..."; "postgresql:" or "pg:" before a key=value
 * conninfo). The password is never in `spec` (refused: SL_EINVAL): it comes from the first line
 * of `password_file` (may be NULL) or libpq's PGPASSFILE / ~/.pgpass. Then migrate as
 * sl_cat_open does. SL_ECATDOWN when the server cannot be reached. Loop thread. */
int sl_cat_open_spec(sl_cat **out, const char *spec, const char *password_file);
int sl_cat_open_spec_upto(sl_cat **out, const char *spec, const char *password_file, int version);

/* What sl_cat_open_spec checks before opening anything: the conninfo parses and holds no
 * password, the password file is one only its owner can read. 0, or SL_EINVAL and a sentence in
 * msg (never the password). */
int sl_cat_spec_check(const char *spec, const char *password_file, char *msg, size_t len);

/* Whether `spec` names a PostgreSQL catalog. */
int sl_cat_is_pg(const char *spec);

/* A catalog server's answer to one statement (and a reconnect) is awaited this long, in ms, before
 * the connection is given up and the statement fails with SL_ECATDOWN (--catalog-timeout). For
 * the connections opened after it; <= 0 is the default. SQLite waits on no server. */
#define SL_CAT_TIMEOUT_MS 5000
void sl_cat_set_timeout(int ms);

/* "sqlite" or "postgresql". */
const char *sl_cat_engine(const sl_cat *cat);

/* Where the catalog is, for GetInfo and logs: "sqlite:PATH" or "postgresql host=.. port=..
 * dbname=.. user=.." (never a password). */
void sl_cat_describe(const sl_cat *cat, char *buf, size_t len);

/* The value of catalog_meta's `key`, set to `value` first if it had none (the first of several
 * replicas to ask sets it). */
int sl_cat_meta_claim(sl_cat *cat, const char *key, const char *value, char *out, size_t len);

/* The value of catalog_meta's `key` into out: 0, SL_ENOTFOUND if it has none, or a catalog
 * error. Loop thread. */
int sl_cat_meta_get(sl_cat *cat, const char *key, char *out, size_t len);

/* Names that differ only in case (ASCII) are one name: jobs' and checkpoints' names become
 * directories and files in the store, and datasets' names files, which collide on a
 * case-insensitive filesystem (and confuse people anyway). A name is refused when another of
 * its kind equals it but for case: a dataset's among datasets, a job's among feed jobs and the
 * jobs of checkpoints (they share checkpoints/<job>), a checkpoint's among its job's. The
 * creating calls (sl_cat_dataset_create, sl_cat_job_create, sl_cat_ckpt_begin) check it in their
 * transaction and return SL_EEXIST; this tells which name they met. Inside a transaction it also
 * makes the replicas of a shared catalog that create names take turns until it ends. */
enum { SL_CAT_NAME_DATASET = 1, SL_CAT_NAME_JOB = 2, SL_CAT_NAME_CKPT = 3 };
/* The existing name of `kind` (a checkpoint's within `job`; job is unused otherwise) that
 * equals `name` but for case, into other: SL_EEXIST when there is one, 0 when there is none, or
 * a catalog error. Loop thread. */
int sl_cat_name_clash(sl_cat *cat, int kind, const char *job, const char *name, char *other,
                      size_t len);

/* Whether the catalog server has answered nothing for at least the catalog timeout: every
 * statement and reconnect since then failed to reach it (PostgreSQL; a statement that timed out
 * counts from when it was sent). 0 again from its first answer (a statement, or the background
 * reconnect, which tries every second). Always 0 with SQLite. Loop thread. */
int sl_cat_unreachable(const sl_cat *cat);

/* Whether several replicas may share this catalog (PostgreSQL): their in-memory state then has
 * to follow what the others write (sl_cat_listen). */
int sl_cat_shared(const sl_cat *cat);

/* What other replicas announced about the rows they changed ("j NAME": a job's row, "p NAME": a
 * job's progress), delivered to fn on the loop after the statement that brought it ended, each
 * replica's own announcements left out; "*" when some may have been missed (the connection was
 * made again). A lost connection is made again by itself (every second). A SQLite catalog never
 * calls fn. sl_cat_unlisten stops (before the loop's last run). Loop thread. */
typedef void (*sl_cat_notify_fn)(const char *payload, void *arg);
int sl_cat_listen(sl_cat *cat, struct uv_loop_s *loop, sl_cat_notify_fn fn, void *arg);
void sl_cat_unlisten(sl_cat *cat);

/* The loop's catalog lane (lane.h) for a shared catalog, from now until sl_cat_unlisten (which
 * waits for it to be idle): every piece of loop work that may run a statement must be handed to
 * sl_cat_lane_run, where a statement suspends it instead of blocking the loop thread. A statement
 * on the loop's own stack meanwhile is logged as catalog_blocking and counted (sl_cat_blocking).
 * No-op for SQLite (a local file: statements run where they are called). Loop thread. */
int sl_cat_lane_start(sl_cat *cat);
/* Run fn(a, b) in the lane (at once if it is idle, else after the work queued before it); at
 * once on the caller's stack while there is no lane. Loop thread. */
typedef void (*sl_cat_work_fn)(void *a, int b);
void sl_cat_lane_run(sl_cat *cat, sl_cat_work_fn fn, void *a, int b);
/* uv_queue_work whose `after` runs in the lane (sl_cat_lane_run): for worker jobs whose
 * completion may run statements or touch what lane work holds. `w->work` is what `fn` and
 * `after` get, its `data` the caller's, as with uv_queue_work. Returns uv_queue_work's code. */
typedef struct sl_cat_work {
    uv_work_t work;
    sl_cat *cat;
    uv_after_work_cb after;
} sl_cat_work;
int sl_cat_queue_work(sl_cat *cat, uv_loop_t *loop, sl_cat_work *w, uv_work_cb fn,
                      uv_after_work_cb after);
/* Statements that waited on the loop thread outside the lane while it was on. Thread-safe. */
unsigned long sl_cat_blocking(const sl_cat *cat);

/* How many other replicas are connected to this shared catalog now (PostgreSQL: sessions of
 * sluiced in pg_stat_activity); 0 with SQLite, or when it cannot tell. */
int sl_cat_peers(sl_cat *cat);

/* Singleton chores of replicas sharing a catalog (the sweeps): sl_cat_chore_try returns 1 when
 * this replica may do chore `id` now (it holds the chore's lock until sl_cat_chore_done, or until
 * its connection ends: a dead replica's chore passes to another), 0 while another replica does
 * it, or a failure code. Always 1 with SQLite. */
enum { SL_CHORE_SWEEP = 1, SL_CHORE_RETENTION = 2 };
int sl_cat_chore_try(sl_cat *cat, int id);
/* sl_cat_chore_try that waits for another replica's turn to end: 0 or a failure code. */
int sl_cat_chore_wait(sl_cat *cat, int id);
void sl_cat_chore_done(sl_cat *cat, int id);

/* Close the catalog. Accepts NULL. Loop thread. */
void sl_cat_close(sl_cat *cat);

/* The schema version after migrations. */
int sl_cat_schema_version(const sl_cat *cat);

/* Statements that failed since the catalog was opened. Thread-safe. */
unsigned long sl_cat_errors(const sl_cat *cat);

/* Whether the file at the catalog's path is still the one open: the open file still has a link
 * (fstat) and the path names it (lstat: device and inode). Returns 0, or SL_ECATLOST once it was
 * found removed (no link left or nothing at the path) or replaced (another file at the path); that
 * finding is final. On it: logs `catalog_lost`, calls the on_lost callback, then folds the WAL
 * into the open file and truncates it (a WAL left at the path would otherwise be applied to
 * whatever catalog is opened there next). A stat that fails otherwise (EIO, EACCES) proves nothing
 * and counts as unchanged. Two system calls. Loop thread. */
int sl_cat_check(sl_cat *cat);

/* Write a consistent copy of the catalog as it is open into `fd` (a new empty file the caller
 * made, opened for writing; it fsyncs and closes it): how a daemon saves the catalog whose file
 * was removed or replaced under it. The copy is a database file SQLite opens as it is. The
 * catalog never opens a path for it, so where the file is (and that no link leads there) is the
 * caller's to decide. Returns 0, -errno (a write failed) or SL_EDB (logged); SL_EUNIMPL with
 * PostgreSQL. Blocking: reads the whole catalog into memory, then writes it. Loop thread. */
int sl_cat_copy(sl_cat *cat, int fd);

/* What sl_cat_check found ("catalog /d/catalog.db was removed while sluiced ran (...)"), or NULL
 * while the file is fine. Valid while the catalog is. Loop thread. */
const char *sl_cat_problem(const sl_cat *cat);

/* Call fn(problem, arg) when sl_cat_check first finds the file removed or replaced (once). */
void sl_cat_on_lost(sl_cat *cat, sl_cat_lost_fn fn, void *arg);

/* The newest schema version this build knows. */
int sl_cat_latest_version(void);

#endif
