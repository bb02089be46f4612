/* libsluice: datasets, jobs, epochs, index and batch streams. */
#include "sluice_feed.h"

#include "internal.h"

#include "err.h"
#include "sluice/v1/feed.pb-c.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define P_DATASETS "/sluice.v1.Datasets/"
#define P_JOBS     "/sluice.v1.Jobs/"
#define P_EPOCHS   "/sluice.v1.Epochs/"
#define P_FEED     "/sluice.v1.Feed/"

static void cpy(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src ? src : "");
}

static int unary(sl_client *c, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *rd, ProtobufCMessage **resp)
{
    return sl_client_unary(c, method, req, rd, resp, c->timeout_ms);
}

/* Copy `count` protobuf items into a new array of `size`-byte structs (one more, zeroed, so an
 * empty list is not NULL) with conv(dst, src), then free the response. Returns 0 with *out and
 * *n, or -ENOMEM (recorded as the client's error). */
static int copy_list(void **out, size_t *n, size_t size, void *const *items, size_t count,
                     void (*conv)(void *dst, const void *src), ProtobufCMessage *resp)
{
    char *v = calloc(count + 1, size);

    if (v)
        for (size_t i = 0; i < count; i++)
            conv(v + i * size, items[i]);
    protobuf_c_message_free_unpacked(resp, NULL);
    if (!v)
        return sl_client_set_error(-ENOMEM, "out of memory");
    *out = v;
    *n = count;
    return 0;
}

/* A unary call whose answer carries nothing the caller needs. */
static int unary_discard(sl_client *c, const char *method, const ProtobufCMessage *req,
                         const ProtobufCMessageDescriptor *rd)
{
    ProtobufCMessage *resp = NULL;
    int err = unary(c, method, req, rd, &resp);

    if (resp)
        protobuf_c_message_free_unpacked(resp, NULL);
    return err;
}

/* ---- datasets ---- */

static void from_dataset(sl_dataset *out, const Sluice__V1__Dataset *d)
{
    memset(out, 0, sizeof(*out));
    cpy(out->name, sizeof(out->name), d->name);
    out->samples = d->samples;
    out->has_lengths = d->has_lengths;
    cpy(out->lengths_sha256, sizeof(out->lengths_sha256), d->lengths_sha256);
    out->created_ms = d->created_ms;
    out->jobs = d->jobs;
    out->has_labels = d->has_labels;
    cpy(out->labels_sha256, sizeof(out->labels_sha256), d->labels_sha256);
    out->classes = d->classes;
}

static void conv_dataset(void *dst, const void *src)
{
    from_dataset(dst, src);
}

static int dataset_reply(int err, Sluice__V1__Dataset *resp, sl_dataset *out)
{
    if (!err && out)
        from_dataset(out, resp);
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    return err;
}

int sl_dataset_create(sl_client *c, const char *name, uint64_t samples, sl_dataset *out)
{
    Sluice__V1__CreateDatasetRequest req = SLUICE__V1__CREATE_DATASET_REQUEST__INIT;
    Sluice__V1__Dataset *resp = NULL;

    req.name = (char *)name;
    req.samples = samples;
    int err = unary(c, P_DATASETS "Create", &req.base, &sluice__v1__dataset__descriptor,
                    (ProtobufCMessage **)&resp);

    return dataset_reply(err, resp, out);
}

int sl_dataset_get(sl_client *c, const char *name, sl_dataset *out)
{
    Sluice__V1__GetDatasetRequest req = SLUICE__V1__GET_DATASET_REQUEST__INIT;
    Sluice__V1__Dataset *resp = NULL;

    req.name = (char *)name;
    int err = unary(c, P_DATASETS "Get", &req.base, &sluice__v1__dataset__descriptor,
                    (ProtobufCMessage **)&resp);

    return dataset_reply(err, resp, out);
}

/* One client stream of u32 values per sample (UploadLengths, UploadLabels) on replica i: both
 * requests are (name = 1, repeated uint32 = 2), so one message type packs either. Returns 0 with
 * *resp, or the error with *st (its status, when the daemon gave one). */
