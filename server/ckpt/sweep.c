/* Sweeps: which files under the store root are abandoned, decided from the catalog and the
 * running uploads. Only what the catalog knows to be garbage is removed: partial uploads of
 * WRITING checkpoints untouched for the upload timeout, metadata temp files at startup, and files
 * of checkpoints whose removal the catalog recorded (Delete, Abort) that are no newer than that
 * decision. Any other checkpoint file the catalog does not know goes to the quarantine
 * (server/store/quarantine.h): a catalog restored from a backup, or a new one after catalog.db
 * was lost, does not know what was written after it, and removing that was data loss. With
 * object storage, a multipart upload that no state object names and that was initiated longer
 * than the upload timeout ago is aborted too (a crash between its start and its first state, or
 * a state lost), unless an upload of its rank runs here or holds a lease on another replica. */
#include "internal.h"

#include "err.h"
#include "log.h"
#include "store/layout.h"
#include "store/quarantine.h"
#include "store/sstore.h"
#include "store/store.h"
#include "util/array.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHARED_GRACE_MS (10 * 60 * 1000)

typedef struct sweep_ctx {
    sl_ckpt_svc *svc;
    const char *job;
    int startup;
    int64_t now_ms;
    int unsure; /* the catalog could not say about a file, which was kept */
    int peers;  /* other replicas are connected to the shared catalog */
} sweep_ctx;

enum {
    SWEEP_KEEP = SL_SSTORE_KEEP,
    SWEEP_REMOVE = SL_SSTORE_REMOVE,
    SWEEP_QUARANTINE = SL_SSTORE_QUARANTINE
};

/* A file of checkpoint `name` that the catalog does not know: garbage if the catalog recorded
 * the removal of that checkpoint's files when the file already was what it is (a crash came
 * between the decision and the unlinks), else quarantined (written after the decision, or never
 * known to this catalog). */
static int unknown(sweep_ctx *c, const char *name, int64_t mtime_ms)
{
    int64_t removed_ms = 0;
    int err = sl_cat_removal_get(c->svc->cat, c->job, name, &removed_ms);

    if (err && err != SL_ENOTFOUND) {
        c->unsure = 1;
        return SWEEP_KEEP; /* the catalog cannot say: keep it, a later sweep decides */
    }
    return !err && mtime_ms <= removed_ms ? SWEEP_REMOVE : SWEEP_QUARANTINE;
}

/* A partial upload stays while its checkpoint is WRITING and it runs or was touched within the
 * upload timeout (a client may resume it); after that it is abandoned and removed. A partial of
 * a checkpoint that is not WRITING is unknown(). */
static int keep_part(sweep_ctx *c, const char *name, int32_t rank, int64_t mtime_ms)
{
    sl_ckpt_svc *s = c->svc;
    int64_t age_ms = c->now_ms - mtime_ms;
    sl_cat_ckpt ck;
    int err = sl_cat_ckpt_get(s->cat, &ck, c->job, name);

    if (err && err != SL_ENOTFOUND) {
        c->unsure = 1;
        return SWEEP_KEEP;
    }
    if (err || ck.state != SL_CKPT_WRITING)
        return unknown(c, name, mtime_ms);
    if (ckpt_upload_find(s, ck.id, rank))
        return SWEEP_KEEP;
    return age_ms < (int64_t)s->opts.upload_timeout_ms ? SWEEP_KEEP : SWEEP_REMOVE;
}

/* At startup, a shard file or metadata file: known if the catalog has its checkpoint (not
 * INCOMPLETE) with a shard row for the rank, or COMPLETE for the metadata file. */
static int keep_file(sweep_ctx *c, sl_store_kind kind, const char *name, int32_t rank,
                     int64_t mtime_ms)
{
    sl_cat_ckpt ck;
    sl_cat_shard sh;
    int err = sl_cat_ckpt_get(c->svc->cat, &ck, c->job, name);

    if (!err && kind == SL_STORE_SHARD && ck.state != SL_CKPT_INCOMPLETE && rank < ck.world_size)
        err = sl_cat_shard_get(c->svc->cat, &sh, ck.id, rank);
    else if (!err && !(kind == SL_STORE_META && ck.state == SL_CKPT_COMPLETE))
        err = SL_ENOTFOUND;
    if (err && err != SL_ENOTFOUND) {
        c->unsure = 1;
        return SWEEP_KEEP;
    }
    return err ? unknown(c, name, mtime_ms) : SWEEP_KEEP;
}

