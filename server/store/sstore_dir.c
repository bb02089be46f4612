/* The directory backend of the shard store (sstore.h): <root>/<job>/<file> through store.h, a
 * partial upload as ".<file>.part" beside where the shard goes, disk reserved ahead of the
 * writes, the finished file fsynced and renamed into place, the directory fsynced. */
#include "sstore.h"

#include "layout.h"
#include "quarantine.h"
#include "store.h"

#include "err.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Disk space is reserved (fallocate) this far ahead of an upload's written bytes, in steps as
 * the data arrives, never the whole announced size at once; a stopped upload gives back what
 * it reserved beyond its written bytes. */
#define RESERVE_AHEAD (64u << 20)
#define FLUSH_EVERY   (8u << 20) /* start writeback of an upload every 8 MiB */

typedef struct dstore {
    sl_sstore base;
    char root[PATH_MAX];
    sl_quar *quar;
} dstore;

struct sl_swriter {
    dstore *s;
    char dir[PATH_MAX], part[PATH_MAX], final[PATH_MAX];
    char name[SL_SHARD_NAME_MAX + 1];
    int fd;
    int64_t gen; /* the attempt's lease generation, 0: none */
    int32_t rank;
    uint32_t tensor_count;
    uint64_t data_size;
    uint64_t written, flushed, reserved;
    int no_reserve, sealed, finished;
    char sha[SL_SHARD_HEX_LEN + 1]; /* the sealed header's checksum */
};

struct sl_sreader {
    int fd;
};

static int job_dir(const dstore *s, char *buf, size_t len, const char *job)
{
    return sl_store_job_dir(buf, len, s->root, job);
}

static int file_path(const dstore *s, char *buf, size_t len, const char *job, const char *file)
{
    int n = snprintf(buf, len, "%s/%s/%s", s->root, job, file);

    return n < 0 || (size_t)n >= len ? SL_ELIMIT : 0;
}

/* ---- writers ---- */

/* The file's header with the checksum `sha` (64 characters: '0's while writing). */
static void w_header(const sl_swriter *w, const char *sha, uint8_t hdr[SL_SHARD_HEADER_SIZE])
{
    sl_shard_header h;

    memset(&h, 0, sizeof(h));
    h.rank = w->rank;
    memcpy(h.sha256, sha, SL_SHARD_HEX_LEN);
    h.tensor_count = (int32_t)w->tensor_count;
    h.data_len = w->data_size;
    sl_shard_header_encode(hdr, &h);
}

/* Reserve the data section up to `to` data bytes (at most the shard's size), so a full disk is
 * found before the data is sent. File systems without fallocate are checked by the writes. */
static int w_reserve(sl_swriter *w, uint64_t to, char *msg, size_t msglen)
{
    int err;

    if (to > w->data_size)
        to = w->data_size;
    if (w->no_reserve || to <= w->reserved)
        return 0;
    if (fallocate(w->fd, FALLOC_FL_KEEP_SIZE, (off_t)(SL_SHARD_HEADER_SIZE + w->reserved),
                  (off_t)(to - w->reserved)) != 0) {
        if (errno == EOPNOTSUPP || errno == ENOSYS) {
            w->no_reserve = 1;
            return 0;
        }
        err = -errno;
        snprintf(msg, msglen, "cannot reserve %" PRIu64 " bytes: %s", to - w->reserved,
                 sl_strerror(err));
        return err;
    }
    w->reserved = to;
    return 0;
}

/* A resume: the kept file must be this rank's shard of the same size and tensor count and hold
 * at least the prefix the client skips; that prefix is hashed again and anything after it cut. */
