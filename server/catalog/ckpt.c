/* Checkpoint queries. Statements are prepared per call: these are control-plane operations (a
 * few per checkpoint and rank), so caching them would buy nothing measurable. */
#include "ckpt.h"

#include "internal.h"

#include "err.h"
#include "log.h"

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
    "c.feed_job, c.auto_commit, c.feed_state IS NOT NULL "                                         \
    "FROM checkpoints c "

static void read_ckpt(sl_cat_ckpt *out, sqlite3_stmt *st)
{
    memset(out, 0, sizeof(*out));
    out->id = sqlite3_column_int64(st, 0);
    sl_cat_copy_col(out->job, sizeof(out->job), st, 1);
    sl_cat_copy_col(out->name, sizeof(out->name), st, 2);
    out->step = (uint64_t)sqlite3_column_int64(st, 3);
    out->world_size = sqlite3_column_int(st, 4);
    out->state = sqlite3_column_int(st, 5);
    sl_cat_copy_col(out->user_metadata, sizeof(out->user_metadata), st, 6);
    out->created_ms = sqlite3_column_int64(st, 7);
    out->committed_ms = sqlite3_column_int64(st, 8);
    out->shards = (uint32_t)sqlite3_column_int64(st, 9);
    out->total_bytes = (uint64_t)sqlite3_column_int64(st, 10);
    sl_cat_copy_col(out->feed_job, sizeof(out->feed_job), st, 11);
    out->auto_commit = sqlite3_column_int(st, 12);
    out->has_feed_state = sqlite3_column_int(st, 13);
}

/* Step a statement expected to yield at most one checkpoint row. */
static int one_ckpt(sl_cat *cat, sqlite3_stmt *st, sl_cat_ckpt *out, const char *op)
{
    int rc = sqlite3_step(st);

    if (rc == SQLITE_ROW) {
        read_ckpt(out, st);
        return 0;
    }
    if (rc == SQLITE_DONE)
        return SL_ENOTFOUND;
    return sl_cat_fail(cat, op);
}

int sl_cat_ckpt_get(sl_cat *cat, sl_cat_ckpt *out, const char *job, const char *name)
{
    sqlite3_stmt *st = NULL;
    int err = sl_cat_prepare(cat, &st, CKPT_COLS "WHERE c.job = ?1 AND c.name = ?2", "ckpt_get");

    if (err)
        return err;
    sqlite3_bind_text(st, 1, job, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    err = one_ckpt(cat, st, out, "ckpt_get");
    sqlite3_finalize(st);
    return err;
}

int sl_cat_ckpt_latest(sl_cat *cat, sl_cat_ckpt *out, const char *job)
{
    sqlite3_stmt *st = NULL;
    int err =
        sl_cat_prepare(cat, &st,
                       CKPT_COLS "WHERE c.job = ?1 AND c.state = 2 "
                                 "ORDER BY c.step DESC, c.committed_ms DESC, c.id DESC LIMIT 1",
                       "ckpt_latest");

    if (err)
        return err;
    sqlite3_bind_text(st, 1, job, -1, SQLITE_STATIC);
    err = one_ckpt(cat, st, out, "ckpt_latest");
    sqlite3_finalize(st);
    return err;
}

static int exec_stmt(sl_cat *cat, sqlite3_stmt *st, const char *op)
{
    int rc = sqlite3_step(st);

    return rc == SQLITE_DONE || rc == SQLITE_ROW ? 0 : sl_cat_fail(cat, op);
}

int sl_cat_ckpt_begin(sl_cat *cat, sl_cat_ckpt *out, int *created, const char *job,
                      const char *name, uint64_t step, int32_t world_size, const char *user_md,
                      int64_t now_ms)
{
    sqlite3_stmt *st = NULL;
    int err;

    *created = 0;
    err = sl_cat_ckpt_get(cat, out, job, name);
    if (err == 0) {
        if (out->state == SL_CKPT_INCOMPLETE) {
            err = sl_cat_prepare(
                cat, &st,
                "UPDATE checkpoints SET state = 1, world_size = ?2, step = ?3, "
                "user_metadata = ?4, created_ms = ?5, committed_ms = 0 WHERE id = ?1",
                "ckpt_reopen");
            if (err)
                return err;
            sqlite3_bind_int64(st, 1, out->id);
            sqlite3_bind_int(st, 2, world_size);
            sqlite3_bind_int64(st, 3, (int64_t)step);
            sqlite3_bind_text(st, 4, user_md ? user_md : "", -1, SQLITE_STATIC);
            sqlite3_bind_int64(st, 5, now_ms);
            err = exec_stmt(cat, st, "ckpt_reopen");
            sqlite3_finalize(st);
            if (!err)
                err = sl_cat_ckpt_get(cat, out, job, name);
            if (!err)
                *created = 1;
            return err;
        }
        return out->world_size == world_size && out->step == step ? 0 : SL_EEXIST;
    }
    if (err != SL_ENOTFOUND)
        return err;
    err =
        sl_cat_prepare(cat, &st,
                       "INSERT INTO checkpoints(job, name, step, world_size, state, user_metadata, "
                       "created_ms) VALUES (?1, ?2, ?3, ?4, 1, ?5, ?6)",
                       "ckpt_insert");
    if (err)
        return err;
    sqlite3_bind_text(st, 1, job, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, (int64_t)step);
    sqlite3_bind_int(st, 4, world_size);
    sqlite3_bind_text(st, 5, user_md ? user_md : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, now_ms);
    err = exec_stmt(cat, st, "ckpt_insert");
    sqlite3_finalize(st);
    if (!err)
        err = sl_cat_ckpt_get(cat, out, job, name);
    if (!err)
        *created = 1;
    return err;
}

int sl_cat_ckpt_list(sl_cat *cat, const char *job, int state, sl_cat_ckpt_fn fn, void *arg)
{
    sqlite3_stmt *st = NULL;
    sl_cat_ckpt c;
    int rc,
        err = sl_cat_prepare(cat, &st,
                             CKPT_COLS "WHERE (?1 = '' OR c.job = ?1) AND (?2 = 0 OR c.state = ?2) "
                                       "ORDER BY c.job, c.step DESC, c.id DESC",
                             "ckpt_list");

    if (err)
        return err;
    sqlite3_bind_text(st, 1, job ? job : "", -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, state);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        read_ckpt(&c, st);
        err = fn(&c, arg);
        if (err)
            break;
    }
    if (!err && rc != SQLITE_DONE)
        err = sl_cat_fail(cat, "ckpt_list");
    sqlite3_finalize(st);
    return err;
}

