/* Checkpoint queries (engine-neutral, db.h). */
#include "ckpt.h"

#include "internal.h"

#include "err.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *sl_cat_ckpt_state_name(int state)
{
    switch (state) {
    case SL_CKPT_WRITING:
        return "WRITING";
    case SL_CKPT_COMPLETE:
        return "COMPLETE";
    case SL_CKPT_INCOMPLETE:
        return "INCOMPLETE";
    default:
        return "UNKNOWN";
    }
}

#define CKPT_COLS                                                                                  \
    "SELECT c.id, c.job, c.name, c.step, c.world_size, c.state, c.user_metadata, c.created_ms, "   \
    "c.committed_ms, (SELECT count(*) FROM checkpoint_shards s WHERE s.checkpoint_id = c.id), "    \
    "(SELECT coalesce(sum(data_size), 0) FROM checkpoint_shards s WHERE s.checkpoint_id = c.id), " \
    "c.feed_job, c.auto_commit, CASE WHEN c.feed_state IS NULL THEN 0 ELSE 1 END "                 \
    "FROM checkpoints c "

static void read_ckpt(sl_cat_ckpt *out, sl_db_q *q)
{
    memset(out, 0, sizeof(*out));
    out->id = sl_db_int_col(q, 0);
    sl_db_copy_text(q, 1, out->job, sizeof(out->job));
    sl_db_copy_text(q, 2, out->name, sizeof(out->name));
    out->step = (uint64_t)sl_db_int_col(q, 3);
    out->world_size = (int32_t)sl_db_int_col(q, 4);
    out->state = (int)sl_db_int_col(q, 5);
    sl_db_copy_text(q, 6, out->user_metadata, sizeof(out->user_metadata));
    out->created_ms = sl_db_int_col(q, 7);
    out->committed_ms = sl_db_int_col(q, 8);
    out->shards = (uint32_t)sl_db_int_col(q, 9);
    out->total_bytes = (uint64_t)sl_db_int_col(q, 10);
    sl_db_copy_text(q, 11, out->feed_job, sizeof(out->feed_job));
    out->auto_commit = (int)sl_db_int_col(q, 12);
    out->has_feed_state = (int)sl_db_int_col(q, 13);
}

/* Run `sql` (q's parameters bound), expected to yield at most one checkpoint row. */
static int one_ckpt(sl_db_q *q, const char *sql, sl_cat_ckpt *out)
{
    int rc, err = sl_db_run(q, sql, 0);

    if (!err) {
        rc = sl_db_next(q);
        if (rc == 1)
            read_ckpt(out, q);
        err = rc == 1 ? 0 : rc == 0 ? SL_ENOTFOUND : rc;
    }
    sl_db_end(q);
    return err;
}

int sl_cat_ckpt_get(sl_cat *cat, sl_cat_ckpt *out, const char *job, const char *name)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "ckpt_get");
    sl_db_text(&q, job);
    sl_db_text(&q, name);
    return one_ckpt(&q, CKPT_COLS "WHERE c.job = ?1 AND c.name = ?2", out);
}

int sl_cat_ckpt_latest(sl_cat *cat, sl_cat_ckpt *out, const char *job)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "ckpt_latest");
    sl_db_text(&q, job);
    return one_ckpt(&q,
                    CKPT_COLS "WHERE c.job = ?1 AND c.state = 2 "
                              "ORDER BY c.step DESC, c.committed_ms DESC, c.id DESC LIMIT 1",
                    out);
}

/* Run a write of one checkpoint's row: SL_ENOTFOUND when it changed none. */
static int ckpt_write(sl_db_q *q, const char *sql)
{
    int64_t changes = 0;
    int err = sl_db_exec(q, sql, 0, &changes);

    return !err && changes == 0 ? SL_ENOTFOUND : err;
}

