/* Token-budget batch planning: pass 1 (scan) and pass 2 (sorting windows, scratch, carrying)
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
void bt_sort_window(planner *p, const uint32_t *src, size_t a, size_t b, uint32_t *didx,
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

int bt_scan(planner *p, size_t n_lengths, char *msg, size_t len)
{
    const uint32_t maxl = p->c.max_seq_len;
    uint16_t *c16 = NULL;
    size_t n16 = 0;
    int err;

    if (p->order && n_lengths >= COMPACT_MIN && n_lengths / 2 <= p->n_order && maxl < UINT16_MAX &&
        (c16 = bt_acct_alloc(&p->a, n_lengths * sizeof(uint16_t))) != NULL) {
        bt_populate(c16, n_lengths * sizeof(uint16_t));
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
    bt_acct_free(&p->a, c16, n16 * sizeof(uint16_t));
    return err;
}

/* Whether the dynamic strategy carries sequences between windows: only under the padded cost
 * (the sum cost pads nothing) and with at least CARRY_MIN_WINDOWS full windows, which keeps the
 * carry scratch (45 bytes per sample of a window) under 3 bytes per sequence. */
int bt_carry_mode(const planner *p, size_t win)
{
    return p->c.strategy == SL_BATCH_DYNAMIC && p->c.cost == SL_BATCH_COST_PADDED && win > 0 &&
           p->n_order / win >= CARRY_MIN_WINDOWS;
}

int bt_alloc_scratch(planner *p, size_t win)
{
    size_t nkeys, last;

    if (p->n_idx == 0)
        return 0;
    last = p->n_order % win;
    nkeys = p->c.strategy == SL_BATCH_BUCKET ? p->hmax / p->c.bucket_width + 1 : p->hmax + 1;
    if (p->c.strategy != SL_BATCH_PAD && win > 1) {
        if (win * 4 >= nkeys) {
            p->n_hist = nkeys;
            if (!(p->hist = bt_acct_alloc(&p->a, nkeys * sizeof(uint32_t))))
                return -ENOMEM;
        }
        /* Windows shorter than a quarter of the key range (perhaps only the last one) sort
         * (key, position) pairs instead, in scratch of their own size. */
        if (win * 4 < nkeys)
            p->n_keys = win;
        else if (last > 1 && last * 4 < nkeys)
            p->n_keys = last;
        if (p->n_keys && !(p->keys = bt_acct_alloc(&p->a, p->n_keys * sizeof(uint64_t))))
            return -ENOMEM;
    }
    if ((p->c.strategy != SL_BATCH_PAD && win > 1) || p->c.strategy == SL_BATCH_PACKED) {
        p->n_tmp = win < p->n_idx ? win : p->n_idx;
        if (!(p->tmp = bt_acct_alloc(&p->a, p->n_tmp * sizeof(uint32_t))))
            return -ENOMEM;
        bt_populate(p->tmp, p->n_tmp * sizeof(uint32_t));
    }
    if (p->c.strategy == SL_BATCH_BUCKET && win > 1 && p->hmax <= p->n_order) {
        /* Two divisions per sample cost more than the whole counting sort. */
        p->n_lut = (size_t)p->hmax + 1;
        if (!(p->lut = bt_acct_alloc(&p->a, p->n_lut * sizeof(uint32_t))))
            return -ENOMEM;
        for (size_t e = 0; e < p->n_lut; e++)
            p->lut[e] = (uint32_t)(e / p->c.bucket_width);
    }
    if (p->c.strategy == SL_BATCH_PACKED) {
        p->n_win = win < p->n_order ? win : p->n_order;
        if (!(p->win = bt_acct_alloc(&p->a, p->n_win * sizeof(uint32_t))))
            return -ENOMEM;
        bt_populate(p->win, p->n_win * sizeof(uint32_t));
    }
    if (bt_carry_mode(p, win)) {
        p->cap_carry = CARRY_WINDOWS * win;
        p->cap_pool = p->cap_carry + win;
        p->pidx = bt_acct_alloc(&p->a, p->cap_pool * sizeof(uint32_t));
        p->peff = bt_acct_alloc(&p->a, p->cap_pool * sizeof(uint32_t));
        p->page = bt_acct_alloc(&p->a, p->cap_pool);
        p->cidx = bt_acct_alloc(&p->a, p->cap_carry * sizeof(uint32_t));
        p->ceff = bt_acct_alloc(&p->a, p->cap_carry * sizeof(uint32_t));
        p->cage = bt_acct_alloc(&p->a, p->cap_carry);
        if (!p->pidx || !p->peff || !p->page || !p->cidx || !p->ceff || !p->cage)
            return -ENOMEM;
    }
    if (p->c.strategy == SL_BATCH_PACKED) {
        p->n_heads = (size_t)p->hmax + 1;
        p->bits.n0 = (p->n_heads + 63) / 64;
        p->bits.n1 = (p->bits.n0 + 63) / 64;
        p->bits.n2 = (p->bits.n1 + 63) / 64;
        p->heads = bt_acct_alloc(&p->a, p->n_heads * sizeof(uint32_t));
        p->bits.l0 = bt_acct_alloc(&p->a, p->bits.n0 * sizeof(uint64_t));
        p->bits.l1 = bt_acct_alloc(&p->a, p->bits.n1 * sizeof(uint64_t));
        p->bits.l2 = bt_acct_alloc(&p->a, p->bits.n2 * sizeof(uint64_t));
        if (!p->heads || !p->bits.l0 || !p->bits.l1 || !p->bits.l2)
            return -ENOMEM;
        memset(p->heads, 0xff, p->n_heads * sizeof(uint32_t));
        memset(p->bits.l0, 0, p->bits.n0 * sizeof(uint64_t));
        memset(p->bits.l1, 0, p->bits.n1 * sizeof(uint64_t));
        memset(p->bits.l2, 0, p->bits.n2 * sizeof(uint64_t));
    }
    return 0;
}

