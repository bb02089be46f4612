/* Commit, Abort, Delete and SetRetention: the catalog lifecycle of a checkpoint and the removal
 * of its files. The catalog changes first, recording the removal with its time: a crash after it
 * leaves files the startup sweep removes (those no newer than that time), never rows that point
 * at missing files. */
#include "internal.h"
#include "util/array.h"

#include "err.h"
#include "log.h"
#include "store/layout.h"
#include "store/sstore.h"
#include "feed/feed.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct removal {
    sl_cat_work work;
    sl_sstore *store;
    char job[SL_SHARD_NAME_MAX + 1], name[SL_SHARD_NAME_MAX + 1];
    int32_t world_size;
    int err;
} removal;

static void removal_work(uv_work_t *w)
{
    removal *r = w->data;

    r->err = r->store->ops->remove_ckpt(r->store, r->job, r->name, r->world_size);
}

static void removal_after(uv_work_t *w, int status)
{
    removal *r = w->data;

    if (r->err && r->err != -ENOENT)
        sl_log_warn("ckpt_remove_failed", "job=%s name=%s error=\"%s\"", r->job, r->name,
                    sl_strerror(r->err));
    free(r);
}

/* Remove a checkpoint's shard files, partial uploads and metadata file (a directory store: now,
 * then fsync the directory; object storage: on the worker pool, the loop never waiting on the
 * network). Errors are logged: the catalog already forgot them, and the sweeps remove what is
 * left. */
static void remove_files(sl_ckpt_svc *s, const sl_cat_ckpt *c)
{
    removal *r = calloc(1, sizeof(*r));

    if (!r)
        return;
    r->store = s->opts.store;
    r->work.work.data = r;
    snprintf(r->job, sizeof(r->job), "%s", c->job);
    snprintf(r->name, sizeof(r->name), "%s", c->name);
    r->world_size = c->world_size;
    ckpt_store_job(s, &r->work, removal_work, removal_after);
}

/* ---- Abort, Delete ---- */

/* Make a WRITING checkpoint INCOMPLETE: forget its shards, end its uploads, remove its files.
 * Returns 0, or the catalog's refusal with msg (COMPLETE or being committed meanwhile, perhaps
 * by another replica: nothing changed). */
static int abort_writing(sl_ckpt_svc *s, const sl_cat_ckpt *ck, char *msg, size_t len)
{
    sl_cat_refusal why;
    int err = sl_cat_ckpt_abort(s->cat, ck->id, sl_now_ms(), &why);

    if (err) {
        if (err == SL_ESTATE && why.state == SL_CKPT_COMPLETE)
            snprintf(msg, len, "checkpoint %s/%s is COMPLETE; delete it instead", ck->job,
                     ck->name);
        else
            err = ckpt_refusal_msg(msg, len, err, &why, ck->job, ck->name);
        return err;
    }
    /* End its running uploads now; one finishing its rename removes its file itself. */
    for (upload *u = s->uploads, *next; u; u = next) {
        next = u->next; /* u may unregister itself; it never removes another */
        if (u->ckpt_id == ck->id)
            ckpt_upload_abort(u);
    }
    remove_files(s, ck);
    sl_log_info("ckpt_abort", "job=%s name=%s", ck->job, ck->name);
    return 0;
}

void ckpt_abort(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__CheckpointRef *req = (const void *)msg;
    sl_ckpt_svc *s = arg;
    char why[CKPT_MSG_MAX];
    sl_cat_ckpt ck;
    int err;

    if (!ckpt_names_ok(call, req->job, req->name) || ckpt_find(s, call, &ck, req->job, req->name))
        return;
    if (ck.state == SL_CKPT_COMPLETE) {
        sl_rpc_call_fail(call, SL_ESTATE, "checkpoint %s/%s is COMPLETE; delete it instead", ck.job,
                         ck.name);
        return;
    }
    if (ckpt_is_committing(s, ck.id)) {
        sl_rpc_call_fail(call, SL_ESTATE, "checkpoint %s/%s is being committed", ck.job, ck.name);
        return;
    }
    if (ck.state == SL_CKPT_WRITING) {
        /* The catalog decides, in the abort's own transaction: a checkpoint that another replica
         * committed or claimed since we read it is left alone. */
        err = abort_writing(s, &ck, why, sizeof(why));
        if (err) {
            sl_rpc_call_fail(call, err, "%s", why);
            return;
        }
        sl_cat_ckpt_get(s->cat, &ck, req->job, req->name);
    }
    ckpt_reply(s, call, &ck);
}