static int upload_u32_on(sl_client *c, size_t i, const char *method, const char *name,
                         const uint32_t *v, uint64_t n, Sluice__V1__Dataset **resp,
                         sl_rpc_status *st)
{
    Sluice__V1__UploadLengthsRequest msg = SLUICE__V1__UPLOAD_LENGTHS_REQUEST__INIT;
    sl_rpc_stream *s = NULL;
    uint64_t off = 0;
    int err, ferr;

    st->code = SL_RPC_OK;
    err = sl_rpc_stream_open(&s, c->rpc[i], method, -1);
    if (err)
        return sl_client_set_error(err, "cannot start the upload: %s", sl_strerror(err));
    msg.name = (char *)name;
    do {
        uint64_t k = n - off < (1u << 20) ? n - off : (1u << 20);
        msg.lengths = (uint32_t *)(v + off);
        msg.n_lengths = (size_t)k;
        err = sl_rpc_stream_write(s, &msg.base, 0);
        off += k;
    } while (!err && off < n);
    if (!err)
        err = sl_rpc_stream_close_send(s);
    if (!err) {
        int r = sl_rpc_stream_read(s, &sluice__v1__dataset__descriptor, (ProtobufCMessage **)resp);
        err = r == 1 ? 0 : (r == 0 ? SL_ERPC : r);
    }
    ferr = sl_rpc_stream_finish(s, st);
    sl_rpc_stream_free(s);
    if (ferr)
        return ferr;
    if (err)
        err = sl_client_set_error(err, "upload failed: %s", sl_strerror(err));
    return err;
}

/* upload_u32_on with the replicas' failover: the values are in memory, so a replica that ends
 * the upload UNAVAILABLE gets it again from the start on the next. */
static int upload_u32(sl_client *c, const char *method, const char *name, const uint32_t *v,
                      uint64_t n, sl_dataset *out)
{
    Sluice__V1__Dataset *resp = NULL;
    size_t first = sl_client_pick(c), i = first, tries = 0;
    sl_rpc_status st;
    int err;

    for (;;) {
        err = upload_u32_on(c, i, method, name, v, n, &resp, &st);
        tries++;
        if (!err || st.code == SL_RPC_OK || !sl_client_fail_over(c, i, err, tries))
            break;
        if (resp)
            protobuf_c_message_free_unpacked(&resp->base, NULL);
        resp = NULL;
        i = (i + 1) % c->n;
    }
    if (err && st.code != SL_RPC_OK)
        err = sl_client_record_tried(err, &st, c, first, tries);
    return dataset_reply(err, resp, out);
}

int sl_dataset_upload_lengths(sl_client *c, const char *name, const uint32_t *lengths, uint64_t n,
                              sl_dataset *out)
{
    return upload_u32(c, P_DATASETS "UploadLengths", name, lengths, n, out);
}

int sl_dataset_upload_labels(sl_client *c, const char *name, const uint32_t *labels, uint64_t n,
                             sl_dataset *out)
{
    return upload_u32(c, P_DATASETS "UploadLabels", name, labels, n, out);
}

int sl_dataset_list(sl_client *c, sl_dataset **out, size_t *n)
{
    Sluice__V1__ListDatasetsRequest req = SLUICE__V1__LIST_DATASETS_REQUEST__INIT;
    Sluice__V1__ListDatasetsResponse *resp = NULL;
    int err = unary(c, P_DATASETS "List", &req.base,
                    &sluice__v1__list_datasets_response__descriptor, (ProtobufCMessage **)&resp);

    *out = NULL;
    *n = 0;
    if (err)
        return err;
    return copy_list((void **)out, n, sizeof(**out), (void *const *)resp->datasets,
                     resp->n_datasets, conv_dataset, &resp->base);
}

int sl_dataset_delete(sl_client *c, const char *name)
{
    Sluice__V1__DeleteDatasetRequest req = SLUICE__V1__DELETE_DATASET_REQUEST__INIT;

    req.name = (char *)name;
    return unary_discard(c, P_DATASETS "Delete", &req.base,
                         &sluice__v1__delete_dataset_response__descriptor);
}

/* ---- jobs ---- */

