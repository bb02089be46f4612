/* Sweeps: which files under the store root are abandoned, decided from the catalog and the
 * running uploads. Only what the catalog knows to be garbage is removed: partial uploads of
 * WRITING checkpoints untouched for the upload timeout, metadata temp files at startup, and files
 * of checkpoints whose removal the catalog recorded (Delete, Abort) that are no newer than that
 * decision. Any other checkpoint file the catalog does not know goes to the quarantine
 * (server/store/quarantine.h): a catalog restored from a backup, or a new one after catalog.db
 * was lost, does not know what was written after it, and removing that was data loss. */
#include "internal.h"

#include "err.h"
#include "log.h"
#include "store/layout.h"
#include "store/quarantine.h"
#include "store/store.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

typedef struct sweep_ctx {
    sl_ckpt_svc *svc;
    const char *job;
    const char *dir; /* the job's directory */
    int startup;
    int64_t now_ms;
    int moved;  /* files quarantined */
    int unsure; /* the catalog could not say about a file, which was kept */
} sweep_ctx;

enum { SWEEP_REMOVE = 0, SWEEP_KEEP = 1, SWEEP_QUARANTINE = 2 };

/* A file of checkpoint `name` that the catalog does not know: garbage if the catalog recorded
 * the removal of that checkpoint's files when the file already was what it is (a crash came
 * between the decision and the unlinks), else quarantined (written after the decision, or never
 * known to this catalog). */
static int unknown(sweep_ctx *c, const char *name, const struct stat *st)
{
    int64_t removed_ms = 0;
    int64_t mtime_ms = (int64_t)st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000;
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
static int keep_part(sweep_ctx *c, const char *name, int32_t rank, const struct stat *st)
{
    sl_ckpt_svc *s = c->svc;
    int64_t age_ms = c->now_ms - (int64_t)st->st_mtime * 1000;
    sl_cat_ckpt ck;
    int err = sl_cat_ckpt_get(s->cat, &ck, c->job, name);

    if (err && err != SL_ENOTFOUND) {
        c->unsure = 1;
        return SWEEP_KEEP;
    }
    if (err || ck.state != SL_CKPT_WRITING)
        return unknown(c, name, st);
    if (ckpt_upload_find(s, ck.id, rank))
        return SWEEP_KEEP;
    return age_ms < (int64_t)s->opts.upload_timeout_ms ? SWEEP_KEEP : SWEEP_REMOVE;
}

/* At startup, a shard file or metadata file: known if the catalog has its checkpoint (not
 * INCOMPLETE) with a shard row for the rank, or COMPLETE for the metadata file. */
static int keep_file(sweep_ctx *c, sl_store_kind kind, const char *name, int32_t rank,
                     const struct stat *st)
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
    return err ? unknown(c, name, st) : SWEEP_KEEP;
}

static int verdict(sweep_ctx *c, const char *file, const struct stat *st)
{
    char name[NAME_MAX + 1];
    int32_t rank = 0;
    size_t n = strlen(file);
    sl_store_kind kind = sl_store_classify(file, name, sizeof(name), &rank);

    switch (kind) {
    case SL_STORE_PART:
        return keep_part(c, name, rank, st);
    case SL_STORE_TEMP:
        /* A temp file of an atomic write (metadata being written) is redundant once the daemon
         * has just started: the write never finished. Other hidden files are not ours. */
        return !(c->startup && n > 4 && strcmp(file + n - 4, ".tmp") == 0);
    case SL_STORE_SHARD:
    case SL_STORE_META:
        /* Only the startup sweep looks at them; a name no request could make is not ours. */
        if (!c->startup || sl_shard_name_check(name) != 0)
            return SWEEP_KEEP;
        return keep_file(c, kind, name, rank, st);
    default:
        return SWEEP_KEEP; /* not ours */
    }
}

/* sl_store_sweep only removes; a file to quarantine is moved here and kept for the sweep. It
 * leaves the directory while the sweep reads it, which POSIX allows (it is not read again). A file
 * that cannot be moved stays. */
static int sweep_keep(const char *file, const struct stat *st, void *arg)
{
    sweep_ctx *c = arg;
    sl_quar *q = c->svc->opts.quarantine;
    int v = verdict(c, file, st);

    if (v != SWEEP_QUARANTINE)
        return v;
    if (q && sl_quar_move(q, c->dir, file, "checkpoint file the catalog does not know") == 0)
        c->moved++;
    return SWEEP_KEEP;
}

/* Whether the data dir is still the one whose LOCK the daemon holds: 1, 0, or -1 if it cannot
 * tell now. If it was removed (and perhaps made again for another daemon), the files at its path
 * are not in this daemon's catalog and a sweep would remove them: found when a daemon left
 * running on a removed data dir deleted a new daemon's partial uploads every 60 s
 * (tests/bench/soak.c, docs/hardening.md). */
static int data_dir_held(const sl_ckpt_svc *s)
{
    char path[PATH_MAX + 8];
    int held;

    if (s->opts.lock_fd < 0)
        return 1;
    snprintf(path, sizeof(path), "%s/LOCK", s->data_dir);
    held = sl_store_same_file(s->opts.lock_fd, path);
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

/* Sweep one job directory; returns 1 if the catalog could say about every file. */
static int sweep_job(sl_ckpt_svc *s, const char *job, int startup, int *removed, int *moved)
{
    char dir[PATH_MAX];
    sweep_ctx c = {s, job, dir, startup, sl_now_ms(), 0, 0};
    int err;

    *removed = *moved = 0;
    if (ckpt_job_dir(s, dir, sizeof(dir), job) != 0)
        return 1;
    err = sl_store_sweep(dir, sweep_keep, &c, removed);
    if (err)
        sl_log_warn("ckpt_sweep_failed", "dir=%s error=\"%s\"", dir, sl_strerror(err));
    /* Quarantined files left the directory: make that durable, as sl_store_sweep does after
     * removals. */
    if (c.moved && !*removed && (err = sl_store_fsync_dir(dir)) != 0)
        sl_log_warn("ckpt_sweep_failed", "dir=%s error=\"%s\"", dir, sl_strerror(err));
    *moved = c.moved;
    return !c.unsure && !err;
}

void ckpt_sweep(sl_ckpt_svc *s, int startup)
{
    struct dirent *e;
    DIR *d;
    int removed, moved, total = 0, quarantined = 0, sure = 1, err;

    if (!may_sweep(s))
        return;
    if (sl_store_opendir(&d, s->root) != 0)
        return;
    while ((e = readdir(d)) != NULL) {
        if (sl_shard_name_check(e->d_name) != 0)
            continue;
        sure &= sweep_job(s, e->d_name, startup, &removed, &moved);
        total += removed;
        quarantined += moved;
    }
    closedir(d);
    /* The startup sweep dealt with every file of every recorded removal. */
    if (startup && sure && (err = sl_cat_removals_clear(s->cat)) != 0)
        sl_log_warn("ckpt_removals_clear_failed", "error=\"%s\"", sl_strerror(err));
    /* The startup's batch stays open for the other startup sweeps (sluiced ends it). */
    if (!startup && s->opts.quarantine)
        sl_quar_end(s->opts.quarantine);
    if (total || quarantined)
        sl_log_info("ckpt_sweep", "removed=%d quarantined=%d startup=%d", total, quarantined,
                    startup);
}
