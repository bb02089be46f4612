/* sluice ckpt: checkpoint shards (begin, upload, commit, abort, verify, ls, latest, show,
 * download, rm, retention, restore, status). The family, its options and the subcommands that only
 * call the daemon; upload and download are in ckpt_xfer.c. */
#include "ckpt.h"

#include "err.h"
#include "opt.h"
#include "sluice_ckpt.h"
#include "util/num.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static void print_ckpt(const sl_cli *cli, const sl_ckpt *c, int last)
{
    if (cli->json) {
        printf("{\"job\":");
        sl_cli_json_str(stdout, c->job);
        printf(",\"name\":");
        sl_cli_json_str(stdout, c->name);
        printf(",\"step\":%" PRIu64 ",\"world_size\":%d,\"state\":\"%s\",\"shards_uploaded\":%u,"
               "\"total_bytes\":%" PRIu64 ",\"created_at_ms\":%" PRId64
               ",\"committed_at_ms\":%" PRId64 ",\"user_metadata\":",
               c->step, c->world_size, sl_ckpt_state_name(c->state), c->shards_uploaded,
               c->total_bytes, c->created_ms, c->committed_ms);
        sl_cli_json_str(stdout, c->user_metadata);
        printf("}%s", last ? "\n" : "");
    } else {
        printf("%-16s %-24s %-10s step %-8" PRIu64 " shards %u/%d  %" PRIu64 " bytes\n", c->job,
               c->name, sl_ckpt_state_name(c->state), c->step, c->shards_uploaded, c->world_size,
               c->total_bytes);
    }
}

/* The feed state's JSON members, without the braces. */
static void json_feed_state(const sl_ckpt_feed_state *fs)
{
    printf("\"feed_job\":");
    sl_cli_json_str(stdout, fs->job);
    printf(",\"epoch\":%" PRIu64 ",\"world_size\":%u,\"unit\":\"%s\",\"samples\":%" PRIu64
           ",\"elastic\":%s,\"positions\":[",
           fs->epoch, fs->world_size, fs->unit, fs->samples, fs->elastic ? "true" : "false");
    for (size_t i = 0; i < fs->n_positions; i++)
        printf("%s%" PRIu64, i ? "," : "", fs->positions[i]);
    printf("]");
}

static void print_feed_state(const sl_cli *cli, const sl_ckpt_feed_state *fs, uint64_t epoch_now,
                             uint32_t world_now, int restored)
{
    if (cli->json) {
        printf("{");
        json_feed_state(fs);
        if (restored)
            printf(",\"job_epoch\":%" PRIu64 ",\"job_world_size\":%u", epoch_now, world_now);
        printf("}\n");
        return;
    }
    printf("feed job %s: epoch %" PRIu64 ", world %u%s, positions (%s per dp rank):", fs->job,
           fs->epoch, fs->world_size, fs->elastic ? " (resized mid-epoch)" : "", fs->unit);
    for (size_t i = 0; i < fs->n_positions && i < 64; i++)
        printf(" %" PRIu64, fs->positions[i]);
    printf("%s\n", fs->n_positions > 64 ? " ..." : "");
    if (restored)
        printf("restored: job %s is in epoch %" PRIu64 " with world %u\n", fs->job, epoch_now,
               world_now);
}

/* ---- subcommands ---- */

static int run_begin(sl_cli *cli, sl_client *c, void *opts, int argc, char **argv)
{
    const ckpt_opts *o = opts;
    sl_ckpt_begin_opts bo = SL_CKPT_BEGIN_OPTS_INIT;
    sl_ckpt ck;

    if (o->world <= 0) {
        fprintf(stderr, "sluice ckpt begin: --world N is required\n");
        return SL_CLI_USAGE;
    }
    bo.feed_job = o->feed_job;
    bo.no_feed = o->no_feed;
    bo.auto_commit = o->auto_commit;
    if (sl_ckpt_begin_ex(c, &ck, argv[0], argc > 1 ? argv[1] : NULL, o->step, o->world, o->meta,
                         &bo))
        return sl_cli_call_fail(cli, "ckpt begin");
    print_ckpt(cli, &ck, 1);
    return SL_CLI_OK;
}