int sl_cat_ckpt_begin(sl_cat *cat, sl_cat_ckpt *out, int *created, const char *job,
                      const char *name, uint64_t step, int32_t world_size, const char *user_md,
                      int64_t now_ms)
{
    sl_db_q q;
    int err;

    *created = 0;
    err = sl_cat_ckpt_get(cat, out, job, name);
    if (err == 0 && out->state != SL_CKPT_INCOMPLETE)
        return out->world_size == world_size && out->step == step ? 0 : SL_EEXIST;
    if (err != 0 && err != SL_ENOTFOUND)
        return err;
    if (err == 0) {
        sl_db_q_init(&q, cat, "ckpt_reopen");
        sl_db_int(&q, out->id);
        sl_db_int(&q, world_size);
        sl_db_int(&q, (int64_t)step);
        sl_db_text(&q, user_md ? user_md : "");
        sl_db_int(&q, now_ms);
        err = sl_db_exec(&q,
                         "UPDATE checkpoints SET state = 1, world_size = ?2, step = ?3, "
                         "user_metadata = ?4, created_ms = ?5, committed_ms = 0, "
                         "commit_claim_ms = 0 WHERE id = ?1",
                         0, NULL);
    } else {
        char other[SL_CAT_FEED_NAME_MAX + 1];
        if ((err = sl_cat_name_clash(cat, SL_CAT_NAME_JOB, NULL, job, other, sizeof(other))) ||
            (err = sl_cat_name_clash(cat, SL_CAT_NAME_CKPT, job, name, other, sizeof(other))))
            return err;
        sl_db_q_init(&q, cat, "ckpt_insert");
        sl_db_text(&q, job);
        sl_db_text(&q, name);
        sl_db_int(&q, (int64_t)step);
        sl_db_int(&q, world_size);
        sl_db_text(&q, user_md ? user_md : "");
        sl_db_int(&q, now_ms);
        /* A replica that inserted the same name a moment earlier wins: nothing is inserted
         * (DO NOTHING: a failed INSERT would end a PostgreSQL transaction), and the caller gets
         * what that replica made. */
        int64_t changes = 0;
        err = sl_db_exec(&q,
                         "INSERT INTO checkpoints(job, name, step, world_size, state, "
                         "user_metadata, created_ms) VALUES (?1, ?2, ?3, ?4, 1, ?5, ?6) "
                         "ON CONFLICT (job, name) DO NOTHING",
                         0, &changes);
        if (!err && changes == 0) {
            err = sl_cat_ckpt_get(cat, out, job, name);
            return err ? err : out->world_size == world_size && out->step == step ? 0 : SL_EEXIST;
        }
    }
    if (!err)
        err = sl_cat_ckpt_get(cat, out, job, name);
    if (!err)
        *created = 1;
    return err;
}

int sl_cat_ckpt_list(sl_cat *cat, const char *job, int state, sl_cat_ckpt_fn fn, void *arg)
{
    sl_db_q q;
    sl_cat_ckpt c;
    int rc = 0, err;

    sl_db_q_init(&q, cat, "ckpt_list");
    sl_db_text(&q, job ? job : "");
    sl_db_int(&q, state);
    err = sl_db_run(&q,
                    CKPT_COLS "WHERE (?1 = '' OR c.job = ?1) AND (?2 = 0 OR c.state = ?2) "
                              "ORDER BY c.job, c.step DESC, c.id DESC",
                    0);
    while (!err && (rc = sl_db_next(&q)) == 1) {
        read_ckpt(&c, &q);
        err = fn(&c, arg);
    }
    sl_db_end(&q);
    return err ? err : rc;
}

int sl_cat_ckpt_set_state(sl_cat *cat, int64_t id, int state, int64_t committed_ms)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "ckpt_set_state");
    sl_db_int(&q, id);
    sl_db_int(&q, state);
    sl_db_int(&q, committed_ms);
    return ckpt_write(&q, "UPDATE checkpoints SET state = ?2, committed_ms = ?3 WHERE id = ?1");
}

int sl_cat_ckpt_bind(sl_cat *cat, int64_t id, const char *feed_job, int auto_commit)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "ckpt_bind");
    sl_db_int(&q, id);
    sl_db_text(&q, feed_job ? feed_job : "");
    sl_db_int(&q, auto_commit != 0);
    return ckpt_write(&q, "UPDATE checkpoints SET feed_job = ?2, auto_commit = ?3, "
                          "feed_state = NULL, feed_spec = NULL, feed_elastic = NULL "
                          "WHERE id = ?1");
}

/* Lock checkpoint `id`'s row for a change that needs it WRITING with no live commit claim, in the
 * caller's transaction. A claim older than SL_CAT_CLAIM_STALE_MS by the catalog's clock is
 * ended here, so that its claimant, if it ever wakes, fails to make the checkpoint COMPLETE.
 * Returns 0, or why not: SL_ENOTFOUND, SL_ESTATE (not WRITING; its state into *state),
 * SL_EUNAVAILABLE (a live claim; the claimer into who). */