static int delete_ckpt(sl_ckpt_svc *s, const sl_cat_ckpt *ck)
{
    int err = sl_cat_ckpt_delete(s->cat, ck->id, sl_now_ms());

    if (err)
        return err;
    remove_files(s, ck);
    sl_log_info("ckpt_delete", "job=%s name=%s", ck->job, ck->name);
    return 0;
}

void ckpt_delete(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__CheckpointRef *req = (const void *)msg;
    Sluice__V1__DeleteResponse resp = SLUICE__V1__DELETE_RESPONSE__INIT;
    sl_ckpt_svc *s = arg;
    sl_cat_ckpt ck;
    int err;

    if (!ckpt_names_ok(call, req->job, req->name) || ckpt_find(s, call, &ck, req->job, req->name))
        return;
    if (ck.state == SL_CKPT_WRITING || ckpt_upload_find(s, ck.id, -1)) {
        sl_rpc_call_fail(call, SL_ESTATE, "checkpoint %s/%s is being written; abort it first",
                         ck.job, ck.name);
        return;
    }
    err = delete_ckpt(s, &ck);
    if (err)
        sl_rpc_call_fail(call, err, "catalog error: %s", sl_strerror(err));
    else
        sl_rpc_call_reply(call, &resp.base);
}

/* ---- retention ---- */

typedef struct retention {
    uint32_t keep;
    uint32_t seen;
    sl_cat_ckpt *victims;
    size_t n, cap;
} retention;

static int pick_victim(const sl_cat_ckpt *c, void *arg)
{
    retention *r = arg;

    /* Listed newest first: the first `keep` (at least the newest) stay. */
    if (r->seen++ < r->keep)
        return 0;
    if (sl_array_grow((void **)&r->victims, &r->cap, r->n, sizeof(*r->victims), 4) != 0)
        return -ENOMEM;
    r->victims[r->n++] = *c;
    return 0;
}

/* Apply the job's retention policy; names of deleted checkpoints go to `deleted` (may be NULL,
 * else an array the caller frees with its strings). Returns 0 or an error. */
/* Delete the job's COMPLETE checkpoints beyond r->keep, newest kept (names into *deleted). */
static int retention_run(sl_ckpt_svc *s, const char *job, retention *r, char ***deleted,
                         size_t *n_deleted)
{
    int err = sl_cat_ckpt_list(s->cat, job, SL_CKPT_COMPLETE, pick_victim, r);
    if (err < 0)
        goto out;
    err = 0;
    if (deleted && r->n) {
        *deleted = calloc(r->n, sizeof(char *));
        if (!*deleted) {
            err = -ENOMEM;
            goto out;
        }
    }
    for (size_t i = 0; i < r->n; i++) {
        err = delete_ckpt(s, &r->victims[i]);
        if (err)
            break;
        sl_log_info("ckpt_retention_deleted", "job=%s name=%s keep_last=%u", job,
                    r->victims[i].name, r->keep);
        if (deleted)
            (*deleted)[(*n_deleted)++] = strdup(r->victims[i].name);
    }
out:
    free(r->victims);
    return err;
}