static int run_ref(sl_cli *cli, sl_client *c, const char *sub, int commit, char **argv)
{
    sl_ckpt ck;
    int err =
        commit ? sl_ckpt_commit(c, &ck, argv[0], argv[1]) : sl_ckpt_abort(c, &ck, argv[0], argv[1]);

    if (err)
        return sl_cli_call_fail(cli, sub);
    print_ckpt(cli, &ck, 1);
    return SL_CLI_OK;
}

static int run_commit(sl_cli *cli, sl_client *c, void *o, int argc, char **argv)
{
    return run_ref(cli, c, "ckpt commit", 1, argv);
}

static int run_abort(sl_cli *cli, sl_client *c, void *o, int argc, char **argv)
{
    return run_ref(cli, c, "ckpt abort", 0, argv);
}

static int run_rm(sl_cli *cli, sl_client *c, void *o, int argc, char **argv)
{
    if (sl_ckpt_delete(c, argv[0], argv[1]))
        return sl_cli_call_fail(cli, "ckpt rm");
    if (!cli->json)
        printf("deleted %s/%s\n", argv[0], argv[1]);
    else
        printf("{\"deleted\":true}\n");
    return SL_CLI_OK;
}

static int run_latest(sl_cli *cli, sl_client *c, void *o, int argc, char **argv)
{
    sl_ckpt ck;

    if (sl_ckpt_latest(c, &ck, argv[0]))
        return sl_cli_call_fail(cli, "ckpt latest");
    if (cli->json)
        print_ckpt(cli, &ck, 1);
    else
        printf("%s\n", ck.name);
    return SL_CLI_OK;
}

static int run_ls(sl_cli *cli, sl_client *c, void *opts, int argc, char **argv)
{
    const ckpt_opts *o = opts;
    sl_ckpt *v = NULL;
    size_t n = 0;

    if (sl_ckpt_list(c, &v, &n, argc > 0 ? argv[0] : NULL, o->state))
        return sl_cli_call_fail(cli, "ckpt ls");
    if (cli->json)
        printf("[");
    for (size_t i = 0; i < n; i++) {
        if (cli->json && i)
            printf(",");
        print_ckpt(cli, &v[i], 0);
    }
    if (cli->json)
        printf("]\n");
    free(v);
    return SL_CLI_OK;
}

static int run_show(sl_cli *cli, sl_client *c, void *o, int argc, char **argv)
{
    sl_ckpt_shard *sh = NULL;
    sl_ckpt_feed_state fs;
    size_t n = 0;
    sl_ckpt ck;
    int have_fs;

    if (sl_ckpt_get(c, &ck, &sh, &n, argv[0], argv[1]))
        return sl_cli_call_fail(cli, "ckpt show");
    /* The data position of a COMPLETE checkpoint bound to a feed job (FAILED_PRECONDITION for
     * one without: not an error here). */
    have_fs =
        ck.state == SL_CKPT_STATE_COMPLETE && sl_ckpt_feed_state_get(c, &fs, argv[0], argv[1]) == 0;
    if (cli->json) {
        printf("{\"checkpoint\":");
        print_ckpt(cli, &ck, 0);
        printf(",\"shards\":[");
        for (size_t i = 0; i < n; i++) {
            printf("%s{\"rank\":%d,\"data_size\":%" PRIu64 ",\"file_size\":%" PRIu64
                   ",\"sha256\":\"%s\",\"path\":",
                   i ? "," : "", sh[i].rank, sh[i].data_size, sh[i].file_size, sh[i].sha256);
            sl_cli_json_str(stdout, sh[i].path);
            printf(",\"tensors\":%u}", sh[i].tensor_count);
        }
        printf("],\"feed_state\":");
        if (have_fs) {
            printf("{");
            json_feed_state(&fs);
            printf("}");
        } else {
            printf("null");
        }
        printf("}\n");
    } else {
        print_ckpt(cli, &ck, 1);
        if (ck.user_metadata[0])
            printf("metadata: %s\n", ck.user_metadata);
        if (have_fs)
            print_feed_state(cli, &fs, 0, 0, 0);
        for (size_t i = 0; i < n; i++)
            printf("  rank %-5d %14" PRIu64 " bytes  %s  %s\n", sh[i].rank, sh[i].data_size,
                   sh[i].sha256, sh[i].path);
    }
    if (have_fs)
        free(fs.positions);
    free(sh);
    return SL_CLI_OK;
}

