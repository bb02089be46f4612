/* Growing arrays. See array.h. */
#include "util/array.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

int sl_array_grow(void **v, size_t *cap, size_t n, size_t size, size_t first)
{
    size_t want;
    void *p;

    if (n < *cap)
        return 0;
    want = *cap ? *cap : (first ? first : 1);
    while (want <= n) {
        if (want > SIZE_MAX / 2)
            return -ENOMEM;
        want *= 2;
    }
    if (size && want > SIZE_MAX / size)
        return -ENOMEM;
    p = realloc(*v, want * size);
    if (!p)
        return -ENOMEM;
    *v = p;
    *cap = want;
    return 0;
}