static int apply_retention(sl_ckpt_svc *s, const char *job, char ***deleted, size_t *n_deleted)
{
    retention r = {0};
    int err;

    if (deleted) {
        *deleted = NULL;
        *n_deleted = 0;
    }
    err = sl_cat_retention_get(s->cat, job, &r.keep);
    if (err || r.keep == 0)
        return err;
    /* Replicas of a shared catalog apply retention one at a time. */
    if ((err = sl_cat_chore_wait(s->cat, SL_CHORE_RETENTION)) != 0)
        return err;
    err = retention_run(s, job, &r, deleted, n_deleted);
    sl_cat_chore_done(s->cat, SL_CHORE_RETENTION);
    return err;
}

void ckpt_set_retention(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__SetRetentionRequest *req = (const void *)msg;
    Sluice__V1__SetRetentionResponse resp = SLUICE__V1__SET_RETENTION_RESPONSE__INIT;
    sl_ckpt_svc *s = arg;
    char **deleted = NULL;
    size_t n = 0;
    int err;

    if (!ckpt_names_ok(call, req->job, NULL))
        return;
    err = sl_cat_retention_set(s->cat, req->job, req->keep_last);
    if (!err)
        err = apply_retention(s, req->job, &deleted, &n);
    resp.deleted = deleted;
    resp.n_deleted = n;
    if (err)
        sl_rpc_call_fail(call, err, "cannot apply the retention policy");
    else
        sl_rpc_call_reply(call, &resp.base);
    for (size_t i = 0; i < n; i++)
        free(deleted[i]);
    free(deleted);
}

/* ---- Commit ---- */

typedef struct commit_job {
    sl_cat_work work;
    sl_ckpt_svc *svc;
    sl_rpc_call *call; /* NULL: an auto-commit */
    sl_cat_ckpt ck;
    ckpt_mark mark;
    int64_t claim; /* the commit claim's token (a shared catalog), 0: none */
    int64_t committed_ms;
    char file[NAME_MAX + 1];
    sl_buf json;
    sl_cat_blob feed_state, feed_spec, feed_elastic; /* empty: none */
    /* Object storage: each rank's recorded file size and checksum, checked on the worker pool
     * before the metadata is written (a directory store checks on the loop). */
    uint64_t *sizes;
    char (*shas)[SL_SHARD_HEX_LEN + 1];
    int err;
    char errmsg[256];
} commit_job;

static const char *commit_replica(const sl_ckpt_svc *s);

/* What Commit finds about the recorded shards: missing ranks, files that do not match, and the
 * ranks' data positions. */
typedef struct commit_check {
    sl_ckpt_svc *svc;
    const sl_cat_ckpt *ck;
    uint64_t *sizes; /* remote store: recorded sizes and checksums, checked later */
    char (*shas)[SL_SHARD_HEX_LEN + 1];
    int32_t next;   /* the next rank expected */
    sl_buf missing; /* the first 32 missing ranks, for the message */
    int n_missing;
    char bad[256];
    uint64_t *pos;      /* [world_size] each rank's position */
    int n_pos;          /* shards that carry one */
    int32_t no_pos;     /* a rank without one (when some have) */
    int32_t first;      /* the first rank with a position */
    uint64_t epoch;     /* its epoch */
    char disagree[256]; /* the first disagreement about the epoch */
} commit_check;

static void note_missing(commit_check *cc, int32_t from, int32_t to)
{
    for (int32_t r = from; r < to; r++) {
        if (cc->n_missing < 32)
            sl_buf_printf(&cc->missing, "%s%d", cc->n_missing ? ", " : "", r);
        else if (cc->n_missing == 32)
            sl_buf_addstr(&cc->missing, ", ...");
        cc->n_missing++;
    }
}

/* A local store: the shard file of sh's rank is the one its row records, by size and by the
 * checksum in its header (an upload fenced out whose rename came late is found here). A rank
 * recorded whose rename a crash or a pause cut short is published now from its sealed partial
 * upload (the claim holds: no attempt records or publishes meanwhile, and the holder's own
 * rename then finds its bytes in place). */