static void from_job(sl_job *out, const Sluice__V1__Job *j)
{
    memset(out, 0, sizeof(*out));
    cpy(out->name, sizeof(out->name), j->name);
    cpy(out->dataset, sizeof(out->dataset), j->dataset);
    out->world_size = j->world_size;
    if (j->mesh) {
        out->mesh.dp = j->mesh->dp;
        out->mesh.tp = j->mesh->tp;
        out->mesh.cp = j->mesh->cp;
        out->mesh.pp = j->mesh->pp;
        cpy(out->mesh.order, sizeof(out->mesh.order), j->mesh->order);
    }
    cpy(out->partition, sizeof(out->partition), j->partition);
    out->chunk_size = j->chunk_size;
    cpy(out->shuffle, sizeof(out->shuffle), j->shuffle);
    out->seed = j->seed;
    out->drop_last = j->drop_last;
    out->manual_advance = j->manual_advance;
    if (j->batching) {
        const Sluice__V1__BatchConfig *b = j->batching;
        out->has_batching = 1;
        cpy(out->batching.strategy, sizeof(out->batching.strategy), b->strategy);
        out->batching.max_batch_size = b->max_batch_size;
        out->batching.max_seq_len = b->max_seq_len;
        out->batching.max_tokens = b->max_tokens;
        cpy(out->batching.cost, sizeof(out->batching.cost), b->cost);
        out->batching.window = b->window;
        out->batching.bucket_width = b->bucket_width;
        out->batching.batch_size_multiple = b->batch_size_multiple;
        out->batching.skip_overlong = b->skip_overlong;
        out->batching.pad_remainder = b->pad_remainder;
        out->batching.balance = b->balance;
    }
    out->epoch = j->epoch;
    out->created_ms = j->created_ms;
    out->dp_size = j->dp_size;
    out->resized_in_epoch = j->resized_in_epoch;
    out->stratify = j->stratify;
    out->balance_classes = j->balance_classes;
    out->epoch_length = j->epoch_length;
    out->n_class_weights = (uint32_t)j->n_class_weights;
    out->n_rank_weights = (uint32_t)j->n_rank_weights;
}

/* The job's weights copied to store (n_class_weights + n_rank_weights entries): class weights
 * first, then rank weights; the job's pointers set into it (NULL where there are none). */
static void job_weights(sl_job *out, const Sluice__V1__Job *j, double *store)
{
    if (j->n_class_weights) {
        memcpy(store, j->class_weights, j->n_class_weights * sizeof(*store));
        out->class_weights = store;
    }
    if (j->n_rank_weights) {
        memcpy(store + j->n_class_weights, j->rank_weights, j->n_rank_weights * sizeof(*store));
        out->rank_weights = store + j->n_class_weights;
    }
}

void sl_job_clear(sl_job *j)
{
    if (!j)
        return;
    /* One block holds both arrays (job_reply): it starts at the class weights if any. */
    free((void *)(j->class_weights ? j->class_weights : j->rank_weights));
    j->class_weights = j->rank_weights = NULL;
}

static int job_reply(int err, Sluice__V1__Job *resp, sl_job *out)
{
    if (!err && out) {
        size_t nw = resp->n_class_weights + resp->n_rank_weights;
        double *w = nw ? malloc(nw * sizeof(*w)) : NULL;

        from_job(out, resp);
        if (nw && !w)
            err = sl_client_set_error(-ENOMEM, "out of memory");
        else if (nw)
            job_weights(out, resp, w);
    }
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    return err;
}

static void to_mesh(Sluice__V1__Mesh *m, const sl_job_mesh *in)
{
    sluice__v1__mesh__init(m);
    m->dp = in->dp;
    m->tp = in->tp;
    m->cp = in->cp;
    m->pp = in->pp;
    m->order = (char *)in->order;
}

