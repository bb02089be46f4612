/* Sampling with classes and weights: labels grouped by class, largest-remainder splits and the
 * stratified / class-balanced layout of an epoch (the interleave tree is in mix.c). See
 * docs/sampling.md "Stratified shares". */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* madvise */
#endif
#include "internal.h"

#include "err.h"
#include "util/msg.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

/* ---- labels ---- */

/* The grouped index is read at random places, one read per index a stream produces: above a few
 * MiB most of those reads miss the TLB as well as the caches, and on a virtual machine a TLB miss
 * walks two page tables. So it is allocated on a 2 MiB boundary and the kernel is asked for
 * transparent huge pages there (only a hint: without THP, or elsewhere, nothing changes). */
#define GROUPED_HUGE_MIN   (4u << 20)
#define GROUPED_HUGE_ALIGN (2u << 20)

static void *grouped_alloc(size_t bytes)
{
    void *p = NULL;

    if (bytes < GROUPED_HUGE_MIN)
        return malloc(bytes);
    bytes = (bytes + GROUPED_HUGE_ALIGN - 1) & ~(size_t)(GROUPED_HUGE_ALIGN - 1);
    if (posix_memalign(&p, GROUPED_HUGE_ALIGN, bytes) != 0)
        return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

int sl_sample_labels_new(sl_sample_labels **out, const uint32_t *labels, uint64_t n, char *msg,
                         size_t len)
{
    sl_sample_labels *l = NULL;
    uint32_t top = 0;
    int err = 0;

    *out = NULL;
    if (!labels || n == 0)
        return sl_fail(msg, len, SL_EINVAL, "labels count 0: one label per sample is needed");
    if (n > SL_SAMPLE_MAX_N)
        return sl_fail(msg, len, SL_ELIMIT, "labels count %" PRIu64 " over the limit %" PRIu64, n,
                       SL_SAMPLE_MAX_N);
    for (uint64_t i = 0; i < n; i++) {
        if (labels[i] >= SL_SAMPLE_MAX_CLASSES)
            return sl_fail(msg, len, SL_EINVAL,
                           "label %" PRIu32 " of sample %" PRIu64
                           " over the maximum class id %" PRIu32,
                           labels[i], i, SL_SAMPLE_MAX_CLASSES - 1);
        if (labels[i] > top)
            top = labels[i];
    }
    if (!(l = calloc(1, sizeof(*l))))
        goto nomem;
    l->n = n;
    l->classes = top + 1;
    if (!(l->off = calloc((size_t)l->classes + 1, sizeof(*l->off))))
        goto nomem;
    if (n <= (uint64_t)UINT32_MAX + 1)
        l->by32 = grouped_alloc(n * sizeof(*l->by32));
    else
        l->by64 = grouped_alloc(n * sizeof(*l->by64));
    if (!l->by32 && !l->by64)
        goto nomem;
    /* Counting sort: off[c + 1] counts class c, then prefix sums give each class's start. */
    for (uint64_t i = 0; i < n; i++)
        l->off[labels[i] + 1]++;
    for (uint32_t c = 0; c < l->classes; c++)
        l->off[c + 1] += l->off[c];
    for (uint64_t i = 0; i < n; i++) {
        uint64_t k = l->off[labels[i]]++;
        if (l->by32)
            l->by32[k] = (uint32_t)i;
        else
            l->by64[k] = i;
    }
    for (uint32_t c = l->classes; c > 0; c--)
        l->off[c] = l->off[c - 1];
    l->off[0] = 0;
    *out = l;
    return 0;
nomem:
    err = sl_fail(msg, len, -ENOMEM, "out of memory grouping %" PRIu64 " labels", n);
    sl_sample_labels_free(l);
    return err;
}

uint64_t sl_sample_labels_count(const sl_sample_labels *l)
{
    return l ? l->n : 0;
}

uint32_t sl_sample_labels_classes(const sl_sample_labels *l)
{
    return l ? l->classes : 0;
}

uint64_t sl_sample_labels_class_size(const sl_sample_labels *l, uint32_t c)
{
    return l && c < l->classes ? l->off[c + 1] - l->off[c] : 0;
}

void sl_sample_labels_free(sl_sample_labels *l)
{
    if (!l)
        return;
    free(l->off);
    free(l->by32);
    free(l->by64);
    free(l);
}

/* ---- weights ---- */

int sl_weights_quantize(uint64_t *q, const double *w, size_t n, const char *what, char *msg,
                        size_t len)
{
    double top = 0;

    for (size_t i = 0; i < n; i++) {
        if (!isfinite(w[i]) || !(w[i] > 0))
            return sl_fail(msg, len, SL_EINVAL,
                           "%s weight %zu is %g: weights must be positive and finite", what, i,
                           w[i]);
        if (w[i] > top)
            top = w[i];
    }
    /* One correctly rounded division and multiplication per weight: the same on every IEEE
     * machine, and everything after is integer arithmetic. */
    for (size_t i = 0; i < n; i++) {
        double x = w[i] / top * 4294967296.0;
        q[i] = (uint64_t)llround(x);
        if (q[i] == 0)
            return sl_fail(
                msg, len, SL_ELIMIT,
                "%s weight %zu is %g, too small next to the largest %g (ratio over 2^32)", what, i,
                w[i], top);
    }
    return 0;
}

typedef struct lr_rem {
    uint64_t rem;
    size_t idx;
} lr_rem;

static int lr_cmp(const void *pa, const void *pb)
{
    const lr_rem *a = pa, *b = pb;

    if (a->rem != b->rem)
        return a->rem > b->rem ? -1 : 1;
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

int sl_lr_split(uint64_t *out, uint64_t total, const uint64_t *q, size_t n, int floor_only)
{
    unsigned __int128 Q = 0;
    uint64_t given = 0;
    lr_rem *r;

    for (size_t i = 0; i < n; i++)
        Q += q[i];
    if (!(r = malloc((n ? n : 1) * sizeof(*r))))
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        unsigned __int128 p = (unsigned __int128)total * q[i];
        out[i] = (uint64_t)(p / Q);
        r[i].rem = (uint64_t)(p % Q); /* < Q <= n * 2^32 */
        r[i].idx = i;
        given += out[i];
    }
    if (!floor_only && given < total) {
        qsort(r, n, sizeof(*r), lr_cmp);
        for (size_t k = 0; given < total; k++, given++)
            out[r[k].idx]++;
    }
    free(r);
    return 0;
}

int sl_sample_weights_parse(double *out, size_t *n, size_t max, const char *s, const char *what,
                            char *msg, size_t len)
{
    size_t k = 0;

    *n = 0;
    if (!s || !*s)
        return sl_fail(msg, len, SL_EINVAL, "%s weights empty", what);
    while (*s) {
        char *end;
        double v;
        if (k == max)
            return sl_fail(msg, len, SL_ELIMIT, "more than %zu %s weights", max, what);
        v = strtod(s, &end);
        if (end == s || (*end != ',' && *end != '\0'))
            return sl_fail(msg, len, SL_EINVAL, "%s weight %zu is not a number: '%s'", what, k, s);
        if (!isfinite(v) || !(v > 0))
            return sl_fail(msg, len, SL_EINVAL,
                           "%s weight %zu is %g: weights must be positive and finite", what, k, v);
        out[k++] = v;
        s = *end ? end + 1 : end;
        if (*end == ',' && !*s)
            return sl_fail(msg, len, SL_EINVAL, "%s weights end with a comma", what);
    }
    *n = k;
    return 0;
}

/* ---- the stratified / class-balanced layout ---- */

/* Static counts: a node's count is the weight of its leaf range (the rank tree). */
static uint64_t static_count(const void *ctx, const sl_mix *t, uint32_t nd)
{
    const uint64_t *pre = ctx;

    return pre[t->node[nd].b] - pre[t->node[nd].a];
}

/* Grouped positions below x dealt to rank r. */
static uint64_t deal_prefix(const sl_strat *st, uint32_t r, uint64_t x)
{
    if (x > st->S)
        x = st->S;
    if (st->weighted)
        return sl_mix_prefix(&st->rtree, r, x, static_count, st->rpre);
    return x > r ? (x - r - 1) / st->R + 1 : 0;
}

/* Grouped position of rank r's ord-th dealt position. */
static uint64_t deal_select(const sl_strat *st, uint32_t r, uint64_t ord)
{
    if (st->weighted)
        return sl_mix_select(&st->rtree, r, ord, static_count, st->rpre);
    return r + ord * st->R;
}

typedef struct rank_ctx {
    const sl_strat *st;
    uint32_t r;
    const uint64_t *cache;
} rank_ctx;

static uint64_t rank_count(const void *ctx, const sl_mix *t, uint32_t nd)
{
    const rank_ctx *rc = ctx;

    if (rc->cache)
        return rc->cache[nd];
    return deal_prefix(rc->st, rc->r, rc->st->pre[t->node[nd].b]) -
           deal_prefix(rc->st, rc->r, rc->st->pre[t->node[nd].a]);
}

void sl_strat_counts(uint64_t *cnt, const sl_strat *st, uint32_t r)
{
    rank_ctx rc = {st, r, NULL};

    for (uint32_t nd = 0; nd < st->ctree.nnode; nd++)
        cnt[nd] = rank_count(&rc, &st->ctree, nd);
}

uint64_t sl_strat_real(const sl_strat *st, uint32_t r)
{
    return deal_prefix(st, r, st->S);
}

uint64_t sl_strat_count(const sl_strat *st, uint32_t r)
{
    if (st->pad)
        return st->V / st->R + (st->V % st->R != 0);
    return sl_strat_real(st, r);
}

/* Draws of leaf `leaf` dealt to ranks each epoch (drop_last may trim the last leaf). In
 * class-balanced epochs the class's stream moves on by this much per epoch, so what drop_last
 * trims is drawn next epoch instead of being skipped. */
static uint64_t leaf_used(const sl_strat *st, uint32_t leaf)
{
    uint64_t end = st->pre[leaf + 1] < st->S ? st->pre[leaf + 1] : st->S;

    return end > st->pre[leaf] ? end - st->pre[leaf] : 0;
}

/* A class's order in one pass. Classes of at most SMALL_CLASS samples are shuffled by a keyed
 * Fisher-Yates table instead of the Feistel network, whose smallest domain is 16: a class of 2
 * would cycle-walk about 8 times (96 rounds) per draw, and with 10,000 classes most classes are
 * that small. Larger classes use the epoch's precomputed key schedule when the pass is the one
 * cached (strat_keys), else set one up. Lives on the stack: fp may point into it. */
#define SMALL_CLASS 16u

typedef struct class_perm {
    uint64_t nc;
    int small;
    uint8_t tab[SMALL_CLASS];
    sl_feistel f;
    const sl_feistel *fp;
} class_perm;

/* g / d and g % d, with one 64-bit division when g fits (always, but for epochs past 2^64 /
 * draws): the 128-bit division is a library call, several times slower, once per run. */
static inline void divmod128(uint64_t *q, uint64_t *rem, unsigned __int128 g, uint64_t d)
{
    if ((uint64_t)(g >> 64) == 0) {
        *q = (uint64_t)g / d;
        *rem = (uint64_t)g % d;
    } else {
        *q = (uint64_t)(g / d);
        *rem = (uint64_t)(g % d);
    }
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static void class_perm_init(class_perm *cp, const sl_strat *st, uint32_t leaf, uint64_t pass)
{
    uint32_t c = st->leaf_class[leaf];

    cp->nc = st->lab->off[c + 1] - st->lab->off[c];
    cp->small = cp->nc <= SMALL_CLASS;
    if (cp->small) {
        uint64_t h = 0;
        for (uint32_t i = 0; i < cp->nc; i++)
            cp->tab[i] = (uint8_t)i;
        if (cp->nc > 1)
            h = mix64(st->seed ^ mix64((uint64_t)c + 1) ^ (pass * 0x9E3779B97F4A7C15ULL));
        for (uint32_t i = (uint32_t)cp->nc; i > 1; i--) {
            uint32_t k = (uint32_t)(mix64(h + i) % i);
            uint8_t t = cp->tab[i - 1];
            cp->tab[i - 1] = cp->tab[k];
            cp->tab[k] = t;
        }
    } else if (st->fk && st->fk_pass[leaf] == pass) {
        cp->fp = &st->fk[leaf];
    } else {
        sl_feistel_init(&cp->f, cp->nc, st->seed, pass, 1 + (uint64_t)c);
        cp->fp = &cp->f;
    }
}

/* out[k] = the image of start + k * stride for k < m (all below the class size). */
static void class_perm_seq(const class_perm *cp, uint64_t *out, uint64_t start, uint64_t stride,
                           size_t m)
{
    if (cp->small) {
        for (size_t k = 0; k < m; k++)
            out[k] = cp->tab[start + k * stride];
    } else if (m < 8) { /* the vector path's set-up costs more than it saves */
        for (size_t k = 0; k < m; k++)
            out[k] = sl_feistel_at(cp->fp, start + k * stride);
    } else {
        sl_feistel_map_seq(cp->fp, out, start, stride, m);
    }
}

/* Where draw j of leaf `leaf` this epoch falls in the class's stream: the pass and the place in
 * it. Class-balanced epochs run a class's draws on across epochs (pass k is a fresh order of the
 * class, so no sample repeats before the class is exhausted); stratified ones draw each sample
 * of the class once, in the epoch's order. */
static void class_place(uint64_t *pass, uint64_t *jj, const sl_strat *st, uint32_t leaf, uint64_t j)
{
    uint32_t c = st->leaf_class[leaf];
    uint64_t nc = st->lab->off[c + 1] - st->lab->off[c];

    if (st->balance) {
        divmod128(pass, jj, (unsigned __int128)st->epoch * leaf_used(st, leaf) + j, nc);
    } else {
        *pass = st->epoch;
        *jj = j;
    }
}

/* Draw j of leaf `leaf` this epoch -> sample index. */
static uint64_t class_sample(const sl_strat *st, uint32_t leaf, uint64_t j)
{
    uint64_t base = st->lab->off[st->leaf_class[leaf]], pass, jj, v;
    class_perm cp;

    class_place(&pass, &jj, st, leaf, j);
    if (st->shuffle == SL_SAMPLE_SHUFFLE_NONE)
        return sl_labels_member(st->lab, base + jj);
    class_perm_init(&cp, st, leaf, pass);
    class_perm_seq(&cp, &v, jj, 1, 1);
    return sl_labels_member(st->lab, base + v);
}

static uint64_t grouped_sample(const sl_strat *st, uint64_t p)
{
    uint32_t lo = 0, hi = st->nleaf; /* pre[lo] <= p < pre[hi] */

    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (st->pre[mid] <= p)
            lo = mid;
        else
            hi = mid;
    }
    return class_sample(st, lo, p - st->pre[lo]);
}

uint64_t sl_strat_at(const sl_strat *st, uint32_t r, const uint64_t *cnt, uint64_t i)
{
    rank_ctx rc = {st, r, cnt};
    uint32_t leaf;
    uint64_t ord, p;

    if (i >= sl_strat_real(st, r)) /* padding: the torch rule over the grouped order */
        return grouped_sample(st, (r + (unsigned __int128)i * st->R) % st->V);
    sl_mix_at(&leaf, &ord, &st->ctree, i, rank_count, &rc);
    p = deal_select(st, r, deal_prefix(st, r, st->pre[leaf]) + ord);
    return class_sample(st, leaf, p - st->pre[leaf]);
}

/* Block fill: the positions of a block go down the interleave tree together. At each node the
 * block's slots (output offsets) are split stably into those that go left and right with an
 * incremental Bresenham step (one division per node visited, not per position), so a block of
 * m positions costs O(m x depth) additions plus one class lookup each, instead of two divisions
 * per level per position. */
#define FILL_BLOCK 4096u

typedef struct fill_ctx {
    const sl_strat *st;
    rank_ctx rc;
    uint64_t *out;
    uint32_t *tmp; /* [FILL_BLOCK] */
    uint64_t *val; /* [FILL_BLOCK] */
} fill_ctx;

/* Draws j0 + k * stride (k < m) of leaf `leaf` into out[slot[k]]: cut where the class's stream
 * enters a new pass (class-balanced epochs), each run mapped with one permutation, then one
 * gather from the grouped labels, prefetched ahead (at large N each read is a cache miss). */
static void fill_run(fill_ctx *fc, uint32_t leaf, uint64_t j0, uint64_t stride,
                     const uint32_t *slot, uint32_t m)
{
    const sl_strat *st = fc->st;
    uint32_t c = st->leaf_class[leaf];
    uint64_t base = st->lab->off[c], nc = st->lab->off[c + 1] - base, pass, jj, *val = fc->val;
    class_perm cp;

    class_place(&pass, &jj, st, leaf, j0);
    for (uint32_t k = 0; k < m;) {
        uint64_t run = (nc - 1 - jj) / stride + 1;
        if (run > m - k)
            run = m - k;
        if (st->shuffle == SL_SAMPLE_SHUFFLE_NONE) {
            for (uint64_t t = 0; t < run; t++)
                val[k + t] = jj + t * stride;
        } else {
            class_perm_init(&cp, st, leaf, pass);
            class_perm_seq(&cp, val + k, jj, stride, (size_t)run);
        }
        k += (uint32_t)run;
        /* The next draw: run * stride further along the class's stream. */
        uint64_t more;
        divmod128(&more, &jj, (unsigned __int128)jj + (unsigned __int128)run * stride, nc);
        pass += more;
    }
    if (st->lab->by32) {
        const uint32_t *by = st->lab->by32 + base;
        for (uint32_t k = 0; k < m; k++) {
            if (k + 24 < m)
                __builtin_prefetch(by + val[k + 24]);
            fc->out[slot[k]] = by[val[k]];
        }
    } else {
        for (uint32_t k = 0; k < m; k++)
            fc->out[slot[k]] = st->lab->by64[base + val[k]];
    }
}

/* Positions [o0, o0 + m) of leaf `leaf` (this rank's ordinals) into out[slot[k]]. */
static void fill_leaf(fill_ctx *fc, uint32_t leaf, uint64_t o0, const uint32_t *slot, uint32_t m)
{
    const sl_strat *st = fc->st;
    uint32_t r = fc->rc.r;
    uint64_t d0 = deal_prefix(st, r, st->pre[leaf]) + o0, start = st->pre[leaf];

    if (st->weighted) {
        for (uint32_t k = 0; k < m; k++)
            fc->out[slot[k]] = class_sample(st, leaf, deal_select(st, r, d0 + k) - start);
        return;
    }
    /* Equal shares: rank r's ord-th dealt position is r + ord x R, so the leaf's draws form one
     * arithmetic sequence. */
    fill_run(fc, leaf, r + d0 * st->R - start, st->R, slot, m);
}

static void fill_node(fill_ctx *fc, uint32_t nd, uint64_t s0, uint32_t *slot, uint32_t m)
{
    const sl_mix *t = &fc->st->ctree;
    uint64_t k, kl, q, rem, l0;
    uint32_t nl = 0, nr = 0;
    unsigned __int128 num;

    if (m == 0)
        return;
    if (t->node[nd].left == SL_MIX_NONE) {
        fill_leaf(fc, t->node[nd].a, s0, slot, m);
        return;
    }
    k = rank_count(&fc->rc, t, nd);
    kl = rank_count(&fc->rc, t, t->node[nd].left);
    /* L(s) = floor((s x kl + floor(k / 2)) / k); position s goes left iff L(s + 1) > L(s). */
    num = (unsigned __int128)s0 * kl + k / 2;
    divmod128(&q, &rem, num, k);
    l0 = q;
    /* Left slots are compacted in place, right ones parked in tmp and appended. */
    for (uint32_t i = 0; i < m; i++) {
        rem += kl;
        if (rem >= k) {
            rem -= k;
            slot[nl++] = slot[i];
        } else {
            fc->tmp[nr++] = slot[i];
        }
    }
    for (uint32_t i = 0; i < nr; i++)
        slot[nl + i] = fc->tmp[i];
    if (nl)
        fill_node(fc, t->node[nd].left, l0, slot, nl);
    if (nr)
        fill_node(fc, t->node[nd].right, s0 - l0, slot + nl, nr);
}

void sl_strat_fill(uint64_t *out, const sl_strat *st, uint32_t r, const uint64_t *cnt, uint64_t pos,
                   size_t m)
{
    uint32_t slot[FILL_BLOCK], tmp[FILL_BLOCK];
    uint64_t real = sl_strat_real(st, r), val[FILL_BLOCK];
    fill_ctx fc = {st, {st, r, cnt}, NULL, tmp, val};
    size_t k = 0;

    while (k < m && pos + k < real) {
        uint64_t left = real - (pos + k);
        uint32_t b = (uint32_t)(m - k < FILL_BLOCK ? m - k : FILL_BLOCK);

        if (b > left)
            b = (uint32_t)left;
        for (uint32_t i = 0; i < b; i++)
            slot[i] = i;
        fc.out = out + k;
        fill_node(&fc, st->ctree.root, pos + k, slot, b);
        k += b;
    }
    for (; k < m; k++) /* padding */
        out[k] = sl_strat_at(st, r, cnt, pos + k);
}

/* Draws of every class this epoch: n_c (stratify) or the largest-remainder split of the epoch
 * length by the class weights (balance). */
static int class_draws(uint64_t *m, const sl_sample_config *cfg, char *msg, size_t len)
{
    const sl_sample_labels *l = cfg->labels;
    uint64_t *q = NULL;
    int err = 0;

    if (cfg->classes == SL_SAMPLE_CLASSES_STRATIFY) {
        for (uint32_t c = 0; c < l->classes; c++)
            m[c] = l->off[c + 1] - l->off[c];
        return 0;
    }
    if (!(q = calloc(l->classes, sizeof(*q))))
        return sl_fail(msg, len, -ENOMEM, "out of memory");
    if (cfg->n_class_weights) {
        if ((err = sl_weights_quantize(q, cfg->class_weights, l->classes, "class", msg, len)))
            goto out;
    } else {
        for (uint32_t c = 0; c < l->classes; c++)
            q[c] = l->off[c + 1] > l->off[c];
    }
    if ((err = sl_lr_split(m, cfg->epoch_length ? cfg->epoch_length : cfg->samples, q, l->classes,
                           0)))
        err = sl_fail(msg, len, err, "out of memory");
out:
    free(q);
    return err;
}

/* The classes drawn this epoch in grouped order (the interleave tree's leaf order, heaviest
 * class last, where drop_last trims) and the tree. */
static int strat_leaves(sl_strat *st, const uint64_t *m, uint32_t classes)
{
    uint32_t *cls = malloc(((size_t)classes + 1) * sizeof(*cls)), k = 0;
    uint32_t *order = malloc(((size_t)classes + 1) * sizeof(*order));
    uint64_t *w = malloc(((size_t)classes + 1) * sizeof(*w));
    int err = -ENOMEM;

    if (!cls || !order || !w)
        goto out;
    for (uint32_t c = 0; c < classes; c++)
        if (m[c]) {
            w[k] = m[c];
            cls[k++] = c;
        }
    st->nleaf = k;
    st->leaf_class = malloc(((size_t)k + 1) * sizeof(*st->leaf_class));
    st->pre = malloc(((size_t)k + 1) * sizeof(*st->pre));
    if (!st->leaf_class || !st->pre || sl_mix_build_sets(&st->ctree, order, w, k))
        goto out;
    st->pre[0] = 0;
    for (uint32_t i = 0; i < k; i++) {
        st->leaf_class[i] = cls[order[i]];
        st->pre[i + 1] = st->pre[i] + w[order[i]];
    }
    st->V = st->pre[k];
    err = 0;
out:
    free(cls);
    free(order);
    free(w);
    return err;
}

/* Precompute each class's permutation for its first pass this epoch (a stream then needs no
 * key schedule per index); skipped above 2^16 classes to bound memory. */
static int strat_keys(sl_strat *st)
{
    if (st->shuffle != SL_SAMPLE_SHUFFLE_FEISTEL || st->nleaf > 65536)
        return 0;
    st->fk = malloc((size_t)st->nleaf * sizeof(*st->fk));
    st->fk_pass = malloc((size_t)st->nleaf * sizeof(*st->fk_pass));
    if (!st->fk || !st->fk_pass)
        return -ENOMEM;
    for (uint32_t i = 0; i < st->nleaf; i++) {
        uint32_t c = st->leaf_class[i];
        uint64_t nc = st->lab->off[c + 1] - st->lab->off[c], pass = st->epoch;
        if (st->balance)
            pass = (uint64_t)((unsigned __int128)st->epoch * leaf_used(st, i) / nc);
        st->fk_pass[i] = pass;
        if (nc > SMALL_CLASS) /* small classes use class_perm's table */
            sl_feistel_init(&st->fk[i], nc, st->seed, pass, 1 + (uint64_t)c);
    }
    return 0;
}

int sl_strat_init(sl_strat *st, const sl_sample_config *cfg, uint32_t R, const uint64_t *q,
                  char *msg, size_t len)
{
    uint64_t *m = NULL, *rc = NULL;
    int err;

    memset(st, 0, sizeof(*st));
    st->lab = cfg->labels;
    st->balance = cfg->classes == SL_SAMPLE_CLASSES_BALANCE;
    st->seed = cfg->seed;
    st->epoch = cfg->epoch;
    st->shuffle = cfg->shuffle;
    st->R = R;
    if (!(m = calloc(st->lab->classes, sizeof(*m)))) {
        err = sl_fail(msg, len, -ENOMEM, "out of memory");
        goto out;
    }
    if ((err = class_draws(m, cfg, msg, len)) != 0)
        goto out;
    if ((err = strat_leaves(st, m, st->lab->classes)) != 0)
        goto nomem;
    if (st->V == 0) {
        err = sl_fail(msg, len, SL_EINVAL, "epoch length 0: the epoch draws nothing");
        goto out;
    }
    st->weighted = q != NULL;
    st->S = st->V;
    if (st->weighted) {
        if (!(rc = malloc((size_t)R * sizeof(*rc))) ||
            !(st->rpre = malloc(((size_t)R + 1) * sizeof(*st->rpre))))
            goto nomem;
        if ((err = sl_lr_split(rc, st->V, q, R, cfg->drop_last)) != 0)
            goto nomem;
        st->rpre[0] = 0;
        for (uint32_t r = 0; r < R; r++)
            st->rpre[r + 1] = st->rpre[r] + rc[r];
        st->S = st->rpre[R];
        /* A rank with no positions cannot be a leaf of the dealing tree: weights this uneven
         * only arise when the epoch is shorter than the world. */
        for (uint32_t r = 0; r < R; r++)
            if (rc[r] == 0) {
                err = sl_fail(msg, len, SL_EINVAL,
                              "rank %" PRIu32 " gets no samples: %" PRIu64
                              " draws are too few for the rank weights",
                              r, st->V);
                goto out;
            }
        if ((err = sl_mix_build(&st->rtree, st->rpre, R)) != 0)
            goto nomem;
    } else if (cfg->drop_last) {
        st->S = st->V / R * R;
    } else {
        st->pad = 1;
    }
    if ((err = strat_keys(st)) != 0)
        goto nomem;
    goto out;
nomem:
    err = sl_fail(msg, len, -ENOMEM, "out of memory");
out:
    free(m);
    free(rc);
    if (err)
        sl_strat_close(st);
    return err;
}

void sl_strat_close(sl_strat *st)
{
    free(st->leaf_class);
    free(st->pre);
    free(st->rpre);
    free(st->fk);
    free(st->fk_pass);
    sl_mix_close(&st->ctree);
    sl_mix_close(&st->rtree);
    memset(st, 0, sizeof(*st));
}
