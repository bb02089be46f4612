/* Bounded decimal numbers: the one parser of unsigned integers given as text (command-line
 * values, lists like "2,2,1,1", configuration values).
 *
 * The accepted form is strict: one or more ASCII digits and nothing else. No sign, no spaces, no
 * "0x", no trailing characters; leading zeros are allowed ("007" is 7). Pure functions of their
 * arguments; thread-safe. See docs/util.md.
 */
#ifndef SL_UTIL_NUM_H
#define SL_UTIL_NUM_H

#include <stddef.h>
#include <stdint.h>

/* Parse `s` as a decimal in [min, max] into *out. Returns 0; SL_EINVAL if s is NULL, empty or
 * holds anything but digits; -EOVERFLOW if the number does not fit in 64 bits; -ERANGE if it is
 * outside [min, max]. *out is written only on success. */
int sl_parse_u64(uint64_t *out, const char *s, uint64_t min, uint64_t max);

/* Parse exactly `n` decimals in [min, max] separated by `sep` ("2,2,1,1" with n = 4, sep ',')
 * into out[0..n). Returns 0; SL_EINVAL if there are more or fewer than n values or one of them is
 * empty or not a decimal (or n is 0 or over 64); -EOVERFLOW or -ERANGE as sl_parse_u64. out is
 * written only on success. */
int sl_parse_u64_list(uint64_t *out, size_t n, const char *s, char sep, uint64_t min, uint64_t max);

#endif
