/* Private to server/ckpt/: the Checkpoints service's state and what its files share. Loop thread
 * only, unless a comment says otherwise.
 *
 * ckpt.c owns the service (method table, constructor, sweep timer); each RPC lives in the file
 * of its concern: query.c (Begin, Get, List, Latest, UploadStatus), upload.c with upload_io.c
 * (UploadShard), commit.c (Commit, Abort, Delete, SetRetention), verify.c, download.c. reply.c
 * holds the checks and answers they share, metadata.c renders metadata.json, sweep.c removes
 * abandoned files and quarantines unknown ones. Files and paths on disk are server/store/'s.
 */
#ifndef SL_CKPT_INTERNAL_H
#define SL_CKPT_INTERNAL_H

#include "ckpt.h"
#include "validate.h"

#include "catalog/ckpt.h"
#include "shard.h"
#include "store/sstore.h"
#include "util/buf.h"
#include "util/clock.h"

#include <limits.h>
#include <stdint.h>
#include <uv.h>

#define UP_INFLIGHT 8  /* chunks held in memory per upload */
#define UP_RING     16 /* ring slots, at least UP_INFLIGHT */
_Static_assert(UP_RING >= UP_INFLIGHT, "the chunk ring must hold every chunk in flight");
#define DL_CHUNK  (1u << 20) /* download message size */
#define DL_QUEUED 3          /* download messages queued per call */
#define LIST_MAX  10000      /* checkpoints in one List answer */
/* metadata.json is rendered in memory (commit, quick verify): its tensor lists are capped. */
#define META_MAX        (64u << 20)
#define SWEEP_PERIOD_MS 60000
#define CKPT_MSG_MAX    512 /* room for any message of validate.h */

/* Deep Verify calls in progress at once (hashing or waiting for a hash slot); one more is
 * refused with RESOURCE_EXHAUSTED. */
#define DEEP_CALLS_MAX 64

typedef struct upload upload;
typedef struct verify verify;
typedef struct ckpt_rsweep ckpt_rsweep;
typedef struct ckpt_sjob ckpt_sjob;

/* A checkpoint with a commit in progress on this replica: uploads, aborts and other commits here
 * wait for it (across replicas, the commit claim in the catalog does). */
typedef struct ckpt_mark {
    int64_t id;
    struct ckpt_mark *next;
} ckpt_mark;

struct sl_ckpt_svc {
    uv_loop_t *loop;
    sl_cat *cat;
    sl_ckpt_opts opts;
    char data_dir[PATH_MAX]; /* the directory sl_ckpt_opts.lock_fd holds */
    sl_rpc_service svc;
    upload *uploads;   /* registered uploads (OPENING .. FAILING) */
    uint64_t mem_held; /* bytes of upload chunks in memory, all uploads */
    int mem_blocked;   /* an upload did not ask for its next chunk because of the budget */
    ckpt_mark *committing;
    /* Deep verifies (verify.c): shard hash jobs on the worker pool now (at most
     * opts.max_deep_verifies), the calls in progress, and those waiting for a slot, served in
     * turn one shard at a time. */
    int deep_running;
    int deep_calls;
    verify *deep_head, *deep_tail;
    uv_timer_t sweep;
    ckpt_rsweep *rsweep; /* a sweep of object storage on the worker pool (sweep.c) */
    /* Small jobs on a remote store (gate.c): at most opts.store_jobs on the worker pool at
     * once, the others waiting in arrival order. */
    int sjobs_running;
    ckpt_sjob *sjobs_head, *sjobs_tail;
    int stopping;   /* sl_ckpt_svc_free was called: freed once the timer closed and no
                     * sweep runs */
    int timer_open; /* the sweep timer's handle is not closed yet */
    int dir_lost;   /* the data dir was replaced under the daemon: sweeps stopped */
    /* An upload of (job, name) ended (its shard recorded, or not while others were held back by
     * it): ckpt.c sets it to commit.c's ckpt_auto_commit, so upload.c never calls commit.c
     * (which calls upload.c to abort uploads). */
    void (*upload_settled)(sl_ckpt_svc *s, const char *job, const char *name);
};

/* ---- lease.c: one upload per (checkpoint, rank) across the replicas of a shared catalog ---- */

/* At start: drop the leases and commit claims a dead process of this replica left (no-op with
 * SQLite). */
void ckpt_lease_restarted(sl_ckpt_svc *s);

/* Take the lease of (ck, rank) for `up` (no-op with SQLite); answers the call UNAVAILABLE when
 * another replica's upload holds it. Returns 1 to go on. */
