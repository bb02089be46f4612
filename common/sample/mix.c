/* The interleave tree (internal.h, sl_mix_*): a binary tree over leaves whose nodes lay their
 * positions out like Bresenham's line, built over contiguous leaf ranges (the rank tree of
 * weighted shares) or over balanced sets of items (the class tree of stratified shares). Used by
 * strat.c; see docs/sampling.md "Stratified shares". */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint64_t bres(uint64_t s, uint64_t kl, uint64_t k)
{
    return (uint64_t)(((unsigned __int128)s * kl + k / 2) / k);
}

typedef struct mix_build {
    sl_mix *t;
    const uint64_t *pre;
} mix_build;

/* Split point of [a, b) (b - a >= 2) where the two sides' weights are closest. */
static uint32_t mix_split(const uint64_t *pre, uint32_t a, uint32_t b)
{
    uint64_t half = pre[a] + (pre[b] - pre[a]) / 2;
    uint32_t lo = a + 1, hi = b - 1; /* the first m in [a+1, b-1] with pre[m] >= half */

    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (pre[mid] >= half)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (lo > a + 1) {
        uint64_t big_lo = pre[lo] - pre[a] > pre[b] - pre[lo] ? pre[lo] - pre[a] : pre[b] - pre[lo];
        uint64_t m1 = lo - 1;
        uint64_t big_m1 = pre[m1] - pre[a] > pre[b] - pre[m1] ? pre[m1] - pre[a] : pre[b] - pre[m1];
        if (big_m1 < big_lo)
            lo = (uint32_t)m1;
    }
    return lo;
}

static uint32_t mix_node(mix_build *mb, uint32_t a, uint32_t b, uint32_t parent)
{
    sl_mix *t = mb->t;
    uint32_t id = t->nnode++;
    sl_mix_node *nd = &t->node[id];

    nd->a = a;
    nd->b = b;
    nd->parent = parent;
    nd->left = nd->right = SL_MIX_NONE;
    if (b - a == 1) {
        t->leaf[a] = id;
        return id;
    }
    uint32_t m = mix_split(mb->pre, a, b);
    uint32_t l = mix_node(mb, a, m, id);
    uint32_t r = mix_node(mb, m, b, id);
    t->node[id].left = l;
    t->node[id].right = r;
    return id;
}

int sl_mix_build(sl_mix *t, const uint64_t *pre, uint32_t nleaf)
{
    mix_build mb = {t, pre};

    memset(t, 0, sizeof(*t));
    if (nleaf == 0)
        return 0;
    t->node = malloc((2 * (size_t)nleaf) * sizeof(*t->node));
    t->leaf = malloc((size_t)nleaf * sizeof(*t->leaf));
    if (!t->node || !t->leaf) {
        sl_mix_close(t);
        return -ENOMEM;
    }
    t->nleaf = nleaf;
    t->root = mix_node(&mb, 0, nleaf, SL_MIX_NONE);
    return 0;
}

typedef struct mix_sets {
    sl_mix *t;
    const uint64_t *w;
    uint32_t *order, *tmp;
    uint32_t next; /* leaves placed so far */
} mix_sets;

/* Node over items[0..k), sorted by weight, heaviest first. Splits so that the children's
 * weights are as even as the greedy rule gets them (a class heavier than all others together
 * alone), which keeps the product of ratios along every path small: that product is what the
 * window bound adds up (docs/sampling.md). The heaviest item's side goes right, so the heaviest
 * item overall is the last leaf. */
static uint32_t mix_set_node(mix_sets *ms, uint32_t *items, uint32_t k, uint32_t parent)
{
    sl_mix *t = ms->t;
    uint32_t id = t->nnode++, nl = 0, nr = 0, a = ms->next;
    uint64_t total = 0, wl = 0, wr = 0;

    t->node[id].parent = parent;
    t->node[id].left = t->node[id].right = SL_MIX_NONE;
    if (k == 1) {
        ms->order[a] = items[0];
        t->leaf[a] = id;
        t->node[id].a = a;
        t->node[id].b = ++ms->next;
        return id;
    }
    for (uint32_t i = 0; i < k; i++)
        total += ms->w[items[i]];
    /* tmp[0..nl) collects the left side, tmp[k - nr..k) the right side (reversed). */
    int alone = ms->w[items[0]] * 2 >= total;
    for (uint32_t i = 0; i < k; i++) {
        /* The heaviest goes right; then each item to the lighter side (all left if the
         * heaviest outweighs the rest). */
        int right = i == 0 || (!alone && wr < wl);
        if (right) {
            ms->tmp[k - 1 - nr++] = items[i];
            wr += ms->w[items[i]];
        } else {
            ms->tmp[nl++] = items[i];
            wl += ms->w[items[i]];
        }
    }
    memcpy(items, ms->tmp, nl * sizeof(*items));
    for (uint32_t i = 0; i < nr; i++)
        items[nl + i] = ms->tmp[k - 1 - i];
    uint32_t l = mix_set_node(ms, items, nl, id);
    uint32_t r = mix_set_node(ms, items + nl, nr, id);
    t->node[id].left = l;
    t->node[id].right = r;
    t->node[id].a = a;
    t->node[id].b = ms->next;
    return id;
}

