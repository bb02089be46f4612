/* Private to common/batch: the types and functions the planner's files share. Not installed;
 * include only from the .c files of common/batch. */
#ifndef SL_BATCH_INTERNAL_H
#define SL_BATCH_INTERNAL_H

#include "batch/batch.h"

#include <stddef.h>
#include <stdint.h>

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

/* Hierarchical bitset over capacity classes [0, n): finds the first set class >= x in three
 * word probes and a scan of at most 65 words (n <= 2^24 + 1). */
typedef struct bitset {
    uint64_t *l0, *l1, *l2;
    size_t n0, n1, n2;
} bitset;
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

/* acct.c */
void *bt_acct_alloc(acct *a, size_t n);
void *bt_acct_realloc(acct *a, void *old, size_t old_n, size_t n);
void bt_populate(void *p, size_t n);
void bt_acct_free(acct *a, void *p, size_t n);

/* config.c */
uint64_t bt_weight_q(double w, double top);
int bt_config_resolve(sl_batch_config *out, const sl_batch_config *in, char *msg, size_t len);

/* cut.c */
int bt_cut_greedy(planner *p, const uint32_t *eff, size_t a, size_t b);
int bt_cut_packed(planner *p, uint32_t *e, const uint32_t *sx, size_t a, size_t b);

/* window.c */
void bt_sort_window(planner *p, const uint32_t *src, size_t a, size_t b, uint32_t *didx,
                    uint32_t *deff, uint32_t *stage, size_t *n_out, int desc);
int bt_scan(planner *p, size_t n_lengths, char *msg, size_t len);
int bt_carry_mode(const planner *p, size_t win);
int bt_alloc_scratch(planner *p, size_t win);
void bt_free_scratch(planner *p);
int bt_plan_carry(planner *p, size_t win, size_t *n_out);

/* arrange.c */
int bt_arrange(planner *p, sl_batch_plan *plan);
void bt_finish_stats(sl_batch_stats *s, uint64_t max_tokens);
void bt_sum_stats(planner *p, sl_batch_plan *plan);

#endif
