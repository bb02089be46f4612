/* libsluice: datasets, jobs, epochs and the per-rank index and batch streams (sluice.v1.Datasets,
 * Jobs, Epochs, Feed).
 *
 * Every function here is thread-safe on one sl_client and returns 0 (or, for the stream readers,
 * 1) on success and a negative error on failure (sluice.h); sl_client_error() then says what the
 * daemon reported ("NOT_FOUND: job 'x' not found"). Structs the caller passes in or out belong to
 * the caller; arrays the library allocates are freed by the caller as each function says. A
 * stream object is used by one thread at a time. Streams have no deadline (a stream for the next
 * epoch waits until the coordinator begins it).
 */
#ifndef SLUICE_FEED_H
#define SLUICE_FEED_H

#include "sluice.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sl_dataset {
    char name[129];
    uint64_t samples;
    int has_lengths;
    char lengths_sha256[65];
    uint64_t created_ms;
    uint32_t jobs; /* jobs using it */
    int has_labels;
    char labels_sha256[65];
    uint32_t classes; /* 1 + the largest class id in the labels */
} sl_dataset;

/* Datasets.Create: a dataset of `samples` samples named `name`. Returns 0 and, if `out` is not
 * NULL, the dataset as stored; SL_EEXIST if the name is taken, SL_EINVAL for a bad name. */
SL_API int sl_dataset_create(sl_client *c, const char *name, uint64_t samples, sl_dataset *out);

/* Datasets.UploadLengths: stream the n sequence lengths of dataset `name` (n must equal its
 * sample count), 1 Mi per message; `lengths` stays the caller's. Returns 0 and, if `out` is not
 * NULL, the dataset with its lengths checksum; a negative error otherwise. */
SL_API int sl_dataset_upload_lengths(sl_client *c, const char *name, const uint32_t *lengths,
                                     uint64_t n, sl_dataset *out);

/* Datasets.UploadLabels: stream the n class ids of dataset `name` (n must equal its sample count,
 * each below 2^20), 1 Mi per message; `labels` stays the caller's. Returns 0 and, if `out` is not
 * NULL, the dataset with its labels checksum and class count; SL_EINVAL (wrong count, a class id
 * over the maximum), SL_ESTATE (jobs use the labels) or another negative error. */
SL_API int sl_dataset_upload_labels(sl_client *c, const char *name, const uint32_t *labels,
                                    uint64_t n, sl_dataset *out);

/* Datasets.Get: dataset `name` into the caller's *out (not NULL). Returns 0, SL_ENOTFOUND or
 * another negative error. */
SL_API int sl_dataset_get(sl_client *c, const char *name, sl_dataset *out);

/* Datasets.List: every dataset. Returns 0 with *out an array of *n datasets, which the caller
 * frees with free() (also when *n is 0); on error *out is NULL and *n 0. */
SL_API int sl_dataset_list(sl_client *c, sl_dataset **out, size_t *n);

/* Datasets.Delete: dataset `name`. Returns 0, SL_ENOTFOUND, SL_ESTATE while jobs use it, or
 * another negative error. */
SL_API int sl_dataset_delete(sl_client *c, const char *name);

typedef struct sl_job_mesh {
    uint32_t dp, tp, cp, pp; /* all 0: no mesh */
    char order[32];          /* "" = pp,dp,cp,tp */
} sl_job_mesh;

typedef struct sl_job_batching {
    char strategy[16]; /* pad | bucket | dynamic | packed; "" = dynamic */
    uint32_t max_batch_size, max_seq_len;
    uint64_t max_tokens; /* 0 = max_batch_size x max_seq_len */
    char cost[16];       /* padded | sum | "" */
    uint64_t window;     /* 0 = whole epoch */
    uint32_t bucket_width, batch_size_multiple;
    int skip_overlong, pad_remainder, balance;
} sl_job_batching;

