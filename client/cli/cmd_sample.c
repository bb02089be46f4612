/* sluice sample: list a rank's sample indices for an epoch, locally (no daemon). */
#include "cli.h"

#include "err.h"
#include "opt.h"
#include "sample/sample.h"
#include "util/num.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* A comma-separated list of numbers, as given. */
typedef struct u64_list {
    uint64_t *v;
    size_t n;
} u64_list;

/* Most weights one option takes (class ids are below SL_SAMPLE_MAX_CLASSES). */
#define MAX_WEIGHTS SL_SAMPLE_MAX_CLASSES

typedef struct weight_list {
    double *v;
    size_t n;
} weight_list;

/* Resizes after the first (--consumed/--new-replicas): "C0,C1,...:R2[:W0,W1,...]". */
#define MAX_RESIZES 16

typedef struct sample_opts {
    sl_sample_config cfg;
    uint64_t start, count, new_replicas;
    u64_list consumed;
    int have_samples, have_new;
    const char *labels_file;
    int stratify, balance;
    int left_out;
    weight_list rank_w, class_w;
    weight_list new_w; /* --new-rank-weights: the first resize's world */
    u64_list more[MAX_RESIZES];
    uint64_t more_R[MAX_RESIZES];
    weight_list more_w[MAX_RESIZES]; /* each further resize's weights, or none */
    size_t n_more;
    sl_sample_labels *labels;
} sample_opts;

/* Parse "A,B,..." (at most max_n entries, each in [0, max]) into *l, replacing what it held. */
static int parse_list(u64_list *l, const char *opt, const char *arg, uint64_t max, size_t max_n)
{
    size_t cnt = 1, k = 0;
    char *copy = NULL, *save = NULL, *tok;
    uint64_t *v = NULL;
    int r = SL_CLI_USAGE;

    for (const char *p = arg; *p; p++)
        cnt += *p == ',';
    if (cnt > max_n) {
        fprintf(stderr, "sluice sample: --%s has %zu entries, more than %zu\n", opt, cnt, max_n);
        goto out;
    }
    v = calloc(cnt, sizeof(*v));
    copy = strdup(arg);
    if (!v || !copy) {
        r = sl_cli_fail("sample", "out of memory");
        goto out;
    }
    for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (sl_parse_u64(&v[k++], tok, 0, max) != 0) {
            fprintf(stderr, "sluice sample: --%s '%s' is not an integer in [0, %" PRIu64 "]\n", opt,
                    tok, max);
            goto out;
        }
    }
    if (k != cnt) {
        fprintf(stderr, "sluice sample: --%s '%s' has an empty entry\n", opt, arg);
        goto out;
    }
    free(l->v);
    l->v = v;
    l->n = cnt;
    v = NULL;
    r = 0;
out:
    free(v);
    free(copy);
    return r;
}

static int set_mesh(void *field, const char *arg)
{
    sl_sample_mesh *m = field;
    u64_list l = {NULL, 0};
    int r = parse_list(&l, "mesh", arg, UINT32_MAX, 4);

    if (r == 0 && l.n != 4) {
        fprintf(stderr, "sluice sample: --mesh '%s' needs four sizes DP,TP,CP,PP\n", arg);
        r = SL_CLI_USAGE;
    }
    if (r == 0) {
        m->dp = (uint32_t)l.v[0];
        m->tp = (uint32_t)l.v[1];
        m->cp = (uint32_t)l.v[2];
        m->pp = (uint32_t)l.v[3];
    }
    free(l.v);
    return r;
}

static int set_consumed(void *field, const char *arg)
{
    return parse_list(field, "consumed", arg, UINT64_MAX, 1u << 20);
}

static int set_weights(weight_list *w, const char *what, const char *arg)
{
    char msg[256];
    double *v = calloc(MAX_WEIGHTS, sizeof(*v));
    int err;

    if (!v)
        return sl_cli_fail("sample", "out of memory");
    err = sl_sample_weights_parse(v, &w->n, MAX_WEIGHTS, arg, what, msg, sizeof(msg));
    if (err) {
        free(v);
        fprintf(stderr, "sluice sample: %s\n", msg);
        return SL_CLI_USAGE;
    }
    free(w->v);
    w->v = v;
    return 0;
}

