/* JSON string literals: the one escaper of text that goes into JSON (log lines, metadata.json,
 * the command-line client's --json output).
 *
 * '"' and '\' are escaped with a backslash, bytes below 0x20 as \u00XX (lowercase hex); every
 * other byte is copied, so UTF-8 passes through unchanged (check it first with sl_utf8_check
 * where it matters). The output is byte-for-byte what earlier sluice versions wrote, which
 * checkpoint verification relies on (metadata.json is compared byte for byte).
 *
 * Thread-safe (the buffer is the caller's). See docs/util.md.
 */
#ifndef SL_UTIL_JSON_H
#define SL_UTIL_JSON_H

#include "util/buf.h"

#include <stddef.h>

/* Append s[0..n) escaped, without quotes. Returns 0, SL_ELIMIT or -ENOMEM; on failure the buffer
 * is as it was. */
int sl_json_esc(sl_buf *b, const char *s, size_t n);

/* Append s[0..n) as a quoted JSON string. As sl_json_esc. */
int sl_json_str(sl_buf *b, const char *s, size_t n);

#endif
