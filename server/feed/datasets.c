/* sluice.v1.Datasets: registration and per-sample lengths and labels files.
 *
 * Lengths (and labels, the same way: one u32 per sample) arrive as a client stream and are written
 * to a temporary file next to their final name while they are hashed; at the end of the stream the
 * file is made durable and staged under a name carrying its checksum, the checksum goes into the
 * catalog, then the staged file replaces the old lengths (upload_finish). Nothing is visible before
 * the bytes are durable, and a failed or interrupted upload never damages the lengths stored before
 * it. The writes run on the loop thread: they are page-cache writes of at most one message (a few
 * MiB) each.
 */
#include "internal.h"
#include "util/array.h"

#include "err.h"
#include "log.h"
#include "util/clock.h"
#include "shard/shard.h"
#include "store/store.h"
#include "util/lengths.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void describe(const sl_cat_dataset *d, Sluice__V1__Dataset *out)
{
    sluice__v1__dataset__init(out);
    out->name = (char *)d->name;
    out->samples = d->samples;
    out->has_lengths = d->has_lengths;
    out->lengths_sha256 = (char *)d->lengths_sha256;
    out->created_ms = (uint64_t)d->created_ms;
    out->jobs = d->jobs;
    out->has_labels = d->has_labels;
    out->labels_sha256 = (char *)d->labels_sha256;
    out->classes = d->classes;
}

static void reply_dataset(sl_rpc_call *call, sl_feed *f, const char *name)
{
    Sluice__V1__Dataset resp;
    sl_cat_dataset d;
    int err = sl_cat_dataset_get(f->cat, &d, name);

    if (err) {
        sl_rpc_call_fail(call, err, "dataset '%.140s': %s", name, sl_strerror(err));
        return;
    }
    describe(&d, &resp);
    sl_rpc_call_reply(call, &resp.base);
}

static void create(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    const Sluice__V1__CreateDatasetRequest *req = (const void *)m;
    sl_feed *f = arg;
    char msg[256];
    int err = sl_name_check("dataset", req->name, msg, sizeof(msg));

    if (err) {
        sl_rpc_call_fail(call, err, "%s", msg);
        return;
    }
    if (req->samples == 0 || req->samples > SL_SAMPLE_MAX_N) {
        sl_rpc_call_fail(call, SL_EINVAL, "samples %llu out of range [1, 2^62]",
                         (unsigned long long)req->samples);
        return;
    }
    err = sl_cat_dataset_create(f->cat, req->name, req->samples, sl_now_ms());
    if (err == SL_EEXIST) {
        char other[SL_CAT_FEED_NAME_MAX + 1];
        if (sl_cat_name_clash(f->cat, SL_CAT_NAME_DATASET, NULL, req->name, other, sizeof(other)) ==
            SL_EEXIST)
            sl_rpc_call_fail(call, err,
                             "dataset '%s' differs only in case from the existing dataset '%s' "
                             "(names are case-insensitive)",
                             req->name, other);
        else
            sl_rpc_call_fail(call, err, "dataset '%s' already exists", req->name);
        return;
    }
    if (err) {
        sl_rpc_call_fail(call, err, "could not create dataset '%s': %s", req->name,
                         sl_strerror(err));
        return;
    }
    sl_log_info("dataset_created", "name=%s samples=%llu", req->name,
                (unsigned long long)req->samples);
    reply_dataset(call, f, req->name);
}

static void get(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    const Sluice__V1__GetDatasetRequest *req = (const void *)m;
    char msg[256];
    int err = sl_name_check("dataset", req->name, msg, sizeof(msg));

    if (err) {
        sl_rpc_call_fail(call, err, "%s", msg);
        return;
    }
    reply_dataset(call, arg, req->name);
}

typedef struct list_acc {
    sl_cat_dataset *items;
    size_t n, cap;
} list_acc;

static int list_one(const sl_cat_dataset *d, void *arg)
{
    list_acc *a = arg;

    if (sl_array_grow((void **)&a->items, &a->cap, a->n, sizeof(*a->items), 16) != 0)
        return -ENOMEM;
    a->items[a->n++] = *d;
    return 0;
}

