/* Checkpoint benchmark: one 1 GiB upload (C client, 1 MiB chunks) next to `openssl speed -evp
 * sha256` (the single-core hashing limit) measured in the same run; 2 and 8 concurrent uploads
 * (1 GiB in total each); deep verify of 8 shards next to `sha256sum` of the same files run in
 * parallel. Every figure is the median of --runs runs.
 *
 * The single upload is measured twice: without the client's local SHA-256 (the daemon's path
 * alone) and with it (libsluice's default, which hashes on a helper thread on the same cores).
 *
 * Usage: ckpt_bench [--sluiced PATH] [--dir DIR] [--size MIB] [--runs N] [--chunk KIB] [--one]
 *                   [--smoke]
 * --one measures only the single upload (both ways). It starts its own sluiced (SLUICED or
 * --sluiced) on 127.0.0.1:0 with a data dir under DIR.
 */
#include "sluice_ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB (1024.0 * 1024.0)

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void die(const char *what)
{
    fprintf(stderr, "ckpt_bench: %s: %s\n", what, sl_client_error());
    exit(1);
}

/* openssl speed -evp sha256 on 1 MiB blocks, in bytes per second (0 if it cannot be run). */
static double openssl_speed(int seconds)
{
    char cmd[128], line[512], last[512] = "";
    double v = 0;
    FILE *p;

    snprintf(cmd, sizeof(cmd), "openssl speed -evp sha256 -bytes 1048576 -seconds %d 2>/dev/null",
             seconds);
    p = popen(cmd, "r");
    if (!p)
        return 0;
    while (fgets(line, sizeof(line), p))
        if (strncmp(line, "sha256", 6) == 0 || strncmp(line, "SHA256", 6) == 0)
            snprintf(last, sizeof(last), "%s", line);
    pclose(p);
    /* "sha256   1234567.89k": thousands of bytes per second. */
    {
        char *k = strrchr(last, 'k');
        char *sp;
        if (!k)
            return 0;
        *k = '\0';
        sp = strrchr(last, ' ');
        v = sp ? atof(sp + 1) * 1000.0 : 0;
    }
    return v;
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
    fprintf(stderr, "ckpt_bench: sluiced did not start\n");
    kill(pid, SIGKILL);
    exit(1);
}

typedef struct job {
    sl_client *c;
    const char *name;
    int32_t rank;
    int fd;
    uint64_t size;
    int client_hash;
    int err;
    sl_ckpt_shard receipt;
} job;

static size_t chunk_bytes = 1 << 20;
static pid_t daemon_pid;
static double cpu_daemon, cpu_client; /* CPU seconds of the last upload_round */
static char last_sha[65];             /* the daemon's SHA-256 of the last single upload */

/* CPU seconds (user + system) used so far by the daemon and by this process. */
static void cpu_now(double *d, double *c)
{
    unsigned long long ut = 0, st = 0;
    char path[64], buf[1024], *p;
    struct rusage ru;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)daemon_pid);
    f = fopen(path, "r");
    *d = 0;
    if (f) {
        /* Fields 14 and 15 (utime, stime), counted after the parenthesised command name. */
        if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')) != NULL &&
            sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2)
            *d = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
        fclose(f);
    }
    getrusage(RUSAGE_SELF, &ru);
    *c = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static void *upload_thread(void *arg)
{
    job *j = arg;
    sl_ckpt_upload_opts o = SL_CKPT_UPLOAD_OPTS_INIT;

    o.chunk_bytes = chunk_bytes;
    o.no_verify = !j->client_hash;
    j->err = sl_ckpt_upload_fd(j->c, &j->receipt, "bench", j->name, j->rank, j->fd, j->size, &o);
    if (j->err)
        fprintf(stderr, "ckpt_bench: upload: %s\n", sl_client_error());
    return NULL;
}

