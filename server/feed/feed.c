/* The feeding service's lifecycle: load jobs from the catalog, hand out the service tables. */
#include "internal.h"

#include "err.h"
#include "log.h"
#include "store/quarantine.h"
#include "store/store.h"
#include "util/clock.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ".<ext>." + 64 hex digits + ".new": the staged name's suffix after the dataset name. */
#define STAGED_SUFFIX_LEN(ext) (strlen(ext) + 2 + 64 + sizeof(".new") - 1)

static int ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);

    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The catalog's checksum of the file of kind `ext` ("lengths" or "labels") of a dataset, or NULL
 * if the catalog has no such file. */
static const char *recorded_sha(const sl_cat_dataset *ds, const char *ext)
{
    if (strcmp(ext, "labels") == 0)
        return ds->has_labels ? ds->labels_sha256 : NULL;
    return ds->has_lengths ? ds->lengths_sha256 : NULL;
}

/* Startup: finish or undo the lengths (and, the same way, labels) uploads a crash interrupted
 * (upload_finish in datasets.c writes ".<name>.lengths.<n>.tmp", renames it to
 * ".<name>.lengths.<sha256>.new", records the checksum in the catalog, then renames the file to
 * "<name>.lengths"):
 * - a ".tmp" file is an unfinished upload, redundant: removed;
 * - a ".new" file whose checksum is the catalog's was recorded but not moved: moved into place
 *   (over the lengths it replaces). Any other ".new" file is not the catalog's: quarantined;
 * - "<name>.lengths" of a dataset the catalog does not have or has without lengths (a crash
 *   between a delete's commit and its unlink, or a catalog that is older than the file or new):
 *   quarantined, never removed (server/store/quarantine.h). With q NULL such files stay.
 * Returns 0, or the catalog's error if it cannot be read. */
/* With other replicas connected, files younger than this are left to them (as the checkpoint
 * sweep at start does). */
#define SHARED_GRACE_S 600

static int recover_files(sl_feed *f, const char *dir, sl_quar *q, const char *ext)
{
    char name[SL_CAT_FEED_NAME_MAX + 1], from[4400], to[4400], mid[16], tail[16];
    size_t sfx = STAGED_SUFFIX_LEN(ext), el = strlen(ext);
    int changed = 0, err = 0, peers = sl_cat_peers(f->cat);
    time_t now = time(NULL);
    struct dirent *e;
    DIR *d;

    snprintf(mid, sizeof(mid), ".%s.", ext);
    snprintf(tail, sizeof(tail), ".%s", ext);
    if (sl_store_opendir(&d, dir) != 0)
        return 0;
    while (!err && (e = readdir(d)) != NULL) {
        const char *file = e->d_name, *action = NULL;
        size_t n = strlen(file), k;
        struct stat st;
        sl_cat_dataset ds;
        int rc, promote = 0;

        if (fstatat(dirfd(d), file, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        /* Replicas share the dir: a young file may be another one's upload on its way. */
        if (peers && now - st.st_mtime < SHARED_GRACE_S)
            continue;
        if (file[0] == '.' && ends_with(file, n, ".tmp") && strstr(file, mid)) {
            action = "removed";
        } else if (file[0] == '.' && ends_with(file, n, ".new") && n > sfx + 1 &&
                   strncmp(file + n - sfx, mid, el + 2) == 0 && (k = n - sfx - 1) < sizeof(name)) {
            memcpy(name, file + 1, k);
            name[k] = '\0';
            rc = sl_cat_dataset_get(f->cat, &ds, name);
            if (rc != 0 && rc != SL_ENOTFOUND) {
                err = rc;
                break;
            }
            promote = rc == 0 && recorded_sha(&ds, ext) &&
                      strncmp(file + n - sfx + el + 2, recorded_sha(&ds, ext), 64) == 0;
            action = promote ? "moved into place" : "quarantined";
        } else if (file[0] != '.' && ends_with(file, n, tail) && (k = n - el - 1) < sizeof(name)) {
            memcpy(name, file, k);
            name[k] = '\0';
            rc = sl_cat_dataset_get(f->cat, &ds, name);
            if (rc != 0 && rc != SL_ENOTFOUND) {
                err = rc;
                break;
            }
            if (rc == 0 && recorded_sha(&ds, ext))
                continue;
            action = "quarantined";
        } else {
            continue;
        }
        snprintf(from, sizeof(from), "%s/%s", dir, file);
        if (promote) {
            snprintf(to, sizeof(to), "%s/%s.%s", dir, name, ext);
            rc = sl_store_rename(from, to);
        } else if (strcmp(action, "removed") == 0) {
            rc = sl_store_unlink(from);
        } else if (!q) {
            continue;
        } else {
            rc =
                sl_quar_move(q, dir, file,
                             strcmp(ext, "labels") == 0 ? "labels file the catalog does not know"
                                                        : "lengths file the catalog does not know");
        }
        if (rc != 0) {
            sl_log_warn("dataset_file_recover_failed", "file=%s error=\"%s\"", from,
                        sl_store_strerror(rc));
            continue;
        }
        changed = 1;
        sl_log_info(strcmp(ext, "labels") == 0 ? "labels_recovered" : "lengths_recovered",
                    "file=%s action=\"%s\"", file, action);
    }
    closedir(d);
    if (changed) {
        if (sl_store_fsync_dir(dir) != 0)
            sl_log_warn("lengths_recover_failed", "dir=%s error=\"fsync failed\"", dir);
    }
    return err;
}

/* 16 random hex digits (a clock-and-pid mix if the kernel has no randomness to give). */
static void random_tag(char *out, size_t len)
{
    uint64_t v;

    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v))
        v = sl_mono_ns() ^ ((uint64_t)getpid() << 32);
    snprintf(out, len, "%016llx", (unsigned long long)v);
}

