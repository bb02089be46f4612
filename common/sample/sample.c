/* Sampling engine: layouts of each partition mode and the streams over them (configs are in
 * config.c, elastic plans in elastic.c). */
#include "internal.h"

#include "err.h"
#include "util/msg.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_torch(const layout *L)
{
    return L->cfg.shuffle == SL_SAMPLE_SHUFFLE_TORCH;
}

static int dup_doubles(double **out, const double *w, size_t n)
{
    *out = NULL;
    if (!n)
        return 0;
    if (!(*out = malloc(n * sizeof(**out))))
        return -ENOMEM;
    memcpy(*out, w, n * sizeof(**out));
    return 0;
}

/* Weighted pieces of the epoch order (class-blind) or the class layout. */
static int layout_weights(layout *L, char *msg, size_t len)
{
    const sl_sample_config *c = &L->cfg;
    uint64_t *q = NULL, *cnt = NULL;
    int err = 0;

    if (c->n_rank_weights) {
        if (!(q = malloc((size_t)L->R * sizeof(*q))))
            goto nomem;
        if ((err = sl_weights_quantize(q, c->rank_weights, L->R, "rank", msg, len)) != 0)
            goto out;
    }
    if (c->classes != SL_SAMPLE_CLASSES_NONE) {
        if (!(L->st = calloc(1, sizeof(*L->st))))
            goto nomem;
        err = sl_strat_init(L->st, c, L->R, q, msg, len);
        if (err) {
            free(L->st);
            L->st = NULL;
        }
        goto out;
    }
    if (!q)
        goto out;
    cnt = malloc((size_t)L->R * sizeof(*cnt));
    L->rpre = malloc(((size_t)L->R + 1) * sizeof(*L->rpre));
    if (!cnt || !L->rpre || sl_lr_split(cnt, L->n, q, L->R, c->drop_last))
        goto nomem;
    L->rpre[0] = 0;
    for (uint32_t r = 0; r < L->R; r++)
        L->rpre[r + 1] = L->rpre[r] + cnt[r];
    goto out;
nomem:
    err = sl_fail(msg, len, -ENOMEM, "out of memory");
out:
    free(q);
    free(cnt);
    return err;
}

/* Sizes, weighted pieces and the class layout of a checked config; no shuffle permutation is
 * built. On failure the layout is closed. */
int smp_layout_init(layout *L, const sl_sample_config *cfg, char *msg, size_t len)
{
    uint32_t dummy;
    int err;

    memset(L, 0, sizeof(*L));
    L->cfg = *cfg;
    if (dup_doubles(&L->rw, cfg->rank_weights, cfg->n_rank_weights) ||
        dup_doubles(&L->cw, cfg->class_weights, cfg->n_class_weights)) {
        smp_layout_close(L);
        return sl_fail(msg, len, -ENOMEM, "out of memory");
    }
    L->cfg.rank_weights = L->rw;
    L->cfg.class_weights = L->cw;
    L->n = cfg->samples;
    smp_dp_of(&dummy, &L->R, cfg);
    switch (cfg->partition) {
    case SL_SAMPLE_INTERLEAVED:
        L->per = cfg->drop_last ? L->n / L->R : L->n / L->R + (L->n % L->R != 0);
        break;
    case SL_SAMPLE_CONTIGUOUS:
        L->blk = L->n / L->R;
        L->last_len = cfg->drop_last ? L->blk : L->n - (uint64_t)(L->R - 1) * L->blk;
        break;
    case SL_SAMPLE_CHUNKED:
        L->C = cfg->chunk_size;
        L->kfull = L->n / L->C;
        if (cfg->drop_last) {
            L->kuse = L->kfull / L->R * L->R;
            L->rem = 0;
        } else {
            L->rem = L->n % L->C;
            L->kuse = L->kfull + (L->rem != 0);
        }
        break;
    }
    if ((err = layout_weights(L, msg, len)) != 0)
        smp_layout_close(L);
    return err;
}

uint64_t smp_layout_count(const layout *L, uint32_t r)
{
    uint64_t cnt;

    if (L->st)
        return sl_strat_count(L->st, r);
    if (L->rpre)
        return L->rpre[r + 1] - L->rpre[r];
    switch (L->cfg.partition) {
    case SL_SAMPLE_INTERLEAVED:
        return L->per;
    case SL_SAMPLE_CONTIGUOUS:
        return r + 1 == L->R ? L->last_len : L->blk;
    default:
        cnt = L->kuse > r ? (L->kuse - 1 - r) / L->R + 1 : 0;
        if (L->rem && L->kfull % L->R == r)
            return (cnt - 1) * L->C + L->rem;
        return cnt * L->C;
    }
}

