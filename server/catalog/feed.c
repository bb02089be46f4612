/* Feeding-service queries. Statements are prepared per call except progress updates, which are
 * the only frequent write (one per rank report); SQLite's prepare is a few microseconds, far below
 * the fsync every committed write costs anyway. */
#include "feed.h"

#include "internal.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Run a prepared write; maps constraint failures to `constraint_err`. */
static int run(sl_cat *cat, sqlite3_stmt *st, const char *op, int constraint_err)
{
    int rc = sqlite3_step(st);

    if (rc == SQLITE_DONE || rc == SQLITE_ROW)
        return 0;
    if ((rc & 0xff) == SQLITE_CONSTRAINT && constraint_err)
        return constraint_err;
    return sl_cat_fail(cat, op);
}

static int exec_sql(sl_cat *cat, const char *sql, const char *op)
{
    if (sqlite3_exec(cat->db, sql, NULL, NULL, NULL) != SQLITE_OK)
        return sl_cat_fail(cat, op);
    return 0;
}

/* End a failed transaction. SQLite may have rolled it back already (it does on some I/O errors
 * and a full disk); a COMMIT that failed otherwise leaves it open, and every later write would
 * join it and never be committed. */
static void rollback(sl_cat *cat)
{
    if (!sqlite3_get_autocommit(cat->db))
        exec_sql(cat, "ROLLBACK", "rollback");
}

#define DATASET_COLS                                                                               \
    "SELECT d.name, d.samples, d.lengths_sha256, d.created_ms, "                                   \
    "(SELECT count(*) FROM feed_jobs j WHERE j.dataset = d.name), d.labels_sha256, d.classes "     \
    "FROM feed_datasets d "

static void read_dataset(sl_cat_dataset *out, sqlite3_stmt *st)
{
    memset(out, 0, sizeof(*out));
    sl_cat_copy_col(out->name, sizeof(out->name), st, 0);
    out->samples = (uint64_t)sqlite3_column_int64(st, 1);
    sl_cat_copy_col(out->lengths_sha256, sizeof(out->lengths_sha256), st, 2);
    out->has_lengths = out->lengths_sha256[0] != '\0';
    out->created_ms = sqlite3_column_int64(st, 3);
    out->jobs = (uint32_t)sqlite3_column_int64(st, 4);
    sl_cat_copy_col(out->labels_sha256, sizeof(out->labels_sha256), st, 5);
    out->has_labels = out->labels_sha256[0] != '\0';
    out->classes = (uint32_t)sqlite3_column_int64(st, 6);
}

int sl_cat_dataset_create(sl_cat *cat, const char *name, uint64_t samples, int64_t now_ms)
{
    sqlite3_stmt *st = NULL;
    int err = sl_cat_prepare(
        cat, &st, "INSERT INTO feed_datasets(name, samples, created_ms) VALUES (?1, ?2, ?3)",
        "dataset_create");

    if (err)
        return err;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (int64_t)samples);
    sqlite3_bind_int64(st, 3, now_ms);
    err = run(cat, st, "dataset_create", SL_EEXIST);
    sqlite3_finalize(st);
    return err;
}

int sl_cat_dataset_get(sl_cat *cat, sl_cat_dataset *out, const char *name)
{
    sqlite3_stmt *st = NULL;
    int rc, err = sl_cat_prepare(cat, &st, DATASET_COLS "WHERE d.name = ?1", "dataset_get");

    if (err)
        return err;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        read_dataset(out, st);
    else
        err = rc == SQLITE_DONE ? SL_ENOTFOUND : sl_cat_fail(cat, "dataset_get");
    sqlite3_finalize(st);
    return err;
}

int sl_cat_dataset_list(sl_cat *cat, int (*fn)(const sl_cat_dataset *d, void *arg), void *arg)
{
    sqlite3_stmt *st = NULL;
    sl_cat_dataset d;
    int rc, err = sl_cat_prepare(cat, &st, DATASET_COLS "ORDER BY d.name", "dataset_list");

    if (err)
        return err;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        read_dataset(&d, st);
        if ((err = fn(&d, arg)) != 0)
            break;
    }
    if (!err && rc != SQLITE_DONE)
        err = sl_cat_fail(cat, "dataset_list");
    sqlite3_finalize(st);
    return err;
}

int sl_cat_dataset_set_lengths(sl_cat *cat, const char *name, const char *sha256)
{
    sqlite3_stmt *st = NULL;
    int err =
        sl_cat_prepare(cat, &st, "UPDATE feed_datasets SET lengths_sha256 = ?2 WHERE name = ?1",
                       "dataset_set_lengths");

    if (err)
        return err;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, sha256, -1, SQLITE_STATIC);
    err = run(cat, st, "dataset_set_lengths", 0);
    if (!err && sqlite3_changes(cat->db) == 0)
        err = SL_ENOTFOUND;
    sqlite3_finalize(st);
    return err;
}

