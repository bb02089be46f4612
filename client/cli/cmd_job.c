/* sluice job: training jobs on the daemon (sluice.v1.Jobs): create, ls, show, rm, resize. */
#include "cli.h"

#include "err.h"
#include "opt.h"
#include "sample/sample.h"
#include "sluice_feed.h"
#include "util/num.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

typedef struct weights {
    double *v;
    size_t n;
} weights;

typedef struct job_opts {
    sl_job spec;
    int mesh_given;
    weights class_w, rank_w;
} job_opts;

/* "W0,W1,...": weights > 0 and finite (sample.h), at most `max`. */
static int set_weights(weights *w, const char *what, size_t max, const char *arg)
{
    char msg[256];
    double *v = calloc(max, sizeof(*v));

    if (!v)
        return sl_cli_fail("job", "out of memory");
    if (sl_sample_weights_parse(v, &w->n, max, arg, what, msg, sizeof(msg)) != 0) {
        free(v);
        fprintf(stderr, "sluice job: %s\n", msg);
        return SL_CLI_USAGE;
    }
    free(w->v);
    w->v = v;
    return 0;
}

static int set_class_weights(void *field, const char *arg)
{
    return set_weights(field, "class", SL_SAMPLE_MAX_CLASSES, arg);
}

static int set_rank_weights(void *field, const char *arg)
{
    return set_weights(field, "rank", 65536, arg);
}

/* "DP,TP,CP,PP": four sizes >= 1. */
static int set_mesh(void *field, const char *arg)
{
    sl_job_mesh *m = field;

    return sl_cli_mesh(arg, &m->dp, &m->tp, &m->cp, &m->pp);
}

#define AT(f)    SL_CLI_AT(job_opts, spec.f)
#define BATCHING SL_CLI_SEEN(job_opts, spec.has_batching)
#define NAME(name, arg, help, f)                                                                   \
    {                                                                                              \
        name, SL_CLI_COPY, arg, help, AT(f), .err = "is too long"                                  \
    }

static const sl_cli_opt job_table[] = {
    NAME("dataset", "D", "dataset the job reads (create; filter for ls)", dataset),
    {"world-size", SL_CLI_U64, "R", "number of ranks", AT(world_size), .max = UINT32_MAX},
    NAME("partition", "P", "interleaved (default), contiguous or chunked", partition),
    {"chunk-size", SL_CLI_U64, "C", "chunk size of the chunked partition", AT(chunk_size),
     .max = UINT64_MAX},
    NAME("shuffle", "S", "feistel (default), torch or none", shuffle),
    {"seed", SL_CLI_U64, "S", "shuffle seed (default 0)", AT(seed), .max = UINT64_MAX},
    {"drop-last", SL_CLI_FLAG, NULL, "drop the tail instead of padding (as torch's drop_last)",
     AT(drop_last)},
    {"manual-advance", SL_CLI_FLAG, NULL, "epochs advance only with 'sluice epoch next'",
     AT(manual_advance)},
    {"mesh", SL_CLI_CALL, "DP,TP,CP,PP", "device mesh sizes (product = world size)", AT(mesh),
     SL_CLI_SEEN(job_opts, mesh_given), .call = set_mesh, .err = "is not DP,TP,CP,PP (each >= 1)"},
    NAME("mesh-order", "ORDER", "mesh axes outermost first, e.g. pp,dp,cp,tp", mesh.order),
    SL_CLI_LINE("Classes and weights (docs/sampling.md; classes need the dataset's labels):"),
    {"stratify", SL_CLI_FLAG, NULL, "every dp rank holds each class in proportion", AT(stratify)},
    {"balance-classes", SL_CLI_FLAG, NULL, "class-balanced epochs, classes drawn uniformly",
     AT(balance_classes)},
    {"class-weights", SL_CLI_CALL, "W0,W1,...",
     "class-balanced epochs with these class proportions", SL_CLI_AT(job_opts, class_w),
     .call = set_class_weights},
    {"epoch-length", SL_CLI_U64, "L", "samples per class-balanced epoch (default N)",
     AT(epoch_length), .max = UINT64_C(1) << 62},
    {"rank-weights", SL_CLI_CALL, "W0,W1,...", "one weight per dp rank: shares proportional",
     SL_CLI_AT(job_opts, rank_w), .call = set_rank_weights},
    SL_CLI_LINE("Batching (the job streams token-budget batches instead of indices):"),
    {"strategy", SL_CLI_COPY, "S", "pad, bucket, dynamic or packed", AT(batching.strategy),
     BATCHING, .err = "is too long"},
    {"max-batch-size", SL_CLI_U64, "B", "sequences per batch", AT(batching.max_batch_size),
     BATCHING, .max = UINT32_MAX},
    {"max-seq-len", SL_CLI_U64, "L", "longest sequence", AT(batching.max_seq_len), BATCHING,
     .max = UINT32_MAX},
    {"max-tokens", SL_CLI_U64, "T", "budget per batch (default B x L)", AT(batching.max_tokens),
     BATCHING, .max = UINT64_MAX},
    {"cost", SL_CLI_COPY, "C", "padded or sum", AT(batching.cost), BATCHING, .err = "is too long"},
    {"window", SL_CLI_U64, "W", "sort window in samples (default whole epoch)", AT(batching.window),
     BATCHING, .max = UINT64_MAX},
    {"bucket-width", SL_CLI_U64, "W", "bucket strategy width", AT(batching.bucket_width), BATCHING,
     .max = UINT32_MAX},
    {"batch-size-multiple", SL_CLI_U64, "M", "", AT(batching.batch_size_multiple), BATCHING,
     .max = UINT32_MAX},
    {"skip-overlong", SL_CLI_FLAG, NULL, "skip sequences over max-seq-len instead of truncating",
     AT(batching.skip_overlong), BATCHING},
    {"pad-remainder", SL_CLI_FLAG, NULL, "repeat batches instead of dropping the remainder",
     AT(batching.pad_remainder), BATCHING},
    {"balance", SL_CLI_FLAG, NULL, "balance tokens across the ranks of a step",
     AT(batching.balance), BATCHING},
    SL_CLI_OPTS_END,
};

