/* Internals of the sampling engine shared by its files (sample.c, config.c, elastic.c, perm.c,
 * strat.c, mix.c). Not part of the API. */
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

/* ---- Issue 17: weights, the interleave tree, stratified and class-balanced layouts ---- */

/* floor(a * b / c) without overflow; c > 0 and the result must fit. */
static inline uint64_t sl_muldiv(uint64_t a, uint64_t b, uint64_t c)
{
    return (uint64_t)((unsigned __int128)a * b / c);
}

/* Convert positive finite weights into integers (the largest becomes 2^32) so that every later
 * step is exact integer arithmetic and the same on every machine. Returns 0, or SL_EINVAL /
 * SL_ELIMIT with a message naming `what` and the index and value of the bad weight. */
int sl_weights_quantize(uint64_t *q, const double *w, size_t n, const char *what, char *msg,
                        size_t len);

/* Split `total` in proportion to the integer weights q[0..n) (sum > 0, zeros allowed) by largest
 * remainders (ties to the lower index), or by floors only with floor_only. Returns 0 or -ENOMEM. */
int sl_lr_split(uint64_t *out, uint64_t total, const uint64_t *q, size_t n, int floor_only);

/* The interleave tree: a binary tree over leaves 0..nleaf-1 whose nodes are contiguous leaf
 * ranges split where the weights balance. A node of count K whose left child has count KL lays
 * its positions out like Bresenham's line: position s goes left iff L(s+1) > L(s), with
 * L(s) = floor((s*KL + floor(K/2)) / K), so any window of a node holds floor or ceil of its
 * proportion of each child. Counts come from a callback so one tree serves every rank. */
#define SL_MIX_NONE UINT32_MAX
typedef struct sl_mix_node {
    uint32_t a, b;                /* leaves [a, b) */
    uint32_t left, right, parent; /* SL_MIX_NONE where absent */
} sl_mix_node;

typedef struct sl_mix {
    uint32_t nleaf, nnode, root;
    sl_mix_node *node;
    uint32_t *leaf; /* [nleaf] node of each leaf */
} sl_mix;

/* Count of node `nd` for the caller's context (a rank). */
typedef uint64_t (*sl_mix_count_fn)(const void *ctx, const sl_mix *t, uint32_t nd);

/* Build over prefix weights pre[0..nleaf] (every leaf weight >= 1). Returns 0 or -ENOMEM. */
int sl_mix_build(sl_mix *t, const uint64_t *pre, uint32_t nleaf);
/* Build over items 0..n-1 of weights w (each >= 1) as balanced sets rather than contiguous
 * ranges; order[k] receives the item at leaf position k (the heaviest item is last). Returns 0
 * or -ENOMEM. */
int sl_mix_build_sets(sl_mix *t, uint32_t *order, const uint64_t *w, uint32_t n);
void sl_mix_close(sl_mix *t);
/* Leaf and ordinal within it of position pos < count(root). */
void sl_mix_at(uint32_t *leaf, uint64_t *ord, const sl_mix *t, uint64_t pos, sl_mix_count_fn fn,
               const void *ctx);
/* Position of the ord-th item of leaf `leaf`. */
uint64_t sl_mix_select(const sl_mix *t, uint32_t leaf, uint64_t ord, sl_mix_count_fn fn,
                       const void *ctx);
/* How many of the first x positions (x <= count(root)) belong to leaf `leaf`. */
uint64_t sl_mix_prefix(const sl_mix *t, uint32_t leaf, uint64_t x, sl_mix_count_fn fn,
                       const void *ctx);

/* Labels grouped by class (sample.h's sl_sample_labels). */
struct sl_sample_labels {
    uint64_t n;
    uint32_t classes; /* largest label + 1 */
    uint64_t *off;    /* [classes + 1]: class c's samples are at [off[c], off[c+1]) of by */
    uint32_t *by32;   /* sample indices grouped by class, ascending within (n <= 2^32) */
    uint64_t *by64;   /* the same for larger n */
};

static inline uint64_t sl_labels_member(const sl_sample_labels *l, uint64_t k)
{
    return l->by32 ? l->by32[k] : l->by64[k];
}

/* One epoch's stratified or class-balanced layout over all ranks. */
typedef struct sl_strat {
    const sl_sample_labels *lab;
    int balance;
    uint64_t seed, epoch;
    int shuffle;
    uint32_t nleaf;       /* classes drawn this epoch, in grouped order (ascending draws) */
    uint32_t *leaf_class; /* [nleaf] */
    uint64_t *pre;        /* [nleaf + 1]: leaf i holds grouped positions [pre[i], pre[i+1]) */
    uint64_t V;           /* draws this epoch */
    uint64_t S;           /* grouped positions dealt to ranks (V, less with drop_last) */
    uint32_t R;           /* dp world */
    int pad;              /* equal counts by wrapping around (equal shares without drop_last) */
    sl_mix ctree;         /* over leaves */
    int weighted;
    uint64_t *rpre;    /* weighted: [R + 1] prefix of the ranks' counts */
    sl_mix rtree;      /* weighted: deals grouped positions to ranks */
    sl_feistel *fk;    /* [nleaf] the permutation of each class's first pass, or NULL */
    uint64_t *fk_pass; /* [nleaf] which pass fk holds */
} sl_strat;

