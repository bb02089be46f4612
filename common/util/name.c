/* Names. See name.h. */
#include "util/name.h"

#include "err.h"

#include <stdio.h>
#include <string.h>

static int name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

int sl_name_check(const char *what, const char *name, char *msg, size_t len)
{
    const char *why = NULL;
    size_t n;

    if (!name)
        name = "";
    /* strnlen: a name from the network may be long; no need to measure past the limit. */
    n = strnlen(name, SL_NAME_MAX + 1);
    if (n == 0 || n > SL_NAME_MAX) {
        if (msg && len)
            snprintf(msg, len, "%s name '%.140s' must have 1 to %d characters", what, name,
                     SL_NAME_MAX);
        return SL_EINVAL;
    }
    for (size_t i = 0; i < n && !why; i++)
        if (!name_char(name[i]))
            why = "has a character outside [A-Za-z0-9._-]";
    if (!why && (name[0] == '.' || strstr(name, "..")))
        why = "must not start with '.' or contain '..'";
    if (!why)
        return 0;
    if (msg && len)
        snprintf(msg, len, "%s name '%.140s' %s", what, name, why);
    return SL_EINVAL;
}