static int run_restore(sl_cli *cli, sl_client *c, void *opts, int argc, char **argv)
{
    const ckpt_opts *o = opts;
    sl_ckpt_feed_state fs;
    uint64_t epoch = 0;
    uint32_t world = 0;

    if (sl_ckpt_restore(c, &fs, &epoch, &world, argv[0], argv[1], (uint32_t)o->world))
        return sl_cli_call_fail(cli, "ckpt restore");
    print_feed_state(cli, &fs, epoch, world, 1);
    free(fs.positions);
    return SL_CLI_OK;
}

static int run_verify(sl_cli *cli, sl_client *c, void *opts, int argc, char **argv)
{
    const ckpt_opts *o = opts;
    sl_ckpt_verdict *v = NULL, meta;
    size_t n = 0;
    int ok = 0;

    if (sl_ckpt_verify(c, &ok, &v, &n, &meta, argv[0], argv[1], o->deep))
        return sl_cli_call_fail(cli, "ckpt verify");
    if (cli->json) {
        printf("{\"ok\":%s,\"mode\":\"%s\",\"metadata\":\"%s\",\"shards\":[", ok ? "true" : "false",
               o->deep ? "deep" : "quick", sl_ckpt_verdict_name(meta.verdict));
        for (size_t i = 0; i < n; i++) {
            printf("%s{\"rank\":%d,\"verdict\":\"%s\",\"detail\":", i ? "," : "", v[i].rank,
                   sl_ckpt_verdict_name(v[i].verdict));
            sl_cli_json_str(stdout, v[i].detail);
            printf("}");
        }
        printf("]}\n");
    } else {
        for (size_t i = 0; i < n; i++)
            if (v[i].verdict != SL_CKPT_OK)
                printf("rank %d: %s %s\n", v[i].rank, sl_ckpt_verdict_name(v[i].verdict),
                       v[i].detail);
        if (meta.verdict && meta.verdict != SL_CKPT_OK)
            printf("metadata: %s %s\n", sl_ckpt_verdict_name(meta.verdict), meta.detail);
        printf("%s (%s, %zu shards)\n", ok ? "OK" : "FAILED", o->deep ? "deep" : "quick", n);
    }
    free(v);
    return ok ? SL_CLI_OK : SL_CLI_ERROR;
}

static int run_retention(sl_cli *cli, sl_client *c, void *o, int argc, char **argv)
{
    uint64_t k;
    size_t n = 0;

    if (sl_parse_u64(&k, argv[1], 0, UINT32_MAX) != 0) {
        fprintf(stderr, "sluice ckpt retention: KEEP '%s' is not a count\n", argv[1]);
        return SL_CLI_USAGE;
    }
    if (sl_ckpt_set_retention(c, argv[0], (uint32_t)k, &n))
        return sl_cli_call_fail(cli, "ckpt retention");
    if (cli->json)
        printf("{\"keep_last\":%" PRIu64 ",\"deleted\":%zu}\n", k, n);
    else
        printf("keep last %" PRIu64 " complete checkpoints of %s; %zu deleted now\n", k, argv[0],
               n);
    return SL_CLI_OK;
}

static int run_status(sl_cli *cli, sl_client *c, void *opts, int argc, char **argv)
{
    const ckpt_opts *o = opts;
    uint64_t held = 0;
    int running = 0, stored = 0;

    if (!o->have_rank) {
        fprintf(stderr, "sluice ckpt status: --rank R is required\n");
        return SL_CLI_USAGE;
    }
    if (sl_ckpt_upload_status(c, &held, &running, &stored, argv[0], argv[1], o->rank))
        return sl_cli_call_fail(cli, "ckpt status");
    if (cli->json)
        printf("{\"held_bytes\":%" PRIu64 ",\"in_progress\":%s,\"stored\":%s}\n", held,
               running ? "true" : "false", stored ? "true" : "false");
    else
        printf("held %" PRIu64 " bytes, %s, %s\n", held, running ? "upload running" : "idle",
               stored ? "stored" : "not stored");
    return SL_CLI_OK;
}

/* ---- options ---- */

