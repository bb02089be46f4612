/* Sampling engine: configs (defaults, validation, device meshes, names) and the dp rank. */
#include "internal.h"

#include "err.h"
#include "util/msg.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sl_sample_config_init(sl_sample_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->replicas = 1;
    cfg->partition = SL_SAMPLE_INTERLEAVED;
    cfg->chunk_size = 1;
    cfg->shuffle = SL_SAMPLE_SHUFFLE_FEISTEL;
}

static const char *const axis_names[5] = {"?", "dp", "tp", "cp", "pp"};

static int mesh_used(const sl_sample_mesh *m)
{
    return m->dp || m->tp || m->cp || m->pp;
}

static void mesh_order(uint8_t out[4], const sl_sample_mesh *m)
{
    static const uint8_t def[4] = {SL_SAMPLE_AXIS_PP, SL_SAMPLE_AXIS_DP, SL_SAMPLE_AXIS_CP,
                                   SL_SAMPLE_AXIS_TP};

    if (m->order[0] || m->order[1] || m->order[2] || m->order[3])
        memcpy(out, m->order, 4);
    else
        memcpy(out, def, 4);
}

static int check_mesh(const sl_sample_config *cfg, char *msg, size_t len)
{
    const sl_sample_mesh *m = &cfg->mesh;
    const uint32_t sz[5] = {0, m->dp, m->tp, m->cp, m->pp};
    uint8_t ord[4];
    unsigned seen = 0;
    uint64_t prod = 1;

    if (!mesh_used(m))
        return 0;
    for (int a = 1; a <= 4; a++) {
        if (sz[a] == 0)
            return sl_fail(msg, len, SL_EINVAL, "mesh %s size 0: every axis must be at least 1",
                           axis_names[a]);
        prod *= sz[a];
    }
    if (prod != cfg->replicas)
        return sl_fail(msg, len, SL_EINVAL,
                       "mesh dp=%" PRIu32 " x tp=%" PRIu32 " x cp=%" PRIu32 " x pp=%" PRIu32
                       " = %" PRIu64 " ranks does not match world size %" PRIu32,
                       m->dp, m->tp, m->cp, m->pp, prod, cfg->replicas);
    mesh_order(ord, m);
    for (int i = 0; i < 4; i++) {
        if (ord[i] < 1 || ord[i] > 4 || (seen & (1u << ord[i])))
            return sl_fail(msg, len, SL_EINVAL,
                           "mesh order must list each of dp, tp, cp, pp once (entry %d is %u)", i,
                           ord[i]);
        seen |= 1u << ord[i];
    }
    return 0;
}

/* Weights are checked by quantizing them (the same code that later uses them). */
static int check_weights(const double *w, size_t n, const char *what, char *msg, size_t len)
{
    uint64_t *q = malloc((n ? n : 1) * sizeof(*q));
    int err;

    if (!q)
        return sl_fail(msg, len, -ENOMEM, "out of memory");
    err = sl_weights_quantize(q, w, n, what, msg, len);
    free(q);
    return err;
}

static int check_class_weights(const sl_sample_config *cfg, char *msg, size_t len)
{
    const sl_sample_labels *l = cfg->labels;
    int err;

    if (cfg->n_class_weights != l->classes)
        return sl_fail(msg, len, SL_EINVAL,
                       "%" PRIu32 " class weights for %" PRIu32 " class ids (labels 0 .. %" PRIu32
                       ")",
                       cfg->n_class_weights, l->classes, l->classes - 1);
    if ((err = check_weights(cfg->class_weights, cfg->n_class_weights, "class", msg, len)) != 0)
        return err;
    for (uint32_t c = 0; c < l->classes; c++)
        if (l->off[c + 1] == l->off[c])
            return sl_fail(msg, len, SL_EINVAL, "class %" PRIu32 " has weight %g but no samples", c,
                           cfg->class_weights[c]);
    return 0;
}

