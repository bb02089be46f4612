/* sluice batch: plan an epoch's token-budget batches from a file of sequence lengths (local, no
 * daemon). The epoch order comes from the sampling engine (with classes: batch_epoch.c), the plan
 * from common/batch/, the lengths from the lengths-file module (util/lengths.h); mid-epoch
 * resizes are applied to the plan as the daemon applies them (batch_epoch.c). */
#include "cli.h"

#include "batch/batch.h"
#include "batch_epoch.h"
#include "err.h"
#include "opt.h"
#include "sample/sample.h"
#include "util/lengths.h"
#include "util/num.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Resizes after the first (--consumed/--new-replicas), as in `sluice sample`. */
#define MAX_RESIZES 16

typedef struct batch_opts {
    sl_batch_config cfg;
    sl_sample_config sc; /* the order: partition, chunk size, drop_last, mesh */
    sl_sample_shuffle shuffle;
    sl_lengths_form form;
    const char *path;
    uint64_t rank; /* UINT64_MAX: all ranks */
    int stats_only, partitioned, have_chunk;
    double *rank_w; /* --rank-weights: one per dp rank */
    size_t n_rank_w;
    batch_classes cls;
    /* Resizes: --consumed/--new-replicas, then each --resize "C0,C1,...:R2". */
    batch_step first;
    uint64_t new_replicas;
    int have_new;
    batch_step more[MAX_RESIZES];
    size_t n_more;
} batch_opts;

/* Parse "A,B,..." (each a decimal in [0, 2^64)) into *st, replacing what it held. */
static int set_steps_list(batch_step *st, const char *opt, const char *arg)
{
    size_t cnt = 1;
    uint64_t *v;

    for (const char *p = arg; *p; p++)
        cnt += *p == ',';
    if (cnt > SL_BATCH_MAX_REPLICAS) {
        fprintf(stderr, "sluice batch: --%s has %zu entries, more than %u\n", opt, cnt,
                SL_BATCH_MAX_REPLICAS);
        return SL_CLI_USAGE;
    }
    if (!(v = calloc(cnt, sizeof(*v))))
        return sl_cli_fail("batch", "out of memory");
    if (sl_parse_u64_list(v, cnt, arg, ',', 0, UINT64_MAX) != 0) {
        free(v);
        fprintf(stderr, "sluice batch: --%s '%s' is not a list of batch counts C0,C1,...\n", opt,
                arg);
        return SL_CLI_USAGE;
    }
    free(st->consumed);
    st->consumed = v;
    st->n_consumed = cnt;
    return 0;
}

static int set_consumed(void *field, const char *arg)
{
    return set_steps_list(field, "consumed", arg);
}

/* One more resize, "C0,C1,...:R2", appended to the chain. */
static int set_resize(void *field, const char *arg)
{
    batch_opts *o = (batch_opts *)((char *)field - offsetof(batch_opts, n_more));
    const char *colon = strrchr(arg, ':');
    uint64_t world;
    char *list;
    int r;

    if (o->n_more == MAX_RESIZES) {
        fprintf(stderr, "sluice batch: more than %d --resize steps\n", MAX_RESIZES);
        return SL_CLI_USAGE;
    }
    if (!colon || sl_parse_u64(&world, colon + 1, 1, SL_BATCH_MAX_REPLICAS) != 0) {
        fprintf(stderr, "sluice batch: --resize '%s' is not C0,C1,...:R2 (R2 in [1, %u])\n", arg,
                SL_BATCH_MAX_REPLICAS);
        return SL_CLI_USAGE;
    }
    if (!(list = strndup(arg, (size_t)(colon - arg))))
        return sl_cli_fail("batch", "out of memory");
    r = set_steps_list(&o->more[o->n_more], "resize", list);
    free(list);
    if (r == 0)
        o->more[o->n_more++].new_replicas = (uint32_t)world;
    return r;
}

/* Parse a weight list ("class" or "rank", at most max) into a new array that replaces *dst. */
static int parse_weights(double **dst, size_t *n, size_t max, const char *arg, const char *kind)
{
    double *v = calloc(max, sizeof(*v));
    char msg[256];

    if (!v)
        return sl_cli_fail("batch", "out of memory");
    if (sl_sample_weights_parse(v, n, max, arg, kind, msg, sizeof(msg)) != 0) {
        free(v);
        fprintf(stderr, "sluice batch: %s\n", msg);
        return SL_CLI_USAGE;
    }
    free(*dst);
    *dst = v;
    return 0;
}

