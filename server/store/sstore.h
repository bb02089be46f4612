/* The shard store: where checkpoint files live, behind one interface with two backends.
 *
 *   dir  a directory on a local or shared POSIX file system (sstore_dir.c; the default):
 *        <root>/<job>/<file>, written through store.h (no symbolic link followed, durable
 *        renames), partial uploads as ".<file>.part" files kept for a resume;
 *   s3   S3-compatible object storage (sstore_s3.c): objects "<prefix>/<job>/<file>", shards
 *        written as multipart uploads, a partial upload resumable from its state object.
 *
 * Files are named by (job, file): `file` is a name of layout.h (a shard, the metadata file),
 * built from names the caller checked. The layout of every file is the same in both backends, so
 * a shard object can be fetched and verified with any S3 tool.
 *
 * Threads: every function may block (on a disk or the network) and is thread-safe, except where
 * a comment says otherwise; the daemon calls them from libuv's worker pool. sl_sstore_remote()
 * says whether a backend's calls wait on the network: the checkpoint service runs the small
 * calls of a local backend (stat, remove, held) on the loop, those of a remote one never.
 *
 * Errors: 0 or a negative SL_E* / -errno; functions taking msg/msglen write one line there
 * (never a credential).
 */
#ifndef SL_STORE_SSTORE_H
#define SL_STORE_SSTORE_H

#include "shard.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

typedef struct sl_sstore sl_sstore;
typedef struct sl_swriter sl_swriter;
typedef struct sl_sreader sl_sreader;

/* A shard to write: where, and the header it will carry. */
typedef struct sl_swriter_spec {
    const char *job, *name; /* checked names: the shard file is layout.h's SHARD of (name, rank) */
    int32_t rank;
    uint32_t tensor_count;
    uint64_t data_size;   /* data bytes the shard will hold */
    uint64_t resume_from; /* data bytes the client skips: the partial upload must hold them */
    /* The upload lease's generation (a shared catalog), 0: none. An attempt with one writes a
     * partial upload of its own, named by it, and removes the older attempts' (a resume copies
     * its prefix from the newest of them), so an attempt fenced out in the catalog can never
     * touch this one's bytes or publish its own over them. */
    int64_t generation;
} sl_swriter_spec;

/* What a sweep decides about one file it found. */
enum { SL_SSTORE_KEEP = 0, SL_SSTORE_REMOVE = 1, SL_SSTORE_QUARANTINE = 2 };

/* A file found under the store: its job, its file name (layout.h classifies it), its last
 * change in ms since the epoch. Returns one of SL_SSTORE_*. Called on the sweeping thread. */
typedef int (*sl_sstore_verdict_fn)(const char *job, const char *file, int64_t mtime_ms, void *arg);

/* A multipart upload no partial upload names (object storage): the shard file it was started
 * on, its id (at most SL_SSTORE_UPLOAD_MAX - 1 bytes), when it was initiated. Returns 0 to go on.
 */
#define SL_SSTORE_UPLOAD_MAX 512
typedef int (*sl_sstore_orphan_fn)(const char *job, const char *file, const char *upload_id,
                                   int64_t initiated_ms, void *arg);

/* How a remote store's requests ended lately (server/store/s3.h's sl_s3_health). */
typedef struct sl_sstore_health {
    uint64_t failures;        /* requests in a row that got no usable answer */
    int64_t failing_since_ms; /* wall clock of the first of them; 0 when failures == 0 */
    int64_t last_ok_ms;       /* wall clock of the last answered request; 0: none yet */
} sl_sstore_health;

