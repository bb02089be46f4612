/* DownloadShard: a stored shard, or a range of it, streamed back in messages of at most
 * DL_CHUNK bytes, read on the worker pool one piece per job, at most DL_QUEUED messages queued
 * per call. No byte goes out unchecked, in one of two ways (docs/checkpoints.md):
 *
 *   whole  the download of the whole data section (offset 0), and any download of a shard
 *          recorded without block digests: the data is hashed from byte 0 to its end in order
 *          (bytes before and after a range are read but not sent), and the message that ends
 *          the range is held back until the hash matches the catalog; DATA_LOSS otherwise.
 *   block  a download from an offset or of a range: the whole blocks that cover it are read,
 *          each hashed and compared with the digest recorded at upload before any of its bytes
 *          is sent; DATA_LOSS naming the block otherwise.
 *
 * The digests come from the catalog a window of DL_WINDOW at a time, loaded in lane work (the
 * handler, dl_after) just before the pump needs a block past the window. */
#include "internal.h"

#include "err.h"
#include "log.h"
#include "store/layout.h"
#include "store/sstore.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DL_WINDOW 1024 /* block digests held per download: 32 KiB, 1 GiB of 1 MiB blocks */

typedef struct download {
    sl_cat_work work;
    sl_ckpt_svc *svc;
    sl_rpc_call *call;
    char job[SL_SHARD_NAME_MAX + 1], file[NAME_MAX + 1];
    int32_t rank;
    int64_t ckpt_id;
    sl_sreader *r;
    uint64_t data_size;
    uint64_t pos, end; /* the next data byte to send; the end of the range */
    char sha[SL_SHARD_HEX_LEN + 1];
    /* Whole mode (h set): data bytes [0, hashed) hashed; checked once all matched. */
    sl_sha256 *h;
    uint64_t hashed;
    int checked;
    uint8_t *scratch; /* whole mode: the tail after a range, read while buf holds its end */
    /* Block mode: the block size and the digests of blocks [win_first, win_first + win_n). */
    uint32_t bsize, win_n;
    uint64_t win_first;
    uint8_t *win;
    /* Bytes read and checked (whole mode: hashed), ready to send: data [buf_off, +buf_len). */
    uint8_t *buf;
    uint64_t buf_off;
    size_t buf_len;
    int busy, sent_last, err;
    char errmsg[256];
} download;

static void dl_free(void *p)
{
    download *dl = p;

    if (dl->r)
        dl->svc->opts.store->ops->r_close(dl->r);
    sl_sha256_free(dl->h);
    free(dl->scratch);
    free(dl->win);
    free(dl->buf);
    free(dl);
}

/* ---- worker side ---- */

/* Worker: open the shard and check its header against the catalog. */
static int dl_open(download *dl)
{
    const sl_sstore_ops *ops = dl->svc->opts.store->ops;
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    char why[200] = "";
    sl_shard_header h;
    uint64_t size;
    int err;

    err = ops->r_open(dl->svc->opts.store, dl->job, dl->file, &dl->r, &size, why, sizeof(why));
    if (err) {
        snprintf(dl->errmsg, sizeof(dl->errmsg), "shard file of rank %d: %s", dl->rank, why);
        return err == SL_ENOTFOUND ? SL_ECORRUPT : err;
    }
    if (ops->r_read(dl->r, hdr, sizeof(hdr), 0, why, sizeof(why)) != 0 ||
        sl_shard_header_decode(&h, hdr, sizeof(hdr)) != 0 || h.rank != dl->rank ||
        h.data_len != dl->data_size || strcmp(h.sha256, dl->sha) != 0) {
        snprintf(dl->errmsg, sizeof(dl->errmsg),
                 "shard file of rank %d has a header that does not match the catalog", dl->rank);
        return SL_ECORRUPT;
    }
    return 0;
}

/* Worker: exactly len data bytes at data offset off. */
static int dl_read(download *dl, uint8_t *buf, size_t len, uint64_t off)
{
    char why[200] = "";
    int err = dl->svc->opts.store->ops->r_read(dl->r, buf, len, SL_SHARD_HEADER_SIZE + off, why,
                                               sizeof(why));

    if (err)
        snprintf(dl->errmsg, sizeof(dl->errmsg), "cannot read the shard of rank %d: %s", dl->rank,
                 why);
    return err;
}

/* Worker, whole mode: hash the next piece of data at `hashed`, read into `into` (at most
 * DL_CHUNK bytes, never past `to`). */
