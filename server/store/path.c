/* Names under the data dir, resolved without following symbolic links. See store.h.
 *
 * The daemon's paths are its data dir, made canonical by realpath(3) at start, and names below
 * it built from checked names: none of their components is a symbolic link, so a link found in
 * one was planted by someone who can write in the data dir, and it is refused, never followed.
 * The kernel checks a whole path in one call where it can (openat2 with RESOLVE_NO_SYMLINKS,
 * Linux 5.6); where openat2 is missing or filtered (ENOSYS on old kernels, EPERM from some
 * seccomp profiles) the path is walked one component at a time with O_NOFOLLOW. Operations on a
 * name (create, remove, rename, stat) open its parent directory so and act on the last component
 * relative to it, which unlinkat, renameat2, fstatat(AT_SYMLINK_NOFOLLOW) and openat(O_NOFOLLOW)
 * never follow.
 */
#include "store.h"

#include "err.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#else
struct open_how {
    uint64_t flags;
    uint64_t mode;
    uint64_t resolve;
};
#define RESOLVE_NO_MAGICLINKS 0x02
#define RESOLVE_NO_SYMLINKS   0x04
#endif
#ifndef SYS_openat2
#define SYS_openat2 437 /* the same number on every architecture */
#endif

/* What a directory on the way is opened with: no access needed (a parent such as /home/user may
 * be searchable only), and O_PATH takes no other flags. */
#define STEP_FLAGS (O_PATH | O_NOFOLLOW | O_CLOEXEC)

/* The flags given to the kernel for the caller's `flags`. O_NOFOLLOW: a link as the last
 * component is refused too. O_NONBLOCK: a FIFO planted at a file's name would block the open
 * until a writer came; it is refused after the open instead (finish). O_TRUNC is done by finish,
 * once the file is known to be a regular file with no other name. O_DIRECTORY is checked by
 * finish as well, so that a link there is ELOOP, not the kernel's ENOTDIR. */
static int kernel_flags(int flags)
{
    if (flags & O_PATH)
        return STEP_FLAGS;
    return (flags & ~(O_DIRECTORY | O_TRUNC)) | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
}

/* Check what `fd` (or the -errno of its open) is, against the caller's `flags`: -ELOOP for a
 * link (an O_PATH open returns the link itself), -ENOTDIR for a non-directory asked for as one,
 * -ENXIO for anything but a regular file or a directory, -EMLINK for a regular file opened for
 * writing that has other names (a hard link planted at a temp file's name: its other names may
 * be outside the data dir). Then truncates (O_TRUNC) and clears O_NONBLOCK. Closes fd on failure.
 * Returns fd or -errno. */
static int finish(int fd, int flags)
{
    struct stat st;
    int err = 0;

    if (fd < 0)
        return fd;
    if (fstat(fd, &st) != 0)
        err = -errno;
    else if (S_ISLNK(st.st_mode))
        err = -ELOOP;
    else if ((flags & O_DIRECTORY) && !S_ISDIR(st.st_mode))
        err = -ENOTDIR;
    else if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
        err = -ENXIO;
    else if (S_ISREG(st.st_mode) && (flags & O_ACCMODE) != O_RDONLY && st.st_nlink > 1)
        err = -EMLINK;
    if (!err && (flags & O_TRUNC) && ftruncate(fd, 0) != 0)
        err = -errno;
    if (!err && !(flags & (O_PATH | O_NONBLOCK)) &&
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
        err = -errno;
    if (err) {
        close(fd);
        return err;
    }
    return fd;
}

/* Split `path` into its directory (dir, PATH_MAX bytes) and last component (name, NAME_MAX + 1
 * bytes), trailing slashes dropped: "/a/b/" gives "/a" and "b", "b" gives "." and "b", "/" gives
 * "/" and ".". Returns 0 or -ENAMETOOLONG (also for an empty path). */
static int split(const char *path, char *dir, char *name)
{
    size_t n = strlen(path), start, d;
    const char *slash;

    if (n == 0 || n >= PATH_MAX)
        return -ENAMETOOLONG;
    while (n > 1 && path[n - 1] == '/')
        n--;
    slash = memrchr(path, '/', n);
    if (slash && slash == path + n - 1) { /* the root itself */
        strcpy(dir, "/");
        strcpy(name, ".");
        return 0;
    }
    if (!slash) {
        strcpy(dir, ".");
        start = 0;
    } else {
        d = slash == path ? 1 : (size_t)(slash - path); /* "/b": the parent is "/" */
        memcpy(dir, path, d);
        dir[d] = '\0';
        start = (size_t)(slash - path) + 1;
    }
    if (n - start > NAME_MAX)
        return -ENAMETOOLONG;
    memcpy(name, path + start, n - start);
    name[n - start] = '\0';
    return 0;
}

/* fsync the directory open as O_PATH `dfd` (fsync needs a descriptor opened for reading). */
static int fsync_at(int dfd)
{
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC), err = 0;

    if (fd < 0)
        return -errno;
    if (fsync(fd) != 0)
        err = -errno;
    close(fd);
    return err;
}