static int set_class_weights(void *field, const char *arg)
{
    batch_classes *c = field;

    return parse_weights(&c->class_w, &c->n_class_w, SL_SAMPLE_MAX_CLASSES, arg, "class");
}

static int set_rank_weights(void *field, const char *arg)
{
    batch_opts *o = (batch_opts *)((char *)field - offsetof(batch_opts, rank_w));

    return parse_weights(&o->rank_w, &o->n_rank_w, SL_BATCH_MAX_REPLICAS, arg, "rank");
}

static int set_form(void *field, const char *arg)
{
    return sl_lengths_form_parse(field, arg);
}

static int set_strategy(void *field, const char *arg)
{
    return sl_batch_strategy_parse(arg, field);
}

static int set_cost(void *field, const char *arg)
{
    return sl_batch_cost_parse(arg, field);
}

static int set_shuffle(void *field, const char *arg)
{
    return sl_sample_shuffle_parse(field, arg);
}

static int set_partition(void *field, const char *arg)
{
    return sl_sample_partition_parse(field, arg);
}

static int set_mesh_order(void *field, const char *arg)
{
    return sl_sample_mesh_order_parse(field, arg);
}

/* "DP,TP,CP,PP": four sizes >= 1. */
static int set_mesh(void *field, const char *arg)
{
    sl_sample_mesh *m = field;

    return sl_cli_mesh(arg, &m->dp, &m->tp, &m->cp, &m->pp);
}

static const sl_cli_choice remainders[] = {
    {"drop", SL_BATCH_DROP},
    {"pad", SL_BATCH_REPEAT},
    {NULL, 0},
};

#define AT(f)   SL_CLI_AT(batch_opts, f)
#define SEEN(f) SL_CLI_SEEN(batch_opts, f)