static int set_rank_weights(void *field, const char *arg)
{
    return set_weights(field, "rank", arg);
}

static int set_class_weights(void *field, const char *arg)
{
    return set_weights(field, "class", arg);
}

static int set_new_rank_weights(void *field, const char *arg)
{
    return set_weights(field, "rank", arg);
}

/* One more resize, "C0,C1,...:R2" or "C0,C1,...:R2:W0,W1,..." (the new world's rank weights),
 * appended to the chain. */
static int set_resize(void *field, const char *arg)
{
    sample_opts *o = (sample_opts *)((char *)field - offsetof(sample_opts, n_more));
    const char *colon = strchr(arg, ':'), *wcolon = colon ? strchr(colon + 1, ':') : NULL;
    char *list = NULL, *world = NULL;
    size_t k = o->n_more;
    int r = SL_CLI_USAGE;

    if (k == MAX_RESIZES) {
        fprintf(stderr, "sluice sample: more than %d --resize steps\n", MAX_RESIZES);
        return SL_CLI_USAGE;
    }
    if (colon &&
        !(world = wcolon ? strndup(colon + 1, (size_t)(wcolon - colon - 1)) : strdup(colon + 1)))
        return sl_cli_fail("sample", "out of memory");
    if (!colon || sl_parse_u64(&o->more_R[k], world, 1, UINT32_MAX) != 0) {
        fprintf(stderr,
                "sluice sample: --resize '%s' is not C0,C1,...:R2 or C0,C1,...:R2:W0,W1,... "
                "(R2 >= 1)\n",
                arg);
        goto out;
    }
    if (!(list = strndup(arg, (size_t)(colon - arg)))) {
        r = sl_cli_fail("sample", "out of memory");
        goto out;
    }
    r = parse_list(&o->more[k], "resize", list, UINT64_MAX, 1u << 20);
    if (r == 0 && wcolon && (r = set_weights(&o->more_w[k], "rank", wcolon + 1)) != 0) {
        free(o->more[k].v); /* a step not taken: the options' cleanup frees only n_more steps */
        o->more[k].v = NULL;
    }
    if (r == 0)
        o->n_more++;
out:
    free(world);
    free(list);
    return r;
}

static int set_partition(void *field, const char *arg)
{
    return sl_sample_partition_parse(field, arg);
}

static int set_shuffle(void *field, const char *arg)
{
    return sl_sample_shuffle_parse(field, arg);
}

static int set_mesh_order(void *field, const char *arg)
{
    return sl_sample_mesh_order_parse(field, arg);
}

#define AT(f) SL_CLI_AT(sample_opts, f)