int sl_cat_fence_ckpt(sl_cat *cat, int64_t id, int *state, char *who, size_t len)
{
    int64_t changes = 0;
    sl_db_q q;
    int rc, err;

    sl_db_q_init(&q, cat, "ckpt_fence");
    sl_db_int(&q, id);
    sl_db_int(&q, SL_CAT_CLAIM_STALE_MS);
    err = sl_db_exec(&q,
                     "UPDATE checkpoints SET commit_claim_ms = 0 WHERE id = ?1 AND state = 1 AND "
                     "(commit_claim_ms = 0 OR commit_claim_ms < sl_now_ms() - ?2)",
                     0, &changes);
    if (err || changes)
        return err;
    sl_db_q_init(&q, cat, "ckpt_fence_why");
    sl_db_int(&q, id);
    err = sl_db_run(&q, "SELECT state, commit_claimer FROM checkpoints WHERE id = ?1", 0);
    if (!err) {
        rc = sl_db_next(&q);
        if (rc == 1) {
            if (state)
                *state = (int)sl_db_int_col(&q, 0);
            if (who)
                sl_db_copy_text(&q, 1, who, len);
            err = sl_db_int_col(&q, 0) == SL_CKPT_WRITING ? SL_EUNAVAILABLE : SL_ESTATE;
        } else {
            err = rc == 0 ? SL_ENOTFOUND : rc;
        }
    }
    sl_db_end(&q);
    return err;
}

/* A live upload lease of checkpoint `id` (by the catalog's clock): 1 with its rank and holder,
 * 0 if none, or an error. */
static int live_lease(sl_cat *cat, int64_t id, int32_t *rank, char *who, size_t len)
{
    sl_db_q q;
    int rc, err;

    sl_db_q_init(&q, cat, "ckpt_live_lease");
    sl_db_int(&q, id);
    err = sl_db_run(&q,
                    "SELECT rank, replica FROM upload_leases WHERE checkpoint_id = ?1 AND "
                    "expires_ms >= sl_now_ms() ORDER BY rank LIMIT 1",
                    0);
    if (!err) {
        rc = sl_db_next(&q);
        if (rc == 1) {
            *rank = (int32_t)sl_db_int_col(&q, 0);
            sl_db_copy_text(&q, 1, who, len);
        }
        err = rc;
    }
    sl_db_end(&q);
    return err;
}

static int one_int(sl_db_q *q, const char *sql, int64_t *out, const int64_t *none);

/* The claim just written: its time (the token COMPLETE must match). */
static int claim_token(sl_cat *cat, int64_t id, int64_t *token)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "ckpt_claim_token");
    sl_db_int(&q, id);
    return one_int(&q, "SELECT commit_claim_ms FROM checkpoints WHERE id = ?1", token, NULL);
}

static int claim_tx(sl_cat *cat, int64_t id, const char *replica, int64_t *token,
                    sl_cat_refusal *why)
{
    int64_t changes = 0;
    sl_db_q q;
    int err, live;

    sl_db_q_init(&q, cat, "ckpt_claim");
    sl_db_int(&q, id);
    sl_db_text(&q, replica);
    sl_db_int(&q, SL_CAT_CLAIM_STALE_MS);
    err = sl_db_exec(&q,
                     "UPDATE checkpoints SET commit_claim_ms = CASE WHEN sl_now_ms() > "
                     "commit_claim_ms THEN sl_now_ms() ELSE commit_claim_ms + 1 END, "
                     "commit_claimer = ?2 WHERE id = ?1 AND state = 1 AND (commit_claim_ms = 0 OR "
                     "commit_claim_ms < sl_now_ms() - ?3 OR commit_claimer = ?2)",
                     0, &changes);
    if (err)
        return err;
    if (!changes) {
        err = sl_cat_fence_ckpt(cat, id, &why->state, why->who, sizeof(why->who));
        return err ? err : SL_EUNAVAILABLE;
    }
    /* The row is locked: a lease taken before us is visible now, and none can be taken after
     * us until the claim ends (sl_cat_lease_take fences on it). */
    live = live_lease(cat, id, &why->rank, why->who, sizeof(why->who));
    if (live < 0)
        return live;
    if (live == 1) {
        why->state = SL_CKPT_WRITING;
        return SL_ESTATE;
    }
    return claim_token(cat, id, token);
}

