/* Giving freed heap memory back to the system once the daemon is quiet.
 *
 * Upload chunks arrive as gRPC buffers allocated on the RPC threads and freed on the loop and
 * worker threads, up to --upload-memory at a time. glibc keeps what is freed in its per-thread
 * arenas: after a burst of uploads the daemon kept about 2 GiB resident while 250 MiB were in
 * use (tests/bench/soak.c, docs/hardening.md). A timer looks at the heap every few seconds on
 * the worker pool and calls malloc_trim when most of it is free. Loop thread only.
 */
#ifndef SL_MEMTRIM_H
#define SL_MEMTRIM_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct sl_memtrim {
    uv_timer_t timer;
    uv_work_t work;
    int open;            /* the timer is initialised */
    int busy;            /* a check runs on the worker pool */
    size_t in_use;       /* heap bytes in use at the last check */
    size_t free;         /* heap bytes free at the last check, before trimming */
    size_t free_at_trim; /* free bytes at the last trim, lowered as the heap is reused */
    int trimmed;         /* the last check trimmed */
    uint64_t trims;      /* trims so far */
} sl_memtrim;

/* Check the heap every interval_ms on `loop`. Returns 0 or a libuv error. */
int sl_memtrim_start(sl_memtrim *m, uv_loop_t *loop, uint64_t interval_ms);

/* Stop the timer (a check in flight completes on its own). Accepts a never-started struct that
 * was zeroed. */
void sl_memtrim_stop(sl_memtrim *m);

#endif
