/* UploadShard on the loop thread, as one state machine (up_state in internal.h; up_to() below is
 * the only place the state changes).
 *
 * HEADER: the header is validated, the checkpoint must be WRITING, with no other upload of the
 * rank and enough free space -> OPENING: a worker opens the partial upload in the shard store
 * (server/store/sstore.h; in a directory: ".<name>_shard_<rank>.shard.part" with a placeholder
 * header, space reserved ahead in steps as the data comes; on resume the kept prefix is hashed
 * again or its saved hash state loaded) ->
 * RECEIVING: each chunk is handed to the lanes without a copy, written and hashed in order, at
 * most UP_INFLIGHT chunks in memory -> DRAINING: at the end of the stream, size and client
 * checksum are checked on the loop -> FINALIZING: a worker has the store make the shard durable
 * with the real checksum in its header -> the catalog row, in the transaction that fences this
 * attempt (the checkpoint WRITING and not being committed, the lease's generation still ours) ->
 * PUBLISHING: a worker publishes it under its name (a directory's rename, object storage's
 * CompleteMultipartUpload) -> DONE and the receipt; a publish that fails keeps the sealed upload
 * for Commit to publish (STOPPING). Nothing reaches the catalog before its bytes are
 * durable, and nothing is published before the catalog fenced it.
 * An upload that stops (STOPPING) keeps its written bytes for a resume and gives back the space
 * reserved beyond them; one that fails has the store discard them (a write-lane job, before the
 * failure is answered).
 */
#include "internal.h"

#include "err.h"
#include "log.h"
#include "store/layout.h"
#include "store/sstore.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define B(s) (1u << (s))

/* The legal transitions: bit `to` of up_next[from]. */
static const unsigned up_next[] = {
    [UP_HEADER] = B(UP_OPENING) | B(UP_DONE),
    [UP_OPENING] = B(UP_RECEIVING) | B(UP_STOPPING) | B(UP_FAILING),
    [UP_RECEIVING] = B(UP_DRAINING) | B(UP_STOPPING) | B(UP_FAILING),
    [UP_DRAINING] = B(UP_FINALIZING) | B(UP_STOPPING) | B(UP_FAILING),
    [UP_FINALIZING] = B(UP_PUBLISHING) | B(UP_ABORTING) | B(UP_FAILING) | B(UP_DONE),
    [UP_PUBLISHING] = B(UP_ABORTING) | B(UP_STOPPING) | B(UP_FAILING) | B(UP_DONE),
    [UP_ABORTING] = B(UP_FAILING),
    [UP_STOPPING] = B(UP_FAILING) | B(UP_DONE),
    [UP_FAILING] = B(UP_FAILING) | B(UP_DONE),
    [UP_DONE] = 0,
};

static const char *const up_names[] = {
    [UP_HEADER] = "HEADER",     [UP_OPENING] = "OPENING",       [UP_RECEIVING] = "RECEIVING",
    [UP_DRAINING] = "DRAINING", [UP_FINALIZING] = "FINALIZING", [UP_PUBLISHING] = "PUBLISHING",
    [UP_ABORTING] = "ABORTING", [UP_STOPPING] = "STOPPING",     [UP_FAILING] = "FAILING",
    [UP_DONE] = "DONE",
};

static void up_to(upload *up, up_state to);
static void up_pump(upload *up);
static void up_after_write(uv_work_t *w, int status);
static void up_after_hash(uv_work_t *w, int status);
static void up_done(upload *up);

/* OPENING .. DRAINING: the upload has a client and may still fail or stop. */
static int up_active(const upload *up)
{
    return up->state == UP_OPENING || up->state == UP_RECEIVING || up->state == UP_DRAINING;
}

