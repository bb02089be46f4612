/* Token-budget batch planning. See batch.h for the contract and docs/batching.md for the design.
 *
 * The planner runs in one straight line: validate the inputs and measure them (pass 1), sort each
 * window of the order by its key into `idx` and cut it into batch records (pass 2), shuffle the
 * records, apply the remainder rule, balance steps, and sum up per-rank statistics. A record
 * refers to a contiguous run of `idx`, so shuffling, repeating and balancing batches only moves
 * 16-byte records, never indices.
 */
#include "batch/batch.h"

#include "err.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE     UINT32_MAX
#define PREFETCH 64

/* One batch: a run idx[start, start + count). tokens fits in 32 bits because it never exceeds
 * max_tokens (sum cost) or count x max_len <= max_tokens (padded cost). */
typedef struct rec {
    uint32_t start;
    uint32_t count;
    uint32_t max_len;
    uint32_t tokens;
} rec;

struct sl_batch_plan {
    sl_batch_config cfg; /* defaults resolved */
    uint32_t *idx;
    size_t n_idx;
    rec *recs; /* the final order: step s, rank r is recs[s * D + r] */
    size_t n_recs;
    uint64_t per_rank;
    sl_batch_stats total;
    sl_batch_stats *ranks; /* cfg.replicas entries */
    size_t held, peak;
};

/* Allocation accounting, so the plan can report its peak without any help from the allocator. */
typedef struct acct {
    size_t cur, peak;
} acct;

static void *acct_alloc(acct *a, size_t n)
{
    void *p = malloc(n ? n : 1);

    if (p) {
        a->cur += n;
        if (a->cur > a->peak)
            a->peak = a->cur;
    }
    return p;
}

static void *acct_realloc(acct *a, void *old, size_t old_n, size_t n)
{
    void *p = realloc(old, n ? n : 1);

    if (p) {
        /* Growing may copy: count both blocks at the peak, as the allocator holds them then.
         * Shrinking happens in place. */
        if (n > old_n && a->cur + n > a->peak)
            a->peak = a->cur + n;
        a->cur = a->cur - old_n + n;
    }
    return p;
}

static void acct_free(acct *a, void *p, size_t n)
{
    if (p) {
        free(p);
        a->cur -= n;
    }
}

static int fail(char *msg, size_t len, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *msg, size_t len, int code, const char *fmt, ...)
{
    va_list ap;

    if (msg && len) {
        va_start(ap, fmt);
        vsnprintf(msg, len, fmt, ap);
        va_end(ap);
    }
    return code;
}

void sl_batch_config_init(sl_batch_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->strategy = SL_BATCH_DYNAMIC;
    cfg->cost = SL_BATCH_COST_DEFAULT;
    cfg->overlong = SL_BATCH_TRUNCATE;
    cfg->bucket_width = SL_BATCH_DEFAULT_BUCKET;
    cfg->replicas = 1;
    cfg->remainder = SL_BATCH_DROP;
}

static const char *const strategy_names[] = {"pad", "bucket", "dynamic", "packed"};
static const char *const cost_names[] = {"default", "padded", "sum"};

const char *sl_batch_strategy_name(sl_batch_strategy s)
{
    return (unsigned)s < 4 ? strategy_names[s] : "?";
}

const char *sl_batch_cost_name(sl_batch_cost c)
{
    return (unsigned)c < 3 ? cost_names[c] : "?";
}

int sl_batch_strategy_parse(const char *name, sl_batch_strategy *out)
{
    for (unsigned i = 0; name && i < 4; i++) {
        if (strcmp(name, strategy_names[i]) == 0) {
            *out = (sl_batch_strategy)i;
            return 0;
        }
    }
    return SL_EINVAL;
}

int sl_batch_cost_parse(const char *name, sl_batch_cost *out)
{
    for (unsigned i = 1; name && i < 3; i++) {
        if (strcmp(name, cost_names[i]) == 0) {
            *out = (sl_batch_cost)i;
            return 0;
        }
    }
    return SL_EINVAL;
}

