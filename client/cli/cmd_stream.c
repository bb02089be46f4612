/* sluice indices, sluice batches: stream a rank's sample indices or token-budget batches from
 * the daemon (sluice.v1.Feed), and optionally report how far they got. */
#include "cli.h"

#include "err.h"
#include "opt.h"
#include "sluice_feed.h"

#include <inttypes.h>
#include <string.h>

typedef struct stream_opts {
    const char *job;
    uint32_t rank;
    int have_rank, report;
    uint64_t count;
    sl_stream_opts so;
} stream_opts;

/* How far a stream got. */
typedef struct progress {
    uint64_t done;  /* indices or batches printed */
    uint64_t last;  /* the position (step) after the last one printed */
    uint64_t epoch; /* the epoch streamed */
} progress;

#define AT(f) SL_CLI_AT(stream_opts, f)

/* The options of both commands: only the unit of --from and --count differs. */
#define STREAM_TABLE(from_help, count_help)                                                        \
    {                                                                                              \
        {"job", SL_CLI_STR, "J", "job name", AT(job)},                                             \
            {"rank",           SL_CLI_U64, "R",                                                    \
             "global rank",    AT(rank),   SL_CLI_SEEN(stream_opts, have_rank),                    \
             .max = UINT32_MAX},                                                                   \
            {"epoch",                                                                              \
             SL_CLI_U64,                                                                           \
             "E",                                                                                  \
             "epoch (default: current)",                                                           \
             AT(so.epoch),                                                                         \
             SL_CLI_SEEN(stream_opts, so.epoch_set),                                               \
             .max = INT64_MAX},                                                                    \
            {"from",           SL_CLI_U64,      "P",                                               \
             from_help,        AT(so.position), SL_CLI_SEEN(stream_opts, so.position_set),         \
             .max = UINT64_MAX},                                                                   \
            {"count", SL_CLI_U64, "M", count_help, AT(count), .max = UINT64_MAX},                  \
            {"report", SL_CLI_FLAG, NULL, "report progress through the last one printed",          \
             AT(report)},                                                                          \
            SL_CLI_OPTS_END,                                                                       \
    }

static const sl_cli_opt indices_table[] =
    STREAM_TABLE("first position (default: the reported position)", "stop after M indices");
static const sl_cli_opt batches_table[] =
    STREAM_TABLE("first step (default: the reported position)", "stop after M batches");

static void stream_init(void *opts)
{
    stream_opts *o = opts;
    const sl_stream_opts so = SL_STREAM_OPTS_INIT;

    o->count = UINT64_MAX;
    o->so = so;
}

/* Print indices (one per line, or one JSON object for all). Returns 0 or the client's error. */
static int indices(const sl_cli *cli, sl_client *c, const stream_opts *o, progress *p)
{
    sl_index_stream *s = NULL;
    const uint64_t *idx;
    size_t n;
    uint64_t start;
    int header = 0, got = sl_indices_open(&s, c, o->job, o->rank, &o->so);

    while (!got && p->done < o->count && (got = sl_indices_next(s, &idx, &n, &start)) == 1) {
        got = 0;
        if (n > o->count - p->done)
            n = (size_t)(o->count - p->done);
        if (cli->json && !header)
            printf("{\"epoch\":%" PRIu64 ",\"start\":%" PRIu64 ",\"share_count\":%" PRIu64
                   ",\"indices\":[",
                   sl_indices_epoch(s), start, sl_indices_share_count(s));
        header = 1;
        for (size_t i = 0; i < n; i++) {
            if (cli->json)
                printf("%s%" PRIu64, p->done + i ? "," : "", idx[i]);
            else
                printf("%" PRIu64 "\n", idx[i]);
        }
        p->done += n;
        p->last = start + n;
    }
    p->epoch = s ? sl_indices_epoch(s) : 0;
    if (cli->json && header)
        printf("]}\n");
    sl_indices_close(s);
    return got;
}

