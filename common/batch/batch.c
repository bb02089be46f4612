/* Token-budget batch planning. See batch.h for the contract and docs/batching.md for the design.
 *
 * The planner runs in one straight line: validate the inputs and measure them (pass 1), sort each
 * window of the order by its key into `idx` and cut it into batch records (pass 2), shuffle the
 * records, apply the remainder rule, balance steps, and sum up per-rank statistics. A record
 * refers to a contiguous run of `idx`, so shuffling, repeating and balancing batches only moves
 * 16-byte records, never indices.
 *
 * This file holds the entry points (sl_batch_plan_new, weighted plans, the accessors); the passes
 * live in window.c (pass 1, sorting windows, scratch, carrying), cut.c (greedy and packed
 * cutting), arrange.c (shuffle, remainder, balance, statistics), config.c (the configuration) and
 * acct.c (allocation accounting), sharing internal.h.
 */
#include "batch/internal.h"

#include "err.h"
#include "util/msg.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Weighted ranks: cut the order into one piece per rank holding tokens in proportion to the
 * weights, plan each piece alone with its rank's budgets, then give every rank the same count. */
static int plan_weighted(sl_batch_plan **out, const sl_batch_config *c, const uint32_t *lengths,
                         size_t n_lengths, const uint64_t *order, size_t n_order, char *msg,
                         size_t len)
{
    const uint32_t d = c->replicas;
    sl_batch_plan **sub = NULL, *plan = NULL;
    uint64_t *ident = NULL, *q = NULL, total = 0, qsum = 0, cum = 0, per = 0, placed = 0;
    size_t *cut = NULL, n_idx = 0, k = 0;
    double top = 0;
    int err = -ENOMEM;

    if (!lengths && n_lengths)
        return sl_fail(msg, len, SL_EINVAL, "lengths is NULL");
    if (!order) {
        if (!(ident = malloc((n_lengths ? n_lengths : 1) * sizeof(*ident))))
            goto out;
        for (size_t i = 0; i < n_lengths; i++)
            ident[i] = i;
        order = ident;
        n_order = n_lengths;
    }
    sub = calloc(d, sizeof(*sub));
    q = calloc(d, sizeof(*q));
    cut = calloc((size_t)d + 1, sizeof(*cut));
    plan = calloc(1, sizeof(*plan));
    if (!sub || !q || !cut || !plan)
        goto out;
    plan->cfg = *c;
    plan->weights = malloc(d * sizeof(double));
    plan->budget = malloc(d * sizeof(uint64_t));
    plan->mbs = malloc(d * sizeof(uint32_t));
    plan->ranks = calloc(d, sizeof(sl_batch_stats));
    if (!plan->weights || !plan->budget || !plan->mbs || !plan->ranks)
        goto out;
    memcpy(plan->weights, c->rank_weights, d * sizeof(double));
    plan->cfg.rank_weights = plan->weights;
    for (uint32_t r = 0; r < d; r++)
        top = c->rank_weights[r] > top ? c->rank_weights[r] : top;
    for (uint32_t r = 0; r < d; r++) {
        uint64_t m;

        q[r] = bt_weight_q(c->rank_weights[r], top);
        qsum += q[r];
        plan->budget[r] = (c->max_tokens * q[r]) >> 32;
        m = ((uint64_t)c->max_batch_size * q[r]) >> 32;
        plan->mbs[r] = m ? (uint32_t)m : 1;
    }
    /* Tokens of the order as the planner counts them (skipped sequences count nothing). */
    for (size_t i = 0; i < n_order; i++) {
        uint32_t l;

        if (order[i] >= n_lengths) {
            err = sl_fail(msg, len, SL_EINVAL,
                          "order[%zu] = %" PRIu64 " is out of range (%zu lengths)", i, order[i],
                          n_lengths);
            goto out;
        }
        l = lengths[order[i]];
        if (l > c->max_seq_len)
            l = c->overlong == SL_BATCH_SKIP ? 0 : c->max_seq_len;
        total += l;
    }
    /* Piece r ends where the running token count is nearest total x (q_0 + .. + q_r) / sum(q). */
    for (uint32_t r = 0; r < d; r++) {
        unsigned __int128 goal;

        cum += q[r];
        goal = (unsigned __int128)total * cum / qsum;
        if (r + 1 == d)
            k = n_order;
        for (; k < n_order; k++) {
            uint32_t l = lengths[order[k]];

            if (l > c->max_seq_len)
                l = c->overlong == SL_BATCH_SKIP ? 0 : c->max_seq_len;
            if (2 * (unsigned __int128)placed + l > 2 * goal)
                break;
            placed += l;
        }
        cut[r + 1] = k;
    }
    for (uint32_t r = 0; r < d; r++) {
        sl_batch_config sc = *c;

        sc.rank_weights = NULL;
        sc.n_rank_weights = 0;
        sc.replicas = 1;
        sc.max_tokens = plan->budget[r];
        sc.max_batch_size = plan->mbs[r];
        if (sc.batch_size_multiple > sc.max_batch_size)
            sc.batch_size_multiple = 1;
        sc.seed = c->seed ^ (0x9e3779b97f4a7c15ull * (r + 1));
        err = sl_batch_plan_new(&sub[r], &sc, lengths, n_lengths, order + cut[r],
                                cut[r + 1] - cut[r], msg, len);
        if (err)
            goto out;
        if (r == 0 ||
            (c->remainder == SL_BATCH_DROP ? sub[r]->per_rank < per : sub[r]->per_rank > per))
            per = sub[r]->per_rank;
        n_idx += sub[r]->n_idx;
    }
    if (c->remainder == SL_BATCH_REPEAT)
        for (uint32_t r = 0; r < d; r++)
            if (sub[r]->per_rank == 0)
                per = 0; /* a rank without a batch has nothing to repeat */
    err = -ENOMEM;
    plan->idx = malloc((n_idx ? n_idx : 1) * sizeof(uint32_t));
    plan->recs = malloc(((size_t)per * d + 1) * sizeof(rec));
    if (!plan->idx || !plan->recs)
        goto out;
    plan->n_idx = n_idx;
    plan->n_recs = (size_t)per * d;
    plan->per_rank = per;
    n_idx = 0;
    for (uint32_t r = 0; r < d; r++) {
        sl_batch_plan *p = sub[r];
        sl_batch_stats *s = &plan->ranks[r];

        memcpy(plan->idx + n_idx, p->idx, p->n_idx * sizeof(uint32_t));
        for (uint64_t i = 0; i < per; i++) {
            rec x = p->recs[i % p->per_rank];

            x.start += (uint32_t)n_idx;
            plan->recs[i * d + r] = x;
            s->batches++;
            s->sequences += x.count;
            s->tokens += x.tokens;
            s->padded_tokens += (uint64_t)x.count * x.max_len;
            if (i >= p->per_rank)
                plan->total.repeated += x.count;
        }
        for (uint64_t i = per; i < p->per_rank; i++)
            plan->total.dropped += p->recs[i].count;
        /* Truncations are counted per piece (repeats and drops aside: close enough for stats). */
        s->truncated = p->total.truncated;
        plan->total.skipped += p->total.skipped;
        n_idx += p->n_idx;
    }
    for (uint32_t r = 0; r < d; r++) {
        sl_batch_stats *s = &plan->ranks[r];

        plan->total.batches += s->batches;
        plan->total.sequences += s->sequences;
        plan->total.tokens += s->tokens;
        plan->total.padded_tokens += s->padded_tokens;
        plan->total.truncated += s->truncated;
    }
    for (uint32_t r = 0; r < d; r++) {
        plan->ranks[r].skipped = plan->total.skipped;
        plan->ranks[r].dropped = plan->total.dropped;
        plan->ranks[r].repeated = plan->total.repeated;
        bt_finish_stats(&plan->ranks[r], plan->budget[r]);
    }
    {
        uint64_t sum_budget = 0;

        for (uint32_t r = 0; r < d; r++)
            sum_budget += plan->budget[r];
        bt_finish_stats(&plan->total, sum_budget / d ? sum_budget / d : 1);
    }
    plan->held = n_idx * sizeof(uint32_t) + plan->n_recs * sizeof(rec) +
                 d * (sizeof(sl_batch_stats) + sizeof(double) + 12);
    plan->peak = plan->held;
    for (uint32_t r = 0; r < d; r++)
        plan->peak += sub[r]->peak;
    *out = plan;
    plan = NULL;
    err = 0;
out:
    if (err == -ENOMEM)
        sl_fail(msg, len, err, "out of memory planning an epoch of %zu samples", n_order);
    if (sub)
        for (uint32_t r = 0; r < d; r++)
            sl_batch_plan_free(sub[r]);
    free(sub);
    free(q);
    free(cut);
    free(ident);
    sl_batch_plan_free(plan);
    return err;
}

