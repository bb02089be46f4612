/* sluice.v1.Jobs and sluice.v1.Epochs. */
#include "internal.h"

#include "err.h"
#include "log.h"
#include "util/clock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* A new job's first version: random below 2^62 (increments never reach 2^63), so that a job
 * deleted and made again under the same name through one replica never has a version another
 * replica's copy of the old job holds; that copy would look current and keep the old job's
 * dataset and settings (sync.c compares versions). A clock-and-pid mix if the kernel has no
 * randomness to give. */
static uint64_t first_version(void)
{
    uint64_t v;

    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v))
        v = sl_mono_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)sl_now_ms() << 20;
    return v >> 2;
}

/* The job as the Jobs service describes it (borrowing the job's strings and arrays). */
static void describe(const fjob *j, Sluice__V1__Job *out, Sluice__V1__Mesh *mesh,
                     Sluice__V1__BatchConfig *bc)
{
    const Sluice__V1__Job *s = j->spec;

    sluice__v1__job__init(out);
    out->name = (char *)j->name;
    out->dataset = (char *)j->dataset;
    out->world_size = s->world_size;
    if (feed_mesh_set(s->mesh)) {
        sluice__v1__mesh__init(mesh);
        mesh->dp = s->mesh->dp;
        mesh->tp = s->mesh->tp;
        mesh->cp = s->mesh->cp;
        mesh->pp = s->mesh->pp;
        mesh->order = s->mesh->order ? s->mesh->order : (char *)"";
        out->mesh = mesh;
    }
    out->partition = (char *)sl_sample_partition_name(j->cfg.partition);
    out->chunk_size = j->cfg.partition == SL_SAMPLE_CHUNKED ? j->cfg.chunk_size : 0;
    out->shuffle = (char *)sl_sample_shuffle_name(j->cfg.shuffle);
    out->seed = s->seed;
    out->drop_last = s->drop_last;
    out->manual_advance = s->manual_advance;
    out->stratify = s->stratify;
    out->balance_classes = s->balance_classes;
    out->class_weights = s->class_weights;
    out->n_class_weights = s->n_class_weights;
    out->epoch_length = s->epoch_length;
    out->rank_weights = s->rank_weights;
    out->n_rank_weights = s->n_rank_weights;
    if (s->batching) {
        *bc = *s->batching;
        out->batching = bc;
    }
    out->epoch = j->epoch;
    out->created_ms = (uint64_t)j->created_ms;
    out->dp_size = j->dp_size;
    out->resized_in_epoch = j->chain != NULL; /* batch jobs build j->src only once streamed */
}

static void reply_job(sl_rpc_call *call, const fjob *j)
{
    Sluice__V1__Job out;
    Sluice__V1__Mesh mesh;
    Sluice__V1__BatchConfig bc;

    describe(j, &out, &mesh, &bc);
    sl_rpc_call_reply(call, &out.base);
}

/* A call parked while its job resizes (feed_job_resize_start), or a Resize in flight: its
 * handler runs again on a copy of its request. */
typedef struct jparked {
    feed_handler h;
    void *arg;
    const ProtobufCMessageDescriptor *desc;
    size_t len;
    uint8_t bytes[];
} jparked;

/* Keep a copy of m and h as the call's data, for parked_run. */
static int park(sl_rpc_call *call, const ProtobufCMessage *m, feed_handler h, void *arg)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    jparked *p = malloc(sizeof(*p) + n);

    if (!p)
        return -ENOMEM;
    p->h = h;
    p->arg = arg;
    p->desc = m->descriptor;
    p->len = protobuf_c_message_pack(m, p->bytes);
    sl_rpc_call_set_data(call, p, free);
    return 0;
}

/* Run a parked call's handler again (feed_ready_cb). */
static void parked_run(sl_rpc_call *call, sl_feed *f, const char *job)
{
    jparked *p = sl_rpc_call_data(call);
    ProtobufCMessage *m;

    (void)job;
    sl_rpc_call_set_data(call, NULL, NULL);
    if (!p || sl_rpc_call_is_done(call))
        goto out;
    if (f->shutting_down) {
        sl_rpc_call_finish(call, SL_RPC_UNAVAILABLE, "server shutting down");
    } else if (!(m = protobuf_c_message_unpack(p->desc, NULL, p->len, p->bytes))) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
    } else {
        p->h(call, m, p->arg);
        protobuf_c_message_free_unpacked(m, NULL);
    }
