/* Catalog queries for checkpoints and their shards (schema: migration 2 in catalog.c).
 *
 * A checkpoint is WRITING until every rank's shard is durable and recorded, then COMPLETE; an
 * aborted one is INCOMPLETE. The catalog records only what is already durable on disk. Every
 * function here runs on the loop thread (the catalog handle belongs to it) and returns 0, SL_EDB
 * for a SQLite failure (logged with SQLite's message; -ENOSPC or SL_EDBBUSY for a full disk or
 * a busy catalog, see catalog.h), or the code named in its comment.
 */
#ifndef SL_CATALOG_CKPT_H
#define SL_CATALOG_CKPT_H

#include "catalog.h"
#include "feed.h"

#include <stdint.h>

/* Same numbers as sluice.v1.CheckpointState. */
enum { SL_CKPT_WRITING = 1, SL_CKPT_COMPLETE = 2, SL_CKPT_INCOMPLETE = 3 };

#define SL_CAT_NAME_MAX    128
#define SL_CAT_USER_MD_MAX 8192

typedef struct sl_cat_ckpt {
    int64_t id;
    char job[SL_CAT_NAME_MAX + 1];
    char name[SL_CAT_NAME_MAX + 1];
    uint64_t step;
    int32_t world_size;
    int state;
    char user_metadata[SL_CAT_USER_MD_MAX + 1];
    int64_t created_ms, committed_ms;
    uint32_t shards;                    /* shard rows recorded */
    uint64_t total_bytes;               /* sum of their data sizes */
    char feed_job[SL_CAT_NAME_MAX + 1]; /* bound feed job, "" when none */
    int auto_commit;
    int has_feed_state; /* COMPLETE with the feed state it was taken at */
} sl_cat_ckpt;

#define SL_CAT_DIGEST 32 /* bytes of a block digest (SHA-256) */

typedef struct sl_cat_shard {
    int32_t rank;
    uint64_t data_size, file_size;
    char sha256[65];
    uint32_t tensor_count;
    const char *tensors_json; /* JSON array; borrowed (valid during a callback or a put) */
    int has_pos;              /* the rank's data position when its state was taken */
    uint64_t pos_epoch, pos_position;
    uint32_t pos_world;
    /* Put only: the SHA-256 of each block_size bytes of the data (SL_CAT_DIGEST bytes each,
     * block_count of them, borrowed); block_size 0: none (recorded as an older shard). */
    uint32_t block_size;
    const uint8_t *blocks;
    size_t block_count;
} sl_cat_shard;

/* Name of a state ("WRITING"), "UNKNOWN" otherwise. Static string. */
const char *sl_cat_ckpt_state_name(int state);

/* Create checkpoint (job, name) in state WRITING, or return the existing one: *created says
 * which. An existing INCOMPLETE checkpoint is reopened (WRITING, new world size and metadata).
 * Returns SL_EEXIST (and the existing one in *out) if it exists WRITING or COMPLETE with another
 * world size or step; SL_EEXIST (and *out untouched) when a new one's job equals another job's
 * name but for case, or its name another checkpoint's of the job (sl_cat_name_clash says
 * which). */
int sl_cat_ckpt_begin(sl_cat *cat, sl_cat_ckpt *out, int *created, const char *job,
                      const char *name, uint64_t step, int32_t world_size, const char *user_md,
                      int64_t now_ms);

/* Look up (job, name). Returns SL_ENOTFOUND if absent. */
int sl_cat_ckpt_get(sl_cat *cat, sl_cat_ckpt *out, const char *job, const char *name);

/* The job's newest COMPLETE checkpoint: highest step, then newest commit. SL_ENOTFOUND if none. */
int sl_cat_ckpt_latest(sl_cat *cat, sl_cat_ckpt *out, const char *job);

/* Called per checkpoint; return nonzero to stop (that value is returned by the iteration). */
typedef int (*sl_cat_ckpt_fn)(const sl_cat_ckpt *c, void *arg);

/* Checkpoints of `job` (NULL or "": all jobs) in `state` (0: all), newest first (step, then id). */
int sl_cat_ckpt_list(sl_cat *cat, const char *job, int state, sl_cat_ckpt_fn fn, void *arg);

/* Set the state (and committed_ms, 0 unless COMPLETE). SL_ENOTFOUND if the id is gone. */
int sl_cat_ckpt_set_state(sl_cat *cat, int64_t id, int state, int64_t committed_ms);

/* sl_cat_ckpt_begin and, when it created (or reopened) the checkpoint, sl_cat_ckpt_bind, in one
 * transaction: a checkpoint never exists without the binding it was begun with. */
int sl_cat_ckpt_begin_bound(sl_cat *cat, sl_cat_ckpt *out, int *created, const char *job,
                            const char *name, uint64_t step, int32_t world_size,
                            const char *user_md, int64_t now_ms, const char *feed_job,
                            int auto_commit);