static void check_file(commit_check *cc, sl_sstore *st, const char *file, const sl_cat_shard *sh)
{
    char sha[SL_SHARD_HEX_LEN + 1];
    uint64_t size;
    int err;

    if (st->ops->shard_sha) {
        err = st->ops->shard_sha(st, cc->ck->job, file, &size, sha);
        if ((err == SL_ENOTFOUND || (!err && strcmp(sha, sh->sha256) != 0)) && st->ops->recover &&
            st->ops->recover(st, cc->ck->job, cc->ck->name, sh->rank, sh->sha256) == 0)
            err = st->ops->shard_sha(st, cc->ck->job, file, &size, sha);
        if (!err && strcmp(sha, sh->sha256) != 0) {
            snprintf(cc->bad, sizeof(cc->bad),
                     "shard file of rank %d holds sha256 %.16s..., its record says %.16s...: its "
                     "upload has not finished, or was overtaken; upload the rank again",
                     sh->rank, sha, sh->sha256);
            return;
        }
    } else {
        err = st->ops->stat(st, cc->ck->job, file, &size);
    }
    if (err || size != sh->file_size)
        snprintf(cc->bad, sizeof(cc->bad), "shard file of rank %d is missing or has the wrong size",
                 sh->rank);
}

static int check_shard(const sl_cat_shard *sh, void *arg)
{
    commit_check *cc = arg;
    sl_sstore *st = cc->svc->opts.store;
    char file[NAME_MAX + 1];

    if (sh->rank >= cc->ck->world_size)
        return 0;
    note_missing(cc, cc->next, sh->rank);
    cc->next = sh->rank + 1;
    if (cc->sizes) {
        cc->sizes[sh->rank] = sh->file_size;
        memcpy(cc->shas[sh->rank], sh->sha256, SL_SHARD_HEX_LEN + 1);
    } else if (!cc->bad[0] &&
               sl_store_file_name(file, sizeof(file), SL_STORE_SHARD, cc->ck->name, sh->rank) == 0)
        check_file(cc, st, file, sh);
    if (!sh->has_pos) {
        cc->no_pos = sh->rank;
        return 0;
    }
    cc->pos[sh->rank] = sh->pos_position;
    if (cc->n_pos++ == 0) {
        cc->first = sh->rank;
        cc->epoch = sh->pos_epoch;
    } else if (sh->pos_epoch != cc->epoch && !cc->disagree[0]) {
        snprintf(cc->disagree, sizeof(cc->disagree),
                 "the ranks disagree on the epoch: rank %d was in epoch %" PRIu64
                 ", rank %d in epoch %" PRIu64,
                 cc->first, cc->epoch, sh->rank, sh->pos_epoch);
    }
    return 0;
}

static void commit_work(uv_work_t *w)
{
    commit_job *j = w->data;
    sl_sstore *st = j->svc->opts.store;
    char file[NAME_MAX + 1];
    uint64_t size = 0;
    int err;

    /* As check_file does for a local store: the object's header carries the record's checksum,
     * and a rank recorded but not yet published (its holder died or paused between the record
     * and CompleteMultipartUpload) is published now from its sealed upload. */
    for (int32_t r = 0; j->sizes && r < j->ck.world_size; r++) {
        char sha[SL_SHARD_HEX_LEN + 1];
        if (sl_store_file_name(file, sizeof(file), SL_STORE_SHARD, j->ck.name, r) != 0)
            continue;
        err = st->ops->shard_sha(st, j->ck.job, file, &size, sha);
        if ((err == SL_ENOTFOUND || (!err && strcmp(sha, j->shas[r]) != 0)) &&
            st->ops->recover(st, j->ck.job, j->ck.name, r, j->shas[r]) == 0)
            err = st->ops->shard_sha(st, j->ck.job, file, &size, sha);
        if (err && err != SL_ENOTFOUND && err != SL_ECORRUPT) {
            snprintf(j->errmsg, sizeof(j->errmsg), "cannot check the shard of rank %d: %s", r,
                     sl_strerror(err));
            j->err = err;
            return;
        }
        if (!err && strcmp(sha, j->shas[r]) != 0) {
            snprintf(j->errmsg, sizeof(j->errmsg),
                     "shard object of rank %d holds sha256 %.16s..., its record says %.16s...: "
                     "its upload has not finished, or was overtaken; upload the rank again",
                     r, sha, j->shas[r]);
            j->err = SL_ECORRUPT;
            return;
        }
        if (err || size != j->sizes[r]) {
            snprintf(j->errmsg, sizeof(j->errmsg),
                     "shard file of rank %d is missing or has the wrong size", r);
            j->err = SL_ECORRUPT;
            return;
        }
    }
    if (j->sizes && st->ops->tidy)
        st->ops->tidy(st, j->ck.job, j->ck.name, j->ck.world_size,
                      (const char(*)[SL_SHARD_HEX_LEN + 1]) j->shas);
    j->err =
        st->ops->put(st, j->ck.job, j->file, j->json.p, j->json.len, j->errmsg, sizeof(j->errmsg));
}