int sl_cat_ckpt_claim(sl_cat *cat, int64_t id, const char *replica, int64_t *token,
                      sl_cat_refusal *why)
{
    int err = sl_db_tx_begin(cat);

    memset(why, 0, sizeof(*why));
    why->rank = -1;
    *token = 0;
    if (err)
        return err;
    err = claim_tx(cat, id, replica, token, why);
    return sl_db_tx_end(cat, err);
}

int sl_cat_ckpt_unclaim(sl_cat *cat, int64_t id, const char *replica, int64_t token)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "ckpt_unclaim");
    sl_db_int(&q, id);
    sl_db_text(&q, replica);
    sl_db_int(&q, token);
    return sl_db_exec(&q,
                      "UPDATE checkpoints SET commit_claim_ms = 0 WHERE id = ?1 AND "
                      "commit_claimer = ?2 AND commit_claim_ms = ?3",
                      0, NULL);
}

int sl_cat_replica_restarted(sl_cat *cat, const char *replica, int64_t *n)
{
    sl_db_q q;
    int64_t leases = 0, claims = 0;
    int err;

    sl_db_q_init(&q, cat, "replica_leases");
    sl_db_text(&q, replica);
    err = sl_db_exec(&q, "DELETE FROM upload_leases WHERE replica = ?1", 0, &leases);
    if (!err) {
        sl_db_q_init(&q, cat, "replica_claims");
        sl_db_text(&q, replica);
        err = sl_db_exec(&q,
                         "UPDATE checkpoints SET commit_claim_ms = 0 WHERE commit_claimer = ?1 "
                         "AND commit_claim_ms <> 0",
                         0, &claims);
    }
    *n = leases + claims;
    return err;
}

int sl_cat_ckpt_begin_bound(sl_cat *cat, sl_cat_ckpt *out, int *created, const char *job,
                            const char *name, uint64_t step, int32_t world_size,
                            const char *user_md, int64_t now_ms, const char *feed_job,
                            int auto_commit)
{
    int err = sl_db_tx_begin(cat);

    if (err)
        return err;
    err = sl_cat_ckpt_begin(cat, out, created, job, name, step, world_size, user_md, now_ms);
    if (!err && *created) {
        err = sl_cat_ckpt_bind(cat, out->id, feed_job, auto_commit);
        if (!err)
            err = sl_cat_ckpt_get(cat, out, job, name);
    }
    /* Any error rolls back (SL_EEXIST wrote nothing; *out is the existing checkpoint). */
    return sl_db_tx_end(cat, err);
}

int sl_cat_ckpt_complete(sl_cat *cat, int64_t id, int64_t committed_ms, const char *replica,
                         int64_t token, const sl_cat_blob *state, const sl_cat_blob *spec,
                         const sl_cat_blob *elastic)
{
    sl_db_q q;
    int err;

    sl_db_q_init(&q, cat, "ckpt_complete");
    sl_db_int(&q, id);
    sl_db_int(&q, committed_ms);
    sl_db_blob_opt(&q, state ? state->p : NULL, state ? state->len : 0);
    sl_db_blob_opt(&q, spec ? spec->p : NULL, spec ? spec->len : 0);
    sl_db_blob_opt(&q, elastic ? elastic->p : NULL, elastic ? elastic->len : 0);
    sl_db_int(&q, token);
    sl_db_text(&q, replica ? replica : "");
    /* With a claim (token), only while it is still ours: a claim that went stale and was ended
     * or taken over means another replica may have changed the shards since we checked them. */
    err = ckpt_write(&q, "UPDATE checkpoints SET state = 2, committed_ms = ?2, feed_state = ?3, "
                         "feed_spec = ?4, feed_elastic = ?5, commit_claim_ms = 0 WHERE id = ?1 "
                         "AND state = 1 AND (CAST(?6 AS BIGINT) = 0 OR (commit_claim_ms = ?6 AND "
                         "commit_claimer = ?7))");
    return err == SL_ENOTFOUND ? SL_ESTATE : err;
}

