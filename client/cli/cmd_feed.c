/* sluice dataset|job|epoch|indices|batches: the feeding service from the command line. */
#include "cli.h"

#include "err.h"
#include "sluice_feed.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

enum {
    O_SAMPLES = 1,
    O_FILE,
    O_FORMAT,
    O_DATASET,
    O_WORLD,
    O_PARTITION,
    O_CHUNK,
    O_SHUFFLE,
    O_SEED,
    O_DROP_LAST,
    O_MANUAL,
    O_MESH,
    O_MESH_ORDER,
    O_STRATEGY,
    O_MBS,
    O_MSL,
    O_MAXTOK,
    O_COST,
    O_WINDOW,
    O_BUCKET,
    O_MULTIPLE,
    O_SKIP,
    O_PADREM,
    O_BALANCE,
    O_JOB,
    O_RANK,
    O_EPOCH,
    O_FROM,
    O_COUNT,
    O_REPORT,
    O_POSITION,
    O_EXPECT,
};

/* Strict unsigned decimal in [min, max]. */
static int parse_u64(uint64_t *out, const char *cmd, const char *opt, const char *arg, uint64_t min,
                     uint64_t max)
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
    fprintf(stderr, "sluice %s: --%s '%s' is not an integer in [%" PRIu64 ", %" PRIu64 "]\n", cmd,
            opt, arg ? arg : "", min, max);
    return SL_CLI_USAGE;
}

static int parse_u32(uint32_t *out, const char *cmd, const char *opt, const char *arg, uint32_t min)
{
    uint64_t v;
    int r = parse_u64(&v, cmd, opt, arg, min, UINT32_MAX);

    if (!r)
        *out = (uint32_t)v;
    return r;
}

static int connect_or_fail(sl_client **out, sl_cli *cli, const char *cmd)
{
    return sl_cli_connect(out, cli, cmd);
}

static int call_fail(const char *cmd, const sl_cli *cli)
{
    return sl_cli_fail(cmd, "%s (daemon %s)", sl_client_error(), cli->addr);
}

/* ---- output ---- */

static void print_dataset(const sl_cli *cli, const sl_dataset *d)
{
    if (cli->json) {
        printf("{\"name\":");
        sl_cli_json_str(stdout, d->name);
        printf(",\"samples\":%" PRIu64 ",\"has_lengths\":%s,\"lengths_sha256\":\"%s\","
               "\"created_ms\":%" PRIu64 ",\"jobs\":%u}\n",
               d->samples, d->has_lengths ? "true" : "false", d->lengths_sha256, d->created_ms,
               d->jobs);
    } else {
        printf("name:      %s\nsamples:   %" PRIu64 "\nlengths:   %s\njobs:      %u\n", d->name,
               d->samples, d->has_lengths ? d->lengths_sha256 : "(none)", d->jobs);
    }
}

static void print_job_json(const sl_job *j)
{
    printf("{\"name\":");
    sl_cli_json_str(stdout, j->name);
    printf(",\"dataset\":");
    sl_cli_json_str(stdout, j->dataset);
    printf(",\"world_size\":%u,\"dp_size\":%u,\"partition\":\"%s\",\"chunk_size\":%" PRIu64
           ",\"shuffle\":\"%s\",\"seed\":%" PRIu64 ",\"drop_last\":%s,\"manual_advance\":%s,"
           "\"epoch\":%" PRIu64 ",\"resized_in_epoch\":%s,\"created_ms\":%" PRIu64,
           j->world_size, j->dp_size, j->partition, j->chunk_size, j->shuffle, j->seed,
           j->drop_last ? "true" : "false", j->manual_advance ? "true" : "false", j->epoch,
           j->resized_in_epoch ? "true" : "false", j->created_ms);
    if (j->mesh.dp || j->mesh.tp || j->mesh.cp || j->mesh.pp)
        printf(",\"mesh\":{\"dp\":%u,\"tp\":%u,\"cp\":%u,\"pp\":%u,\"order\":\"%s\"}", j->mesh.dp,
               j->mesh.tp, j->mesh.cp, j->mesh.pp, j->mesh.order);
    if (j->has_batching)
        printf(",\"batching\":{\"strategy\":\"%s\",\"max_batch_size\":%u,\"max_seq_len\":%u,"
               "\"max_tokens\":%" PRIu64 ",\"cost\":\"%s\",\"window\":%" PRIu64 "}",
               j->batching.strategy[0] ? j->batching.strategy : "dynamic",
               j->batching.max_batch_size, j->batching.max_seq_len, j->batching.max_tokens,
               j->batching.cost, j->batching.window);
    printf("}");
}

