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

typedef enum sl_log_format {
    SL_LOG_LOGFMT = 0, /* ts=... level=info event=x key=value */
    SL_LOG_JSON = 1,   /* {"ts":"...","level":"info","event":"x","key":"value"} */
} sl_log_format;

/* Choose the line format. Thread-safe. */
void sl_log_set_format(sl_log_format format);

/* Parse "logfmt" or "json". Returns 0 or SL_EINVAL. */
int sl_log_parse_format(sl_log_format *out, const char *s);

/* Name of a format. Static string. */
const char *sl_log_format_name(sl_log_format format);

/* Set the lowest level that is written. Thread-safe. */
void sl_log_set_level(sl_log_level level);

/* Fields added to the end of every line from now on (e.g. "replica=host:7700"; "" for none),
 * cut to 255 bytes. Set it before other threads log. */
void sl_log_set_tag(const char *fields);

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

/* As sl_log, but writes `event` at most once per `interval_ms` (per event name, for up to 64
 * names); the next line written says how many were suppressed. For hot error paths that a
 * misbehaving client can trigger at will. Thread-safe. */
void sl_log_limited(sl_log_level level, unsigned interval_ms, const char *event, const char *fields,
                    ...) __attribute__((format(printf, 4, 5)));

#define sl_log_debug(event, ...) sl_log(SL_LOG_DEBUG, event, __VA_ARGS__)
#define sl_log_info(event, ...)  sl_log(SL_LOG_INFO, event, __VA_ARGS__)
#define sl_log_warn(event, ...)  sl_log(SL_LOG_WARN, event, __VA_ARGS__)
#define sl_log_error(event, ...) sl_log(SL_LOG_ERROR, event, __VA_ARGS__)

#endif
