/* sluice batch: plan an epoch's token-budget batches from a file of sequence lengths (local, no
 * daemon). The epoch order comes from the sampling engine, the plan from common/batch/. */
#include "cli.h"

#include "batch/batch.h"
#include "err.h"
#include "sample/sample.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const char usage_text[] =
    "Usage: sluice batch --lengths FILE --max-batch-size B --max-seq-len L [options]\n"
    "\n"
    "Plan one epoch's batches of variable-length sequences under a token budget, for all\n"
    "data-parallel ranks, and print one JSON object per batch (JSON lines, always):\n"
    "  {\"rank\":R,\"step\":S,\"indices\":[...],\"max_len\":M,\"tokens\":T,\"padded_tokens\":P}\n"
    "then a last line {\"summary\":{...}} (batches, padding_fraction, fill, ...). Rank r gets\n"
    "batches r, r+D, r+2D, ... of the shuffled plan; every rank gets the same number.\n"
    "\n"
    "Input:\n"
    "  --lengths FILE            sequence lengths, sample i on line/record i ('-' = stdin)\n"
    "  --lengths-format FMT      text (one integer >= 1 per line, default) or u32 (raw\n"
    "                            little-endian uint32)\n"
    "\n"
    "Plan:\n"
    "  --strategy S              pad | bucket | dynamic (default) | packed\n"
    "  --max-batch-size B        sequences per batch (required)\n"
    "  --max-seq-len L           longer sequences are truncated to L (required)\n"
    "  --max-tokens T            token budget per batch (default B x L)\n"
    "  --cost C                  padded (batch size x longest; default) or sum (sum of lengths;\n"
    "                            the default and only choice for packed)\n"
    "  --skip-long               leave sequences longer than L out instead of truncating them\n"
    "  --bucket-width W          bucket strategy: lengths per bucket (default 64)\n"
    "  --window W                sort by length within windows of W samples of the shuffled\n"
    "                            order (default 0 = the whole epoch)\n"
    "  --batch-size-multiple M   make batch sizes multiples of M where possible\n"
    "  --keep-order              do not shuffle the batches (for inspection)\n"
    "\n"
    "Ranks:\n"
    "  --replicas D              data-parallel ranks (default 1); with --mesh, the world size\n"
    "  --rank R                  print only rank R's batches and stats (default: all ranks);\n"
    "                            with --mesh a global rank, printing its dp rank's batches\n"
    "  --mesh DP,TP,CP,PP        device mesh (product = --replicas): plan for the DP\n"
    "                            data-parallel ranks; tp/cp/pp ranks share their dp rank's\n"
    "  --mesh-order AXES         mesh axes outermost first (default pp,dp,cp,tp)\n"
    "  --remainder P             drop (default) or pad (repeat batches from the start) so every\n"
    "                            rank gets the same number of batches\n"
    "  --balance                 give the D batches of each step about the same cost\n"
    "\n"
    "Order (as in `sluice sample`; see docs/batching.md):\n"
    "  --shuffle MODE            none | torch | feistel (default): the epoch order of samples\n"
    "  --seed S                  shuffle seed for the order and the batches (default 0)\n"
    "  --epoch E                 epoch (default 0)\n"
    "  --partition MODE          plan the sampler's epoch order for this partition over the\n"
    "                            D data-parallel ranks: interleaved (torch's layout: the order\n"
    "                            padded by wrap-around, or cut with --drop-last, to a multiple\n"
    "                            of D), contiguous (rank 0's block, then rank 1's, ...) or\n"
    "                            chunked (the chunks in chunk order). Without it, the plain\n"
    "                            shuffled order of all samples, each once\n"
    "  --chunk-size C            samples per chunk for --partition chunked\n"
    "  --drop-last               drop what the sampler drops instead of padding (implies\n"
    "                            --partition interleaved unless one is given)\n"
    "\n"
    "Output:\n"
    "  --stats                   print only the summary line\n"
    "  --json                    accepted for symmetry with other commands; the output is\n"
    "                            JSON lines with or without it\n"
    "  -h, --help                show this help\n"
    "\n"
    "Exit codes: 0 ok, 1 error (unreadable or invalid lengths, invalid plan), 2 usage.\n";

