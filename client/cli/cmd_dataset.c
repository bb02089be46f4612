/* sluice dataset: datasets on the daemon (sluice.v1.Datasets): create, lengths, labels, ls, show,
 * rm. */
#include "cli.h"

#include "err.h"
#include "opt.h"
#include "sluice_feed.h"
#include "util/lengths.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

typedef struct dataset_opts {
    uint64_t samples;
    const char *file;
    sl_lengths_form form;
} dataset_opts;

static int set_form(void *field, const char *arg)
{
    return sl_lengths_form_parse(field, arg);
}

static const sl_cli_opt dataset_table[] = {
    {"samples", SL_CLI_U64, "N", "number of samples (create)", SL_CLI_AT(dataset_opts, samples),
     .min = 1, .max = UINT64_C(1) << 62},
    {"file", SL_CLI_STR, "FILE", "lengths or labels file, '-' for stdin (lengths, labels)",
     SL_CLI_AT(dataset_opts, file)},
    {"format", SL_CLI_CALL, "FMT", "text (default) or u32 little-endian (lengths, labels)",
     SL_CLI_AT(dataset_opts, form), .call = set_form, .err = "must be text or u32",
     .flags = SL_CLI_PLAIN},
    SL_CLI_OPTS_END,
};

static void print_dataset(const sl_cli *cli, const sl_dataset *d)
{
    if (cli->json) {
        printf("{\"name\":");
        sl_cli_json_str(stdout, d->name);
        printf(",\"samples\":%" PRIu64 ",\"has_lengths\":%s,\"lengths_sha256\":\"%s\","
               "\"created_ms\":%" PRIu64 ",\"jobs\":%u,\"has_labels\":%s,\"labels_sha256\":\"%s\","
               "\"classes\":%u}\n",
               d->samples, d->has_lengths ? "true" : "false", d->lengths_sha256, d->created_ms,
               d->jobs, d->has_labels ? "true" : "false", d->labels_sha256, d->classes);
    } else {
        printf("name:      %s\nsamples:   %" PRIu64 "\nlengths:   %s\nlabels:    %s\n", d->name,
               d->samples, d->has_lengths ? d->lengths_sha256 : "(none)",
               d->has_labels ? d->labels_sha256 : "(none)");
        if (d->has_labels)
            printf("classes:   %u\n", d->classes);
        printf("jobs:      %u\n", d->jobs);
    }
}

/* Read a lengths file in the CLI's input forms (util/lengths.h). */
static int read_lengths(uint32_t **out, size_t *n, const char *path, sl_lengths_form form)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    char msg[512];
    int err;

    if (!f)
        return sl_cli_fail("dataset", "cannot open '%s': %s", path, strerror(errno));
    err = sl_lengths_parse(out, n, f, form, SL_LENGTHS_MAX, path, msg, sizeof(msg));
    if (f != stdin)
        fclose(f);
    return err ? sl_cli_fail("dataset", "%s", msg) : 0;
}

static int upload_lengths(const sl_cli *cli, sl_client *c, const dataset_opts *o, const char *name)
{
    uint32_t *v = NULL;
    size_t n = 0;
    sl_dataset d;
    int r;

    if ((r = read_lengths(&v, &n, o->file, o->form)) != 0)
        return r;
    r = sl_dataset_upload_lengths(c, name, v, n, &d);
    free(v);
    if (r)
        return sl_cli_call_fail(cli, "dataset");
    print_dataset(cli, &d);
    return SL_CLI_OK;
}

static int upload_labels(const sl_cli *cli, sl_client *c, const dataset_opts *o, const char *name)
{
    FILE *f = strcmp(o->file, "-") == 0 ? stdin : fopen(o->file, "rb");
    uint32_t *v = NULL;
    size_t n = 0;
    sl_dataset d;
    int r;

    if (!f)
        return sl_cli_fail("dataset", "cannot open '%s': %s", o->file, strerror(errno));
    r = sl_cli_labels_read(&v, &n, f, o->form == SL_LENGTHS_U32, o->file, "dataset");
    if (f != stdin)
        fclose(f);
    if (!r)
        r = sl_dataset_upload_labels(c, name, v, n, &d) ? sl_cli_call_fail(cli, "dataset") : 0;
    free(v);
    if (r)
        return r;
    print_dataset(cli, &d);
    return SL_CLI_OK;
}

