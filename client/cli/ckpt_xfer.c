/* sluice ckpt upload and download: shard data between files and the daemon, with a progress
 * line on a terminal. Uploads of several ranks run in parallel threads over one client. */
#include "ckpt.h"

#include "err.h"
#include "sluice_ckpt.h"
#include "util/buf.h"
#include "util/clock.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static double now_s(void)
{
    return (double)sl_mono_ns() / 1e9;
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

/* Redraw the progress line (at most every 0.1 s unless final). Thread-safe. */
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

static void progress_init(progress *p, const sl_cli *cli, const ckpt_opts *o)
{
    memset(p, 0, sizeof(*p));
    pthread_mutex_init(&p->mu, NULL);
    p->tty = !o->no_progress && !cli->json && isatty(STDERR_FILENO);
    p->start = now_s();
}

/* One transfer's share of the progress. */
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
    const ckpt_opts *o;
    const char *job, *name;
    item *items;
    size_t n;
    atomic_size_t next;
    progress prog;
} uploader;

/* Upload one shard file. Upload threads. */
static void upload_one(uploader *u, item *it)
{
    sl_ckpt_upload_opts uo = SL_CKPT_UPLOAD_OPTS_INIT;
    xfer x = {&u->prog, 0};
    struct stat st;
    int fd = open(it->path, O_RDONLY | O_CLOEXEC);

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

/* The files of directory `dir` that have a rank number, by rank, into u->items. Returns 0 or an
 * exit code after printing why. */
static int scan_dir(uploader *u, const char *dir)
{
    sl_buf items;
    struct dirent *e;
    DIR *d = opendir(dir);
    int err = 0;

    if (!d)
        return sl_cli_fail("ckpt upload", "%s: %s", dir, strerror(errno));
    sl_buf_init(&items, (size_t)CKPT_MAX_RANKS * sizeof(item));
    while (!err && (e = readdir(d)) != NULL) {
        long r = e->d_name[0] == '.' ? -1 : rank_of(e->d_name);
        item it;

        if (r < 0)
            continue;
        memset(&it, 0, sizeof(it));
        snprintf(it.path, sizeof(it.path), "%s/%s", dir, e->d_name);
        it.rank = (int32_t)r;
        err = sl_buf_add(&items, &it, sizeof(it));
    }
    closedir(d);
    u->n = items.len / sizeof(item);
    u->items = (item *)(void *)sl_buf_take(&items);
    if (err == SL_ELIMIT)
        return sl_cli_fail("ckpt upload", "more than %d files with a rank number in %s",
                           CKPT_MAX_RANKS, dir);
    if (err)
        return sl_cli_fail("ckpt upload", "out of memory");
    if (u->n == 0)
        return sl_cli_fail("ckpt upload", "no file with a rank number in %s", dir);
    qsort(u->items, u->n, sizeof(*u->items), cmp_item);
    for (size_t i = 1; i < u->n; i++)
        if (u->items[i].rank == u->items[i - 1].rank)
            return sl_cli_fail("ckpt upload", "%s and %s both look like rank %d",
                               u->items[i - 1].path, u->items[i].path, u->items[i].rank);
    return 0;
}

/* What to upload: FILE as --rank R, or the rank files of --dir DIR. */
static int upload_items(uploader *u, int argc, char **argv)
{
    const ckpt_opts *o = u->o;

    if (o->dir && argc == 2)
        return scan_dir(u, o->dir);
    if (argc == 3 && !o->dir && o->have_rank) {
        if (!(u->items = calloc(1, sizeof(*u->items))))
            return sl_cli_fail("ckpt upload", "out of memory");
        snprintf(u->items[0].path, sizeof(u->items[0].path), "%s", argv[2]);
        u->items[0].rank = o->rank;
        u->n = 1;
        return 0;
    }
    fprintf(stderr, "sluice ckpt upload: give FILE with --rank R, or --dir DIR\n");
    return SL_CLI_USAGE;
}

/* Run the uploads on min(--jobs, files) threads. */
static void upload_all(uploader *u)
{
    pthread_t th[64];
    int nt = u->o->jobs > 0 ? u->o->jobs : 4;

    for (size_t i = 0; i < u->n; i++) {
        struct stat st;

        if (stat(u->items[i].path, &st) == 0)
            u->prog.total += (uint64_t)st.st_size;
    }
    if ((size_t)nt > u->n)
        nt = (int)u->n;
    for (int i = 0; i < nt; i++)
        pthread_create(&th[i], NULL, upload_thread, u);
    for (int i = 0; i < nt; i++)
        pthread_join(th[i], NULL);
    progress_draw(&u->prog, 1);
}

/* After the uploads: the receipts as JSON, the failures, the total. Returns the exit code. */
static int upload_report(const uploader *u)
{
    const sl_cli *cli = u->cli;
    int rc = SL_CLI_OK;

    if (cli->json)
        printf("[");
    for (size_t i = 0, shown = 0; i < u->n; i++) {
        const item *it = &u->items[i];

        if (it->rc) {
            if (cli->json)
                fprintf(stderr, "sluice ckpt upload: %s\n", it->error);
            rc = SL_CLI_ERROR;
            continue;
        }
        if (!cli->json)
            continue;
        printf("%s{\"rank\":%d,\"data_size\":%" PRIu64 ",\"sha256\":\"%s\",\"path\":",
               shown++ ? "," : "", it->rank, it->receipt.data_size, it->receipt.sha256);
        sl_cli_json_str(stdout, it->receipt.path);
        printf("}");
    }
    if (cli->json)
        printf("]\n");
    if (!cli->json && rc == SL_CLI_OK && u->n > 1) {
        double el = now_s() - u->prog.start;

        printf("%zu shards, %" PRIu64 " bytes in %.2f s (%.1f MiB/s)\n", u->n, u->prog.total, el,
               el > 0 ? (double)u->prog.total / el / 1048576.0 : 0.0);
    }
    return rc;
}

int ckpt_upload(sl_cli *cli, sl_client *c, void *opts, int argc, char **argv)
{
    uploader u;
    int rc;

    memset(&u, 0, sizeof(u));
    u.cli = cli;
    u.c = c;
    u.o = opts;
    u.job = argv[0];
    u.name = argv[1];
    if ((rc = upload_items(&u, argc, argv)) == 0) {
        progress_init(&u.prog, cli, u.o);
        upload_all(&u);
        pthread_mutex_destroy(&u.prog.mu);
        rc = upload_report(&u);
    }
    free(u.items);
    return rc;
}

/* ---- download ---- */

/* Download one rank's data into `path` (through path.part, renamed when complete). */
static int download_one(const sl_cli *cli, sl_client *c, const char *job, const char *name,
                        int32_t rank, const char *path, progress *p)
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
        return sl_cli_call_fail(cli, "ckpt download");
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return sl_cli_fail("ckpt download", "%s: %s", path, strerror(errno));
    }
    if (cli->json) {
        printf("{\"rank\":%d,\"sha256\":\"%s\",\"path\":", rank, sha);
        sl_cli_json_str(stdout, path);
        printf("}\n");
    } else {
        printf("rank %d: sha256 %s -> %s\n", rank, sha, path);
    }
    return SL_CLI_OK;
}