enum {
    OPT_LENGTHS = 1,
    OPT_FORMAT,
    OPT_STRATEGY,
    OPT_MAX_TOKENS,
    OPT_MAX_BATCH,
    OPT_MAX_SEQ,
    OPT_COST,
    OPT_SKIP_LONG,
    OPT_BUCKET,
    OPT_WINDOW,
    OPT_MULTIPLE,
    OPT_KEEP_ORDER,
    OPT_REPLICAS,
    OPT_RANK,
    OPT_REMAINDER,
    OPT_BALANCE,
    OPT_SHUFFLE,
    OPT_SEED,
    OPT_EPOCH,
    OPT_STATS,
    OPT_PARTITION,
    OPT_CHUNK,
    OPT_DROP,
    OPT_MESH,
    OPT_MESH_ORDER,
};

/* Strict unsigned decimal in [min, max]: no sign, no spaces, no trailing characters. */
static int parse_u64(uint64_t *out, const char *opt, const char *arg, uint64_t min, uint64_t max)
{
    char *end;
    unsigned long long v;

    errno = 0;
    if (!arg || arg[0] < '0' || arg[0] > '9')
        goto bad;
    v = strtoull(arg, &end, 10);
    if (errno || *end || v < min || v > max)
        goto bad;
    *out = v;
    return 0;
bad:
    fprintf(stderr, "sluice batch: --%s '%s' is not an integer in [%" PRIu64 ", %" PRIu64 "]\n",
            opt, arg ? arg : "", min, max);
    return SL_CLI_USAGE;
}

/* A growing array of lengths. */
typedef struct lengths {
    uint32_t *v;
    size_t n, cap;
} lengths;

static int lengths_push(lengths *l, uint32_t x)
{
    if (l->n == l->cap) {
        size_t ncap = l->cap ? l->cap * 2 : 1 << 16;
        uint32_t *nv;

        if (ncap > SL_BATCH_MAX_SEQUENCES)
            ncap = SL_BATCH_MAX_SEQUENCES;
        if (l->n == ncap)
            return SL_ELIMIT;
        if (!(nv = realloc(l->v, ncap * sizeof(uint32_t))))
            return -ENOMEM;
        l->v = nv;
        l->cap = ncap;
    }
    l->v[l->n++] = x;
    return 0;
}

/* Text: one integer >= 1 per line; a final line without a newline is fine, CRLF is fine. */
static int read_text(lengths *l, FILE *f, const char *path)
{
    static char buf[1 << 16];
    uint64_t line = 1, v = 0;
    int digits = 0, bad = 0, err;
    size_t got;

    while ((got = fread(buf, 1, sizeof(buf), f)) > 0) {
        for (size_t i = 0; i < got; i++) {
            unsigned char c = (unsigned char)buf[i];

            if (c >= '0' && c <= '9' && !bad) {
                v = v * 10 + (c - '0');
                digits++;
                if (v > UINT32_MAX)
                    return sl_cli_fail("batch", "%s:%" PRIu64 ": length is over %" PRIu32, path,
                                       line, UINT32_MAX);
            } else if (c == '\n') {
                if (bad || digits == 0)
                    return sl_cli_fail("batch",
                                       "%s:%" PRIu64 ": not a non-negative integer (one length "
                                       "per line)",
                                       path, line);
                if (v == 0)
                    return sl_cli_fail("batch",
                                       "%s:%" PRIu64 ": length 0 (every length must be at "
                                       "least 1)",
                                       path, line);
                if ((err = lengths_push(l, (uint32_t)v)) != 0)
                    return sl_cli_fail("batch", "%s: more than %" PRIu32 " lengths (%s)", path,
                                       SL_BATCH_MAX_SEQUENCES, sl_strerror(err));
                line++;
                v = 0;
                digits = 0;
            } else if (c == '\r' && digits > 0) {
                continue;
            } else {
                bad = 1;
            }
        }
    }
    if (ferror(f))
        return sl_cli_fail("batch", "%s: read error: %s", path, strerror(errno));
    if (bad || digits) {
        if (bad)
            return sl_cli_fail("batch", "%s:%" PRIu64 ": not a non-negative integer", path, line);
        if (v == 0)
            return sl_cli_fail(
                "batch", "%s:%" PRIu64 ": length 0 (every length must be at least 1)", path, line);
        if ((err = lengths_push(l, (uint32_t)v)) != 0)
            return sl_cli_fail("batch", "%s: more than %" PRIu32 " lengths", path,
                               SL_BATCH_MAX_SEQUENCES);
    }
    return 0;
}