static void print_job(const sl_cli *cli, const sl_job *j)
{
    if (cli->json) {
        print_job_json(j);
        printf("\n");
        return;
    }
    printf("name:        %s\ndataset:     %s\nworld size:  %u (dp %u)\npartition:   %s\n"
           "shuffle:     %s (seed %" PRIu64 ")\ndrop last:   %s\nepoch:       %" PRIu64 "%s%s\n",
           j->name, j->dataset, j->world_size, j->dp_size, j->partition, j->shuffle, j->seed,
           j->drop_last ? "yes" : "no", j->epoch, j->manual_advance ? " (manual advance)" : "",
           j->resized_in_epoch ? " (resized mid-epoch)" : "");
    if (j->has_batching)
        printf("batching:    %s, max_batch_size %u, max_seq_len %u, max_tokens %" PRIu64 "\n",
               j->batching.strategy[0] ? j->batching.strategy : "dynamic",
               j->batching.max_batch_size, j->batching.max_seq_len, j->batching.max_tokens);
}

static void print_epoch(const sl_cli *cli, const sl_epoch *e)
{
    if (cli->json) {
        printf("{\"job\":");
        sl_cli_json_str(stdout, e->job);
        printf(",\"epoch\":%" PRIu64 ",\"dp_size\":%u,\"complete\":%s,\"unit\":\"%s\",\"ranks\":[",
               e->epoch, e->dp_size, e->complete ? "true" : "false", e->unit);
        for (uint32_t i = 0; i < e->dp_size; i++)
            printf("%s{\"dp_rank\":%u,\"position\":%" PRIu64 ",\"count\":%" PRIu64 ",\"done\":%s}",
                   i ? "," : "", e->ranks[i].dp_rank, e->ranks[i].position, e->ranks[i].count,
                   e->ranks[i].done ? "true" : "false");
        printf("]}\n");
        return;
    }
    printf("job %s epoch %" PRIu64 " (%s)%s\n", e->job, e->epoch, e->unit,
           e->complete ? " complete" : "");
    printf("%-8s %14s %14s %s\n", "dp_rank", "position", "count", "done");
    for (uint32_t i = 0; i < e->dp_size; i++)
        printf("%-8u %14" PRIu64 " %14" PRIu64 " %s\n", e->ranks[i].dp_rank, e->ranks[i].position,
               e->ranks[i].count, e->ranks[i].done ? "yes" : "no");
}

/* ---- lengths files ---- */

static int read_lengths(uint32_t **out, uint64_t *n, const char *path, int u32)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, u32 ? "rb" : "r");
    uint32_t *v = NULL;
    size_t cap = 0, k = 0;
    uint64_t line = 0;
    char buf[64];
    int r = 0;

    if (!f)
        return sl_cli_fail("dataset", "cannot open '%s': %s", path, strerror(errno));
    for (;;) {
        uint64_t x;
        if (k == cap) {
            size_t ncap = cap ? 2 * cap : 1 << 16;
            uint32_t *nv = realloc(v, ncap * sizeof(*v));
            if (!nv) {
                r = sl_cli_fail("dataset", "out of memory");
                break;
            }
            v = nv;
            cap = ncap;
        }
        if (u32) {
            unsigned char b[4];
            size_t got = fread(b, 1, 4, f);
            if (got == 0)
                break;
            if (got != 4) {
                r = sl_cli_fail("dataset", "%s: size is not a multiple of 4 bytes", path);
                break;
            }
            v[k++] =
                (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
            continue;
        }
        if (!fgets(buf, sizeof(buf), f))
            break;
        line++;
        {
            char *end;
            size_t len = strcspn(buf, "\r\n");
            buf[len] = '\0';
            errno = 0;
            x = strtoull(buf, &end, 10);
            if (len == 0 || buf[0] < '0' || buf[0] > '9' || *end || errno || x > UINT32_MAX) {
                r = sl_cli_fail("dataset", "%s:%" PRIu64 ": not a length in [0, 2^32)", path, line);
                break;
            }
        }
        v[k++] = (uint32_t)x;
    }
    if (f != stdin)
        fclose(f);
    if (r) {
        free(v);
        return r;
    }
    *out = v;
    *n = k;
    return 0;
}

/* ---- sluice dataset ---- */

