/* Jobs in memory: each epoch's share sizes, progress, epoch advance, resize, elastic state. */
#include "internal.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

fjob *feed_job_find(sl_feed *f, const char *name)
{
    for (fjob *j = f->jobs; j; j = j->next)
        if (strcmp(j->name, name) == 0)
            return j;
    return NULL;
}

void fsrc_unref(fsrc *s)
{
    if (s && --s->refs == 0) {
        sl_sample_elastic_free(s->plan);
        free(s);
    }
}

/* Elastic blob: "SLE1", u32 spec length, the old spec, u32 n, n x u64 consumed (little-endian
 * host order: the catalog never leaves the machine that wrote it). */
#define ELASTIC_MAGIC 0x31454c53u

static int elastic_decode(const uint8_t *b, size_t len, Sluice__V1__Job **old_spec,
                          uint64_t **consumed, uint32_t *n)
{
    uint32_t magic, spec_len;

    *old_spec = NULL;
    *consumed = NULL;
    if (len < 12)
        return SL_ECORRUPT;
    memcpy(&magic, b, 4);
    memcpy(&spec_len, b + 4, 4);
    if (magic != ELASTIC_MAGIC || spec_len > len - 12)
        return SL_ECORRUPT;
    memcpy(n, b + 8 + spec_len, 4);
    if (*n == 0 || *n > FEED_MAX_WORLD || len != 12 + (size_t)spec_len + 8 * (size_t)*n)
        return SL_ECORRUPT;
    *old_spec = sluice__v1__job__unpack(NULL, spec_len, b + 8);
    *consumed = malloc(8 * (size_t)*n);
    if (!*old_spec || !*consumed) {
        if (*old_spec)
            sluice__v1__job__free_unpacked(*old_spec, NULL);
        free(*consumed);
        *old_spec = NULL;
        *consumed = NULL;
        return SL_ECORRUPT;
    }
    memcpy(*consumed, b + 12 + spec_len, 8 * (size_t)*n);
    return 0;
}

static int elastic_encode(uint8_t **out, size_t *out_len, const Sluice__V1__Job *old_spec,
                          const uint64_t *consumed, uint32_t n)
{
    size_t spec_len = sluice__v1__job__get_packed_size(old_spec);
    size_t len = 12 + spec_len + 8 * (size_t)n;
    uint8_t *b = malloc(len);
    uint32_t magic = ELASTIC_MAGIC, sl = (uint32_t)spec_len;

    if (!b)
        return -ENOMEM;
    memcpy(b, &magic, 4);
    memcpy(b + 4, &sl, 4);
    sluice__v1__job__pack(old_spec, b + 8);
    memcpy(b + 8 + spec_len, &n, 4);
    memcpy(b + 12 + spec_len, consumed, 8 * (size_t)n);
    *out = b;
    *out_len = len;
    return 0;
}

/* Build the elastic source of the current epoch from a blob. */
static int elastic_load(fjob *j, const uint8_t *blob, size_t blob_len, char *msg, size_t len)
{
    Sluice__V1__Job *old = NULL;
    uint64_t *consumed = NULL;
    sl_sample_config ocfg;
    uint32_t n;
    int err = elastic_decode(blob, blob_len, &old, &consumed, &n);

    if (err) {
        snprintf(msg, len, "elastic state of job '%s' is corrupt", j->name);
        return err;
    }
    err = feed_spec_config(&ocfg, old, j->samples, j->epoch, msg, len);
    if (!err) {
        j->src = calloc(1, sizeof(*j->src));
        if (!j->src)
            err = -ENOMEM;
    }
    if (!err) {
        j->src->refs = 1;
        err = sl_sample_elastic_new(&j->src->plan, &ocfg, consumed, n, j->dp_size, msg, len);
        if (err) {
            free(j->src);
            j->src = NULL;
        }
    }
    if (!err) {
        j->elastic_blob = malloc(blob_len);
        if (j->elastic_blob) {
            memcpy(j->elastic_blob, blob, blob_len);
            j->elastic_len = blob_len;
        }
    }
    sluice__v1__job__free_unpacked(old, NULL);
    free(consumed);
    return err;
}

