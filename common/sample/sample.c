/* Sampling engine: configs, layouts of each partition mode, streams and elastic plans. */
#include "internal.h"

#include "err.h"
#include "util/msg.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void dp_of(uint32_t *dp_rank, uint32_t *dp_size, const sl_sample_config *cfg);

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
    dp_of(&r, &R, cfg);
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
static void dp_of(uint32_t *dp_rank, uint32_t *dp_size, const sl_sample_config *cfg)
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
    dp_of(dp_rank, dp_size, cfg);
    return 0;
}

static int is_torch(const layout *L)
{
    return L->cfg.shuffle == SL_SAMPLE_SHUFFLE_TORCH;
}

static void layout_close(layout *L);

static int dup_doubles(double **out, const double *w, size_t n)
{
    *out = NULL;
    if (!n)
        return 0;
    if (!(*out = malloc(n * sizeof(**out))))
        return -ENOMEM;
    memcpy(*out, w, n * sizeof(**out));
    return 0;
}

/* Weighted pieces of the epoch order (class-blind) or the class layout. */
static int layout_weights(layout *L, char *msg, size_t len)
{
    const sl_sample_config *c = &L->cfg;
    uint64_t *q = NULL, *cnt = NULL;
    int err = 0;

    if (c->n_rank_weights) {
        if (!(q = malloc((size_t)L->R * sizeof(*q))))
            goto nomem;
        if ((err = sl_weights_quantize(q, c->rank_weights, L->R, "rank", msg, len)) != 0)
            goto out;
    }
    if (c->classes != SL_SAMPLE_CLASSES_NONE) {
        if (!(L->st = calloc(1, sizeof(*L->st))))
            goto nomem;
        err = sl_strat_init(L->st, c, L->R, q, msg, len);
        if (err) {
            free(L->st);
            L->st = NULL;
        }
        goto out;
    }
    if (!q)
        goto out;
    cnt = malloc((size_t)L->R * sizeof(*cnt));
    L->rpre = malloc(((size_t)L->R + 1) * sizeof(*L->rpre));
    if (!cnt || !L->rpre || sl_lr_split(cnt, L->n, q, L->R, c->drop_last))
        goto nomem;
    L->rpre[0] = 0;
    for (uint32_t r = 0; r < L->R; r++)
        L->rpre[r + 1] = L->rpre[r] + cnt[r];
    goto out;
nomem:
    err = sl_fail(msg, len, -ENOMEM, "out of memory");
out:
    free(q);
    free(cnt);
    return err;
}

/* Sizes, weighted pieces and the class layout of a checked config; no shuffle permutation is
 * built. On failure the layout is closed. */
static int layout_init(layout *L, const sl_sample_config *cfg, char *msg, size_t len)
{
    uint32_t dummy;
    int err;

    memset(L, 0, sizeof(*L));
    L->cfg = *cfg;
    if (dup_doubles(&L->rw, cfg->rank_weights, cfg->n_rank_weights) ||
        dup_doubles(&L->cw, cfg->class_weights, cfg->n_class_weights)) {
        layout_close(L);
        return sl_fail(msg, len, -ENOMEM, "out of memory");
    }
    L->cfg.rank_weights = L->rw;
    L->cfg.class_weights = L->cw;
    L->n = cfg->samples;
    dp_of(&dummy, &L->R, cfg);
    switch (cfg->partition) {
    case SL_SAMPLE_INTERLEAVED:
        L->per = cfg->drop_last ? L->n / L->R : L->n / L->R + (L->n % L->R != 0);
        break;
    case SL_SAMPLE_CONTIGUOUS:
        L->blk = L->n / L->R;
        L->last_len = cfg->drop_last ? L->blk : L->n - (uint64_t)(L->R - 1) * L->blk;
        break;
    case SL_SAMPLE_CHUNKED:
        L->C = cfg->chunk_size;
        L->kfull = L->n / L->C;
        if (cfg->drop_last) {
            L->kuse = L->kfull / L->R * L->R;
            L->rem = 0;
        } else {
            L->rem = L->n % L->C;
            L->kuse = L->kfull + (L->rem != 0);
        }
        break;
    }
    if ((err = layout_weights(L, msg, len)) != 0)
        layout_close(L);
    return err;
}

