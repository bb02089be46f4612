/* Feeding-service queries (engine-neutral, db.h). */
#include "feed.h"

#include "internal.h"

#include "err.h"
#include "util/buf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DATASET_COLS                                                                               \
    "SELECT d.name, d.samples, d.lengths_sha256, d.created_ms, "                                   \
    "(SELECT count(*) FROM feed_jobs j WHERE j.dataset = d.name), d.labels_sha256, d.classes "     \
    "FROM feed_datasets d "

static void read_dataset(sl_cat_dataset *out, sl_db_q *q)
{
    memset(out, 0, sizeof(*out));
    sl_db_copy_text(q, 0, out->name, sizeof(out->name));
    out->samples = (uint64_t)sl_db_int_col(q, 1);
    sl_db_copy_text(q, 2, out->lengths_sha256, sizeof(out->lengths_sha256));
    out->has_lengths = out->lengths_sha256[0] != '\0';
    out->created_ms = sl_db_int_col(q, 3);
    out->jobs = (uint32_t)sl_db_int_col(q, 4);
    sl_db_copy_text(q, 5, out->labels_sha256, sizeof(out->labels_sha256));
    out->has_labels = out->labels_sha256[0] != '\0';
    out->classes = (uint32_t)sl_db_int_col(q, 6);
}

int sl_cat_dataset_create(sl_cat *cat, const char *name, uint64_t samples, int64_t now_ms)
{
    char other[SL_CAT_FEED_NAME_MAX + 1];
    sl_db_q q;
    int err = sl_db_tx_begin(cat);

    if (err)
        return err;
    if ((err = sl_cat_name_clash(cat, SL_CAT_NAME_DATASET, NULL, name, other, sizeof(other))) ==
        0) {
        sl_db_q_init(&q, cat, "dataset_create");
        sl_db_text(&q, name);
        sl_db_int(&q, (int64_t)samples);
        sl_db_int(&q, now_ms);
        err = sl_db_exec(&q,
                         "INSERT INTO feed_datasets(name, samples, created_ms) VALUES (?1, ?2, ?3)",
                         SL_EEXIST, NULL);
    }
    return sl_db_tx_end(cat, err);
}

int sl_cat_dataset_get(sl_cat *cat, sl_cat_dataset *out, const char *name)
{
    sl_db_q q;
    int rc, err;

    sl_db_q_init(&q, cat, "dataset_get");
    sl_db_text(&q, name);
    err = sl_db_run(&q, DATASET_COLS "WHERE d.name = ?1", 0);
    if (!err) {
        rc = sl_db_next(&q);
        if (rc == 1)
            read_dataset(out, &q);
        err = rc == 1 ? 0 : rc == 0 ? SL_ENOTFOUND : rc;
    }
    sl_db_end(&q);
    return err;
}

int sl_cat_dataset_list(sl_cat *cat, int (*fn)(const sl_cat_dataset *d, void *arg), void *arg)
{
    sl_db_q q;
    sl_cat_dataset d;
    int rc = 0, err;

    sl_db_q_init(&q, cat, "dataset_list");
    err = sl_db_run(&q, DATASET_COLS "ORDER BY d.name", 0);
    while (!err && (rc = sl_db_next(&q)) == 1) {
        read_dataset(&d, &q);
        err = fn(&d, arg);
    }
    sl_db_end(&q);
    return err ? err : rc;
}

/* Run a write of one dataset's row: SL_ENOTFOUND when it changed none. */
static int dataset_write(sl_db_q *q, const char *sql, int constraint_err)
{
    int64_t changes = 0;
    int err = sl_db_exec(q, sql, constraint_err, &changes);

    return !err && changes == 0 ? SL_ENOTFOUND : err;
}

int sl_cat_dataset_set_lengths(sl_cat *cat, const char *name, const char *sha256)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "dataset_set_lengths");
    sl_db_text(&q, name);
    sl_db_text(&q, sha256);
    return dataset_write(&q, "UPDATE feed_datasets SET lengths_sha256 = ?2 WHERE name = ?1", 0);
}

