/* sluice ckpt: checkpoint shards (begin, upload, commit, abort, verify, ls, latest, show,
 * download, rm, retention, status). */
#include "cli.h"

#include "err.h"
#include "sluice_ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum {
    O_STEP = 2000,
    O_WORLD,
    O_META,
    O_RANK,
    O_DIR,
    O_JOBS,
    O_DEEP,
    O_STATE,
    O_RESUME,
    O_NO_VERIFY,
    O_CHUNK,
    O_OUTPUT,
    O_NO_PROGRESS,
    O_SHA
};

typedef struct opts {
    uint64_t step;
    int32_t world, rank;
    int have_rank;
    const char *meta, *dir, *output, *sha;
    int jobs, deep, state, resume, no_verify, no_progress;
    size_t chunk;
} opts;

typedef struct subcmd {
    const char *name;
    int (*run)(sl_cli *cli, sl_client *c, opts *o, int argc, char **argv);
    int min_args, max_args;
    const char *args, *allowed, *help;
} subcmd;

static int fail_call(const sl_cli *cli, const char *sub)
{
    fprintf(stderr, "sluice ckpt %s: %s (daemon %s)\n", sub, sl_client_error(), cli->addr);
    return SL_CLI_ERROR;
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

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

/* ---- progress ---- */

typedef struct progress {
    int tty;
    atomic_uint_fast64_t done;
    uint64_t total;
    double start, last;
    pthread_mutex_t mu;
} progress;

static void human(char *buf, size_t len, double v)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;

    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, len, "%.1f %s", v, units[u]);
}

static void progress_draw(progress *p, int final)
{
    char a[32], b[32], r[32];
    double t = now_s(), el = t - p->start;
    uint64_t done = atomic_load(&p->done);
    double rate = el > 0 ? (double)done / el : 0;

    if (!p->tty)
        return;
    pthread_mutex_lock(&p->mu);
    if (final || t - p->last >= 0.1) {
        p->last = t;
        human(a, sizeof(a), (double)done);
        human(b, sizeof(b), (double)p->total);
        human(r, sizeof(r), rate);
        fprintf(stderr, "\r%s / %s  %s/s  ETA %.0f s   ", a, b, r,
                rate > 0 ? (double)(p->total - done) / rate : 0.0);
        if (final)
            fputc('\n', stderr);
    }
    pthread_mutex_unlock(&p->mu);
}

typedef struct xfer {
    progress *p;
    uint64_t reported;
} xfer;

static void on_progress(uint64_t done, uint64_t total, void *arg)
{
    xfer *x = arg;

    atomic_fetch_add(&x->p->done, done - x->reported);
    x->reported = done;
    progress_draw(x->p, 0);
}

/* ---- subcommands ---- */

static int run_begin(sl_cli *cli, sl_client *c, opts *o, int argc, char **argv)
{
    sl_ckpt ck;

    if (o->world <= 0) {
        fprintf(stderr, "sluice ckpt begin: --world N is required\n");
        return SL_CLI_USAGE;
    }
    if (sl_ckpt_begin(c, &ck, argv[0], argc > 1 ? argv[1] : NULL, o->step, o->world, o->meta))
        return fail_call(cli, "begin");
    print_ckpt(cli, &ck, 1);
    return SL_CLI_OK;
}

static int run_ref(sl_cli *cli, sl_client *c, const char *sub, int commit, char **argv)
{
    sl_ckpt ck;
    int err =
        commit ? sl_ckpt_commit(c, &ck, argv[0], argv[1]) : sl_ckpt_abort(c, &ck, argv[0], argv[1]);

    if (err)
        return fail_call(cli, sub);
    print_ckpt(cli, &ck, 1);
    return SL_CLI_OK;
}

static int run_commit(sl_cli *cli, sl_client *c, opts *o, int argc, char **argv)
{
    return run_ref(cli, c, "commit", 1, argv);
}

static int run_abort(sl_cli *cli, sl_client *c, opts *o, int argc, char **argv)
{
    return run_ref(cli, c, "abort", 0, argv);
}