/* Validate `in` and write it with every default resolved into `out`. */
static int config_resolve(sl_batch_config *out, const sl_batch_config *in, char *msg, size_t len)
{
    sl_batch_config c;

    if (!in)
        return fail(msg, len, SL_EINVAL, "config is NULL");
    c = *in;
    if ((unsigned)c.strategy > SL_BATCH_PACKED)
        return fail(msg, len, SL_EINVAL, "strategy %d is not pad, bucket, dynamic or packed",
                    (int)c.strategy);
    if ((unsigned)c.cost > SL_BATCH_COST_SUM)
        return fail(msg, len, SL_EINVAL, "cost model %d is not padded or sum", (int)c.cost);
    if ((unsigned)c.overlong > SL_BATCH_SKIP)
        return fail(msg, len, SL_EINVAL, "overlong policy %d is not truncate or skip",
                    (int)c.overlong);
    if ((unsigned)c.remainder > SL_BATCH_REPEAT)
        return fail(msg, len, SL_EINVAL, "remainder policy %d is not drop or pad",
                    (int)c.remainder);
    if (c.max_batch_size == 0)
        return fail(msg, len, SL_EINVAL, "max_batch_size must be at least 1 (got 0)");
    if (c.max_seq_len == 0)
        return fail(msg, len, SL_EINVAL, "max_seq_len must be at least 1 (got 0)");
    if (c.max_seq_len > SL_BATCH_MAX_SEQ_LEN)
        return fail(msg, len, SL_ELIMIT, "max_seq_len %" PRIu32 " is over the limit %u",
                    c.max_seq_len, SL_BATCH_MAX_SEQ_LEN);
    if (c.max_tokens == 0) {
        /* Both factors are 32-bit, so the product cannot overflow 64 bits. */
        uint64_t t = (uint64_t)c.max_batch_size * c.max_seq_len;

        if (t > SL_BATCH_MAX_TOKENS)
            return fail(msg, len, SL_ELIMIT,
                        "max_batch_size %" PRIu32 " x max_seq_len %" PRIu32 " = %" PRIu64
                        " tokens is over the limit %" PRIu32 "; set max_tokens",
                        c.max_batch_size, c.max_seq_len, t, SL_BATCH_MAX_TOKENS);
        c.max_tokens = t;
    }
    if (c.max_tokens > SL_BATCH_MAX_TOKENS)
        return fail(msg, len, SL_ELIMIT, "max_tokens %" PRIu64 " is over the limit %" PRIu32,
                    c.max_tokens, SL_BATCH_MAX_TOKENS);
    if (c.max_tokens < c.max_seq_len)
        return fail(msg, len, SL_EINVAL,
                    "max_tokens %" PRIu64 " is smaller than max_seq_len %" PRIu32
                    ": a sequence of max_seq_len tokens would not fit in any batch",
                    c.max_tokens, c.max_seq_len);
    if (c.cost == SL_BATCH_COST_DEFAULT)
        c.cost = c.strategy == SL_BATCH_PACKED ? SL_BATCH_COST_SUM : SL_BATCH_COST_PADDED;
    if (c.strategy == SL_BATCH_PACKED && c.cost != SL_BATCH_COST_SUM)
        return fail(msg, len, SL_EINVAL,
                    "the packed strategy packs by sum of lengths; cost model padded does not "
                    "apply to it");
    if (c.bucket_width == 0)
        c.bucket_width = SL_BATCH_DEFAULT_BUCKET;
    if (c.batch_size_multiple == 0)
        c.batch_size_multiple = 1;
    if (c.batch_size_multiple > c.max_batch_size)
        return fail(msg, len, SL_EINVAL,
                    "batch_size_multiple %" PRIu32 " is larger than max_batch_size %" PRIu32,
                    c.batch_size_multiple, c.max_batch_size);
    if (c.replicas == 0)
        c.replicas = 1;
    if (c.replicas > SL_BATCH_MAX_REPLICAS)
        return fail(msg, len, SL_ELIMIT, "replicas %" PRIu32 " is over the limit %u", c.replicas,
                    SL_BATCH_MAX_REPLICAS);
    *out = c;
    return 0;
}