static int dataset_help(void)
{
    printf(
        "Usage: sluice dataset create NAME --samples N [options]\n"
        "       sluice dataset lengths NAME --file FILE [--format text|u32] [options]\n"
        "       sluice dataset ls [options]\n"
        "       sluice dataset show NAME [options]\n"
        "       sluice dataset rm NAME [options]\n"
        "\n"
        "Register datasets with the daemon (sluice.v1.Datasets). A lengths file has one length\n"
        "(tokens, >= 1) per line, or raw little-endian uint32 with --format u32; its count must\n"
        "equal the dataset's sample count.\n"
        "\n"
        "Options:\n"
        "  --samples N        number of samples (create)\n"
        "  --file FILE        lengths file, '-' for stdin (lengths)\n"
        "  --format FMT       text (default) or u32 (lengths)\n" SL_CLI_COMMON_HELP);
    return SL_CLI_OK;
}

int cmd_dataset(sl_cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        SL_CLI_COMMON_OPTS,
        {"samples", required_argument, NULL, O_SAMPLES},
        {"file", required_argument, NULL, O_FILE},
        {"format", required_argument, NULL, O_FORMAT},
        {NULL, 0, NULL, 0},
    };
    const char *verb, *name = NULL, *file = NULL;
    uint64_t samples = 0;
    int u32 = 0, ch, r, err = 0;
    sl_client *c = NULL;
    sl_dataset d;

    opterr = 0;
    optind = 0; /* full getopt re-initialisation: main parsed with "+" (no permutation) */
    while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (ch) {
        case 'h':
            return dataset_help();
        case O_SAMPLES:
            if (parse_u64(&samples, "dataset", "samples", optarg, 1, UINT64_C(1) << 62))
                return SL_CLI_USAGE;
            break;
        case O_FILE:
            file = optarg;
            break;
        case O_FORMAT:
            if (strcmp(optarg, "text") != 0 && strcmp(optarg, "u32") != 0) {
                fprintf(stderr, "sluice dataset: --format must be text or u32\n");
                return SL_CLI_USAGE;
            }
            u32 = strcmp(optarg, "u32") == 0;
            break;
        case '?':
        case ':':
            return sl_cli_bad_opt("dataset", ch, argv);
        default:
            if (sl_cli_common_opt(cli, "dataset", ch, optarg) != 0)
                return SL_CLI_USAGE;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "sluice dataset: missing subcommand (create, lengths, ls, show, rm)\n");
        return SL_CLI_USAGE;
    }
    verb = argv[optind++];
    if (strcmp(verb, "ls") != 0) {
        if (optind >= argc) {
            fprintf(stderr, "sluice dataset %s: missing dataset name\n", verb);
            return SL_CLI_USAGE;
        }
        name = argv[optind++];
    }
    if (optind < argc) {
        fprintf(stderr, "sluice dataset: unexpected argument '%s'\n", argv[optind]);
        return SL_CLI_USAGE;
    }
    if (strcmp(verb, "create") == 0 && samples == 0) {
        fprintf(stderr, "sluice dataset create: --samples is required\n");
        return SL_CLI_USAGE;
    }
    if (strcmp(verb, "lengths") == 0 && !file) {
        fprintf(stderr, "sluice dataset lengths: --file is required\n");
        return SL_CLI_USAGE;
    }
    if (strcmp(verb, "create") && strcmp(verb, "lengths") && strcmp(verb, "ls") &&
        strcmp(verb, "show") && strcmp(verb, "rm")) {
        fprintf(stderr, "sluice dataset: unknown subcommand '%s'\n", verb);
        return SL_CLI_USAGE;
    }
    if ((r = connect_or_fail(&c, cli, "dataset")) != 0)
        return r;
    if (strcmp(verb, "create") == 0) {
        err = sl_dataset_create(c, name, samples, &d);
        if (!err)
            print_dataset(cli, &d);
    } else if (strcmp(verb, "lengths") == 0) {
        uint32_t *v = NULL;
        uint64_t n = 0;
        if ((r = read_lengths(&v, &n, file, u32)) != 0) {
            sl_client_close(c);
            return r;
        }
        err = sl_dataset_upload_lengths(c, name, v, n, &d);
        free(v);
        if (!err)
            print_dataset(cli, &d);
    } else if (strcmp(verb, "show") == 0) {
        err = sl_dataset_get(c, name, &d);
        if (!err)
            print_dataset(cli, &d);
    } else if (strcmp(verb, "rm") == 0) {
        err = sl_dataset_delete(c, name);
        if (!err && cli->json)
            printf("{\"deleted\":true}\n");
    } else {
        sl_dataset *all = NULL;
        size_t n = 0;
        err = sl_dataset_list(c, &all, &n);
        if (!err && cli->json) {
            printf("[");
            for (size_t i = 0; i < n; i++) {
                printf("%s{\"name\":", i ? "," : "");
                sl_cli_json_str(stdout, all[i].name);
                printf(",\"samples\":%" PRIu64 ",\"has_lengths\":%s,\"jobs\":%u}", all[i].samples,
                       all[i].has_lengths ? "true" : "false", all[i].jobs);
            }
            printf("]\n");
        } else if (!err) {
            printf("%-32s %14s %-8s %s\n", "NAME", "SAMPLES", "LENGTHS", "JOBS");
            for (size_t i = 0; i < n; i++)
                printf("%-32s %14" PRIu64 " %-8s %u\n", all[i].name, all[i].samples,
                       all[i].has_lengths ? "yes" : "no", all[i].jobs);
        }
        free(all);
    }
    if (err)
        r = call_fail("dataset", cli);
    sl_client_close(c);
    return r;
}

