/* Error codes shared by every sluice module.
 *
 * Functions return int: 0 on success, a negative value on failure. System errors are -errno;
 * project codes are below -1000 and come from the X-macro table below, which yields the enum,
 * sl_strerror() and sl_errname() from one list.
 */
#ifndef SL_ERR_H
#define SL_ERR_H

/* X(name, value, message) */
#define SL_ERR_TABLE(X)                                                                            \
    X(SL_EINVAL, -1001, "invalid argument")                                                        \
    X(SL_ENOTFOUND, -1002, "not found")                                                            \
    X(SL_EEXIST, -1003, "already exists")                                                          \
    X(SL_ELIMIT, -1004, "over a limit")                                                            \
    X(SL_ECORRUPT, -1005, "data corrupt")                                                          \
    X(SL_ESTATE, -1006, "wrong state for this operation")                                          \
    X(SL_EPROTO, -1007, "protocol error")                                                          \
    X(SL_ERPC, -1008, "rpc failed")                                                                \
    X(SL_EDB, -1009, "catalog error")                                                              \
    X(SL_ESHUTDOWN, -1010, "shutting down")                                                        \
    X(SL_ECANCELLED, -1011, "cancelled")                                                           \
    X(SL_ETIMEOUT, -1012, "deadline exceeded")                                                     \
    X(SL_EUNAVAILABLE, -1013, "unavailable")                                                       \
    X(SL_EAUTH, -1014, "not authenticated")                                                        \
    X(SL_EPERM, -1015, "permission denied")                                                        \
    X(SL_EUNIMPL, -1016, "not implemented")                                                        \
    X(SL_EDBBUSY, -1017, "catalog busy: another process holds its write lock")                     \
    X(SL_ECATLOST, -1018, "catalog file removed or replaced while the daemon ran: restart it")     \
    X(SL_ECATDOWN, -1019, "catalog server unreachable: retry")                                     \
    X(SL_EFENCED, -1020, "fenced out: a newer attempt took over")

enum sl_err {
#define SL_ERR_ENUM(name, value, msg) name = value,
    SL_ERR_TABLE(SL_ERR_ENUM)
#undef SL_ERR_ENUM
};

/* Human-readable message for any code (project code or -errno). Thread-safe; the string is
 * static or thread-local and must not be freed. */
const char *sl_strerror(int code);

/* Symbolic name ("SL_EINVAL", "ENOENT") of a code. Thread-safe; static string. */
const char *sl_errname(int code);

#endif
