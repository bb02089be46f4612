#include "sluice_ckpt.h"

#include "internal.h"

#include "err.h"
#include "shard.h"
#include "sluice/v1/checkpoint.pb-c.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SVC "/sluice.v1.Checkpoints/"

const char *sl_ckpt_state_name(int state)
{
    switch (state) {
    case SL_CKPT_STATE_WRITING:
        return "WRITING";
    case SL_CKPT_STATE_COMPLETE:
        return "COMPLETE";
    case SL_CKPT_STATE_INCOMPLETE:
        return "INCOMPLETE";
    default:
        return "UNKNOWN";
    }
}

const char *sl_ckpt_verdict_name(int verdict)
{
    static const char *const names[] = {
        "UNCHECKED",         "OK",           "MISSING", "SIZE_MISMATCH", "HEADER_CORRUPT",
        "CHECKSUM_MISMATCH", "NOT_UPLOADED", "IO_ERROR"};

    return verdict >= 0 && verdict < 8 ? names[verdict] : "UNKNOWN";
}

static void copy_str(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src ? src : "");
}

static void from_pb(sl_ckpt *out, const Sluice__V1__Checkpoint *m)
{
    memset(out, 0, sizeof(*out));
    copy_str(out->job, sizeof(out->job), m->job);
    copy_str(out->name, sizeof(out->name), m->name);
    out->step = m->step;
    out->world_size = m->world_size;
    out->state = (int)m->state;
    copy_str(out->user_metadata, sizeof(out->user_metadata), m->user_metadata);
    out->created_ms = m->created_at_ms;
    out->committed_ms = m->committed_at_ms;
    out->shards_uploaded = m->shards_uploaded;
    out->total_bytes = m->total_bytes;
}

static int unary(sl_client *c, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *desc, ProtobufCMessage **resp)
{
    return sl_client_unary(c, method, req, desc, resp, c->timeout_ms);
}

/* A unary call answered with a Checkpoint, copied into *out (may be NULL). */
static int ckpt_call(sl_client *c, const char *method, const ProtobufCMessage *req, sl_ckpt *out)
{
    Sluice__V1__Checkpoint *resp = NULL;
    int err =
        unary(c, method, req, &sluice__v1__checkpoint__descriptor, (ProtobufCMessage **)&resp);

    if (err)
        return err;
    if (out)
        from_pb(out, resp);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return 0;
}

static int ref_call(sl_client *c, const char *method, sl_ckpt *out, const char *job,
                    const char *name)
{
    Sluice__V1__CheckpointRef req = SLUICE__V1__CHECKPOINT_REF__INIT;

    req.job = (char *)job;
    req.name = (char *)name;
    return ckpt_call(c, method, &req.base, out);
}

int sl_ckpt_begin(sl_client *c, sl_ckpt *out, const char *job, const char *name, uint64_t step,
                  int32_t world_size, const char *user_metadata)
{
    Sluice__V1__BeginRequest req = SLUICE__V1__BEGIN_REQUEST__INIT;

    req.job = (char *)job;
    req.name = (char *)(name ? name : "");
    req.step = step;
    req.world_size = world_size;
    req.user_metadata = (char *)(user_metadata ? user_metadata : "");
    return ckpt_call(c, SVC "Begin", &req.base, out);
}

int sl_ckpt_begin_ex(sl_client *c, sl_ckpt *out, const char *job, const char *name, uint64_t step,
                     int32_t world_size, const char *user_metadata, const sl_ckpt_begin_opts *opts)
{
    Sluice__V1__BeginRequest req = SLUICE__V1__BEGIN_REQUEST__INIT;
    int err =
        opts ? sl_opts_check(opts->version, SL_CKPT_BEGIN_OPTS_VERSION, "sl_ckpt_begin_opts") : 0;

    if (err)
        return err;
    req.job = (char *)job;
    req.name = (char *)(name ? name : "");
    req.step = step;
    req.world_size = world_size;
    req.user_metadata = (char *)(user_metadata ? user_metadata : "");
    if (opts) {
        req.feed_job = (char *)(opts->feed_job ? opts->feed_job : "");
        req.no_feed = opts->no_feed != 0;
        req.auto_commit = opts->auto_commit != 0;
    }
    return ckpt_call(c, SVC "Begin", &req.base, out);
}