static const sl_cli_opt batch_table[] = {
    SL_CLI_LINE("Input:"),
    {"lengths", SL_CLI_STR, "FILE", "sequence lengths, sample i on line/record i ('-' = stdin)",
     AT(path)},
    {"lengths-format", SL_CLI_CALL, "FMT",
     "text (one integer >= 1 per line, default) or u32 (raw\nlittle-endian uint32)", AT(form),
     .call = set_form, .err = "is not text or u32"},
    SL_CLI_LINE(""),
    SL_CLI_LINE("Plan:"),
    {"strategy", SL_CLI_CALL, "S", "pad | bucket | dynamic (default) | packed", AT(cfg.strategy),
     .call = set_strategy, .err = "is not pad, bucket, dynamic or packed"},
    {"max-batch-size", SL_CLI_U64, "B", "sequences per batch (required)", AT(cfg.max_batch_size),
     .min = 1, .max = UINT32_MAX},
    {"max-seq-len", SL_CLI_U64, "L", "longer sequences are truncated to L (required)",
     AT(cfg.max_seq_len), .min = 1, .max = UINT32_MAX},
    {"max-tokens", SL_CLI_U64, "T", "token budget per batch (default B x L)", AT(cfg.max_tokens),
     .min = 1, .max = UINT64_MAX},
    {"cost", SL_CLI_CALL, "C",
     "padded (batch size x longest; default) or sum (sum of lengths;\nthe default and only "
     "choice for packed)",
     AT(cfg.cost), .call = set_cost, .err = "is not padded or sum"},
    {"skip-long", SL_CLI_FLAG, NULL, "leave sequences longer than L out instead of truncating them",
     AT(cfg.overlong), .value = SL_BATCH_SKIP},
    {"bucket-width", SL_CLI_U64, "W", "bucket strategy: lengths per bucket (default 64)",
     AT(cfg.bucket_width), .min = 1, .max = UINT32_MAX},
    {"window", SL_CLI_U64, "W",
     "sort by length within windows of W samples of the shuffled\norder (default 0 = the whole "
     "epoch)",
     AT(cfg.window), .max = UINT64_MAX},
    {"batch-size-multiple", SL_CLI_U64, "M", "make batch sizes multiples of M where possible",
     AT(cfg.batch_size_multiple), .min = 1, .max = UINT32_MAX},
    {"keep-order", SL_CLI_FLAG, NULL, "do not shuffle the batches (for inspection)",
     AT(cfg.keep_order)},
    SL_CLI_LINE(""),
    SL_CLI_LINE("Ranks:"),
    {"replicas", SL_CLI_U64, "D", "data-parallel ranks (default 1); with --mesh, the world size",
     AT(cfg.replicas), .min = 1, .max = SL_BATCH_MAX_REPLICAS},
    {"rank", SL_CLI_U64, "R",
     "print only rank R's batches and stats (default: all ranks);\nwith --mesh a global rank, "
     "printing its dp rank's batches",
     AT(rank), .max = SL_BATCH_MAX_REPLICAS - 1},
    {"mesh", SL_CLI_CALL, "DP,TP,CP,PP",
     "device mesh (product = --replicas): plan for the DP\ndata-parallel ranks; tp/cp/pp ranks "
     "share their dp rank's",
     AT(sc.mesh), .call = set_mesh, .err = "is not four sizes DP,TP,CP,PP (each >= 1)"},
    {"mesh-order", SL_CLI_CALL, "AXES", "mesh axes outermost first (default pp,dp,cp,tp)",
     AT(sc.mesh.order), .call = set_mesh_order,
     .err = "must list dp, tp, cp, pp once each, comma-separated"},
    {"remainder", SL_CLI_ENUM, "P",
     "drop (default) or pad (repeat batches from the start) so every\nrank gets the same "
     "number of batches",
     AT(cfg.remainder), .choices = remainders},
    {"balance", SL_CLI_FLAG, NULL, "give the D batches of each step about the same cost",
     AT(cfg.balance)},
    {"rank-weights", SL_CLI_CALL, "W0,W1,...",
     "one weight per dp rank (uneven GPUs): the same number of\nbatches each, budgets "
     "max_tokens x w / max(w)",
     AT(rank_w), .call = set_rank_weights},
    SL_CLI_LINE(""),
    SL_CLI_LINE("Order (as in `sluice sample`; see docs/batching.md):"),
    {"shuffle", SL_CLI_CALL, "MODE", "none | torch | feistel (default): the epoch order of samples",
     AT(shuffle), .call = set_shuffle, .err = "is not none, torch or feistel"},
    {"seed", SL_CLI_U64, "S", "shuffle seed for the order and the batches (default 0)",
     AT(cfg.seed), .max = UINT64_MAX},
    {"epoch", SL_CLI_U64, "E", "epoch (default 0)", AT(cfg.epoch), .max = SL_SAMPLE_EPOCH_MAX},
    {"partition", SL_CLI_CALL, "MODE",
     "plan the sampler's epoch order for this partition over the\nD data-parallel ranks: "
     "interleaved (torch's layout: the order\npadded by wrap-around, or cut with --drop-last, "
     "to a multiple\nof D), contiguous (rank 0's block, then rank 1's, ...) or\nchunked (the "
     "chunks in chunk order). Without it, the plain\nshuffled order of all samples, each once",
     AT(sc.partition), SEEN(partitioned), .call = set_partition,
     .err = "is not interleaved, contiguous or chunked"},
    {"chunk-size", SL_CLI_U64, "C", "samples per chunk for --partition chunked", AT(sc.chunk_size),
     SEEN(have_chunk), .min = 1, .max = SL_SAMPLE_MAX_CHUNK},
    {"drop-last", SL_CLI_FLAG, NULL,
     "drop what the sampler drops instead of padding (implies\n--partition interleaved unless "
     "one is given)",
     AT(sc.drop_last), SEEN(partitioned)},
    SL_CLI_LINE(""),
    SL_CLI_LINE("Classes (as in `sluice sample`; the plan's order is the epoch's class layout):"),
    {"labels-file", SL_CLI_STR, "F", "class id of every sample, one decimal per line",
     AT(cls.labels_file)},
    {"stratify", SL_CLI_FLAG, NULL,
     "stratified order: every stretch of the epoch holds each class\nin proportion",
     AT(cls.stratify)},
    {"balance-classes", SL_CLI_FLAG, NULL,
     "class-balanced epochs: draw classes uniformly (or by\n--class-weights)", AT(cls.balance)},
    {"class-weights", SL_CLI_CALL, "W0,W1,...",
     "target class proportions of balanced epochs (implies\n--balance-classes)", AT(cls),
     .call = set_class_weights},
    {"epoch-length", SL_CLI_U64, "L", "draws per balanced epoch (default N)", AT(cls.epoch_length),
     .min = 1, .max = SL_BATCH_MAX_SEQUENCES},
    SL_CLI_LINE(""),
    SL_CLI_LINE("Mid-epoch resizes (as a daemon's batch job does them):"),
    {"consumed", SL_CLI_CALL, "C0,C1,...",
     "how many batches each rank of the epoch's D ranks has read;\nprints the rest of the "
     "epoch's batches dealt over --new-replicas\nranks, the same number each",
     AT(first), .call = set_consumed},
    {"new-replicas", SL_CLI_U64, "R2", "the world after the resize (with --consumed)",
     AT(new_replicas), .min = 1, .max = SL_BATCH_MAX_REPLICAS, SEEN(have_new)},
    {"resize", SL_CLI_CALL, "C0,..:R2",
     "a further resize in the same epoch (repeatable, after\n--consumed): what each rank of the "
     "previous world read, and\nthe next world size",
     AT(n_more), .call = set_resize},
    SL_CLI_LINE(""),
    SL_CLI_LINE("Output:"),
    {"stats", SL_CLI_FLAG, NULL, "print only the summary line", AT(stats_only)},
    SL_CLI_ROW(
        "--json",
        "accepted for symmetry with other commands; the output is\nJSON lines with or without it"),
    SL_CLI_ROW("-h, --help", "show this help"),
    SL_CLI_OPTS_END,
};

