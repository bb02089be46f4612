/* sluice.v1.Datasets: registration and per-sample lengths files.
 *
 * Lengths arrive as a client stream and are written to a temporary file next to their final
 * name while they are hashed; at the end of the stream the file is made durable and staged under
 * a name carrying its checksum, the checksum goes into the catalog, then the staged file replaces
 * the old lengths (upload_finish). Nothing is visible before the bytes are durable, and a failed
 * or interrupted upload never damages the lengths stored before it. The writes
 * run on the loop thread: they are page-cache writes of at most one message (a few MiB) each.
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
    sl_log_info("dataset_deleted", "name=%s", req->name);
    sl_rpc_call_reply(call, &resp.base);
}

/* ---- UploadLengths ---- */

typedef struct upload {
    sl_feed *f;
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

static void upload_start(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    upload *u = calloc(1, sizeof(*u));

    (void)m;
    if (!u) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        return;
    }
    u->f = arg;
    u->fd = -1;
    sl_rpc_call_set_data(call, u, upload_free);
    sl_rpc_call_read(call);
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
    if (d.has_lengths && d.jobs) {
        sl_rpc_call_fail(call, SL_ESTATE,
                         "dataset '%s' already has lengths and %u job(s) use it; its lengths "
                         "cannot change under them",
                         name, d.jobs);
        return SL_ESTATE;
    }
    snprintf(u->name, sizeof(u->name), "%s", name);
    u->samples = d.samples;
    snprintf(dir, sizeof(dir), "%s/datasets", u->f->data_dir);
    if ((err = sl_store_mkdirs(dir)) != 0)
        return sl_rpc_call_fail(call, err, "cannot create %s: %s", dir, sl_store_strerror(err)),
               err;
    snprintf(u->tmp, sizeof(u->tmp), "%s/.%s.lengths.%llu.tmp", dir, name,
             (unsigned long long)++u->f->upload_seq);
    u->fd = sl_store_create(u->tmp, 0640);
    if (u->fd < 0) {
        err = u->fd;
        u->fd = -1;
        return sl_rpc_call_fail(call, err, "cannot create the lengths file %s: %s", u->tmp,
                                sl_store_strerror(err)),
               err;
    }
    err = sl_sha256_new(&u->sha);
    if (!err)
        err = sl_sha256_reset(u->sha);
    if (err)
        UPLOAD_FAIL(call, u, err, "hashing unavailable");
    return err;
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
        UPLOAD_FAIL(call, u, SL_EINVAL, "got %llu lengths, dataset '%s' has %llu samples",
                    (unsigned long long)u->got, u->name, (unsigned long long)u->samples);
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
        err = feed_lengths_path(u->f, u->name, path, sizeof(path));
    snprintf(staged, sizeof(staged), "%s/.%s.lengths.%s.new", dir, u->name, hex);
    if (!err)
        err = sl_store_rename(u->tmp, staged);
    if (err) {
        UPLOAD_FAIL(call, u, err, "could not store the lengths file: %s", sl_store_strerror(err));
        return;
    }
    close(u->fd);
    u->fd = -1;
    if ((err = sl_store_fsync_dir(dir)) != 0) {
        sl_store_unlink(staged);
        sl_rpc_call_fail(call, err, "could not sync %s: %s", dir, sl_store_strerror(err));
        return;
    }
    err = sl_cat_dataset_set_lengths(u->f->cat, u->name, hex);
    if (err) {
        /* The old lengths stay (or the dataset was deleted while its lengths arrived). */
        sl_store_unlink(staged);
        sl_rpc_call_fail(call, err, "dataset '%s': could not record the lengths: %s", u->name,
                         sl_store_strerror(err));
        return;
    }
    if ((err = sl_store_rename(staged, path)) != 0 || (err = sl_store_fsync_dir(dir)) != 0) {
        /* Recorded but not in place: planning refuses the old file (its checksum differs) until
         * the next start moves the staged file into place. */
        sl_log_error("lengths_rename_failed", "dataset=%s path=%s error=\"%s\"", u->name, staged,
                     sl_store_strerror(err));
        sl_rpc_call_fail(call, err, "dataset '%s': lengths recorded but not moved into place: %s",
                         u->name, sl_store_strerror(err));
        return;
    }
    sl_log_info("lengths_stored", "dataset=%s samples=%llu sha256=%s", u->name,
                (unsigned long long)u->got, hex);
    reply_dataset(call, u->f, u->name);
}

static void upload_message(sl_rpc_call *call, const ProtobufCMessage *m, void *arg)
{
    const Sluice__V1__UploadLengthsRequest *req = (const void *)m;
    upload *u = sl_rpc_call_data(call);
    size_t bytes, bad = 0;
    int err;

    (void)arg;
    if (!req) {
        upload_finish(call, u);
        return;
    }
    if (u->fd < 0) {
        if (upload_open(call, u, req->name) != 0)
            return;
    } else if (req->name[0] && strcmp(req->name, u->name) != 0) {
        UPLOAD_FAIL(call, u, SL_EINVAL, "dataset changed mid-stream from '%s' to '%.140s'", u->name,
                    req->name);
        return;
    }
    if (req->n_lengths > u->samples - u->got) {
        UPLOAD_FAIL(call, u, SL_EINVAL, "more than %llu lengths for dataset '%s'",
                    (unsigned long long)u->samples, u->name);
        return;
    }
    bytes = req->n_lengths * 4;
    if (bytes && sl_array_grow((void **)&u->buf, &u->buf_cap, bytes - 1, 1, bytes) != 0) {
        UPLOAD_FAIL(call, u, -ENOMEM, "out of memory");
        return;
    }
    if (sl_lengths_encode(u->buf, req->lengths, req->n_lengths, &bad) != 0) {
        UPLOAD_FAIL(call, u, SL_EINVAL, "length 0 for sample %llu (lengths must be >= 1)",
                    (unsigned long long)(u->got + bad));
        return;
    }
    err = sl_store_pwrite_all(u->fd, u->buf, bytes, 4 * u->got);
    if (!err)
        err = sl_sha256_update(u->sha, u->buf, bytes);
    if (err) {
        UPLOAD_FAIL(call, u, err, "could not write the lengths file: %s", sl_strerror(err));
        return;
    }
    u->got += req->n_lengths;
    sl_rpc_call_read(call);
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