static int dl_hash_piece(download *dl, uint8_t *into, uint64_t to)
{
    size_t len = to - dl->hashed < DL_CHUNK ? (size_t)(to - dl->hashed) : DL_CHUNK;
    int err = dl_read(dl, into, len, dl->hashed);

    if (!err)
        err = sl_sha256_update(dl->h, into, len);
    if (!err)
        dl->hashed += len;
    return err;
}

/* Worker, whole mode: one piece of work: a piece of the prefix before the range (not sent), or
 * the next piece of the range (sent), or a piece of the tail after it (not sent); at the data's
 * end, the comparison with the catalog's checksum. */
static int dl_fill_whole(download *dl)
{
    char got[SL_SHARD_HEX_LEN + 1];
    int err;

    if (dl->hashed < dl->pos) {
        dl->buf_len = 0;
        err = dl_hash_piece(dl, dl->buf, dl->pos);
    } else if (dl->hashed == dl->pos && dl->pos < dl->end) {
        dl->buf_off = dl->pos;
        err = dl_hash_piece(dl, dl->buf, dl->end);
        dl->buf_len = err ? 0 : (size_t)(dl->hashed - dl->buf_off);
    } else if (!dl->scratch && !(dl->scratch = malloc(DL_CHUNK))) {
        err = -ENOMEM;
    } else {
        err = dl->hashed < dl->data_size ? dl_hash_piece(dl, dl->scratch, dl->data_size) : 0;
    }
    if (err || dl->hashed < dl->data_size)
        return err;
    if ((err = sl_sha256_final(dl->h, got)) != 0)
        return err;
    if (strcmp(got, dl->sha) != 0) {
        sl_log_error("ckpt_download_corrupt", "job=%s file=%s sha256=%s catalog=%s", dl->job,
                     dl->file, got, dl->sha);
        snprintf(dl->errmsg, sizeof(dl->errmsg),
                 "shard of rank %d is corrupt: data hashes to %s, catalog has %s", dl->rank, got,
                 dl->sha);
        return SL_ECORRUPT;
    }
    dl->checked = 1;
    return 0;
}

/* Worker, block mode: read the whole block that holds `pos` and check it against its digest. */
static int dl_fill_block(download *dl)
{
    uint64_t k = dl->pos / dl->bsize, off = k * dl->bsize;
    size_t len = dl->data_size - off < dl->bsize ? (size_t)(dl->data_size - off) : dl->bsize;
    uint8_t md[SL_SHARD_DIGEST];
    int err;

    dl->buf_len = 0;
    if (k < dl->win_first || k - dl->win_first >= dl->win_n) {
        snprintf(dl->errmsg, sizeof(dl->errmsg), "block %" PRIu64 " has no digest loaded", k);
        return SL_ESTATE;
    }
    if ((err = dl_read(dl, dl->buf, len, off)) != 0 ||
        (err = sl_sha256_once(dl->buf, len, md)) != 0)
        return err;
    if (memcmp(md, dl->win + (k - dl->win_first) * SL_SHARD_DIGEST, SL_SHARD_DIGEST) != 0) {
        sl_log_error("ckpt_download_corrupt", "job=%s file=%s block=%" PRIu64 " offset=%" PRIu64,
                     dl->job, dl->file, k, off);
        snprintf(dl->errmsg, sizeof(dl->errmsg),
                 "shard of rank %d is corrupt: block %" PRIu64 " (data offset %" PRIu64
                 ", %zu bytes) does not match the checksum recorded at upload",
                 dl->rank, k, off, len);
        return SL_ECORRUPT;
    }
    dl->buf_off = off;
    dl->buf_len = len;
    return 0;
}

static void dl_work(uv_work_t *w)
{
    download *dl = w->data;
    int err = dl->r ? 0 : dl_open(dl);

    if (!err)
        err = dl->h ? dl_fill_whole(dl) : dl_fill_block(dl);
    dl->err = err;
}

/* ---- loop side ---- */

/* Lane work: the digests of the DL_WINDOW blocks from block `first` on. Answers the call on a
 * failure (a row replaced or removed since the download began, a damaged list). */
