/* Benchmark of the feeding service over loopback, with its own sluiced (SLUICED or --sluiced) on
 * 127.0.0.1:0 and a temporary data dir:
 *
 *   1. one rank's share of N samples over 8 ranks (feistel shuffle) delivered to the C client:
 *      indices/s and time to the first index (median of --runs);
 *   2. batches/s: a rank's token-budget batches of a dynamic plan over lognormal lengths
 *      (the first stream includes planning the epoch on the worker pool, reported apart);
 *   3. --streams S concurrent rank streams (one job of S ranks, 400k indices each in chunks of
 *      2048, one thread each): aggregate indices/s and the p99 gap between consecutive chunks
 *      seen by a client.
 *
 *   feed_bench [--sluiced PATH] [--samples N] [--runs R] [--streams S] [--smoke]
 *
 * tests/bench/feed_bench.py measures the Python client and torch's DistributedSampler locally.
 */
#include "err.h"
#include "sluice_feed.h"

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void die(const char *what)
{
    fprintf(stderr, "feed_bench: %s: %s\n", what, sl_client_error());
    exit(1);
}

static pid_t start_daemon(const char *sluiced, const char *data, const char *port_file, int *port)
{
    pid_t pid;
    FILE *f;

    unlink(port_file);
    pid = fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 1);
        execl(sluiced, sluiced, "--listen", "127.0.0.1:0", "--data-dir", data, "--port-file",
              port_file, "--log-level", "warn", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 500; i++) {
        usleep(20000);
        f = fopen(port_file, "r");
        if (f) {
            int ok = fscanf(f, "%d", port) == 1;
            fclose(f);
            if (ok)
                return pid;
        }
    }
    fprintf(stderr, "feed_bench: sluiced did not start\n");
    kill(pid, SIGKILL);
    exit(1);
}

/* Stream rank `rank`'s whole share from position 0; returns indices, seconds, first-index
 * seconds, and the gaps between chunks (if gaps != NULL, up to max_gaps). */
typedef struct share_run {
    sl_client *c;
    const char *job;
    uint32_t rank;
    uint32_t chunk;
    uint64_t got;
    double secs, first;
    double *gaps;
    size_t n_gaps, max_gaps;
    uint64_t checksum;
} share_run;