/* u32: raw little-endian uint32 records. */
static int read_u32(lengths *l, FILE *f, const char *path)
{
    static unsigned char buf[1 << 16];
    size_t got, carry = 0;
    int err;

    while ((got = fread(buf + carry, 1, sizeof(buf) - carry, f)) > 0) {
        size_t have = carry + got, k;

        for (k = 0; k + 4 <= have; k += 4) {
            uint32_t v = (uint32_t)buf[k] | (uint32_t)buf[k + 1] << 8 | (uint32_t)buf[k + 2] << 16 |
                         (uint32_t)buf[k + 3] << 24;

            if (v == 0)
                return sl_cli_fail("batch",
                                   "%s: record %zu (byte offset %zu) has length 0 (every length "
                                   "must be at least 1)",
                                   path, l->n, l->n * 4);
            if ((err = lengths_push(l, v)) != 0)
                return sl_cli_fail("batch", "%s: more than %" PRIu32 " lengths", path,
                                   SL_BATCH_MAX_SEQUENCES);
        }
        carry = have - k;
        memmove(buf, buf + k, carry);
    }
    if (ferror(f))
        return sl_cli_fail("batch", "%s: read error: %s", path, strerror(errno));
    if (carry)
        return sl_cli_fail("batch", "%s: size is not a multiple of 4 bytes (%zu trailing)", path,
                           carry);
    return 0;
}

static int read_lengths(lengths *l, const char *path, int u32)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, u32 ? "rb" : "r");
    int r;

    if (!f)
        return sl_cli_fail("batch", "cannot open '%s': %s", path, strerror(errno));
    r = u32 ? read_u32(l, f, path) : read_text(l, f, path);
    if (f != stdin)
        fclose(f);
    if (r == 0 && l->n == 0)
        r = sl_cli_fail("batch", "%s: no lengths (the file is empty)", path);
    return r;
}

/* "DP,TP,CP,PP": four sizes >= 1. */
static int parse_mesh(sl_sample_mesh *m, const char *arg)
{
    uint64_t v[4];
    const char *p = arg;

    for (int i = 0; i < 4; i++) {
        char *end;

        errno = 0;
        if (*p < '0' || *p > '9')
            goto bad;
        v[i] = strtoull(p, &end, 10);
        if (errno || v[i] < 1 || v[i] > UINT32_MAX || *end != (i < 3 ? ',' : '\0'))
            goto bad;
        p = end + 1;
    }
    m->dp = (uint32_t)v[0];
    m->tp = (uint32_t)v[1];
    m->cp = (uint32_t)v[2];
    m->pp = (uint32_t)v[3];
    return 0;
bad:
    fprintf(stderr, "sluice batch: --mesh '%s' is not four sizes DP,TP,CP,PP (each >= 1)\n", arg);
    return SL_CLI_USAGE;
}

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

static void print_summary(FILE *f, const sl_batch_plan *p, const sl_batch_stats *s, int64_t rank,
                          size_t n_lengths, size_t n_order, sl_sample_shuffle shuffle,
                          const char *partition)
{
    const sl_batch_config *c = sl_batch_plan_config(p);

    fprintf(f,
            "{\"summary\":{\"strategy\":\"%s\",\"cost\":\"%s\",\"max_batch_size\":%" PRIu32
            ",\"max_seq_len\":%" PRIu32 ",\"max_tokens\":%" PRIu64 ",\"window\":%" PRIu64
            ",\"replicas\":%" PRIu32 ",",
            sl_batch_strategy_name(c->strategy), sl_batch_cost_name(c->cost), c->max_batch_size,
            c->max_seq_len, c->max_tokens, c->window, c->replicas);
    if (rank >= 0)
        fprintf(f, "\"rank\":%" PRId64 ",", rank);
    else
        fputs("\"rank\":null,", f);
    fprintf(f,
            "\"shuffle\":\"%s\",\"partition\":\"%s\",\"seed\":%" PRIu64 ",\"epoch\":%" PRIu64
            ",\"samples\":%zu,\"order\":%zu,"
            "\"batches\":%" PRIu64 ",\"batches_per_rank\":%" PRIu64 ",\"sequences\":%" PRIu64
            ",\"tokens\":%" PRIu64 ",\"padded_tokens\":%" PRIu64
            ",\"padding_fraction\":%.6f,\"fill\":%.6f,\"truncated\":%" PRIu64
            ",\"skipped\":%" PRIu64 ",\"dropped\":%" PRIu64 ",\"repeated\":%" PRIu64 "}}\n",
            sl_sample_shuffle_name(shuffle), partition, c->seed, c->epoch, n_lengths, n_order,
            s->batches, sl_batch_plan_batches_per_rank(p), s->sequences, s->tokens,
            s->padded_tokens, s->padding_fraction, s->fill, s->truncated, s->skipped, s->dropped,
            s->repeated);
}