int ckpt_lease_take(upload *up, int64_t ckpt_id, int32_t rank);

/* Renew the lease now and then (up_pump); 0, or an error once this upload may no longer write:
 * the lease was taken over, or could not be renewed before its fence. */
int ckpt_lease_keep(upload *up, char *msg, size_t len);

/* Drop the lease of an upload that stopped or failed (another replica may take it at once). */
void ckpt_lease_drop(upload *up);

/* 1 if a live lease of (ckpt, rank) is held by another replica (UploadStatus). */
int ckpt_lease_elsewhere(sl_ckpt_svc *s, int64_t ckpt_id, int32_t rank);

/* The lifecycle of one UploadShard call. Every change goes through up_to() in upload.c, which
 * checks it against the table there, logs it and runs the entry actions named here.
 *
 *   HEADER -> OPENING -> RECEIVING -> DRAINING -> FINALIZING [-> PUBLISHING] -> DONE
 *                                                                         (stored: the receipt)
 *   HEADER -> DONE                                       (refused before anything was opened)
 *   OPENING | RECEIVING | DRAINING -> STOPPING   (the client went away, the stream ended short,
 *                                                 a resume did not match: resumable)
 *   OPENING | RECEIVING | DRAINING | FINALIZING | STOPPING -> FAILING  (bad input, I/O, abort)
 *   FINALIZING | PUBLISHING -> ABORTING -> FAILING  (checkpoint aborted while finalizing)
 *   FINALIZING | PUBLISHING -> FAILING      (fenced out in the catalog, or the rename failed)
 *   FAILING -> FAILING                (aborted while failing: this failure is answered at once)
 *   STOPPING | FAILING -> DONE                            (once no lane job runs)
 */
typedef enum up_state {
    UP_HEADER,     /* waiting for the header; not registered. Rejected: DONE */
    UP_OPENING,    /* entry: registered, the write lane opens the partial file or checks and
                    * re-hashes the prefix kept for a resume */
    UP_RECEIVING,  /* chunks are read and handed to the lanes without a copy */
    UP_DRAINING,   /* the stream ended: the lanes finish the chunks they have, then the size and
                    * checksum are checked */
    UP_FINALIZING, /* entry: the write lane writes the real header and fsyncs; then the catalog
                    * row, in the transaction that fences the attempt (sl_cat_shard_put) */
    UP_PUBLISHING, /* entry: the write lane renames the shard under its name (replacing an older
                    * one of the rank) and fsyncs the directory; then the receipt. Object
                    * storage published when finishing and skips this state */
    UP_ABORTING,   /* the checkpoint was aborted during FINALIZING: the new shard file is removed
                    * when the lane returns, and the call fails */
    UP_STOPPING,   /* ended, the partial file kept for a resume; lane jobs still running return
                    * first, then the write lane gives back the space reserved beyond the written
                    * bytes */
    UP_FAILING,    /* failed, the partial file removed; lane jobs still running return first, and
                    * only then is the failure answered, so that a client retrying at once does
                    * not find its own upload still in progress */
    UP_DONE,       /* entry: chunks freed, file closed, partial file removed after FAILING,
                    * unregistered, the answer of STOPPING/FAILING sent. Nothing more happens */
} up_state;

/* One chunk as received: the RPC layer's buffers, no copy. */
typedef struct up_chunk {
    sl_rpc_bytes *bytes;
    uint64_t off; /* data offset */
    size_t len;
} up_chunk;

/* An UploadShard call. The chunk pipeline: chunks wait in a ring, numbered by arrival; two lanes
 * run at once on the worker pool: the hash lane hashes them in order, the write lane writes them
 * at their offsets (it also runs the open and finalize steps). A lane job works on
 * [seq_x, x_end) taken at its start, and a lane is idle when seq_x == x_end; the loop only
 * appends behind the jobs and frees chunks both lanes passed. */