/* A job as configured (input of sl_job_create) and as reported (output fields marked). */
typedef struct sl_job {
    char name[129];
    char dataset[129];
    uint32_t world_size;
    sl_job_mesh mesh;
    char partition[16]; /* interleaved | contiguous | chunked; "" = interleaved */
    uint64_t chunk_size;
    char shuffle[16]; /* feistel | torch | none; "" = feistel */
    uint64_t seed;
    int drop_last;
    int manual_advance;
    int has_batching;
    sl_job_batching batching;
    /* Sampling II (docs/sampling.md). Stratified shares or class-balanced epochs (class weights,
     * one per class id, or balance_classes for uniform ones) need the dataset's labels; rank
     * weights, one per dp rank, size the shares. The weight arrays are borrowed on input. On
     * output they hold the job's weights (NULL when it has none): from sl_job_create, sl_job_get
     * and sl_job_resize* they belong to the job, which the caller releases with sl_job_clear;
     * in sl_job_list's array they live in the array's own allocation (free() frees them; do not
     * call sl_job_clear on its elements). */
    int stratify;
    int balance_classes;
    uint64_t epoch_length; /* class-balanced samples per epoch; 0 = N */
    const double *class_weights;
    uint32_t n_class_weights;
    const double *rank_weights;
    uint32_t n_rank_weights;
    uint64_t epoch;       /* output */
    uint64_t created_ms;  /* output */
    uint32_t dp_size;     /* output */
    int resized_in_epoch; /* output */
} sl_job;

/* Jobs.Create from the caller's `spec` (name, dataset and world_size required; zero fields take
 * the defaults noted above). Returns 0 and, if `out` is not NULL, the job as stored; SL_EEXIST,
 * SL_ENOTFOUND (no such dataset), SL_EINVAL (a bad setting) or another negative error. */
SL_API int sl_job_create(sl_client *c, const sl_job *spec, sl_job *out);

/* Jobs.Get: job `name` into the caller's *out (not NULL), weights included (release them with
 * sl_job_clear). Returns 0, SL_ENOTFOUND or another negative error. */
SL_API int sl_job_get(sl_client *c, const char *name, sl_job *out);

/* Release the weights an output sl_job holds (sl_job_create, sl_job_get, sl_job_resize*) and set
 * its weight pointers to NULL. Accepts NULL and a job without weights; never call it on a spec
 * whose arrays the caller owns, nor on an element of sl_job_list's array. Thread-safe. */
SL_API void sl_job_clear(sl_job *j);

/* Jobs.List: the jobs of `dataset` (NULL or "": all). Returns 0 with *out an array of *n jobs,
 * which the caller frees with free() (also when *n is 0); on error *out is NULL and *n 0. */
SL_API int sl_job_list(sl_client *c, const char *dataset, sl_job **out, size_t *n);

/* Jobs.Delete: job `name`. Returns 0, SL_ENOTFOUND or another negative error. */
SL_API int sl_job_delete(sl_client *c, const char *name);

/* Jobs.Resize: give job `name` a new world size, mid-epoch too (the rest of the epoch is
 * redistributed); `mesh` NULL means no mesh. Returns 0 and, if `out` is not NULL, the job after
 * the resize; a negative error otherwise. */
SL_API int sl_job_resize(sl_client *c, const char *name, uint32_t world_size,
                         const sl_job_mesh *mesh, sl_job *out);

/* Jobs.Resize with new rank weights: rank_weights[0..n_rank_weights), one per dp rank of the new
 * world (> 0, finite; borrowed for the call), or none (n_rank_weights 0: like sl_job_resize).
 * Index jobs share the rest of the epoch in proportion to them; batch jobs re-plan the rest of
 * the epoch's batches with budgets by them (docs/feeding.md "Resize"). Returns like
 * sl_job_resize; SL_EINVAL for bad weights. */
SL_API int sl_job_resize_weighted(sl_client *c, const char *name, uint32_t world_size,
                                  const sl_job_mesh *mesh, const double *rank_weights,
                                  uint32_t n_rank_weights, sl_job *out);

typedef struct sl_epoch_rank {
    uint32_t dp_rank;
    uint64_t position, count;
    int done;
} sl_epoch_rank;

typedef struct sl_epoch {
    char job[129];
    uint64_t epoch;
    uint32_t dp_size;
    int complete;
    char unit[16];        /* "indices" or "batches" */
    sl_epoch_rank *ranks; /* dp_size entries; free with sl_epoch_clear */
} sl_epoch;

/* Epochs.Get: the current epoch of `job` and each data-parallel rank's progress. Returns 0 and
 * *out (not NULL), whose ranks array the caller frees with sl_epoch_clear; a negative error
 * otherwise (nothing to free). */
SL_API int sl_epoch_get(sl_client *c, const char *job, sl_epoch *out);

/* Epochs.Next: begin the next epoch of `job`; with `check`, fails (SL_ESTATE) unless `expect` is
 * the current epoch. Returns 0 and, if `out` is not NULL, the new epoch (free its ranks with
 * sl_epoch_clear); a negative error otherwise. */