int sl_batch_config_check(const sl_batch_config *cfg, char *msg, size_t len)
{
    sl_batch_config c;

    return config_resolve(&c, cfg, msg, len);
}

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

/* Hierarchical bitset over capacity classes [0, n): finds the first set class >= x in three
 * word probes and a scan of at most 65 words (n <= 2^24 + 1). */
typedef struct bitset {
    uint64_t *l0, *l1, *l2;
    size_t n0, n1, n2;
} bitset;

static void bits_set(bitset *b, uint32_t c)
{
    b->l0[c >> 6] |= 1ull << (c & 63);
    b->l1[c >> 12] |= 1ull << ((c >> 6) & 63);
    b->l2[c >> 18] |= 1ull << ((c >> 12) & 63);
}

static void bits_clear(bitset *b, uint32_t c)
{
    b->l0[c >> 6] &= ~(1ull << (c & 63));
    if (b->l0[c >> 6])
        return;
    b->l1[c >> 12] &= ~(1ull << ((c >> 6) & 63));
    if (b->l1[c >> 12])
        return;
    b->l2[c >> 18] &= ~(1ull << ((c >> 12) & 63));
}

static uint32_t bits_next(const bitset *b, uint32_t x)
{
    size_t w0 = x >> 6, w1, x1, x2;
    uint64_t m;

    if (w0 >= b->n0)
        return NONE;
    m = b->l0[w0] & (~0ull << (x & 63));
    if (m)
        return (uint32_t)((w0 << 6) + (size_t)__builtin_ctzll(m));
    x1 = w0 + 1; /* the first level-0 word still to look at */
    w1 = x1 >> 6;
    if (w1 >= b->n1)
        return NONE;
    m = b->l1[w1] & (~0ull << (x1 & 63));
    if (!m) {
        x2 = w1 + 1; /* the first level-1 word still to look at */
        for (size_t w2 = x2 >> 6; w2 < b->n2; w2++) {
            m = b->l2[w2];
            if (w2 == (x2 >> 6))
                m &= ~0ull << (x2 & 63);
            if (m) {
                w1 = (w2 << 6) + (size_t)__builtin_ctzll(m);
                m = b->l1[w1];
                break;
            }
        }
        if (!m)
            return NONE;
    }
    w0 = (w1 << 6) + (size_t)__builtin_ctzll(m);
    return (uint32_t)((w0 << 6) + (size_t)__builtin_ctzll(b->l0[w0]));
}

/* An open bin of the packed strategy, linked into the list of its capacity class. */
typedef struct bin {
    uint32_t rem; /* fits: max_tokens <= UINT32_MAX */
    uint32_t count, max_len, tokens, start;
    uint32_t prev, next, cls;
} bin;

/* Planning state; everything here is freed or moved into the plan before sl_batch_plan_new
 * returns. */
typedef struct planner {
    sl_batch_config c;
    const uint32_t *lengths;
    const uint64_t *order; /* validated by scan(): every entry < n_lengths <= UINT32_MAX */
    size_t n_order;
    acct a;
    uint32_t *idx; /* the kept samples, window-sorted, then laid out batch by batch */
    size_t n_idx;
    uint32_t beff; /* batch size cap: max_batch_size rounded down to the multiple */
    uint32_t hmax; /* longest effective length */
    uint64_t truncated, skipped;
    rec *recs;
    size_t n_recs, cap_recs;
    /* sort scratch */
    uint32_t *hist;
    size_t n_hist;
    uint64_t *keys;
    size_t n_keys;
    /* Effective lengths: eff[k] of order position k after scan() (0 = skipped), then aligned
     * with idx as windows are sorted, so every later pass reads lengths sequentially. */
    uint32_t *eff;
    size_t n_eff;
    uint32_t *tmp; /* one window of scratch */
    size_t n_tmp;
    uint32_t *lut; /* bucket: lut[e] = e / bucket_width, when cheaper than dividing */
    size_t n_lut;
    /* packed scratch */
    bin *bins;
    size_t n_bins, cap_bins;
    uint32_t *heads;
    bitset bits;
    size_t n_heads;
} planner;

