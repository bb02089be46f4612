/* Files on disk: directories, durable writes, rename without replacing, temp-file sweeps.
 *
 * Every function blocks on the file system and is thread-safe (no shared state). The daemon runs
 * the ones whose cost grows with data (shard and metadata writes and their fsyncs) on worker
 * threads; removals and the directory fsync after them run on the loop. Paths are built by the
 * caller from names that were validated (sl_shard_name_check); nothing here interprets user input.
 */
#ifndef SL_STORE_H
#define SL_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <sys/stat.h>

/* mkdir -p with mode 0750; fsyncs each parent whose entry it created, so a directory that holds
 * durable files is itself durable. Returns 0 or -errno. */
int sl_store_mkdirs(const char *path);

/* fsync a directory (makes renames and unlinks in it durable). Returns 0 or -errno. */
int sl_store_fsync_dir(const char *path);

/* Rename `from` to `to` only if `to` does not exist (renameat2 RENAME_NOREPLACE; link + unlink
 * where the file system lacks it). Returns 0, -EEXIST if `to` exists, or -errno. Does not fsync
 * the directory. */
int sl_store_rename_noreplace(const char *from, const char *to);

/* Write `len` bytes as file `name` in `dir` durably: a temp file ".<name>.tmp" is written and
 * fsynced, any existing `name` is removed (the caller decided it may be), the temp file is
 * renamed into place without replacing, and the directory is fsynced. Nothing half-written is
 * ever visible under `name`. Returns 0 or -errno (the temp file is removed on failure). */
int sl_store_write_file(const char *dir, const char *name, const void *buf, size_t len);

/* Remove `dir`/`name`; a missing file is not an error. Returns 0 or -errno. */
int sl_store_remove(const char *dir, const char *name);

/* Bytes available to unprivileged users on the file system holding `path`. Returns 0 or -errno. */
int sl_store_free_bytes(const char *path, uint64_t *out);

/* Whether `path` still names the file open as `fd` (same device and inode), e.g. a lock file
 * whose directory may have been removed and made again. Returns 1, 0 if `path` is missing or
 * another file, or -errno if it cannot tell (fstat failed, or stat failed otherwise than with
 * ENOENT/ENOTDIR: EIO, ESTALE or EACCES prove nothing). */
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
