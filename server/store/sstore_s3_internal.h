/* Private to the object-storage backend of the shard store (sstore_s3*.c): its types and what
 * its files share. sstore_s3.c (readers, small objects, removals, sweeps, the constructor) ->
 * sstore_s3_write.c (the part threads, writers) -> sstore_s3_state.c (the state object of a
 * partial upload, and the multipart uploads no state names). */
#ifndef SL_STORE_SSTORE_S3_INTERNAL_H
#define SL_STORE_SSTORE_S3_INTERNAL_H

#include "s3.h"
#include "sstore.h"

#include "err.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#define STATE_MAX   (4u << 20)   /* largest state object read back (10,000 parts fit) */
#define PARTS_MAX   10000        /* S3's limit */
#define PART_MIN    (5ull << 20) /* S3's smallest part but the last */
#define HEAD_SUFFIX ".head"

typedef struct pjob pjob;

typedef struct s3store {
    sl_sstore base;
    sl_s3 *c;
    uint64_t part_size;
    int inflight;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    pjob *q_head, *q_tail;
    int queued, queue_max; /* parts queued or on their way, all uploads: at most queue_max */
    int stop, nthreads;
    pthread_t *threads;
} s3store;

/* One part on its way: sent by a pool thread, reaped by its writer in part order. */
struct pjob {
    pjob *next;  /* the pool's queue */
    pjob *wnext; /* the writer's list, in part order */
    sl_s3 *c;
    const char *key, *upload_id;
    int part_no;
    uint8_t *buf;
    size_t len;
    uint64_t data_end; /* data bytes held once this part is stored */
    uint8_t sha_state[SL_SHA256_STATE_LEN];
    int no_state; /* the last part, sent by finish: the hasher is final, nothing to record */
    char etag[SL_S3_ETAG_MAX];
    int done, err;
    char msg[256];
};

struct sl_swriter {
    s3store *s;
    char job[SL_SHARD_NAME_MAX + 1], name[SL_SHARD_NAME_MAX + 1];
    int32_t rank;
    uint32_t tensor_count;
    uint64_t data_size;
    char key[SL_S3_KEY_MAX], state_key[SL_S3_KEY_MAX], head_key[SL_S3_KEY_MAX];
    char upload_id[SL_S3_UPLOAD_MAX]; /* "" without a multipart upload */
    uint64_t part_size, head_len;     /* head_len: data bytes in part 1 */
    uint8_t *head;                    /* head_len bytes */
    uint8_t *buf;                     /* the part being filled (parts 2..n) */
    /* One part buffer back from the pool, reused for the next part: a buffer allocated per part
     * cost page faults (12% more CPU with 32 MiB parts, which glibc maps afresh each time). */
    uint8_t *spare[1];
    int nspare;
    size_t fill;
    int next_part;     /* the part being filled (1: the head) */
    uint64_t data_pos; /* data bytes accepted */
    sl_sha256 *run;    /* the upload's hasher (w_open's sha, not owned): the data is hashed here */
    char (*etags)[SL_S3_ETAG_MAX]; /* [max_part + 1] by part number */
    int max_part;                  /* the number of parts this shard needs */
    int done_upto;                 /* parts 2..done_upto stored */
    uint64_t data_done;            /* data bytes stored (head and parts 2..done_upto) */
    uint8_t done_state[SL_SHA256_STATE_LEN];
    int prefix_upto; /* parts 2..prefix_upto hold the data_done bytes (the resumable prefix) */
    int head_stored, finished;
    /* Sealed by finish: every part stored (part 1 with the real header) and named, with the
     * checksum, in the state object; published (CompleteMultipartUpload) by w_publish only. */
    int sealed;
    char sealed_sha[SL_SHARD_HEX_LEN + 1];
    int finishing; /* in finish: the caller finalized the hasher (its state means nothing) */
    pjob *jobs, *jobs_tail;
    int njobs;
    int err;
    char errmsg[256];
};

