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
    /* The smallest 2^k >= n, k >= SL_FEISTEL_MINBITS. */
    while (k < 64 && (UINT64_C(1) << k) < n)
        k++;
    f->bits = k;
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
    for (int i = 0; i < SL_FEISTEL_ROUNDS; i++) {
        f->keys[i] = splitmix64(&st);
        f->keys32[i] = (uint32_t)(f->keys[i] >> 32);
    }
}

/* 64-bit round function (domains over 2^32): a keyed multiply-xorshift-multiply hash of one
 * half; its top bits are the best mixed, so the result is taken from there. (A single multiply,
 * even 64x64->128, is nearly additive in the key for narrow halves and fails the chi-square
 * test.) */
static inline uint64_t round_fn(uint64_t r, uint64_t key, unsigned width)
{
    uint64_t h = (r ^ key) * UINT64_C(0x9E3779B97F4A7C15);

    h ^= h >> 32;
    h *= UINT64_C(0xD6E8FEB86659FD93);
    return h >> (64 - width);
}

/* The same hash on 32-bit words for halves of at most 16 bits: (x ^ key) * odd constant is a
 * bijection whose top bits depend on every bit of x, the xorshift folds them back into the low
 * bits, and the second multiply spreads those over the top bits again. Only 32-bit multiplies,
 * so compilers vectorize it (8 or 16 lanes). */
static inline uint32_t round32(uint32_t x, uint32_t key, unsigned shift)
{
    uint32_t h = (x ^ key) * 0x9E3779B1u;

    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    return h >> shift;
}

/* Unbalanced halves swap widths every round; with an even round count that is the same as
 * updating the left half (width wl) from the right one, then the right half (width wr) from the
 * new left one, in place: each pair of rounds below is two rounds of the textbook network. */
static inline uint64_t feistel64(const sl_feistel *f, uint64_t x, const int rounds)
{
    uint64_t a = x >> f->wr, b = x & f->mask_r;

    for (int i = 0; i < rounds; i += 2) {
        a ^= round_fn(b, f->keys[i], f->wl);
        b ^= round_fn(a, f->keys[i + 1], f->wr);
    }
    return (a << f->wr) | b;
}

static inline uint32_t feistel32(uint32_t x, const uint32_t *keys, unsigned wr, uint32_t mask_r,
                                 unsigned sa, unsigned sb, const int rounds)
{
    uint32_t a = x >> wr, b = x & mask_r;

    for (int i = 0; i < rounds; i += 2) {
        a ^= round32(b, keys[i], sa);
        b ^= round32(a, keys[i + 1], sb);
    }
    return (a << wr) | b;
}

/* One pass of the network over v[0..m) (no cycle-walking), 32-bit domains. Built once per
 * instruction set where the compiler supports function multiversioning (GCC on x86-64 glibc:
 * the loader picks the best build for the CPU), so AVX2 and AVX-512 machines run 8 or 16
 * positions per instruction and SSE4.1 ones 4 with a native 32-bit multiply; baseline SSE2 has
 * none and is about 3x slower. The result is the same for every build. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__GLIBC__) && !defined(__clang__)
#define SL_FEISTEL_CLONES __attribute__((target_clones("default", "sse4.1", "avx2", "avx512f")))
#else
#define SL_FEISTEL_CLONES
#endif

SL_FEISTEL_CLONES
static void feistel32_pass(const sl_feistel *f, uint32_t *restrict v, size_t m)
{
    /* Copies in locals: v may not alias them, so the loop vectorizes. */
    uint32_t keys[SL_FEISTEL_ROUNDS];
    const unsigned wr = f->wr, sa = 32 - f->wl, sb = 32 - f->wr;
    const uint32_t mask_r = (uint32_t)f->mask_r;

    memcpy(keys, f->keys32, sizeof(keys));
    if (f->rounds == SL_FEISTEL_ROUNDS_WIDE) {
        for (size_t j = 0; j < m; j++)
            v[j] = feistel32(v[j], keys, wr, mask_r, sa, sb, SL_FEISTEL_ROUNDS_WIDE);
    } else {
        for (size_t j = 0; j < m; j++)
            v[j] = feistel32(v[j], keys, wr, mask_r, sa, sb, SL_FEISTEL_ROUNDS);
    }
}

/* One pass of the network on x, any domain; constant round counts let the compiler unroll. */
static inline uint64_t feistel_once(const sl_feistel *f, uint64_t x)
{
    if (f->bits <= SL_FEISTEL_WORD32_BITS) {
        if (f->rounds == SL_FEISTEL_ROUNDS_WIDE)
            return feistel32((uint32_t)x, f->keys32, f->wr, (uint32_t)f->mask_r, 32 - f->wl,
                             32 - f->wr, SL_FEISTEL_ROUNDS_WIDE);
        return feistel32((uint32_t)x, f->keys32, f->wr, (uint32_t)f->mask_r, 32 - f->wl, 32 - f->wr,
                         SL_FEISTEL_ROUNDS);
    }
    return feistel64(f, x, SL_FEISTEL_ROUNDS_WIDE);
}

uint64_t sl_feistel_at(const sl_feistel *f, uint64_t x)
{
    if (f->n <= 1)
        return 0;
    /* Cycle-walking: the domain is less than 2n (or 16 for n < 16), so the expected number of
     * walks is below 2 once n >= 8. */
    do
        x = feistel_once(f, x);
    while (x >= f->n);
    return x;
}

#define SL_FEISTEL_BLOCK 512