/* Fencing (docs/operations.md, "What fences what"). Every change that needs a checkpoint WRITING
 * is conditional on it in its own transaction, with the checkpoint's row locked: recording a
 * shard, taking an upload lease, aborting, claiming the commit and making it COMPLETE. A commit
 * claim is a row (commit_claimer, commit_claim_ms): while it is live, no lease is taken, no shard
 * recorded and no abort done; a claim older than SL_CAT_CLAIM_STALE_MS by the catalog's clock
 * (sl_now_ms() in SQL: PostgreSQL's clock, never a replica's) is ended by the next of those, and
 * its claimant then fails to make the checkpoint COMPLETE. */
#define SL_CAT_CLAIM_STALE_MS 60000

/* Why a fenced change was refused. */
typedef struct sl_cat_refusal {
    int state;                     /* the checkpoint's state (SL_ESTATE) */
    int32_t rank;                  /* an upload in progress: its rank; -1: none */
    char who[SL_CAT_NAME_MAX + 1]; /* the replica claiming the commit or holding that upload */
} sl_cat_refusal;

/* Claim the commit of checkpoint `id` for `replica` (a live claim of another replica is refused;
 * `replica`'s own, left by a process of it that died, is taken back at once), in one transaction
 * that also finds no live upload lease of it on any replica. *token identifies the claim for
 * sl_cat_ckpt_complete / _unclaim. Returns 0; SL_ENOTFOUND; SL_ESTATE when it is not WRITING
 * (why->state) or an upload of why->rank runs on replica why->who; SL_EUNAVAILABLE while
 * why->who's claim holds. */
int sl_cat_ckpt_claim(sl_cat *cat, int64_t id, const char *replica, int64_t *token,
                      sl_cat_refusal *why);
/* End the claim `token` of `replica` after a failed commit (a claim ended meanwhile is left). */
int sl_cat_ckpt_unclaim(sl_cat *cat, int64_t id, const char *replica, int64_t token);

/* A replica starting: what a process of it that died left, its upload leases and commit
 * claims, is dropped, so that any replica may resume those uploads and commits at once instead
 * of after the lease's TTL (replica identities are unique, so no process of it is running).
 * *n: how many were dropped. */
int sl_cat_replica_restarted(sl_cat *cat, const char *replica, int64_t *n);

/* Bind a checkpoint to a feed job ("" : none) and set its auto-commit; forgets a stored feed
 * state (a reopened checkpoint). */
int sl_cat_ckpt_bind(sl_cat *cat, int64_t id, const char *feed_job, int auto_commit);

/* Make a WRITING checkpoint COMPLETE with the feed state it was taken at (all NULL/empty: none),
 * in one statement: the feed state is never recorded without the state or the other way round.
 * With a claim (token nonzero), only while that claim of `replica` still holds. SL_ESTATE if it
 * is not WRITING (another replica committed or aborted it first) or the claim was lost. */
int sl_cat_ckpt_complete(sl_cat *cat, int64_t id, int64_t committed_ms, const char *replica,
                         int64_t token, const sl_cat_blob *state, const sl_cat_blob *spec,
                         const sl_cat_blob *elastic);

/* The stored feed state (packed sluice.v1.FeedState) and the job's spec and elastic state of that
 * epoch (spec, elastic may be NULL). SL_ENOTFOUND if the checkpoint has none. Free each with
 * sl_cat_blob_free. */
int sl_cat_ckpt_feed_get(sl_cat *cat, int64_t id, sl_cat_blob *state, sl_cat_blob *spec,
                         sl_cat_blob *elastic);

/* Delete a checkpoint and its shard rows, and record the removal of its files at now_ms (one
 * transaction). Deleting an id that is gone is not an error. */
int sl_cat_ckpt_delete(sl_cat *cat, int64_t id, int64_t now_ms);

/* Abort checkpoint `id`: only a WRITING one with no live commit claim. Forget its shards and
 * upload leases (fencing out every upload of it), make it INCOMPLETE and record the removal of
 * its files at now_ms (one transaction). SL_ENOTFOUND if the id is gone, SL_ESTATE if it is not
 * WRITING (why->state), SL_EUNAVAILABLE while why->who's commit claim holds. */
int sl_cat_ckpt_abort(sl_cat *cat, int64_t id, int64_t now_ms, sl_cat_refusal *why);

/* Removals: the checkpoints whose files the catalog decided to remove (Delete, Abort) and when.
 * A file of such a checkpoint that is no newer than the decision is garbage; a newer one was
 * written after it (the name used again, or a catalog restored from an older backup) and is not.
 * sl_cat_removal_get returns the time of the last removal of (job, name) or SL_ENOTFOUND;
 * sl_cat_removals_clear forgets them all (after the startup sweep has dealt with their files). */
