/* Resize of a job in memory: the new spec and world, a chain extended by one step (on the worker
 * pool when it chains: feed_job_resize_start), committed on the loop when the job is as it was;
 * and the reload of another replica's resize (feed_job_reload_start). */
#include "internal.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void resize_free(fresize *r)
{
    if (!r)
        return;
    if (r->nspec)
        sluice__v1__job__free_unpacked(r->nspec, NULL);
    if (r->first_spec)
        sluice__v1__job__free_unpacked(r->first_spec, NULL);
    if (r->labels)
        flabels_unref(r->f, r->labels);
    free(r->spec_buf);
    free(r->progress);
    free(r->old_blob);
    free(r->cons);
    free(r->w);
    feed_chain_free(r->chain);
    sl_sample_elastic_free(r->plan);
    free(r->blob);
    free(r);
}

/* A copy of a spec (packed and unpacked again), or NULL (out of memory). */
static Sluice__V1__Job *spec_copy(const Sluice__V1__Job *spec, uint8_t **packed, size_t *len)
{
    size_t l = sluice__v1__job__get_packed_size(spec);
    uint8_t *b = malloc(l ? l : 1);
    Sluice__V1__Job *out = NULL;

    if (b) {
        sluice__v1__job__pack(spec, b);
        out = sluice__v1__job__unpack(NULL, l, b);
    }
    if (packed && out) {
        *packed = b;
        *len = l;
    } else {
        free(b);
    }
    return out;
}

/* The new spec (the old one with the new world, mesh and weights) and its config. */
static int resize_spec(fresize *r, fjob *j, uint32_t world, const Sluice__V1__Mesh *mesh,
                       const double *weights, size_t nw, char *msg, size_t len)
{
    Sluice__V1__Mesh *saved_mesh = j->spec->mesh;
    uint32_t saved_world = j->spec->world_size, dpi;
    size_t saved_nw = j->spec->n_rank_weights;
    double *saved_w = j->spec->rank_weights;
    int err;

    if (feed_mesh_set(j->spec->mesh) && !feed_mesh_set(mesh)) {
        snprintf(msg, len, "job '%s' has a mesh: give the new mesh (its product = world_size)",
                 j->name);
        return SL_EINVAL;
    }
    if (nw > FEED_MAX_WORLD) {
        snprintf(msg, len, "%zu rank weights: at most %u", nw, FEED_MAX_WORLD);
        return SL_EINVAL;
    }
    /* Build the new spec by packing the old one with the new world, mesh and weights. Without
     * new weights the job's are kept while the dp world keeps its size; another size makes the
     * shares even. A wrong count of new weights is refused by the config check below. */
    j->spec->world_size = world;
    j->spec->mesh = feed_mesh_set(mesh) ? (Sluice__V1__Mesh *)mesh : NULL;
    if (nw) {
        j->spec->rank_weights = (double *)weights;
        j->spec->n_rank_weights = nw;
    } else if (saved_nw && saved_nw != (feed_mesh_set(mesh) ? mesh->dp : world)) {
        j->spec->n_rank_weights = 0;
    }
    r->nspec = spec_copy(j->spec, &r->spec_buf, &r->spec_len);
    j->spec->world_size = saved_world;
    j->spec->mesh = saved_mesh;
    j->spec->rank_weights = saved_w;
    j->spec->n_rank_weights = saved_nw;
    if (!r->nspec)
        return -ENOMEM;
    r->world = world;
    err =
        feed_spec_config(&r->ncfg, r->nspec, flabels_of(j->labels), j->samples, j->epoch, msg, len);
    if (err)
        return err;
    r->ncfg.rank = 0;
    return sl_sample_dp_rank(&dpi, &r->ndp, &r->ncfg, msg, len);
}

/* What the chain is built from: the job's blob (copied: the job may drop it meanwhile), what
 * each rank consumed, the new weights; cheap, O(dp world + blob). */