/* ---- sluice job ---- */

static int job_help(void)
{
    printf(
        "Usage: sluice job create NAME --dataset D --world-size R [options]\n"
        "       sluice job ls [--dataset D] [options]\n"
        "       sluice job show NAME [options]\n"
        "       sluice job rm NAME [options]\n"
        "       sluice job resize NAME --world-size R [--mesh DP,TP,CP,PP] [options]\n"
        "\n"
        "Manage training jobs (sluice.v1.Jobs). Resizing mid-epoch redistributes the rest of the\n"
        "epoch over the new world exactly once.\n"
        "\n"
        "Options:\n"
        "  --dataset D           dataset the job reads (create; filter for ls)\n"
        "  --world-size R        number of ranks\n"
        "  --partition P         interleaved (default), contiguous or chunked\n"
        "  --chunk-size C        chunk size of the chunked partition\n"
        "  --shuffle S           feistel (default), torch or none\n"
        "  --seed S              shuffle seed (default 0)\n"
        "  --drop-last           drop the tail instead of padding (as torch's drop_last)\n"
        "  --manual-advance      epochs advance only with 'sluice epoch next'\n"
        "  --mesh DP,TP,CP,PP    device mesh sizes (product = world size)\n"
        "  --mesh-order ORDER    mesh axes outermost first, e.g. pp,dp,cp,tp\n"
        "Batching (the job streams token-budget batches instead of indices):\n"
        "  --strategy S          pad, bucket, dynamic or packed\n"
        "  --max-batch-size B    sequences per batch\n"
        "  --max-seq-len L       longest sequence\n"
        "  --max-tokens T        budget per batch (default B x L)\n"
        "  --cost C              padded or sum\n"
        "  --window W            sort window in samples (default whole epoch)\n"
        "  --bucket-width W      bucket strategy width\n"
        "  --batch-size-multiple M\n"
        "  --skip-overlong       skip sequences over max-seq-len instead of truncating\n"
        "  --pad-remainder       repeat batches instead of dropping the remainder\n"
        "  --balance             balance tokens across the ranks of a step\n" SL_CLI_COMMON_HELP);
    return SL_CLI_OK;
}

static int parse_mesh(sl_job_mesh *m, const char *arg)
{
    unsigned a, b, c, d;
    char extra;

    if (sscanf(arg, "%u,%u,%u,%u%c", &a, &b, &c, &d, &extra) != 4 || !a || !b || !c || !d) {
        fprintf(stderr, "sluice job: --mesh '%s' is not DP,TP,CP,PP (each >= 1)\n", arg);
        return SL_CLI_USAGE;
    }
    m->dp = a;
    m->tp = b;
    m->cp = c;
    m->pp = d;
    return 0;
}

static int set_name(char *dst, size_t len, const char *v, const char *opt)
{
    if (strlen(v) >= len) {
        fprintf(stderr, "sluice job: --%s '%s' is too long\n", opt, v);
        return SL_CLI_USAGE;
    }
    strcpy(dst, v);
    return 0;
}