static uint64_t layout_count(const layout *L, uint32_t r)
{
    uint64_t cnt;

    if (L->st)
        return sl_strat_count(L->st, r);
    if (L->rpre)
        return L->rpre[r + 1] - L->rpre[r];
    switch (L->cfg.partition) {
    case SL_SAMPLE_INTERLEAVED:
        return L->per;
    case SL_SAMPLE_CONTIGUOUS:
        return r + 1 == L->R ? L->last_len : L->blk;
    default:
        cnt = L->kuse > r ? (L->kuse - 1 - r) / L->R + 1 : 0;
        if (L->rem && L->kfull % L->R == r)
            return (cnt - 1) * L->C + L->rem;
        return cnt * L->C;
    }
}

static int torch_table(uint32_t **out, uint64_t n, uint64_t seed)
{
    *out = malloc((n ? n : 1) * sizeof(uint32_t));
    if (!*out)
        return -ENOMEM;
    sl_torch_randperm(*out, n, seed);
    return 0;
}

/* Build the permutations a layout needs: for every rank (rank < 0) or only for `rank`. */
static int layout_perms(layout *L, int64_t rank)
{
    const sl_sample_config *c = &L->cfg;
    uint64_t tseed = c->seed + c->epoch;
    int err = 0;

    L->order.mode = c->shuffle;
    if (c->partition == SL_SAMPLE_INTERLEAVED)
        L->order.n = L->n;
    else if (c->partition == SL_SAMPLE_CHUNKED)
        L->order.n = L->kfull;
    if (L->order.mode == SL_SAMPLE_SHUFFLE_FEISTEL)
        sl_feistel_init(&L->order.f, L->order.n, c->seed, c->epoch, 0);
    if (!is_torch(L))
        return 0;
    if (L->order.n) {
        if ((err = torch_table(&L->tab_order, L->order.n, tseed)) != 0)
            return err;
        L->order.tab = L->tab_order;
    }
    /* Within-block and within-chunk orders in torch mode: torch.randperm(length) with the
     * epoch's generator seed, the same for every block or chunk of one length. */
    if (c->partition == SL_SAMPLE_CONTIGUOUS) {
        int need_last = rank < 0 || rank + 1 == (int64_t)L->R;
        int need_blk = rank < 0 || rank + 1 < (int64_t)L->R;
        if (need_blk && (err = torch_table(&L->tab_a, L->blk, tseed)) != 0)
            return err;
        if (need_last && (err = torch_table(&L->tab_b, L->last_len, tseed)) != 0)
            return err;
    } else if (c->partition == SL_SAMPLE_CHUNKED) {
        if (L->kfull && (err = torch_table(&L->tab_a, L->C, tseed)) != 0)
            return err;
        if (L->rem && (err = torch_table(&L->tab_b, L->rem, tseed)) != 0)
            return err;
    }
    return 0;
}

static void layout_close(layout *L)
{
    free(L->tab_order);
    free(L->tab_a);
    free(L->tab_b);
    free(L->rpre);
    free(L->rw);
    free(L->cw);
    if (L->st)
        sl_strat_close(L->st);
    free(L->st);
    L->tab_order = L->tab_a = L->tab_b = NULL;
    L->rpre = NULL;
    L->rw = L->cw = NULL;
    L->st = NULL;
}

/* The permutation within contiguous block or chunk `id` of length `n`. */
static void within_perm(sl_perm *p, const layout *L, uint64_t id, uint64_t n, int last)
{
    p->n = n;
    p->mode = L->cfg.shuffle;
    p->tab = last ? L->tab_b : L->tab_a;
    if (p->mode == SL_SAMPLE_SHUFFLE_FEISTEL)
        sl_feistel_init(&p->f, n, L->cfg.seed, L->cfg.epoch, 1 + id);
}

