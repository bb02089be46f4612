/* The object-storage backend of the shard store (sstore.h) over the S3 client (s3.h).
 *
 * Objects are "<job>/<file>" under the configured prefix, with the same bytes as the directory
 * backend's files. Every shard is a multipart upload (one part for a small one): part 1 is the
 * header and the first data bytes, parts 2..n the rest; part 1 goes last, once the checksum in
 * its header is known, and the state object is then sealed (every part's ETag, the checksum).
 * CompleteMultipartUpload makes the shard visible whole, and only after the catalog recorded it
 * (w_publish), so that an attempt fenced out in the catalog never publishes; a rank recorded but
 * not published (its replica died or paused in between) is completed by Commit from the sealed
 * state (s3s_recover). While it is written, two more objects keep it resumable, by another
 * process too:
 *   .<name>_shard_<rank>.shard.part   the upload's state: its upload id, the parts stored with
 *                                     their ETags, the data bytes they hold and the SHA-256 state
 *                                     after them (written after each part that extends them),
 *                                     and once sealed the checksum and every part's ETag;
 *   .<name>_shard_<rank>.shard.part.head   the data bytes of part 1, stored once they are all
 *                                          here.
 * The state object has the name of a directory's partial file, so the sweeps treat both alike; a
 * removed state object takes its multipart upload (aborted) and head object with it.
 *
 * Parts are sent by a pool of threads of this backend, at most `inflight` at once per upload, so
 * the write lane hands over a part and goes on while it travels.
 *
 * This file: readers, small objects, removals, sweeps and the constructor; writers and the part
 * threads are in sstore_s3_write.c, the state object in sstore_s3_state.c.
 */
#include "sstore_s3_internal.h"

#include "layout.h"

#include "err.h"
#include "log.h"
#include "util/buf.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- readers, small objects ---- */

static int s_r_open(sl_sstore *base, const char *job, const char *file, sl_sreader **out,
                    uint64_t *size, char *msg, size_t msglen)
{
    s3store *s = (s3store *)base;
    sl_sreader *r = calloc(1, sizeof(*r));
    int err;

    *out = NULL;
    if (!r)
        return -ENOMEM;
    r->s = s;
    if (obj_key(r->key, sizeof(r->key), job, file, NULL) != 0) {
        snprintf(msg, msglen, "object key too long");
        free(r);
        return SL_ELIMIT;
    }
    err = sl_s3_head(s->c, r->key, size, NULL, msg, msglen);
    if (err) {
        free(r);
        return err;
    }
    *out = r;
    return 0;
}

static int s_r_read(sl_sreader *r, void *buf, size_t len, uint64_t off, char *msg, size_t msglen)
{
    return len ? sl_s3_get(r->s->c, r->key, off, buf, len, msg, msglen) : 0;
}

static void s_r_close(sl_sreader *r)
{
    free(r);
}

static int s_put(sl_sstore *base, const char *job, const char *file, const void *buf, size_t len,
                 char *msg, size_t msglen)
{
    s3store *s = (s3store *)base;
    char key[SL_S3_KEY_MAX];

    if (obj_key(key, sizeof(key), job, file, NULL) != 0) {
        snprintf(msg, msglen, "object key too long");
        return SL_ELIMIT;
    }
    return sl_s3_put(s->c, key, buf, len, msg, msglen);
}

static int s_stat(sl_sstore *base, const char *job, const char *file, uint64_t *size)
{
    s3store *s = (s3store *)base;
    char key[SL_S3_KEY_MAX], msg[256];

    if (obj_key(key, sizeof(key), job, file, NULL) != 0)
        return SL_ELIMIT;
    return sl_s3_head(s->c, key, size, NULL, msg, sizeof(msg));
}

/* Remove an object; a partial upload's state object takes its upload and head with it. */
static int remove_key(s3store *s, const char *job, const char *file)
{
    char key[SL_S3_KEY_MAX], msg[256], name[NAME_MAX + 1];
    int32_t rank;

    if (obj_key(key, sizeof(key), job, file, NULL) != 0)
        return SL_ELIMIT;
    if (sl_store_classify(file, name, sizeof(name), &rank) == SL_STORE_PART) {
        s3s_state_discard(s, key);
        return 0;
    }
    return sl_s3_delete(s->c, key, msg, sizeof(msg));
}

static int s_remove(sl_sstore *base, const char *job, const char *file)
{
    return remove_key((s3store *)base, job, file);
}

typedef struct ckpt_files {
    const char *name;
    char (*files)[NAME_MAX + 1];
    size_t n, cap;
} ckpt_files;