int cmd_batch(sl_cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        SL_CLI_COMMON_OPTS,
        {"lengths", required_argument, NULL, OPT_LENGTHS},
        {"lengths-format", required_argument, NULL, OPT_FORMAT},
        {"strategy", required_argument, NULL, OPT_STRATEGY},
        {"max-tokens", required_argument, NULL, OPT_MAX_TOKENS},
        {"max-batch-size", required_argument, NULL, OPT_MAX_BATCH},
        {"max-seq-len", required_argument, NULL, OPT_MAX_SEQ},
        {"cost", required_argument, NULL, OPT_COST},
        {"skip-long", no_argument, NULL, OPT_SKIP_LONG},
        {"bucket-width", required_argument, NULL, OPT_BUCKET},
        {"window", required_argument, NULL, OPT_WINDOW},
        {"batch-size-multiple", required_argument, NULL, OPT_MULTIPLE},
        {"keep-order", no_argument, NULL, OPT_KEEP_ORDER},
        {"replicas", required_argument, NULL, OPT_REPLICAS},
        {"rank", required_argument, NULL, OPT_RANK},
        {"remainder", required_argument, NULL, OPT_REMAINDER},
        {"balance", no_argument, NULL, OPT_BALANCE},
        {"shuffle", required_argument, NULL, OPT_SHUFFLE},
        {"seed", required_argument, NULL, OPT_SEED},
        {"epoch", required_argument, NULL, OPT_EPOCH},
        {"stats", no_argument, NULL, OPT_STATS},
        {"partition", required_argument, NULL, OPT_PARTITION},
        {"chunk-size", required_argument, NULL, OPT_CHUNK},
        {"drop-last", no_argument, NULL, OPT_DROP},
        {"mesh", required_argument, NULL, OPT_MESH},
        {"mesh-order", required_argument, NULL, OPT_MESH_ORDER},
        {NULL, 0, NULL, 0},
    };
    static char outbuf[1 << 20];
    sl_batch_config cfg;
    sl_sample_config sc; /* the order: partition, chunk size, drop_last, mesh */
    sl_sample_shuffle shuffle = SL_SAMPLE_SHUFFLE_FEISTEL;
    const char *path = NULL;
    lengths lens = {0};
    uint64_t *order = NULL, v, rank = UINT64_MAX;
    size_t n_order = 0;
    sl_batch_plan *plan = NULL;
    sl_batch_stats st;
    int u32 = 0, stats_only = 0, partitioned = 0, have_chunk = 0, ch, r = SL_CLI_USAGE, err;
    char msg[256];

    sl_batch_config_init(&cfg);
    sl_sample_config_init(&sc);
    opterr = 0;
    while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (ch) {
        case 'h':
            fputs(usage_text, stdout);
            r = SL_CLI_OK;
            goto out;
        case OPT_LENGTHS:
            path = optarg;
            break;
        case OPT_FORMAT:
            if (strcmp(optarg, "text") == 0) {
                u32 = 0;
            } else if (strcmp(optarg, "u32") == 0) {
                u32 = 1;
            } else {
                fprintf(stderr, "sluice batch: --lengths-format '%s' is not text or u32\n", optarg);
                goto out;
            }
            break;
        case OPT_STRATEGY:
            if (sl_batch_strategy_parse(optarg, &cfg.strategy)) {
                fprintf(stderr,
                        "sluice batch: --strategy '%s' is not pad, bucket, dynamic or packed\n",
                        optarg);
                goto out;
            }
            break;
        case OPT_MAX_TOKENS:
            if (parse_u64(&cfg.max_tokens, "max-tokens", optarg, 1, UINT64_MAX))
                goto out;
            break;
        case OPT_MAX_BATCH:
            if (parse_u64(&v, "max-batch-size", optarg, 1, UINT32_MAX))
                goto out;
            cfg.max_batch_size = (uint32_t)v;
            break;
        case OPT_MAX_SEQ:
            if (parse_u64(&v, "max-seq-len", optarg, 1, UINT32_MAX))
                goto out;
            cfg.max_seq_len = (uint32_t)v;
            break;
        case OPT_COST:
            if (sl_batch_cost_parse(optarg, &cfg.cost)) {
                fprintf(stderr, "sluice batch: --cost '%s' is not padded or sum\n", optarg);
                goto out;
            }
            break;
        case OPT_SKIP_LONG:
            cfg.overlong = SL_BATCH_SKIP;
            break;
        case OPT_BUCKET:
            if (parse_u64(&v, "bucket-width", optarg, 1, UINT32_MAX))
                goto out;
            cfg.bucket_width = (uint32_t)v;
            break;
        case OPT_WINDOW:
            if (parse_u64(&cfg.window, "window", optarg, 0, UINT64_MAX))
                goto out;
            break;
        case OPT_MULTIPLE:
            if (parse_u64(&v, "batch-size-multiple", optarg, 1, UINT32_MAX))
                goto out;
            cfg.batch_size_multiple = (uint32_t)v;
            break;
        case OPT_KEEP_ORDER:
            cfg.keep_order = 1;
            break;
        case OPT_REPLICAS:
            if (parse_u64(&v, "replicas", optarg, 1, SL_BATCH_MAX_REPLICAS))
                goto out;
            cfg.replicas = (uint32_t)v;
            break;
        case OPT_RANK:
            if (parse_u64(&rank, "rank", optarg, 0, SL_BATCH_MAX_REPLICAS - 1))
                goto out;
            break;
        case OPT_REMAINDER:
            if (strcmp(optarg, "drop") == 0) {
                cfg.remainder = SL_BATCH_DROP;
            } else if (strcmp(optarg, "pad") == 0) {
                cfg.remainder = SL_BATCH_REPEAT;
            } else {
                fprintf(stderr, "sluice batch: --remainder '%s' is not drop or pad\n", optarg);
                goto out;
            }
            break;
        case OPT_BALANCE:
            cfg.balance = 1;
            break;
        case OPT_SHUFFLE:
            if (sl_sample_shuffle_parse(&shuffle, optarg)) {
                fprintf(stderr, "sluice batch: --shuffle '%s' is not none, torch or feistel\n",
                        optarg);
                goto out;
            }
            break;
        case OPT_SEED:
            if (parse_u64(&cfg.seed, "seed", optarg, 0, UINT64_MAX))
                goto out;
            break;
        case OPT_EPOCH:
            if (parse_u64(&cfg.epoch, "epoch", optarg, 0, SL_SAMPLE_EPOCH_MAX))
                goto out;
            break;
        case OPT_STATS:
            stats_only = 1;
            break;
        case OPT_PARTITION:
            if (sl_sample_partition_parse(&sc.partition, optarg)) {
                fprintf(stderr,
                        "sluice batch: --partition '%s' is not interleaved, contiguous or "
                        "chunked\n",
                        optarg);
                goto out;
            }
            partitioned = 1;
            break;
        case OPT_CHUNK:
            if (parse_u64(&sc.chunk_size, "chunk-size", optarg, 1, SL_SAMPLE_MAX_CHUNK))
                goto out;
            have_chunk = 1;
            break;
        case OPT_DROP:
            sc.drop_last = true;
            partitioned = 1;
            break;
        case OPT_MESH:
            if (parse_mesh(&sc.mesh, optarg))
                goto out;
            break;
        case OPT_MESH_ORDER:
            if (sl_sample_mesh_order_parse(sc.mesh.order, optarg)) {
                fprintf(stderr,
                        "sluice batch: --mesh-order '%s' must list dp, tp, cp, pp once each, "
                        "comma-separated\n",
                        optarg);
                goto out;
            }
            break;
        case '?':
        case ':':
            r = sl_cli_bad_opt("batch", ch, argv);
            goto out;
        default:
            if (sl_cli_common_opt(cli, "batch", ch, optarg) != 0)
                goto out;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "sluice batch: unexpected argument '%s'\n", argv[optind]);
        goto out;
    }
    if (!path || !cfg.max_batch_size || !cfg.max_seq_len) {
        fprintf(stderr, "sluice batch: --lengths, --max-batch-size and --max-seq-len are "
                        "required\nTry 'sluice batch --help'.\n");
        goto out;
    }
    if (rank != UINT64_MAX && rank >= cfg.replicas) {
        fprintf(stderr, "sluice batch: --rank %" PRIu64 " out of range [0, %" PRIu32 ")\n", rank,
                cfg.replicas);
        goto out;
    }
    if (have_chunk && sc.partition != SL_SAMPLE_CHUNKED) {
        fprintf(stderr, "sluice batch: --chunk-size applies to --partition chunked only\n");
        goto out;
    }
    if (sc.partition == SL_SAMPLE_CHUNKED && !have_chunk) {
        fprintf(stderr, "sluice batch: --partition chunked needs --chunk-size\n");
        goto out;
    }
    if (sc.mesh.dp || sc.mesh.order[0]) {
        /* A mesh: --replicas is the world; the plan is for its dp ranks and --rank (global)
         * reads its dp rank's batches, as `sluice sample` partitions only along dp. */
        uint32_t dp_rank, dp_size;

        sc.samples = 1;
        sc.replicas = cfg.replicas;
        sc.rank = rank == UINT64_MAX ? 0 : (uint32_t)rank;
        if (!sc.mesh.dp) {
            fprintf(stderr, "sluice batch: --mesh-order needs --mesh\n");
            goto out;
        }
        if ((err = sl_sample_dp_rank(&dp_rank, &dp_size, &sc, msg, sizeof(msg))) != 0) {
            r = sl_cli_fail("batch", "%s", msg);
            goto out;
        }
        cfg.replicas = dp_size;
        if (rank != UINT64_MAX)
            rank = dp_rank;
        memset(&sc.mesh, 0, sizeof(sc.mesh));
    }
    /* Check the plan before reading a possibly large file. */
    if ((err = sl_batch_config_check(&cfg, msg, sizeof(msg))) != 0) {
        r = sl_cli_fail("batch", "%s", msg);
        goto out;
    }
    if ((r = read_lengths(&lens, path, u32)) != 0)
        goto out;
    r = SL_CLI_ERROR;
    n_order = lens.n;
    if (partitioned) {
        sc.samples = lens.n;
        sc.replicas = cfg.replicas;
        sc.rank = 0;
        sc.shuffle = shuffle;
        sc.seed = cfg.seed;
        sc.epoch = cfg.epoch;
        if ((r = partition_order(&order, &n_order, &sc)) != 0)
            goto out;
        r = SL_CLI_ERROR;
    } else if (shuffle != SL_SAMPLE_SHUFFLE_NONE) {
        if (!(order = malloc(lens.n * sizeof(uint64_t)))) {
            sl_cli_fail("batch", "out of memory for the order of %zu samples", lens.n);
            goto out;
        }
        if ((err = sl_sample_epoch_order(order, lens.n, (int)shuffle, cfg.seed, cfg.epoch)) != 0) {
            sl_cli_fail(
                "batch", "cannot shuffle %zu samples (%s, seed %" PRIu64 ", epoch %" PRIu64 "): %s",
                lens.n, sl_sample_shuffle_name(shuffle), cfg.seed, cfg.epoch, sl_strerror(err));
            goto out;
        }
    }
    err = sl_batch_plan_new(&plan, &cfg, lens.v, lens.n, order, n_order, msg, sizeof(msg));
    if (err) {
        sl_cli_fail("batch", "%s", msg[0] ? msg : sl_strerror(err));
        goto out;
    }
    free(order);
    order = NULL;

    setvbuf(stdout, outbuf, _IOFBF, sizeof(outbuf));
    if (!stats_only) {
        uint64_t per = sl_batch_plan_batches_per_rank(plan);
        uint32_t d = sl_batch_plan_replicas(plan);

        for (uint64_t i = 0; i < per; i++) {
            for (uint32_t k = 0; k < d; k++) {
                sl_batch b;

                if (rank != UINT64_MAX && k != rank)
                    continue;
                sl_batch_plan_get(plan, k, i, &b);
                print_batch(stdout, k, i, &b);
            }
        }
    }
    sl_batch_plan_stats(plan, rank == UINT64_MAX ? -1 : (int64_t)rank, &st);
    print_summary(stdout, plan, &st, rank == UINT64_MAX ? -1 : (int64_t)rank, lens.n, n_order,
                  shuffle, partitioned ? sl_sample_partition_name(sc.partition) : "none");
    if (fflush(stdout) != 0 || ferror(stdout)) {
        sl_cli_fail("batch", "cannot write the plan: %s", strerror(errno));
        goto out;
    }
    r = SL_CLI_OK;
out:
    sl_batch_plan_free(plan);
    free(order);
    free(lens.v);
    return r;
}