/* Cycle-walking needs the positions whose image fell outside [0, n) packed into a dense list
 * (index and value). Plain C packs one element per iteration through a data-dependent store
 * (~8 instructions per element, on every element of every block); with AVX-512 one compress per
 * 16 elements does it. Zen 4 runs compress-to-memory slowly, so the compress goes to a register
 * and a full-width store follows: the arrays need 16 elements of slack. */
#define SL_FEISTEL_SLACK 16
#if defined(__x86_64__) && defined(__GNUC__) && defined(__GLIBC__) && !defined(__clang__)
#include <immintrin.h>
#define SL_FEISTEL_AVX512_PACK 1

/* Pack the (idx[q] or q if idx is NULL, val[q]) with val[q] > last, q < len, into
 * (oidx, oval); returns their number. In place (oidx == idx, oval == val) is fine. */
__attribute__((target("avx512f"))) static size_t pack_avx512(uint32_t *oidx, uint32_t *oval,
                                                             const uint32_t *idx,
                                                             const uint32_t *val, size_t len,
                                                             uint32_t last)
{
    const __m512i lim = _mm512_set1_epi32((int)last), step = _mm512_set1_epi32(16);
    __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    size_t np = 0, q = 0;

    for (; q + 16 <= len; q += 16) {
        __m512i v = _mm512_loadu_si512(val + q);
        __m512i i = idx ? _mm512_loadu_si512(idx + q) : iota;
        __mmask16 k = _mm512_cmpgt_epu32_mask(v, lim);

        _mm512_storeu_si512(oval + np, _mm512_maskz_compress_epi32(k, v));
        _mm512_storeu_si512(oidx + np, _mm512_maskz_compress_epi32(k, i));
        np += (size_t)__builtin_popcount((unsigned)k);
        iota = _mm512_add_epi32(iota, step);
    }
    for (; q < len; q++) {
        uint32_t v = val[q], i = idx ? idx[q] : (uint32_t)q;

        oidx[np] = i;
        oval[np] = v;
        np += v > last;
    }
    return np;
}
#endif

static size_t pack_walkers(uint32_t *oidx, uint32_t *oval, const uint32_t *idx, const uint32_t *val,
                           size_t len, uint32_t last, int avx512)
{
    size_t np = 0;

#ifdef SL_FEISTEL_AVX512_PACK
    if (avx512)
        return pack_avx512(oidx, oval, idx, val, len, last);
#else
    (void)avx512;
#endif
    for (size_t q = 0; q < len; q++) {
        uint32_t v = val[q], i = idx ? idx[q] : (uint32_t)q;

        oidx[np] = i;
        oval[np] = v;
        np += v > last;
    }
    return np;
}

/* 32-bit domains: one vectorized pass over a block, then passes over the positions that walked
 * out of [0, n), packed into a dense list (a fraction p < 1/2 of the block, then p^2, ...), so
 * the walk costs at most twice a pass in total instead of one mispredicted branch per index.
 * The positions are in[0..m) or, when in is NULL, start + j * stride (all below n). */
static void feistel32_map(const sl_feistel *f, uint64_t *out, const uint64_t *in, uint64_t start,
                          uint64_t stride, size_t m)
{
    uint32_t w[SL_FEISTEL_BLOCK], tmp[SL_FEISTEL_BLOCK + SL_FEISTEL_SLACK];
    uint32_t pend[SL_FEISTEL_BLOCK + SL_FEISTEL_SLACK];
    const uint32_t last = (uint32_t)(f->n - 1); /* n <= 2^32: images above last walk */
    int avx512 = 0;

#ifdef SL_FEISTEL_AVX512_PACK
    avx512 = __builtin_cpu_supports("avx512f");
#endif
    for (size_t b = 0; b < m; b += SL_FEISTEL_BLOCK) {
        size_t len = m - b < SL_FEISTEL_BLOCK ? m - b : SL_FEISTEL_BLOCK, np;
        if (in) {
            for (size_t j = 0; j < len; j++)
                w[j] = (uint32_t)in[b + j];
        } else {
            /* Positions are below n <= 2^32, so 32-bit arithmetic is exact. */
            uint32_t pos = (uint32_t)(start + b * stride), st = (uint32_t)stride;
            for (size_t j = 0; j < len; j++, pos += st)
                w[j] = pos;
        }
        feistel32_pass(f, w, len);
        /* Each round passes the walkers again, writes every result back (a finished one for
         * good) and packs the rest in place. */
        np = pack_walkers(pend, tmp, NULL, w, len, last, avx512);
        while (np) {
            feistel32_pass(f, tmp, np);
            for (size_t q = 0; q < np; q++)
                w[pend[q]] = tmp[q];
            np = pack_walkers(pend, tmp, pend, tmp, np, last, avx512);
        }
        for (size_t j = 0; j < len; j++)
            out[b + j] = w[j];
    }
}

void sl_feistel_map_seq(const sl_feistel *f, uint64_t *out, uint64_t start, uint64_t stride,
                        size_t m)
{
    if (f->n > 1 && f->bits <= SL_FEISTEL_WORD32_BITS) {
        feistel32_map(f, out, NULL, start, stride, m);
        return;
    }
    for (size_t j = 0; j < m; j++)
        out[j] = start + j * stride;
    sl_feistel_map(f, out, m);
}

void sl_feistel_map(const sl_feistel *f, uint64_t *v, size_t m)
{
    uint32_t pend[256];

    if (f->n <= 1) {
        for (size_t j = 0; j < m; j++)
            v[j] = 0;
        return;
    }
    if (f->bits <= SL_FEISTEL_WORD32_BITS) {
        feistel32_map(f, v, v, 0, 0, m);
        return;
    }
    /* Wider domains: blocks of independent positions, one branch-free pass over all of them,
     * then passes over the (fewer) ones that walked out of [0, n). */
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
