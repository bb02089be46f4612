/* UploadShard's work on the worker pool: open or resume the partial upload, write and hash
 * chunks (two lanes, see internal.h), and make the finished shard durable under its name, all
 * through the shard store (server/store/sstore.h). Each job runs on a worker thread and touches
 * only its upload's writer, hasher and the chunks and fields the loop leaves alone while the job
 * runs; its result goes to err/errmsg (herr). */
#include "internal.h"

#include "err.h"

#include <stdio.h>
#include <string.h>

void ckpt_up_open_work(uv_work_t *w)
{
    upload *up = w->data;
    sl_swriter_spec spec = {
        .job = up->job,
        .name = up->name,
        .rank = up->rank,
        .tensor_count = up->tensor_count,
        .data_size = up->data_size,
        .resume_from = up->resume_from,
        .generation = up->lease,
    };
    sl_sstore *st = up->svc->opts.store;

    up->err = st->ops->w_open(st, &spec, up->sha, &up->w, up->errmsg, sizeof(up->errmsg));
    if (!up->err)
        up->written = up->resume_from;
}

/* Worker, write lane: write the chunks [seq_write, write_end) at their offsets. */
void ckpt_up_write_work(uv_work_t *w)
{
    upload *up = w->data;
    sl_sstore *st = up->svc->opts.store;
    int err = 0;

    for (uint64_t q = up->seq_write; q < up->write_end && !err; q++) {
        const up_chunk *c = &up->ring[q % UP_RING];
        int n;
        const struct iovec *iov = sl_rpc_bytes_iov(c->bytes, &n);
        err = st->ops->w_write(up->w, iov, n, c->off, up->errmsg, sizeof(up->errmsg));
        if (!err)
            up->written = c->off + c->len;
    }
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

void ckpt_up_release_work(uv_work_t *w)
{
    upload *up = w->data;

    up->svc->opts.store->ops->w_release(up->w);
}

void ckpt_up_close_work(uv_work_t *w)
{
    upload *up = w->data;

    up->svc->opts.store->ops->w_close(up->w, up->discard);
    up->w = NULL;
}

/* Worker: publish the recorded shard under its name (PUBLISHING). */
void ckpt_up_publish_work(uv_work_t *w)
{
    upload *up = w->data;
    sl_sstore *st = up->svc->opts.store;

    up->err = st->ops->w_publish(up->w, up->errmsg, sizeof(up->errmsg));
}

/* Worker: make the shard durable (FINALIZING). */
void ckpt_up_final_work(uv_work_t *w)
{
    upload *up = w->data;
    sl_sstore *st = up->svc->opts.store;

    up->err = st->ops->w_finish(up->w, up->sha_hex, up->errmsg, sizeof(up->errmsg));
}
