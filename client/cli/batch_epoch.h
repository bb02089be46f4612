/* `sluice batch`'s epoch beyond the plain plan (batch_epoch.c): the class-aware order of an epoch
 * with labels, and the view of a plan after mid-epoch resizes, computed as the daemon computes
 * them (docs/batching.md "Classes", docs/feeding.md "Resize"). Main thread only. */
#ifndef SL_CLI_BATCH_EPOCH_H
#define SL_CLI_BATCH_EPOCH_H

#include "batch/batch.h"
#include "sample/sample.h"

#include <stddef.h>
#include <stdint.h>

/* Class options of `sluice batch` (as `sluice sample` spells them). */
typedef struct batch_classes {
    const char *labels_file; /* one class id per line, '-' = stdin */
    int stratify, balance;
    double *class_w; /* --class-weights, n_class_w of them (implies balance) */
    size_t n_class_w;
    uint64_t epoch_length;
} batch_classes;

/* 1 if any class option is given. */
int batch_classes_set(const batch_classes *bc);

/* The order of an epoch of n samples with classes: the labels file read and grouped, and
 * sl_sample_plan_order of (shuffle, seed, epoch) with the class options. *order: a new array of
 * *n_order entries (caller frees). Returns 0, or an exit code after printing why. */
int batch_class_order(uint64_t **order, size_t *n_order, const batch_classes *bc, size_t n,
                      sl_sample_shuffle shuffle, uint64_t seed, uint64_t epoch);

/* One mid-epoch resize: what each rank of the world before consumed (in batches), the world
 * after. */
typedef struct batch_step {
    uint64_t *consumed;
    size_t n_consumed;
    uint32_t new_replicas;
} batch_step;

/* The batches each rank of the last world reads after the resizes: the epoch plan's batches
 * dealt out again with equal counts (the plan without rank weights: lockstep elastic shares),
 * or, with rank weights, the rest re-planned for each new world (its weights when the world
 * keeps their count, equal budgets otherwise). */
typedef struct batch_view {
    const sl_batch_plan *plan; /* the epoch's plan, borrowed */
    sl_batch_plan *replan;     /* the last re-plan (weighted), or NULL */
    sl_sample_elastic *e;      /* the lockstep shares (unweighted), or NULL */
    sl_sample **s;             /* [world] streams of e */
    uint32_t world;
    uint64_t per_rank; /* batches every rank of the last world reads */
} batch_view;

/* Build the view of `plan` (planned with cfg, over lengths[0..n)) after the steps. Consumed
 * counts are checked against the shares they count in. Returns 0, or an exit code after printing
 * why. Free with batch_view_close, also after a failure. */
int batch_view_open(batch_view *v, const sl_batch_plan *plan, const sl_batch_config *cfg,
                    const uint32_t *lengths, size_t n, const batch_step *steps, size_t n_steps);

/* Batch i of rank r of the last world. Returns 0 or SL_EINVAL. */
int batch_view_get(const batch_view *v, uint32_t r, uint64_t i, sl_batch *b);

void batch_view_close(batch_view *v);

#endif
