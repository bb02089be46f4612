/* The SQLite engine: the only code that includes <sqlite3.h>.
 *
 * The catalog is one SQLite file, in WAL mode with synchronous=FULL, so a committed row survives
 * a crash; a lock another process holds is waited for up to 5 s (busy timeout). The file is
 * created 0600 and watched: removed or replaced under the daemon, every write is refused from
 * then on (sl_cat_check, see catalog.h).
 */
#include "../internal.h"

#include "err.h"
#include "log.h"
#include "util/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Migration N (1-based) takes the schema from version N-1 to N. Append only: a released
 * migration is never edited, later changes get a new entry. */
static const char *const migrations[] = {
    /* 1: identity of this catalog. */
    "CREATE TABLE catalog_meta (\n"
    "  key   TEXT PRIMARY KEY NOT NULL,\n"
    "  value TEXT NOT NULL\n"
    ");\n"
    "INSERT INTO catalog_meta(key, value) VALUES ('created_at', "
    "strftime('%Y-%m-%dT%H:%M:%SZ','now'));\n",
    /* 2: checkpoints and their shards (server/catalog/ckpt.c). `job` is a plain name,
     * not a reference: checkpoints do not depend on any other table. */
    "CREATE TABLE checkpoints (\n"
    "  id            INTEGER PRIMARY KEY,\n"
    "  job           TEXT NOT NULL,\n"
    "  name          TEXT NOT NULL,\n"
    "  step          INTEGER NOT NULL CHECK (step >= 0),\n"
    "  world_size    INTEGER NOT NULL CHECK (world_size > 0),\n"
    "  state         INTEGER NOT NULL CHECK (state IN (1, 2, 3)), -- WRITING, COMPLETE, "
    "INCOMPLETE\n"
    "  user_metadata TEXT NOT NULL DEFAULT '',\n"
    "  created_ms    INTEGER NOT NULL,\n"
    "  committed_ms  INTEGER NOT NULL DEFAULT 0,\n"
    "  UNIQUE (job, name)\n"
    ");\n"
    "CREATE INDEX checkpoints_job_state ON checkpoints(job, state, step);\n"
    "CREATE TABLE checkpoint_shards (\n"
    "  checkpoint_id INTEGER NOT NULL REFERENCES checkpoints(id) ON DELETE CASCADE,\n"
    "  rank          INTEGER NOT NULL CHECK (rank >= 0),\n"
    "  data_size     INTEGER NOT NULL CHECK (data_size >= 0),\n"
    "  file_size     INTEGER NOT NULL CHECK (file_size >= 0),\n"
    "  sha256        TEXT NOT NULL,\n"
    "  tensor_count  INTEGER NOT NULL,\n"
    "  tensors       TEXT NOT NULL, -- JSON array, as written to metadata.json\n"
    "  created_ms    INTEGER NOT NULL,\n"
    "  PRIMARY KEY (checkpoint_id, rank)\n"
    ") WITHOUT ROWID;\n"
    "CREATE TABLE checkpoint_retention (\n"
    "  job       TEXT PRIMARY KEY NOT NULL,\n"
    "  keep_last INTEGER NOT NULL CHECK (keep_last >= 0)\n"
    ");\n",
    /* 3: feeding service: datasets, jobs (config as an opaque spec blob), per-rank progress of
     * each job's current epoch (server/catalog/feed.c). */
    "CREATE TABLE feed_datasets (\n"
    "  name           TEXT PRIMARY KEY NOT NULL,\n"
    "  samples        INTEGER NOT NULL CHECK (samples > 0),\n"
    "  lengths_sha256 TEXT NOT NULL DEFAULT '',\n"
    "  created_ms     INTEGER NOT NULL\n"
    ");\n"
    "CREATE TABLE feed_jobs (\n"
    "  name       TEXT PRIMARY KEY NOT NULL,\n"
    "  dataset    TEXT NOT NULL REFERENCES feed_datasets(name),\n"
    "  spec       BLOB NOT NULL,\n"
    "  world_size INTEGER NOT NULL CHECK (world_size > 0),\n"
    "  epoch      INTEGER NOT NULL DEFAULT 0 CHECK (epoch >= 0),\n"
    "  elastic    BLOB,\n"
    "  created_ms INTEGER NOT NULL\n"
    ");\n"
    "CREATE INDEX feed_jobs_dataset ON feed_jobs(dataset);\n"
    "CREATE TABLE feed_progress (\n"
    "  job      TEXT NOT NULL REFERENCES feed_jobs(name) ON DELETE CASCADE,\n"
    "  dp_rank  INTEGER NOT NULL CHECK (dp_rank >= 0),\n"
    "  epoch    INTEGER NOT NULL,\n"
    "  position INTEGER NOT NULL CHECK (position >= 0),\n"
    "  PRIMARY KEY (job, dp_rank)\n"
    ") WITHOUT ROWID;\n",
    /* 4: checkpoints that carry the data position (issue 14). A checkpoint may be bound to a
     * feed job; each shard records its rank's position; a COMPLETE one keeps the feed state it
     * was taken at (a packed sluice.v1.FeedState, the job's spec and elastic state of that
     * epoch). feed_epochs keeps each job's spec and elastic state of its recent epochs, so a
     * commit that lands after the job moved on still finds the epoch its shards were taken in. */
    "ALTER TABLE checkpoints ADD COLUMN feed_job TEXT NOT NULL DEFAULT '';\n"
    "ALTER TABLE checkpoints ADD COLUMN auto_commit INTEGER NOT NULL DEFAULT 0;\n"
    "ALTER TABLE checkpoints ADD COLUMN feed_state BLOB;\n"
    "ALTER TABLE checkpoints ADD COLUMN feed_spec BLOB;\n"
    "ALTER TABLE checkpoints ADD COLUMN feed_elastic BLOB;\n"
    "ALTER TABLE checkpoint_shards ADD COLUMN pos_epoch INTEGER;\n"
    "ALTER TABLE checkpoint_shards ADD COLUMN pos_position INTEGER;\n"
    "ALTER TABLE checkpoint_shards ADD COLUMN pos_world INTEGER;\n"
    "CREATE TABLE feed_epochs (\n"
    "  job        TEXT NOT NULL REFERENCES feed_jobs(name) ON DELETE CASCADE,\n"
    "  epoch      INTEGER NOT NULL CHECK (epoch >= 0),\n"
    "  spec       BLOB NOT NULL,\n"
    "  world_size INTEGER NOT NULL CHECK (world_size > 0),\n"
    "  elastic    BLOB,\n"
    "  PRIMARY KEY (job, epoch)\n"
    ") WITHOUT ROWID;\n",
    /* 5: the checkpoints whose files the catalog decided to remove (Delete, Abort, retention),
     * with the time of that decision, written in the transaction of the decision. A file of
     * (job, name) no newer than removed_ms is garbage the startup sweep may remove; any other
     * file the catalog does not know goes to the quarantine (server/ckpt/sweep.c). Cleared by
     * the startup sweep. */
    "CREATE TABLE checkpoint_removals (\n"
    "  job        TEXT NOT NULL,\n"
    "  name       TEXT NOT NULL,\n"
    "  removed_ms INTEGER NOT NULL,\n"
    "  PRIMARY KEY (job, name)\n"
    ") WITHOUT ROWID;\n",
    /* 6: per-sample labels (class ids) of a dataset, stored like its lengths: the checksum of
     * the complete file ('' when it has none) and 1 + the largest class id in it. */
    "ALTER TABLE feed_datasets ADD COLUMN labels_sha256 TEXT NOT NULL DEFAULT '';\n"
    "ALTER TABLE feed_datasets ADD COLUMN classes INTEGER NOT NULL DEFAULT 0;\n",
    /* 7: replicas (issue 15). A job's version counts the changes of its spec other than epoch
     * advances (resize, restore), so a replica that hears a job changed knows whether its copy
     * only has to move to the next epoch. A checkpoint's commit claim: the replica committing it
     * (writing metadata.json) and since when. An upload lease: which replica receives the shard of
     * (checkpoint, rank), with a generation that fences a replica whose lease was taken over out
     * of recording it. */
    "ALTER TABLE feed_jobs ADD COLUMN version INTEGER NOT NULL DEFAULT 0;\n"
    "ALTER TABLE checkpoints ADD COLUMN commit_claim_ms INTEGER NOT NULL DEFAULT 0;\n"
    "ALTER TABLE checkpoints ADD COLUMN commit_claimer TEXT NOT NULL DEFAULT '';\n"
    "CREATE TABLE upload_leases (\n"
    "  checkpoint_id INTEGER NOT NULL REFERENCES checkpoints(id) ON DELETE CASCADE,\n"
    "  rank          INTEGER NOT NULL CHECK (rank >= 0),\n"
    "  replica       TEXT NOT NULL,\n"
    "  generation    INTEGER NOT NULL,\n"
    "  expires_ms    INTEGER NOT NULL,\n"
    "  PRIMARY KEY (checkpoint_id, rank)\n"
    ") WITHOUT ROWID;\n",
    /* 8: fencing in the catalog (issue 25). The statements call sl_now_ms() and
     * sl_lease_generation(), which PostgreSQL defines in its migration 8; here they are
     * functions of the connection (sqlite_functions below), so nothing changes in the file. */
    "SELECT 1;\n",
    /* 9: block digests of a shard (issue 25): the SHA-256 of each block_size bytes of its data,
     * concatenated, so a download from an offset checks the blocks it serves. block_size 0 and
     * blocks NULL: a shard recorded before, or one whose list was lost (docs/checkpoints.md). */
    "ALTER TABLE checkpoint_shards ADD COLUMN block_size INTEGER NOT NULL DEFAULT 0;\n"
    "ALTER TABLE checkpoint_shards ADD COLUMN blocks BLOB;\n",
};