/* Index at position i < count of dp rank r's share. */
static uint64_t layout_at(const layout *L, uint32_t r, uint64_t i)
{
    sl_perm w;
    uint64_t p, jj, off, j, id;

    if (L->st)
        return sl_strat_at(L->st, r, NULL, i);
    if (L->rpre && L->cfg.partition == SL_SAMPLE_INTERLEAVED)
        return sl_perm_at(&L->order, L->rpre[r] + i);
    if (L->rpre) {
        within_perm(&w, L, r, L->rpre[r + 1] - L->rpre[r], 0);
        return L->rpre[r] + sl_perm_at(&w, i);
    }
    switch (L->cfg.partition) {
    case SL_SAMPLE_INTERLEAVED:
        p = r + i * L->R;
        if (p >= L->n)
            p %= L->n; /* torch's padding: wrap around to the start of the order */
        return sl_perm_at(&L->order, p);
    case SL_SAMPLE_CONTIGUOUS:
        if (r + 1 == L->R) {
            within_perm(&w, L, r, L->last_len, 1);
        } else {
            within_perm(&w, L, r, L->blk, 0);
        }
        return (uint64_t)r * L->blk + sl_perm_at(&w, i);
    default:
        jj = i / L->C;
        off = i % L->C;
        j = r + jj * L->R;
        if (j < L->kfull) {
            id = sl_perm_at(&L->order, j);
            within_perm(&w, L, id, L->C, 0);
        } else {
            id = L->kfull;
            within_perm(&w, L, id, L->rem, 1);
        }
        return id * L->C + sl_perm_at(&w, off);
    }
}

/* Weighted class-blind shares: one piece of the epoch order, or one block. */
static void weighted_fill(const layout *L, uint32_t r, uint64_t pos, uint64_t *out, size_t m)
{
    uint64_t base = L->rpre[r];
    const sl_perm *p = &L->order;
    sl_perm w;

    if (L->cfg.partition == SL_SAMPLE_CONTIGUOUS) {
        within_perm(&w, L, r, L->rpre[r + 1] - base, 0);
        p = &w;
        if (p->mode == SL_SAMPLE_SHUFFLE_FEISTEL) {
            sl_feistel_map_seq(&p->f, out, pos, 1, m);
            for (size_t k = 0; k < m; k++)
                out[k] += base;
            return;
        }
        for (size_t k = 0; k < m; k++)
            out[k] = base + sl_perm_at(p, pos + k);
        return;
    }
    if (p->mode == SL_SAMPLE_SHUFFLE_FEISTEL) {
        sl_feistel_map_seq(&p->f, out, base + pos, 1, m);
        return;
    }
    for (size_t k = 0; k < m; k++)
        out[k] = sl_perm_at(p, base + pos + k);
}

/* Fast paths: m indices from position pos of dp rank r's share (cnt: a stratified stream's
 * node counts or NULL). */
static void layout_fill(const layout *L, uint32_t r, uint64_t pos, uint64_t *out, size_t m,
                        const uint64_t *ncnt)
{
    sl_perm w;
    size_t k = 0;

    if (L->st) {
        sl_strat_fill(out, L->st, r, ncnt, pos, m);
        return;
    }
    if (L->rpre) {
        weighted_fill(L, r, pos, out, m);
        return;
    }
    if (L->cfg.partition == SL_SAMPLE_INTERLEAVED) {
        uint64_t p = r + pos * L->R, n = L->n, R = L->R;
        if (L->order.mode == SL_SAMPLE_SHUFFLE_FEISTEL) {
            /* Positions below n form an arithmetic sequence the network reads directly; only
             * the padding tail wraps around. */
            if (p < n) {
                uint64_t run = (n - p + R - 1) / R;
                k = run < m ? (size_t)run : m;
                sl_feistel_map_seq(&L->order.f, out, p, R, k);
                p += k * R;
            }
            for (size_t j = k; j < m; j++, p += R)
                out[j] = p % n;
            sl_feistel_map(&L->order.f, out + k, m - k);
            return;
        }
        for (; k < m && p < n; k++, p += R)
            out[k] = sl_perm_at(&L->order, p);
        for (; k < m; k++, p += R)
            out[k] = sl_perm_at(&L->order, p % n);
        return;
    }
    if (L->cfg.partition == SL_SAMPLE_CONTIGUOUS) {
        uint64_t base = (uint64_t)r * L->blk;
        within_perm(&w, L, r, r + 1 == L->R ? L->last_len : L->blk, r + 1 == L->R);
        if (w.mode == SL_SAMPLE_SHUFFLE_FEISTEL) {
            sl_feistel_map_seq(&w.f, out, pos, 1, m);
            for (; k < m; k++)
                out[k] += base;
            return;
        }
        for (; k < m; k++)
            out[k] = base + sl_perm_at(&w, pos + k);
        return;
    }
    /* Chunked: one permutation set-up per chunk. */
    while (k < m) {
        uint64_t i = pos + k, jj = i / L->C, off = i % L->C, j = r + jj * L->R, id, len;
        if (j < L->kfull) {
            id = sl_perm_at(&L->order, j);
            len = L->C;
        } else {
            id = L->kfull;
            len = L->rem;
        }
        within_perm(&w, L, id, len, j >= L->kfull);
        if (w.mode == SL_SAMPLE_SHUFFLE_FEISTEL) {
            size_t cnt = len - off < m - k ? (size_t)(len - off) : m - k;
            sl_feistel_map_seq(&w.f, out + k, off, 1, cnt);
            for (size_t e = k + cnt; k < e; k++)
                out[k] += id * L->C;
            continue;
        }
        for (; k < m && off < len; k++, off++)
            out[k] = id * L->C + sl_perm_at(&w, off);
    }
}

