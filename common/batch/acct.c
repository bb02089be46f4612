/* Token-budget batch planning: allocation accounting (see internal.h). */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* madvise */
#endif
#include "batch/internal.h"

#include "err.h"
#include "util/msg.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

void *bt_acct_alloc(acct *a, size_t n)
{
    void *p = malloc(n ? n : 1);

    if (p) {
        a->cur += n;
        if (a->cur > a->peak)
            a->peak = a->cur;
    }
    return p;
}

void *bt_acct_realloc(acct *a, void *old, size_t old_n, size_t n)
{
    void *p = realloc(old, n ? n : 1);

    if (p) {
        /* Growing may copy: count both blocks at the peak, as the allocator holds them then.
         * Shrinking happens in place. */
        if (n > old_n && a->cur + n > a->peak)
            a->peak = a->cur + n;
        a->cur = a->cur - old_n + n;
    }
    return p;
}

/* Arrays the planner fills completely and that are large enough to come straight from mmap are
 * faulted in with one madvise call instead of one page fault per page: first touch of 40 MB
 * costs ~30 ms on the project VM that way, ~13 ms this way. Only a hint: before Linux 5.14
 * (no MADV_POPULATE_WRITE) or elsewhere nothing happens. */
#define POPULATE_MIN  (8u << 20)
#define POPULATE_PAGE 4096u /* with larger pages madvise fails on the alignment: no harm */
#if defined(__linux__) && !defined(MADV_POPULATE_WRITE)
#define MADV_POPULATE_WRITE 23
#endif

void bt_populate(void *p, size_t n)
{
#if defined(__linux__)
    const uintptr_t pg = POPULATE_PAGE;

    if (p && n >= POPULATE_MIN) {
        uintptr_t s = ((uintptr_t)p + pg - 1) & ~(pg - 1), e = ((uintptr_t)p + n) & ~(pg - 1);

        if (e > s)
            (void)madvise((void *)s, e - s, MADV_POPULATE_WRITE);
    }
#else
    (void)p;
    (void)n;
#endif
}

void bt_acct_free(acct *a, void *p, size_t n)
{
    if (p) {
        free(p);
        a->cur -= n;
    }
}