/* sl_sstore_verdict_fn: what becomes of `file` of job `job`. Loop thread (the catalog). */
static int verdict(const char *job, const char *file, int64_t mtime_ms, void *arg)
{
    sweep_ctx *c = arg;
    char name[NAME_MAX + 1];
    int32_t rank = 0;
    size_t n = strlen(file);
    sl_store_kind kind = sl_store_classify(file, name, sizeof(name), &rank);

    c->job = job;
    /* Other replicas of a shared catalog are writing now: a file of theirs may be between its
     * rename and its catalog row. What the startup sweep alone decides (temp files, files the
     * catalog does not know) waits until the file is SHARED_GRACE_MS old. */
    if (c->startup && c->peers && kind != SL_STORE_PART && c->now_ms - mtime_ms < SHARED_GRACE_MS)
        return SWEEP_KEEP;
    switch (kind) {
    case SL_STORE_PART:
        return keep_part(c, name, rank, mtime_ms);
    case SL_STORE_TEMP:
        /* A temp file of an atomic write (metadata being written) is redundant once the daemon
         * has just started: the write never finished. Other hidden files are not ours. */
        return c->startup && n > 4 && strcmp(file + n - 4, ".tmp") == 0 ? SWEEP_REMOVE : SWEEP_KEEP;
    case SL_STORE_SHARD:
    case SL_STORE_META:
        /* Only the startup sweep looks at them; a name no request could make is not ours. */
        if (!c->startup || sl_shard_name_check(name) != 0)
            return SWEEP_KEEP;
        return keep_file(c, kind, name, rank, mtime_ms);
    default:
        return SWEEP_KEEP; /* not ours */
    }
}

/* Whether the data dir is still the directory the daemon opened and locked: 1, 0, or -1 if it
 * cannot tell now. If it was removed (and perhaps made again for another daemon), the files at its
 * path are not in this daemon's catalog and a sweep would remove them: found when a daemon left
 * running on a removed data dir deleted a new daemon's partial uploads every 60 s
 * (tests/bench/soak.c, docs/hardening.md). */
static int data_dir_held(const sl_ckpt_svc *s)
{
    int held;

    if (s->opts.lock_fd < 0)
        return 1;
    held = sl_store_same_file(s->opts.lock_fd, s->data_dir);
    return held < 0 ? -1 : held;
}

/* Whether sweeping may go on: the data dir and the catalog are still the ones the daemon opened.
 * A catalog removed or replaced under the daemon no longer says what the files are. */
static int may_sweep(sl_ckpt_svc *s)
{
    int held = 0;

    if (!s->dir_lost && (held = data_dir_held(s)) > 0)
        return sl_cat_check(s->cat) == 0;
    if (held < 0)
        return 0; /* cannot tell now: try again at the next sweep */
    if (!s->dir_lost)
        sl_log_error("data_dir_replaced",
                     "path=%s hint=\"the data dir this daemon locked was removed or replaced; "
                     "partial uploads are no longer swept: restart the daemon\"",
                     s->data_dir);
    s->dir_lost = 1;
    return 0;
}

/* The end of a sweep: the startup one dealt with every file of every recorded removal. */
static void sweep_done(sl_ckpt_svc *s, int startup, int sure, int removed, int moved, int aborted)
{
    int err;

    if (startup && sure && (err = sl_cat_removals_clear(s->cat)) != 0)
        sl_log_warn("ckpt_removals_clear_failed", "error=\"%s\"", sl_strerror(err));
    /* The startup's batch stays open for the other startup sweeps (sluiced ends it). */
    if (!startup && s->opts.quarantine)
        sl_quar_end(s->opts.quarantine);
    if (removed || moved || aborted)
        sl_log_info("ckpt_sweep", "removed=%d quarantined=%d uploads_aborted=%d startup=%d",
                    removed, moved, aborted, startup);
}

/* ---- object storage: list on a worker, decide on the loop, act on a worker ---- */

typedef struct rs_item {
    char job[SL_SHARD_NAME_MAX + 1];
    char file[NAME_MAX + 1];
    int64_t mtime_ms;
    int action;
} rs_item;

/* A multipart upload that no state object names (sl_sstore_ops.orphans). */
typedef struct rs_orphan {
    char job[SL_SHARD_NAME_MAX + 1];
    char file[NAME_MAX + 1];
    char upload_id[SL_SSTORE_UPLOAD_MAX];
    int abort;
} rs_orphan;