typedef struct lite {
    sqlite3 *db;
    /* The file opened, to notice it removed or replaced under the daemon (sl_cat_check): an fd
     * of our own on it (closed only after SQLite's, so SQLite's POSIX locks stay), its path and
     * identity at open. */
    int fd;
    char path[PATH_MAX];
    dev_t dev;
    ino_t ino;
    int lost; /* sticky once found: every write is refused with SL_ECATLOST */
    char problem[PATH_MAX + 160];
    int64_t lease_gen; /* the last generation sl_lease_generation() gave */
} lite;

#define LITE(cat) ((lite *)(cat)->conn)

/* The sluice code for a SQLite result code: -ENOSPC for SQLITE_FULL (the disk is full),
 * SL_EDBBUSY for SQLITE_BUSY and SQLITE_LOCKED (another process held the lock longer than the
 * busy timeout), SL_EDB for anything else. */
static int code(int rc)
{
    switch (rc & 0xff) {
    case SQLITE_FULL:
        return -ENOSPC;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return SL_EDBBUSY;
    default:
        return SL_EDB;
    }
}

/* Count and log a failed statement of `op` with SQLite's message. */
static int fail(sl_cat *cat, const char *op)
{
    int rc = sqlite3_extended_errcode(LITE(cat)->db);

    sl_db_count_error(cat);
    sl_log_error("catalog_error", "op=%s code=%d msg=\"%s\"", op, rc,
                 sqlite3_errmsg(LITE(cat)->db));
    return code(rc);
}

