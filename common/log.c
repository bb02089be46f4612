#include "log.h"

#include "err.h"
#include "util/clock.h"
#include "util/json.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_level = SL_LOG_INFO;
static atomic_int log_format = SL_LOG_LOGFMT;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

static char log_tag[256];

void sl_log_set_tag(const char *fields)
{
    snprintf(log_tag, sizeof(log_tag), "%s", fields ? fields : "");
}

void sl_log_set_level(sl_log_level level)
{
    atomic_store(&log_level, (int)level);
}

sl_log_level sl_log_get_level(void)
{
    return (sl_log_level)atomic_load(&log_level);
}

int sl_log_parse_level(sl_log_level *out, const char *s)
{
    for (int i = 0; i < 4; i++) {
        if (s && strcmp(s, level_names[i]) == 0) {
            *out = (sl_log_level)i;
            return 0;
        }
    }
    return SL_EINVAL;
}

void sl_log_set_format(sl_log_format format)
{
    atomic_store(&log_format, (int)format);
}

int sl_log_parse_format(sl_log_format *out, const char *s)
{
    if (s && strcmp(s, "logfmt") == 0)
        *out = SL_LOG_LOGFMT;
    else if (s && strcmp(s, "json") == 0)
        *out = SL_LOG_JSON;
    else
        return SL_EINVAL;
    return 0;
}

const char *sl_log_format_name(sl_log_format format)
{
    return format == SL_LOG_JSON ? "json" : "logfmt";
}

const char *sl_log_level_name(sl_log_level level)
{
    return (unsigned)level < 4 ? level_names[level] : "unknown";
}

/* Turn logfmt fields (key=value, key="quoted value") into JSON members appended to b. A member
 * that does not fit ends the list, so a long line is cut but stays valid JSON. */
static void fields_to_json(sl_buf *b, const char *f)
{
    while (*f) {
        const char *k, *v;
        size_t klen, vlen, start = b->len;
        char unq[1024];

        while (*f == ' ')
            f++;
        k = f;
        while (*f && *f != '=' && *f != ' ')
            f++;
        klen = (size_t)(f - k);
        if (klen == 0 || *f != '=') {
            /* Not a key=value pair: keep the words as a message. */
            while (*f && *f != ' ')
                f++;
            continue;
        }
        f++;
        if (*f == '"') {
            size_t u = 0;
            f++;
            while (*f && *f != '"' && u < sizeof(unq) - 1) {
                if (*f == '\\' && f[1])
                    f++;
                unq[u++] = *f++;
            }
            if (*f == '"')
                f++;
            v = unq;
            vlen = u;
        } else {
            v = f;
            while (*f && *f != ' ')
                f++;
            vlen = (size_t)(f - v);
        }
        if (sl_buf_add(b, ",", 1) || sl_json_str(b, k, klen) || sl_buf_add(b, ":", 1) ||
            sl_json_str(b, v, vlen)) {
            sl_buf_setlen(b, start);
            return;
        }
    }
}

/* The JSON form of a line into line[0..cap) (cap >= 3), without its newline. Returns its length.
 * No allocation: the buffer is the caller's stack memory. */
static size_t json_line(char *line, size_t cap, const char *ts, sl_log_level level,
                        const char *event, const char *body)
{
    sl_buf b;

    /* Two bytes stay free for the closing brace and the newline. */
    sl_buf_init_fixed(&b, line, cap - 2);
    if (sl_buf_printf(&b, "{\"ts\":\"%s\",\"level\":\"%s\",\"event\":", ts,
                      sl_log_level_name(level)) == 0 &&
        sl_json_str(&b, event, strlen(event)) == 0)
        fields_to_json(&b, body);
    line[b.len] = '}';
    return b.len + 1;
}

static void vlog(sl_log_level level, const char *event, const char *suffix, const char *fields,
                 va_list ap)
{
    char line[4096], ts[40], body[3072] = "";
    int64_t now = sl_now_ms();
    time_t sec = (time_t)(now / 1000);
    struct tm tm;
    size_t n = 0;
    int r;

    gmtime_r(&sec, &tm);
    r = (int)strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + r, sizeof(ts) - (size_t)r, ".%03dZ", (int)(now % 1000));
    if (fields)
        vsnprintf(body, sizeof(body), fields, ap);
    if (suffix) {
        size_t b = strlen(body);
        snprintf(body + b, sizeof(body) - b, "%s%s", b ? " " : "", suffix);
    }
    if (log_tag[0]) {
        size_t b = strlen(body);
        snprintf(body + b, sizeof(body) - b, "%s%s", b ? " " : "", log_tag);
    }
    if (atomic_load(&log_format) == SL_LOG_JSON) {
        n = json_line(line, sizeof(line), ts, level, event, body);
    } else {
        r = snprintf(line, sizeof(line), "ts=%s level=%s event=%s%s%s", ts,
                     sl_log_level_name(level), event, body[0] ? " " : "", body);
        n = r > 0 ? (size_t)r : 0;
    }
    /* Long lines are cut, never split: one event stays one line. */
    if (n > sizeof(line) - 2)
        n = sizeof(line) - 2;
    line[n++] = '\n';
    if (write(STDERR_FILENO, line, n) < 0) {
        /* Nowhere left to report a failing stderr. */
    }
}

void sl_log(sl_log_level level, const char *event, const char *fields, ...)
{
    va_list ap;

    if ((int)level < atomic_load(&log_level))
        return;
    va_start(ap, fields);
    vlog(level, event, NULL, fields, ap);
    va_end(ap);
}

/* Per-event-name state of rate-limited lines. */
static struct {
    const char *event;
    uint64_t last_ns;
    unsigned long suppressed;
} limits[64];
static pthread_mutex_t limits_mu = PTHREAD_MUTEX_INITIALIZER;

void sl_log_limited(sl_log_level level, unsigned interval_ms, const char *event, const char *fields,
                    ...)
{
    char suffix[48] = "";
    uint64_t now;
    unsigned long suppressed = 0;
    int write_it = 1, slot = -1;
    va_list ap;

    if ((int)level < atomic_load(&log_level))
        return;
    now = sl_mono_ns();
    pthread_mutex_lock(&limits_mu);
    for (int i = 0; i < 64 && slot < 0; i++)
        if (!limits[i].event || strcmp(limits[i].event, event) == 0)
            slot = i;
    if (slot >= 0) {
        if (limits[slot].event) {
            if (now - limits[slot].last_ns < (uint64_t)interval_ms * 1000000u) {
                limits[slot].suppressed++;
                write_it = 0;
            }
        }
        if (write_it) {
            limits[slot].event = event;
            limits[slot].last_ns = now;
            suppressed = limits[slot].suppressed;
            limits[slot].suppressed = 0;
        }
    }
    pthread_mutex_unlock(&limits_mu);
    if (!write_it)
        return;
    if (suppressed)
        snprintf(suffix, sizeof(suffix), "suppressed=%lu", suppressed);
    va_start(ap, fields);
    vlog(level, event, suppressed ? suffix : NULL, fields, ap);
    va_end(ap);
}