static uint32_t order_at(const planner *p, size_t k)
{
    return p->order ? (uint32_t)p->order[k] : (uint32_t)k;
}

static uint32_t key_of(const planner *p, uint32_t e)
{
    if (p->c.strategy != SL_BATCH_BUCKET)
        return e;
    return p->lut ? p->lut[e] : e / p->c.bucket_width;
}

static int emit(planner *p, size_t start, uint32_t count, uint32_t max_len, uint64_t tokens)
{
    if (p->n_recs == p->cap_recs) {
        size_t ncap = p->cap_recs + p->cap_recs / 2 + 64;
        rec *r = acct_realloc(&p->a, p->recs, p->cap_recs * sizeof(rec), ncap * sizeof(rec));

        if (!r)
            return -ENOMEM;
        p->recs = r;
        p->cap_recs = ncap;
    }
    p->recs[p->n_recs++] = (rec){(uint32_t)start, count, max_len, (uint32_t)tokens};
    return 0;
}

/* Longest length and real tokens of idx[a, a + n). */
static void measure(const planner *p, size_t a, uint32_t n, uint32_t *mx, uint64_t *tok)
{
    *mx = 0;
    *tok = 0;
    for (size_t k = a; k < a + n; k++) {
        uint32_t s = p->eff[k];

        *mx = s > *mx ? s : *mx;
        *tok += s;
    }
}

/* pad, bucket and dynamic: walk idx[a, b) and close a batch whenever the next sequence would
 * break the size cap or the budget. With a batch size multiple m, an overflowing batch keeps its
 * largest multiple of m and carries the rest into the next batch, as fairseq does. */
static int cut_greedy(planner *p, size_t a, size_t b)
{
    const int padded = p->c.cost == SL_BATCH_COST_PADDED;
    const uint32_t m = p->c.batch_size_multiple;
    const uint64_t t = p->c.max_tokens;
    size_t start = a;
    uint32_t cnt = 0, mx = 0;
    uint64_t tok = 0;
    int err;

    for (size_t k = a; k < b; k++) {
        uint32_t s = p->eff[k];

        while (cnt > 0) {
            uint32_t nmx = s > mx ? s : mx;
            uint64_t cost = padded ? (uint64_t)(cnt + 1) * nmx : tok + s;
            uint32_t keep = cnt, kmx;
            uint64_t ktok;

            if (cnt + 1 <= p->beff && cost <= t)
                break;
            if (m > 1 && cnt > m && cnt % m)
                keep = cnt - cnt % m;
            if (keep == cnt) {
                kmx = mx;
                ktok = tok;
            } else {
                measure(p, start, keep, &kmx, &ktok);
            }
            if ((err = emit(p, start, keep, kmx, ktok)) != 0)
                return err;
            start += keep;
            cnt -= keep;
            measure(p, start, cnt, &mx, &tok);
        }
        cnt++;
        mx = s > mx ? s : mx;
        tok += s;
    }
    return cnt ? emit(p, start, cnt, mx, tok) : 0;
}

static void bin_unlink(planner *p, uint32_t bi)
{
    bin *b = &p->bins[bi];

    if (b->prev != NONE)
        p->bins[b->prev].next = b->next;
    else
        p->heads[b->cls] = b->next;
    if (b->next != NONE)
        p->bins[b->next].prev = b->prev;
    if (p->heads[b->cls] == NONE)
        bits_clear(&p->bits, b->cls);
    b->cls = NONE;
}