static int w_resume(sl_swriter *w, uint64_t from, sl_sha256 *sha, char *msg, size_t msglen)
{
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    sl_shard_header h;
    struct stat st;
    int err;

    if (fstat(w->fd, &st) != 0 || sl_store_pread_all(w->fd, hdr, sizeof(hdr), 0) != 0 ||
        sl_shard_header_decode(&h, hdr, sizeof(hdr)) != 0 || h.rank != w->rank ||
        h.data_len != w->data_size || (uint32_t)h.tensor_count != w->tensor_count ||
        (uint64_t)st.st_size < SL_SHARD_HEADER_SIZE + from) {
        snprintf(msg, msglen,
                 "cannot resume at offset %" PRIu64
                 ": the server holds no matching partial upload (ask UploadStatus)",
                 from);
        return SL_ESTATE;
    }
    err = sl_shard_hash_fd(sha, w->fd, SL_SHARD_HEADER_SIZE, from);
    if (!err && ftruncate(w->fd, (off_t)(SL_SHARD_HEADER_SIZE + from)) != 0)
        err = -errno;
    if (err) {
        snprintf(msg, msglen, "cannot re-read the kept prefix: %s", sl_strerror(err));
        return err;
    }
    w->written = from;
    w->flushed = from;
    return 0;
}

/* A new upload: an empty file with a placeholder header. */
static int w_create(sl_swriter *w, char *msg, size_t msglen)
{
    char zeros[SL_SHARD_HEX_LEN];
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    int err = 0;

    memset(zeros, '0', sizeof(zeros));
    w_header(w, zeros, hdr);
    if (ftruncate(w->fd, 0) != 0)
        err = -errno;
    if (!err)
        err = sl_store_pwrite_all(w->fd, hdr, sizeof(hdr), 0);
    if (err)
        snprintf(msg, msglen, "cannot write the partial file: %s", sl_strerror(err));
    return err;
}

/* The partial uploads of the writer's (name, rank) other than its own: the newest older one (to
 * resume from), and whether a newer attempt has one (this one is fenced out). */
typedef struct others {
    const sl_swriter *w;
    int64_t newest;
    char newest_path[PATH_MAX];
    int newer;
} others;

static int find_other(const char *path, int32_t rank, int64_t gen, void *arg)
{
    others *o = arg;

    (void)rank;
    if (gen > o->w->gen)
        o->newer = 1;
    else if (gen < o->w->gen && (o->newest_path[0] == '\0' || gen > o->newest)) {
        o->newest = gen;
        snprintf(o->newest_path, sizeof(o->newest_path), "%s", path);
    }
    return 0;
}

static int remove_older(const char *path, int32_t rank, int64_t gen, void *arg)
{
    const sl_swriter *w = arg;

    (void)rank;
    if (gen < w->gen)
        sl_store_unlink(path);
    return 0;
}

/* Create the attempt's own partial file (a name no other attempt uses). */
static int w_create_own(sl_swriter *w, char *msg, size_t msglen)
{
    int fd = sl_store_open(w->part, O_RDWR | O_CREAT | O_TRUNC, 0640);

    if (fd < 0) {
        snprintf(msg, msglen, "cannot open the partial file %.200s: %s", w->part,
                 sl_store_strerror(fd));
        return fd;
    }
    w->fd = fd;
    return 0;
}

/* Copy [header, header + from) of src into the writer's new file, behind a placeholder header. */
static int w_copy_prefix(sl_swriter *w, int src, uint64_t from)
{
    char zeros[SL_SHARD_HEX_LEN];
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    loff_t in_off = SL_SHARD_HEADER_SIZE, out_off = SL_SHARD_HEADER_SIZE;
    int err;

    memset(zeros, '0', sizeof(zeros));
    w_header(w, zeros, hdr);
    err = sl_store_pwrite_all(w->fd, hdr, sizeof(hdr), 0);
    while (!err && (uint64_t)in_off < SL_SHARD_HEADER_SIZE + from) {
        ssize_t n = copy_file_range(src, &in_off, w->fd, &out_off,
                                    (size_t)(SL_SHARD_HEADER_SIZE + from - (uint64_t)in_off), 0);
        if (n < 0 && errno != EINTR)
            err = -errno;
        else if (n == 0)
            err = -EIO;
    }
    return err;
}

/* A resume of another attempt's upload: the newest older partial upload (`from_path`) must be
 * this rank's shard of the same size and tensor count and hold the prefix; only then is the
 * attempt's own file made, the prefix copied into it (never written in place: the other attempt
 * may still hold it open) and hashed again there. A refused resume leaves no file behind. */
