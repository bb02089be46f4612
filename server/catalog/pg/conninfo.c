/* What the daemon is told about its PostgreSQL server: the conninfo (--catalog), checked before
 * connecting, and the password file (--catalog-password-file), checked at start and read to
 * connect. */
#include "../internal.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void sl_db_pg_clean(char *dst, size_t len, const char *msg)
{
    size_t j = 0;

    for (size_t i = 0; msg && msg[i] && j + 1 < len; i++)
        dst[j++] = msg[i] == '"' ? '\'' : msg[i] == '\n' ? ' ' : msg[i];
    dst[j] = '\0';
}

int sl_db_pg_password_check(const char *path, char *msg, size_t len)
{
    struct stat st;

    /* A file that is not there yet (a secret mounted at start) is looked for when connecting. */
    if (stat(path, &st) != 0)
        return 0;
    if (!S_ISREG(st.st_mode) || (st.st_mode & 077)) {
        snprintf(msg, len,
                 "--catalog-password-file %s: not a regular file only its owner can read "
                 "(chmod 600)",
                 path);
        return SL_EINVAL;
    }
    return 0;
}

int sl_db_pg_read_password(const char *path, char *pw, size_t len)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW), err = 0;
    ssize_t n;

    if (fd < 0) {
        err = -errno;
        sl_log_error("catalog_password_file", "path=%s error=\"%s\"", path, sl_strerror(err));
        return err;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 077)) {
        sl_log_error("catalog_password_file",
                     "path=%s error=\"not a regular file only its owner can read (chmod 600)\"",
                     path);
        close(fd);
        return SL_EINVAL;
    }
    n = read(fd, pw, len - 1);
    close(fd);
    if (n < 0)
        return -errno;
    pw[n] = '\0';
    pw[strcspn(pw, "\r\n")] = '\0';
    return 0;
}

int sl_db_pg_check(const char *where, char *msg, size_t len)
{
    char *perr = NULL;
    PQconninfoOption *opts = PQconninfoParse(where, &perr), *o;
    int err = 0;

    if (!opts) {
        snprintf(msg, len, "--catalog is not a PostgreSQL conninfo: ");
        sl_db_pg_clean(msg + strlen(msg), len - strlen(msg), perr ? perr : "out of memory");
        PQfreemem(perr);
        return SL_EINVAL;
    }
    for (o = opts; o->keyword; o++)
        if (!strcmp(o->keyword, "password") && o->val && o->val[0]) {
            /* Never echoed: it would be in argv, the config and the logs. */
            snprintf(msg, len,
                     "--catalog: the PostgreSQL conninfo holds a password: put it in "
                     "--catalog-password-file or PGPASSFILE instead");
            err = SL_EINVAL;
        }
    PQconninfoFree(opts);
    return err;
}

int sl_db_pg_check_conninfo(const char *where)
{
    char msg[512];
    int err = sl_db_pg_check(where, msg, sizeof(msg));

    if (err)
        sl_log_error("catalog_conninfo", "error=\"%s\"", msg);
    return err;
}