/* Upload n shards of `size` bytes concurrently into a new checkpoint; returns seconds. */
static double upload_round(sl_client *c, const char *name, int n, int fd, uint64_t size, int commit,
                           int client_hash)
{
    pthread_t th[16];
    job jobs[16];
    double t, d0, c0;

    if (sl_ckpt_begin(c, NULL, "bench", name, 0, n, NULL))
        die("begin");
    cpu_now(&d0, &c0);
    t = now_s();
    for (int i = 0; i < n; i++) {
        jobs[i] = (job){
            .c = c, .name = name, .rank = i, .fd = fd, .size = size, .client_hash = client_hash};
        pthread_create(&th[i], NULL, upload_thread, &jobs[i]);
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    t = now_s() - t;
    cpu_now(&cpu_daemon, &cpu_client);
    cpu_daemon -= d0;
    cpu_client -= c0;
    for (int i = 0; i < n; i++)
        if (jobs[i].err)
            exit(1);
    memcpy(last_sha, jobs[0].receipt.sha256, sizeof(last_sha));
    if (commit && sl_ckpt_commit(c, NULL, "bench", name))
        die("commit");
    if (!commit && sl_ckpt_abort(c, NULL, "bench", name))
        die("abort");
    return t;
}

int main(int argc, char **argv)
{
    const char *sluiced = getenv("SLUICED") ? getenv("SLUICED") : "sluiced";
    const char *base = "/tmp";
    uint64_t size_mib = 1024;
    int runs = 3, smoke = 0, only_one = 0, port;
    char root[4096], data[4200], port_file[4200], src[4200], addr[64], cmd[16384];
    double sha_limit, v1[9], v1h[9], v2[9], v8[9], vd[9], vs[9];
    double cd1[9], cc1[9], cd1h[9], cc1h[9]; /* CPU seconds per GiB: daemon, client */
    sl_client_opts co = SL_CLIENT_OPTS_INIT;
    sl_client *c;
    pid_t pid;
    int fd, st;

    co.timeout_ms = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sluiced") == 0 && i + 1 < argc)
            sluiced = argv[++i];
        else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
            base = argv[++i];
        else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc)
            size_mib = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--chunk") == 0 && i + 1 < argc)
            chunk_bytes = (size_t)strtoull(argv[++i], NULL, 10) << 10;
        else if (strcmp(argv[i], "--one") == 0)
            only_one = 1;
        else if (strcmp(argv[i], "--smoke") == 0)
            smoke = 1;
        else {
            fprintf(stderr, "usage: ckpt_bench [--sluiced PATH] [--dir DIR] [--size MIB] "
                            "[--runs N] [--chunk KIB] [--one] [--smoke]\n");
            return 2;
        }
    }
    if (smoke) {
        size_mib = 8;
        runs = 1;
    }
    if (runs < 1 || runs > 9 || size_mib < 8 || chunk_bytes < 1024 || chunk_bytes > (4u << 20)) {
        fprintf(stderr, "ckpt_bench: --runs in [1, 9], --size at least 8, --chunk in [1, 4096]\n");
        return 2;
    }
    snprintf(root, sizeof(root), "%s/ckpt_bench.XXXXXX", base);
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(data, sizeof(data), "%s/data", root);
    snprintf(port_file, sizeof(port_file), "%s/port", root);
    snprintf(src, sizeof(src), "%s/source", root);

    /* The source data: pseudo-random, written once (it stays in the page cache). */
    {
        uint64_t total = size_mib << 20, x = 0x9e3779b97f4a7c15ull;
        uint64_t *buf = malloc(1 << 20);
        fd = open(src, O_RDWR | O_CREAT | O_TRUNC, 0600);
        for (uint64_t off = 0; off < total; off += 1 << 20) {
            for (size_t i = 0; i < (1 << 20) / 8; i++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                buf[i] = x;
            }
            if (write(fd, buf, 1 << 20) != 1 << 20) {
                perror("write");
                return 1;
            }
        }
        free(buf);
    }

    sha_limit = openssl_speed(smoke ? 1 : 3);
    pid = start_daemon(sluiced, data, port_file, &port);
    daemon_pid = pid;
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    if (sl_client_connect(&c, addr, &co))
        die("connect");

    for (int r = 0; r < runs; r++) {
        char name[64], sha[65];
        uint64_t total = size_mib << 20;
        snprintf(name, sizeof(name), "one_%d", r);
        v1[r] = (double)total / upload_round(c, name, 1, fd, total, 0, 0);
        cd1[r] = cpu_daemon * 1024 / (double)size_mib;
        cc1[r] = cpu_client * 1024 / (double)size_mib;
        snprintf(name, sizeof(name), "one_hashed_%d", r);
        memcpy(sha, last_sha, sizeof(sha));
        v1h[r] = (double)total / upload_round(c, name, 1, fd, total, 0, 1);
        /* The upload without a local checksum must have delivered the same bytes as the one
         * whose receipt libsluice checked against its own SHA-256. */
        if (strcmp(sha, last_sha) != 0) {
            fprintf(stderr, "ckpt_bench: the daemon got %s without the client hash, %s with it\n",
                    sha, last_sha);
            return 1;
        }
        cd1h[r] = cpu_daemon * 1024 / (double)size_mib;
        cc1h[r] = cpu_client * 1024 / (double)size_mib;
        if (only_one)
            continue;
        snprintf(name, sizeof(name), "two_%d", r);
        v2[r] = (double)total / upload_round(c, name, 2, fd, total / 2, 0, 0);
        snprintf(name, sizeof(name), "eight_%d", r);
        v8[r] = (double)total / upload_round(c, name, 8, fd, total / 8, 1, 0);
        /* Deep verify of the 8 shards, then sha256sum of the same files in parallel. */
        {
            int ok = 0;
            double t = now_s();
            if (sl_ckpt_verify(c, &ok, NULL, NULL, NULL, "bench", name, 1) || !ok)
                die("verify");
            vd[r] = (double)total / (now_s() - t);
            size_t n = (size_t)snprintf(cmd, sizeof(cmd), "cd '%s/checkpoints/bench' && (", data);
            for (int k = 0; k < 8; k++)
                n += (size_t)snprintf(cmd + n, sizeof(cmd) - n,
                                      "sha256sum %s_shard_%d.shard >/dev/null & ", name, k);
            snprintf(cmd + n, sizeof(cmd) - n, "wait)");
            t = now_s();
            if (system(cmd) != 0)
                fprintf(stderr, "ckpt_bench: sha256sum failed\n");
            vs[r] = (double)total / (now_s() - t);
        }
        if (sl_ckpt_delete(c, "bench", name))
            die("delete");
    }
    sl_client_close(c);
    kill(pid, SIGTERM);
    waitpid(pid, &st, 0);
    close(fd);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "ckpt_bench: could not remove %s\n", root);

    {
        double m1 = median(v1, runs), m1h = median(v1h, runs);
        printf("ckpt_bench: %" PRIu64
               " MiB per round, median of %d runs, %ld cores, %zu KiB chunks\n",
               size_mib, runs, sysconf(_SC_NPROCESSORS_ONLN), chunk_bytes >> 10);
        printf("  openssl speed -evp sha256 (1 core): %8.1f MiB/s\n", sha_limit / MiB);
        printf("  1 upload, durable, no client hash:  %8.1f MiB/s  (%.0f%% of the SHA-256 limit)"
               "  CPU s/GiB daemon %.2f client %.2f\n",
               m1 / MiB, sha_limit > 0 ? 100.0 * m1 / sha_limit : 0.0, median(cd1, runs),
               median(cc1, runs));
        printf("  1 upload, durable, client hashes:   %8.1f MiB/s  (%.0f%% of the SHA-256 limit)"
               "  CPU s/GiB daemon %.2f client %.2f\n",
               m1h / MiB, sha_limit > 0 ? 100.0 * m1h / sha_limit : 0.0, median(cd1h, runs),
               median(cc1h, runs));
        if (only_one)
            return 0;
        double m2 = median(v2, runs), m8 = median(v8, runs);
        double md = median(vd, runs), ms = median(vs, runs);
        printf("  2 concurrent uploads (aggregate):   %8.1f MiB/s\n", m2 / MiB);
        printf("  8 concurrent uploads (aggregate):   %8.1f MiB/s\n", m8 / MiB);
        printf("  deep verify of 8 shards:            %8.1f MiB/s\n", md / MiB);
        printf("  sha256sum of the 8 files, parallel: %8.1f MiB/s  (verify is %.2fx)\n", ms / MiB,
               ms > 0 ? md / ms : 0.0);
    }
    return 0;
}