static void list(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    Sluice__V1__ListDatasetsResponse resp = SLUICE__V1__LIST_DATASETS_RESPONSE__INIT;
    Sluice__V1__Dataset *msgs = NULL, **ptrs = NULL;
    sl_feed *f = arg;
    list_acc a = {0};
    int err = sl_cat_dataset_list(f->cat, list_one, &a);

    (void)m;
    if (!err && a.n) {
        msgs = calloc(a.n, sizeof(*msgs));
        ptrs = calloc(a.n, sizeof(*ptrs));
        if (!msgs || !ptrs)
            err = -ENOMEM;
    }
    if (err) {
        sl_rpc_call_fail(call, err, "could not list datasets: %s", sl_strerror(err));
        goto out;
    }
    for (size_t i = 0; i < a.n; i++) {
        describe(&a.items[i], &msgs[i]);
        ptrs[i] = &msgs[i];
    }
    resp.n_datasets = a.n;
    resp.datasets = ptrs;
    sl_rpc_call_reply(call, &resp.base);
out:
    free(msgs);
    free(ptrs);
    free(a.items);
}

static void delete (sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    const Sluice__V1__DeleteDatasetRequest *req = (const void *)m;
    Sluice__V1__DeleteDatasetResponse resp = SLUICE__V1__DELETE_DATASET_RESPONSE__INIT;
    sl_feed *f = arg;
    sl_cat_dataset d;
    char msg[256], path[4300];
    int err = sl_name_check("dataset", req->name, msg, sizeof(msg));

    if (err) {
        sl_rpc_call_fail(call, err, "%s", msg);
        return;
    }
    err = sl_cat_dataset_get(f->cat, &d, req->name);
    if (!err && d.jobs)
        err = SL_ESTATE;
    if (!err)
        err = sl_cat_dataset_delete(f->cat, req->name);
    if (err == SL_ESTATE) {
        sl_rpc_call_fail(call, err, "dataset '%s' is used by %u job(s); delete them first",
                         req->name, d.jobs);
        return;
    }
    if (err) {
        sl_rpc_call_fail(call, err, "dataset '%s': %s", req->name, sl_strerror(err));
        return;
    }
    if (feed_lengths_path(f, req->name, path, sizeof(path)) == 0 &&
        (err = sl_store_unlink(path)) != 0)
        sl_log_warn("lengths_unlink_failed", "path=%s error=\"%s\"", path, sl_store_strerror(err));
    if (feed_labels_path(f, req->name, path, sizeof(path)) == 0 &&
        (err = sl_store_unlink(path)) != 0)
        sl_log_warn("labels_unlink_failed", "path=%s error=\"%s\"", path, sl_store_strerror(err));
    sl_log_info("dataset_deleted", "name=%s", req->name);
    sl_rpc_call_reply(call, &resp.base);
}

/* ---- UploadLengths, UploadLabels ---- */

/* What an upload stores: the two files differ in their name, their values' rule and what the
 * catalog records. */
typedef struct upload_kind {
    const char *what;  /* "lengths", "labels": also the file's extension */
    const char *value; /* "length", "label" */
    int labels;        /* 1: class ids below SL_SAMPLE_MAX_CLASSES; else lengths >= 1 */
} upload_kind;

static const upload_kind kind_lengths = {"lengths", "length", 0};
static const upload_kind kind_labels = {"labels", "label", 1};

typedef struct upload {
    sl_feed *f;
    const upload_kind *kind;
    uint32_t classes; /* labels: 1 + the largest class id so far */
    char name[SL_CAT_FEED_NAME_MAX + 1];
    uint64_t samples, got;
    int fd;
    char tmp[4300];
    sl_sha256 *sha;
    uint8_t *buf;
    size_t buf_cap;
} upload;

static void upload_free(void *p)
{
    upload *u = p;

    if (u->fd >= 0) {
        close(u->fd);
        sl_store_unlink(u->tmp);
    }
    sl_sha256_free(u->sha);
    free(u->buf);
    free(u);
}

/* Drops the temporary file before a failure is answered, so a client that sees the
 * error never sees the file (upload_free runs only after the status is sent). */
static void upload_discard(upload *u)
{
    if (u->fd >= 0) {
        close(u->fd);
        sl_store_unlink(u->tmp);
        u->fd = -1;
    }
}

#define UPLOAD_FAIL(call, u, ...)                                                                  \
    do {                                                                                           \
        upload_discard(u);                                                                         \
        sl_rpc_call_fail(call, __VA_ARGS__);                                                       \
    } while (0)

static void upload_begin(sl_rpc_call *call, void *arg, const upload_kind *kind)
{
    upload *u = calloc(1, sizeof(*u));

    if (!u) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        return;
    }
    u->f = arg;
    u->kind = kind;
    u->fd = -1;
    sl_rpc_call_set_data(call, u, upload_free);
    sl_rpc_call_read(call);
}