int sl_sample_share_count(uint64_t *out, const sl_sample_config *cfg, char *msg, size_t len)
{
    layout L;
    uint32_t r, R;
    int err = sl_sample_config_check(cfg, msg, len);

    if (err)
        return err;
    dp_of(&r, &R, cfg);
    if ((err = layout_init(&L, cfg, msg, len)) != 0)
        return err;
    *out = layout_count(&L, r);
    layout_close(&L);
    return 0;
}

int sl_sample_feistel_at(uint64_t *out, uint64_t n, uint64_t seed, uint64_t epoch, uint64_t pos)
{
    sl_feistel f;

    if (!out || n == 0 || n > SL_SAMPLE_MAX_N || pos >= n)
        return SL_EINVAL;
    sl_feistel_init(&f, n, seed, epoch, 0);
    *out = sl_feistel_at(&f, pos);
    return 0;
}

int sl_sample_epoch_order(uint64_t *out, uint64_t n, int shuffle_mode, uint64_t seed,
                          uint64_t epoch)
{
    sl_feistel f;
    uint32_t *tab;

    if (!out || n == 0 || epoch > SL_SAMPLE_EPOCH_MAX || seed > UINT64_MAX - epoch)
        return SL_EINVAL;
    if (n > SL_SAMPLE_MAX_N)
        return SL_ELIMIT;
    switch (shuffle_mode) {
    case SL_SAMPLE_SHUFFLE_NONE:
        for (uint64_t i = 0; i < n; i++)
            out[i] = i;
        return 0;
    case SL_SAMPLE_SHUFFLE_TORCH:
        if (n >= SL_SAMPLE_TORCH_MAX_N)
            return SL_ELIMIT;
        if (!(tab = malloc(n * sizeof(*tab))))
            return -ENOMEM;
        sl_torch_randperm(tab, n, seed + epoch);
        for (uint64_t i = 0; i < n; i++)
            out[i] = tab[i];
        free(tab);
        return 0;
    case SL_SAMPLE_SHUFFLE_FEISTEL:
        sl_feistel_init(&f, n, seed, epoch, 0);
        sl_feistel_map_seq(&f, out, 0, 1, n);
        return 0;
    default:
        return SL_EINVAL;
    }
}

int sl_sample_new(sl_sample **out, const sl_sample_config *cfg, char *msg, size_t len)
{
    sl_sample *s = NULL;
    uint32_t R;
    int err;

    *out = NULL;
    if ((err = sl_sample_config_check(cfg, msg, len)) != 0)
        goto out;
    if (!(s = calloc(1, sizeof(*s)))) {
        err = sl_fail(msg, len, -ENOMEM, "out of memory");
        goto out;
    }
    if ((err = layout_init(&s->own, cfg, msg, len)) != 0)
        goto out;
    dp_of(&s->r, &R, cfg);
    if ((err = layout_perms(&s->own, s->r)) != 0) {
        sl_fail(msg, len, err, "out of memory for the torch permutation of %" PRIu64 " samples",
                cfg->samples);
        goto out;
    }
    s->L = &s->own;
    s->count = layout_count(s->L, s->r);
    if (s->own.st) {
        if (!(s->cnt = malloc(((size_t)s->own.st->ctree.nnode + 1) * sizeof(*s->cnt)))) {
            err = sl_fail(msg, len, -ENOMEM, "out of memory");
            goto out;
        }
        sl_strat_counts(s->cnt, s->own.st, s->r);
    }
    *out = s;
    s = NULL;
out:
    sl_sample_free(s);
    return err;
}