static int io_err_status(int err)
{
    /* Out of space is a limit, not corruption. A store that no longer has what the partial
     * upload was built on (S3's NoSuchUpload: the multipart upload completed by an earlier life
     * of the daemon, or aborted) is a resume that does not match: the partial upload is
     * discarded, the client asks UploadStatus and sends again (NOT_FOUND would say the
     * checkpoint is missing). */
    if (err == SL_ENOTFOUND)
        return SL_ESTATE;
    return err == -ENOSPC || err == -EDQUOT ? SL_ELIMIT : err;
}

/* ---- ending an upload ---- */

/* End the upload keeping its partial file for a resume (STOPPING); `err` and `fmt` give the
 * answer (0 and NULL: none, the client is gone). */
static void __attribute__((format(printf, 3, 4))) up_stop(upload *up, int err, const char *fmt, ...)
{
    va_list ap;

    up->answer_err = err;
    up->answer_msg[0] = '\0';
    if (fmt) {
        va_start(ap, fmt);
        vsnprintf(up->answer_msg, sizeof(up->answer_msg), fmt, ap);
        va_end(ap);
    }
    up_to(up, UP_STOPPING);
}

/* Fail the upload and remove its partial file (FAILING); the failure is answered on DONE. */
static void __attribute__((format(printf, 3, 4))) up_fail(upload *up, int err, const char *fmt, ...)
{
    char msg[sizeof(up->answer_msg)];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* Failing again while a lane job runs (an abort after another failure): this failure is
     * answered now, and the first one, sent on DONE, finds the call finished. */
    if (up->state == UP_FAILING)
        sl_rpc_call_fail(up->call, err, "%s", msg);
    up->answer_err = err;
    memcpy(up->answer_msg, msg, sizeof(msg));
    up_to(up, UP_FAILING);
}

/* Free the chunks both lanes are done with (all of them with `all`, when no lane runs). */
static void up_free_chunks(upload *up, int all)
{
    uint64_t upto =
        all ? up->seq_tail : (up->seq_hash < up->seq_write ? up->seq_hash : up->seq_write);

    for (; up->seq_free < upto; up->seq_free++) {
        up_chunk *c = &up->ring[up->seq_free % UP_RING];
        up->svc->mem_held -= c->len;
        sl_rpc_bytes_free(c->bytes);
        c->bytes = NULL;
    }
}

static void up_unregister(upload *up)
{
    for (upload **p = &up->svc->uploads; *p; p = &(*p)->next) {
        if (*p == up) {
            *p = up->next;
            break;
        }
    }
}

/* DONE: give back what the upload holds, then send the answer of STOPPING or FAILING. */
static void up_release(upload *up, up_state from)
{
    up_free_chunks(up, 1);
    /* An upload whose call was freed without a cancel (up_data_free) gives back what it holds
     * here, on the loop: no lane job can hold the call any more. */
    if (up->w) {
        const sl_sstore_ops *ops = up->svc->opts.store->ops;
        if (from == UP_STOPPING)
            ops->w_release(up->w);
        ops->w_close(up->w, from == UP_FAILING);
        up->w = NULL;
    }
    if (from != UP_HEADER)
        up_unregister(up);
    ckpt_lease_drop(up);
    if (up->answer_err)
        sl_rpc_call_fail(up->call, up->answer_err, "%s", up->answer_msg);
    /* The auto-commit waits for running uploads: when the last rank's shard was recorded while
     * this one ran (a re-upload of a rank that has a shard), this one ending without replacing
     * it is the moment every rank's shard is durable. */
    if (from == UP_STOPPING || from == UP_FAILING)
        up->svc->upload_settled(up->svc, up->job, up->name);
}

/* ---- the lanes ---- */

/* Start a job on a lane; it holds a call reference until its after-callback ran. */
static void up_lane(upload *up, sl_cat_work *w, uv_work_cb fn, uv_after_work_cb after)
{
    up->jobs++;
    sl_rpc_call_ref(up->call);
    sl_cat_queue_work(up->svc->cat, up->svc->loop, w, fn, after);
}

