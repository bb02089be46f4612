/* Progress reports' group commit: the reports of one loop iteration are written in one
 * transaction per run of one job's reports (on the loop with SQLite; with PostgreSQL by a worker
 * on the writer connection, one group at a time), then answered (sluice.v1.Epochs
 * ReportProgress, jobs.c). */
#include "internal.h"
#include "util/array.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void on_flush(uv_check_t *h);

int feed_report_enqueue(sl_feed *f, sl_rpc_call *call, const fjob *j, uint32_t dp, uint64_t epoch,
                        uint64_t position)
{
    freport *r;

    if (sl_array_grow((void **)&f->pending, &f->cap_pending, f->n_pending, sizeof(*f->pending),
                      64) != 0)
        return -ENOMEM;
    r = &f->pending[f->n_pending++];
    r->call = call;
    snprintf(r->job, sizeof(r->job), "%s", j->name);
    r->dp = dp;
    r->epoch = epoch;
    r->position = position;
    r->gen = j->gen;
    sl_rpc_call_ref(call);
    if (f->n_pending == 1)
        uv_check_start(f->flush, on_flush);
    return 0;
}

/* A group commit: the reports to answer, and the rows to write of those whose job has not
 * changed since they were checked (a report that raced an advance, a resize or a delete is
 * answered without being written), in runs of one job. */
typedef struct frun {
    char job[SL_CAT_FEED_NAME_MAX + 1];
    uint64_t gen;  /* the job's when collected */
    int finishing; /* a report of the run ends its rank's share: the epoch may be complete */
    size_t at, n;  /* rows[at .. at + n) */
} frun;

/* A progress row of a run's job read back after the commit (shared catalog). */
typedef struct fseen {
    size_t run;
    sl_cat_progress row;
} fseen;

typedef struct fgroup {
    sl_cat_work work;
    sl_feed *f;
    sl_cat *cat; /* the connection that writes */
    freport *batch;
    size_t n;
    sl_cat_progress *rows;
    frun *runs;
    size_t nruns;
    fseen *seen;
    size_t nseen, capseen, run; /* run: the one being read back */
    int err;
} fgroup;

static fgroup *flush_collect(sl_feed *f, freport *batch, size_t n)
{
    fgroup *fl = calloc(1, sizeof(*fl));
    uint64_t count;
    size_t k = 0;

    if (!fl)
        return NULL;
    fl->f = f;
    fl->batch = batch;
    fl->n = n;
    fl->rows = n ? malloc(n * sizeof(*fl->rows)) : NULL;
    fl->runs = n ? malloc(n * sizeof(*fl->runs)) : NULL;
    if (n && (!fl->rows || !fl->runs)) {
        fl->err = -ENOMEM;
        return fl;
    }
    for (size_t i = 0; i < n; i++) {
        fjob *j = feed_job_find(f, batch[i].job);
        if (!j || j->gen != batch[i].gen)
            continue;
        if (!fl->nruns || strcmp(fl->runs[fl->nruns - 1].job, j->name) != 0) {
            frun *r = &fl->runs[fl->nruns++];
            snprintf(r->job, sizeof(r->job), "%s", j->name);
            r->gen = j->gen;
            r->finishing = 0;
            r->at = k;
            r->n = 0;
        }
        fl->rows[k++] = (sl_cat_progress){batch[i].dp, batch[i].epoch, batch[i].position};
        fl->runs[fl->nruns - 1].n++;
        if (feed_job_count(j, batch[i].dp, &count) == 0 && batch[i].position >= count)
            fl->runs[fl->nruns - 1].finishing = 1;
    }
    return fl;
}