static void commit_unmark(sl_ckpt_svc *s, ckpt_mark *mark)
{
    for (ckpt_mark **p = &s->committing; *p; p = &(*p)->next) {
        if (*p == mark) {
            *p = mark->next;
            break;
        }
    }
}

static void commit_job_free(commit_job *j)
{
    if (j->call)
        sl_rpc_call_unref(j->call);
    sl_buf_free(&j->json);
    free(j->sizes);
    free(j->shas);
    sl_cat_blob_free(&j->feed_state);
    sl_cat_blob_free(&j->feed_spec);
    sl_cat_blob_free(&j->feed_elastic);
    free(j);
}

static void commit_job_free(commit_job *j);

static void rewrite_work(uv_work_t *w)
{
    commit_job *j = w->data;
    sl_sstore *st = j->svc->opts.store;

    if (j->sizes && st->ops->tidy)
        st->ops->tidy(st, j->ck.job, j->ck.name, j->ck.world_size,
                      (const char(*)[SL_SHARD_HEX_LEN + 1]) j->shas);
    j->err =
        st->ops->put(st, j->ck.job, j->file, j->json.p, j->json.len, j->errmsg, sizeof(j->errmsg));
}

static void rewrite_after(uv_work_t *w, int status)
{
    commit_job *j = w->data;

    (void)status;
    if (j->err)
        sl_log_error("ckpt_metadata_rewrite_failed", "job=%s name=%s error=\"%s\"", j->ck.job,
                     j->ck.name, j->errmsg);
    if (j->call)
        ckpt_reply(j->svc, j->call, &j->ck);
    commit_job_free(j);
}

/* metadata.json as the catalog has the checkpoint now (another replica's commit), written on the
 * worker pool; the job is answered and freed there. 0 once started. */
static int rewrite_metadata(commit_job *j)
{
    Sluice__V1__FeedState *fs = NULL;
    int err;

    if (j->feed_state.len &&
        !(fs = sluice__v1__feed_state__unpack(NULL, j->feed_state.len, j->feed_state.p)))
        return -ENOMEM;
    sl_buf_free(&j->json);
    sl_buf_init(&j->json, SIZE_MAX);
    err = ckpt_render_metadata(j->svc, &j->ck, j->ck.committed_ms, fs, &j->json);
    if (fs)
        sluice__v1__feed_state__free_unpacked(fs, NULL);
    if (err)
        return err;
    ckpt_store_job(j->svc, &j->work, rewrite_work, rewrite_after);
    return 0;
}

