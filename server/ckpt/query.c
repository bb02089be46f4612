/* Begin, Get, List, Latest and UploadStatus: checkpoints as the catalog has them, and how much
 * of an interrupted upload the server holds. */
#include "internal.h"
#include "util/array.h"

#include "err.h"
#include "log.h"
#include "store/layout.h"
#include "store/sstore.h"
#include "feed/feed.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A Begin refused because its job or checkpoint name equals another but for case: answers
 * ALREADY_EXISTS naming both and returns 1, else 0 (the refusal was another one). */
static int begin_case_clash(sl_ckpt_svc *s, sl_rpc_call *call, const char *job, const char *name)
{
    char other[SL_CAT_FEED_NAME_MAX + 1];

    if (sl_cat_name_clash(s->cat, SL_CAT_NAME_JOB, NULL, job, other, sizeof(other)) == SL_EEXIST)
        sl_rpc_call_fail(call, SL_EEXIST,
                         "job '%s' differs only in case from the existing job '%s' (names are "
                         "case-insensitive)",
                         job, other);
    else if (sl_cat_name_clash(s->cat, SL_CAT_NAME_CKPT, job, name, other, sizeof(other)) ==
             SL_EEXIST)
        sl_rpc_call_fail(call, SL_EEXIST,
                         "checkpoint %s/%s differs only in case from the existing checkpoint "
                         "%s/%s (names are case-insensitive)",
                         job, name, job, other);
    else
        return 0;
    return 1;
}

void ckpt_begin(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__BeginRequest *req = (const void *)msg;
    sl_ckpt_svc *s = arg;
    sl_cat_ckpt ck;
    char name[SL_SHARD_NAME_MAX + 1], why[CKPT_MSG_MAX];
    const char *feed_job;
    int created, err;

    err = sl_ckpt_check_begin(req, name, sizeof(name), why, sizeof(why));
    if (err) {
        sl_rpc_call_fail(call, err, "%s", why);
        return;
    }
    /* The feed job it carries the data position of: the one named, else the job's namesake. */
    feed_job = req->feed_job && *req->feed_job ? req->feed_job : NULL;
    if (feed_job && !(s->opts.feed && sl_feed_job_exists(s->opts.feed, feed_job))) {
        /* A job that is being loaded (its labels read) is waited for, not missed. */
        if ((err = s->opts.feed
                       ? sl_feed_park_job(s->opts.feed, feed_job, call, msg, ckpt_begin, arg)
                       : 0) <= 0)
            sl_rpc_call_fail(call, err ? err : SL_ENOTFOUND, "feed job '%s' %s", feed_job,
                             err ? "could not be waited for" : "not found");
        return;
    }
    if (!feed_job && !req->no_feed && s->opts.feed) {
        if (sl_feed_job_exists(s->opts.feed, req->job))
            feed_job = req->job;
        else if ((err = sl_feed_park_job(s->opts.feed, req->job, call, msg, ckpt_begin, arg)) != 0)
            goto parked;
    }
    err = sl_cat_ckpt_begin_bound(s->cat, &ck, &created, req->job, name, req->step, req->world_size,
                                  req->user_metadata, sl_now_ms(), feed_job, req->auto_commit);
    if (err == SL_EEXIST && begin_case_clash(s, call, req->job, name))
        return;
    if (err == SL_EEXIST) {
        sl_rpc_call_fail(call, err,
                         "checkpoint %s/%s exists (%s) with world_size %d and step %" PRIu64
                         ", not %d and %" PRIu64,
                         req->job, name, sl_cat_ckpt_state_name(ck.state), ck.world_size, ck.step,
                         req->world_size, req->step);
        return;
    }
    if (err) {
        sl_rpc_call_fail(call, err, "catalog error: %s", sl_strerror(err));
        return;
    }
    if (created)
        sl_log_info("ckpt_begin", "job=%s name=%s world_size=%d feed_job=%s auto_commit=%d",
                    req->job, name, req->world_size, ck.feed_job, ck.auto_commit);
    ckpt_reply(s, call, &ck);
    return;
parked:
    if (err < 0)
        sl_rpc_call_fail(call, err, "feed job '%s' could not be waited for", req->job);
}