void bt_free_scratch(planner *p)
{
    bt_acct_free(&p->a, p->hist, p->n_hist * sizeof(uint32_t));
    bt_acct_free(&p->a, p->keys, p->n_keys * sizeof(uint64_t));
    if (p->eff != p->idx)
        bt_acct_free(&p->a, p->eff, p->n_eff * sizeof(uint32_t));
    bt_acct_free(&p->a, p->win, p->n_win * sizeof(uint32_t));
    p->win = NULL;
    bt_acct_free(&p->a, p->tmp, p->n_tmp * sizeof(uint32_t));
    bt_acct_free(&p->a, p->lut, p->n_lut * sizeof(uint32_t));
    bt_acct_free(&p->a, p->heads, p->n_heads * sizeof(uint32_t));
    bt_acct_free(&p->a, p->bits.l0, p->bits.n0 * sizeof(uint64_t));
    bt_acct_free(&p->a, p->bits.l1, p->bits.n1 * sizeof(uint64_t));
    bt_acct_free(&p->a, p->bits.l2, p->bits.n2 * sizeof(uint64_t));
    bt_acct_free(&p->a, p->bins, p->cap_bins * sizeof(bin));
    bt_acct_free(&p->a, p->pidx, p->cap_pool * sizeof(uint32_t));
    bt_acct_free(&p->a, p->peff, p->cap_pool * sizeof(uint32_t));
    bt_acct_free(&p->a, p->page, p->cap_pool);
    bt_acct_free(&p->a, p->cidx, p->cap_carry * sizeof(uint32_t));
    bt_acct_free(&p->a, p->ceff, p->cap_carry * sizeof(uint32_t));
    bt_acct_free(&p->a, p->cage, p->cap_carry);
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
int bt_plan_carry(planner *p, size_t win, size_t *n_out)
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
            bt_sort_window(p, p->eff + a, a, b, p->pidx + C, p->peff + C, p->peff + C, &k, 0);
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
        if ((err = bt_cut_greedy(p, p->peff, 0, C + k)) != 0)
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