int sl_cat_dataset_set_labels(sl_cat *cat, const char *name, const char *sha256, uint32_t classes)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "dataset_set_labels");
    sl_db_text(&q, name);
    sl_db_text(&q, sha256);
    sl_db_int(&q, classes);
    return dataset_write(
        &q, "UPDATE feed_datasets SET labels_sha256 = ?2, classes = ?3 WHERE name = ?1", 0);
}

int sl_cat_dataset_delete(sl_cat *cat, const char *name)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "dataset_delete");
    sl_db_text(&q, name);
    /* The jobs' foreign key refuses the delete while a job refers to the dataset. */
    return dataset_write(&q, "DELETE FROM feed_datasets WHERE name = ?1", SL_ESTATE);
}

/* The job's row, its dataset and its name checked first. */
static int job_insert(sl_cat *cat, const sl_cat_job *job)
{
    char other[SL_CAT_FEED_NAME_MAX + 1];
    sl_cat_dataset d;
    sl_db_q q;
    int err = sl_cat_dataset_get(cat, &d, job->dataset);

    if (!err)
        err = sl_cat_name_clash(cat, SL_CAT_NAME_JOB, NULL, job->name, other, sizeof(other));
    if (err)
        return err;
    sl_db_q_init(&q, cat, "job_create");
    sl_db_text(&q, job->name);
    sl_db_text(&q, job->dataset);
    sl_db_blob(&q, job->spec, job->spec_len);
    sl_db_int(&q, job->world_size);
    sl_db_int(&q, job->created_ms);
    sl_db_int(&q, (int64_t)job->version);
    return sl_db_exec(&q,
                      "INSERT INTO feed_jobs(name, dataset, spec, world_size, epoch, created_ms, "
                      "version) VALUES (?1, ?2, ?3, ?4, 0, ?5, ?6)",
                      SL_EEXIST, NULL);
}

int sl_cat_job_create(sl_cat *cat, const sl_cat_job *job)
{
    int err = sl_db_tx_begin(cat);

    if (err)
        return err;
    err = job_insert(cat, job);
    if (!err)
        err = sl_db_announce(cat, 'j', job->name);
    return sl_db_tx_end(cat, err);
}

/* Call fn for each job row `q` (run with JOB_COLS) yields; *rows counts them. */
#define JOB_COLS                                                                                   \
    "SELECT name, dataset, spec, world_size, epoch, elastic, created_ms, version FROM feed_jobs "

static int job_rows(sl_db_q *q, int (*fn)(const sl_cat_job *j, void *arg), void *arg, int *rows)
{
    sl_cat_job j;
    int rc = 0, err = 0;

    *rows = 0;
    while (!err && (rc = sl_db_next(q)) == 1) {
        memset(&j, 0, sizeof(j));
        j.name = sl_db_text_col(q, 0);
        j.dataset = sl_db_text_col(q, 1);
        j.spec = sl_db_blob_col(q, 2, &j.spec_len);
        j.world_size = (uint32_t)sl_db_int_col(q, 3);
        j.epoch = (uint64_t)sl_db_int_col(q, 4);
        j.elastic = sl_db_blob_col(q, 5, &j.elastic_len);
        j.created_ms = sl_db_int_col(q, 6);
        j.version = (uint64_t)sl_db_int_col(q, 7);
        (*rows)++;
        if (j.name && j.dataset)
            err = fn(&j, arg);
    }
    return err ? err : rc;
}

int sl_cat_job_list(sl_cat *cat, int (*fn)(const sl_cat_job *j, void *arg), void *arg)
{
    sl_db_q q;
    int rows, err;

    sl_db_q_init(&q, cat, "job_list");
    err = sl_db_run(&q, JOB_COLS "ORDER BY name", 0);
    if (!err)
        err = job_rows(&q, fn, arg, &rows);
    sl_db_end(&q);
    return err;
}