int sl_job_create(sl_client *c, const sl_job *spec, sl_job *out)
{
    Sluice__V1__CreateJobRequest req = SLUICE__V1__CREATE_JOB_REQUEST__INIT;
    Sluice__V1__Job j = SLUICE__V1__JOB__INIT;
    Sluice__V1__Mesh mesh;
    Sluice__V1__BatchConfig bc = SLUICE__V1__BATCH_CONFIG__INIT;
    Sluice__V1__Job *resp = NULL;

    j.name = (char *)spec->name;
    j.dataset = (char *)spec->dataset;
    j.world_size = spec->world_size;
    if (spec->mesh.dp || spec->mesh.tp || spec->mesh.cp || spec->mesh.pp) {
        to_mesh(&mesh, &spec->mesh);
        j.mesh = &mesh;
    }
    j.partition = (char *)spec->partition;
    j.chunk_size = spec->chunk_size;
    j.shuffle = (char *)spec->shuffle;
    j.seed = spec->seed;
    j.drop_last = spec->drop_last;
    j.manual_advance = spec->manual_advance;
    j.stratify = spec->stratify;
    j.balance_classes = spec->balance_classes;
    j.epoch_length = spec->epoch_length;
    j.class_weights = (double *)spec->class_weights;
    j.n_class_weights = spec->class_weights ? spec->n_class_weights : 0;
    j.rank_weights = (double *)spec->rank_weights;
    j.n_rank_weights = spec->rank_weights ? spec->n_rank_weights : 0;
    if (spec->has_batching) {
        const sl_job_batching *b = &spec->batching;
        bc.strategy = (char *)b->strategy;
        bc.max_batch_size = b->max_batch_size;
        bc.max_seq_len = b->max_seq_len;
        bc.max_tokens = b->max_tokens;
        bc.cost = (char *)b->cost;
        bc.window = b->window;
        bc.bucket_width = b->bucket_width;
        bc.batch_size_multiple = b->batch_size_multiple;
        bc.skip_overlong = b->skip_overlong;
        bc.pad_remainder = b->pad_remainder;
        bc.balance = b->balance;
        j.batching = &bc;
    }
    req.job = &j;
    int err = unary(c, P_JOBS "Create", &req.base, &sluice__v1__job__descriptor,
                    (ProtobufCMessage **)&resp);

    return job_reply(err, resp, out);
}

int sl_job_get(sl_client *c, const char *name, sl_job *out)
{
    Sluice__V1__GetJobRequest req = SLUICE__V1__GET_JOB_REQUEST__INIT;
    Sluice__V1__Job *resp = NULL;

    req.name = (char *)name;
    int err =
        unary(c, P_JOBS "Get", &req.base, &sluice__v1__job__descriptor, (ProtobufCMessage **)&resp);

    return job_reply(err, resp, out);
}

int sl_job_list(sl_client *c, const char *dataset, sl_job **out, size_t *n)
{
    Sluice__V1__ListJobsRequest req = SLUICE__V1__LIST_JOBS_REQUEST__INIT;
    Sluice__V1__ListJobsResponse *resp = NULL;
    int err;

    *out = NULL;
    *n = 0;
    req.dataset = (char *)(dataset ? dataset : "");
    err = unary(c, P_JOBS "List", &req.base, &sluice__v1__list_jobs_response__descriptor,
                (ProtobufCMessage **)&resp);
    if (err)
        return err;
    /* The jobs and all their weights in one block, so that free() of the array frees them. */
    size_t nw = 0, at = 0, count = resp->n_jobs;
    for (size_t i = 0; i < resp->n_jobs; i++)
        nw += resp->jobs[i]->n_class_weights + resp->jobs[i]->n_rank_weights;
    sl_job *v = calloc(1, (resp->n_jobs + 1) * sizeof(*v) + nw * sizeof(double));
    if (v) {
        double *w = (double *)(void *)(v + resp->n_jobs + 1);
        for (size_t i = 0; i < resp->n_jobs; i++) {
            from_job(&v[i], resp->jobs[i]);
            job_weights(&v[i], resp->jobs[i], w + at);
            at += resp->jobs[i]->n_class_weights + resp->jobs[i]->n_rank_weights;
        }
    }
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    if (!v)
        return sl_client_set_error(-ENOMEM, "out of memory");
    *out = v;
    *n = count;
    return 0;
}

int sl_job_delete(sl_client *c, const char *name)
{
    Sluice__V1__DeleteJobRequest req = SLUICE__V1__DELETE_JOB_REQUEST__INIT;

    req.name = (char *)name;
    return unary_discard(c, P_JOBS "Delete", &req.base,
                         &sluice__v1__delete_job_response__descriptor);
}

int sl_job_resize(sl_client *c, const char *name, uint32_t world_size, const sl_job_mesh *mesh,
                  sl_job *out)
{
    return sl_job_resize_weighted(c, name, world_size, mesh, NULL, 0, out);
}

