/* Labels of datasets in memory: each stored labels file grouped by class (sl_sample_labels) once,
 * shared by every job of the dataset across epochs, and freed when the last job lets go. Loop
 * thread (in the catalog lane with PostgreSQL), except read_work.
 *
 * A labels file holds one u32 little-endian class id per sample; it is read through the store
 * (no symbolic link is followed) and must have the size and the checksum the catalog records.
 * Reading is O(N) (at N = 1e8 a 400 MB file, hashed and sorted by class): it runs on libuv's
 * worker pool, never on the loop, and what needs the labels waits for it without holding the
 * loop or the lane: a CreateJob is parked and run again once they are read (park), a job loaded
 * from the catalog (at start, or another replica's) is added then (`loads`), and calls naming
 * such a job meanwhile are parked too (feed_labels_park_job). The labels are held once per
 * (dataset, checksum): 4 bytes per sample plus 8 per class.
 */
#include "internal.h"

#include "err.h"
#include "log.h"
#include "util/array.h"
#include "shard/shard.h"
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define READ_PIECE (1u << 20)

struct flabels {
    int refs;  /* the jobs', parked calls', and the worker's while it reads */
    int state; /* 0 reading, 1 ready, -1 failed (err, msg) */
    int err;
    char msg[512];
    sl_feed *f;
    char dataset[SL_CAT_FEED_NAME_MAX + 1];
    char sha256[65];
    uint64_t n;
    char path[4300];
    sl_sample_labels *l;
    fwaiters waiters;                        /* calls parked until the labels are read */
    char (*loads)[SL_CAT_FEED_NAME_MAX + 1]; /* jobs to load from the catalog once they are */
    size_t nloads, cap_loads;
    sl_cat_work work;
    flabels *next;
};

/* A call parked until labels are read: its handler runs again then on a copy of its request. */
typedef struct fparked {
    flabels *fl; /* referenced until the handler ran again */
    /* Parked on the load of this job (feed_labels_park_job), "" otherwise: if the labels fail,
     * the job is not loaded and the call gets their error, not NOT_FOUND. */
    char job[SL_CAT_FEED_NAME_MAX + 1];
    feed_handler h;
    void *arg;
    const ProtobufCMessageDescriptor *desc;
    size_t len;
    uint8_t bytes[];
} fparked;

/* Read the n labels of fd, hashing them; the checksum must be `sha256`. */
static int read_labels(uint32_t *v, int fd, uint64_t n, const char *sha256, char *msg, size_t len)
{
    char hex[SL_SHARD_HEX_LEN + 1];
    uint8_t *buf = malloc(READ_PIECE);
    sl_sha256 *h = NULL;
    uint64_t done = 0;
    int err = buf ? sl_sha256_new(&h) : -ENOMEM;

    if (!err)
        err = sl_sha256_reset(h);
    while (!err && done < n) {
        size_t want = (n - done) * 4 < READ_PIECE ? (size_t)(n - done) * 4 : READ_PIECE;
        ssize_t got = pread(fd, buf, want, (off_t)(done * 4));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0 || (size_t)got % 4) {
            err = got < 0 ? -errno : SL_ECORRUPT;
            break;
        }
        err = sl_sha256_update(h, buf, (size_t)got);
        for (size_t i = 0; !err && i < (size_t)got / 4; i++)
            v[done + i] = (uint32_t)buf[4 * i] | (uint32_t)buf[4 * i + 1] << 8 |
                          (uint32_t)buf[4 * i + 2] << 16 | (uint32_t)buf[4 * i + 3] << 24;
        done += (size_t)got / 4;
    }
    if (!err && (err = sl_sha256_final(h, hex)) == 0 && strcmp(hex, sha256) != 0)
        err = SL_ECORRUPT;
    if (err)
        snprintf(msg, len, "labels file: %s",
                 err == SL_ECORRUPT ? "checksum differs from the catalog's" : sl_strerror(err));
    sl_sha256_free(h);
    free(buf);
    return err;
}

int feed_labels_read(sl_sample_labels **out, int fd, uint64_t n, const char *sha256, char *msg,
                     size_t len)
{
    uint32_t *v = NULL;
    struct stat st;
    int err;

    *out = NULL;
    /* The size first: a count from the catalog is trusted only as far as the file bears it out,
     * so nothing is allocated for a file that cannot hold it. */
    if (fstat(fd, &st) != 0) {
        err = -errno;
        snprintf(msg, len, "labels file: %s", sl_strerror(err));
        return err;
    }
    if (n == 0 || n > SL_SAMPLE_MAX_N || n > SIZE_MAX / 4 || (uint64_t)st.st_size != n * 4) {
        snprintf(msg, len, "labels file has %lld bytes, not %llu (4 per sample)",
                 (long long)st.st_size, n > UINT64_MAX / 4 ? 0ull : (unsigned long long)n * 4);
        return SL_ECORRUPT;
    }
    if (!(v = malloc((size_t)n * 4))) {
        snprintf(msg, len, "out of memory for %llu labels", (unsigned long long)n);
        return -ENOMEM;
    }
    err = read_labels(v, fd, n, sha256, msg, len);
    if (!err)
        err = sl_sample_labels_new(out, v, n, msg, len);
    free(v);
    return err;
}

