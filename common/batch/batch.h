/* Token-budget batch planning: pure functions, no I/O, no globals.
 *
 * The planner turns one epoch's order of samples (the sampler's global permutation, any
 * partition or shuffle mode) and every sample's length into batches for D data-parallel ranks:
 *
 *   1. Lengths longer than max_seq_len are truncated to it (counted) or the sample is skipped.
 *   2. The order is cut into windows of `window` consecutive samples; within each window samples
 *      are sorted by length (dynamic, packed), by length / bucket_width (bucket) or not at all
 *      (pad). The sort is stable, so ties keep the shuffled order.
 *   3. Each window is cut into batches that never exceed max_batch_size sequences nor
 *      max_tokens under the cost model: `padded` charges a batch count x longest, `sum` charges
 *      the sum of its lengths. pad, bucket and dynamic cut greedily in window order; packed fills
 *      bins of max_tokens by sum of lengths, best-fit-decreasing. dynamic under the padded cost
 *      with 16 windows or more carries a batch that would pad more than 3% of its tokens, and
 *      each window's last, incomplete batch, into the next window's sort, for at most 2
 *      windows: a batch then holds samples of up to 3 consecutive windows.
 *   4. The batches are shuffled by (seed, epoch), so consecutive batches mix lengths.
 *   5. Every rank gets the same number of batches: the remainder is dropped or padded by
 *      repeating batches from the start; rank r gets batches r, r + D, r + 2D, ...; optionally
 *      the D batches of each step are chosen to cost about the same (token balancing).
 *
 * The same inputs, config, seed and epoch give the same plan on any machine.
 *
 * Memory: a plan holds 4 bytes per planned sequence plus 16 bytes per batch. Planning
 * temporarily needs, on top of that, O(longest length) for the sort histogram, 4 bytes per
 * sample of the order (pad, bucket, dynamic without carrying), a few window-sized scratch
 * arrays, and for large shuffled inputs 2 bytes per length while gathering (see
 * docs/batching.md for the measured peaks; at most 16 bytes per sequence when batches average
 * two sequences or more).
 */
#ifndef SL_BATCH_H
#define SL_BATCH_H

#include <stddef.h>
#include <stdint.h>

typedef enum sl_batch_strategy {
    SL_BATCH_PAD = 0, /* max_batch_size sequences in order, padded to the longest */
    SL_BATCH_BUCKET,  /* group by length / bucket_width within the window */
    SL_BATCH_DYNAMIC, /* sort by length within the window, add while the cost fits */
    SL_BATCH_PACKED,  /* best-fit-decreasing bins of max_tokens by sum of lengths */
} sl_batch_strategy;

typedef enum sl_batch_cost {
    SL_BATCH_COST_DEFAULT = 0, /* padded, except sum for the packed strategy */
    SL_BATCH_COST_PADDED,      /* batch size x longest sequence in the batch */
    SL_BATCH_COST_SUM,         /* sum of lengths (trainers with variable-length attention) */
} sl_batch_cost;

typedef enum sl_batch_overlong {
    SL_BATCH_TRUNCATE = 0, /* count a longer sequence as max_seq_len tokens (reported) */
    SL_BATCH_SKIP,         /* leave a longer sequence out of the epoch (reported) */
} sl_batch_overlong;

typedef enum sl_batch_remainder {
    SL_BATCH_DROP = 0, /* drop the last (batches mod replicas) batches of the shuffled order */
    SL_BATCH_REPEAT,   /* pad: repeat batches from the start of the shuffled order */
} sl_batch_remainder;

/* Limits enforced by sl_batch_config_check(); they keep every product inside 32/64 bits. */
#define SL_BATCH_MAX_SEQ_LEN    (1u << 24) /* longest max_seq_len: 16 Mi tokens */
#define SL_BATCH_MAX_TOKENS     UINT32_MAX /* largest max_tokens */
#define SL_BATCH_MAX_REPLICAS   65536u     /* largest data-parallel world */
#define SL_BATCH_MAX_SEQUENCES  UINT32_MAX /* longest lengths array and order */
#define SL_BATCH_DEFAULT_BUCKET 64u        /* default bucket_width */