int sl_cat_removal_get(sl_cat *cat, const char *job, const char *name, int64_t *removed_ms);
int sl_cat_removals_clear(sl_cat *cat);

/* Total bytes of the tensor lists (JSON) recorded for the checkpoint's shards, leaving out
 * `except_rank` (-1: none). */
int sl_cat_ckpt_tensor_bytes(sl_cat *cat, uint64_t *out, int64_t ckpt_id, int32_t except_rank);

/* Record (insert or replace) a shard of checkpoint `ckpt_id`, in one transaction that finds the
 * checkpoint WRITING with no live commit claim and, with `lease` (the generation
 * sl_cat_lease_take gave; 0: none, a catalog of one daemon), that lease still this upload's; the
 * lease is dropped with the record. Returns 0; SL_ESTATE / SL_EUNAVAILABLE as sl_cat_ckpt_abort;
 * SL_EFENCED if a newer attempt took the lease over (nothing recorded). */
int sl_cat_shard_put(sl_cat *cat, int64_t ckpt_id, const sl_cat_shard *s, int64_t now_ms,
                     int64_t lease, sl_cat_refusal *why);

/* Upload leases (a shared catalog): one upload attempt per (checkpoint, rank) across replicas.
 * Take: always succeeds on a WRITING checkpoint with no live commit claim, with a new generation
 * from the catalog's sequence into *gen (never the same twice): an attempt that held it before,
 * alive or not, is fenced out (it can neither renew nor record); its replica, if its lease was
 * still live, into why->who. SL_ESTATE / SL_EUNAVAILABLE / SL_ENOTFOUND as sl_cat_ckpt_abort.
 * Renew: the expiry moves to the catalog's now + ttl while gen is still the lease's; SL_ESTATE
 * once it is not (taken over). Release: dropped if still `gen`'s. */
int sl_cat_lease_take(sl_cat *cat, int64_t ckpt_id, int32_t rank, const char *replica,
                      int64_t ttl_ms, int64_t *gen, sl_cat_refusal *why);
int sl_cat_lease_renew(sl_cat *cat, int64_t ckpt_id, int32_t rank, int64_t gen, int64_t ttl_ms);
int sl_cat_lease_release(sl_cat *cat, int64_t ckpt_id, int32_t rank, int64_t gen);

/* The live lease (by the catalog's clock) of (checkpoint, rank) held by a replica other than
 * `replica`: 1 and its holder, or 0 when there is none. */
int sl_cat_lease_elsewhere(sl_cat *cat, int64_t ckpt_id, int32_t rank, const char *replica,
                           char *holder, size_t len);

/* Look up one shard (tensors_json is NULL). SL_ENOTFOUND if the rank has none. */
int sl_cat_shard_get(sl_cat *cat, sl_cat_shard *out, int64_t ckpt_id, int32_t rank);

/* Block digests of the shard of (ckpt_id, rank) whose checksum is still `sha256` (a download
 * reads them a window at a time; a row replaced since is SL_ENOTFOUND): at most `max` of them
 * from block `first` on, into out (room for max * SL_CAT_DIGEST bytes), their number into *n
 * and the shard's block size into *block_size (0 and *n 0: a shard recorded without them).
 * SL_ECORRUPT if the row's list is not whole digests. */
int sl_cat_shard_blocks(sl_cat *cat, int64_t ckpt_id, int32_t rank, const char *sha256,
                        uint64_t first, uint32_t max, uint8_t *out, uint32_t *n,
                        uint32_t *block_size);

/* Forget one shard, or all shards of a checkpoint (rank < 0). */
int sl_cat_shard_delete(sl_cat *cat, int64_t ckpt_id, int32_t rank);

typedef int (*sl_cat_shard_fn)(const sl_cat_shard *s, void *arg);

/* The checkpoint's shards in rank order; tensors_json is set only if with_tensors. */
int sl_cat_shard_list(sl_cat *cat, int64_t ckpt_id, int with_tensors, sl_cat_shard_fn fn,
                      void *arg);

/* How many checkpoints are in each state: counts[SL_CKPT_WRITING] etc. (index 0 unused).
 * Loop thread. Returns 0 or SL_EDB. */
int sl_cat_ckpt_count_states(sl_cat *cat, uint64_t counts[4]);

/* Retention policy: keep the last `keep_last` COMPLETE checkpoints of `job` (0: keep all). */
int sl_cat_retention_set(sl_cat *cat, const char *job, uint32_t keep_last);

/* The job's policy into *keep_last (0 when none was set). */
int sl_cat_retention_get(sl_cat *cat, const char *job, uint32_t *keep_last);

#endif
