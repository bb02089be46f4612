/* Checkpoints that carry the data position: the feed state a checkpoint is committed with (built
 * from its ranks' positions), and Restore, which puts a job back to it. The checkpoint service
 * calls these; they read and write the feed's catalog tables and jobs in memory. */
#include "internal.h"

#include "err.h"
#include "log.h"
#include "sluice/v1/checkpoint.pb-c.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The job as the catalog has it now, or NULL: with a shared catalog another replica may have
 * made, resized or restored it a moment ago (if the catalog cannot be read, this replica's copy;
 * the statements that follow fail the same way). */
static fjob *job_now(sl_feed *f, const char *name)
{
    fjob *j = NULL;

    return feed_job_current(f, name, &j) == 0 ? j : NULL;
}

int sl_feed_job_exists(sl_feed *f, const char *name)
{
    return job_now(f, name) != NULL;
}

int sl_feed_park_job(sl_feed *f, const char *name, sl_rpc_call *call, const ProtobufCMessage *m,
                     void (*h)(sl_rpc_call *call, const ProtobufCMessage *m, void *arg), void *arg)
{
    return feed_labels_park_job(f, name, call, m, h, arg);
}

/* A job spec packed without its world and mesh: what must not change between a checkpoint and
 * its restore (dataset, partition, shuffle, seed, drop_last, batching...). */
static int pack_settings(const Sluice__V1__Job *spec, uint8_t **out, size_t *out_len)
{
    Sluice__V1__Job c = *spec;

    c.world_size = 0;
    c.mesh = NULL;
    c.epoch = 0;
    c.created_ms = 0;
    c.dp_size = 0;
    c.resized_in_epoch = 0;
    c.manual_advance = 0;
    *out_len = sluice__v1__job__get_packed_size(&c);
    *out = malloc(*out_len ? *out_len : 1);
    if (!*out)
        return -ENOMEM;
    sluice__v1__job__pack(&c, *out);
    return 0;
}

static int same_settings(const Sluice__V1__Job *a, const Sluice__V1__Job *b)
{
    uint8_t *pa = NULL, *pb = NULL;
    size_t la, lb;
    int same = 0;

    if (pack_settings(a, &pa, &la) == 0 && pack_settings(b, &pb, &lb) == 0)
        same = la == lb && memcmp(pa, pb, la) == 0;
    free(pa);
    free(pb);
    return same;
}