/* Classes and weights, on a config whose other fields are valid. */
static int check_classes(const sl_sample_config *cfg, char *msg, size_t len)
{
    uint32_t r, R;

    if ((unsigned)cfg->classes > SL_SAMPLE_CLASSES_BALANCE)
        return sl_fail(msg, len, SL_EINVAL, "classes mode %d unknown", (int)cfg->classes);
    if (cfg->classes != SL_SAMPLE_CLASSES_BALANCE && (cfg->n_class_weights || cfg->epoch_length))
        return sl_fail(msg, len, SL_EINVAL,
                       "class weights and epoch length need class-balanced epochs");
    if (cfg->n_class_weights && !cfg->class_weights)
        return sl_fail(msg, len, SL_EINVAL, "no class weights array");
    if (cfg->epoch_length > SL_SAMPLE_MAX_N)
        return sl_fail(msg, len, SL_ELIMIT, "epoch length %" PRIu64 " over the limit %" PRIu64,
                       cfg->epoch_length, SL_SAMPLE_MAX_N);
    if (cfg->classes != SL_SAMPLE_CLASSES_NONE) {
        const char *mode = cfg->classes == SL_SAMPLE_CLASSES_STRATIFY ? "stratify" : "balance";
        if (!cfg->labels)
            return sl_fail(msg, len, SL_EINVAL, "%s needs labels: the dataset has none", mode);
        if (cfg->labels->n != cfg->samples)
            return sl_fail(msg, len, SL_EINVAL,
                           "labels count %" PRIu64 " does not match samples %" PRIu64,
                           cfg->labels->n, cfg->samples);
        if (cfg->partition != SL_SAMPLE_INTERLEAVED)
            return sl_fail(msg, len, SL_EINVAL, "%s needs partition interleaved, not %s", mode,
                           sl_sample_partition_name(cfg->partition));
        if (cfg->shuffle == SL_SAMPLE_SHUFFLE_TORCH)
            return sl_fail(msg, len, SL_EINVAL, "%s needs shuffle feistel or none, not torch",
                           mode);
        if (cfg->n_class_weights) {
            int err = check_class_weights(cfg, msg, len);
            if (err)
                return err;
        }
    }
    if (!cfg->n_rank_weights)
        return 0;
    smp_dp_of(&r, &R, cfg);
    if (!cfg->rank_weights)
        return sl_fail(msg, len, SL_EINVAL, "no rank weights array");
    if (cfg->n_rank_weights != R)
        return sl_fail(msg, len, SL_EINVAL,
                       "%" PRIu32 " rank weights for a dp world of %" PRIu32 " ranks",
                       cfg->n_rank_weights, R);
    if (cfg->partition == SL_SAMPLE_CHUNKED)
        return sl_fail(msg, len, SL_EINVAL,
                       "rank weights need partition interleaved or contiguous");
    if (cfg->partition == SL_SAMPLE_CONTIGUOUS && cfg->shuffle == SL_SAMPLE_SHUFFLE_TORCH)
        return sl_fail(msg, len, SL_EINVAL,
                       "rank weights with partition contiguous need shuffle feistel or none");
    return check_weights(cfg->rank_weights, cfg->n_rank_weights, "rank", msg, len);
}

int sl_sample_config_check(const sl_sample_config *cfg, char *msg, size_t len)
{
    int err;

    if (!cfg)
        return sl_fail(msg, len, SL_EINVAL, "no config");
    if (cfg->samples == 0)
        return sl_fail(msg, len, SL_EINVAL, "samples 0: the dataset must hold at least one sample");
    if (cfg->samples > SL_SAMPLE_MAX_N)
        return sl_fail(msg, len, SL_ELIMIT, "samples %" PRIu64 " over the limit %" PRIu64,
                       cfg->samples, SL_SAMPLE_MAX_N);
    if (cfg->replicas == 0)
        return sl_fail(msg, len, SL_EINVAL, "replicas 0: the world must hold at least one rank");
    if (cfg->rank >= cfg->replicas)
        return sl_fail(msg, len, SL_EINVAL, "rank %" PRIu32 " out of range [0, %" PRIu32 ")",
                       cfg->rank, cfg->replicas);
    if ((unsigned)cfg->partition > SL_SAMPLE_CHUNKED)
        return sl_fail(msg, len, SL_EINVAL, "partition %d unknown", (int)cfg->partition);
    if ((unsigned)cfg->shuffle > SL_SAMPLE_SHUFFLE_FEISTEL)
        return sl_fail(msg, len, SL_EINVAL, "shuffle %d unknown", (int)cfg->shuffle);
    if (cfg->partition == SL_SAMPLE_CHUNKED && cfg->chunk_size == 0)
        return sl_fail(msg, len, SL_EINVAL, "chunk size 0: chunks hold at least one sample");
    if (cfg->partition == SL_SAMPLE_CHUNKED && cfg->chunk_size > SL_SAMPLE_MAX_CHUNK)
        return sl_fail(msg, len, SL_ELIMIT, "chunk size %" PRIu64 " over the limit %" PRIu64,
                       cfg->chunk_size, SL_SAMPLE_MAX_CHUNK);
    if (cfg->shuffle == SL_SAMPLE_SHUFFLE_TORCH && cfg->samples >= SL_SAMPLE_TORCH_MAX_N)
        return sl_fail(msg, len, SL_ELIMIT,
                       "samples %" PRIu64 " too many for shuffle torch (exact below %" PRIu64
                       "); use feistel",
                       cfg->samples, SL_SAMPLE_TORCH_MAX_N);
    if (cfg->epoch > SL_SAMPLE_EPOCH_MAX)
        return sl_fail(msg, len, SL_EINVAL, "epoch %" PRIu64 " out of range [0, %" PRIu64 "]",
                       cfg->epoch, SL_SAMPLE_EPOCH_MAX);
    if (cfg->seed > UINT64_MAX - cfg->epoch)
        return sl_fail(msg, len, SL_EINVAL,
                       "epoch %" PRIu64 " out of range: seed %" PRIu64 " + epoch exceeds %" PRIu64,
                       cfg->epoch, cfg->seed, UINT64_MAX);
    if ((err = check_mesh(cfg, msg, len)) != 0)
        return err;
    return check_classes(cfg, msg, len);
}