static int w_resume_copy(sl_swriter *w, const char *from_path, uint64_t from, sl_sha256 *sha,
                         char *msg, size_t msglen)
{
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    sl_shard_header h;
    struct stat st;
    int err, src = from_path[0] ? sl_store_open(from_path, O_RDONLY, 0) : -ENOENT;

    if (src < 0 || fstat(src, &st) != 0 || sl_store_pread_all(src, hdr, sizeof(hdr), 0) != 0 ||
        sl_shard_header_decode(&h, hdr, sizeof(hdr)) != 0 || h.rank != w->rank ||
        h.data_len != w->data_size || (uint32_t)h.tensor_count != w->tensor_count ||
        (uint64_t)st.st_size < SL_SHARD_HEADER_SIZE + from) {
        if (src >= 0)
            close(src);
        snprintf(msg, msglen,
                 "cannot resume at offset %" PRIu64
                 ": the server holds no matching partial upload (ask UploadStatus)",
                 from);
        return SL_ESTATE;
    }
    err = w_create_own(w, msg, msglen);
    if (!err && (err = w_copy_prefix(w, src, from)) == 0)
        err = sl_shard_hash_fd(sha, w->fd, SL_SHARD_HEADER_SIZE, from);
    close(src);
    if (err) {
        if (!msg[0])
            snprintf(msg, msglen, "cannot copy the kept prefix: %s", sl_strerror(err));
        return err;
    }
    w->written = from;
    w->flushed = 0;
    return 0;
}

/* Open attempt w->gen's own partial upload: fenced out if a newer attempt has one; a resume
 * copies the newest older one's prefix; then the older ones are removed, so that their holders'
 * late renames find nothing to publish. */
static int w_open_gen(sl_swriter *w, uint64_t resume_from, sl_sha256 *sha, char *msg, size_t msglen)
{
    others o = {.w = w};
    int err = sl_store_parts_each(w->dir, w->name, w->rank, find_other, &o);

    if (!err && o.newer) {
        snprintf(msg, msglen, "a newer upload attempt of rank %d has started", w->rank);
        return SL_EFENCED;
    }
    if (!err && resume_from > 0)
        err = w_resume_copy(w, o.newest_path, resume_from, sha, msg, msglen);
    else if (!err && (err = w_create_own(w, msg, msglen)) == 0)
        err = w_create(w, msg, msglen);
    if (!err)
        err = sl_store_parts_each(w->dir, w->name, w->rank, remove_older, w);
    if (err && !msg[0])
        snprintf(msg, msglen, "cannot open the partial upload: %s", sl_store_strerror(err));
    return err;
}

static int d_w_open(sl_sstore *base, const sl_swriter_spec *spec, sl_sha256 *sha, sl_swriter **out,
                    char *msg, size_t msglen)
{
    dstore *s = (dstore *)base;
    sl_swriter *w = calloc(1, sizeof(*w));
    char file[NAME_MAX + 1];
    int err;

    *out = NULL;
    if (!w)
        return -ENOMEM;
    w->s = s;
    w->fd = -1;
    w->rank = spec->rank;
    w->gen = spec->generation;
    w->tensor_count = spec->tensor_count;
    w->data_size = spec->data_size;
    snprintf(w->name, sizeof(w->name), "%s", spec->name);
    if (job_dir(s, w->dir, sizeof(w->dir), spec->job) != 0 ||
        sl_store_part_name(file, sizeof(file), spec->name, spec->rank, w->gen) != 0 ||
        snprintf(w->part, sizeof(w->part), "%s/%s", w->dir, file) >= (int)sizeof(w->part) ||
        sl_store_path(w->final, sizeof(w->final), w->dir, SL_STORE_SHARD, spec->name, spec->rank) !=
            0) {
        snprintf(msg, msglen, "checkpoint path too long");
        free(w);
        return SL_EINVAL;
    }
    /* From here on the writer is returned also on failure: closing it decides whether the
     * partial file (or whatever was planted at its name) stays. */
    *out = w;
    err = sl_store_mkdirs(w->dir);
    if (err) {
        snprintf(msg, msglen, "cannot create the checkpoint directory %.200s: %s", w->dir,
                 sl_store_strerror(err));
        return err;
    }
    if (w->gen > 0) {
        err = w_open_gen(w, spec->resume_from, sha, msg, msglen);
        goto reserve;
    }
    w->fd = sl_store_open(w->part, O_RDWR | O_CREAT, 0640);
    if (w->fd < 0) {
        err = w->fd;
        w->fd = -1;
        snprintf(msg, msglen, "cannot open the partial file %.200s: %s", w->part,
                 sl_store_strerror(err));
        return err;
    }
    err = spec->resume_from > 0 ? w_resume(w, spec->resume_from, sha, msg, msglen)
                                : w_create(w, msg, msglen);
reserve:
    if (!err) {
        w->reserved = w->written;
        err = w_reserve(w, w->written + RESERVE_AHEAD, msg, msglen);
    }
    return err;
}