uint64_t sl_sample_count(const sl_sample *s)
{
    return s->count;
}

uint64_t sl_sample_pos(const sl_sample *s)
{
    return s->pos;
}

int sl_sample_seek(sl_sample *s, uint64_t pos)
{
    if (!s || pos > s->count)
        return SL_EINVAL;
    s->pos = pos;
    return 0;
}

/* Position in the rest of level lv of new rank s's i-th index (i < its count). */
static uint64_t level_pos(const elevel *lv, uint32_t s, uint64_t i)
{
    uint64_t q = lv->T / lv->new_R, rm = lv->T % lv->new_R, v;

    if (lv->woff)
        return lv->woff[s] + i;
    if (lv->interleave)
        v = s + i * lv->new_R;
    else
        v = s * q + (s < rm ? s : rm) + i;
    if (v >= lv->T)
        v %= lv->T; /* padding wraps around to the start of the rest */
    return v;
}

static uint64_t level_count(const elevel *lv, uint32_t s)
{
    uint64_t q = lv->T / lv->new_R, rm = lv->T % lv->new_R;

    if (lv->woff)
        return lv->woff[s + 1] - lv->woff[s];
    if (lv->T == 0)
        return 0;
    if (lv->pad)
        return q + (rm != 0);
    return q + (s < rm);
}

/* New rank s's indices that are not padding. */
static uint64_t level_real(const elevel *lv, uint32_t s)
{
    if (lv->woff || !lv->pad)
        return level_count(lv, s);
    if (lv->interleave)
        return lv->T > s ? (lv->T - s - 1) / lv->new_R + 1 : 0;
    return lv->T / lv->new_R + (s < lv->T % lv->new_R);
}

/* Index at position i of rank s of level k's shares: down the levels to the epoch's layout. */
static uint64_t level_at(const sl_sample_elastic *e, uint32_t k, uint32_t s, uint64_t i)
{
    for (;;) {
        const elevel *lv = &e->lev[k];
        uint64_t v = level_pos(lv, s, i);
        uint32_t lo = 0, hi = lv->old_R; /* off[lo] <= v < off[hi] */
        while (hi - lo > 1) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (lv->off[mid] <= v)
                lo = mid;
            else
                hi = mid;
        }
        i = lv->start[lo] + (v - lv->off[lo]);
        s = lo;
        if (k == 0)
            return layout_at(&e->L, s, i);
        k--;
    }
}

int sl_sample_fill(uint64_t *out, const sl_sample *s, uint64_t pos, size_t m)
{
    if (!s || (m && !out) || pos > s->count || m > s->count - pos)
        return SL_EINVAL;
    if (s->e) {
        for (size_t k = 0; k < m; k++)
            out[k] = level_at(s->e, s->e->nlev - 1, s->r, pos + k);
        return 0;
    }
    layout_fill(s->L, s->r, pos, out, m, s->cnt);
    return 0;
}

int sl_sample_next(uint64_t *out, size_t *got, sl_sample *s, size_t max)
{
    uint64_t left;
    size_t m;
    int err;

    if (!got || !s)
        return SL_EINVAL;
    left = s->count - s->pos;
    m = left < max ? (size_t)left : max;
    if ((err = sl_sample_fill(out, s, s->pos, m)) != 0)
        return err;
    s->pos += m;
    *got = m;
    return 0;
}

void sl_sample_free(sl_sample *s)
{
    if (!s)
        return;
    layout_close(&s->own);
    free(s->cnt);
    free(s);
}

static void elastic_free_levels(elevel *lev, uint32_t n)
{
    for (uint32_t k = 0; lev && k < n; k++) {
        free(lev[k].start);
        free(lev[k].off);
        free(lev[k].woff);
    }
    free(lev);
}