int sl_cat_job_get(sl_cat *cat, const char *name, int (*fn)(const sl_cat_job *j, void *arg),
                   void *arg)
{
    sl_db_q q;
    int rows = 0, err;

    sl_db_q_init(&q, cat, "job_get");
    sl_db_text(&q, name);
    err = sl_db_run(&q, JOB_COLS "WHERE name = ?1", 0);
    if (!err)
        err = job_rows(&q, fn, arg, &rows);
    sl_db_end(&q);
    return err ? err : rows ? 0 : SL_ENOTFOUND;
}

int sl_cat_job_progress(sl_cat *cat, const char *name, uint64_t *version, uint64_t *epoch,
                        int (*fn)(uint32_t dp_rank, uint64_t epoch, uint64_t position, void *arg),
                        void *arg)
{
    sl_db_q q;
    int rc = 0, rows = 0, err;

    sl_db_q_init(&q, cat, "job_progress");
    sl_db_text(&q, name);
    err = sl_db_run(&q,
                    "SELECT j.version, j.epoch, p.dp_rank, p.epoch, p.position FROM feed_jobs j "
                    "LEFT JOIN feed_progress p ON p.job = j.name WHERE j.name = ?1",
                    0);
    while (!err && (rc = sl_db_next(&q)) == 1) {
        *version = (uint64_t)sl_db_int_col(&q, 0);
        *epoch = (uint64_t)sl_db_int_col(&q, 1);
        rows++;
        if (!sl_db_isnull(&q, 2))
            err = fn((uint32_t)sl_db_int_col(&q, 2), (uint64_t)sl_db_int_col(&q, 3),
                     (uint64_t)sl_db_int_col(&q, 4), arg);
    }
    if (!err && rc < 0)
        err = rc;
    sl_db_end(&q);
    return err ? err : rows ? 0 : SL_ENOTFOUND;
}

int sl_cat_job_delete(sl_cat *cat, const char *name)
{
    sl_db_q q;

    int err;

    sl_db_q_init(&q, cat, "job_delete");
    sl_db_text(&q, name);
    err = dataset_write(&q, "DELETE FROM feed_jobs WHERE name = ?1", 0);
    return err ? err : sl_db_announce(cat, 'j', name);
}

/* Keep the job's current epoch, spec and elastic state in feed_epochs (replacing the row of
 * that epoch), and forget epochs more than FEED_EPOCHS_KEPT older. */
#define FEED_EPOCHS_KEPT 64

static int record_epoch(sl_cat *cat, const char *name, const char *op)
{
    sl_db_q q;
    int err;

    sl_db_q_init(&q, cat, op);
    sl_db_text(&q, name);
    err = sl_db_exec(&q,
                     "INSERT INTO feed_epochs(job, epoch, spec, world_size, elastic) "
                     "SELECT name, epoch, spec, world_size, elastic FROM feed_jobs WHERE name = ?1 "
                     "ON CONFLICT (job, epoch) DO UPDATE SET spec = excluded.spec, "
                     "world_size = excluded.world_size, elastic = excluded.elastic",
                     0, NULL);
    if (err)
        return err;
    sl_db_q_init(&q, cat, op);
    sl_db_text(&q, name);
    sl_db_int(&q, FEED_EPOCHS_KEPT);
    return sl_db_exec(&q,
                      "DELETE FROM feed_epochs WHERE job = ?1 AND epoch + ?2 < "
                      "(SELECT epoch FROM feed_jobs WHERE name = ?1)",
                      0, NULL);
}

static int clear_progress(sl_cat *cat, const char *name, const char *op)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, op);
    sl_db_text(&q, name);
    return sl_db_exec(&q, "DELETE FROM feed_progress WHERE job = ?1", 0, NULL);
}

/* The job's version into *version (NULL: nothing). */
static int read_version(sl_cat *cat, const char *name, uint64_t *version)
{
    sl_db_q q;
    int rc, err;

    if (!version)
        return 0;
    sl_db_q_init(&q, cat, "job_version");
    sl_db_text(&q, name);
    err = sl_db_run(&q, "SELECT version FROM feed_jobs WHERE name = ?1", 0);
    if (!err) {
        rc = sl_db_next(&q);
        if (rc == 1)
            *version = (uint64_t)sl_db_int_col(&q, 0);
        err = rc == 1 ? 0 : rc == 0 ? SL_ENOTFOUND : rc;
    }
    sl_db_end(&q);
    return err;
}