int sl_batch_plan_new(sl_batch_plan **out, const sl_batch_config *cfg, const uint32_t *lengths,
                      size_t n_lengths, const uint64_t *order, size_t n_order, char *msg,
                      size_t len)
{
    planner p = {0};
    sl_batch_plan *plan = NULL;
    size_t win, n = 0;
    int err;

    if (msg && len)
        msg[0] = '\0';
    if (!out)
        return sl_fail(msg, len, SL_EINVAL, "out is NULL");
    *out = NULL;
    if ((err = bt_config_resolve(&p.c, cfg, msg, len)) != 0)
        return err;
    if (p.c.n_rank_weights)
        return plan_weighted(out, &p.c, lengths, n_lengths, order, n_order, msg, len);
    if (n_lengths > SL_BATCH_MAX_SEQUENCES)
        return sl_fail(msg, len, SL_ELIMIT, "%zu lengths is over the limit %" PRIu32, n_lengths,
                       SL_BATCH_MAX_SEQUENCES);
    if (!order)
        n_order = n_lengths;
    if (n_order > SL_BATCH_MAX_SEQUENCES)
        return sl_fail(msg, len, SL_ELIMIT, "an order of %zu samples is over the limit %" PRIu32,
                       n_order, SL_BATCH_MAX_SEQUENCES);
    if (!lengths && n_lengths)
        return sl_fail(msg, len, SL_EINVAL, "lengths is NULL");
    p.lengths = lengths;
    p.order = order;
    p.n_order = n_order;
    p.beff = p.c.max_batch_size;
    if (p.c.strategy != SL_BATCH_PACKED)
        p.beff -= p.beff % p.c.batch_size_multiple;
    win = p.c.window == 0 || p.c.window > n_order ? n_order : (size_t)p.c.window;
    p.windowed = p.c.strategy == SL_BATCH_PACKED || bt_carry_mode(&p, win);
    p.n_eff = n_order;
    if (!(p.eff = bt_acct_alloc(&p.a, n_order * sizeof(uint32_t)))) {
        err = -ENOMEM;
        goto out;
    }
    bt_populate(p.eff, n_order * sizeof(uint32_t));
    if (p.windowed)
        p.idx = p.eff; /* sized for every order position until the windows are done */
    if ((err = bt_scan(&p, n_lengths, msg, len)) != 0)
        goto out;

    err = -ENOMEM;
    plan = bt_acct_alloc(&p.a, sizeof(*plan));
    if (!plan)
        goto out;
    memset(plan, 0, sizeof(*plan));
    plan->cfg = p.c;
    plan->ranks = bt_acct_alloc(&p.a, p.c.replicas * sizeof(sl_batch_stats));
    if (!plan->ranks)
        goto out;
    memset(plan->ranks, 0, p.c.replicas * sizeof(sl_batch_stats));
    if (!p.windowed) {
        if (!(p.idx = bt_acct_alloc(&p.a, p.n_idx * sizeof(uint32_t))))
            goto out;
        bt_populate(p.idx, p.n_idx * sizeof(uint32_t));
    }
    if ((err = bt_alloc_scratch(&p, win)) != 0)
        goto out;
    /* A first guess at the batch count keeps the record array from growing many times. */
    p.cap_recs = p.n_idx / (p.beff ? p.beff : 1) + 64;
    if (!(p.recs = bt_acct_alloc(&p.a, p.cap_recs * sizeof(rec)))) {
        err = -ENOMEM;
        goto out;
    }

    if (p.n_idx == 0) {
        /* Nothing kept (every sequence skipped): no windows to sort, and no scratch. */
    } else if (bt_carry_mode(&p, win)) {
        if ((err = bt_plan_carry(&p, win, &n)) != 0)
            goto out;
    } else {
        /* Windows alternate between ascending and descending order, so the longest sequences
         * at the end of one window meet the longest at the start of the next and the greedy
         * cut runs across window boundaries without a half-empty batch at each one. */
        for (size_t a = 0, w = 0; a < n_order; a += win, w++) {
            size_t b = n_order - a < win ? n_order : a + win, seg = n, k;

            if (p.c.strategy == SL_BATCH_PACKED) {
                /* eff is idx here: the window is sorted into scratch (samples in tmp, lengths
                 * in win), then packed back into idx, which never runs ahead of eff. */
                bt_sort_window(&p, p.eff + a, a, b, p.tmp, p.win, p.win, &k, 0);
                n += k;
                if (n > seg && (err = bt_cut_packed(&p, p.win, p.tmp, seg, n)) != 0)
                    goto out;
            } else {
                bt_sort_window(&p, p.eff + a, a, b, p.idx + n, p.eff + n, p.tmp, &k, (int)(w % 2));
                n += k;
            }
        }
        if (p.c.strategy != SL_BATCH_PACKED && (err = bt_cut_greedy(&p, p.eff, 0, n)) != 0)
            goto out;
    }
    bt_free_scratch(&p);
    if (p.windowed && p.n_idx < n_order) {
        /* Skipped samples: give back the order positions idx no longer needs. */
        uint32_t *q = bt_acct_realloc(&p.a, p.idx, n_order * sizeof(uint32_t),
                                      (p.n_idx ? p.n_idx : 1) * sizeof(uint32_t));

        if (q)
            p.idx = q;
    }
    if ((err = bt_arrange(&p, plan)) != 0)
        goto out;
    bt_sum_stats(&p, plan);
    plan->idx = p.idx;
    plan->n_idx = p.n_idx;
    plan->recs = p.recs;
    plan->n_recs = p.n_recs;
    plan->held = p.a.cur;
    plan->peak = p.a.peak;
    p.idx = NULL;
    p.recs = NULL;
    *out = plan;
    plan = NULL;
    err = 0;
out:
    /* The contract promises a message for every failure; the allocation sites leave it to us. */
    if (err == -ENOMEM)
        sl_fail(msg, len, err, "out of memory planning an epoch of %zu samples", n_order);
    bt_free_scratch(&p);
    free(p.idx);
    free(p.recs);
    if (plan) {
        free(plan->ranks);
        free(plan);
    }
    return err;
}