static void commit_after(uv_work_t *w, int status)
{
    commit_job *j = w->data;
    sl_ckpt_svc *s = j->svc;
    int err = j->err;

    commit_unmark(s, &j->mark);
    if (err) {
        if (j->claim)
            sl_cat_ckpt_unclaim(s->cat, j->ck.id, commit_replica(s), j->claim);
        sl_log_error("ckpt_commit_failed", "job=%s name=%s error=\"%s\"", j->ck.job, j->ck.name,
                     j->errmsg);
        if (j->call)
            sl_rpc_call_fail(j->call, err, "%s", j->errmsg);
        goto out;
    }
    /* COMPLETE and the feed state it was taken at, in one statement. */
    err = sl_cat_ckpt_complete(s->cat, j->ck.id, j->committed_ms, commit_replica(s), j->claim,
                               &j->feed_state, &j->feed_spec, &j->feed_elastic);
    if (err == SL_ESTATE && sl_cat_ckpt_get(s->cat, &j->ck, j->ck.job, j->ck.name) == 0 &&
        j->ck.state == SL_CKPT_COMPLETE) {
        /* Another replica committed it first (both saw every shard): one commit. Our
         * metadata.json may have landed after the winner's, with our commit time: write the
         * winner's again, then answer. */
        sl_log_info("ckpt_committed_elsewhere", "job=%s name=%s", j->ck.job, j->ck.name);
        if (rewrite_metadata(j) == 0)
            return;
        if (j->call)
            ckpt_reply(s, j->call, &j->ck);
        goto out;
    }
    if (!err)
        err = sl_cat_ckpt_get(s->cat, &j->ck, j->ck.job, j->ck.name);
    if (err) {
        sl_log_error("ckpt_commit_failed", "job=%s name=%s error=\"catalog: %s\"", j->ck.job,
                     j->ck.name, sl_strerror(err));
        if (j->call)
            sl_rpc_call_fail(j->call, err, "catalog error: %s", sl_strerror(err));
        goto out;
    }
    sl_log_info("ckpt_commit",
                "job=%s name=%s world_size=%d bytes=%" PRIu64 " feed_state=%d auto=%d", j->ck.job,
                j->ck.name, j->ck.world_size, j->ck.total_bytes, j->ck.has_feed_state,
                j->call == NULL);
    if (j->call)
        ckpt_reply(s, j->call, &j->ck);
    err = apply_retention(s, j->ck.job, NULL, NULL);
    if (err)
        sl_log_warn("ckpt_retention_failed", "job=%s error=\"%s\"", j->ck.job, sl_strerror(err));
out:
    commit_job_free(j);
}

/* Whether checkpoint ck may be committed now. Returns 0 to go on, 1 if it is COMPLETE already (a
 * commit is idempotent), or an error with msg. */
static int commit_allowed(sl_ckpt_svc *s, const sl_cat_ckpt *ck, char *msg, size_t len)
{
    upload *u;

    if (ck->state == SL_CKPT_COMPLETE)
        return 1;
    if (ck->state != SL_CKPT_WRITING) {
        snprintf(msg, len, "checkpoint %s/%s is %s", ck->job, ck->name,
                 sl_cat_ckpt_state_name(ck->state));
        return SL_ESTATE;
    }
    if (ckpt_is_committing(s, ck->id)) {
        snprintf(msg, len, "checkpoint %s/%s is being committed", ck->job, ck->name);
        return SL_ESTATE;
    }
    if ((u = ckpt_upload_find(s, ck->id, -1)) != NULL) {
        snprintf(msg, len, "an upload of rank %d of %s/%s is in progress", u->rank, ck->job,
                 ck->name);
        return SL_ESTATE;
    }
    return 0;
}

/* Every rank has a recorded shard whose file has the recorded size, and the ranks' data positions
 * make a feed state (into j). Returns 0 or an error with msg. */