/* Print batches (a line of indices, or a JSON object, each). As indices(). */
static int batches(const sl_cli *cli, sl_client *c, const stream_opts *o, progress *p)
{
    sl_batch_stream *s = NULL;
    sl_feed_batch b;
    int got = sl_batches_open(&s, c, o->job, o->rank, &o->so);

    while (!got && p->done < o->count && (got = sl_batches_next(s, &b)) == 1) {
        if (cli->json) {
            printf("{\"epoch\":%" PRIu64 ",\"step\":%" PRIu64 ",\"indices\":[", sl_batches_epoch(s),
                   b.step);
            for (size_t i = 0; i < b.count; i++)
                printf("%s%u", i ? "," : "", b.indices[i]);
            printf("],\"max_len\":%u,\"tokens\":%" PRIu64 ",\"padded_tokens\":%" PRIu64 "}\n",
                   b.max_len, b.tokens, b.padded_tokens);
        } else {
            for (size_t i = 0; i < b.count; i++)
                printf("%s%u", i ? " " : "", b.indices[i]);
            printf("\n");
        }
        p->done++;
        p->last = b.step + 1;
        got = 0;
    }
    p->epoch = s ? sl_batches_epoch(s) : 0;
    sl_batches_close(s);
    return got;
}

static int stream_run(sl_cli *cli, const stream_opts *o, const char *cmd,
                      int (*stream)(const sl_cli *, sl_client *, const stream_opts *, progress *))
{
    progress p = {0, 0, 0};
    sl_client *c = NULL;
    int r, got;

    if (!o->job || !o->have_rank) {
        fprintf(stderr, "sluice %s: --job and --rank are required\n", cmd);
        return SL_CLI_USAGE;
    }
    if ((r = sl_cli_connect(&c, cli, cmd)) != 0)
        return r;
    got = stream(cli, c, o, &p);
    fflush(stdout);
    if (got < 0)
        r = sl_cli_call_fail(cli, cmd);
    else if (o->report && p.done > 0 &&
             sl_epoch_report(c, o->job, o->rank, p.epoch, p.last, NULL, NULL) != 0)
        r = sl_cli_call_fail(cli, cmd);
    sl_client_close(c);
    return r;
}

static int indices_run(sl_cli *cli, sl_client *unused, void *o, int argc, char **argv)
{
    return stream_run(cli, o, "indices", indices);
}

static int batches_run(sl_cli *cli, sl_client *unused, void *o, int argc, char **argv)
{
    return stream_run(cli, o, "batches", batches);
}

#define STREAM_HEAD(cmd, what, text, json)                                                         \
    "Usage: sluice " cmd " --job J --rank R [--epoch E] [--from P] [--count M] [--report] "        \
    "[options]\n"                                                                                  \
    "\n"                                                                                           \
    "Stream a rank's " what " for the job's current epoch (sluice.v1.Feed), starting at\n"         \
    "its last reported position. With --epoch E = current + 1 it waits until the\n"                \
    "epoch begins. --report reports the position reached when done. Text output\n"                 \
    "is " text "; --json prints " json ".\n"                                                       \
    "\n"                                                                                           \
    "Options:\n"

const sl_cli_cmd sl_cli_indices = {
    .name = "indices",
    .summary = "stream a rank's sample indices from the daemon",
    .max_args = 0,
    .opts = indices_table,
    .opts_size = sizeof(stream_opts),
    .init = stream_init,
    .run = indices_run,
    .head = STREAM_HEAD("indices", "sample indices", "one index per line",
                        "one JSON object {epoch, start, share_count, indices}"),
};

const sl_cli_cmd sl_cli_batches = {
    .name = "batches",
    .summary = "stream a rank's token-budget batches from the daemon",
    .max_args = 0,
    .opts = batches_table,
    .opts_size = sizeof(stream_opts),
    .init = stream_init,
    .run = batches_run,
    .head =
        STREAM_HEAD("batches", "token-budget batches",
                    "one line of space-separated indices per batch", "one JSON object per batch"),
};