int sl_cat_ckpt_feed_get(sl_cat *cat, int64_t id, sl_cat_blob *state, sl_cat_blob *spec,
                         sl_cat_blob *elastic)
{
    sl_cat_blob none[2];
    sl_db_q q;
    int rc, err;

    state->p = NULL;
    state->len = 0;
    if (!spec)
        spec = &none[0];
    if (!elastic)
        elastic = &none[1];
    spec->p = elastic->p = NULL;
    spec->len = elastic->len = 0;
    sl_db_q_init(&q, cat, "ckpt_feed_get");
    sl_db_int(&q, id);
    err = sl_db_run(&q,
                    "SELECT feed_state, feed_spec, feed_elastic FROM checkpoints "
                    "WHERE id = ?1 AND feed_state IS NOT NULL",
                    0);
    if (!err) {
        rc = sl_db_next(&q);
        if (rc == 1) {
            err = sl_db_copy_blob(&q, 0, state);
            if (!err)
                err = sl_db_copy_blob(&q, 1, spec);
            if (!err)
                err = sl_db_copy_blob(&q, 2, elastic);
        } else {
            err = rc == 0 ? SL_ENOTFOUND : rc;
        }
    }
    sl_db_end(&q);
    if (err || spec == &none[0])
        sl_cat_blob_free(spec);
    if (err || elastic == &none[1])
        sl_cat_blob_free(elastic);
    if (err)
        sl_cat_blob_free(state);
    return err;
}

/* Record, in the caller's transaction, that the files of checkpoint `id` are to be removed. */
static int note_removal(sl_cat *cat, int64_t id, int64_t now_ms)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "removal_note");
    sl_db_int(&q, id);
    sl_db_int(&q, now_ms);
    return sl_db_exec(&q,
                      "INSERT INTO checkpoint_removals(job, name, removed_ms) "
                      "SELECT job, name, CAST(?2 AS BIGINT) FROM checkpoints WHERE id = ?1 "
                      "ON CONFLICT (job, name) DO UPDATE SET removed_ms = excluded.removed_ms",
                      0, NULL);
}

int sl_cat_ckpt_delete(sl_cat *cat, int64_t id, int64_t now_ms)
{
    sl_db_q q;
    int err = sl_db_tx_begin(cat);

    if (err)
        return err;
    err = note_removal(cat, id, now_ms);
    if (!err) {
        sl_db_q_init(&q, cat, "ckpt_delete");
        sl_db_int(&q, id);
        err = sl_db_exec(&q, "DELETE FROM checkpoints WHERE id = ?1", 0, NULL);
    }
    return sl_db_tx_end(cat, err);
}

static int abort_tx(sl_cat *cat, int64_t id, int64_t now_ms, sl_cat_refusal *why)
{
    sl_db_q q;
    int err = sl_cat_fence_ckpt(cat, id, &why->state, why->who, sizeof(why->who));

    if (!err)
        err = note_removal(cat, id, now_ms);
    if (!err)
        err = sl_cat_shard_delete(cat, id, -1);
    if (!err) {
        /* The uploads in progress are fenced out: none of them can record its shard now. */
        sl_db_q_init(&q, cat, "ckpt_abort_leases");
        sl_db_int(&q, id);
        err = sl_db_exec(&q, "DELETE FROM upload_leases WHERE checkpoint_id = ?1", 0, NULL);
    }
    if (!err) {
        sl_db_q_init(&q, cat, "ckpt_abort");
        sl_db_int(&q, id);
        err = ckpt_write(&q, "UPDATE checkpoints SET state = 3, committed_ms = 0 WHERE id = ?1 "
                             "AND state = 1");
    }
    return err;
}

int sl_cat_ckpt_abort(sl_cat *cat, int64_t id, int64_t now_ms, sl_cat_refusal *why)
{
    int err = sl_db_tx_begin(cat);

    memset(why, 0, sizeof(*why));
    why->rank = -1;
    if (err)
        return err;
    err = abort_tx(cat, id, now_ms, why);
    return sl_db_tx_end(cat, err);
}

/* Run `sql` (q's parameters bound), yielding at most one row of one integer: *out, or `none`
 * when there is no row (SL_ENOTFOUND when `none` is NULL). */