void sl_batch_plan_free(sl_batch_plan *plan)
{
    if (!plan)
        return;
    free(plan->idx);
    free(plan->recs);
    free(plan->ranks);
    free(plan->weights);
    free(plan->budget);
    free(plan->mbs);
    free(plan);
}

uint32_t sl_batch_plan_replicas(const sl_batch_plan *plan)
{
    return plan->cfg.replicas;
}

uint64_t sl_batch_plan_batches_per_rank(const sl_batch_plan *plan)
{
    return plan->per_rank;
}

int sl_batch_plan_get(const sl_batch_plan *plan, uint32_t rank, uint64_t i, sl_batch *out)
{
    const rec *r;

    if (rank >= plan->cfg.replicas || i >= plan->per_rank)
        return SL_EINVAL;
    r = &plan->recs[i * plan->cfg.replicas + rank];
    out->indices = plan->idx + r->start;
    out->count = r->count;
    out->max_len = r->max_len;
    out->tokens = r->tokens;
    out->padded_tokens = (uint64_t)r->count * r->max_len;
    return 0;
}

int sl_batch_plan_stats(const sl_batch_plan *plan, int64_t rank, sl_batch_stats *out)
{
    if (rank < 0) {
        *out = plan->total;
        return 0;
    }
    if (rank >= (int64_t)plan->cfg.replicas)
        return SL_EINVAL;
    *out = plan->ranks[rank];
    return 0;
}

