/* Batch plans: one per (job, epoch), computed on libuv's worker pool from the stored lengths file
 * (its SHA-256 checked first) and the epoch's global order (with classes: the stratified or
 * class-balanced layout of the whole epoch, sl_sample_plan_order), and shared by every rank.
 * Calls that need a plan wait for it as waiters (a call reference and a callback); when it is
 * ready the job hears of it through the plan_ready hook. Loop thread, except plan_work. */
#include "internal.h"

#include "err.h"
#include "log.h"
#include "util/lengths.h"
#include "shard/shard.h"
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void steps_free(fplan_step *st, uint32_t n)
{
    for (uint32_t k = 0; st && k < n; k++) {
        free(st[k].w);
        free(st[k].consumed);
    }
    free(st);
}

void fplan_unref(fplan *p)
{
    if (p && --p->refs == 0) {
        sl_batch_plan_free(p->plan);
        free(p->rank_weights);
        free(p->class_weights);
        flabels_unref(p->f, p->labels);
        steps_free(p->steps, p->nsteps);
        free(p);
    }
}

/* The re-plans of a weighted batch job resized mid-epoch, on the worker: each step plans the
 * rest of the plan before it for its world and weights. */
static void replan(fplan *p, const uint32_t *lengths, uint64_t n)
{
    for (uint32_t k = 0; k < p->nsteps && !p->err; k++) {
        sl_batch_plan *next = NULL;
        uint64_t *order = NULL;
        size_t m = 0;
        char why[200];

        /* A rest of nothing (every rank consumed its share) plans into no batches. */
        p->err = sl_batch_plan_rest(&order, &m, p->plan, p->steps[k].consumed,
                                    p->steps[k].n_consumed, why, sizeof(why));
        if (p->err) {
            snprintf(p->msg, sizeof(p->msg), "resize %u: %s", k + 1, why);
        } else {
            p->err = sl_batch_plan_new(&next, &p->steps[k].cfg, lengths, (size_t)n, order, m,
                                       p->msg, sizeof(p->msg));
        }
        free(order);
        if (!p->err) {
            sl_batch_plan_free(p->plan);
            p->plan = next;
        }
    }
}

static void plan_work(uv_work_t *w)
{
    fplan *p = w->data;
    uint32_t *lengths = NULL;
    uint64_t *order = NULL, n_order = 0;
    uint64_t n = p->scfg.samples;

    int fd = sl_store_open(p->path, O_RDONLY, 0);

    if (fd < 0) {
        p->err = fd;
        snprintf(p->msg, sizeof(p->msg), "cannot open the lengths file %.200s: %s", p->path,
                 sl_store_strerror(fd));
        goto out;
    }
    p->err = sl_lengths_read(&lengths, fd, n, p->sha256, p->msg, sizeof(p->msg));
    close(fd);
    if (p->err)
        goto out;
    /* The epoch's order: the shuffled samples, or with classes the stratified or class-balanced
     * layout of the whole epoch, so that the batches cut from it carry the class proportions. */
    p->err = sl_sample_plan_order(&order, &n_order, &p->scfg, SL_BATCH_MAX_SEQUENCES, p->msg,
                                  sizeof(p->msg));
    if (p->err)
        goto out;
    p->err = sl_batch_plan_new(&p->plan, &p->cfg, lengths, (size_t)n, order, (size_t)n_order,
                               p->msg, sizeof(p->msg));
    if (!p->err)
        replan(p, lengths, n);
out:
    free(lengths);
    free(order);
}

static void plan_done(uv_work_t *w, int status)
{
    fplan *p = w->data;
    fjob *j = p->job;

    if (status != 0 && !p->err) {
        p->err = SL_ECANCELLED;
        snprintf(p->msg, sizeof(p->msg), "planning cancelled");
    }
    p->state = p->err ? -1 : 1;
    if (p->err)
        sl_log_warn("batch_plan_failed", "epoch=%llu error=\"%s\"", (unsigned long long)p->epoch,
                    p->msg);
    else
        sl_log_info("batch_plan_ready", "epoch=%llu batches_per_rank=%llu",
                    (unsigned long long)p->epoch,
                    (unsigned long long)sl_batch_plan_batches_per_rank(p->plan));
    /* The calls waiting for it (streams, Epochs.Get) may belong to an epoch that has ended
     * since (Epochs.Next): each callback checks what it still needs. */
    feed_waiters_run(&p->waiters, p->f, p->job_name);
    if (j && p->state == 1)
        p->f->hooks.plan_ready(j);
    fplan_unref(p);
}

/* The worker's copies of the chain's steps (the job's may change while it plans): per step the
 * batch config of its world and weights, and what the world before consumed. */