static int feed_from_pb(sl_ckpt_feed_state *out, const Sluice__V1__FeedState *fs)
{
    memset(out, 0, sizeof(*out));
    copy_str(out->job, sizeof(out->job), fs->job);
    out->epoch = fs->epoch;
    out->world_size = fs->world_size;
    copy_str(out->unit, sizeof(out->unit), fs->unit);
    out->samples = fs->samples;
    copy_str(out->lengths_sha256, sizeof(out->lengths_sha256), fs->lengths_sha256);
    out->elastic = fs->elastic;
    out->positions = malloc(sizeof(uint64_t) * (fs->n_positions ? fs->n_positions : 1));
    if (!out->positions)
        return sl_client_set_error(-ENOMEM, "out of memory");
    memcpy(out->positions, fs->positions, sizeof(uint64_t) * fs->n_positions);
    out->n_positions = fs->n_positions;
    return 0;
}

int sl_ckpt_feed_state_get(sl_client *c, sl_ckpt_feed_state *out, const char *job, const char *name)
{
    Sluice__V1__CheckpointRef req = SLUICE__V1__CHECKPOINT_REF__INIT;
    Sluice__V1__Checkpoint *resp = NULL;
    int err;

    req.job = (char *)job;
    req.name = (char *)name;
    err = unary(c, SVC "Get", &req.base, &sluice__v1__checkpoint__descriptor,
                (ProtobufCMessage **)&resp);
    if (err)
        return err;
    if (!resp->feed_state)
        err = sl_client_set_error(SL_ENOTFOUND, "checkpoint %s/%s carries no data position", job,
                                  name);
    else
        err = feed_from_pb(out, resp->feed_state);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return err;
}

int sl_ckpt_restore(sl_client *c, sl_ckpt_feed_state *out, uint64_t *epoch, uint32_t *world,
                    const char *job, const char *name, uint32_t world_size)
{
    Sluice__V1__RestoreRequest req = SLUICE__V1__RESTORE_REQUEST__INIT;
    Sluice__V1__RestoreResponse *resp = NULL;
    int err;

    req.job = (char *)job;
    req.name = (char *)name;
    req.world_size = world_size;
    err = unary(c, SVC "Restore", &req.base, &sluice__v1__restore_response__descriptor,
                (ProtobufCMessage **)&resp);
    if (err)
        return err;
    if (epoch)
        *epoch = resp->epoch;
    if (world)
        *world = resp->world_size;
    if (out && resp->restored)
        err = feed_from_pb(out, resp->restored);
    else if (out)
        memset(out, 0, sizeof(*out));
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return err;
}

int sl_ckpt_commit(sl_client *c, sl_ckpt *out, const char *job, const char *name)
{
    return ref_call(c, SVC "Commit", out, job, name);
}

int sl_ckpt_abort(sl_client *c, sl_ckpt *out, const char *job, const char *name)
{
    return ref_call(c, SVC "Abort", out, job, name);
}

int sl_ckpt_get(sl_client *c, sl_ckpt *out, sl_ckpt_shard **shards, size_t *n_shards,
                const char *job, const char *name)
{
    Sluice__V1__CheckpointRef req = SLUICE__V1__CHECKPOINT_REF__INIT;
    Sluice__V1__Checkpoint *resp = NULL;
    int err;

    req.job = (char *)job;
    req.name = (char *)name;
    err = unary(c, SVC "Get", &req.base, &sluice__v1__checkpoint__descriptor,
                (ProtobufCMessage **)&resp);
    if (err)
        return err;
    if (out)
        from_pb(out, resp);
    if (shards) {
        *shards = calloc(resp->n_shards ? resp->n_shards : 1, sizeof(**shards));
        *n_shards = resp->n_shards;
        if (!*shards) {
            err = sl_client_set_error(-ENOMEM, "out of memory");
        } else {
            for (size_t i = 0; i < resp->n_shards; i++) {
                const Sluice__V1__ShardInfo *si = resp->shards[i];
                sl_ckpt_shard *s = &(*shards)[i];
                s->rank = si->rank;
                s->data_size = si->data_size;
                s->file_size = si->file_size;
                copy_str(s->sha256, sizeof(s->sha256), si->sha256);
                copy_str(s->path, sizeof(s->path), si->path);
                s->tensor_count = si->tensor_count;
            }
        }
    }
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return err;
}