int sl_cat_dataset_set_labels(sl_cat *cat, const char *name, const char *sha256, uint32_t classes)
{
    sqlite3_stmt *st = NULL;
    int err = sl_cat_prepare(
        cat, &st, "UPDATE feed_datasets SET labels_sha256 = ?2, classes = ?3 WHERE name = ?1",
        "dataset_set_labels");

    if (err)
        return err;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, sha256, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, classes);
    err = run(cat, st, "dataset_set_labels", 0);
    if (!err && sqlite3_changes(cat->db) == 0)
        err = SL_ENOTFOUND;
    sqlite3_finalize(st);
    return err;
}

int sl_cat_dataset_delete(sl_cat *cat, const char *name)
{
    sqlite3_stmt *st = NULL;
    int err =
        sl_cat_prepare(cat, &st, "DELETE FROM feed_datasets WHERE name = ?1", "dataset_delete");

    if (err)
        return err;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    /* The jobs' foreign key refuses the delete while a job refers to the dataset. */
    err = run(cat, st, "dataset_delete", SL_ESTATE);
    if (!err && sqlite3_changes(cat->db) == 0)
        err = SL_ENOTFOUND;
    sqlite3_finalize(st);
    return err;
}

int sl_cat_job_create(sl_cat *cat, const sl_cat_job *job)
{
    sqlite3_stmt *st = NULL;
    sl_cat_dataset d;
    int err = sl_cat_dataset_get(cat, &d, job->dataset);

    if (err)
        return err;
    err =
        sl_cat_prepare(cat, &st,
                       "INSERT INTO feed_jobs(name, dataset, spec, world_size, epoch, created_ms) "
                       "VALUES (?1, ?2, ?3, ?4, 0, ?5)",
                       "job_create");
    if (err)
        return err;
    sqlite3_bind_text(st, 1, job->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, job->dataset, -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 3, job->spec, (int)job->spec_len, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, job->world_size);
    sqlite3_bind_int64(st, 5, job->created_ms);
    err = run(cat, st, "job_create", SL_EEXIST);
    sqlite3_finalize(st);
    return err;
}

int sl_cat_job_list(sl_cat *cat, int (*fn)(const sl_cat_job *j, void *arg), void *arg)
{
    sqlite3_stmt *st = NULL;
    sl_cat_job j;
    int rc,
        err = sl_cat_prepare(cat, &st,
                             "SELECT name, dataset, spec, world_size, epoch, elastic, created_ms "
                             "FROM feed_jobs ORDER BY name",
                             "job_list");

    if (err)
        return err;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        memset(&j, 0, sizeof(j));
        j.name = (const char *)sqlite3_column_text(st, 0);
        j.dataset = (const char *)sqlite3_column_text(st, 1);
        j.spec = sqlite3_column_blob(st, 2);
        j.spec_len = (size_t)sqlite3_column_bytes(st, 2);
        j.world_size = (uint32_t)sqlite3_column_int64(st, 3);
        j.epoch = (uint64_t)sqlite3_column_int64(st, 4);
        j.elastic = sqlite3_column_blob(st, 5);
        j.elastic_len = (size_t)sqlite3_column_bytes(st, 5);
        j.created_ms = sqlite3_column_int64(st, 6);
        if (!j.name || !j.dataset)
            continue;
        if ((err = fn(&j, arg)) != 0)
            break;
    }
    if (!err && rc != SQLITE_DONE)
        err = sl_cat_fail(cat, "job_list");
    sqlite3_finalize(st);
    return err;
}

int sl_cat_job_delete(sl_cat *cat, const char *name)
{
    sqlite3_stmt *st = NULL;
    int err = sl_cat_prepare(cat, &st, "DELETE FROM feed_jobs WHERE name = ?1", "job_delete");

    if (err)
        return err;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    err = run(cat, st, "job_delete", 0);
    if (!err && sqlite3_changes(cat->db) == 0)
        err = SL_ENOTFOUND;
    sqlite3_finalize(st);
    return err;
}

/* Keep the job's current epoch, spec and elastic state in feed_epochs (replacing the row of
 * that epoch), and forget epochs more than FEED_EPOCHS_KEPT older. */
#define FEED_EPOCHS_KEPT 64

