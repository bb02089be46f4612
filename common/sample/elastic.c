/* Sampling engine: elastic plans, the rest of an epoch redistributed over chained resizes. */
#include "internal.h"

#include "err.h"
#include "util/msg.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void elastic_free_levels(elevel *lev, uint32_t n)
{
    for (uint32_t k = 0; lev && k < n; k++) {
        free(lev[k].start);
        free(lev[k].off);
        free(lev[k].woff);
    }
    free(lev);
}

/* Append the level of one resize to e, whose levels array has room for it. */
static int elastic_add_level(sl_sample_elastic *e, const sl_sample_resize *st, char *msg,
                             size_t len)
{
    elevel *prev = e->nlev ? &e->lev[e->nlev - 1] : NULL, *lv = &e->lev[e->nlev];
    uint32_t old_R = prev ? prev->new_R : e->L.R;
    uint64_t *q = NULL;
    int err = 0;

    memset(lv, 0, sizeof(*lv));
    if (!st || (st->n_consumed && !st->consumed))
        return sl_fail(msg, len, SL_EINVAL, "no consumed counts");
    if (st->new_replicas == 0)
        return sl_fail(msg, len, SL_EINVAL,
                       "new replicas 0: the world must hold at least one rank");
    if (st->n_consumed != old_R)
        return sl_fail(msg, len, SL_EINVAL,
                       "%zu consumed counts for an old dp world of %" PRIu32 " ranks",
                       st->n_consumed, old_R);
    if (st->n_weights && st->n_weights != st->new_replicas)
        return sl_fail(msg, len, SL_EINVAL,
                       "%zu rank weights for a new dp world of %" PRIu32 " ranks", st->n_weights,
                       st->new_replicas);
    lv->old_R = old_R;
    lv->new_R = st->new_replicas;
    e->nlev++; /* from here lv is freed with the plan */
    lv->start = malloc((size_t)old_R * sizeof(*lv->start));
    lv->off = malloc(((size_t)old_R + 1) * sizeof(*lv->off));
    if (!lv->start || !lv->off)
        return sl_fail(msg, len, -ENOMEM, "out of memory");
    lv->off[0] = 0;
    for (uint32_t r = 0; r < old_R; r++) {
        /* The first resize keeps the epoch's padding as part of what is left (as before
         * chaining existed); later ones pass on only real indices. */
        uint64_t cnt = prev ? smp_level_count(prev, r) : smp_layout_count(&e->L, r);
        uint64_t real = prev ? smp_level_real(prev, r) : cnt;
        if (st->consumed[r] > cnt)
            return sl_fail(msg, len, SL_EINVAL,
                           "consumed %" PRIu64 " for old rank %" PRIu32
                           " exceeds its share of %" PRIu64,
                           st->consumed[r], r, cnt);
        lv->start[r] = st->consumed[r];
        lv->off[r + 1] = lv->off[r] + (real > st->consumed[r] ? real - st->consumed[r] : 0);
    }
    lv->T = lv->off[old_R];
    lv->interleave = e->L.cfg.partition == SL_SAMPLE_INTERLEAVED;
    /* Equal counts, so that DDP ranks take the same number of steps after a resize whatever
     * their batch size (steps recorded before this rule keep theirs: uneven). */
    lv->pad = !e->L.cfg.drop_last && (e->L.cfg.partition != SL_SAMPLE_CHUNKED || !st->uneven);
    lv->cut = e->L.cfg.drop_last && !st->uneven;
    if (!st->n_weights)
        return 0;
    q = malloc(st->n_weights * sizeof(*q));
    lv->woff = malloc((st->n_weights + 1) * sizeof(*lv->woff));
    if (!q || !lv->woff) {
        err = sl_fail(msg, len, -ENOMEM, "out of memory");
        goto out;
    }
    if ((err = sl_weights_quantize(q, st->weights, st->n_weights, "rank", msg, len)) != 0)
        goto out;
    if ((err = sl_lr_split(lv->woff + 1, lv->T, q, st->n_weights, 0)) != 0) {
        err = sl_fail(msg, len, err, "out of memory");
        goto out;
    }
    lv->woff[0] = 0;
    for (size_t s = 0; s < st->n_weights; s++)
        lv->woff[s + 1] += lv->woff[s];
out:
    free(q);
    return err;
}