typedef struct sl_batch_config {
    sl_batch_strategy strategy;
    uint32_t max_batch_size;      /* sequences per batch, >= 1 (required) */
    uint32_t max_seq_len;         /* longest sequence in tokens, >= 1 (required) */
    uint64_t max_tokens;          /* budget per batch; 0 = max_batch_size x max_seq_len */
    sl_batch_cost cost;           /* cost model; see sl_batch_cost */
    sl_batch_overlong overlong;   /* what to do with sequences longer than max_seq_len */
    uint32_t bucket_width;        /* bucket strategy: lengths per bucket; 0 = 64 */
    uint64_t window;              /* sort window in samples; 0 = the whole epoch */
    uint32_t batch_size_multiple; /* batch sizes are multiples of this when possible; 0/1 = off */
    uint32_t replicas;            /* data-parallel ranks D; 0 = 1 */
    sl_batch_remainder remainder; /* how to give every rank the same number of batches */
    int balance;                  /* nonzero: similar cost for the D batches of each step */
    int keep_order;               /* nonzero: do not shuffle the batches (debugging) */
    uint64_t seed;                /* shuffle seed */
    uint64_t epoch;               /* epoch number, mixed into the shuffle */
    /* Weighted ranks (uneven GPUs): replicas weights, each > 0 and finite, or none. Every rank
     * still gets the same number of batches; rank r's budgets are max_tokens x w_r / max(w) and
     * max_batch_size x w_r / max(w) (rounded down, at least 1 sequence), so the heaviest rank
     * gets max_tokens. The epoch's order is cut into `replicas` consecutive pieces holding
     * tokens in proportion to the weights, and each piece is planned with its rank's budgets
     * (shuffled with its own stream); then every rank keeps the fewest batches any rank got
     * (drop) or repeats its first batches up to the most (pad). Not with balance. The plan
     * copies the weights. */
    const double *rank_weights;
    uint32_t n_rank_weights;
} sl_batch_config;

/* One batch of a plan. `indices` points into the plan and lives as long as the plan. */
typedef struct sl_batch {
    const uint32_t *indices; /* sample indices (into the lengths array) */
    uint32_t count;          /* number of indices */
    uint32_t max_len;        /* longest (effective) length in the batch */
    uint64_t tokens;         /* real tokens: sum of effective lengths */
    uint64_t padded_tokens;  /* count x max_len: what a padding trainer computes */
} sl_batch;

/* Epoch statistics of a plan or of one rank. */
typedef struct sl_batch_stats {
    uint64_t batches;        /* batches (per rank: this rank's) */
    uint64_t sequences;      /* sequences in those batches, repeats included */
    uint64_t tokens;         /* real tokens in those batches */
    uint64_t padded_tokens;  /* sum of count x max_len over those batches */
    uint64_t truncated;      /* sequences in those batches that were truncated (repeats too) */
    uint64_t skipped;        /* epoch-wide: sequences left out for being over max_seq_len */
    uint64_t dropped;        /* epoch-wide: sequences in batches dropped by the remainder rule */
    uint64_t repeated;       /* epoch-wide: sequences in batches repeated to pad the remainder */
    double padding_fraction; /* (padded_tokens - tokens) / padded_tokens; 0 when empty */
    double fill;             /* tokens / (batches x max_tokens); 0 when empty */
} sl_batch_stats;

typedef struct sl_batch_plan sl_batch_plan;

/* Set `cfg` to the defaults: strategy dynamic, cost default, truncate, bucket width 64, window =
 * whole epoch, one replica, drop, no balancing, seed 0, epoch 0. max_batch_size and max_seq_len
 * are left 0 and must be set by the caller. Thread-safe. */
void sl_batch_config_init(sl_batch_config *cfg);

/* Validate every field of `cfg` on its own and in combination (products that would overflow,
 * max_tokens smaller than max_seq_len, multiple larger than max_batch_size, ...). Returns 0 or
 * SL_EINVAL / SL_ELIMIT and, if `msg` is not NULL, writes a sentence naming the bad value into
 * msg[0..len). Thread-safe. */