static int dl_window(download *dl, uint64_t first)
{
    uint64_t nblocks = (dl->data_size + dl->bsize - 1) / dl->bsize;
    uint32_t want = nblocks - first < DL_WINDOW ? (uint32_t)(nblocks - first) : DL_WINDOW, bs;
    int err;

    err = sl_cat_shard_blocks(dl->svc->cat, dl->ckpt_id, dl->rank, dl->sha, first, DL_WINDOW,
                              dl->win, &dl->win_n, &bs);
    if (err == SL_ENOTFOUND) {
        sl_rpc_call_fail(dl->call, err, "the shard of rank %d was removed or replaced meanwhile",
                         dl->rank);
        return err;
    }
    if (!err && (bs != dl->bsize || dl->win_n != want))
        err = SL_ECORRUPT;
    if (err) {
        sl_rpc_call_fail(dl->call, err, "the catalog's block checksums of rank %d: %s", dl->rank,
                         err == SL_ECORRUPT ? "they do not cover the data" : sl_strerror(err));
        return err;
    }
    dl->win_first = first;
    return 0;
}

/* Send the next message from the checked bytes: up to DL_CHUNK bytes at pos, the checksum on
 * the one that ends the range. Returns 0 or an error (the call is over). */
static int dl_send(download *dl)
{
    Sluice__V1__DownloadShardResponse m = SLUICE__V1__DOWNLOAD_SHARD_RESPONSE__INIT;
    uint64_t avail = dl->buf_off + dl->buf_len - dl->pos, left = dl->end - dl->pos;
    size_t n = (size_t)(avail < left ? avail : left);

    n = n < DL_CHUNK ? n : DL_CHUNK;
    m.data.data = n ? dl->buf + (dl->pos - dl->buf_off) : NULL;
    m.data.len = n;
    m.offset = dl->pos;
    m.data_size = dl->data_size;
    if (dl->pos + n == dl->end) {
        m.sha256 = dl->sha;
        dl->sent_last = 1;
    }
    dl->pos += n;
    if (sl_rpc_call_send(dl->call, &m.base) != 0)
        return SL_EUNAVAILABLE;
    if (dl->sent_last)
        sl_rpc_call_finish(dl->call, SL_RPC_OK, NULL);
    return 0;
}

/* What the pump may send now: 1 if the bytes at pos are read and checked, or the range is
 * over and only the last message is left. Whole mode holds the message that ends the range back
 * until the whole data matched. */
static int dl_ready(const download *dl)
{
    uint64_t have = dl->buf_off + dl->buf_len;

    if (dl->pos < dl->end && (dl->pos < dl->buf_off || dl->pos >= have))
        return 0;
    return !dl->h || dl->checked || (dl->pos < dl->end && have < dl->end);
}

static void dl_after(uv_work_t *w, int status);

void ckpt_download_pump(sl_rpc_call *call, void *arg)
{
    download *dl = sl_rpc_call_data(call);

    while (dl && !dl->busy && !dl->sent_last && !sl_rpc_call_is_done(call)) {
        if (sl_rpc_call_send_room(call) <= 0 ||
            64 - sl_rpc_call_send_room(call) >= DL_QUEUED) /* the layer's window is 64 */
            return;
        if (dl_ready(dl)) {
            if (dl_send(dl) != 0)
                return;
            continue;
        }
        dl->busy = 1;
        sl_rpc_call_ref(call);
        sl_cat_queue_work(dl->svc->cat, dl->svc->loop, &dl->work, dl_work, dl_after);
    }
}

/* Lane work after a piece: fail, or load the digests of the block after the one just read if
 * the window ends before it (the pump, which may run outside the lane, never loads them), and
 * send. */
static void dl_after(uv_work_t *w, int status)
{
    download *dl = w->data;
    sl_rpc_call *call = dl->call;
    uint64_t next = dl->buf_off + dl->buf_len;

    dl->busy = 0;
    if (sl_rpc_call_is_done(call))
        goto out;
    if (dl->err) {
        sl_rpc_call_fail(call, dl->err, "%s", dl->errmsg);
        goto out;
    }
    if (!dl->h && dl->buf_len && next < dl->end && next / dl->bsize - dl->win_first >= dl->win_n &&
        dl_window(dl, next / dl->bsize) != 0)
        goto out;
    ckpt_download_pump(call, NULL);
out:
    sl_rpc_call_unref(call);
}

/* The shard the request names, from the catalog, and the range; answers the call if there is
 * none or the range does not fit. */