/* 1 if the job exists. */
static int job_exists(sl_cat *cat, const char *name)
{
    uint64_t v;

    return read_version(cat, name, &v) == 0;
}

/* Run `q` (an UPDATE of one job, its parameters bound) and clear the job's progress, in one
 * transaction; the epoch the job leaves and the one it is in after are recorded in feed_epochs,
 * the job's version read back into *version (may be NULL), the other replicas told. An UPDATE
 * that changed nothing returns `unchanged` (SL_ENOTFOUND when the job is gone). */
static int update_and_clear(sl_db_q *q, const char *sql, const char *name, int unchanged,
                            uint64_t *version)
{
    int64_t changes = 0;
    sl_cat *cat = q->cat;
    int err = sl_db_tx_begin(cat);

    if (err)
        return err;
    err = record_epoch(cat, name, q->op);
    if (!err)
        err = sl_db_exec(q, sql, 0, &changes);
    if (!err && changes == 0)
        err = job_exists(cat, name) ? unchanged : SL_ENOTFOUND;
    if (!err)
        err = clear_progress(cat, name, q->op);
    if (!err)
        err = record_epoch(cat, name, q->op);
    if (!err)
        err = read_version(cat, name, version);
    if (!err)
        err = sl_db_announce(cat, 'j', name);
    return sl_db_tx_end(cat, err);
}

int sl_cat_job_set_epoch(sl_cat *cat, const char *name, uint64_t from, uint64_t epoch)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "job_set_epoch");
    sl_db_text(&q, name);
    sl_db_int(&q, (int64_t)epoch);
    sl_db_int(&q, (int64_t)from);
    /* The row lock the UPDATE takes makes racing replicas wait; the first one's commit makes
     * the others' `epoch = ?3` false. */
    return update_and_clear(
        &q, "UPDATE feed_jobs SET epoch = ?2, elastic = NULL WHERE name = ?1 AND epoch = ?3", name,
        SL_ESTATE, NULL);
}

int sl_cat_job_resize(sl_cat *cat, const char *name, const void *spec, size_t spec_len,
                      uint32_t world_size, const void *elastic, size_t elastic_len,
                      uint64_t *version)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "job_resize");
    sl_db_text(&q, name);
    sl_db_blob(&q, spec, spec_len);
    sl_db_int(&q, world_size);
    sl_db_blob_opt(&q, elastic, elastic_len);
    return update_and_clear(&q,
                            "UPDATE feed_jobs SET spec = ?2, world_size = ?3, elastic = ?4, "
                            "version = version + 1 WHERE name = ?1",
                            name, SL_ENOTFOUND, version);
}

int sl_cat_feed_begin(sl_cat *cat)
{
    return sl_db_tx_begin(cat);
}

int sl_cat_feed_end(sl_cat *cat, int err)
{
    return sl_db_tx_end(cat, err);
}

/* One upsert over a VALUES list of (dp_rank, epoch, position): integers written into the
 * statement (column1..3 in both engines), the job its one parameter. A row is taken only for the
 * job's current epoch; a lower position of the same epoch never replaces a higher one. */
#define PUT_ROWS 256

