/* Files on disk: directories, durable writes, rename without replacing, temp-file sweeps.
 *
 * Every function blocks on the file system and is thread-safe (no shared state). The daemon runs
 * the ones whose cost grows with data (shard and metadata writes and their fsyncs) on worker
 * threads; removals and the directory fsync after them run on the loop. Paths are built by the
 * caller from names that were validated (sl_shard_name_check); nothing here interprets user input.
 *
 * Every file operation under the data dir goes through these functions, and none of them follows
 * a symbolic link in any component of a path (path.c): a path must name what it names without
 * one. The daemon makes its data dir canonical with realpath(3) at start, so a link found below
 * it was planted there, and the operation fails with -ELOOP; the link's target is never opened,
 * created, truncated, written, renamed or removed. Functions that act on a name (create, unlink,
 * rename, stat, the sweep's removals) act on the link itself where it is the last component.
 * sl_store_strerror words the errors these rules add.
 */
#ifndef SL_STORE_H
#define SL_STORE_H

#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <sys/stat.h>

/* Open `path` as open(2) would with `flags` and `mode`, O_NOFOLLOW and O_CLOEXEC added, following
 * no symbolic link in any component: openat2(2) with RESOLVE_NO_SYMLINKS, or, where openat2 fails
 * with ENOSYS or EPERM (kernels before 5.6, seccomp filters), sl_store_open_walk. Only regular
 * files and directories are opened (a FIFO planted at a shard's name would block its reader).
 * O_TRUNC is applied only once the file is known to be a regular file with a single name.
 * Returns the fd or -errno: -ELOOP for a link anywhere in the path, -ENOTDIR for a non-directory
 * opened with O_DIRECTORY, -ENXIO for anything but a regular file or directory, -EMLINK for a
 * regular file opened for writing that has other hard links. */
int sl_store_open(const char *path, int flags, mode_t mode);

/* sl_store_open's fallback, callable on its own for tests: the path is walked from "/" (or the
 * working directory) one component at a time, each directory opened with O_PATH | O_NOFOLLOW and
 * checked, the last component opened relative to its parent with O_NOFOLLOW. Same results. */
int sl_store_open_walk(const char *path, int flags, mode_t mode);

/* Create `path` anew for writing (O_WRONLY) with `mode`, for temp files: whatever holds its name
 * (a temp file a crash left, a link planted there) is removed as a name first, and the file is
 * made with O_CREAT | O_EXCL, so nothing but a new file of this daemon is ever written through
 * it. Returns the fd or -errno (-EEXIST if something took the name in between). */
int sl_store_create(const char *path, mode_t mode);

/* opendir(3) of `path` through sl_store_open. Returns 0 and *out (closedir), or -errno with *out
 * NULL. */
int sl_store_opendir(DIR **out, const char *path);

/* Remove the name `path` (a link itself, never its target); a missing file or directory on the
 * way is not an error. Returns 0 or -errno. */
int sl_store_unlink(const char *path);

/* lstat(2) of `path` with no link followed on the way: a link as the last component is reported
 * as itself (S_ISLNK). Returns 0 or -errno. */
int sl_store_stat(const char *path, struct stat *st);

/* Rename `from` to `to`, replacing what `to` names (a link there is replaced, not followed).
 * Returns 0 or -errno. Does not fsync the directory. */
int sl_store_rename(const char *from, const char *to);

/* The message for an error of these functions: -ELOOP, -EMLINK and -ENXIO in the words of the
 * rules above, anything else as sl_strerror. Static string. */
const char *sl_store_strerror(int err);

/* mkdir -p with mode 0750; fsyncs each parent whose entry it created, so a directory that holds
 * durable files is itself durable. Returns 0 or -errno (-ELOOP for a link on the way). */
int sl_store_mkdirs(const char *path);

/* mkdir(2) of `path` alone with `mode`, its parent resolved with no link followed (the new name
 * itself is never followed: something there, a link included, is -EEXIST). Does not fsync the
 * parent. Returns 0, -EEXIST, or -errno (-ELOOP for a link on the way). */
int sl_store_mkdir(const char *path, mode_t mode);

/* fsync a directory (makes renames and unlinks in it durable). Returns 0 or -errno. */
int sl_store_fsync_dir(const char *path);

/* Rename `from` to `to` only if `to` does not exist (renameat2 RENAME_NOREPLACE; link + unlink
 * where the file system lacks it). Returns 0, -EEXIST if `to` exists, or -errno. Does not fsync
 * the directory. */
int sl_store_rename_noreplace(const char *from, const char *to);

/* Write `len` bytes as file `name` in `dir` durably: a temp file ".<name>.tmp" is made with
 * sl_store_create, written and fsynced, any existing `name` is removed (the caller decided it may
 * be), the temp file is renamed into place without replacing, and the directory is fsynced.
 * Nothing half-written is ever visible under `name`. Returns 0 or -errno (the temp file is
 * removed on failure). */
int sl_store_write_file(const char *dir, const char *name, const void *buf, size_t len);

/* Remove `dir`/`name`; a missing file is not an error. Returns 0 or -errno. */
int sl_store_remove(const char *dir, const char *name);

/* Bytes available to unprivileged users on the file system holding `path`. Returns 0 or -errno. */
int sl_store_free_bytes(const char *path, uint64_t *out);

/* Whether `path` still names the file open as `fd` (same device and inode), e.g. a lock file
 * whose directory may have been removed and made again. Returns 1, 0 if `path` is missing or
 * another file (or a link is on its way), or -errno if it cannot tell (fstat failed, or stat
 * failed otherwise than with ENOENT/ENOTDIR/ELOOP: EIO, ESTALE or EACCES prove nothing). */
int sl_store_same_file(int fd, const char *path);

/* Decides whether a sweep keeps a file: return 1 to keep it. */
typedef int (*sl_store_keep_fn)(const char *name, const struct stat *st, void *arg);

/* Remove every regular file in `dir` for which `keep` returns 0 (with `keep` NULL: every file
 * whose name starts with '.', i.e. temp files); then fsync the directory if anything was removed.
 * *removed (may be NULL) receives the count. A missing dir is not an error. Returns 0 or -errno. */
int sl_store_sweep(const char *dir, sl_store_keep_fn keep, void *arg, int *removed);

/* Write all of buf at offset (retrying short writes and EINTR). Returns 0 or -errno. */
int sl_store_pwrite_all(int fd, const void *buf, size_t len, uint64_t offset);

/* Write the n ranges of iov, in order, starting at offset (retrying short writes and EINTR; any
 * number of ranges). Returns 0 or -errno. */
int sl_store_pwritev_all(int fd, const struct iovec *iov, int n, uint64_t offset);

/* Read exactly len bytes at offset. Returns 0, -errno, or -EIO at a premature end of file. */
int sl_store_pread_all(int fd, void *buf, size_t len, uint64_t offset);

#endif