struct sl_sreader {
    s3store *s;
    char key[SL_S3_KEY_MAX];
};

/* The number of parts of a shard of data_size bytes in parts of part_size (part 1: the header and
 * the first part_size - header bytes). */
static inline int s3s_part_count(uint64_t data_size, uint64_t part_size)
{
    uint64_t head_len = part_size - SL_SHARD_HEADER_SIZE;

    if (head_len >= data_size)
        return 1;
    return 1 + (int)((data_size - head_len + part_size - 1) / part_size);
}

/* "<job>/<file><suffix>" into buf. Returns 0 or SL_ELIMIT. */
static inline int obj_key(char *buf, size_t len, const char *job, const char *file,
                          const char *suffix)
{
    int n = snprintf(buf, len, "%s/%s%s", job, file, suffix ? suffix : "");

    return n < 0 || (size_t)n >= len ? SL_ELIMIT : 0;
}

/* ---- sstore_s3_state.c ---- */

/* What a state object says. */
typedef struct ustate {
    char upload_id[SL_S3_UPLOAD_MAX];
    int32_t rank;
    uint64_t data_size, part_size, data_done;
    uint32_t tensor_count;
    uint8_t sha[SL_SHA256_STATE_LEN];
    int last_part;
    /* A sealed upload: the shard's checksum ("" if not sealed) and its parts, 1..sealed_parts,
     * every one stored (their ETags in the table of s3s_state_load). */
    char sealed[SL_SHARD_HEX_LEN + 1];
    int sealed_parts;
} ustate;

/* Write the writer's state object (its errmsg on failure). */
int s3s_state_save(sl_swriter *w);
/* Read the state object at key; etags (may be NULL) receives the parts' ETags by part number,
 * parts above max_part making the state SL_ECORRUPT.
 * SL_ENOTFOUND if there is none, SL_ECORRUPT if it does not parse. */
int s3s_state_load(s3store *s, const char *key, ustate *u, char (*etags)[SL_S3_ETAG_MAX],
                   int max_part, char *msg, size_t msglen);
/* Abort the multipart upload a state object names and remove it with its head object. */
void s3s_state_discard(s3store *s, const char *state_key);
/* sl_sstore_ops.recover and shard_sha. */
void s3s_tidy(sl_sstore *base, const char *job, const char *name, int32_t world_size,
              const char (*shas)[SL_SHARD_HEX_LEN + 1]);
int s3s_recover(sl_sstore *base, const char *job, const char *name, int32_t rank, const char *sha);
int s3s_shard_sha(sl_sstore *base, const char *job, const char *file, uint64_t *size,
                  char sha[SL_SHARD_HEX_LEN + 1]);
/* sl_sstore_ops.orphans and abort_upload. */
int s3s_orphans(sl_sstore *base, int64_t before_ms, sl_sstore_orphan_fn fn, void *arg);
int s3s_abort_upload(sl_sstore *base, const char *job, const char *file, const char *upload_id);
/* sl_sstore_ops.held. */
int s3s_held(sl_sstore *base, const char *job, const char *name, int32_t rank, uint64_t *held);

/* ---- sstore_s3_write.c ---- */

/* A part thread's body (started by the constructor). */
void *s3s_pool_main(void *arg);
/* sl_sstore_ops writers. */
int s3s_w_open(sl_sstore *base, const sl_swriter_spec *spec, sl_sha256 *sha, sl_swriter **out,
               char *msg, size_t msglen);
int s3s_w_write(sl_swriter *w, const struct iovec *iov, int n, uint64_t off, char *msg,
                size_t msglen);
int s3s_w_finish(sl_swriter *w, const char *sha_hex, char *msg, size_t msglen);
int s3s_w_publish(sl_swriter *w, char *msg, size_t msglen);
void s3s_w_release(sl_swriter *w);
void s3s_w_close(sl_swriter *w, int discard);

#endif
