#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

int sl_store_pwrite_all(int fd, const void *buf, size_t len, uint64_t offset)
{
    const char *p = buf;

    while (len > 0) {
        ssize_t n = pwrite(fd, p, len, (off_t)offset);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += n;
        len -= (size_t)n;
        offset += (uint64_t)n;
    }
    return 0;
}

int sl_store_pwritev_all(int fd, const struct iovec *iov, int n, uint64_t offset)
{
    int i = 0;

    while (i < n) {
        int k = n - i < IOV_MAX ? n - i : IOV_MAX;
        ssize_t w = pwritev(fd, iov + i, k, (off_t)offset);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        offset += (uint64_t)w;
        /* Skip the ranges written; finish a range written in part on its own. */
        while (i < n && (size_t)w >= iov[i].iov_len)
            w -= (ssize_t)iov[i++].iov_len;
        if (w > 0) {
            int err = sl_store_pwrite_all(fd, (const char *)iov[i].iov_base + w,
                                          iov[i].iov_len - (size_t)w, offset);
            if (err)
                return err;
            offset += iov[i].iov_len - (size_t)w;
            i++;
        }
    }
    return 0;
}

int sl_store_pread_all(int fd, void *buf, size_t len, uint64_t offset)
{
    char *p = buf;

    while (len > 0) {
        ssize_t n = pread(fd, p, len, (off_t)offset);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0)
            return -EIO;
        p += n;
        len -= (size_t)n;
        offset += (uint64_t)n;
    }
    return 0;
}

static int join(char *buf, size_t len, const char *dir, const char *name)
{
    int n = snprintf(buf, len, "%s/%s", dir, name);

    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int sl_store_remove(const char *dir, const char *name)
{
    char path[PATH_MAX];
    int err = join(path, sizeof(path), dir, name);

    return err ? err : sl_store_unlink(path);
}

int sl_store_write_file(const char *dir, const char *name, const void *buf, size_t len)
{
    char tmp[PATH_MAX], path[PATH_MAX], tname[NAME_MAX + 1];
    int fd = -1, err;

    if ((size_t)snprintf(tname, sizeof(tname), ".%s.tmp", name) >= sizeof(tname))
        return -ENAMETOOLONG;
    err = join(tmp, sizeof(tmp), dir, tname);
    if (!err)
        err = join(path, sizeof(path), dir, name);
    if (err)
        return err;
    fd = sl_store_create(tmp, 0640);
    if (fd < 0)
        return fd;
    err = sl_store_pwrite_all(fd, buf, len, 0);
    if (!err && fsync(fd) != 0)
        err = -errno;
    if (close(fd) != 0 && !err)
        err = -errno;
    if (!err)
        err = sl_store_unlink(path);
    if (!err)
        err = sl_store_rename_noreplace(tmp, path);
    if (!err)
        err = sl_store_fsync_dir(dir);
    if (err)
        sl_store_unlink(tmp);
    return err;
}

int sl_store_free_bytes(const char *path, uint64_t *out)
{
    struct statvfs sv;
    int fd = sl_store_open(path, O_PATH | O_DIRECTORY, 0), err = 0;

    if (fd < 0)
        return fd;
    if (fstatvfs(fd, &sv) != 0)
        err = -errno;
    else
        *out = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    close(fd);
    return err;
}

int sl_store_same_file(int fd, const char *path)
{
    struct stat held, now;
    int err;

    if (fstat(fd, &held) != 0)
        return -errno;
    if ((err = sl_store_stat(path, &now)) != 0)
        return err == -ENOENT || err == -ENOTDIR || err == -ELOOP ? 0 : err;
    return held.st_dev == now.st_dev && held.st_ino == now.st_ino;
}

int sl_store_sweep(const char *dir, sl_store_keep_fn keep, void *arg, int *removed)
{
    DIR *d;
    struct dirent *e;
    int n = 0, err = sl_store_opendir(&d, dir);

    if (removed)
        *removed = 0;
    if (err)
        return err == -ENOENT ? 0 : err;
    while ((e = readdir(d)) != NULL) {
        struct stat st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (keep ? keep(e->d_name, &st, arg) : e->d_name[0] != '.')
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0)
            n++;
        else if (errno != ENOENT)
            err = -errno;
    }
    closedir(d);
    if (n > 0) {
        int e2 = sl_store_fsync_dir(dir);
        if (!err)
            err = e2;
    }
    if (removed)
        *removed = n;
    return err;
}