static int collect_ckpt(const char *key, uint64_t size, int64_t mtime_ms, void *arg)
{
    ckpt_files *f = arg;
    const char *file = strchr(key, '/');
    char name[NAME_MAX + 1];
    int32_t rank;
    sl_store_kind kind;

    if (!file || strchr(file + 1, '/'))
        return 0;
    file++;
    kind = sl_store_classify(file, name, sizeof(name), &rank);
    if (kind == SL_STORE_OTHER || kind == SL_STORE_TEMP || strcmp(name, f->name) != 0)
        return 0;
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 64;
        char(*p)[NAME_MAX + 1] = realloc(f->files, cap * sizeof(*p));
        if (!p)
            return -ENOMEM;
        f->files = p;
        f->cap = cap;
    }
    snprintf(f->files[f->n++], NAME_MAX + 1, "%s", file);
    return 0;
}

static int s_remove_ckpt(sl_sstore *base, const char *job, const char *name, int32_t world_size)
{
    s3store *s = (s3store *)base;
    char prefix[SL_S3_KEY_MAX], msg[256];
    ckpt_files f = {name, NULL, 0, 0};
    int err, n = snprintf(prefix, sizeof(prefix), "%s/%s", job, name);

    (void)world_size; /* the listing finds every rank's files */
    if (n < 0 || (size_t)n >= sizeof(prefix))
        return SL_ELIMIT;
    /* One listing of the keys starting with the checkpoint's name, then one request per file. */
    err = sl_s3_list(s->c, prefix, collect_ckpt, &f, msg, sizeof(msg));
    if (!err) {
        /* Partial uploads start with '.': list them too. */
        n = snprintf(prefix, sizeof(prefix), "%s/.%s", job, name);
        if (n > 0 && (size_t)n < sizeof(prefix))
            err = sl_s3_list(s->c, prefix, collect_ckpt, &f, msg, sizeof(msg));
    }
    for (size_t i = 0; i < f.n; i++) {
        int e = remove_key(s, job, f.files[i]);
        if (e && !err)
            err = e;
    }
    free(f.files);
    return err;
}

static int s_free_bytes(sl_sstore *base, uint64_t *out)
{
    (void)base;
    *out = UINT64_MAX;
    return 0;
}

/* ---- sweeps: list, then act ---- */

typedef struct list_ctx {
    sl_sstore_verdict_fn fn;
    void *arg;
} list_ctx;

static int list_one(const char *key, uint64_t size, int64_t mtime_ms, void *arg)
{
    list_ctx *c = arg;
    const char *slash = strchr(key, '/');
    char job[SL_SHARD_NAME_MAX + 1];
    size_t n = slash ? (size_t)(slash - key) : 0;
    size_t k = strlen(key);

    (void)size;
    /* "<job>/<file>" only: the quarantine's keys and anything deeper are not checkpoint files;
     * head objects go with their state object. */
    if (!slash || n == 0 || n > SL_SHARD_NAME_MAX || strchr(slash + 1, '/') ||
        (k > sizeof(HEAD_SUFFIX) - 1 &&
         strcmp(key + k - (sizeof(HEAD_SUFFIX) - 1), HEAD_SUFFIX) == 0))
        return 0;
    memcpy(job, key, n);
    job[n] = '\0';
    if (sl_shard_name_check(job) != 0)
        return 0;
    return c->fn(job, slash + 1, mtime_ms, c->arg);
}

static int s_list(sl_sstore *base, sl_sstore_verdict_fn fn, void *arg)
{
    s3store *s = (s3store *)base;
    list_ctx c = {fn, arg};
    char msg[256];
    int err = sl_s3_list(s->c, "", list_one, &c, msg, sizeof(msg));

    if (err)
        sl_log_warn("s3_list_failed", "error=\"%s\"", msg);
    return err;
}

