/* libsluice: checkpoint shards (sluice.v1.Checkpoints).
 *
 * Every function is thread-safe on one sl_client (uploads of several ranks may run in parallel
 * threads) and returns 0 or a negative sluice error; sl_client_error() then says what the daemon
 * (or the local file system) reported. Uploads and downloads stream from and to file
 * descriptors and never hold a shard in memory.
 */
#ifndef SLUICE_CKPT_H
#define SLUICE_CKPT_H

#include "sluice.h"

#include <stddef.h>
#include <stdint.h>

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

#define SL_CKPT_UPLOAD_OPTS_VERSION 1

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
} sl_ckpt_upload_opts;

/* The defaults: one "bytes" tensor, 1 MiB messages, local SHA-256 check, no progress. */
#define SL_CKPT_UPLOAD_OPTS_INIT                                                                   \
    {                                                                                              \
        .version = SL_CKPT_UPLOAD_OPTS_VERSION                                                     \
    }

/* Names of states and verdicts ("COMPLETE", "CHECKSUM_MISMATCH"). Static strings. */
const char *sl_ckpt_state_name(int state);
const char *sl_ckpt_verdict_name(int verdict);

/* Begin (or find) checkpoint (job, name); name NULL or "" means "step_<step>". */
int sl_ckpt_begin(sl_client *c, sl_ckpt *out, const char *job, const char *name, uint64_t step,
                  int32_t world_size, const char *user_metadata);

/* Commit: COMPLETE once every rank has a durable shard (SL_ESTATE names missing ranks). */
int sl_ckpt_commit(sl_client *c, sl_ckpt *out, const char *job, const char *name);

/* Abort a WRITING checkpoint: INCOMPLETE, files removed. */
int sl_ckpt_abort(sl_client *c, sl_ckpt *out, const char *job, const char *name);

/* Get a checkpoint and, if shards is not NULL, its shards (caller frees *shards with free()). */
int sl_ckpt_get(sl_client *c, sl_ckpt *out, sl_ckpt_shard **shards, size_t *n_shards,
                const char *job, const char *name);

/* List checkpoints of job (NULL or "": all) in state (0: all), newest first. Caller frees *out. */
int sl_ckpt_list(sl_client *c, sl_ckpt **out, size_t *n, const char *job, int state);

/* The newest COMPLETE checkpoint of job (SL_ENOTFOUND if none). */
int sl_ckpt_latest(sl_client *c, sl_ckpt *out, const char *job);

/* Delete a checkpoint that is not being written. */
int sl_ckpt_delete(sl_client *c, const char *job, const char *name);

/* Keep the last keep_last COMPLETE checkpoints of job (0: all); *n_deleted (may be NULL) gets
 * how many were removed at once. */
int sl_ckpt_set_retention(sl_client *c, const char *job, uint32_t keep_last, size_t *n_deleted);

/* Verify quick or deep. *ok says whether all is whole; *shards (caller frees, may be NULL) one
 * verdict per rank; *metadata (may be NULL) the metadata file's. */
int sl_ckpt_verify(sl_client *c, int *ok, sl_ckpt_verdict **shards, size_t *n_shards,
                   sl_ckpt_verdict *metadata, const char *job, const char *name, int deep);

/* Upload `size` bytes of fd (from offset 0, read with pread) as the data of rank's shard.
 * Returns 0 and the receipt (may be NULL); SL_EINVAL for an unknown opts->version, SL_ECORRUPT
 * if the daemon's checksum differs from the data read locally. opts may be NULL. */
int sl_ckpt_upload_fd(sl_client *c, sl_ckpt_shard *receipt, const char *job, const char *name,
                      int32_t rank, int fd, uint64_t size, const sl_ckpt_upload_opts *opts);

/* How many data bytes of an interrupted upload the daemon holds, whether one runs now and
 * whether the rank already has a stored shard. Any out-parameter may be NULL. */
int sl_ckpt_upload_status(sl_client *c, uint64_t *held, int *in_progress, int *stored,
                          const char *job, const char *name, int32_t rank);

/* Download rank's data section into fd (written sequentially from its current position) and
 * check its SHA-256 against the daemon's; sha256 (may be NULL) receives it. SL_ECORRUPT if the
 * bytes do not hash to it. */
int sl_ckpt_download_fd(sl_client *c, char sha256[65], const char *job, const char *name,
                        int32_t rank, int fd, sl_ckpt_progress_fn progress, void *arg);

#endif