int cmd_job(sl_cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        SL_CLI_COMMON_OPTS,
        {"dataset", required_argument, NULL, O_DATASET},
        {"world-size", required_argument, NULL, O_WORLD},
        {"partition", required_argument, NULL, O_PARTITION},
        {"chunk-size", required_argument, NULL, O_CHUNK},
        {"shuffle", required_argument, NULL, O_SHUFFLE},
        {"seed", required_argument, NULL, O_SEED},
        {"drop-last", no_argument, NULL, O_DROP_LAST},
        {"manual-advance", no_argument, NULL, O_MANUAL},
        {"mesh", required_argument, NULL, O_MESH},
        {"mesh-order", required_argument, NULL, O_MESH_ORDER},
        {"strategy", required_argument, NULL, O_STRATEGY},
        {"max-batch-size", required_argument, NULL, O_MBS},
        {"max-seq-len", required_argument, NULL, O_MSL},
        {"max-tokens", required_argument, NULL, O_MAXTOK},
        {"cost", required_argument, NULL, O_COST},
        {"window", required_argument, NULL, O_WINDOW},
        {"bucket-width", required_argument, NULL, O_BUCKET},
        {"batch-size-multiple", required_argument, NULL, O_MULTIPLE},
        {"skip-overlong", no_argument, NULL, O_SKIP},
        {"pad-remainder", no_argument, NULL, O_PADREM},
        {"balance", no_argument, NULL, O_BALANCE},
        {NULL, 0, NULL, 0},
    };
    sl_job spec, out;
    const char *verb, *name = NULL;
    int ch, r = 0, err = 0, mesh_given = 0;
    sl_client *c = NULL;

    memset(&spec, 0, sizeof(spec));
    opterr = 0;
    optind = 0; /* full getopt re-initialisation: main parsed with "+" (no permutation) */
    while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (ch) {
        case 'h':
            return job_help();
        case O_DATASET:
            r = set_name(spec.dataset, sizeof(spec.dataset), optarg, "dataset");
            break;
        case O_WORLD:
            r = parse_u32(&spec.world_size, "job", "world-size", optarg, 0);
            break;
        case O_PARTITION:
            r = set_name(spec.partition, sizeof(spec.partition), optarg, "partition");
            break;
        case O_CHUNK:
            r = parse_u64(&spec.chunk_size, "job", "chunk-size", optarg, 0, UINT64_MAX);
            break;
        case O_SHUFFLE:
            r = set_name(spec.shuffle, sizeof(spec.shuffle), optarg, "shuffle");
            break;
        case O_SEED:
            r = parse_u64(&spec.seed, "job", "seed", optarg, 0, UINT64_MAX);
            break;
        case O_DROP_LAST:
            spec.drop_last = 1;
            break;
        case O_MANUAL:
            spec.manual_advance = 1;
            break;
        case O_MESH:
            r = parse_mesh(&spec.mesh, optarg);
            mesh_given = 1;
            break;
        case O_MESH_ORDER:
            r = set_name(spec.mesh.order, sizeof(spec.mesh.order), optarg, "mesh-order");
            break;
        case O_STRATEGY:
            spec.has_batching = 1;
            r = set_name(spec.batching.strategy, sizeof(spec.batching.strategy), optarg,
                         "strategy");
            break;
        case O_MBS:
            spec.has_batching = 1;
            r = parse_u32(&spec.batching.max_batch_size, "job", "max-batch-size", optarg, 0);
            break;
        case O_MSL:
            spec.has_batching = 1;
            r = parse_u32(&spec.batching.max_seq_len, "job", "max-seq-len", optarg, 0);
            break;
        case O_MAXTOK:
            spec.has_batching = 1;
            r = parse_u64(&spec.batching.max_tokens, "job", "max-tokens", optarg, 0, UINT64_MAX);
            break;
        case O_COST:
            spec.has_batching = 1;
            r = set_name(spec.batching.cost, sizeof(spec.batching.cost), optarg, "cost");
            break;
        case O_WINDOW:
            spec.has_batching = 1;
            r = parse_u64(&spec.batching.window, "job", "window", optarg, 0, UINT64_MAX);
            break;
        case O_BUCKET:
            spec.has_batching = 1;
            r = parse_u32(&spec.batching.bucket_width, "job", "bucket-width", optarg, 0);
            break;
        case O_MULTIPLE:
            spec.has_batching = 1;
            r = parse_u32(&spec.batching.batch_size_multiple, "job", "batch-size-multiple", optarg,
                          0);
            break;
        case O_SKIP:
            spec.has_batching = spec.batching.skip_overlong = 1;
            break;
        case O_PADREM:
            spec.has_batching = spec.batching.pad_remainder = 1;
            break;
        case O_BALANCE:
            spec.has_batching = spec.batching.balance = 1;
            break;
        case '?':
        case ':':
            return sl_cli_bad_opt("job", ch, argv);
        default:
            if (sl_cli_common_opt(cli, "job", ch, optarg) != 0)
                return SL_CLI_USAGE;
        }
        if (r)
            return SL_CLI_USAGE;
    }
    if (optind >= argc) {
        fprintf(stderr, "sluice job: missing subcommand (create, ls, show, rm, resize)\n");
        return SL_CLI_USAGE;
    }
    verb = argv[optind++];
    if (strcmp(verb, "create") && strcmp(verb, "ls") && strcmp(verb, "show") &&
        strcmp(verb, "rm") && strcmp(verb, "resize")) {
        fprintf(stderr, "sluice job: unknown subcommand '%s'\n", verb);
        return SL_CLI_USAGE;
    }
    if (strcmp(verb, "ls") != 0) {
        if (optind >= argc) {
            fprintf(stderr, "sluice job %s: missing job name\n", verb);
            return SL_CLI_USAGE;
        }
        name = argv[optind++];
        if (set_name(spec.name, sizeof(spec.name), name, "name"))
            return SL_CLI_USAGE;
    }
    if (optind < argc) {
        fprintf(stderr, "sluice job: unexpected argument '%s'\n", argv[optind]);
        return SL_CLI_USAGE;
    }
    if (strcmp(verb, "create") == 0 && (!spec.dataset[0] || !spec.world_size)) {
        fprintf(stderr, "sluice job create: --dataset and --world-size are required\n");
        return SL_CLI_USAGE;
    }
    if (strcmp(verb, "resize") == 0 && !spec.world_size) {
        fprintf(stderr, "sluice job resize: --world-size is required\n");
        return SL_CLI_USAGE;
    }
    if ((r = connect_or_fail(&c, cli, "job")) != 0)
        return r;
    if (strcmp(verb, "create") == 0) {
        err = sl_job_create(c, &spec, &out);
        if (!err)
            print_job(cli, &out);
    } else if (strcmp(verb, "show") == 0) {
        err = sl_job_get(c, name, &out);
        if (!err)
            print_job(cli, &out);
    } else if (strcmp(verb, "rm") == 0) {
        err = sl_job_delete(c, name);
        if (!err && cli->json)
            printf("{\"deleted\":true}\n");
    } else if (strcmp(verb, "resize") == 0) {
        err = sl_job_resize(c, name, spec.world_size, mesh_given ? &spec.mesh : NULL, &out);
        if (!err)
            print_job(cli, &out);
    } else {
        sl_job *all = NULL;
        size_t n = 0;
        err = sl_job_list(c, spec.dataset, &all, &n);
        if (!err && cli->json) {
            printf("[");
            for (size_t i = 0; i < n; i++) {
                printf("%s", i ? "," : "");
                print_job_json(&all[i]);
            }
            printf("]\n");
        } else if (!err) {
            printf("%-24s %-20s %6s %-12s %-8s %10s\n", "NAME", "DATASET", "WORLD", "PARTITION",
                   "SHUFFLE", "EPOCH");
            for (size_t i = 0; i < n; i++)
                printf("%-24s %-20s %6u %-12s %-8s %10" PRIu64 "\n", all[i].name, all[i].dataset,
                       all[i].world_size, all[i].partition, all[i].shuffle, all[i].epoch);
        }
        free(all);
    }
    if (err)
        r = call_fail("job", cli);
    sl_client_close(c);
    return r;
}

