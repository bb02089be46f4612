/* Replicas of one shared (PostgreSQL) catalog: this replica's jobs in memory follow the catalog.
 *
 * Jobs are loaded from their rows here (feed_job_load, at start and later). Every write of a
 * job's row or progress is announced to the other replicas (NOTIFY, in the writing transaction:
 * server/catalog/feed.c); what they announce arrives here (notified) and the job is read again:
 * made, removed, replaced (a resize or restore elsewhere: its streams end with ABORTED and reopen
 * on the new state), moved to the next epoch (streams waiting for it start), or its progress
 * merged (an epoch that is then complete is advanced by the replica that recorded its last
 * report; exactly one replica's conditional UPDATE begins the next one). Every call on a job but
 * a progress report reads the job first (feed_job_current), and a report that names a job this
 * replica does not know yet or an epoch ahead of its copy does too, so no answer depends on
 * which replica a client reached or on the lag of an announcement.
 */
#include "internal.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct refresh {
    sl_feed *f;
    int seen;
} refresh;

/* How long an epoch that the merged progress completes waits before this replica advances it:
 * the replica that recorded the completing report advances it at once (and answers that report
 * with advanced=true), so this only acts when that replica died in between. */
#define ORPHAN_ADVANCE_MS 1000

static void orphans(void *arg, int b)
{
    sl_feed *f = arg;

    (void)b;
    for (fjob *j = f->jobs; j; j = j->next) {
        int err;
        if (j->spec->manual_advance || !feed_job_complete(j))
            continue;
        sl_log_info("epoch_complete_unadvanced", "job=%s epoch=%llu", j->name,
                    (unsigned long long)j->epoch);
        err = feed_job_advance(j);
        if (err && err != SL_ESTATE)
            sl_log_error("epoch_advance_failed", "job=%s epoch=%llu error=\"%s\"", j->name,
                         (unsigned long long)j->epoch, sl_strerror(err));
    }
}

static void on_orphans(uv_timer_t *t)
{
    sl_feed *f = t->data;

    sl_cat_lane_run(f->cat, orphans, f, 0);
}

static void unadvanced_if_complete(sl_feed *f, fjob *j)
{
    if (!j->spec->manual_advance && feed_job_complete(j))
        feed_sync_unadvanced(f);
}

/* Same epoch: merge the progress other replicas recorded. An epoch that is now complete is
 * advanced by the replica that recorded its last report (or, if that one died, by on_orphans). */
static int merge_progress(sl_feed *f, fjob *j)
{
    int err = sl_cat_progress_list(f->cat, j->name, feed_job_merge_progress, j);

    if (err)
        return err;
    unadvanced_if_complete(f, j);
    return 0;
}

void feed_sync_unadvanced(sl_feed *f)
{
    if (f->orphans && !uv_is_active((uv_handle_t *)f->orphans))
        uv_timer_start(f->orphans, on_orphans, ORPHAN_ADVANCE_MS, 0);
}

int feed_job_load(const sl_cat_job *row, void *arg)
{
    sl_feed *f = arg;
    Sluice__V1__Job *spec = sluice__v1__job__unpack(NULL, row->spec_len, row->spec);
    sl_cat_dataset d;
    char msg[256];
    fjob *j;
    int err;

    if (!spec) {
        sl_log_error("job_load_failed", "job=%s error=\"spec does not decode\"", row->name);
        return 0;
    }
    err = sl_cat_dataset_get(f->cat, &d, row->dataset);
    if (err) {
        sluice__v1__job__free_unpacked(spec, NULL);
        sl_log_error("job_load_failed", "job=%s error=\"dataset %s: %s\"", row->name, row->dataset,
                     sl_strerror(err));
        return err == SL_EDB ? err : 0;
    }
    err = feed_job_add(f, &j, row->name, row->dataset, spec, d.samples, row->epoch, row->created_ms,
                       row->elastic, row->elastic_len, msg, sizeof(msg));
    if (err == FEED_PENDING) {
        sl_log_info("job_load_waits", "job=%s reading=labels", row->name);
        return 0;
    }
    if (err) {
        /* Keep serving the other jobs; this one stays in the catalog for an operator. */
        sl_log_error("job_load_failed", "job=%s error=\"%s\"", row->name, msg);
        return err == SL_EDB ? err : 0;
    }
    j->version = row->version;
    sl_log_info("job_loaded", "job=%s epoch=%llu world=%u resized_in_epoch=%d", j->name,
                (unsigned long long)j->epoch, j->spec->world_size, j->src != NULL);
    /* A crash between the report that completed the epoch (durable) and the write of the next
     * epoch leaves a complete epoch behind: begin the next one now, as the report would have.
     * (A batch job's completion is known once its plan is ready; stream.c checks it then.) */
    if (!j->spec->manual_advance && feed_job_complete(j)) {
        /* Loaded from another replica's announcement (the timer exists once the feed has
         * started): the replica that made it complete advances it. */
        if (f->orphans) {
            feed_sync_unadvanced(f);
            return 0;
        }
        err = feed_job_advance(j);
        if (err && err != SL_ESTATE)
            sl_log_error("epoch_advance_failed", "job=%s epoch=%llu error=\"%s\"", j->name,
                         (unsigned long long)j->epoch, sl_strerror(err));
        return err == SL_EDB ? err : 0;
    }
    return 0;
}

