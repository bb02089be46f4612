/* Sampling engine: which sample indices each data-parallel rank reads in an epoch.
 *
 * Pure functions and small immutable objects, no I/O, no globals. Shared by the daemon (which
 * streams each rank's share) and the clients (the `sluice sample` command, libsluice).
 *
 * Vocabulary (see docs/sampling.md for the full description):
 * - N samples, indices [0, N). The world is `replicas` ranks; with a mesh (dp x tp x cp x pp)
 *   only the dp axis partitions, ranks that differ only in tp/cp/pp get identical streams.
 * - The *epoch order* is the shuffle of [0, N) for (seed, epoch): identity (none), exactly
 *   torch.randperm(N, generator=torch.Generator().manual_seed(seed + epoch)) (torch), or a keyed
 *   Feistel bijection computed per position in O(1) (feistel).
 * - A rank's *share* is the sequence of indices it reads this epoch; positions in it are 0-based.
 *   interleaved = torch.utils.data.DistributedSampler; contiguous = one block per rank, shuffled
 *   within the block; chunked = chunks of chunk_size consecutive samples dealt round-robin.
 *
 * Errors: functions return 0 or a negative code from err.h (SL_EINVAL for invalid input, SL_ELIMIT
 * for a value over a documented limit, -ENOMEM). Functions taking `char *msg, size_t len` write a
 * NUL-terminated message naming the bad value there on failure ("rank 9 out of range [0, 8)");
 * msg may be NULL.
 */
#ifndef SL_SAMPLE_H
#define SL_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Largest N accepted in any mode. Positions stay far from uint64 overflow below it. */
#define SL_SAMPLE_MAX_N (UINT64_C(1) << 62)
/* torch shuffle is exact for N below this (uint32 max / 20, torch's small-n randperm path);
 * larger N is refused with SL_ELIMIT. */
#define SL_SAMPLE_TORCH_MAX_N UINT64_C(214748364)
/* Epochs are in [0, SL_SAMPLE_EPOCH_MAX] (an int64 on the wire and in Python), and seed + epoch
 * must not exceed UINT64_MAX (torch's manual_seed range). */
#define SL_SAMPLE_EPOCH_MAX ((uint64_t)INT64_MAX)
/* Largest chunk size; also bounds the torch-mode within-chunk permutation. */
#define SL_SAMPLE_MAX_CHUNK (UINT64_C(1) << 32)

typedef enum sl_sample_partition {
    SL_SAMPLE_INTERLEAVED = 0, /* rank r takes positions r, r+R, ... of the epoch order */
    SL_SAMPLE_CONTIGUOUS = 1,  /* rank r takes one block; last rank also the remainder */
    SL_SAMPLE_CHUNKED = 2,     /* chunk c (of chunk_size samples) goes to rank c mod R */
} sl_sample_partition;

typedef enum sl_sample_shuffle {
    SL_SAMPLE_SHUFFLE_NONE = 0,
    SL_SAMPLE_SHUFFLE_TORCH = 1,   /* bit-identical to torch CPU randperm; O(N) memory */
    SL_SAMPLE_SHUFFLE_FEISTEL = 2, /* O(1) time and memory per index */
} sl_sample_shuffle;

/* Mesh axes. Values start at 1 so that a zeroed order means "default". */
typedef enum sl_sample_axis {
    SL_SAMPLE_AXIS_DP = 1,
    SL_SAMPLE_AXIS_TP = 2,
    SL_SAMPLE_AXIS_CP = 3,
    SL_SAMPLE_AXIS_PP = 4,
} sl_sample_axis;

/* A device mesh. All sizes 0 means "no mesh": every rank is its own dp rank. Otherwise every size
 * must be >= 1 and dp*tp*cp*pp must equal the config's replicas. `order` lists the four axes from
 * outermost (slowest varying in the global rank) to innermost; all zero selects the default
 * {PP, DP, CP, TP} (Megatron-style: tp ranks are adjacent). */
typedef struct sl_sample_mesh {
    uint32_t dp, tp, cp, pp;
    uint8_t order[4];
} sl_sample_mesh;