static const sl_cli_opt sample_table[] = {
    {"samples", SL_CLI_U64, "N", "dataset size (required, >= 1)", AT(cfg.samples),
     .max = UINT64_MAX, SL_CLI_SEEN(sample_opts, have_samples)},
    {"replicas", SL_CLI_U64, "R", "world size (default 1)", AT(cfg.replicas), .max = UINT32_MAX},
    {"rank", SL_CLI_U64, "r", "global rank in [0, R) (default 0)", AT(cfg.rank), .max = UINT32_MAX},
    {"partition", SL_CLI_CALL, "MODE",
     "interleaved (default; = torch DistributedSampler), contiguous,\nchunked", AT(cfg.partition),
     .call = set_partition, .err = "is not interleaved, contiguous or chunked"},
    {"chunk-size", SL_CLI_U64, "C", "samples per chunk for --partition chunked (default 1)",
     AT(cfg.chunk_size), .max = UINT64_MAX},
    {"shuffle", SL_CLI_CALL, "MODE",
     "none, torch (= torch.randperm, N < 214748364) or feistel\n(default; O(1) memory)",
     AT(cfg.shuffle), .call = set_shuffle, .err = "is not none, torch or feistel"},
    {"seed", SL_CLI_U64, "S", "shuffle seed (default 0)", AT(cfg.seed), .max = UINT64_MAX},
    {"epoch", SL_CLI_U64, "E", "epoch (default 0); the order is keyed by seed and epoch",
     AT(cfg.epoch), .max = UINT64_MAX},
    {"drop-last", SL_CLI_FLAG, NULL, "drop the tail instead of padding so shares are equal",
     AT(cfg.drop_last)},
    {"mesh", SL_CLI_CALL, "DP,TP,CP,PP",
     "device mesh sizes; their product must be R; only dp partitions", AT(cfg.mesh),
     .call = set_mesh},
    {"mesh-order", SL_CLI_CALL, "AXES", "mesh axes outermost first (default pp,dp,cp,tp)",
     AT(cfg.mesh.order), .call = set_mesh_order,
     .err = "must list dp, tp, cp, pp once each, comma-separated"},
    {"consumed", SL_CLI_CALL, "C0,C1,...",
     "elastic remainder: how many indices each old dp rank has read;\nprints new rank r's "
     "share of the rest of the epoch",
     AT(consumed), .call = set_consumed},
    {"new-replicas", SL_CLI_U64, "R2", "elastic remainder: the new dp world size (with --consumed)",
     AT(new_replicas), .max = UINT32_MAX, SL_CLI_SEEN(sample_opts, have_new)},
    {"new-rank-weights", SL_CLI_CALL, "W0,W1,...",
     "elastic remainder: one weight per rank of the new dp world\n(as --rank-weights; default "
     "equal shares)",
     AT(new_w), .call = set_new_rank_weights},
    {"resize", SL_CLI_CALL, "C0,..:R2[:W0,..]",
     "a further resize in the same epoch (repeatable, after --consumed):\nwhat each rank of the "
     "previous world read, the next world size, and\noptionally its rank weights (as "
     "--rank-weights, one per rank of R2)",
     AT(n_more), .call = set_resize},
    {"left-out", SL_CLI_FLAG, NULL,
     "with --consumed: print the indices the resizes left out instead of\na share (with "
     "--drop-last each resize cuts the rest to a multiple of\nits new world, so that every rank "
     "gets the same count; without\n--drop-last the rest is padded and nothing is left out)",
     AT(left_out)},
    {"labels-file", SL_CLI_STR, "F", "class id of every sample, one decimal per line",
     AT(labels_file)},
    {"stratify", SL_CLI_FLAG, NULL, "stratified shares: every rank holds each class in proportion",
     AT(stratify)},
    {"balance-classes", SL_CLI_FLAG, NULL,
     "class-balanced epochs: draw classes uniformly (or by --class-weights)", AT(balance)},
    {"class-weights", SL_CLI_CALL, "W0,W1,...",
     "target class proportions of balanced epochs (implies --balance-classes)", AT(class_w),
     .call = set_class_weights},
    {"epoch-length", SL_CLI_U64, "L", "draws per balanced epoch (default N)", AT(cfg.epoch_length),
     .max = UINT64_MAX},
    {"rank-weights", SL_CLI_CALL, "W0,W1,...",
     "one weight per dp rank: shares proportional to them", AT(rank_w), .call = set_rank_weights},
    {"start", SL_CLI_U64, "K", "start at position K of the share (default 0)", AT(start),
     .max = UINT64_MAX},
    {"count", SL_CLI_U64, "M", "print at most M indices (default: to the end of the share)",
     AT(count), .max = UINT64_MAX},
    SL_CLI_ROW("--json", "print a JSON array"),
    SL_CLI_ROW("-h, --help", "show this help"),
    SL_CLI_OPTS_END,
};

static void sample_init(void *opts)
{
    sample_opts *o = opts;

    sl_sample_config_init(&o->cfg);
    o->count = UINT64_MAX;
}

static void sample_fini(void *opts)
{
    sample_opts *o = opts;

    free(o->consumed.v);
    free(o->rank_w.v);
    free(o->class_w.v);
    free(o->new_w.v);
    for (size_t k = 0; k < o->n_more; k++) {
        free(o->more[k].v);
        free(o->more_w[k].v);
    }
    sl_sample_labels_free(o->labels);
}