/* Append the level of one resize to e, whose levels array has room for it. */
static int elastic_add_level(sl_sample_elastic *e, const sl_sample_resize *st, char *msg,
                             size_t len)
{
    elevel *prev = e->nlev ? &e->lev[e->nlev - 1] : NULL, *lv = &e->lev[e->nlev];
    uint32_t old_R = prev ? prev->new_R : e->L.R;
    uint64_t *q = NULL;
    int err = 0;

    memset(lv, 0, sizeof(*lv));
    if (!st || (st->n_consumed && !st->consumed))
        return sl_fail(msg, len, SL_EINVAL, "no consumed counts");
    if (st->new_replicas == 0)
        return sl_fail(msg, len, SL_EINVAL,
                       "new replicas 0: the world must hold at least one rank");
    if (st->n_consumed != old_R)
        return sl_fail(msg, len, SL_EINVAL,
                       "%zu consumed counts for an old dp world of %" PRIu32 " ranks",
                       st->n_consumed, old_R);
    if (st->n_weights && st->n_weights != st->new_replicas)
        return sl_fail(msg, len, SL_EINVAL,
                       "%zu rank weights for a new dp world of %" PRIu32 " ranks", st->n_weights,
                       st->new_replicas);
    lv->old_R = old_R;
    lv->new_R = st->new_replicas;
    e->nlev++; /* from here lv is freed with the plan */
    lv->start = malloc((size_t)old_R * sizeof(*lv->start));
    lv->off = malloc(((size_t)old_R + 1) * sizeof(*lv->off));
    if (!lv->start || !lv->off)
        return sl_fail(msg, len, -ENOMEM, "out of memory");
    lv->off[0] = 0;
    for (uint32_t r = 0; r < old_R; r++) {
        /* The first resize keeps the epoch's padding as part of what is left (as before
         * chaining existed); later ones pass on only real indices. */
        uint64_t cnt = prev ? level_count(prev, r) : layout_count(&e->L, r);
        uint64_t real = prev ? level_real(prev, r) : cnt;
        if (st->consumed[r] > cnt)
            return sl_fail(msg, len, SL_EINVAL,
                           "consumed %" PRIu64 " for old rank %" PRIu32
                           " exceeds its share of %" PRIu64,
                           st->consumed[r], r, cnt);
        lv->start[r] = st->consumed[r];
        lv->off[r + 1] = lv->off[r] + (real > st->consumed[r] ? real - st->consumed[r] : 0);
    }
    lv->T = lv->off[old_R];
    lv->interleave = e->L.cfg.partition == SL_SAMPLE_INTERLEAVED;
    lv->pad = !e->L.cfg.drop_last && e->L.cfg.partition != SL_SAMPLE_CHUNKED;
    if (!st->n_weights)
        return 0;
    q = malloc(st->n_weights * sizeof(*q));
    lv->woff = malloc((st->n_weights + 1) * sizeof(*lv->woff));
    if (!q || !lv->woff) {
        err = sl_fail(msg, len, -ENOMEM, "out of memory");
        goto out;
    }
    if ((err = sl_weights_quantize(q, st->weights, st->n_weights, "rank", msg, len)) != 0)
        goto out;
    if ((err = sl_lr_split(lv->woff + 1, lv->T, q, st->n_weights, 0)) != 0) {
        err = sl_fail(msg, len, err, "out of memory");
        goto out;
    }
    lv->woff[0] = 0;
    for (size_t s = 0; s < st->n_weights; s++)
        lv->woff[s + 1] += lv->woff[s];
out:
    free(q);
    return err;
}

/* A plan with the epoch's layout (every rank) and room for n_lev levels. */
static int elastic_alloc(sl_sample_elastic **out, const sl_sample_config *epoch_cfg, size_t n_lev,
                         char *msg, size_t len)
{
    sl_sample_elastic *e;
    sl_sample_config cfg;
    int err;

    *out = NULL;
    if (!epoch_cfg)
        return sl_fail(msg, len, SL_EINVAL, "no config");
    cfg = *epoch_cfg;
    cfg.rank = 0; /* the plan covers every rank */
    if ((err = sl_sample_config_check(&cfg, msg, len)) != 0)
        return err;
    if (!(e = calloc(1, sizeof(*e))) || !(e->lev = calloc(n_lev ? n_lev : 1, sizeof(*e->lev)))) {
        free(e);
        return sl_fail(msg, len, -ENOMEM, "out of memory");
    }
    if ((err = layout_init(&e->L, &cfg, msg, len)) != 0) {
        sl_sample_elastic_free(e);
        return err;
    }
    if ((err = layout_perms(&e->L, -1)) != 0) {
        sl_sample_elastic_free(e);
        return sl_fail(msg, len, err,
                       "out of memory for the torch permutation of %" PRIu64 " samples",
                       cfg.samples);
    }
    *out = e;
    return 0;
}

