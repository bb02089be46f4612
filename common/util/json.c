/* JSON string literals. See json.h. */
#include "util/json.h"

#include <stdio.h>

int sl_json_esc(sl_buf *b, const char *s, size_t n)
{
    size_t start = b->len, i = 0;
    int err = 0;

    while (!err && i < n) {
        size_t run = i;
        unsigned char c;

        /* Copy runs of plain bytes at once. */
        while (run < n && (unsigned char)s[run] >= 0x20 && s[run] != '"' && s[run] != '\\')
            run++;
        if (run > i)
            err = sl_buf_add(b, s + i, run - i);
        if (err || run == n)
            break;
        c = (unsigned char)s[run];
        if (c == '"' || c == '\\')
            err = sl_buf_printf(b, "\\%c", c);
        else
            err = sl_buf_printf(b, "\\u%04x", c);
        i = run + 1;
    }
    if (err)
        sl_buf_setlen(b, start);
    return err;
}

int sl_json_str(sl_buf *b, const char *s, size_t n)
{
    size_t start = b->len;
    int err = sl_buf_add(b, "\"", 1);

    if (!err)
        err = sl_json_esc(b, s, n);
    if (!err)
        err = sl_buf_add(b, "\"", 1);
    if (err)
        sl_buf_setlen(b, start);
    return err;
}