static int d_w_write(sl_swriter *w, const struct iovec *iov, int n, uint64_t off, char *msg,
                     size_t msglen)
{
    uint64_t end = off;
    int err = 0;

    for (int i = 0; i < n; i++)
        end += iov[i].iov_len;
    /* Keep the reservation ahead of the data: once the writes come within half a window of its
     * end, it grows to a whole window beyond them. */
    if (end + RESERVE_AHEAD / 2 > w->reserved)
        err = w_reserve(w, end + RESERVE_AHEAD, msg, msglen);
    if (!err)
        err = sl_store_pwritev_all(w->fd, iov, n, SL_SHARD_HEADER_SIZE + off);
    if (err) {
        if (!msg[0])
            snprintf(msg, msglen, "cannot write the shard: %s", sl_strerror(err));
        return err;
    }
    w->written = end;
    /* Start writeback of what has accumulated, so the final fsync finds little left to write
     * and the disk works while the rest of the shard arrives. Advisory: errors surface at fsync. */
    if (w->written - w->flushed >= FLUSH_EVERY) {
        sync_file_range(w->fd, (off_t)(SL_SHARD_HEADER_SIZE + w->flushed),
                        (off_t)(w->written - w->flushed), SYNC_FILE_RANGE_WRITE);
        w->flushed = w->written;
    }
    return 0;
}

/* The header of the shard file (or sealed partial upload) at `path`: 0 with its checksum and
 * its size matching the header's data length, SL_ENOTFOUND, or SL_ECORRUPT. */
static int read_sha(const char *path, char sha[SL_SHARD_HEX_LEN + 1], sl_shard_header *h,
                    uint64_t *size)
{
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    struct stat st;
    int err, fd = sl_store_open(path, O_RDONLY, 0);

    if (fd < 0)
        return fd == -ENOENT ? SL_ENOTFOUND : fd;
    err = fstat(fd, &st) != 0 ? -errno : sl_store_pread_all(fd, hdr, sizeof(hdr), 0);
    if (!err && sl_shard_header_decode(h, hdr, sizeof(hdr)) != 0)
        err = SL_ECORRUPT;
    close(fd);
    if (err)
        return err == -EIO ? SL_ECORRUPT : err;
    *size = (uint64_t)st.st_size;
    memcpy(sha, h->sha256, SL_SHARD_HEX_LEN + 1);
    return 0;
}

/* 1 if the file at `path` carries checksum `sha` in its header and has the size it declares. */
static int shard_sha_is(const char *path, const char *sha)
{
    char got[SL_SHARD_HEX_LEN + 1];
    sl_shard_header h;
    uint64_t size;

    return read_sha(path, got, &h, &size) == 0 && strcmp(got, sha) == 0 &&
           size == SL_SHARD_HEADER_SIZE + h.data_len;
}

/* The real header, the size, fsync: durable as the partial upload; published by d_w_publish. */
static int d_w_finish(sl_swriter *w, const char *sha_hex, char *msg, size_t msglen)
{
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    const char *step = "write the header";
    int err;

    w_header(w, sha_hex, hdr);
    err = sl_store_pwrite_all(w->fd, hdr, sizeof(hdr), 0);
    if (!err && ftruncate(w->fd, (off_t)(SL_SHARD_HEADER_SIZE + w->data_size)) != 0) {
        err = -errno;
        step = "truncate";
    }
    if (!err && fsync(w->fd) != 0) {
        err = -errno;
        step = "fsync";
    }
    if (err) {
        snprintf(msg, msglen, "cannot %s: %s", step, sl_store_strerror(err));
    } else {
        w->sealed = 1;
        snprintf(w->sha, sizeof(w->sha), "%s", sha_hex);
    }
    return err;
}

