/* UploadShard's work on the worker pool: open or resume the partial file, write and hash
 * chunks (two lanes, see internal.h), and make the finished shard durable under its name. Each
 * job runs on a worker thread and touches only its upload's file, hasher and the chunks and
 * fields the loop leaves alone while the job runs; its result goes to err/errmsg (herr). */
#include "internal.h"

#include "err.h"
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The file's header with the checksum `sha` (64 characters: '0's while writing). */
static void part_header(const upload *up, const char *sha, uint8_t hdr[SL_SHARD_HEADER_SIZE])
{
    sl_shard_header h;

    memset(&h, 0, sizeof(h));
    h.rank = up->rank;
    memcpy(h.sha256, sha, SL_SHARD_HEX_LEN);
    h.tensor_count = (int32_t)up->tensor_count;
    h.data_len = up->data_size;
    sl_shard_header_encode(hdr, &h);
}

/* A resume: the kept file must be this rank's shard of the same size and tensor count and hold
 * at least the prefix the client skips; that prefix is hashed again and anything after it cut. */
static int part_resume(upload *up)
{
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    sl_shard_header h;
    struct stat st;
    int err;

    if (fstat(up->fd, &st) != 0 || sl_store_pread_all(up->fd, hdr, sizeof(hdr), 0) != 0 ||
        sl_shard_header_decode(&h, hdr, sizeof(hdr)) != 0 || h.rank != up->rank ||
        h.data_len != up->data_size || (uint32_t)h.tensor_count != up->tensor_count ||
        (uint64_t)st.st_size < SL_SHARD_HEADER_SIZE + up->resume_from) {
        snprintf(up->errmsg, sizeof(up->errmsg),
                 "cannot resume at offset %" PRIu64
                 ": the server holds no matching partial upload (ask UploadStatus)",
                 up->resume_from);
        return SL_ESTATE;
    }
    err = sl_shard_hash_fd(up->sha, up->fd, SL_SHARD_HEADER_SIZE, up->resume_from);
    if (!err && ftruncate(up->fd, (off_t)(SL_SHARD_HEADER_SIZE + up->resume_from)) != 0)
        err = -errno;
    if (err) {
        snprintf(up->errmsg, sizeof(up->errmsg), "cannot re-read the kept prefix: %s",
                 sl_strerror(err));
        return err;
    }
    up->written = up->resume_from;
    up->flushed = up->resume_from;
    return 0;
}

/* A new upload: an empty file with a placeholder header. */
static int part_create(upload *up)
{
    char zeros[SL_SHARD_HEX_LEN];
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    int err = 0;

    memset(zeros, '0', sizeof(zeros));
    part_header(up, zeros, hdr);
    if (ftruncate(up->fd, 0) != 0)
        err = -errno;
    if (!err)
        err = sl_store_pwrite_all(up->fd, hdr, sizeof(hdr), 0);
    if (err)
        snprintf(up->errmsg, sizeof(up->errmsg), "cannot write the partial file: %s",
                 sl_strerror(err));
    return err;
}

void ckpt_up_open_work(uv_work_t *w)
{
    upload *up = w->data;
    int err = sl_store_mkdirs(up->dir);

    if (err) {
        snprintf(up->errmsg, sizeof(up->errmsg),
                 "cannot create the checkpoint directory %.200s: %s", up->dir,
                 sl_store_strerror(err));
        goto out;
    }
    up->fd = sl_store_open(up->part, O_RDWR | O_CREAT, 0640);
    if (up->fd < 0) {
        err = up->fd;
        up->fd = -1;
        snprintf(up->errmsg, sizeof(up->errmsg), "cannot open the partial file %.200s: %s",
                 up->part, sl_store_strerror(err));
        goto out;
    }
    err = up->resume_from > 0 ? part_resume(up) : part_create(up);
    if (err)
        goto out;
    /* Reserve the space now, so a full disk is found before the data is sent. File systems
     * without fallocate are checked by the writes themselves. */
    if (up->data_size > up->written &&
        fallocate(up->fd, FALLOC_FL_KEEP_SIZE, (off_t)(SL_SHARD_HEADER_SIZE + up->written),
                  (off_t)(up->data_size - up->written)) != 0 &&
        errno != EOPNOTSUPP && errno != ENOSYS) {
        err = -errno;
        snprintf(up->errmsg, sizeof(up->errmsg), "cannot reserve %" PRIu64 " bytes: %s",
                 up->data_size - up->written, sl_strerror(err));
    }
out:
    up->err = err;
}