static void upload_start(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    (void)m;
    upload_begin(call, arg, &kind_lengths);
}

static void labels_start(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    (void)m;
    upload_begin(call, arg, &kind_labels);
}

/* The stored file of the upload's kind for the dataset `name`. */
static int upload_path(const upload *u, const char *name, char *buf, size_t len)
{
    return u->kind->labels ? feed_labels_path(u->f, name, buf, len)
                           : feed_lengths_path(u->f, name, buf, len);
}

/* First message: check the dataset and open the temporary file. */
static int upload_open(sl_rpc_call *call, upload *u, const char *name)
{
    sl_cat_dataset d;
    char msg[256], dir[4200];
    int err = sl_name_check("dataset", name, msg, sizeof(msg));

    if (err)
        return sl_rpc_call_fail(call, err, "%s", msg), err;
    err = sl_cat_dataset_get(u->f->cat, &d, name);
    if (err)
        return sl_rpc_call_fail(call, err, "dataset '%s': %s", name, sl_strerror(err)), err;
    if ((u->kind->labels ? d.has_labels : d.has_lengths) && d.jobs) {
        sl_rpc_call_fail(call, SL_ESTATE,
                         "dataset '%s' already has %s and %u job(s) use it; its %s "
                         "cannot change under them",
                         name, u->kind->what, d.jobs, u->kind->what);
        return SL_ESTATE;
    }
    snprintf(u->name, sizeof(u->name), "%s", name);
    u->samples = d.samples;
    snprintf(dir, sizeof(dir), "%s/datasets", u->f->data_dir);
    if ((err = sl_store_mkdirs(dir)) != 0)
        return sl_rpc_call_fail(call, err, "cannot create %s: %s", dir, sl_store_strerror(err)),
               err;
    snprintf(u->tmp, sizeof(u->tmp), "%s/.%s.%s.%s-%llu.tmp", dir, name, u->kind->what,
             u->f->tmp_tag, (unsigned long long)++u->f->upload_seq);
    u->fd = sl_store_create(u->tmp, 0640);
    if (u->fd < 0) {
        err = u->fd;
        u->fd = -1;
        return sl_rpc_call_fail(call, err, "cannot create the %s file %s: %s", u->kind->what,
                                u->tmp, sl_store_strerror(err)),
               err;
    }
    err = sl_sha256_new(&u->sha);
    if (!err)
        err = sl_sha256_reset(u->sha);
    if (err)
        UPLOAD_FAIL(call, u, err, "hashing unavailable");
    return err;
}

/* The staged file is gone: did another replica (sharing the data dir) move it into place? Its
 * name is its checksum, so if the catalog still records that checksum and the file is there (a
 * regular file, reached with no link followed), the file in place is this upload's content. */
