/* Failing with a message: the pattern of the pure modules' validators, which return a code and
 * say in a caller's buffer what was wrong and with which value. Thread-safe. See docs/util.md.
 */
#ifndef SL_UTIL_MSG_H
#define SL_UTIL_MSG_H

#include <stddef.h>

/* Write the printf-style message into msg[0..len) (nothing if msg is NULL or len 0) and return
 * `code`, so a validator ends with `return sl_fail(msg, len, SL_EINVAL, "rank %u ...", r);`. */
int sl_fail(char *msg, size_t len, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