struct upload {
    sl_ckpt_svc *svc;
    sl_rpc_call *call;
    /* With a shared catalog: the generation of this upload's lease (0: none), when it was last
     * renewed, and the time after which this replica stops writing for it unless renewed
     * (lease.c). */
    int64_t lease;
    uint64_t lease_renewed_ms, lease_fence_ms;
    upload *next; /* in svc->uploads while registered */
    up_state state;
    int jobs; /* lane jobs on the worker pool (0..2), each holding a call reference */
    int64_t ckpt_id;
    char job[SL_SHARD_NAME_MAX + 1], name[SL_SHARD_NAME_MAX + 1];
    int32_t rank, world_size;
    sl_swriter *w; /* the shard store's writer, from OPENING until closed (write lane) */
    int discard;   /* close the writer discarding what it wrote (FAILING) */
    int dying;     /* the call is being freed: no lane job may start */
    sl_sha256 *sha;
    uint64_t data_size;
    uint64_t received;        /* data bytes accepted from the stream (incl. the resumed prefix) */
    uint64_t written;         /* data bytes written by the write lane (its thread) */
    uint64_t acked;           /* `written` as of the last write job, for the loop thread */
    int released;             /* STOPPING: the reservation beyond `written` was given back */
    uint64_t t_header, t_eof; /* loop time (ms) of the header and of the end of the stream */
    uint64_t resume_from;
    char client_sha[SL_SHARD_HEX_LEN + 1];
    char sha_hex[SL_SHARD_HEX_LEN + 1];
    char *tensors_json;
    uint32_t tensor_count;
    int has_pos; /* the header's data position */
    uint64_t pos_epoch, pos_position;
    uint32_t pos_world;
    up_chunk ring[UP_RING];
    uint64_t seq_tail, seq_free, seq_hash, seq_write, hash_end, write_end;
    sl_cat_work work, hwork; /* write lane, hash lane */
    int err, herr;           /* results of the last write-lane / hash-lane job */
    char errmsg[256];        /* what the write-lane job could not do */
    /* The answer STOPPING or FAILING sends on DONE (answer_err 0: none, the client is gone). */
    int answer_err;
    char answer_msg[CKPT_MSG_MAX];
};

/* The running upload of (ckpt_id, rank), or of any rank with rank < 0; NULL if none. */
static inline upload *ckpt_upload_find(const sl_ckpt_svc *s, int64_t ckpt_id, int32_t rank)
{
    for (upload *u = s->uploads; u; u = u->next)
        if (u->ckpt_id == ckpt_id && (rank < 0 || u->rank == rank))
            return u;
    return NULL;
}

/* 1 if a commit of checkpoint `id` is in progress. */
static inline int ckpt_is_committing(const sl_ckpt_svc *s, int64_t id)
{
    for (const ckpt_mark *m = s->committing; m; m = m->next)
        if (m->id == id)
            return 1;
    return 0;
}

/* ---- gate.c: small jobs on the store ---- */

/* Run a small store job (removals, UploadStatus, metadata rewrites, the periodic sweep): with a
 * remote store on the worker pool, at most opts.store_jobs of them at once and the others
 * queued in arrival order, so that a store that answers slowly holds at most that many workers
 * and uploads, commits and verifies still find theirs (the loop never waits on the network;
 * `after` runs in the catalog lane). With a local store right here (fn, then after, as the pool
 * would). fn and after get &w->work, whose data the caller set. Once the service is stopping,
 * queued jobs all start at once, as they did before the cap. Loop thread. */
void ckpt_store_job(sl_ckpt_svc *s, sl_cat_work *w, uv_work_cb fn, uv_after_work_cb after);

/* Start every queued store job now, whatever the cap (sl_ckpt_svc_free). */
void ckpt_store_jobs_flush(sl_ckpt_svc *s);

/* ---- reply.c: checks and answers shared by the handlers ---- */

/* sl_ckpt_check_names; on failure answers the call and returns 0. Returns 1 if valid. */
int ckpt_names_ok(sl_rpc_call *call, const char *job, const char *name);

/* Look up a checkpoint; on failure answers the call (NOT_FOUND or the catalog's error) and
 * returns the error. */
int ckpt_find(sl_ckpt_svc *s, sl_rpc_call *call, sl_cat_ckpt *ck, const char *job,
              const char *name);

/* A fenced change the catalog refused (sl_cat_refusal), as a message naming the checkpoint and
 * why into msg; returns the code to answer with (a commit claimed by another replica, which
 * callers other than Commit see as a precondition, is SL_ESTATE). ckpt_refusal_fail answers the
 * call with it. */
int ckpt_refusal_msg(char *msg, size_t len, int err, const sl_cat_refusal *why, const char *job,
                     const char *name);
void ckpt_refusal_fail(sl_rpc_call *call, int err, const sl_cat_refusal *why, const char *job,
                       const char *name);

/* Fill a Checkpoint message with copies of the strings (shards left empty); free with
 * ckpt_pb_clear, which also frees shards the caller attached. */
void ckpt_pb_fill(Sluice__V1__Checkpoint *m, const sl_cat_ckpt *c);
void ckpt_pb_clear(Sluice__V1__Checkpoint *m);

