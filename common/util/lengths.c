/* The lengths file's format and the client's input forms. See lengths.h. */
#include "util/lengths.h"

#include "err.h"
#include "util/buf.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#define ZERO_WHY "every length must be at least 1"

int sl_lengths_form_parse(sl_lengths_form *out, const char *s)
{
    if (s && strcmp(s, "text") == 0)
        *out = SL_LENGTHS_TEXT;
    else if (s && strcmp(s, "u32") == 0)
        *out = SL_LENGTHS_U32;
    else
        return SL_EINVAL;
    return 0;
}

int sl_lengths_encode(uint8_t *out, const uint32_t *v, size_t n, size_t *bad)
{
    for (size_t i = 0; i < n; i++) {
        if (v[i] == 0) {
            if (bad)
                *bad = i;
            return SL_EINVAL;
        }
        for (int k = 0; k < 4; k++)
            out[4 * i + (size_t)k] = (uint8_t)(v[i] >> (8 * k));
    }
    return 0;
}

int sl_lengths_decode(uint32_t *out, const uint8_t *raw, size_t n, size_t *bad)
{
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p = raw + 4 * i;
        /* Read the record whole before writing: out may alias raw. */
        uint32_t v =
            (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;

        if (v == 0) {
            if (bad)
                *bad = i;
            return SL_EINVAL;
        }
        out[i] = v;
    }
    return 0;
}

/* ---- input forms ---- */

typedef struct parser {
    sl_buf out; /* host-order uint32 lengths */
    const char *name;
    char *msg;
    size_t len;
    /* text form: the line being read */
    uint64_t line, v;
    int digits, bad, cr;
} parser;

static size_t count(const parser *p)
{
    return p->out.len / 4;
}

static int push(parser *p, uint32_t v)
{
    int err = sl_buf_add(&p->out, &v, sizeof(v));

    if (err == SL_ELIMIT)
        snprintf(p->msg, p->len, "%s: more than %zu lengths", p->name, p->out.max / 4);
    else if (err)
        snprintf(p->msg, p->len, "%s: out of memory after %zu lengths", p->name, count(p));
    return err;
}

/* The end of a text line (at '\n' or at the end of the input). */
static int text_line(parser *p)
{
    int err;

    if (p->bad || p->digits == 0) {
        snprintf(p->msg, p->len, "%s:%" PRIu64 ": not a non-negative integer (one length per line)",
                 p->name, p->line);
        return SL_EINVAL;
    }
    if (p->v == 0) {
        snprintf(p->msg, p->len, "%s:%" PRIu64 ": length 0 (" ZERO_WHY ")", p->name, p->line);
        return SL_EINVAL;
    }
    if ((err = push(p, (uint32_t)p->v)) != 0)
        return err;
    p->line++;
    p->v = 0;
    p->digits = p->bad = p->cr = 0;
    return 0;
}

/* One byte of the text form: digits, then an optional '\r', then '\n'. Anything else makes the
 * line bad; the error is reported at its end, with its number. */
static int text_byte(parser *p, unsigned char c)
{
    if (c == '\n')
        return text_line(p);
    if (p->cr || p->bad) {
        p->bad = 1;
    } else if (c >= '0' && c <= '9') {
        p->v = p->v * 10 + (c - '0');
        p->digits++;
        if (p->v > UINT32_MAX) {
            snprintf(p->msg, p->len, "%s:%" PRIu64 ": length is over %" PRIu32, p->name, p->line,
                     UINT32_MAX);
            return SL_EINVAL;
        }
    } else if (c == '\r' && p->digits > 0) {
        p->cr = 1;
    } else {
        p->bad = 1;
    }
    return 0;
}

static int parse_text(parser *p, FILE *f)
{
    unsigned char buf[16384];
    size_t got;
    int err = 0;

    p->line = 1;
    while (!err && (got = fread(buf, 1, sizeof(buf), f)) > 0)
        for (size_t i = 0; !err && i < got; i++)
            err = text_byte(p, buf[i]);
    if (!err && (p->bad || p->digits))
        err = text_line(p);
    return err;
}

static int parse_u32(parser *p, FILE *f)
{
    unsigned char buf[16384];
    size_t got, carry = 0, k = 0;
    int err = 0;

    while (!err && (got = fread(buf + carry, 1, sizeof(buf) - carry, f)) > 0) {
        size_t have = carry + got;

        for (k = 0; !err && k + 4 <= have; k += 4) {
            uint32_t v;

            if (sl_lengths_decode(&v, buf + k, 1, NULL) != 0) {
                snprintf(p->msg, p->len,
                         "%s: record %zu (byte offset %zu) has length 0 (" ZERO_WHY ")", p->name,
                         count(p), count(p) * 4);
                return SL_EINVAL;
            }
            err = push(p, v);
        }
        carry = have - k;
        memmove(buf, buf + k, carry);
    }
    if (!err && carry) {
        snprintf(p->msg, p->len, "%s: size is not a multiple of 4 bytes (%zu trailing)", p->name,
                 carry);
        err = SL_EINVAL;
    }
    return err;
}

int sl_lengths_parse(uint32_t **out, size_t *n, FILE *f, sl_lengths_form form, size_t max,
                     const char *name, char *msg, size_t len)
{
    parser p;
    int err;

    if (max > SL_LENGTHS_MAX)
        max = SL_LENGTHS_MAX;
    if (max > SIZE_MAX / 4)
        max = SIZE_MAX / 4;
    memset(&p, 0, sizeof(p));
    sl_buf_init(&p.out, max * 4);
    p.name = name;
    p.msg = msg;
    p.len = len;
    *out = NULL;
    *n = 0;
    err = form == SL_LENGTHS_U32 ? parse_u32(&p, f) : parse_text(&p, f);
    if (!err && ferror(f)) {
        err = errno ? -errno : -EIO;
        snprintf(msg, len, "%s: read error: %s", name, sl_strerror(err));
    }
    if (err) {
        sl_buf_free(&p.out);
        return err;
    }
    *n = count(&p);
    *out = (uint32_t *)(void *)sl_buf_take(&p.out);
    return 0;
}
