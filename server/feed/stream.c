/* sluice.v1.Feed: each rank's index stream and batch stream.
 *
 * A stream produces its next chunks only when the RPC layer's send queue has room (on_writable):
 * at most QUEUE_DEPTH chunks and SEND_BYTES bytes queued or in flight (the methods'
 * send_budget), each message at most MSG_BYTES, so a slow client slows production and a client
 * that never reads holds at most STREAM_BYTES of the daemon's memory, call state included. Messages
 * are built in the service's one scratch buffer, so a stream holds no buffer of its own. Index
 * chunks are computed from (seed, epoch, rank, position) with sl_sample_fill; batch chunks are
 * slices of the epoch's plan, which is computed once per (job, epoch) on the worker pool and
 * shared by every rank.
 */
#include "internal.h"

#include "err.h"
#include "log.h"
#include "shard/shard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define QUEUE_DEPTH 8
/* What a stream may hold of the daemon's memory: its call's own state in gRPC and here (measured
 * at a few KiB; STATE_BYTES is what is set aside for it) and its messages queued or in flight
 * (SEND_BYTES, the methods' send_budget). A message takes at most a quarter of SEND_BYTES, so a
 * reader keeps several coming while a stalled one holds no more than the budget. */
#define STREAM_BYTES (256u << 10)
#define STATE_BYTES  (32u << 10)
#define SEND_BYTES   (STREAM_BYTES - STATE_BYTES)
#define MSG_BYTES    (SEND_BYTES / 4)
/* Chunks produced per wake-up of one stream: the loop serves many streams, and producing a
 * whole queue's worth for one of them delays all the others (measured: p99 gap between chunks
 * with 256 streams). */
#define PUMP_BURST          2
#define DEFAULT_CHUNK       8192
#define MAX_CHUNK           65536
#define DEFAULT_BATCH_CHUNK 64
#define MAX_BATCH_CHUNK     1024

enum { ST_WAIT_EPOCH, ST_WAIT_PLAN, ST_WAIT_SAMPLE, ST_STREAMING, ST_DONE };

struct fstream {
    sl_feed *f;
    fjob *job; /* NULL once detached (job deleted, resized, shutdown) */
    sl_rpc_call *call;
    int batches;
    int state;
    uint32_t rank, dp;
    uint64_t epoch;
    int has_pos;
    int group; /* without a position: resume at the group's common position */
    uint64_t pos, end;
    uint32_t chunk;
    int window;    /* send room with an empty queue */
    sl_sample *s;  /* owned, or borrowed from `share` */
    fshare *share; /* torch mode: the dp rank's shared share */
    fsrc *src;
    fplan *plan;
    fstream *prev, *next;
};

static void detach(fstream *s)
{
    if (!s->job)
        return;
    if (s->prev)
        s->prev->next = s->next;
    else
        s->job->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
    s->job = NULL;
}

static void stream_free(void *p)
{
    fstream *s = p;

    detach(s);
    if (s->share)
        fshare_unref(s->share);
    else
        sl_sample_free(s->s);
    fsrc_unref(s->src);
    fplan_unref(s->plan);
    free(s);
}

static void end_stream(fstream *s, sl_rpc_code code, const char *why)
{
    s->state = ST_DONE;
    sl_rpc_call_finish(s->call, code, "%s", why);
}

/* The service's scratch buffer, at least `len` bytes; NULL if out of memory. */
static void *scratch(sl_feed *f, size_t len)
{
    void *p;

    if (len <= f->scratch_cap)
        return f->scratch;
    p = realloc(f->scratch, len);
    if (!p)
        return NULL;
    f->scratch = p;
    f->scratch_cap = len;
    return p;
}

static int queue_room(fstream *s)
{
    int room = sl_rpc_call_send_room(s->call);

    return room - (s->window - QUEUE_DEPTH);
}