static int s_act(sl_sstore *base, const char *job, const char *file, int64_t mtime_ms, int action)
{
    s3store *s = (s3store *)base;
    char key[SL_S3_KEY_MAX], to[SL_S3_KEY_MAX], msg[256];
    int64_t now_ms = 0;
    int err;

    if (obj_key(key, sizeof(key), job, file, NULL) != 0)
        return SL_ELIMIT;
    /* Changed since it was listed (a resumed upload wrote its state again): kept. Last-Modified
     * of a HEAD has whole seconds. */
    err = sl_s3_head(s->c, key, NULL, &now_ms, msg, sizeof(msg));
    if (err)
        return err;
    if (now_ms / 1000 != mtime_ms / 1000)
        return SL_ESTATE;
    if (action == SL_SSTORE_QUARANTINE) {
        char name[NAME_MAX + 1];
        int32_t rank;
        if (snprintf(to, sizeof(to), "quarantine/%s/%s", job, file) >= (int)sizeof(to))
            return SL_ELIMIT;
        /* A partial upload the catalog does not know: its state and head objects go to the
         * quarantine and its multipart upload is left as it is (not aborted): with the upload
         * id and ETags of the state, an operator can still complete it. */
        if (sl_store_classify(file, name, sizeof(name), &rank) == SL_STORE_PART) {
            char hfrom[SL_S3_KEY_MAX], hto[SL_S3_KEY_MAX];
            if (snprintf(hfrom, sizeof(hfrom), "%s%s", key, HEAD_SUFFIX) < (int)sizeof(hfrom) &&
                snprintf(hto, sizeof(hto), "%s%s", to, HEAD_SUFFIX) < (int)sizeof(hto) &&
                sl_s3_copy(s->c, hfrom, hto, msg, sizeof(msg)) == 0)
                sl_s3_delete(s->c, hfrom, msg, sizeof(msg));
        }
        err = sl_s3_copy(s->c, key, to, msg, sizeof(msg));
        if (err) {
            sl_log_warn("s3_quarantine_failed", "key=%s error=\"%s\"", key, msg);
            return err;
        }
        sl_log_warn("quarantined", "key=%s to=%s why=\"checkpoint file the catalog does not know\"",
                    key, to);
        return sl_s3_delete(s->c, key, msg, sizeof(msg));
    }
    return remove_key(s, job, file);
}

static void s_free(sl_sstore *base)
{
    s3store *s = (s3store *)base;

    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->nthreads; i++)
        pthread_join(s->threads[i], NULL);
    free(s->threads);
    pthread_cond_destroy(&s->work_cv);
    pthread_cond_destroy(&s->done_cv);
    pthread_mutex_destroy(&s->mu);
    sl_s3_free(s->c);
    free(s);
}

static void s_health(sl_sstore *base, sl_sstore_health *out)
{
    s3store *s = (s3store *)base;
    sl_s3_health h;

    sl_s3_health_get(s->c, &h);
    out->failures = h.failures;
    out->failing_since_ms = h.failing_since_ms;
    out->last_ok_ms = h.last_ok_ms;
}

static int s_probe(sl_sstore *base, char *msg, size_t msglen)
{
    return sl_s3_check(((s3store *)base)->c, msg, msglen);
}

static const sl_sstore_ops s3_ops = {
    .kind = "s3",
    .remote = 1,
    .hashes = 1,
    .w_open = s3s_w_open,
    .w_write = s3s_w_write,
    .w_finish = s3s_w_finish,
    .w_publish = s3s_w_publish,
    .w_release = s3s_w_release,
    .w_close = s3s_w_close,
    .held = s3s_held,
    .r_open = s_r_open,
    .r_read = s_r_read,
    .r_close = s_r_close,
    .put = s_put,
    .stat = s_stat,
    .shard_sha = s3s_shard_sha,
    .recover = s3s_recover,
    .tidy = s3s_tidy,
    .remove = s_remove,
    .remove_ckpt = s_remove_ckpt,
    .free_bytes = s_free_bytes,
    .sweep = NULL,
    .list = s_list,
    .act = s_act,
    .orphans = s3s_orphans,
    .abort_upload = s3s_abort_upload,
    .health = s_health,
    .probe = s_probe,
    .free = s_free,
};

int sl_sstore_s3_new(sl_sstore **out, const sl_s3_cfg *cfg, uint64_t part_size, int inflight,
                     char *msg, size_t msglen)
{
    s3store *s = calloc(1, sizeof(*s));
    int err;

    *out = NULL;
    if (!s)
        return -ENOMEM;
    s->base.ops = &s3_ops;
    s->part_size = part_size < PART_MIN ? PART_MIN : part_size;
    s->inflight = inflight < 1 ? 1 : inflight;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    err = sl_s3_new(&s->c, cfg, msg, msglen);
    if (!err)
        err = sl_s3_check(s->c, msg, msglen);
    /* Parts of several uploads travel at once: twice one upload's share. */
    s->nthreads = 2 * s->inflight;
    s->queue_max = 2 * s->nthreads;
    if (!err && !(s->threads = calloc((size_t)s->nthreads, sizeof(*s->threads))))
        err = -ENOMEM;
    for (int i = 0; !err && i < s->nthreads; i++) {
        if (pthread_create(&s->threads[i], NULL, s3s_pool_main, s) != 0) {
            s->nthreads = i;
            err = -EAGAIN;
            snprintf(msg, msglen, "cannot start the part threads");
        }
    }
    if (err) {
        if (!s->threads)
            s->nthreads = 0;
        s_free(&s->base);
        return err;
    }
    *out = &s->base;
    return 0;
}