int sl_job_resize_weighted(sl_client *c, const char *name, uint32_t world_size,
                           const sl_job_mesh *mesh, const double *rank_weights,
                           uint32_t n_rank_weights, sl_job *out)
{
    Sluice__V1__ResizeJobRequest req = SLUICE__V1__RESIZE_JOB_REQUEST__INIT;
    Sluice__V1__Mesh m;
    Sluice__V1__Job *resp = NULL;

    req.name = (char *)name;
    req.world_size = world_size;
    req.rank_weights = (double *)rank_weights;
    req.n_rank_weights = rank_weights ? n_rank_weights : 0;
    if (mesh) {
        to_mesh(&m, mesh);
        req.mesh = &m;
    }
    int err = unary(c, P_JOBS "Resize", &req.base, &sluice__v1__job__descriptor,
                    (ProtobufCMessage **)&resp);

    return job_reply(err, resp, out);
}

/* ---- epochs ---- */

void sl_epoch_clear(sl_epoch *e)
{
    if (!e)
        return;
    free(e->ranks);
    e->ranks = NULL;
}

static int epoch_reply(int err, Sluice__V1__EpochState *resp, sl_epoch *out)
{
    if (!err && out) {
        memset(out, 0, sizeof(*out));
        cpy(out->job, sizeof(out->job), resp->job);
        out->epoch = resp->epoch;
        out->dp_size = resp->dp_size;
        out->complete = resp->complete;
        cpy(out->unit, sizeof(out->unit), resp->unit);
        out->ranks = calloc(resp->n_ranks + 1, sizeof(*out->ranks));
        if (!out->ranks) {
            err = sl_client_set_error(-ENOMEM, "out of memory");
        } else {
            for (size_t i = 0; i < resp->n_ranks; i++) {
                out->ranks[i].dp_rank = resp->ranks[i]->dp_rank;
                out->ranks[i].position = resp->ranks[i]->position;
                out->ranks[i].count = resp->ranks[i]->count;
                out->ranks[i].done = resp->ranks[i]->done;
            }
            out->dp_size = (uint32_t)resp->n_ranks;
        }
    }
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    return err;
}

int sl_epoch_get(sl_client *c, const char *job, sl_epoch *out)
{
    Sluice__V1__GetEpochRequest req = SLUICE__V1__GET_EPOCH_REQUEST__INIT;
    Sluice__V1__EpochState *resp = NULL;

    req.job = (char *)job;
    int err = unary(c, P_EPOCHS "Get", &req.base, &sluice__v1__epoch_state__descriptor,
                    (ProtobufCMessage **)&resp);

    return epoch_reply(err, resp, out);
}

int sl_epoch_next(sl_client *c, const char *job, int check, uint64_t expect, sl_epoch *out)
{
    Sluice__V1__NextEpochRequest req = SLUICE__V1__NEXT_EPOCH_REQUEST__INIT;
    Sluice__V1__EpochState *resp = NULL;

    req.job = (char *)job;
    req.check_epoch = check;
    req.expect_epoch = expect;
    int err = unary(c, P_EPOCHS "Next", &req.base, &sluice__v1__epoch_state__descriptor,
                    (ProtobufCMessage **)&resp);

    return epoch_reply(err, resp, out);
}

int sl_epoch_report(sl_client *c, const char *job, uint32_t rank, uint64_t epoch, uint64_t position,
                    uint64_t *cur_epoch, int *advanced)
{
    Sluice__V1__ReportProgressRequest req = SLUICE__V1__REPORT_PROGRESS_REQUEST__INIT;
    Sluice__V1__ReportProgressResponse *resp = NULL;
    int err;

    req.job = (char *)job;
    req.rank = rank;
    req.epoch = epoch;
    req.position = position;
    err = unary(c, P_EPOCHS "ReportProgress", &req.base,
                &sluice__v1__report_progress_response__descriptor, (ProtobufCMessage **)&resp);
    if (err)
        return err;
    if (cur_epoch)
        *cur_epoch = resp->epoch;
    if (advanced)
        *advanced = resp->advanced;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return 0;
}

/* ---- streams ---- */

/* Where a stream is, so that it can be reopened on another replica: a stream is a pure function
 * of (job, epoch, rank, position), so the next replica continues at the position reached. */
typedef struct feed_call {
    sl_client *c;
    const char *method;
    sl_rpc_stream *s;
    size_t replica; /* where the call runs */
    size_t tries;   /* replicas tried since the last message arrived */
    char *job;
    uint32_t rank;
    sl_stream_opts so; /* as opened; epoch and position follow the messages received */
    int done;
} feed_call;

struct sl_index_stream {
    feed_call f;
    Sluice__V1__IndexChunk *chunk;
    uint64_t epoch, share_count;
};

