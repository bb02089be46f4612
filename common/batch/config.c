/* Token-budget batch planning: the configuration, its names and its validation (see batch.h). */
#include "batch/internal.h"

#include "err.h"
#include "util/msg.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
uint64_t bt_weight_q(double w, double top)
{
    return (uint64_t)llround(w / top * 4294967296.0);
}

int bt_config_resolve(sl_batch_config *out, const sl_batch_config *in, char *msg, size_t len)
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
            uint64_t q = bt_weight_q(c.rank_weights[r], top), b = (c.max_tokens * q) >> 32;

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

    return bt_config_resolve(&c, cfg, msg, len);
}