/* The checkpoint's stored feed state into *out (NULL when it has none; free with
 * sluice__v1__feed_state__free_unpacked). Returns 0, the catalog's error or SL_ECORRUPT. */
int ckpt_feed_state_load(sl_ckpt_svc *s, const sl_cat_ckpt *c, Sluice__V1__FeedState **out);

/* Answer the call with the checkpoint and its feed state (or the error reading it). */
void ckpt_reply(sl_ckpt_svc *s, sl_rpc_call *call, const sl_cat_ckpt *c);

/* ---- metadata.c ---- */

/* Render <name>.metadata.json of checkpoint c from the catalog into b (initialized by the caller,
 * who frees it), with the feed state `fs` (NULL: the stored one, if any), as committed at
 * committed_ms (Commit writes it, Verify compares the file byte for
 * byte). Returns 0, the catalog's error, or the buffer's (-ENOMEM, SL_ELIMIT). */
int ckpt_render_metadata(sl_ckpt_svc *s, const sl_cat_ckpt *c, int64_t committed_ms,
                         const Sluice__V1__FeedState *fs, sl_buf *b);

/* ---- upload.c / upload_io.c: UploadShard ---- */

void ckpt_upload_start(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg);
void ckpt_upload_message(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg);
void ckpt_upload_bad_message(sl_rpc_call *call, int err, const char *why, void *arg);
void ckpt_upload_cancel(sl_rpc_call *call, void *arg);

/* The upload's checkpoint was aborted (the catalog already forgot its shards): a running upload
 * fails at once; one in FINALIZING removes its shard file when the lane returns. */
void ckpt_upload_abort(upload *up);

/* Write-lane and hash-lane jobs (worker threads): each reads the upload's inputs, which the loop
 * does not change while the job runs, and leaves its result in err/errmsg (herr). */
void ckpt_up_open_work(uv_work_t *w);
void ckpt_up_write_work(uv_work_t *w);
void ckpt_up_hash_work(uv_work_t *w);
void ckpt_up_final_work(uv_work_t *w);
void ckpt_up_publish_work(uv_work_t *w);
/* Give back the space reserved beyond the written bytes (kept for a resume): STOPPING. */
void ckpt_up_release_work(uv_work_t *w);
/* Close the writer, discarding what it wrote with up->discard: STOPPING and FAILING. */
void ckpt_up_close_work(uv_work_t *w);

/* ---- query.c ---- */

void ckpt_begin(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg);
void ckpt_get(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg);
void ckpt_list(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg);
void ckpt_latest(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg);
void ckpt_upload_status(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg);

/* ---- commit.c ---- */

void ckpt_commit(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg);
void ckpt_abort(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg);
void ckpt_delete(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg);
void ckpt_set_retention(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg);
void ckpt_restore(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg);

/* A shard of (job, name) was recorded: commit the checkpoint now if it asked for auto-commit
 * and every rank's shard is durable. A refusal is logged (the checkpoint stays WRITING). */
void ckpt_auto_commit(sl_ckpt_svc *s, const char *job, const char *name);

/* ckpt_auto_commit for every WRITING auto-commit checkpoint whose shards are all recorded: the
 * ones whose commit a crash cut short (the replica or daemon that recorded the last shard died
 * first). At start and with every periodic sweep. */
void ckpt_auto_commit_pending(sl_ckpt_svc *s);

/* ---- verify.c, download.c ---- */

void ckpt_verify(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg);
void ckpt_verify_cancel(sl_rpc_call *call, void *arg); /* on_cancel: the hashing stops */
void ckpt_download(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg);
void ckpt_download_pump(sl_rpc_call *call, void *arg); /* on_writable */

/* ---- sweep.c ---- */

/* Remove abandoned files under the store root: partial uploads of WRITING checkpoints untouched
 * for the upload timeout (and not running); at `startup` also temp files. Files of checkpoints
 * the catalog does not know (partial uploads always; shard and metadata files at `startup`) are
 * removed if the catalog recorded their removal no earlier than their last change, else moved to
 * the quarantine. Does nothing once the data dir was replaced (sl_ckpt_opts.lock_fd) or the
 * catalog file was (sl_cat_check). */
void ckpt_sweep(sl_ckpt_svc *s, int startup);

/* Free the service if it is stopping and nothing holds it (the timer closed, no sweep and no
 * store job runs or waits): in gate.c, below the sweep and the store jobs, which may outlive
 * sl_ckpt_svc_free and call it as they end. */
void ckpt_svc_release(sl_ckpt_svc *s);

#endif