int sl_sample_elastic_chain(sl_sample_elastic **out, const sl_sample_config *epoch_cfg,
                            const sl_sample_resize *steps, size_t n_steps, char *msg, size_t len)
{
    sl_sample_elastic *e = NULL;
    int err;

    *out = NULL;
    if (n_steps == 0 || !steps)
        return sl_fail(msg, len, SL_EINVAL, "no resize steps");
    if ((err = elastic_alloc(&e, epoch_cfg, n_steps, msg, len)) != 0)
        return err;
    for (size_t k = 0; k < n_steps && !err; k++)
        err = elastic_add_level(e, &steps[k], msg, len);
    if (err)
        sl_sample_elastic_free(e);
    else
        *out = e;
    return err;
}

int sl_sample_elastic_extend(sl_sample_elastic **out, const sl_sample_elastic *prev,
                             const sl_sample_resize *step, char *msg, size_t len)
{
    sl_sample_elastic *e = NULL;
    int err;

    *out = NULL;
    if (!prev)
        return sl_fail(msg, len, SL_EINVAL, "no elastic plan");
    if ((err = elastic_alloc(&e, &prev->L.cfg, (size_t)prev->nlev + 1, msg, len)) != 0)
        return err;
    for (uint32_t k = 0; k < prev->nlev; k++) {
        const elevel *p = &prev->lev[k];
        elevel *lv = &e->lev[k];
        *lv = *p;
        lv->start = malloc((size_t)p->old_R * sizeof(*lv->start));
        lv->off = malloc(((size_t)p->old_R + 1) * sizeof(*lv->off));
        lv->woff = p->woff ? malloc(((size_t)p->new_R + 1) * sizeof(*lv->woff)) : NULL;
        e->nlev++;
        if (!lv->start || !lv->off || (p->woff && !lv->woff)) {
            sl_sample_elastic_free(e);
            return sl_fail(msg, len, -ENOMEM, "out of memory");
        }
        memcpy(lv->start, p->start, (size_t)p->old_R * sizeof(*lv->start));
        memcpy(lv->off, p->off, ((size_t)p->old_R + 1) * sizeof(*lv->off));
        if (p->woff)
            memcpy(lv->woff, p->woff, ((size_t)p->new_R + 1) * sizeof(*lv->woff));
    }
    if ((err = elastic_add_level(e, step, msg, len)) != 0)
        sl_sample_elastic_free(e);
    else
        *out = e;
    return err;
}

int sl_sample_elastic_new(sl_sample_elastic **out, const sl_sample_config *epoch_cfg,
                          const uint64_t *consumed, size_t n_consumed, uint32_t new_replicas,
                          char *msg, size_t len)
{
    sl_sample_resize step = {consumed, n_consumed, new_replicas, NULL, 0};

    *out = NULL;
    if (!epoch_cfg || (n_consumed && !consumed))
        return sl_fail(msg, len, SL_EINVAL, "no config or consumed counts");
    return sl_sample_elastic_chain(out, epoch_cfg, &step, 1, msg, len);
}

uint64_t sl_sample_elastic_remaining(const sl_sample_elastic *e)
{
    return e->lev[e->nlev - 1].T;
}

uint32_t sl_sample_elastic_world(const sl_sample_elastic *e)
{
    return e->lev[e->nlev - 1].new_R;
}

int sl_sample_new_elastic(sl_sample **out, const sl_sample_elastic *e, uint32_t new_rank, char *msg,
                          size_t len)
{
    sl_sample *s;

    *out = NULL;
    if (!e)
        return sl_fail(msg, len, SL_EINVAL, "no elastic plan");
    if (new_rank >= sl_sample_elastic_world(e))
        return sl_fail(msg, len, SL_EINVAL, "rank %" PRIu32 " out of range [0, %" PRIu32 ")",
                       new_rank, sl_sample_elastic_world(e));
    if (!(s = calloc(1, sizeof(*s))))
        return sl_fail(msg, len, -ENOMEM, "out of memory");
    s->L = &e->L;
    s->e = e;
    s->r = new_rank;
    s->count = level_count(&e->lev[e->nlev - 1], new_rank);
    *out = s;
    return 0;
}

void sl_sample_elastic_free(sl_sample_elastic *e)
{
    if (!e)
        return;
    layout_close(&e->L);
    elastic_free_levels(e->lev, e->nlev);
    free(e);
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
