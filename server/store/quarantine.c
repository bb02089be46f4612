/* Files the catalog does not know, moved out of the way instead of removed. See quarantine.h. */
#include "quarantine.h"

#include "store.h"

#include "err.h"
#include "log.h"
#include "util/clock.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define WALK_DEPTH 32  /* batch/checkpoints/<job>/<file> is 4 deep; more is not ours */
#define NAME_TRIES 100 /* ".1" .. ".99" after a taken name */
#define REFRESH_MS 1000

struct sl_quar {
    char data_dir[PATH_MAX];
    char root[PATH_MAX];  /* <data dir>/quarantine */
    char batch[PATH_MAX]; /* the open batch's directory, "" when none is open */
    char dirty[PATH_MAX]; /* a directory of the batch that received a file and is not synced */
    uint64_t batch_files, batch_bytes;
    int64_t walked_ms; /* time of the last walk */
    atomic_uint_least64_t moved, files, bytes;
};

/* Count the regular files under the open directory dfd (which this closes). */
static void walk(int dfd, int depth, uint64_t *files, uint64_t *bytes)
{
    DIR *d = fdopendir(dfd);
    struct dirent *e;
    struct stat st;

    if (!d) {
        close(dfd);
        return;
    }
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
            fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (S_ISREG(st.st_mode)) {
            (*files)++;
            *bytes += (uint64_t)st.st_size;
        } else if (S_ISDIR(st.st_mode) && depth < WALK_DEPTH) {
            int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (fd >= 0)
                walk(fd, depth + 1, files, bytes);
        }
    }
    closedir(d);
}

/* A quarantine that is a link (or has one on its way) is not walked: it counts as empty. */
static void walk_all(sl_quar *q)
{
    uint64_t files = 0, bytes = 0;
    int fd = sl_store_open(q->root, O_RDONLY | O_DIRECTORY, 0);

    if (fd >= 0)
        walk(fd, 0, &files, &bytes);
    atomic_store(&q->files, files);
    atomic_store(&q->bytes, bytes);
    q->walked_ms = sl_now_ms();
}

int sl_quar_new(sl_quar **out, const char *data_dir)
{
    sl_quar *q;

    *out = NULL;
    if (strlen(data_dir) >= PATH_MAX - 64)
        return -ENAMETOOLONG;
    q = calloc(1, sizeof(*q));
    if (!q)
        return -ENOMEM;
    snprintf(q->data_dir, sizeof(q->data_dir), "%s", data_dir);
    snprintf(q->root, sizeof(q->root), "%s/quarantine", data_dir);
    walk_all(q);
    *out = q;
    return 0;
}

void sl_quar_free(sl_quar *q)
{
    if (!q)
        return;
    sl_quar_end(q);
    free(q);
}

const char *sl_quar_path(const sl_quar *q)
{
    return q->root;
}

/* Open a batch: <root>/<UTC time>, or with "-2", "-3", ... if taken. Neither the quarantine nor
 * a batch is ever reached through a link: a link planted at the quarantine's name fails the
 * mkdirs with -ELOOP, one planted at a batch's name takes that name (-EEXIST, the next is
 * tried), and every move into the batch resolves its path with no link followed again. */
static int open_batch(sl_quar *q)
{
    char stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    int err = sl_store_mkdirs(q->root);

    if (err)
        return err;
    gmtime_r(&now, &tm);
    strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
    for (int i = 1; i < NAME_TRIES; i++) {
        int n = i == 1 ? snprintf(q->batch, sizeof(q->batch), "%s/%s", q->root, stamp)
                       : snprintf(q->batch, sizeof(q->batch), "%s/%s-%d", q->root, stamp, i);
        if (n < 0 || (size_t)n >= sizeof(q->batch)) {
            err = -ENAMETOOLONG;
            break;
        }
        if ((err = sl_store_mkdir(q->batch, 0750)) == 0)
            return sl_store_fsync_dir(q->root);
        if (err != -EEXIST)
            break;
    }
    q->batch[0] = '\0';
    return err;
}