static int torch_table(uint32_t **out, uint64_t n, uint64_t seed)
{
    *out = malloc((n ? n : 1) * sizeof(uint32_t));
    if (!*out)
        return -ENOMEM;
    sl_torch_randperm(*out, n, seed);
    return 0;
}

/* Build the permutations a layout needs: for every rank (rank < 0) or only for `rank`. */
int smp_layout_perms(layout *L, int64_t rank)
{
    const sl_sample_config *c = &L->cfg;
    uint64_t tseed = c->seed + c->epoch;
    int err = 0;

    L->order.mode = c->shuffle;
    if (c->partition == SL_SAMPLE_INTERLEAVED)
        L->order.n = L->n;
    else if (c->partition == SL_SAMPLE_CHUNKED)
        L->order.n = L->kfull;
    if (L->order.mode == SL_SAMPLE_SHUFFLE_FEISTEL)
        sl_feistel_init(&L->order.f, L->order.n, c->seed, c->epoch, 0);
    if (!is_torch(L))
        return 0;
    if (L->order.n) {
        if ((err = torch_table(&L->tab_order, L->order.n, tseed)) != 0)
            return err;
        L->order.tab = L->tab_order;
    }
    /* Within-block and within-chunk orders in torch mode: torch.randperm(length) with the
     * epoch's generator seed, the same for every block or chunk of one length. */
    if (c->partition == SL_SAMPLE_CONTIGUOUS) {
        int need_last = rank < 0 || rank + 1 == (int64_t)L->R;
        int need_blk = rank < 0 || rank + 1 < (int64_t)L->R;
        if (need_blk && (err = torch_table(&L->tab_a, L->blk, tseed)) != 0)
            return err;
        if (need_last && (err = torch_table(&L->tab_b, L->last_len, tseed)) != 0)
            return err;
    } else if (c->partition == SL_SAMPLE_CHUNKED) {
        if (L->kfull && (err = torch_table(&L->tab_a, L->C, tseed)) != 0)
            return err;
        if (L->rem && (err = torch_table(&L->tab_b, L->rem, tseed)) != 0)
            return err;
    }
    return 0;
}

void smp_layout_close(layout *L)
{
    free(L->tab_order);
    free(L->tab_a);
    free(L->tab_b);
    free(L->rpre);
    free(L->rw);
    free(L->cw);
    if (L->st)
        sl_strat_close(L->st);
    free(L->st);
    L->tab_order = L->tab_a = L->tab_b = NULL;
    L->rpre = NULL;
    L->rw = L->cw = NULL;
    L->st = NULL;
}

/* The permutation within contiguous block or chunk `id` of length `n`. */
static void within_perm(sl_perm *p, const layout *L, uint64_t id, uint64_t n, int last)
{
    p->n = n;
    p->mode = L->cfg.shuffle;
    p->tab = last ? L->tab_b : L->tab_a;
    if (p->mode == SL_SAMPLE_SHUFFLE_FEISTEL)
        sl_feistel_init(&p->f, n, L->cfg.seed, L->cfg.epoch, 1 + id);
}

/* Index at position i < count of dp rank r's share. */
static uint64_t layout_at(const layout *L, uint32_t r, uint64_t i)
{
    sl_perm w;
    uint64_t p, jj, off, j, id;

    if (L->st)
        return sl_strat_at(L->st, r, NULL, i);
    if (L->rpre && L->cfg.partition == SL_SAMPLE_INTERLEAVED)
        return sl_perm_at(&L->order, L->rpre[r] + i);
    if (L->rpre) {
        within_perm(&w, L, r, L->rpre[r + 1] - L->rpre[r], 0);
        return L->rpre[r] + sl_perm_at(&w, i);
    }
    switch (L->cfg.partition) {
    case SL_SAMPLE_INTERLEAVED:
        p = r + i * L->R;
        if (p >= L->n)
            p %= L->n; /* torch's padding: wrap around to the start of the order */
        return sl_perm_at(&L->order, p);
    case SL_SAMPLE_CONTIGUOUS:
        if (r + 1 == L->R) {
            within_perm(&w, L, r, L->last_len, 1);
        } else {
            within_perm(&w, L, r, L->blk, 0);
        }
        return (uint64_t)r * L->blk + sl_perm_at(&w, i);
    default:
        jj = i / L->C;
        off = i % L->C;
        j = r + jj * L->R;
        if (j < L->kfull) {
            id = sl_perm_at(&L->order, j);
            within_perm(&w, L, id, L->C, 0);
        } else {
            id = L->kfull;
            within_perm(&w, L, id, L->rem, 1);
        }
        return id * L->C + sl_perm_at(&w, off);
    }
}