out:
    free(p);
}

/* Look a job up by a request's name: NOT_FOUND / INVALID_ARGUMENT are answered here. A job
 * whose load waits for its labels (read on the worker pool) parks the call: handler h runs again
 * on m once they are read; so does a job whose Resize is being built, once it ends (its calls
 * see the job before or after it, never in between). NULL when answered or parked. */
static fjob *job_or_fail(sl_rpc_call *call, const ProtobufCMessage *m, feed_handler h, sl_feed *f,
                         const char *name, int fresh)
{
    char msg[256];
    fjob *j;
    int err;

    if (sl_name_check("job", name, msg, sizeof(msg)) != 0) {
        sl_rpc_call_fail(call, SL_EINVAL, "%s", msg);
        return NULL;
    }
    j = feed_job_find(f, name);
    /* Another replica may have made, changed or advanced it a moment ago, before its
     * announcement arrived here: with a shared catalog a `fresh` call sees the catalog's state
     * (reports, the frequent call, only read it on a miss; the group commit checks them). */
    if (fresh && sl_cat_shared(f->cat))
        err = feed_job_current(f, name, &j);
    else
        err = j ? 0 : feed_job_refresh(f, name, &j);
    if (err) {
        sl_rpc_call_fail(call, err, "job '%s': %s", name, sl_strerror(err));
        return NULL;
    }
    if (!j && (err = feed_labels_park_job(f, name, call, m, h, f)) <= 0) {
        if (err)
            sl_rpc_call_fail(call, err, "out of memory");
        else
            sl_rpc_call_fail(call, SL_ENOTFOUND, "job '%s' not found", name);
    }
    if (j && j->resizing) {
        if (park(call, m, h, f) != 0) {
            sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        } else if (feed_job_resize_park(j, call, parked_run) != 0) {
            free(sl_rpc_call_data(call));
            sl_rpc_call_set_data(call, NULL, NULL);
            sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        }
        return NULL;
    }
    return j;
}