/* Rename the sealed partial upload over the shard's name (an older shard of the rank replaced
 * in one step) and fsync the directory. The file is kept open until close, so that a discarding
 * close removes the shard only while it is still this writer's. */
static int d_w_publish(sl_swriter *w, char *msg, size_t msglen)
{
    const char *step = "rename";
    int err = w->sealed ? sl_store_rename(w->part, w->final) : SL_ESTATE;

    if (err == -ENOENT && shard_sha_is(w->final, w->sha)) {
        /* Our sealed file was published for us (a Commit that found the rank recorded but not
         * yet renamed, sl_sstore_ops.recover): the same bytes are under the name. */
        err = 0;
    } else if (err == -ENOENT && w->gen > 0) {
        /* A newer attempt removed ours: it is fenced out, and nothing was published. */
        snprintf(msg, msglen, "a newer upload attempt of rank %d took over", w->rank);
        return SL_EFENCED;
    }
    if (!err && (err = sl_store_fsync_dir(w->dir)) != 0)
        step = "fsync the directory";
    if (err)
        snprintf(msg, msglen, "cannot %s: %s", step, sl_store_strerror(err));
    else
        w->finished = 1;
    return err;
}

static void d_w_release(sl_swriter *w)
{
    off_t end = (off_t)(SL_SHARD_HEADER_SIZE + w->written);

    if (w->fd < 0)
        return;
    /* Cutting the file at its written end frees the blocks reserved beyond it on ext4 and XFS,
     * even when the size does not change; punching them covers file systems where it does not
     * (tmpfs). The written bytes stay for a resume. Failures leave the space to the sweep. */
    if (w->reserved > w->written && ftruncate(w->fd, end) == 0)
        fallocate(w->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, end,
                  (off_t)(w->reserved - w->written));
    w->reserved = w->written;
}