int sl_batch_config_check(const sl_batch_config *cfg, char *msg, size_t len);

/* Plan one epoch. `lengths[i]` is the length in tokens of sample i (i < n_lengths, every length
 * >= 1). `order` is the epoch's global order of sample indices (n_order entries, each <
 * n_lengths; repeats are allowed and planned like any other sample), as sl_sample_epoch_order()
 * writes it; NULL means the identity order over n_lengths samples. Neither array is retained. On
 * success stores a new plan in *out (caller frees with sl_batch_plan_free) and returns 0. On
 * failure returns SL_EINVAL (bad config, zero length, index out of range), SL_ELIMIT (a size over
 * its limit) or -ENOMEM, leaves *out NULL and describes the problem in msg (if not NULL).
 * Thread-safe; the work is O(n + batches x log(batches)) and runs on the calling thread. */
int sl_batch_plan_new(sl_batch_plan **out, const sl_batch_config *cfg, const uint32_t *lengths,
                      size_t n_lengths, const uint64_t *order, size_t n_order, char *msg,
                      size_t len);

/* Free a plan and every sl_batch.indices pointing into it. Accepts NULL. */
void sl_batch_plan_free(sl_batch_plan *plan);

/* Number of replicas D the plan was made for. */
uint32_t sl_batch_plan_replicas(const sl_batch_plan *plan);

/* Number of batches each rank gets (the same for every rank). */
uint64_t sl_batch_plan_batches_per_rank(const sl_batch_plan *plan);

/* Batch `i` (0-based step) of rank `rank`: the plan's batch i x D + rank. Returns 0, or SL_EINVAL
 * if rank >= D or i >= sl_batch_plan_batches_per_rank(). `out->indices` is owned by the plan.
 * Thread-safe on a plan that is not being freed. */
int sl_batch_plan_get(const sl_batch_plan *plan, uint32_t rank, uint64_t i, sl_batch *out);

/* The rest of `plan` once each rank r consumed its first consumed[r] batches (n_consumed = the
 * plan's replicas; counts past the end mean all), as an order of samples to plan again (a
 * resize re-plans it for a new world): step by step, rank by rank, each batch's samples as
 * planned. Stores a new array in *out (caller frees; not NULL on success) of *n entries,
 * possibly none. Returns 0, SL_EINVAL (wrong count) or -ENOMEM with msg. Thread-safe. */
int sl_batch_plan_rest(uint64_t **out, size_t *n, const sl_batch_plan *plan,
                       const uint64_t *consumed, size_t n_consumed, char *msg, size_t len);

/* Statistics of the whole epoch (rank < 0) or of one rank. Returns 0, or SL_EINVAL if rank >= D.
 * Thread-safe on a plan that is not being freed. */
int sl_batch_plan_stats(const sl_batch_plan *plan, int64_t rank, sl_batch_stats *out);

/* Rank `rank`'s budgets: max_tokens and max_batch_size after its weight (the config's own values
 * without weights). Returns 0, or SL_EINVAL if rank >= D. Thread-safe. */
int sl_batch_plan_rank_budget(const sl_batch_plan *plan, uint32_t rank, uint64_t *max_tokens,
                              uint32_t *max_batch_size);

/* The config the plan was made with, with defaults resolved (max_tokens, cost, replicas, ...). */
const sl_batch_config *sl_batch_plan_config(const sl_batch_plan *plan);

/* Bytes the plan holds now (`held`) and the most it held while planning (`peak`), counting
 * every allocation the planner made, not the caller's input arrays. Either pointer may be NULL. */
void sl_batch_plan_memory(const sl_batch_plan *plan, size_t *held, size_t *peak);

/* Name of a strategy / cost model ("dynamic", "padded"), or "?" if out of range. Static string. */
const char *sl_batch_strategy_name(sl_batch_strategy s);
const char *sl_batch_cost_name(sl_batch_cost c);

/* Parse a strategy / cost model name. Returns 0 and stores the value, or SL_EINVAL. */
int sl_batch_strategy_parse(const char *name, sl_batch_strategy *out);
int sl_batch_cost_parse(const char *name, sl_batch_cost *out);

#endif
