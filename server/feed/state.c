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

int feed_job_batch_src(fjob *j, char *msg, size_t len)
{
    sl_sample_elastic *e = NULL;
    uint64_t count = 0;
    int err;

    if (!j->spec->batching || !j->chain || j->src || !j->plan || j->plan->state != 1 ||
        feed_job_replans(j)) /* its plan is the re-plan of the rest: no elastic shares */
        return 0;
    err = feed_chain_batch_plan(j->chain, sl_batch_plan_batches_per_rank(j->plan->plan),
                                j->spec->batching->pad_remainder, &e, &count, msg, len);
    if (!err && !(j->src = calloc(1, sizeof(*j->src))))
        err = -ENOMEM;
    if (err) {
        sl_sample_elastic_free(e);
        sl_log_error("elastic_batches_failed", "job=%s epoch=%llu error=\"%s\"", j->name,
                     (unsigned long long)j->epoch, msg);
        return err;
    }
    j->src->refs = 1;
    j->src->plan = e;
    j->bcount = count;
    return 0;
}

/* Install a chain (owned from now on) and its blob as the current epoch's elastic state: index
 * jobs get their plan now (`plan`, owned from now on, when built already), batch jobs once
 * their epoch plan is ready. */
int feed_job_elastic_install(fjob *j, fchain *c, const uint8_t *blob, size_t blob_len,
                             sl_sample_elastic *plan, char *msg, size_t len)
{
    sl_sample_config ocfg;
    int err = feed_chain_config(flabels_of(j->labels), j->samples, j->epoch, c, &ocfg, msg, len);

    if (!err && c->steps[c->n - 1].new_replicas != j->dp_size) {
        snprintf(msg, len, "elastic state of job '%s' ends in a world of %u, not %u", j->name,
                 c->steps[c->n - 1].new_replicas, j->dp_size);
        err = SL_ECORRUPT;
    }
    if (!err && !j->spec->batching && !plan)
        err =
            feed_chain_index_plan(flabels_of(j->labels), j->samples, j->epoch, c, &plan, msg, len);
    if (!err && !j->spec->batching && !(j->src = calloc(1, sizeof(*j->src))))
        err = -ENOMEM;
    if (!err && !(j->elastic_blob = malloc(blob_len)))
        err = -ENOMEM;
    if (err) {
        free(j->src);
        j->src = NULL;
        sl_sample_elastic_free(plan);
        feed_chain_free(c);
        return err;
    }
    if (j->src) {
        j->src->refs = 1;
        j->src->plan = plan;
    } else {
        sl_sample_elastic_free(plan); /* a batch job's: built over its epoch plan */
    }
    memcpy(j->elastic_blob, blob, blob_len);
    j->elastic_len = blob_len;
    j->chain = c;
    return 0;
}

/* The chain and index plan feed_job_reload_start built on the worker pool for job j's blob, if
 * they are (the same job, labels, epoch and blob): 1 with both handed over, else 0. */
static int take_prebuilt(fjob *j, const uint8_t *blob, size_t blob_len, fchain **chain,
                         sl_sample_elastic **plan)
{
    fresize *p = j->feed->prebuilt;

    if (!p || !p->chain || strcmp(p->name, j->name) != 0 || p->labels != j->labels ||
        p->epoch != j->epoch || p->old_len != blob_len || memcmp(p->old_blob, blob, blob_len) != 0)
        return 0;
    *chain = p->chain;
    *plan = p->plan;
    p->chain = NULL;
    p->plan = NULL;
    return 1;
}

/* Build the elastic source of the current epoch from a blob. */
int feed_job_elastic_load(fjob *j, const uint8_t *blob, size_t blob_len, char *msg, size_t len)
{
    sl_sample_elastic *plan = NULL;
    fchain *c = NULL;
    int err;

    if (take_prebuilt(j, blob, blob_len, &c, &plan))
        return feed_job_elastic_install(j, c, blob, blob_len, plan, msg, len);
    err = feed_chain_decode(blob, blob_len, j->dp_size, &c);

    if (err) {
        snprintf(msg, len, "elastic state of job '%s' is corrupt", j->name);
        return err;
    }
    return feed_job_elastic_install(j, c, blob, blob_len, NULL, msg, len);
}