typedef struct shard_list {
    Sluice__V1__ShardInfo **v;
    size_t n, cap;
    const char *job, *name;
} shard_list;

static int collect_shard(const sl_cat_shard *sh, void *arg)
{
    shard_list *l = arg;
    Sluice__V1__ShardInfo *si;
    char file[NAME_MAX + 1], path[PATH_MAX];

    if (sl_array_grow((void **)&l->v, &l->cap, l->n, sizeof(*l->v), 16) != 0)
        return -ENOMEM;
    si = calloc(1, sizeof(*si));
    if (!si)
        return -ENOMEM;
    sluice__v1__shard_info__init(si);
    sl_shard_file_name(file, sizeof(file), l->name, sh->rank);
    snprintf(path, sizeof(path), "checkpoints/%s/%s", l->job, file);
    si->rank = sh->rank;
    si->data_size = sh->data_size;
    si->file_size = sh->file_size;
    si->sha256 = strdup(sh->sha256);
    si->path = strdup(path);
    si->tensor_count = sh->tensor_count;
    l->v[l->n++] = si;
    if (!si->sha256 || !si->path)
        return -ENOMEM;
    return 0;
}

void ckpt_get(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__CheckpointRef *req = (const void *)msg;
    sl_ckpt_svc *s = arg;
    Sluice__V1__Checkpoint m;
    shard_list l = {0};
    sl_cat_ckpt ck;
    int err;

    if (!ckpt_names_ok(call, req->job, req->name) || ckpt_find(s, call, &ck, req->job, req->name))
        return;
    l.job = ck.job;
    l.name = ck.name;
    err = sl_cat_shard_list(s->cat, ck.id, 0, collect_shard, &l);
    ckpt_pb_fill(&m, &ck);
    m.shards = l.v;
    m.n_shards = l.n;
    if (!err)
        err = ckpt_feed_state_load(s, &ck, &m.feed_state);
    if (err)
        sl_rpc_call_fail(call, err, "cannot list shards or read the feed state: %s",
                         sl_strerror(err));
    else
        sl_rpc_call_reply(call, &m.base);
    ckpt_pb_clear(&m);
}

typedef struct ckpt_vec {
    Sluice__V1__Checkpoint **v;
    size_t n, cap;
} ckpt_vec;

static int collect_ckpt(const sl_cat_ckpt *c, void *arg)
{
    ckpt_vec *l = arg;
    Sluice__V1__Checkpoint *m;

    if (l->n >= LIST_MAX)
        return 1;
    if (sl_array_grow((void **)&l->v, &l->cap, l->n, sizeof(*l->v), 16) != 0)
        return -ENOMEM;
    m = malloc(sizeof(*m));
    if (!m)
        return -ENOMEM;
    ckpt_pb_fill(m, c);
    l->v[l->n++] = m;
    return 0;
}

void ckpt_list(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__ListRequest *req = (const void *)msg;
    Sluice__V1__ListResponse resp = SLUICE__V1__LIST_RESPONSE__INIT;
    sl_ckpt_svc *s = arg;
    ckpt_vec l = {0};
    int err;

    if (req->job && *req->job && !ckpt_names_ok(call, req->job, NULL))
        return;
    if ((int)req->state < 0 || (int)req->state > SL_CKPT_INCOMPLETE) {
        sl_rpc_call_fail(call, SL_EINVAL, "state %d is not a checkpoint state", (int)req->state);
        return;
    }
    /* A callback's 1 (LIST_MAX reached) ends the listing early without an error. */
    err = sl_cat_ckpt_list(s->cat, req->job, (int)req->state, collect_ckpt, &l);
    resp.checkpoints = l.v;
    resp.n_checkpoints = l.n;
    if (err < 0)
        sl_rpc_call_fail(call, err, "cannot list checkpoints");
    else
        sl_rpc_call_reply(call, &resp.base);
    for (size_t i = 0; i < l.n; i++) {
        ckpt_pb_clear(l.v[i]);
        free(l.v[i]);
    }
    free(l.v);
}

