/* Permutations: torch's CPU randperm (MT19937) and a keyed Feistel bijection. */
#include "internal.h"

#include <string.h>

/* Domains have at least 2^4 elements: with 1-bit halves a Feistel network reaches only a few
 * permutations, and cycle-walking a tiny n over 16 values costs little. */
#define SL_FEISTEL_MINBITS 4

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));

    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

void sl_feistel_init(sl_feistel *f, uint64_t n, uint64_t seed, uint64_t epoch, uint64_t tag)
{
    unsigned k = SL_FEISTEL_MINBITS;
    uint64_t st;

    memset(f, 0, sizeof(*f));
    f->n = n;
    /* The smallest 2^k >= n, k >= 2 so both halves have at least one bit. */
    while (k < 64 && (UINT64_C(1) << k) < n)
        k++;
    f->wr = k / 2;
    f->wl = k - f->wr;
    f->mask_l = (UINT64_C(1) << f->wl) - 1;
    f->mask_r = (UINT64_C(1) << f->wr) - 1;
    f->rounds = k <= SL_FEISTEL_NARROW_BITS ? SL_FEISTEL_ROUNDS : SL_FEISTEL_ROUNDS_WIDE;
    /* Keys come from a hash chain over (seed, epoch, tag, n), so neighbouring seeds, epochs and
     * sizes give unrelated permutations. */
    st = seed;
    st = splitmix64(&st) ^ epoch;
    st = splitmix64(&st) ^ tag;
    st = splitmix64(&st) ^ n;
    for (int i = 0; i < SL_FEISTEL_ROUNDS; i++)
        f->keys[i] = splitmix64(&st);
}

/* Round function: a keyed multiply-xorshift-multiply hash of the right half; its top bits are
 * the best mixed, so the result is taken from there. (A single multiply, even 64x64->128, is
 * nearly additive in the key for narrow halves and fails the chi-square test.) */
static inline uint64_t round_fn(uint64_t r, uint64_t key, unsigned width)
{
    uint64_t h = (r ^ key) * UINT64_C(0x9E3779B97F4A7C15);

    h ^= h >> 32;
    h *= UINT64_C(0xD6E8FEB86659FD93);
    return h >> (64 - width);
}

static inline uint64_t feistel_rounds(const sl_feistel *f, uint64_t x, const int rounds)
{
    uint64_t l = x >> f->wr, r = x & f->mask_r, t;
    unsigned wl = f->wl, wr = f->wr, tw;

    /* Unbalanced halves swap widths every round; an even round count restores them. */
    for (int i = 0; i < rounds; i++) {
        t = l ^ round_fn(r, f->keys[i], wl);
        l = r;
        r = t;
        tw = wl;
        wl = wr;
        wr = tw;
    }
    return (l << wr) | r;
}

/* Constant round counts let the compiler unroll each variant. */
static inline uint64_t feistel_once(const sl_feistel *f, uint64_t x)
{
    if (f->rounds == SL_FEISTEL_ROUNDS_WIDE)
        return feistel_rounds(f, x, SL_FEISTEL_ROUNDS_WIDE);
    return feistel_rounds(f, x, SL_FEISTEL_ROUNDS);
}

uint64_t sl_feistel_at(const sl_feistel *f, uint64_t x)
{
    if (f->n <= 1)
        return 0;
    /* Cycle-walking: the domain is less than 4n (2n for n >= 4), so the expected number of
     * walks is below 2 once n >= 4. */
    do
        x = feistel_once(f, x);
    while (x >= f->n);
    return x;
}

void sl_feistel_map(const sl_feistel *f, uint64_t *v, size_t m)
{
    uint32_t pend[256];

    if (f->n <= 1) {
        for (size_t j = 0; j < m; j++)
            v[j] = 0;
        return;
    }
    /* Blocks of independent positions: one branch-free pass over all of them, then passes over
     * the (fewer) ones that walked out of [0, n). This keeps the pipeline full instead of
     * mispredicting the cycle-walking branch on every index. */
    for (size_t b = 0; b < m; b += 256) {
        size_t len = m - b < 256 ? m - b : 256, np = 0;
        uint64_t *w = v + b;
        for (size_t j = 0; j < len; j++) {
            uint64_t y = feistel_once(f, w[j]);
            w[j] = y;
            pend[np] = (uint32_t)j;
            np += y >= f->n;
        }
        while (np) {
            size_t nq = 0;
            for (size_t k = 0; k < np; k++) {
                uint64_t y = feistel_once(f, w[pend[k]]);
                w[pend[k]] = y;
                pend[nq] = pend[k];
                nq += y >= f->n;
            }
            np = nq;
        }
    }
}

/* MT19937 as torch's CPU generator uses it: seeded with the low 32 bits of the seed. */
typedef struct mt19937 {
    uint32_t st[624];
    int i;
} mt19937;

static void mt_seed(mt19937 *m, uint64_t seed)
{
    m->st[0] = (uint32_t)seed;
    for (uint32_t i = 1; i < 624; i++)
        m->st[i] = 1812433253u * (m->st[i - 1] ^ (m->st[i - 1] >> 30)) + i;
    m->i = 624;
}

static void mt_twist(mt19937 *m)
{
    uint32_t *s = m->st, y;
    int k;

    for (k = 0; k < 624 - 397; k++) {
        y = (s[k] & 0x80000000u) | (s[k + 1] & 0x7fffffffu);
        s[k] = s[k + 397] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    for (; k < 623; k++) {
        y = (s[k] & 0x80000000u) | (s[k + 1] & 0x7fffffffu);
        s[k] = s[k + 397 - 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    y = (s[623] & 0x80000000u) | (s[0] & 0x7fffffffu);
    s[623] = s[396] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    m->i = 0;
}

static inline uint32_t mt_next(mt19937 *m)
{
    uint32_t y;

    if (m->i >= 624)
        mt_twist(m);
    y = m->st[m->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

void sl_torch_randperm(uint32_t *tab, uint64_t n, uint64_t seed)
{
    mt19937 m;

    /* torch's small-n path: start from the identity and, for each position i, swap in the
     * element at i + (32-bit draw mod (n - i)). */
    for (uint64_t i = 0; i < n; i++)
        tab[i] = (uint32_t)i;
    if (n < 2)
        return;
    mt_seed(&m, seed);
    for (uint32_t i = 0; i < (uint32_t)n - 1; i++) {
        uint32_t z = i + mt_next(&m) % ((uint32_t)n - i);
        uint32_t t = tab[i];
        tab[i] = tab[z];
        tab[z] = t;
    }
}