static int replan_inputs(fplan *p, fjob *j, char *msg, size_t len)
{
    const fchain *c = j->chain;
    int err = 0;

    if (!(p->steps = calloc(c->n, sizeof(*p->steps))))
        return -ENOMEM;
    p->nsteps = c->n;
    for (uint32_t k = 0; k < c->n && !err; k++) {
        const sl_sample_resize *rs = &c->steps[k];
        Sluice__V1__Job spec = *c->spec;
        fplan_step *st = &p->steps[k];

        spec.rank_weights = (double *)rs->weights;
        spec.n_rank_weights = rs->n_weights;
        err = feed_spec_batch_config(&st->cfg, &spec, rs->new_replicas, j->cfg.seed, j->epoch, msg,
                                     len);
        if (err)
            break;
        st->consumed = malloc(rs->n_consumed * sizeof(*st->consumed));
        st->w = rs->n_weights ? malloc(rs->n_weights * sizeof(*st->w)) : NULL;
        if (!st->consumed || (rs->n_weights && !st->w)) {
            err = -ENOMEM;
            break;
        }
        memcpy(st->consumed, rs->consumed, rs->n_consumed * sizeof(*st->consumed));
        st->n_consumed = (uint32_t)rs->n_consumed;
        if (rs->n_weights)
            memcpy(st->w, rs->weights, rs->n_weights * sizeof(*st->w));
        st->cfg.rank_weights = st->w;
    }
    return err;
}

/* The worker's copy of the epoch's sample config: for a job with classes a reference to the
 * dataset's labels and a copy of the class weights (the spec's may be freed by a resize). */
static int order_inputs(fplan *p, const fjob *j, char *msg, size_t len)
{
    p->scfg = j->cfg;
    p->scfg.rank_weights = NULL; /* the plan's order is the whole epoch's (one rank) */
    p->scfg.n_rank_weights = 0;
    p->scfg.class_weights = NULL;
    p->scfg.n_class_weights = 0;
    p->scfg.labels = NULL;
    if (j->cfg.classes == SL_SAMPLE_CLASSES_NONE)
        return 0;
    if (!flabels_of(j->labels)) {
        snprintf(msg, len, "the labels of dataset '%s' are not loaded yet", j->dataset);
        return SL_EUNAVAILABLE;
    }
    p->labels = flabels_ref(j->labels);
    p->scfg.labels = flabels_of(p->labels);
    if (j->cfg.n_class_weights) {
        p->class_weights = malloc(j->cfg.n_class_weights * sizeof(double));
        if (!p->class_weights)
            return -ENOMEM;
        memcpy(p->class_weights, j->cfg.class_weights, j->cfg.n_class_weights * sizeof(double));
        p->scfg.class_weights = p->class_weights;
        p->scfg.n_class_weights = j->cfg.n_class_weights;
    }
    return 0;
}

int feed_plan_request(fjob *j, char *msg, size_t len)
{
    sl_cat_dataset d;
    const Sluice__V1__Job *spec;
    uint32_t dp_size;
    fplan *p;
    int err;

    if (j->plan && j->plan->state >= 0)
        return 0;
    if (j->plan) {
        /* A failed plan is retried (the lengths may have been uploaded since). */
        j->plan->job = NULL;
        fplan_unref(j->plan);
        j->plan = NULL;
    }
    err = sl_cat_dataset_get(j->feed->cat, &d, j->dataset);
    if (err) {
        snprintf(msg, len, "dataset '%s': %s", j->dataset, sl_strerror(err));
        return err;
    }
    if (!d.has_lengths) {
        snprintf(msg, len, "dataset '%s' has no lengths: upload them first", j->dataset);
        return SL_ESTATE;
    }
    p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->refs = 1; /* the job's; fplan_unref frees a plan that does not start */
    p->f = j->feed;
    /* A job resized mid-epoch keeps the plan of the epoch's first world (its elastic shares
     * redistribute that plan's batches). */
    spec = feed_job_plan_spec(j, &dp_size);
    err = feed_spec_batch_config(&p->cfg, spec, dp_size, j->cfg.seed, j->epoch, msg, len);
    if (!err && p->cfg.n_rank_weights) {
        /* The worker must not read the spec, which a resize may free meanwhile. */
        p->rank_weights = malloc(p->cfg.n_rank_weights * sizeof(double));
        if (!p->rank_weights)
            err = -ENOMEM;
        else
            memcpy(p->rank_weights, p->cfg.rank_weights, p->cfg.n_rank_weights * sizeof(double));
        p->cfg.rank_weights = p->rank_weights;
    }
    if (!err && feed_job_replans(j))
        err = replan_inputs(p, j, msg, len);
    if (!err)
        err = order_inputs(p, j, msg, len);
    if (!err)
        err = feed_lengths_path(j->feed, j->dataset, p->path, sizeof(p->path));
    if (err) {
        if (err == -ENOMEM)
            snprintf(msg, len, "out of memory");
        fplan_unref(p);
        return err;
    }
    p->epoch = j->epoch;
    snprintf(p->job_name, sizeof(p->job_name), "%s", j->name);
    snprintf(p->sha256, sizeof(p->sha256), "%s", d.lengths_sha256);
    p->refs = 2; /* the job's and the worker's */
    p->job = j;
    p->work.work.data = p;
    err = sl_cat_queue_work(j->feed->cat, j->feed->loop, &p->work, plan_work, plan_done);
    if (err) {
        p->refs = 1;
        fplan_unref(p);
        snprintf(msg, len, "cannot queue the batch plan");
        return SL_EUNAVAILABLE;
    }
    j->plan = p;
    return 0;
}

int feed_plan_wait(fjob *j, sl_rpc_call *call, feed_ready_cb cb, char *msg, size_t len)
{
    int err = feed_plan_request(j, msg, len);

    if (err)
        return err;
    if (j->plan->state != 0) {
        cb(call, j->feed, j->name);
        return 0;
    }
    err = feed_waiters_add(&j->plan->waiters, call, cb);
    if (err)
        snprintf(msg, len, "out of memory");
    return err;
}