/* sl_feed.load_row: a job whose load waited for its labels, loaded from its row unless it is in
 * memory already. */
static int load_if_absent(const sl_cat_job *row, void *arg)
{
    sl_feed *f = arg;

    return feed_job_find(f, row->name) ? 0 : feed_job_load(row, f);
}

int sl_feed_new(sl_feed **out, uv_loop_t *loop, sl_cat *cat, const char *data_dir,
                sl_quar *quarantine)
{
    sl_feed *f = calloc(1, sizeof(*f));
    char dir[sizeof(f->data_dir) + 16];
    int err;

    *out = NULL;
    if (!f)
        return -ENOMEM;
    f->load_row = load_if_absent;
    f->loop = loop;
    f->cat = cat;
    random_tag(f->tmp_tag, sizeof(f->tmp_tag));
    if (strlen(data_dir) >= sizeof(f->data_dir) - 64) {
        free(f);
        return -ENAMETOOLONG;
    }
    snprintf(f->data_dir, sizeof(f->data_dir), "%s", data_dir);
    snprintf(dir, sizeof(dir), "%s/datasets", f->data_dir);
    if ((err = sl_store_mkdirs(dir)) != 0) {
        sl_log_error("datasets_dir_failed", "path=%s error=\"%s\"", dir, sl_store_strerror(err));
        free(f);
        return err;
    }
    f->hooks.streams_end = feed_streams_end;
    f->hooks.epoch_began = feed_streams_epoch_began;
    f->hooks.plan_ready = feed_job_plan_ready;
    err = recover_files(f, dir, quarantine, "lengths");
    if (!err)
        err = recover_files(f, dir, quarantine, "labels");
    if (!err)
        err = feed_reports_init(f);
    if (!err)
        err = sl_cat_job_list(cat, feed_job_load, f);
    if (!err && sl_cat_shared(cat))
        err = feed_sync_init(f);
    if (err) {
        sl_feed_free(f);
        return err;
    }
    feed_datasets_service(f);
    feed_jobs_service(f);
    feed_epochs_service(f);
    feed_stream_service(f);
    *out = f;
    return 0;
}

void sl_feed_free(sl_feed *f)
{
    if (!f)
        return;
    f->wcat = NULL; /* the loop has ended: what is left is written here */
    feed_sync_close(f);
    feed_reports_close(f);
    while (f->jobs)
        feed_job_remove(f, f->jobs, SL_RPC_UNAVAILABLE, "server shutting down");
    free(f->scratch);
    free(f);
}

void sl_feed_drain(sl_feed *f)
{
    if (!f)
        return;
    f->shutting_down = 1; /* the reads' completions load no job and answer no call */
    while (feed_labels_reading(f))
        uv_run(f->loop, UV_RUN_ONCE);
}

void sl_feed_set_writer(sl_feed *f, sl_cat *wcat)
{
    f->wcat = wcat;
}

void sl_feed_set_metrics(sl_feed *f, sl_metrics *m)
{
    f->metrics = m;
}

const sl_rpc_service *sl_feed_service(sl_feed *f, int i)
{
    return i >= 0 && i < SL_FEED_N_SERVICES ? &f->svcs[i] : NULL;
}