int sl_cat_ckpt_set_state(sl_cat *cat, int64_t id, int state, int64_t committed_ms)
{
    sqlite3_stmt *st = NULL;
    int err = sl_cat_prepare(cat, &st,
                             "UPDATE checkpoints SET state = ?2, committed_ms = ?3 WHERE id = ?1",
                             "ckpt_set_state");

    if (err)
        return err;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int(st, 2, state);
    sqlite3_bind_int64(st, 3, committed_ms);
    err = exec_stmt(cat, st, "ckpt_set_state");
    if (!err && sqlite3_changes(cat->db) == 0)
        err = SL_ENOTFOUND;
    sqlite3_finalize(st);
    return err;
}

int sl_cat_ckpt_bind(sl_cat *cat, int64_t id, const char *feed_job, int auto_commit)
{
    sqlite3_stmt *st = NULL;
    int err = sl_cat_prepare(cat, &st,
                             "UPDATE checkpoints SET feed_job = ?2, auto_commit = ?3, "
                             "feed_state = NULL, feed_spec = NULL, feed_elastic = NULL "
                             "WHERE id = ?1",
                             "ckpt_bind");

    if (err)
        return err;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_text(st, 2, feed_job ? feed_job : "", -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 3, auto_commit != 0);
    err = exec_stmt(cat, st, "ckpt_bind");
    if (!err && sqlite3_changes(cat->db) == 0)
        err = SL_ENOTFOUND;
    sqlite3_finalize(st);
    return err;
}

int sl_cat_ckpt_begin_bound(sl_cat *cat, sl_cat_ckpt *out, int *created, const char *job,
                            const char *name, uint64_t step, int32_t world_size,
                            const char *user_md, int64_t now_ms, const char *feed_job,
                            int auto_commit)
{
    int err = sl_cat_tx_begin(cat);

    if (err)
        return err;
    err = sl_cat_ckpt_begin(cat, out, created, job, name, step, world_size, user_md, now_ms);
    if (!err && *created) {
        err = sl_cat_ckpt_bind(cat, out->id, feed_job, auto_commit);
        if (!err)
            err = sl_cat_ckpt_get(cat, out, job, name);
    }
    /* Any error rolls back (SL_EEXIST wrote nothing; *out is the existing checkpoint). */
    return sl_cat_tx_end(cat, err);
}