SL_API int sl_epoch_next(sl_client *c, const char *job, int check, uint64_t expect, sl_epoch *out);

/* Epochs.ReportProgress: global rank `rank` of `job` consumed positions [0, position) of its
 * share in `epoch`. Returns 0 with *cur_epoch (may be NULL) the current epoch after the report
 * and *advanced (may be NULL) whether this report began the next epoch; a negative error
 * otherwise. */
SL_API int sl_epoch_report(sl_client *c, const char *job, uint32_t rank, uint64_t epoch,
                           uint64_t position, uint64_t *cur_epoch, int *advanced);

/* Free the ranks array of an sl_epoch and set it to NULL; the struct itself stays the caller's.
 * Accepts NULL and a zeroed struct. Thread-safe. */
SL_API void sl_epoch_clear(sl_epoch *e);

#define SL_STREAM_OPTS_VERSION 1

/* Where a stream starts: by default the current epoch at the rank's reported position. */
typedef struct sl_stream_opts {
    unsigned int version; /* SL_STREAM_OPTS_VERSION (0 reads as 1) */
    int epoch_set;
    uint64_t epoch;
    int position_set;
    uint64_t position;  /* a step for batch streams */
    uint32_t max_chunk; /* indices (or batches) per message; 0 = server default */
} sl_stream_opts;

/* The defaults: current epoch, reported position, the daemon's chunk size. */
#define SL_STREAM_OPTS_INIT                                                                        \
    {                                                                                              \
        .version = SL_STREAM_OPTS_VERSION                                                          \
    }

typedef struct sl_index_stream sl_index_stream;

/* Feed.StreamIndices for global rank `rank` of `job`; opts may be NULL (the defaults) and is not
 * kept. Returns 0 and *out, which the caller frees with sl_indices_close; SL_EINVAL for an
 * unknown opts->version, or the error of starting the call (*out is then NULL). Errors of the
 * request itself (unknown job, rank out of range) surface from the first sl_indices_next. The
 * stream may be read by one thread at a time, any thread. */
SL_API int sl_indices_open(sl_index_stream **out, sl_client *c, const char *job, uint32_t rank,
                           const sl_stream_opts *opts);

/* The next chunk: *idx holds *n indices at positions [*start, *start + *n) of the share; the
 * array belongs to the stream and is valid until the next call on it. Returns 1 with a chunk
 * (possibly empty), 0 at the end of the share, or a negative error. */
SL_API int sl_indices_next(sl_index_stream *s, const uint64_t **idx, size_t *n, uint64_t *start);

/* Epoch of the stream, known after the first chunk (0 before). */
SL_API uint64_t sl_indices_epoch(const sl_index_stream *s);

/* Size of the rank's share in that epoch, known after the first chunk (0 before). */
SL_API uint64_t sl_indices_share_count(const sl_index_stream *s);

/* Cancel the call if it is not finished, and free the stream. Accepts NULL. */
SL_API void sl_indices_close(sl_index_stream *s);

typedef struct sl_feed_batch {
    uint64_t step;
    const uint32_t *indices; /* valid until the next sl_batches_next */
    size_t count;
    uint32_t max_len;
    uint64_t tokens, padded_tokens;
} sl_feed_batch;

typedef struct sl_batch_stream sl_batch_stream;

/* Feed.StreamBatches for global rank `rank` of a job with batching; opts as for sl_indices_open
 * (its position is a step). Returns 0 and *out, which the caller frees with sl_batches_close;
 * errors as for sl_indices_open. */
SL_API int sl_batches_open(sl_batch_stream **out, sl_client *c, const char *job, uint32_t rank,
                           const sl_stream_opts *opts);

/* The next batch into the caller's *out; out->indices belongs to the stream and is valid until
 * the next call on it. Returns 1 with a batch, 0 at the end of the rank's batches, or a negative
 * error. */
SL_API int sl_batches_next(sl_batch_stream *s, sl_feed_batch *out);

/* Epoch of the stream, known after the first batch (0 before). */
SL_API uint64_t sl_batches_epoch(const sl_batch_stream *s);

/* Number of batches every rank gets in that epoch, known after the first batch (0 before). */
SL_API uint64_t sl_batches_per_rank(const sl_batch_stream *s);

/* Cancel the call if it is not finished, and free the stream. Accepts NULL. */
SL_API void sl_batches_close(sl_batch_stream *s);

#ifdef __cplusplus
}
#endif

#endif
