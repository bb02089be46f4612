/* The PostgreSQL password file (--catalog-password-file): checked at start, read to connect. */
#include "../internal.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