static void job_create(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    const Sluice__V1__CreateJobRequest *req = (const void *)m;
    const Sluice__V1__Job *in = req->job;
    Sluice__V1__Job *spec = NULL;
    sl_feed *f = arg;
    sl_cat_dataset d;
    sl_sample_config cfg;
    sl_batch_config bc;
    sl_cat_job row;
    uint8_t *buf = NULL;
    size_t len;
    uint32_t dp, dp_size;
    char msg[320];
    fjob *j = NULL;
    flabels *labels = NULL;
    int err;

    if (!in) {
        sl_rpc_call_fail(call, SL_EINVAL, "missing job");
        return;
    }
    if ((err = sl_name_check("job", in->name, msg, sizeof(msg))) != 0 ||
        (err = sl_name_check("dataset", in->dataset, msg, sizeof(msg))) != 0)
        goto fail;
    if (feed_job_find(f, in->name)) {
        err = SL_EEXIST;
        snprintf(msg, sizeof(msg), "job '%s' already exists", in->name);
        goto fail;
    }
    err = sl_cat_dataset_get(f->cat, &d, in->dataset);
    if (err) {
        snprintf(msg, sizeof(msg), "dataset '%s': %s", in->dataset, sl_strerror(err));
        goto fail;
    }
    if (feed_spec_wants_labels(in) && !d.has_labels) {
        err = SL_ESTATE;
        snprintf(msg, sizeof(msg),
                 "%s needs labels: dataset '%s' has none (upload them with `sluice dataset "
                 "labels`)",
                 in->stratify ? "stratify" : "class-balanced epochs", in->dataset);
        goto fail;
    }
    /* Labels not in memory yet are read on the worker pool (O(N)): the call waits for them
     * parked, and this handler runs again once they are read (or failed). */
    if (feed_spec_wants_labels(in) &&
        (err = feed_labels_get(&labels, f, in->dataset, msg, sizeof(msg))) != 0) {
        if (err != FEED_PENDING)
            goto fail;
        err = feed_labels_park(labels, call, m, job_create, f);
        flabels_unref(f, labels);
        labels = NULL;
        if (!err)
            return;
        snprintf(msg, sizeof(msg), "out of memory");
        goto fail;
    }
    if ((err = feed_spec_config(&cfg, in, flabels_of(labels), d.samples, 0, msg, sizeof(msg))) != 0)
        goto fail;
    if ((err = sl_sample_dp_rank(&dp, &dp_size, &cfg, msg, sizeof(msg))) != 0)
        goto fail;
    if (in->batching &&
        (err = feed_spec_batch_config(&bc, in, dp_size, in->seed, 0, msg, sizeof(msg))) != 0)
        goto fail;
    if (in->batching && d.samples > SL_BATCH_MAX_SEQUENCES) {
        err = SL_ELIMIT;
        snprintf(msg, sizeof(msg), "batching supports at most %u samples, dataset has %llu",
                 SL_BATCH_MAX_SEQUENCES, (unsigned long long)d.samples);
        goto fail;
    }
    if (in->batching && in->epoch_length > SL_BATCH_MAX_SEQUENCES) {
        err = SL_ELIMIT;
        snprintf(msg, sizeof(msg), "epoch_length %llu of a batch job over the limit %u",
                 (unsigned long long)in->epoch_length, SL_BATCH_MAX_SEQUENCES);
        goto fail;
    }
    /* Store the spec without the output-only fields. */
    {
        Sluice__V1__Job copy = *in;
        copy.epoch = 0;
        copy.created_ms = 0;
        copy.dp_size = 0;
        copy.resized_in_epoch = 0;
        len = sluice__v1__job__get_packed_size(&copy);
        buf = malloc(len ? len : 1);
        if (!buf) {
            err = -ENOMEM;
            snprintf(msg, sizeof(msg), "out of memory");
            goto fail;
        }
        sluice__v1__job__pack(&copy, buf);
    }
    spec = sluice__v1__job__unpack(NULL, len, buf);
    if (!spec) {
        err = -ENOMEM;
        snprintf(msg, sizeof(msg), "out of memory");
        goto fail;
    }
    memset(&row, 0, sizeof(row));
    row.name = in->name;
    row.dataset = in->dataset;
    row.spec = buf;
    row.spec_len = len;
    row.world_size = in->world_size;
    row.created_ms = sl_now_ms();
    row.version = first_version();
    err = sl_cat_job_create(f->cat, &row);
    if (err == SL_EEXIST) {
        char other[SL_CAT_FEED_NAME_MAX + 1];
        if (sl_cat_name_clash(f->cat, SL_CAT_NAME_JOB, NULL, in->name, other, sizeof(other)) ==
            SL_EEXIST)
            snprintf(msg, sizeof(msg),
                     "job '%s' differs only in case from the existing job '%s' (names are "
                     "case-insensitive)",
                     in->name, other);
        else
            snprintf(msg, sizeof(msg), "job '%s': already exists", in->name);
        goto fail;
    }
    if (err) {
        snprintf(msg, sizeof(msg), "job '%s': %s", in->name, sl_strerror(err));
        goto fail;
    }
    err = feed_job_add(f, &j, in->name, in->dataset, spec, d.samples, 0, row.created_ms, NULL, 0,
                       msg, sizeof(msg));
    spec = NULL;
    if (err == FEED_PENDING) { /* other labels recorded meanwhile: it is loaded once read */
        err = SL_EUNAVAILABLE;
        snprintf(msg, sizeof(msg), "job '%s' created; its dataset's labels changed meanwhile",
                 in->name);
    }
    if (err)
        goto fail;
    j->version = row.version;
    sl_log_info("job_created", "job=%s dataset=%s world=%u partition=%s shuffle=%s", j->name,
                j->dataset, j->spec->world_size, sl_sample_partition_name(j->cfg.partition),
                sl_sample_shuffle_name(j->cfg.shuffle));
    free(buf);
    flabels_unref(f, labels);
    reply_job(call, j);
    return;
fail:
    if (spec)
        sluice__v1__job__free_unpacked(spec, NULL);
    free(buf);
    flabels_unref(f, labels);
    sl_rpc_call_fail(call, err, "%s", msg);
}

static void job_get(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    const Sluice__V1__GetJobRequest *req = (const void *)m;
    fjob *j = job_or_fail(call, m, job_get, arg, req->name, 1);

    if (j)
        reply_job(call, j);
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(fjob *const *)a)->name, (*(fjob *const *)b)->name);
}

