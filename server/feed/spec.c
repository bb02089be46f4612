/* Job specs and names: validation and the sampling and batching configs a spec stands for. Pure
 * functions of their arguments (no job state), used by every other file of the folder. */
#include "internal.h"

#include "err.h"

#include <stdio.h>
#include <string.h>

int feed_lengths_path(const sl_feed *f, const char *name, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s/datasets/%s.lengths", f->data_dir, name);

    return n < 0 || (size_t)n >= len ? SL_ELIMIT : 0;
}

int feed_labels_path(const sl_feed *f, const char *name, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s/datasets/%s.labels", f->data_dir, name);

    return n < 0 || (size_t)n >= len ? SL_ELIMIT : 0;
}

int feed_mesh_set(const Sluice__V1__Mesh *m)
{
    return m && (m->dp || m->tp || m->cp || m->pp);
}

/* Classes and weights of Sampling II (docs/sampling.md); the sampler checks the values. */
static int spec_classes(sl_sample_config *cfg, const Sluice__V1__Job *spec,
                        const sl_sample_labels *labels, char *msg, size_t len)
{
    int balance = spec->balance_classes || spec->n_class_weights;

    if (spec->stratify && balance) {
        snprintf(msg, len,
                 "stratify and class-balanced epochs (balance_classes, class_weights) "
                 "exclude each other");
        return SL_EINVAL;
    }
    if (spec->epoch_length && !balance) {
        snprintf(msg, len,
                 "epoch_length %llu needs class-balanced epochs (balance_classes or "
                 "class_weights)",
                 (unsigned long long)spec->epoch_length);
        return SL_EINVAL;
    }
    if (spec->n_class_weights > SL_SAMPLE_MAX_CLASSES || spec->n_rank_weights > FEED_MAX_WORLD) {
        snprintf(msg, len, "%zu class weights or %zu rank weights: over the limit",
                 spec->n_class_weights, spec->n_rank_weights);
        return SL_ELIMIT;
    }
    cfg->classes = spec->stratify ? SL_SAMPLE_CLASSES_STRATIFY
                   : balance      ? SL_SAMPLE_CLASSES_BALANCE
                                  : SL_SAMPLE_CLASSES_NONE;
    cfg->labels = cfg->classes != SL_SAMPLE_CLASSES_NONE ? labels : NULL;
    cfg->class_weights = spec->class_weights;
    cfg->n_class_weights = (uint32_t)spec->n_class_weights;
    cfg->epoch_length = spec->epoch_length;
    cfg->rank_weights = spec->rank_weights;
    cfg->n_rank_weights = (uint32_t)spec->n_rank_weights;
    return 0;
}

int feed_spec_config(sl_sample_config *cfg, const Sluice__V1__Job *spec,
                     const sl_sample_labels *labels, uint64_t samples, uint64_t epoch, char *msg,
                     size_t len)
{
    int err;

    sl_sample_config_init(cfg);
    cfg->samples = samples;
    if (spec->world_size == 0 || spec->world_size > FEED_MAX_WORLD) {
        snprintf(msg, len, "world_size %u out of range [1, %u]", spec->world_size, FEED_MAX_WORLD);
        return SL_EINVAL;
    }
    cfg->replicas = spec->world_size;
    if (spec->partition && spec->partition[0] &&
        sl_sample_partition_parse(&cfg->partition, spec->partition) != 0) {
        snprintf(msg, len, "unknown partition '%.64s' (interleaved, contiguous or chunked)",
                 spec->partition);
        return SL_EINVAL;
    }
    if (cfg->partition == SL_SAMPLE_CHUNKED)
        cfg->chunk_size = spec->chunk_size;
    if (spec->shuffle && spec->shuffle[0] &&
        sl_sample_shuffle_parse(&cfg->shuffle, spec->shuffle) != 0) {
        snprintf(msg, len, "unknown shuffle '%.64s' (none, torch or feistel)", spec->shuffle);
        return SL_EINVAL;
    }
    cfg->seed = spec->seed;
    cfg->epoch = epoch;
    cfg->drop_last = spec->drop_last;
    if (feed_mesh_set(spec->mesh)) {
        cfg->mesh.dp = spec->mesh->dp;
        cfg->mesh.tp = spec->mesh->tp;
        cfg->mesh.cp = spec->mesh->cp;
        cfg->mesh.pp = spec->mesh->pp;
        if (spec->mesh->order && spec->mesh->order[0] &&
            sl_sample_mesh_order_parse(cfg->mesh.order, spec->mesh->order) != 0) {
            snprintf(msg, len, "bad mesh order '%.64s' (a permutation of dp,tp,cp,pp)",
                     spec->mesh->order);
            return SL_EINVAL;
        }
    }
    if ((err = spec_classes(cfg, spec, labels, msg, len)) != 0)
        return err;
    return sl_sample_config_check(cfg, msg, len);
}

int feed_spec_batch_config(sl_batch_config *bc, const Sluice__V1__Job *spec, uint32_t dp_size,
                           uint64_t seed, uint64_t epoch, char *msg, size_t len)
{
    const Sluice__V1__BatchConfig *b = spec->batching;

    sl_batch_config_init(bc);
    if (b->strategy && b->strategy[0] && sl_batch_strategy_parse(b->strategy, &bc->strategy)) {
        snprintf(msg, len, "unknown batching strategy '%.64s' (pad, bucket, dynamic or packed)",
                 b->strategy);
        return SL_EINVAL;
    }
    if (b->cost && b->cost[0] && sl_batch_cost_parse(b->cost, &bc->cost)) {
        snprintf(msg, len, "unknown batching cost '%.64s' (padded or sum)", b->cost);
        return SL_EINVAL;
    }
    bc->max_batch_size = b->max_batch_size;
    bc->max_seq_len = b->max_seq_len;
    bc->max_tokens = b->max_tokens;
    bc->overlong = b->skip_overlong ? SL_BATCH_SKIP : SL_BATCH_TRUNCATE;
    bc->bucket_width = b->bucket_width;
    bc->window = b->window;
    bc->batch_size_multiple = b->batch_size_multiple;
    bc->replicas = dp_size;
    bc->remainder = b->pad_remainder ? SL_BATCH_REPEAT : SL_BATCH_DROP;
    bc->balance = b->balance;
    bc->seed = seed;
    bc->epoch = epoch;
    /* Weighted ranks: the same batch count for every rank, budgets scaled by the weights. The
     * config borrows the spec's array. */
    bc->rank_weights = spec->rank_weights;
    bc->n_rank_weights =
        (uint32_t)(spec->n_rank_weights < UINT32_MAX ? spec->n_rank_weights : UINT32_MAX);
    return sl_batch_config_check(bc, msg, len);
}

uint32_t feed_index_chunk(uint32_t max_chunk, uint64_t samples, size_t msg_bytes)
{
    unsigned width = 1; /* varint bytes of the largest index, samples - 1 */
    uint64_t fit;

    for (uint64_t x = samples > 0 ? samples - 1 : 0; x >= 0x80; x >>= 7)
        width++;
    fit = msg_bytes > FEED_CHUNK_OVERHEAD ? (msg_bytes - FEED_CHUNK_OVERHEAD) / width : 1;
    if (fit < 1)
        fit = 1;
    return fit < max_chunk ? (uint32_t)fit : max_chunk;
}