void feed_job_drop_epoch(fjob *j)
{
    if (j->shares) {
        for (uint32_t d = 0; d < j->dp_size; d++)
            fshare_unref(j->shares[d]);
        free(j->shares);
        j->shares = NULL;
    }
    fsrc_unref(j->src);
    j->src = NULL;
    feed_chain_free(j->chain);
    j->chain = NULL;
    j->bcount = 0;
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
int feed_job_setup_counts(fjob *j, char *msg, size_t len)
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
        return 0; /* filled by feed_job_setup_elastic_counts once the plan exists */
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

int feed_job_setup_elastic_counts(fjob *j, char *msg, size_t len)
{
    if (!j->src)
        return 0; /* a batch job's: feed_job_batch_src, once its plan is ready */
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
    if (j->resizing)
        j->resizing->job = NULL; /* its end finds the job gone: the call runs again */
    feed_job_drop_epoch(j);
    flabels_unref(j->feed, j->labels);
    if (j->spec)
        sluice__v1__job__free_unpacked(j->spec, NULL);
    free(j->counts);
    free(j->progress);
    free(j->reported);
    free(j);
}

int feed_job_merge_progress(uint32_t dp, uint64_t epoch, uint64_t position, void *arg)
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
    err = feed_spec_wants_labels(spec) ? feed_labels_get(&j->labels, f, dataset, msg, len) : 0;
    if (err == FEED_PENDING && feed_labels_defer_load(j->labels, name) != 0) {
        snprintf(msg, len, "out of memory");
        err = -ENOMEM;
    }
    if (!err)
        err = feed_spec_config(&j->cfg, spec, flabels_of(j->labels), samples, epoch, msg, len);
    if (!err)
        err = feed_job_setup_counts(j, msg, len);
    if (!err && elastic && elastic_len) {
        err = feed_job_elastic_load(j, elastic, elastic_len, msg, len);
        if (!err)
            err = feed_job_setup_elastic_counts(j, msg, len);
    }
    if (!err)
        err = sl_cat_progress_list(f->cat, j->name, feed_job_merge_progress, j);
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
        int elastic = j->chain && !feed_job_replans(j);
        if (!j->plan || j->plan->state != 1 || (elastic && !j->src))
            return SL_ESTATE;
        *count = elastic ? j->bcount : sl_batch_plan_batches_per_rank(j->plan->plan);
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
    uint64_t next = j->epoch + 1;
    int err;

    if (next > SL_SAMPLE_EPOCH_MAX || next > UINT64_MAX - j->cfg.seed) {
        sl_log_warn("epoch_limit", "job=%s epoch=%llu", j->name, (unsigned long long)j->epoch);
        return SL_ELIMIT;
    }
    err = sl_cat_job_set_epoch(j->feed->cat, j->name, j->epoch, next);
    if (err == SL_ESTATE)
        sl_log_info("epoch_advanced_elsewhere", "job=%s epoch=%llu", j->name,
                    (unsigned long long)j->epoch);
    return err ? err : feed_job_enter(j, next);
}

int feed_job_enter(fjob *j, uint64_t next)
{
    char msg[256];
    int err;

    feed_job_drop_epoch(j);
    j->gen++;
    j->epoch = next;
    j->cfg.epoch = next;
    err = feed_job_setup_counts(j, msg, sizeof(msg));
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
    char msg[256];

    feed_job_batch_src(j, msg, sizeof(msg));
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
        /* SL_ESTATE: another replica began the next epoch first; its announcement brings it. */
        if (err)
            return err == SL_ESTATE ? 0 : err;
        *advanced = 1;
    }
    return 0;
}

int feed_job_rewind(fjob *j, Sluice__V1__Job *spec, uint64_t epoch, const void *elastic,
                    size_t elastic_len, const uint64_t *positions, uint32_t n, char *msg,
                    size_t len)
{
    sl_sample_config cfg;
    int err = feed_spec_config(&cfg, spec, flabels_of(j->labels), j->samples, epoch, msg, len);

    if (err) {
        sluice__v1__job__free_unpacked(spec, NULL);
        return err;
    }
    j->feed->hooks.streams_end(j, 1, SL_RPC_ABORTED,
                               "job restored to a checkpoint's data position; reopen the stream");
    feed_job_drop_epoch(j);
    j->gen++;
    sluice__v1__job__free_unpacked(j->spec, NULL);
    j->spec = spec;
    j->epoch = epoch;
    j->cfg = cfg;
    err = feed_job_setup_counts(j, msg, len);
    if (!err && elastic && elastic_len) {
        err = feed_job_elastic_load(j, elastic, elastic_len, msg, len);
        if (!err)
            err = feed_job_setup_elastic_counts(j, msg, len);
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