static const sl_cli_choice states[] = {
    {"WRITING", SL_CKPT_STATE_WRITING},
    {"writing", SL_CKPT_STATE_WRITING},
    {"COMPLETE", SL_CKPT_STATE_COMPLETE},
    {"complete", SL_CKPT_STATE_COMPLETE},
    {"INCOMPLETE", SL_CKPT_STATE_INCOMPLETE},
    {"incomplete", SL_CKPT_STATE_INCOMPLETE},
    {NULL, 0},
};

#define AT(f) SL_CLI_AT(ckpt_opts, f)
#define RANK(help)                                                                                 \
    {                                                                                              \
        "rank", SL_CLI_U64, "R", help, AT(rank), SL_CLI_SEEN(ckpt_opts, have_rank),                \
            .max = CKPT_MAX_RANKS                                                                  \
    }
#define DIR_OPT(help)                                                                              \
    {                                                                                              \
        "dir", SL_CLI_STR, "DIR", help, AT(dir)                                                    \
    }
#define NO_PROGRESS(help)                                                                          \
    {                                                                                              \
        "no-progress", SL_CLI_FLAG, NULL, help, AT(no_progress)                                    \
    }

static const sl_cli_opt begin_opts[] = {
    {"step", SL_CLI_U64, "N", "training step (default 0)", AT(step), .max = INT64_MAX},
    {"world", SL_CLI_U64, "N", "number of ranks (required)", AT(world), .max = CKPT_MAX_RANKS},
    {"metadata", SL_CLI_STR, "TEXT", "opaque user metadata (e.g. JSON), at most 8 KiB", AT(meta)},
    {"feed-job", SL_CLI_STR, "JOB",
     "carry the data position of this feed job (default: the feed "
     "job named like JOB, if any)",
     AT(feed_job)},
    {"no-feed", SL_CLI_FLAG, NULL, "carry no data position", AT(no_feed)},
    {"auto-commit", SL_CLI_FLAG, NULL, "the daemon commits once every rank's shard is durable",
     AT(auto_commit)},
    SL_CLI_OPTS_END,
};

static const sl_cli_opt restore_opts[] = {
    {"world", SL_CLI_U64, "N", "restore into N ranks (default: the checkpoint's world)", AT(world),
     .max = CKPT_MAX_RANKS},
    SL_CLI_OPTS_END,
};

static const sl_cli_opt upload_opts[] = {
    RANK("rank of FILE"),
    DIR_OPT("upload a directory of shards"),
    {"jobs", SL_CLI_U64, "N", "parallel uploads (default 4)", .letter = 'j', AT(jobs), .max = 64},
    {"resume", SL_CLI_FLAG, NULL, "continue interrupted uploads from what the daemon holds",
     AT(resume)},
    {"no-verify", SL_CLI_FLAG, NULL, "do not hash locally", AT(no_verify)},
    {"sha256", SL_CLI_STR, "HEX", "expected checksum of FILE, checked by the daemon", AT(sha)},
    {"chunk-size", SL_CLI_U64, "N", "bytes per message (default 1 MiB, at most 4 MiB)", AT(chunk),
     .min = 1, .max = 4u << 20},
    NO_PROGRESS("no progress bar (it is shown only on a terminal)"),
    SL_CLI_OPTS_END,
};

static const sl_cli_opt verify_opts[] = {
    {"deep", SL_CLI_FLAG, NULL, "re-hash the data of every shard", AT(deep)},
    SL_CLI_OPTS_END,
};

static const sl_cli_opt ls_opts[] = {
    {"state", SL_CLI_ENUM, "S", "WRITING, COMPLETE or INCOMPLETE", AT(state), .choices = states},
    SL_CLI_OPTS_END,
};

static const sl_cli_opt download_opts[] = {
    SL_CLI_ROW("--rank R -o FILE", "one rank"),
    RANK(NULL),
    {"output", SL_CLI_STR, "FILE", NULL, .letter = 'o', AT(output)},
    {"offset", SL_CLI_U64, "N", "with --rank: data bytes from N on (default 0)", AT(offset),
     SL_CLI_SEEN(ckpt_opts, have_range), .max = INT64_MAX},
    {"length", SL_CLI_U64, "N", "with --rank: N data bytes (default: to the end)", AT(length),
     SL_CLI_SEEN(ckpt_opts, have_range), .max = INT64_MAX},
    DIR_OPT("all ranks"),
    NO_PROGRESS("no progress bar"),
    SL_CLI_OPTS_END,
};

