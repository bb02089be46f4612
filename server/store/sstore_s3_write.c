/* Writers of the object-storage backend (sstore_s3.c has the design): the head gathered in
 * memory and stored once complete (then freed: part 1 reads it back at the end), parts handed to
 * the part threads (at most `inflight` per upload on their way), the state object written as the
 * stored prefix grows, part 1 with the header and CompleteMultipartUpload at the end. One thread at
 * a time per writer (the upload's write lane). */
#include "sstore_s3_internal.h"

#include "layout.h"

#include "err.h"
#include "log.h"
#include "util/buf.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the part pool ---- */

void *s3s_pool_main(void *arg)
{
    s3store *s = arg;

    pthread_mutex_lock(&s->mu);
    for (;;) {
        pjob *j;
        while (!s->stop && !s->q_head)
            pthread_cond_wait(&s->work_cv, &s->mu);
        if (!s->q_head)
            break; /* stopping and nothing queued */
        j = s->q_head;
        s->q_head = j->next;
        if (!s->q_head)
            s->q_tail = NULL;
        pthread_mutex_unlock(&s->mu);
        struct iovec iov = {j->buf, j->len};
        int err = sl_s3_mpu_part(j->c, j->key, j->upload_id, j->part_no, &iov, 1, j->etag, j->msg,
                                 sizeof(j->msg));
        pthread_mutex_lock(&s->mu);
        j->err = err;
        j->done = 1;
        s->queued--;
        pthread_cond_broadcast(&s->done_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Queue a part; waits while queue_max parts of all uploads are queued or on their way, so that
 * memory for parts in flight is bounded for the whole store, not per upload only. */
static void pool_submit(s3store *s, pjob *j)
{
    pthread_mutex_lock(&s->mu);
    while (s->queued >= s->queue_max)
        pthread_cond_wait(&s->done_cv, &s->mu);
    s->queued++;
    j->next = NULL;
    if (s->q_tail)
        s->q_tail->next = j;
    else
        s->q_head = j;
    s->q_tail = j;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---- writers ---- */

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

/* Reap the parts that are stored, in order; wait while more than `keep` are in flight. Writes
 * the state object when the stored prefix grew. Returns the first failure. */
static int w_reap(sl_swriter *w, int keep)
{
    s3store *s = w->s;
    int grew = 0, err = 0;

    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (w->jobs && w->jobs->done) {
            pjob *j = w->jobs;
            w->jobs = j->wnext;
            if (!w->jobs)
                w->jobs_tail = NULL;
            w->njobs--;
            if (j->err && !w->err) {
                w->err = j->err;
                snprintf(w->errmsg, sizeof(w->errmsg), "part %d: %.200s", j->part_no, j->msg);
            } else if (!j->err) {
                memcpy(w->etags[j->part_no], j->etag, SL_S3_ETAG_MAX);
                w->done_upto = j->part_no;
                if (!j->no_state) {
                    w->prefix_upto = j->part_no;
                    w->data_done = j->data_end;
                    memcpy(w->done_state, j->sha_state, sizeof(w->done_state));
                    grew = 1;
                }
            }
            if (w->nspare < (int)(sizeof(w->spare) / sizeof(w->spare[0])))
                w->spare[w->nspare++] = j->buf;
            else
                free(j->buf);
            free(j);
        }
        if (w->njobs <= keep)
            break;
        pthread_cond_wait(&s->done_cv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    if (w->err)
        return w->err;
    if (grew && w->head_stored && (err = s3s_state_save(w)) != 0)
        w->err = err;
    return err;
}

/* Hand the filled part buffer to the pool. */
static int w_send_part(sl_swriter *w)
{
    pjob *j = calloc(1, sizeof(*j));

    if (!j)
        return -ENOMEM;
    j->c = w->s->c;
    j->key = w->key;
    j->upload_id = w->upload_id;
    j->part_no = w->next_part++;
    j->buf = w->buf;
    j->len = w->fill;
    j->data_end = w->data_pos;
    j->no_state = w->finishing;
    if (!j->no_state)
        sl_sha256_save(w->run, j->sha_state);
    w->buf = NULL;
    w->fill = 0;
    pthread_mutex_lock(&w->s->mu);
    if (w->jobs_tail)
        w->jobs_tail->wnext = j;
    else
        w->jobs = j;
    w->jobs_tail = j;
    w->njobs++;
    pthread_mutex_unlock(&w->s->mu);
    pool_submit(w->s, j);
    return w_reap(w, w->s->inflight);
}

/* The head is complete: store it, so that a resume elsewhere can build part 1. */
static int w_store_head(sl_swriter *w)
{
    int err = sl_s3_put(w->s->c, w->head_key, w->head, w->head_len, w->errmsg, sizeof(w->errmsg));

    if (err)
        return err;
    /* Stored: the memory goes, so that a running upload holds one part being filled and its parts
     * in flight; part 1 reads the head back at the end. */
    free(w->head);
    w->head = NULL;
    w->head_stored = 1;
    w->data_done = w->head_len;
    w->done_upto = 1;
    w->prefix_upto = 1;
    w->next_part = 2;
    sl_sha256_save(w->run, w->done_state);
    return s3s_state_save(w);
}

static uint64_t pick_part_size(const s3store *s, uint64_t data_size)
{
    uint64_t p = s->part_size;
    uint64_t need = (data_size + SL_SHARD_HEADER_SIZE + PARTS_MAX - 1) / PARTS_MAX;

    if (p < need)
        p = (need + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
    return p;
}

/* A new upload: any earlier partial upload of the rank goes, and a multipart upload starts, even
 * for a shard of one part: CompleteMultipartUpload is how a shard is published, after the record
 * (a PutObject at the end could not wait for it without holding the whole shard). */
static int w_start(sl_swriter *w, char *msg, size_t msglen)
{
    int err;

    s3s_state_discard(w->s, w->state_key);
    err = sl_s3_mpu_create(w->s->c, w->key, w->upload_id, msg, msglen);
    if (!err && (err = s3s_state_save(w)) != 0)
        snprintf(msg, msglen, "%s", w->errmsg);
    return err;
}

/* A resume at `from`: the state object must describe this shard and hold exactly `from` bytes. */
static int w_resume(sl_swriter *w, uint64_t from, sl_sha256 *sha, char *msg, size_t msglen)
{
    ustate u;
    int err = s3s_state_load(w->s, w->state_key, &u, NULL, 0, msg, msglen);

    if (err == 0 && (u.rank != w->rank || u.data_size != w->data_size ||
                     u.tensor_count != w->tensor_count || u.data_done != from))
        err = SL_ESTATE;
    if (err == 0 && u.part_size != w->part_size) {
        /* Stored with another part size (the setting changed since): its parts decide. */
        char(*etags)[SL_S3_ETAG_MAX];
        w->part_size = u.part_size;
        w->head_len = w->part_size - SL_SHARD_HEADER_SIZE;
        if (w->head_len > w->data_size)
            w->head_len = w->data_size;
        w->max_part = s3s_part_count(w->data_size, w->part_size);
        if (!(etags = calloc((size_t)w->max_part + 1, sizeof(*etags))))
            return -ENOMEM;
        free(w->etags);
        w->etags = etags;
    }
    /* Again with the ETags, into a table sized for this part size. */
    if (err == 0)
        err = s3s_state_load(w->s, w->state_key, &u, w->etags, w->max_part, msg, msglen);
    if (err) {
        snprintf(msg, msglen,
                 "cannot resume at offset %" PRIu64
                 ": the store holds no matching partial upload (ask UploadStatus)",
                 from);
        return SL_ESTATE;
    }
    w->part_size = u.part_size;
    w->head_len = w->part_size - SL_SHARD_HEADER_SIZE;
    if (w->head_len > w->data_size)
        w->head_len = w->data_size;
    snprintf(w->upload_id, sizeof(w->upload_id), "%s", u.upload_id);
    if ((err = sl_sha256_load(w->run, u.sha)) != 0) {
        snprintf(msg, msglen, "the upload state's hash does not load");
        return SL_ESTATE;
    }
    {
        uint64_t size = 0;
        err = sl_s3_head(w->s->c, w->head_key, &size, NULL, msg, msglen);
        if (!err && size != w->head_len)
            err = SL_ECORRUPT;
        if (err == SL_ENOTFOUND || err == SL_ECORRUPT) {
            /* A state without its head (a kill between the two removals that end an upload)
             * can never be resumed: it goes, so that UploadStatus stops offering its bytes. */
            s3s_state_discard(w->s, w->state_key);
            snprintf(msg, msglen,
                     "cannot resume at offset %" PRIu64
                     ": the store lost the first part's data; the partial upload was discarded "
                     "(start again from 0)",
                     from);
            return SL_ESTATE;
        }
        if (err)
            return err;
    }
    free(w->head);
    w->head = NULL;
    w->head_stored = 1;
    w->done_upto = u.last_part;
    w->prefix_upto = u.last_part;
    w->next_part = u.last_part + 1;
    w->data_done = from;
    w->data_pos = from;
    memcpy(w->done_state, u.sha, sizeof(u.sha));
    return 0;
}

static void w_free(sl_swriter *w)
{
    free(w->head);
    free(w->buf);
    for (int i = 0; i < w->nspare; i++)
        free(w->spare[i]);
    free(w->etags);
    free(w);
}

int s3s_w_open(sl_sstore *base, const sl_swriter_spec *spec, sl_sha256 *sha, sl_swriter **out,
               char *msg, size_t msglen)
{
    s3store *s = (s3store *)base;
    sl_swriter *w = calloc(1, sizeof(*w));
    char file[NAME_MAX + 1], part[NAME_MAX + 1];
    int err;

    *out = NULL;
    if (!w)
        return -ENOMEM;
    w->s = s;
    snprintf(w->job, sizeof(w->job), "%s", spec->job);
    snprintf(w->name, sizeof(w->name), "%s", spec->name);
    w->rank = spec->rank;
    w->tensor_count = spec->tensor_count;
    w->data_size = spec->data_size;
    w->part_size = pick_part_size(s, spec->data_size);
    w->head_len = w->part_size - SL_SHARD_HEADER_SIZE;
    if (w->head_len > w->data_size)
        w->head_len = w->data_size;
    w->next_part = 1;
    if (sl_store_file_name(file, sizeof(file), SL_STORE_SHARD, spec->name, spec->rank) != 0 ||
        sl_store_file_name(part, sizeof(part), SL_STORE_PART, spec->name, spec->rank) != 0 ||
        obj_key(w->key, sizeof(w->key), spec->job, file, NULL) != 0 ||
        obj_key(w->state_key, sizeof(w->state_key), spec->job, part, NULL) != 0 ||
        obj_key(w->head_key, sizeof(w->head_key), spec->job, part, HEAD_SUFFIX) != 0) {
        snprintf(msg, msglen, "object key too long");
        w_free(w);
        return SL_EINVAL;
    }
    /* The head is at most one part: memory for it and the etag table is what an upload costs
     * besides its parts in flight. */
    w->head = malloc(w->head_len ? w->head_len : 1);
    /* Parts: part 1 with the head, then the rest in part_size pieces (at most PARTS_MAX). */
    w->max_part = s3s_part_count(w->data_size, w->part_size);
    w->etags = calloc((size_t)w->max_part + 1, sizeof(*w->etags));
    /* The data is hashed here, into the upload's hasher (ops.hashes): the state saved at part
     * boundaries is that hash's, and the checkpoint service runs no hash lane of its own. */
    w->run = sha;
    if (!w->head || !w->etags) {
        w_free(w);
        return -ENOMEM;
    }
    *out = w;
    err = spec->resume_from > 0 ? w_resume(w, spec->resume_from, sha, msg, msglen)
                                : w_start(w, msg, msglen);
    return err;
}

int s3s_w_write(sl_swriter *w, const struct iovec *iov, int n, uint64_t off, char *msg,
                size_t msglen)
{
    int err = w->err;

    if (!err && off != w->data_pos) {
        snprintf(msg, msglen, "data at offset %" PRIu64 ", expected %" PRIu64, off, w->data_pos);
        return SL_EINVAL;
    }
    for (int i = 0; i < n && !err; i++) {
        const uint8_t *p = iov[i].iov_base;
        size_t left = iov[i].iov_len;
        while (left && !err) {
            size_t k;
            if (w->data_pos < w->head_len) {
                k = w->head_len - w->data_pos < left ? (size_t)(w->head_len - w->data_pos) : left;
                memcpy(w->head + w->data_pos, p, k);
            } else {
                if (!w->buf && w->nspare)
                    w->buf = w->spare[--w->nspare];
                if (!w->buf && !(w->buf = malloc(w->part_size))) {
                    err = -ENOMEM;
                    break;
                }
                k = w->part_size - w->fill < left ? (size_t)(w->part_size - w->fill) : left;
                memcpy(w->buf + w->fill, p, k);
                w->fill += k;
            }
            /* Hashed piece by piece, so that the state saved at a boundary (the head's end, a
             * part's end) is the hash of exactly the data before it. */
            if ((err = sl_sha256_update(w->run, p, k)) != 0)
                break;
            w->data_pos += k;
            p += k;
            left -= k;
            if (w->data_pos == w->head_len && w->head_len < w->data_size && !w->head_stored)
                err = w_store_head(w);
            else if (w->fill == w->part_size)
                err = w_send_part(w);
        }
    }
    if (err && !w->err)
        w->err = err;
    if (err && !msg[0])
        snprintf(msg, msglen, "%s", w->errmsg[0] ? w->errmsg : sl_strerror(err));
    return err;
}

/* Every part stored, part 1 last with the real header, and the state object sealed with the
 * checksum and every part's ETag: durable, but not yet under the shard's name (s3s_w_publish). */
int s3s_w_finish(sl_swriter *w, const char *sha_hex, char *msg, size_t msglen)
{
    uint8_t *part1 = NULL;
    int err = w->err;

    if (!err && w->data_pos != w->data_size) {
        snprintf(msg, msglen, "%" PRIu64 " of %" PRIu64 " data bytes written", w->data_pos,
                 w->data_size);
        return SL_EINVAL;
    }
    if (!err && !(part1 = malloc(SL_SHARD_HEADER_SIZE + w->head_len)))
        err = -ENOMEM;
    if (!err) {
        w_header(w, sha_hex, part1);
        if (w->head)
            memcpy(part1 + SL_SHARD_HEADER_SIZE, w->head, w->head_len);
        else if (w->head_len)
            err = sl_s3_get(w->s->c, w->head_key, 0, part1 + SL_SHARD_HEADER_SIZE, w->head_len, msg,
                            msglen);
    }
    if (!err) {
        struct iovec iov = {part1, SL_SHARD_HEADER_SIZE + w->head_len};
        /* The parts before the last one are recorded first; the last, partly filled one is
         * not in the resumable prefix: the caller finalized the hasher to give sha_hex, so
         * there is no hash state to record after it (a resume after a crash sends it again). */
        err = w_reap(w, 0);
        if (!err && w->fill) {
            w->finishing = 1;
            err = w_send_part(w);
        }
        if (!err)
            err = w_reap(w, 0);
        if (!err)
            err =
                sl_s3_mpu_part(w->s->c, w->key, w->upload_id, 1, &iov, 1, w->etags[1], msg, msglen);
        if (!err && w->max_part > 1 && w->done_upto < w->max_part) {
            snprintf(msg, msglen, "%d of %d parts stored", w->done_upto, w->max_part);
            err = SL_ESTATE;
        }
        if (!err) {
            w->sealed = 1;
            memcpy(w->sealed_sha, sha_hex, SL_SHARD_HEX_LEN);
            w->sealed_sha[SL_SHARD_HEX_LEN] = '\0';
            if ((err = s3s_state_save(w)) != 0) {
                w->sealed = 0;
                snprintf(msg, msglen, "%s", w->errmsg);
            }
        }
    }
    free(part1);
    if (err && !msg[0])
        snprintf(msg, msglen, "%s", w->errmsg[0] ? w->errmsg : sl_strerror(err));
    return err;
}

/* Does the state object still describe this writer's sealed upload? 1 yes, 0 no (a newer attempt
 * replaced it, or it is gone), negative if the store could not say. */
static int w_state_is_ours(sl_swriter *w)
{
    char msg[256];
    ustate u;
    int err = s3s_state_load(w->s, w->state_key, &u, NULL, 0, msg, sizeof(msg));

    if (err == SL_ENOTFOUND || err == SL_ECORRUPT)
        return 0;
    if (err)
        return err;
    return strcmp(u.upload_id, w->upload_id) == 0 && strcmp(u.sealed, w->sealed_sha) == 0;
}

/* Publish the sealed upload under the shard's name (CompleteMultipartUpload), after the catalog
 * recorded it; then its state and head objects go. A Commit that found the rank recorded but not
 * published may have completed it already (s3s_recover): the object then carries this
 * checksum. An upload a newer attempt aborted is fenced out: nothing was published. */
int s3s_w_publish(sl_swriter *w, char *msg, size_t msglen)
{
    int err;

    if (!w->sealed)
        return SL_ESTATE;
    err = sl_s3_mpu_complete(w->s->c, w->key, w->upload_id, w->max_part,
                             (const char(*)[SL_S3_ETAG_MAX])(w->etags + 1), msg, msglen);
    if (err == SL_ENOTFOUND) {
        char got[SL_SHARD_HEX_LEN + 1];
        uint64_t size = 0;
        const char *slash = strchr(w->key, '/');
        if (slash && s3s_shard_sha(&w->s->base, w->job, slash + 1, &size, got) == 0 &&
            strcmp(got, w->sealed_sha) == 0 && size == SL_SHARD_HEADER_SIZE + w->data_size) {
            err = 0;
            msg[0] = '\0';
        } else {
            snprintf(msg, msglen, "a newer upload attempt of rank %d took over", w->rank);
            return SL_EFENCED;
        }
    }
    if (err)
        return err;
    if (w_state_is_ours(w) == 1) {
        char m2[256];
        sl_s3_delete(w->s->c, w->head_key, m2, sizeof(m2));
        sl_s3_delete(w->s->c, w->state_key, m2, sizeof(m2));
    }
    w->upload_id[0] = '\0';
    w->finished = 1;
    return 0;
}

void s3s_w_release(sl_swriter *w)
{
    (void)w; /* nothing is reserved in a bucket */
}

/* Waits for the parts in flight and, with `discard`, removes what the upload stored: network
 * requests. The checkpoint service calls it on a worker, except for an upload whose call was
 * freed without a cancel (rare), which it closes on the loop. */
void s3s_w_close(sl_swriter *w, int discard)
{
    char msg[256];

    if (!w)
        return;
    /* Parts in flight hold the writer's key and upload id: they return first. A stopped upload
     * that stored more parts meanwhile records them, for the resume. */
    w_reap(w, 0);
    if (discard && w->finished) {
        sl_s3_delete(w->s->c, w->key, msg, sizeof(msg));
    } else if (discard && w->sealed && w_state_is_ours(w) != 1) {
        /* Sealed but not recorded (fenced out, or the checkpoint aborted meanwhile), and the
         * state is no longer ours: what is there belongs to a newer attempt. Our multipart
         * upload, if that attempt did not abort it, is the orphan sweep's. */
        sl_log_info("s3_sealed_upload_left", "key=%s upload_id=%s", w->key, w->upload_id);
    } else if (discard) {
        if (w->upload_id[0]) {
            int err = sl_s3_mpu_abort(w->s->c, w->key, w->upload_id, msg, sizeof(msg));
            if (err && err != SL_EUNIMPL)
                sl_log_warn("s3_abort_failed", "key=%s error=\"%s\"", w->key, msg);
        }
        sl_s3_delete(w->s->c, w->head_key, msg, sizeof(msg));
        sl_s3_delete(w->s->c, w->state_key, msg, sizeof(msg));
    }
    w_free(w);
}