struct sl_batch_stream {
    feed_call f;
    Sluice__V1__BatchChunk *chunk;
    size_t next; /* next batch of chunk */
    uint64_t epoch, per_rank;
};

/* The request of f's method for its job, rank, epoch and position, packed and sent on f->s. */
static int send_request(feed_call *f)
{
    const sl_stream_opts *o = &f->so;

    if (strcmp(f->method, P_FEED "StreamIndices") == 0) {
        Sluice__V1__StreamIndicesRequest req = SLUICE__V1__STREAM_INDICES_REQUEST__INIT;
        req.job = f->job;
        req.rank = f->rank;
        req.epoch_set = o->epoch_set;
        req.epoch = o->epoch;
        req.position_set = o->position_set;
        req.position = o->position;
        req.max_chunk = o->max_chunk;
        return sl_rpc_stream_write(f->s, &req.base, 0);
    } else {
        Sluice__V1__StreamBatchesRequest req = SLUICE__V1__STREAM_BATCHES_REQUEST__INIT;
        req.job = f->job;
        req.rank = f->rank;
        req.epoch_set = o->epoch_set;
        req.epoch = o->epoch;
        req.step_set = o->position_set;
        req.step = o->position;
        req.max_batches = o->max_chunk;
        return sl_rpc_stream_write(f->s, &req.base, 0);
    }
}

/* Start f's call on the current replica; with several replicas, one that ends the call
 * UNAVAILABLE before the request is sent makes the next one current and the call starts there.
 * Returns 0 or the error (recorded). */
static int feed_open(feed_call *f)
{
    size_t first = sl_client_pick(f->c);
    sl_rpc_status st;
    int err, ferr;

    for (;;) {
        f->replica = sl_client_pick(f->c);
        f->done = 0;
        err = sl_rpc_stream_open(&f->s, f->c->rpc[f->replica], f->method, -1);
        if (err)
            return sl_client_set_error(err, "cannot open the stream: %s", sl_strerror(err));
        err = send_request(f);
        if (!err)
            err = sl_rpc_stream_close_send(f->s);
        if (!err)
            return 0;
        ferr = f->c->n > 1 ? sl_rpc_stream_finish(f->s, &st) : 0;
        sl_rpc_stream_free(f->s);
        f->s = NULL;
        if (!ferr)
            return sl_client_set_error(err, "cannot open the stream: %s", sl_strerror(err));
        if (!sl_client_fail_over(f->c, f->replica, ferr, ++f->tries))
            return sl_client_record_tried(ferr, &st, f->c, first, f->tries);
    }
}

/* The stream read up to epoch `epoch`, position `position` (exclusive): a reopened call starts
 * there. */
static void feed_reached(feed_call *f, uint64_t epoch, uint64_t position)
{
    f->so.epoch_set = 1;
    f->so.epoch = epoch;
    f->so.position_set = 1;
    f->so.position = position;
    f->tries = 0;
}

/* Read one message; on end or failure record the final status. A call that ends UNAVAILABLE on
 * a client with several replicas is reopened on the next one at the position reached (each
 * replica at most once since the last message). Returns 1, 0 or an error. */
static int read_msg(feed_call *f, const ProtobufCMessageDescriptor *d, ProtobufCMessage **m)
{
    size_t first = f->replica;
    sl_rpc_status st;
    int r, ferr;

    for (;;) {
        if (f->done)
            return 0;
        r = sl_rpc_stream_read(f->s, d, m);
        if (r == 1)
            return 1;
        f->done = 1;
        ferr = sl_rpc_stream_finish(f->s, &st);
        if (!ferr)
            return r == 0 ? 0 : sl_client_set_error(r, "stream failed: %s", sl_strerror(r));
        if (!sl_client_fail_over(f->c, f->replica, ferr, ++f->tries))
            return sl_client_record_tried(ferr, &st, f->c, first, f->tries);
        sl_rpc_stream_free(f->s);
        f->s = NULL;
        r = feed_open(f);
        if (r)
            return r;
    }
}

/* Check the options, allocate a stream object of `size` bytes that begins with its feed_call,
 * and start `method` for job and rank. Returns 0 and *out, or the error (*out NULL). */