static void read_work(uv_work_t *w)
{
    flabels *fl = w->data;
    char why[256];
    int fd = sl_store_open(fl->path, O_RDONLY, 0);

    if (fd < 0) {
        fl->err = fd;
        snprintf(fl->msg, sizeof(fl->msg), "cannot open the labels of dataset '%s': %s",
                 fl->dataset, sl_store_strerror(fd));
        return;
    }
    fl->err = feed_labels_read(&fl->l, fd, fl->n, fl->sha256, why, sizeof(why));
    if (fl->err)
        snprintf(fl->msg, sizeof(fl->msg), "dataset '%s': %s", fl->dataset, why);
    close(fd);
}

/* In the lane: the jobs whose load waited are loaded from their rows now (a job deleted
 * meanwhile is gone from the catalog too), then the parked calls run again and find them. */
static void read_done(uv_work_t *w, int status)
{
    flabels *fl = w->data;
    sl_feed *f = fl->f;

    if (status != 0 && !fl->err) {
        fl->err = SL_ECANCELLED;
        snprintf(fl->msg, sizeof(fl->msg), "reading the labels of dataset '%s' was cancelled",
                 fl->dataset);
    }
    fl->state = fl->err ? -1 : 1;
    if (fl->err)
        sl_log_warn("labels_read_failed", "dataset=%s error=\"%s\"", fl->dataset, fl->msg);
    else
        sl_log_info("labels_read", "dataset=%s samples=%llu classes=%u", fl->dataset,
                    (unsigned long long)fl->n, sl_sample_labels_classes(fl->l));
    for (size_t i = 0; i < fl->nloads; i++) {
        int err = SL_ECANCELLED;
        if (!f->shutting_down && fl->state == 1)
            err = sl_cat_job_get(f->cat, fl->loads[i], f->load_row, f);
        if (err && err != SL_ENOTFOUND)
            sl_log_error("job_load_failed", "job=%s error=\"%s\"", fl->loads[i],
                         fl->state == 1 ? sl_strerror(err) : fl->msg);
    }
    free(fl->loads);
    fl->loads = NULL;
    fl->nloads = fl->cap_loads = 0;
    feed_waiters_run(&fl->waiters, f, fl->dataset);
    flabels_unref(f, fl); /* the worker's */
}

/* Start reading the labels of dataset d on the worker pool into a new entry of f->labels. */
static int start_read(flabels **out, sl_feed *f, const sl_cat_dataset *d, char *msg, size_t len)
{
    flabels *fl = calloc(1, sizeof(*fl));
    int err;

    *out = NULL;
    if (!fl) {
        snprintf(msg, len, "out of memory");
        return -ENOMEM;
    }
    if ((err = feed_labels_path(f, d->name, fl->path, sizeof(fl->path))) != 0) {
        snprintf(msg, len, "labels path of dataset '%s' too long", d->name);
        free(fl);
        return err;
    }
    fl->refs = 2; /* the caller's and the worker's */
    fl->f = f;
    fl->n = d->samples;
    snprintf(fl->dataset, sizeof(fl->dataset), "%s", d->name);
    snprintf(fl->sha256, sizeof(fl->sha256), "%s", d->labels_sha256);
    fl->work.work.data = fl;
    if (sl_cat_queue_work(f->cat, f->loop, &fl->work, read_work, read_done) != 0) {
        snprintf(msg, len, "cannot queue the read of the labels of dataset '%s'", d->name);
        free(fl);
        return SL_EUNAVAILABLE;
    }
    fl->next = f->labels;
    f->labels = fl;
    *out = fl;
    return FEED_PENDING;
}

int feed_labels_get(flabels **out, sl_feed *f, const char *dataset, char *msg, size_t len)
{
    flabels *fl;
    sl_cat_dataset d;
    int err = sl_cat_dataset_get(f->cat, &d, dataset);

    *out = NULL;
    if (err) {
        snprintf(msg, len, "dataset '%s': %s", dataset, sl_strerror(err));
        return err;
    }
    if (!d.has_labels) {
        snprintf(msg, len, "dataset '%s' has no labels (upload them with `sluice dataset labels`)",
                 dataset);
        return SL_ESTATE;
    }
    for (fl = f->labels; fl; fl = fl->next)
        if (strcmp(fl->dataset, dataset) == 0 && strcmp(fl->sha256, d.labels_sha256) == 0)
            break;
    if (!fl)
        return start_read(out, f, &d, msg, len);
    if (fl->state < 0) {
        /* Held only by calls parked on it, whose rerun lands here: they get its failure. */
        snprintf(msg, len, "%s", fl->msg);
        return fl->err;
    }
    fl->refs++;
    *out = fl;
    return fl->state == 1 ? 0 : FEED_PENDING;
}