static void *run_share(void *arg)
{
    share_run *r = arg;
    sl_stream_opts o = SL_STREAM_OPTS_INIT;
    sl_index_stream *s = NULL;
    const uint64_t *idx;
    size_t n;
    uint64_t start;
    double t0 = now_s(), last = 0;
    int rc;

    o.position_set = 1;
    o.max_chunk = r->chunk;
    if (sl_indices_open(&s, r->c, r->job, r->rank, &o))
        die("open");
    r->got = 0;
    r->first = -1;
    while ((rc = sl_indices_next(s, &idx, &n, &start)) == 1) {
        double t = now_s();
        if (r->first < 0 && n)
            r->first = t - t0;
        if (r->gaps && last > 0 && r->n_gaps < r->max_gaps)
            r->gaps[r->n_gaps++] = t - last;
        last = t;
        for (size_t i = 0; i < n; i++)
            r->checksum += idx[i];
        r->got += n;
    }
    if (rc < 0)
        die("stream");
    r->secs = now_s() - t0;
    sl_indices_close(s);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *sluiced = getenv("SLUICED") ? getenv("SLUICED") : "sluiced";
    uint64_t samples = 100000000;
    int runs = 5, streams = 256, smoke = 0, port;
    char dir[] = "/tmp/feed-bench-XXXXXX", data[64], port_file[64], addr[64], cmd[128];
    sl_client_opts copts = SL_CLIENT_OPTS_INIT;
    sl_client *c;
    sl_job spec;
    pid_t pid;

    copts.timeout_ms = 60000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sluiced") == 0 && i + 1 < argc)
            sluiced = argv[++i];
        else if (strcmp(argv[i], "--samples") == 0 && i + 1 < argc)
            samples = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--streams") == 0 && i + 1 < argc)
            streams = atoi(argv[++i]);
        else if (strcmp(argv[i], "--smoke") == 0)
            smoke = 1;
        else {
            fprintf(stderr, "usage: feed_bench [--sluiced PATH] [--samples N] [--runs R] "
                            "[--streams S] [--smoke]\n");
            return 2;
        }
    }
    if (smoke) {
        samples = 200000;
        runs = 1;
        streams = 16;
    }
    if (runs < 1 || runs > 50 || streams < 1 || streams > 4096 || samples < 8) {
        fprintf(stderr, "feed_bench: bad arguments\n");
        return 2;
    }
    if (!mkdtemp(dir))
        return 1;
    snprintf(data, sizeof(data), "%s/data", dir);
    snprintf(port_file, sizeof(port_file), "%s/port", dir);
    pid = start_daemon(sluiced, data, port_file, &port);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    if (sl_client_connect(&c, addr, &copts))
        return 1;

    /* 1. One rank's share of N over 8 ranks. */
    if (sl_dataset_create(c, "big", samples, NULL))
        die("dataset");
    memset(&spec, 0, sizeof(spec));
    snprintf(spec.name, sizeof(spec.name), "share");
    snprintf(spec.dataset, sizeof(spec.dataset), "big");
    spec.world_size = 8;
    snprintf(spec.shuffle, sizeof(spec.shuffle), "feistel");
    if (sl_job_create(c, &spec, NULL))
        die("job");
    {
        double secs[50], first[50];
        uint64_t got = 0;
        for (int i = 0; i < runs; i++) {
            share_run r = {.c = c, .job = "share", .rank = 0, .chunk = 65536};
            run_share(&r);
            secs[i] = r.secs;
            first[i] = r.first;
            got = r.got;
        }
        printf("share       N=%llu ranks=8 indices=%llu  median %.3f s  %.1f M indices/s  "
               "first index %.2f ms\n",
               (unsigned long long)samples, (unsigned long long)got, median(secs, runs),
               (double)got / median(secs, runs) / 1e6, median(first, runs) * 1e3);
    }

    /* 2. Batches/s on lognormal lengths (mu 5.5, sigma 1, clipped to [1, 4096]). */
    {
        uint64_t nb = smoke ? 100000 : 1000000;
        uint32_t *len = malloc(sizeof(*len) * nb);
        uint64_t x = 88172645463325252ull;
        double secs[50], plan_first = 0;
        uint64_t batches = 0;

        for (uint64_t i = 0; i < nb; i++) {
            double u1, u2, z;
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            u1 = ((double)(x >> 11) + 0.5) / 9007199254740992.0;
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            u2 = ((double)(x >> 11) + 0.5) / 9007199254740992.0;
            z = sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
            z = exp(5.5 + z);
            len[i] = z < 1 ? 1 : z > 4096 ? 4096 : (uint32_t)z;
        }
        if (sl_dataset_create(c, "tok", nb, NULL) ||
            sl_dataset_upload_lengths(c, "tok", len, nb, NULL))
            die("lengths");
        free(len);
        memset(&spec, 0, sizeof(spec));
        snprintf(spec.name, sizeof(spec.name), "batches");
        snprintf(spec.dataset, sizeof(spec.dataset), "tok");
        spec.world_size = 8;
        spec.has_batching = 1;
        snprintf(spec.batching.strategy, sizeof(spec.batching.strategy), "dynamic");
        spec.batching.max_batch_size = 4096;
        spec.batching.max_seq_len = 4096;
        spec.batching.max_tokens = 16384;
        spec.batching.window = 100 * 64;
        if (sl_job_create(c, &spec, NULL))
            die("batch job");
        for (int i = 0; i <= runs; i++) {
            sl_stream_opts o = SL_STREAM_OPTS_INIT;
            sl_batch_stream *s = NULL;
            sl_feed_batch b;
            double t0 = now_s();
            int rc;
            o.position_set = 1;
            o.max_chunk = 256;
            batches = 0;
            if (sl_batches_open(&s, c, "batches", 0, &o))
                die("batches");
            while ((rc = sl_batches_next(s, &b)) == 1)
                batches++;
            if (rc < 0)
                die("batches stream");
            sl_batches_close(s);
            if (i == 0)
                plan_first = now_s() - t0;
            else
                secs[i - 1] = now_s() - t0;
        }
        printf("batches     N=%llu ranks=8 batches/rank=%llu  first stream (with planning) "
               "%.3f s  then median %.4f s  %.0f batches/s\n",
               (unsigned long long)nb, (unsigned long long)batches, plan_first, median(secs, runs),
               (double)batches / median(secs, runs));
    }

    /* 3. Many concurrent rank streams. */
    {
        share_run *rs = calloc((size_t)streams, sizeof(*rs));
        pthread_t *th = calloc((size_t)streams, sizeof(*th));
        sl_client **cs = calloc((size_t)streams, sizeof(*cs));
        uint64_t n = smoke ? 200000 : (uint64_t)streams * 400000, total = 0;
        double t0, secs, *all;
        size_t n_all = 0, max_gaps = 4096;

        if (sl_dataset_create(c, "many", n, NULL))
            die("dataset many");
        memset(&spec, 0, sizeof(spec));
        snprintf(spec.name, sizeof(spec.name), "many");
        snprintf(spec.dataset, sizeof(spec.dataset), "many");
        spec.world_size = (uint32_t)streams;
        snprintf(spec.shuffle, sizeof(spec.shuffle), "feistel");
        if (sl_job_create(c, &spec, NULL))
            die("job many");
        t0 = now_s();
        for (int i = 0; i < streams; i++) {
            /* One channel per 16 streams, as trainers on different hosts would have. */
            if (i % 16 == 0 && sl_client_connect(&cs[i], addr, &copts))
                return 1;
            rs[i] =
                (share_run){.c = cs[i - i % 16], .job = "many", .rank = (uint32_t)i, .chunk = 2048};
            rs[i].max_gaps = max_gaps;
            rs[i].gaps = malloc(sizeof(double) * max_gaps);
            pthread_create(&th[i], NULL, run_share, &rs[i]);
        }
        for (int i = 0; i < streams; i++)
            pthread_join(th[i], NULL);
        secs = now_s() - t0;
        all = malloc(sizeof(double) * max_gaps * (size_t)streams);
        for (int i = 0; i < streams; i++) {
            total += rs[i].got;
            memcpy(all + n_all, rs[i].gaps, rs[i].n_gaps * sizeof(double));
            n_all += rs[i].n_gaps;
            free(rs[i].gaps);
        }
        qsort(all, n_all, sizeof(double), cmp_double);
        printf("concurrent  streams=%d N=%llu  %.3f s  %.1f M indices/s aggregate  "
               "p99 gap between chunks %.2f ms (max %.2f ms)\n",
               streams, (unsigned long long)n, secs, (double)total / secs / 1e6,
               n_all ? all[(size_t)((double)n_all * 0.99)] * 1e3 : 0.0,
               n_all ? all[n_all - 1] * 1e3 : 0.0);
        if (total != n - n % (uint64_t)streams + (n % (uint64_t)streams ? (uint64_t)streams : 0)) {
            fprintf(stderr, "feed_bench: got %llu indices\n", (unsigned long long)total);
            return 1;
        }
        for (int i = 0; i < streams; i += 16)
            sl_client_close(cs[i]);
        free(all);
        free(rs);
        free(th);
        free(cs);
    }
    sl_client_close(c);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return 0;
}