/* A write-lane job: open, write or finalize. */
static void up_write_lane(upload *up, uv_work_cb fn)
{
    up->err = 0;
    up->errmsg[0] = '\0';
    up_lane(up, &up->work, fn, up_after_write);
}

/* STOPPING or FAILING: once no lane job runs, a stopped upload first gives back the space it
 * reserved beyond its written bytes, then the writer is closed (a failed upload's bytes
 * discarded), each a write-lane job; then both go on to DONE. */
static void up_settle(upload *up)
{
    if (up->jobs)
        return;
    if (up->w && !up->dying) {
        if (up->state == UP_STOPPING && !up->released) {
            up->released = 1;
            up_write_lane(up, ckpt_up_release_work);
        } else {
            up->discard = up->state == UP_FAILING;
            up_write_lane(up, ckpt_up_close_work);
        }
        return;
    }
    up_to(up, UP_DONE);
}

/* ---- the transition ---- */

/* The one place an upload's state changes: checks the transition against up_next, logs it and
 * runs the entry actions of `to` (internal.h). STOPPING and FAILING go on to DONE at once when no
 * lane job runs; otherwise the last job to return moves them on (up_continue). */
static void up_to(upload *up, up_state to)
{
    up_state from = up->state;

    if (!(up_next[from] & B(to))) {
        sl_log_error("ckpt_upload_bad_transition", "job=%s name=%s rank=%d from=%s to=%s", up->job,
                     up->name, up->rank, up_names[from], up_names[to]);
        return;
    }
    sl_log_debug("ckpt_upload_state", "job=%s name=%s rank=%d from=%s to=%s jobs=%d", up->job,
                 up->name, up->rank, up_names[from], up_names[to], up->jobs);
    up->state = to;
    switch (to) {
    case UP_OPENING:
        up->next = up->svc->uploads;
        up->svc->uploads = up;
        up->t_header = uv_now(up->svc->loop);
        up_write_lane(up, ckpt_up_open_work);
        break;
    case UP_FINALIZING:
        up->t_eof = uv_now(up->svc->loop);
        up_write_lane(up, ckpt_up_final_work);
        break;
    case UP_PUBLISHING:
        up_write_lane(up, ckpt_up_publish_work);
        break;
    case UP_FAILING:
        /* Only uploads that got as far as an open file are logged: failing to open one (most
         * often a full disk) is the client's to act on. */
        if (from != UP_OPENING)
            sl_log_warn("ckpt_upload_failed", "job=%s name=%s rank=%d error=\"%s\"", up->job,
                        up->name, up->rank, up->answer_msg);
        /* fall through */
    case UP_STOPPING:
        up_settle(up);
        break;
    case UP_DONE:
        up_release(up, from);
        break;
    default:
        break;
    }
}

/* ---- the pipeline ---- */

/* Pump the uploads that wait for memory, once some is free. */
static void up_wake_blocked(sl_ckpt_svc *s)
{
    if (!s->mem_blocked || s->mem_held >= s->opts.upload_memory)
        return;
    s->mem_blocked = 0;
    for (upload *u = s->uploads, *next; u; u = next) {
        next = u->next; /* pumping a RECEIVING upload never ends one */
        if (u->state == UP_RECEIVING)
            up_pump(u);
    }
}

/* After a lane job: go on, or finish a stopped upload once no lane job runs. */
static void up_continue(upload *up)
{
    sl_ckpt_svc *s = up->svc;

    if (up->state == UP_STOPPING || up->state == UP_FAILING) {
        up_settle(up);
    } else if (sl_rpc_call_is_done(up->call)) {
        up_stop(up, 0, NULL);
    } else {
        up_pump(up);
    }
    up_wake_blocked(s);
}

