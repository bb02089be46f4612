/* sluice sample: list a rank's sample indices for an epoch, locally (no daemon). */
#include "cli.h"

#include "err.h"
#include "sample/sample.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

enum {
    OPT_SAMPLES = 1,
    OPT_REPLICAS,
    OPT_RANK,
    OPT_PARTITION,
    OPT_CHUNK,
    OPT_SHUFFLE,
    OPT_SEED,
    OPT_EPOCH,
    OPT_DROP,
    OPT_START,
    OPT_COUNT,
    OPT_MESH,
    OPT_MESH_ORDER,
    OPT_CONSUMED,
    OPT_NEW_REPLICAS,
};

static const char usage_text[] =
    "Usage: sluice sample --samples N [--replicas R] [--rank r] [options]\n"
    "\n"
    "Print the sample indices rank r reads in one epoch, one per line (a JSON array with\n"
    "--json). Computed locally; no daemon is contacted. See docs/sampling.md.\n"
    "\n"
    "Options:\n"
    "  --samples N            dataset size (required, >= 1)\n"
    "  --replicas R           world size (default 1)\n"
    "  --rank r               global rank in [0, R) (default 0)\n"
    "  --partition MODE       interleaved (default; = torch DistributedSampler), contiguous,\n"
    "                         chunked\n"
    "  --chunk-size C         samples per chunk for --partition chunked (default 1)\n"
    "  --shuffle MODE         none, torch (= torch.randperm, N < 214748364) or feistel\n"
    "                         (default; O(1) memory)\n"
    "  --seed S               shuffle seed (default 0)\n"
    "  --epoch E              epoch (default 0); the order is keyed by seed and epoch\n"
    "  --drop-last            drop the tail instead of padding so shares are equal\n"
    "  --mesh DP,TP,CP,PP     device mesh sizes; their product must be R; only dp partitions\n"
    "  --mesh-order AXES      mesh axes outermost first (default pp,dp,cp,tp)\n"
    "  --consumed C0,C1,...   elastic remainder: how many indices each old dp rank has read;\n"
    "                         prints new rank r's share of the rest of the epoch\n"
    "  --new-replicas R2      elastic remainder: the new dp world size (with --consumed)\n"
    "  --start K              start at position K of the share (default 0)\n"
    "  --count M              print at most M indices (default: to the end of the share)\n"
    "  --json                 print a JSON array\n"
    "  -h, --help             show this help\n"
    "\n"
    "Exit codes: 0 ok, 1 error (invalid configuration), 2 usage.\n";

/* Strict unsigned decimal: no sign, no spaces, no trailing characters, at most max. */
static int parse_u64(uint64_t *out, const char *opt, const char *arg, uint64_t max)
{
    char *end;
    unsigned long long v;

    errno = 0;
    if (!arg || arg[0] < '0' || arg[0] > '9')
        goto bad;
    v = strtoull(arg, &end, 10);
    if (errno || *end || v > max)
        goto bad;
    *out = v;
    return 0;
bad:
    fprintf(stderr, "sluice sample: --%s '%s' is not an integer in [0, %" PRIu64 "]\n", opt,
            arg ? arg : "", max);
    return SL_CLI_USAGE;
}

static int parse_list(uint64_t **out, size_t *n, const char *opt, const char *arg, uint64_t max,
                      size_t max_n)
{
    uint64_t *v = NULL;
    size_t cnt = 1, k = 0;
    char *copy = NULL, *save = NULL, *tok;
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
        if (parse_u64(&v[k++], opt, tok, max))
            goto out;
    }
    if (k != cnt) {
        fprintf(stderr, "sluice sample: --%s '%s' has an empty entry\n", opt, arg);
        goto out;
    }
    *out = v;
    *n = cnt;
    v = NULL;
    r = 0;
out:
    free(v);
    free(copy);
    return r;
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