/* Read class ids, one decimal per line, into o->labels. Returns 0 or an exit code. */
static int load_labels(sample_opts *o)
{
    FILE *f = strcmp(o->labels_file, "-") == 0 ? stdin : fopen(o->labels_file, "r");
    uint32_t *v = NULL;
    size_t n = 0, cap = 0;
    char line[64], msg[256];
    int r = 0;

    if (!f)
        return sl_cli_fail("sample", "cannot open %s", o->labels_file);
    while (fgets(line, sizeof(line), f)) {
        uint64_t x;
        line[strcspn(line, "\r\n")] = '\0';
        if (sl_parse_u64(&x, line, 0, UINT32_MAX) != 0) {
            r = sl_cli_fail("sample", "%s line %zu: '%s' is not a class id", o->labels_file, n + 1,
                            line);
            goto out;
        }
        if (n == cap) {
            uint32_t *nv = realloc(v, (cap = cap ? 2 * cap : 4096) * sizeof(*v));
            if (!nv) {
                r = sl_cli_fail("sample", "out of memory");
                goto out;
            }
            v = nv;
        }
        v[n++] = (uint32_t)x;
    }
    if (sl_sample_labels_new(&o->labels, v, n, msg, sizeof(msg)) != 0)
        r = sl_cli_fail("sample", "%s: %s", o->labels_file, msg);
out:
    free(v);
    if (f != stdin)
        fclose(f);
    return r;
}

/* Classes and weights from the options into the config. Returns 0 or an exit code. */
static int apply_classes(sample_opts *o)
{
    int r;

    if (o->labels_file && (r = load_labels(o)) != 0)
        return r;
    o->cfg.labels = o->labels;
    if (o->class_w.v)
        o->balance = 1;
    if (o->stratify && o->balance) {
        fprintf(stderr, "sluice sample: --stratify and --balance-classes exclude each other\n");
        return SL_CLI_USAGE;
    }
    o->cfg.classes = o->stratify  ? SL_SAMPLE_CLASSES_STRATIFY
                     : o->balance ? SL_SAMPLE_CLASSES_BALANCE
                                  : SL_SAMPLE_CLASSES_NONE;
    o->cfg.class_weights = o->class_w.v;
    o->cfg.n_class_weights = (uint32_t)o->class_w.n;
    o->cfg.rank_weights = o->rank_w.v;
    o->cfg.n_rank_weights = (uint32_t)o->rank_w.n;
    return 0;
}

/* Print indices fast: stdio with a large buffer and hand-made decimal conversion. */
static void print_indices(const uint64_t *v, size_t n, int json, int *first)
{
    char buf[24];

    for (size_t i = 0; i < n; i++) {
        char *p = buf + sizeof(buf);
        uint64_t x = v[i];
        *--p = '\0';
        do {
            *--p = (char)('0' + x % 10);
            x /= 10;
        } while (x);
        if (json && !*first)
            fputc(',', stdout);
        fputs(p, stdout);
        if (!json)
            fputc('\n', stdout);
        *first = 0;
    }
}

/* The share to print: the configured rank's, or with --consumed the new rank's share of the
 * rest of the epoch. Returns 0 and *s, or an exit code after printing why. */
static int open_share(sl_sample **s, sl_sample_elastic **plan, sample_opts *o)
{
    char msg[256] = "";
    int err;

    if (o->consumed.v) {
        /* The epoch's world is --replicas/--mesh; --rank is the rank in the new world. */
        uint32_t new_rank = o->cfg.rank;

        sl_sample_resize steps[1 + MAX_RESIZES];

        steps[0] = (sl_sample_resize){o->consumed.v, o->consumed.n, (uint32_t)o->new_replicas,
                                      o->new_w.v,    o->new_w.n,    false};
        for (size_t k = 0; k < o->n_more; k++)
            steps[k + 1] =
                (sl_sample_resize){o->more[k].v,   o->more[k].n,   (uint32_t)o->more_R[k],
                                   o->more_w[k].v, o->more_w[k].n, false};
        o->cfg.rank = 0;
        err = sl_sample_elastic_chain(plan, &o->cfg, steps, 1 + o->n_more, msg, sizeof(msg));
        if (!err)
            err = sl_sample_new_elastic(s, *plan, new_rank, msg, sizeof(msg));
    } else {
        err = sl_sample_new(s, &o->cfg, msg, sizeof(msg));
    }
    if (err)
        return sl_cli_fail("sample", "%s", msg[0] ? msg : sl_strerror(err));
    if (o->start > sl_sample_count(*s))
        return sl_cli_fail("sample", "start %" PRIu64 " past the end of the share (%" PRIu64 ")",
                           o->start, sl_sample_count(*s));
    return 0;
}