/* Weighted class-blind shares: one piece of the epoch order, or one block. */
static void weighted_fill(const layout *L, uint32_t r, uint64_t pos, uint64_t *out, size_t m)
{
    uint64_t base = L->rpre[r];
    const sl_perm *p = &L->order;
    sl_perm w;

    if (L->cfg.partition == SL_SAMPLE_CONTIGUOUS) {
        within_perm(&w, L, r, L->rpre[r + 1] - base, 0);
        p = &w;
        if (p->mode == SL_SAMPLE_SHUFFLE_FEISTEL) {
            sl_feistel_map_seq(&p->f, out, pos, 1, m);
            for (size_t k = 0; k < m; k++)
                out[k] += base;
            return;
        }
        for (size_t k = 0; k < m; k++)
            out[k] = base + sl_perm_at(p, pos + k);
        return;
    }
    if (p->mode == SL_SAMPLE_SHUFFLE_FEISTEL) {
        sl_feistel_map_seq(&p->f, out, base + pos, 1, m);
        return;
    }
    for (size_t k = 0; k < m; k++)
        out[k] = sl_perm_at(p, base + pos + k);
}

/* Fast paths: m indices from position pos of dp rank r's share (cnt: a stratified stream's
 * node counts or NULL). */
static void layout_fill(const layout *L, uint32_t r, uint64_t pos, uint64_t *out, size_t m,
                        const uint64_t *ncnt)
{
    sl_perm w;
    size_t k = 0;

    if (L->st) {
        sl_strat_fill(out, L->st, r, ncnt, pos, m);
        return;
    }
    if (L->rpre) {
        weighted_fill(L, r, pos, out, m);
        return;
    }
    if (L->cfg.partition == SL_SAMPLE_INTERLEAVED) {
        uint64_t p = r + pos * L->R, n = L->n, R = L->R;
        if (L->order.mode == SL_SAMPLE_SHUFFLE_FEISTEL) {
            /* Positions below n form an arithmetic sequence the network reads directly; only
             * the padding tail wraps around. */
            if (p < n) {
                uint64_t run = (n - p + R - 1) / R;
                k = run < m ? (size_t)run : m;
                sl_feistel_map_seq(&L->order.f, out, p, R, k);
                p += k * R;
            }
            for (size_t j = k; j < m; j++, p += R)
                out[j] = p % n;
            sl_feistel_map(&L->order.f, out + k, m - k);
            return;
        }
        for (; k < m && p < n; k++, p += R)
            out[k] = sl_perm_at(&L->order, p);
        for (; k < m; k++, p += R)
            out[k] = sl_perm_at(&L->order, p % n);
        return;
    }
    if (L->cfg.partition == SL_SAMPLE_CONTIGUOUS) {
        uint64_t base = (uint64_t)r * L->blk;
        within_perm(&w, L, r, r + 1 == L->R ? L->last_len : L->blk, r + 1 == L->R);
        if (w.mode == SL_SAMPLE_SHUFFLE_FEISTEL) {
            sl_feistel_map_seq(&w.f, out, pos, 1, m);
            for (; k < m; k++)
                out[k] += base;
            return;
        }
        for (; k < m; k++)
            out[k] = base + sl_perm_at(&w, pos + k);
        return;
    }
    /* Chunked: one permutation set-up per chunk. */
    while (k < m) {
        uint64_t i = pos + k, jj = i / L->C, off = i % L->C, j = r + jj * L->R, id, len;
        if (j < L->kfull) {
            id = sl_perm_at(&L->order, j);
            len = L->C;
        } else {
            id = L->kfull;
            len = L->rem;
        }
        within_perm(&w, L, id, len, j >= L->kfull);
        if (w.mode == SL_SAMPLE_SHUFFLE_FEISTEL) {
            size_t cnt = len - off < m - k ? (size_t)(len - off) : m - k;
            sl_feistel_map_seq(&w.f, out + k, off, 1, cnt);
            for (size_t e = k + cnt; k < e; k++)
                out[k] += id * L->C;
            continue;
        }
        for (; k < m && off < len; k++, off++)
            out[k] = id * L->C + sl_perm_at(&w, off);
    }
}