int cmd_sample(sl_cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        SL_CLI_COMMON_OPTS,
        {"samples", required_argument, NULL, OPT_SAMPLES},
        {"replicas", required_argument, NULL, OPT_REPLICAS},
        {"rank", required_argument, NULL, OPT_RANK},
        {"partition", required_argument, NULL, OPT_PARTITION},
        {"chunk-size", required_argument, NULL, OPT_CHUNK},
        {"shuffle", required_argument, NULL, OPT_SHUFFLE},
        {"seed", required_argument, NULL, OPT_SEED},
        {"epoch", required_argument, NULL, OPT_EPOCH},
        {"drop-last", no_argument, NULL, OPT_DROP},
        {"start", required_argument, NULL, OPT_START},
        {"count", required_argument, NULL, OPT_COUNT},
        {"mesh", required_argument, NULL, OPT_MESH},
        {"mesh-order", required_argument, NULL, OPT_MESH_ORDER},
        {"consumed", required_argument, NULL, OPT_CONSUMED},
        {"new-replicas", required_argument, NULL, OPT_NEW_REPLICAS},
        {NULL, 0, NULL, 0},
    };
    static char outbuf[1 << 16];
    sl_sample_config cfg;
    sl_sample_elastic *plan = NULL;
    sl_sample *s = NULL;
    uint64_t v, start = 0, count = UINT64_MAX, *consumed = NULL, *mesh = NULL, new_R = 0;
    uint64_t buf[4096];
    size_t n_consumed = 0, n_mesh = 0, got;
    int have_samples = 0, have_new = 0, first = 1, ch, r = SL_CLI_USAGE, err;
    char msg[256];

    sl_sample_config_init(&cfg);
    opterr = 0;
    while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (ch) {
        case 'h':
            fputs(usage_text, stdout);
            r = SL_CLI_OK;
            goto out;
        case OPT_SAMPLES:
            if (parse_u64(&cfg.samples, "samples", optarg, UINT64_MAX))
                goto out;
            have_samples = 1;
            break;
        case OPT_REPLICAS:
            if (parse_u64(&v, "replicas", optarg, UINT32_MAX))
                goto out;
            cfg.replicas = (uint32_t)v;
            break;
        case OPT_RANK:
            if (parse_u64(&v, "rank", optarg, UINT32_MAX))
                goto out;
            cfg.rank = (uint32_t)v;
            break;
        case OPT_PARTITION:
            if (sl_sample_partition_parse(&cfg.partition, optarg)) {
                fprintf(stderr,
                        "sluice sample: --partition '%s' is not interleaved, contiguous or "
                        "chunked\n",
                        optarg);
                goto out;
            }
            break;
        case OPT_CHUNK:
            if (parse_u64(&cfg.chunk_size, "chunk-size", optarg, UINT64_MAX))
                goto out;
            break;
        case OPT_SHUFFLE:
            if (sl_sample_shuffle_parse(&cfg.shuffle, optarg)) {
                fprintf(stderr, "sluice sample: --shuffle '%s' is not none, torch or feistel\n",
                        optarg);
                goto out;
            }
            break;
        case OPT_SEED:
            if (parse_u64(&cfg.seed, "seed", optarg, UINT64_MAX))
                goto out;
            break;
        case OPT_EPOCH:
            if (parse_u64(&cfg.epoch, "epoch", optarg, UINT64_MAX))
                goto out;
            break;
        case OPT_DROP:
            cfg.drop_last = true;
            break;
        case OPT_START:
            if (parse_u64(&start, "start", optarg, UINT64_MAX))
                goto out;
            break;
        case OPT_COUNT:
            if (parse_u64(&count, "count", optarg, UINT64_MAX))
                goto out;
            break;
        case OPT_MESH:
            free(mesh);
            mesh = NULL;
            if (parse_list(&mesh, &n_mesh, "mesh", optarg, UINT32_MAX, 4))
                goto out;
            if (n_mesh != 4) {
                fprintf(stderr, "sluice sample: --mesh '%s' needs four sizes DP,TP,CP,PP\n",
                        optarg);
                goto out;
            }
            cfg.mesh.dp = (uint32_t)mesh[0];
            cfg.mesh.tp = (uint32_t)mesh[1];
            cfg.mesh.cp = (uint32_t)mesh[2];
            cfg.mesh.pp = (uint32_t)mesh[3];
            break;
        case OPT_MESH_ORDER:
            if (sl_sample_mesh_order_parse(cfg.mesh.order, optarg)) {
                fprintf(stderr,
                        "sluice sample: --mesh-order '%s' must list dp, tp, cp, pp once each, "
                        "comma-separated\n",
                        optarg);
                goto out;
            }
            break;
        case OPT_CONSUMED:
            free(consumed);
            consumed = NULL;
            if (parse_list(&consumed, &n_consumed, "consumed", optarg, UINT64_MAX, 1u << 20))
                goto out;
            break;
        case OPT_NEW_REPLICAS:
            if (parse_u64(&new_R, "new-replicas", optarg, UINT32_MAX))
                goto out;
            have_new = 1;
            break;
        case '?':
        case ':':
            r = sl_cli_bad_opt("sample", ch, argv);
            goto out;
        default:
            if (sl_cli_common_opt(cli, "sample", ch, optarg))
                goto out;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "sluice sample: unexpected argument '%s'\n", argv[optind]);
        goto out;
    }
    if (!have_samples) {
        fprintf(stderr, "sluice sample: --samples is required\nTry 'sluice sample --help'.\n");
        goto out;
    }
    if (!!consumed != have_new) {
        fprintf(stderr, "sluice sample: --consumed and --new-replicas go together\n");
        goto out;
    }
    msg[0] = '\0';
    if (consumed) {
        /* The epoch's world is --replicas/--mesh; --rank is the rank in the new world. */
        uint32_t new_rank = cfg.rank;
        cfg.rank = 0;
        err = sl_sample_elastic_new(&plan, &cfg, consumed, n_consumed, (uint32_t)new_R, msg,
                                    sizeof(msg));
        if (!err)
            err = sl_sample_new_elastic(&s, plan, new_rank, msg, sizeof(msg));
    } else {
        err = sl_sample_new(&s, &cfg, msg, sizeof(msg));
    }
    if (err) {
        r = sl_cli_fail("sample", "%s", msg[0] ? msg : sl_strerror(err));
        goto out;
    }
    if (start > sl_sample_count(s)) {
        r = sl_cli_fail("sample", "start %" PRIu64 " past the end of the share (%" PRIu64 ")",
                        start, sl_sample_count(s));
        goto out;
    }
    sl_sample_seek(s, start);
    setvbuf(stdout, outbuf, _IOFBF, sizeof(outbuf));
    if (cli->json)
        fputc('[', stdout);
    while (count > 0) {
        size_t want =
            count < sizeof(buf) / sizeof(buf[0]) ? (size_t)count : sizeof(buf) / sizeof(buf[0]);
        if ((err = sl_sample_next(buf, &got, s, want)) != 0) {
            r = sl_cli_fail("sample", "%s", sl_strerror(err));
            goto out;
        }
        if (got == 0)
            break;
        print_indices(buf, got, cli->json, &first);
        count -= got;
    }
    if (cli->json)
        fputs("]\n", stdout);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        r = sl_cli_fail("sample", "writing the output failed");
        goto out;
    }
    r = SL_CLI_OK;
out:
    sl_sample_free(s);
    sl_sample_elastic_free(plan);
    free(consumed);
    free(mesh);
    return r;
}