/* Per-sample class ids grouped by class (see sl_sample_labels_new). Immutable once built. */
typedef struct sl_sample_labels sl_sample_labels;

/* Class ids are below this (2^20); a label at or above it is refused. */
#define SL_SAMPLE_MAX_CLASSES (UINT32_C(1) << 20)

typedef enum sl_sample_classes {
    SL_SAMPLE_CLASSES_NONE = 0,     /* class-blind shares */
    SL_SAMPLE_CLASSES_STRATIFY = 1, /* every share holds each class in proportion */
    SL_SAMPLE_CLASSES_BALANCE = 2,  /* the epoch draws classes with target proportions */
} sl_sample_classes;

typedef struct sl_sample_config {
    uint64_t samples;              /* N >= 1 */
    uint32_t replicas;             /* world size >= 1 (dp*tp*cp*pp with a mesh) */
    uint32_t rank;                 /* global rank in [0, replicas) */
    sl_sample_partition partition; /* default interleaved */
    uint64_t chunk_size;           /* chunked only: >= 1 */
    sl_sample_shuffle shuffle;     /* default feistel */
    uint64_t seed;                 /* default 0 */
    uint64_t epoch;                /* default 0 */
    bool drop_last;                /* default false: pad (interleaved/contiguous elastic) */
    sl_sample_mesh mesh;           /* default: no mesh */
    /* Classes (docs/sampling.md "Stratified shares", "Class-balanced epochs"). Stratify and
     * balance need labels with one label per sample, the interleaved partition and shuffle none
     * or feistel. The arrays are borrowed: they must outlive every call that takes this config
     * (streams and plans keep copies of what they need, except the labels, which they borrow). */
    sl_sample_classes classes;      /* default none */
    const sl_sample_labels *labels; /* borrowed */
    const double *class_weights;    /* balance: one per class id (0 .. labels' classes - 1), */
    uint32_t n_class_weights;       /*   each > 0 and finite; none: uniform over the classes */
                                    /*   that have samples */
    uint64_t epoch_length;          /* balance: draws per epoch; 0 means N */
    /* Weighted shares: one weight per dp rank (> 0, finite), shares proportional to them by
     * largest remainders; none: equal shares. Not with the chunked partition. */
    const double *rank_weights;
    uint32_t n_rank_weights;
} sl_sample_config;

/* Fill `cfg` with the defaults (N = 0, which the caller must set; one replica; interleaved;
 * feistel; seed 0; epoch 0; no drop_last; no mesh; chunk_size 1). Thread-safe. */
void sl_sample_config_init(sl_sample_config *cfg);

/* Validate `cfg`. Returns 0, SL_EINVAL (N = 0, replicas = 0, rank >= replicas, chunk_size 0 in
 * chunked mode, bad enum, bad mesh or mesh product != replicas, epoch out of range) or SL_ELIMIT
 * (N, chunk size or torch-mode N over its limit), with a message in msg. Thread-safe. */
int sl_sample_config_check(const sl_sample_config *cfg, char *msg, size_t len);

/* The data-parallel coordinate of cfg->rank and the dp world size (replicas without a mesh).
 * Returns 0 or the error of sl_sample_config_check. Thread-safe. */
int sl_sample_dp_rank(uint32_t *dp_rank, uint32_t *dp_size, const sl_sample_config *cfg, char *msg,
                      size_t len);

/* Number of indices in cfg->rank's share, in O(1) and without allocating. Returns 0 or the error
 * of sl_sample_config_check. Thread-safe. */
int sl_sample_share_count(uint64_t *out, const sl_sample_config *cfg, char *msg, size_t len);

/* The epoch's global order: out[i] = the index at position i of the shuffled [0, n), before any
 * partitioning, for shuffle_mode (an sl_sample_shuffle) keyed by seed and epoch. `out` must hold
 * n entries (caller-owned). This is the order the interleaved partition deals from: rank r of R
 * reads out[(r + i*R) mod n]. For torch it equals torch.randperm(n, generator=
 * torch.Generator().manual_seed(seed + epoch)). Returns 0, SL_EINVAL (n = 0, bad mode, epoch out
 * of range), SL_ELIMIT (n over SL_SAMPLE_MAX_N, or SL_SAMPLE_TORCH_MAX_N for torch) or -ENOMEM
 * (torch allocates n uint32 temporarily). Thread-safe. */