static void job_list(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    const Sluice__V1__ListJobsRequest *req = (const void *)m;
    Sluice__V1__ListJobsResponse resp = SLUICE__V1__LIST_JOBS_RESPONSE__INIT;
    sl_feed *f = arg;
    size_t n = 0, k = 0;
    fjob **js = NULL;
    Sluice__V1__Job *msgs = NULL, **ptrs = NULL;
    Sluice__V1__Mesh *meshes = NULL;
    Sluice__V1__BatchConfig *bcs = NULL;

    for (fjob *j = f->jobs; j; j = j->next)
        n++;
    js = calloc(n + 1, sizeof(*js));
    msgs = calloc(n + 1, sizeof(*msgs));
    ptrs = calloc(n + 1, sizeof(*ptrs));
    meshes = calloc(n + 1, sizeof(*meshes));
    bcs = calloc(n + 1, sizeof(*bcs));
    if (!js || !msgs || !ptrs || !meshes || !bcs) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        goto out;
    }
    for (fjob *j = f->jobs; j; j = j->next)
        if (!req->dataset[0] || strcmp(req->dataset, j->dataset) == 0)
            js[k++] = j;
    qsort(js, k, sizeof(*js), cmp_name);
    for (size_t i = 0; i < k; i++) {
        describe(js[i], &msgs[i], &meshes[i], &bcs[i]);
        ptrs[i] = &msgs[i];
    }
    resp.n_jobs = k;
    resp.jobs = ptrs;
    sl_rpc_call_reply(call, &resp.base);
out:
    free(js);
    free(msgs);
    free(ptrs);
    free(meshes);
    free(bcs);
}

static void job_delete(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    const Sluice__V1__DeleteJobRequest *req = (const void *)m;
    Sluice__V1__DeleteJobResponse resp = SLUICE__V1__DELETE_JOB_RESPONSE__INIT;
    sl_feed *f = arg;
    fjob *j = job_or_fail(call, m, job_delete, f, req->name, 1);
    int err;

    if (!j)
        return;
    err = sl_cat_job_delete(f->cat, j->name);
    if (err) {
        sl_rpc_call_fail(call, err, "job '%s': %s", req->name, sl_strerror(err));
        return;
    }
    sl_log_info("job_deleted", "job=%s", j->name);
    feed_job_remove(f, j, SL_RPC_ABORTED, "job deleted");
    sl_rpc_call_reply(call, &resp.base);
}

/* A Resize built on the worker pool ended (feed_resize_cb). */
static void resize_ended(sl_rpc_call *call, sl_feed *f, const char *job, int err, const char *msg)
{
    fjob *j;

    if (err == FEED_RETRY) {
        parked_run(call, f, job); /* the job changed meanwhile: resize it as it is now */
        return;
    }
    free(sl_rpc_call_data(call));
    sl_rpc_call_set_data(call, NULL, NULL);
    if (sl_rpc_call_is_done(call))
        return;
    if (err)
        sl_rpc_call_fail(call, err, "%s", msg);
    else if ((j = feed_job_find(f, job)) != NULL)
        reply_job(call, j);
    else
        sl_rpc_call_fail(call, SL_ENOTFOUND, "job '%s' was deleted", job);
}

static void job_resize(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    const Sluice__V1__ResizeJobRequest *req = (const void *)m;
    fjob *j = job_or_fail(call, m, job_resize, arg, req->name, 1);
    char msg[320];
    int err;

    if (!j)
        return;
    /* Its request is kept, to run it again if the job changes while the chain is built. */
    if (park(call, m, job_resize, arg) != 0) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        return;
    }
    err = feed_job_resize_start(j, req->world_size, req->mesh, req->rank_weights,
                                req->n_rank_weights, call, resize_ended, msg, sizeof(msg));
    if (err == FEED_PENDING)
        return;
    free(sl_rpc_call_data(call));
    sl_rpc_call_set_data(call, NULL, NULL);
    if (err) {
        sl_rpc_call_fail(call, err, "%s", msg);
        return;
    }
    reply_job(call, j);
}

/* ---- Epochs ---- */