/* ---- sluice epoch ---- */

int cmd_epoch(sl_cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        SL_CLI_COMMON_OPTS,
        {"expect", required_argument, NULL, O_EXPECT},
        {"rank", required_argument, NULL, O_RANK},
        {"epoch", required_argument, NULL, O_EPOCH},
        {"position", required_argument, NULL, O_POSITION},
        {NULL, 0, NULL, 0},
    };
    uint64_t expect = 0, epoch = 0, position = 0;
    uint32_t rank = 0;
    int have_expect = 0, have_rank = 0, have_epoch = 0, have_pos = 0, ch, r = 0, err;
    const char *verb, *job;
    sl_client *c = NULL;
    sl_epoch e;

    opterr = 0;
    optind = 0; /* full getopt re-initialisation: main parsed with "+" (no permutation) */
    while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (ch) {
        case 'h':
            printf(
                "Usage: sluice epoch show JOB [options]\n"
                "       sluice epoch next JOB [--expect E] [options]\n"
                "       sluice epoch report JOB --rank R --epoch E --position P [options]\n"
                "\n"
                "The coordinator owns each job's epoch (sluice.v1.Epochs): show its per-rank\n"
                "progress, end it now and begin the next one, or report a rank's progress.\n"
                "\n"
                "Options:\n"
                "  --expect E         next: only if E is the current epoch\n"
                "  --rank R           report: global rank\n"
                "  --epoch E          report: the epoch the position belongs to\n"
                "  --position P       report: positions [0, P) are consumed\n" SL_CLI_COMMON_HELP);
            return SL_CLI_OK;
        case O_EXPECT:
            r = parse_u64(&expect, "epoch", "expect", optarg, 0, INT64_MAX);
            have_expect = 1;
            break;
        case O_RANK:
            r = parse_u32(&rank, "epoch", "rank", optarg, 0);
            have_rank = 1;
            break;
        case O_EPOCH:
            r = parse_u64(&epoch, "epoch", "epoch", optarg, 0, INT64_MAX);
            have_epoch = 1;
            break;
        case O_POSITION:
            r = parse_u64(&position, "epoch", "position", optarg, 0, UINT64_MAX);
            have_pos = 1;
            break;
        case '?':
        case ':':
            return sl_cli_bad_opt("epoch", ch, argv);
        default:
            if (sl_cli_common_opt(cli, "epoch", ch, optarg) != 0)
                return SL_CLI_USAGE;
        }
        if (r)
            return SL_CLI_USAGE;
    }
    if (argc - optind != 2) {
        fprintf(stderr, "sluice epoch: expected a subcommand (show, next, report) and a job\n");
        return SL_CLI_USAGE;
    }
    verb = argv[optind];
    job = argv[optind + 1];
    if (strcmp(verb, "show") && strcmp(verb, "next") && strcmp(verb, "report")) {
        fprintf(stderr, "sluice epoch: unknown subcommand '%s'\n", verb);
        return SL_CLI_USAGE;
    }
    if (strcmp(verb, "report") == 0 && !(have_rank && have_epoch && have_pos)) {
        fprintf(stderr, "sluice epoch report: --rank, --epoch and --position are required\n");
        return SL_CLI_USAGE;
    }
    if ((r = connect_or_fail(&c, cli, "epoch")) != 0)
        return r;
    memset(&e, 0, sizeof(e));
    if (strcmp(verb, "report") == 0) {
        uint64_t cur = 0;
        int adv = 0;
        err = sl_epoch_report(c, job, rank, epoch, position, &cur, &adv);
        if (!err) {
            if (cli->json)
                printf("{\"epoch\":%" PRIu64 ",\"advanced\":%s}\n", cur, adv ? "true" : "false");
            else
                printf("epoch %" PRIu64 "%s\n", cur, adv ? " (advanced)" : "");
        }
    } else {
        err = strcmp(verb, "show") == 0 ? sl_epoch_get(c, job, &e)
                                        : sl_epoch_next(c, job, have_expect, expect, &e);
        if (!err)
            print_epoch(cli, &e);
    }
    sl_epoch_clear(&e);
    if (err)
        r = call_fail("epoch", cli);
    sl_client_close(c);
    return r;
}