int sl_sample_epoch_order(uint64_t *out, uint64_t n, int shuffle_mode, uint64_t seed,
                          uint64_t epoch);

/* The order of a whole epoch of cfg as one rank reads it, for planners that cut it into
 * consecutive pieces (token-budget batches): with classes, the single-rank (R = 1) share of the
 * stratified or class-balanced layout (every class spread along it with the window property;
 * class-balanced: epoch_length draws, samples of a small class repeated), else the epoch order
 * of sl_sample_epoch_order over cfg->samples. cfg's replicas, rank, mesh, rank weights and
 * drop_last are ignored. Stores a new array in *out (caller frees) of *n entries. Returns 0, a
 * config error, SL_ELIMIT (more than max entries) or -ENOMEM, with msg. O(n) time (class
 * layouts: O(n x tree depth)). Thread-safe. */
int sl_sample_plan_order(uint64_t **out, uint64_t *n, const sl_sample_config *cfg, uint64_t max,
                         char *msg, size_t len);

/* One position of the Feistel permutation of [0, n) keyed by (seed, epoch): the value
 * sl_sample_epoch_order would put at position pos in feistel mode. O(1) time and memory.
 * Returns 0 or SL_EINVAL (n = 0, pos >= n, n > SL_SAMPLE_MAX_N). Thread-safe. */
int sl_sample_feistel_at(uint64_t *out, uint64_t n, uint64_t seed, uint64_t epoch, uint64_t pos);

/* A rank's index stream for one epoch: an immutable share plus a cursor. */
typedef struct sl_sample sl_sample;

/* Create the stream of cfg->rank's share, cursor at position 0. O(1) time and memory for none
 * and feistel; torch computes its permutations here (O(N) time, 4*N bytes for interleaved,
 * 4*(block or chunk count + chunk size) bytes otherwise). Returns 0, a config error (see
 * sl_sample_config_check) or -ENOMEM. The caller frees *out with sl_sample_free. Thread-safe. */
int sl_sample_new(sl_sample **out, const sl_sample_config *cfg, char *msg, size_t len);

/* Number of indices in the share. Thread-safe on a stream nobody else mutates. */
uint64_t sl_sample_count(const sl_sample *s);

/* Cursor position: how many indices sl_sample_next has produced since position 0 or the last
 * seek. Thread-safe on a stream nobody else mutates. */
uint64_t sl_sample_pos(const sl_sample *s);

/* Move the cursor to position pos in [0, count] (count = end of share). O(1). Returns 0 or
 * SL_EINVAL. Not thread-safe for one stream (one thread per stream). */
int sl_sample_seek(sl_sample *s, uint64_t pos);

/* Write up to max indices from the cursor into out (caller-owned, max entries), advance the
 * cursor, and set *got to how many were written (0 at the end of the share). Returns 0 or
 * SL_EINVAL (NULL arguments). Not thread-safe for one stream. */
int sl_sample_next(uint64_t *out, size_t *got, sl_sample *s, size_t max);

/* Write the m indices at positions [pos, pos + m) of the share into out, independent of the
 * cursor. Returns 0 or SL_EINVAL (range past the end). Thread-safe: any number of threads may
 * fill from one stream concurrently as long as none calls seek/next on it. */
int sl_sample_fill(uint64_t *out, const sl_sample *s, uint64_t pos, size_t m);

/* Free a stream. Accepts NULL. A stream created with sl_sample_new_elastic does not free the
 * plan it borrows. */
void sl_sample_free(sl_sample *s);

