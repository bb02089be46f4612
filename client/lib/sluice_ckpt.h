/* libsluice: checkpoint shards (sluice.v1.Checkpoints).
 *
 * Every function here is thread-safe on one sl_client (uploads of several ranks may run in
 * parallel threads) and returns 0 or a negative error (sluice.h); sl_client_error() then says
 * what the daemon (or the local file system) reported. Structs the caller passes in or out belong
 * to the caller; arrays the library allocates are freed by the caller with free(). Uploads and
 * downloads stream from and to file descriptors and never hold a shard in memory.
 */
#ifndef SLUICE_CKPT_H
#define SLUICE_CKPT_H

#include "sluice.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Same numbers as sluice.v1.CheckpointState and sluice.v1.Verdict. */
enum { SL_CKPT_STATE_WRITING = 1, SL_CKPT_STATE_COMPLETE = 2, SL_CKPT_STATE_INCOMPLETE = 3 };
enum {
    SL_CKPT_OK = 1,
    SL_CKPT_MISSING = 2,
    SL_CKPT_SIZE_MISMATCH = 3,
    SL_CKPT_HEADER_CORRUPT = 4,
    SL_CKPT_CHECKSUM_MISMATCH = 5,
    SL_CKPT_NOT_UPLOADED = 6,
    SL_CKPT_IO_ERROR = 7,
};

typedef struct sl_ckpt {
    char job[129];
    char name[129];
    uint64_t step;
    int32_t world_size;
    int state;
    char user_metadata[8193];
    int64_t created_ms, committed_ms; /* Unix time; committed 0 unless COMPLETE */
    uint32_t shards_uploaded;
    uint64_t total_bytes;
} sl_ckpt;

typedef struct sl_ckpt_shard {
    int32_t rank;
    uint64_t data_size, file_size;
    char sha256[65];
    char path[320]; /* relative to the daemon's data dir */
    uint32_t tensor_count;
} sl_ckpt_shard;

typedef struct sl_ckpt_tensor {
    const char *name;
    const char *dtype; /* float32, bfloat16, int64, uint8, bool, bytes, ... */
    const int64_t *shape;
    size_t n_dims;
    uint64_t offset, size;
} sl_ckpt_tensor;

typedef struct sl_ckpt_verdict {
    int32_t rank; /* -1 for the metadata file */
    int verdict;  /* SL_CKPT_OK, ... (0 when not checked) */
    char detail[256];
} sl_ckpt_verdict;

/* Progress of a transfer: bytes done of total. Called from the transferring thread. */
typedef void (*sl_ckpt_progress_fn)(uint64_t done, uint64_t total, void *arg);

/* Where a rank was in a feed job when the state in its shard was taken (issue 14). */
typedef struct sl_ckpt_data_position {
    const char *job; /* the feed job; NULL or "": the checkpoint's */
    uint64_t epoch;
    uint64_t position;   /* in the rank's share, in the job's unit (indices or batches) */
    uint32_t world_size; /* the world the rank ran in */
} sl_ckpt_data_position;

#define SL_CKPT_UPLOAD_OPTS_VERSION 2

typedef struct sl_ckpt_upload_opts {
    unsigned int version;          /* SL_CKPT_UPLOAD_OPTS_VERSION (0 reads as 1) */
    const sl_ckpt_tensor *tensors; /* NULL: one "bytes" tensor named "data" covering the shard */
    size_t n_tensors;
    const char *sha256; /* optional: the data's checksum, checked by the daemon */
    size_t chunk_bytes; /* message size; 0 means 1 MiB; at most 4 MiB */
    int resume;         /* continue an interrupted upload from what the daemon holds */
    int no_verify;      /* skip hashing locally and comparing with the receipt */
    sl_ckpt_progress_fn progress;
    void *arg;
    /* version 2 */
    const sl_ckpt_data_position *position; /* NULL: none */
} sl_ckpt_upload_opts;

#define SL_CKPT_BEGIN_OPTS_VERSION 1

typedef struct sl_ckpt_begin_opts {
    unsigned int version; /* SL_CKPT_BEGIN_OPTS_VERSION */
    const char *feed_job; /* NULL: the feed job named like the checkpoint's job, if any */
    int no_feed;          /* carry no data position */
    int auto_commit;      /* the daemon commits once every rank's shard is durable */
} sl_ckpt_begin_opts;

#define SL_CKPT_BEGIN_OPTS_INIT                                                                    \
    {                                                                                              \
        .version = SL_CKPT_BEGIN_OPTS_VERSION                                                      \
    }

/* The feed state a COMPLETE checkpoint carries. `positions` is allocated by the library (free()).
 */