static int one_int(sl_db_q *q, const char *sql, int64_t *out, const int64_t *none)
{
    int rc, err = sl_db_run(q, sql, 0);

    if (!err) {
        rc = sl_db_next(q);
        if (rc == 1)
            *out = sl_db_int_col(q, 0);
        else if (rc == 0 && none)
            *out = *none;
        err = rc == 1 || (rc == 0 && none) ? 0 : rc == 0 ? SL_ENOTFOUND : rc;
    }
    sl_db_end(q);
    return err;
}

int sl_cat_removal_get(sl_cat *cat, const char *job, const char *name, int64_t *removed_ms)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "removal_get");
    sl_db_text(&q, job);
    sl_db_text(&q, name);
    return one_int(&q, "SELECT removed_ms FROM checkpoint_removals WHERE job = ?1 AND name = ?2",
                   removed_ms, NULL);
}

int sl_cat_removals_clear(sl_cat *cat)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "removals_clear");
    return sl_db_exec(&q, "DELETE FROM checkpoint_removals", 0, NULL);
}

int sl_cat_ckpt_tensor_bytes(sl_cat *cat, uint64_t *out, int64_t ckpt_id, int32_t except_rank)
{
    static const int64_t zero = 0;
    int64_t v = 0;
    sl_db_q q;
    int err;

    sl_db_q_init(&q, cat, "ckpt_tensor_bytes");
    sl_db_int(&q, ckpt_id);
    sl_db_int(&q, except_rank);
    err = one_int(&q,
                  "SELECT coalesce(sum(length(tensors)), 0) FROM checkpoint_shards "
                  "WHERE checkpoint_id = ?1 AND rank != ?2",
                  &v, &zero);
    *out = (uint64_t)v;
    return err;
}

static int shard_upsert(sl_cat *cat, int64_t ckpt_id, const sl_cat_shard *s, int64_t now_ms)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "shard_put");
    sl_db_int(&q, ckpt_id);
    sl_db_int(&q, s->rank);
    sl_db_int(&q, (int64_t)s->data_size);
    sl_db_int(&q, (int64_t)s->file_size);
    sl_db_text(&q, s->sha256);
    sl_db_int(&q, s->tensor_count);
    sl_db_text(&q, s->tensors_json ? s->tensors_json : "[]");
    sl_db_int(&q, now_ms);
    if (s->has_pos) {
        sl_db_int(&q, (int64_t)s->pos_epoch);
        sl_db_int(&q, (int64_t)s->pos_position);
        sl_db_int(&q, s->pos_world);
    } else {
        for (int i = 0; i < 3; i++)
            sl_db_text(&q, NULL);
    }
    sl_db_int(&q, s->blocks ? s->block_size : 0);
    sl_db_blob(&q, s->blocks, s->block_count * SL_CAT_DIGEST);
    return sl_db_exec(&q,
                      "INSERT INTO checkpoint_shards(checkpoint_id, rank, data_size, file_size, "
                      "sha256, tensor_count, tensors, created_ms, pos_epoch, pos_position, "
                      "pos_world, block_size, blocks) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, "
                      "CAST(?9 AS BIGINT), CAST(?10 AS BIGINT), CAST(?11 AS BIGINT), ?12, ?13) "
                      "ON CONFLICT (checkpoint_id, rank) DO UPDATE SET "
                      "data_size = excluded.data_size, file_size = excluded.file_size, "
                      "sha256 = excluded.sha256, tensor_count = excluded.tensor_count, "
                      "tensors = excluded.tensors, created_ms = excluded.created_ms, "
                      "pos_epoch = excluded.pos_epoch, pos_position = excluded.pos_position, "
                      "pos_world = excluded.pos_world, block_size = excluded.block_size, "
                      "blocks = excluded.blocks",
                      0, NULL);
}

/* Lock the lease row of (ckpt, rank) if it is still generation `gen`: 1, 0 (taken over or
 * gone), or an error. An UPDATE that changes nothing is the portable row lock. */
static int lease_hold(sl_cat *cat, int64_t ckpt_id, int32_t rank, int64_t gen)
{
    int64_t changes = 0;
    sl_db_q q;
    int err;

    sl_db_q_init(&q, cat, "lease_hold");
    sl_db_int(&q, ckpt_id);
    sl_db_int(&q, rank);
    sl_db_int(&q, gen);
    err = sl_db_exec(&q,
                     "UPDATE upload_leases SET expires_ms = expires_ms WHERE checkpoint_id = ?1 "
                     "AND rank = ?2 AND generation = ?3",
                     0, &changes);
    return err ? err : changes == 1;
}

