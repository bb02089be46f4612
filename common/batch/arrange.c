/* Token-budget batch planning: shuffling and balancing the batch records, and the statistics
 * (see internal.h). */
#include "batch/internal.h"

#include "err.h"
#include "util/msg.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Deterministic random numbers: splitmix64, the same sequence on every machine. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);

    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rng_init(uint64_t seed, uint64_t epoch, uint64_t stream)
{
    uint64_t s = seed;
    uint64_t a = rng_next(&s);

    s = a ^ (epoch * 0xD1B54A32D192ED03ull);
    a = rng_next(&s);
    s = a ^ (stream * 0xABC98388FB8FAC03ull);
    return s;
}

/* Uniform in [0, n) without modulo bias. */
static uint64_t rng_below(uint64_t *s, uint64_t n)
{
    uint64_t t = (0 - n) % n, r;

    do
        r = rng_next(s);
    while (r < t);
    return r % n;
}
/* The cost a step balances: what the trainer computes for the batch. */
static uint64_t rec_cost(const rec *r, sl_batch_cost cost)
{
    return cost == SL_BATCH_COST_PADDED ? (uint64_t)r->count * r->max_len : r->tokens;
}

static int cmp_rec_padded(const void *x, const void *y)
{
    const rec *a = x, *b = y;
    uint64_t ca = rec_cost(a, SL_BATCH_COST_PADDED), cb = rec_cost(b, SL_BATCH_COST_PADDED);

    if (ca != cb)
        return ca > cb ? -1 : 1;
    if (a->start != b->start)
        return a->start < b->start ? -1 : 1;
    return 0;
}

static int cmp_rec_sum(const void *x, const void *y)
{
    const rec *a = x, *b = y;

    if (a->tokens != b->tokens)
        return a->tokens > b->tokens ? -1 : 1;
    if (a->start != b->start)
        return a->start < b->start ? -1 : 1;
    return 0;
}

/* Shuffle, remainder, balance: turn the window-ordered records into the final order. */
int bt_arrange(planner *p, sl_batch_plan *plan)
{
    const uint64_t d = p->c.replicas;
    size_t nb = p->n_recs, total;
    uint64_t rng;

    if (!p->c.keep_order) {
        rng = rng_init(p->c.seed, p->c.epoch, 1);
        for (size_t i = nb; i > 1; i--) {
            size_t j = (size_t)rng_below(&rng, i);
            rec t = p->recs[i - 1];

            p->recs[i - 1] = p->recs[j];
            p->recs[j] = t;
        }
    }
    if (p->c.remainder == SL_BATCH_DROP || nb == 0) {
        plan->per_rank = nb / d;
        total = (size_t)(plan->per_rank * d);
        for (size_t i = total; i < nb; i++)
            plan->total.dropped += p->recs[i].count;
    } else {
        plan->per_rank = (nb + d - 1) / d;
        total = (size_t)(plan->per_rank * d);
        if (total > p->cap_recs) {
            rec *r =
                bt_acct_realloc(&p->a, p->recs, p->cap_recs * sizeof(rec), total * sizeof(rec));

            if (!r)
                return -ENOMEM;
            p->recs = r;
            p->cap_recs = total;
        }
        for (size_t i = nb; i < total; i++) {
            p->recs[i] = p->recs[(i - nb) % nb];
            plan->total.repeated += p->recs[i].count;
        }
    }
    if (total < p->cap_recs) {
        rec *r = bt_acct_realloc(&p->a, p->recs, p->cap_recs * sizeof(rec),
                                 (total ? total : 1) * sizeof(rec));

        if (r) {
            p->recs = r;
            p->cap_recs = total ? total : 1;
        }
    }
    p->n_recs = total;
    if (p->c.balance && d > 1 && total > 0) {
        /* Sort by cost so each step's D batches cost about the same, then shuffle the steps
         * (the records' start offsets make the order total, so the result is deterministic). */
        qsort(p->recs, total, sizeof(rec),
              p->c.cost == SL_BATCH_COST_PADDED ? cmp_rec_padded : cmp_rec_sum);
        if (!p->c.keep_order) {
            rng = rng_init(p->c.seed, p->c.epoch, 2);
            for (size_t i = plan->per_rank; i > 1; i--) {
                size_t j = (size_t)rng_below(&rng, i);

                for (size_t r = 0; r < d; r++) {
                    rec t = p->recs[(i - 1) * d + r];

                    p->recs[(i - 1) * d + r] = p->recs[j * d + r];
                    p->recs[j * d + r] = t;
                }
            }
        }
    }
    return 0;
}

void bt_finish_stats(sl_batch_stats *s, uint64_t max_tokens)
{
    s->padding_fraction =
        s->padded_tokens ? (double)(s->padded_tokens - s->tokens) / (double)s->padded_tokens : 0;
    s->fill = s->batches ? (double)s->tokens / ((double)s->batches * (double)max_tokens) : 0;
}

void bt_sum_stats(planner *p, sl_batch_plan *plan)
{
    const uint32_t d = p->c.replicas;
    sl_batch_stats *t = &plan->total;

    for (size_t k = 0; k < p->n_recs; k++) {
        const rec *r = &p->recs[k];
        sl_batch_stats *s = &plan->ranks[k % d];
        uint64_t trunc = 0;

        if (p->truncated) {
            for (uint32_t j = 0; j < r->count; j++)
                trunc += p->lengths[p->idx[r->start + j]] > p->c.max_seq_len;
        }
        s->batches++;
        s->sequences += r->count;
        s->tokens += r->tokens;
        s->padded_tokens += (uint64_t)r->count * r->max_len;
        s->truncated += trunc;
    }
    for (uint32_t r = 0; r < d; r++) {
        sl_batch_stats *s = &plan->ranks[r];

        t->batches += s->batches;
        t->sequences += s->sequences;
        t->tokens += s->tokens;
        t->padded_tokens += s->padded_tokens;
        t->truncated += s->truncated;
    }
    t->skipped = p->skipped;
    for (uint32_t r = 0; r < d; r++) {
        plan->ranks[r].skipped = t->skipped;
        plan->ranks[r].dropped = t->dropped;
        plan->ranks[r].repeated = t->repeated;
        bt_finish_stats(&plan->ranks[r], p->c.max_tokens);
    }
    bt_finish_stats(t, p->c.max_tokens);
}
