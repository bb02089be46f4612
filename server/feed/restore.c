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

/* The feed state's format this build writes (FeedState.format): 1 records the labels. */
#define FEED_STATE_FORMAT 1

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
    /* The labels define the order of a stratified or class-balanced epoch as the lengths define
     * a batch plan: Restore compares them (feed_state_check). */
    fs.labels_sha256 = feed_spec_wants_labels(spec) && ds.has_labels ? ds.labels_sha256 : "";
    fs.format = FEED_STATE_FORMAT;
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

/* What a restore checks in its catalog transaction (sl_cat_restore.check). */
typedef struct rcheck {
    fjob *j; /* this replica's copy of the job */
    uint64_t version;
    const Sluice__V1__FeedState *fs;
    Sluice__V1__Job *spec; /* the checkpoint's */
    const sl_feed_restore_req *req;
    int resize;
    char *msg;
    size_t len;
} rcheck;

/* The dataset as the catalog has it now against the checkpoint's feed state: its sample count,
 * and the lengths and labels wherever they define the order (a batch plan; a stratified or
 * class-balanced epoch). `now` is the job's spec in the catalog. */
static int data_same(const rcheck *c, const sl_cat_job *row, const Sluice__V1__Job *now,
                     const sl_cat_dataset *ds)
{
    const Sluice__V1__FeedState *fs = c->fs;
    const char *then = fs->lengths_sha256 ? fs->lengths_sha256 : "", *cur;

    if (ds->samples != fs->samples) {
        snprintf(c->msg, c->len,
                 "dataset '%s' of feed job '%s' has %" PRIu64
                 " samples; the checkpoint was taken with %" PRIu64,
                 row->dataset, row->name, ds->samples, fs->samples);
        return SL_ESTATE;
    }
    cur = ds->has_lengths ? ds->lengths_sha256 : "";
    if ((then[0] || now->batching) && strcmp(cur, then) != 0) {
        snprintf(c->msg, c->len,
                 "the lengths of dataset '%s' changed since the checkpoint (sha256 %.16s, "
                 "then %.16s)",
                 row->dataset, cur[0] ? cur : "none", then[0] ? then : "none");
        return SL_ESTATE;
    }
    then = fs->labels_sha256 ? fs->labels_sha256 : "";
    cur = feed_spec_wants_labels(now) && ds->has_labels ? ds->labels_sha256 : "";
    if (fs->format == 0) {
        /* Taken before feed states recorded the labels: nothing to compare with. */
        if (cur[0])
            sl_log_warn("restore_labels_unchecked",
                        "job=%s dataset=%s reason=\"the checkpoint predates recorded labels\"",
                        row->name, row->dataset);
    } else if (strcmp(cur, then) != 0) {
        snprintf(c->msg, c->len,
                 "the labels of dataset '%s' changed since the checkpoint (sha256 %.16s, then "
                 "%.16s): the epoch's order would not be the one the positions count in",
                 row->dataset, cur[0] ? cur : "none", then[0] ? then : "none");
        return SL_ESTATE;
    }
    return 0;
}

/* sl_cat_restore.check: the job's and dataset's rows, read in the restore's transaction, never
 * this replica's copy, decide; the copy must be the row (the rewind updates it). */
static int feed_state_check(const sl_cat_job *row, const sl_cat_dataset *ds, void *arg)
{
    rcheck *c = arg;
    Sluice__V1__Job *now = sluice__v1__job__unpack(NULL, row->spec_len, row->spec);
    int err;

    if (!now) {
        snprintf(c->msg, c->len, "the spec of feed job '%s' is corrupt", row->name);
        return SL_ECORRUPT;
    }
    if ((err = data_same(c, row, now, ds)) != 0)
        goto out;
    if (!same_settings(c->spec, now)) {
        snprintf(c->msg, c->len,
                 "feed job '%s' has other settings than when the checkpoint was taken (its "
                 "dataset, partition, shuffle, seed, drop_last, batching or classes changed)",
                 row->name);
        err = SL_ESTATE;
        goto out;
    }
    if (row->version != c->version) {
        snprintf(c->msg, c->len, "feed job '%s' changed through another replica meanwhile",
                 row->name);
        err = SL_EUNAVAILABLE;
        goto out;
    }
    if (c->resize)
        err = resize_possible(c->j, c->spec, c->fs, c->req->world, (Sluice__V1__Mesh *)c->req->mesh,
                              c->msg, c->len);
out:
    sluice__v1__job__free_unpacked(now, NULL);
    return err;
}

/* The catalog's side of a restore: checked and written in one transaction, tried again once
 * if this replica's copy of the job was behind the catalog. */
static int restore_row(sl_feed *f, rcheck *c, fjob **j)
{
    const Sluice__V1__FeedState *fs = c->fs;
    sl_cat_restore r = {
        .name = fs->job,
        .spec = c->req->spec->p,
        .spec_len = c->req->spec->len,
        .world_size = c->spec->world_size,
        .epoch = fs->epoch,
        .elastic = c->req->elastic->p,
        .elastic_len = c->req->elastic->len,
        .positions = fs->positions,
        .n = (uint32_t)fs->n_positions,
        .check = feed_state_check,
        .arg = c,
    };
    uint64_t version = 0;
    int err = SL_EUNAVAILABLE;

    for (int tries = 0; tries < 2 && err == SL_EUNAVAILABLE; tries++) {
        if (!(*j = job_now(f, fs->job))) {
            snprintf(c->msg, c->len, "feed job '%s' not found", fs->job);
            return SL_ENOTFOUND;
        }
        c->j = *j;
        c->version = (*j)->version;
        c->msg[0] = 0;
        err = sl_cat_job_restore(f->cat, &r, &version);
    }
    if (err == SL_ENOTFOUND)
        snprintf(c->msg, c->len, "feed job '%s' not found", fs->job);
    else if (err && !c->msg[0])
        snprintf(c->msg, c->len, "catalog error: %s", sl_strerror(err));
    if (!err)
        (*j)->version = version;
    return err;
}

int sl_feed_restore(sl_feed *f, const sl_feed_restore_req *req, uint64_t *epoch_out,
                    uint32_t *world_out, char *msg, size_t len)
{
    Sluice__V1__FeedState *fs = NULL;
    Sluice__V1__Job *spec = NULL;
    rcheck c = {.req = req, .msg = msg, .len = len};
    fjob *j = NULL;
    int resize, err = 0;

    fs = sluice__v1__feed_state__unpack(NULL, req->state->len, req->state->p);
    if (fs)
        spec = sluice__v1__job__unpack(NULL, req->spec->len, req->spec->p);
    if (!fs || !spec || !fs->job) {
        snprintf(msg, len, "the checkpoint's feed state is corrupt");
        err = SL_ECORRUPT;
        goto out;
    }
    resize = req->world && (req->world != spec->world_size ||
                            (feed_mesh_set(req->mesh) && !mesh_same(req->mesh, spec->mesh)));
    c.fs = fs;
    c.spec = spec;
    c.resize = resize;
    if ((err = restore_row(f, &c, &j)) != 0)
        goto out;
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