static void drop_epoch_state(fjob *j)
{
    if (j->shares) {
        for (uint32_t d = 0; d < j->dp_size; d++)
            fshare_unref(j->shares[d]);
        free(j->shares);
        j->shares = NULL;
    }
    fsrc_unref(j->src);
    j->src = NULL;
    free(j->elastic_blob);
    j->elastic_blob = NULL;
    j->elastic_len = 0;
    if (j->plan) {
        j->plan->job = NULL;
        fplan_unref(j->plan);
        j->plan = NULL;
    }
}

/* Compute dp_size, counts and zeroed progress for j->cfg (and j->src when elastic). */
static int setup_counts(fjob *j, char *msg, size_t len)
{
    sl_sample_config c = j->cfg;
    uint32_t dp, dp_size;
    int err = sl_sample_dp_rank(&dp, &dp_size, &c, msg, len);

    if (err)
        return err;
    free(j->counts);
    free(j->progress);
    free(j->reported);
    j->dp_size = dp_size;
    j->counts = calloc(dp_size, sizeof(*j->counts));
    j->progress = calloc(dp_size, sizeof(*j->progress));
    j->reported = calloc(dp_size, sizeof(*j->reported));
    if (!j->counts || !j->progress || !j->reported)
        return -ENOMEM;
    if (j->src)
        return 0; /* filled by setup_elastic_counts once the plan exists */
    for (uint32_t r = 0; r < c.replicas; r++) {
        uint64_t n;
        c.rank = r;
        if ((err = sl_sample_dp_rank(&dp, &dp_size, &c, msg, len)) != 0 ||
            (err = sl_sample_share_count(&n, &c, msg, len)) != 0)
            return err;
        j->counts[dp] = n;
    }
    return 0;
}

static int setup_elastic_counts(fjob *j, char *msg, size_t len)
{
    for (uint32_t d = 0; d < j->dp_size; d++) {
        sl_sample *s = NULL;
        int err = sl_sample_new_elastic(&s, j->src->plan, d, msg, len);
        if (err)
            return err;
        j->counts[d] = sl_sample_count(s);
        sl_sample_free(s);
    }
    return 0;
}

static void job_free(fjob *j)
{
    if (!j)
        return;
    drop_epoch_state(j);
    if (j->spec)
        sluice__v1__job__free_unpacked(j->spec, NULL);
    free(j->counts);
    free(j->progress);
    free(j->reported);
    free(j);
}

static int load_progress(uint32_t dp, uint64_t epoch, uint64_t position, void *arg)
{
    fjob *j = arg;

    if (epoch == j->epoch && dp < j->dp_size) {
        j->reported[dp] = 1;
        if (position > j->progress[dp])
            j->progress[dp] = position;
    }
    return 0;
}

int feed_job_add(sl_feed *f, fjob **out, const char *name, const char *dataset,
                 Sluice__V1__Job *spec, uint64_t samples, uint64_t epoch, int64_t created_ms,
                 const void *elastic, size_t elastic_len, char *msg, size_t len)
{
    fjob *j = calloc(1, sizeof(*j));
    int err;

    if (!j) {
        sluice__v1__job__free_unpacked(spec, NULL);
        return -ENOMEM;
    }
    j->feed = f;
    snprintf(j->name, sizeof(j->name), "%s", name);
    snprintf(j->dataset, sizeof(j->dataset), "%s", dataset);
    j->spec = spec;
    j->samples = samples;
    j->epoch = epoch;
    j->created_ms = created_ms;
    err = feed_spec_config(&j->cfg, spec, samples, epoch, msg, len);
    if (!err)
        err = setup_counts(j, msg, len);
    if (!err && elastic && elastic_len) {
        err = elastic_load(j, elastic, elastic_len, msg, len);
        if (!err)
            err = setup_elastic_counts(j, msg, len);
    }
    if (!err)
        err = sl_cat_progress_list(f->cat, j->name, load_progress, j);
    if (err) {
        job_free(j);
        return err;
    }
    j->next = f->jobs;
    f->jobs = j;
    *out = j;
    return 0;
}

void feed_job_remove(sl_feed *f, fjob *j, sl_rpc_code code, const char *why)
{
    fjob **pp = &f->jobs;

    f->hooks.streams_end(j, 1, code, why);
    while (*pp && *pp != j)
        pp = &(*pp)->next;
    if (*pp)
        *pp = j->next;
    job_free(j);
}

