/* Checks and answers the Checkpoints handlers share. See internal.h. */
#include "internal.h"

#include "err.h"
#include "store/layout.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ckpt_names_ok(sl_rpc_call *call, const char *job, const char *name)
{
    char msg[CKPT_MSG_MAX];
    int err = sl_ckpt_check_names(job, name, msg, sizeof(msg));

    if (err)
        sl_rpc_call_fail(call, err, "%s", msg);
    return !err;
}

int ckpt_find(sl_ckpt_svc *s, sl_rpc_call *call, sl_cat_ckpt *ck, const char *job, const char *name)
{
    int err = sl_cat_ckpt_get(s->cat, ck, job, name);

    if (err == SL_ENOTFOUND)
        sl_rpc_call_fail(call, err, "checkpoint %s/%s not found", job, name);
    else if (err)
        sl_rpc_call_fail(call, err, "catalog error: %s", sl_strerror(err));
    return err;
}

int ckpt_refusal_msg(char *msg, size_t len, int err, const sl_cat_refusal *why, const char *job,
                     const char *name)
{
    switch (err) {
    case SL_ENOTFOUND:
        snprintf(msg, len, "checkpoint %s/%s not found", job, name);
        return err;
    case SL_ESTATE:
        if (why->rank >= 0)
            snprintf(msg, len, "an upload of rank %d of %s/%s is in progress on replica %s",
                     why->rank, job, name, why->who);
        else
            snprintf(msg, len, "checkpoint %s/%s is %s, not WRITING", job, name,
                     sl_cat_ckpt_state_name(why->state));
        return err;
    case SL_EUNAVAILABLE:
        snprintf(msg, len, "checkpoint %s/%s is being committed by replica %s", job, name,
                 why->who[0] ? why->who : "(unknown)");
        return SL_ESTATE;
    case SL_EFENCED:
        snprintf(msg, len, "this upload attempt was taken over by a newer one (another replica)");
        return err;
    default:
        snprintf(msg, len, "catalog error: %s", sl_strerror(err));
        return err;
    }
}

void ckpt_refusal_fail(sl_rpc_call *call, int err, const sl_cat_refusal *why, const char *job,
                       const char *name)
{
    char msg[CKPT_MSG_MAX];

    err = ckpt_refusal_msg(msg, sizeof(msg), err, why, job, name);
    sl_rpc_call_fail(call, err, "%s", msg);
}

void ckpt_pb_fill(Sluice__V1__Checkpoint *m, const sl_cat_ckpt *c)
{
    sluice__v1__checkpoint__init(m);
    m->job = strdup(c->job);
    m->name = strdup(c->name);
    m->step = c->step;
    m->world_size = c->world_size;
    m->state = (Sluice__V1__CheckpointState)c->state;
    m->user_metadata = strdup(c->user_metadata);
    m->created_at_ms = c->created_ms;
    m->committed_at_ms = c->committed_ms;
    m->shards_uploaded = c->shards;
    m->total_bytes = c->total_bytes;
    m->feed_job = strdup(c->feed_job);
    m->auto_commit = c->auto_commit != 0;
}

int ckpt_feed_state_load(sl_ckpt_svc *s, const sl_cat_ckpt *c, Sluice__V1__FeedState **out)
{
    sl_cat_blob st;
    int err;

    *out = NULL;
    if (!c->has_feed_state)
        return 0;
    err = sl_cat_ckpt_feed_get(s->cat, c->id, &st, NULL, NULL);
    if (err)
        return err;
    *out = sluice__v1__feed_state__unpack(NULL, st.len, st.p);
    sl_cat_blob_free(&st);
    return *out ? 0 : SL_ECORRUPT;
}

void ckpt_pb_clear(Sluice__V1__Checkpoint *m)
{
    free(m->job);
    free(m->name);
    free(m->user_metadata);
    free(m->feed_job);
    if (m->feed_state)
        sluice__v1__feed_state__free_unpacked(m->feed_state, NULL);
    for (size_t i = 0; i < m->n_shards; i++) {
        free(m->shards[i]->sha256);
        free(m->shards[i]->path);
        free(m->shards[i]);
    }
    free(m->shards);
}

void ckpt_reply(sl_ckpt_svc *s, sl_rpc_call *call, const sl_cat_ckpt *c)
{
    Sluice__V1__Checkpoint m;
    int err;

    ckpt_pb_fill(&m, c);
    err = ckpt_feed_state_load(s, c, &m.feed_state);
    if (err)
        sl_rpc_call_fail(call, err, "cannot read the feed state of %s/%s: %s", c->job, c->name,
                         sl_strerror(err));
    else if (!m.job || !m.name || !m.user_metadata || !m.feed_job)
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
    else
        sl_rpc_call_reply(call, &m.base);
    ckpt_pb_clear(&m);
}
