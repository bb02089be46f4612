/* UTF-8 validity: the one check of text that must be well-formed UTF-8 (protobuf `string`
 * fields, user metadata stored and served back).
 *
 * Well-formed means RFC 3629: no overlong forms, no surrogates (U+D800..U+DFFF), nothing above
 * U+10FFFF, no truncated sequence. NUL bytes are refused too: such text cannot be a C string and
 * protobuf-c would cut it there. Pure; thread-safe. See docs/util.md.
 */
#ifndef SL_UTIL_UTF8_H
#define SL_UTIL_UTF8_H

#include <stddef.h>

/* Check s[0..n). Returns 0 if it is well-formed UTF-8 without NUL bytes, else SL_EINVAL. */
int sl_utf8_check(const char *s, size_t n);

#endif