static void parked_run(sl_rpc_call *call, sl_feed *f, const char *dataset)
{
    fparked *p = sl_rpc_call_data(call);
    ProtobufCMessage *m;

    (void)dataset;
    sl_rpc_call_set_data(call, NULL, NULL);
    if (!p)
        return;
    if (sl_rpc_call_is_done(call))
        goto out;
    if (f->shutting_down) {
        sl_rpc_call_finish(call, SL_RPC_UNAVAILABLE, "server shutting down");
    } else if (p->job[0] && p->fl->state < 0) {
        sl_rpc_call_fail(call, p->fl->err, "job '%s' cannot be loaded: %s", p->job, p->fl->msg);
    } else if (!(m = protobuf_c_message_unpack(p->desc, NULL, p->len, p->bytes))) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
    } else {
        p->h(call, m, p->arg);
        protobuf_c_message_free_unpacked(m, NULL);
    }
out:
    flabels_unref(f, p->fl);
    free(p);
}

/* Park `call` on fl: once the labels are read (or failed), h(call, copy of m, arg) runs again. */
static int park(flabels *fl, sl_rpc_call *call, const ProtobufCMessage *m, feed_handler h,
                void *arg)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    fparked *p = malloc(sizeof(*p) + n);

    if (!p)
        return -ENOMEM;
    p->fl = fl;
    p->job[0] = '\0';
    p->h = h;
    p->arg = arg;
    p->desc = m->descriptor;
    p->len = protobuf_c_message_pack(m, p->bytes);
    if (feed_waiters_add(&fl->waiters, call, parked_run) != 0) {
        free(p);
        return -ENOMEM;
    }
    fl->refs++; /* the parked call's, until its handler ran again */
    sl_rpc_call_set_data(call, p, free);
    return 0;
}

int feed_labels_park(flabels *fl, sl_rpc_call *call, const ProtobufCMessage *m, feed_handler h,
                     void *arg)
{
    return fl->state == 0 ? park(fl, call, m, h, arg) : SL_ESTATE;
}

int feed_labels_defer_load(flabels *fl, const char *job)
{
    for (size_t i = 0; i < fl->nloads; i++)
        if (strcmp(fl->loads[i], job) == 0)
            return 0;
    if (sl_array_grow((void **)&fl->loads, &fl->cap_loads, fl->nloads, sizeof(*fl->loads), 4) != 0)
        return -ENOMEM;
    snprintf(fl->loads[fl->nloads++], sizeof(*fl->loads), "%s", job);
    return 0;
}

/* The labels being read that a load of `job` waits for, or NULL. */
static flabels *loading(sl_feed *f, const char *job)
{
    for (flabels *fl = f->labels; fl; fl = fl->next)
        for (size_t i = 0; fl->state == 0 && i < fl->nloads; i++)
            if (strcmp(fl->loads[i], job) == 0)
                return fl;
    return NULL;
}

int feed_labels_loading(sl_feed *f, const char *job)
{
    return loading(f, job) != NULL;
}

int feed_labels_park_job(sl_feed *f, const char *job, sl_rpc_call *call, const ProtobufCMessage *m,
                         feed_handler h, void *arg)
{
    flabels *fl = loading(f, job);

    if (!fl)
        return 0;
    if (park(fl, call, m, h, arg) != 0)
        return -ENOMEM;
    snprintf(((fparked *)sl_rpc_call_data(call))->job, SL_CAT_FEED_NAME_MAX + 1, "%s", job);
    return 1;
}

int feed_labels_reading(const sl_feed *f)
{
    for (const flabels *fl = f->labels; fl; fl = fl->next)
        if (fl->state == 0)
            return 1;
    return 0;
}

int flabels_state(const flabels *fl)
{
    return fl->state;
}

const sl_sample_labels *flabels_of(const flabels *fl)
{
    return fl && fl->state == 1 ? fl->l : NULL;
}

flabels *flabels_ref(flabels *fl)
{
    if (fl)
        fl->refs++;
    return fl;
}

void flabels_unref(sl_feed *f, flabels *fl)
{
    flabels **pp = &f->labels;

    if (!fl || --fl->refs > 0)
        return;
    while (*pp && *pp != fl)
        pp = &(*pp)->next;
    if (*pp)
        *pp = fl->next;
    sl_sample_labels_free(fl->l);
    free(fl->loads);
    free(fl);
}

int feed_spec_wants_labels(const Sluice__V1__Job *spec)
{
    return spec->stratify || spec->balance_classes || spec->n_class_weights;
}