int sl_cat_lease_release(sl_cat *cat, int64_t ckpt_id, int32_t rank, int64_t gen)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "lease_release");
    sl_db_int(&q, ckpt_id);
    sl_db_int(&q, rank);
    sl_db_int(&q, gen);
    return sl_db_exec(&q,
                      "DELETE FROM upload_leases WHERE checkpoint_id = ?1 AND rank = ?2 AND "
                      "generation = ?3",
                      0, NULL);
}

int sl_cat_shard_put(sl_cat *cat, int64_t ckpt_id, const sl_cat_shard *s, int64_t now_ms,
                     int64_t lease, sl_cat_refusal *why)
{
    int err, held = 1;

    memset(why, 0, sizeof(*why));
    why->rank = -1;
    if ((err = sl_db_tx_begin(cat)) != 0)
        return err;
    err = sl_cat_fence_ckpt(cat, ckpt_id, &why->state, why->who, sizeof(why->who));
    if (!err && lease)
        held = lease_hold(cat, ckpt_id, s->rank, lease);
    if (!err && held != 1)
        err = held < 0 ? held : SL_EFENCED;
    if (!err)
        err = shard_upsert(cat, ckpt_id, s, now_ms);
    if (!err && lease)
        err = sl_cat_lease_release(cat, ckpt_id, s->rank, lease);
    return sl_db_tx_end(cat, err);
}

static void read_shard(sl_cat_shard *out, sl_db_q *q, int with_tensors, int with_pos)
{
    memset(out, 0, sizeof(*out));
    out->rank = (int32_t)sl_db_int_col(q, 0);
    out->data_size = (uint64_t)sl_db_int_col(q, 1);
    out->file_size = (uint64_t)sl_db_int_col(q, 2);
    sl_db_copy_text(q, 3, out->sha256, sizeof(out->sha256));
    out->tensor_count = (uint32_t)sl_db_int_col(q, 4);
    out->tensors_json = with_tensors ? sl_db_text_col(q, 5) : NULL;
    if (with_pos && !sl_db_isnull(q, 6)) {
        out->has_pos = 1;
        out->pos_epoch = (uint64_t)sl_db_int_col(q, 6);
        out->pos_position = (uint64_t)sl_db_int_col(q, 7);
        out->pos_world = (uint32_t)sl_db_int_col(q, 8);
    }
}

int sl_cat_shard_get(sl_cat *cat, sl_cat_shard *out, int64_t ckpt_id, int32_t rank)
{
    sl_db_q q;
    int rc, err;

    sl_db_q_init(&q, cat, "shard_get");
    sl_db_int(&q, ckpt_id);
    sl_db_int(&q, rank);
    err = sl_db_run(&q,
                    "SELECT rank, data_size, file_size, sha256, tensor_count FROM "
                    "checkpoint_shards WHERE checkpoint_id = ?1 AND rank = ?2",
                    0);
    if (!err) {
        rc = sl_db_next(&q);
        if (rc == 1)
            read_shard(out, &q, 0, 0);
        err = rc == 1 ? 0 : rc == 0 ? SL_ENOTFOUND : rc;
    }
    sl_db_end(&q);
    return err;
}

/* The window's digests out of the current row of the query, checked: whole digests, no more
 * than asked for. The caller checks the block size before it allocates one. */
static int read_blocks(sl_db_q *q, uint32_t max, uint8_t *out, uint32_t *n, uint32_t *block_size)
{
    int64_t bs = sl_db_int_col(q, 0);
    size_t len = 0;
    const void *p = sl_db_blob_col(q, 1, &len);

    if (bs == 0)
        return 0;
    if (bs < 0 || bs > UINT32_MAX || len % SL_CAT_DIGEST != 0 || len / SL_CAT_DIGEST > max)
        return SL_ECORRUPT;
    if (len)
        memcpy(out, p, len);
    *n = (uint32_t)(len / SL_CAT_DIGEST);
    *block_size = (uint32_t)bs;
    return 0;
}