/* A plan with the epoch's layout (every rank) and room for n_lev levels. */
static int elastic_alloc(sl_sample_elastic **out, const sl_sample_config *epoch_cfg, size_t n_lev,
                         char *msg, size_t len)
{
    sl_sample_elastic *e;
    sl_sample_config cfg;
    int err;

    *out = NULL;
    if (!epoch_cfg)
        return sl_fail(msg, len, SL_EINVAL, "no config");
    cfg = *epoch_cfg;
    cfg.rank = 0; /* the plan covers every rank */
    if ((err = sl_sample_config_check(&cfg, msg, len)) != 0)
        return err;
    if (!(e = calloc(1, sizeof(*e))) || !(e->lev = calloc(n_lev ? n_lev : 1, sizeof(*e->lev)))) {
        free(e);
        return sl_fail(msg, len, -ENOMEM, "out of memory");
    }
    if ((err = smp_layout_init(&e->L, &cfg, msg, len)) != 0) {
        sl_sample_elastic_free(e);
        return err;
    }
    if ((err = smp_layout_perms(&e->L, -1)) != 0) {
        sl_sample_elastic_free(e);
        return sl_fail(msg, len, err,
                       "out of memory for the torch permutation of %" PRIu64 " samples",
                       cfg.samples);
    }
    *out = e;
    return 0;
}

int sl_sample_elastic_chain(sl_sample_elastic **out, const sl_sample_config *epoch_cfg,
                            const sl_sample_resize *steps, size_t n_steps, char *msg, size_t len)
{
    sl_sample_elastic *e = NULL;
    int err;

    *out = NULL;
    if (n_steps == 0 || !steps)
        return sl_fail(msg, len, SL_EINVAL, "no resize steps");
    if ((err = elastic_alloc(&e, epoch_cfg, n_steps, msg, len)) != 0)
        return err;
    for (size_t k = 0; k < n_steps && !err; k++)
        err = elastic_add_level(e, &steps[k], msg, len);
    if (err)
        sl_sample_elastic_free(e);
    else
        *out = e;
    return err;
}

int sl_sample_elastic_extend(sl_sample_elastic **out, const sl_sample_elastic *prev,
                             const sl_sample_resize *step, char *msg, size_t len)
{
    sl_sample_elastic *e = NULL;
    int err;

    *out = NULL;
    if (!prev)
        return sl_fail(msg, len, SL_EINVAL, "no elastic plan");
    if ((err = elastic_alloc(&e, &prev->L.cfg, (size_t)prev->nlev + 1, msg, len)) != 0)
        return err;
    for (uint32_t k = 0; k < prev->nlev; k++) {
        const elevel *p = &prev->lev[k];
        elevel *lv = &e->lev[k];
        *lv = *p;
        lv->start = malloc((size_t)p->old_R * sizeof(*lv->start));
        lv->off = malloc(((size_t)p->old_R + 1) * sizeof(*lv->off));
        lv->woff = p->woff ? malloc(((size_t)p->new_R + 1) * sizeof(*lv->woff)) : NULL;
        e->nlev++;
        if (!lv->start || !lv->off || (p->woff && !lv->woff)) {
            sl_sample_elastic_free(e);
            return sl_fail(msg, len, -ENOMEM, "out of memory");
        }
        memcpy(lv->start, p->start, (size_t)p->old_R * sizeof(*lv->start));
        memcpy(lv->off, p->off, ((size_t)p->old_R + 1) * sizeof(*lv->off));
        if (p->woff)
            memcpy(lv->woff, p->woff, ((size_t)p->new_R + 1) * sizeof(*lv->woff));
    }
    if ((err = elastic_add_level(e, step, msg, len)) != 0)
        sl_sample_elastic_free(e);
    else
        *out = e;
    return err;
}

int sl_sample_elastic_new(sl_sample_elastic **out, const sl_sample_config *epoch_cfg,
                          const uint64_t *consumed, size_t n_consumed, uint32_t new_replicas,
                          char *msg, size_t len)
{
    sl_sample_resize step = {consumed, n_consumed, new_replicas, NULL, 0, false};

    *out = NULL;
    if (!epoch_cfg || (n_consumed && !consumed))
        return sl_fail(msg, len, SL_EINVAL, "no config or consumed counts");
    return sl_sample_elastic_chain(out, epoch_cfg, &step, 1, msg, len);
}

uint64_t sl_sample_elastic_remaining(const sl_sample_elastic *e)
{
    return e->lev[e->nlev - 1].T;
}

uint32_t sl_sample_elastic_world(const sl_sample_elastic *e)
{
    return e->lev[e->nlev - 1].new_R;
}

/* What level lv's cut leaves out: the last T mod new_R positions of its rest. */
static uint64_t level_left_out(const elevel *lv)
{
    return lv->cut && !lv->woff ? lv->T % lv->new_R : 0;
}

uint64_t sl_sample_elastic_left_out_count(const sl_sample_elastic *e)
{
    uint64_t n = 0;

    for (uint32_t k = 0; k < e->nlev; k++)
        n += level_left_out(&e->lev[k]);
    return n;
}

uint64_t sl_sample_elastic_padded(const sl_sample_elastic *e)
{
    const elevel *lv = &e->lev[e->nlev - 1];
    uint64_t per = lv->T / lv->new_R + (lv->T % lv->new_R != 0);

    return lv->pad && !lv->woff && lv->T ? per * lv->new_R - lv->T : 0;
}