static int record_epoch(sl_cat *cat, const char *name, const char *op)
{
    sqlite3_stmt *st = NULL;
    int err = sl_cat_prepare(cat, &st,
                             "INSERT OR REPLACE INTO feed_epochs(job, epoch, spec, world_size, "
                             "elastic) SELECT name, epoch, spec, world_size, elastic FROM "
                             "feed_jobs WHERE name = ?1",
                             op);

    if (err)
        return err;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    err = run(cat, st, op, 0);
    sqlite3_finalize(st);
    if (err)
        return err;
    err = sl_cat_prepare(cat, &st,
                         "DELETE FROM feed_epochs WHERE job = ?1 AND epoch + ?2 < "
                         "(SELECT epoch FROM feed_jobs WHERE name = ?1)",
                         op);
    if (err)
        return err;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, FEED_EPOCHS_KEPT);
    err = run(cat, st, op, 0);
    sqlite3_finalize(st);
    return err;
}

/* Run `st` (an UPDATE of one job) and clear the job's progress, in one transaction; the epoch
 * the job leaves and the one it is in after are recorded in feed_epochs. */
static int update_and_clear(sl_cat *cat, sqlite3_stmt *st, const char *name, const char *op)
{
    sqlite3_stmt *del = NULL;
    int err = sl_cat_tx_begin(cat);

    if (err)
        return err;
    err = record_epoch(cat, name, op);
    if (!err)
        err = run(cat, st, op, 0);
    if (!err && sqlite3_changes(cat->db) == 0)
        err = SL_ENOTFOUND;
    if (!err)
        err = sl_cat_prepare(cat, &del, "DELETE FROM feed_progress WHERE job = ?1", op);
    if (!err) {
        sqlite3_bind_text(del, 1, name, -1, SQLITE_STATIC);
        err = run(cat, del, op, 0);
    }
    sqlite3_finalize(del);
    if (!err)
        err = record_epoch(cat, name, op);
    if (!err)
        err = exec_sql(cat, "COMMIT", "commit");
    if (err)
        rollback(cat);
    return err;
}

int sl_cat_job_set_epoch(sl_cat *cat, const char *name, uint64_t epoch)
{
    sqlite3_stmt *st = NULL;
    int err =
        sl_cat_prepare(cat, &st, "UPDATE feed_jobs SET epoch = ?2, elastic = NULL WHERE name = ?1",
                       "job_set_epoch");

    if (err)
        return err;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (int64_t)epoch);
    err = update_and_clear(cat, st, name, "job_set_epoch");
    sqlite3_finalize(st);
    return err;
}

int sl_cat_job_resize(sl_cat *cat, const char *name, const void *spec, size_t spec_len,
                      uint32_t world_size, const void *elastic, size_t elastic_len)
{
    sqlite3_stmt *st = NULL;
    int err = sl_cat_prepare(cat, &st,
                             "UPDATE feed_jobs SET spec = ?2, world_size = ?3, elastic = ?4 "
                             "WHERE name = ?1",
                             "job_resize");

    if (err)
        return err;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_blob(st, 2, spec, (int)spec_len, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, world_size);
    if (elastic && elastic_len)
        sqlite3_bind_blob(st, 4, elastic, (int)elastic_len, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 4);
    err = update_and_clear(cat, st, name, "job_resize");
    sqlite3_finalize(st);
    return err;
}

int sl_cat_feed_begin(sl_cat *cat)
{
    return sl_cat_tx_begin(cat);
}

int sl_cat_feed_end(sl_cat *cat, int err)
{
    if (!err)
        err = exec_sql(cat, "COMMIT", "commit");
    if (err)
        rollback(cat);
    return err;
}

int sl_cat_progress_set(sl_cat *cat, const char *job, uint32_t dp_rank, uint64_t epoch,
                        uint64_t position)
{
    sqlite3_stmt *st = NULL;
    int err = sl_cat_prepare(cat, &st,
                             "INSERT INTO feed_progress(job, dp_rank, epoch, position) "
                             "VALUES (?1, ?2, ?3, ?4) ON CONFLICT(job, dp_rank) DO UPDATE SET "
                             "position = CASE WHEN epoch = excluded.epoch "
                             "THEN max(position, excluded.position) ELSE excluded.position END, "
                             "epoch = excluded.epoch",
                             "progress_set");

    if (err)
        return err;
    sqlite3_bind_text(st, 1, job, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, dp_rank);
    sqlite3_bind_int64(st, 3, (int64_t)epoch);
    sqlite3_bind_int64(st, 4, (int64_t)position);
    /* The foreign key fails for a job that does not exist. */
    err = run(cat, st, "progress_set", SL_ENOTFOUND);
    sqlite3_finalize(st);
    return err;
}

