/* Load and soak benchmark: S concurrent streams against one sluiced for a while, mixed like a
 * training cluster's traffic, while the daemon's RSS, open file descriptors and threads are
 * sampled from /proc.
 *
 *   - half the streams are index streams: ranks of several index jobs (32 ranks per job) read
 *     their shares, report progress now and then, and at the end of a share either open a
 *     stream for the next epoch at once (it waits in the daemon until every rank is done) or
 *     poll Epochs.Get until the epoch has advanced (even and odd ranks);
 *   - a quarter are batch streams: ranks of token-budget batching jobs (dynamic strategy over
 *     lognormal lengths), the same way;
 *   - a quarter are checkpoint shard uploads: groups of up to 8 ranks begin a checkpoint, each
 *     uploads a 1-8 MiB shard (the daemon checks the SHA-256; every fourth upload is also hashed
 *     by libsluice), rank 0 commits; every fourth round is verified deep and an older
 *     checkpoint deleted, and a retention policy of 3 keeps the disk from filling;
 *   - a few extra threads make a trickle of unary calls (Datasets/Jobs Get and List,
 *     Epochs.Get, Admin.GetInfo, Checkpoints List and latest).
 *
 * It prints a time series (RSS, fds, threads, throughput, errors) every --interval seconds and
 * at the end: operations and errors by kind, latency percentiles (unary calls, time to the first
 * message of index and batch streams, per upload chunk, whole uploads, commits, deep verifies),
 * throughput, and RSS / fds at start (after --warmup), middle and end with the drift. Any error,
 * a daemon that dies, or a daemon that does not exit 0 on SIGTERM makes the exit status 1.
 *
 *   soak [--streams S] [--duration SECS] [--addr HOST:PORT | --sluiced PATH] [--dir DIR] [--json]
 *        [--interval SECS] [--warmup SECS] [--clients N] [--unary-threads N] [--think-ms MS]
 *        [--upload-pause-ms MS] [--max-upload-mib MIB] [--mix I:B:U] [--help]
 *
 * Without --addr it starts its own sluiced (--sluiced, else $SLUICED, else `sluiced` on PATH) on
 * 127.0.0.1:0 with a data dir under --dir (default /tmp), logging to <dir>/sluiced.log. With
 * --addr the daemon is sampled through /proc when Admin.GetInfo's pid is visible here.
 */
#include "err.h"
#include "shard/shard.h"
#include "sluice_ckpt.h"
#include "sluice_feed.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB         (1024.0 * 1024.0)
#define RANKS_JOB   32 /* ranks per index or batch job */
#define GROUP_MAX   8  /* ranks per checkpoint group */
#define N_SIZES     8  /* distinct shard sizes */
#define MAX_SAMPLES 100000
#define MAX_MSGS    20

/* ---- options ---- */

static struct {
    int streams;
    double duration, interval, warmup;
    const char *addr, *sluiced, *dir;
    int json, clients, unary_threads, think_ms, upload_pause_ms, max_upload_mib;
    int mix[3]; /* weights of index, batch and upload streams */
} opt = {
    .mix = {2, 1, 1},
    .streams = 512,
    .duration = 600,
    .interval = 5,
    .warmup = -1,
    .dir = "/tmp",
    .clients = 0,
    .unary_threads = 4,
    .think_ms = 100,
    .upload_pause_ms = 1000,
    .max_upload_mib = 8,
};

static FILE *out; /* human-readable output: stdout, or stderr with --json */

/* ---- time, random numbers ---- */

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Sleep about ms milliseconds (±50%), in slices, returning early once the run is stopping. */
static atomic_int stopping;

static void nap(uint64_t *x, int ms)
{
    uint64_t us;

    if (ms <= 0)
        return;
    us = (uint64_t)ms * 500 + rnd(x) % ((uint64_t)ms * 1000);
    while (us > 0 && !atomic_load(&stopping)) {
        uint64_t s = us < 100000 ? us : 100000;
        usleep((useconds_t)s);
        us -= s;
    }
}

/* ---- latency histograms: log-linear buckets of microseconds, 1/16 precision ---- */

#define H_BUCKETS 608

enum { H_UNARY, H_TTFM_INDEX, H_TTFM_BATCH, H_CHUNK, H_UPLOAD, H_COMMIT, H_VERIFY, H_N };

static const char *h_names[H_N] = {
    "unary calls",  "index stream first msg", "batch stream first msg",
    "upload chunk", "whole shard upload",     "checkpoint commit",
    "deep verify",
};
static const char *h_keys[H_N] = {"unary",  "ttfm_index", "ttfm_batch", "upload_chunk",
                                  "upload", "commit",     "verify_deep"};

typedef struct hist {
    uint64_t n, max_us;
    uint32_t b[H_BUCKETS];
} hist;

static int h_bucket(uint64_t us)
{
    int e, b;

    if (us < 16)
        return (int)us;
    e = 63 - __builtin_clzll(us);
    b = 16 + (e - 4) * 16 + (int)((us >> (e - 4)) & 15);
    return b < H_BUCKETS ? b : H_BUCKETS - 1;
}

static uint64_t h_upper(int b)
{
    int e, sub;

    if (b < 16)
        return (uint64_t)b;
    e = (b - 16) / 16 + 4;
    sub = (b - 16) % 16;
    return ((uint64_t)(16 + sub + 1) << (e - 4)) - 1;
}

static void h_add(hist *h, double secs)
{
    uint64_t us = secs <= 0 ? 0 : (uint64_t)(secs * 1e6);

    h->b[h_bucket(us)]++;
    h->n++;
    if (us > h->max_us)
        h->max_us = us;
}

/* The q-quantile in milliseconds: the upper bound of its bucket, at most the maximum. */
static double h_quantile(const hist *h, double q)
{
    uint64_t want, seen = 0;

    if (!h->n)
        return 0;
    want = (uint64_t)ceil(q * (double)h->n);
    if (want < 1)
        want = 1;
    for (int b = 0; b < H_BUCKETS; b++) {
        seen += h->b[b];
        if (seen >= want) {
            uint64_t v = h_upper(b);
            return (double)(v < h->max_us ? v : h->max_us) / 1e3;
        }
    }
    return (double)h->max_us / 1e3;
}

/* Every thread records into its own histograms and merges them here when it ends. */
static hist g_hist[H_N];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static void h_merge(hist *mine)
{
    pthread_mutex_lock(&g_mu);
    for (int k = 0; k < H_N; k++) {
        for (int b = 0; b < H_BUCKETS; b++)
            g_hist[k].b[b] += mine[k].b[b];
        g_hist[k].n += mine[k].n;
        if (mine[k].max_us > g_hist[k].max_us)
            g_hist[k].max_us = mine[k].max_us;
    }
    pthread_mutex_unlock(&g_mu);
}

/* ---- operation and error counters ---- */

