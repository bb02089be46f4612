/* Token-budget batch planning. See batch.h for the contract and docs/batching.md for the design.
 *
 * The planner runs in one straight line: validate the inputs and measure them (pass 1), sort each
 * window of the order by its key into `idx` and cut it into batch records (pass 2), shuffle the
 * records, apply the remainder rule, balance steps, and sum up per-rank statistics. A record
 * refers to a contiguous run of `idx`, so shuffling, repeating and balancing batches only moves
 * 16-byte records, never indices.
 */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* madvise */
#endif
#include "batch/batch.h"

#include "err.h"
#include "util/msg.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#define NONE     UINT32_MAX
#define PREFETCH 64

/* Shuffled inputs of at least this many lengths are gathered from a 16-bit copy (see scan()). */
#define COMPACT_MIN (1u << 20)

/* Carrying (dynamic strategy, padded cost, 16 windows or more; see plan_carry()): a batch that
 * would pad more than CARRY_PAD_PERMILLE / 1000 of its tokens, or the last, incomplete batch of
 * a window, waits for the next window, at most CARRY_WINDOWS windows. */
#define CARRY_PAD_PERMILLE 30
#define CARRY_WINDOWS      2
#define CARRY_MIN_WINDOWS  16

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
    /* Weighted plans: the weights (cfg.rank_weights points here) and each rank's budgets. */
    double *weights;
    uint64_t *budget;
    uint32_t *mbs;
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

/* Arrays the planner fills completely and that are large enough to come straight from mmap are
 * faulted in with one madvise call instead of one page fault per page: first touch of 40 MB
 * costs ~30 ms on the project VM that way, ~13 ms this way. Only a hint: before Linux 5.14
 * (no MADV_POPULATE_WRITE) or elsewhere nothing happens. */
#define POPULATE_MIN  (8u << 20)
#define POPULATE_PAGE 4096u /* with larger pages madvise fails on the alignment: no harm */
#if defined(__linux__) && !defined(MADV_POPULATE_WRITE)
#define MADV_POPULATE_WRITE 23
#endif

static void populate(void *p, size_t n)
{
#if defined(__linux__)
    const uintptr_t pg = POPULATE_PAGE;

    if (p && n >= POPULATE_MIN) {
        uintptr_t s = ((uintptr_t)p + pg - 1) & ~(pg - 1), e = ((uintptr_t)p + n) & ~(pg - 1);

        if (e > s)
            (void)madvise((void *)s, e - s, MADV_POPULATE_WRITE);
    }
#else
    (void)p;
    (void)n;
#endif
}

