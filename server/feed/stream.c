/* sluice.v1.Feed: each rank's index stream and batch stream.
 *
 * A stream produces its next chunks only when the RPC layer's send queue has room (on_writable),
 * and keeps at most QUEUE_DEPTH chunks queued, so a slow client slows production and memory per
 * stream stays at a few hundred KiB. Index chunks are computed from (seed, epoch, rank, position)
 * with sl_sample_fill; batch chunks are slices of the epoch's plan, which is computed once per
 * (job, epoch) on the worker pool and shared by every rank.
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
    uint64_t *buf;
    Sluice__V1__Batch *bmsgs;
    Sluice__V1__Batch **bptrs;
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
    free(s->buf);
    free(s->bmsgs);
    free(s->bptrs);
    free(s);
}

static void end_stream(fstream *s, sl_rpc_code code, const char *why)
{
    s->state = ST_DONE;
    sl_rpc_call_finish(s->call, code, "%s", why);
}

static int queue_room(fstream *s)
{
    int room = sl_rpc_call_send_room(s->call);

    return room - (s->window - QUEUE_DEPTH);
}

static void pump_indices(fstream *s)
{
    Sluice__V1__IndexChunk msg = SLUICE__V1__INDEX_CHUNK__INIT;
    int burst = 0;

    while (s->state == ST_STREAMING && s->pos < s->end && queue_room(s) > 0 &&
           burst++ < PUMP_BURST) {
        uint64_t n = s->end - s->pos < s->chunk ? s->end - s->pos : s->chunk;
        if (sl_sample_fill(s->buf, s->s, s->pos, (size_t)n) != 0) {
            end_stream(s, SL_RPC_INTERNAL, "sampler failed");
            return;
        }
        msg.epoch = s->epoch;
        msg.start = s->pos;
        msg.indices = s->buf;
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

static void pump_batches(fstream *s)
{
    Sluice__V1__BatchChunk msg = SLUICE__V1__BATCH_CHUNK__INIT;

    while (s->state == ST_STREAMING && s->pos < s->end && queue_room(s) > 0) {
        uint64_t n = s->end - s->pos < s->chunk ? s->end - s->pos : s->chunk;
        for (uint64_t i = 0; i < n; i++) {
            sl_batch b;
            if (sl_batch_plan_get(s->plan->plan, s->dp, s->pos + i, &b) != 0) {
                end_stream(s, SL_RPC_INTERNAL, "batch plan lookup failed");
                return;
            }
            sluice__v1__batch__init(&s->bmsgs[i]);
            s->bmsgs[i].step = s->pos + i;
            s->bmsgs[i].indices = (uint32_t *)b.indices;
            s->bmsgs[i].n_indices = b.count;
            s->bmsgs[i].max_len = b.max_len;
            s->bmsgs[i].tokens = b.tokens;
            s->bmsgs[i].padded_tokens = b.padded_tokens;
            s->bptrs[i] = &s->bmsgs[i];
        }
        msg.epoch = s->epoch;
        msg.batches = s->bptrs;
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
    s->end = sl_batch_plan_batches_per_rank(s->plan->plan);
    s->bmsgs = calloc(s->chunk, sizeof(*s->bmsgs));
    s->bptrs = calloc(s->chunk, sizeof(*s->bptrs));
    if (!s->bmsgs || !s->bptrs) {
        end_stream(s, SL_RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    (void)j;
    stream_go(s);
}

/* The share's sampler exists (or failed): allocate the chunk buffer and start. */
static void indices_ready(fstream *s, int err, const char *why)
{
    char msg[256];

    snprintf(msg, sizeof(msg), "%s", why);
    if (!err) {
        s->buf = malloc(sizeof(*s->buf) * s->chunk);
        if (!s->buf) {
            err = -ENOMEM;
            snprintf(msg, sizeof(msg), "out of memory");
        }
    }
    if (err) {
        end_stream(s, sl_rpc_code_from_err(err), msg);
        return;
    }
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

/* torch mode builds an O(N) permutation: do it on the worker pool, not on the loop. */
static void share_work(uv_work_t *w)
{
    fshare *sh = w->data;

    sh->err = sl_sample_new(&sh->s, &sh->cfg, sh->msg, sizeof(sh->msg));
}

static void share_done(uv_work_t *w, int status)
{
    fshare *sh = w->data;

    if (status != 0 && !sh->err) {
        sh->err = SL_ECANCELLED;
        snprintf(sh->msg, sizeof(sh->msg), "cancelled");
    }
    sh->state = sh->err ? -1 : 1;
    /* The streams waiting for it may belong to an epoch that has ended since: look for them
     * in every job rather than through the job's current shares. */
    for (fjob *j = sh->f->jobs; j; j = j->next) {
        fstream *s = j->streams;
        while (s) {
            fstream *next = s->next;
            if (s->state == ST_WAIT_SAMPLE && s->share == sh)
                share_attach(s);
            s = next;
        }
    }
    fshare_unref(sh);
}

/* Attach the stream to its dp rank's shared torch-mode share, building it if needed. */
static void share_request(fstream *s, const sl_sample_config *cfg)
{
    fjob *j = s->job;
    fshare *sh;

    if (!j->shares && !(j->shares = calloc(j->dp_size, sizeof(*j->shares)))) {
        end_stream(s, SL_RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    sh = j->shares[s->dp];
    if (!sh) {
        sh = calloc(1, sizeof(*sh));
        if (!sh) {
            end_stream(s, SL_RPC_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        sh->refs = 2; /* the job's and the worker's */
        sh->f = s->f;
        sh->cfg = *cfg;
        sh->work.data = sh;
        if (uv_queue_work(s->f->loop, &sh->work, share_work, share_done) != 0) {
            free(sh);
            end_stream(s, SL_RPC_UNAVAILABLE, "cannot queue work");
            return;
        }
        j->shares[s->dp] = sh;
    }
    s->share = sh;
    sh->refs++;
    if (sh->state == 0) {
        s->state = ST_WAIT_SAMPLE;
        return;
    }
    share_attach(s);
}

/* The stream's epoch is the job's current epoch: build the share and start. */
static void stream_begin(fstream *s)
{
    fjob *j = s->job;
    char msg[256] = ""; /* indices_ready copies it even on success */
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
        if (s->plan->state == 0) {
            s->state = ST_WAIT_PLAN;
            return;
        }
        start_batches(s);
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
            share_request(s, &c);
            return;
        }
        err = sl_sample_new(&s->s, &c, msg, sizeof(msg));
    }
    indices_ready(s, err, msg);
}

static void stream_start(sl_rpc_call *call, int batches, const char *job, uint32_t rank,
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
        return;
    }
    if (feed_name_check("job", job, msg, sizeof(msg)) != 0) {
        sl_rpc_call_fail(call, SL_EINVAL, "%s", msg);
        return;
    }
    j = feed_job_find(f, job);
    if (!j) {
        sl_rpc_call_fail(call, SL_ENOTFOUND, "job '%s' not found", job);
        return;
    }
    if (sl_rpc_call_claim(call, job, "job") != 0)
        return;
    if (batches && !j->spec->batching) {
        sl_rpc_call_fail(call, SL_ESTATE, "job '%s' has no batching config", job);
        return;
    }
    if (!batches && j->spec->batching) {
        sl_rpc_call_fail(call, SL_ESTATE, "job '%s' streams batches: use StreamBatches", job);
        return;
    }
    if ((err = feed_job_dp_rank(j, rank, &dp, msg, sizeof(msg))) != 0) {
        sl_rpc_call_fail(call, err, "%s", msg);
        return;
    }
    if (!has_epoch)
        epoch = j->epoch;
    if (epoch < j->epoch) {
        sl_rpc_call_fail(call, SL_ESTATE, "epoch %llu of job '%s' is over (current epoch %llu)",
                         (unsigned long long)epoch, job, (unsigned long long)j->epoch);
        return;
    }
    if (epoch > j->epoch + 1) {
        sl_rpc_call_fail(call, SL_ESTATE,
                         "epoch %llu of job '%s' is more than one ahead of the current epoch %llu",
                         (unsigned long long)epoch, job, (unsigned long long)j->epoch);
        return;
    }
    s = calloc(1, sizeof(*s));
    if (!s) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        return;
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
    stream_start(call, 0, req->job, req->rank, req->epoch_set, req->epoch, req->position_set,
                 req->group_position, req->position, chunk, arg);
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
    stream_start(call, 1, req->job, req->rank, req->epoch_set, req->epoch, req->step_set,
                 req->group_position, req->step, chunk, arg);
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

void feed_streams_plan_ready(fjob *j, const fplan *p)
{
    fstream *s = j->streams;

    while (s) {
        fstream *next = s->next;
        if (s->state == ST_WAIT_PLAN && s->plan == p)
            start_batches(s);
        s = next;
    }
}

/* ---- batch plans on the worker pool ---- */

int feed_read_lengths(uint32_t **out, const char *path, uint64_t n, const char *sha256, char *msg,
                      size_t len)
{
    uint32_t *v = NULL;
    uint8_t *raw;
    sl_sha256 *h = NULL;
    char hex[SL_SHARD_HEX_LEN + 1];
    struct stat stt;
    size_t got = 0, bytes = (size_t)n * 4;
    int fd = open(path, O_RDONLY | O_CLOEXEC), err = 0;

    *out = NULL;
    /* 4 * n must not wrap: a count of 2^62 + 5 would otherwise match a 20-byte file. */
    if (n > SIZE_MAX / 4) {
        err = SL_ECORRUPT;
        snprintf(msg, len, "%llu lengths do not fit in memory", (unsigned long long)n);
        goto out;
    }
    if (fd < 0 || fstat(fd, &stt) != 0) {
        err = -errno;
        snprintf(msg, len, "cannot open the lengths file: %s", sl_strerror(err));
        goto out;
    }
    if ((uint64_t)stt.st_size != (uint64_t)bytes) {
        err = SL_ECORRUPT;
        snprintf(msg, len, "lengths file has %lld bytes, expected %zu", (long long)stt.st_size,
                 bytes);
        goto out;
    }
    v = malloc(bytes ? bytes : 4);
    if (!v) {
        err = -ENOMEM;
        snprintf(msg, len, "out of memory for %zu lengths", (size_t)n);
        goto out;
    }
    raw = (uint8_t *)v;
    while (got < bytes) {
        ssize_t r = read(fd, raw + got, bytes - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            err = r < 0 ? -errno : SL_ECORRUPT;
            snprintf(msg, len, "cannot read the lengths file: %s", sl_strerror(err));
            goto out;
        }
        got += (size_t)r;
    }
    if ((err = sl_sha256_new(&h)) != 0 || (err = sl_sha256_reset(h)) != 0 ||
        (err = sl_sha256_update(h, raw, bytes)) != 0 || (err = sl_sha256_final(h, hex)) != 0) {
        snprintf(msg, len, "hashing failed");
        goto out;
    }
    if (strcmp(hex, sha256) != 0) {
        err = SL_ECORRUPT;
        snprintf(msg, len, "lengths file checksum %s does not match the catalog's %s", hex, sha256);
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        v[i] = (uint32_t)raw[4 * i] | (uint32_t)raw[4 * i + 1] << 8 |
               (uint32_t)raw[4 * i + 2] << 16 | (uint32_t)raw[4 * i + 3] << 24;
out:
    if (fd >= 0)
        close(fd);
    sl_sha256_free(h);
    if (err)
        free(v);
    else
        *out = v;
    return err;
}

static void plan_work(uv_work_t *w)
{
    fplan *p = w->data;
    uint32_t *lengths = NULL;
    uint64_t *order = NULL;
    uint64_t n = p->scfg.samples;

    p->err = feed_read_lengths(&lengths, p->path, n, p->sha256, p->msg, sizeof(p->msg));
    if (p->err)
        goto out;
    order = malloc(sizeof(*order) * n);
    if (!order) {
        p->err = -ENOMEM;
        snprintf(p->msg, sizeof(p->msg), "out of memory for the epoch order");
        goto out;
    }
    p->err = sl_sample_epoch_order(order, n, p->scfg.shuffle, p->scfg.seed, p->scfg.epoch);
    if (p->err) {
        snprintf(p->msg, sizeof(p->msg), "epoch order failed: %s", sl_strerror(p->err));
        goto out;
    }
    p->err = sl_batch_plan_new(&p->plan, &p->cfg, lengths, (size_t)n, order, (size_t)n, p->msg,
                               sizeof(p->msg));
out:
    free(lengths);
    free(order);
}

static void plan_done(uv_work_t *w, int status)
{
    fplan *p = w->data;
    fjob *j = p->job;

    if (status != 0 && !p->err) {
        p->err = SL_ECANCELLED;
        snprintf(p->msg, sizeof(p->msg), "planning cancelled");
    }
    p->state = p->err ? -1 : 1;
    if (p->err)
        sl_log_warn("batch_plan_failed", "epoch=%llu error=\"%s\"", (unsigned long long)p->epoch,
                    p->msg);
    else
        sl_log_info("batch_plan_ready", "epoch=%llu batches_per_rank=%llu",
                    (unsigned long long)p->epoch,
                    (unsigned long long)sl_batch_plan_batches_per_rank(p->plan));
    /* Streams waiting for it may belong to an epoch that has ended since (Epochs.Next): look
     * in every job, not only through the job's current plan. */
    for (fjob *k = p->f->jobs; k; k = k->next)
        feed_streams_plan_ready(k, p);
    for (size_t i = 0; i < p->n_waiters; i++) {
        p->waiters[i].cb(p->waiters[i].call, p->f, p->job_name);
        sl_rpc_call_unref(p->waiters[i].call);
    }
    free(p->waiters);
    p->waiters = NULL;
    p->n_waiters = 0;
    if (j) {
        /* Reports recorded before the plan existed may already complete the epoch. */
        if (p->state == 1 && !j->spec->manual_advance && feed_job_complete(j))
            feed_job_advance(j);
    }
    fplan_unref(p);
}

int feed_plan_request(fjob *j, char *msg, size_t len)
{
    sl_cat_dataset d;
    fplan *p;
    int err;

    if (j->plan && j->plan->state >= 0)
        return 0;
    if (j->plan) {
        /* A failed plan is retried (the lengths may have been uploaded since). */
        j->plan->job = NULL;
        fplan_unref(j->plan);
        j->plan = NULL;
    }
    err = sl_cat_dataset_get(j->feed->cat, &d, j->dataset);
    if (err) {
        snprintf(msg, len, "dataset '%s': %s", j->dataset, sl_strerror(err));
        return err;
    }
    if (!d.has_lengths) {
        snprintf(msg, len, "dataset '%s' has no lengths: upload them first", j->dataset);
        return SL_ESTATE;
    }
    p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    err = feed_spec_batch_config(&p->cfg, j->spec, j->dp_size, j->cfg.seed, j->epoch, msg, len);
    if (!err)
        err = feed_lengths_path(j->feed, j->dataset, p->path, sizeof(p->path));
    if (err) {
        free(p);
        return err;
    }
    p->scfg = j->cfg;
    p->epoch = j->epoch;
    p->f = j->feed;
    snprintf(p->job_name, sizeof(p->job_name), "%s", j->name);
    snprintf(p->sha256, sizeof(p->sha256), "%s", d.lengths_sha256);
    p->refs = 2; /* the job's and the worker's */
    p->job = j;
    p->work.data = p;
    err = uv_queue_work(j->feed->loop, &p->work, plan_work, plan_done);
    if (err) {
        free(p);
        snprintf(msg, len, "cannot queue the batch plan");
        return SL_EUNAVAILABLE;
    }
    j->plan = p;
    return 0;
}

int feed_plan_wait(fjob *j, sl_rpc_call *call, feed_plan_cb cb, char *msg, size_t len)
{
    fwaiter *w;
    fplan *p;
    int err = feed_plan_request(j, msg, len);

    if (err)
        return err;
    p = j->plan;
    if (p->state != 0) {
        cb(call, j->feed, j->name);
        return 0;
    }
    w = realloc(p->waiters, (p->n_waiters + 1) * sizeof(*w));
    if (!w) {
        snprintf(msg, len, "out of memory");
        return -ENOMEM;
    }
    p->waiters = w;
    w[p->n_waiters].call = call;
    w[p->n_waiters].cb = cb;
    p->n_waiters++;
    sl_rpc_call_ref(call);
    return 0;
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
    },
    {
        .name = "StreamBatches",
        .kind = SL_RPC_SERVER_STREAM,
        .access = FEED_ACCESS_READER,
        .request = &sluice__v1__stream_batches_request__descriptor,
        .response = &sluice__v1__batch_chunk__descriptor,
        .on_start = batches_start,
        .on_writable = on_writable,
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