int sl_batch_plan_rank_budget(const sl_batch_plan *plan, uint32_t rank, uint64_t *max_tokens,
                              uint32_t *max_batch_size)
{
    if (rank >= plan->cfg.replicas)
        return SL_EINVAL;
    if (max_tokens)
        *max_tokens = plan->budget ? plan->budget[rank] : plan->cfg.max_tokens;
    if (max_batch_size)
        *max_batch_size = plan->mbs ? plan->mbs[rank] : plan->cfg.max_batch_size;
    return 0;
}

const sl_batch_config *sl_batch_plan_config(const sl_batch_plan *plan)
{
    return &plan->cfg;
}

void sl_batch_plan_memory(const sl_batch_plan *plan, size_t *held, size_t *peak)
{
    if (held)
        *held = plan->held;
    if (peak)
        *peak = plan->peak;
}

/* Visit the rest of `plan` after consumed[r] batches of each rank r: step by step, rank by rank,
 * each batch's samples as planned, written to v when it is not NULL. Returns how many. */
static size_t rest_walk(uint64_t *v, const sl_batch_plan *plan, const uint64_t *consumed)
{
    uint32_t D = sl_batch_plan_replicas(plan);
    uint64_t B = sl_batch_plan_batches_per_rank(plan);
    size_t at = 0;
    sl_batch b;

    for (uint64_t i = 0; i < B; i++)
        for (uint32_t r = 0; r < D; r++) {
            if (i < consumed[r] || sl_batch_plan_get(plan, r, i, &b) != 0)
                continue;
            for (uint32_t k = 0; v && k < b.count; k++)
                v[at + k] = b.indices[k];
            at += b.count;
        }
    return at;
}

int sl_batch_plan_rest(uint64_t **out, size_t *n, const sl_batch_plan *plan,
                       const uint64_t *consumed, size_t n_consumed, char *msg, size_t len)
{
    size_t total;

    *out = NULL;
    *n = 0;
    if (!plan || n_consumed != sl_batch_plan_replicas(plan))
        return sl_fail(msg, len, SL_EINVAL, "%zu consumed counts for a plan of %" PRIu32 " ranks",
                       n_consumed, plan ? sl_batch_plan_replicas(plan) : 0);
    total = rest_walk(NULL, plan, consumed);
    if (!(*out = malloc((total ? total : 1) * sizeof(**out))))
        return sl_fail(msg, len, -ENOMEM, "out of memory for the rest of %zu samples", total);
    rest_walk(*out, plan, consumed);
    *n = total;
    return 0;
}