static int commit_shards_ok(sl_ckpt_svc *s, commit_job *j, char *msg, size_t len)
{
    const sl_cat_ckpt *ck = &j->ck;
    commit_check cc;
    int err;

    memset(&cc, 0, sizeof(cc));
    cc.svc = s;
    cc.ck = ck;
    cc.no_pos = -1;
    if (sl_sstore_remote(s->opts.store)) {
        if (!(j->sizes = calloc((size_t)ck->world_size, sizeof(*j->sizes))) ||
            !(j->shas = calloc((size_t)ck->world_size, sizeof(*j->shas))))
            return -ENOMEM;
        cc.sizes = j->sizes;
        cc.shas = j->shas;
    }
    sl_buf_init(&cc.missing, 1024);
    if (!(cc.pos = calloc((size_t)ck->world_size, sizeof(*cc.pos)))) {
        sl_buf_free(&cc.missing);
        return -ENOMEM;
    }
    err = sl_cat_shard_list(s->cat, ck->id, 0, check_shard, &cc);
    note_missing(&cc, cc.next, ck->world_size);
    if (err) {
        snprintf(msg, len, "catalog error: %s", sl_strerror(err));
    } else if (cc.n_missing) {
        snprintf(msg, len, "%d of %d ranks have no shard: %s", cc.n_missing, ck->world_size,
                 sl_buf_str(&cc.missing));
        err = SL_ESTATE;
    } else if (cc.bad[0]) {
        snprintf(msg, len, "%s", cc.bad);
        err = SL_ECORRUPT;
    } else if (cc.n_pos && cc.no_pos >= 0) {
        snprintf(msg, len,
                 "rank %d sent no data position but rank %d did: every rank of a checkpoint "
                 "bound to a feed job sends one, or none does",
                 cc.no_pos, cc.first);
        err = SL_ESTATE;
    } else if (cc.disagree[0]) {
        snprintf(msg, len, "%s", cc.disagree);
        err = SL_ESTATE;
    } else if (cc.n_pos) {
        if (!s->opts.feed) {
            snprintf(msg, len, "this daemon has no feeding service");
            err = SL_ESTATE;
        } else {
            err =
                sl_feed_capture(s->opts.feed, ck->feed_job, cc.epoch, (uint32_t)ck->world_size,
                                cc.pos, &j->feed_state, &j->feed_spec, &j->feed_elastic, msg, len);
        }
    }
    free(cc.pos);
    sl_buf_free(&cc.missing);
    return err;
}

static const char *commit_replica(const sl_ckpt_svc *s)
{
    return s->opts.replica ? s->opts.replica : "";
}

/* Replicas of a shared catalog: claim the commit (a row), in a transaction that finds the
 * checkpoint WRITING, unclaimed and with no upload lease live on any replica; from then on no
 * replica takes a lease on it, records a shard or aborts it until the claim ends. Returns 0, 1 if
 * it is COMPLETE already, or an error with msg. */
static int commit_claim(sl_ckpt_svc *s, commit_job *j, char *msg, size_t len)
{
    sl_cat_refusal why;
    int err;

    if (!sl_cat_shared(s->cat))
        return 0;
    err = sl_cat_ckpt_claim(s->cat, j->ck.id, commit_replica(s), &j->claim, &why);
    if (err == SL_ESTATE && why.rank < 0 && why.state == SL_CKPT_COMPLETE)
        return 1; /* committed elsewhere meanwhile: a commit is idempotent */
    if (err == SL_EUNAVAILABLE) {
        snprintf(msg, len, "%s/%s is being committed by replica %s: ask again", j->ck.job,
                 j->ck.name, why.who);
        return err;
    }
    if (err)
        err = ckpt_refusal_msg(msg, len, err, &why, j->ck.job, j->ck.name);
    return err;
}

/* Start committing ck (call NULL: an auto-commit): checks, the feed state, metadata.json rendered
 * here and written on the worker pool, then COMPLETE. Returns 0 once started, 1 if ck is COMPLETE
 * already, or an error with msg (nothing started). */