int sl_feed_capture(sl_feed *f, const char *job, uint64_t epoch, uint32_t world,
                    const uint64_t *rank_pos, sl_cat_blob *state, sl_cat_blob *spec_out,
                    sl_cat_blob *elastic_out, char *msg, size_t len)
{
    Sluice__V1__FeedState fs = SLUICE__V1__FEED_STATE__INIT;
    Sluice__V1__Job *spec = NULL;
    sl_cat_dataset ds;
    sl_sample_config cfg;
    uint64_t *pos = NULL;
    uint32_t w = 0, dp, dp_size;
    fjob *j = job_now(f, job);
    int err;

    state->p = NULL;
    state->len = 0;
    spec_out->p = elastic_out->p = NULL;
    spec_out->len = elastic_out->len = 0;
    if (!j && feed_labels_loading(f, job)) {
        snprintf(msg, len, "feed job '%s' is being loaded (its labels are read); retry", job);
        return SL_EUNAVAILABLE;
    }
    if (!j) {
        snprintf(msg, len, "feed job '%s' not found", job);
        return SL_ENOTFOUND;
    }
    err = sl_cat_epoch_get(f->cat, job, epoch, spec_out, &w, elastic_out);
    if (err == SL_ENOTFOUND) {
        snprintf(msg, len,
                 "feed job '%s' has no record of epoch %" PRIu64 " (it is in epoch %" PRIu64
                 "; the last 64 epochs are kept)",
                 job, epoch, j->epoch);
        err = SL_ESTATE;
        goto out;
    }
    if (err) {
        snprintf(msg, len, "catalog error: %s", sl_strerror(err));
        goto out;
    }
    if (w != world) {
        snprintf(msg, len,
                 "the ranks ran in a world of %u but feed job '%s' had a world of %u in epoch "
                 "%" PRIu64,
                 world, job, w, epoch);
        err = SL_ESTATE;
        goto out;
    }
    spec = sluice__v1__job__unpack(NULL, spec_out->len, spec_out->p);
    if (!spec) {
        snprintf(msg, len, "the spec of feed job '%s' in epoch %" PRIu64 " is corrupt", job, epoch);
        err = SL_ECORRUPT;
        goto out;
    }
    if ((err = feed_spec_config(&cfg, spec, flabels_of(j->labels), j->samples, epoch, msg, len)) !=
            0 ||
        (err = sl_sample_dp_rank(&dp, &dp_size, &cfg, msg, len)) != 0)
        goto out;
    if (!(pos = malloc(sizeof(*pos) * dp_size))) {
        err = -ENOMEM;
        goto out;
    }
    for (uint32_t d = 0; d < dp_size; d++)
        pos[d] = UINT64_MAX;
    /* A dp rank's tp/cp/pp replicas read the same share; the lowest of their positions is kept,
     * so nothing is skipped if they disagree. */
    for (uint32_t r = 0; r < world; r++) {
        cfg.rank = r;
        if ((err = sl_sample_dp_rank(&dp, &dp_size, &cfg, msg, len)) != 0)
            goto out;
        if (rank_pos[r] < pos[dp])
            pos[dp] = rank_pos[r];
        if (rank_pos[r] > j->samples) {
            snprintf(msg, len,
                     "rank %u's position %" PRIu64 " is past the %" PRIu64
                     " samples of feed job '%s'",
                     r, rank_pos[r], j->samples, job);
            err = SL_EINVAL;
            goto out;
        }
        /* An index share's size is known here (a batch share's needs the plan, an elastic
         * share's the remainder plan: those are bounded by the sample count above). */
        if (!spec->batching && !elastic_out->len) {
            uint64_t n;
            if ((err = sl_sample_share_count(&n, &cfg, msg, len)) != 0)
                goto out;
            if (rank_pos[r] > n) {
                snprintf(msg, len,
                         "rank %u's position %" PRIu64 " is past the end of its share (%" PRIu64
                         " indices) in epoch %" PRIu64 " of feed job '%s'",
                         r, rank_pos[r], n, epoch, job);
                err = SL_EINVAL;
                goto out;
            }
        }
    }
    err = sl_cat_dataset_get(f->cat, &ds, j->dataset);
    if (err) {
        snprintf(msg, len, "dataset '%s' of feed job '%s': %s", j->dataset, job, sl_strerror(err));
        goto out;
    }
    fs.job = (char *)job;
    fs.epoch = epoch;
    fs.world_size = world;
    fs.mesh = feed_mesh_set(spec->mesh) ? spec->mesh : NULL;
    fs.unit = spec->batching ? "batches" : "indices";
    fs.n_positions = dp_size;
    fs.positions = pos;
    fs.samples = ds.samples;
    fs.lengths_sha256 = ds.has_lengths ? ds.lengths_sha256 : "";
    fs.elastic = elastic_out->len > 0;
    state->len = sluice__v1__feed_state__get_packed_size(&fs);
    if (!(state->p = malloc(state->len ? state->len : 1))) {
        err = -ENOMEM;
        goto out;
    }
    sluice__v1__feed_state__pack(&fs, state->p);
out:
    if (spec)
        sluice__v1__job__free_unpacked(spec, NULL);
    free(pos);
    if (err) {
        sl_cat_blob_free(state);
        sl_cat_blob_free(spec_out);
        sl_cat_blob_free(elastic_out);
    }
    return err;
}

/* Whether Resize can take the restored job (its checkpoint's `spec`) into `world` and `mesh`,
 * checked before anything is written so that a refused resize leaves the job as it was: the
 * new world and mesh must make a valid spec. Mid-epoch resizes chain (an epoch resized before
 * is resized again) and batch jobs resize mid-epoch too (weighted ones re-plan the rest). */
static int resize_possible(const fjob *j, Sluice__V1__Job *spec, const Sluice__V1__FeedState *fs,
                           uint32_t world, Sluice__V1__Mesh *mesh, char *msg, size_t len)
{
    Sluice__V1__Mesh *saved_mesh = spec->mesh;
    uint32_t saved_world = spec->world_size, dp, dp_size;
    size_t saved_nw = spec->n_rank_weights;
    sl_sample_config c;
    int err;

    if (feed_mesh_set(spec->mesh) && !feed_mesh_set(mesh)) {
        snprintf(msg, len, "job '%s' has a mesh: give the new mesh (its product = world_size)",
                 j->name);
        return SL_EINVAL;
    }
    spec->world_size = world;
    spec->mesh = feed_mesh_set(mesh) ? mesh : NULL;
    /* As the resize will: rank weights stay only while the dp world keeps its size. */
    if (saved_nw && saved_nw != (feed_mesh_set(mesh) ? mesh->dp : world))
        spec->n_rank_weights = 0;
    err = feed_spec_config(&c, spec, flabels_of(j->labels), j->samples, fs->epoch, msg, len);
    if (!err)
        err = sl_sample_dp_rank(&dp, &dp_size, &c, msg, len);
    spec->world_size = saved_world;
    spec->mesh = saved_mesh;
    spec->n_rank_weights = saved_nw;
    if (err)
        return err;
    /* Mid-epoch, the resize adds a step to the epoch's chain like Jobs.Resize: index jobs and
     * unweighted batch jobs redistribute the rest, weighted batch jobs re-plan it. */
    return 0;
}