void feed_job_describe(const fjob *j, Sluice__V1__Job *out, Sluice__V1__Mesh *mesh,
                       Sluice__V1__BatchConfig *bc)
{
    const Sluice__V1__Job *s = j->spec;

    sluice__v1__job__init(out);
    out->name = (char *)j->name;
    out->dataset = (char *)j->dataset;
    out->world_size = s->world_size;
    if (feed_mesh_set(s->mesh)) {
        sluice__v1__mesh__init(mesh);
        mesh->dp = s->mesh->dp;
        mesh->tp = s->mesh->tp;
        mesh->cp = s->mesh->cp;
        mesh->pp = s->mesh->pp;
        mesh->order = s->mesh->order ? s->mesh->order : (char *)"";
        out->mesh = mesh;
    }
    out->partition = (char *)sl_sample_partition_name(j->cfg.partition);
    out->chunk_size = j->cfg.partition == SL_SAMPLE_CHUNKED ? j->cfg.chunk_size : 0;
    out->shuffle = (char *)sl_sample_shuffle_name(j->cfg.shuffle);
    out->seed = s->seed;
    out->drop_last = s->drop_last;
    out->manual_advance = s->manual_advance;
    if (s->batching) {
        *bc = *s->batching;
        out->batching = bc;
    }
    out->epoch = j->epoch;
    out->created_ms = (uint64_t)j->created_ms;
    out->dp_size = j->dp_size;
    out->resized_in_epoch = j->src != NULL;
    out->n_rank_weights = s->n_rank_weights;
    out->rank_weights = s->rank_weights;
}

int feed_job_dp_rank(const fjob *j, uint32_t rank, uint32_t *dp, char *msg, size_t len)
{
    sl_sample_config c = j->cfg;
    uint32_t dp_size;

    if (rank >= c.replicas) {
        snprintf(msg, len, "rank %u out of range [0, %u) of job '%s'", rank, c.replicas, j->name);
        return SL_EINVAL;
    }
    c.rank = rank;
    return sl_sample_dp_rank(dp, &dp_size, &c, msg, len);
}

int feed_job_count(const fjob *j, uint32_t dp, uint64_t *count)
{
    if (j->spec->batching) {
        if (!j->plan || j->plan->state != 1)
            return SL_ESTATE;
        *count = sl_batch_plan_batches_per_rank(j->plan->plan);
        return 0;
    }
    *count = j->counts[dp];
    return 0;
}

int feed_job_complete(const fjob *j)
{
    for (uint32_t d = 0; d < j->dp_size; d++) {
        uint64_t n;
        if (feed_job_count(j, d, &n) != 0 || j->progress[d] < n || !j->reported[d])
            return 0;
    }
    return 1;
}

int feed_job_report_new(const fjob *j, uint32_t dp, uint64_t position)
{
    return position > j->progress[dp] || !j->reported[dp];
}

uint64_t feed_job_group_position(const fjob *j)
{
    uint64_t low = UINT64_MAX;

    for (uint32_t d = 0; d < j->dp_size; d++)
        if (j->progress[d] < low)
            low = j->progress[d];
    return j->dp_size ? low : 0;
}

int feed_job_advance(fjob *j)
{
    char msg[256];
    uint64_t next = j->epoch + 1;
    int err;

    if (next > SL_SAMPLE_EPOCH_MAX || next > UINT64_MAX - j->cfg.seed) {
        sl_log_warn("epoch_limit", "job=%s epoch=%llu", j->name, (unsigned long long)j->epoch);
        return SL_ELIMIT;
    }
    err = sl_cat_job_set_epoch(j->feed->cat, j->name, next);
    if (err)
        return err;
    drop_epoch_state(j);
    j->gen++;
    j->epoch = next;
    j->cfg.epoch = next;
    err = setup_counts(j, msg, sizeof(msg));
    if (err) {
        sl_log_error("epoch_setup_failed", "job=%s epoch=%llu error=\"%s\"", j->name,
                     (unsigned long long)next, msg);
        return err;
    }
    sl_log_info("epoch_began", "job=%s epoch=%llu", j->name, (unsigned long long)next);
    j->feed->hooks.epoch_began(j);
    return 0;
}

void feed_job_plan_ready(fjob *j)
{
    if (!j->spec->manual_advance && feed_job_complete(j))
        feed_job_advance(j);
}

