/* Internals of the sampling engine shared by perm.c and sample.c. Not part of the API. */
#ifndef SL_SAMPLE_INTERNAL_H
#define SL_SAMPLE_INTERNAL_H

#include "sample.h"

#include <stddef.h>
#include <stdint.h>

/* Rounds of the Feistel network: 12 on domains up to 2^16, where narrow halves need many rounds
 * (6 or 8 fail the chi-square test in tests/unit/sample_test.c), 8 above. See docs/sampling.md. */
#define SL_FEISTEL_ROUNDS      12
#define SL_FEISTEL_ROUNDS_WIDE 8
#define SL_FEISTEL_NARROW_BITS 16

/* Domains of up to 2^32 elements (both halves at most 16 bits wide) run the network on 32-bit
 * words, which vectorize; wider domains use 64-bit words. */
#define SL_FEISTEL_WORD32_BITS 32

/* A keyed bijection of [0, n) built from a balanced-as-possible Feistel network on the smallest
 * power-of-two domain of at least 16 elements that holds n, with cycle-walking back into [0, n). */
typedef struct sl_feistel {
    uint64_t n;
    unsigned bits;   /* the domain is [0, 2^bits) */
    unsigned wl, wr; /* widths in bits of the left and right halves at round 0 */
    unsigned rounds;
    uint64_t mask_l, mask_r;
    uint64_t keys[SL_FEISTEL_ROUNDS];
    uint32_t keys32[SL_FEISTEL_ROUNDS]; /* the round keys of 32-bit domains */
} sl_feistel;

/* Set up the permutation of [0, n) for (seed, epoch, tag). tag separates independent
 * permutations of one epoch (0: the global order; 1 + b: within block or chunk b). */
void sl_feistel_init(sl_feistel *f, uint64_t n, uint64_t seed, uint64_t epoch, uint64_t tag);

/* The image of x < f->n. */
uint64_t sl_feistel_at(const sl_feistel *f, uint64_t x);

/* Replace each of v[0..m) (all < f->n) by its image; faster than sl_feistel_at per element. */
void sl_feistel_map(const sl_feistel *f, uint64_t *v, size_t m);

/* out[j] = image of start + j * stride for j < m; every such position must be below f->n. */
void sl_feistel_map_seq(const sl_feistel *f, uint64_t *out, uint64_t start, uint64_t stride,
                        size_t m);

/* torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on CPU for
 * n < SL_SAMPLE_TORCH_MAX_N, into tab[0..n). */
void sl_torch_randperm(uint32_t *tab, uint64_t n, uint64_t seed);

/* One permutation of [0, n) in any shuffle mode. */
typedef struct sl_perm {
    uint64_t n;
    int mode;
    const uint32_t *tab; /* torch: borrowed table */
    sl_feistel f;        /* feistel */
} sl_perm;

static inline uint64_t sl_perm_at(const sl_perm *p, uint64_t x)
{
    switch (p->mode) {
    case SL_SAMPLE_SHUFFLE_TORCH:
        return p->tab[x];
    case SL_SAMPLE_SHUFFLE_FEISTEL:
        return sl_feistel_at(&p->f, x);
    default:
        return x;
    }
}

#endif