static int mesh_same(const Sluice__V1__Mesh *a, const Sluice__V1__Mesh *b)
{
    if (!feed_mesh_set(a) || !feed_mesh_set(b))
        return feed_mesh_set(a) == feed_mesh_set(b);
    return a->dp == b->dp && a->tp == b->tp && a->cp == b->cp && a->pp == b->pp &&
           strcmp(a->order ? a->order : "", b->order ? b->order : "") == 0;
}

int sl_feed_restore(sl_feed *f, const sl_feed_restore_req *req, uint64_t *epoch_out,
                    uint32_t *world_out, char *msg, size_t len)
{
    Sluice__V1__FeedState *fs = NULL;
    Sluice__V1__Job *spec = NULL;
    sl_cat_dataset ds;
    fjob *j;
    int resize, err = 0;

    fs = sluice__v1__feed_state__unpack(NULL, req->state->len, req->state->p);
    if (fs)
        spec = sluice__v1__job__unpack(NULL, req->spec->len, req->spec->p);
    if (!fs || !spec || !fs->job) {
        snprintf(msg, len, "the checkpoint's feed state is corrupt");
        err = SL_ECORRUPT;
        goto out;
    }
    if (!(j = job_now(f, fs->job))) {
        snprintf(msg, len, "feed job '%s' not found", fs->job);
        err = SL_ENOTFOUND;
        goto out;
    }
    if (j->samples != fs->samples) {
        snprintf(msg, len,
                 "dataset '%s' of feed job '%s' has %" PRIu64
                 " samples; the checkpoint was taken with %" PRIu64,
                 j->dataset, j->name, j->samples, fs->samples);
        err = SL_ESTATE;
        goto out;
    }
    err = sl_cat_dataset_get(f->cat, &ds, j->dataset);
    if (err) {
        snprintf(msg, len, "catalog error: %s", sl_strerror(err));
        goto out;
    }
    if ((fs->lengths_sha256 && fs->lengths_sha256[0]) || j->spec->batching) {
        const char *now = ds.has_lengths ? ds.lengths_sha256 : "";
        if (strcmp(now, fs->lengths_sha256 ? fs->lengths_sha256 : "") != 0) {
            snprintf(msg, len,
                     "the lengths of dataset '%s' changed since the checkpoint (sha256 %.16s, "
                     "then %.16s)",
                     j->dataset, now[0] ? now : "none",
                     fs->lengths_sha256 && fs->lengths_sha256[0] ? fs->lengths_sha256 : "none");
            err = SL_ESTATE;
            goto out;
        }
    }
    if (!same_settings(spec, j->spec)) {
        snprintf(msg, len,
                 "feed job '%s' has other settings than when the checkpoint was taken (its "
                 "dataset, partition, shuffle, seed, drop_last or batching changed)",
                 j->name);
        err = SL_ESTATE;
        goto out;
    }
    resize = req->world && (req->world != spec->world_size ||
                            (feed_mesh_set(req->mesh) && !mesh_same(req->mesh, spec->mesh)));
    if (resize && (err = resize_possible(j, spec, fs, req->world, (Sluice__V1__Mesh *)req->mesh,
                                         msg, len)) != 0)
        goto out;
    err = sl_cat_job_restore(f->cat, j->name, req->spec->p, req->spec->len, spec->world_size,
                             fs->epoch, req->elastic->p, req->elastic->len, fs->positions,
                             (uint32_t)fs->n_positions, &j->version);
    if (err) {
        snprintf(msg, len, "catalog error: %s", sl_strerror(err));
        goto out;
    }
    err = feed_job_rewind(j, spec, fs->epoch, req->elastic->p, req->elastic->len, fs->positions,
                          (uint32_t)fs->n_positions, msg, len);
    spec = NULL; /* owned by the job now */
    if (err)
        goto out;
    /* A state at the end of its epoch begins the next one (as the last report would have),
     * before a resize: the new world then starts the next epoch whole. */
    feed_job_plan_ready(j);
    if (resize) {
        char why[256];
        err = feed_job_resize(j, req->world, req->mesh, NULL, 0, why, sizeof(why));
        if (err) {
            snprintf(msg, len,
                     "feed job '%s' was restored to epoch %" PRIu64 " in its world of %u, but "
                     "not resized: %s",
                     j->name, fs->epoch, fs->world_size, why);
            goto out;
        }
    }
    /* A batch job's share sizes, hence whether the restored state ends its epoch, are known
     * once its plan is built: build it now, so the epoch advances without waiting for a
     * stream to ask for it (the plan_ready hook). */
    if (j->spec->batching && !j->spec->manual_advance && !j->plan) {
        char why[256];
        if (feed_plan_request(j, why, sizeof(why)) != 0)
            sl_log_warn("job_restore_plan_failed", "job=%s error=\"%s\"", j->name, why);
    }
    *epoch_out = j->epoch;
    *world_out = j->spec->world_size;
out:
    if (fs)
        sluice__v1__feed_state__free_unpacked(fs, NULL);
    if (spec)
        sluice__v1__job__free_unpacked(spec, NULL);
    return err;
}
