/* Catalog queries for the feeding service: datasets, jobs, and each job's epoch and per-rank
 * progress (schema: the feed migration in catalog.c).
 *
 * A job's configuration is stored as an opaque blob (the feed service's serialized job spec) next
 * to the columns the catalog itself needs (name, dataset, world size, epoch), so adding a job
 * option never needs a migration. Progress rows are keyed by (job, dp rank) and belong to the
 * job's current epoch: advancing the epoch or resizing the job deletes them in the same
 * transaction that changes the job.
 *
 * Every function runs on the loop thread and returns 0, SL_EDB for a SQLite failure (logged with
 * SQLite's message; -ENOSPC or SL_EDBBUSY for a full disk or a busy catalog, see catalog.h), or
 * the code named in its comment.
 */
#ifndef SL_CATALOG_FEED_H
#define SL_CATALOG_FEED_H

#include "catalog.h"

#include <stddef.h>
#include <stdint.h>

#define SL_CAT_FEED_NAME_MAX 128

typedef struct sl_cat_dataset {
    char name[SL_CAT_FEED_NAME_MAX + 1];
    uint64_t samples;
    int has_lengths;
    char lengths_sha256[65];
    int64_t created_ms;
    uint32_t jobs; /* jobs referring to it */
    int has_labels;
    char labels_sha256[65];
    uint32_t classes; /* 1 + the largest class id in the labels (0 without labels) */
} sl_cat_dataset;

/* Insert a dataset without lengths. SL_EEXIST if the name is taken, or another dataset's equals
 * it but for case (sl_cat_name_clash says which). */
int sl_cat_dataset_create(sl_cat *cat, const char *name, uint64_t samples, int64_t now_ms);

/* Look a dataset up. SL_ENOTFOUND if absent. */
int sl_cat_dataset_get(sl_cat *cat, sl_cat_dataset *out, const char *name);

/* Call fn for every dataset in name order; a nonzero return stops and is returned. */
int sl_cat_dataset_list(sl_cat *cat, int (*fn)(const sl_cat_dataset *d, void *arg), void *arg);

/* Record that the dataset's lengths file is complete with this checksum. SL_ENOTFOUND. */
int sl_cat_dataset_set_lengths(sl_cat *cat, const char *name, const char *sha256);

/* Record that the dataset's labels file is complete with this checksum and 1 + its largest class
 * id. SL_ENOTFOUND. */
int sl_cat_dataset_set_labels(sl_cat *cat, const char *name, const char *sha256, uint32_t classes);

/* Delete a dataset. SL_ENOTFOUND if absent, SL_ESTATE if a job uses it. */
int sl_cat_dataset_delete(sl_cat *cat, const char *name);

/* A job row. The blobs are borrowed: valid during the callback (list) or the call (writes). */
typedef struct sl_cat_job {
    const char *name;
    const char *dataset;
    const void *spec; /* the feed service's job spec */
    size_t spec_len;
    uint32_t world_size;
    uint64_t epoch;
    const void *elastic; /* the current epoch's elastic state, NULL/0 when none */
    size_t elastic_len;
    int64_t created_ms;
    uint64_t version; /* changes of the spec other than epoch advances (resize, restore) */
} sl_cat_job;

/* Insert a job at epoch 0 with job->version as its first version (the caller picks one that a
 * job deleted and made again under the same name never repeats: replicas tell their copy of a
 * job from the catalog's by it). SL_EEXIST if the name is taken or a job's (feed or
 * checkpoints') equals it but for case (sl_cat_name_clash says which), SL_ENOTFOUND if the
 * dataset is not. */
int sl_cat_job_create(sl_cat *cat, const sl_cat_job *job);

/* Call fn for every job in name order; a nonzero return stops and is returned. */
int sl_cat_job_list(sl_cat *cat, int (*fn)(const sl_cat_job *j, void *arg), void *arg);

/* Call fn once with the job's row. SL_ENOTFOUND if absent. */
int sl_cat_job_get(sl_cat *cat, const char *name, int (*fn)(const sl_cat_job *j, void *arg),
                   void *arg);

/* Delete a job and its progress. SL_ENOTFOUND if absent. */
int sl_cat_job_delete(sl_cat *cat, const char *name);

/* Move the job from epoch `from` to `epoch` with no elastic state and no progress (one
 * transaction). SL_ESTATE if the job is no longer at `from` (another replica moved it first:
 * exactly one of several racing replicas wins), SL_ENOTFOUND if it is gone. */
int sl_cat_job_set_epoch(sl_cat *cat, const char *name, uint64_t from, uint64_t epoch);