static void bind_blob_or_null(sqlite3_stmt *st, int i, const sl_cat_blob *b)
{
    if (b && b->p && b->len)
        sqlite3_bind_blob(st, i, b->p, (int)b->len, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, i);
}

int sl_cat_ckpt_complete(sl_cat *cat, int64_t id, int64_t committed_ms, const sl_cat_blob *state,
                         const sl_cat_blob *spec, const sl_cat_blob *elastic)
{
    sqlite3_stmt *st = NULL;
    int err =
        sl_cat_prepare(cat, &st,
                       "UPDATE checkpoints SET state = 2, committed_ms = ?2, feed_state = ?3, "
                       "feed_spec = ?4, feed_elastic = ?5 WHERE id = ?1",
                       "ckpt_complete");

    if (err)
        return err;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, committed_ms);
    bind_blob_or_null(st, 3, state);
    bind_blob_or_null(st, 4, spec);
    bind_blob_or_null(st, 5, elastic);
    err = exec_stmt(cat, st, "ckpt_complete");
    if (!err && sqlite3_changes(cat->db) == 0)
        err = SL_ENOTFOUND;
    sqlite3_finalize(st);
    return err;
}

int sl_cat_ckpt_feed_get(sl_cat *cat, int64_t id, sl_cat_blob *state, sl_cat_blob *spec,
                         sl_cat_blob *elastic)
{
    sqlite3_stmt *st = NULL;
    int rc, err = sl_cat_prepare(cat, &st,
                                 "SELECT feed_state, feed_spec, feed_elastic FROM checkpoints "
                                 "WHERE id = ?1 AND feed_state IS NOT NULL",
                                 "ckpt_feed_get");
    sl_cat_blob none[2];

    state->p = NULL;
    state->len = 0;
    if (!spec)
        spec = &none[0];
    if (!elastic)
        elastic = &none[1];
    spec->p = elastic->p = NULL;
    spec->len = elastic->len = 0;
    if (err)
        return err;
    sqlite3_bind_int64(st, 1, id);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        err = sl_cat_copy_blob(state, st, 0);
        if (!err)
            err = sl_cat_copy_blob(spec, st, 1);
        if (!err)
            err = sl_cat_copy_blob(elastic, st, 2);
    } else {
        err = rc == SQLITE_DONE ? SL_ENOTFOUND : sl_cat_fail(cat, "ckpt_feed_get");
    }
    sqlite3_finalize(st);
    if (err || spec == &none[0])
        sl_cat_blob_free(spec);
    if (err || elastic == &none[1])
        sl_cat_blob_free(elastic);
    if (err)
        sl_cat_blob_free(state);
    return err;
}

/* Run one statement over a checkpoint id (?1) and a time (?2), each if the statement has it. */
static int exec_id(sl_cat *cat, const char *sql, int64_t id, int64_t ms, const char *op)
{
    sqlite3_stmt *st = NULL;
    int err = sl_cat_prepare(cat, &st, sql, op);

    if (err)
        return err;
    if (sqlite3_bind_parameter_count(st) >= 1)
        sqlite3_bind_int64(st, 1, id);
    if (sqlite3_bind_parameter_count(st) >= 2)
        sqlite3_bind_int64(st, 2, ms);
    err = exec_stmt(cat, st, op);
    sqlite3_finalize(st);
    return err;
}

/* Record, in the caller's transaction, that the files of checkpoint `id` are to be removed. */
static int note_removal(sl_cat *cat, int64_t id, int64_t now_ms)
{
    return exec_id(cat,
                   "INSERT OR REPLACE INTO checkpoint_removals(job, name, removed_ms) "
                   "SELECT job, name, ?2 FROM checkpoints WHERE id = ?1",
                   id, now_ms, "removal_note");
}

int sl_cat_ckpt_delete(sl_cat *cat, int64_t id, int64_t now_ms)
{
    int err = sl_cat_tx_begin(cat);

    if (err)
        return err;
    err = note_removal(cat, id, now_ms);
    if (!err)
        err = exec_id(cat, "DELETE FROM checkpoints WHERE id = ?1", id, 0, "ckpt_delete");
    return sl_cat_tx_end(cat, err);
}