enum {
    K_INDEX_STREAM,
    K_BATCH_STREAM,
    K_UPLOAD,
    K_REPORT,
    K_EPOCH_GET,
    K_DATASET_GET,
    K_DATASET_LIST,
    K_JOB_GET,
    K_JOB_LIST,
    K_INFO,
    K_CKPT_BEGIN,
    K_CKPT_COMMIT,
    K_CKPT_VERIFY,
    K_CKPT_DELETE,
    K_CKPT_LIST,
    K_CKPT_LATEST,
    K_N
};

static const char *k_names[K_N] = {
    "index streams", "batch streams", "shard uploads", "progress reports",
    "Epochs.Get",    "Datasets.Get",  "Datasets.List", "Jobs.Get",
    "Jobs.List",     "Admin.GetInfo", "ckpt Begin",    "ckpt Commit",
    "ckpt Verify",   "ckpt Delete",   "ckpt List",     "ckpt latest",
};
static const char *k_keys[K_N] = {
    "index_streams", "batch_streams", "uploads",   "reports",     "epoch_get",  "dataset_get",
    "dataset_list",  "job_get",       "job_list",  "info",        "ckpt_begin", "ckpt_commit",
    "ckpt_verify",   "ckpt_delete",   "ckpt_list", "ckpt_latest",
};

static atomic_ullong g_ops[K_N], g_errs[K_N];
static atomic_ullong g_indices, g_batches, g_bytes, g_open_streams, g_drain_errs;
static char g_msgs[MAX_MSGS][512];
static int g_n_msgs;

static void op_ok(int kind)
{
    atomic_fetch_add(&g_ops[kind], 1);
}

/* Record a failed operation with the daemon's message. After the run has begun stopping, a
 * stream that finds its epoch over is an effect of the drain (Epochs.Next), not an error. */
static void op_fail(int kind, int err, const char *what)
{
    atomic_fetch_add(&g_ops[kind], 1);
    if (atomic_load(&stopping) && err == SL_ESTATE) {
        atomic_fetch_add(&g_drain_errs, 1);
        return;
    }
    atomic_fetch_add(&g_errs[kind], 1);
    pthread_mutex_lock(&g_mu);
    if (g_n_msgs < MAX_MSGS)
        snprintf(g_msgs[g_n_msgs++], sizeof(g_msgs[0]), "%s (%s): %s [%s]", k_names[kind], what,
                 sl_client_error(), sl_errname(err));
    pthread_mutex_unlock(&g_mu);
}

/* ---- the daemon ---- */

static pid_t daemon_pid; /* the daemon we started, 0 with --addr */
static int sample_pid;   /* the process sampled through /proc, 0: none */
static char root[4096];  /* the temporary directory */
static sl_client **clients;

static pid_t start_daemon(const char *sluiced, int *port)
{
    char data[4200], port_file[4200], log[4200];
    pid_t pid;

    snprintf(data, sizeof(data), "%s/data", root);
    snprintf(port_file, sizeof(port_file), "%s/port", root);
    snprintf(log, sizeof(log), "%s/sluiced.log", root);
    pid = fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY), lfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 1);
        if (lfd >= 0)
            dup2(lfd, 2);
        execlp(sluiced, sluiced, "--listen", "127.0.0.1:0", "--data-dir", data, "--port-file",
               port_file, "--log-level", "warn", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 1500; i++) {
        FILE *f;
        int st;
        usleep(20000);
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "soak: sluiced exited at startup (see %s)\n", log);
            exit(1);
        }
        f = fopen(port_file, "r");
        if (f) {
            int ok = fscanf(f, "%d", port) == 1;
            fclose(f);
            if (ok)
                return pid;
        }
    }
    fprintf(stderr, "soak: sluiced did not start\n");
    kill(pid, SIGKILL);
    exit(1);
}

typedef struct sample {
    double t;
    double rss_mib;
    long fds, threads;
    uint64_t indices, batches, bytes, ops, errs, open_streams;
    double cpu_daemon, cpu_self; /* CPU seconds so far */
} sample;

static sample *samples;
static size_t n_samples;

/* RSS (MiB), open fds and threads of the sampled process; 0 if it is gone or not visible. */
static int proc_read(double *rss, long *fds, long *threads)
{
    char path[64], line[256];
    FILE *f;
    DIR *d;
    struct dirent *e;

    *rss = 0;
    *fds = *threads = 0;
    if (!sample_pid)
        return 0;
    snprintf(path, sizeof(path), "/proc/%d/status", sample_pid);
    f = fopen(path, "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f)) {
        long v;
        if (sscanf(line, "VmRSS: %ld", &v) == 1)
            *rss = (double)v / 1024.0;
        else if (sscanf(line, "Threads: %ld", &v) == 1)
            *threads = v;
    }
    fclose(f);
    snprintf(path, sizeof(path), "/proc/%d/fd", sample_pid);
    d = opendir(path);
    if (!d)
        return 0;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            (*fds)++;
    closedir(d);
    return 1;
}

