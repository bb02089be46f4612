/* Benchmark of common/sample/: indices per second on one core, time to the first index and
 * peak RSS, per shuffle mode and dataset size. Each measurement runs in a forked child so its
 * peak RSS is its own. Prints medians of --runs runs (default 5).
 *
 *   sample_bench [--runs K] [--smoke] [--share R] [--shuffle none|torch|feistel]
 *
 * Modes: throughput lists one rank's share with R = 1 (the whole epoch order; at most 2e8
 * indices, so the 1e9 feistel case measures the first 2e8); --share R lists rank 0's share of R
 * replicas at N = 1e7 and 1e8, the figure to put next to torch's DistributedSampler (see
 * sample_bench.py). "worst-walk" is feistel at N = 2^27 + 1, the most cycle-walking.
 * --shuffle runs the rows of one shuffle mode only. --smoke runs tiny sizes once
 * (for ctest). */
#define _POSIX_C_SOURCE 200809L
#include "sample/sample.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct result {
    double first_s, total_s, rate;
    long rss_kb;
    unsigned long long checksum;
} result;

static double now(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void measure(result *res, uint64_t n, uint32_t R, int shuffle, uint64_t limit)
{
    static uint64_t buf[1 << 16];
    sl_sample_config c;
    sl_sample *s = NULL;
    uint64_t done = 0, sum = 0;
    size_t got;
    double t0 = now(), t1;

    sl_sample_config_init(&c);
    c.samples = n;
    c.replicas = R;
    c.shuffle = shuffle;
    c.seed = 1;
    c.epoch = 2;
    if (sl_sample_new(&s, &c, NULL, 0) || sl_sample_next(buf, &got, s, 1)) {
        fprintf(stderr, "sample_bench: cannot create the stream\n");
        exit(1);
    }
    t1 = now();
    sum = buf[0];
    done = got;
    while (done < limit && sl_sample_next(buf, &got, s, sizeof(buf) / sizeof(buf[0])) == 0 && got) {
        for (size_t i = 0; i < got; i++)
            sum += buf[i];
        done += got;
    }
    res->first_s = t1 - t0;
    res->total_s = now() - t0;
    res->rate = (double)done / (now() - t1);
    res->checksum = sum;
    sl_sample_free(s);
}

static void run_child(result *res, uint64_t n, uint32_t R, int shuffle, uint64_t limit)
{
    int fds[2];
    pid_t pid;
    struct rusage ru;
    int status;

    if (pipe(fds) || (pid = fork()) < 0) {
        perror("sample_bench");
        exit(1);
    }
    if (pid == 0) {
        close(fds[0]);
        measure(res, n, R, shuffle, limit);
        if (write(fds[1], res, sizeof(*res)) != (ssize_t)sizeof(*res))
            _exit(1);
        _exit(0);
    }
    close(fds[1]);
    if (read(fds[0], res, sizeof(*res)) != (ssize_t)sizeof(*res)) {
        fprintf(stderr, "sample_bench: child failed\n");
        exit(1);
    }
    close(fds[0]);
    wait4(pid, &status, 0, &ru);
    res->rss_kb = ru.ru_maxrss;
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

static void row(const char *what, uint64_t n, uint32_t R, int shuffle, uint64_t limit, int runs)
{
    double first[32], total[32], rate[32], rss[32];
    result r;

    for (int i = 0; i < runs; i++) {
        run_child(&r, n, R, shuffle, limit);
        first[i] = r.first_s;
        total[i] = r.total_s;
        rate[i] = r.rate;
        rss[i] = (double)r.rss_kb;
    }
    printf("%-10s %-8s N=%-11.0e R=%-3u first=%10.3f ms  total=%8.3f s  rate=%8.1f M idx/s  "
           "peak RSS=%8.1f MB\n",
           what, sl_sample_shuffle_name(shuffle), (double)n, R, median(first, runs) * 1e3,
           median(total, runs), median(rate, runs) / 1e6, median(rss, runs) / 1024.0);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int runs = 5, smoke = 0, only = -1;
    uint32_t share = 8;
    sl_sample_shuffle sh_only;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--share") == 0 && i + 1 < argc)
            share = (uint32_t)atoi(argv[++i]);
        else if (strcmp(argv[i], "--smoke") == 0)
            smoke = 1;
        else if (strcmp(argv[i], "--shuffle") == 0 && i + 1 < argc &&
                 sl_sample_shuffle_parse(&sh_only, argv[i + 1]) == 0) {
            only = (int)sh_only;
            i++;
        } else {
            fprintf(stderr, "usage: sample_bench [--runs K] [--smoke] [--share R] "
                            "[--shuffle none|torch|feistel]\n");
            return 2;
        }
    }
    if (runs < 1 || runs > 32)
        runs = 5;
    if (smoke) {
        for (int sh = 0; sh < 3; sh++)
            row("smoke", 100000, 1, sh, UINT64_MAX, 1);
        return 0;
    }
    printf("# median of %d runs; one core; seed 1 epoch 2\n", runs);
    for (int sh = 0; sh < 3; sh++) {
        if (only >= 0 && sh != only)
            continue;
        row("epoch", 1000000, 1, sh, UINT64_MAX, runs);
        row("epoch", 100000000, 1, sh, UINT64_MAX, runs);
    }
    if (only < 0 || only == SL_SAMPLE_SHUFFLE_FEISTEL) {
        row("epoch-2e8", 1000000000, 1, SL_SAMPLE_SHUFFLE_FEISTEL, 200000000, runs);
        /* Just above a power of two: nearly half of every pass walks out of [0, N). */
        row("worst-walk", (UINT64_C(1) << 27) + 1, 1, SL_SAMPLE_SHUFFLE_FEISTEL, UINT64_MAX, runs);
    }
    for (int sh = 1; sh < 3; sh++) {
        if (only >= 0 && sh != only)
            continue;
        row("rank-share", 10000000, share, sh, UINT64_MAX, runs);
        row("rank-share", 100000000, share, sh, UINT64_MAX, runs);
    }
    return 0;
}