static int progress_put(sl_cat *cat, const char *job, const sl_cat_progress *rows, size_t n,
                        int64_t *changed)
{
    int64_t changes;
    sl_buf sql;
    sl_db_q q;
    int err = 0;

    *changed = 0;
    sl_buf_init(&sql, SIZE_MAX);
    for (size_t at = 0; !err && at < n; at += PUT_ROWS) {
        size_t end = n - at > PUT_ROWS ? at + PUT_ROWS : n;
        sl_buf_setlen(&sql, 0);
        err = sl_buf_printf(&sql, "INSERT INTO feed_progress(job, dp_rank, epoch, position) "
                                  "SELECT ?1, v.column1, v.column2, v.column3 FROM (VALUES ");
        for (size_t i = at; !err && i < end; i++)
            err = sl_buf_printf(&sql, "%s(%u, %llu, %llu)", i > at ? ", " : "", rows[i].dp_rank,
                                (unsigned long long)rows[i].epoch,
                                (unsigned long long)rows[i].position);
        if (!err)
            err = sl_buf_printf(
                &sql, ") AS v WHERE EXISTS (SELECT 1 FROM feed_jobs WHERE name = ?1 AND "
                      "epoch = v.column2) ON CONFLICT (job, dp_rank) DO UPDATE SET "
                      "position = CASE WHEN feed_progress.epoch = excluded.epoch AND "
                      "feed_progress.position > excluded.position THEN feed_progress.position "
                      "ELSE excluded.position END, epoch = excluded.epoch");
        if (err)
            break;
        sl_db_q_init(&q, cat, "progress_put");
        sl_db_text(&q, job);
        err = sl_db_exec(&q, (const char *)sql.p, 0, &changes);
        *changed += changes;
    }
    sl_buf_free(&sql);
    return err;
}

static int by_rank(const void *a, const void *b)
{
    const sl_cat_progress *x = a, *y = b;

    if (x->dp_rank != y->dp_rank)
        return x->dp_rank < y->dp_rank ? -1 : 1;
    if (x->epoch != y->epoch)
        return x->epoch < y->epoch ? -1 : 1;
    return x->position < y->position ? -1 : x->position > y->position;
}

int sl_cat_progress_put(sl_cat *cat, const char *job, const sl_cat_progress *rows, size_t n)
{
    sl_cat_progress *v = n ? malloc(n * sizeof(*v)) : NULL;
    size_t m = 0;
    int64_t changed;
    int err;

    if (!n)
        return 0;
    if (!v)
        return -ENOMEM;
    /* One row per dp rank (its latest epoch, highest position): a statement may not change a
     * row twice (PostgreSQL refuses it), and two reports of one rank can share a group. */
    memcpy(v, rows, n * sizeof(*v));
    qsort(v, n, sizeof(*v), by_rank);
    for (size_t i = 0; i < n; i++) {
        if (m && v[m - 1].dp_rank == v[i].dp_rank)
            m--;
        v[m++] = v[i];
    }
    err = progress_put(cat, job, v, m, &changed);
    free(v);
    return err;
}

int sl_cat_progress_set(sl_cat *cat, const char *job, uint32_t dp_rank, uint64_t epoch,
                        uint64_t position)
{
    sl_cat_progress row = {dp_rank, epoch, position};
    int64_t changed;
    int err = progress_put(cat, job, &row, 1, &changed);

    /* No row taken: the job does not exist (SL_ENOTFOUND), or it is in another epoch. */
    return !err && changed == 0 && !job_exists(cat, job) ? SL_ENOTFOUND : err;
}

int sl_cat_progress_announce(sl_cat *cat, const char *job)
{
    return sl_db_announce(cat, 'p', job);
}

int sl_cat_progress_list(sl_cat *cat, const char *job,
                         int (*fn)(uint32_t dp_rank, uint64_t epoch, uint64_t position, void *arg),
                         void *arg)
{
    sl_db_q q;
    int rc = 0, err;

    sl_db_q_init(&q, cat, "progress_list");
    sl_db_text(&q, job);
    err = sl_db_run(&q, "SELECT dp_rank, epoch, position FROM feed_progress WHERE job = ?1", 0);
    while (!err && (rc = sl_db_next(&q)) == 1)
        err = fn((uint32_t)sl_db_int_col(&q, 0), (uint64_t)sl_db_int_col(&q, 1),
                 (uint64_t)sl_db_int_col(&q, 2), arg);
    sl_db_end(&q);
    return err ? err : rc;
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
    sl_db_q q;
    int rc, err;

    spec->p = elastic->p = NULL;
    spec->len = elastic->len = 0;
    sl_db_q_init(&q, cat, "epoch_get");
    sl_db_text(&q, job);
    sl_db_int(&q, (int64_t)epoch);
    err = sl_db_run(&q,
                    "SELECT spec, world_size, elastic FROM feed_jobs "
                    "WHERE name = ?1 AND epoch = ?2 UNION ALL "
                    "SELECT spec, world_size, elastic FROM feed_epochs "
                    "WHERE job = ?1 AND epoch = ?2 LIMIT 1",
                    0);
    if (!err) {
        rc = sl_db_next(&q);
        if (rc == 1) {
            *world_size = (uint32_t)sl_db_int_col(&q, 1);
            err = sl_db_copy_blob(&q, 0, spec);
            if (!err)
                err = sl_db_copy_blob(&q, 2, elastic);
        } else {
            err = rc == 0 ? SL_ENOTFOUND : rc;
        }
    }
    sl_db_end(&q);
    if (err) {
        sl_cat_blob_free(spec);
        sl_cat_blob_free(elastic);
    }
    return err;
}

