/* Giving freed heap memory back to the system; see memtrim.h. */
#include "memtrim.h"

#include "log.h"

#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

/* Trim when more than this much is free and it is more than twice what is in use: under a
 * steady upload load the free part stays below that (it is reused at once), after the load
 * the heap is mostly free. */
#define TRIM_MIN_FREE ((size_t)64 << 20)

static void check_work(uv_work_t *w)
{
    sl_memtrim *m = w->data;

    m->trimmed = 0;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    {
        struct mallinfo2 mi = mallinfo2();
        m->in_use = mi.uordblks + mi.hblkhd;
        m->free = mi.fordblks;
        /* malloc_trim leaves arena tops and what it already released counted as free: trim
         * again only once more has been freed since, not every tick of an idle daemon. */
        if (m->free > TRIM_MIN_FREE && m->free > 2 * m->in_use &&
            m->free > m->free_at_trim + TRIM_MIN_FREE / 4) {
            malloc_trim(0);
            m->trimmed = 1;
            m->free_at_trim = m->free;
        } else if (m->free < m->free_at_trim) {
            m->free_at_trim = m->free;
        }
    }
#endif
}

static void check_done(uv_work_t *w, int status)
{
    sl_memtrim *m = w->data;

    m->busy = 0;
    if (status == 0 && m->trimmed) {
        m->trims++;
        sl_log_debug("heap_trimmed", "free_mib=%zu in_use_mib=%zu", m->free >> 20, m->in_use >> 20);
    }
}

static void on_tick(uv_timer_t *t)
{
    sl_memtrim *m = t->data;

    if (m->busy)
        return;
    m->work.data = m;
    if (uv_queue_work(t->loop, &m->work, check_work, check_done) == 0)
        m->busy = 1;
}

int sl_memtrim_start(sl_memtrim *m, uv_loop_t *loop, uint64_t interval_ms)
{
    int err;

    memset(m, 0, sizeof(*m));
    err = uv_timer_init(loop, &m->timer);
    if (err)
        return err;
    m->open = 1;
    m->timer.data = m;
    return uv_timer_start(&m->timer, on_tick, interval_ms, interval_ms);
}

void sl_memtrim_stop(sl_memtrim *m)
{
    if (!m->open)
        return;
    m->open = 0;
    uv_close((uv_handle_t *)&m->timer, NULL);
}