static void bin_link(planner *p, uint32_t bi)
{
    bin *b = &p->bins[bi];
    uint32_t c = b->rem < p->hmax ? (uint32_t)b->rem : p->hmax;

    b->cls = c;
    b->prev = NONE;
    b->next = p->heads[c];
    if (b->next != NONE)
        p->bins[b->next].prev = bi;
    else
        bits_set(&p->bits, c);
    p->heads[c] = bi;
}

/* packed: best-fit-decreasing over idx[a, b), which is sorted by ascending length. A bin with
 * room r sits in capacity class min(r, hmax); every bin with at least hmax tokens of room fits
 * any sequence, and among those the most recently touched one is filled first. */
static int cut_packed(planner *p, size_t a, size_t b)
{
    size_t w = b - a, first = p->n_bins;
    int err;

    for (size_t k = b; k-- > a;) {
        uint32_t s = p->eff[k];
        uint32_t c = bits_next(&p->bits, s), bi;

        if (c != NONE) {
            bin *bn;

            bi = p->heads[c];
            bn = &p->bins[bi];
            /* Fast path: a bin that stays open in the same class keeps its place at the head
             * of the list, exactly where unlinking and relinking would put it. */
            if (bn->count + 1 < p->beff && bn->rem - s >= 1 &&
                (bn->rem - s < p->hmax ? bn->rem - s : p->hmax) == c) {
                bn->rem -= s;
                bn->count++;
                bn->tokens += s;
                bn->max_len = s > bn->max_len ? s : bn->max_len;
                p->eff[k] = bi;
                continue;
            }
            bin_unlink(p, bi);
        } else {
            if (p->n_bins == p->cap_bins) {
                size_t ncap = p->cap_bins + p->cap_bins / 2 + 64;
                bin *nb =
                    acct_realloc(&p->a, p->bins, p->cap_bins * sizeof(bin), ncap * sizeof(bin));

                if (!nb)
                    return -ENOMEM;
                p->bins = nb;
                p->cap_bins = ncap;
            }
            bi = (uint32_t)p->n_bins++;
            p->bins[bi] = (bin){.rem = (uint32_t)p->c.max_tokens, .cls = NONE};
        }
        p->bins[bi].rem -= s;
        p->bins[bi].count++;
        p->bins[bi].tokens += s;
        if (s > p->bins[bi].max_len)
            p->bins[bi].max_len = s;
        p->eff[k] = bi; /* the length is no longer needed: remember the bin instead */
        if (p->bins[bi].count < p->beff && p->bins[bi].rem > 0)
            bin_link(p, bi);
    }
    /* Close the window: unlink open bins, then lay idx[a, b) out bin by bin, in the order the
     * bins were opened, and emit one record per bin. */
    for (size_t bi = first, pos = a; bi < p->n_bins; bi++) {
        if (p->bins[bi].cls != NONE)
            bin_unlink(p, (uint32_t)bi);
        p->bins[bi].start = (uint32_t)pos;
        pos += p->bins[bi].count;
        p->bins[bi].count = 0;
    }
    for (size_t k = 0; k < w; k++) {
        bin *bn = &p->bins[p->eff[a + k]];

        p->tmp[bn->start - a + bn->count++] = p->idx[a + k];
    }
    memcpy(p->idx + a, p->tmp, w * sizeof(uint32_t));
    for (size_t bi = first; bi < p->n_bins; bi++) {
        const bin *bn = &p->bins[bi];

        if ((err = emit(p, bn->start, bn->count, bn->max_len, bn->tokens)) != 0)
            return err;
    }
    p->n_bins = first;
    return 0;
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;

    return a < b ? -1 : a > b;
}

/* Stable sort of the kept samples of order[a, b) by key, ascending or descending, appended to
 * idx (and their lengths to eff, which is safe because the output never runs ahead of the
 * input: out <= a). A counting sort when the window is at least a quarter of the key range, else
 * a sort of (key, position) pairs, so the scratch stays O(key range) whatever the window. */