/* Build from a checked config (classes mode stratify or balance); q are quantized rank weights
 * (NULL for equal shares). Returns 0, SL_EINVAL/SL_ELIMIT with a message, or -ENOMEM. */
int sl_strat_init(sl_strat *st, const sl_sample_config *cfg, uint32_t R, const uint64_t *q,
                  char *msg, size_t len);
void sl_strat_close(sl_strat *st);
/* Number of indices in dp rank r's share (padding included). */
uint64_t sl_strat_count(const sl_strat *st, uint32_t r);
/* Number of real (non-padding) indices of rank r. */
uint64_t sl_strat_real(const sl_strat *st, uint32_t r);
/* Node counts of rank r's interleave tree, for a stream's cache: cnt[ctree.nnode]. */
void sl_strat_counts(uint64_t *cnt, const sl_strat *st, uint32_t r);
/* Index at position i of rank r's share; cnt from sl_strat_counts or NULL. */
uint64_t sl_strat_at(const sl_strat *st, uint32_t r, const uint64_t *cnt, uint64_t i);
/* out[k] = sl_strat_at(st, r, cnt, pos + k) for k < m, a block at a time (much faster). */
void sl_strat_fill(uint64_t *out, const sl_strat *st, uint32_t r, const uint64_t *cnt, uint64_t pos,
                   size_t m);

/* The whole epoch of one config: sizes of every rank's share and the permutations they read. */
typedef struct layout {
    sl_sample_config cfg;
    uint32_t R; /* dp world size */
    uint64_t n;
    uint64_t per;      /* interleaved: every rank's count */
    uint64_t blk;      /* contiguous: block length of ranks 0..R-2 */
    uint64_t last_len; /* contiguous: the last rank's block length */
    uint64_t C;        /* chunked: chunk size */
    uint64_t kfull;    /* chunked: number of full chunks */
    uint64_t rem;      /* chunked: length of the partial chunk (0 if none or dropped) */
    uint64_t kuse;     /* chunked: chunk-order positions dealt (partial chunk last) */
    sl_perm order;     /* interleaved: over n; chunked: over kfull */
    uint32_t *tab_order, *tab_a, *tab_b; /* torch tables, owned */
    uint64_t *rpre;  /* weighted shares: [R + 1] offsets of each rank's piece, owned */
    sl_strat *st;    /* stratified or class-balanced, owned */
    double *rw, *cw; /* copies of the rank and class weights cfg points to, owned */
} layout;

struct sl_sample {
    layout own;
    const layout *L;
    const sl_sample_elastic *e;
    uint32_t r;
    uint64_t count, pos;
    uint64_t *cnt; /* stratified: node counts of this rank's interleave tree */
};

/* One resize: the rest of the previous shares, redistributed. */
typedef struct elevel {
    uint32_t old_R, new_R;
    int interleave;  /* 1: new ranks interleave over the rest; 0: contiguous pieces */
    int pad;         /* equal counts by wrapping around the rest */
    int cut;         /* equal counts by leaving out the rest's last T mod new_R positions */
    uint64_t T;      /* the rest, before padding */
    uint64_t *start; /* [old_R]: consumed counts */
    uint64_t *off;   /* [old_R + 1]: prefix sums of the unconsumed lengths */
    uint64_t *woff;  /* weighted new world: [new_R + 1] offsets of the pieces, or NULL */
} elevel;

struct sl_sample_elastic {
    layout L;
    uint32_t nlev;
    elevel *lev; /* lev[k] redistributes what lev[k - 1]'s ranks (the epoch's for k = 0) left */
};

/* config.c: the dp rank of global rank r under cfg's mesh. */
void smp_dp_of(uint32_t *dp_rank, uint32_t *dp_size, const sl_sample_config *cfg);

/* sample.c: layouts of one config and the levels of elastic plans. */
int smp_layout_init(layout *L, const sl_sample_config *cfg, char *msg, size_t len);
uint64_t smp_layout_count(const layout *L, uint32_t r);
int smp_layout_perms(layout *L, int64_t rank);
void smp_layout_close(layout *L);
uint64_t smp_level_count(const elevel *lv, uint32_t s);
uint64_t smp_level_real(const elevel *lv, uint32_t s);
uint64_t smp_rest_at(const sl_sample_elastic *e, uint32_t k, uint64_t v);

#endif