static void batch_init(void *opts)
{
    batch_opts *o = opts;

    sl_batch_config_init(&o->cfg);
    sl_sample_config_init(&o->sc);
    o->shuffle = SL_SAMPLE_SHUFFLE_FEISTEL;
    o->form = SL_LENGTHS_TEXT;
    o->rank = UINT64_MAX;
}

static void batch_fini(void *opts)
{
    batch_opts *o = opts;

    free(o->rank_w);
    free(o->cls.class_w);
    free(o->first.consumed);
    for (size_t k = 0; k < o->n_more; k++)
        free(o->more[k].consumed);
}

/* ---- lengths ---- */

/* The lengths of the epoch's samples, from a file or stdin ('-'). */
typedef struct lengths {
    uint32_t *v;
    size_t n;
} lengths;

static int read_lengths(lengths *l, const char *path, sl_lengths_form form)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    char msg[512];
    int err;

    if (!f)
        return sl_cli_fail("batch", "cannot open '%s': %s", path, strerror(errno));
    err = sl_lengths_parse(&l->v, &l->n, f, form, SL_BATCH_MAX_SEQUENCES, path, msg, sizeof(msg));
    if (f != stdin)
        fclose(f);
    if (err)
        return sl_cli_fail("batch", "%s", msg);
    if (l->n == 0)
        return sl_cli_fail("batch", "%s: no lengths (the file is empty)", path);
    return 0;
}

/* ---- the order ---- */

/* The sampler's epoch order for a partition over sc->replicas ranks (sc has no mesh): the
 * sequence whose round-robin deal (interleaved: by position; chunked: by chunk) or whose blocks
 * (contiguous) give every rank its `sluice sample` share. Stores a new array (caller frees) of
 * *n entries. */