static const sl_cli_opt status_opts[] = {
    RANK("the rank"),
    SL_CLI_OPTS_END,
};

/* ---- the family ---- */

#define SUB(name_, run_, min_, max_, args_, opts_, head_)                                          \
    {                                                                                              \
        .name = name_, .run = run_, .min_args = min_, .max_args = max_, .args = args_,             \
        .opts = opts_, .opts_size = sizeof(ckpt_opts), .head = head_, .mid = "\nOptions:\n"        \
    }

static const sl_cli_cmd subs[] = {
    SUB("begin", run_begin, 1, 2, "JOB [NAME]", begin_opts,
        "Create a checkpoint in state WRITING (idempotent). NAME defaults to step_<STEP>.\n"),
    SUB("upload", ckpt_upload, 2, 3, "JOB NAME [FILE]", upload_opts,
        "Upload shard data: FILE as --rank R, or every file of --dir DIR in parallel, its rank\n"
        "being the last number in its name (rank_3.bin, model_shard_3.pt). The data is hashed\n"
        "locally while sent and compared with the daemon's receipt.\n"),
    SUB("commit", run_commit, 2, 2, "JOB NAME", NULL,
        "Mark the checkpoint COMPLETE once every rank has a durable shard.\n"),
    SUB("abort", run_abort, 2, 2, "JOB NAME", NULL,
        "Mark a WRITING checkpoint INCOMPLETE and remove its files.\n"),
    SUB("verify", run_verify, 2, 2, "JOB NAME", verify_opts,
        "Check the files: size, header, metadata.json; with --deep also re-hash every shard.\n"
        "Exits 1 if anything is wrong.\n"),
    SUB("ls", run_ls, 0, 1, "[JOB]", ls_opts, "List checkpoints (of JOB, or all), newest first.\n"),
    SUB("latest", run_latest, 1, 1, "JOB", NULL, "Print the newest COMPLETE checkpoint of JOB.\n"),
    SUB("show", run_show, 2, 2, "JOB NAME", NULL, "Show a checkpoint and its shards.\n"),
    SUB("download", ckpt_download, 2, 2, "JOB NAME", download_opts,
        "Download shard data (checked against its SHA-256): --rank R -o FILE, or every rank\n"
        "into --dir DIR as rank_<R>.bin. --offset/--length: a range of the rank's data, each\n"
        "block it comes from checked by the daemon against its digest.\n"),
    SUB("rm", run_rm, 2, 2, "JOB NAME", NULL, "Delete a checkpoint that is not being written.\n"),
    SUB("retention", run_retention, 2, 2, "JOB KEEP", NULL,
        "Keep the last KEEP complete checkpoints of JOB (0 keeps all); applied now and at every\n"
        "commit. The newest complete one and those being written are never deleted.\n"),
    SUB("restore", run_restore, 2, 2, "JOB NAME", restore_opts,
        "Rewind the checkpoint's feed job to the data position the checkpoint was taken at\n"
        "(epoch, world, every dp rank's position); later progress is discarded and open streams\n"
        "of the job end (ABORTED) and reopen there. --world N resizes into N ranks.\n"),
    SUB("status", run_status, 2, 2, "JOB NAME", status_opts,
        "How much of an interrupted upload of --rank R the daemon holds.\n"),
};

const sl_cli_cmd sl_cli_ckpt = {
    .name = "ckpt",
    .summary = "checkpoint shards: begin, upload, commit, verify, ls, download, ...",
    .subs = subs,
    .n_subs = sizeof(subs) / sizeof(subs[0]),
    .flags = SL_CLI_CONNECT | SL_CLI_TERSE,
    .head = "Usage: sluice ckpt <subcommand> [options] ARGS\n\nCheckpoint shards "
            "(sluice.v1.Checkpoints).\n\nSubcommands:\n",
    .tail = "\n'sluice ckpt <subcommand> --help' describes one. Exit codes: 0 ok, 1 error, "
            "2 usage.\n",
};