/* DRAINING, every chunk hashed and written: check size and checksum, then finalize. */
static void up_finish(upload *up)
{
    int err;

    if (up->received != up->data_size) {
        /* A cancelled call can look like a half-closed one here; either way the prefix stays
         * for a resume (the sweep removes it after the upload timeout). */
        up_stop(up, SL_EINVAL,
                "stream ended after %" PRIu64 " of %" PRIu64 " data bytes; resume from there",
                up->received, up->data_size);
        return;
    }
    err = sl_sha256_final(up->sha, up->sha_hex);
    if (err) {
        up_fail(up, err, "hashing failed");
        return;
    }
    if (up->client_sha[0] && strcmp(up->client_sha, up->sha_hex) != 0) {
        up_fail(up, SL_ECORRUPT,
                "checksum mismatch for rank %d: client sent sha256 %s, server received %s",
                up->rank, up->client_sha, up->sha_hex);
        return;
    }
    up_to(up, UP_FINALIZING);
}

/* Keep the pipeline moving: hand pending chunks to the lanes, ask for more, finish at the end. */
static void up_pump(upload *up)
{
    sl_ckpt_svc *s = up->svc;

    char msg[CKPT_MSG_MAX];
    int err;

    if (up->state != UP_RECEIVING && up->state != UP_DRAINING)
        return;
    if ((err = ckpt_lease_keep(up, msg, sizeof(msg))) != 0) {
        up_stop(up, err, "%s", msg);
        return;
    }
    up_free_chunks(up, 0);
    if (up->seq_write == up->write_end && up->seq_write < up->seq_tail) {
        up->write_end = up->seq_tail;
        up_write_lane(up, ckpt_up_write_work);
    }
    if (s->opts.store->ops->hashes) {
        /* The store's writer hashes what the write lane gives it: no hash lane. */
        up->seq_hash = up->hash_end = up->seq_tail;
    } else if (up->seq_hash == up->hash_end && up->seq_hash < up->seq_tail) {
        up->hash_end = up->seq_tail;
        up->herr = 0;
        up_lane(up, &up->hwork, ckpt_up_hash_work, up_after_hash);
    }
    if (up->state == UP_RECEIVING && up->seq_tail - up->seq_free < UP_INFLIGHT) {
        /* The budget bounds memory across thousands of concurrent ranks; a waiting upload is
         * pumped again when chunks are freed (up_wake_blocked). The layer refuses a read while
         * one is outstanding (SL_ESTATE), so asking again is harmless. */
        if (s->mem_held >= s->opts.upload_memory)
            s->mem_blocked = 1;
        else
            sl_rpc_call_read(up->call);
    }
    if (up->state == UP_DRAINING && !up->jobs && up->seq_hash == up->seq_tail &&
        up->seq_write == up->seq_tail)
        up_finish(up);
}

/* ---- lane results ---- */

/* FINALIZING, the shard durable: record it, in the transaction that fences this attempt (the
 * checkpoint still WRITING and not being committed, the lease still ours); then PUBLISHING (its
 * name, where the store publishes after the record), or DONE. */
static void up_record(upload *up)
{
    sl_ckpt_svc *s = up->svc;
    sl_cat_refusal why;
    sl_cat_shard sh;
    char msg[CKPT_MSG_MAX];
    int err;

    memset(&sh, 0, sizeof(sh));
    sh.rank = up->rank;
    sh.data_size = up->data_size;
    sh.file_size = SL_SHARD_HEADER_SIZE + up->data_size;
    memcpy(sh.sha256, up->sha_hex, sizeof(sh.sha256));
    sh.tensor_count = up->tensor_count;
    sh.tensors_json = up->tensors_json;
    sh.has_pos = up->has_pos;
    sh.pos_epoch = up->pos_epoch;
    sh.pos_position = up->pos_position;
    sh.pos_world = up->pos_world;
    if (sl_sha256_blocks(up->sha, &sh.blocks, &sh.block_count) == 0)
        sh.block_size = SL_SHARD_BLOCK;
    err = sl_cat_shard_put(s->cat, up->ckpt_id, &sh, sl_now_ms(), up->lease, &why);
    if (err) {
        if (err == SL_EFENCED)
            up->lease = 0; /* not ours to drop */
        err = ckpt_refusal_msg(msg, sizeof(msg), err, &why, up->job, up->name);
        up_fail(up, err, "rank %d not recorded: %s", up->rank, msg);
        return;
    }
    up->lease = 0; /* dropped with the record */
    if (s->opts.store->ops->w_publish)
        up_to(up, UP_PUBLISHING);
    else
        up_done(up);
}