int feed_job_report_check(const fjob *j, uint32_t dp, uint64_t epoch, uint64_t position, char *msg,
                          size_t len)
{
    uint64_t count;

    if (epoch != j->epoch) {
        snprintf(msg, len, "epoch %llu is not the current epoch %llu of job '%s'",
                 (unsigned long long)epoch, (unsigned long long)j->epoch, j->name);
        return SL_ESTATE;
    }
    /* A batch job's count is known once its plan is ready; before that (right after a daemon
     * restart) the report is bounded by the sample count and completion waits for the plan. */
    if (feed_job_count(j, dp, &count) != 0)
        count = j->samples; /* no rank gets more batches than there are samples */
    if (position > count) {
        snprintf(msg, len, "position %llu past the end of dp rank %u's share (%llu)",
                 (unsigned long long)position, dp, (unsigned long long)count);
        return SL_EINVAL;
    }
    return 0;
}

int feed_job_report_apply(fjob *j, uint32_t dp, uint64_t position, int *advanced)
{
    int err;

    *advanced = 0;
    j->reported[dp] = 1;
    if (position > j->progress[dp])
        j->progress[dp] = position;
    if (!j->spec->manual_advance && feed_job_complete(j)) {
        err = feed_job_advance(j);
        if (err)
            return err;
        *advanced = 1;
    }
    return 0;
}

int feed_job_resize(fjob *j, uint32_t world, const Sluice__V1__Mesh *mesh, char *msg, size_t len)
{
    Sluice__V1__Job *nspec = NULL, *old_spec = NULL;
    Sluice__V1__Mesh *saved_mesh = j->spec->mesh;
    uint32_t saved_world = j->spec->world_size;
    size_t saved_nw = j->spec->n_rank_weights;
    uint8_t *spec_buf = NULL, *blob = NULL;
    uint64_t *consumed = NULL;
    size_t spec_len, blob_len = 0;
    sl_sample_config ncfg, ocfg;
    sl_sample_elastic *plan = NULL;
    uint32_t n_old = 0, ndp, dpi;
    int any = 0, err;

    for (uint32_t d = 0; d < j->dp_size; d++)
        any |= j->progress[d] > 0;
    if (feed_mesh_set(j->spec->mesh) && !feed_mesh_set(mesh)) {
        snprintf(msg, len, "job '%s' has a mesh: give the new mesh (its product = world_size)",
                 j->name);
        return SL_EINVAL;
    }
    /* Build the new spec by packing the old one with the new world and mesh. Rank weights are
     * kept while the dp world keeps its size; another size makes the shares even (Resize
     * carries no weights). */
    j->spec->world_size = world;
    j->spec->mesh = feed_mesh_set(mesh) ? (Sluice__V1__Mesh *)mesh : NULL;
    if (saved_nw && saved_nw != (feed_mesh_set(mesh) ? mesh->dp : world))
        j->spec->n_rank_weights = 0;
    spec_len = sluice__v1__job__get_packed_size(j->spec);
    spec_buf = malloc(spec_len ? spec_len : 1);
    if (spec_buf)
        sluice__v1__job__pack(j->spec, spec_buf);
    j->spec->world_size = saved_world;
    j->spec->mesh = saved_mesh;
    j->spec->n_rank_weights = saved_nw;
    if (!spec_buf)
        return -ENOMEM;
    nspec = sluice__v1__job__unpack(NULL, spec_len, spec_buf);
    if (!nspec) {
        err = -ENOMEM;
        goto out;
    }
    err = feed_spec_config(&ncfg, nspec, j->samples, j->epoch, msg, len);
    if (err)
        goto out;
    ncfg.rank = 0;
    if ((err = sl_sample_dp_rank(&dpi, &ndp, &ncfg, msg, len)) != 0)
        goto out;
    if (j->src && any) {
        snprintf(msg, len,
                 "job '%s' was already resized in epoch %llu and ranks have progressed since; "
                 "resize again when the next epoch begins",
                 j->name, (unsigned long long)j->epoch);
        err = SL_ESTATE;
        goto out;
    }
    if (j->spec->batching && (any || j->src)) {
        snprintf(msg, len,
                 "job '%s' streams batches: it can be resized only before any rank "
                 "reported progress in an epoch",
                 j->name);
        err = SL_ESTATE;
        goto out;
    }
    if (j->src) {
        /* Resized again before anyone progressed: re-plan from the epoch's original world. */
        err = elastic_decode(j->elastic_blob, j->elastic_len, &old_spec, &consumed, &n_old);
        if (err)
            goto out;
    } else if (any) {
        n_old = j->dp_size;
        consumed = malloc(8 * (size_t)n_old);
        if (!consumed) {
            err = -ENOMEM;
            goto out;
        }
        for (uint32_t d = 0; d < n_old; d++)
            consumed[d] = j->progress[d] < j->counts[d] ? j->progress[d] : j->counts[d];
    }
    if (consumed) {
        err =
            feed_spec_config(&ocfg, old_spec ? old_spec : j->spec, j->samples, j->epoch, msg, len);
        if (!err)
            err = sl_sample_elastic_new(&plan, &ocfg, consumed, n_old, ndp, msg, len);
        if (!err)
            err = elastic_encode(&blob, &blob_len, old_spec ? old_spec : j->spec, consumed, n_old);
        if (err)
            goto out;
    }
    err = sl_cat_job_resize(j->feed->cat, j->name, spec_buf, spec_len, world, blob, blob_len);
    if (err) {
        snprintf(msg, len, "catalog write failed: %s", sl_strerror(err));
        goto out;
    }
    /* Committed: the old world's streams of this epoch are void. */
    j->feed->hooks.streams_end(j, 0, SL_RPC_ABORTED, "job resized; reopen the stream");
    drop_epoch_state(j);
    j->gen++;
    sluice__v1__job__free_unpacked(j->spec, NULL);
    j->spec = nspec;
    nspec = NULL;
    j->cfg = ncfg;
    setup_counts(j, msg, len);
    if (plan) {
        j->src = calloc(1, sizeof(*j->src));
        if (!j->src) {
            err = -ENOMEM;
            goto out;
        }
        j->src->refs = 1;
        j->src->plan = plan;
        plan = NULL;
        j->elastic_blob = blob;
        j->elastic_len = blob_len;
        blob = NULL;
        setup_elastic_counts(j, msg, len);
    }
    sl_log_info("job_resized", "job=%s epoch=%llu world=%u dp=%u elastic=%d", j->name,
                (unsigned long long)j->epoch, world, j->dp_size, j->src != NULL);
out:
    if (nspec)
        sluice__v1__job__free_unpacked(nspec, NULL);
    if (old_spec)
        sluice__v1__job__free_unpacked(old_spec, NULL);
    sl_sample_elastic_free(plan);
    free(consumed);
    free(spec_buf);
    free(blob);
    return err;
}

