/* Small jobs on a remote store under a cap (ckpt_store_job in internal.h).
 *
 * Every request to object storage blocks a worker of libuv's pool until the store answers or
 * the request's timeout ends it. Removals after a Delete or an Abort, UploadStatus and the
 * periodic sweep are each a few such requests; without a cap a store that answers 2 bytes a
 * second let a burst of them take all 16 workers, and an unrelated upload, whose chunks and
 * finish need a worker, failed. So they hold at most opts.store_jobs workers; the others wait
 * on the loop in arrival order and start as slots free. Upload lanes, commits and verifies are
 * not counted here (verifies have their own budget): they are what the cap keeps room for.
 */
#include "internal.h"

#include <stdlib.h>

/* One job holding or waiting for a slot. The caller's sl_cat_work stays the caller's: its work
 * (and data) is what fn and after see; `work` here is what goes on the pool. */
struct ckpt_sjob {
    sl_cat_work work;
    sl_ckpt_svc *svc;
    sl_cat_work *w;
    uv_work_cb fn;
    uv_after_work_cb after;
    ckpt_sjob *next;
};

/* Here, below the sweep and the store jobs that may outlive sl_ckpt_svc_free, which call it as
 * they end: the last of the service's asynchronous holders frees it. */
void ckpt_svc_release(sl_ckpt_svc *s)
{
    if (s->stopping && !s->timer_open && !s->rsweep && !s->sjobs_running && !s->sjobs_head)
        free(s);
}

static void sjob_work(uv_work_t *u)
{
    ckpt_sjob *j = u->data;

    j->fn(&j->w->work);
}

static void gate_pump(sl_ckpt_svc *s);

static void sjob_after(uv_work_t *u, int status)
{
    ckpt_sjob *j = u->data;
    sl_ckpt_svc *s = j->svc;

    /* The slot is held while the caller's after runs: the service cannot be freed inside it
     * (the sweep's after releases the service when it is stopping). */
    j->after(&j->w->work, status);
    free(j);
    s->sjobs_running--;
    gate_pump(s);
    if (s->stopping)
        ckpt_svc_release(s);
}

static void sjob_start(sl_ckpt_svc *s, ckpt_sjob *j)
{
    s->sjobs_running++;
    if (sl_cat_queue_work(s->cat, s->loop, &j->work, sjob_work, sjob_after) != 0) {
        /* libuv refuses only a NULL callback: as the pool would report a cancelled job. */
        sjob_after(&j->work.work, UV_ECANCELED);
    }
}

/* Start queued jobs while slots are free; all of them once the service is stopping. */
static void gate_pump(sl_ckpt_svc *s)
{
    while (s->sjobs_head && (s->stopping || s->sjobs_running < s->opts.store_jobs)) {
        ckpt_sjob *j = s->sjobs_head;

        s->sjobs_head = j->next;
        if (!s->sjobs_head)
            s->sjobs_tail = NULL;
        j->next = NULL;
        sjob_start(s, j);
    }
}

void ckpt_store_job(sl_ckpt_svc *s, sl_cat_work *w, uv_work_cb fn, uv_after_work_cb after)
{
    ckpt_sjob *j;

    if (!sl_sstore_remote(s->opts.store)) {
        fn(&w->work);
        after(&w->work, 0);
        return;
    }
    if (!(j = calloc(1, sizeof(*j)))) {
        /* Out of memory for the record: run it outside the cap rather than lose it. */
        sl_cat_queue_work(s->cat, s->loop, w, fn, after);
        return;
    }
    j->work.work.data = j;
    j->svc = s;
    j->w = w;
    j->fn = fn;
    j->after = after;
    if (s->sjobs_tail)
        s->sjobs_tail->next = j;
    else
        s->sjobs_head = j;
    s->sjobs_tail = j;
    gate_pump(s);
}

void ckpt_store_jobs_flush(sl_ckpt_svc *s)
{
    gate_pump(s); /* s->stopping is set: every queued job starts */
}