/* dp coordinate of a valid config's rank. */
void smp_dp_of(uint32_t *dp_rank, uint32_t *dp_size, const sl_sample_config *cfg)
{
    const sl_sample_mesh *m = &cfg->mesh;
    const uint32_t sz[5] = {0, m->dp, m->tp, m->cp, m->pp};
    uint32_t rest = cfg->rank, coord[5] = {0};
    uint8_t ord[4];

    if (!mesh_used(m)) {
        *dp_rank = cfg->rank;
        *dp_size = cfg->replicas;
        return;
    }
    mesh_order(ord, m);
    /* The innermost axis varies fastest in the global rank. */
    for (int i = 3; i >= 0; i--) {
        coord[ord[i]] = rest % sz[ord[i]];
        rest /= sz[ord[i]];
    }
    *dp_rank = coord[SL_SAMPLE_AXIS_DP];
    *dp_size = m->dp;
}

int sl_sample_dp_rank(uint32_t *dp_rank, uint32_t *dp_size, const sl_sample_config *cfg, char *msg,
                      size_t len)
{
    int err = sl_sample_config_check(cfg, msg, len);

    if (err)
        return err;
    smp_dp_of(dp_rank, dp_size, cfg);
    return 0;
}

static const char *const partition_names[] = {"interleaved", "contiguous", "chunked"};
static const char *const shuffle_names[] = {"none", "torch", "feistel"};

int sl_sample_partition_parse(sl_sample_partition *out, const char *s)
{
    for (int i = 0; s && i < 3; i++) {
        if (strcmp(s, partition_names[i]) == 0) {
            *out = (sl_sample_partition)i;
            return 0;
        }
    }
    return SL_EINVAL;
}

int sl_sample_shuffle_parse(sl_sample_shuffle *out, const char *s)
{
    for (int i = 0; s && i < 3; i++) {
        if (strcmp(s, shuffle_names[i]) == 0) {
            *out = (sl_sample_shuffle)i;
            return 0;
        }
    }
    return SL_EINVAL;
}

int sl_sample_mesh_order_parse(uint8_t out[4], const char *s)
{
    uint8_t ord[4];
    unsigned seen = 0;
    int n = 0;

    if (!s)
        return SL_EINVAL;
    while (*s) {
        int a;
        for (a = 1; a <= 4; a++)
            if (strncmp(s, axis_names[a], 2) == 0 && (s[2] == ',' || s[2] == '\0'))
                break;
        if (a > 4 || n == 4 || (seen & (1u << a)))
            return SL_EINVAL;
        seen |= 1u << a;
        ord[n++] = (uint8_t)a;
        s += 2;
        if (*s == ',' && s[1] != '\0')
            s++;
        else if (*s)
            return SL_EINVAL;
    }
    if (n != 4)
        return SL_EINVAL;
    memcpy(out, ord, 4);
    return 0;
}

const char *sl_sample_partition_name(sl_sample_partition p)
{
    return (unsigned)p < 3 ? partition_names[p] : "?";
}

const char *sl_sample_shuffle_name(sl_sample_shuffle s)
{
    return (unsigned)s < 3 ? shuffle_names[s] : "?";
}