typedef struct sl_sstore_ops {
    const char *kind; /* "dir", "s3" */
    int remote;       /* calls wait on the network */
    /* The writer hashes the data it is given into the `sha` of w_open (from the resumed
     * prefix's state on), one thread at a time with its writes: the caller then hashes nothing
     * itself. A backend that saves the hash state (object storage) saves a pass over the data. */
    int hashes;
    /* Writers (one thread at a time per writer). open: a new partial upload, or the kept one
     * resumed (its prefix of resume_from bytes hashed into `sha` again, or its saved hash
     * state loaded into `sha`): SL_ESTATE with msg if there is no matching partial upload.
     * write: the n ranges at data offset `off`, in order, offsets contiguous (hashed into `sha`
     * with ops.hashes; `sha` must then outlive the writer). finish: the header
     * with checksum `sha_hex` written and the shard durable, still as a partial upload
     * (sealed), published under its name only by w_publish, which the caller runs after the
     * catalog transaction that fences the attempt (an older shard of the rank replaced;
     * SL_EFENCED if a newer attempt removed or aborted this one's). Nothing is visible under
     * the name before. release: give back room
     * reserved ahead of the written bytes (the written bytes stay for a resume). close: free
     * the writer; `discard` removes the partial upload (and, after finish, the shard). */
    int (*w_open)(sl_sstore *s, const sl_swriter_spec *spec, sl_sha256 *sha, sl_swriter **out,
                  char *msg, size_t msglen);
    int (*w_write)(sl_swriter *w, const struct iovec *iov, int n, uint64_t off, char *msg,
                   size_t msglen);
    int (*w_finish)(sl_swriter *w, const char *sha_hex, char *msg, size_t msglen);
    int (*w_publish)(sl_swriter *w, char *msg, size_t msglen);
    void (*w_release)(sl_swriter *w);
    void (*w_close)(sl_swriter *w, int discard);
    /* Data bytes a kept partial upload of (job, name, rank) holds: SL_ENOTFOUND if none. */
    int (*held)(sl_sstore *s, const char *job, const char *name, int32_t rank, uint64_t *held);
    /* Readers: a stored file and its size in bytes (SL_ENOTFOUND if missing); reads of exactly
     * len bytes (SL_ECORRUPT if the file is shorter). */
    int (*r_open)(sl_sstore *s, const char *job, const char *file, sl_sreader **out, uint64_t *size,
                  char *msg, size_t msglen);
    int (*r_read)(sl_sreader *r, void *buf, size_t len, uint64_t off, char *msg, size_t msglen);
    void (*r_close)(sl_sreader *r);
    /* A small file written whole, atomically and durably (the metadata file). */
    int (*put)(sl_sstore *s, const char *job, const char *file, const void *buf, size_t len,
               char *msg, size_t msglen);
    /* Size of a stored file; SL_ENOTFOUND if missing. */
    int (*stat)(sl_sstore *s, const char *job, const char *file, uint64_t *size);
    /* Size and the checksum in the header of a stored shard file (object storage: a HEAD and a
     * ranged GET); SL_ENOTFOUND if missing, SL_ECORRUPT if the header does not parse. Commit
     * checks it against the catalog's row. */
    int (*shard_sha)(sl_sstore *s, const char *job, const char *file, uint64_t *size,
                     char sha[SL_SHARD_HEX_LEN + 1]);
    /* A shard recorded in the catalog but not under its name (a crash, or a pause, between the
     * record and w_publish): publish the sealed partial upload of (name, rank) whose header
     * carries `sha`, the record's checksum. 0, SL_ENOTFOUND if there is none, or an error. */
    int (*recover)(sl_sstore *s, const char *job, const char *name, int32_t rank, const char *sha);
    /* Object storage (NULL elsewhere), on a worker, once Commit found every rank of checkpoint
     * `name` published with the checksum its record has (shas[rank]): remove the state and head
     * objects that sealed uploads of those checksums left behind (a kill or a pause between
     * CompleteMultipartUpload and their removal). One listing; best effort. */
    void (*tidy)(sl_sstore *s, const char *job, const char *name, int32_t world_size,
                 const char (*shas)[SL_SHARD_HEX_LEN + 1]);
    /* Remove one file (missing: not an error). */
    int (*remove)(sl_sstore *s, const char *job, const char *file);
    /* Remove every file of checkpoint `name` of ranks [0, world_size): shards, partial uploads,
     * the metadata file. Failures are left to the sweeps. */
    int (*remove_ckpt)(sl_sstore *s, const char *job, const char *name, int32_t world_size);
    /* Room left for new shards (UINT64_MAX where the store does not say). */
    int (*free_bytes)(sl_sstore *s, uint64_t *out);
    /* Sweeps come in two shapes. A local backend sweeps in one pass on the loop thread (the
     * quarantine is loop-thread state): every file of every job, `verdict` decides, the backend
     * removes or quarantines; *removed and *moved count what was done. A remote backend (sweep
     * NULL) lists (`list`: every file of every job to `fn`, on a worker) and then acts on each
     * file the caller decided about (`act`, on a worker: REMOVE or QUARANTINE, skipped if the
     * file changed since mtime_ms). */
    int (*sweep)(sl_sstore *s, sl_sstore_verdict_fn verdict, void *arg, int *removed, int *moved);
    int (*list)(sl_sstore *s, sl_sstore_verdict_fn fn, void *arg);
    int (*act)(sl_sstore *s, const char *job, const char *file, int64_t mtime_ms, int action);
    /* Object storage (NULL elsewhere), on a worker: the multipart uploads on shard files that
     * were initiated before `before_ms` and that no state object names (neither a partial
     * upload's nor one in the quarantine), to `fn`: left by a crash between their start and
     * their first state, or by a state removed behind the daemon's back. A store that cannot
     * list its uploads (SL_EUNIMPL) lists none. abort_upload aborts one (a missing one is not an
     * error). */
    int (*orphans)(sl_sstore *s, int64_t before_ms, sl_sstore_orphan_fn fn, void *arg);
    int (*abort_upload)(sl_sstore *s, const char *job, const char *file, const char *upload_id);
    /* A remote store (NULL elsewhere): how its requests ended lately (thread-safe, no I/O),
     * and a probe (on a worker: one cheap request, counted like any other) that tells whether
     * it answers. server/store_health.c turns them into health. */
    void (*health)(sl_sstore *s, sl_sstore_health *out);
    int (*probe)(sl_sstore *s, char *msg, size_t msglen);
    void (*free)(sl_sstore *s);
} sl_sstore_ops;

/* Every backend's struct starts with this. */
struct sl_sstore {
    const sl_sstore_ops *ops;
};

static inline int sl_sstore_remote(const sl_sstore *s)
{
    return s->ops->remote;
}

static inline const char *sl_sstore_kind(const sl_sstore *s)
{
    return s->ops->kind;
}

static inline void sl_sstore_free(sl_sstore *s)
{
    if (s)
        s->ops->free(s);
}

/* The directory backend on `root` (made if missing, 0750). `quarantine` (may be NULL) receives
 * what sweeps quarantine. Returns 0 and *out, or -errno. */
struct sl_quar;
int sl_sstore_dir_new(sl_sstore **out, const char *root, struct sl_quar *quarantine);

/* The object-storage backend on the bucket and prefix of `cfg` (copied), parts of part_size
 * bytes (at least 5 MiB; larger where a shard would need more than 10,000 parts), at most
 * `inflight` parts of one upload sent at once. The bucket is checked (HEAD) before it returns:
 * a wrong endpoint, key or bucket is an error with msg. Returns 0 and *out, or an error. */
struct sl_s3_cfg;
int sl_sstore_s3_new(sl_sstore **out, const struct sl_s3_cfg *cfg, uint64_t part_size, int inflight,
                     char *msg, size_t msglen);

#endif
