/* Bounded decimal numbers. See num.h. */
#include "util/num.h"

#include "err.h"

#include <errno.h>

/* Parse the digits at *s up to the first non-digit, which *s is left pointing at. */
static int parse_digits(uint64_t *out, const char **s, uint64_t min, uint64_t max)
{
    const char *p = *s;
    uint64_t v = 0;
    int overflow = 0;

    if (*p < '0' || *p > '9')
        return SL_EINVAL;
    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned d = (unsigned)(*p - '0');

        if (v > (UINT64_MAX - d) / 10)
            overflow = 1;
        v = v * 10 + d;
    }
    *s = p;
    if (overflow)
        return -EOVERFLOW;
    if (v < min || v > max)
        return -ERANGE;
    *out = v;
    return 0;
}

int sl_parse_u64(uint64_t *out, const char *s, uint64_t min, uint64_t max)
{
    uint64_t v;
    int err;

    if (!s)
        return SL_EINVAL;
    err = parse_digits(&v, &s, min, max);
    /* Garbage after the digits is a malformed number, whatever its value. */
    if (*s != '\0')
        return SL_EINVAL;
    if (err == 0)
        *out = v;
    return err;
}

int sl_parse_u64_list(uint64_t *out, size_t n, const char *s, char sep, uint64_t min, uint64_t max)
{
    uint64_t v[64];
    int err = 0;

    if (!s || n == 0 || n > sizeof(v) / sizeof(v[0]))
        return SL_EINVAL;
    for (size_t i = 0; i < n; i++) {
        int e = parse_digits(&v[i], &s, min, max);

        if (e == SL_EINVAL || *s != (i + 1 < n ? sep : '\0'))
            return SL_EINVAL;
        if (err == 0)
            err = e;
        s++;
    }
    if (err == 0) {
        for (size_t i = 0; i < n; i++)
            out[i] = v[i];
    }
    return err;
}