/* The shard recorded and under its name: DONE and the receipt. */
static void up_done(upload *up)
{
    Sluice__V1__UploadShardResponse resp = SLUICE__V1__UPLOAD_SHARD_RESPONSE__INIT;
    sl_ckpt_svc *s = up->svc;
    char path[PATH_MAX], file[NAME_MAX + 1];

    up_to(up, UP_DONE);
    sl_log_info("ckpt_shard_stored",
                "job=%s name=%s rank=%d bytes=%" PRIu64 " sha256=%s receive_ms=%" PRIu64
                " sync_ms=%" PRIu64,
                up->job, up->name, up->rank, up->data_size, up->sha_hex, up->t_eof - up->t_header,
                uv_now(s->loop) - up->t_eof);
    if (sl_store_file_name(file, sizeof(file), SL_STORE_SHARD, up->name, up->rank) != 0)
        file[0] = '\0';
    snprintf(path, sizeof(path), "checkpoints/%s/%s", up->job, file);
    resp.rank = up->rank;
    resp.data_size = up->data_size;
    resp.file_size = SL_SHARD_HEADER_SIZE + up->data_size;
    resp.sha256 = up->sha_hex;
    resp.path = path;
    sl_rpc_call_reply(up->call, &resp.base);
    s->upload_settled(s, up->job, up->name);
}

/* The write lane returned from the job the state names. */
static void up_after_write(uv_work_t *w, int status)
{
    upload *up = w->data;
    sl_rpc_call *call = up->call;

    up->jobs--;
    up->seq_write = up->write_end;
    switch (up->state) {
    case UP_OPENING:
        if (up->err == SL_ESTATE) { /* a resume that does not match: the partial file stays */
            up_stop(up, up->err, "%s", up->errmsg);
        } else if (up->err) {
            up_fail(up, io_err_status(up->err), "%s", up->errmsg);
        } else {
            up->acked = up->written;
            up_to(up, UP_RECEIVING);
        }
        break;
    case UP_FINALIZING:
    case UP_PUBLISHING:
    case UP_ABORTING:
        /* The bytes are durable: record them even if the client has gone. */
        if (up->err && up->state == UP_PUBLISHING && up->err != SL_EFENCED) {
            /* Recorded but not published (the store failed): the sealed upload stays, for a
             * Commit to publish (sl_sstore_ops.recover); UploadStatus says stored. */
            up_stop(up, io_err_status(up->err), "rank %d recorded, not yet published: %s", up->rank,
                    up->errmsg);
        } else if (up->err) {
            up_fail(up, io_err_status(up->err), "%s", up->errmsg);
        } else if (up->state == UP_ABORTING) {
            /* The new shard goes: FAILING has the store discard it when closing the writer. */
            up_fail(up, SL_ESTATE, "checkpoint %s/%s was aborted", up->job, up->name);
        } else if (up->state == UP_FINALIZING) {
            up_record(up);
        } else {
            up_done(up);
        }
        break;
    case UP_RECEIVING:
    case UP_DRAINING:
        if (up->err)
            up_fail(up, io_err_status(up->err), "%s", up->errmsg);
        else
            up->acked = up->written;
        break;
    default: /* STOPPING, FAILING: the result no longer matters */
        break;
    }
    if (up->state != UP_DONE)
        up_continue(up);
    sl_rpc_call_unref(call);
}

