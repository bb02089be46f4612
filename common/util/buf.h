/* A growable byte buffer whose size cap is set when it is created.
 *
 * Every append either succeeds whole or fails and leaves the buffer as it was: -ENOMEM when
 * memory runs out, SL_ELIMIT when the contents would exceed the cap. Nothing allocated by a
 * failed call stays behind; what the buffer held before is still the caller's, released by
 * sl_buf_free. The contents are always followed by a NUL byte (not counted in the length), so a
 * buffer of text is a C string.
 *
 * A buffer is used by one thread at a time. See docs/util.md.
 */
#ifndef SL_UTIL_BUF_H
#define SL_UTIL_BUF_H

#include <stddef.h>

typedef struct sl_buf {
    char *p;      /* contents + NUL; NULL while a heap buffer has never held anything */
    size_t len;   /* bytes held, without the NUL */
    size_t alloc; /* bytes at p */
    size_t max;   /* the cap: most bytes the buffer may hold, without the NUL */
    int fixed;    /* p is the caller's memory (sl_buf_init_fixed): never reallocated or freed */
} sl_buf;

/* Start an empty heap buffer that may grow to `max` bytes. Allocates nothing yet. */
void sl_buf_init(sl_buf *b, size_t max);

/* Start an empty buffer over the caller's `size` bytes at `mem` (size >= 1), holding at most
 * size - 1 bytes; it never allocates. For code that must not allocate (logging). */
void sl_buf_init_fixed(sl_buf *b, char *mem, size_t size);

/* Append n bytes. Returns 0, SL_ELIMIT or -ENOMEM (the buffer unchanged). */
int sl_buf_add(sl_buf *b, const void *data, size_t n);

/* Append a C string (without its NUL). As sl_buf_add. */
int sl_buf_addstr(sl_buf *b, const char *s);

/* Append printf output. As sl_buf_add; also SL_EINVAL if the format fails. */
int sl_buf_printf(sl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Cut the contents to `len` bytes if they are longer (to undo appends). Never fails. */
void sl_buf_setlen(sl_buf *b, size_t len);

/* The contents as a C string ("" when empty). Valid until the next call on the buffer. */
const char *sl_buf_str(const sl_buf *b);

/* Hand the contents of a heap buffer to the caller, who frees them with free(); the buffer is
 * empty again (same cap). Returns NULL if nothing was ever allocated or the buffer is fixed. */
char *sl_buf_take(sl_buf *b);

/* Release a heap buffer's memory (a fixed buffer is only emptied); the buffer is empty again and
 * may be reused with the same cap. Accepts NULL. */
void sl_buf_free(sl_buf *b);

#endif