/* One step of a walk: directory `name` in `dfd`, opened O_PATH without following it. With
 * `create`, a missing one is made (mode 0750) and its parent fsynced, so that a directory that
 * will hold durable files is itself durable. Returns the fd or -errno. */
static int step(int dfd, const char *name, int create)
{
    int fd = openat(dfd, name, STEP_FLAGS), err;

    if (fd < 0 && errno == ENOENT && create) {
        if (mkdirat(dfd, name, 0750) == 0) {
            if ((err = fsync_at(dfd)) != 0)
                return err;
        } else if (errno != EEXIST) {
            return -errno;
        }
        fd = openat(dfd, name, STEP_FLAGS);
    }
    return finish(fd < 0 ? -errno : fd, O_PATH | O_DIRECTORY);
}

/* Walk directory path `dir` from "/" or the working directory, one component at a time, making
 * missing ones with `create`. Returns an O_PATH fd of it or -errno. */
static int walk(const char *dir, int create)
{
    char comp[NAME_MAX + 1];
    const char *p = dir;
    int dfd = open(*dir == '/' ? "/" : ".", STEP_FLAGS | O_DIRECTORY);

    if (dfd < 0)
        return -errno;
    while (*p) {
        size_t n = strcspn(p, "/");
        if (n > NAME_MAX) {
            close(dfd);
            return -ENAMETOOLONG;
        }
        if (n > 0) {
            int fd;
            memcpy(comp, p, n);
            comp[n] = '\0';
            fd = step(dfd, comp, create);
            close(dfd);
            if (fd < 0)
                return fd;
            dfd = fd;
        }
        p += n + (p[n] == '/');
    }
    return dfd;
}

int sl_store_open_walk(const char *path, int flags, mode_t mode)
{
    char dir[PATH_MAX], name[NAME_MAX + 1];
    int err = split(path, dir, name), dfd, fd;

    if (err)
        return err;
    if ((dfd = walk(dir, 0)) < 0)
        return dfd;
    fd = openat(dfd, name, kernel_flags(flags), mode);
    fd = fd < 0 ? -errno : fd;
    close(dfd);
    return finish(fd, flags);
}

int sl_store_open(const char *path, int flags, mode_t mode)
{
    struct open_how how = {
        .flags = (uint64_t)kernel_flags(flags),
        .mode = (flags & O_CREAT) ? mode : 0,
        .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    long fd = syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof(how));

    if (fd < 0 && (errno == ENOSYS || errno == EPERM))
        return sl_store_open_walk(path, flags, mode);
    return finish(fd < 0 ? -errno : (int)fd, flags);
}

/* The directory holding `path`'s last component, opened O_PATH without following links, and
 * that component into name (NAME_MAX + 1 bytes). Returns the fd or -errno. */
static int open_parent(const char *path, char *name)
{
    char dir[PATH_MAX];
    int err = split(path, dir, name);

    return err ? err : sl_store_open(dir, O_PATH | O_DIRECTORY, 0);
}