static int partition_order(uint64_t **out, size_t *n, sl_sample_config *sc)
{
    const uint32_t R = sc->replicas;
    uint64_t N = sc->samples, total = 0, cnt, *v = NULL, *share = NULL, maxc = 0;
    sl_sample *s = NULL;
    char msg[256] = "";
    int err = 0;

    for (uint32_t r = 0; r < R; r++) {
        sc->rank = r;
        if ((err = sl_sample_share_count(&cnt, sc, msg, sizeof(msg))) != 0)
            goto out;
        total += cnt;
        maxc = cnt > maxc ? cnt : maxc;
    }
    if (total > SL_BATCH_MAX_SEQUENCES) {
        err = SL_ELIMIT;
        snprintf(msg, sizeof(msg), "the partitioned order holds %" PRIu64 " samples, over %" PRIu32,
                 total, SL_BATCH_MAX_SEQUENCES);
        goto out;
    }
    if (!(v = malloc((total ? total : 1) * sizeof(uint64_t)))) {
        err = -ENOMEM;
        goto out;
    }
    if (sc->partition == SL_SAMPLE_INTERLEAVED) {
        /* Position p of the padded (or cut) order is the epoch order's p mod N. */
        uint64_t *perm = malloc(N * sizeof(uint64_t));

        if (!perm) {
            err = -ENOMEM;
            goto out;
        }
        err = sl_sample_epoch_order(perm, N, (int)sc->shuffle, sc->seed, sc->epoch);
        for (uint64_t p = 0; !err && p < total; p++)
            v[p] = perm[p % N];
        free(perm);
        goto out;
    }
    if (!(share = malloc((maxc ? maxc : 1) * sizeof(uint64_t)))) {
        err = -ENOMEM;
        goto out;
    }
    for (uint32_t r = 0; r < R; r++) {
        sc->rank = r;
        if ((err = sl_sample_new(&s, sc, msg, sizeof(msg))) != 0)
            goto out;
        cnt = sl_sample_count(s);
        if ((err = sl_sample_fill(share, s, 0, (size_t)cnt)) != 0)
            goto out;
        sl_sample_free(s);
        s = NULL;
        if (sc->partition == SL_SAMPLE_CONTIGUOUS) {
            /* Rank r's block starts at r * floor(N / R); the last one may be longer. */
            memcpy(v + (uint64_t)r * (N / R), share, cnt * sizeof(uint64_t));
            continue;
        }
        /* Chunked: rank r's jj-th chunk sits at chunk-order position jj * R + r; every chunk
         * before it is whole (the partial chunk comes last), so it starts at that times C. */
        for (uint64_t jj = 0, pos = 0; pos < cnt; jj++) {
            uint64_t len = cnt - pos < sc->chunk_size ? cnt - pos : sc->chunk_size;

            memcpy(v + (jj * R + r) * sc->chunk_size, share + pos, len * sizeof(uint64_t));
            pos += len;
        }
    }
out:
    sl_sample_free(s);
    free(share);
    if (err) {
        free(v);
        return sl_cli_fail("batch", "cannot build the %s order: %s",
                           sl_sample_partition_name(sc->partition),
                           msg[0] ? msg : sl_strerror(err));
    }
    *out = v;
    *n = (size_t)total;
    return 0;
}