static int run_rm(sl_cli *cli, sl_client *c, opts *o, int argc, char **argv)
{
    if (sl_ckpt_delete(c, argv[0], argv[1]))
        return fail_call(cli, "rm");
    if (!cli->json)
        printf("deleted %s/%s\n", argv[0], argv[1]);
    else
        printf("{\"deleted\":true}\n");
    return SL_CLI_OK;
}

static int run_latest(sl_cli *cli, sl_client *c, opts *o, int argc, char **argv)
{
    sl_ckpt ck;

    if (sl_ckpt_latest(c, &ck, argv[0]))
        return fail_call(cli, "latest");
    if (cli->json)
        print_ckpt(cli, &ck, 1);
    else
        printf("%s\n", ck.name);
    return SL_CLI_OK;
}

static int run_ls(sl_cli *cli, sl_client *c, opts *o, int argc, char **argv)
{
    sl_ckpt *v = NULL;
    size_t n = 0;

    if (sl_ckpt_list(c, &v, &n, argc > 0 ? argv[0] : NULL, o->state))
        return fail_call(cli, "ls");
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

static int run_show(sl_cli *cli, sl_client *c, opts *o, int argc, char **argv)
{
    sl_ckpt_shard *sh = NULL;
    size_t n = 0;
    sl_ckpt ck;

    if (sl_ckpt_get(c, &ck, &sh, &n, argv[0], argv[1]))
        return fail_call(cli, "show");
    if (cli->json) {
        printf("{\"checkpoint\":");
        print_ckpt(cli, &ck, 0);
        printf(",\"shards\":[");
        for (size_t i = 0; i < n; i++)
            printf("%s{\"rank\":%d,\"data_size\":%" PRIu64 ",\"file_size\":%" PRIu64
                   ",\"sha256\":\"%s\",\"path\":",
                   i ? "," : "", sh[i].rank, sh[i].data_size, sh[i].file_size, sh[i].sha256),
                sl_cli_json_str(stdout, sh[i].path), printf(",\"tensors\":%u}", sh[i].tensor_count);
        printf("]}\n");
    } else {
        print_ckpt(cli, &ck, 1);
        if (ck.user_metadata[0])
            printf("metadata: %s\n", ck.user_metadata);
        for (size_t i = 0; i < n; i++)
            printf("  rank %-5d %14" PRIu64 " bytes  %s  %s\n", sh[i].rank, sh[i].data_size,
                   sh[i].sha256, sh[i].path);
    }
    free(sh);
    return SL_CLI_OK;
}

static int run_verify(sl_cli *cli, sl_client *c, opts *o, int argc, char **argv)
{
    sl_ckpt_verdict *v = NULL, meta;
    size_t n = 0;
    int ok = 0;

    if (sl_ckpt_verify(c, &ok, &v, &n, &meta, argv[0], argv[1], o->deep))
        return fail_call(cli, "verify");
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

static int run_retention(sl_cli *cli, sl_client *c, opts *o, int argc, char **argv)
{
    char *end;
    unsigned long k;
    size_t n = 0;

    errno = 0;
    k = strtoul(argv[1], &end, 10);
    if (errno || end == argv[1] || *end || argv[1][0] == '-' || k > UINT32_MAX) {
        fprintf(stderr, "sluice ckpt retention: KEEP '%s' is not a count\n", argv[1]);
        return SL_CLI_USAGE;
    }
    if (sl_ckpt_set_retention(c, argv[0], (uint32_t)k, &n))
        return fail_call(cli, "retention");
    if (cli->json)
        printf("{\"keep_last\":%lu,\"deleted\":%zu}\n", k, n);
    else
        printf("keep last %lu complete checkpoints of %s; %zu deleted now\n", k, argv[0], n);
    return SL_CLI_OK;
}

static int run_status(sl_cli *cli, sl_client *c, opts *o, int argc, char **argv)
{
    uint64_t held = 0;
    int running = 0, stored = 0;

    if (!o->have_rank) {
        fprintf(stderr, "sluice ckpt status: --rank R is required\n");
        return SL_CLI_USAGE;
    }
    if (sl_ckpt_upload_status(c, &held, &running, &stored, argv[0], argv[1], o->rank))
        return fail_call(cli, "status");
    if (cli->json)
        printf("{\"held_bytes\":%" PRIu64 ",\"in_progress\":%s,\"stored\":%s}\n", held,
               running ? "true" : "false", stored ? "true" : "false");
    else
        printf("held %" PRIu64 " bytes, %s, %s\n", held, running ? "upload running" : "idle",
               stored ? "stored" : "not stored");
    return SL_CLI_OK;
}

/* ---- upload ---- */

typedef struct item {
    char path[4096];
    int32_t rank;
    int rc;
    sl_ckpt_shard receipt;
    char error[5400];
} item;

typedef struct uploader {
    sl_cli *cli;
    sl_client *c;
    opts *o;
    const char *job, *name;
    item *items;
    size_t n;
    atomic_size_t next;
    progress prog;
} uploader;

static void upload_one(uploader *u, item *it)
{
    sl_ckpt_upload_opts uo;
    xfer x = {&u->prog, 0};
    struct stat st;
    int fd = open(it->path, O_RDONLY | O_CLOEXEC);

    memset(&uo, 0, sizeof(uo));
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(it->error, sizeof(it->error), "%s: %s", it->path, strerror(errno));
        it->rc = SL_CLI_ERROR;
        if (fd >= 0)
            close(fd);
        return;
    }
    uo.chunk_bytes = u->o->chunk;
    uo.resume = u->o->resume;
    uo.no_verify = u->o->no_verify;
    uo.sha256 = u->o->sha;
    uo.progress = on_progress;
    uo.arg = &x;
    if (sl_ckpt_upload_fd(u->c, &it->receipt, u->job, u->name, it->rank, fd, (uint64_t)st.st_size,
                          &uo) != 0) {
        snprintf(it->error, sizeof(it->error), "rank %d (%s): %s", it->rank, it->path,
                 sl_client_error());
        it->rc = SL_CLI_ERROR;
    }
    close(fd);
    if (u->cli->json)
        return;
    /* Text mode reports each shard as it completes, so a log shows the progress. */
    pthread_mutex_lock(&u->prog.mu);
    if (u->prog.tty)
        fputs("\r\033[K", stderr);
    if (it->rc)
        fprintf(stderr, "sluice ckpt upload: %s\n", it->error);
    else
        printf("rank %d: %" PRIu64 " bytes sha256 %s -> %s\n", it->rank, it->receipt.data_size,
               it->receipt.sha256, it->receipt.path);
    fflush(stdout);
    pthread_mutex_unlock(&u->prog.mu);
}

static void *upload_thread(void *arg)
{
    uploader *u = arg;
    size_t i;

    while ((i = atomic_fetch_add(&u->next, 1)) < u->n)
        upload_one(u, &u->items[i]);
    return NULL;
}

/* The rank of a file in a directory upload: the last run of digits of its name before the
 * extension ("model_shard_3.bin" -> 3, "rank_12" -> 12). Returns -1 if there is none. */
static long rank_of(const char *file)
{
    const char *dot = strrchr(file, '.');
    const char *end = dot && dot != file ? dot : file + strlen(file);
    const char *p = end;

    while (p > file && p[-1] >= '0' && p[-1] <= '9')
        p--;
    if (p == end || end - p > 6)
        return -1;
    return strtol(p, NULL, 10);
}

static int cmp_item(const void *a, const void *b)
{
    const item *x = a, *y = b;

    return (x->rank > y->rank) - (x->rank < y->rank);
}

static int run_upload(sl_cli *cli, sl_client *c, opts *o, int argc, char **argv)
{
    uploader u;
    pthread_t th[64];
    size_t cap = 0;
    int nt, rc = SL_CLI_OK;

    memset(&u, 0, sizeof(u));
    u.cli = cli;
    u.c = c;
    u.o = o;
    u.job = argv[0];
    u.name = argv[1];
    if (o->dir && argc == 2) {
        DIR *d = opendir(o->dir);
        struct dirent *e;
        if (!d)
            return sl_cli_fail("ckpt upload", "%s: %s", o->dir, strerror(errno));
        while ((e = readdir(d)) != NULL) {
            long r = e->d_name[0] == '.' ? -1 : rank_of(e->d_name);
            if (r < 0)
                continue;
            if (u.n == cap) {
                cap = cap ? cap * 2 : 16;
                u.items = realloc(u.items, cap * sizeof(*u.items));
                if (!u.items) {
                    closedir(d);
                    return sl_cli_fail("ckpt upload", "out of memory");
                }
            }
            memset(&u.items[u.n], 0, sizeof(u.items[0]));
            snprintf(u.items[u.n].path, sizeof(u.items[0].path), "%s/%s", o->dir, e->d_name);
            u.items[u.n].rank = (int32_t)r;
            u.n++;
        }
        closedir(d);
        qsort(u.items, u.n, sizeof(*u.items), cmp_item);
        for (size_t i = 1; i < u.n; i++) {
            if (u.items[i].rank == u.items[i - 1].rank) {
                rc = sl_cli_fail("ckpt upload", "%s and %s both look like rank %d",
                                 u.items[i - 1].path, u.items[i].path, u.items[i].rank);
                goto out;
            }
        }
        if (u.n == 0) {
            rc = sl_cli_fail("ckpt upload", "no file with a rank number in %s", o->dir);
            goto out;
        }
    } else if (argc == 3 && !o->dir && o->have_rank) {
        u.items = calloc(1, sizeof(*u.items));
        if (!u.items)
            return sl_cli_fail("ckpt upload", "out of memory");
        snprintf(u.items[0].path, sizeof(u.items[0].path), "%s", argv[2]);
        u.items[0].rank = o->rank;
        u.n = 1;
    } else {
        fprintf(stderr, "sluice ckpt upload: give FILE with --rank R, or --dir DIR\n");
        return SL_CLI_USAGE;
    }
    for (size_t i = 0; i < u.n; i++) {
        struct stat st;
        if (stat(u.items[i].path, &st) == 0)
            u.prog.total += (uint64_t)st.st_size;
    }
    u.prog.tty = !o->no_progress && !cli->json && isatty(STDERR_FILENO);
    u.prog.start = now_s();
    pthread_mutex_init(&u.prog.mu, NULL);
    nt = o->jobs > 0 ? o->jobs : 4;
    if ((size_t)nt > u.n)
        nt = (int)u.n;
    for (int i = 0; i < nt; i++)
        pthread_create(&th[i], NULL, upload_thread, &u);
    for (int i = 0; i < nt; i++)
        pthread_join(th[i], NULL);
    progress_draw(&u.prog, 1);
    pthread_mutex_destroy(&u.prog.mu);
    if (cli->json)
        printf("[");
    for (size_t i = 0, shown = 0; i < u.n; i++) {
        item *it = &u.items[i];
        if (it->rc) {
            if (cli->json)
                fprintf(stderr, "sluice ckpt upload: %s\n", it->error);
            rc = SL_CLI_ERROR;
            continue;
        }
        if (cli->json)
            printf("%s{\"rank\":%d,\"data_size\":%" PRIu64 ",\"sha256\":\"%s\",\"path\":",
                   shown++ ? "," : "", it->rank, it->receipt.data_size, it->receipt.sha256),
                sl_cli_json_str(stdout, it->receipt.path), printf("}");
    }
    if (cli->json)
        printf("]\n");
    if (!cli->json && rc == SL_CLI_OK && u.n > 1) {
        double el = now_s() - u.prog.start;
        printf("%zu shards, %" PRIu64 " bytes in %.2f s (%.1f MiB/s)\n", u.n, u.prog.total, el,
               el > 0 ? (double)u.prog.total / el / 1048576.0 : 0.0);
    }
out:
    free(u.items);
    return rc;
}

/* ---- download ---- */

static int download_one(const sl_cli *cli, sl_client *c, const opts *o, const char *job,
                        const char *name, int32_t rank, const char *path, progress *p)
{
    char tmp[4200], sha[65];
    xfer x = {p, 0};
    int fd, err;

    snprintf(tmp, sizeof(tmp), "%s.part", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return sl_cli_fail("ckpt download", "%s: %s", tmp, strerror(errno));
    err = sl_ckpt_download_fd(c, sha, job, name, rank, fd, on_progress, &x);
    if (close(fd) != 0 && !err)
        err = -errno;
    if (err) {
        unlink(tmp);
        return fail_call(cli, "download");
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return sl_cli_fail("ckpt download", "%s: %s", path, strerror(errno));
    }
    if (cli->json)
        printf("{\"rank\":%d,\"sha256\":\"%s\",\"path\":", rank, sha),
            sl_cli_json_str(stdout, path), printf("}\n");
    else
        printf("rank %d: sha256 %s -> %s\n", rank, sha, path);
    return SL_CLI_OK;
}

static int run_download(sl_cli *cli, sl_client *c, opts *o, int argc, char **argv)
{
    progress p;
    sl_ckpt ck;
    char path[4200];
    int rc = SL_CLI_OK;

    memset(&p, 0, sizeof(p));
    pthread_mutex_init(&p.mu, NULL);
    p.tty = !o->no_progress && !cli->json && isatty(STDERR_FILENO);
    p.start = now_s();
    if (o->have_rank && o->output) {
        rc = download_one(cli, c, o, argv[0], argv[1], o->rank, o->output, &p);
    } else if (o->dir) {
        if (sl_ckpt_get(c, &ck, NULL, NULL, argv[0], argv[1])) {
            rc = fail_call(cli, "download");
            goto out;
        }
        p.total = ck.total_bytes;
        for (int32_t r = 0; r < ck.world_size && rc == SL_CLI_OK; r++) {
            snprintf(path, sizeof(path), "%s/rank_%d.bin", o->dir, r);
            rc = download_one(cli, c, o, argv[0], argv[1], r, path, &p);
        }
    } else {
        fprintf(stderr, "sluice ckpt download: give --rank R -o FILE, or --dir DIR\n");
        rc = SL_CLI_USAGE;
    }
    progress_draw(&p, 1);
out:
    pthread_mutex_destroy(&p.mu);
    return rc;
}

/* ---- dispatch ---- */

static const subcmd subs[] = {
    {"begin", run_begin, 1, 2, "JOB [NAME]", "swmt",
     "Create a checkpoint in state WRITING (idempotent). NAME defaults to step_<STEP>.\n"
     "  --step N           training step (default 0)\n"
     "  --world N          number of ranks (required)\n"
     "  --metadata TEXT    opaque user metadata (e.g. JSON), at most 8 KiB\n"},
    {"upload", run_upload, 2, 3, "JOB NAME [FILE]", "rdjRVcSP",
     "Upload shard data: FILE as --rank R, or every file of --dir DIR in parallel, its rank\n"
     "being the last number in its name (rank_3.bin, model_shard_3.pt). The data is hashed\n"
     "locally while sent and compared with the daemon's receipt.\n"
     "  --rank R           rank of FILE\n"
     "  --dir DIR          upload a directory of shards\n"
     "  -j, --jobs N       parallel uploads (default 4)\n"
     "  --resume           continue interrupted uploads from what the daemon holds\n"
     "  --no-verify        do not hash locally\n"
     "  --sha256 HEX       expected checksum of FILE, checked by the daemon\n"
     "  --chunk-size N     bytes per message (default 1 MiB, at most 4 MiB)\n"
     "  --no-progress      no progress bar (it is shown only on a terminal)\n"},
    {"commit", run_commit, 2, 2, "JOB NAME", "",
     "Mark the checkpoint COMPLETE once every rank has a durable shard.\n"},
    {"abort", run_abort, 2, 2, "JOB NAME", "",
     "Mark a WRITING checkpoint INCOMPLETE and remove its files.\n"},
    {"verify", run_verify, 2, 2, "JOB NAME", "e",
     "Check the files: size, header, metadata.json; with --deep also re-hash every shard.\n"
     "Exits 1 if anything is wrong.\n"
     "  --deep             re-hash the data of every shard\n"},
    {"ls", run_ls, 0, 1, "[JOB]", "a",
     "List checkpoints (of JOB, or all), newest first.\n"
     "  --state S          WRITING, COMPLETE or INCOMPLETE\n"},
    {"latest", run_latest, 1, 1, "JOB", "", "Print the newest COMPLETE checkpoint of JOB.\n"},
    {"show", run_show, 2, 2, "JOB NAME", "", "Show a checkpoint and its shards.\n"},
    {"download", run_download, 2, 2, "JOB NAME", "rodP",
     "Download shard data (checked against its SHA-256): --rank R -o FILE, or every rank\n"
     "into --dir DIR as rank_<R>.bin.\n"
     "  --rank R -o FILE   one rank\n"
     "  --dir DIR          all ranks\n"
     "  --no-progress      no progress bar\n"},
    {"rm", run_rm, 2, 2, "JOB NAME", "", "Delete a checkpoint that is not being written.\n"},
    {"retention", run_retention, 2, 2, "JOB KEEP", "",
     "Keep the last KEEP complete checkpoints of JOB (0 keeps all); applied now and at every\n"
     "commit. The newest complete one and those being written are never deleted.\n"},
    {"status", run_status, 2, 2, "JOB NAME", "r",
     "How much of an interrupted upload of --rank R the daemon holds.\n"
     "  --rank R           the rank\n"},
};

#define N_SUBS (sizeof(subs) / sizeof(subs[0]))

/* Option letters in `allowed`: s step, w world, m metadata, t (unused), r rank, d dir, j jobs,
 * R resume, V no-verify, c chunk, S sha256, P no-progress, e deep, a state, o output. */
static const struct {
    int id;
    char letter;
} opt_letters[] = {
    {O_STEP, 's'},      {O_WORLD, 'w'}, {O_META, 'm'},   {O_RANK, 'r'},
    {O_DIR, 'd'},       {O_JOBS, 'j'},  {'j', 'j'},      {O_RESUME, 'R'},
    {O_NO_VERIFY, 'V'}, {O_CHUNK, 'c'}, {O_SHA, 'S'},    {O_NO_PROGRESS, 'P'},
    {O_DEEP, 'e'},      {O_STATE, 'a'}, {O_OUTPUT, 'o'}, {'o', 'o'},
};

static void ckpt_usage(FILE *f)
{
    fprintf(f, "Usage: sluice ckpt <subcommand> [options] ARGS\n\nCheckpoint shards "
               "(sluice.v1.Checkpoints).\n\nSubcommands:\n");
    for (size_t i = 0; i < N_SUBS; i++)
        fprintf(f, "  %-10s %s\n", subs[i].name, subs[i].args);
    fprintf(f, "\n'sluice ckpt <subcommand> --help' describes one. Exit codes: 0 ok, 1 error, "
               "2 usage.\n");
}

static int parse_u64(uint64_t *out, const char *s, uint64_t max)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-' || v > max)
        return -1;
    *out = v;
    return 0;
}

int cmd_ckpt(sl_cli *cli, int argc, char **argv)
{
    static const struct option lopts[] = {
        SL_CLI_COMMON_OPTS,
        {"step", required_argument, NULL, O_STEP},
        {"world", required_argument, NULL, O_WORLD},
        {"metadata", required_argument, NULL, O_META},
        {"rank", required_argument, NULL, O_RANK},
        {"dir", required_argument, NULL, O_DIR},
        {"jobs", required_argument, NULL, O_JOBS},
        {"deep", no_argument, NULL, O_DEEP},
        {"state", required_argument, NULL, O_STATE},
        {"resume", no_argument, NULL, O_RESUME},
        {"no-verify", no_argument, NULL, O_NO_VERIFY},
        {"chunk-size", required_argument, NULL, O_CHUNK},
        {"output", required_argument, NULL, O_OUTPUT},
        {"no-progress", no_argument, NULL, O_NO_PROGRESS},
        {"sha256", required_argument, NULL, O_SHA},
        {NULL, 0, NULL, 0},
    };
    const subcmd *sb = NULL;
    sl_client *c = NULL;
    opts o;
    uint64_t v;
    int ch, r;

    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        ckpt_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? SL_CLI_USAGE : SL_CLI_OK;
    }
    for (size_t i = 0; i < N_SUBS; i++)
        if (strcmp(argv[1], subs[i].name) == 0)
            sb = &subs[i];
    if (!sb) {
        fprintf(stderr, "sluice ckpt: unknown subcommand '%s'\nTry 'sluice ckpt --help'.\n",
                argv[1]);
        return SL_CLI_USAGE;
    }
    memset(&o, 0, sizeof(o));
    argc--;
    argv++;
    /* 0, not 1: GNU getopt re-initialises only then, and main's "+" (stop at the first
     * argument) would otherwise stay in force, so options after JOB were not parsed. */
    optind = 0;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, ":hj:o:", lopts, NULL)) != -1) {
        char letter = 0;
        if (ch == 'h') {
            printf("Usage: sluice ckpt %s [options] %s\n\n%s\nOptions:\n" SL_CLI_COMMON_HELP,
                   sb->name, sb->args, sb->help);
            return SL_CLI_OK;
        }
        if (ch == '?' || ch == ':')
            return sl_cli_bad_opt("ckpt", ch, argv);
        if ((r = sl_cli_common_opt(cli, "ckpt", ch, optarg)) == 0)
            continue;
        if (r != 1)
            return SL_CLI_USAGE;
        for (size_t i = 0; i < sizeof(opt_letters) / sizeof(opt_letters[0]); i++)
            if (opt_letters[i].id == ch)
                letter = opt_letters[i].letter;
        if (!letter || !strchr(sb->allowed, letter)) {
            fprintf(stderr, "sluice ckpt %s: option '%s' does not apply\n", sb->name,
                    argv[optind - 1]);
            return SL_CLI_USAGE;
        }
        switch (ch) {
        case O_STEP:
            if (parse_u64(&o.step, optarg, INT64_MAX))
                goto bad_value;
            break;
        case O_WORLD:
        case O_RANK:
        case O_JOBS:
        case 'j':
            if (parse_u64(&v, optarg, ch == O_JOBS || ch == 'j' ? 64 : 65536))
                goto bad_value;
            if (ch == O_WORLD)
                o.world = (int32_t)v;
            else if (ch == O_RANK)
                o.rank = (int32_t)v, o.have_rank = 1;
            else
                o.jobs = (int)v;
            break;
        case O_CHUNK:
            if (parse_u64(&v, optarg, 4u << 20) || v == 0)
                goto bad_value;
            o.chunk = (size_t)v;
            break;
        case O_META:
            o.meta = optarg;
            break;
        case O_DIR:
            o.dir = optarg;
            break;
        case O_OUTPUT:
        case 'o':
            o.output = optarg;
            break;
        case O_SHA:
            o.sha = optarg;
            break;
        case O_DEEP:
            o.deep = 1;
            break;
        case O_RESUME:
            o.resume = 1;
            break;
        case O_NO_VERIFY:
            o.no_verify = 1;
            break;
        case O_NO_PROGRESS:
            o.no_progress = 1;
            break;
        case O_STATE:
            if (strcmp(optarg, "WRITING") == 0 || strcmp(optarg, "writing") == 0)
                o.state = SL_CKPT_STATE_WRITING;
            else if (strcmp(optarg, "COMPLETE") == 0 || strcmp(optarg, "complete") == 0)
                o.state = SL_CKPT_STATE_COMPLETE;
            else if (strcmp(optarg, "INCOMPLETE") == 0 || strcmp(optarg, "incomplete") == 0)
                o.state = SL_CKPT_STATE_INCOMPLETE;
            else
                goto bad_value;
            break;
        default:
            goto bad_value;
        }
        continue;
    bad_value:
        fprintf(stderr, "sluice ckpt %s: bad value '%s' for %s\n", sb->name, optarg,
                argv[optind - 1]);
        return SL_CLI_USAGE;
    }
    if (argc - optind < sb->min_args || argc - optind > sb->max_args) {
        fprintf(stderr, "Usage: sluice ckpt %s [options] %s\nTry 'sluice ckpt %s --help'.\n",
                sb->name, sb->args, sb->name);
        return SL_CLI_USAGE;
    }
    if ((r = sl_cli_connect(&c, cli, "ckpt")) != 0)
        return r;
    r = sb->run(cli, c, &o, argc - optind, argv + optind);
    sl_client_close(c);
    return r;
}