/* ,"name":[w0,w1,...] when the job reported its weights (%.17g: they read back exactly). */
static void print_weights_json(const char *name, const double *w, uint32_t n)
{
    if (!w)
        return;
    printf(",\"%s\":[", name);
    for (uint32_t i = 0; i < n; i++)
        printf("%s%.17g", i ? "," : "", w[i]);
    printf("]");
}

/* The weights in text: all of them up to 16, else the first 16 and the count. */
static void print_weights(const char *label, const double *w, uint32_t n)
{
    printf("%s", label);
    for (uint32_t i = 0; w && i < n && i < 16; i++)
        printf("%s%g", i ? "," : " ", w[i]);
    if (!w || n > 16)
        printf(" (%u)", n);
    printf("\n");
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
    printf(
        ",\"stratify\":%s,\"balance_classes\":%s,\"n_class_weights\":%u,\"epoch_length\":%" PRIu64
        ",\"n_rank_weights\":%u",
        j->stratify ? "true" : "false", j->balance_classes ? "true" : "false", j->n_class_weights,
        j->epoch_length, j->n_rank_weights);
    print_weights_json("class_weights", j->class_weights, j->n_class_weights);
    print_weights_json("rank_weights", j->rank_weights, j->n_rank_weights);
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
    if (j->stratify)
        printf("classes:     stratified shares\n");
    if (j->balance_classes || j->n_class_weights)
        printf("classes:     balanced epochs (%u class weights, epoch length %" PRIu64 ")\n",
               j->n_class_weights, j->epoch_length);
    if (j->n_class_weights)
        print_weights("class weights:", j->class_weights, j->n_class_weights);
    if (j->n_rank_weights)
        print_weights("rank weights:", j->rank_weights, j->n_rank_weights);
}

static int list(const sl_cli *cli, sl_client *c, const char *dataset)
{
    sl_job *all = NULL;
    size_t n = 0;

    if (sl_job_list(c, dataset, &all, &n))
        return sl_cli_call_fail(cli, "job");
    if (cli->json) {
        printf("[");
        for (size_t i = 0; i < n; i++) {
            printf("%s", i ? "," : "");
            print_job_json(&all[i]);
        }
        printf("]\n");
    } else {
        printf("%-24s %-20s %6s %-12s %-8s %10s\n", "NAME", "DATASET", "WORLD", "PARTITION",
               "SHUFFLE", "EPOCH");
        for (size_t i = 0; i < n; i++)
            printf("%-24s %-20s %6u %-12s %-8s %10" PRIu64 "\n", all[i].name, all[i].dataset,
                   all[i].world_size, all[i].partition, all[i].shuffle, all[i].epoch);
    }
    free(all);
    return SL_CLI_OK;
}