void ckpt_latest(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__LatestRequest *req = (const void *)msg;
    sl_ckpt_svc *s = arg;
    sl_cat_ckpt ck;
    int err;

    if (!ckpt_names_ok(call, req->job, NULL))
        return;
    err = sl_cat_ckpt_latest(s->cat, &ck, req->job);
    if (err == SL_ENOTFOUND)
        sl_rpc_call_fail(call, err, "job %s has no COMPLETE checkpoint", req->job);
    else if (err)
        sl_rpc_call_fail(call, err, "catalog error: %s", sl_strerror(err));
    else
        ckpt_reply(s, call, &ck);
}

/* An UploadStatus answered after the store said what it holds (object storage: on the worker
 * pool). */
typedef struct status_job {
    sl_cat_work work;
    sl_sstore *store;
    sl_rpc_call *call;
    char job[SL_SHARD_NAME_MAX + 1], name[SL_SHARD_NAME_MAX + 1];
    int32_t rank;
    int stored;
    char sha256[SL_SHARD_HEX_LEN + 1];
    uint64_t held;
} status_job;

static void status_work(uv_work_t *w)
{
    status_job *j = w->data;

    /* Nothing held (no partial upload, or not one of this rank) leaves held 0. */
    if (j->store->ops->held(j->store, j->job, j->name, j->rank, &j->held) != 0)
        j->held = 0;
}

static void status_after(uv_work_t *w, int status)
{
    Sluice__V1__UploadStatusResponse resp = SLUICE__V1__UPLOAD_STATUS_RESPONSE__INIT;
    status_job *j = w->data;

    resp.stored = j->stored;
    resp.sha256 = j->sha256;
    resp.held_bytes = j->held;
    if (!sl_rpc_call_is_done(j->call))
        sl_rpc_call_reply(j->call, &resp.base);
    sl_rpc_call_unref(j->call);
    free(j);
}

void ckpt_upload_status(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__UploadStatusRequest *req = (const void *)msg;
    Sluice__V1__UploadStatusResponse resp = SLUICE__V1__UPLOAD_STATUS_RESPONSE__INIT;
    sl_ckpt_svc *s = arg;
    char why[CKPT_MSG_MAX];
    sl_cat_shard sh;
    sl_cat_ckpt ck;
    status_job *j;
    upload *u;
    int err;

    if (!ckpt_names_ok(call, req->job, req->checkpoint) ||
        ckpt_find(s, call, &ck, req->job, req->checkpoint))
        return;
    err = sl_ckpt_check_rank(req->rank, ck.world_size, why, sizeof(why));
    if (err) {
        sl_rpc_call_fail(call, err, "%s", why);
        return;
    }
    if (sl_cat_shard_get(s->cat, &sh, ck.id, req->rank) == 0) {
        resp.stored = 1;
        resp.sha256 = sh.sha256;
    }
    if ((u = ckpt_upload_find(s, ck.id, req->rank)) != NULL) {
        resp.in_progress = 1;
        resp.held_bytes = u->acked;
        sl_rpc_call_reply(call, &resp.base);
        return;
    }
    /* Running on another replica (its lease is live): the client waits for it to end. */
    if (ckpt_lease_elsewhere(s, ck.id, req->rank)) {
        resp.in_progress = 1;
        sl_rpc_call_reply(call, &resp.base);
        return;
    }
    if (!(j = calloc(1, sizeof(*j)))) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        return;
    }
    j->work.work.data = j;
    j->store = s->opts.store;
    j->call = call;
    j->rank = req->rank;
    j->stored = resp.stored;
    if (resp.stored)
        memcpy(j->sha256, sh.sha256, sizeof(j->sha256));
    snprintf(j->job, sizeof(j->job), "%s", ck.job);
    snprintf(j->name, sizeof(j->name), "%s", ck.name);
    sl_rpc_call_ref(call);
    ckpt_store_job(s, &j->work, status_work, status_after);
}
