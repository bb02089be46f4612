/* Token-budget batch planning: cutting sorted runs into batch records, greedy and packed
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

static int emit(planner *p, size_t start, uint32_t count, uint32_t max_len, uint64_t tokens)
{
    if (p->n_recs == p->cap_recs) {
        size_t ncap = p->cap_recs + p->cap_recs / 2 + 64;
        rec *r = bt_acct_realloc(&p->a, p->recs, p->cap_recs * sizeof(rec), ncap * sizeof(rec));

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
int bt_cut_greedy(planner *p, const uint32_t *eff, size_t a, size_t b)
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
int bt_cut_packed(planner *p, uint32_t *e, const uint32_t *sx, size_t a, size_t b)
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
                    bin *nb = bt_acct_realloc(&p->a, p->bins, p->cap_bins * sizeof(bin),
                                              ncap * sizeof(bin));

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
