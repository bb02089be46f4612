/* torch-mode shares: the O(N) permutation of one dp rank in one (job, epoch), built once on
 * libuv's worker pool and shared by every stream of that dp rank (reconnects, tp/cp/pp replicas).
 * Streams wait for it as waiters. Loop thread, except share_work. */
#include "internal.h"

#include "err.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

void fshare_unref(fshare *s)
{
    if (s && --s->refs == 0) {
        sl_sample_free(s->s);
        free(s);
    }
}

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
    /* The streams waiting for it may belong to an epoch that has ended since: each callback
     * checks whether its stream still waits. */
    feed_waiters_run(&sh->waiters, sh->f, sh->job_name);
    fshare_unref(sh);
}

static int share_new(fshare **out, fjob *j, const sl_sample_config *cfg, char *msg, size_t len)
{
    fshare *sh = calloc(1, sizeof(*sh));

    if (!sh) {
        snprintf(msg, len, "out of memory");
        return -ENOMEM;
    }
    sh->refs = 2; /* the job's and the worker's */
    sh->f = j->feed;
    sh->cfg = *cfg;
    snprintf(sh->job_name, sizeof(sh->job_name), "%s", j->name);
    sh->work.work.data = sh;
    if (sl_cat_queue_work(j->feed->cat, j->feed->loop, &sh->work, share_work, share_done) != 0) {
        free(sh);
        snprintf(msg, len, "cannot queue work");
        return SL_EUNAVAILABLE;
    }
    *out = sh;
    return 0;
}

int feed_share_wait(fshare **out, fjob *j, uint32_t dp, const sl_sample_config *cfg,
                    sl_rpc_call *call, feed_ready_cb cb, char *msg, size_t len)
{
    fshare *sh;
    int err;

    if (!j->shares && !(j->shares = calloc(j->dp_size, sizeof(*j->shares)))) {
        snprintf(msg, len, "out of memory");
        return -ENOMEM;
    }
    if (!j->shares[dp] && (err = share_new(&j->shares[dp], j, cfg, msg, len)) != 0)
        return err;
    sh = j->shares[dp];
    sh->refs++;
    *out = sh;
    if (sh->state != 0) {
        cb(call, j->feed, j->name);
        return 0;
    }
    err = feed_waiters_add(&sh->waiters, call, cb);
    if (err)
        snprintf(msg, len, "out of memory");
    return err;
}