struct ckpt_rsweep {
    sl_cat_work work;
    sl_ckpt_svc *svc;
    int startup, phase; /* 0: listing, 1: acting */
    int peers;
    rs_item *items;
    size_t n, cap;
    rs_orphan *orphans;
    size_t norphans, orphans_cap;
    int64_t before_ms; /* uploads initiated before this may be orphans */
    int err, removed, moved, aborted, sure;
};

static int rs_collect(const char *job, const char *file, int64_t mtime_ms, void *arg)
{
    ckpt_rsweep *r = arg;
    rs_item *it;

    if (strlen(job) > SL_SHARD_NAME_MAX || strlen(file) > NAME_MAX)
        return 0; /* not a name of ours */
    if (sl_array_grow((void **)&r->items, &r->cap, r->n, sizeof(*r->items), 256) != 0)
        return -ENOMEM;
    it = &r->items[r->n++];
    snprintf(it->job, sizeof(it->job), "%s", job);
    snprintf(it->file, sizeof(it->file), "%s", file);
    it->mtime_ms = mtime_ms;
    it->action = SWEEP_KEEP;
    return 0;
}

static int rs_orphan_collect(const char *job, const char *file, const char *upload_id,
                             int64_t initiated_ms, void *arg)
{
    ckpt_rsweep *r = arg;
    rs_orphan *o;

    (void)initiated_ms;
    if (strlen(job) > SL_SHARD_NAME_MAX || strlen(file) > NAME_MAX)
        return 0;
    if (sl_array_grow((void **)&r->orphans, &r->orphans_cap, r->norphans, sizeof(*r->orphans),
                      16) != 0)
        return -ENOMEM;
    o = &r->orphans[r->norphans++];
    snprintf(o->job, sizeof(o->job), "%s", job);
    snprintf(o->file, sizeof(o->file), "%s", file);
    snprintf(o->upload_id, sizeof(o->upload_id), "%s", upload_id);
    o->abort = 0;
    return 0;
}

/* Abort the multipart uploads decided to be orphans; SL_EUNAVAILABLE stops (the next sweep). */
static void rs_abort_orphans(ckpt_rsweep *r, sl_sstore *st)
{
    for (size_t i = 0; i < r->norphans; i++) {
        rs_orphan *o = &r->orphans[i];
        int err;
        if (!o->abort)
            continue;
        err = st->ops->abort_upload(st, o->job, o->file, o->upload_id);
        if (err == SL_EUNAVAILABLE)
            break;
        if (!err) {
            r->aborted++;
            sl_log_info("s3_upload_aborted",
                        "job=%s file=%s upload_id=%s why=\"no upload state names it\"", o->job,
                        o->file, o->upload_id);
        }
    }
}

static void rs_work(uv_work_t *w)
{
    ckpt_rsweep *r = w->data;
    sl_sstore *st = r->svc->opts.store;

    if (r->phase == 0) {
        /* Uploads first, objects after: an upload old enough to be listed here wrote its
         * first state (if its writer lives) before the objects are listed and read. */
        if (st->ops->orphans && st->ops->orphans(st, r->before_ms, rs_orphan_collect, r) != 0)
            r->norphans = 0;
        r->err = st->ops->list(st, rs_collect, r);
        return;
    }
    rs_abort_orphans(r, st);
    for (size_t i = 0; i < r->n; i++) {
        rs_item *it = &r->items[i];
        int err;
        if (it->action == SWEEP_KEEP)
            continue;
        err = st->ops->act(st, it->job, it->file, it->mtime_ms, it->action);
        /* The store failed after its retries (each up to --s3-retry-deadline): the rest waits
         * for the next sweep, so that a store that fails on many objects delays the daemon's
         * start by one deadline, not one per object. */
        if (err == SL_EUNAVAILABLE) {
            r->sure = 0;
            break;
        }
        if (err)
            continue;
        if (it->action == SWEEP_REMOVE)
            r->removed++;
        else
            r->moved++;
    }
}

/* A multipart upload no state names is aborted unless an upload of its (checkpoint, rank) runs
 * here or holds a live lease on another replica (its writer may be about to write its first
 * state), or the catalog cannot say. */
static int orphan_abort(ckpt_rsweep *r, const rs_orphan *o)
{
    sl_ckpt_svc *s = r->svc;
    char name[NAME_MAX + 1];
    int32_t rank = 0;
    sl_cat_ckpt ck;
    int err;

    if (sl_store_classify(o->file, name, sizeof(name), &rank) != SL_STORE_SHARD)
        return 0;
    err = sl_cat_ckpt_get(s->cat, &ck, o->job, name);
    if (err == SL_ENOTFOUND || (!err && ck.state != SL_CKPT_WRITING))
        return 1;
    if (err)
        return 0;
    return !ckpt_upload_find(s, ck.id, rank) && !ckpt_lease_elsewhere(s, ck.id, rank);
}