static void pump_indices(fstream *s)
{
    Sluice__V1__IndexChunk msg = SLUICE__V1__INDEX_CHUNK__INIT;
    uint64_t *buf = scratch(s->f, sizeof(*buf) * s->chunk);
    int burst = 0;

    if (!buf) {
        end_stream(s, SL_RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    while (s->state == ST_STREAMING && s->pos < s->end && queue_room(s) > 0 &&
           burst++ < PUMP_BURST) {
        uint64_t n = s->end - s->pos < s->chunk ? s->end - s->pos : s->chunk;
        if (sl_sample_fill(buf, s->s, s->pos, (size_t)n) != 0) {
            end_stream(s, SL_RPC_INTERNAL, "sampler failed");
            return;
        }
        msg.epoch = s->epoch;
        msg.start = s->pos;
        msg.indices = buf;
        msg.n_indices = (size_t)n;
        msg.share_count = s->end;
        if (sl_rpc_call_send(s->call, &msg.base) != 0)
            return;
        s->pos += n;
        if (s->f->metrics)
            sl_metrics_add(s->f->metrics, "sluice_indices_served_total", NULL, (double)n);
    }
    if (s->state == ST_STREAMING && s->pos >= s->end) {
        s->state = ST_DONE;
        sl_rpc_call_finish(s->call, SL_RPC_OK, "%s", "");
    }
}

/* Fill bmsgs/bptrs with the batches from s->pos on: at most `max`, and no more once they pack
 * into MSG_BYTES (at least one). Returns how many, or 0 after ending the stream. */
static uint64_t fill_batches(fstream *s, Sluice__V1__Batch *bmsgs, Sluice__V1__Batch **bptrs,
                             uint64_t max)
{
    size_t bytes = 0;
    uint64_t n = 0;

    while (n < max && bytes < MSG_BYTES) {
        uint32_t rank = s->dp;
        uint64_t step = s->pos + n, g;
        sl_batch b;

        if (s->s) {
            /* Elastic shares (resized mid-epoch): batch g of the epoch plan's step-major order. */
            uint32_t d0 = sl_batch_plan_replicas(s->plan->plan);
            if (sl_sample_fill(&g, s->s, step, 1) != 0) {
                end_stream(s, SL_RPC_INTERNAL, "elastic batch lookup failed");
                return 0;
            }
            rank = (uint32_t)(g % d0);
            step = g / d0;
        }
        if (sl_batch_plan_get(s->plan->plan, rank, step, &b) != 0) {
            end_stream(s, SL_RPC_INTERNAL, "batch plan lookup failed");
            return 0;
        }
        sluice__v1__batch__init(&bmsgs[n]);
        bmsgs[n].step = s->pos + n;
        bmsgs[n].indices = (uint32_t *)b.indices;
        bmsgs[n].n_indices = b.count;
        bmsgs[n].max_len = b.max_len;
        bmsgs[n].tokens = b.tokens;
        bmsgs[n].padded_tokens = b.padded_tokens;
        bptrs[n] = &bmsgs[n];
        /* The batch, its tag and its length prefix. */
        bytes += protobuf_c_message_get_packed_size(&bmsgs[n].base) + 6;
        n++;
    }
    return n;
}

static void pump_batches(fstream *s)
{
    Sluice__V1__BatchChunk msg = SLUICE__V1__BATCH_CHUNK__INIT;
    Sluice__V1__Batch *bmsgs = scratch(s->f, (sizeof(*bmsgs) + sizeof(bmsgs)) * s->chunk);
    Sluice__V1__Batch **bptrs = (Sluice__V1__Batch **)(bmsgs + s->chunk);

    if (!bmsgs) {
        end_stream(s, SL_RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    while (s->state == ST_STREAMING && s->pos < s->end && queue_room(s) > 0) {
        uint64_t n =
            fill_batches(s, bmsgs, bptrs, s->end - s->pos < s->chunk ? s->end - s->pos : s->chunk);
        if (n == 0)
            return;
        msg.epoch = s->epoch;
        msg.batches = bptrs;
        msg.n_batches = (size_t)n;
        msg.batches_per_rank = s->end;
        if (sl_rpc_call_send(s->call, &msg.base) != 0)
            return;
        s->pos += n;
        if (s->f->metrics)
            sl_metrics_add(s->f->metrics, "sluice_batches_served_total", NULL, (double)n);
    }
    if (s->state == ST_STREAMING && s->pos >= s->end) {
        s->state = ST_DONE;
        sl_rpc_call_finish(s->call, SL_RPC_OK, "%s", "");
    }
}

static void pump(fstream *s)
{
    if (s->state != ST_STREAMING)
        return;
    if (s->batches)
        pump_batches(s);
    else
        pump_indices(s);
}

/* Send one empty chunk so a client whose share is empty (or already consumed) still learns the
 * epoch and the share size, then end. */
static void send_empty(fstream *s)
{
    if (s->batches) {
        Sluice__V1__BatchChunk msg = SLUICE__V1__BATCH_CHUNK__INIT;
        msg.epoch = s->epoch;
        msg.batches_per_rank = s->end;
        sl_rpc_call_send(s->call, &msg.base);
    } else {
        Sluice__V1__IndexChunk msg = SLUICE__V1__INDEX_CHUNK__INIT;
        msg.epoch = s->epoch;
        msg.start = s->pos;
        msg.share_count = s->end;
        sl_rpc_call_send(s->call, &msg.base);
    }
    s->state = ST_DONE;
    sl_rpc_call_finish(s->call, SL_RPC_OK, "%s", "");
}

/* Set the start position and go. */
static void stream_go(fstream *s)
{
    fjob *j = s->job;
    char msg[200];

    if (!s->has_pos && s->epoch != j->epoch)
        /* The epoch ended while the share or plan was built: every rank finished it (or it
         * was advanced by hand), so there is nothing left to serve from it. */
        s->pos = s->end;
    else if (!s->has_pos) {
        uint64_t p = s->group ? feed_job_group_position(j) : j->progress[s->dp];
        s->pos = p < s->end ? p : s->end;
    }
    if (s->pos > s->end) {
        snprintf(msg, sizeof(msg), "position %llu past the end of rank %u's share (%llu)",
                 (unsigned long long)s->pos, s->rank, (unsigned long long)s->end);
        end_stream(s, SL_RPC_INVALID_ARGUMENT, msg);
        return;
    }
    s->window = sl_rpc_call_send_room(s->call);
    s->state = ST_STREAMING;
    if (s->pos == s->end) {
        send_empty(s);
        return;
    }
    pump(s);
}

static void start_batches(fstream *s)
{
    fjob *j = s->job;

    if (s->plan->state < 0) {
        end_stream(s, sl_rpc_code_from_err(s->plan->err), s->plan->msg);
        return;
    }
    if (s->plan == j->plan && j->chain && !feed_job_replans(j)) {
        /* Resized mid-epoch: this rank's elastic share of the rest of the plan's batches (a
         * weighted job's plan is the re-plan of the rest itself). */
        char msg[256] = "";
        int err = feed_job_batch_src(j, msg, sizeof(msg));

        if (!err && !j->src)
            err = SL_ESTATE;
        if (!err && !s->s)
            err = sl_sample_new_elastic(&s->s, j->src->plan, s->dp, msg, sizeof(msg));
        if (err) {
            end_stream(s, sl_rpc_code_from_err(err), msg[0] ? msg : "elastic batches failed");
            return;
        }
        if (!s->src) {
            s->src = j->src;
            s->src->refs++;
        }
        s->end = j->bcount;
    } else {
        s->end = sl_batch_plan_batches_per_rank(s->plan->plan);
    }
    stream_go(s);
}

/* The share's sampler exists (or failed): size the chunks to the message limit and start. */
static void indices_ready(fstream *s, int err, const char *why)
{
    if (err) {
        end_stream(s, sl_rpc_code_from_err(err), why);
        return;
    }
    s->chunk = feed_index_chunk(s->chunk, s->job->samples, MSG_BYTES);
    s->end = sl_sample_count(s->s);
    stream_go(s);
}

/* The stream's torch-mode share finished building (or failed). */
static void share_attach(fstream *s)
{
    if (s->share->state < 0) {
        indices_ready(s, s->share->err, s->share->msg);
        return;
    }
    s->s = s->share->s;
    indices_ready(s, 0, "");
}

/* feed_ready_cb of a stream waiting for its share; it may have ended meanwhile. */
static void share_ready(sl_rpc_call *call, sl_feed *f, const char *job)
{
    fstream *s = sl_rpc_call_data(call);

    (void)f;
    (void)job;
    if (s && s->job && s->state == ST_WAIT_SAMPLE)
        share_attach(s);
}

/* feed_ready_cb of a stream waiting for its batch plan; it may have ended meanwhile. */
static void plan_ready(sl_rpc_call *call, sl_feed *f, const char *job)
{
    fstream *s = sl_rpc_call_data(call);

    (void)f;
    (void)job;
    if (s && s->job && s->state == ST_WAIT_PLAN)
        start_batches(s);
}

/* The stream's epoch is the job's current epoch: build the share and start. */
static void stream_begin(fstream *s)
{
    fjob *j = s->job;
    char msg[256] = ""; /* passed to indices_ready even on success */
    int err;

    if ((err = feed_job_dp_rank(j, s->rank, &s->dp, msg, sizeof(msg))) != 0) {
        end_stream(s, sl_rpc_code_from_err(err), msg);
        return;
    }
    if (s->batches) {
        if ((err = feed_plan_request(j, msg, sizeof(msg))) != 0) {
            end_stream(s, sl_rpc_code_from_err(err), msg);
            return;
        }
        s->plan = j->plan;
        s->plan->refs++;
        s->state = ST_WAIT_PLAN;
        if ((err = feed_plan_wait(j, s->call, plan_ready, msg, sizeof(msg))) != 0)
            end_stream(s, sl_rpc_code_from_err(err), msg);
        return;
    }
    if (j->src) {
        err = sl_sample_new_elastic(&s->s, j->src->plan, s->dp, msg, sizeof(msg));
        if (!err) {
            s->src = j->src;
            s->src->refs++;
        }
    } else {
        sl_sample_config c = j->cfg;
        c.rank = s->rank;
        if (c.shuffle == SL_SAMPLE_SHUFFLE_TORCH) {
            s->state = ST_WAIT_SAMPLE;
            err = feed_share_wait(&s->share, j, s->dp, &c, s->call, share_ready, msg, sizeof(msg));
            if (err)
                end_stream(s, sl_rpc_code_from_err(err), msg);
            return;
        }
        err = sl_sample_new(&s->s, &c, msg, sizeof(msg));
    }
    indices_ready(s, err, msg);
}

/* Open a stream on the job's state. Returns SL_ENOTFOUND, without answering, when this replica
 * has no such job (the caller answers: job_missing), else 0 (answered or streaming). */
static int stream_start(sl_rpc_call *call, int batches, const char *job, uint32_t rank,
                        int has_epoch, uint64_t epoch, int has_pos, int group, uint64_t pos,
                        uint32_t chunk, sl_feed *f)
{
    fstream *s;
    fjob *j;
    char msg[256];
    uint32_t dp;
    int err;

    if (f->shutting_down) {
        sl_rpc_call_finish(call, SL_RPC_UNAVAILABLE, "server shutting down");
        return 0;
    }
    if (sl_name_check("job", job, msg, sizeof(msg)) != 0) {
        sl_rpc_call_fail(call, SL_EINVAL, "%s", msg);
        return 0;
    }
    j = feed_job_find(f, job);
    /* Another replica may have made, resized or restored it, begun the epoch asked for or
     * recorded the progress a stream resumes from a moment ago, before its announcement
     * arrived here: with a shared catalog a stream opens on the catalog's state of the job (on
     * this replica's copy while the catalog is away). */
    if ((!j || (has_epoch && epoch > j->epoch) || sl_cat_shared(f->cat)) &&
        (err = feed_job_current(f, job, &j)) != 0) {
        sl_rpc_call_fail(call, err, "job '%s': %s", job, sl_strerror(err));
        return 0;
    }
    if (!j)
        return SL_ENOTFOUND; /* or its load waits for its labels: job_missing */
    if (sl_rpc_call_claim(call, "feed", job, "job") != 0)
        return 0;
    if (batches && !j->spec->batching) {
        sl_rpc_call_fail(call, SL_ESTATE, "job '%s' has no batching config", job);
        return 0;
    }
    if (!batches && j->spec->batching) {
        sl_rpc_call_fail(call, SL_ESTATE, "job '%s' streams batches: use StreamBatches", job);
        return 0;
    }
    if ((err = feed_job_dp_rank(j, rank, &dp, msg, sizeof(msg))) != 0) {
        sl_rpc_call_fail(call, err, "%s", msg);
        return 0;
    }
    if (!has_epoch)
        epoch = j->epoch;
    if (epoch < j->epoch) {
        sl_rpc_call_fail(call, SL_ESTATE, "epoch %llu of job '%s' is over (current epoch %llu)",
                         (unsigned long long)epoch, job, (unsigned long long)j->epoch);
        return 0;
    }
    if (epoch > j->epoch + 1) {
        sl_rpc_call_fail(call, SL_ESTATE,
                         "epoch %llu of job '%s' is more than one ahead of the current epoch %llu",
                         (unsigned long long)epoch, job, (unsigned long long)j->epoch);
        return 0;
    }
    s = calloc(1, sizeof(*s));
    if (!s) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        return 0;
    }
    s->f = f;
    s->call = call;
    s->batches = batches;
    s->rank = rank;
    s->epoch = epoch;
    s->has_pos = has_pos;
    s->group = group;
    s->pos = pos;
    s->chunk = chunk;
    s->job = j;
    s->next = j->streams;
    if (j->streams)
        j->streams->prev = s;
    j->streams = s;
    sl_rpc_call_set_data(call, s, stream_free);
    if (epoch == j->epoch) {
        stream_begin(s);
    } else {
        s->state = ST_WAIT_EPOCH;
        sl_log_debug("stream_waits", "job=%s rank=%u epoch=%llu", job, rank,
                     (unsigned long long)epoch);
    }
    return 0;
}

/* stream_start found no job: if its load waits for its labels, park the call (h runs again on
 * m once they are read), else NOT_FOUND. */
static void job_missing(sl_rpc_call *call, const ProtobufCMessage *m, feed_handler h, sl_feed *f,
                        const char *job)
{
    int r = feed_labels_park_job(f, job, call, m, h, f);

    if (r < 0)
        sl_rpc_call_fail(call, r, "out of memory");
    else if (r == 0)
        sl_rpc_call_fail(call, SL_ENOTFOUND, "job '%s' not found", job);
}

static void indices_start(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    const Sluice__V1__StreamIndicesRequest *req = (const void *)m;
    uint32_t chunk = req->max_chunk ? req->max_chunk : DEFAULT_CHUNK;

    if (chunk > MAX_CHUNK) {
        sl_rpc_call_fail(call, SL_EINVAL, "max_chunk %u out of range [1, %u]", req->max_chunk,
                         MAX_CHUNK);
        return;
    }
    if (stream_start(call, 0, req->job, req->rank, req->epoch_set, req->epoch, req->position_set,
                     req->group_position, req->position, chunk, arg) == SL_ENOTFOUND)
        job_missing(call, m, indices_start, arg, req->job);
}

static void batches_start(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    const Sluice__V1__StreamBatchesRequest *req = (const void *)m;
    uint32_t chunk = req->max_batches ? req->max_batches : DEFAULT_BATCH_CHUNK;

    if (chunk > MAX_BATCH_CHUNK) {
        sl_rpc_call_fail(call, SL_EINVAL, "max_batches %u out of range [1, %u]", req->max_batches,
                         MAX_BATCH_CHUNK);
        return;
    }
    if (stream_start(call, 1, req->job, req->rank, req->epoch_set, req->epoch, req->step_set,
                     req->group_position, req->step, chunk, arg) == SL_ENOTFOUND)
        job_missing(call, m, batches_start, arg, req->job);
}

static void on_writable(sl_rpc_call *call, void *arg)
{
    fstream *s = sl_rpc_call_data(call);

    (void)arg;
    if (s)
        pump(s);
}

void feed_streams_end(fjob *j, int all, sl_rpc_code code, const char *why)
{
    fstream *s = j->streams;

    while (s) {
        fstream *next = s->next;
        if (all || s->epoch == j->epoch) {
            if (s->state != ST_DONE)
                end_stream(s, code, why);
            detach(s);
        }
        s = next;
    }
}

void feed_streams_epoch_began(fjob *j)
{
    fstream *s = j->streams;

    while (s) {
        fstream *next = s->next;
        if (s->state == ST_WAIT_EPOCH && s->epoch == j->epoch)
            stream_begin(s);
        s = next;
    }
}

static void on_shutdown(void *arg)
{
    sl_feed *f = arg;

    f->shutting_down = 1;
    for (fjob *j = f->jobs; j; j = j->next)
        feed_streams_end(j, 1, SL_RPC_UNAVAILABLE, "server shutting down");
}

static const sl_rpc_method methods[] = {
    {
        .name = "StreamIndices",
        .kind = SL_RPC_SERVER_STREAM,
        .access = FEED_ACCESS_READER,
        .request = &sluice__v1__stream_indices_request__descriptor,
        .response = &sluice__v1__index_chunk__descriptor,
        .on_start = indices_start,
        .on_writable = on_writable,
        .send_budget = SEND_BYTES,
    },
    {
        .name = "StreamBatches",
        .kind = SL_RPC_SERVER_STREAM,
        .access = FEED_ACCESS_READER,
        .request = &sluice__v1__stream_batches_request__descriptor,
        .response = &sluice__v1__batch_chunk__descriptor,
        .on_start = batches_start,
        .on_writable = on_writable,
        .send_budget = SEND_BYTES,
    },
};

const sl_rpc_service *feed_stream_service(sl_feed *f)
{
    f->svcs[3] = (sl_rpc_service){
        .name = "sluice.v1.Feed",
        .methods = methods,
        .n_methods = sizeof(methods) / sizeof(methods[0]),
        .arg = f,
        .on_shutdown = on_shutdown,
    };
    return &f->svcs[3];
}
