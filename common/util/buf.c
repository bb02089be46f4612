/* A growable byte buffer with a cap. See buf.h. */
#include "util/buf.h"

#include "err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first allocation of a heap buffer; later ones double. */
#define SL_BUF_MIN 64

void sl_buf_init(sl_buf *b, size_t max)
{
    b->p = NULL;
    b->len = 0;
    b->alloc = 0;
    /* One byte stays for the NUL. */
    b->max = max < SIZE_MAX ? max : SIZE_MAX - 1;
    b->fixed = 0;
}

void sl_buf_init_fixed(sl_buf *b, char *mem, size_t size)
{
    b->p = mem;
    b->len = 0;
    b->alloc = size;
    b->max = size - 1;
    b->fixed = 1;
    mem[0] = '\0';
}

/* Make room for `need` more bytes and the NUL. Returns 0, SL_ELIMIT or -ENOMEM. */
static int reserve(sl_buf *b, size_t need)
{
    size_t want, cap;
    char *p;

    if (need > b->max - b->len)
        return SL_ELIMIT;
    want = b->len + need + 1;
    if (want <= b->alloc)
        return 0;
    if (b->fixed)
        return SL_ELIMIT;
    cap = b->alloc ? b->alloc : SL_BUF_MIN;
    while (cap < want)
        cap = cap <= SIZE_MAX / 2 ? cap * 2 : SIZE_MAX;
    /* want <= max + 1 (checked above), so the cap never cuts what was asked for. */
    if (cap > b->max + 1)
        cap = b->max + 1;
    p = realloc(b->p, cap);
    if (!p)
        return -ENOMEM;
    b->p = p;
    b->alloc = cap;
    return 0;
}

int sl_buf_add(sl_buf *b, const void *data, size_t n)
{
    int err = reserve(b, n);

    if (err)
        return err;
    if (n)
        memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

int sl_buf_addstr(sl_buf *b, const char *s)
{
    return sl_buf_add(b, s, strlen(s));
}

int sl_buf_printf(sl_buf *b, const char *fmt, ...)
{
    va_list ap;
    int n, err;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return SL_EINVAL;
    if ((err = reserve(b, (size_t)n)) != 0)
        return err;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void sl_buf_setlen(sl_buf *b, size_t len)
{
    if (len < b->len) {
        b->len = len;
        b->p[len] = '\0';
    }
}

const char *sl_buf_str(const sl_buf *b)
{
    return b->p ? b->p : "";
}

char *sl_buf_take(sl_buf *b)
{
    char *p = b->fixed ? NULL : b->p;

    if (!b->fixed)
        sl_buf_init(b, b->max);
    return p;
}

void sl_buf_free(sl_buf *b)
{
    if (!b)
        return;
    if (b->fixed) {
        sl_buf_setlen(b, 0);
        return;
    }
    free(b->p);
    sl_buf_init(b, b->max);
}