/* Decide about every listed file (loop thread). Returns whether there is anything to do. */
static int rs_decide(ckpt_rsweep *r)
{
    int todo = 0;

    for (size_t i = 0; i < r->norphans; i++) {
        r->orphans[i].abort = orphan_abort(r, &r->orphans[i]);
        todo |= r->orphans[i].abort;
    }

    r->sure = r->err == 0;
    for (size_t i = 0; i < r->n; i++) {
        rs_item *it = &r->items[i];
        sweep_ctx c = {r->svc, it->job, r->startup, sl_now_ms(), 0, r->peers};
        it->action = verdict(it->job, it->file, it->mtime_ms, &c);
        r->sure &= !c.unsure;
        todo |= it->action != SWEEP_KEEP;
    }
    return todo;
}

static void rs_free(ckpt_rsweep *r)
{
    free(r->orphans);
    free(r->items);
    free(r);
}

static void rs_after(uv_work_t *w, int status)
{
    ckpt_rsweep *r = w->data;
    sl_ckpt_svc *s = r->svc;

    if (r->phase == 0 && r->err)
        sl_log_warn("ckpt_sweep_failed", "store=%s error=\"%s\"", sl_sstore_kind(s->opts.store),
                    sl_strerror(r->err));
    if (r->phase == 0 && !s->stopping && may_sweep(s) && rs_decide(r)) {
        r->phase = 1;
        ckpt_store_job(s, &r->work, rs_work, rs_after);
        return;
    }
    if (!s->stopping)
        sweep_done(s, r->startup, r->sure, r->removed, r->moved, r->aborted);
    sl_cat_chore_done(s->cat, SL_CHORE_SWEEP);
    s->rsweep = NULL;
    rs_free(r);
    if (s->stopping)
        ckpt_svc_release(s);
}

/* A sweep of object storage. At startup it runs here, before any call is served; later ones
 * run their listing and actions on the worker pool, one sweep at a time. */
static void sweep_remote(sl_ckpt_svc *s, int startup)
{
    ckpt_rsweep *r;

    if (!(r = calloc(1, sizeof(*r)))) {
        sl_cat_chore_done(s->cat, SL_CHORE_SWEEP);
        return;
    }
    r->svc = s;
    r->startup = startup;
    r->peers = startup ? sl_cat_peers(s->cat) : 0;
    r->before_ms = sl_now_ms() - (int64_t)s->opts.upload_timeout_ms;
    r->work.work.data = r;
    if (!startup) {
        s->rsweep = r;
        ckpt_store_job(s, &r->work, rs_work, rs_after);
        return;
    }
    rs_work(&r->work.work);
    if (rs_decide(r)) {
        r->phase = 1;
        rs_work(&r->work.work);
    }
    sweep_done(s, 1, r->sure, r->removed, r->moved, r->aborted);
    sl_cat_chore_done(s->cat, SL_CHORE_SWEEP);
    rs_free(r);
}

void ckpt_sweep(sl_ckpt_svc *s, int startup)
{
    sweep_ctx c = {s, NULL, startup, sl_now_ms(), 0, 0};
    sl_sstore *st = s->opts.store;
    int removed = 0, moved = 0, err;

    if (s->rsweep || !may_sweep(s))
        return;
    /* Replicas of a shared catalog sweep one at a time (the chore's lock). */
    if ((err = sl_cat_chore_try(s->cat, SL_CHORE_SWEEP)) != 1) {
        if (err < 0)
            sl_log_warn("ckpt_sweep_skipped", "error=\"%s\"", sl_strerror(err));
        return;
    }
    if (!st->ops->sweep) {
        sweep_remote(s, startup); /* sweep_remote or rs_after ends the chore */
        return;
    }
    c.peers = startup ? sl_cat_peers(s->cat) : 0;
    err = st->ops->sweep(st, verdict, &c, &removed, &moved);
    if (err && err != -ENOENT)
        sl_log_warn("ckpt_sweep_failed", "store=%s error=\"%s\"", sl_sstore_kind(st),
                    sl_strerror(err));
    sweep_done(s, startup, !c.unsure && !err, removed, moved, 0);
    sl_cat_chore_done(s->cat, SL_CHORE_SWEEP);
}