static int same_in_place(upload *u, const char *hex, const char *path)
{
    sl_cat_dataset d;
    struct stat st;
    const char *sha;

    if (!sl_cat_shared(u->f->cat) || sl_cat_dataset_get(u->f->cat, &d, u->name) != 0)
        return 0;
    sha = u->kind->labels ? (d.has_labels ? d.labels_sha256 : NULL)
                          : (d.has_lengths ? d.lengths_sha256 : NULL);
    return sha && strcmp(sha, hex) == 0 && sl_store_stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static void upload_finish(sl_rpc_call *call, upload *u)
{
    char hex[SL_SHARD_HEX_LEN + 1], path[4300], staged[4500], dir[4200];
    int err;

    if (u->fd < 0) {
        UPLOAD_FAIL(call, u, SL_EINVAL, "empty stream: the first message must name a dataset");
        return;
    }
    if (u->got != u->samples) {
        UPLOAD_FAIL(call, u, SL_EINVAL, "got %llu %s, dataset '%s' has %llu samples",
                    (unsigned long long)u->got, u->kind->what, u->name,
                    (unsigned long long)u->samples);
        return;
    }
    /* The complete file is staged under a hidden name that carries its checksum, the catalog
     * records the checksum, and only then does the file replace the old lengths. A failure or a
     * crash before the catalog write leaves the old lengths and their row as they were; a crash
     * after it is finished at startup (feed.c), which can tell from the name whether the staged
     * file is the one the catalog has. */
    snprintf(dir, sizeof(dir), "%s/datasets", u->f->data_dir);
    err = sl_sha256_final(u->sha, hex);
    if (!err && fsync(u->fd) != 0)
        err = -errno;
    if (!err)
        err = upload_path(u, u->name, path, sizeof(path));
    snprintf(staged, sizeof(staged), "%s/.%s.%s.%s.new", dir, u->name, u->kind->what, hex);
    if (!err)
        err = sl_store_rename(u->tmp, staged);
    if (err) {
        UPLOAD_FAIL(call, u, err, "could not store the %s file: %s", u->kind->what,
                    sl_store_strerror(err));
        return;
    }
    close(u->fd);
    u->fd = -1;
    if ((err = sl_store_fsync_dir(dir)) != 0) {
        sl_store_unlink(staged);
        sl_rpc_call_fail(call, err, "could not sync %s: %s", dir, sl_store_strerror(err));
        return;
    }
    err = u->kind->labels ? sl_cat_dataset_set_labels(u->f->cat, u->name, hex, u->classes)
                          : sl_cat_dataset_set_lengths(u->f->cat, u->name, hex);
    if (err) {
        /* The old file stays (or the dataset was deleted while the new one arrived). */
        sl_store_unlink(staged);
        sl_rpc_call_fail(call, err, "dataset '%s': could not record the %s: %s", u->name,
                         u->kind->what, sl_store_strerror(err));
        return;
    }
    if ((err = sl_store_rename(staged, path)) == -ENOENT && same_in_place(u, hex, path))
        err = 0; /* another replica stored the same file a moment before: it is in place */
    if (err || (err = sl_store_fsync_dir(dir)) != 0) {
        /* Recorded but not in place: planning refuses the old file (its checksum differs) until
         * the next start moves the staged file into place. */
        sl_log_error("upload_rename_failed", "dataset=%s kind=%s path=%s error=\"%s\"", u->name,
                     u->kind->what, staged, sl_store_strerror(err));
        sl_rpc_call_fail(call, err, "dataset '%s': %s recorded but not moved into place: %s",
                         u->name, u->kind->what, sl_store_strerror(err));
        return;
    }
    sl_log_info(u->kind->labels ? "labels_stored" : "lengths_stored",
                "dataset=%s samples=%llu sha256=%s classes=%u", u->name, (unsigned long long)u->got,
                hex, u->classes);
    reply_dataset(call, u->f, u->name);
}

/* Labels into their stored form (u32 little-endian). Returns 0, or SL_EINVAL at the first class
 * id at or over SL_SAMPLE_MAX_CLASSES (*bad is its index). */
static int labels_encode(uint8_t *out, const uint32_t *v, size_t n, size_t *bad, uint32_t *classes)
{
    for (size_t i = 0; i < n; i++) {
        if (v[i] >= SL_SAMPLE_MAX_CLASSES) {
            *bad = i;
            return SL_EINVAL;
        }
        if (v[i] + 1 > *classes)
            *classes = v[i] + 1;
        out[4 * i] = (uint8_t)v[i];
        out[4 * i + 1] = (uint8_t)(v[i] >> 8);
        out[4 * i + 2] = (uint8_t)(v[i] >> 16);
        out[4 * i + 3] = (uint8_t)(v[i] >> 24);
    }
    return 0;
}

static int upload_encode(sl_rpc_call *call, upload *u, const uint32_t *v, size_t n)
{
    size_t bad = 0;

    if (!u->kind->labels) {
        if (sl_lengths_encode(u->buf, v, n, &bad) == 0)
            return 0;
        UPLOAD_FAIL(call, u, SL_EINVAL, "length 0 for sample %llu (lengths must be >= 1)",
                    (unsigned long long)(u->got + bad));
        return SL_EINVAL;
    }
    if (labels_encode(u->buf, v, n, &bad, &u->classes) == 0)
        return 0;
    UPLOAD_FAIL(call, u, SL_EINVAL, "label %u of sample %llu over the maximum class id %u", v[bad],
                (unsigned long long)(u->got + bad), SL_SAMPLE_MAX_CLASSES - 1);
    return SL_EINVAL;
}

/* One message of either upload: its dataset name and its values. NULL req_name: end of stream. */
static void upload_values(sl_rpc_call *call, upload *u, const char *req_name, const uint32_t *v,
                          size_t n)
{
    size_t bytes;
    int err;

    if (!req_name) {
        upload_finish(call, u);
        return;
    }
    if (u->fd < 0) {
        if (upload_open(call, u, req_name) != 0)
            return;
        sl_rpc_call_progress(call);
    } else if (req_name[0] && strcmp(req_name, u->name) != 0) {
        UPLOAD_FAIL(call, u, SL_EINVAL, "dataset changed mid-stream from '%s' to '%.140s'", u->name,
                    req_name);
        return;
    }
    if (n > u->samples - u->got) {
        UPLOAD_FAIL(call, u, SL_EINVAL, "more than %llu %s for dataset '%s'",
                    (unsigned long long)u->samples, u->kind->what, u->name);
        return;
    }
    bytes = n * 4;
    if (bytes && sl_array_grow((void **)&u->buf, &u->buf_cap, bytes - 1, 1, bytes) != 0) {
        UPLOAD_FAIL(call, u, -ENOMEM, "out of memory");
        return;
    }
    if (upload_encode(call, u, v, n) != 0)
        return;
    err = sl_store_pwrite_all(u->fd, u->buf, bytes, 4 * u->got);
    if (!err)
        err = sl_sha256_update(u->sha, u->buf, bytes);
    if (err) {
        UPLOAD_FAIL(call, u, err, "could not write the %s file: %s", u->kind->what,
                    sl_strerror(err));
        return;
    }
    u->got += n;
    if (n)
        sl_rpc_call_progress(call);
    sl_rpc_call_read(call);
}

static void upload_message(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    const Sluice__V1__UploadLengthsRequest *req = (const void *)m;

    (void)arg;
    upload_values(call, sl_rpc_call_data(call), req ? req->name : NULL, req ? req->lengths : NULL,
                  req ? req->n_lengths : 0);
}

static void labels_message(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    const Sluice__V1__UploadLabelsRequest *req = (const void *)m;

    (void)arg;
    upload_values(call, sl_rpc_call_data(call), req ? req->name : NULL, req ? req->labels : NULL,
                  req ? req->n_labels : 0);
}

/* An undecodable message: the temp file goes before the answer, as for any failure. */
static void upload_bad_message(sl_rpc_call *call, int err, const char *why, void *arg)
{
    (void)arg;
    UPLOAD_FAIL(call, (upload *)sl_rpc_call_data(call), err, "%s", why);
}

static const sl_rpc_method methods[] = {
    {
        .name = "Create",
        .kind = SL_RPC_UNARY,
        .access = FEED_ACCESS_ADMIN,
        .request = &sluice__v1__create_dataset_request__descriptor,
        .response = &sluice__v1__dataset__descriptor,
        .on_start = create,
    },
    {
        .name = "UploadLengths",
        .kind = SL_RPC_CLIENT_STREAM,
        .access = FEED_ACCESS_ADMIN,
        .request = &sluice__v1__upload_lengths_request__descriptor,
        .response = &sluice__v1__dataset__descriptor,
        .on_start = upload_start,
        .on_message = upload_message,
        .on_bad_message = upload_bad_message,
        /* Messages without lengths are not progress for the idle timeout. */
        .handler_progress = 1,
    },
    {
        .name = "UploadLabels",
        .kind = SL_RPC_CLIENT_STREAM,
        .access = FEED_ACCESS_ADMIN,
        .request = &sluice__v1__upload_labels_request__descriptor,
        .response = &sluice__v1__dataset__descriptor,
        .on_start = labels_start,
        .on_message = labels_message,
        .on_bad_message = upload_bad_message,
        .handler_progress = 1,
    },
    {
        .name = "Get",
        .kind = SL_RPC_UNARY,
        .access = FEED_ACCESS_READER,
        .request = &sluice__v1__get_dataset_request__descriptor,
        .response = &sluice__v1__dataset__descriptor,
        .on_start = get,
    },
    {
        .name = "List",
        .kind = SL_RPC_UNARY,
        .access = FEED_ACCESS_READER,
        .request = &sluice__v1__list_datasets_request__descriptor,
        .response = &sluice__v1__list_datasets_response__descriptor,
        .on_start = list,
    },
    {
        .name = "Delete",
        .kind = SL_RPC_UNARY,
        .access = FEED_ACCESS_ADMIN,
        .request = &sluice__v1__delete_dataset_request__descriptor,
        .response = &sluice__v1__delete_dataset_response__descriptor,
        .on_start = delete,
    },
};

const sl_rpc_service *feed_datasets_service(sl_feed *f)
{
    f->svcs[0] = (sl_rpc_service){
        .name = "sluice.v1.Datasets",
        .methods = methods,
        .n_methods = sizeof(methods) / sizeof(methods[0]),
        .arg = f,
    };
    return &f->svcs[0];
}