/* Elastic remainder: the rest of an epoch redistributed over a new dp world.
 *
 * Given the epoch's config (its world, mesh, N, partition, shuffle, seed, epoch; its rank is
 * ignored), how many indices each old dp rank has consumed (consumed[r] for dp rank r, a prefix
 * of its share), and the new dp world size, the plan gives each new rank a share such that the
 * unconsumed rest of every old share is read exactly once:
 * - interleaved: new rank s takes positions s, s+R', ... of the rest (old rank 0's unconsumed
 *   tail, then old rank 1's, ...); without drop_last the rest is padded by wrapping around to its
 *   start so every new rank reads the same count (the torch padding rule).
 * - contiguous, chunked: new rank s takes one contiguous piece of the rest (locality is kept);
 *   contiguous without drop_last pads like interleaved; chunked never pads.
 * With drop_last nothing is repeated and counts differ by at most one. Creation costs O(old R)
 * and memory O(old R) plus, for torch, the epoch's permutations: independent of N and of how far
 * apart the ranks are. */
typedef struct sl_sample_elastic sl_sample_elastic;

/* Build a plan. consumed has n_consumed entries, which must equal the old dp size, each at most
 * that rank's share count. new_replicas >= 1 is the new dp world size. Returns 0, SL_EINVAL with a
 * message, a config error or -ENOMEM. Caller frees with sl_sample_elastic_free. Thread-safe. */
int sl_sample_elastic_new(sl_sample_elastic **out, const sl_sample_config *epoch_cfg,
                          const uint64_t *consumed, size_t n_consumed, uint32_t new_replicas,
                          char *msg, size_t len);

/* Total number of unconsumed indices (the rest of the epoch, before padding). Thread-safe. */
uint64_t sl_sample_elastic_remaining(const sl_sample_elastic *e);

/* Stream of new dp rank new_rank's share of the plan, cursor at 0. The stream borrows e, which
 * must outlive it. Returns 0, SL_EINVAL (new_rank out of range) or -ENOMEM. Caller frees with
 * sl_sample_free. Thread-safe (the plan is immutable). */
int sl_sample_new_elastic(sl_sample **out, const sl_sample_elastic *e, uint32_t new_rank, char *msg,
                          size_t len);

/* Free a plan. Accepts NULL. Free its streams first. */
void sl_sample_elastic_free(sl_sample_elastic *e);

/* Chained resizes: each step redistributes the rest of the previous plan's shares (the epoch's
 * shares for the first step) over a new dp world, optionally with rank weights (then every new
 * rank takes one contiguous piece of the rest, sized by largest remainders, never padded).
 * Without weights every new rank gets the same count, so DDP ranks take the same number of
 * batches whatever the batch size: with drop_last the rest is cut to a multiple of the new world
 * (its last rest mod new_replicas positions are left out, sl_sample_elastic_left_out), without
 * it padded by wrapping around to the start of the rest (every partition). */
typedef struct sl_sample_resize {
    const uint64_t *consumed; /* consumed[r]: a prefix of the previous world's rank r's share */
    size_t n_consumed;        /* = the previous dp world size */
    uint32_t new_replicas;    /* >= 1 */
    const double *weights;    /* optional: new_replicas weights, > 0 and finite */
    size_t n_weights;         /* 0 or new_replicas */
    /* The rule of versions before equal counts, for steps recorded by them: with drop_last the
     * counts differ by one, a chunked rest is never padded. */
    bool uneven;
} sl_sample_resize;

/* A plan after n_steps resizes in a row of the epoch of epoch_cfg (n_steps >= 1). Steps after
 * the first count only real indices of the previous shares as left (padding repeats are not
 * passed on). Cost O(sum of the worlds' sizes), independent of N. Returns 0, SL_EINVAL with a
 * message, a config error or -ENOMEM. Caller frees with sl_sample_elastic_free. Thread-safe. */
int sl_sample_elastic_chain(sl_sample_elastic **out, const sl_sample_config *epoch_cfg,
                            const sl_sample_resize *steps, size_t n_steps, char *msg, size_t len);

/* A new plan: prev followed by one more resize. prev is not changed and may be freed after.
 * Returns like sl_sample_elastic_chain. Thread-safe. */
int sl_sample_elastic_extend(sl_sample_elastic **out, const sl_sample_elastic *prev,
                             const sl_sample_resize *step, char *msg, size_t len);