static int script(sl_cat *cat, const char *sql, const char *op)
{
    char *msg = NULL;
    int rc = sqlite3_exec(LITE(cat)->db, sql, NULL, NULL, &msg);

    if (rc != SQLITE_OK) {
        sl_db_count_error(cat);
        sl_log_error("catalog_error", "op=%s code=%d msg=\"%s\"", op, rc,
                     msg ? msg : sqlite3_errstr(rc));
        sqlite3_free(msg);
        return code(rc);
    }
    return 0;
}

static int check(sl_cat *cat);

static int run(sl_db_q *q, const char *sql, int constraint_err)
{
    sqlite3 *db = LITE(q->cat)->db;
    sqlite3_stmt *st = NULL;
    int rc, err;

    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        return fail(q->cat, q->op);
    q->res = st;
    /* A write outside a transaction is checked here; inside one, its BEGIN was. */
    if (!sqlite3_stmt_readonly(st) && sqlite3_get_autocommit(db) && (err = check(q->cat)) != 0)
        return err;
    for (int i = 0; i < q->nparams; i++) {
        const sl_db_param *p = &q->params[i];
        if (p->kind == SL_DB_P_INT)
            sqlite3_bind_int64(st, i + 1, p->i);
        else if (p->kind == SL_DB_P_TEXT)
            sqlite3_bind_text(st, i + 1, p->p, -1, SQLITE_STATIC);
        else if (p->kind == SL_DB_P_BLOB)
            sqlite3_bind_blob(st, i + 1, p->p, (int)p->n, SQLITE_STATIC);
    }
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        q->pending = 1;
        return 0;
    }
    if (rc == SQLITE_DONE) {
        q->changes = sqlite3_changes(db);
        return 0;
    }
    if ((rc & 0xff) == SQLITE_CONSTRAINT && constraint_err)
        return constraint_err;
    return fail(q->cat, q->op);
}