int sl_ckpt_list(sl_client *c, sl_ckpt **out, size_t *n, const char *job, int state)
{
    Sluice__V1__ListRequest req = SLUICE__V1__LIST_REQUEST__INIT;
    Sluice__V1__ListResponse *resp = NULL;
    int err;

    *out = NULL;
    *n = 0;
    req.job = (char *)(job ? job : "");
    req.state = (Sluice__V1__CheckpointState)state;
    err = unary(c, SVC "List", &req.base, &sluice__v1__list_response__descriptor,
                (ProtobufCMessage **)&resp);
    if (err)
        return err;
    *out = calloc(resp->n_checkpoints ? resp->n_checkpoints : 1, sizeof(**out));
    if (!*out) {
        err = sl_client_set_error(-ENOMEM, "out of memory");
    } else {
        for (size_t i = 0; i < resp->n_checkpoints; i++)
            from_pb(&(*out)[i], resp->checkpoints[i]);
        *n = resp->n_checkpoints;
    }
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return err;
}

int sl_ckpt_latest(sl_client *c, sl_ckpt *out, const char *job)
{
    Sluice__V1__LatestRequest req = SLUICE__V1__LATEST_REQUEST__INIT;
    Sluice__V1__Checkpoint *resp = NULL;
    int err;

    req.job = (char *)job;
    err = unary(c, SVC "Latest", &req.base, &sluice__v1__checkpoint__descriptor,
                (ProtobufCMessage **)&resp);
    if (err)
        return err;
    from_pb(out, resp);
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return 0;
}

int sl_ckpt_delete(sl_client *c, const char *job, const char *name)
{
    Sluice__V1__CheckpointRef req = SLUICE__V1__CHECKPOINT_REF__INIT;
    ProtobufCMessage *resp = NULL;
    int err;

    req.job = (char *)job;
    req.name = (char *)name;
    err = unary(c, SVC "Delete", &req.base, &sluice__v1__delete_response__descriptor, &resp);
    if (!err)
        protobuf_c_message_free_unpacked(resp, NULL);
    return err;
}

int sl_ckpt_set_retention(sl_client *c, const char *job, uint32_t keep_last, size_t *n_deleted)
{
    Sluice__V1__SetRetentionRequest req = SLUICE__V1__SET_RETENTION_REQUEST__INIT;
    Sluice__V1__SetRetentionResponse *resp = NULL;
    int err;

    req.job = (char *)job;
    req.keep_last = keep_last;
    err = unary(c, SVC "SetRetention", &req.base, &sluice__v1__set_retention_response__descriptor,
                (ProtobufCMessage **)&resp);
    if (err)
        return err;
    if (n_deleted)
        *n_deleted = resp->n_deleted;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return 0;
}

int sl_ckpt_verify(sl_client *c, int *ok, sl_ckpt_verdict **shards, size_t *n_shards,
                   sl_ckpt_verdict *metadata, const char *job, const char *name, int deep)
{
    Sluice__V1__VerifyRequest req = SLUICE__V1__VERIFY_REQUEST__INIT;
    Sluice__V1__VerifyResponse *resp = NULL;
    int err;

    req.job = (char *)job;
    req.name = (char *)name;
    req.mode = deep ? SLUICE__V1__VERIFY_MODE__DEEP : SLUICE__V1__VERIFY_MODE__QUICK;
    /* A deep verification reads every byte: no per-call deadline. */
    err = sl_client_unary(c, SVC "Verify", &req.base, &sluice__v1__verify_response__descriptor,
                          (ProtobufCMessage **)&resp, deep ? -1 : c->timeout_ms);
    if (err)
        return err;
    *ok = resp->ok;
    if (metadata) {
        metadata->rank = -1;
        metadata->verdict = (int)resp->metadata;
        copy_str(metadata->detail, sizeof(metadata->detail), resp->metadata_detail);
    }
    if (shards) {
        *shards = calloc(resp->n_shards ? resp->n_shards : 1, sizeof(**shards));
        *n_shards = resp->n_shards;
        if (!*shards) {
            err = sl_client_set_error(-ENOMEM, "out of memory");
        } else {
            for (size_t i = 0; i < resp->n_shards; i++) {
                (*shards)[i].rank = resp->shards[i]->rank;
                (*shards)[i].verdict = (int)resp->shards[i]->verdict;
                copy_str((*shards)[i].detail, sizeof((*shards)[i].detail), resp->shards[i]->detail);
            }
        }
    }
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return err;
}

int sl_ckpt_upload_status(sl_client *c, uint64_t *held, int *in_progress, int *stored,
                          const char *job, const char *name, int32_t rank)
{
    Sluice__V1__UploadStatusRequest req = SLUICE__V1__UPLOAD_STATUS_REQUEST__INIT;
    Sluice__V1__UploadStatusResponse *resp = NULL;
    int err;

    req.job = (char *)job;
    req.checkpoint = (char *)name;
    req.rank = rank;
    err = unary(c, SVC "UploadStatus", &req.base, &sluice__v1__upload_status_response__descriptor,
                (ProtobufCMessage **)&resp);
    if (err)
        return err;
    if (held)
        *held = resp->held_bytes;
    if (in_progress)
        *in_progress = resp->in_progress;
    if (stored)
        *stored = resp->stored;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return 0;
}