static void reply_epoch(sl_rpc_call *call, const fjob *j)
{
    Sluice__V1__EpochState st = SLUICE__V1__EPOCH_STATE__INIT;
    Sluice__V1__RankProgress *rp = calloc(j->dp_size, sizeof(*rp));
    Sluice__V1__RankProgress **ptrs = calloc(j->dp_size, sizeof(*ptrs));

    if (!rp || !ptrs) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        goto out;
    }
    st.job = (char *)j->name;
    st.epoch = j->epoch;
    st.dp_size = j->dp_size;
    st.unit = (char *)(j->spec->batching ? "batches" : "indices");
    for (uint32_t d = 0; d < j->dp_size; d++) {
        uint64_t n = 0;
        int known = feed_job_count(j, d, &n) == 0;
        sluice__v1__rank_progress__init(&rp[d]);
        rp[d].dp_rank = d;
        rp[d].position = j->progress[d];
        rp[d].count = n;
        rp[d].done = known && j->progress[d] >= n && j->reported[d];
        ptrs[d] = &rp[d];
    }
    st.group_position = feed_job_group_position(j);
    if (j->src && !j->spec->batching) {
        st.left_out = sl_sample_elastic_left_out_count(j->src->plan);
        st.padded = sl_sample_elastic_padded(j->src->plan);
    }
    st.n_ranks = j->dp_size;
    st.ranks = ptrs;
    st.complete = feed_job_complete(j);
    sl_rpc_call_reply(call, &st.base);
out:
    free(rp);
    free(ptrs);
}

/* The batch plan an Epochs.Get waited for is ready (or failed): answer with the counts. */
static void epoch_plan_ready(sl_rpc_call *call, sl_feed *f, const char *job)
{
    fjob *j = feed_job_find(f, job);
    char msg[256];

    if (j) {
        feed_job_batch_src(j, msg, sizeof(msg)); /* a resized batch job's shares */
        reply_epoch(call, j);
    } else {
        sl_rpc_call_fail(call, SL_ENOTFOUND, "job '%s' was deleted", job);
    }
}

static void epoch_get(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    const Sluice__V1__GetEpochRequest *req = (const void *)m;
    fjob *j = job_or_fail(call, m, epoch_get, arg, req->job, 1);
    char msg[256];

    if (!j)
        return;
    /* A batch job's share sizes come from the epoch's plan, which is computed on demand: wait
     * for it, so that a trainer knows its number of steps before it streams (len(DataLoader)
     * at setup). Without lengths there is no plan: answer with the counts unknown (0). */
    if (j->spec->batching && !(j->plan && j->plan->state == 1) &&
        feed_plan_wait(j, call, epoch_plan_ready, msg, sizeof(msg)) == 0)
        return;
    feed_job_batch_src(j, msg, sizeof(msg)); /* a resized batch job's shares */
    reply_epoch(call, j);
}

static void epoch_report(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    const Sluice__V1__ReportProgressRequest *req = (const void *)m;
    Sluice__V1__ReportProgressResponse resp = SLUICE__V1__REPORT_PROGRESS_RESPONSE__INIT;
    sl_feed *f = arg;
    fjob *j = job_or_fail(call, m, epoch_report, f, req->job, 0);
    char msg[256];
    uint32_t dp;
    int err;

    if (!j)
        return;
    /* An epoch ahead of this replica's copy: another replica began it a moment ago. */
    if (req->epoch > j->epoch && feed_job_refresh(f, req->job, &j) == 0 && !j) {
        sl_rpc_call_fail(call, SL_ENOTFOUND, "job '%s' not found", req->job);
        return;
    }
    if ((err = feed_job_dp_rank(j, req->rank, &dp, msg, sizeof(msg))) != 0) {
        sl_rpc_call_fail(call, err, "%s", msg);
        return;
    }
    if (req->epoch < j->epoch) {
        /* The epoch is over (every rank finished it, or Next ended it): nothing to record.
         * Answered OK so that reports are idempotent: a client that lost the answer to the
         * report which completed the epoch (a daemon restart) may send it again. */
        resp.epoch = j->epoch;
        resp.position = req->position;
        sl_rpc_call_reply(call, &resp.base);
        return;
    }
    if ((err = feed_job_report_check(j, dp, req->epoch, req->position, msg, sizeof(msg))) != 0) {
        sl_rpc_call_fail(call, err, "%s", msg);
        return;
    }
    if (feed_job_report_new(j, dp, req->position)) {
        err = feed_report_enqueue(f, call, j, dp, req->epoch, req->position);
        if (err)
            sl_rpc_call_fail(call, err, "out of memory");
        return;
    }
    /* Nothing new to record (reports are monotonic). The epoch may still be complete without
     * having advanced, if writing the next epoch failed (full disk, busy catalog) after the
     * completing report was recorded: this retried report advances it. */
    if (!j->spec->manual_advance && feed_job_complete(j)) {
        err = feed_job_advance(j);
        if (err && err != SL_ESTATE) { /* SL_ESTATE: another replica began it */
            sl_rpc_call_fail(call, err, "job '%s': could not begin epoch %llu: %s", j->name,
                             (unsigned long long)j->epoch + 1, sl_strerror(err));
            return;
        }
        resp.advanced = !err;
    }
    resp.epoch = j->epoch;
    resp.position = resp.advanced ? req->position : j->progress[dp];
    sl_rpc_call_reply(call, &resp.base);
}