/* Fast unsigned decimal output: plans can hold tens of millions of indices. */
static void put_u64(FILE *f, uint64_t v)
{
    char b[24];
    int i = sizeof(b);

    do {
        b[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    fwrite(b + i, 1, sizeof(b) - (size_t)i, f);
}

static void print_batch(FILE *f, uint32_t rank, uint64_t step, const sl_batch *b)
{
    fputs("{\"rank\":", f);
    put_u64(f, rank);
    fputs(",\"step\":", f);
    put_u64(f, step);
    fputs(",\"indices\":[", f);
    for (uint32_t j = 0; j < b->count; j++) {
        if (j)
            fputc(',', f);
        put_u64(f, b->indices[j]);
    }
    fputs("],\"max_len\":", f);
    put_u64(f, b->max_len);
    fputs(",\"tokens\":", f);
    put_u64(f, b->tokens);
    fputs(",\"padded_tokens\":", f);
    put_u64(f, b->padded_tokens);
    fputs("}\n", f);
}

/* What the summary line describes besides the plan's config: the order, and the world whose
 * batches were printed (after resizes, if any). */
typedef struct summary_ctx {
    size_t n_lengths, n_order;
    sl_sample_shuffle shuffle;
    const char *partition, *classes;
    size_t resizes;
    uint32_t world;
    uint64_t per_rank;
} summary_ctx;

static void print_summary(FILE *f, const sl_batch_plan *p, const sl_batch_stats *s, int64_t rank,
                          const summary_ctx *x)
{
    const sl_batch_config *c = sl_batch_plan_config(p);

    fprintf(f,
            "{\"summary\":{\"strategy\":\"%s\",\"cost\":\"%s\",\"max_batch_size\":%" PRIu32
            ",\"max_seq_len\":%" PRIu32 ",\"max_tokens\":%" PRIu64 ",\"window\":%" PRIu64
            ",\"replicas\":%" PRIu32 ",",
            sl_batch_strategy_name(c->strategy), sl_batch_cost_name(c->cost), c->max_batch_size,
            c->max_seq_len, c->max_tokens, c->window, x->world);
    if (c->n_rank_weights) {
        fputs("\"rank_weights\":[", f);
        for (uint32_t r = 0; r < c->replicas; r++)
            fprintf(f, "%s%.17g", r ? "," : "", c->rank_weights[r]);
        fputs("],\"rank_max_tokens\":[", f);
        for (uint32_t r = 0; r < c->replicas; r++) {
            uint64_t t;
            sl_batch_plan_rank_budget(p, r, &t, NULL);
            fprintf(f, "%s%" PRIu64, r ? "," : "", t);
        }
        fputs("],\"rank_max_batch_size\":[", f);
        for (uint32_t r = 0; r < c->replicas; r++) {
            uint32_t b;
            sl_batch_plan_rank_budget(p, r, NULL, &b);
            fprintf(f, "%s%" PRIu32, r ? "," : "", b);
        }
        fputs("],", f);
    }
    if (rank >= 0)
        fprintf(f, "\"rank\":%" PRId64 ",", rank);
    else
        fputs("\"rank\":null,", f);
    fprintf(f,
            "\"shuffle\":\"%s\",\"partition\":\"%s\",\"classes\":\"%s\",\"resizes\":%zu,"
            "\"seed\":%" PRIu64 ",\"epoch\":%" PRIu64 ",\"samples\":%zu,\"order\":%zu,"
            "\"batches\":%" PRIu64 ",\"batches_per_rank\":%" PRIu64 ",\"sequences\":%" PRIu64
            ",\"tokens\":%" PRIu64 ",\"padded_tokens\":%" PRIu64
            ",\"padding_fraction\":%.6f,\"fill\":%.6f,\"truncated\":%" PRIu64
            ",\"skipped\":%" PRIu64 ",\"dropped\":%" PRIu64 ",\"repeated\":%" PRIu64 "}}\n",
            sl_sample_shuffle_name(x->shuffle), x->partition, x->classes, x->resizes, c->seed,
            c->epoch, x->n_lengths, x->n_order, s->batches, x->per_rank, s->sequences, s->tokens,
            s->padded_tokens, s->padding_fraction, s->fill, s->truncated, s->skipped, s->dropped,
            s->repeated);
}

/* The dp world whose batches are printed: the last resize's, else --replicas. */
static uint64_t last_world(const batch_opts *o)
{
    if (o->n_more)
        return o->more[o->n_more - 1].new_replicas;
    return o->first.consumed ? o->new_replicas : o->cfg.replicas;
}

/* Checks that need several options, before any work. Returns 0 or SL_CLI_USAGE. */
static int check_opts(const batch_opts *o)
{
    const char *why = NULL;

    if (!o->path || !o->cfg.max_batch_size || !o->cfg.max_seq_len) {
        fprintf(stderr, "sluice batch: --lengths, --max-batch-size and --max-seq-len are "
                        "required\nTry 'sluice batch --help'.\n");
        return SL_CLI_USAGE;
    }
    if (o->rank != UINT64_MAX && o->rank >= last_world(o)) {
        fprintf(stderr, "sluice batch: --rank %" PRIu64 " out of range [0, %" PRIu64 ")%s\n",
                o->rank, last_world(o), o->first.consumed ? " of the world after the resizes" : "");
        return SL_CLI_USAGE;
    }
    if (o->have_chunk && o->sc.partition != SL_SAMPLE_CHUNKED)
        why = "--chunk-size applies to --partition chunked only";
    else if (o->sc.partition == SL_SAMPLE_CHUNKED && !o->have_chunk)
        why = "--partition chunked needs --chunk-size";
    else if (o->sc.mesh.order[0] && !o->sc.mesh.dp)
        why = "--mesh-order needs --mesh";
    else if (!!o->first.consumed != o->have_new)
        why = "--consumed and --new-replicas go together";
    else if (o->n_more && !o->first.consumed)
        why = "--resize follows --consumed and --new-replicas";
    else if (o->first.consumed && o->sc.mesh.dp)
        why = "--consumed does not take --mesh: give --replicas as the epoch's dp world";
    else if (batch_classes_set(&o->cls) && o->partitioned)
        why = "--partition and --drop-last do not apply with class options: the plan's order is "
              "the whole epoch's class layout";
    else if (o->cls.labels_file && strcmp(o->cls.labels_file, "-") == 0 &&
             strcmp(o->path, "-") == 0)
        why = "--lengths and --labels-file cannot both read stdin";
    else if (o->cls.stratify && (o->cls.balance || o->cls.class_w))
        why = "--stratify and --balance-classes exclude each other";
    if (why) {
        fprintf(stderr, "sluice batch: %s\n", why);
        return SL_CLI_USAGE;
    }
    return 0;
}

/* A mesh: --replicas is the world; the plan is for its dp ranks and --rank (global) reads its dp
 * rank's batches, as `sluice sample` partitions only along dp. */
static int apply_mesh(batch_opts *o)
{
    uint32_t dp_rank, dp_size;
    char msg[256];

    if (!o->sc.mesh.dp)
        return 0;
    o->sc.samples = 1;
    o->sc.replicas = o->cfg.replicas;
    o->sc.rank = o->rank == UINT64_MAX ? 0 : (uint32_t)o->rank;
    if (sl_sample_dp_rank(&dp_rank, &dp_size, &o->sc, msg, sizeof(msg)) != 0)
        return sl_cli_fail("batch", "%s", msg);
    o->cfg.replicas = dp_size;
    if (o->rank != UINT64_MAX)
        o->rank = dp_rank;
    memset(&o->sc.mesh, 0, sizeof(o->sc.mesh));
    return 0;
}

/* The order of samples to plan: the partitioned one, the shuffled one, or (*order NULL) the
 * identity. */
static int epoch_order(uint64_t **order, size_t *n_order, batch_opts *o, size_t n)
{
    int err;

    *order = NULL;
    *n_order = n;
    if (batch_classes_set(&o->cls))
        return batch_class_order(order, n_order, &o->cls, n, o->shuffle, o->cfg.seed, o->cfg.epoch);
    if (o->partitioned) {
        o->sc.samples = n;
        o->sc.replicas = o->cfg.replicas;
        o->sc.rank = 0;
        o->sc.shuffle = o->shuffle;
        o->sc.seed = o->cfg.seed;
        o->sc.epoch = o->cfg.epoch;
        return partition_order(order, n_order, &o->sc);
    }
    if (o->shuffle == SL_SAMPLE_SHUFFLE_NONE)
        return 0;
    if (!(*order = malloc(n * sizeof(uint64_t))))
        return sl_cli_fail("batch", "out of memory for the order of %zu samples", n);
    if ((err = sl_sample_epoch_order(*order, n, (int)o->shuffle, o->cfg.seed, o->cfg.epoch)))
        return sl_cli_fail(
            "batch", "cannot shuffle %zu samples (%s, seed %" PRIu64 ", epoch %" PRIu64 "): %s", n,
            sl_sample_shuffle_name(o->shuffle), o->cfg.seed, o->cfg.epoch, sl_strerror(err));
    return 0;
}

/* Statistics of what a resized view serves (all ranks, or one): its batches as printed; the
 * epoch-wide counts (skipped, dropped, repeated) are the epoch plan's. */
static void view_stats(sl_batch_stats *st, const batch_view *v, int64_t rank)
{
    const sl_batch_plan *bp = v->replan ? v->replan : v->plan;
    uint64_t budget = 0;
    sl_batch_stats ep;

    sl_batch_plan_stats(v->plan, -1, &ep);
    memset(st, 0, sizeof(*st));
    st->skipped = ep.skipped;
    st->dropped = ep.dropped;
    st->repeated = ep.repeated;
    for (uint32_t k = 0; k < v->world; k++) {
        uint64_t t = sl_batch_plan_config(bp)->max_tokens;
        if (rank >= 0 && k != rank)
            continue;
        if (v->replan)
            sl_batch_plan_rank_budget(v->replan, k, &t, NULL);
        for (uint64_t i = 0; i < v->per_rank; i++) {
            sl_batch b;
            if (batch_view_get(v, k, i, &b) != 0)
                continue;
            st->batches++;
            st->sequences += b.count;
            st->tokens += b.tokens;
            st->padded_tokens += b.padded_tokens;
            budget += t;
        }
    }
    if (st->padded_tokens)
        st->padding_fraction = (double)(st->padded_tokens - st->tokens) / (double)st->padded_tokens;
    if (budget)
        st->fill = (double)st->tokens / (double)budget;
}

/* Print every batch of the plan, or of its view after resizes (v not NULL), then the summary. */
static int print_plan(const sl_batch_plan *plan, const batch_view *v, const batch_opts *o,
                      summary_ctx *x)
{
    static char outbuf[1 << 20];
    int64_t rank = o->rank == UINT64_MAX ? -1 : (int64_t)o->rank;
    sl_batch_stats st;

    x->world = v ? v->world : sl_batch_plan_replicas(plan);
    x->per_rank = v ? v->per_rank : sl_batch_plan_batches_per_rank(plan);
    setvbuf(stdout, outbuf, _IOFBF, sizeof(outbuf));
    for (uint64_t i = 0; !o->stats_only && i < x->per_rank; i++) {
        for (uint32_t k = 0; k < x->world; k++) {
            sl_batch b;

            if (rank >= 0 && k != rank)
                continue;
            if (v)
                batch_view_get(v, k, i, &b);
            else
                sl_batch_plan_get(plan, k, i, &b);
            print_batch(stdout, k, i, &b);
        }
    }
    if (v)
        view_stats(&st, v, rank);
    else
        sl_batch_plan_stats(plan, rank, &st);
    print_summary(stdout, v && v->replan ? v->replan : plan, &st, rank, x);
    if (fflush(stdout) != 0 || ferror(stdout))
        return sl_cli_fail("batch", "cannot write the plan: %s", strerror(errno));
    return SL_CLI_OK;
}

/* Plan the epoch and print it, after the resizes if any. */
static int plan_and_print(const batch_opts *o, const uint32_t *lens, size_t n,
                          const uint64_t *order, size_t n_order)
{
    batch_step steps[1 + MAX_RESIZES];
    sl_batch_plan *plan = NULL;
    batch_view v, *vp = NULL;
    summary_ctx x = {n, n_order, o->shuffle, "none", "none", 0, 0, 0};
    char msg[256] = "";
    int r, err;

    if (o->partitioned)
        x.partition = sl_sample_partition_name(o->sc.partition);
    if (batch_classes_set(&o->cls))
        x.classes = o->cls.stratify ? "stratify" : "balance";
    memset(&v, 0, sizeof(v));
    err = sl_batch_plan_new(&plan, &o->cfg, lens, n, order, n_order, msg, sizeof(msg));
    if (err)
        return sl_cli_fail("batch", "%s", msg[0] ? msg : sl_strerror(err));
    if (o->first.consumed) {
        steps[0] = o->first;
        steps[0].new_replicas = (uint32_t)o->new_replicas;
        for (size_t k = 0; k < o->n_more; k++)
            steps[k + 1] = o->more[k];
        x.resizes = 1 + o->n_more;
        r = batch_view_open(&v, plan, &o->cfg, lens, n, steps, 1 + o->n_more);
        vp = &v;
    } else {
        r = 0;
    }
    if (r == 0)
        r = print_plan(plan, vp, o, &x);
    batch_view_close(&v);
    sl_batch_plan_free(plan);
    return r;
}

static int batch_run(sl_cli *cli, struct sl_client *c, void *opts, int argc, char **argv)
{
    batch_opts *o = opts;
    lengths lens = {NULL, 0};
    uint64_t *order = NULL;
    size_t n_order = 0;
    char msg[256];
    int r;

    if ((r = check_opts(o)) != 0 || (r = apply_mesh(o)) != 0)
        goto out;
    o->cfg.rank_weights = o->rank_w;
    o->cfg.n_rank_weights = (uint32_t)o->n_rank_w;
    /* Check the plan before reading a possibly large file. */
    if (sl_batch_config_check(&o->cfg, msg, sizeof(msg)) != 0) {
        r = sl_cli_fail("batch", "%s", msg);
        goto out;
    }
    if ((r = read_lengths(&lens, o->path, o->form)) != 0 ||
        (r = epoch_order(&order, &n_order, o, lens.n)) != 0)
        goto out;
    r = plan_and_print(o, lens.v, lens.n, order, n_order);
out:
    free(order);
    free(lens.v);
    return r;
}

const sl_cli_cmd sl_cli_batch = {
    .name = "batch",
    .summary = "plan token-budget batches from sequence lengths (local, no daemon)",
    .max_args = 0,
    .opts = batch_table,
    .opts_size = sizeof(batch_opts),
    .init = batch_init,
    .fini = batch_fini,
    .run = batch_run,
    .width = 26,
    .flags = SL_CLI_NO_COMMON_HELP,
    .head =
        "Usage: sluice batch --lengths FILE --max-batch-size B --max-seq-len L [options]\n"
        "\n"
        "Plan one epoch's batches of variable-length sequences under a token budget, for all\n"
        "data-parallel ranks, and print one JSON object per batch (JSON lines, always):\n"
        "  "
        "{\"rank\":R,\"step\":S,\"indices\":[...],\"max_len\":M,\"tokens\":T,\"padded_tokens\":P}\n"
        "then a last line {\"summary\":{...}} (batches, padding_fraction, fill, ...). Rank r gets\n"
        "batches r, r+D, r+2D, ... of the shuffled plan; every rank gets the same number.\n"
        "\n",
    .tail = "\nExit codes: 0 ok, 1 error (unreadable or invalid lengths, invalid plan), 2 usage.\n",
};