static void up_after_hash(uv_work_t *w, int status)
{
    upload *up = w->data;
    sl_rpc_call *call = up->call;

    up->jobs--;
    up->seq_hash = up->hash_end;
    if (up->herr && (up->state == UP_RECEIVING || up->state == UP_DRAINING))
        up_fail(up, up->herr, "hashing failed");
    else
        up_continue(up);
    sl_rpc_call_unref(call);
}

/* ---- the header ---- */

/* What the header asks of the checkpoint and the other uploads; answers the call if it is
 * refused. Returns 1 to go on. */
static int up_admit(upload *up, const Sluice__V1__ShardHeader *h, const sl_cat_ckpt *ck)
{
    sl_ckpt_svc *s = up->svc;
    sl_rpc_call *call = up->call;
    uint64_t others = 0;
    int err;

    if (ck->state != SL_CKPT_WRITING) {
        sl_rpc_call_fail(call, SL_ESTATE, "checkpoint %s/%s is %s, not WRITING", ck->job, ck->name,
                         sl_cat_ckpt_state_name(ck->state));
        return 0;
    }
    if (ckpt_is_committing(s, ck->id)) {
        sl_rpc_call_fail(call, SL_ESTATE, "checkpoint %s/%s is being committed", ck->job, ck->name);
        return 0;
    }
    /* Other ranks' lists as recorded; uploads running now are not counted, a bound that is good
     * enough for a limit that only hostile input reaches. */
    err = sl_cat_ckpt_tensor_bytes(s->cat, &others, ck->id, h->rank);
    if (err) {
        sl_rpc_call_fail(call, err, "catalog error: %s", sl_strerror(err));
        return 0;
    }
    if (others + strlen(up->tensors_json) > META_MAX) {
        sl_rpc_call_fail(call, SL_ELIMIT,
                         "tensor lists of %s/%s would take %" PRIu64
                         " bytes of metadata, at most %u",
                         ck->job, ck->name, others + strlen(up->tensors_json), META_MAX);
        return 0;
    }
    if (ckpt_upload_find(s, ck->id, h->rank)) {
        sl_rpc_call_fail(call, SL_ESTATE, "an upload of rank %d of %s/%s is already in progress",
                         h->rank, ck->job, ck->name);
        return 0;
    }
    return ckpt_lease_take(up, ck->id, h->rank);
}

/* Where the shard goes, whether it fits there, and its hasher; answers the call if not. Returns
 * 1 to go on. */
static int up_place(upload *up, const Sluice__V1__ShardHeader *h, const sl_cat_ckpt *ck)
{
    sl_ckpt_svc *s = up->svc;
    sl_rpc_call *call = up->call;
    uint64_t free_bytes;
    int err;

    /* A remote store is not asked here (the loop never waits on the network): it says nothing
     * about room, and a full bucket fails the upload. */
    err = sl_sstore_remote(s->opts.store)
              ? SL_EUNIMPL
              : s->opts.store->ops->free_bytes(s->opts.store, &free_bytes);
    if (!err && free_bytes < h->data_size - h->offset + SL_SHARD_HEADER_SIZE) {
        sl_rpc_call_fail(call, SL_ELIMIT,
                         "not enough space for rank %d: %" PRIu64 " bytes needed, %" PRIu64 " free",
                         h->rank, h->data_size - h->offset, free_bytes);
        return 0;
    }
    err = sl_sha256_new(&up->sha);
    /* Block digests for ranged downloads, kept while the data is hashed anyway; a resume
     * re-hashes its kept prefix into them too (directory), or loses them (object storage). */
    if (!err)
        err = sl_sha256_blocks_on(up->sha, SL_SHARD_BLOCK, h->data_size);
    if (err) {
        sl_rpc_call_fail(call, err, "cannot start hashing");
        return 0;
    }
    return 1;
}