int sl_store_mkdirs(const char *path)
{
    char dir[PATH_MAX], name[NAME_MAX + 1];
    int err = split(path, dir, name), dfd, fd;

    if (err)
        return err;
    if ((dfd = walk(dir, 1)) < 0)
        return dfd;
    fd = step(dfd, name, 1);
    close(dfd);
    if (fd < 0)
        return fd;
    close(fd);
    return 0;
}

int sl_store_mkdir(const char *path, mode_t mode)
{
    char name[NAME_MAX + 1];
    int dfd = open_parent(path, name), err = 0;

    if (dfd < 0)
        return dfd;
    if (mkdirat(dfd, name, mode) != 0)
        err = -errno;
    close(dfd);
    return err;
}

int sl_store_fsync_dir(const char *path)
{
    int fd = sl_store_open(path, O_RDONLY | O_DIRECTORY, 0), err = 0;

    if (fd < 0)
        return fd;
    if (fsync(fd) != 0)
        err = -errno;
    close(fd);
    return err;
}

int sl_store_create(const char *path, mode_t mode)
{
    char name[NAME_MAX + 1];
    int dfd = open_parent(path, name), fd;

    if (dfd < 0)
        return dfd;
    /* Whatever holds the name goes as a name: a link's target is never opened. */
    if (unlinkat(dfd, name, 0) != 0 && errno != ENOENT)
        fd = -errno;
    else if ((fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode)) <
             0)
        fd = -errno;
    close(dfd);
    return fd;
}

int sl_store_opendir(DIR **out, const char *path)
{
    int fd = sl_store_open(path, O_RDONLY | O_DIRECTORY, 0), err;

    *out = NULL;
    if (fd < 0)
        return fd;
    if ((*out = fdopendir(fd)) == NULL) {
        err = -errno;
        close(fd);
        return err;
    }
    return 0;
}

int sl_store_unlink(const char *path)
{
    char name[NAME_MAX + 1];
    int dfd = open_parent(path, name), err = 0;

    if (dfd < 0)
        return dfd == -ENOENT ? 0 : dfd;
    if (unlinkat(dfd, name, 0) != 0 && errno != ENOENT)
        err = -errno;
    close(dfd);
    return err;
}

int sl_store_stat(const char *path, struct stat *st)
{
    char name[NAME_MAX + 1];
    int dfd = open_parent(path, name), err = 0;

    if (dfd < 0)
        return dfd;
    if (fstatat(dfd, name, st, AT_SYMLINK_NOFOLLOW) != 0)
        err = -errno;
    close(dfd);
    return err;
}

/* renameat2 between the parents of `from` and `to` with `flags` (0 or RENAME_NOREPLACE). */
static int rename_names(const char *from, const char *to, unsigned flags)
{
    char fname[NAME_MAX + 1], tname[NAME_MAX + 1];
    int fdir = open_parent(from, fname), tdir = -1, err = 0;

    if (fdir < 0)
        return fdir;
    if ((tdir = open_parent(to, tname)) < 0) {
        close(fdir);
        return tdir;
    }
    if (renameat2(fdir, fname, tdir, tname, flags) != 0) {
        err = -errno;
        /* No RENAME_NOREPLACE on this file system: link() fails with EEXIST just the same. */
        if (flags && (err == -EINVAL || err == -ENOSYS)) {
            err = 0;
            if (linkat(fdir, fname, tdir, tname, 0) != 0 || unlinkat(fdir, fname, 0) != 0)
                err = -errno;
        }
    }
    close(tdir);
    close(fdir);
    return err;
}

int sl_store_rename_noreplace(const char *from, const char *to)
{
    return rename_names(from, to, RENAME_NOREPLACE);
}

int sl_store_rename(const char *from, const char *to)
{
    return rename_names(from, to, 0);
}

const char *sl_store_strerror(int err)
{
    switch (err) {
    case -ELOOP:
        return "a symbolic link is in the path (the store follows none)";
    case -EMLINK:
        return "the file has other hard links (refused for writing)";
    case -ENXIO:
        return "not a regular file or a directory";
    default:
        return sl_strerror(err);
    }
}