static int list(const sl_cli *cli, sl_client *c)
{
    sl_dataset *all = NULL;
    size_t n = 0;

    if (sl_dataset_list(c, &all, &n))
        return sl_cli_call_fail(cli, "dataset");
    if (cli->json) {
        printf("[");
        for (size_t i = 0; i < n; i++) {
            printf("%s{\"name\":", i ? "," : "");
            sl_cli_json_str(stdout, all[i].name);
            printf(",\"samples\":%" PRIu64 ",\"has_lengths\":%s,\"jobs\":%u}", all[i].samples,
                   all[i].has_lengths ? "true" : "false", all[i].jobs);
        }
        printf("]\n");
    } else {
        printf("%-32s %14s %-8s %s\n", "NAME", "SAMPLES", "LENGTHS", "JOBS");
        for (size_t i = 0; i < n; i++)
            printf("%-32s %14" PRIu64 " %-8s %u\n", all[i].name, all[i].samples,
                   all[i].has_lengths ? "yes" : "no", all[i].jobs);
    }
    free(all);
    return SL_CLI_OK;
}

static int call(const sl_cli *cli, sl_client *c, const dataset_opts *o, const char *verb,
                const char *name)
{
    sl_dataset d;
    int err;

    if (strcmp(verb, "lengths") == 0)
        return upload_lengths(cli, c, o, name);
    if (strcmp(verb, "labels") == 0)
        return upload_labels(cli, c, o, name);
    if (strcmp(verb, "ls") == 0)
        return list(cli, c);
    if (strcmp(verb, "rm") == 0) {
        if ((err = sl_dataset_delete(c, name)) == 0 && cli->json)
            printf("{\"deleted\":true}\n");
    } else {
        err = strcmp(verb, "create") == 0 ? sl_dataset_create(c, name, o->samples, &d)
                                          : sl_dataset_get(c, name, &d);
        if (!err)
            print_dataset(cli, &d);
    }
    return err ? sl_cli_call_fail(cli, "dataset") : SL_CLI_OK;
}

/* The subcommand and its dataset name, with what each subcommand requires. */
static int check_args(const dataset_opts *o, int argc, char **argv)
{
    const char *verb;

    if (argc < 1) {
        fprintf(stderr,
                "sluice dataset: missing subcommand (create, lengths, labels, ls, show, rm)\n");
        return SL_CLI_USAGE;
    }
    verb = argv[0];
    if (strcmp(verb, "ls") != 0 && argc < 2) {
        fprintf(stderr, "sluice dataset %s: missing dataset name\n", verb);
        return SL_CLI_USAGE;
    }
    if (argc > (strcmp(verb, "ls") != 0 ? 2 : 1)) {
        fprintf(stderr, "sluice dataset: unexpected argument '%s'\n",
                argv[strcmp(verb, "ls") != 0 ? 2 : 1]);
        return SL_CLI_USAGE;
    }
    if (strcmp(verb, "create") == 0 && o->samples == 0) {
        fprintf(stderr, "sluice dataset create: --samples is required\n");
        return SL_CLI_USAGE;
    }
    if ((strcmp(verb, "lengths") == 0 || strcmp(verb, "labels") == 0) && !o->file) {
        fprintf(stderr, "sluice dataset %s: --file is required\n", verb);
        return SL_CLI_USAGE;
    }
    if (strcmp(verb, "create") && strcmp(verb, "lengths") && strcmp(verb, "labels") &&
        strcmp(verb, "ls") && strcmp(verb, "show") && strcmp(verb, "rm")) {
        fprintf(stderr, "sluice dataset: unknown subcommand '%s'\n", verb);
        return SL_CLI_USAGE;
    }
    return 0;
}

static int dataset_run(sl_cli *cli, sl_client *unused, void *opts, int argc, char **argv)
{
    const dataset_opts *o = opts;
    sl_client *c = NULL;
    int r;

    if ((r = check_args(o, argc, argv)) != 0 || (r = sl_cli_connect(&c, cli, "dataset")) != 0)
        return r;
    r = call(cli, c, o, argv[0], argc > 1 ? argv[1] : NULL);
    sl_client_close(c);
    return r;
}

const sl_cli_cmd sl_cli_dataset = {
    .name = "dataset",
    .summary = "datasets on the daemon: create, lengths, ls, show, rm",
    .max_args = -1,
    .opts = dataset_table,
    .opts_size = sizeof(dataset_opts),
    .run = dataset_run,
    .head =
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
        "Options:\n",
};
