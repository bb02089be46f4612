/* `sluice batch`: the class-aware order of an epoch and the view of a plan after mid-epoch
 * resizes, the way the daemon's batch jobs compute them (server/feed/plan.c, state.c), from the
 * same pure functions: sl_sample_plan_order, sl_sample_elastic_lockstep, sl_batch_plan_rest. */
#include "batch_epoch.h"

#include "cli.h"

#include "err.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int batch_classes_set(const batch_classes *bc)
{
    return bc->labels_file || bc->stratify || bc->balance || bc->class_w || bc->epoch_length;
}

static int read_labels(sl_sample_labels **out, const char *path)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    uint32_t *v = NULL;
    size_t n = 0;
    char msg[256];
    int r;

    if (!f)
        return sl_cli_fail("batch", "cannot open '%s': %s", path, strerror(errno));
    r = sl_cli_labels_read(&v, &n, f, 0, path, "batch");
    if (f != stdin)
        fclose(f);
    if (!r && sl_sample_labels_new(out, v, n, msg, sizeof(msg)) != 0)
        r = sl_cli_fail("batch", "%s: %s", path, msg);
    free(v);
    return r;
}

int batch_class_order(uint64_t **order, size_t *n_order, const batch_classes *bc, size_t n,
                      sl_sample_shuffle shuffle, uint64_t seed, uint64_t epoch)
{
    sl_sample_labels *labels = NULL;
    sl_sample_config cfg;
    uint64_t got = 0;
    char msg[256] = "";
    int r = 0, err;

    *order = NULL;
    *n_order = 0;
    if (bc->labels_file && (r = read_labels(&labels, bc->labels_file)) != 0)
        return r;
    sl_sample_config_init(&cfg);
    cfg.samples = n;
    cfg.shuffle = shuffle;
    cfg.seed = seed;
    cfg.epoch = epoch;
    cfg.classes = bc->stratify  ? SL_SAMPLE_CLASSES_STRATIFY
                  : bc->balance ? SL_SAMPLE_CLASSES_BALANCE
                  : bc->class_w ? SL_SAMPLE_CLASSES_BALANCE
                                : SL_SAMPLE_CLASSES_NONE;
    cfg.labels = labels;
    cfg.class_weights = bc->class_w;
    cfg.n_class_weights = (uint32_t)bc->n_class_w;
    cfg.epoch_length = bc->epoch_length;
    if (cfg.classes == SL_SAMPLE_CLASSES_NONE)
        r = sl_cli_fail("batch", "--labels-file and --epoch-length need --stratify, "
                                 "--balance-classes or --class-weights");
    else if ((err = sl_sample_plan_order(order, &got, &cfg, SL_BATCH_MAX_SEQUENCES, msg,
                                         sizeof(msg))) != 0)
        r = sl_cli_fail("batch", "%s", msg[0] ? msg : sl_strerror(err));
    *n_order = (size_t)got;
    sl_sample_labels_free(labels);
    return r;
}

/* Every consumed count of a step at most `cap` (the batches each rank of its world had). */
static int check_consumed(const batch_step *st, size_t k, uint64_t cap)
{
    for (size_t r = 0; r < st->n_consumed; r++)
        if (st->consumed[r] > cap)
            return sl_cli_fail("batch",
                               "%s: rank %zu consumed %" PRIu64 " batches, more than the %" PRIu64
                               " each rank had",
                               k == 0 ? "--consumed" : "--resize", r, st->consumed[r], cap);
    return 0;
}

/* Unweighted plans: the batches dealt out again, equal counts per rank (lockstep shares). Each
 * step's consumed counts are checked against what every rank of its world had. */