static int resize_snapshot(fresize *r, fjob *j)
{
    int any = 0;

    for (uint32_t d = 0; d < j->dp_size; d++)
        any |= j->progress[d] > 0;
    r->gen = j->gen;
    r->version = j->version;
    r->dp_size = j->dp_size;
    r->chained = j->chain || any;
    if (!(r->progress = malloc(8 * (size_t)j->dp_size)))
        return -ENOMEM;
    memcpy(r->progress, j->progress, 8 * (size_t)j->dp_size);
    if (!r->chained)
        return 0;
    r->labels = flabels_ref(j->labels);
    r->samples = j->samples;
    r->epoch = j->epoch;
    r->batching = j->spec->batching != NULL;
    if (j->chain) {
        if (!(r->old_blob = malloc(j->elastic_len)))
            return -ENOMEM;
        memcpy(r->old_blob, j->elastic_blob, j->elastic_len);
        r->old_len = j->elastic_len;
    } else if (!(r->first_spec = spec_copy(j->spec, NULL, NULL))) {
        return -ENOMEM; /* the first resize of the epoch: the chain starts from the job's spec */
    }
    if (any || !j->chain) {
        /* Ranks progressed on the current shares: one more step, redistributing what each of
         * them has not consumed. */
        if (!(r->cons = malloc(8 * (size_t)j->dp_size)))
            return -ENOMEM;
        for (uint32_t d = 0; d < j->dp_size; d++) {
            uint64_t n;
            /* A batch job's count needs its plan; without it the position stands (the report
             * check bounded it) and is clipped when the shares are built. */
            if (feed_job_count(j, d, &n) != 0)
                n = UINT64_MAX;
            r->cons[d] = j->progress[d] < n ? j->progress[d] : n;
        }
    }
    if (r->nspec->n_rank_weights == r->ndp) {
        if (!(r->w = malloc(8 * (size_t)r->ndp)))
            return -ENOMEM;
        memcpy(r->w, r->nspec->rank_weights, 8 * (size_t)r->ndp);
    }
    return 0;
}

/* The chain with the resize's step, its index plan and its blob, from the snapshot alone: runs
 * on the worker pool (O(resizes x ranks), the reason it leaves the loop). */
static int resize_build(fresize *r, char *msg, size_t len)
{
    const sl_sample_labels *labels = flabels_of(r->labels);
    fchain *c = NULL;
    sl_sample_resize *last;
    int err = -ENOMEM;

    msg[0] = '\0';
    if (r->old_blob) {
        if (feed_chain_decode(r->old_blob, r->old_len, r->dp_size, &c) != 0)
            goto out;
    } else if ((c = calloc(1, sizeof(*c))) != NULL) {
        c->spec = r->first_spec;
        r->first_spec = NULL;
    }
    if (!c)
        goto out;
    if (r->cons) {
        uint64_t total = r->dp_size;
        for (uint32_t k = 0; k < c->n; k++)
            total += c->steps[k].n_consumed;
        if (total > ELASTIC_COUNTS_MAX) {
            snprintf(msg, len,
                     "job '%s' was resized %u times in this epoch: at most %llu ranks' "
                     "positions in all (resize at the epoch boundary)",
                     r->name, c->n, (unsigned long long)ELASTIC_COUNTS_MAX);
            err = SL_ELIMIT;
            goto out;
        }
        if (feed_chain_grow(c) != 0)
            goto out;
        c->steps[c->n].consumed = r->cons;
        c->steps[c->n].n_consumed = r->dp_size;
        c->n++;
        r->cons = NULL;
    }
    /* Nobody progressed since the last resize: re-plan its step for the new world, with equal
     * counts whatever rule it was recorded with. */
    last = &c->steps[c->n - 1];
    last->new_replicas = r->ndp;
    last->uneven = false;
    free((void *)last->weights);
    last->weights = r->w;
    last->n_weights = r->w ? r->ndp : 0;
    r->w = NULL;
    err = feed_chain_config(labels, r->samples, r->epoch, c, &(sl_sample_config){0}, msg, len);
    if (!err && r->batching && feed_chain_mixes_modes(c)) {
        snprintf(msg, len,
                 "job '%s' was resized in this epoch without rank weights: its ranks hold "
                 "the plan's batches as they were sized, so new rank weights apply from the "
                 "next epoch (resize without them now, or at the epoch boundary)",
                 r->name);
        err = SL_ESTATE;
    }
    /* The index plan is built now, so that a refused chain leaves the job as it was, and the
     * commit only installs it. */
    if (!err && !r->batching)
        err = feed_chain_index_plan(labels, r->samples, r->epoch, c, &r->plan, msg, len);
    if (!err)
        err = feed_chain_encode(&r->blob, &r->blob_len, c);
out:
    if (err == -ENOMEM && !msg[0])
        snprintf(msg, len, "out of memory");
    if (err)
        feed_chain_free(c);
    else
        r->chain = c;
    return err;
}

