/* Restore: a feed job put back to the data position a COMPLETE checkpoint was taken at (its
 * feed state, stored by Commit). The rewind itself is the feeding service's (feed/restore.c). */
#include "internal.h"

#include "err.h"
#include "feed/feed.h"
#include "log.h"

#include <inttypes.h>
#include <stdio.h>

void ckpt_restore(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__RestoreRequest *req = (const void *)msg;
    Sluice__V1__RestoreResponse resp = SLUICE__V1__RESTORE_RESPONSE__INIT;
    sl_ckpt_svc *s = arg;
    sl_cat_blob state, spec, elastic;
    sl_feed_restore_req fr;
    sl_cat_ckpt ck;
    char why[CKPT_MSG_MAX];
    uint64_t epoch = 0;
    uint32_t world = 0;
    int err, parked;

    if (!ckpt_names_ok(call, req->job, req->name))
        return;
    if (req->world_size > SL_CKPT_MAX_WORLD) {
        sl_rpc_call_fail(call, SL_EINVAL, "world_size %u out of range [0, %d]", req->world_size,
                         SL_CKPT_MAX_WORLD);
        return;
    }
    if (ckpt_find(s, call, &ck, req->job, req->name))
        return;
    if (ck.state != SL_CKPT_COMPLETE) {
        sl_rpc_call_fail(call, SL_ESTATE,
                         "checkpoint %s/%s is %s: only a COMPLETE checkpoint can be restored",
                         ck.job, ck.name, sl_cat_ckpt_state_name(ck.state));
        return;
    }
    if (!ck.has_feed_state || !s->opts.feed) {
        sl_rpc_call_fail(call, SL_ESTATE,
                         "checkpoint %s/%s carries no data position (feed job '%s'): its ranks "
                         "sent none",
                         ck.job, ck.name, ck.feed_job);
        return;
    }
    err = sl_cat_ckpt_feed_get(s->cat, ck.id, &state, &spec, &elastic);
    if (err) {
        sl_rpc_call_fail(call, err, "catalog error: %s", sl_strerror(err));
        return;
    }
    fr.state = &state;
    fr.spec = &spec;
    fr.elastic = &elastic;
    fr.world = req->world_size;
    fr.mesh = req->mesh;
    why[0] = 0;
    err = sl_feed_restore(s->opts.feed, &fr, &epoch, &world, why, sizeof(why));
    /* A feed job that is being loaded (its labels read): run again once it is. */
    if (err == SL_ENOTFOUND &&
        (parked = sl_feed_park_job(s->opts.feed, ck.feed_job, call, msg, ckpt_restore, arg)) != 0) {
        if (parked < 0)
            sl_rpc_call_fail(call, parked, "feed job '%s' could not be waited for", ck.feed_job);
    } else if (err) {
        sl_rpc_call_fail(call, err, "%s", why[0] ? why : sl_strerror(err));
    } else {
        resp.restored = sluice__v1__feed_state__unpack(NULL, state.len, state.p);
        resp.feed_job = ck.feed_job;
        resp.epoch = epoch;
        resp.world_size = world;
        sl_log_info("ckpt_restore", "job=%s name=%s feed_job=%s epoch=%" PRIu64 " world=%u", ck.job,
                    ck.name, ck.feed_job, epoch, world);
        if (!resp.restored)
            sl_rpc_call_fail(call, SL_ECORRUPT, "the feed state of %s/%s is corrupt", ck.job,
                             ck.name);
        else
            sl_rpc_call_reply(call, &resp.base);
        if (resp.restored)
            sluice__v1__feed_state__free_unpacked(resp.restored, NULL);
    }
    sl_cat_blob_free(&state);
    sl_cat_blob_free(&spec);
    sl_cat_blob_free(&elastic);
}
