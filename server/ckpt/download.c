/* DownloadShard: a stored shard streamed back in DL_CHUNK messages, read on the worker pool, at
 * most DL_QUEUED messages queued per call; a download from offset 0 is hashed on the way and
 * fails with DATA_LOSS instead of sending the last piece of a shard that does not match the
 * catalog. */
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

typedef struct download {
    sl_cat_work work;
    sl_ckpt_svc *svc;
    sl_rpc_call *call;
    char job[SL_SHARD_NAME_MAX + 1], file[NAME_MAX + 1];
    int32_t rank;
    sl_sreader *r;
    uint64_t data_size, pos;
    char sha[SL_SHARD_HEX_LEN + 1];
    char got[SL_SHARD_HEX_LEN + 1];
    sl_sha256 *h; /* NULL when resuming from an offset: nothing to compare against */
    uint8_t *buf;
    size_t len;
    int busy, sent_last, err;
    char errmsg[256];
} download;

static void dl_free(void *p)
{
    download *dl = p;

    if (dl->r)
        dl->svc->opts.store->ops->r_close(dl->r);
    sl_sha256_free(dl->h);
    free(dl->buf);
    free(dl);
}

static void dl_work(uv_work_t *w)
{
    download *dl = w->data;
    const sl_sstore_ops *ops = dl->svc->opts.store->ops;
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    char why[200] = "";
    sl_shard_header h;
    uint64_t left, size;
    int err = 0;

    if (!dl->r) {
        err = ops->r_open(dl->svc->opts.store, dl->job, dl->file, &dl->r, &size, why, sizeof(why));
        if (err) {
            snprintf(dl->errmsg, sizeof(dl->errmsg), "shard file of rank %d: %s", dl->rank, why);
            err = err == SL_ENOTFOUND ? SL_ECORRUPT : err;
            goto out;
        }
        if (ops->r_read(dl->r, hdr, sizeof(hdr), 0, why, sizeof(why)) != 0 ||
            sl_shard_header_decode(&h, hdr, sizeof(hdr)) != 0 || h.rank != dl->rank ||
            h.data_len != dl->data_size || strcmp(h.sha256, dl->sha) != 0) {
            err = SL_ECORRUPT;
            snprintf(dl->errmsg, sizeof(dl->errmsg),
                     "shard file of rank %d has a header that does not match the catalog",
                     dl->rank);
            goto out;
        }
    }
    left = dl->data_size - dl->pos;
    dl->len = left < DL_CHUNK ? (size_t)left : DL_CHUNK;
    err = ops->r_read(dl->r, dl->buf, dl->len, SL_SHARD_HEADER_SIZE + dl->pos, why, sizeof(why));
    if (err) {
        snprintf(dl->errmsg, sizeof(dl->errmsg), "cannot read the shard of rank %d: %s", dl->rank,
                 why);
        goto out;
    }
    if (dl->h) {
        err = sl_sha256_update(dl->h, dl->buf, dl->len);
        if (!err && dl->pos + dl->len == dl->data_size)
            err = sl_sha256_final(dl->h, dl->got);
    }
out:
    dl->err = err;
}

static void dl_after(uv_work_t *w, int status);

void ckpt_download_pump(sl_rpc_call *call, void *arg)
{
    download *dl = sl_rpc_call_data(call);

    if (!dl || dl->busy || dl->sent_last || sl_rpc_call_is_done(call))
        return;
    if (sl_rpc_call_send_room(call) <= 0 ||
        64 - sl_rpc_call_send_room(call) >= DL_QUEUED) /* the layer's window is 64 */
        return;
    dl->busy = 1;
    sl_rpc_call_ref(call);
    sl_cat_queue_work(dl->svc->cat, dl->svc->loop, &dl->work, dl_work, dl_after);
}

static void dl_after(uv_work_t *w, int status)
{
    download *dl = w->data;
    sl_rpc_call *call = dl->call;
    Sluice__V1__DownloadShardResponse m = SLUICE__V1__DOWNLOAD_SHARD_RESPONSE__INIT;

    dl->busy = 0;
    if (sl_rpc_call_is_done(call))
        goto out;
    if (dl->err) {
        sl_rpc_call_fail(call, dl->err, "%s", dl->errmsg);
        goto out;
    }
    m.data.data = dl->buf;
    m.data.len = dl->len;
    m.offset = dl->pos;
    m.data_size = dl->data_size;
    dl->pos += dl->len;
    if (dl->pos == dl->data_size) {
        if (dl->h && strcmp(dl->got, dl->sha) != 0) {
            sl_log_error("ckpt_download_corrupt", "job=%s file=%s sha256=%s catalog=%s", dl->job,
                         dl->file, dl->got, dl->sha);
            sl_rpc_call_fail(call, SL_ECORRUPT,
                             "shard of rank %d is corrupt: data hashes to %s, catalog has %s",
                             dl->rank, dl->got, dl->sha);
            goto out;
        }
        m.sha256 = dl->sha;
        dl->sent_last = 1;
    }
    if (sl_rpc_call_send(call, &m.base) != 0)
        goto out;
    if (dl->sent_last)
        sl_rpc_call_finish(call, SL_RPC_OK, NULL);
    else
        ckpt_download_pump(call, NULL);
out:
    sl_rpc_call_unref(call);
}

/* The shard the request names, from the catalog; answers the call if there is none. */
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
    if (req->offset > sh->data_size) {
        sl_rpc_call_fail(call, SL_EINVAL, "offset %" PRIu64 " beyond the data size %" PRIu64,
                         req->offset, sh->data_size);
        return SL_EINVAL;
    }
    return 0;
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
    dl = calloc(1, sizeof(*dl));
    if (!dl || !(dl->buf = malloc(DL_CHUNK))) {
        free(dl);
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        return;
    }
    dl->svc = s;
    dl->call = call;
    dl->rank = req->rank;
    dl->data_size = sh.data_size;
    dl->pos = req->offset;
    dl->work.work.data = dl;
    memcpy(dl->sha, sh.sha256, sizeof(dl->sha));
    sl_rpc_call_set_data(call, dl, dl_free);
    snprintf(dl->job, sizeof(dl->job), "%s", ck.job);
    if (sl_store_file_name(dl->file, sizeof(dl->file), SL_STORE_SHARD, ck.name, req->rank) != 0) {
        sl_rpc_call_fail(call, SL_EINVAL, "checkpoint path too long");
        return;
    }
    if (req->offset == 0 && sl_sha256_new(&dl->h) != 0) {
        sl_rpc_call_fail(call, SL_EUNAVAILABLE, "cannot start hashing");
        return;
    }
    ckpt_download_pump(call, s);
}
