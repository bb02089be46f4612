/* server/memtrim.c: heap memory freed by other threads' arenas goes back to the system once the
 * timer's check finds the heap mostly free.
 *
 * Four threads allocate 1 MiB buffers in their own arenas (as gRPC's RPC threads do with upload
 * chunks, with main.c's mmap threshold so they are not mmap()ed), each followed by a small live
 * allocation that pins it below the arena's top; the main thread frees the buffers (as the loop
 * does). glibc keeps those pages resident; after the first check that trims, they are gone.
 * Skipped (exit 77) where the allocator is not glibc's, e.g. under AddressSanitizer.
 */
#include "memtrim.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#if defined(__SANITIZE_ADDRESS__) || !defined(__GLIBC__)
int main(void)
{
    printf("memtrim_test: skipped (the allocator is not glibc's)\n");
    return 77;
}
#else
#define THREADS    4
#define PER_THREAD 64
#define BUF        (1u << 20)

static void *bufs[THREADS][PER_THREAD];
static void *pins[THREADS][PER_THREAD];

static long rss_mib(void)
{
    char line[256];
    long kib = -1;
    FILE *f = fopen("/proc/self/status", "r");

    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib < 0 ? -1 : kib / 1024;
}

static void *alloc_main(void *arg)
{
    int t = (int)(intptr_t)arg;

    for (int i = 0; i < PER_THREAD; i++) {
        bufs[t][i] = malloc(BUF);
        pins[t][i] = malloc(64);
        if (!bufs[t][i] || !pins[t][i])
            abort();
        memset(bufs[t][i], 0x5a, BUF);
    }
    return NULL;
}

static sl_memtrim trim;
static int waited_ticks;

/* Stop once a check has trimmed; give up after 60 s of checks (a hang guard, not a timing
 * assertion: the check runs every 20 ms). */
static void on_watch(uv_timer_t *t)
{
    if (trim.trims > 0 || ++waited_ticks > 3000) {
        sl_memtrim_stop(&trim);
        uv_close((uv_handle_t *)t, NULL);
    }
}

int main(void)
{
    pthread_t th[THREADS];
    uv_loop_t loop;
    uv_timer_t watch;
    long base, full, freed, after;

    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 20);
    base = rss_mib();
    for (int t = 0; t < THREADS; t++)
        pthread_create(&th[t], NULL, alloc_main, (void *)(intptr_t)t);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    full = rss_mib();
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < PER_THREAD; i++)
            free(bufs[t][i]);
    freed = rss_mib();
    printf("memtrim_test: RSS %ld MiB at start, %ld with the buffers, %ld after free()\n", base,
           full, freed);
    /* Without the trim glibc keeps the freed pages: that is what memtrim is for. */
    if (freed < base + (THREADS * PER_THREAD) / 2) {
        printf("memtrim_test: FAIL: glibc gave the memory back by itself; the test means "
               "nothing\n");
        return 1;
    }

    if (uv_loop_init(&loop) != 0 || sl_memtrim_start(&trim, &loop, 20) != 0)
        return 1;
    uv_timer_init(&loop, &watch);
    uv_timer_start(&watch, on_watch, 20, 20);
    uv_run(&loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&loop) != 0) {
        printf("memtrim_test: FAIL: handles left open\n");
        return 1;
    }
    after = rss_mib();
    printf("memtrim_test: %llu trims; RSS %ld MiB after (heap free %zu MiB, in use %zu MiB at "
           "the check)\n",
           (unsigned long long)trim.trims, after, trim.free >> 20, trim.in_use >> 20);
    for (int t = 0; t < THREADS; t++)
        for (int i = 0; i < PER_THREAD; i++)
            free(pins[t][i]);
    if (trim.trims == 0 || after > freed - (THREADS * PER_THREAD) / 2) {
        printf("memtrim_test: FAIL: the freed memory stayed resident\n");
        return 1;
    }
    printf("memtrim_test: ok\n");
    return 0;
}
#endif