/* ---- sluice indices / batches ---- */

static int stream_cmd(sl_cli *cli, int argc, char **argv, int batches)
{
    static const struct option opts[] = {
        SL_CLI_COMMON_OPTS,
        {"job", required_argument, NULL, O_JOB},
        {"rank", required_argument, NULL, O_RANK},
        {"epoch", required_argument, NULL, O_EPOCH},
        {"from", required_argument, NULL, O_FROM},
        {"count", required_argument, NULL, O_COUNT},
        {"report", no_argument, NULL, O_REPORT},
        {NULL, 0, NULL, 0},
    };
    const char *cmd = batches ? "batches" : "indices";
    const char *job = NULL;
    sl_stream_opts so;
    uint64_t count = UINT64_MAX, done = 0, epoch = 0, last = 0;
    uint32_t rank = 0;
    int have_rank = 0, report = 0, ch, r = 0, got;
    sl_client *c = NULL;

    memset(&so, 0, sizeof(so));
    opterr = 0;
    optind = 0; /* full getopt re-initialisation: main parsed with "+" (no permutation) */
    while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (ch) {
        case 'h':
            printf("Usage: sluice %s --job J --rank R [--epoch E] [--from P] [--count M] "
                   "[--report] [options]\n"
                   "\n"
                   "Stream a rank's %s for the job's current epoch (sluice.v1.Feed), starting at\n"
                   "its last reported position. With --epoch E = current + 1 it waits until the\n"
                   "epoch begins. --report reports the position reached when done. Text output\n"
                   "is %s; --json prints %s.\n"
                   "\n"
                   "Options:\n"
                   "  --job J            job name\n"
                   "  --rank R           global rank\n"
                   "  --epoch E          epoch (default: current)\n"
                   "  --from P           first %s (default: the reported position)\n"
                   "  --count M          stop after M %s\n"
                   "  --report           report progress through the last one "
                   "printed\n" SL_CLI_COMMON_HELP,
                   cmd, batches ? "token-budget batches" : "sample indices",
                   batches ? "one line of space-separated indices per batch" : "one index per line",
                   batches ? "one JSON object per batch"
                           : "one JSON object {epoch, start, share_count, indices}",
                   batches ? "step" : "position", cmd);
            return SL_CLI_OK;
        case O_JOB:
            job = optarg;
            break;
        case O_RANK:
            r = parse_u32(&rank, cmd, "rank", optarg, 0);
            have_rank = 1;
            break;
        case O_EPOCH:
            r = parse_u64(&so.epoch, cmd, "epoch", optarg, 0, INT64_MAX);
            so.epoch_set = 1;
            break;
        case O_FROM:
            r = parse_u64(&so.position, cmd, "from", optarg, 0, UINT64_MAX);
            so.position_set = 1;
            break;
        case O_COUNT:
            r = parse_u64(&count, cmd, "count", optarg, 0, UINT64_MAX);
            break;
        case O_REPORT:
            report = 1;
            break;
        case '?':
        case ':':
            return sl_cli_bad_opt(cmd, ch, argv);
        default:
            if (sl_cli_common_opt(cli, cmd, ch, optarg) != 0)
                return SL_CLI_USAGE;
        }
        if (r)
            return SL_CLI_USAGE;
    }
    if (optind < argc) {
        fprintf(stderr, "sluice %s: unexpected argument '%s'\n", cmd, argv[optind]);
        return SL_CLI_USAGE;
    }
    if (!job || !have_rank) {
        fprintf(stderr, "sluice %s: --job and --rank are required\n", cmd);
        return SL_CLI_USAGE;
    }
    if ((r = connect_or_fail(&c, cli, cmd)) != 0)
        return r;
    if (!batches) {
        sl_index_stream *s = NULL;
        const uint64_t *idx;
        size_t n;
        uint64_t start;
        int header = 0;
        got = sl_indices_open(&s, c, job, rank, &so);
        while (!got && done < count && (got = sl_indices_next(s, &idx, &n, &start)) == 1) {
            got = 0;
            if (n > count - done)
                n = (size_t)(count - done);
            if (cli->json && !header)
                printf("{\"epoch\":%" PRIu64 ",\"start\":%" PRIu64 ",\"share_count\":%" PRIu64
                       ",\"indices\":[",
                       sl_indices_epoch(s), start, sl_indices_share_count(s));
            header = 1;
            for (size_t i = 0; i < n; i++) {
                if (cli->json)
                    printf("%s%" PRIu64, done + i ? "," : "", idx[i]);
                else
                    printf("%" PRIu64 "\n", idx[i]);
            }
            done += n;
            last = start + n;
        }
        epoch = s ? sl_indices_epoch(s) : 0;
        if (cli->json && header)
            printf("]}\n");
        sl_indices_close(s);
    } else {
        sl_batch_stream *s = NULL;
        sl_feed_batch b;
        got = sl_batches_open(&s, c, job, rank, &so);
        while (!got && done < count && (got = sl_batches_next(s, &b)) == 1) {
            if (cli->json) {
                printf("{\"epoch\":%" PRIu64 ",\"step\":%" PRIu64 ",\"indices\":[",
                       sl_batches_epoch(s), b.step);
                for (size_t i = 0; i < b.count; i++)
                    printf("%s%u", i ? "," : "", b.indices[i]);
                printf("],\"max_len\":%u,\"tokens\":%" PRIu64 ",\"padded_tokens\":%" PRIu64 "}\n",
                       b.max_len, b.tokens, b.padded_tokens);
            } else {
                for (size_t i = 0; i < b.count; i++)
                    printf("%s%u", i ? " " : "", b.indices[i]);
                printf("\n");
            }
            done++;
            last = b.step + 1;
            got = 0;
        }
        epoch = s ? sl_batches_epoch(s) : 0;
        sl_batches_close(s);
    }
    fflush(stdout);
    if (got < 0)
        r = call_fail(cmd, cli);
    else if (report && done > 0 && sl_epoch_report(c, job, rank, epoch, last, NULL, NULL) != 0)
        r = call_fail(cmd, cli);
    sl_client_close(c);
    return r;
}

int cmd_indices(sl_cli *cli, int argc, char **argv)
{
    return stream_cmd(cli, argc, argv, 0);
}

int cmd_batches(sl_cli *cli, int argc, char **argv)
{
    return stream_cmd(cli, argc, argv, 1);
}