/* HEADER: validate the header and open the partial file, or refuse (DONE). */
/* The rank's data position, if the header carries one: only into a checkpoint bound to a feed
 * job, of that job, with a world. Answers the call if not; returns 1 to go on. */
static int up_position(upload *up, const Sluice__V1__ShardHeader *h, const sl_cat_ckpt *ck)
{
    const Sluice__V1__DataPosition *p = h->data_position;

    if (!p)
        return 1;
    if (!ck->feed_job[0]) {
        sl_rpc_call_fail(up->call, SL_EINVAL,
                         "checkpoint %s/%s is not bound to a feed job: Begin it with feed_job to "
                         "send data positions",
                         ck->job, ck->name);
        return 0;
    }
    if (p->job && p->job[0] && strcmp(p->job, ck->feed_job) != 0) {
        sl_rpc_call_fail(up->call, SL_EINVAL,
                         "data position of feed job '%.128s', but checkpoint %s/%s is bound to "
                         "'%s'",
                         p->job, ck->job, ck->name, ck->feed_job);
        return 0;
    }
    if (p->world_size != (uint32_t)ck->world_size) {
        sl_rpc_call_fail(up->call, SL_EINVAL,
                         "data position with world_size %u, but checkpoint %s/%s has world_size %d",
                         p->world_size, ck->job, ck->name, ck->world_size);
        return 0;
    }
    up->has_pos = 1;
    up->pos_epoch = p->epoch;
    up->pos_position = p->position;
    up->pos_world = p->world_size;
    return 1;
}

static void up_header(upload *up, const Sluice__V1__ShardHeader *h)
{
    sl_ckpt_svc *s = up->svc;
    sl_rpc_call *call = up->call;
    char msg[CKPT_MSG_MAX];
    sl_cat_ckpt ck;
    int err;

    if (!ckpt_names_ok(call, h->job, h->checkpoint) ||
        sl_rpc_call_claim(call, "upload", h->job, "job") != 0 ||
        ckpt_find(s, call, &ck, h->job, h->checkpoint))
        goto refuse;
    snprintf(up->job, sizeof(up->job), "%s", h->job);
    snprintf(up->name, sizeof(up->name), "%s", h->checkpoint);
    err = sl_ckpt_check_header(h, ck.world_size, s->opts.max_shard_bytes, &up->tensors_json, msg,
                               sizeof(msg));
    if (err) {
        sl_rpc_call_fail(call, err, "%s", msg[0] ? msg : "out of memory");
        goto refuse;
    }
    if (!up_position(up, h, &ck) || !up_admit(up, h, &ck) || !up_place(up, h, &ck))
        goto refuse;
    up->ckpt_id = ck.id;
    up->rank = h->rank;
    up->world_size = ck.world_size;
    up->data_size = h->data_size;
    up->resume_from = h->offset;
    up->received = h->offset;
    up->tensor_count = (uint32_t)h->n_tensors;
    if (h->sha256 && *h->sha256)
        snprintf(up->client_sha, sizeof(up->client_sha), "%s", h->sha256);
    sl_rpc_call_progress(call);
    up_to(up, UP_OPENING);
    return;
refuse:
    up_to(up, UP_DONE);
}

/* ---- the call ---- */

static void up_data_free(void *p)
{
    upload *up = p;

    /* Nobody is left to answer. The call is freed only after every lane job returned (each holds
     * a reference), so the upload is HEADER, DONE, or active and lost its client without a
     * cancel; the other states are ended all the same, so that nothing stays registered. */
    up->answer_err = 0;
    up->dying = 1;
    if (up_active(up))
        up_stop(up, 0, NULL);
    else if (up->state == UP_ABORTING)
        up_to(up, UP_FAILING);
    else if (up->state != UP_DONE)
        up_to(up, UP_DONE);
    sl_sha256_free(up->sha);
    free(up->tensors_json);
    free(up);
}