/* Write the resize to the catalog and make it the job's state (the loop). */
static int resize_commit(fjob *j, fresize *r, char *msg, size_t len)
{
    int err = sl_cat_job_resize(j->feed->cat, j->name, r->spec_buf, r->spec_len, r->world, r->blob,
                                r->blob_len, &j->version);

    if (err) {
        snprintf(msg, len, "catalog write failed: %s", sl_strerror(err));
        return err;
    }
    /* Committed: the old world's streams of this epoch are void. */
    j->feed->hooks.streams_end(j, 0, SL_RPC_ABORTED, "job resized; reopen the stream");
    feed_job_drop_epoch(j);
    j->gen++;
    sluice__v1__job__free_unpacked(j->spec, NULL);
    j->spec = r->nspec;
    r->nspec = NULL;
    j->cfg = r->ncfg;
    feed_job_setup_counts(j, msg, len);
    if (r->chain) {
        err = feed_job_elastic_install(j, r->chain, r->blob, r->blob_len, r->plan, msg, len);
        r->chain = NULL;
        r->plan = NULL;
        if (err)
            return err;
        feed_job_setup_elastic_counts(j, msg, len);
        if (j->spec->batching) {
            /* The rest of the epoch's batches come from the plan of its first world. */
            char why[256];
            if (feed_plan_request(j, why, sizeof(why)) != 0)
                sl_log_warn("job_resize_plan_failed", "job=%s error=\"%s\"", j->name, why);
        }
    }
    sl_log_info("job_resized", "job=%s epoch=%llu world=%u dp=%u elastic=%d resizes=%u", j->name,
                (unsigned long long)j->epoch, r->world, j->dp_size, j->chain != NULL,
                j->chain ? j->chain->n : 0);
    return 0;
}

/* The new spec and the snapshot of a resize of j. */
static int resize_prepare(fresize **out, fjob *j, uint32_t world, const Sluice__V1__Mesh *mesh,
                          const double *weights, size_t nw, char *msg, size_t len)
{
    fresize *r = calloc(1, sizeof(*r));
    int err;

    *out = NULL;
    if (!r)
        return -ENOMEM;
    r->f = j->feed;
    snprintf(r->name, sizeof(r->name), "%s", j->name);
    err = resize_spec(r, j, world, mesh, weights, nw, msg, len);
    if (!err)
        err = resize_snapshot(r, j);
    if (err) {
        resize_free(r);
        return err;
    }
    *out = r;
    return 0;
}

int feed_job_resize(fjob *j, uint32_t world, const Sluice__V1__Mesh *mesh, const double *weights,
                    size_t nw, char *msg, size_t len)
{
    fresize *r = NULL;
    int err = resize_prepare(&r, j, world, mesh, weights, nw, msg, len);

    if (!err && r->chained)
        err = resize_build(r, msg, len);
    if (!err)
        err = resize_commit(j, r, msg, len);
    resize_free(r);
    return err;
}

static void resize_done(uv_work_t *w, int status);

/* A reload's products: the chain and index plan of the row's elastic state (worker pool). */
static int reload_build(fresize *r, char *msg, size_t len)
{
    Sluice__V1__Job *spec = sluice__v1__job__unpack(NULL, r->spec_len, r->spec_buf);
    const sl_sample_labels *labels = flabels_of(r->labels);
    sl_sample_config cfg;
    uint32_t dp, dp_size;
    int err = spec ? 0 : SL_ECORRUPT;

    if (!err)
        err = feed_spec_config(&cfg, spec, labels, r->samples, r->epoch, msg, len);
    if (!err) {
        cfg.rank = 0;
        err = sl_sample_dp_rank(&dp, &dp_size, &cfg, msg, len);
    }
    if (!err && (err = feed_chain_decode(r->old_blob, r->old_len, dp_size, &r->chain)) != 0)
        snprintf(msg, len, "elastic state of job '%s' is corrupt", r->name);
    if (!err)
        err = feed_chain_index_plan(labels, r->samples, r->epoch, r->chain, &r->plan, msg, len);
    if (spec)
        sluice__v1__job__free_unpacked(spec, NULL);
    return err;
}

static void resize_work(uv_work_t *w)
{
    fresize *r = w->data;

    r->err =
        r->load ? reload_build(r, r->msg, sizeof(r->msg)) : resize_build(r, r->msg, sizeof(r->msg));
}

/* A reload's products are ready: the job is refreshed, and its load takes them
 * (feed_job_elastic_load). A job changed again meanwhile loads as it is now (built again off the
 * loop if it must be). */
static void reload_done(fresize *r, int status)
{
    sl_feed *f = r->f;

    if (r->job)
        r->job->resizing = NULL;
    if (status != 0 || r->err) {
        sl_log_warn("job_reload_build_failed", "job=%s error=\"%s\"", r->name,
                    status != 0 ? "cancelled" : r->msg);
        sl_sample_elastic_free(r->plan);
        r->plan = NULL;
        feed_chain_free(r->chain);
        r->chain = NULL; /* the load then fails, or succeeds, on the loop as before */
    }
    if (r->job && !f->shutting_down) {
        f->prebuilt = r;
        r->refresh(f, r->name);
        f->prebuilt = NULL;
    }
    feed_waiters_run(&r->waiters, f, r->name);
    resize_free(r);
}