static int reconcile(const sl_cat_job *row, void *arg)
{
    refresh *r = arg;
    sl_feed *f = r->f;
    fjob *j = feed_job_find(f, row->name);
    flabels *keep;
    uint64_t gen;
    int err;

    r->seen = 1;
    if (!j)
        return feed_job_load(row, f);
    if (row->version == j->version && row->epoch == j->epoch)
        return merge_progress(f, j);
    if (row->version == j->version && row->epoch == j->epoch + 1 && !row->elastic_len) {
        sl_log_info("epoch_began_elsewhere", "job=%s epoch=%llu", j->name,
                    (unsigned long long)row->epoch);
        err = feed_job_enter(j, row->epoch);
        return err ? err : merge_progress(f, j);
    }
    /* Resized or restored elsewhere (or more than one epoch behind): the catalog's job replaces
     * this copy; its streams reopen on it. Reports queued for the old copy are refused by gen.
     * The chain is rebuilt here, on the loop: a copy that served its old state while the chain
     * was built on the worker pool answered a stream opened meanwhile with the old shares (the
     * rest after a restore into another world served twice, ckpt_position_integration_pg under
     * ASan), so the reload waits until calls can wait for it. */
    sl_log_info("job_changed_elsewhere", "job=%s epoch=%llu version=%llu", j->name,
                (unsigned long long)row->epoch, (unsigned long long)row->version);
    gen = j->gen;
    /* Its labels stay in memory across the replacement (not read again when it held the last
     * reference). */
    keep = j->labels;
    flabels_ref(keep);
    feed_job_remove(f, j, SL_RPC_ABORTED,
                    "job changed through another replica (resize or restore); reopen the stream");
    err = feed_job_load(row, f);
    flabels_unref(f, keep);
    if ((j = feed_job_find(f, row->name)) != NULL)
        j->gen = gen + 1;
    return err;
}

/* The copy's version and epoch are still the catalog's: merge the catalog's progress. */
typedef struct quick {
    fjob *j;
    uint64_t version, epoch;
} quick;

static int merge_if_current(uint32_t dp, uint64_t epoch, uint64_t position, void *arg)
{
    quick *q = arg;

    if (q->version == q->j->version && q->epoch == q->j->epoch)
        feed_job_merge_progress(dp, epoch, position, q->j);
    return 0;
}

int feed_job_refresh(sl_feed *f, const char *name, fjob **out)
{
    refresh r = {.f = f};
    fjob *j = feed_job_find(f, name);
    int err;

    if (out)
        *out = j;
    /* A Resize or a reload in flight: the job is refreshed when it ends, and calls wait. */
    if (!sl_cat_shared(f->cat) || (j && j->resizing))
        return 0;
    /* The usual case, in one statement: the copy is current but for progress. */
    if (j) {
        quick q = {.j = j};
        err = sl_cat_job_progress(f->cat, name, &q.version, &q.epoch, merge_if_current, &q);
        if (err && err != SL_ENOTFOUND)
            return err;
        if (!err && q.version == j->version && q.epoch == j->epoch) {
            unadvanced_if_complete(f, j);
            return 0;
        }
    }
    err = sl_cat_job_get(f->cat, name, reconcile, &r);
    if (err == SL_ENOTFOUND && (j = feed_job_find(f, name)) != NULL) {
        sl_log_info("job_deleted_elsewhere", "job=%s", name);
        feed_job_remove(f, j, SL_RPC_NOT_FOUND, "job deleted through another replica");
        err = 0;
    }
    if (out)
        *out = feed_job_find(f, name);
    return err == SL_ENOTFOUND ? 0 : err;
}

int feed_job_current(sl_feed *f, const char *name, fjob **out)
{
    int err = feed_job_refresh(f, name, out);

    return err && *out ? 0 : err;
}

/* Announcements were lost (a new connection): read every job again, and drop the ones gone. */
static void refresh_all(sl_feed *f)
{
    refresh r = {.f = f};
    fjob *j, *next;

    if (sl_cat_job_list(f->cat, reconcile, &r) != 0)
        return; /* the next reconnect or announcement tries again */
    for (j = f->jobs; j; j = next) {
        next = j->next;
        if (feed_job_refresh(f, j->name, NULL) != 0)
            break;
    }
}

static void notified(const char *payload, void *arg)
{
    sl_feed *f = arg;
    int err;

    if (f->shutting_down)
        return;
    if (!strcmp(payload, "*")) {
        refresh_all(f);
        return;
    }
    if ((payload[0] != 'j' && payload[0] != 'p') || payload[1] != ' ')
        return;
    err = feed_job_refresh(f, payload + 2, NULL);
    if (err)
        sl_log_warn("job_refresh_failed", "job=%s error=\"%s\"", payload + 2, sl_strerror(err));
}

static void free_handle(uv_handle_t *h)
{
    free(h);
}

int feed_sync_init(sl_feed *f)
{
    f->orphans = calloc(1, sizeof(*f->orphans));
    if (!f->orphans)
        return -ENOMEM;
    uv_timer_init(f->loop, f->orphans);
    f->orphans->data = f;
    return sl_cat_listen(f->cat, f->loop, notified, f);
}

void feed_sync_close(sl_feed *f)
{
    if (f->orphans)
        uv_close((uv_handle_t *)f->orphans, free_handle);
    f->orphans = NULL;
}