typedef struct sl_ckpt_feed_state {
    char job[129];
    uint64_t epoch;
    uint32_t world_size;
    char unit[16]; /* "indices" or "batches" */
    uint64_t samples;
    char lengths_sha256[65];
    int elastic;
    uint64_t *positions; /* per dp rank */
    size_t n_positions;
} sl_ckpt_feed_state;

/* The defaults: one "bytes" tensor, 1 MiB messages, local SHA-256 check, no progress. */
#define SL_CKPT_UPLOAD_OPTS_INIT                                                                   \
    {                                                                                              \
        .version = SL_CKPT_UPLOAD_OPTS_VERSION                                                     \
    }

/* Name of a checkpoint state ("COMPLETE"; "UNKNOWN" for any other value). Returns a static
 * string. Thread-safe. */
SL_API const char *sl_ckpt_state_name(int state);

/* Name of a verdict ("CHECKSUM_MISMATCH"; "UNCHECKED" for 0, "UNKNOWN" for other values).
 * Returns a static string. Thread-safe. */
SL_API const char *sl_ckpt_verdict_name(int verdict);

/* Checkpoints.Begin: begin (or find, if it exists with the same step and world size) checkpoint
 * (job, name) of `step` for `world_size` ranks; name NULL or "" means "step_<step>",
 * user_metadata (NULL: none) is stored as given. Returns 0 and, if `out` is not NULL, the
 * checkpoint; a negative error otherwise. */
SL_API int sl_ckpt_begin(sl_client *c, sl_ckpt *out, const char *job, const char *name,
                         uint64_t step, int32_t world_size, const char *user_metadata);

/* Checkpoints.Begin with feed options (sl_ckpt_begin is this with opts NULL): the feed job the
 * checkpoint carries the data position of, none, and auto-commit. Returns as sl_ckpt_begin;
 * SL_ENOTFOUND for a feed job that does not exist. */
SL_API int sl_ckpt_begin_ex(sl_client *c, sl_ckpt *out, const char *job, const char *name,
                            uint64_t step, int32_t world_size, const char *user_metadata,
                            const sl_ckpt_begin_opts *opts);

/* Checkpoints.Get: the feed state COMPLETE checkpoint (job, name) carries (free out->positions).
 * Returns 0, SL_ENOTFOUND if it carries none, or another negative error. */
SL_API int sl_ckpt_feed_state_get(sl_client *c, sl_ckpt_feed_state *out, const char *job,
                                  const char *name);

/* Checkpoints.Restore: rewind the checkpoint's feed job to its feed state (world_size 0: the
 * checkpoint's world; else resized into it). Returns 0 with *out (may be NULL; free
 * out->positions) the restored state and *epoch and *world (may be NULL) the job's epoch and
 * world now; SL_ESTATE (not COMPLETE, no feed state, the dataset or job changed) or another
 * negative error. */
SL_API int sl_ckpt_restore(sl_client *c, sl_ckpt_feed_state *out, uint64_t *epoch, uint32_t *world,
                           const char *job, const char *name, uint32_t world_size);

/* Checkpoints.Commit: the checkpoint becomes COMPLETE once every rank has a durable shard.
 * Returns 0 and, if `out` is not NULL, the checkpoint; SL_ESTATE (the message names the missing
 * ranks) or another negative error. */
SL_API int sl_ckpt_commit(sl_client *c, sl_ckpt *out, const char *job, const char *name);

/* Checkpoints.Abort: a WRITING checkpoint becomes INCOMPLETE and its files are removed. Returns 0
 * and, if `out` is not NULL, the checkpoint; a negative error otherwise. */
SL_API int sl_ckpt_abort(sl_client *c, sl_ckpt *out, const char *job, const char *name);

/* Checkpoints.Get: the checkpoint into *out (may be NULL) and, if `shards` is not NULL, its
 * stored shards: *shards an array of *n_shards, which the caller frees with free(). Returns 0,
 * SL_ENOTFOUND or another negative error (then there is nothing to free). */
SL_API int sl_ckpt_get(sl_client *c, sl_ckpt *out, sl_ckpt_shard **shards, size_t *n_shards,
                       const char *job, const char *name);

/* Checkpoints.List: the checkpoints of `job` (NULL or "": all jobs) in `state` (0: all), newest
 * first. Returns 0 with *out an array of *n, which the caller frees with free() (also when *n is
 * 0); on error *out is NULL and *n 0. */
SL_API int sl_ckpt_list(sl_client *c, sl_ckpt **out, size_t *n, const char *job, int state);

/* Checkpoints.Latest: the newest COMPLETE checkpoint of `job` into the caller's *out (not NULL).
 * Returns 0, SL_ENOTFOUND if there is none, or another negative error. */