/* Worker, write lane: write the chunks [seq_write, write_end) at their offsets. */
void ckpt_up_write_work(uv_work_t *w)
{
    upload *up = w->data;
    int err = 0;

    for (uint64_t q = up->seq_write; q < up->write_end && !err; q++) {
        const up_chunk *c = &up->ring[q % UP_RING];
        int n;
        const struct iovec *iov = sl_rpc_bytes_iov(c->bytes, &n);
        err = sl_store_pwritev_all(up->fd, iov, n, SL_SHARD_HEADER_SIZE + c->off);
        if (!err)
            up->written = c->off + c->len;
    }
    /* Start writeback of what has accumulated, so the final fsync finds little left to write
     * and the disk works while the rest of the shard arrives. Advisory: errors surface at fsync. */
    if (!err && up->written - up->flushed >= FLUSH_EVERY) {
        sync_file_range(up->fd, (off_t)(SL_SHARD_HEADER_SIZE + up->flushed),
                        (off_t)(up->written - up->flushed), SYNC_FILE_RANGE_WRITE);
        up->flushed = up->written;
    }
    if (err)
        snprintf(up->errmsg, sizeof(up->errmsg), "cannot write the shard: %s", sl_strerror(err));
    up->err = err;
}

/* Worker, hash lane: hash the chunks [seq_hash, hash_end) in order. */
void ckpt_up_hash_work(uv_work_t *w)
{
    upload *up = w->data;
    int err = 0;

    for (uint64_t q = up->seq_hash; q < up->hash_end && !err; q++) {
        int n;
        const struct iovec *iov = sl_rpc_bytes_iov(up->ring[q % UP_RING].bytes, &n);
        for (int i = 0; i < n && !err; i++)
            err = sl_sha256_update(up->sha, iov[i].iov_base, iov[i].iov_len);
    }
    up->herr = err;
}

/* Worker: make the shard durable under its final name. */
void ckpt_up_final_work(uv_work_t *w)
{
    upload *up = w->data;
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    const char *step = "write the header";
    int err;

    part_header(up, up->sha_hex, hdr);
    err = sl_store_pwrite_all(up->fd, hdr, sizeof(hdr), 0);
    if (!err && ftruncate(up->fd, (off_t)(SL_SHARD_HEADER_SIZE + up->data_size)) != 0) {
        err = -errno;
        step = "truncate";
    }
    if (!err && fsync(up->fd) != 0) {
        err = -errno;
        step = "fsync";
    }
    if (close(up->fd) != 0 && !err) {
        err = -errno;
        step = "close";
    }
    up->fd = -1;
    /* The checkpoint is WRITING (checked on the loop), so an older shard of this rank, whose row
     * is already gone, may be replaced; the rename itself never replaces anything. */
    if (!err && (err = sl_store_unlink(up->final)) != 0)
        step = "remove the old shard";
    if (!err && (err = sl_store_rename_noreplace(up->part, up->final)) != 0)
        step = "rename";
    if (!err && (err = sl_store_fsync_dir(up->dir)) != 0)
        step = "fsync the directory";
    if (err)
        snprintf(up->errmsg, sizeof(up->errmsg), "cannot %s: %s", step, sl_store_strerror(err));
    up->err = err;
}