static void sort_window(planner *p, size_t a, size_t b, size_t *n_out, int desc)
{
    size_t out = *n_out, n = 0;

    if (p->c.strategy == SL_BATCH_PAD || b - a == 1) {
        for (size_t k = a; k < b; k++) {
            if (p->eff[k]) {
                p->idx[out + n] = order_at(p, k);
                p->eff[out + n++] = p->eff[k];
            }
        }
    } else if (p->hist && (b - a) * 4 >= p->n_hist) {
        uint32_t *h = p->hist, sum = 0;

        memset(h, 0, p->n_hist * sizeof(uint32_t));
        for (size_t k = a; k < b; k++) {
            if (p->eff[k])
                h[key_of(p, p->eff[k])]++;
        }
        for (size_t v = 0; v < p->n_hist; v++) {
            size_t x = desc ? p->n_hist - 1 - v : v;
            uint32_t c = h[x];

            h[x] = sum;
            sum += c;
        }
        for (size_t k = a; k < b; k++) {
            uint32_t e = p->eff[k], pos;

            if (e) {
                pos = h[key_of(p, e)]++;
                p->idx[out + pos] = order_at(p, k);
                p->tmp[pos] = e;
            }
        }
        n = sum;
        memcpy(p->eff + out, p->tmp, n * sizeof(uint32_t));
    } else {
        for (size_t k = a; k < b; k++) {
            uint32_t e = p->eff[k], key;

            if (e) {
                key = desc ? ~key_of(p, e) : key_of(p, e);
                p->keys[n++] = (uint64_t)key << 32 | (uint32_t)(k - a);
            }
        }
        qsort(p->keys, n, sizeof(uint64_t), cmp_u64);
        for (size_t j = 0; j < n; j++) {
            size_t k = a + (uint32_t)p->keys[j];

            p->idx[out + j] = order_at(p, k);
            p->tmp[j] = p->eff[k];
        }
        memcpy(p->eff + out, p->tmp, n * sizeof(uint32_t));
    }
    *n_out = out + n;
}

/* Pass 1: check every index and length, count truncated and skipped, find the longest. */
static int scan(planner *p, size_t n_lengths, char *msg, size_t len)
{
    const uint32_t maxl = p->c.max_seq_len;

    for (size_t k = 0; k < p->n_order; k++) {
        uint64_t i = p->order ? p->order[k] : k;
        uint32_t l;

        /* The gather through a shuffled order misses the cache on every sample; asking for the
         * length a few dozen samples ahead overlaps those misses (about 2x at 1e7 samples). */
        if (p->order && k + PREFETCH < p->n_order && p->order[k + PREFETCH] < n_lengths)
            __builtin_prefetch(&p->lengths[p->order[k + PREFETCH]]);
        if (i >= n_lengths)
            return fail(msg, len, SL_EINVAL, "order[%zu] = %" PRIu64 " is out of range [0, %zu)", k,
                        i, n_lengths);
        l = p->lengths[i];
        if (l == 0)
            return fail(msg, len, SL_EINVAL,
                        "sample %" PRIu64 " has length 0 (every length must be at least 1)", i);
        if (l > maxl) {
            if (p->c.overlong == SL_BATCH_SKIP) {
                p->skipped++;
                p->eff[k] = 0;
                continue;
            }
            p->truncated++;
            l = maxl;
        }
        if (l > p->hmax)
            p->hmax = l;
        p->eff[k] = l;
        p->n_idx++;
    }
    return 0;
}