/* 1 if `path` is the file open as fd (the same inode). */
static int same_file(const char *path, int fd)
{
    struct stat a, b;

    return fd >= 0 && fstat(fd, &a) == 0 && sl_store_stat(path, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

static void d_w_close(sl_swriter *w, int discard)
{
    if (!w)
        return;
    /* A published shard is removed only while the name is still ours; an unpublished partial
     * upload has a name of its own (or, generation 0, one writer at a time). */
    if (discard && (!w->finished || same_file(w->final, w->fd)))
        sl_store_unlink(w->finished ? w->final : w->part);
    if (w->fd >= 0)
        close(w->fd);
    free(w);
}

/* The newest partial upload of a rank (the highest generation). */
typedef struct newest {
    int64_t gen;
    char path[PATH_MAX];
} newest;

static int find_newest(const char *path, int32_t rank, int64_t gen, void *arg)
{
    newest *n = arg;

    (void)rank;
    if (!n->path[0] || gen > n->gen) {
        n->gen = gen;
        snprintf(n->path, sizeof(n->path), "%s", path);
    }
    return 0;
}

static int d_held(sl_sstore *base, const char *job, const char *name, int32_t rank, uint64_t *held)
{
    dstore *s = (dstore *)base;
    char dir[PATH_MAX];
    newest n = {0};

    if (job_dir(s, dir, sizeof(dir), job) != 0 ||
        sl_store_parts_each(dir, name, rank, find_newest, &n) != 0 || !n.path[0])
        return SL_ENOTFOUND;
    return sl_store_part_held(n.path, rank, held);
}

/* ---- readers, small files ---- */

static int d_r_open(sl_sstore *base, const char *job, const char *file, sl_sreader **out,
                    uint64_t *size, char *msg, size_t msglen)
{
    dstore *s = (dstore *)base;
    char path[PATH_MAX];
    struct stat st;
    sl_sreader *r;
    int fd, err;

    *out = NULL;
    if (file_path(s, path, sizeof(path), job, file) != 0) {
        snprintf(msg, msglen, "path too long");
        return SL_ELIMIT;
    }
    fd = sl_store_open(path, O_RDONLY, 0);
    if (fd < 0) {
        snprintf(msg, msglen, "%s", sl_store_strerror(fd));
        return fd == -ENOENT ? SL_ENOTFOUND : fd;
    }
    if (fstat(fd, &st) != 0) {
        err = -errno;
        snprintf(msg, msglen, "%s", sl_strerror(err));
        close(fd);
        return err;
    }
    r = malloc(sizeof(*r));
    if (!r) {
        close(fd);
        return -ENOMEM;
    }
    r->fd = fd;
    *size = (uint64_t)st.st_size;
    *out = r;
    return 0;
}

static int d_r_read(sl_sreader *r, void *buf, size_t len, uint64_t off, char *msg, size_t msglen)
{
    int err = sl_store_pread_all(r->fd, buf, len, off);

    if (err == -EIO) {
        snprintf(msg, msglen, "file is truncated");
        return SL_ECORRUPT;
    }
    if (err)
        snprintf(msg, msglen, "%s", sl_strerror(err));
    return err;
}

static void d_r_close(sl_sreader *r)
{
    if (!r)
        return;
    close(r->fd);
    free(r);
}

static int d_put(sl_sstore *base, const char *job, const char *file, const void *buf, size_t len,
                 char *msg, size_t msglen)
{
    dstore *s = (dstore *)base;
    char dir[PATH_MAX];
    int err;

    if (job_dir(s, dir, sizeof(dir), job) != 0) {
        snprintf(msg, msglen, "path too long");
        return SL_ELIMIT;
    }
    err = sl_store_write_file(dir, file, buf, len);
    if (err)
        snprintf(msg, msglen, "cannot write %s in %s: %s", file, dir, sl_store_strerror(err));
    return err;
}

static int d_stat(sl_sstore *base, const char *job, const char *file, uint64_t *size)
{
    dstore *s = (dstore *)base;
    char path[PATH_MAX];
    struct stat st;
    int err;

    if (file_path(s, path, sizeof(path), job, file) != 0)
        return SL_ELIMIT;
    err = sl_store_stat(path, &st);
    if (err)
        return err == -ENOENT ? SL_ENOTFOUND : err;
    if (!S_ISREG(st.st_mode))
        return SL_ENOTFOUND;
    *size = (uint64_t)st.st_size;
    return 0;
}

static int d_shard_sha(sl_sstore *base, const char *job, const char *file, uint64_t *size,
                       char sha[SL_SHARD_HEX_LEN + 1])
{
    dstore *s = (dstore *)base;
    char path[PATH_MAX];
    sl_shard_header h;

    if (file_path(s, path, sizeof(path), job, file) != 0)
        return SL_ELIMIT;
    return read_sha(path, sha, &h, size);
}

/* A sealed partial upload of the rank that carries `sha`, and the shard's path. */
typedef struct sealed {
    const char *sha;
    char path[PATH_MAX];
} sealed;

static int find_sealed(const char *path, int32_t rank, int64_t gen, void *arg)
{
    sealed *f = arg;

    (void)rank;
    (void)gen;
    if (!shard_sha_is(path, f->sha))
        return 0;
    snprintf(f->path, sizeof(f->path), "%s", path);
    return 1;
}

static int d_recover(sl_sstore *base, const char *job, const char *name, int32_t rank,
                     const char *sha)
{
    dstore *s = (dstore *)base;
    char dir[PATH_MAX], final[PATH_MAX];
    sealed f = {sha, ""};
    int err;

    if (job_dir(s, dir, sizeof(dir), job) != 0 ||
        sl_store_path(final, sizeof(final), dir, SL_STORE_SHARD, name, rank) != 0)
        return SL_ELIMIT;
    err = sl_store_parts_each(dir, name, rank, find_sealed, &f);
    if (err < 0)
        return err;
    if (!f.path[0])
        return SL_ENOTFOUND;
    err = sl_store_rename(f.path, final);
    if (!err)
        err = sl_store_fsync_dir(dir);
    if (!err)
        sl_log_info("ckpt_shard_recovered", "job=%s name=%s rank=%d sha256=%s", job, name, rank,
                    sha);
    return err;
}

static int d_remove(sl_sstore *base, const char *job, const char *file)
{
    dstore *s = (dstore *)base;
    char path[PATH_MAX];

    if (file_path(s, path, sizeof(path), job, file) != 0)
        return SL_ELIMIT;
    return sl_store_unlink(path);
}

static int d_remove_ckpt(sl_sstore *base, const char *job, const char *name, int32_t world_size)
{
    dstore *s = (dstore *)base;
    char dir[PATH_MAX];

    if (job_dir(s, dir, sizeof(dir), job) != 0)
        return SL_ELIMIT;
    return sl_store_remove_ckpt(dir, name, world_size);
}

static int d_free_bytes(sl_sstore *base, uint64_t *out)
{
    return sl_store_free_bytes(((dstore *)base)->root, out);
}

/* ---- sweeps ---- */

typedef struct dsweep {
    dstore *s;
    const char *job, *dir;
    sl_sstore_verdict_fn verdict;
    void *arg;
    int moved;
} dsweep;

/* sl_store_sweep only removes; a file to quarantine is moved here and kept for the sweep. It
 * leaves the directory while the sweep reads it, which POSIX allows (it is not read again). A
 * file that cannot be moved stays. */
static int d_keep(const char *file, const struct stat *st, void *arg)
{
    dsweep *c = arg;
    int64_t mtime_ms = (int64_t)st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000;
    int v = c->verdict(c->job, file, mtime_ms, c->arg);

    if (v == SL_SSTORE_REMOVE)
        return 0;
    if (v == SL_SSTORE_QUARANTINE && c->s->quar &&
        sl_quar_move(c->s->quar, c->dir, file, "checkpoint file the catalog does not know") == 0)
        c->moved++;
    return 1;
}

static int d_sweep(sl_sstore *base, sl_sstore_verdict_fn verdict, void *arg, int *removed,
                   int *moved)
{
    dstore *s = (dstore *)base;
    struct dirent *e;
    DIR *d;
    int err = 0;

    *removed = *moved = 0;
    if ((err = sl_store_opendir(&d, s->root)) != 0)
        return err;
    while ((e = readdir(d)) != NULL) {
        char dir[PATH_MAX];
        dsweep c = {s, e->d_name, dir, verdict, arg, 0};
        int n = 0, e2;

        if (sl_shard_name_check(e->d_name) != 0 || job_dir(s, dir, sizeof(dir), e->d_name) != 0)
            continue;
        e2 = sl_store_sweep(dir, d_keep, &c, &n);
        if (e2)
            sl_log_warn("ckpt_sweep_failed", "dir=%s error=\"%s\"", dir, sl_strerror(e2));
        /* Quarantined files left the directory: make that durable, as sl_store_sweep does after
         * removals. */
        if (c.moved && !n && (e2 = sl_store_fsync_dir(dir)) != 0)
            sl_log_warn("ckpt_sweep_failed", "dir=%s error=\"%s\"", dir, sl_strerror(e2));
        if (e2 && !err)
            err = e2;
        *removed += n;
        *moved += c.moved;
    }
    closedir(d);
    return err;
}

static void d_free(sl_sstore *base)
{
    free(base);
}

static const sl_sstore_ops dir_ops = {
    .kind = "dir",
    .remote = 0,
    .w_open = d_w_open,
    .w_write = d_w_write,
    .w_finish = d_w_finish,
    .w_publish = d_w_publish,
    .w_release = d_w_release,
    .w_close = d_w_close,
    .held = d_held,
    .r_open = d_r_open,
    .r_read = d_r_read,
    .r_close = d_r_close,
    .put = d_put,
    .stat = d_stat,
    .shard_sha = d_shard_sha,
    .recover = d_recover,
    .remove = d_remove,
    .remove_ckpt = d_remove_ckpt,
    .free_bytes = d_free_bytes,
    .sweep = d_sweep,
    .free = d_free,
};

int sl_sstore_dir_new(sl_sstore **out, const char *root, sl_quar *quarantine)
{
    dstore *s = calloc(1, sizeof(*s));
    int n, err;

    *out = NULL;
    if (!s)
        return -ENOMEM;
    s->base.ops = &dir_ops;
    s->quar = quarantine;
    n = snprintf(s->root, sizeof(s->root), "%s", root);
    if (n < 0 || (size_t)n >= sizeof(s->root)) {
        free(s);
        return -ENAMETOOLONG;
    }
    err = sl_store_mkdirs(s->root);
    if (err) {
        sl_log_error("ckpt_dir_failed", "path=%s error=\"%s\"", s->root, sl_strerror(err));
        free(s);
        return err;
    }
    *out = &s->base;
    return 0;
}