/* fsync the batch directory that last received a file, if any. */
static void sync_dirty(sl_quar *q)
{
    int err;

    if (!q->dirty[0])
        return;
    err = sl_store_fsync_dir(q->dirty);
    if (err)
        sl_log_warn("quarantine_fsync_failed", "dir=%s error=\"%s\"", q->dirty, sl_strerror(err));
    q->dirty[0] = '\0';
}

/* Rename from into dir/name, or dir/name.1, ... if taken; never replaces. The name used goes to
 * `to`. */
static int move_noreplace(const char *from, const char *dir, const char *name, char *to, size_t len)
{
    int err = -EEXIST;

    for (int i = 0; i < NAME_TRIES && err == -EEXIST; i++) {
        int n =
            i ? snprintf(to, len, "%s/%s.%d", dir, name, i) : snprintf(to, len, "%s/%s", dir, name);
        if (n < 0 || (size_t)n >= len)
            return -ENAMETOOLONG;
        err = sl_store_rename_noreplace(from, to);
    }
    return err;
}

int sl_quar_move(sl_quar *q, const char *dir, const char *name, const char *why)
{
    char from[PATH_MAX], dest[PATH_MAX], to[PATH_MAX];
    size_t k = strlen(q->data_dir);
    const char *rel = dir + k;
    struct stat st;
    int n, err;

    if (strncmp(dir, q->data_dir, k) != 0 || (*rel != '\0' && *rel != '/'))
        return SL_EINVAL;
    n = snprintf(from, sizeof(from), "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof(from))
        return -ENAMETOOLONG;
    if ((err = sl_store_stat(from, &st)) != 0)
        return err;
    if (!q->batch[0] && (err = open_batch(q)) != 0)
        goto out;
    n = snprintf(dest, sizeof(dest), "%s%s", q->batch, rel);
    if (n < 0 || (size_t)n >= sizeof(dest)) {
        err = -ENAMETOOLONG;
        goto out;
    }
    if ((err = sl_store_mkdirs(dest)) != 0)
        goto out;
    if (strcmp(dest, q->dirty) != 0)
        sync_dirty(q);
    if ((err = move_noreplace(from, dest, name, to, sizeof(to))) != 0)
        goto out;
    snprintf(q->dirty, sizeof(q->dirty), "%s", dest);
    q->batch_files++;
    q->batch_bytes += (uint64_t)st.st_size;
    atomic_fetch_add(&q->moved, 1);
    atomic_fetch_add(&q->files, 1);
    atomic_fetch_add(&q->bytes, (uint64_t)st.st_size);
    sl_log_info("quarantined", "file=%s to=%s bytes=%lld why=\"%s\"", from, to,
                (long long)st.st_size, why);
out:
    if (err)
        sl_log_limited(SL_LOG_WARN, 1000, "quarantine_failed",
                       "file=%s quarantine=%s error=\"%s\" hint=\"the file stays where it is\"",
                       from, q->root, sl_store_strerror(err));
    return err;
}

void sl_quar_end(sl_quar *q)
{
    sync_dirty(q);
    if (q->batch_files)
        sl_log_warn("quarantine_batch",
                    "files=%llu bytes=%llu path=%s hint=\"files the catalog does not know were "
                    "moved here instead of being removed: bring them back or remove them (see "
                    "docs/checkpoints.md, Backup and restore)\"",
                    (unsigned long long)q->batch_files, (unsigned long long)q->batch_bytes,
                    q->batch);
    q->batch[0] = '\0';
    q->batch_files = q->batch_bytes = 0;
}

void sl_quar_refresh(sl_quar *q)
{
    if (sl_now_ms() - q->walked_ms >= REFRESH_MS)
        walk_all(q);
}

void sl_quar_get_counts(const sl_quar *q, sl_quar_counts *out)
{
    sl_quar *m = (sl_quar *)q;

    out->moved = atomic_load(&m->moved);
    out->files = atomic_load(&m->files);
    out->bytes = atomic_load(&m->bytes);
}