static int dl_find(sl_ckpt_svc *s, sl_rpc_call *call, const Sluice__V1__DownloadShardRequest *req,
                   sl_cat_ckpt *ck, sl_cat_shard *sh)
{
    char why[CKPT_MSG_MAX];
    int err;

    if (!ckpt_names_ok(call, req->job, req->name) ||
        sl_rpc_call_claim(call, "download", req->job, "job") != 0 ||
        ckpt_find(s, call, ck, req->job, req->name))
        return SL_EINVAL;
    err = sl_ckpt_check_rank(req->rank, ck->world_size, why, sizeof(why));
    if (err) {
        sl_rpc_call_fail(call, err, "%s", why);
        return err;
    }
    err = sl_cat_shard_get(s->cat, sh, ck->id, req->rank);
    if (err) {
        sl_rpc_call_fail(call, err, "checkpoint %s/%s has no shard for rank %d", ck->job, ck->name,
                         req->rank);
        return err;
    }
    if (req->length > 0 && ck->state != SL_CKPT_COMPLETE) {
        /* A range is a piece of a committed checkpoint (a DCP load): a WRITING checkpoint's
         * shard may still be replaced by another upload of its rank. */
        sl_rpc_call_fail(call, SL_ESTATE,
                         "checkpoint %s/%s is %s: ranged reads serve COMPLETE checkpoints only",
                         ck->job, ck->name, sl_cat_ckpt_state_name(ck->state));
        return SL_ESTATE;
    }
    if (req->offset > sh->data_size || req->length > sh->data_size - req->offset) {
        sl_rpc_call_fail(call, SL_EINVAL,
                         "range of %" PRIu64 " bytes at offset %" PRIu64
                         " beyond the data size %" PRIu64,
                         req->length, req->offset, sh->data_size);
        return SL_EINVAL;
    }
    return 0;
}

/* Pick the mode: whole for the whole data and for a shard recorded without block digests, block
 * otherwise (its first window loaded). Answers the call on a failure. */
static int dl_mode(download *dl)
{
    int whole = dl->pos == 0 && dl->end == dl->data_size;
    uint32_t bs = 0, n = 0;
    int err = 0;

    if (!whole && !(dl->win = malloc(DL_WINDOW * SL_SHARD_DIGEST)))
        err = -ENOMEM;
    if (!err && !whole)
        err = sl_cat_shard_blocks(dl->svc->cat, dl->ckpt_id, dl->rank, dl->sha, 0, 0, dl->win, &n,
                                  &bs);
    if (err) {
        sl_rpc_call_fail(dl->call, err, "cannot read the block checksums of rank %d: %s", dl->rank,
                         sl_strerror(err));
        return err;
    }
    if (bs && (bs < SL_SHARD_BLOCK_MIN || bs > SL_SHARD_BLOCK_MAX)) {
        sl_rpc_call_fail(dl->call, SL_ECORRUPT, "the catalog's block size of rank %d is %" PRIu32,
                         dl->rank, bs);
        return SL_ECORRUPT;
    }
    dl->bsize = bs;
    if (whole || bs == 0) {
        dl->buf = malloc(DL_CHUNK);
        err = !dl->buf || sl_sha256_new(&dl->h) != 0 ? -ENOMEM : 0;
    } else {
        dl->buf = malloc(bs); /* at most SL_SHARD_BLOCK_MAX, checked above */
        err = dl->buf ? dl_window(dl, dl->pos / bs) : -ENOMEM;
        if (err)
            return err; /* answered */
    }
    if (err)
        sl_rpc_call_fail(dl->call, err, "out of memory");
    return err;
}

void ckpt_download(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__DownloadShardRequest *req = (const void *)msg;
    sl_ckpt_svc *s = arg;
    download *dl;
    sl_cat_shard sh;
    sl_cat_ckpt ck;

    if (dl_find(s, call, req, &ck, &sh) != 0)
        return;
    if (!(dl = calloc(1, sizeof(*dl)))) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        return;
    }
    dl->svc = s;
    dl->call = call;
    dl->rank = req->rank;
    dl->ckpt_id = ck.id;
    dl->data_size = sh.data_size;
    dl->pos = req->offset;
    dl->end = req->length ? req->offset + req->length : sh.data_size;
    dl->work.work.data = dl;
    memcpy(dl->sha, sh.sha256, sizeof(dl->sha));
    sl_rpc_call_set_data(call, dl, dl_free);
    snprintf(dl->job, sizeof(dl->job), "%s", ck.job);
    if (sl_store_file_name(dl->file, sizeof(dl->file), SL_STORE_SHARD, ck.name, req->rank) != 0) {
        sl_rpc_call_fail(call, SL_EINVAL, "checkpoint path too long");
        return;
    }
    if (dl_mode(dl) == 0)
        ckpt_download_pump(call, s);
}
