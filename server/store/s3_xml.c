/* The S3 client's reading of the store's small XML answers (errors, UploadId, listings, the
 * result of CompleteMultipartUpload). Not a general XML parser: it finds elements by name in a
 * bounded range and decodes their text, which is all these answers need; anything it cannot
 * read is SL_ECORRUPT, never a guess.
 */
#include "store/s3_internal.h"

#include "err.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* Does the tag name at p (just after '<') equal tag, followed by '>', '/' or a space? */
static int tag_at(const char *p, const char *end, const char *tag, size_t tl)
{
    if ((size_t)(end - p) <= tl || memcmp(p, tag, tl) != 0)
        return 0;
    char ch = p[tl];
    return ch == '>' || ch == '/' || ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n';
}

int s3_xml_find(const char *p, const char *end, const char *tag, const char **vs, const char **ve)
{
    size_t tl = strlen(tag);
    while (p < end) {
        const char *lt = memchr(p, '<', (size_t)(end - p));
        if (!lt)
            return 0;
        if (!tag_at(lt + 1, end, tag, tl)) {
            p = lt + 1;
            continue;
        }
        const char *gt = memchr(lt + 1, '>', (size_t)(end - lt - 1));
        if (!gt)
            return 0;
        if (gt[-1] == '/') { /* <Tag/> */
            *vs = *ve = gt + 1;
            return 1;
        }
        const char *s = gt + 1;
        /* Its own closing tag: elements of the same name inside it open and close in between
         * (a store's answer never nests them, a hostile one may: the element found is then the
         * outer one whole, never a piece ending at an inner close). */
        unsigned depth = 0;
        for (const char *q = s; q < end;) {
            const char *close = memchr(q, '<', (size_t)(end - q));
            if (!close || end - close < (ptrdiff_t)tl + 3)
                return 0;
            if (close[1] == '/' && memcmp(close + 2, tag, tl) == 0 && close[2 + tl] == '>') {
                if (depth-- == 0) {
                    *vs = s;
                    *ve = close;
                    return 1;
                }
            } else if (tag_at(close + 1, end, tag, tl)) {
                const char *igt = memchr(close + 1, '>', (size_t)(end - close - 1));
                if (!igt)
                    return 0;
                if (igt[-1] != '/') /* <Tag/> opens nothing */
                    depth++;
            }
            q = close + 1;
        }
        return 0;
    }
    return 0;
}

/* Decode one entity at p (after '&'); writes its UTF-8 bytes to u, returns the count or -1. */
static int entity(const char *p, const char *end, char u[4], const char **next)
{
    const char *semi = memchr(p, ';', (size_t)(end - p) < 12 ? (size_t)(end - p) : 12);
    if (!semi)
        return -1;
    size_t n = (size_t)(semi - p);
    static const struct {
        const char *name;
        char ch;
    } named[] = {{"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}};
    *next = semi + 1;
    for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++)
        if (strlen(named[i].name) == n && memcmp(p, named[i].name, n) == 0) {
            u[0] = named[i].ch;
            return 1;
        }
    if (n < 2 || p[0] != '#')
        return -1;
    unsigned long cp = 0;
    int hex = p[1] == 'x';
    for (const char *q = p + 1 + hex; q < semi; q++) {
        int d = *q >= '0' && *q <= '9'          ? *q - '0'
                : hex && *q >= 'a' && *q <= 'f' ? *q - 'a' + 10
                : hex && *q >= 'A' && *q <= 'F' ? *q - 'A' + 10
                                                : -1;
        if (d < 0 || cp > 0x10FFFF)
            return -1;
        cp = cp * (hex ? 16 : 10) + (unsigned long)d;
    }
    if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return -1;
    if (cp < 0x80) {
        u[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    u[0] = (char)(0xF0 | (cp >> 18));
    u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    u[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int s3_xml_text(const char *vs, const char *ve, char *out, size_t outlen)
{
    size_t o = 0;
    for (const char *p = vs; p < ve;) {
        char u[4];
        int n = 1;
        if (*p == '<')
            return SL_ECORRUPT; /* markup inside a text element */
        if (*p == '&') {
            n = entity(p + 1, ve, u, &p);
            if (n < 0)
                return SL_ECORRUPT;
        } else {
            u[0] = *p++;
        }
        if (o + (size_t)n >= outlen)
            return SL_ECORRUPT;
        memcpy(out + o, u, (size_t)n);
        o += (size_t)n;
    }
    if (outlen == 0)
        return SL_ECORRUPT;
    out[o] = '\0';
    return 0;
}

int s3_xml_get(const char *p, const char *end, const char *tag, char *out, size_t outlen)
{
    const char *vs, *ve;
    if (!s3_xml_find(p, end, tag, &vs, &ve))
        return SL_ENOTFOUND;
    return s3_xml_text(vs, ve, out, outlen);
}

int64_t s3_iso8601_ms(const char *s)
{
    struct tm tm = {0};
    int ms = 0, n = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &n) != 6 ||
        n != 19)
        return -1;
    const char *p = s + n;
    if (*p == '.') {
        int digits = 0;
        for (p++; *p >= '0' && *p <= '9'; p++, digits++)
            if (digits < 3)
                ms = ms * 10 + (*p - '0');
        for (; digits < 3 && digits > 0; digits++)
            ms *= 10;
    }
    if (strcmp(p, "Z") != 0 && strcmp(p, "+00:00") != 0)
        return -1;
    if (tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 ||
        tm.tm_min > 59 || tm.tm_sec > 60)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    time_t t = timegm(&tm);
    if (t == (time_t)-1)
        return -1;
    return (int64_t)t * 1000 + ms;
}
