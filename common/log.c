#include "log.h"

#include "err.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_level = SL_LOG_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

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

const char *sl_log_level_name(sl_log_level level)
{
    return (unsigned)level < 4 ? level_names[level] : "unknown";
}

void sl_log(sl_log_level level, const char *event, const char *fields, ...)
{
    char line[4096];
    struct timespec ts;
    struct tm tm;
    size_t n;
    int r;

    if ((int)level < atomic_load(&log_level))
        return;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = strftime(line, sizeof(line), "ts=%Y-%m-%dT%H:%M:%S", &tm);
    r = snprintf(line + n, sizeof(line) - n, ".%03ldZ level=%s event=%s", ts.tv_nsec / 1000000L,
                 sl_log_level_name(level), event);
    if (r > 0)
        n += (size_t)r;
    if (fields && n < sizeof(line) - 2) {
        va_list ap;
        line[n++] = ' ';
        va_start(ap, fields);
        r = vsnprintf(line + n, sizeof(line) - n, fields, ap);
        va_end(ap);
        if (r > 0)
            n += (size_t)r;
    }
    /* Long lines are cut, never split: one event stays one line. */
    if (n > sizeof(line) - 2)
        n = sizeof(line) - 2;
    line[n++] = '\n';
    if (write(STDERR_FILENO, line, n) < 0) {
        /* Nowhere left to report a failing stderr. */
    }
}