static int commit_start(sl_ckpt_svc *s, sl_rpc_call *call, const sl_cat_ckpt *ck, char *msg,
                        size_t len)
{
    Sluice__V1__FeedState *fs = NULL;
    commit_job *j;
    int err = commit_allowed(s, ck, msg, len);

    if (err)
        return err;
    if (!(j = calloc(1, sizeof(*j))))
        return -ENOMEM;
    j->svc = s;
    j->ck = *ck;
    j->committed_ms = sl_now_ms();
    sl_buf_init(&j->json, SIZE_MAX);
    if (sl_store_file_name(j->file, sizeof(j->file), SL_STORE_META, ck->name, 0) != 0) {
        snprintf(msg, len, "path too long");
        err = SL_ELIMIT;
        goto fail;
    }
    if ((err = commit_claim(s, j, msg, len)) != 0)
        goto fail;
    /* With the claim held, the shard rows cannot change under these checks. */
    if ((err = commit_shards_ok(s, j, msg, len)) != 0)
        goto fail;
    if (j->feed_state.len &&
        !(fs = sluice__v1__feed_state__unpack(NULL, j->feed_state.len, j->feed_state.p))) {
        err = -ENOMEM;
        goto fail;
    }
    err = ckpt_render_metadata(s, ck, j->committed_ms, fs, &j->json);
    if (fs)
        sluice__v1__feed_state__free_unpacked(fs, NULL);
    if (err) {
        snprintf(msg, len, "cannot render the metadata: %s", sl_strerror(err));
        goto fail;
    }
    j->mark.id = ck->id;
    j->mark.next = s->committing;
    s->committing = &j->mark;
    j->work.work.data = j;
    if (call) {
        j->call = call;
        sl_rpc_call_ref(call);
    }
    sl_cat_queue_work(s->cat, s->loop, &j->work, commit_work, commit_after);
    return 0;
fail:
    if (j->claim && err != 1)
        sl_cat_ckpt_unclaim(s->cat, ck->id, commit_replica(s), j->claim);
    commit_job_free(j);
    return err;
}

void ckpt_commit(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__CheckpointRef *req = (const void *)msg;
    sl_ckpt_svc *s = arg;
    sl_cat_ckpt ck;
    char why[CKPT_MSG_MAX];
    int err;

    if (!ckpt_names_ok(call, req->job, req->name) || ckpt_find(s, call, &ck, req->job, req->name))
        return;
    why[0] = 0;
    err = commit_start(s, call, &ck, why, sizeof(why));
    /* COMPLETE already (perhaps by another replica a moment ago): as the catalog has it now. */
    if (err == 1 && ckpt_find(s, call, &ck, req->job, req->name) == 0)
        ckpt_reply(s, call, &ck);
    else if (err)
        sl_rpc_call_fail(call, err, "%s", why[0] ? why : sl_strerror(err));
}

static int pending_one(const sl_cat_ckpt *c, void *arg)
{
    if (c->auto_commit && c->shards >= (uint32_t)c->world_size)
        ckpt_auto_commit(arg, c->job, c->name);
    return 0;
}

void ckpt_auto_commit_pending(sl_ckpt_svc *s)
{
    int err = sl_cat_ckpt_list(s->cat, NULL, SL_CKPT_WRITING, pending_one, s);

    if (err)
        sl_log_warn("ckpt_auto_commit_scan_failed", "error=\"%s\"", sl_strerror(err));
}

void ckpt_auto_commit(sl_ckpt_svc *s, const char *job, const char *name)
{
    sl_cat_ckpt ck;
    char why[CKPT_MSG_MAX];
    int err;

    if (sl_cat_ckpt_get(s->cat, &ck, job, name) != 0 || !ck.auto_commit ||
        ck.state != SL_CKPT_WRITING || ck.shards < (uint32_t)ck.world_size ||
        ckpt_is_committing(s, ck.id) || ckpt_upload_find(s, ck.id, -1))
        return;
    why[0] = 0;
    err = commit_start(s, NULL, &ck, why, sizeof(why));
    /* SL_EUNAVAILABLE: another replica commits it. */
    if (err && err != 1 && err != SL_EUNAVAILABLE)
        sl_log_warn("ckpt_auto_commit_refused", "job=%s name=%s error=\"%s\"", ck.job, ck.name,
                    why[0] ? why : sl_strerror(err));
}