int feed_job_reload_start(fjob *j, const sl_cat_job *row, void (*refresh)(sl_feed *, const char *))
{
    sl_feed *f = j->feed;
    Sluice__V1__Job *spec;
    sl_cat_dataset d;
    fresize *r = NULL;
    int ok;

    if (!row->elastic_len || j->resizing || f->shutting_down)
        return 0;
    if (f->prebuilt && strcmp(f->prebuilt->name, j->name) == 0 &&
        f->prebuilt->old_len == row->elastic_len &&
        memcmp(f->prebuilt->old_blob, row->elastic, row->elastic_len) == 0)
        return 0; /* built: the load takes it */
    if (!(spec = sluice__v1__job__unpack(NULL, row->spec_len, row->spec)))
        return 0;
    /* A batch job builds no plan when loaded; a job whose labels would be read again loads as
     * before. */
    ok = !spec->batching && (!feed_spec_wants_labels(spec) || flabels_of(j->labels));
    sluice__v1__job__free_unpacked(spec, NULL);
    if (!ok || sl_cat_dataset_get(f->cat, &d, row->dataset) != 0 || !(r = calloc(1, sizeof(*r))))
        return 0;
    r->f = f;
    r->job = j;
    r->load = 1;
    r->refresh = refresh;
    snprintf(r->name, sizeof(r->name), "%s", j->name);
    r->samples = d.samples;
    r->epoch = row->epoch;
    r->labels = flabels_ref(j->labels);
    r->spec_buf = malloc(row->spec_len ? row->spec_len : 1);
    r->old_blob = malloc(row->elastic_len);
    r->spec_len = row->spec_len;
    r->old_len = row->elastic_len;
    r->work.work.data = r;
    if (!r->spec_buf || !r->old_blob) {
        resize_free(r);
        return 0;
    }
    memcpy(r->spec_buf, row->spec, row->spec_len);
    memcpy(r->old_blob, row->elastic, row->elastic_len);
    if (sl_cat_queue_work(f->cat, f->loop, &r->work, resize_work, resize_done) != 0) {
        resize_free(r);
        return 0;
    }
    j->resizing = r;
    sl_log_info("job_reload_building", "job=%s epoch=%llu version=%llu", j->name,
                (unsigned long long)row->epoch, (unsigned long long)row->version);
    return FEED_PENDING;
}

/* Whether the job changed since the snapshot: its chain would not be what it has consumed. */
static int resize_stale(const fjob *j, const fresize *r)
{
    return !j || j->gen != r->gen || j->version != r->version || j->dp_size != r->dp_size ||
           memcmp(j->progress, r->progress, 8 * (size_t)r->dp_size) != 0;
}

static void resize_done(uv_work_t *w, int status)
{
    fresize *r = w->data;
    fjob *j = r->job;
    int err = r->err;

    if (r->load) {
        reload_done(r, status);
        return;
    }
    if (j)
        j->resizing = NULL;
    if (status != 0) {
        err = SL_ECANCELLED;
        snprintf(r->msg, sizeof(r->msg), "cancelled");
    } else if (resize_stale(j, r)) {
        err = FEED_RETRY;
    } else if (!err) {
        err = resize_commit(j, r, r->msg, sizeof(r->msg));
    }
    r->cb(r->call, r->f, r->name, err, r->msg);
    sl_rpc_call_unref(r->call);
    feed_waiters_run(&r->waiters, r->f, r->name);
    resize_free(r);
}

int feed_job_resize_start(fjob *j, uint32_t world, const Sluice__V1__Mesh *mesh,
                          const double *weights, size_t nw, sl_rpc_call *call, feed_resize_cb cb,
                          char *msg, size_t len)
{
    fresize *r = NULL;
    int err = resize_prepare(&r, j, world, mesh, weights, nw, msg, len);

    if (!err && !r->chained)
        err = resize_commit(j, r, msg, len); /* nothing to chain: a plain change, at once */
    if (err || !r->chained) {
        resize_free(r);
        return err;
    }
    r->job = j;
    r->call = call;
    r->cb = cb;
    r->work.work.data = r;
    if (sl_cat_queue_work(j->feed->cat, j->feed->loop, &r->work, resize_work, resize_done) != 0) {
        resize_free(r);
        snprintf(msg, len, "cannot queue work");
        return SL_EUNAVAILABLE;
    }
    sl_rpc_call_ref(call);
    j->resizing = r;
    return FEED_PENDING;
}

int feed_job_resize_park(fjob *j, sl_rpc_call *call, feed_ready_cb cb)
{
    return feed_waiters_add(&j->resizing->waiters, call, cb);
}