static int next(sl_db_q *q)
{
    int rc;

    if (!q->res)
        return 0;
    if (q->pending) {
        q->pending = 0;
        return 1;
    }
    rc = sqlite3_step(q->res);
    if (rc == SQLITE_ROW)
        return 1;
    if (rc == SQLITE_DONE)
        return 0;
    return fail(q->cat, q->op);
}

static int isnull(sl_db_q *q, int col)
{
    return sqlite3_column_type(q->res, col) == SQLITE_NULL;
}

static int64_t int64(sl_db_q *q, int col)
{
    return sqlite3_column_int64(q->res, col);
}

static const char *text(sl_db_q *q, int col)
{
    return (const char *)sqlite3_column_text(q->res, col);
}

static const void *blob(sl_db_q *q, int col, size_t *len)
{
    const void *p = sqlite3_column_blob(q->res, col);
    int n = sqlite3_column_bytes(q->res, col);

    *len = p && n > 0 ? (size_t)n : 0;
    return *len ? p : NULL;
}

static void end(sl_db_q *q)
{
    sqlite3_finalize(q->res);
    q->res = NULL;
}

static int tx_begin(sl_cat *cat)
{
    int err = check(cat);

    return err ? err : script(cat, "BEGIN IMMEDIATE", "begin");
}

static int tx_end(sl_cat *cat, int err)
{
    sqlite3 *db = LITE(cat)->db;

    if (!err)
        err = script(cat, "COMMIT", "commit");
    /* SQLite rolls back by itself on some errors (a full disk); a failed COMMIT otherwise leaves
     * the transaction open, and every later write would join it. */
    if (err && !sqlite3_get_autocommit(db))
        script(cat, "ROLLBACK", "rollback");
    return err;
}

/* The catalog holds every checkpoint's and job's records: readable by the daemon's user only.
 * SQLite creates the file 0644 (whatever the umask allows), and its -wal and -shm files take the
 * main file's mode, so create it (or tighten an existing one) to 0600 before SQLite opens it. A
 * symlink in its place is refused. The fd stays open: sl_cat_check compares it with the path. */
static int own_file(lite *l, const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600), err = 0;
    struct stat st;

    if (fd < 0) {
        err = -errno;
        sl_log_error("catalog_open_failed", "path=%s error=\"%s\"", path, sl_strerror(err));
        return err == -ELOOP ? SL_EINVAL : err;
    }
    if (fchmod(fd, 0600) != 0 || fstat(fd, &st) != 0) {
        err = -errno;
        sl_log_error("catalog_open_failed", "path=%s error=\"chmod or stat: %s\"", path,
                     sl_strerror(err));
        close(fd);
        return err;
    }
    l->fd = fd;
    l->dev = st.st_dev;
    l->ino = st.st_ino;
    return 0;
}

/* SQLite opens the -wal and -shm files beside the catalog with O_NOFOLLOW, so a link planted at
 * either name is never followed, but the open then fails with "unable to open database file",
 * naming neither the file nor why. Refuse it first, saying which. Anything else but a regular
 * file there (a FIFO, a directory) is refused too. Only the last component is looked at: the
 * directory is the catalog's own, which own_file opened. */