static void acct_free(acct *a, void *p, size_t n)
{
    if (p) {
        free(p);
        a->cur -= n;
    }
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
/* A weight as a fraction of the largest, in units of 2^-32: one correctly rounded division and
 * multiplication, the same on every IEEE machine; everything after is integer arithmetic. */
static uint64_t weight_q(double w, double top)
{
    return (uint64_t)llround(w / top * 4294967296.0);
}

static int config_resolve(sl_batch_config *out, const sl_batch_config *in, char *msg, size_t len)
{
    sl_batch_config c;

    if (!in)
        return sl_fail(msg, len, SL_EINVAL, "config is NULL");
    c = *in;
    if ((unsigned)c.strategy > SL_BATCH_PACKED)
        return sl_fail(msg, len, SL_EINVAL, "strategy %d is not pad, bucket, dynamic or packed",
                       (int)c.strategy);
    if ((unsigned)c.cost > SL_BATCH_COST_SUM)
        return sl_fail(msg, len, SL_EINVAL, "cost model %d is not padded or sum", (int)c.cost);
    if ((unsigned)c.overlong > SL_BATCH_SKIP)
        return sl_fail(msg, len, SL_EINVAL, "overlong policy %d is not truncate or skip",
                       (int)c.overlong);
    if ((unsigned)c.remainder > SL_BATCH_REPEAT)
        return sl_fail(msg, len, SL_EINVAL, "remainder policy %d is not drop or pad",
                       (int)c.remainder);
    if (c.max_batch_size == 0)
        return sl_fail(msg, len, SL_EINVAL, "max_batch_size must be at least 1 (got 0)");
    if (c.max_seq_len == 0)
        return sl_fail(msg, len, SL_EINVAL, "max_seq_len must be at least 1 (got 0)");
    if (c.max_seq_len > SL_BATCH_MAX_SEQ_LEN)
        return sl_fail(msg, len, SL_ELIMIT, "max_seq_len %" PRIu32 " is over the limit %u",
                       c.max_seq_len, SL_BATCH_MAX_SEQ_LEN);
    if (c.max_tokens == 0) {
        /* Both factors are 32-bit, so the product cannot overflow 64 bits. */
        uint64_t t = (uint64_t)c.max_batch_size * c.max_seq_len;

        if (t > SL_BATCH_MAX_TOKENS)
            return sl_fail(msg, len, SL_ELIMIT,
                           "max_batch_size %" PRIu32 " x max_seq_len %" PRIu32 " = %" PRIu64
                           " tokens is over the limit %" PRIu32 "; set max_tokens",
                           c.max_batch_size, c.max_seq_len, t, SL_BATCH_MAX_TOKENS);
        c.max_tokens = t;
    }
    if (c.max_tokens > SL_BATCH_MAX_TOKENS)
        return sl_fail(msg, len, SL_ELIMIT, "max_tokens %" PRIu64 " is over the limit %" PRIu32,
                       c.max_tokens, SL_BATCH_MAX_TOKENS);
    if (c.max_tokens < c.max_seq_len)
        return sl_fail(msg, len, SL_EINVAL,
                       "max_tokens %" PRIu64 " is smaller than max_seq_len %" PRIu32
                       ": a sequence of max_seq_len tokens would not fit in any batch",
                       c.max_tokens, c.max_seq_len);
    if (c.cost == SL_BATCH_COST_DEFAULT)
        c.cost = c.strategy == SL_BATCH_PACKED ? SL_BATCH_COST_SUM : SL_BATCH_COST_PADDED;
    if (c.strategy == SL_BATCH_PACKED && c.cost != SL_BATCH_COST_SUM)
        return sl_fail(msg, len, SL_EINVAL,
                       "the packed strategy packs by sum of lengths; cost model padded does not "
                       "apply to it");
    if (c.bucket_width == 0)
        c.bucket_width = SL_BATCH_DEFAULT_BUCKET;
    if (c.batch_size_multiple == 0)
        c.batch_size_multiple = 1;
    if (c.batch_size_multiple > c.max_batch_size)
        return sl_fail(msg, len, SL_EINVAL,
                       "batch_size_multiple %" PRIu32 " is larger than max_batch_size %" PRIu32,
                       c.batch_size_multiple, c.max_batch_size);
    if (c.replicas == 0)
        c.replicas = 1;
    if (c.replicas > SL_BATCH_MAX_REPLICAS)
        return sl_fail(msg, len, SL_ELIMIT, "replicas %" PRIu32 " is over the limit %u", c.replicas,
                       SL_BATCH_MAX_REPLICAS);
    if (c.n_rank_weights) {
        double top = 0;

        if (!c.rank_weights)
            return sl_fail(msg, len, SL_EINVAL, "rank_weights is NULL");
        if (c.n_rank_weights != c.replicas)
            return sl_fail(msg, len, SL_EINVAL,
                           "%" PRIu32 " rank weights for %" PRIu32
                           " data-parallel ranks: give one weight per rank",
                           c.n_rank_weights, c.replicas);
        if (c.balance)
            return sl_fail(
                msg, len, SL_EINVAL,
                "balance does not apply with rank weights: each rank has its own budget");
        for (uint32_t r = 0; r < c.n_rank_weights; r++) {
            double w = c.rank_weights[r];

            if (!isfinite(w) || !(w > 0))
                return sl_fail(msg, len, SL_EINVAL,
                               "rank weight %" PRIu32 " is %g: weights must be positive and finite",
                               r, w);
            if (w > top)
                top = w;
        }
        for (uint32_t r = 0; r < c.n_rank_weights; r++) {
            uint64_t q = weight_q(c.rank_weights[r], top), b = (c.max_tokens * q) >> 32;

            if (b < c.max_seq_len)
                return sl_fail(msg, len, SL_EINVAL,
                               "rank weight %" PRIu32 " is %g: its budget of %" PRIu64
                               " tokens (max_tokens %" PRIu64 " x %g / %g) is below max_seq_len "
                               "%" PRIu32,
                               r, c.rank_weights[r], b, c.max_tokens, c.rank_weights[r], top,
                               c.max_seq_len);
        }
    }
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
    if (!m && w1 + 1 < b->n1 && b->l1[w1 + 1]) {
        /* The next level-1 word: the common miss (e.g. only bins with more room than any
         * sequence needs are open), found without the level-2 scan. */
        m = b->l1[++w1];
    } else if (!m) {
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
    /* packed and carrying plans work one window at a time and keep the effective lengths in
     * idx itself until the windows overwrite them (eff == idx); win holds the sorted lengths
     * of one window (packed) */
    int windowed;
    uint32_t *win;
    size_t n_win;
    uint32_t *lut; /* bucket: lut[e] = e / bucket_width, when cheaper than dividing */
    size_t n_lut;
    /* carry scratch: the pool of one window plus what earlier windows carried (sorted by
     * length, with each sequence's age in windows), and what this window carries on */
    uint32_t *pidx, *peff, *cidx, *ceff;
    uint8_t *page, *cage;
    size_t cap_pool, cap_carry, n_carry;
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

/* Longest length and real tokens of eff[a, a + n). */
static void measure(const uint32_t *eff, size_t a, uint32_t n, uint32_t *mx, uint64_t *tok)
{
    *mx = 0;
    *tok = 0;
    for (size_t k = a; k < a + n; k++) {
        uint32_t s = eff[k];

        *mx = s > *mx ? s : *mx;
        *tok += s;
    }
}

/* pad, bucket and dynamic: walk the lengths eff[a, b) and close a batch whenever the next
 * sequence would break the size cap or the budget. With a batch size multiple m, an overflowing
 * batch keeps its largest multiple of m and carries the rest into the next batch, as fairseq
 * does. Records refer to positions in eff. */
static int cut_greedy(planner *p, const uint32_t *eff, size_t a, size_t b)
{
    const int padded = p->c.cost == SL_BATCH_COST_PADDED;
    const uint32_t m = p->c.batch_size_multiple;
    const uint64_t t = p->c.max_tokens;
    size_t start = a;
    uint32_t cnt = 0, mx = 0;
    uint64_t tok = 0;
    int err;

    for (size_t k = a; k < b; k++) {
        uint32_t s = eff[k];

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
                measure(eff, start, keep, &kmx, &ktok);
            }
            if ((err = emit(p, start, keep, kmx, ktok)) != 0)
                return err;
            start += keep;
            cnt -= keep;
            measure(eff, start, cnt, &mx, &tok);
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

/* packed: best-fit-decreasing over one window's kept samples sx[0, b - a), sorted by ascending
 * length; e[k - a] is the length of sx[k - a] (and is overwritten with its bin). The samples are
 * laid out bin by bin in idx[a, b). A bin with room r sits in capacity class min(r, hmax); every
 * bin with at least hmax tokens of room fits any sequence, and among those the most recently
 * touched one is filled first. */
static int cut_packed(planner *p, uint32_t *e, const uint32_t *sx, size_t a, size_t b)
{
    size_t w = b - a, first = p->n_bins;
    int err;

    e -= a;
    /* Equal lengths come in runs. After a sequence of length s goes into the best-fitting bin,
     * that bin is the best fit for the next s as long as it still has s tokens of room (its
     * class only got smaller, and it is at the head of it), so one placement puts as many of
     * the run into it as fit: the same bins as one sequence at a time, with one search and
     * one list update per placement instead of per sequence. */
    for (size_t k = b; k > a;) {
        const uint32_t s = e[k - 1];
        size_t j = k - 1;

        while (j > a && e[j - 1] == s)
            j--;
        while (k > j) {
            uint32_t c = bits_next(&p->bits, s), bi, m;
            bin *bn;

            if (c != NONE) {
                bi = p->heads[c];
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
            bn = &p->bins[bi];
            /* Room for at least one (its class is >= s), and an open bin is under the cap. */
            m = bn->rem / s;
            if (m > p->beff - bn->count)
                m = p->beff - bn->count;
            if (m > k - j)
                m = (uint32_t)(k - j);
            bn->rem -= m * s;
            bn->count += m;
            bn->tokens += m * s;
            if (s > bn->max_len)
                bn->max_len = s;
            for (uint32_t q = 0; q < m; q++)
                e[--k] = bi; /* the length is no longer needed: remember the bin instead */
            if (bn->count < p->beff && bn->rem > 0)
                bin_link(p, bi);
        }
    }
    /* Close the window: unlink open bins, then lay the samples out bin by bin in idx[a, b), in
     * the order the bins were opened, and emit one record per bin. */
    for (size_t bi = first, pos = a; bi < p->n_bins; bi++) {
        if (p->bins[bi].cls != NONE)
            bin_unlink(p, (uint32_t)bi);
        p->bins[bi].start = (uint32_t)pos;
        pos += p->bins[bi].count;
        p->bins[bi].count = 0;
    }
    for (size_t k = 0; k < w; k++) {
        bin *bn = &p->bins[e[a + k]];

        p->idx[bn->start + bn->count++] = sx[k];
    }
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

/* Stable sort of the kept samples of order[a, b) by key, ascending or descending, into
 * didx[0, *n_out) with their lengths in deff. src[k - a] is the effective length of order
 * position k (0: skipped). deff may be src or p->eff + out for some out <= a (the output never
 * runs ahead of the input); the sorted lengths are then staged in p->tmp (stage == p->tmp),
 * otherwise written directly (stage == deff). didx must not overlap src or stage. A counting
 * sort when the window is at least a quarter of the key range, else a sort of (key, position)
 * pairs, so the scratch stays O(key range) whatever the window. */
static void sort_window(planner *p, const uint32_t *src, size_t a, size_t b, uint32_t *didx,
                        uint32_t *deff, uint32_t *stage, size_t *n_out, int desc)
{
    size_t n = 0;

    src -= a;
    if (p->c.strategy == SL_BATCH_PAD || b - a == 1) {
        for (size_t k = a; k < b; k++) {
            if (src[k]) {
                didx[n] = order_at(p, k);
                deff[n++] = src[k];
            }
        }
    } else if (p->hist && (b - a) * 4 >= p->n_hist) {
        /* dynamic and packed sort by the length itself: skipped samples (0) count in h[0],
         * which is then cleared, and the hot loops need no test of the strategy. */
        const int bylen = p->c.strategy != SL_BATCH_BUCKET;
        uint32_t *h = p->hist, sum = 0;

        memset(h, 0, p->n_hist * sizeof(uint32_t));
        if (bylen) {
            for (size_t k = a; k < b; k++)
                h[src[k]]++;
            h[0] = 0;
        } else {
            for (size_t k = a; k < b; k++) {
                if (src[k])
                    h[key_of(p, src[k])]++;
            }
        }
        for (size_t v = 0; v < p->n_hist; v++) {
            size_t x = desc ? p->n_hist - 1 - v : v;
            uint32_t c = h[x];

            h[x] = sum;
            sum += c;
        }
        if (bylen && p->order) {
            for (size_t k = a; k < b; k++) {
                uint32_t e = src[k], pos;

                if (e) {
                    pos = h[e]++;
                    didx[pos] = (uint32_t)p->order[k];
                    stage[pos] = e;
                }
            }
        } else {
            for (size_t k = a; k < b; k++) {
                uint32_t e = src[k], pos;

                if (e) {
                    pos = h[key_of(p, e)]++;
                    didx[pos] = order_at(p, k);
                    stage[pos] = e;
                }
            }
        }
        n = sum;
        if (stage != deff && n > 0)
            memcpy(deff, stage, n * sizeof(uint32_t));
    } else {
        for (size_t k = a; k < b; k++) {
            uint32_t e = src[k], key;

            if (e) {
                key = desc ? ~key_of(p, e) : key_of(p, e);
                p->keys[n++] = (uint64_t)key << 32 | (uint32_t)(k - a);
            }
        }
        /* An all-skipped window has no keys (and maybe no key array). */
        if (n > 1)
            qsort(p->keys, n, sizeof(uint64_t), cmp_u64);
        for (size_t j = 0; j < n; j++) {
            size_t k = a + (uint32_t)p->keys[j];

            didx[j] = order_at(p, k);
            stage[j] = src[k];
        }
        if (stage != deff && n > 0)
            memcpy(deff, stage, n * sizeof(uint32_t));
    }
    *n_out = n;
}

/* Pass 1: check every index and length, count truncated and skipped, find the longest.
 *
 * The gather through a shuffled order misses the cache on every sample. Two things help: asking
 * for the length a few dozen samples ahead overlaps those misses (about 2x at 1e7 samples), and,
 * for large shuffled inputs with max_seq_len < 65535, gathering from a 16-bit copy of the
 * lengths clamped to max_seq_len + 1 (a sequential pass): half the bytes, so 1e7 lengths fit the
 * last-level cache (20 MB) and the gather mostly hits it. The copy keeps 0 (an error) and
 * "longer than max_seq_len" apart, so the results are the same. */
static inline __attribute__((always_inline)) int scan_loop(planner *p, const uint16_t *c16,
                                                           size_t n_lengths, char *msg, size_t len)
{
    const uint32_t maxl = p->c.max_seq_len;
    const size_t n = p->n_order, pre = n > PREFETCH ? n - PREFETCH : 0;
    const uint64_t *order = p->order;
    uint32_t *eff = p->eff, hmax = p->hmax;
    size_t kept = 0;
    int err = 0;

    for (size_t k = 0; k < n; k++) {
        uint64_t i = order ? order[k] : k;
        uint32_t l;

        if (order && k < pre && order[k + PREFETCH] < n_lengths) {
            if (c16)
                __builtin_prefetch(&c16[order[k + PREFETCH]]);
            else
                __builtin_prefetch(&p->lengths[order[k + PREFETCH]]);
        }
        if (i >= n_lengths) {
            err = sl_fail(msg, len, SL_EINVAL, "order[%zu] = %" PRIu64 " is out of range [0, %zu)",
                          k, i, n_lengths);
            break;
        }
        l = c16 ? c16[i] : p->lengths[i];
        if (l == 0) {
            err = sl_fail(msg, len, SL_EINVAL,
                          "sample %" PRIu64 " has length 0 (every length must be at least 1)", i);
            break;
        }
        if (l > maxl) {
            if (p->c.overlong == SL_BATCH_SKIP) {
                p->skipped++;
                eff[k] = 0;
                continue;
            }
            p->truncated++;
            l = maxl;
        }
        hmax = l > hmax ? l : hmax;
        eff[k] = l;
        kept++;
    }
    p->hmax = hmax;
    p->n_idx += kept;
    return err;
}

static int scan(planner *p, size_t n_lengths, char *msg, size_t len)
{
    const uint32_t maxl = p->c.max_seq_len;
    uint16_t *c16 = NULL;
    size_t n16 = 0;
    int err;

    if (p->order && n_lengths >= COMPACT_MIN && n_lengths / 2 <= p->n_order && maxl < UINT16_MAX &&
        (c16 = acct_alloc(&p->a, n_lengths * sizeof(uint16_t))) != NULL) {
        populate(c16, n_lengths * sizeof(uint16_t));
        const uint32_t cap = maxl + 1, *restrict src = p->lengths;
        uint16_t *restrict dst = c16;

        n16 = n_lengths;
        for (size_t i = 0; i < n_lengths; i++)
            dst[i] = (uint16_t)(src[i] < cap ? src[i] : cap);
    }
    /* Two copies of the loop, so neither tests which array it reads per sample. */
    if (c16)
        err = scan_loop(p, c16, n_lengths, msg, len);
    else
        err = scan_loop(p, NULL, n_lengths, msg, len);
    acct_free(&p->a, c16, n16 * sizeof(uint16_t));
    return err;
}

/* Whether the dynamic strategy carries sequences between windows: only under the padded cost
 * (the sum cost pads nothing) and with at least CARRY_MIN_WINDOWS full windows, which keeps the
 * carry scratch (45 bytes per sample of a window) under 3 bytes per sequence. */
static int carry_mode(const planner *p, size_t win)
{
    return p->c.strategy == SL_BATCH_DYNAMIC && p->c.cost == SL_BATCH_COST_PADDED && win > 0 &&
           p->n_order / win >= CARRY_MIN_WINDOWS;
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
        populate(p->tmp, p->n_tmp * sizeof(uint32_t));
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
        p->n_win = win < p->n_order ? win : p->n_order;
        if (!(p->win = acct_alloc(&p->a, p->n_win * sizeof(uint32_t))))
            return -ENOMEM;
        populate(p->win, p->n_win * sizeof(uint32_t));
    }
    if (carry_mode(p, win)) {
        p->cap_carry = CARRY_WINDOWS * win;
        p->cap_pool = p->cap_carry + win;
        p->pidx = acct_alloc(&p->a, p->cap_pool * sizeof(uint32_t));
        p->peff = acct_alloc(&p->a, p->cap_pool * sizeof(uint32_t));
        p->page = acct_alloc(&p->a, p->cap_pool);
        p->cidx = acct_alloc(&p->a, p->cap_carry * sizeof(uint32_t));
        p->ceff = acct_alloc(&p->a, p->cap_carry * sizeof(uint32_t));
        p->cage = acct_alloc(&p->a, p->cap_carry);
        if (!p->pidx || !p->peff || !p->page || !p->cidx || !p->ceff || !p->cage)
            return -ENOMEM;
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
    if (p->eff != p->idx)
        acct_free(&p->a, p->eff, p->n_eff * sizeof(uint32_t));
    acct_free(&p->a, p->win, p->n_win * sizeof(uint32_t));
    p->win = NULL;
    acct_free(&p->a, p->tmp, p->n_tmp * sizeof(uint32_t));
    acct_free(&p->a, p->lut, p->n_lut * sizeof(uint32_t));
    acct_free(&p->a, p->heads, p->n_heads * sizeof(uint32_t));
    acct_free(&p->a, p->bits.l0, p->bits.n0 * sizeof(uint64_t));
    acct_free(&p->a, p->bits.l1, p->bits.n1 * sizeof(uint64_t));
    acct_free(&p->a, p->bits.l2, p->bits.n2 * sizeof(uint64_t));
    acct_free(&p->a, p->bins, p->cap_bins * sizeof(bin));
    acct_free(&p->a, p->pidx, p->cap_pool * sizeof(uint32_t));
    acct_free(&p->a, p->peff, p->cap_pool * sizeof(uint32_t));
    acct_free(&p->a, p->page, p->cap_pool);
    acct_free(&p->a, p->cidx, p->cap_carry * sizeof(uint32_t));
    acct_free(&p->a, p->ceff, p->cap_carry * sizeof(uint32_t));
    acct_free(&p->a, p->cage, p->cap_carry);
    p->pidx = p->peff = p->cidx = p->ceff = NULL;
    p->page = p->cage = NULL;
    p->hist = NULL;
    p->keys = NULL;
    p->eff = p->tmp = p->heads = p->lut = NULL;
    p->bits.l0 = p->bits.l1 = p->bits.l2 = NULL;
    p->bins = NULL;
}

/* The dynamic strategy with many small windows. A window of ~100 batches holds few very short
 * and very long sequences, so the batches at the two ends of its length range mix lengths far
 * apart (they caused most of the padding: a batch of the shortest sequences padded a third of
 * its tokens). Each window is sorted and merged with the sequences earlier windows carried
 * (already sorted), the pool is cut greedily, and a batch is only kept if it pads at most
 * CARRY_PAD_PERMILLE / 1000 or it is the last window or one of its sequences has waited
 * CARRY_WINDOWS windows already; the other batches, and the last, incomplete one, are carried
 * into the next window's pool. So a sequence is batched at most CARRY_WINDOWS windows after its
 * own, and sparse lengths find partners in the next windows instead of padding. Kept batches are
 * laid out in idx in order; the number of planned sequences is returned in *n_out. */
static int plan_carry(planner *p, size_t win, size_t *n_out)
{
    size_t n = 0;
    int err;

    for (size_t a = 0; a < p->n_order; a += win) {
        size_t b = p->n_order - a < win ? p->n_order : a + win, C = p->n_carry, k, i = 0, j = 0;
        size_t o = 0, r0 = p->n_recs, w = r0;
        int last = b == p->n_order;

        if (p->hist && (b - a) * 4 >= p->n_hist) {
            /* One counting sort of the carried sequences (first, so they come first on ties)
             * and the window's: no merge, no branch per sequence. */
            uint32_t *h = p->hist, sum = 0;

            memset(h, 0, p->n_hist * sizeof(uint32_t));
            for (size_t q = 0; q < C; q++)
                h[p->ceff[q]]++;
            for (size_t q = a; q < b; q++)
                h[p->eff[q]]++; /* skipped samples count under 0 and are left out below */
            for (size_t v = 1; v < p->n_hist; v++) {
                uint32_t c = h[v];

                h[v] = sum;
                sum += c;
            }
            for (size_t q = 0; q < C; q++) {
                uint32_t pos = h[p->ceff[q]]++;

                p->pidx[pos] = p->cidx[q];
                p->peff[pos] = p->ceff[q];
                p->page[pos] = p->cage[q];
            }
            for (size_t q = a; q < b; q++) {
                uint32_t e = p->eff[q], pos;

                if (e) {
                    pos = h[e]++;
                    p->pidx[pos] = order_at(p, q);
                    p->peff[pos] = e;
                    p->page[pos] = 0;
                }
            }
            k = sum - C;
            i = C;
            j = k;
        } else {
            sort_window(p, p->eff + a, a, b, p->pidx + C, p->peff + C, p->peff + C, &k, 0);
        }
        /* Merge: the carried run comes first on ties (it is older). The window's run sits at
         * the end of the pool, so the merge never overwrites what it has still to read. */
        while (i < C && j < k) {
            if (p->ceff[i] <= p->peff[C + j]) {
                p->pidx[o] = p->cidx[i];
                p->peff[o] = p->ceff[i];
                p->page[o++] = p->cage[i++];
            } else {
                p->pidx[o] = p->pidx[C + j];
                p->peff[o] = p->peff[C + j];
                p->page[o++] = 0;
                j++;
            }
        }
        for (; i < C; i++, o++) {
            p->pidx[o] = p->cidx[i];
            p->peff[o] = p->ceff[i];
            p->page[o] = p->cage[i];
        }
        for (; j < k; j++, o++)
            p->page[o] = 0; /* already in place: o == C + j */
        (void)o;
        p->n_carry = 0;
        if ((err = cut_greedy(p, p->peff, 0, C + k)) != 0)
            return err;
        for (size_t r = r0; r < p->n_recs; r++) {
            rec x = p->recs[r];
            uint64_t padded = (uint64_t)x.count * x.max_len;
            int carry = !last && (r + 1 == p->n_recs || (padded - x.tokens) * 1000 >
                                                            (uint64_t)CARRY_PAD_PERMILLE * padded);

            for (uint32_t q = 0; carry && q < x.count; q++)
                carry = p->page[x.start + q] < CARRY_WINDOWS;
            if (carry) {
                for (uint32_t q = 0; q < x.count; q++, p->n_carry++) {
                    p->cidx[p->n_carry] = p->pidx[x.start + q];
                    p->ceff[p->n_carry] = p->peff[x.start + q];
                    p->cage[p->n_carry] = (uint8_t)(p->page[x.start + q] + 1);
                }
                continue;
            }
            memcpy(p->idx + n, p->pidx + x.start, x.count * sizeof(uint32_t));
            x.start = (uint32_t)n;
            n += x.count;
            p->recs[w++] = x;
        }
        p->n_recs = w;
    }
    *n_out = n;
    return 0;
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

        q[r] = weight_q(c->rank_weights[r], top);
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
        finish_stats(&plan->ranks[r], plan->budget[r]);
    }
    {
        uint64_t sum_budget = 0;

        for (uint32_t r = 0; r < d; r++)
            sum_budget += plan->budget[r];
        finish_stats(&plan->total, sum_budget / d ? sum_budget / d : 1);
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
    if ((err = config_resolve(&p.c, cfg, msg, len)) != 0)
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
    p.windowed = p.c.strategy == SL_BATCH_PACKED || carry_mode(&p, win);
    p.n_eff = n_order;
    if (!(p.eff = acct_alloc(&p.a, n_order * sizeof(uint32_t)))) {
        err = -ENOMEM;
        goto out;
    }
    populate(p.eff, n_order * sizeof(uint32_t));
    if (p.windowed)
        p.idx = p.eff; /* sized for every order position until the windows are done */
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
    if (!p.windowed) {
        if (!(p.idx = acct_alloc(&p.a, p.n_idx * sizeof(uint32_t))))
            goto out;
        populate(p.idx, p.n_idx * sizeof(uint32_t));
    }
    if ((err = alloc_scratch(&p, win)) != 0)
        goto out;
    /* A first guess at the batch count keeps the record array from growing many times. */
    p.cap_recs = p.n_idx / (p.beff ? p.beff : 1) + 64;
    if (!(p.recs = acct_alloc(&p.a, p.cap_recs * sizeof(rec)))) {
        err = -ENOMEM;
        goto out;
    }

    if (p.n_idx == 0) {
        /* Nothing kept (every sequence skipped): no windows to sort, and no scratch. */
    } else if (carry_mode(&p, win)) {
        if ((err = plan_carry(&p, win, &n)) != 0)
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
                sort_window(&p, p.eff + a, a, b, p.tmp, p.win, p.win, &k, 0);
                n += k;
                if (n > seg && (err = cut_packed(&p, p.win, p.tmp, seg, n)) != 0)
                    goto out;
            } else {
                sort_window(&p, p.eff + a, a, b, p.idx + n, p.eff + n, p.tmp, &k, (int)(w % 2));
                n += k;
            }
        }
        if (p.c.strategy != SL_BATCH_PACKED && (err = cut_greedy(&p, p.eff, 0, n)) != 0)
            goto out;
    }
    free_scratch(&p);
    if (p.windowed && p.n_idx < n_order) {
        /* Skipped samples: give back the order positions idx no longer needs. */
        uint32_t *q = acct_realloc(&p.a, p.idx, n_order * sizeof(uint32_t),
                                   (p.n_idx ? p.n_idx : 1) * sizeof(uint32_t));

        if (q)
            p.idx = q;
    }
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
    /* The contract promises a message for every failure; the allocation sites leave it to us. */
    if (err == -ENOMEM)
        sl_fail(msg, len, err, "out of memory planning an epoch of %zu samples", n_order);
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