static int alloc_scratch(planner *p, size_t win)
{
    size_t nkeys, last;

    if (p->n_idx == 0)
        return 0;
    last = p->n_order % win;
    nkeys = p->c.strategy == SL_BATCH_BUCKET ? p->hmax / p->c.bucket_width + 1 : p->hmax + 1;
    if (p->c.strategy != SL_BATCH_PAD && win > 1) {
        if (win * 4 >= nkeys) {
            p->n_hist = nkeys;
            if (!(p->hist = acct_alloc(&p->a, nkeys * sizeof(uint32_t))))
                return -ENOMEM;
        }
        /* Windows shorter than a quarter of the key range (perhaps only the last one) sort
         * (key, position) pairs instead, in scratch of their own size. */
        if (win * 4 < nkeys)
            p->n_keys = win;
        else if (last > 1 && last * 4 < nkeys)
            p->n_keys = last;
        if (p->n_keys && !(p->keys = acct_alloc(&p->a, p->n_keys * sizeof(uint64_t))))
            return -ENOMEM;
    }
    if ((p->c.strategy != SL_BATCH_PAD && win > 1) || p->c.strategy == SL_BATCH_PACKED) {
        p->n_tmp = win < p->n_idx ? win : p->n_idx;
        if (!(p->tmp = acct_alloc(&p->a, p->n_tmp * sizeof(uint32_t))))
            return -ENOMEM;
    }
    if (p->c.strategy == SL_BATCH_BUCKET && win > 1 && p->hmax <= p->n_order) {
        /* Two divisions per sample cost more than the whole counting sort. */
        p->n_lut = (size_t)p->hmax + 1;
        if (!(p->lut = acct_alloc(&p->a, p->n_lut * sizeof(uint32_t))))
            return -ENOMEM;
        for (size_t e = 0; e < p->n_lut; e++)
            p->lut[e] = (uint32_t)(e / p->c.bucket_width);
    }
    if (p->c.strategy == SL_BATCH_PACKED) {
        p->n_heads = (size_t)p->hmax + 1;
        p->bits.n0 = (p->n_heads + 63) / 64;
        p->bits.n1 = (p->bits.n0 + 63) / 64;
        p->bits.n2 = (p->bits.n1 + 63) / 64;
        p->heads = acct_alloc(&p->a, p->n_heads * sizeof(uint32_t));
        p->bits.l0 = acct_alloc(&p->a, p->bits.n0 * sizeof(uint64_t));
        p->bits.l1 = acct_alloc(&p->a, p->bits.n1 * sizeof(uint64_t));
        p->bits.l2 = acct_alloc(&p->a, p->bits.n2 * sizeof(uint64_t));
        if (!p->heads || !p->bits.l0 || !p->bits.l1 || !p->bits.l2)
            return -ENOMEM;
        memset(p->heads, 0xff, p->n_heads * sizeof(uint32_t));
        memset(p->bits.l0, 0, p->bits.n0 * sizeof(uint64_t));
        memset(p->bits.l1, 0, p->bits.n1 * sizeof(uint64_t));
        memset(p->bits.l2, 0, p->bits.n2 * sizeof(uint64_t));
    }
    return 0;
}