int sl_sample_elastic_left_out(uint64_t *out, const sl_sample_elastic *e, uint64_t i)
{
    if (!out || !e)
        return SL_EINVAL;
    for (uint32_t k = 0; k < e->nlev; k++) {
        const elevel *lv = &e->lev[k];
        uint64_t n = level_left_out(lv);
        if (i < n) {
            /* The cut keeps positions [0, T - n) of the rest: the left out are its tail. */
            *out = smp_rest_at(e, k, lv->T - n + i);
            return 0;
        }
        i -= n;
    }
    return SL_EINVAL;
}

int sl_sample_new_elastic(sl_sample **out, const sl_sample_elastic *e, uint32_t new_rank, char *msg,
                          size_t len)
{
    sl_sample *s;

    *out = NULL;
    if (!e)
        return sl_fail(msg, len, SL_EINVAL, "no elastic plan");
    if (new_rank >= sl_sample_elastic_world(e))
        return sl_fail(msg, len, SL_EINVAL, "rank %" PRIu32 " out of range [0, %" PRIu32 ")",
                       new_rank, sl_sample_elastic_world(e));
    if (!(s = calloc(1, sizeof(*s))))
        return sl_fail(msg, len, -ENOMEM, "out of memory");
    s->L = &e->L;
    s->e = e;
    s->r = new_rank;
    s->count = smp_level_count(&e->lev[e->nlev - 1], new_rank);
    *out = s;
    return 0;
}

int sl_sample_elastic_lockstep(sl_sample_elastic **out, uint64_t *count, uint64_t per_rank,
                               uint32_t d0, bool pad, const sl_sample_resize *steps, size_t n_steps,
                               char *msg, size_t len)
{
    sl_sample_config pc;
    sl_sample_elastic *e = NULL;
    uint64_t *shares = NULL, low = 0;
    uint32_t world = d0;
    int err = 0;

    *out = NULL;
    *count = 0;
    sl_sample_config_init(&pc);
    pc.replicas = d0;
    pc.partition = SL_SAMPLE_INTERLEAVED;
    pc.shuffle = SL_SAMPLE_SHUFFLE_NONE;
    pc.drop_last = !pad;
    if (d0 == 0 || per_rank == 0 || per_rank > SL_SAMPLE_MAX_N / d0 || n_steps == 0)
        return sl_fail(msg, len, SL_EINVAL,
                       "lockstep plan of %" PRIu64 " per rank over %" PRIu32
                       " ranks and %zu resizes: each must be at least 1",
                       per_rank, d0, n_steps);
    pc.samples = per_rank * d0;
    for (size_t k = 0; k < n_steps && !err; k++) {
        sl_sample_resize st = steps[k];
        uint64_t *cons;
        sl_sample_elastic *next = NULL;

        if (st.n_consumed != world) {
            err = sl_fail(msg, len, SL_EINVAL,
                          "resize %zu: %zu consumed counts for a world of %" PRIu32 " ranks", k + 1,
                          st.n_consumed, world);
            break;
        }
        if (!(cons = malloc(8 * (st.n_consumed ? st.n_consumed : 1)))) {
            err = sl_fail(msg, len, -ENOMEM, "out of memory");
            break;
        }
        for (size_t r = 0; r < st.n_consumed; r++) {
            uint64_t cap = k == 0 ? per_rank : shares[r];
            cons[r] = st.consumed[r] < cap ? st.consumed[r] : cap;
        }
        st.consumed = cons;
        st.weights = NULL; /* the units keep the sizes they were planned with */
        st.n_weights = 0;
        /* Every rank reads the smallest count below, and a unit the others' share held beyond
         * it stays in the rest the next resize redistributes. */
        st.uneven = true;
        err = k == 0 ? sl_sample_elastic_chain(&next, &pc, &st, 1, msg, len)
                     : sl_sample_elastic_extend(&next, e, &st, msg, len);
        free(cons);
        sl_sample_elastic_free(e);
        e = next;
        free(shares);
        shares = NULL;
        if (err)
            break;
        world = st.new_replicas;
        if (!(shares = calloc(world, sizeof(*shares)))) {
            err = sl_fail(msg, len, -ENOMEM, "out of memory");
            break;
        }
        low = UINT64_MAX;
        for (uint32_t d = 0; d < world && !err; d++) {
            sl_sample *s = NULL;
            if ((err = sl_sample_new_elastic(&s, e, d, msg, len)) == 0) {
                shares[d] = sl_sample_count(s);
                low = shares[d] < low ? shares[d] : low;
            }
            sl_sample_free(s);
        }
        /* Every rank reads `low` of its share; the next level sees those as the shares. */
        for (uint32_t d = 0; d < world; d++)
            shares[d] = low;
    }
    free(shares);
    if (err) {
        sl_sample_elastic_free(e);
        return err;
    }
    *out = e;
    *count = low;
    return 0;
}

void sl_sample_elastic_free(sl_sample_elastic *e)
{
    if (!e)
        return;
    smp_layout_close(&e->L);
    elastic_free_levels(e->lev, e->nlev);
    free(e);
}
