/* Benchmark of stratified shares and class-balanced epochs (common/sample/strat.c) next to plain
 * feistel shares: indices per second on one core over rank 0's share of R = 8, and bytes of memory
 * per sample beyond the labels (the grouped index plus per-class state, from peak RSS). Each
 * measurement runs in a forked child so its RSS is its own; medians of --runs runs.
 *
 *   strat_bench [--runs K] [--smoke] [--max-n N] [--row MODE,N,CLASSES]
 *
 * --row measures one row only (MODE 0 feistel, 1 stratify, 2 balance), e.g. under perf.
 *
 * Labels: class of sample i = a hash of i, skewed so class c holds about twice as many samples as
 * class c + 1 for the first classes (imbalanced), with 10 and 10,000 classes. Rows: plain
 * feistel, stratify, balance (uniform class weights). tests/bench/strat_bench.py runs torch's
 * WeightedRandomSampler in the same run and prints ratios. */
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
    double rate;
    double bytes_per_sample;
    unsigned long long checksum;
} result;

static double now(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;

    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2)
            res = 0;
        fclose(f);
    }
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

static uint32_t label_of(uint64_t i, uint32_t C)
{
    uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ULL;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 29;
    /* Half of the samples in class 0, a quarter in class 1, ... then uniform over the rest. */
    for (uint32_t c = 0; c + 1 < C && c < 6; c++, h >>= 1)
        if (h & 1)
            return c;
    return (uint32_t)((h >> 8) % C);
}

static void measure(result *res, uint64_t n, uint32_t C, int mode)
{
    static uint64_t buf[1 << 14];
    uint32_t *lab = NULL;
    sl_sample_labels *L = NULL;
    sl_sample_config cfg;
    sl_sample *s = NULL;
    char msg[256];
    long before;
    double t0, t1;
    size_t got;
    unsigned passes = 0;

    memset(res, 0, sizeof(*res));
    sl_sample_config_init(&cfg);
    cfg.samples = n;
    cfg.replicas = 8;
    cfg.seed = 1;
    cfg.epoch = 2;
    if (mode) {
        lab = malloc(n * sizeof(*lab));
        for (uint64_t i = 0; i < n; i++)
            lab[i] = label_of(i, C);
    }
    before = rss_kb();
    if (mode) {
        if (sl_sample_labels_new(&L, lab, n, msg, sizeof(msg)) != 0) {
            fprintf(stderr, "labels: %s\n", msg);
            exit(1);
        }
        cfg.labels = L;
        cfg.classes = mode == 1 ? SL_SAMPLE_CLASSES_STRATIFY : SL_SAMPLE_CLASSES_BALANCE;
    }
    if (sl_sample_new(&s, &cfg, msg, sizeof(msg)) != 0) {
        fprintf(stderr, "new: %s\n", msg);
        exit(1);
    }
    /* The whole share, again from position 0 until 0.2 s have passed: at N = 1e6 one pass takes
     * about a millisecond, which one scheduler hiccup on a shared machine would decide. */
    t0 = now();
    do {
        if (passes++ && sl_sample_seek(s, 0) != 0)
            exit(1);
        while (sl_sample_next(buf, &got, s, sizeof(buf) / sizeof(buf[0])) == 0 && got)
            for (size_t k = 0; k < got; k += 997)
                res->checksum += buf[k];
        t1 = now();
    } while (t1 - t0 < 0.2);
    res->rate = (double)sl_sample_count(s) * (double)passes / (t1 - t0);
    res->bytes_per_sample = (double)(rss_kb() - before) * 1024.0 / (double)n;
    sl_sample_free(s);
    sl_sample_labels_free(L);
    free(lab);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static void row(uint64_t n, uint32_t C, int mode, int runs)
{
    static const char *const names[] = {"feistel", "stratify", "balance"};
    double rates[32], bytes = 0;

    for (int k = 0; k < runs; k++) {
        int fd[2];
        result r;
        pid_t pid;
        if (pipe(fd) != 0)
            exit(1);
        if ((pid = fork()) == 0) {
            measure(&r, n, C, mode);
            if (write(fd[1], &r, sizeof(r)) != (ssize_t)sizeof(r))
                _exit(1);
            _exit(0);
        }
        close(fd[1]);
        if (read(fd[0], &r, sizeof(r)) != (ssize_t)sizeof(r))
            exit(1);
        close(fd[0]);
        waitpid(pid, NULL, 0);
        rates[k] = r.rate;
        bytes = r.bytes_per_sample;
    }
    qsort(rates, (size_t)runs, sizeof(rates[0]), cmp_double);
    printf("%-9s N=%-10.0e classes=%-6u rate %8.2f M idx/s/core  memory beyond labels %5.2f "
           "B/sample\n",
           names[mode], (double)n, mode ? C : 0, rates[runs / 2] / 1e6, bytes);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int runs = 5, smoke = 0, only = 0, row_mode = 0;
    uint64_t max_n = 100000000, row_n = 0;
    uint32_t row_c = 0;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--smoke") == 0)
            smoke = 1;
        else if (strcmp(argv[i], "--max-n") == 0 && i + 1 < argc)
            max_n = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--row") == 0 && i + 1 < argc) {
            unsigned long long rn = 0;
            unsigned mode = 0, rc = 0;
            if (sscanf(argv[++i], "%u,%llu,%u", &mode, &rn, &rc) != 3 || mode > 2 || rn == 0)
                return 2;
            only = 1;
            row_mode = (int)mode;
            row_n = rn;
            row_c = rc;
        }
    }
    if (runs < 1 || runs > 31)
        runs = 5;
    if (only) {
        row(row_n, row_c, row_mode, runs);
        return 0;
    }
    if (smoke) {
        row(10000, 10, 0, 1);
        row(10000, 10, 1, 1);
        row(10000, 10, 2, 1);
        return 0;
    }
    for (uint64_t n = 1000000; n <= max_n; n *= 100) {
        row(n, 0, 0, runs);
        for (int mode = 1; mode <= 2; mode++) {
            row(n, 10, mode, runs);
            row(n, 10000, mode, runs);
        }
    }
    return 0;
}