int sl_cat_ckpt_abort(sl_cat *cat, int64_t id, int64_t now_ms)
{
    int err = sl_cat_tx_begin(cat);

    if (err)
        return err;
    err = note_removal(cat, id, now_ms);
    if (!err)
        err = sl_cat_shard_delete(cat, id, -1);
    if (!err)
        err = sl_cat_ckpt_set_state(cat, id, SL_CKPT_INCOMPLETE, 0);
    return sl_cat_tx_end(cat, err);
}

int sl_cat_removal_get(sl_cat *cat, const char *job, const char *name, int64_t *removed_ms)
{
    sqlite3_stmt *st = NULL;
    int rc, err = sl_cat_prepare(
                cat, &st, "SELECT removed_ms FROM checkpoint_removals WHERE job = ?1 AND name = ?2",
                "removal_get");

    if (err)
        return err;
    sqlite3_bind_text(st, 1, job, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *removed_ms = sqlite3_column_int64(st, 0);
    else
        err = rc == SQLITE_DONE ? SL_ENOTFOUND : sl_cat_fail(cat, "removal_get");
    sqlite3_finalize(st);
    return err;
}

int sl_cat_removals_clear(sl_cat *cat)
{
    return exec_id(cat, "DELETE FROM checkpoint_removals", 0, 0, "removals_clear");
}

int sl_cat_ckpt_tensor_bytes(sl_cat *cat, uint64_t *out, int64_t ckpt_id, int32_t except_rank)
{
    sqlite3_stmt *st = NULL;
    int rc, err = sl_cat_prepare(cat, &st,
                                 "SELECT coalesce(sum(length(tensors)), 0) FROM checkpoint_shards "
                                 "WHERE checkpoint_id = ?1 AND rank != ?2",
                                 "ckpt_tensor_bytes");

    if (err)
        return err;
    sqlite3_bind_int64(st, 1, ckpt_id);
    sqlite3_bind_int(st, 2, except_rank);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *out = (uint64_t)sqlite3_column_int64(st, 0);
    else
        err = sl_cat_fail(cat, "ckpt_tensor_bytes");
    sqlite3_finalize(st);
    return err;
}

int sl_cat_shard_put(sl_cat *cat, int64_t ckpt_id, const sl_cat_shard *s, int64_t now_ms)
{
    sqlite3_stmt *st = NULL;
    int err =
        sl_cat_prepare(cat, &st,
                       "INSERT OR REPLACE INTO checkpoint_shards(checkpoint_id, rank, data_size, "
                       "file_size, sha256, tensor_count, tensors, created_ms, pos_epoch, "
                       "pos_position, pos_world) "
                       "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                       "shard_put");

    if (err)
        return err;
    sqlite3_bind_int64(st, 1, ckpt_id);
    sqlite3_bind_int(st, 2, s->rank);
    sqlite3_bind_int64(st, 3, (int64_t)s->data_size);
    sqlite3_bind_int64(st, 4, (int64_t)s->file_size);
    sqlite3_bind_text(st, 5, s->sha256, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 6, s->tensor_count);
    sqlite3_bind_text(st, 7, s->tensors_json ? s->tensors_json : "[]", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 8, now_ms);
    if (s->has_pos) {
        sqlite3_bind_int64(st, 9, (int64_t)s->pos_epoch);
        sqlite3_bind_int64(st, 10, (int64_t)s->pos_position);
        sqlite3_bind_int64(st, 11, s->pos_world);
    }
    err = exec_stmt(cat, st, "shard_put");
    sqlite3_finalize(st);
    return err;
}

static void read_shard(sl_cat_shard *out, sqlite3_stmt *st, int with_tensors)
{
    memset(out, 0, sizeof(*out));
    out->rank = sqlite3_column_int(st, 0);
    out->data_size = (uint64_t)sqlite3_column_int64(st, 1);
    out->file_size = (uint64_t)sqlite3_column_int64(st, 2);
    sl_cat_copy_col(out->sha256, sizeof(out->sha256), st, 3);
    out->tensor_count = (uint32_t)sqlite3_column_int64(st, 4);
    out->tensors_json = with_tensors ? (const char *)sqlite3_column_text(st, 5) : NULL;
    if (sqlite3_column_count(st) > 6 && sqlite3_column_type(st, 6) != SQLITE_NULL) {
        out->has_pos = 1;
        out->pos_epoch = (uint64_t)sqlite3_column_int64(st, 6);
        out->pos_position = (uint64_t)sqlite3_column_int64(st, 7);
        out->pos_world = (uint32_t)sqlite3_column_int64(st, 8);
    }
}

int sl_cat_shard_get(sl_cat *cat, sl_cat_shard *out, int64_t ckpt_id, int32_t rank)
{
    sqlite3_stmt *st = NULL;
    int rc, err = sl_cat_prepare(cat, &st,
                                 "SELECT rank, data_size, file_size, sha256, tensor_count, '' FROM "
                                 "checkpoint_shards WHERE checkpoint_id = ?1 AND rank = ?2",
                                 "shard_get");

    if (err)
        return err;
    sqlite3_bind_int64(st, 1, ckpt_id);
    sqlite3_bind_int(st, 2, rank);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        read_shard(out, st, 0);
    else
        err = rc == SQLITE_DONE ? SL_ENOTFOUND : sl_cat_fail(cat, "shard_get");
    sqlite3_finalize(st);
    return err;
}

int sl_cat_shard_delete(sl_cat *cat, int64_t ckpt_id, int32_t rank)
{
    sqlite3_stmt *st = NULL;
    int err = sl_cat_prepare(cat, &st,
                             "DELETE FROM checkpoint_shards WHERE checkpoint_id = ?1 AND "
                             "(?2 < 0 OR rank = ?2)",
                             "shard_delete");

    if (err)
        return err;
    sqlite3_bind_int64(st, 1, ckpt_id);
    sqlite3_bind_int(st, 2, rank);
    err = exec_stmt(cat, st, "shard_delete");
    sqlite3_finalize(st);
    return err;
}

int sl_cat_shard_list(sl_cat *cat, int64_t ckpt_id, int with_tensors, sl_cat_shard_fn fn, void *arg)
{
    sqlite3_stmt *st = NULL;
    sl_cat_shard s;
    int rc,
        err = sl_cat_prepare(cat, &st,
                             "SELECT rank, data_size, file_size, sha256, tensor_count, tensors, "
                             "pos_epoch, pos_position, pos_world FROM "
                             "checkpoint_shards WHERE checkpoint_id = ?1 ORDER BY rank",
                             "shard_list");

    if (err)
        return err;
    sqlite3_bind_int64(st, 1, ckpt_id);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        read_shard(&s, st, with_tensors);
        err = fn(&s, arg);
        if (err)
            break;
    }
    if (!err && rc != SQLITE_DONE)
        err = sl_cat_fail(cat, "shard_list");
    sqlite3_finalize(st);
    return err;
}

int sl_cat_retention_set(sl_cat *cat, const char *job, uint32_t keep_last)
{
    sqlite3_stmt *st = NULL;
    int err = sl_cat_prepare(
        cat, &st, "INSERT OR REPLACE INTO checkpoint_retention(job, keep_last) VALUES (?1, ?2)",
        "retention_set");

    if (err)
        return err;
    sqlite3_bind_text(st, 1, job, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, keep_last);
    err = exec_stmt(cat, st, "retention_set");
    sqlite3_finalize(st);
    return err;
}

int sl_cat_retention_get(sl_cat *cat, const char *job, uint32_t *keep_last)
{
    sqlite3_stmt *st = NULL;
    int rc,
        err = sl_cat_prepare(cat, &st, "SELECT keep_last FROM checkpoint_retention WHERE job = ?1",
                             "retention_get");

    if (err)
        return err;
    sqlite3_bind_text(st, 1, job, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    *keep_last = rc == SQLITE_ROW ? (uint32_t)sqlite3_column_int64(st, 0) : 0;
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        err = sl_cat_fail(cat, "retention_get");
    sqlite3_finalize(st);
    return err;
}

int sl_cat_ckpt_count_states(sl_cat *cat, uint64_t counts[4])
{
    sqlite3_stmt *st = NULL;
    int rc, err = 0;

    memset(counts, 0, 4 * sizeof(counts[0]));
    if (sl_cat_prepare(cat, &st, "SELECT state, COUNT(*) FROM checkpoints GROUP BY state",
                       "ckpt_count_states") != 0)
        return SL_EDB;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        int state = sqlite3_column_int(st, 0);
        if (state >= SL_CKPT_WRITING && state <= SL_CKPT_INCOMPLETE)
            counts[state] = (uint64_t)sqlite3_column_int64(st, 1);
    }
    if (rc != SQLITE_DONE)
        err = sl_cat_fail(cat, "ckpt_count_states");
    sqlite3_finalize(st);
    return err;
}
