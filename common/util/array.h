/* Growing arrays: the one doubling realloc.
 *
 * An array is a pointer, a count and a capacity kept by the caller. sl_array_grow makes room for
 * one more element; on failure the array is as it was (still the caller's to free). Pure apart
 * from the allocation; a given array is used by one thread at a time. See docs/util.md.
 */
#ifndef SL_UTIL_ARRAY_H
#define SL_UTIL_ARRAY_H

#include <stddef.h>

/* Make room for element number n (0-based) of the array *v of `size`-byte elements whose
 * capacity is *cap: if n == *cap, reallocate to twice the capacity (at least `first`
 * elements). Returns 0, or -ENOMEM (also when the size would overflow) with *v and *cap
 * unchanged. */
int sl_array_grow(void **v, size_t *cap, size_t n, size_t size, size_t first);

#endif
