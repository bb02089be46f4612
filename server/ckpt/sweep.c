/* Sweeps: which files under the store root are abandoned, decided from the catalog and the
 * running uploads. At startup they remove temp files and the files of checkpoints the catalog
 * forgot or aborted; every sweep removes partial uploads that can no longer be resumed. */
#include "internal.h"

#include "err.h"
#include "log.h"
#include "store/layout.h"
#include "store/store.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

typedef struct sweep_ctx {
    sl_ckpt_svc *svc;
    const char *job;
    int startup;
    int64_t now_ms;
} sweep_ctx;

/* A partial upload stays while its checkpoint is WRITING and it runs or was touched within the
 * upload timeout (a client may resume it). */
static int keep_part(sweep_ctx *c, const char *name, int32_t rank, const struct stat *st)
{
    sl_ckpt_svc *s = c->svc;
    int64_t age_ms = c->now_ms - (int64_t)st->st_mtime * 1000;
    sl_cat_ckpt ck;
    int err = sl_cat_ckpt_get(s->cat, &ck, c->job, name);

    if (err && err != SL_ENOTFOUND)
        return 1; /* the catalog cannot say: keep it, a later sweep decides */
    if (err || ck.state != SL_CKPT_WRITING)
        return 0;
    if (ckpt_upload_find(s, ck.id, rank))
        return 1;
    return age_ms < (int64_t)s->opts.upload_timeout_ms;
}

static int sweep_keep(const char *file, const struct stat *st, void *arg)
{
    sweep_ctx *c = arg;
    char name[NAME_MAX + 1];
    sl_cat_ckpt ck;
    int32_t rank = 0;
    int err;

    switch (sl_store_classify(file, name, sizeof(name), &rank)) {
    case SL_STORE_PART:
        return keep_part(c, name, rank, st);
    case SL_STORE_TEMP:
        /* Other temp files (metadata being written) belong to a running commit unless the
         * daemon has just started. */
        return !c->startup;
    case SL_STORE_SHARD:
    case SL_STORE_META:
        break;
    default:
        return 1; /* not ours */
    }
    /* Files of checkpoints the catalog forgot (a crash between a delete's commit and its
     * unlinks) or aborted. Anything else stays. */
    if (!c->startup || sl_shard_name_check(name) != 0)
        return 1;
    err = sl_cat_ckpt_get(c->svc->cat, &ck, c->job, name);
    if (err == SL_ENOTFOUND)
        return 0;
    /* A catalog that cannot be read says nothing about the file: keep it. */
    return err || ck.state != SL_CKPT_INCOMPLETE;
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

void ckpt_sweep(sl_ckpt_svc *s, int startup)
{
    char dir[PATH_MAX];
    struct dirent *e;
    DIR *d;
    int removed, total = 0, err, held = 0;

    if (s->dir_lost || (held = data_dir_held(s)) <= 0) {
        if (held < 0)
            return; /* cannot tell now: try again at the next sweep */
        if (!s->dir_lost)
            sl_log_error("data_dir_replaced",
                         "path=%s hint=\"the data dir this daemon locked was removed or replaced; "
                         "partial uploads are no longer swept: restart the daemon\"",
                         s->data_dir);
        s->dir_lost = 1;
        return;
    }
    if (sl_store_opendir(&d, s->root) != 0)
        return;
    while ((e = readdir(d)) != NULL) {
        sweep_ctx c = {s, e->d_name, startup, sl_now_ms()};
        if (sl_shard_name_check(e->d_name) != 0 ||
            ckpt_job_dir(s, dir, sizeof(dir), e->d_name) != 0)
            continue;
        err = sl_store_sweep(dir, sweep_keep, &c, &removed);
        if (err)
            sl_log_warn("ckpt_sweep_failed", "dir=%s error=\"%s\"", dir, sl_strerror(err));
        total += removed;
    }
    closedir(d);
    if (total)
        sl_log_info("ckpt_sweep", "removed=%d startup=%d", total, startup);
}