int feed_job_rewind(fjob *j, Sluice__V1__Job *spec, uint64_t epoch, const void *elastic,
                    size_t elastic_len, const uint64_t *positions, uint32_t n, char *msg,
                    size_t len)
{
    sl_sample_config cfg;
    int err = feed_spec_config(&cfg, spec, j->samples, epoch, msg, len);

    if (err) {
        sluice__v1__job__free_unpacked(spec, NULL);
        return err;
    }
    j->feed->hooks.streams_end(j, 1, SL_RPC_ABORTED,
                               "job restored to a checkpoint's data position; reopen the stream");
    drop_epoch_state(j);
    j->gen++;
    sluice__v1__job__free_unpacked(j->spec, NULL);
    j->spec = spec;
    j->epoch = epoch;
    j->cfg = cfg;
    err = setup_counts(j, msg, len);
    if (!err && elastic && elastic_len) {
        err = elastic_load(j, elastic, elastic_len, msg, len);
        if (!err)
            err = setup_elastic_counts(j, msg, len);
    }
    if (err) {
        sl_log_error("job_restore_failed", "job=%s epoch=%llu error=\"%s\"", j->name,
                     (unsigned long long)epoch, msg);
        return err;
    }
    for (uint32_t d = 0; d < j->dp_size && d < n; d++) {
        j->progress[d] = positions[d];
        j->reported[d] = 1;
    }
    sl_log_info("job_restored", "job=%s epoch=%llu world=%u dp=%u elastic=%d", j->name,
                (unsigned long long)epoch, spec->world_size, j->dp_size, j->src != NULL);
    return 0;
}