int sl_sample_share_count(uint64_t *out, const sl_sample_config *cfg, char *msg, size_t len)
{
    layout L;
    uint32_t r, R;
    int err = sl_sample_config_check(cfg, msg, len);

    if (err)
        return err;
    smp_dp_of(&r, &R, cfg);
    if ((err = smp_layout_init(&L, cfg, msg, len)) != 0)
        return err;
    *out = smp_layout_count(&L, r);
    smp_layout_close(&L);
    return 0;
}

int sl_sample_feistel_at(uint64_t *out, uint64_t n, uint64_t seed, uint64_t epoch, uint64_t pos)
{
    sl_feistel f;

    if (!out || n == 0 || n > SL_SAMPLE_MAX_N || pos >= n)
        return SL_EINVAL;
    sl_feistel_init(&f, n, seed, epoch, 0);
    *out = sl_feistel_at(&f, pos);
    return 0;
}

int sl_sample_epoch_order(uint64_t *out, uint64_t n, int shuffle_mode, uint64_t seed,
                          uint64_t epoch)
{
    sl_feistel f;
    uint32_t *tab;

    if (!out || n == 0 || epoch > SL_SAMPLE_EPOCH_MAX || seed > UINT64_MAX - epoch)
        return SL_EINVAL;
    if (n > SL_SAMPLE_MAX_N)
        return SL_ELIMIT;
    switch (shuffle_mode) {
    case SL_SAMPLE_SHUFFLE_NONE:
        for (uint64_t i = 0; i < n; i++)
            out[i] = i;
        return 0;
    case SL_SAMPLE_SHUFFLE_TORCH:
        if (n >= SL_SAMPLE_TORCH_MAX_N)
            return SL_ELIMIT;
        if (!(tab = malloc(n * sizeof(*tab))))
            return -ENOMEM;
        sl_torch_randperm(tab, n, seed + epoch);
        for (uint64_t i = 0; i < n; i++)
            out[i] = tab[i];
        free(tab);
        return 0;
    case SL_SAMPLE_SHUFFLE_FEISTEL:
        sl_feistel_init(&f, n, seed, epoch, 0);
        sl_feistel_map_seq(&f, out, 0, 1, n);
        return 0;
    default:
        return SL_EINVAL;
    }
}

int sl_sample_plan_order(uint64_t **out, uint64_t *n, const sl_sample_config *cfg, uint64_t max,
                         char *msg, size_t len)
{
    sl_sample_config one = *cfg;
    sl_sample *s = NULL;
    uint64_t cnt = cfg->samples, *v = NULL;
    int err = 0;

    *out = NULL;
    *n = 0;
    /* The whole epoch as one rank reads it: the class layout spreads every class evenly along
     * it, and whatever cuts it into consecutive pieces (batches, windows) keeps the proportions. */
    one.replicas = 1;
    one.rank = 0;
    memset(&one.mesh, 0, sizeof(one.mesh));
    one.rank_weights = NULL;
    one.n_rank_weights = 0;
    one.drop_last = false;
    if (one.classes != SL_SAMPLE_CLASSES_NONE) {
        if ((err = sl_sample_new(&s, &one, msg, len)) != 0)
            return err;
        cnt = sl_sample_count(s);
    } else if ((err = sl_sample_config_check(&one, msg, len)) != 0) {
        return err;
    }
    if (cnt > max) {
        err = sl_fail(msg, len, SL_ELIMIT,
                      "the epoch's order holds %" PRIu64 " samples, over the limit %" PRIu64, cnt,
                      max);
        goto out;
    }
    if (!(v = malloc((cnt ? cnt : 1) * sizeof(*v)))) {
        err = sl_fail(msg, len, -ENOMEM, "out of memory for an order of %" PRIu64 " samples", cnt);
        goto out;
    }
    err = s ? sl_sample_fill(v, s, 0, (size_t)cnt)
            : sl_sample_epoch_order(v, cnt, (int)one.shuffle, one.seed, one.epoch);
    if (err) {
        sl_fail(msg, len, err, "epoch order failed: %s", sl_strerror(err));
        free(v);
        goto out;
    }
    *out = v;
    *n = cnt;
out:
    sl_sample_free(s);
    return err;
}