static int seen_add(uint32_t dp, uint64_t epoch, uint64_t position, void *arg)
{
    fgroup *fl = arg;

    if (fl->nseen == fl->capseen) {
        size_t cap = fl->capseen ? 2 * fl->capseen : 64;
        fseen *v = realloc(fl->seen, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        fl->seen = v;
        fl->capseen = cap;
    }
    fl->seen[fl->nseen++] = (fseen){fl->run, {dp, epoch, position}};
    return 0;
}

/* A shared catalog: the progress of each job a report of which ended its rank's share (only
 * such a report can complete an epoch), as it is after the commit, which includes what other
 * replicas recorded. Of two replicas that record the last reports of an epoch at the same time,
 * the one that reads last sees both, so at least one of them sees the epoch complete and
 * advances it (and says so in its answer), instead of both leaving it to the announcements. A
 * failed read loses nothing: the announcements bring the same rows a moment later. */
static void flush_read_back(fgroup *fl)
{
    for (fl->run = 0; fl->run < fl->nruns; fl->run++)
        if (fl->runs[fl->run].finishing &&
            sl_cat_progress_list(fl->cat, fl->runs[fl->run].job, seen_add, fl) != 0)
            fl->nseen = 0; /* none rather than some */
}

/* One statement per run, the other replicas told once per run; one transaction (one fsync)
 * around them unless there is only one. Any thread: fl->cat is the loop's catalog, or the
 * writer connection of a shared catalog used by one worker job at a time. */
static void flush_write(uv_work_t *w)
{
    fgroup *fl = w->data;
    int tx = fl->nruns > 1, err = fl->err;

    if (!err && tx)
        err = sl_cat_feed_begin(fl->cat);
    for (size_t i = 0; !err && i < fl->nruns; i++) {
        err =
            sl_cat_progress_put(fl->cat, fl->runs[i].job, fl->rows + fl->runs[i].at, fl->runs[i].n);
        if (!err)
            err = sl_cat_progress_announce(fl->cat, fl->runs[i].job);
    }
    if (tx)
        err = sl_cat_feed_end(fl->cat, err);
    fl->err = err;
    if (!err && sl_cat_shared(fl->cat))
        flush_read_back(fl);
}

/* Answer the reports (loop thread) and free the group commit. */
static void flush_answer(fgroup *fl)
{
    sl_feed *f = fl->f;

    for (size_t i = 0; i < fl->nseen; i++) {
        fseen *s = &fl->seen[i];
        fjob *j = feed_job_find(f, fl->runs[s->run].job);
        if (j && j->gen == fl->runs[s->run].gen) /* not replaced or advanced meanwhile */
            feed_job_merge_progress(s->row.dp_rank, s->row.epoch, s->row.position, j);
    }
    for (size_t i = 0; i < fl->n; i++) {
        Sluice__V1__ReportProgressResponse resp = SLUICE__V1__REPORT_PROGRESS_RESPONSE__INIT;
        freport *r = &fl->batch[i];
        fjob *j = feed_job_find(f, r->job);
        int advanced = 0, e2;

        if (fl->err) {
            sl_rpc_call_fail(r->call, fl->err, "could not record progress: %s",
                             sl_strerror(fl->err));
        } else if (!j) {
            sl_rpc_call_fail(r->call, SL_ENOTFOUND, "job '%s' was deleted", r->job);
        } else if (j->gen != r->gen && j->epoch == r->epoch) {
            sl_rpc_call_fail(r->call, SL_ESTATE,
                             "job '%s' was resized or restored while the report was queued; "
                             "report again",
                             r->job);
        } else if (j->gen != r->gen) {
            /* The epoch ended (an earlier report of this batch completed it, or Next). */
            resp.epoch = j->epoch;
            resp.position = r->position;
            sl_rpc_call_reply(r->call, &resp.base);
        } else if ((e2 = feed_job_report_apply(j, r->dp, r->position, &advanced)) != 0) {
            sl_rpc_call_fail(r->call, e2, "could not begin epoch %llu: %s",
                             (unsigned long long)r->epoch + 1, sl_strerror(e2));
        } else {
            resp.epoch = j->epoch;
            resp.advanced = advanced;
            resp.position = advanced ? r->position : j->progress[r->dp];
            sl_rpc_call_reply(r->call, &resp.base);
        }
        sl_rpc_call_unref(r->call);
    }
    free(fl->batch);
    free(fl->rows);
    free(fl->runs);
    free(fl->seen);
    free(fl);
}

static void flush_after(uv_work_t *w, int status)
{
    fgroup *fl = w->data;
    sl_feed *f = fl->f;

    (void)status;
    f->flushing = 0;
    flush_answer(fl);
    if (f->n_pending && f->flush)
        uv_check_start(f->flush, on_flush);
}

/* In the catalog lane: with SQLite, or PostgreSQL while shutting down, the group is written
 * here. */
static void flush_now(void *arg, int b)
{
    sl_feed *f = arg;
    freport *batch = f->pending;
    size_t n = f->n_pending;
    fgroup *fl;

    (void)b;
    if (f->flushing || n == 0)
        return; /* the group commit on its way starts the next one when it ends */
    f->pending = NULL;
    f->n_pending = f->cap_pending = 0;
    if (!(fl = flush_collect(f, batch, n))) {
        for (size_t i = 0; i < n; i++) {
            sl_rpc_call_fail(batch[i].call, -ENOMEM, "out of memory");
            sl_rpc_call_unref(batch[i].call);
        }
        free(batch);
        return;
    }
    /* A shared catalog's writes go over the network: a worker writes them on a connection of
     * its own while the loop goes on; the local SQLite file is written here. */
    if (f->wcat && !f->shutting_down) {
        fl->cat = f->wcat;
        fl->work.work.data = fl;
        f->flushing = 1;
        sl_cat_queue_work(f->cat, f->loop, &fl->work, flush_write, flush_after);
        return;
    }
    fl->cat = f->cat;
    fl->work.work.data = fl;
    flush_write(&fl->work.work);
    flush_answer(fl);
}

static void on_flush(uv_check_t *h)
{
    sl_feed *f = h->data;

    uv_check_stop(h);
    sl_cat_lane_run(f->cat, flush_now, f, 0);
}

static void on_flush_closed(uv_handle_t *h)
{
    free(h);
}

int feed_reports_init(sl_feed *f)
{
    f->flush = calloc(1, sizeof(*f->flush));
    if (!f->flush)
        return -ENOMEM;
    uv_check_init(f->loop, f->flush);
    f->flush->data = f;
    return 0;
}

void feed_reports_close(sl_feed *f)
{
    if (f->flush)
        uv_check_stop(f->flush);
    if (f->n_pending)
        flush_now(f, 0);
    if (f->flush)
        uv_close((uv_handle_t *)f->flush, on_flush_closed);
    f->flush = NULL;
}
