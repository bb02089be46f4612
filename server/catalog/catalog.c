#include "catalog.h"

#include "internal.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
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
};

#define N_MIGRATIONS ((int)(sizeof(migrations) / sizeof(migrations[0])))

int sl_cat_code(int rc)
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

int sl_cat_fail(sl_cat *cat, const char *op)
{
    int rc = sqlite3_extended_errcode(cat->db);

    atomic_fetch_add(&cat->errors, 1);
    sl_log_error("catalog_error", "op=%s code=%d msg=\"%s\"", op, rc, sqlite3_errmsg(cat->db));
    return sl_cat_code(rc);
}

int sl_cat_prepare(sl_cat *cat, sqlite3_stmt **st, const char *sql, const char *op)
{
    int err;

    if (sqlite3_prepare_v2(cat->db, sql, -1, st, NULL) != SQLITE_OK)
        return sl_cat_fail(cat, op);
    /* Inside a transaction its BEGIN was checked. */
    if (!sqlite3_stmt_readonly(*st) && sqlite3_get_autocommit(cat->db) &&
        (err = sl_cat_check(cat)) != 0) {
        sqlite3_finalize(*st);
        *st = NULL;
        return err;
    }
    return 0;
}

int sl_cat_tx_begin(sl_cat *cat)
{
    int err = sl_cat_check(cat);

    if (err)
        return err;
    if (sqlite3_exec(cat->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
        return sl_cat_fail(cat, "begin");
    return 0;
}

int sl_cat_tx_end(sl_cat *cat, int err)
{
    if (!err && sqlite3_exec(cat->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
        err = sl_cat_fail(cat, "commit");
    /* SQLite rolls back by itself on some errors (a full disk); a failed COMMIT otherwise leaves
     * the transaction open, and every later write would join it. */
    if (err && !sqlite3_get_autocommit(cat->db) &&
        sqlite3_exec(cat->db, "ROLLBACK", NULL, NULL, NULL) != SQLITE_OK)
        sl_cat_fail(cat, "rollback");
    return err;
}

void sl_cat_copy_col(char *dst, size_t len, sqlite3_stmt *st, int col)
{
    const unsigned char *s = sqlite3_column_text(st, col);

    snprintf(dst, len, "%s", s ? (const char *)s : "");
}

int sl_cat_copy_blob(sl_cat_blob *b, sqlite3_stmt *st, int col)
{
    const void *p = sqlite3_column_blob(st, col);
    int n = sqlite3_column_bytes(st, col);

    b->p = NULL;
    b->len = 0;
    if (!p || n <= 0)
        return 0;
    if (!(b->p = malloc((size_t)n)))
        return -ENOMEM;
    memcpy(b->p, p, (size_t)n);
    b->len = (size_t)n;
    return 0;
}

unsigned long sl_cat_errors(const sl_cat *cat)
{
    return atomic_load(&((sl_cat *)cat)->errors);
}

int sl_cat_latest_version(void)
{
    return N_MIGRATIONS;
}

int sl_cat_schema_version(const sl_cat *cat)
{
    return cat->version;
}

static int exec(sl_cat *cat, const char *sql, const char *what)
{
    char *msg = NULL;
    int rc = sqlite3_exec(cat->db, sql, NULL, NULL, &msg);

    if (rc != SQLITE_OK) {
        atomic_fetch_add(&cat->errors, 1);
        sl_log_error("catalog_error", "op=%s code=%d msg=\"%s\"", what, rc,
                     msg ? msg : sqlite3_errstr(rc));
        sqlite3_free(msg);
        return SL_EDB;
    }
    return 0;
}

static int read_version(sl_cat *cat, int *version)
{
    sqlite3_stmt *st = NULL;
    int rc, err = 0;

    rc = sqlite3_prepare_v2(cat->db, "SELECT version FROM schema_version", -1, &st, NULL);
    if (rc != SQLITE_OK) {
        err = SL_EDB;
        goto out;
    }
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *version = sqlite3_column_int(st, 0);
    } else if (rc == SQLITE_DONE) {
        *version = -1;
    } else {
        err = SL_EDB;
    }
out:
    if (err) {
        atomic_fetch_add(&cat->errors, 1);
        sl_log_error("catalog_error", "op=read_version msg=\"%s\"", sqlite3_errmsg(cat->db));
    }
    sqlite3_finalize(st);
    return err;
}

/* Migrate up to schema version `target` (<= N_MIGRATIONS). */
static int migrate(sl_cat *cat, int target)
{
    char sql[64];
    int version, err;

    err = exec(cat, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
               "create_schema_version");
    if (err)
        return err;
    err = read_version(cat, &version);
    if (err)
        return err;
    if (version < 0) {
        err = exec(cat, "INSERT INTO schema_version(version) VALUES (0)", "init_version");
        if (err)
            return err;
        version = 0;
    }
    if (version > N_MIGRATIONS) {
        sl_log_error("catalog_too_new", "schema_version=%d supported=%d", version, N_MIGRATIONS);
        return SL_ESTATE;
    }
    while (version < target) {
        err = exec(cat, "BEGIN IMMEDIATE", "begin");
        if (err)
            return err;
        err = exec(cat, migrations[version], "migrate");
        if (!err) {
            snprintf(sql, sizeof(sql), "UPDATE schema_version SET version = %d", version + 1);
            err = exec(cat, sql, "set_version");
        }
        if (err) {
            exec(cat, "ROLLBACK", "rollback");
            return err;
        }
        err = exec(cat, "COMMIT", "commit");
        if (err)
            return err;
        version++;
        sl_log_info("catalog_migrated", "schema_version=%d", version);
    }
    cat->version = version;
    return 0;
}

/* The catalog holds every checkpoint's and job's records: readable by the daemon's user only.
 * SQLite creates the file 0644 (whatever the umask allows), and its -wal and -shm files take the
 * main file's mode, so create it (or tighten an existing one) to 0600 before SQLite opens it. A
 * symlink in its place is refused. The fd stays open: sl_cat_check compares it with the path. */
static int own_file(sl_cat *cat, const char *path)
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
    cat->fd = fd;
    cat->dev = st.st_dev;
    cat->ino = st.st_ino;
    return 0;
}

/* The file is lost: say so once, tell the daemon (which may save a copy, sl_cat_copy), then fold
 * the WAL into the open file and empty it. SQLite does not checkpoint a moved file when it
 * closes, so its WAL would stay at the path, where SQLite would apply it to the catalog opened
 * there next: another database's pages in a restored backup. */
static void lose(sl_cat *cat)
{
    int rc;

    cat->lost = 1;
    sl_log_error("catalog_lost",
                 "path=%s problem=\"%s\" hint=\"every write is refused and health is "
                 "NOT_SERVING: restart sluiced; files the catalog it opens does not know go to "
                 "the quarantine\"",
                 cat->path, cat->problem);
    if (cat->on_lost)
        cat->on_lost(cat->problem, cat->on_lost_arg);
    rc = sqlite3_wal_checkpoint_v2(cat->db, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
    if (rc != SQLITE_OK)
        sl_log_warn("catalog_lost_checkpoint_failed", "path=%s code=%d msg=\"%s\"", cat->path, rc,
                    sqlite3_errmsg(cat->db));
}

int sl_cat_check(sl_cat *cat)
{
    struct stat held, now;
    int at_path;

    if (cat->lost)
        return SL_ECATLOST;
    if (cat->fd < 0 || fstat(cat->fd, &held) != 0)
        return 0;
    at_path = lstat(cat->path, &now) == 0;
    if (!at_path && errno != ENOENT && errno != ENOTDIR)
        return 0; /* cannot tell */
    /* The inode number of the open file is not reused while the fd holds it. */
    if (at_path && (now.st_dev != cat->dev || now.st_ino != cat->ino)) {
        snprintf(cat->problem, sizeof(cat->problem),
                 "catalog %s was replaced while sluiced ran (inode %llu opened, inode %llu at "
                 "the path now)",
                 cat->path, (unsigned long long)cat->ino, (unsigned long long)now.st_ino);
    } else if (held.st_nlink == 0 || !at_path) {
        snprintf(cat->problem, sizeof(cat->problem),
                 "catalog %s was removed while sluiced ran (inode %llu: %s)", cat->path,
                 (unsigned long long)cat->ino,
                 held.st_nlink == 0 ? "no link left" : "nothing at the path, moved away");
    } else {
        return 0;
    }
    lose(cat);
    return SL_ECATLOST;
}

int sl_cat_copy(sl_cat *cat, const char *path)
{
    sqlite3_stmt *st = NULL;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600), rc;

    /* Made empty and 0600 first: VACUUM INTO writes into an empty file, and would create one
     * readable by everyone the umask lets read. */
    if (fd < 0) {
        int err = -errno;
        sl_log_error("catalog_copy_failed", "path=%s error=\"%s\"", path, sl_strerror(err));
        return err;
    }
    close(fd);
    rc = sqlite3_prepare_v2(cat->db, "VACUUM INTO ?1", -1, &st, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(st, 1, path, -1, SQLITE_STATIC);
        rc = sqlite3_step(st);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK && rc != SQLITE_DONE) {
        atomic_fetch_add(&cat->errors, 1);
        sl_log_error("catalog_copy_failed", "path=%s code=%d msg=\"%s\"", path, rc,
                     sqlite3_errmsg(cat->db));
        unlink(path); /* the half-written copy this call made */
        return SL_EDB;
    }
    return 0;
}

const char *sl_cat_problem(const sl_cat *cat)
{
    return cat->lost ? cat->problem : NULL;
}

void sl_cat_on_lost(sl_cat *cat, sl_cat_lost_fn fn, void *arg)
{
    cat->on_lost = fn;
    cat->on_lost_arg = arg;
}

int sl_cat_open(sl_cat **out, const char *path)
{
    return sl_cat_open_upto(out, path, N_MIGRATIONS);
}

int sl_cat_open_upto(sl_cat **out, const char *path, int version)
{
    sl_cat *cat = calloc(1, sizeof(*cat));
    int rc, err = 0;

    *out = NULL;
    if (!cat)
        return -ENOMEM;
    cat->fd = -1;
    if (strlen(path) >= sizeof(cat->path)) {
        err = -ENAMETOOLONG;
        goto out;
    }
    snprintf(cat->path, sizeof(cat->path), "%s", path);
    if ((err = own_file(cat, path)) != 0)
        goto out;
    rc = sqlite3_open_v2(path, &cat->db,
                         SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        sl_log_error("catalog_open_failed", "path=%s msg=\"%s\"", path,
                     cat->db ? sqlite3_errmsg(cat->db) : sqlite3_errstr(rc));
        err = SL_EDB;
        goto out;
    }
    sqlite3_busy_timeout(cat->db, 5000);
    err = exec(cat, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;",
               "pragmas");
    if (err)
        goto out;
    err = version < 0 || version > N_MIGRATIONS ? SL_EINVAL : migrate(cat, version);
out:
    if (err) {
        sl_cat_close(cat);
        return err;
    }
    *out = cat;
    return 0;
}

void sl_cat_close(sl_cat *cat)
{
    if (!cat)
        return;
    sqlite3_close(cat->db);
    /* After SQLite's own fds: closing any fd of a file drops the process's POSIX locks on it. */
    if (cat->fd >= 0)
        close(cat->fd);
    free(cat);
}