/* CPU seconds (user + system) used so far by the sampled process and by this one. */
static void cpu_read(double *daemon, double *self)
{
    unsigned long long ut = 0, st = 0;
    char path[64], buf[1024], *p;
    struct rusage ru;
    FILE *f;

    *daemon = 0;
    if (sample_pid) {
        snprintf(path, sizeof(path), "/proc/%d/stat", sample_pid);
        f = fopen(path, "r");
        if (f) {
            /* utime and stime are fields 14 and 15, counted after the command name. */
            if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')) != NULL &&
                sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) ==
                    2)
                *daemon = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
            fclose(f);
        }
    }
    getrusage(RUSAGE_SELF, &ru);
    *self = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
            (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* ---- workload setup ---- */

typedef struct feed_job {
    char name[64];
    int batches;
    uint32_t world;
    atomic_int alive; /* rank threads still running */
} feed_job;

typedef struct group {
    char job[64];
    int g;
    pthread_barrier_t bar;
    int go;
} group;

static feed_job *jobs;
static int n_jobs;
static group *groups;
static int n_groups;
static uint64_t sizes[N_SIZES];
static char sizes_sha[N_SIZES][65];
static int src_fd = -1;
static atomic_int fatal_daemon; /* the daemon vanished */
static char pfx[32];            /* "soak<pid>": names of this run's datasets and jobs */
static char ds_idx[64], ds_small[64], ds_tok[64];

static void die(const char *what)
{
    fprintf(stderr, "soak: %s: %s\n", what, sl_client_error());
    if (daemon_pid)
        kill(daemon_pid, SIGKILL);
    exit(1);
}

/* Lognormal lengths (mu 5.5, sigma 1) clipped to [1, 4096]. */
static uint32_t *lognormal(uint64_t n, uint64_t seed)
{
    uint32_t *len = malloc(sizeof(*len) * n);
    uint64_t x = seed;

    for (uint64_t i = 0; len && i < n; i++) {
        double u1 = ((double)(rnd(&x) >> 11) + 0.5) / 9007199254740992.0;
        double u2 = ((double)(rnd(&x) >> 11) + 0.5) / 9007199254740992.0;
        double z = exp(5.5 + sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
        len[i] = z < 1 ? 1 : z > 4096 ? 4096 : (uint32_t)z;
    }
    return len;
}

/* Datasets, jobs, checkpoint groups and the upload source file. */
static void setup(sl_client *c, int n_index, int n_batch, int n_upload, int gsize)
{
    char path[4200];
    uint8_t *buf;
    uint64_t total, x = 0x9e3779b97f4a7c15ull;
    int k = 0;

    snprintf(ds_idx, sizeof(ds_idx), "%s-idx", pfx);
    snprintf(ds_tok, sizeof(ds_tok), "%s-tok", pfx);
    snprintf(ds_small, sizeof(ds_small), "%s-small", pfx);
    if (sl_dataset_create(c, ds_idx, (uint64_t)RANKS_JOB * 60000, NULL) ||
        sl_dataset_create(c, ds_small, (uint64_t)RANKS_JOB * 8000, NULL))
        die("create the index datasets");
    {
        uint64_t n = 200000;
        uint32_t *len = lognormal(n, 88172645463325252ull);
        if (!len || sl_dataset_create(c, ds_tok, n, NULL) ||
            sl_dataset_upload_lengths(c, ds_tok, len, n, NULL))
            die("create the token dataset");
        free(len);
    }
    n_jobs = (n_index + RANKS_JOB - 1) / RANKS_JOB + (n_batch + RANKS_JOB - 1) / RANKS_JOB;
    jobs = calloc((size_t)n_jobs + 1, sizeof(*jobs));
    for (int pass = 0; pass < 2; pass++) {
        int left = pass ? n_batch : n_index;
        for (int i = 0; left > 0; i++) {
            feed_job *j = &jobs[k++];
            sl_job spec;
            int torch;
            memset(&spec, 0, sizeof(spec));
            j->batches = pass;
            j->world = (uint32_t)(left < RANKS_JOB ? left : RANKS_JOB);
            left -= (int)j->world;
            snprintf(j->name, sizeof(j->name), "%s-%s-%d", pfx, pass ? "batch" : "idx", i);
            snprintf(spec.name, sizeof(spec.name), "%s", j->name);
            /* Every fourth index job shuffles like torch, on a smaller dataset: each dp rank
             * of a torch job holds the epoch's whole permutation (docs/feeding.md). */
            torch = !pass && i % 4 == 1;
            snprintf(spec.dataset, sizeof(spec.dataset), "%s",
                     pass    ? ds_tok
                     : torch ? ds_small
                             : ds_idx);
            spec.world_size = j->world;
            spec.seed = (uint64_t)k;
            snprintf(spec.shuffle, sizeof(spec.shuffle), torch ? "torch" : "feistel");
            if (pass) {
                spec.has_batching = 1;
                snprintf(spec.batching.strategy, sizeof(spec.batching.strategy), "dynamic");
                spec.batching.max_batch_size = 1024;
                spec.batching.max_seq_len = 4096;
                spec.batching.max_tokens = 16384;
                spec.batching.window = 6400;
            }
            if (sl_job_create(c, &spec, NULL))
                die("create job");
        }
    }
    n_jobs = k;

    n_groups = gsize ? n_upload / gsize : 0;
    groups = calloc((size_t)n_groups + 1, sizeof(*groups));
    for (int i = 0; i < n_groups; i++) {
        group *g = &groups[i];
        snprintf(g->job, sizeof(g->job), "%s-ckpt-%d", pfx, i);
        g->g = gsize;
        pthread_barrier_init(&g->bar, NULL, (unsigned)gsize);
        if (sl_ckpt_set_retention(c, g->job, 3, NULL))
            die("set retention");
    }

    /* Shard sizes from max/8 to max, some not a multiple of anything. */
    total = (uint64_t)opt.max_upload_mib << 20;
    for (int i = 0; i < N_SIZES; i++) {
        static const int64_t odd[N_SIZES] = {0, -4093, 17, 0, -1, 0, 333, 0};
        int64_t s = (int64_t)(total / N_SIZES * (uint64_t)((i * 5) % N_SIZES + 1)) + odd[i];
        sizes[i] = (uint64_t)(s > 1 ? s : 1);
    }
    buf = malloc(total);
    if (!buf)
        die("out of memory");
    for (uint64_t i = 0; i + 8 <= total; i += 8) {
        uint64_t v = rnd(&x);
        memcpy(buf + i, &v, 8);
    }
    for (int i = 0; i < N_SIZES; i++) {
        sl_sha256 *h = NULL;
        if (sl_sha256_new(&h) || sl_sha256_update(h, buf, sizes[i]) ||
            sl_sha256_final(h, sizes_sha[i]))
            die("sha256");
        sl_sha256_free(h);
    }
    snprintf(path, sizeof(path), "%s/source", root);
    src_fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (src_fd < 0 || write(src_fd, buf, total) != (ssize_t)total) {
        perror("soak: write the upload source");
        exit(1);
    }
    free(buf);
}

/* ---- rank threads of index and batch jobs ---- */

typedef struct worker {
    pthread_t th;
    sl_client *c;
    feed_job *job;
    group *grp;
    uint32_t rank;
    uint64_t rng;
    hist *h; /* H_N histograms */
    double chunk_t;
} worker;

static int report(worker *w, uint64_t epoch, uint64_t pos)
{
    double t = now_s();
    int err = sl_epoch_report(w->c, w->job->name, w->rank, epoch, pos, NULL, NULL);

    h_add(&w->h[H_UNARY], now_s() - t);
    if (err)
        op_fail(K_REPORT, err, w->job->name);
    else
        op_ok(K_REPORT);
    return err;
}

/* Poll Epochs.Get until the job is past `epoch` (or the run stops). */
static void wait_epoch(worker *w, uint64_t epoch)
{
    while (!atomic_load(&stopping)) {
        sl_epoch e;
        double t = now_s();
        int err;
        memset(&e, 0, sizeof(e));
        err = sl_epoch_get(w->c, w->job->name, &e);
        h_add(&w->h[H_UNARY], now_s() - t);
        sl_epoch_clear(&e);
        if (err) {
            op_fail(K_EPOCH_GET, err, w->job->name);
            return;
        }
        op_ok(K_EPOCH_GET);
        if (e.epoch > epoch)
            return;
        nap(&w->rng, 200);
    }
}

/* One stream of an index job: returns 1 at the end of the share, 0 when stopped, < 0 on error.
 * *epoch is the stream's epoch. */
static int index_stream(worker *w, int next_set, uint64_t next, uint64_t *epoch)
{
    sl_stream_opts o = SL_STREAM_OPTS_INIT;
    sl_index_stream *s = NULL;
    const uint64_t *idx;
    size_t n;
    uint64_t start, pos = 0, reported = 0, chunks = 0;
    double t0 = now_s();
    int rc, first = 1, rfail = 0, err;

    o.epoch_set = next_set;
    o.epoch = next;
    o.max_chunk = 2048;
    err = sl_indices_open(&s, w->c, w->job->name, w->rank, &o);
    if (err) {
        op_fail(K_INDEX_STREAM, err, "open");
        return err;
    }
    atomic_fetch_add(&g_open_streams, 1);
    while ((rc = sl_indices_next(s, &idx, &n, &start)) == 1) {
        if (first && !next_set)
            h_add(&w->h[H_TTFM_INDEX], now_s() - t0);
        first = 0;
        *epoch = sl_indices_epoch(s);
        atomic_fetch_add(&g_indices, n);
        pos = start + n;
        if (++chunks % 16 == 0 && pos > reported) {
            if (report(w, *epoch, pos)) {
                rfail = 1; /* counted by report */
                break;
            }
            reported = pos;
        }
        if (atomic_load(&stopping))
            break;
        nap(&w->rng, opt.think_ms);
    }
    if (rfail) {
        op_ok(K_INDEX_STREAM);
        rc = -1;
    } else if (rc < 0) {
        op_fail(K_INDEX_STREAM, rc, "read");
    } else if (rc == 0) {
        uint64_t count = sl_indices_share_count(s);
        *epoch = sl_indices_epoch(s);
        op_ok(K_INDEX_STREAM);
        if (count > reported && report(w, *epoch, count) == 0)
            rc = 1;
        else
            rc = count > reported ? -1 : 1;
    } else {
        op_ok(K_INDEX_STREAM);
        rc = 0;
    }
    sl_indices_close(s);
    atomic_fetch_sub(&g_open_streams, 1);
    return rc;
}

static int batch_stream(worker *w, int next_set, uint64_t next, uint64_t *epoch)
{
    sl_stream_opts o = SL_STREAM_OPTS_INIT;
    sl_batch_stream *s = NULL;
    sl_feed_batch b;
    uint64_t pos = 0, reported = 0, got = 0;
    double t0 = now_s();
    int rc, first = 1, rfail = 0, err;

    o.epoch_set = next_set;
    o.epoch = next;
    o.max_chunk = 16;
    err = sl_batches_open(&s, w->c, w->job->name, w->rank, &o);
    if (err) {
        op_fail(K_BATCH_STREAM, err, "open");
        return err;
    }
    atomic_fetch_add(&g_open_streams, 1);
    while ((rc = sl_batches_next(s, &b)) == 1) {
        if (first && !next_set)
            h_add(&w->h[H_TTFM_BATCH], now_s() - t0);
        first = 0;
        *epoch = sl_batches_epoch(s);
        atomic_fetch_add(&g_batches, 1);
        pos = b.step + 1;
        if (++got % 16 == 0 && pos > reported) {
            if (report(w, *epoch, pos)) {
                rfail = 1; /* counted by report */
                break;
            }
            reported = pos;
        }
        if (atomic_load(&stopping))
            break;
        if (got % 2 == 0)
            nap(&w->rng, opt.think_ms);
    }
    if (rfail) {
        op_ok(K_BATCH_STREAM);
        rc = -1;
    } else if (rc < 0) {
        op_fail(K_BATCH_STREAM, rc, "read");
    } else if (rc == 0) {
        uint64_t count = sl_batches_per_rank(s);
        *epoch = sl_batches_epoch(s);
        op_ok(K_BATCH_STREAM);
        if (count > reported && report(w, *epoch, count) == 0)
            rc = 1;
        else
            rc = count > reported ? -1 : 1;
    } else {
        op_ok(K_BATCH_STREAM);
        rc = 0;
    }
    sl_batches_close(s);
    atomic_fetch_sub(&g_open_streams, 1);
    return rc;
}

static void *rank_main(void *arg)
{
    worker *w = arg;
    int wait_in_daemon = w->rank % 2 == 0, next_set = 0;
    uint64_t next = 0;

    while (!atomic_load(&stopping)) {
        uint64_t epoch = 0;
        int rc = w->job->batches ? batch_stream(w, next_set, next, &epoch)
                                 : index_stream(w, next_set, next, &epoch);
        next_set = 0;
        if (rc < 0) {
            nap(&w->rng, 500);
            continue;
        }
        if (rc == 0)
            break;
        /* The share is done: wait for the next epoch in the daemon or by polling. */
        if (wait_in_daemon) {
            next_set = 1;
            next = epoch + 1;
        } else {
            wait_epoch(w, epoch);
        }
    }
    atomic_fetch_sub(&w->job->alive, 1);
    return NULL;
}

/* ---- checkpoint upload groups ---- */

static void on_progress(uint64_t done, uint64_t total, void *arg)
{
    worker *w = arg;
    double t = now_s();

    (void)done;
    (void)total;
    h_add(&w->h[H_CHUNK], t - w->chunk_t);
    w->chunk_t = t;
}

static int unary_timed(worker *w, int kind, int err, double t0, const char *what)
{
    h_add(&w->h[H_UNARY], now_s() - t0);
    if (err)
        op_fail(kind, err, what);
    else
        op_ok(kind);
    return err;
}

static void *upload_main(void *arg)
{
    worker *w = arg;
    group *g = w->grp;
    int rank = (int)w->rank;

    for (uint64_t round = 1;; round++) {
        char name[64];
        sl_ckpt_upload_opts o;
        sl_ckpt_shard receipt;
        int si = (int)((round * 3 + (uint64_t)rank) % N_SIZES), err;
        double t;

        if (rank == 0)
            g->go = !atomic_load(&stopping);
        pthread_barrier_wait(&g->bar);
        if (!g->go)
            break;
        snprintf(name, sizeof(name), "step_%" PRIu64, round);
        t = now_s();
        err = sl_ckpt_begin(w->c, NULL, g->job, name, round, g->g, "{\"soak\":true}");
        if (!unary_timed(w, K_CKPT_BEGIN, err, t, name)) {
            o = (sl_ckpt_upload_opts)SL_CKPT_UPLOAD_OPTS_INIT;
            o.sha256 = sizes_sha[si];
            o.chunk_bytes = rank % 2 ? (1u << 20) : (256u << 10);
            o.no_verify = (round + (uint64_t)rank) % 4 != 0;
            o.progress = on_progress;
            o.arg = w;
            t = w->chunk_t = now_s();
            atomic_fetch_add(&g_open_streams, 1);
            err = sl_ckpt_upload_fd(w->c, &receipt, g->job, name, rank, src_fd, sizes[si], &o);
            atomic_fetch_sub(&g_open_streams, 1);
            h_add(&w->h[H_UPLOAD], now_s() - t);
            if (!err && strcmp(receipt.sha256, sizes_sha[si]) != 0)
                err = SL_ECORRUPT;
            if (err) {
                op_fail(K_UPLOAD, err, name);
            } else {
                op_ok(K_UPLOAD);
                atomic_fetch_add(&g_bytes, sizes[si]);
            }
        }
        pthread_barrier_wait(&g->bar);
        if (rank == 0) {
            t = now_s();
            err = sl_ckpt_commit(w->c, NULL, g->job, name);
            h_add(&w->h[H_COMMIT], now_s() - t);
            if (err) {
                op_fail(K_CKPT_COMMIT, err, name);
                sl_ckpt_abort(w->c, NULL, g->job, name);
            } else {
                op_ok(K_CKPT_COMMIT);
            }
            if (!err && round % 4 == 1) {
                int ok = 0;
                t = now_s();
                err = sl_ckpt_verify(w->c, &ok, NULL, NULL, NULL, g->job, name, 1);
                h_add(&w->h[H_VERIFY], now_s() - t);
                if (!err && !ok)
                    err = SL_ECORRUPT;
                if (err)
                    op_fail(K_CKPT_VERIFY, err, name);
                else
                    op_ok(K_CKPT_VERIFY);
            }
            if (round % 4 == 3) {
                /* The checkpoint two rounds back is still kept by the retention of 3. */
                snprintf(name, sizeof(name), "step_%" PRIu64, round - 2);
                t = now_s();
                unary_timed(w, K_CKPT_DELETE, sl_ckpt_delete(w->c, g->job, name), t, name);
            }
        }
        nap(&w->rng, opt.upload_pause_ms);
    }
    return NULL;
}

/* ---- the unary trickle ---- */

static void *unary_main(void *arg)
{
    worker *w = arg;

    for (uint64_t i = 0; !atomic_load(&stopping); i++) {
        feed_job *j = n_jobs ? &jobs[rnd(&w->rng) % (uint64_t)n_jobs] : NULL;
        double t = now_s();
        int kind = (int)(i % 8), err;

        if (!j && (kind == 0 || kind == 2 || kind == 4))
            kind = 5; /* no feeding jobs in this mix */

        switch (kind) {
        case 0: {
            sl_dataset d;
            kind = K_DATASET_GET;
            err = sl_dataset_get(w->c, j->batches ? ds_tok : i % 16 ? ds_idx : ds_small, &d);
            break;
        }
        case 1: {
            sl_dataset *d = NULL;
            size_t n = 0;
            kind = K_DATASET_LIST;
            err = sl_dataset_list(w->c, &d, &n);
            free(d);
            break;
        }
        case 2: {
            sl_job jj;
            kind = K_JOB_GET;
            err = sl_job_get(w->c, j->name, &jj);
            if (!err)
                sl_job_clear(&jj);
            break;
        }
        case 3: {
            sl_job *l = NULL;
            size_t n = 0;
            kind = K_JOB_LIST;
            err = sl_job_list(w->c, NULL, &l, &n);
            free(l);
            break;
        }
        case 4: {
            sl_epoch e;
            memset(&e, 0, sizeof(e));
            kind = K_EPOCH_GET;
            err = sl_epoch_get(w->c, j->name, &e);
            sl_epoch_clear(&e);
            break;
        }
        case 5: {
            sl_info info;
            kind = K_INFO;
            err = sl_client_info(w->c, &info);
            break;
        }
        case 6: {
            sl_ckpt *l = NULL;
            size_t n = 0;
            kind = K_CKPT_LIST;
            err =
                sl_ckpt_list(w->c, &l, &n, n_groups ? groups[i % (uint64_t)n_groups].job : NULL, 0);
            free(l);
            break;
        }
        default: {
            sl_ckpt ck;
            kind = K_CKPT_LATEST;
            err = n_groups ? sl_ckpt_latest(w->c, &ck, groups[i % (uint64_t)n_groups].job) : 0;
            if (err == SL_ENOTFOUND) /* nothing committed yet */
                err = 0;
            break;
        }
        }
        unary_timed(w, kind, err, t, j ? j->name : "");
        nap(&w->rng, 20);
    }
    return NULL;
}

/* ---- output ---- */

static void print_pct(FILE *f, const char *name, const hist *h)
{
    if (!h->n) {
        fprintf(f, "  %-24s %10s\n", name, "-");
        return;
    }
    fprintf(f, "  %-24s %10" PRIu64 " %9.2f %9.2f %9.2f %9.2f %9.2f\n", name, h->n,
            h_quantile(h, 0.5), h_quantile(h, 0.9), h_quantile(h, 0.99), h_quantile(h, 0.999),
            (double)h->max_us / 1e3);
}

/* Means of RSS, fds and threads over the samples in [from, to) (fds and threads rounded); the
 * nearest sample if none falls inside. The series swings with the uploads' buffers, so single
 * samples make a poor start or end. */
static sample window(double from, double to)
{
    sample m;
    double rss = 0, fds = 0, th = 0;
    int n = 0;

    memset(&m, 0, sizeof(m));
    for (size_t i = 0; i < n_samples; i++) {
        if (samples[i].t < from || samples[i].t >= to)
            continue;
        rss += samples[i].rss_mib;
        fds += (double)samples[i].fds;
        th += (double)samples[i].threads;
        n++;
    }
    if (n == 0) {
        const sample *best = &samples[0];
        for (size_t i = 0; i < n_samples; i++)
            if (fabs(samples[i].t - from) < fabs(best->t - from))
                best = &samples[i];
        m = *best;
        m.t = from;
        return m;
    }
    m.t = from;
    m.rss_mib = rss / n;
    m.fds = lround(fds / n);
    m.threads = lround(th / n);
    return m;
}

/* Least-squares slope per minute of RSS (field 0) or fds (field 1) over samples after t0. */
static double slope(double t0, int field)
{
    double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;

    for (size_t i = 0; i < n_samples; i++) {
        double x, y;
        if (samples[i].t < t0)
            continue;
        x = samples[i].t / 60.0;
        y = field ? (double)samples[i].fds : samples[i].rss_mib;
        n++;
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
    }
    if (n < 2 || n * sxx - sx * sx == 0)
        return 0;
    return (n * sxy - sx * sy) / (n * sxx - sx * sx);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: soak [--streams S] [--duration SECS] [--addr HOST:PORT | --sluiced PATH]\n"
            "            [--dir DIR] [--json] [--interval SECS] [--warmup SECS] [--clients N]\n"
            "            [--unary-threads N] [--think-ms MS] [--upload-pause-ms MS]\n"
            "            [--max-upload-mib MIB] [--mix I:B:U] [--help]\n"
            "  --streams S          concurrent streams: 1/2 index, 1/4 batch, 1/4 uploads "
            "(default 512)\n"
            "  --duration SECS      how long the load runs (default 600)\n"
            "  --addr HOST:PORT     use a running daemon instead of starting one\n"
            "  --sluiced PATH       the daemon to start (default $SLUICED, else sluiced)\n"
            "  --dir DIR            where the temporary directory goes (default /tmp)\n"
            "  --json               print the summary as JSON on stdout (the rest on stderr)\n"
            "  --interval SECS      sampling period of the time series (default 5)\n"
            "  --warmup SECS        the start figures are taken after this (default min(120, "
            "duration/5))\n"
            "  --clients N          connections the streams are spread over, neighbours sharing "
            "one\n"
            "                       (default streams/8: one per host of 8 ranks)\n"
            "  --unary-threads N    threads making the unary trickle, ~40 calls/s each "
            "(default 4)\n"
            "  --think-ms MS        pause after each index chunk and every 4 batches (default "
            "5)\n"
            "  --upload-pause-ms MS pause between checkpoint rounds (default 1000)\n"
            "  --max-upload-mib MIB largest shard (default 8; shards are MIB/8 .. MIB)\n"
            "  --mix I:B:U          weights of index, batch and upload streams (default 2:1:1)\n");
}

static int arg_int(const char *s, int lo, int hi, const char *name)
{
    char *end;
    long v = strtol(s, &end, 10);

    if (*s == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "soak: %s must be an integer in [%d, %d]\n", name, lo, hi);
        exit(2);
    }
    return (int)v;
}