static void epoch_next(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    const Sluice__V1__NextEpochRequest *req = (const void *)m;
    fjob *j = job_or_fail(call, m, epoch_next, arg, req->job, 1);
    int err;

    if (!j)
        return;
    if (req->check_epoch && req->expect_epoch != j->epoch) {
        sl_rpc_call_fail(call, SL_ESTATE, "job '%s' is at epoch %llu, not %llu", j->name,
                         (unsigned long long)j->epoch, (unsigned long long)req->expect_epoch);
        return;
    }
    err = feed_job_advance(j);
    if (err == SL_ESTATE) {
        sl_rpc_call_fail(call, err,
                         "job '%s' left epoch %llu through another replica meanwhile: "
                         "check its epoch and ask again",
                         j->name, (unsigned long long)j->epoch);
        return;
    }
    if (err) {
        sl_rpc_call_fail(call, err, "job '%s': could not begin epoch %llu: %s", j->name,
                         (unsigned long long)j->epoch + 1, sl_strerror(err));
        return;
    }
    reply_epoch(call, j);
}

/* Epochs.Rewind: the job put back to a position a trainer saved (its sampler's state_dict), as
 * a Restore puts it back to a checkpoint's: the same feed state is captured from the epoch's
 * record (every dp rank at the position) and restored, resized into to_world_size. */
static void epoch_rewind(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    const Sluice__V1__RewindRequest *req = (const void *)m;
    Sluice__V1__RewindResponse resp = SLUICE__V1__REWIND_RESPONSE__INIT;
    sl_feed *f = arg;
    sl_cat_blob state, spec, elastic;
    sl_feed_restore_req fr;
    uint64_t *pos, epoch = 0;
    uint32_t world = 0;
    char msg[320] = "";
    int err;

    if (!job_or_fail(call, m, epoch_rewind, f, req->job, 1))
        return;
    if (req->world_size < 1 || req->world_size > FEED_MAX_WORLD ||
        req->to_world_size > FEED_MAX_WORLD) {
        sl_rpc_call_fail(call, SL_EINVAL,
                         "world_size %u or to_world_size %u out of range (1 to %u, 0: the same)",
                         req->world_size, req->to_world_size, FEED_MAX_WORLD);
        return;
    }
    if (!(pos = malloc(sizeof(*pos) * req->world_size))) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        return;
    }
    for (uint32_t r = 0; r < req->world_size; r++)
        pos[r] = req->position;
    err = sl_feed_capture(f, req->job, req->epoch, req->world_size, pos, &state, &spec, &elastic,
                          msg, sizeof(msg));
    free(pos);
    if (err) {
        sl_rpc_call_fail(call, err, "%s", msg[0] ? msg : sl_strerror(err));
        return;
    }
    fr.state = &state;
    fr.spec = &spec;
    fr.elastic = &elastic;
    fr.world = req->to_world_size;
    fr.mesh = req->to_mesh;
    err = sl_feed_restore(f, &fr, &epoch, &world, msg, sizeof(msg));
    sl_cat_blob_free(&state);
    sl_cat_blob_free(&spec);
    sl_cat_blob_free(&elastic);
    if (err) {
        sl_rpc_call_fail(call, err, "%s", msg[0] ? msg : sl_strerror(err));
        return;
    }
    sl_log_info("job_rewound",
                "job=%s epoch=%llu position=%llu world=%u now_epoch=%llu now_world=%u", req->job,
                (unsigned long long)req->epoch, (unsigned long long)req->position, req->world_size,
                (unsigned long long)epoch, world);
    resp.epoch = epoch;
    resp.world_size = world;
    sl_rpc_call_reply(call, &resp.base);
}