static int weight_desc(const void *pa, const void *pb, const uint64_t *w)
{
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;

    if (w[a] != w[b])
        return w[a] > w[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* qsort has no context argument in C11: sort ids by weight with a small merge sort instead. */
static void sort_by_weight(uint32_t *v, uint32_t *tmp, uint32_t n, const uint64_t *w)
{
    if (n < 2)
        return;
    uint32_t h = n / 2, i = 0, j = h, k = 0;
    sort_by_weight(v, tmp, h, w);
    sort_by_weight(v + h, tmp, n - h, w);
    while (i < h && j < n)
        tmp[k++] = weight_desc(&v[j], &v[i], w) < 0 ? v[j++] : v[i++];
    while (i < h)
        tmp[k++] = v[i++];
    while (j < n)
        tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof(*v));
}

int sl_mix_build_sets(sl_mix *t, uint32_t *order, const uint64_t *w, uint32_t n)
{
    mix_sets ms = {t, w, order, NULL, 0};
    uint32_t *items = malloc(((size_t)n + 1) * sizeof(*items));
    int err = 0;

    memset(t, 0, sizeof(*t));
    ms.tmp = malloc(((size_t)n + 1) * sizeof(*ms.tmp));
    t->node = malloc((2 * (size_t)n + 1) * sizeof(*t->node));
    t->leaf = malloc(((size_t)n + 1) * sizeof(*t->leaf));
    if (!items || !ms.tmp || !t->node || !t->leaf) {
        sl_mix_close(t);
        err = -ENOMEM;
        goto out;
    }
    t->nleaf = n;
    if (n == 0)
        goto out;
    for (uint32_t i = 0; i < n; i++)
        items[i] = i;
    sort_by_weight(items, ms.tmp, n, w);
    t->root = mix_set_node(&ms, items, n, SL_MIX_NONE);
out:
    free(items);
    free(ms.tmp);
    return err;
}

void sl_mix_close(sl_mix *t)
{
    free(t->node);
    free(t->leaf);
    memset(t, 0, sizeof(*t));
}

void sl_mix_at(uint32_t *leaf, uint64_t *ord, const sl_mix *t, uint64_t pos, sl_mix_count_fn fn,
               const void *ctx)
{
    uint32_t nd = t->root;

    while (t->node[nd].left != SL_MIX_NONE) {
        uint64_t k = fn(ctx, t, nd), kl = fn(ctx, t, t->node[nd].left);
        uint64_t l0 = bres(pos, kl, k), l1 = bres(pos + 1, kl, k);
        if (l1 > l0) {
            pos = l0;
            nd = t->node[nd].left;
        } else {
            pos -= l0;
            nd = t->node[nd].right;
        }
    }
    *leaf = t->node[nd].a;
    *ord = pos;
}

uint64_t sl_mix_select(const sl_mix *t, uint32_t leaf, uint64_t ord, sl_mix_count_fn fn,
                       const void *ctx)
{
    uint32_t nd = t->leaf[leaf];

    while (t->node[nd].parent != SL_MIX_NONE) {
        uint32_t p = t->node[nd].parent;
        uint64_t k = fn(ctx, t, p), kl = fn(ctx, t, t->node[p].left), h = k / 2;
        unsigned __int128 x;
        if (t->node[p].left == nd) {
            /* The smallest s with L(s + 1) >= ord + 1. */
            x = (unsigned __int128)(ord + 1) * k - h;
            ord = (uint64_t)((x + kl - 1) / kl) - 1;
        } else {
            /* Right prefix R(s) = s - L(s) = ceil((s*kr - h) / k): the smallest s with
             * R(s + 1) >= ord + 1 is floor((ord*k + h) / kr). */
            x = (unsigned __int128)ord * k + h;
            ord = (uint64_t)(x / (k - kl));
        }
        nd = p;
    }
    return ord;
}

uint64_t sl_mix_prefix(const sl_mix *t, uint32_t leaf, uint64_t x, sl_mix_count_fn fn,
                       const void *ctx)
{
    uint32_t nd = t->root;

    while (t->node[nd].left != SL_MIX_NONE && x) {
        uint32_t l = t->node[nd].left;
        uint64_t lx = bres(x, fn(ctx, t, l), fn(ctx, t, nd));
        if (leaf < t->node[l].b) {
            x = lx;
            nd = l;
        } else {
            x -= lx;
            nd = t->node[nd].right;
        }
    }
    return x;
}
