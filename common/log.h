/* Logging: one event per line on stderr, logfmt ("ts=... level=info event=listening addr=...").
 *
 * The level is process-wide; every function here is thread-safe. A line is written with a single
 * write(2), so lines from different threads never interleave.
 */
#ifndef SL_LOG_H
#define SL_LOG_H

typedef enum sl_log_level {
    SL_LOG_DEBUG = 0,
    SL_LOG_INFO = 1,
    SL_LOG_WARN = 2,
    SL_LOG_ERROR = 3,
} sl_log_level;

/* Set the lowest level that is written. Thread-safe. */
void sl_log_set_level(sl_log_level level);

/* Current level. Thread-safe. */
sl_log_level sl_log_get_level(void);

/* Parse "debug", "info", "warn" or "error" into *out. Returns 0, or SL_EINVAL. */
int sl_log_parse_level(sl_log_level *out, const char *s);

/* Name of a level ("info"). Static string. */
const char *sl_log_level_name(sl_log_level level);

/* Write one event. `fields` is a printf format for the rest of the line, conventionally
 * "key=value key2=\"quoted value\"", and may be NULL. Thread-safe. */
void sl_log(sl_log_level level, const char *event, const char *fields, ...)
    __attribute__((format(printf, 3, 4)));

#define sl_log_debug(event, ...) sl_log(SL_LOG_DEBUG, event, __VA_ARGS__)
#define sl_log_info(event, ...)  sl_log(SL_LOG_INFO, event, __VA_ARGS__)
#define sl_log_warn(event, ...)  sl_log(SL_LOG_WARN, event, __VA_ARGS__)
#define sl_log_error(event, ...) sl_log(SL_LOG_ERROR, event, __VA_ARGS__)

#endif
