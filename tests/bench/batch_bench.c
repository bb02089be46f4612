/* Benchmark of common/batch/: plan time, peak memory and plan quality per strategy.
 *
 *   batch_bench [--lengths FILE.u32 | --n N] [--runs R] [--max-tokens T] [--max-seq-len L]
 *               [--window-batches K] [--strategy S]
 *
 * Lengths come from a raw little-endian uint32 file (tests/bench/batch_bench.py writes the issue's
 * lognormal(5.5, 1) lengths clipped to [1, 4096]) or are generated here from the same
 * distribution. The order is a seeded shuffle of [0, N). Each configuration is planned R times;
 * the median wall time is reported with the planner's own peak allocation and the process's peak
 * RSS growth during one plan (VmHWM after resetting it through /proc/self/clear_refs). Output: one
 * JSON object per configuration.
 */
#include "batch/batch.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rs = 20261121;

static uint64_t rnd(void)
{
    uint64_t z = (rs += 0x9E3779B97F4A7C15ull);

    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rnd01(void)
{
    return (double)(rnd() >> 11) / 9007199254740992.0;
}

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU time of this process: on a shared machine it leaves out the time other processes held
 * the core (not their effect on the caches). */
static double cpu_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* kB from a /proc/self/status line such as "VmHWM:   1234 kB"; -1 if unavailable. */
static long status_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t kl = strlen(key);

    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtol(line + kl + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

static void reset_hwm(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");

    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

static uint32_t *load(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    uint32_t *v = NULL;
    long size;

    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) > 0 && size % 4 == 0) {
        rewind(f);
        v = malloc((size_t)size);
        if (v && fread(v, 1, (size_t)size, f) != (size_t)size) {
            free(v);
            v = NULL;
        }
        *n = (size_t)size / 4;
    }
    fclose(f);
    return v; /* the file is little-endian, as is every host this runs on */
}

int main(int argc, char **argv)
{
    const char *path = NULL, *only = NULL;
    size_t n = 1000000;
    int runs = 5;
    uint64_t max_tokens = 16384;
    uint32_t max_seq_len = 4096;
    double window_batches = 100;
    uint32_t *len;
    uint64_t *order, total = 0;

    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--lengths") == 0)
            path = argv[i + 1];
        else if (strcmp(argv[i], "--n") == 0)
            n = strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--runs") == 0)
            runs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--max-tokens") == 0)
            max_tokens = strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--max-seq-len") == 0)
            max_seq_len = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--window-batches") == 0)
            window_batches = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--strategy") == 0)
            only = argv[i + 1];
        else {
            fprintf(stderr, "batch_bench: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (runs < 1 || runs > 100)
        runs = 1;
    if (path) {
        if (!(len = load(path, &n))) {
            fprintf(stderr, "batch_bench: cannot read %s\n", path);
            return 1;
        }
    } else {
        if (!(len = malloc(n * sizeof(uint32_t))))
            return 1;
        for (size_t i = 0; i < n; i++) {
            double z = sqrt(-2 * log(rnd01() + 1e-300)) * cos(6.283185307179586 * rnd01());
            double v = exp(5.5 + z);

            len[i] = v < 1 ? 1 : v > 4096 ? 4096 : (uint32_t)v;
        }
    }
    if (!(order = malloc(n * sizeof(uint64_t))))
        return 1;
    for (size_t i = 0; i < n; i++) {
        order[i] = i;
        total += len[i] < max_seq_len ? len[i] : max_seq_len;
    }
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(rnd() % i);
        uint64_t t = order[i - 1];

        order[i - 1] = order[j];
        order[j] = t;
    }

    /* A window of K batches holds about K x max_tokens / mean length sequences. */
    {
        double mean = (double)total / (double)n;
        uint64_t win = (uint64_t)(window_batches * (double)max_tokens / mean);
        struct {
            const char *name;
            sl_batch_strategy s;
            uint64_t window;
            uint32_t max_batch;
        } cases[] = {
            {"pad", SL_BATCH_PAD, 0, (uint32_t)(max_tokens / max_seq_len)},
            {"bucket", SL_BATCH_BUCKET, win, 1u << 20},
            {"bucket-epoch", SL_BATCH_BUCKET, 0, 1u << 20},
            {"dynamic", SL_BATCH_DYNAMIC, win, 1u << 20},
            {"dynamic-epoch", SL_BATCH_DYNAMIC, 0, 1u << 20},
            {"packed", SL_BATCH_PACKED, win, 1u << 20},
            {"packed-epoch", SL_BATCH_PACKED, 0, 1u << 20},
        };

        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
            sl_batch_config cfg;
            double t[100], ct[100];
            sl_batch_stats st = {0};
            size_t held = 0, peak = 0;
            long rss0 = -1, hwm = -1;

            if (only && strcmp(cases[c].name, only) != 0)
                continue;
            sl_batch_config_init(&cfg);
            cfg.strategy = cases[c].s;
            cfg.max_batch_size = cases[c].max_batch ? cases[c].max_batch : 1;
            cfg.max_seq_len = max_seq_len;
            cfg.max_tokens = max_tokens;
            cfg.window = cases[c].window;
            cfg.seed = 1;
            for (int r = 0; r < runs; r++) {
                sl_batch_plan *p;
                char msg[256];
                double t0;
                int err;

                if (r == 0) {
                    reset_hwm();
                    rss0 = status_kb("VmRSS");
                }
                t0 = now();
                ct[r] = cpu_now();
                err = sl_batch_plan_new(&p, &cfg, len, n, order, n, msg, sizeof(msg));
                t[r] = now() - t0;
                ct[r] = cpu_now() - ct[r];
                if (err) {
                    fprintf(stderr, "batch_bench: %s: %s\n", cases[c].name, msg);
                    return 1;
                }
                if (r == 0) {
                    hwm = status_kb("VmHWM");
                    sl_batch_plan_stats(p, -1, &st);
                    sl_batch_plan_memory(p, &held, &peak);
                }
                sl_batch_plan_free(p);
            }
            qsort(t, (size_t)runs, sizeof(double), cmp_double);
            qsort(ct, (size_t)runs, sizeof(double), cmp_double);
            printf("{\"strategy\":\"%s\",\"n\":%zu,\"window\":%" PRIu64 ",\"runs\":%d,"
                   "\"plan_s_median\":%.4f,\"plan_s_min\":%.4f,\"cpu_s_median\":%.4f,"
                   "\"batches\":%" PRIu64
                   ",\"padding_fraction\":%.5f,\"fill\":%.5f,\"held_bytes_per_seq\":%.2f,"
                   "\"peak_bytes_per_seq\":%.2f,\"rss_growth_bytes_per_seq\":%.2f}\n",
                   cases[c].name, n, cfg.window, runs, t[runs / 2], t[0], ct[runs / 2], st.batches,
                   st.padding_fraction, st.fill, (double)held / (double)n, (double)peak / (double)n,
                   rss0 >= 0 && hwm >= 0 ? (double)(hwm - rss0) * 1024.0 / (double)n : -1.0);
            fflush(stdout);
        }
    }
    free(order);
    free(len);
    return 0;
}