/* Read exactly len bytes at offset. */
static int read_at(int fd, void *buf, size_t len, uint64_t off)
{
    char *p = buf;

    while (len > 0) {
        ssize_t n = pread(fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EIO;
        p += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

typedef struct read_arg {
    int fd;
    uint64_t off;
    int err; /* the read's error, told apart from the stream's */
} read_arg;

/* sl_rpc_stream_write_bytes fill callback: the chunk at ra->off of the file. */
static int read_fill(void *dst, size_t len, void *arg)
{
    read_arg *ra = arg;

    ra->err = read_at(ra->fd, dst, len, ra->off);
    return ra->err;
}

/* The local checksum of an upload is computed on a helper thread while the calling thread reads
 * and sends, over HASH_BUFS rotating buffers: a buffer is reused once it has been both sent
 * (sl_rpc_stream_write copies it) and hashed. */
#define HASH_BUFS 3

typedef struct hasher {
    pthread_t thread;
    int running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sl_sha256 *sha; /* NULL: no local checksum */
    uint8_t *bufs[HASH_BUFS];
    size_t lens[HASH_BUFS];
    uint64_t posted, hashed;
    int quit;
} hasher;

static void *hasher_main(void *arg)
{
    hasher *h = arg;

    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (h->hashed == h->posted && !h->quit)
            pthread_cond_wait(&h->cv, &h->mu);
        if (h->hashed == h->posted)
            break;
        size_t k = (size_t)(h->hashed % HASH_BUFS);
        pthread_mutex_unlock(&h->mu);
        sl_sha256_update(h->sha, h->bufs[k], h->lens[k]);
        pthread_mutex_lock(&h->mu);
        h->hashed++;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* The buffer for chunk number `seq`, once the hash of its previous use is done. */
static uint8_t *hasher_buffer(hasher *h, uint64_t seq)
{
    if (h->running) {
        pthread_mutex_lock(&h->mu);
        while (h->hashed + HASH_BUFS <= seq)
            pthread_cond_wait(&h->cv, &h->mu);
        pthread_mutex_unlock(&h->mu);
    }
    return h->bufs[seq % HASH_BUFS];
}

static void hasher_post(hasher *h, uint64_t seq, size_t len)
{
    if (!h->running)
        return;
    pthread_mutex_lock(&h->mu);
    h->lens[seq % HASH_BUFS] = len;
    h->posted = seq + 1;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* Wait for every posted chunk to be hashed and stop the thread. */
static void hasher_stop(hasher *h)
{
    if (!h->running)
        return;
    pthread_mutex_lock(&h->mu);
    h->quit = 1;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->thread, NULL);
    h->running = 0;
}

/* One try of sl_ckpt_upload_fd (opts not NULL), from what the daemon holds if `resume`, on the
 * replica current when the stream opens (*replica). Returns as sl_ckpt_upload_fd; st->code is
 * the call's status when the daemon or the transport ended it, else SL_RPC_OK. */
static int upload_try(sl_client *c, sl_ckpt_shard *receipt, const char *job, const char *name,
                      int32_t rank, int fd, uint64_t size, const sl_ckpt_upload_opts *opts,
                      int resume, size_t *replica, sl_rpc_status *st)
{
    Sluice__V1__UploadShardRequest msg = SLUICE__V1__UPLOAD_SHARD_REQUEST__INIT;
    Sluice__V1__ShardHeader hdr = SLUICE__V1__SHARD_HEADER__INIT;
    Sluice__V1__DataPosition pos = SLUICE__V1__DATA_POSITION__INIT;
    Sluice__V1__TensorInfo *tinfo = NULL, **tptr = NULL, one = SLUICE__V1__TENSOR_INFO__INIT;
    Sluice__V1__UploadShardResponse *resp = NULL;
    sl_rpc_stream *s = NULL;
    sl_sha256 *sha = NULL;
    hasher hs;
    char local[65];
    uint64_t off = 0, seq = 0;
    int64_t shape1;
    size_t chunk;
    int err;

    st->code = SL_RPC_OK;
    memset(&hs, 0, sizeof(hs));
    pthread_mutex_init(&hs.mu, NULL);
    pthread_cond_init(&hs.cv, NULL);
    chunk = opts->chunk_bytes ? opts->chunk_bytes : (1u << 20);
    if (chunk > (4u << 20))
        chunk = 4u << 20;
    if (resume) {
        uint64_t held = 0;
        int running = 0;
        err = sl_ckpt_upload_status(c, &held, &running, NULL, job, name, rank);
        if (err)
            goto out;
        if (running) {
            err = sl_client_set_error(SL_ESTATE, "an upload of rank %d is running now", rank);
            goto out;
        }
        off = held <= size ? held : 0;
    }
    if (opts->tensors) {
        tinfo = calloc(opts->n_tensors ? opts->n_tensors : 1, sizeof(*tinfo));
        tptr = calloc(opts->n_tensors ? opts->n_tensors : 1, sizeof(*tptr));
        if (!tinfo || !tptr) {
            err = sl_client_set_error(-ENOMEM, "out of memory");
            goto out;
        }
        for (size_t i = 0; i < opts->n_tensors; i++) {
            sluice__v1__tensor_info__init(&tinfo[i]);
            tinfo[i].name = (char *)opts->tensors[i].name;
            tinfo[i].dtype = (char *)opts->tensors[i].dtype;
            tinfo[i].shape = (int64_t *)opts->tensors[i].shape;
            tinfo[i].n_shape = opts->tensors[i].n_dims;
            tinfo[i].offset = opts->tensors[i].offset;
            tinfo[i].size = opts->tensors[i].size;
            tptr[i] = &tinfo[i];
        }
        hdr.tensors = tptr;
        hdr.n_tensors = opts->n_tensors;
    } else {
        shape1 = (int64_t)size;
        one.name = (char *)"data";
        one.dtype = (char *)"bytes";
        one.shape = &shape1;
        one.n_shape = 1;
        one.size = size;
        tptr = calloc(1, sizeof(*tptr));
        if (!tptr) {
            err = sl_client_set_error(-ENOMEM, "out of memory");
            goto out;
        }
        tptr[0] = &one;
        hdr.tensors = tptr;
        hdr.n_tensors = 1;
    }
    hdr.job = (char *)job;
    hdr.checkpoint = (char *)name;
    hdr.rank = rank;
    hdr.data_size = size;
    hdr.sha256 = (char *)(opts->sha256 ? opts->sha256 : "");
    hdr.offset = off;
    if (opts->version >= 2 && opts->position) {
        pos.job = (char *)(opts->position->job ? opts->position->job : "");
        pos.epoch = opts->position->epoch;
        pos.position = opts->position->position;
        pos.world_size = opts->position->world_size;
        hdr.data_position = &pos;
    }
    for (int k = 0; k < HASH_BUFS && !opts->no_verify; k++) {
        hs.bufs[k] = malloc(chunk);
        if (!hs.bufs[k]) {
            err = sl_client_set_error(-ENOMEM, "out of memory");
            goto out;
        }
    }
    if (!opts->no_verify) {
        err = sl_sha256_new(&sha);
        /* A resumed upload hashes its prefix again here: the check covers every byte. */
        if (!err && off)
            err = sl_shard_hash_fd(sha, fd, 0, off);
        if (err) {
            err = sl_client_set_error(err, "cannot hash the local file: %s", sl_strerror(err));
            goto out;
        }
        hs.sha = sha;
        if (pthread_create(&hs.thread, NULL, hasher_main, &hs) != 0) {
            err = sl_client_set_error(-EAGAIN, "cannot start the hashing thread");
            goto out;
        }
        hs.running = 1;
    }
    *replica = sl_client_pick(c);
    err = sl_rpc_stream_open(&s, c->rpc[*replica], SVC "UploadShard", -1);
    if (err) {
        err = sl_client_set_error(err, "cannot start the upload: %s", sl_strerror(err));
        goto out;
    }
    msg.kind_case = SLUICE__V1__UPLOAD_SHARD_REQUEST__KIND_HEADER;
    msg.header = &hdr;
    err = sl_rpc_stream_write(s, &msg.base, 0);
    msg.kind_case = SLUICE__V1__UPLOAD_SHARD_REQUEST__KIND_CHUNK;
    while (!err && off < size) {
        size_t n = size - off < chunk ? (size_t)(size - off) : chunk;
        uint8_t *buf;
        if (!hs.running) {
            /* No local checksum: read each chunk straight into the buffer that is sent. */
            read_arg ra = {fd, off, 0};
            err = sl_rpc_stream_write_bytes(s, SLUICE__V1__UPLOAD_SHARD_REQUEST__KIND_CHUNK, n, 0,
                                            read_fill, &ra);
            if (ra.err) {
                sl_rpc_stream_cancel(s);
                err = sl_client_set_error(ra.err, "cannot read the shard at offset %llu: %s",
                                          (unsigned long long)off, sl_strerror(ra.err));
                goto out;
            }
            off += n;
            if (!err && opts->progress)
                opts->progress(off, size, opts->arg);
            continue;
        }
        buf = hasher_buffer(&hs, seq);
        err = read_at(fd, buf, n, off);
        if (err) {
            sl_rpc_stream_cancel(s);
            err = sl_client_set_error(err, "cannot read the shard at offset %llu: %s",
                                      (unsigned long long)off, sl_strerror(err));
            goto out;
        }
        hasher_post(&hs, seq++, n);
        msg.chunk.data = buf;
        msg.chunk.len = n;
        err = sl_rpc_stream_write(s, &msg.base, 0);
        off += n;
        if (!err && opts->progress)
            opts->progress(off, size, opts->arg);
    }
    if (!err)
        err = sl_rpc_stream_close_send(s);
    if (!err) {
        int r = sl_rpc_stream_read(s, &sluice__v1__upload_shard_response__descriptor,
                                   (ProtobufCMessage **)&resp);
        err = r == 1 ? 0 : (r == 0 ? SL_ERPC : r);
    }
    {
        int ferr = sl_rpc_stream_finish(s, st);
        if (ferr) {
            err = sl_client_record(ferr, st);
            goto out;
        }
    }
    if (err) {
        err = sl_client_set_error(err, "upload failed: %s", sl_strerror(err));
        goto out;
    }
    if (sha) {
        hasher_stop(&hs);
        sl_sha256_final(sha, local);
        if (strcmp(local, resp->sha256 ? resp->sha256 : "") != 0) {
            err = sl_client_set_error(SL_ECORRUPT,
                                      "the daemon stored sha256 %s but the local data hashes to %s",
                                      resp->sha256, local);
            goto out;
        }
    }
    if (receipt) {
        memset(receipt, 0, sizeof(*receipt));
        receipt->rank = resp->rank;
        receipt->data_size = resp->data_size;
        receipt->file_size = resp->file_size;
        copy_str(receipt->sha256, sizeof(receipt->sha256), resp->sha256);
        copy_str(receipt->path, sizeof(receipt->path), resp->path);
        receipt->tensor_count = (uint32_t)hdr.n_tensors;
    }
out:
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    hasher_stop(&hs);
    pthread_cond_destroy(&hs.cv);
    pthread_mutex_destroy(&hs.mu);
    for (int k = 0; k < HASH_BUFS; k++)
        free(hs.bufs[k]);
    sl_rpc_stream_free(s);
    sl_sha256_free(sha);
    free(tinfo);
    free(tptr);
    return err;
}

int sl_ckpt_upload_fd(sl_client *c, sl_ckpt_shard *receipt, const char *job, const char *name,
                      int32_t rank, int fd, uint64_t size, const sl_ckpt_upload_opts *opts)
{
    static const sl_ckpt_upload_opts defaults = SL_CKPT_UPLOAD_OPTS_INIT;
    size_t first = sl_client_pick(c), i = first, tries = 0;
    sl_rpc_status st;
    int err, resume;

    if (!opts)
        opts = &defaults;
    err = sl_opts_check(opts->version, SL_CKPT_UPLOAD_OPTS_VERSION, "sl_ckpt_upload_opts");
    if (err)
        return err;
    resume = opts->resume;
    /* A replica that ends the upload UNAVAILABLE (killed, or cut off from the catalog): the next
     * one continues from what the store holds of it (UploadStatus, then the rest), as a caller's
     * resume after a daemon restart does. */
    for (;;) {
        err = upload_try(c, receipt, job, name, rank, fd, size, opts, resume, &i, &st);
        tries++;
        if (!err || st.code == SL_RPC_OK || !sl_client_fail_over(c, i, err, tries))
            break;
        resume = 1;
    }
    if (err && st.code == SL_RPC_UNAVAILABLE)
        err = sl_client_record_tried(err, &st, c, first, tries);
    return err;
}

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;

    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Open DownloadShard for req (from req->offset) on the current replica (*replica). */
static int download_open(sl_rpc_stream **s, sl_client *c, size_t *replica,
                         const Sluice__V1__DownloadShardRequest *req)
{
    int err;

    *replica = sl_client_pick(c);
    err = sl_rpc_stream_open(s, c->rpc[*replica], SVC "DownloadShard", -1);
    if (!err)
        err = sl_rpc_stream_write(*s, &req->base, 0);
    if (!err)
        err = sl_rpc_stream_close_send(*s);
    return err;
}

int sl_ckpt_download_fd(sl_client *c, char sha256[65], const char *job, const char *name,
                        int32_t rank, int fd, sl_ckpt_progress_fn progress, void *arg)
{
    Sluice__V1__DownloadShardRequest req = SLUICE__V1__DOWNLOAD_SHARD_REQUEST__INIT;
    Sluice__V1__DownloadShardResponse *m = NULL;
    ProtobufCMessage *packed = NULL;
    sl_rpc_stream *s = NULL;
    sl_sha256 *sha = NULL;
    sl_rpc_status st;
    char want[65] = "", got[65];
    uint64_t done = 0;
    size_t replica = 0, first = sl_client_pick(c), tries = 0;
    int r = 0, err, ferr;

    req.job = (char *)job;
    req.name = (char *)name;
    req.rank = rank;
    err = sl_sha256_new(&sha);
    if (err)
        return sl_client_set_error(err, "cannot hash: %s", sl_strerror(err));
again:
    req.offset = done;
    err = download_open(&s, c, &replica, &req);
    if (!s) {
        err = sl_client_set_error(err, "cannot start the download: %s", sl_strerror(err));
        goto out;
    }
    while (!err && (r = sl_rpc_stream_read(s, &sluice__v1__download_shard_response__descriptor,
                                           &packed)) == 1) {
        m = (Sluice__V1__DownloadShardResponse *)packed;
        if (m->offset != done) {
            err = sl_client_set_error(SL_EPROTO, "data at offset %llu, expected %llu",
                                      (unsigned long long)m->offset, (unsigned long long)done);
        } else {
            sl_sha256_update(sha, m->data.data, m->data.len);
            err = write_all(fd, m->data.data, m->data.len);
            if (err)
                err = sl_client_set_error(err, "cannot write: %s", sl_strerror(err));
            done += m->data.len;
            tries = 0;
            if (m->sha256 && *m->sha256)
                copy_str(want, sizeof(want), m->sha256);
            if (!err && progress)
                progress(done, m->data_size, arg);
        }
        protobuf_c_message_free_unpacked(packed, NULL);
        packed = NULL;
    }
    if (!err && r < 0)
        err = r;
    ferr = sl_rpc_stream_finish(s, &st);
    if (ferr) {
        /* A replica that ends the download UNAVAILABLE: the next one sends the rest, from the
         * offset reached (the hash goes on over it). */
        if (sl_client_fail_over(c, replica, ferr, ++tries)) {
            sl_rpc_stream_free(s);
            s = NULL;
            goto again;
        }
        err = sl_client_record_tried(ferr, &st, c, first, tries);
        goto out;
    }
    if (err)
        goto out;
    sl_sha256_final(sha, got);
    if (strcmp(got, want) != 0) {
        err = sl_client_set_error(SL_ECORRUPT, "received data hashes to %s, the daemon says %s",
                                  got, want);
        goto out;
    }
    if (sha256)
        memcpy(sha256, got, 65);
out:
    sl_rpc_stream_free(s);
    sl_sha256_free(sha);
    return err;
}

static int pieces_check(uint64_t offset, uint64_t length, const sl_ckpt_piece *p, size_t n)
{
    uint64_t at = offset, end = offset + length;

    if (end < offset)
        return sl_client_set_error(SL_EINVAL, "range of %llu bytes at offset %llu overflows",
                                   (unsigned long long)length, (unsigned long long)offset);
    for (size_t i = 0; i < n; i++) {
        if (p[i].offset < at || p[i].offset > end || p[i].size > end - p[i].offset ||
            (p[i].size && !p[i].dst))
            return sl_client_set_error(SL_EINVAL,
                                       "piece %zu (%llu bytes at offset %llu) is not inside "
                                       "[%llu, %llu) after the one before it, or has no buffer",
                                       i, (unsigned long long)p[i].size,
                                       (unsigned long long)p[i].offset, (unsigned long long)at,
                                       (unsigned long long)end);
        at = p[i].offset + p[i].size;
    }
    return 0;
}

/* The bytes of one message, at data offset `at`, into the pieces from *k on: each piece hashed
 * as it is copied (the bytes still in cache), its digest set once its last byte is in. */
static void pieces_feed(sl_ckpt_piece *p, size_t n, size_t *k, sl_sha256 *sha, uint64_t at,
                        const uint8_t *data, size_t len)
{
    while (*k < n) {
        sl_ckpt_piece *q = &p[*k];
        uint64_t qend = q->offset + q->size;

        if (at >= qend) { /* done (an empty piece is done once reached) */
            sl_sha256_final(sha, q->sha256);
            sl_sha256_reset(sha);
            ++*k;
            continue;
        }
        if (!len)
            return;
        if (at < q->offset) { /* bytes between pieces */
            uint64_t skip = q->offset - at < len ? q->offset - at : len;
            at += skip, data += skip, len -= (size_t)skip;
            continue;
        }
        size_t cnt = qend - at < len ? (size_t)(qend - at) : len;
        uint8_t *dst = (uint8_t *)q->dst + (at - q->offset);
        memcpy(dst, data, cnt);
        sl_sha256_update(sha, dst, cnt);
        at += cnt, data += cnt, len -= cnt;
    }
}

int sl_ckpt_read_pieces(sl_client *c, const char *job, const char *name, int32_t rank,
                        uint64_t offset, uint64_t length, sl_ckpt_piece *pieces, size_t n)
{
    Sluice__V1__DownloadShardRequest req = SLUICE__V1__DOWNLOAD_SHARD_REQUEST__INIT;
    Sluice__V1__DownloadShardResponse *m;
    ProtobufCMessage *packed = NULL;
    sl_rpc_bytes *bytes = NULL;
    sl_rpc_stream *s = NULL;
    sl_sha256 *sha = NULL;
    sl_rpc_status st;
    uint64_t done = offset, end = offset + length;
    size_t replica = 0, first = sl_client_pick(c), tries = 0, k = 0;
    int r = 0, err, ferr;

    if ((err = pieces_check(offset, length, pieces, n)) != 0)
        return err;
    if ((err = sl_sha256_new(&sha)) != 0)
        return sl_client_set_error(err, "cannot hash: %s", sl_strerror(err));
    req.job = (char *)job;
    req.name = (char *)name;
    req.rank = rank;
    while (done < end) {
        req.offset = done;
        req.length = end - done;
        err = download_open(&s, c, &replica, &req);
        if (!s) {
            err = sl_client_set_error(err, "cannot start the download: %s", sl_strerror(err));
            break;
        }
        /* The data as received, in the transport's own slices: copied once, into the pieces. */
        while (!err &&
               (r = sl_rpc_stream_read_bytes(s, &sluice__v1__download_shard_response__descriptor, 1,
                                             &packed, &bytes)) == 1) {
            m = (Sluice__V1__DownloadShardResponse *)packed;
            if (m->offset != done || m->data.len > end - done) {
                err =
                    sl_client_set_error(SL_EPROTO,
                                        "%zu bytes at offset %llu, expected at most %llu at "
                                        "offset %llu",
                                        m->data.len, (unsigned long long)m->offset,
                                        (unsigned long long)(end - done), (unsigned long long)done);
            } else if (bytes) {
                int n_iov;
                const struct iovec *iov = sl_rpc_bytes_iov(bytes, &n_iov);
                uint64_t at = done;
                for (int i = 0; i < n_iov; i++) {
                    pieces_feed(pieces, n, &k, sha, at, iov[i].iov_base, iov[i].iov_len);
                    at += iov[i].iov_len;
                }
            }
            if (!err) {
                done += m->data.len;
                tries = 0;
            }
            protobuf_c_message_free_unpacked(packed, NULL);
            packed = NULL;
            sl_rpc_bytes_free(bytes);
            bytes = NULL;
        }
        if (!err && r < 0)
            err = r;
        ferr = sl_rpc_stream_finish(s, &st);
        sl_rpc_stream_free(s);
        s = NULL;
        if (ferr && sl_client_fail_over(c, replica, ferr, ++tries))
            continue; /* the next replica sends the rest, from the offset reached */
        if (ferr) {
            err = sl_client_record_tried(ferr, &st, c, first, tries);
            break;
        }
        if (!err && done != end)
            err = sl_client_set_error(SL_EPROTO, "the range ended after %llu of %llu bytes",
                                      (unsigned long long)(done - offset),
                                      (unsigned long long)length);
        if (err)
            break;
    }
    if (!err)
        pieces_feed(pieces, n, &k, sha, end, NULL, 0); /* empty pieces at the end */
    sl_sha256_free(sha);
    return err;
}