static const sl_rpc_method job_methods[] = {
    {
        .name = "Create",
        .kind = SL_RPC_UNARY,
        .access = FEED_ACCESS_ADMIN,
        .request = &sluice__v1__create_job_request__descriptor,
        .response = &sluice__v1__job__descriptor,
        .on_start = job_create,
    },
    {
        .name = "Get",
        .kind = SL_RPC_UNARY,
        .access = FEED_ACCESS_READER,
        .request = &sluice__v1__get_job_request__descriptor,
        .response = &sluice__v1__job__descriptor,
        .on_start = job_get,
    },
    {
        .name = "List",
        .kind = SL_RPC_UNARY,
        .access = FEED_ACCESS_READER,
        .request = &sluice__v1__list_jobs_request__descriptor,
        .response = &sluice__v1__list_jobs_response__descriptor,
        .on_start = job_list,
    },
    {
        .name = "Delete",
        .kind = SL_RPC_UNARY,
        .access = FEED_ACCESS_ADMIN,
        .request = &sluice__v1__delete_job_request__descriptor,
        .response = &sluice__v1__delete_job_response__descriptor,
        .on_start = job_delete,
    },
    {
        .name = "Resize",
        .kind = SL_RPC_UNARY,
        .access = FEED_ACCESS_ADMIN,
        .request = &sluice__v1__resize_job_request__descriptor,
        .response = &sluice__v1__job__descriptor,
        .on_start = job_resize,
    },
};

/* The job a report is for: a trainer token bound to other jobs may not report to it (auth.c). */
static const char *report_scope(const ProtobufCMessage *m)
{
    return ((const Sluice__V1__ReportProgressRequest *)m)->job;
}

static const char *rewind_scope(const ProtobufCMessage *m)
{
    return ((const Sluice__V1__RewindRequest *)m)->job;
}

static const sl_rpc_method epoch_methods[] = {
    {
        .name = "Get",
        .kind = SL_RPC_UNARY,
        .access = FEED_ACCESS_READER,
        .request = &sluice__v1__get_epoch_request__descriptor,
        .response = &sluice__v1__epoch_state__descriptor,
        .on_start = epoch_get,
    },
    {
        .name = "ReportProgress",
        .kind = SL_RPC_UNARY,
        .access = FEED_ACCESS_TRAINER,
        .scope = report_scope,
        .request = &sluice__v1__report_progress_request__descriptor,
        .response = &sluice__v1__report_progress_response__descriptor,
        .on_start = epoch_report,
    },
    {
        .name = "Next",
        .kind = SL_RPC_UNARY,
        .access = FEED_ACCESS_ADMIN,
        .request = &sluice__v1__next_epoch_request__descriptor,
        .response = &sluice__v1__epoch_state__descriptor,
        .on_start = epoch_next,
    },
    {
        .name = "Rewind",
        .kind = SL_RPC_UNARY,
        .access = FEED_ACCESS_TRAINER,
        .scope = rewind_scope,
        .request = &sluice__v1__rewind_request__descriptor,
        .response = &sluice__v1__rewind_response__descriptor,
        .on_start = epoch_rewind,
    },
};

const sl_rpc_service *feed_jobs_service(sl_feed *f)
{
    f->svcs[1] = (sl_rpc_service){
        .name = "sluice.v1.Jobs",
        .methods = job_methods,
        .n_methods = sizeof(job_methods) / sizeof(job_methods[0]),
        .arg = f,
    };
    return &f->svcs[1];
}

const sl_rpc_service *feed_epochs_service(sl_feed *f)
{
    f->svcs[2] = (sl_rpc_service){
        .name = "sluice.v1.Epochs",
        .methods = epoch_methods,
        .n_methods = sizeof(epoch_methods) / sizeof(epoch_methods[0]),
        .arg = f,
    };
    return &f->svcs[2];
}