int sl_cat_shard_blocks(sl_cat *cat, int64_t ckpt_id, int32_t rank, const char *sha256,
                        uint64_t first, uint32_t max, uint8_t *out, uint32_t *n,
                        uint32_t *block_size)
{
    sl_db_q q;
    int rc, err;

    *n = 0;
    *block_size = 0;
    if (first > (uint64_t)INT32_MAX / SL_CAT_DIGEST || max > INT32_MAX / SL_CAT_DIGEST)
        return SL_EINVAL;
    sl_db_q_init(&q, cat, "shard_blocks");
    sl_db_int(&q, ckpt_id);
    sl_db_int(&q, rank);
    sl_db_text(&q, sha256);
    sl_db_int(&q, (int64_t)(first * SL_CAT_DIGEST + 1));
    sl_db_int(&q, (int64_t)max * SL_CAT_DIGEST);
    /* substr of a blob counts bytes in both engines: only the window leaves the catalog. */
    err = sl_db_run(&q,
                    "SELECT block_size, substr(blocks, CAST(?4 AS INTEGER), CAST(?5 AS INTEGER)) "
                    "FROM checkpoint_shards WHERE checkpoint_id = ?1 AND rank = ?2 AND "
                    "sha256 = ?3",
                    0);
    if (!err) {
        rc = sl_db_next(&q);
        err = rc == 1 ? read_blocks(&q, max, out, n, block_size) : rc == 0 ? SL_ENOTFOUND : rc;
    }
    sl_db_end(&q);
    return err;
}

int sl_cat_shard_delete(sl_cat *cat, int64_t ckpt_id, int32_t rank)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "shard_delete");
    sl_db_int(&q, ckpt_id);
    sl_db_int(&q, rank);
    return sl_db_exec(&q,
                      "DELETE FROM checkpoint_shards WHERE checkpoint_id = ?1 AND "
                      "(?2 < 0 OR rank = ?2)",
                      0, NULL);
}

int sl_cat_shard_list(sl_cat *cat, int64_t ckpt_id, int with_tensors, sl_cat_shard_fn fn, void *arg)
{
    sl_db_q q;
    sl_cat_shard s;
    int rc = 0, err;

    sl_db_q_init(&q, cat, "shard_list");
    sl_db_int(&q, ckpt_id);
    err = sl_db_run(&q,
                    "SELECT rank, data_size, file_size, sha256, tensor_count, tensors, "
                    "pos_epoch, pos_position, pos_world FROM "
                    "checkpoint_shards WHERE checkpoint_id = ?1 ORDER BY rank",
                    0);
    while (!err && (rc = sl_db_next(&q)) == 1) {
        read_shard(&s, &q, with_tensors, 1);
        err = fn(&s, arg);
    }
    sl_db_end(&q);
    return err ? err : rc;
}

int sl_cat_retention_set(sl_cat *cat, const char *job, uint32_t keep_last)
{
    sl_db_q q;

    sl_db_q_init(&q, cat, "retention_set");
    sl_db_text(&q, job);
    sl_db_int(&q, keep_last);
    return sl_db_exec(&q,
                      "INSERT INTO checkpoint_retention(job, keep_last) VALUES (?1, ?2) "
                      "ON CONFLICT (job) DO UPDATE SET keep_last = excluded.keep_last",
                      0, NULL);
}

int sl_cat_retention_get(sl_cat *cat, const char *job, uint32_t *keep_last)
{
    static const int64_t zero = 0;
    int64_t v = 0;
    sl_db_q q;
    int err;

    sl_db_q_init(&q, cat, "retention_get");
    sl_db_text(&q, job);
    err = one_int(&q, "SELECT keep_last FROM checkpoint_retention WHERE job = ?1", &v, &zero);
    *keep_last = err ? 0 : (uint32_t)v;
    return err;
}

int sl_cat_ckpt_count_states(sl_cat *cat, uint64_t counts[4])
{
    sl_db_q q;
    int rc = 0, err;

    memset(counts, 0, 4 * sizeof(counts[0]));
    sl_db_q_init(&q, cat, "ckpt_count_states");
    err = sl_db_run(&q, "SELECT state, count(*) FROM checkpoints GROUP BY state", 0);
    while (!err && (rc = sl_db_next(&q)) == 1) {
        int64_t state = sl_db_int_col(&q, 0);
        if (state >= SL_CKPT_WRITING && state <= SL_CKPT_INCOMPLETE)
            counts[state] = (uint64_t)sl_db_int_col(&q, 1);
    }
    sl_db_end(&q);
    return err ? err : rc;
}