#define RANGE_WINDOW (16u << 20) /* bytes read per DownloadShard of a ranged download */

/* Bytes [o->offset, o->offset + o->length) of rank's data (length 0: to its end) into `path`
 * (through path.part, renamed when complete), a window at a time straight into one buffer
 * (sl_ckpt_read_pieces). */
static int download_range(const sl_cli *cli, sl_client *c, const char *job, const char *name,
                          const ckpt_opts *o, progress *p)
{
    char tmp[4200];
    sl_ckpt_shard *shards = NULL;
    sl_ckpt_piece piece;
    uint64_t size = 0, len, at;
    size_t n = 0;
    uint8_t *buf = NULL;
    FILE *f;
    int err, werr = 0, found = 0;

    if (sl_ckpt_get(c, NULL, &shards, &n, job, name))
        return sl_cli_call_fail(cli, "ckpt download");
    for (size_t i = 0; i < n; i++)
        if (shards[i].rank == o->rank) {
            size = shards[i].data_size;
            found = 1;
        }
    free(shards);
    if (!found)
        return sl_cli_fail("ckpt download", "%s/%s has no shard of rank %d", job, name, o->rank);
    if (o->offset > size || o->length > size - o->offset)
        return sl_cli_fail("ckpt download",
                           "--offset %" PRIu64 " --length %" PRIu64 " is past the %" PRIu64
                           " data bytes of rank %d",
                           o->offset, o->length, size, o->rank);
    len = o->length ? o->length : size - o->offset;
    p->total = len;
    snprintf(tmp, sizeof(tmp), "%s.part", o->output);
    if (!(buf = malloc(RANGE_WINDOW)))
        return sl_cli_fail("ckpt download", "out of memory");
    if (!(f = fopen(tmp, "wbe"))) {
        free(buf);
        return sl_cli_fail("ckpt download", "%s: %s", tmp, strerror(errno));
    }
    for (at = 0, err = 0; at < len && !err && !werr; at += piece.size) {
        piece.offset = o->offset + at;
        piece.size = len - at < RANGE_WINDOW ? len - at : RANGE_WINDOW;
        piece.dst = buf;
        err = sl_ckpt_read_pieces(c, job, name, o->rank, piece.offset, piece.size, &piece, 1);
        if (!err && fwrite(buf, 1, (size_t)piece.size, f) != piece.size)
            werr = errno ? errno : EIO;
        if (!err && !werr) {
            atomic_fetch_add(&p->done, piece.size);
            progress_draw(p, 0);
        }
    }
    free(buf);
    if (fclose(f) != 0 && !werr)
        werr = errno ? errno : EIO;
    if (err || werr) {
        unlink(tmp);
        if (err)
            return sl_cli_call_fail(cli, "ckpt download");
        return sl_cli_fail("ckpt download", "%s: %s", tmp, strerror(werr));
    }
    if (rename(tmp, o->output) != 0) {
        unlink(tmp);
        return sl_cli_fail("ckpt download", "%s: %s", o->output, strerror(errno));
    }
    if (cli->json) {
        printf("{\"rank\":%d,\"offset\":%" PRIu64 ",\"length\":%" PRIu64 ",\"path\":", o->rank,
               o->offset, len);
        sl_cli_json_str(stdout, o->output);
        printf("}\n");
    } else {
        printf("rank %d: data bytes [%" PRIu64 ", %" PRIu64 ") -> %s\n", o->rank, o->offset,
               o->offset + len, o->output);
    }
    return SL_CLI_OK;
}