int sl_cat_progress_list(sl_cat *cat, const char *job,
                         int (*fn)(uint32_t dp_rank, uint64_t epoch, uint64_t position, void *arg),
                         void *arg)
{
    sqlite3_stmt *st = NULL;
    int rc, err = sl_cat_prepare(
                cat, &st, "SELECT dp_rank, epoch, position FROM feed_progress WHERE job = ?1",
                "progress_list");

    if (err)
        return err;
    sqlite3_bind_text(st, 1, job, -1, SQLITE_STATIC);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        err = fn((uint32_t)sqlite3_column_int64(st, 0), (uint64_t)sqlite3_column_int64(st, 1),
                 (uint64_t)sqlite3_column_int64(st, 2), arg);
        if (err)
            break;
    }
    if (!err && rc != SQLITE_DONE)
        err = sl_cat_fail(cat, "progress_list");
    sqlite3_finalize(st);
    return err;
}

void sl_cat_blob_free(sl_cat_blob *b)
{
    free(b->p);
    b->p = NULL;
    b->len = 0;
}

int sl_cat_epoch_get(sl_cat *cat, const char *job, uint64_t epoch, sl_cat_blob *spec,
                     uint32_t *world_size, sl_cat_blob *elastic)
{
    sqlite3_stmt *st = NULL;
    int rc, err = sl_cat_prepare(cat, &st,
                                 "SELECT spec, world_size, elastic FROM feed_jobs "
                                 "WHERE name = ?1 AND epoch = ?2 UNION ALL "
                                 "SELECT spec, world_size, elastic FROM feed_epochs "
                                 "WHERE job = ?1 AND epoch = ?2 LIMIT 1",
                                 "epoch_get");

    spec->p = elastic->p = NULL;
    spec->len = elastic->len = 0;
    if (err)
        return err;
    sqlite3_bind_text(st, 1, job, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (int64_t)epoch);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *world_size = (uint32_t)sqlite3_column_int64(st, 1);
        err = sl_cat_copy_blob(spec, st, 0);
        if (!err)
            err = sl_cat_copy_blob(elastic, st, 2);
    } else {
        err = rc == SQLITE_DONE ? SL_ENOTFOUND : sl_cat_fail(cat, "epoch_get");
    }
    sqlite3_finalize(st);
    if (err) {
        sl_cat_blob_free(spec);
        sl_cat_blob_free(elastic);
    }
    return err;
}

int sl_cat_job_restore(sl_cat *cat, const char *name, const void *spec, size_t spec_len,
                       uint32_t world_size, uint64_t epoch, const void *elastic, size_t elastic_len,
                       const uint64_t *positions, uint32_t n)
{
    sqlite3_stmt *st = NULL;
    int err = sl_cat_tx_begin(cat);

    if (err)
        return err;
    err = sl_cat_prepare(cat, &st,
                         "UPDATE feed_jobs SET spec = ?2, world_size = ?3, epoch = ?4, "
                         "elastic = ?5 WHERE name = ?1",
                         "job_restore");
    if (!err) {
        sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
        sqlite3_bind_blob(st, 2, spec, (int)spec_len, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, world_size);
        sqlite3_bind_int64(st, 4, (int64_t)epoch);
        if (elastic && elastic_len)
            sqlite3_bind_blob(st, 5, elastic, (int)elastic_len, SQLITE_STATIC);
        else
            sqlite3_bind_null(st, 5);
        err = run(cat, st, "job_restore", 0);
        if (!err && sqlite3_changes(cat->db) == 0)
            err = SL_ENOTFOUND;
        sqlite3_finalize(st);
        st = NULL;
    }
    /* Progress after the restore point is discarded; the restored positions become the ranks'
     * reported progress of the epoch. Epochs after it are forgotten. */
    if (!err)
        err = sl_cat_prepare(cat, &st, "DELETE FROM feed_progress WHERE job = ?1", "job_restore");
    if (!err) {
        sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
        err = run(cat, st, "job_restore", 0);
        sqlite3_finalize(st);
        st = NULL;
    }
    if (!err)
        err = sl_cat_prepare(cat, &st, "DELETE FROM feed_epochs WHERE job = ?1 AND epoch >= ?2",
                             "job_restore");
    if (!err) {
        sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, (int64_t)epoch);
        err = run(cat, st, "job_restore", 0);
        sqlite3_finalize(st);
        st = NULL;
    }
    for (uint32_t d = 0; !err && d < n; d++)
        err = sl_cat_progress_set(cat, name, d, epoch, positions[d]);
    if (!err)
        err = record_epoch(cat, name, "job_restore");
    if (!err)
        err = exec_sql(cat, "COMMIT", "commit");
    if (err)
        rollback(cat);
    return err;
}