/* Replace the job's spec, world size and elastic state, clear its progress and count a new
 * version into *version (may be NULL), in one transaction. SL_ENOTFOUND. */
int sl_cat_job_resize(sl_cat *cat, const char *name, const void *spec, size_t spec_len,
                      uint32_t world_size, const void *elastic, size_t elastic_len,
                      uint64_t *version);

/* Group several writes in one transaction (one fsync): sl_cat_feed_begin, the writes, then
 * sl_cat_feed_end(cat, err), which commits if err is 0 and rolls back otherwise; it returns the
 * first error. Only sl_cat_progress_set may run inside (the others have their own
 * transactions). */
int sl_cat_feed_begin(sl_cat *cat);
int sl_cat_feed_end(sl_cat *cat, int err);

/* Record dp rank `dp_rank`'s position in `epoch` if that is the job's current epoch in the
 * catalog (a report another replica's epoch advance overtook records nothing): a lower
 * position for the same epoch never replaces a higher one. */
int sl_cat_progress_set(sl_cat *cat, const char *job, uint32_t dp_rank, uint64_t epoch,
                        uint64_t position);

/* One dp rank's report for sl_cat_progress_put. */
typedef struct sl_cat_progress {
    uint32_t dp_rank;
    uint64_t epoch, position;
} sl_cat_progress;

/* sl_cat_progress_set for n reports of one job in as few statements as the engine needs (one
 * per 256 reports): what a group commit writes. A job that does not exist takes no row. */
int sl_cat_progress_put(sl_cat *cat, const char *job, const sl_cat_progress *rows, size_t n);

/* The job's version and epoch and, in the same statement, each of its progress rows (fn, any
 * order; *version and *epoch are set before each call): what a replica reads to bring its copy
 * of a job up to date in one round trip. SL_ENOTFOUND if there is no such job. */
int sl_cat_job_progress(sl_cat *cat, const char *name, uint64_t *version, uint64_t *epoch,
                        int (*fn)(uint32_t dp_rank, uint64_t epoch, uint64_t position, void *arg),
                        void *arg);

/* Call fn for each progress row of the job (any order); nonzero stops and is returned. */
int sl_cat_progress_list(sl_cat *cat, const char *job,
                         int (*fn)(uint32_t dp_rank, uint64_t epoch, uint64_t position, void *arg),
                         void *arg);

/* A blob read from the catalog (malloc'd; p NULL when the column was NULL or empty). */
typedef struct sl_cat_blob {
    void *p;
    size_t len;
} sl_cat_blob;

void sl_cat_blob_free(sl_cat_blob *b);

/* The job's spec, world size and elastic state in `epoch`: the job's row while it is in that
 * epoch, else the record kept in feed_epochs (the last 64 epochs). SL_ENOTFOUND if neither. */
int sl_cat_epoch_get(sl_cat *cat, const char *job, uint64_t epoch, sl_cat_blob *spec,
                     uint32_t *world_size, sl_cat_blob *elastic);

/* What sl_cat_job_restore writes, and the check it makes first. */
typedef struct sl_cat_restore {
    const char *name; /* the job */
    const void *spec;
    size_t spec_len;
    uint32_t world_size;
    uint64_t epoch;
    const void *elastic; /* NULL/0: none */
    size_t elastic_len;
    const uint64_t *positions; /* one per dp rank, each reported in `epoch` */
    uint32_t n;
    /* Called in the transaction before anything is written, with the job's row and its
     * dataset's row as they are committed now (not a replica's copy); the write that follows is
     * conditional on the job's row being still that one. Nonzero refuses the restore and is
     * returned. NULL: no check. */
    int (*check)(const sl_cat_job *job, const sl_cat_dataset *ds, void *arg);
    void *arg;
} sl_cat_restore;

/* Put a job back to a checkpoint's feed state in one transaction: r->check first, then its spec,
 * world, epoch and elastic state; its progress replaced by r->positions; records of later
 * epochs forgotten; its new version into *version (may be NULL). SL_ENOTFOUND if the job does
 * not exist, SL_EUNAVAILABLE if another replica changed its row between the check and the
 * write (nothing written: try again), or r->check's code. */
int sl_cat_job_restore(sl_cat *cat, const sl_cat_restore *r, uint64_t *version);

/* Tell the other replicas (a shared catalog, sl_cat_listen) that the job's progress changed, in
 * the group commit's transaction. Nothing for SQLite. */
int sl_cat_progress_announce(sl_cat *cat, const char *job);

#endif