/* Every rank into dir/rank_<R>.bin. */
static int download_dir(const sl_cli *cli, sl_client *c, const char *dir, char **argv, progress *p)
{
    char path[4200];
    sl_ckpt ck;
    int rc = SL_CLI_OK;

    if (sl_ckpt_get(c, &ck, NULL, NULL, argv[0], argv[1]))
        return sl_cli_call_fail(cli, "ckpt download");
    p->total = ck.total_bytes;
    for (int32_t r = 0; r < ck.world_size && rc == SL_CLI_OK; r++) {
        snprintf(path, sizeof(path), "%s/rank_%d.bin", dir, r);
        rc = download_one(cli, c, argv[0], argv[1], r, path, p);
    }
    progress_draw(p, 1);
    return rc;
}

int ckpt_download(sl_cli *cli, sl_client *c, void *opts, int argc, char **argv)
{
    const ckpt_opts *o = opts;
    progress p;
    int rc;

    progress_init(&p, cli, o);
    if (o->have_range && !(o->have_rank && o->output)) {
        fprintf(stderr, "sluice ckpt download: --offset and --length go with --rank R -o FILE\n");
        rc = SL_CLI_USAGE;
    } else if (o->have_range) {
        rc = download_range(cli, c, argv[0], argv[1], o, &p);
        progress_draw(&p, 1);
    } else if (o->have_rank && o->output) {
        rc = download_one(cli, c, argv[0], argv[1], o->rank, o->output, &p);
        progress_draw(&p, 1);
    } else if (o->dir) {
        rc = download_dir(cli, c, o->dir, argv, &p);
    } else {
        fprintf(stderr, "sluice ckpt download: give --rank R -o FILE, or --dir DIR\n");
        rc = SL_CLI_USAGE;
        progress_draw(&p, 1);
    }
    pthread_mutex_destroy(&p.mu);
    return rc;
}