static int call(const sl_cli *cli, sl_client *c, const job_opts *o, const char *verb)
{
    const char *name = o->spec.name;
    sl_job out;
    int err;

    if (strcmp(verb, "ls") == 0)
        return list(cli, c, o->spec.dataset);
    if (strcmp(verb, "rm") == 0) {
        if ((err = sl_job_delete(c, name)) == 0 && cli->json)
            printf("{\"deleted\":true}\n");
        return err ? sl_cli_call_fail(cli, "job") : SL_CLI_OK;
    }
    if (strcmp(verb, "create") == 0) {
        sl_job spec = o->spec;
        spec.class_weights = o->class_w.v;
        spec.n_class_weights = (uint32_t)o->class_w.n;
        spec.rank_weights = o->rank_w.v;
        spec.n_rank_weights = (uint32_t)o->rank_w.n;
        err = sl_job_create(c, &spec, &out);
    } else if (strcmp(verb, "show") == 0)
        err = sl_job_get(c, name, &out);
    else
        err = sl_job_resize_weighted(c, name, o->spec.world_size,
                                     o->mesh_given ? &o->spec.mesh : NULL, o->rank_w.v,
                                     (uint32_t)o->rank_w.n, &out);
    if (err)
        return sl_cli_call_fail(cli, "job");
    print_job(cli, &out);
    sl_job_clear(&out);
    return SL_CLI_OK;
}

/* The subcommand and the job's name (into spec.name), with what each subcommand requires. */
static int check_args(job_opts *o, int argc, char **argv)
{
    const char *verb;
    int k = 1;

    if (argc < 1) {
        fprintf(stderr, "sluice job: missing subcommand (create, ls, show, rm, resize)\n");
        return SL_CLI_USAGE;
    }
    verb = argv[0];
    if (strcmp(verb, "create") && strcmp(verb, "ls") && strcmp(verb, "show") &&
        strcmp(verb, "rm") && strcmp(verb, "resize")) {
        fprintf(stderr, "sluice job: unknown subcommand '%s'\n", verb);
        return SL_CLI_USAGE;
    }
    if (strcmp(verb, "ls") != 0) {
        if (argc < 2) {
            fprintf(stderr, "sluice job %s: missing job name\n", verb);
            return SL_CLI_USAGE;
        }
        if (strlen(argv[k]) >= sizeof(o->spec.name)) {
            fprintf(stderr, "sluice job: --name '%s' is too long\n", argv[k]);
            return SL_CLI_USAGE;
        }
        strcpy(o->spec.name, argv[k++]);
    }
    if (argc > k) {
        fprintf(stderr, "sluice job: unexpected argument '%s'\n", argv[k]);
        return SL_CLI_USAGE;
    }
    if (strcmp(verb, "create") == 0 && (!o->spec.dataset[0] || !o->spec.world_size)) {
        fprintf(stderr, "sluice job create: --dataset and --world-size are required\n");
        return SL_CLI_USAGE;
    }
    if (strcmp(verb, "resize") == 0 && !o->spec.world_size) {
        fprintf(stderr, "sluice job resize: --world-size is required\n");
        return SL_CLI_USAGE;
    }
    return 0;
}

static int job_run(sl_cli *cli, sl_client *unused, void *opts, int argc, char **argv)
{
    job_opts *o = opts;
    sl_client *c = NULL;
    int r;

    if ((r = check_args(o, argc, argv)) != 0 || (r = sl_cli_connect(&c, cli, "job")) != 0)
        return r;
    r = call(cli, c, o, argv[0]);
    sl_client_close(c);
    free(o->class_w.v);
    free(o->rank_w.v);
    return r;
}

const sl_cli_cmd sl_cli_job = {
    .name = "job",
    .summary = "training jobs: create, ls, show, rm, resize",
    .max_args = -1,
    .opts = job_table,
    .opts_size = sizeof(job_opts),
    .run = job_run,
    .width = 22,
    .head =
        "Usage: sluice job create NAME --dataset D --world-size R [options]\n"
        "       sluice job ls [--dataset D] [options]\n"
        "       sluice job show NAME [options]\n"
        "       sluice job rm NAME [options]\n"
        "       sluice job resize NAME --world-size R [--mesh DP,TP,CP,PP] [--rank-weights W,...]\n"
        "\n"
        "Manage training jobs (sluice.v1.Jobs). Resizing mid-epoch redistributes the rest of the\n"
        "epoch over the new world, no sample twice, in equal counts per dp rank (DDP ranks take\n"
        "the same number of steps whatever their batch size; no batch size is needed): with\n"
        "drop_last the rest is cut to a multiple of the new dp world (fewer than R samples left\n"
        "out: Epochs.Get's left_out counts them, 'sluice sample --left-out' lists them),\n"
        "otherwise padded by repeating its first samples. With --rank-weights the counts\n"
        "follow the weights.\n"
        "\n"
        "Options:\n",
};
