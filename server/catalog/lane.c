/* The catalog lane (lane.h): one fiber, on a stack of its own, that runs the loop's work which
 * may wait for a catalog server, one piece after another. Loop thread only.
 *
 * States: IDLE (the fiber waits at the top of its loop for work, or was never entered), RUNNING
 * (the loop thread is on the fiber's stack) and WAITING (a statement suspended the fiber: the
 * loop thread is back on its own stack, running everything else, until sl_lane_resume).
 * Context switches are glibc's swapcontext; AddressSanitizer is told of each one, or it would
 * take the other stack's frames for overflows.
 */
#include "lane.h"

#include "log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define SL_LANE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SL_LANE_ASAN 1
#endif
#endif
#ifdef SL_LANE_ASAN
#include <sanitizer/common_interface_defs.h>
#endif
/* Under valgrind the fiber's stack is registered, or memcheck takes each switch for a stack
 * overflow. The header comes with Debian's valgrind package (a no-op outside valgrind). */
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define SL_LANE_VALGRIND 1
#endif
#endif

/* Handlers keep paths and messages on the stack, and sanitizers make frames larger: generous,
 * and only the pages touched are ever resident. A guard page below catches an overflow. */
#define STACK_BYTES (2u << 20)

enum { IDLE, RUNNING, WAITING };

typedef struct item {
    sl_lane_fn fn;
    void *a;
    int b;
} item;

struct sl_lane {
    ucontext_t main_ctx, fib_ctx;
    char *map; /* guard page + stack */
    size_t map_len;
    int entered; /* the fiber's context was made */
    int state;
    item *q; /* a ring */
    size_t head, len, cap;
    void (*on_idle)(void *);
    void *on_idle_arg;
#ifdef SL_LANE_VALGRIND
    unsigned vg_stack;
#endif
#ifdef SL_LANE_ASAN
    void *fake_main, *fake_fib;
    const void *main_bottom;
    size_t main_size;
#endif
};

/* The lane whose fiber the loop thread is on, if any. */
static _Thread_local sl_lane *here;
/* The lane a fresh fiber belongs to (makecontext passes only ints). */
static sl_lane *entering;

int sl_lane_new(sl_lane **out)
{
    sl_lane *l = calloc(1, sizeof(*l));
    long page = sysconf(_SC_PAGESIZE);

    *out = NULL;
    if (!l)
        return -ENOMEM;
    l->map_len = STACK_BYTES + (size_t)page;
    l->map = mmap(NULL, l->map_len, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (l->map == MAP_FAILED) {
        free(l);
        return -ENOMEM;
    }
    if (mprotect(l->map, (size_t)page, PROT_NONE) != 0) {
        munmap(l->map, l->map_len);
        free(l);
        return -errno;
    }
#ifdef SL_LANE_VALGRIND
    l->vg_stack = VALGRIND_STACK_REGISTER(l->map + (l->map_len - STACK_BYTES), l->map + l->map_len);
#endif
    *out = l;
    return 0;
}

void sl_lane_free(sl_lane *l)
{
    if (!l)
        return;
    if (l->state != IDLE || l->len)
        sl_log_error("lane_freed_busy", "state=%d queued=%zu", l->state, l->len);
#ifdef SL_LANE_VALGRIND
    VALGRIND_STACK_DEREGISTER(l->vg_stack);
#endif
    munmap(l->map, l->map_len);
    free(l->q);
    free(l);
}

/* Fiber -> loop stack. */
static void to_main(sl_lane *l)
{
#ifdef SL_LANE_ASAN
    __sanitizer_start_switch_fiber(&l->fake_fib, l->main_bottom, l->main_size);
#endif
    swapcontext(&l->fib_ctx, &l->main_ctx);
#ifdef SL_LANE_ASAN
    __sanitizer_finish_switch_fiber(l->fake_fib, &l->main_bottom, &l->main_size);
#endif
}

static void fiber_main(void)
{
    sl_lane *l = entering;

#ifdef SL_LANE_ASAN
    __sanitizer_finish_switch_fiber(NULL, &l->main_bottom, &l->main_size);
#endif
    for (;;) {
        while (l->len) {
            item it = l->q[l->head];
            l->head = (l->head + 1) % l->cap;
            l->len--;
            l->state = RUNNING;
            it.fn(it.a, it.b);
        }
        l->state = IDLE;
        to_main(l);
    }
}

/* Loop stack -> fiber, until it is idle or waiting again. */
static void to_fiber(sl_lane *l)
{
    if (!l->entered) {
        getcontext(&l->fib_ctx);
        l->fib_ctx.uc_stack.ss_sp = l->map + (l->map_len - STACK_BYTES);
        l->fib_ctx.uc_stack.ss_size = STACK_BYTES;
        l->fib_ctx.uc_link = NULL;
        makecontext(&l->fib_ctx, fiber_main, 0);
        entering = l;
        l->entered = 1;
    }
    here = l;
    l->state = RUNNING;
#ifdef SL_LANE_ASAN
    __sanitizer_start_switch_fiber(&l->fake_main, l->map + (l->map_len - STACK_BYTES), STACK_BYTES);
#endif
    swapcontext(&l->main_ctx, &l->fib_ctx);
#ifdef SL_LANE_ASAN
    __sanitizer_finish_switch_fiber(l->fake_main, NULL, NULL);
#endif
    here = NULL;
    if (l->state == IDLE && l->on_idle) {
        void (*fn)(void *) = l->on_idle;
        l->on_idle = NULL;
        fn(l->on_idle_arg);
    }
}

static int grow(sl_lane *l)
{
    size_t cap = l->cap ? l->cap * 2 : 64;
    item *q = malloc(cap * sizeof(*q));

    if (!q)
        return -ENOMEM;
    for (size_t i = 0; i < l->len; i++)
        q[i] = l->q[(l->head + i) % l->cap];
    free(l->q);
    l->q = q;
    l->head = 0;
    l->cap = cap;
    return 0;
}

void sl_lane_run(sl_lane *l, sl_lane_fn fn, void *a, int b)
{
    if (l->len == l->cap && grow(l) != 0) {
        /* Out of memory: run it now, on the loop's stack (a statement in it then blocks). */
        sl_log_limited(SL_LOG_ERROR, 1000, "lane_queue_full", "queued=%zu", l->len);
        fn(a, b);
        return;
    }
    l->q[(l->head + l->len) % l->cap] = (item){fn, a, b};
    l->len++;
    if (here != l && l->state == IDLE)
        to_fiber(l);
}

int sl_lane_here(const sl_lane *l)
{
    return l && here == l;
}

int sl_lane_idle(const sl_lane *l)
{
    return !l || (l->state == IDLE && l->len == 0);
}

void sl_lane_suspend(sl_lane *l)
{
    l->state = WAITING;
    here = NULL;
    to_main(l);
    here = l;
    l->state = RUNNING;
}

void sl_lane_resume(sl_lane *l)
{
    if (l->state == WAITING && here != l)
        to_fiber(l);
}

void sl_lane_when_idle(sl_lane *l, void (*fn)(void *), void *arg)
{
    if (sl_lane_idle(l)) {
        fn(arg);
        return;
    }
    l->on_idle = fn;
    l->on_idle_arg = arg;
}