int sl_sample_new(sl_sample **out, const sl_sample_config *cfg, char *msg, size_t len)
{
    sl_sample *s = NULL;
    uint32_t R;
    int err;

    *out = NULL;
    if ((err = sl_sample_config_check(cfg, msg, len)) != 0)
        goto out;
    if (!(s = calloc(1, sizeof(*s)))) {
        err = sl_fail(msg, len, -ENOMEM, "out of memory");
        goto out;
    }
    if ((err = smp_layout_init(&s->own, cfg, msg, len)) != 0)
        goto out;
    smp_dp_of(&s->r, &R, cfg);
    if ((err = smp_layout_perms(&s->own, s->r)) != 0) {
        sl_fail(msg, len, err, "out of memory for the torch permutation of %" PRIu64 " samples",
                cfg->samples);
        goto out;
    }
    s->L = &s->own;
    s->count = smp_layout_count(s->L, s->r);
    if (s->own.st) {
        if (!(s->cnt = malloc(((size_t)s->own.st->ctree.nnode + 1) * sizeof(*s->cnt)))) {
            err = sl_fail(msg, len, -ENOMEM, "out of memory");
            goto out;
        }
        sl_strat_counts(s->cnt, s->own.st, s->r);
    }
    *out = s;
    s = NULL;
out:
    sl_sample_free(s);
    return err;
}

uint64_t sl_sample_count(const sl_sample *s)
{
    return s->count;
}

uint64_t sl_sample_pos(const sl_sample *s)
{
    return s->pos;
}

int sl_sample_seek(sl_sample *s, uint64_t pos)
{
    if (!s || pos > s->count)
        return SL_EINVAL;
    s->pos = pos;
    return 0;
}

/* Position in the rest of level lv of new rank s's i-th index (i < its count). */
static uint64_t level_pos(const elevel *lv, uint32_t s, uint64_t i)
{
    uint64_t q = lv->T / lv->new_R, rm = lv->T % lv->new_R, v;

    if (lv->woff)
        return lv->woff[s] + i;
    if (lv->interleave)
        v = s + i * lv->new_R;
    else if (lv->cut)
        v = s * q + i;
    else
        v = s * q + (s < rm ? s : rm) + i;
    if (v >= lv->T)
        v %= lv->T; /* padding wraps around to the start of the rest */
    return v;
}

uint64_t smp_level_count(const elevel *lv, uint32_t s)
{
    uint64_t q = lv->T / lv->new_R, rm = lv->T % lv->new_R;

    if (lv->woff)
        return lv->woff[s + 1] - lv->woff[s];
    if (lv->T == 0)
        return 0;
    if (lv->pad)
        return q + (rm != 0);
    if (lv->cut)
        return q;
    return q + (s < rm);
}

/* New rank s's indices that are not padding. */
uint64_t smp_level_real(const elevel *lv, uint32_t s)
{
    if (lv->woff || !lv->pad)
        return smp_level_count(lv, s);
    if (lv->interleave)
        return lv->T > s ? (lv->T - s - 1) / lv->new_R + 1 : 0;
    return lv->T / lv->new_R + (s < lv->T % lv->new_R);
}

/* Index at position v of level k's rest: down the levels to the epoch's layout. */
uint64_t smp_rest_at(const sl_sample_elastic *e, uint32_t k, uint64_t v)
{
    for (;;) {
        const elevel *lv = &e->lev[k];
        uint32_t lo = 0, hi = lv->old_R; /* off[lo] <= v < off[hi] */
        uint64_t i;
        while (hi - lo > 1) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (lv->off[mid] <= v)
                lo = mid;
            else
                hi = mid;
        }
        i = lv->start[lo] + (v - lv->off[lo]);
        if (k == 0)
            return layout_at(&e->L, lo, i);
        k--;
        v = level_pos(&e->lev[k], lo, i);
    }
}

/* Index at position i of rank s of level k's shares. */
static uint64_t level_at(const sl_sample_elastic *e, uint32_t k, uint32_t s, uint64_t i)
{
    return smp_rest_at(e, k, level_pos(&e->lev[k], s, i));
}

int sl_sample_fill(uint64_t *out, const sl_sample *s, uint64_t pos, size_t m)
{
    if (!s || (m && !out) || pos > s->count || m > s->count - pos)
        return SL_EINVAL;
    if (s->e) {
        for (size_t k = 0; k < m; k++)
            out[k] = level_at(s->e, s->e->nlev - 1, s->r, pos + k);
        return 0;
    }
    layout_fill(s->L, s->r, pos, out, m, s->cnt);
    return 0;
}

int sl_sample_next(uint64_t *out, size_t *got, sl_sample *s, size_t max)
{
    uint64_t left;
    size_t m;
    int err;

    if (!got || !s)
        return SL_EINVAL;
    left = s->count - s->pos;
    m = left < max ? (size_t)left : max;
    if ((err = sl_sample_fill(out, s, s->pos, m)) != 0)
        return err;
    s->pos += m;
    *got = m;
    return 0;
}

void sl_sample_free(sl_sample *s)
{
    if (!s)
        return;
    smp_layout_close(&s->own);
    free(s->cnt);
    free(s);
}