/* Lockstep resizes of an epoch of units that every rank reads in the same number (a batch
 * plan's batches, which DDP ranks take one per step): unit g = step x d0 + rank is "index" g of
 * an interleaved, unshuffled epoch of per_rank x d0 over d0 ranks. Each step redistributes what
 * the previous world did not consume (consumed counts clipped to its shares: a restored
 * position may exceed a share it never saw), weights ignored (units keep their sizes); with pad
 * the new shares are padded to equal counts by repeating units of the rest (the torch rule),
 * without it every rank reads the smallest count (the others' last unit is left out). *count is
 * what every rank of the last world reads. Returns 0, SL_EINVAL (a step's consumed count not
 * the previous world's size, per_rank or d0 0) or -ENOMEM with msg. Caller frees *out with
 * sl_sample_elastic_free. Thread-safe. */
int sl_sample_elastic_lockstep(sl_sample_elastic **out, uint64_t *count, uint64_t per_rank,
                               uint32_t d0, bool pad, const sl_sample_resize *steps, size_t n_steps,
                               char *msg, size_t len);

/* The dp world size of a plan's newest shares. Thread-safe. */
uint32_t sl_sample_elastic_world(const sl_sample_elastic *e);

/* How many indices the plan's steps left out, all of them together (with drop_last a step
 * cuts its rest to a multiple of its new world: fewer than that world's size each), and how many
 * padding repeats the newest shares hold (without drop_last). Thread-safe. */
uint64_t sl_sample_elastic_left_out_count(const sl_sample_elastic *e);
uint64_t sl_sample_elastic_padded(const sl_sample_elastic *e);

/* The i-th index the plan's steps left out (i < sl_sample_elastic_left_out_count), step by
 * step, each step's in the order of its rest. Returns 0 or SL_EINVAL. Thread-safe. */
int sl_sample_elastic_left_out(uint64_t *out, const sl_sample_elastic *e, uint64_t i);

/* Group per-sample labels (labels[i] = class of sample i, each < SL_SAMPLE_MAX_CLASSES) by class:
 * O(n + classes) time, 4 bytes per sample (8 above 2^32 samples) plus 8 per class. labels is
 * not kept. Returns 0, SL_EINVAL (n = 0, a label over the maximum: "label 2000000 of sample 17
 * over the maximum class id 1048575") or -ENOMEM. Caller frees with sl_sample_labels_free.
 * Thread-safe; the result is immutable and may be shared by any number of streams and threads. */
int sl_sample_labels_new(sl_sample_labels **out, const uint32_t *labels, uint64_t n, char *msg,
                         size_t len);
/* Number of samples, number of class ids (largest label + 1), samples of class c (0 past the
 * end). Thread-safe. */
uint64_t sl_sample_labels_count(const sl_sample_labels *l);
uint32_t sl_sample_labels_classes(const sl_sample_labels *l);
uint64_t sl_sample_labels_class_size(const sl_sample_labels *l, uint32_t c);
/* Free. Accepts NULL. Free the streams and plans that borrow it first. */
void sl_sample_labels_free(sl_sample_labels *l);

/* Parse a comma-separated weight list ("1,1,0.5") into out (caller-owned, max entries); *n is set
 * to the count. Each weight must be > 0 and finite. Returns 0 or SL_EINVAL with a message
 * naming the bad entry. Thread-safe. */
int sl_sample_weights_parse(double *out, size_t *n, size_t max, const char *s, const char *what,
                            char *msg, size_t len);

/* Parse helpers for CLIs and config files: "interleaved"/"contiguous"/"chunked",
 * "none"/"torch"/"feistel", and a mesh order like "pp,dp,cp,tp". Return 0 or SL_EINVAL. */
int sl_sample_partition_parse(sl_sample_partition *out, const char *s);
int sl_sample_shuffle_parse(sl_sample_shuffle *out, const char *s);
int sl_sample_mesh_order_parse(uint8_t out[4], const char *s);

/* Names of the enum values ("interleaved", "feistel", ...), static strings; "?" if unknown. */
const char *sl_sample_partition_name(sl_sample_partition p);
const char *sl_sample_shuffle_name(sl_sample_shuffle s);

#endif