static int open_lockstep(batch_view *v, const batch_step *steps, size_t n_steps, int pad)
{
    sl_sample_resize *rs = calloc(n_steps, sizeof(*rs));
    uint64_t per = sl_batch_plan_batches_per_rank(v->plan), cap = per;
    uint32_t d0 = sl_batch_plan_replicas(v->plan);
    char msg[256] = "";
    int r = 0, err = 0;

    if (!rs)
        return sl_cli_fail("batch", "out of memory");
    if (per == 0)
        r = sl_cli_fail("batch", "the epoch's plan has no batches: nothing to redistribute");
    for (size_t k = 0; k < n_steps && !r && !err; k++) {
        rs[k] = (sl_sample_resize){
            steps[k].consumed, steps[k].n_consumed, steps[k].new_replicas, NULL, 0, false};
        if ((r = check_consumed(&steps[k], k, cap)) != 0)
            break;
        sl_sample_elastic_free(v->e);
        v->e = NULL;
        err = sl_sample_elastic_lockstep(&v->e, &cap, per, d0, pad, rs, k + 1, msg, sizeof(msg));
    }
    free(rs);
    if (err)
        return sl_cli_fail("batch", "%s", msg[0] ? msg : sl_strerror(err));
    if (r)
        return r;
    v->world = sl_sample_elastic_world(v->e);
    v->per_rank = cap;
    if (!(v->s = calloc(v->world, sizeof(*v->s))))
        return sl_cli_fail("batch", "out of memory");
    for (uint32_t d = 0; d < v->world; d++)
        if (sl_sample_new_elastic(&v->s[d], v->e, d, msg, sizeof(msg)) != 0)
            return sl_cli_fail("batch", "%s", msg);
    return 0;
}

/* Weighted plans: each step re-plans the rest of the plan before it for the new world, with the
 * rank weights while the world keeps their count (as a daemon's job keeps them), else equal
 * budgets. */
static int open_replan(batch_view *v, const sl_batch_config *cfg, const uint32_t *lengths, size_t n,
                       const batch_step *steps, size_t n_steps)
{
    const sl_batch_plan *cur = v->plan;
    int keep = 1;
    char msg[256] = "";

    for (size_t k = 0; k < n_steps; k++) {
        sl_batch_config c = *cfg;
        sl_batch_plan *next = NULL;
        uint64_t *order = NULL;
        size_t m = 0;
        int r, err;

        if ((r = check_consumed(&steps[k], k, sl_batch_plan_batches_per_rank(cur))) != 0)
            return r;
        keep = keep && steps[k].new_replicas == cfg->n_rank_weights;
        c.replicas = steps[k].new_replicas;
        c.rank_weights = keep ? cfg->rank_weights : NULL;
        c.n_rank_weights = keep ? cfg->n_rank_weights : 0;
        err = sl_batch_plan_rest(&order, &m, cur, steps[k].consumed, steps[k].n_consumed, msg,
                                 sizeof(msg));
        if (!err)
            err = sl_batch_plan_new(&next, &c, lengths, n, order, m, msg, sizeof(msg));
        free(order);
        if (err)
            return sl_cli_fail("batch", "resize %zu: %s", k + 1, msg[0] ? msg : sl_strerror(err));
        sl_batch_plan_free(v->replan);
        v->replan = next;
        cur = next;
    }
    v->world = sl_batch_plan_replicas(cur);
    v->per_rank = sl_batch_plan_batches_per_rank(cur);
    return 0;
}

int batch_view_open(batch_view *v, const sl_batch_plan *plan, const sl_batch_config *cfg,
                    const uint32_t *lengths, size_t n, const batch_step *steps, size_t n_steps)
{
    memset(v, 0, sizeof(*v));
    v->plan = plan;
    if (cfg->n_rank_weights)
        return open_replan(v, cfg, lengths, n, steps, n_steps);
    return open_lockstep(v, steps, n_steps, cfg->remainder == SL_BATCH_REPEAT);
}

int batch_view_get(const batch_view *v, uint32_t r, uint64_t i, sl_batch *b)
{
    uint32_t d0 = sl_batch_plan_replicas(v->plan);
    uint64_t g;

    if (r >= v->world || i >= v->per_rank)
        return SL_EINVAL;
    if (v->replan)
        return sl_batch_plan_get(v->replan, r, i, b);
    if (sl_sample_fill(&g, v->s[r], i, 1) != 0)
        return SL_EINVAL;
    return sl_batch_plan_get(v->plan, (uint32_t)(g % d0), g / d0, b);
}

void batch_view_close(batch_view *v)
{
    for (uint32_t d = 0; v->s && d < v->world; d++)
        sl_sample_free(v->s[d]);
    free(v->s);
    sl_sample_elastic_free(v->e);
    sl_batch_plan_free(v->replan);
    memset(v, 0, sizeof(*v));
}