/* The check of a restore, on the job's row as read in its transaction. */
typedef struct restore_read {
    sl_cat *cat;
    const sl_cat_restore *r;
    uint64_t version;
} restore_read;

static int restore_check(const sl_cat_job *job, void *arg)
{
    restore_read *rr = arg;
    sl_cat_dataset ds;
    int err;

    rr->version = job->version;
    /* The jobs' foreign key keeps the dataset while the job refers to it. */
    err = sl_cat_dataset_get(rr->cat, &ds, job->dataset);
    if (err)
        return err == SL_ENOTFOUND ? SL_EUNAVAILABLE : err;
    return rr->r->check ? rr->r->check(job, &ds, rr->r->arg) : 0;
}

int sl_cat_job_restore(sl_cat *cat, const sl_cat_restore *r, uint64_t *version)
{
    restore_read rr = {.cat = cat, .r = r};
    int64_t changes = 0;
    sl_db_q q;
    int err = sl_db_tx_begin(cat);

    if (err)
        return err;
    /* Read, check, then write only if the row is still the one checked: with PostgreSQL's read
     * committed, the UPDATE waits for a writer of the row and then finds its version moved on
     * (versions never repeat, even across a delete and a create: sl_cat_job_create). */
    err = sl_cat_job_get(cat, r->name, restore_check, &rr);
    if (!err) {
        sl_db_q_init(&q, cat, "job_restore");
        sl_db_text(&q, r->name);
        sl_db_blob(&q, r->spec, r->spec_len);
        sl_db_int(&q, r->world_size);
        sl_db_int(&q, (int64_t)r->epoch);
        sl_db_blob_opt(&q, r->elastic, r->elastic_len);
        sl_db_int(&q, (int64_t)rr.version);
        err = sl_db_exec(&q,
                         "UPDATE feed_jobs SET spec = ?2, world_size = ?3, epoch = ?4, "
                         "elastic = ?5, version = version + 1 WHERE name = ?1 AND version = ?6",
                         0, &changes);
        if (!err && changes == 0)
            err = SL_EUNAVAILABLE;
    }
    /* Progress after the restore point is discarded; the restored positions become the ranks'
     * reported progress of the epoch. Epochs after it are forgotten. */
    if (!err)
        err = clear_progress(cat, r->name, "job_restore");
    if (!err) {
        sl_db_q_init(&q, cat, "job_restore");
        sl_db_text(&q, r->name);
        sl_db_int(&q, (int64_t)r->epoch);
        err = sl_db_exec(&q, "DELETE FROM feed_epochs WHERE job = ?1 AND epoch >= ?2", 0, NULL);
    }
    for (uint32_t d = 0; !err && d < r->n; d++)
        err = sl_cat_progress_set(cat, r->name, d, r->epoch, r->positions[d]);
    if (!err)
        err = record_epoch(cat, r->name, "job_restore");
    if (!err)
        err = read_version(cat, r->name, version);
    if (!err)
        err = sl_db_announce(cat, 'j', r->name);
    return sl_db_tx_end(cat, err);
}