static void free_scratch(planner *p)
{
    acct_free(&p->a, p->hist, p->n_hist * sizeof(uint32_t));
    acct_free(&p->a, p->keys, p->n_keys * sizeof(uint64_t));
    acct_free(&p->a, p->eff, p->n_eff * sizeof(uint32_t));
    acct_free(&p->a, p->tmp, p->n_tmp * sizeof(uint32_t));
    acct_free(&p->a, p->lut, p->n_lut * sizeof(uint32_t));
    acct_free(&p->a, p->heads, p->n_heads * sizeof(uint32_t));
    acct_free(&p->a, p->bits.l0, p->bits.n0 * sizeof(uint64_t));
    acct_free(&p->a, p->bits.l1, p->bits.n1 * sizeof(uint64_t));
    acct_free(&p->a, p->bits.l2, p->bits.n2 * sizeof(uint64_t));
    acct_free(&p->a, p->bins, p->cap_bins * sizeof(bin));
    p->hist = NULL;
    p->keys = NULL;
    p->eff = p->tmp = p->heads = p->lut = NULL;
    p->bits.l0 = p->bits.l1 = p->bits.l2 = NULL;
    p->bins = NULL;
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
static int arrange(planner *p, sl_batch_plan *plan)
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
            rec *r = acct_realloc(&p->a, p->recs, p->cap_recs * sizeof(rec), total * sizeof(rec));

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
        rec *r = acct_realloc(&p->a, p->recs, p->cap_recs * sizeof(rec),
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

static void finish_stats(sl_batch_stats *s, uint64_t max_tokens)
{
    s->padding_fraction =
        s->padded_tokens ? (double)(s->padded_tokens - s->tokens) / (double)s->padded_tokens : 0;
    s->fill = s->batches ? (double)s->tokens / ((double)s->batches * (double)max_tokens) : 0;
}

static void sum_stats(planner *p, sl_batch_plan *plan)
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
        finish_stats(&plan->ranks[r], p->c.max_tokens);
    }
    finish_stats(t, p->c.max_tokens);
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
        return fail(msg, len, SL_EINVAL, "out is NULL");
    *out = NULL;
    if ((err = config_resolve(&p.c, cfg, msg, len)) != 0)
        return err;
    if (n_lengths > SL_BATCH_MAX_SEQUENCES)
        return fail(msg, len, SL_ELIMIT, "%zu lengths is over the limit %" PRIu32, n_lengths,
                    SL_BATCH_MAX_SEQUENCES);
    if (!order)
        n_order = n_lengths;
    if (n_order > SL_BATCH_MAX_SEQUENCES)
        return fail(msg, len, SL_ELIMIT, "an order of %zu samples is over the limit %" PRIu32,
                    n_order, SL_BATCH_MAX_SEQUENCES);
    if (!lengths && n_lengths)
        return fail(msg, len, SL_EINVAL, "lengths is NULL");
    p.lengths = lengths;
    p.order = order;
    p.n_order = n_order;
    p.beff = p.c.max_batch_size;
    if (p.c.strategy != SL_BATCH_PACKED)
        p.beff -= p.beff % p.c.batch_size_multiple;
    p.n_eff = n_order;
    if (!(p.eff = acct_alloc(&p.a, n_order * sizeof(uint32_t)))) {
        err = -ENOMEM;
        goto out;
    }
    if ((err = scan(&p, n_lengths, msg, len)) != 0)
        goto out;

    err = -ENOMEM;
    plan = acct_alloc(&p.a, sizeof(*plan));
    if (!plan)
        goto out;
    memset(plan, 0, sizeof(*plan));
    plan->cfg = p.c;
    plan->ranks = acct_alloc(&p.a, p.c.replicas * sizeof(sl_batch_stats));
    if (!plan->ranks)
        goto out;
    memset(plan->ranks, 0, p.c.replicas * sizeof(sl_batch_stats));
    if (!(p.idx = acct_alloc(&p.a, p.n_idx * sizeof(uint32_t))))
        goto out;
    win = p.c.window == 0 || p.c.window > n_order ? n_order : (size_t)p.c.window;
    if ((err = alloc_scratch(&p, win)) != 0)
        goto out;
    /* A first guess at the batch count keeps the record array from growing many times. */
    p.cap_recs = p.n_idx / (p.beff ? p.beff : 1) + 64;
    if (!(p.recs = acct_alloc(&p.a, p.cap_recs * sizeof(rec)))) {
        err = -ENOMEM;
        goto out;
    }

    /* Windows alternate between ascending and descending order, so the longest sequences at
     * the end of one window meet the longest at the start of the next and the greedy cut runs
     * across window boundaries without a half-empty batch at each one. */
    for (size_t a = 0, w = 0; a < n_order; a += win, w++) {
        size_t b = n_order - a < win ? n_order : a + win, seg = n;

        if (p.c.strategy == SL_BATCH_PACKED) {
            sort_window(&p, a, b, &n, 0);
            if (n > seg && (err = cut_packed(&p, seg, n)) != 0)
                goto out;
        } else {
            sort_window(&p, a, b, &n, (int)(w % 2));
        }
    }
    if (p.c.strategy != SL_BATCH_PACKED && (err = cut_greedy(&p, 0, n)) != 0)
        goto out;
    free_scratch(&p);
    if ((err = arrange(&p, plan)) != 0)
        goto out;
    sum_stats(&p, plan);
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
    free_scratch(&p);
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
