/* UTF-8 validity. See utf8.h. */
#include "util/utf8.h"

#include "err.h"

#include <stdint.h>

/* The length of the sequence led by byte c (1 to 4), or 0 if c cannot lead one. 0xc0, 0xc1
 * could only start overlong 2-byte forms, 0xf5 and up code points above U+10FFFF. */
static size_t lead_len(unsigned char c, uint32_t *cp)
{
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c >= 0xc2 && c <= 0xdf) {
        *cp = c & 0x1f;
        return 2;
    }
    if (c >= 0xe0 && c <= 0xef) {
        *cp = c & 0x0f;
        return 3;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        *cp = c & 0x07;
        return 4;
    }
    return 0;
}

int sl_utf8_check(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;

    while (i < n) {
        uint32_t cp;
        size_t k = lead_len(p[i], &cp);

        if (k == 0 || p[i] == 0 || k > n - i)
            return SL_EINVAL;
        for (size_t j = 1; j < k; j++) {
            if ((p[i + j] & 0xc0) != 0x80)
                return SL_EINVAL;
            cp = (cp << 6) | (p[i + j] & 0x3f);
        }
        if ((k == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (k == 4 && (cp < 0x10000 || cp > 0x10ffff)))
            return SL_EINVAL;
        i += k;
    }
    return 0;
}