static double arg_secs(const char *s, const char *name)
{
    char *end;
    double v = strtod(s, &end);

    if (*s == '\0' || *end != '\0' || !(v >= 0) || v > 86400 * 7) {
        fprintf(stderr, "soak: %s must be seconds in [0, 604800]\n", name);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    int n_index, n_batch, n_upload, gsize, n_workers = 0, port, failed = 0, daemon_ok = 1;
    char addr[300];
    sl_client_opts co = SL_CLIENT_OPTS_INIT;
    worker *ws;
    pthread_attr_t attr;
    double t0, t_warm, t_end, t_stop, idle;
    sample before, after;

    co.timeout_ms = 60000;
    co.own_connection = 1;
    out = stdout;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            opt.json = 1;
            continue;
        }
        if (!v) {
            usage(stderr);
            return 2;
        }
        i++;
        if (strcmp(a, "--streams") == 0)
            opt.streams = arg_int(v, 4, 65536, a);
        else if (strcmp(a, "--duration") == 0)
            opt.duration = arg_secs(v, a);
        else if (strcmp(a, "--interval") == 0)
            opt.interval = arg_secs(v, a);
        else if (strcmp(a, "--warmup") == 0)
            opt.warmup = arg_secs(v, a);
        else if (strcmp(a, "--addr") == 0)
            opt.addr = v;
        else if (strcmp(a, "--sluiced") == 0)
            opt.sluiced = v;
        else if (strcmp(a, "--dir") == 0)
            opt.dir = v;
        else if (strcmp(a, "--clients") == 0)
            opt.clients = arg_int(v, 1, 1024, a);
        else if (strcmp(a, "--unary-threads") == 0)
            opt.unary_threads = arg_int(v, 0, 256, a);
        else if (strcmp(a, "--think-ms") == 0)
            opt.think_ms = arg_int(v, 0, 60000, a);
        else if (strcmp(a, "--upload-pause-ms") == 0)
            opt.upload_pause_ms = arg_int(v, 0, 600000, a);
        else if (strcmp(a, "--mix") == 0) {
            if (sscanf(v, "%d:%d:%d", &opt.mix[0], &opt.mix[1], &opt.mix[2]) != 3 ||
                opt.mix[0] < 0 || opt.mix[1] < 0 || opt.mix[2] < 0 ||
                opt.mix[0] + opt.mix[1] + opt.mix[2] <= 0 || opt.mix[0] > 1000 ||
                opt.mix[1] > 1000 || opt.mix[2] > 1000) {
                fprintf(stderr, "soak: --mix wants I:B:U, three weights in [0, 1000]\n");
                return 2;
            }
        } else if (strcmp(a, "--max-upload-mib") == 0)
            opt.max_upload_mib = arg_int(v, 1, 1024, a);
        else {
            usage(stderr);
            return 2;
        }
    }
    if (!opt.clients)
        opt.clients = opt.streams / 8 > 0 ? opt.streams / 8 : 1;
    if (opt.interval < 0.1)
        opt.interval = 0.1;
    if (opt.warmup < 0)
        opt.warmup = opt.duration / 5 < 120 ? opt.duration / 5 : 120;
    if (opt.json)
        out = stderr;
    if (!opt.sluiced)
        opt.sluiced = getenv("SLUICED") ? getenv("SLUICED") : "sluiced";
    signal(SIGPIPE, SIG_IGN);

    /* The mix: a quarter uploads (whole groups), a quarter batch streams, the rest indices. */
    {
        int wsum = opt.mix[0] + opt.mix[1] + opt.mix[2];
        n_upload = opt.streams * opt.mix[2] / wsum;
        gsize = n_upload < GROUP_MAX ? n_upload : GROUP_MAX;
        n_upload = gsize ? n_upload / gsize * gsize : 0;
        n_batch = opt.streams * opt.mix[1] / wsum;
        n_index = opt.mix[0] ? opt.streams - n_upload - n_batch : 0;
    }

    snprintf(root, sizeof(root), "%s/soak.XXXXXX", opt.dir);
    if (!mkdtemp(root)) {
        perror("soak: mkdtemp");
        return 1;
    }
    if (opt.addr) {
        snprintf(addr, sizeof(addr), "%s", opt.addr);
    } else {
        daemon_pid = start_daemon(opt.sluiced, &port);
        snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    }
    clients = calloc((size_t)opt.clients, sizeof(*clients));
    for (int i = 0; i < opt.clients; i++)
        if (sl_client_connect(&clients[i], addr, &co))
            die("connect");
    {
        sl_info info;
        if (sl_client_info(clients[0], &info))
            die("Admin.GetInfo");
        sample_pid = (int)info.pid;
        if (daemon_pid && sample_pid != daemon_pid)
            sample_pid = daemon_pid;
        {
            double r;
            long f, th;
            if (!proc_read(&r, &f, &th))
                sample_pid = 0; /* a daemon on another host or in another pid namespace */
        }
    }
    snprintf(pfx, sizeof(pfx), "soak%d", (int)getpid());
    setup(clients[0], n_index, n_batch, n_upload, gsize);
    fprintf(out,
            "soak: %d streams (%d index, %d batch, %d uploads in %d groups of %d) + %d unary "
            "threads over %d channels to %s for %.0f s; daemon pid %d; %ld cores\n",
            opt.streams, n_index, n_batch, n_upload, n_groups, gsize, opt.unary_threads,
            opt.clients, addr, opt.duration, sample_pid, sysconf(_SC_NPROCESSORS_ONLN));
    fprintf(out, "%7s %9s %6s %7s %8s %12s %10s %9s %9s %7s %7s %7s\n", "t(s)", "rss(MiB)", "fds",
            "threads", "streams", "indices/s", "batches/s", "up MiB/s", "ops/s", "errors", "cpu(d)",
            "cpu(c)");

    /* Every connection up, then the daemon's state before the load. */
    for (int i = 0; i < opt.clients; i++) {
        sl_info info;
        if (sl_client_info(clients[i], &info))
            die("Admin.GetInfo");
    }
    memset(&before, 0, sizeof(before));
    proc_read(&before.rss_mib, &before.fds, &before.threads);

    samples = calloc(MAX_SAMPLES, sizeof(*samples));
    ws = calloc((size_t)(n_index + n_batch + n_upload + opt.unary_threads), sizeof(*ws));
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256u << 10);
    {
        int k = 0, n_total = n_index + n_batch + n_upload + opt.unary_threads;
        for (int j = 0; j < n_jobs; j++)
            for (uint32_t r = 0; r < jobs[j].world; r++, k++) {
                worker *w = &ws[n_workers++];
                w->c = clients[(size_t)k * (size_t)opt.clients / (size_t)n_total];
                w->job = &jobs[j];
                w->rank = r;
            }
        for (int gi = 0; gi < n_groups; gi++)
            for (int r = 0; r < gsize; r++, k++) {
                worker *w = &ws[n_workers++];
                w->c = clients[(size_t)k * (size_t)opt.clients / (size_t)n_total];
                w->grp = &groups[gi];
                w->rank = (uint32_t)r;
            }
        for (int u = 0; u < opt.unary_threads; u++, k++) {
            worker *w = &ws[n_workers++];
            w->c = clients[(size_t)k * (size_t)opt.clients / (size_t)n_total];
            w->rank = (uint32_t)u;
        }
    }
    t0 = now_s();
    for (int i = 0; i < n_workers; i++) {
        worker *w = &ws[i];
        void *(*fn)(void *) = w->job ? rank_main : w->grp ? upload_main : unary_main;
        w->rng = 0x2545f4914f6cdd1dull ^ ((uint64_t)i * 0x9e3779b97f4a7c15ull);
        w->h = calloc(H_N, sizeof(hist));
        if (w->job)
            atomic_fetch_add(&w->job->alive, 1);
        if (!w->h || pthread_create(&w->th, &attr, fn, w) != 0) {
            fprintf(stderr, "soak: cannot start thread %d\n", i);
            if (w->job)
                atomic_fetch_sub(&w->job->alive, 1);
            free(w->h);
            atomic_store(&stopping, 1);
            n_workers = i;
            failed = 1;
            break;
        }
    }

    /* The time series. */
    {
        sample prev = {0};
        cpu_read(&prev.cpu_daemon, &prev.cpu_self);
        double next = t0 + opt.interval;
        while (!failed) {
            sample s;
            double t = now_s(), dt;
            uint64_t ops = 0, errs = 0;
            if (t - t0 >= opt.duration)
                break;
            if (t < next) {
                double d = next - t, left = t0 + opt.duration - t;
                if (left < d)
                    d = left;
                usleep((useconds_t)(d * 1e6));
                continue;
            }
            next += opt.interval;
            memset(&s, 0, sizeof(s));
            s.t = t - t0;
            if (sample_pid && !proc_read(&s.rss_mib, &s.fds, &s.threads)) {
                fprintf(stderr, "soak: the daemon (pid %d) is gone\n", sample_pid);
                atomic_store(&fatal_daemon, 1);
                break;
            }
            for (int k = 0; k < K_N; k++) {
                ops += atomic_load(&g_ops[k]);
                errs += atomic_load(&g_errs[k]);
            }
            s.indices = atomic_load(&g_indices);
            s.batches = atomic_load(&g_batches);
            s.bytes = atomic_load(&g_bytes);
            s.open_streams = atomic_load(&g_open_streams);
            s.ops = ops;
            s.errs = errs;
            cpu_read(&s.cpu_daemon, &s.cpu_self);
            dt = s.t - prev.t;
            fprintf(out,
                    "%7.1f %9.1f %6ld %7ld %8" PRIu64 " %12.0f %10.0f %9.1f %9.0f %7" PRIu64
                    " %6.0f%% %6.0f%%\n",
                    s.t, s.rss_mib, s.fds, s.threads, s.open_streams,
                    (double)(s.indices - prev.indices) / dt,
                    (double)(s.batches - prev.batches) / dt,
                    (double)(s.bytes - prev.bytes) / MiB / dt, (double)(s.ops - prev.ops) / dt,
                    s.errs, 100 * (s.cpu_daemon - prev.cpu_daemon) / dt,
                    100 * (s.cpu_self - prev.cpu_self) / dt);
            fflush(out);
            if (n_samples < MAX_SAMPLES)
                samples[n_samples++] = s;
            prev = s;
        }
    }
    t_stop = now_s() - t0;
    atomic_store(&stopping, 1);

    /* Drain: rank threads waiting in the daemon for the next epoch are released by advancing
     * their jobs by hand (Epochs.Next); a stream that then finds its epoch over is expected. */
    for (;;) {
        int alive = 0;
        for (int j = 0; j < n_jobs; j++) {
            if (atomic_load(&jobs[j].alive) == 0)
                continue;
            alive = 1;
            if (!atomic_load(&fatal_daemon))
                sl_epoch_next(clients[0], jobs[j].name, 0, 0, NULL);
        }
        if (!alive)
            break;
        usleep(200000);
    }
    for (int i = 0; i < n_workers; i++) {
        pthread_join(ws[i].th, NULL);
        h_merge(ws[i].h);
        free(ws[i].h);
    }
    t_end = now_s() - t0;
    pthread_attr_destroy(&attr);

    /* Quiesced: every stream closed; the daemon gives freed heap back within 10 s. */
    idle = opt.duration < 12 ? (opt.duration < 1 ? 1 : opt.duration) : 12;
    usleep((useconds_t)(idle * 1e6));
    memset(&after, 0, sizeof(after));
    if (sample_pid && !proc_read(&after.rss_mib, &after.fds, &after.threads))
        atomic_store(&fatal_daemon, 1);

    /* Summary. */
    {
        uint64_t ops = 0, errs = 0;
        sample w0, wm, we;
        const sample *s0 = NULL, *sm = NULL, *se = NULL;
        double w = 0;
        t_warm = opt.warmup;
        if (n_samples) {
            /* Start, middle and end are means over windows of a fifth of the measured time,
             * at most a minute. */
            double last = samples[n_samples - 1].t + opt.interval / 2;
            w = (last - t_warm) / 5;
            w = w > 60 ? 60 : w < opt.interval ? opt.interval : w;
            w0 = window(t_warm, t_warm + w);
            wm = window((t_warm + last - w) / 2, (t_warm + last + w) / 2);
            we = window(last - w, last);
            s0 = &w0;
            sm = &wm;
            se = &we;
        }
        fprintf(out, "\nsoak: load ran %.1f s (all streams closed at %.1f s)\n", t_stop, t_end);
        fprintf(out, "operations and errors by kind:\n");
        for (int k = 0; k < K_N; k++) {
            uint64_t o = atomic_load(&g_ops[k]), e = atomic_load(&g_errs[k]);
            ops += o;
            errs += e;
            fprintf(out, "  %-18s %10" PRIu64 " ops %6" PRIu64 " errors\n", k_names[k], o, e);
        }
        fprintf(out, "  %-18s %10" PRIu64 " ops %6" PRIu64 " errors", "total", ops, errs);
        fprintf(out, "  (%" PRIu64 " streams found their epoch over during the drain)\n",
                (uint64_t)atomic_load(&g_drain_errs));
        for (int i = 0; i < g_n_msgs; i++)
            fprintf(out, "  error: %s\n", g_msgs[i]);
        fprintf(out, "latency (ms)                   count       p50       p90       p99     "
                     "p99.9       max\n");
        for (int k = 0; k < H_N; k++)
            print_pct(out, h_names[k], &g_hist[k]);
        fprintf(out,
                "throughput: %.0f indices/s, %.0f batches/s, %.1f MiB/s uploaded (%" PRIu64
                " MiB in %" PRIu64 " shards)\n",
                (double)atomic_load(&g_indices) / t_stop, (double)atomic_load(&g_batches) / t_stop,
                (double)atomic_load(&g_bytes) / MiB / t_stop,
                (uint64_t)(atomic_load(&g_bytes) >> 20), (uint64_t)atomic_load(&g_ops[K_UPLOAD]));
        if (s0 && sample_pid) {
            fprintf(out,
                    "daemon RSS (MiB), means over %.0f s from t=: start %.1f (%.0f s)  middle "
                    "%.1f (%.0f s)  end %.1f (%.0f s)  drift %+.1f (%+.1f%%), slope %+.2f "
                    "MiB/min; %.0f s after the load %.1f\n",
                    w, s0->rss_mib, s0->t, sm->rss_mib, sm->t, se->rss_mib, se->t,
                    se->rss_mib - s0->rss_mib,
                    s0->rss_mib > 0 ? 100 * (se->rss_mib - s0->rss_mib) / s0->rss_mib : 0,
                    slope(s0->t, 0), idle, after.rss_mib);
            fprintf(out,
                    "daemon fds: start %ld  middle %ld  end %ld  drift %+ld, slope %+.2f/min; "
                    "after the load %ld\n",
                    s0->fds, sm->fds, se->fds, se->fds - s0->fds, slope(s0->t, 1), after.fds);
            fprintf(out, "daemon threads: start %ld  middle %ld  end %ld; after the load %ld\n",
                    s0->threads, sm->threads, se->threads, after.threads);
            fprintf(out, "daemon before the load: RSS %.1f MiB, %ld fds, %ld threads\n",
                    before.rss_mib, before.fds, before.threads);
        }
        /* The same connections are open before and after: any other descriptor left open
         * (a shard file, a catalog handle) is a leak. */
        if (sample_pid && after.fds > before.fds) {
            fprintf(out, "soak: the daemon has %ld open fds after the load, %ld before it\n",
                    after.fds, before.fds);
            failed = 1;
        } else if (!sample_pid) {
            fprintf(out, "daemon RSS and fds: not visible from here\n");
        }
        if (errs)
            failed = 1;
        if (opt.json) {
            printf("{\"streams\":%d,\"duration_s\":%.1f,\"errors\":%" PRIu64 ",\"ops\":{",
                   opt.streams, t_stop, errs);
            for (int k = 0; k < K_N; k++)
                printf("%s\"%s\":[%llu,%llu]", k ? "," : "", k_keys[k],
                       (unsigned long long)atomic_load(&g_ops[k]),
                       (unsigned long long)atomic_load(&g_errs[k]));
            printf("},\"latency_ms\":{");
            for (int k = 0; k < H_N; k++)
                printf("%s\"%s\":{\"n\":%" PRIu64 ",\"p50\":%.3f,\"p90\":%.3f,\"p99\":%.3f,"
                       "\"p999\":%.3f,\"max\":%.3f}",
                       k ? "," : "", h_keys[k], g_hist[k].n, h_quantile(&g_hist[k], 0.5),
                       h_quantile(&g_hist[k], 0.9), h_quantile(&g_hist[k], 0.99),
                       h_quantile(&g_hist[k], 0.999), (double)g_hist[k].max_us / 1e3);
            printf("},\"throughput\":{\"indices_per_s\":%.0f,\"batches_per_s\":%.0f,"
                   "\"upload_mib_per_s\":%.2f},\"series\":[",
                   (double)atomic_load(&g_indices) / t_stop,
                   (double)atomic_load(&g_batches) / t_stop,
                   (double)atomic_load(&g_bytes) / MiB / t_stop);
            for (size_t i = 0; i < n_samples; i++)
                printf("%s{\"t\":%.1f,\"rss_mib\":%.1f,\"fds\":%ld,\"threads\":%ld}", i ? "," : "",
                       samples[i].t, samples[i].rss_mib, samples[i].fds, samples[i].threads);
            if (s0)
                printf(
                    "],\"window_s\":%.0f,\"rss_mib\":{\"start\":%.1f,\"middle\":%.1f,\"end\":%.1f,"
                    "\"slope_per_min\":%.2f},\"fds\":{\"start\":%ld,\"middle\":%ld,\"end\":%ld,"
                    "\"slope_per_min\":%.2f",
                    w, s0->rss_mib, sm->rss_mib, se->rss_mib, slope(s0->t, 0), s0->fds, sm->fds,
                    se->fds, slope(s0->t, 1));
            printf("%s,\"before\":{\"rss_mib\":%.1f,\"fds\":%ld,\"threads\":%ld}", s0 ? "}" : "]",
                   before.rss_mib, before.fds, before.threads);
            printf(",\"after\":{\"rss_mib\":%.1f,\"fds\":%ld,\"threads\":%ld}}\n", after.rss_mib,
                   after.fds, after.threads);
        }
    }

    for (int i = 0; i < opt.clients; i++)
        sl_client_close(clients[i]);
    free(clients);
    if (atomic_load(&fatal_daemon)) {
        fprintf(stderr, "soak: the daemon died during the run (see %s/sluiced.log)\n", root);
        failed = 1;
        daemon_ok = 0;
    }
    if (daemon_pid) {
        int st;
        kill(daemon_pid, SIGTERM);
        if (waitpid(daemon_pid, &st, 0) != daemon_pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "soak: sluiced did not exit cleanly (status 0x%x); log in %s\n", st,
                    root);
            failed = 1;
            daemon_ok = 0;
        }
    }
    for (int i = 0; i < n_groups; i++)
        pthread_barrier_destroy(&groups[i].bar);
    free(groups);
    free(jobs);
    free(ws);
    free(samples);
    close(src_fd);
    if (daemon_pid) {
        /* What the daemon logged at warn and above. */
        char path[4200], line[1024];
        int n = 0;
        FILE *f;
        snprintf(path, sizeof(path), "%s/sluiced.log", root);
        f = fopen(path, "r");
        while (f && fgets(line, sizeof(line), f))
            if (n++ < 10)
                fprintf(out, "  sluiced log: %s", line);
        if (f)
            fclose(f);
        fprintf(out, "soak: the daemon logged %d lines at warn or above\n", n);
    }
    if (daemon_ok) {
        char cmd[4200];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
        if (system(cmd) != 0)
            fprintf(stderr, "soak: could not remove %s\n", root);
    }
    fprintf(out, "soak: %s\n", failed ? "FAILED" : "ok");
    return failed;
}
