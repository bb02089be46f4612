/* sluice epoch: a job's epoch and per-rank progress (sluice.v1.Epochs): show, next, report. */
#include "cli.h"

#include "err.h"
#include "opt.h"
#include "sluice_feed.h"

#include <inttypes.h>
#include <string.h>

typedef struct epoch_opts {
    uint64_t expect, epoch, position;
    uint32_t rank;
    int have_expect, have_rank, have_epoch, have_position;
} epoch_opts;

#define AT(f) SL_CLI_AT(epoch_opts, f)

static const sl_cli_opt epoch_table[] = {
    {"expect", SL_CLI_U64, "E", "next: only if E is the current epoch", AT(expect),
     SL_CLI_SEEN(epoch_opts, have_expect), .max = INT64_MAX},
    {"rank", SL_CLI_U64, "R", "report: global rank", AT(rank), SL_CLI_SEEN(epoch_opts, have_rank),
     .max = UINT32_MAX},
    {"epoch", SL_CLI_U64, "E", "report: the epoch the position belongs to", AT(epoch),
     SL_CLI_SEEN(epoch_opts, have_epoch), .max = INT64_MAX},
    {"position", SL_CLI_U64, "P", "report: positions [0, P) are consumed", AT(position),
     SL_CLI_SEEN(epoch_opts, have_position), .max = UINT64_MAX},
    SL_CLI_OPTS_END,
};

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

static int report(const sl_cli *cli, sl_client *c, const epoch_opts *o, const char *job)
{
    uint64_t cur = 0;
    int adv = 0;

    if (sl_epoch_report(c, job, o->rank, o->epoch, o->position, &cur, &adv) != 0)
        return sl_cli_call_fail(cli, "epoch");
    if (cli->json)
        printf("{\"epoch\":%" PRIu64 ",\"advanced\":%s}\n", cur, adv ? "true" : "false");
    else
        printf("epoch %" PRIu64 "%s\n", cur, adv ? " (advanced)" : "");
    return SL_CLI_OK;
}

static int show_or_next(const sl_cli *cli, sl_client *c, const epoch_opts *o, const char *verb,
                        const char *job)
{
    sl_epoch e;
    int err;

    memset(&e, 0, sizeof(e));
    err = strcmp(verb, "show") == 0 ? sl_epoch_get(c, job, &e)
                                    : sl_epoch_next(c, job, o->have_expect, o->expect, &e);
    if (!err)
        print_epoch(cli, &e);
    sl_epoch_clear(&e);
    return err ? sl_cli_call_fail(cli, "epoch") : SL_CLI_OK;
}

static int epoch_run(sl_cli *cli, sl_client *unused, void *opts, int argc, char **argv)
{
    const epoch_opts *o = opts;
    sl_client *c = NULL;
    int r;

    if (argc != 2) {
        fprintf(stderr, "sluice epoch: expected a subcommand (show, next, report) and a job\n");
        return SL_CLI_USAGE;
    }
    if (strcmp(argv[0], "show") && strcmp(argv[0], "next") && strcmp(argv[0], "report")) {
        fprintf(stderr, "sluice epoch: unknown subcommand '%s'\n", argv[0]);
        return SL_CLI_USAGE;
    }
    if (strcmp(argv[0], "report") == 0 && !(o->have_rank && o->have_epoch && o->have_position)) {
        fprintf(stderr, "sluice epoch report: --rank, --epoch and --position are required\n");
        return SL_CLI_USAGE;
    }
    if ((r = sl_cli_connect(&c, cli, "epoch")) != 0)
        return r;
    if (strcmp(argv[0], "report") == 0)
        r = report(cli, c, o, argv[1]);
    else
        r = show_or_next(cli, c, o, argv[0], argv[1]);
    sl_client_close(c);
    return r;
}

const sl_cli_cmd sl_cli_epoch = {
    .name = "epoch",
    .summary = "a job's epoch and per-rank progress: show, next, report",
    .max_args = -1,
    .opts = epoch_table,
    .opts_size = sizeof(epoch_opts),
    .run = epoch_run,
    .head = "Usage: sluice epoch show JOB [options]\n"
            "       sluice epoch next JOB [--expect E] [options]\n"
            "       sluice epoch report JOB --rank R --epoch E --position P [options]\n"
            "\n"
            "The coordinator owns each job's epoch (sluice.v1.Epochs): show its per-rank\n"
            "progress, end it now and begin the next one, or report a rank's progress.\n"
            "\n"
            "Options:\n",
};