void ckpt_upload_start(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    upload *up = calloc(1, sizeof(*up));

    if (!up) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        return;
    }
    up->svc = arg;
    up->call = call;
    up->state = UP_HEADER;
    up->work.work.data = up;
    up->hwork.work.data = up;
    sl_rpc_call_set_data(call, up, up_data_free);
    sl_rpc_call_read(call);
}

/* RECEIVING: a chunk, or the end of the stream (m NULL). */
static void up_receive(upload *up, const Sluice__V1__UploadShardRequest *m)
{
    up_chunk *c;

    if (!m) {
        up_to(up, UP_DRAINING);
        up_pump(up);
        return;
    }
    if (m->kind_case != SLUICE__V1__UPLOAD_SHARD_REQUEST__KIND_CHUNK) {
        up_fail(up, SL_EINVAL, "only data chunks may follow the header");
        return;
    }
    if (m->chunk.len > SL_CKPT_MAX_CHUNK) {
        up_fail(up, SL_EINVAL, "chunk of %zu bytes exceeds %u", m->chunk.len, SL_CKPT_MAX_CHUNK);
        return;
    }
    if (m->chunk.len > up->data_size - up->received) {
        up_fail(up, SL_EINVAL, "more data than the declared %" PRIu64 " bytes", up->data_size);
        return;
    }
    if (m->chunk.len > 0) {
        c = &up->ring[up->seq_tail % UP_RING];
        c->bytes = sl_rpc_call_take_bytes(up->call);
        if (!c->bytes) {
            /* The layer hands over every non-empty chunk (bytes_field in ckpt.c). */
            up_fail(up, SL_EINVAL, "chunk of %zu bytes arrived without its data", m->chunk.len);
            return;
        }
        sl_rpc_call_progress(up->call);
        c->len = m->chunk.len;
        c->off = up->received;
        up->svc->mem_held += m->chunk.len;
        up->seq_tail++;
        up->received += m->chunk.len;
    }
    up_pump(up);
}

void ckpt_upload_message(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    upload *up = sl_rpc_call_data(call);
    const Sluice__V1__UploadShardRequest *m = (const void *)msg;

    if (up->state == UP_RECEIVING) {
        up_receive(up, m);
    } else if (up->state != UP_HEADER) {
        /* Read before the upload ended or failed: nothing to do with it. */
    } else if (!m) {
        sl_rpc_call_fail(call, SL_EINVAL, "stream ended before the header");
        up_to(up, UP_DONE);
    } else if (m->kind_case != SLUICE__V1__UPLOAD_SHARD_REQUEST__KIND_HEADER) {
        sl_rpc_call_fail(call, SL_EINVAL, "the first message must be the header");
        up_to(up, UP_DONE);
    } else {
        up_header(up, m->header);
    }
}

/* An undecodable message: fail like any other bad message, answering only once the upload is
 * released so that a retry of the same rank is not refused as "in progress". */
void ckpt_upload_bad_message(sl_rpc_call *call, int err, const char *why, void *arg)
{
    upload *up = sl_rpc_call_data(call);

    if (up->state == UP_HEADER) {
        sl_rpc_call_fail(call, err, "%s", why);
        up_to(up, UP_DONE);
    } else if (up_active(up)) {
        up_fail(up, err, "%s", why);
    }
}

void ckpt_upload_cancel(sl_rpc_call *call, void *arg)
{
    upload *up = sl_rpc_call_data(call);

    /* The client went away: keep what was written, so the upload can be resumed; a running
     * finalize still records its durable shard. */
    if (up && up_active(up))
        up_stop(up, 0, NULL);
}

void ckpt_upload_abort(upload *up)
{
    if (up->state == UP_FINALIZING || up->state == UP_PUBLISHING)
        up_to(up, UP_ABORTING);
    else if (up->state != UP_ABORTING)
        up_fail(up, SL_ESTATE, "checkpoint %s/%s was aborted", up->job, up->name);
}