static int open_typed(void **out, size_t size, sl_client *c, const char *method, const char *job,
                      uint32_t rank, const sl_stream_opts *opts)
{
    feed_call *f;
    int err;

    *out = NULL;
    err = opts ? sl_opts_check(opts->version, SL_STREAM_OPTS_VERSION, "sl_stream_opts") : 0;
    if (err)
        return err;
    f = calloc(1, size);
    if (!f || !(f->job = strdup(job ? job : ""))) {
        free(f);
        return sl_client_set_error(-ENOMEM, "out of memory");
    }
    f->c = c;
    f->method = method;
    f->rank = rank;
    if (opts) {
        f->so.epoch_set = opts->epoch_set;
        f->so.epoch = opts->epoch;
        f->so.position_set = opts->position_set;
        f->so.position = opts->position;
        f->so.max_chunk = opts->max_chunk;
    }
    err = feed_open(f);
    if (err) {
        free(f->job);
        free(f);
        return err;
    }
    *out = f;
    return 0;
}

static void feed_close(feed_call *f)
{
    sl_rpc_stream_free(f->s);
    free(f->job);
}

int sl_indices_open(sl_index_stream **out, sl_client *c, const char *job, uint32_t rank,
                    const sl_stream_opts *opts)
{
    return open_typed((void **)out, sizeof(**out), c, P_FEED "StreamIndices", job, rank, opts);
}

int sl_indices_next(sl_index_stream *s, const uint64_t **idx, size_t *n, uint64_t *start)
{
    int r;

    if (s->chunk) {
        protobuf_c_message_free_unpacked(&s->chunk->base, NULL);
        s->chunk = NULL;
    }
    r = read_msg(&s->f, &sluice__v1__index_chunk__descriptor, (ProtobufCMessage **)&s->chunk);
    if (r != 1)
        return r;
    s->epoch = s->chunk->epoch;
    s->share_count = s->chunk->share_count;
    feed_reached(&s->f, s->epoch, s->chunk->start + s->chunk->n_indices);
    *idx = s->chunk->indices;
    *n = s->chunk->n_indices;
    *start = s->chunk->start;
    return 1;
}

uint64_t sl_indices_epoch(const sl_index_stream *s)
{
    return s->epoch;
}

uint64_t sl_indices_share_count(const sl_index_stream *s)
{
    return s->share_count;
}

void sl_indices_close(sl_index_stream *s)
{
    if (!s)
        return;
    if (s->chunk)
        protobuf_c_message_free_unpacked(&s->chunk->base, NULL);
    feed_close(&s->f);
    free(s);
}

int sl_batches_open(sl_batch_stream **out, sl_client *c, const char *job, uint32_t rank,
                    const sl_stream_opts *opts)
{
    return open_typed((void **)out, sizeof(**out), c, P_FEED "StreamBatches", job, rank, opts);
}

int sl_batches_next(sl_batch_stream *s, sl_feed_batch *out)
{
    const Sluice__V1__Batch *b;

    while (!s->chunk || s->next >= s->chunk->n_batches) {
        int r;
        if (s->chunk) {
            protobuf_c_message_free_unpacked(&s->chunk->base, NULL);
            s->chunk = NULL;
        }
        r = read_msg(&s->f, &sluice__v1__batch_chunk__descriptor, (ProtobufCMessage **)&s->chunk);
        if (r != 1)
            return r;
        s->next = 0;
        s->epoch = s->chunk->epoch;
        s->per_rank = s->chunk->batches_per_rank;
        /* The whole chunk is handed out before the next read: a reopened call starts after it. */
        if (s->chunk->n_batches)
            feed_reached(&s->f, s->epoch, s->chunk->batches[s->chunk->n_batches - 1]->step + 1);
    }
    b = s->chunk->batches[s->next++];
    out->step = b->step;
    out->indices = b->indices;
    out->count = b->n_indices;
    out->max_len = b->max_len;
    out->tokens = b->tokens;
    out->padded_tokens = b->padded_tokens;
    return 1;
}

uint64_t sl_batches_epoch(const sl_batch_stream *s)
{
    return s->epoch;
}

uint64_t sl_batches_per_rank(const sl_batch_stream *s)
{
    return s->per_rank;
}

void sl_batches_close(sl_batch_stream *s)
{
    if (!s)
        return;
    if (s->chunk)
        protobuf_c_message_free_unpacked(&s->chunk->base, NULL);
    feed_close(&s->f);
    free(s);
}