static int refuse_odd_companions(const char *path)
{
    static const char *const suffixes[] = {"-wal", "-shm", "-journal"};
    char p[PATH_MAX + 16];
    struct stat st;

    for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
        snprintf(p, sizeof(p), "%s%s", path, suffixes[i]);
        if (lstat(p, &st) != 0 || S_ISREG(st.st_mode))
            continue;
        sl_log_error("catalog_open_failed",
                     "path=%s error=\"%s\" hint=\"remove it: SQLite "
                     "makes this file itself\"",
                     p,
                     S_ISLNK(st.st_mode) ? "a symbolic link (the catalog follows none)"
                                         : "not a regular file");
        return SL_EINVAL;
    }
    return 0;
}

/* The file is lost: say so once, tell the daemon (which may save a copy, sl_cat_copy), then fold
 * the WAL into the open file and empty it. SQLite does not checkpoint a moved file when it
 * closes, so its WAL would stay at the path, where SQLite would apply it to the catalog opened
 * there next: another database's pages in a restored backup. */
static void lose(sl_cat *cat)
{
    lite *l = LITE(cat);
    int rc;

    l->lost = 1;
    sl_log_error("catalog_lost",
                 "path=%s problem=\"%s\" hint=\"every write is refused and health is "
                 "NOT_SERVING: restart sluiced; files the catalog it opens does not know go to "
                 "the quarantine\"",
                 l->path, l->problem);
    if (cat->on_lost)
        cat->on_lost(l->problem, cat->on_lost_arg);
    rc = sqlite3_wal_checkpoint_v2(l->db, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
    if (rc != SQLITE_OK)
        sl_log_warn("catalog_lost_checkpoint_failed", "path=%s code=%d msg=\"%s\"", l->path, rc,
                    sqlite3_errmsg(l->db));
}

static int check(sl_cat *cat)
{
    lite *l = LITE(cat);
    struct stat held, now;
    int at_path;

    if (l->lost)
        return SL_ECATLOST;
    if (l->fd < 0 || fstat(l->fd, &held) != 0)
        return 0;
    at_path = lstat(l->path, &now) == 0;
    if (!at_path && errno != ENOENT && errno != ENOTDIR)
        return 0; /* cannot tell */
    /* The inode number of the open file is not reused while the fd holds it. */
    if (at_path && (now.st_dev != l->dev || now.st_ino != l->ino)) {
        snprintf(l->problem, sizeof(l->problem),
                 "catalog %s was replaced while sluiced ran (inode %llu opened, inode %llu at "
                 "the path now)",
                 l->path, (unsigned long long)l->ino, (unsigned long long)now.st_ino);
    } else if (held.st_nlink == 0 || !at_path) {
        snprintf(l->problem, sizeof(l->problem),
                 "catalog %s was removed while sluiced ran (inode %llu: %s)", l->path,
                 (unsigned long long)l->ino,
                 held.st_nlink == 0 ? "no link left" : "nothing at the path, moved away");
    } else {
        return 0;
    }
    lose(cat);
    return SL_ECATLOST;
}

/* The image of the open database, pages read through SQLite's pager (so with what the WAL
 * holds) in one read transaction, written to fd. sqlite3_serialize rather than VACUUM INTO: the
 * latter opens its output by path, resolving links on the way (SQLite's unix VFS does), and the
 * copy must land in the file the caller made with none followed. */
static int copy(sl_cat *cat, int fd)
{
    sqlite3 *db = LITE(cat)->db;
    sqlite3_int64 size = 0;
    unsigned char *img;
    size_t done = 0;
    int err = 0;

    img = sqlite3_serialize(db, "main", &size, 0);
    if (!img) {
        sl_db_count_error(cat);
        sl_log_error("catalog_copy_failed", "code=%d msg=\"%s\"", sqlite3_extended_errcode(db),
                     sqlite3_errmsg(db));
        return SL_EDB;
    }
    while (done < (size_t)size && !err) {
        ssize_t n = write(fd, img + done, (size_t)size - done);
        if (n > 0)
            done += (size_t)n;
        else if (n < 0 && errno != EINTR)
            err = -errno;
        else if (n == 0)
            err = -EIO;
    }
    sqlite3_free(img);
    if (err)
        sl_log_error("catalog_copy_failed", "bytes=%lld error=\"%s\"", (long long)size,
                     sl_strerror(err));
    return err;
}

static const char *problem(const sl_cat *cat)
{
    const lite *l = cat->conn;

    return l->lost ? l->problem : NULL;
}

static void describe(const sl_cat *cat, char *buf, size_t len)
{
    snprintf(buf, len, "sqlite:%s", ((const lite *)cat->conn)->path);
}

static void lite_close(sl_cat *cat)
{
    lite *l = LITE(cat);

    if (!l)
        return;
    sqlite3_close(l->db);
    /* After SQLite's own fds: closing any fd of a file drops the process's POSIX locks on it. */
    if (l->fd >= 0)
        close(l->fd);
    free(l);
    cat->conn = NULL;
}

const sl_db_engine sl_db_sqlite = {
    .name = "sqlite",
    .migrations = migrations,
    .n_migrations = (int)(sizeof(migrations) / sizeof(migrations[0])),
    .migrate_lock = NULL, /* BEGIN IMMEDIATE takes the file's write lock */
    .name_lock = NULL,
    .script = script,
    .run = run,
    .next = next,
    .isnull = isnull,
    .int64 = int64,
    .text = text,
    .blob = blob,
    .end = end,
    .tx_begin = tx_begin,
    .tx_end = tx_end,
    .check = check,
    .copy = copy,
    .problem = problem,
    .describe = describe,
    .close = lite_close,
};

/* sl_now_ms(): the catalog's clock, which for a file only this daemon opens is its own. */
static void fn_now_ms(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    (void)argv;
    sqlite3_result_int64(ctx, sl_now_ms());
}

/* sl_lease_generation(): never the same number twice in this file's life. Upload leases are
 * taken only on a shared catalog (PostgreSQL, a sequence); here the function exists so that the
 * statements are the same, counting on from the clock in microseconds: a restarted daemon
 * starts above what it gave before. */
static void fn_lease_generation(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    lite *l = sqlite3_user_data(ctx);
    int64_t now = sl_now_ms() * 1000;

    (void)argc;
    (void)argv;
    l->lease_gen = now > l->lease_gen ? now : l->lease_gen + 1;
    sqlite3_result_int64(ctx, l->lease_gen);
}

static int sqlite_functions(lite *l)
{
    int rc =
        sqlite3_create_function(l->db, "sl_now_ms", 0, SQLITE_UTF8, NULL, fn_now_ms, NULL, NULL);

    if (rc == SQLITE_OK)
        rc = sqlite3_create_function(l->db, "sl_lease_generation", 0, SQLITE_UTF8, l,
                                     fn_lease_generation, NULL, NULL);
    if (rc != SQLITE_OK) {
        sl_log_error("catalog_open_failed", "path=%s msg=\"%s\"", l->path, sqlite3_errmsg(l->db));
        return SL_EDB;
    }
    return 0;
}

int sl_db_sqlite_open(sl_cat *cat, const char *path)
{
    lite *l = calloc(1, sizeof(*l));
    int rc, err;

    if (!l)
        return -ENOMEM;
    l->fd = -1;
    cat->conn = l;
    if (strlen(path) >= sizeof(l->path))
        return -ENAMETOOLONG;
    snprintf(l->path, sizeof(l->path), "%s", path);
    if ((err = own_file(l, path)) != 0 || (err = refuse_odd_companions(path)) != 0)
        return err;
    rc = sqlite3_open_v2(path, &l->db,
                         SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        sl_log_error("catalog_open_failed", "path=%s msg=\"%s\"", path,
                     l->db ? sqlite3_errmsg(l->db) : sqlite3_errstr(rc));
        return SL_EDB;
    }
    sqlite3_busy_timeout(l->db, 5000);
    if ((err = sqlite_functions(l)) != 0)
        return err;
    return script(cat, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;",
                  "pragmas");
}