static int print_share(sl_sample *s, uint64_t count, int json)
{
    static char outbuf[1 << 16];
    uint64_t buf[4096];
    size_t got;
    int first = 1, err;

    setvbuf(stdout, outbuf, _IOFBF, sizeof(outbuf));
    if (json)
        fputc('[', stdout);
    while (count > 0) {
        size_t want =
            count < sizeof(buf) / sizeof(buf[0]) ? (size_t)count : sizeof(buf) / sizeof(buf[0]);
        if ((err = sl_sample_next(buf, &got, s, want)) != 0)
            return sl_cli_fail("sample", "%s", sl_strerror(err));
        if (got == 0)
            break;
        print_indices(buf, got, json, &first);
        count -= got;
    }
    if (json)
        fputs("]\n", stdout);
    if (fflush(stdout) != 0 || ferror(stdout))
        return sl_cli_fail("sample", "writing the output failed");
    return SL_CLI_OK;
}

/* --left-out: every index the plan's resizes left out, step by step. */
static int print_left_out(const sl_sample_elastic *plan, int json)
{
    uint64_t n = sl_sample_elastic_left_out_count(plan), v;
    int first = 1;

    if (json)
        fputc('[', stdout);
    for (uint64_t i = 0; i < n; i++) {
        if (sl_sample_elastic_left_out(&v, plan, i) != 0)
            return sl_cli_fail("sample", "left out index %" PRIu64 " unavailable", i);
        print_indices(&v, 1, json, &first);
    }
    if (json)
        fputs("]\n", stdout);
    if (fflush(stdout) != 0 || ferror(stdout))
        return sl_cli_fail("sample", "writing the output failed");
    return SL_CLI_OK;
}

static int sample_run(sl_cli *cli, struct sl_client *c, void *opts, int argc, char **argv)
{
    sample_opts *o = opts;
    sl_sample_elastic *plan = NULL;
    sl_sample *s = NULL;
    int r;

    if (!o->have_samples) {
        fprintf(stderr, "sluice sample: --samples is required\nTry 'sluice sample --help'.\n");
        return SL_CLI_USAGE;
    }
    if (!!o->consumed.v != o->have_new) {
        fprintf(stderr, "sluice sample: --consumed and --new-replicas go together\n");
        return SL_CLI_USAGE;
    }
    if (o->new_w.v && !o->consumed.v) {
        fprintf(stderr, "sluice sample: --new-rank-weights goes with --consumed and "
                        "--new-replicas\n");
        return SL_CLI_USAGE;
    }
    if (o->n_more && !o->consumed.v) {
        fprintf(stderr, "sluice sample: --resize follows --consumed and --new-replicas\n");
        return SL_CLI_USAGE;
    }
    if (o->left_out && !o->consumed.v) {
        fprintf(stderr, "sluice sample: --left-out goes with --consumed and --new-replicas\n");
        return SL_CLI_USAGE;
    }
    if ((r = apply_classes(o)) != 0)
        return r;
    if ((r = open_share(&s, &plan, o)) == 0 && o->left_out) {
        r = print_left_out(plan, cli->json);
    } else if (r == 0) {
        sl_sample_seek(s, o->start);
        r = print_share(s, o->count, cli->json);
    }
    sl_sample_free(s);
    sl_sample_elastic_free(plan);
    return r;
}

const sl_cli_cmd sl_cli_sample = {
    .name = "sample",
    .summary = "list a rank's sample indices for an epoch (local, no daemon)",
    .max_args = 0,
    .opts = sample_table,
    .opts_size = sizeof(sample_opts),
    .init = sample_init,
    .fini = sample_fini,
    .run = sample_run,
    .width = 23,
    .flags = SL_CLI_NO_COMMON_HELP,
    .head = "Usage: sluice sample --samples N [--replicas R] [--rank r] [options]\n"
            "\n"
            "Print the sample indices rank r reads in one epoch, one per line (a JSON array with\n"
            "--json). Computed locally; no daemon is contacted. See docs/sampling.md.\n"
            "\n"
            "Options:\n",
    .tail = "\nExit codes: 0 ok, 1 error (invalid configuration), 2 usage.\n",
};
