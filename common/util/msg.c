/* Failing with a message. See msg.h. */
#include "util/msg.h"

#include <stdarg.h>
#include <stdio.h>

int sl_fail(char *msg, size_t len, int code, const char *fmt, ...)
{
    va_list ap;

    if (msg && len) {
        va_start(ap, fmt);
        vsnprintf(msg, len, fmt, ap);
        va_end(ap);
    }
    return code;
}