SL_API int sl_ckpt_latest(sl_client *c, sl_ckpt *out, const char *job);

/* Checkpoints.Delete: a checkpoint that is not being written, with its files. Returns 0,
 * SL_ENOTFOUND, SL_ESTATE (WRITING) or another negative error. */
SL_API int sl_ckpt_delete(sl_client *c, const char *job, const char *name);

/* Checkpoints.SetRetention: keep the last keep_last COMPLETE checkpoints of `job` (0: all); older
 * ones are deleted at once and after each commit. Returns 0 with *n_deleted (may be NULL) the
 * number deleted now; a negative error otherwise. */
SL_API int sl_ckpt_set_retention(sl_client *c, const char *job, uint32_t keep_last,
                                 size_t *n_deleted);

/* Checkpoints.Verify, quick (sizes and headers) or `deep` (every byte hashed again; no deadline).
 * Returns 0 with *ok whether the checkpoint is whole, *shards (if `shards` is not NULL) an array
 * of *n_shards verdicts, one per rank, which the caller frees with free(), and *metadata (may be
 * NULL) the metadata file's verdict; a negative error otherwise (nothing to free). */
SL_API int sl_ckpt_verify(sl_client *c, int *ok, sl_ckpt_verdict **shards, size_t *n_shards,
                          sl_ckpt_verdict *metadata, const char *job, const char *name, int deep);

/* Checkpoints.UploadShard: upload `size` bytes of fd (from offset 0, read with pread; fd stays
 * the caller's) as the data of rank's shard. opts may be NULL (the defaults) and is read during
 * the call only; opts->progress is called on the calling thread. Returns 0 and the receipt (may
 * be NULL); SL_EINVAL for an unknown opts->version, SL_ECORRUPT if the daemon's checksum differs
 * from the data read locally, SL_ESTATE if another upload of the rank runs (with resume), or
 * another negative error. */
SL_API int sl_ckpt_upload_fd(sl_client *c, sl_ckpt_shard *receipt, const char *job,
                             const char *name, int32_t rank, int fd, uint64_t size,
                             const sl_ckpt_upload_opts *opts);

/* Checkpoints.UploadStatus: how many data bytes of an interrupted upload the daemon holds
 * (*held), whether one runs now (*in_progress) and whether the rank already has a stored shard
 * (*stored); any out-parameter may be NULL. Returns 0 or a negative error. */
SL_API int sl_ckpt_upload_status(sl_client *c, uint64_t *held, int *in_progress, int *stored,
                                 const char *job, const char *name, int32_t rank);

/* Checkpoints.DownloadShard: write rank's data section into fd (sequentially from its current
 * position; fd stays the caller's) and check its SHA-256 against the daemon's; progress (may be
 * NULL) is called on the calling thread with `arg`. Returns 0 with sha256 (may be NULL) the
 * caller's buffer filled with the hex checksum; SL_ECORRUPT if the bytes do not hash to the
 * daemon's checksum, or another negative error (fd may then hold part of the data). */
SL_API int sl_ckpt_download_fd(sl_client *c, char sha256[65], const char *job, const char *name,
                               int32_t rank, int fd, sl_ckpt_progress_fn progress, void *arg);

/* A piece of a ranged read (sl_ckpt_read_pieces): `size` data bytes of the shard from data
 * offset `offset`, written to `dst`; sha256 is filled with their hex SHA-256. */
typedef struct sl_ckpt_piece {
    uint64_t offset;
    uint64_t size;
    void *dst;
    char sha256[65];
} sl_ckpt_piece;

/* Checkpoints.DownloadShard of data bytes [offset, offset + length) of rank's shard (a COMPLETE
 * checkpoint; the daemon checks every block they come from against its digest before it sends
 * any), each byte written straight into the piece that covers it and hashed there as it is
 * copied: the pieces lie inside the range, sorted by offset, none overlapping (bytes of the range
 * between them are read and dropped). Failover as sl_ckpt_download_fd (the read goes on at the
 * offset reached). Returns 0 with every piece's sha256 set (the caller compares it with what it
 * expects); SL_EINVAL for pieces that break those rules, SL_EPROTO for a stream that is not the
 * range asked for, or another negative error (the pieces then hold part of the data). Safe to
 * call from several threads at once on one client, each with its own pieces. */
SL_API int sl_ckpt_read_pieces(sl_client *c, const char *job, const char *name, int32_t rank,
                               uint64_t offset, uint64_t length, sl_ckpt_piece *pieces, size_t n);

#ifdef __cplusplus
}
#endif

#endif
