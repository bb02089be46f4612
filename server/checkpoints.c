/* sluice.v1.Checkpoints. See checkpoints.h and docs/checkpoints.md.
 *
 * Upload: header -> validated, checkpoint WRITING, no other upload of the rank, free space ->
 * worker opens ".<name>_shard_<rank>.shard.part" (placeholder header, space reserved with
 * fallocate; on resume re-hashes the kept prefix) -> each chunk is handed to a worker without a
 * copy, written and hashed in order, at most UP_INFLIGHT chunks in memory -> end of stream: size
 * and client checksum checked on the loop, the rank's old row forgotten -> worker writes the real
 * checksum into the header, fsyncs, renames without replacing, fsyncs the directory -> catalog
 * row -> receipt. Nothing reaches the catalog before its bytes are durable.
 */
#include "checkpoints.h"

#include "auth.h"
#include "catalog/ckpt.h"
#include "daemon.h"
#include "err.h"
#include "log.h"
#include "shard.h"
#include "sluice/v1/checkpoint.pb-c.h"
#include "store/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_CHUNK       (4u << 20) /* largest data chunk per message */
#define MAX_TENSORS     65536
#define MAX_TENSOR_NAME 1024
#define MAX_DIMS        32
#define MAX_WORLD       65536
#define UP_INFLIGHT     8  /* chunks held in memory per upload */
#define UP_RING         16 /* ring slots, at least UP_INFLIGHT */
_Static_assert(UP_RING >= UP_INFLIGHT, "the chunk ring must hold every chunk in flight");
#define DL_CHUNK  (1u << 20) /* download message size */
#define DL_QUEUED 3          /* download messages queued per call */
#define LIST_MAX  10000
/* metadata.json is rendered in memory (commit, quick verify): its tensor lists are capped. */
#define META_MAX        (64u << 20)
#define FLUSH_EVERY     (8u << 20) /* start writeback of an upload every 8 MiB */
#define SWEEP_PERIOD_MS 60000
#define PART_SUFFIX     ".shard.part"

typedef struct upload upload;

/* A checkpoint with a commit in progress: uploads, aborts and other commits wait for it. */
typedef struct busy {
    int64_t id;
    struct busy *next;
} busy;

struct sl_ckpt_svc {
    sl_daemon *d;
    char root[PATH_MAX]; /* <data dir>/checkpoints */
    sl_rpc_service svc;
    upload *uploads;   /* active uploads (loop thread) */
    uint64_t mem_held; /* bytes of upload chunks in memory, all uploads */
    int mem_blocked;   /* an upload did not ask for its next chunk because of the budget */
    busy *committing;
    uv_timer_t sweep;
    int dir_lost; /* the data dir was replaced under the daemon: sweeps stopped */
};

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- a growable string for JSON ---- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        char *p;
        while (cap < b->len + n + 1)
            cap *= 2;
        p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

static void __attribute__((format(printf, 2, 3))) sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n > 0)
        sb_add(b, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

static void sb_json(sbuf *b, const char *s)
{
    char esc[8];

    sb_add(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*p;
            sb_add(b, esc, 2);
        } else if (*p < 0x20) {
            snprintf(esc, sizeof(esc), "\\u%04x", *p);
            sb_add(b, esc, 6);
        } else {
            sb_add(b, (const char *)p, 1);
        }
    }
    sb_add(b, "\"", 1);
}

/* ---- paths ---- */

static int job_dir(const sl_ckpt_svc *s, char *buf, size_t len, const char *job)
{
    int n = snprintf(buf, len, "%s/%s", s->root, job);

    return n < 0 || (size_t)n >= len ? SL_ELIMIT : 0;
}

static int __attribute__((format(printf, 4, 5)))
in_dir(char *buf, size_t len, const char *dir, const char *fmt, ...)
{
    char file[NAME_MAX + 1];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(file, sizeof(file), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(file))
        return SL_ELIMIT;
    n = snprintf(buf, len, "%s/%s", dir, file);
    return n < 0 || (size_t)n >= len ? SL_ELIMIT : 0;
}

/* ---- validation ---- */

static const struct {
    const char *name;
    unsigned size;
} dtypes[] = {
    {"float64", 8},     {"float32", 4},     {"float16", 2},   {"bfloat16", 2}, {"float8_e4m3fn", 1},
    {"float8_e5m2", 1}, {"complex128", 16}, {"complex64", 8}, {"int64", 8},    {"int32", 4},
    {"int16", 2},       {"int8", 1},        {"uint64", 8},    {"uint32", 4},   {"uint16", 2},
    {"uint8", 1},       {"bool", 1},        {"bytes", 1},
};

static unsigned dtype_size(const char *name)
{
    for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
        if (strcmp(dtypes[i].name, name) == 0)
            return dtypes[i].size;
    return 0;
}

typedef struct span {
    uint64_t off, size;
    size_t idx;
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;

    return x->off < y->off ? -1 : x->off > y->off;
}

/* Check the tensor list against the data size and render it as the JSON array stored in the
 * catalog and in metadata.json. Returns 0 and *json (caller frees), SL_EINVAL with a message. */
static int tensors_check(char **json, Sluice__V1__TensorInfo **t, size_t n, uint64_t data_size,
                         char *msg, size_t msg_len)
{
    span *spans = NULL;
    sbuf b = {0};
    int err = SL_EINVAL;

    *json = NULL;
    if (n > MAX_TENSORS) {
        snprintf(msg, msg_len, "%zu tensors, at most %d allowed", n, MAX_TENSORS);
        return SL_EINVAL;
    }
    spans = calloc(n ? n : 1, sizeof(*spans));
    if (!spans)
        return -ENOMEM;
    sb_str(&b, "[");
    for (size_t i = 0; i < n; i++) {
        const char *name = t[i]->name ? t[i]->name : "";
        size_t nl = strnlen(name, MAX_TENSOR_NAME + 1);
        unsigned isz = dtype_size(t[i]->dtype ? t[i]->dtype : "");
        uint64_t elems = 1, end;

        if (nl == 0 || nl > MAX_TENSOR_NAME) {
            snprintf(msg, msg_len, "tensor %zu: name must have 1..%d characters", i,
                     MAX_TENSOR_NAME);
            goto out;
        }
        for (size_t k = 0; k < nl; k++) {
            if ((unsigned char)name[k] < 0x20 || (unsigned char)name[k] > 0x7e) {
                snprintf(msg, msg_len, "tensor %zu: name has a byte 0x%02x outside printable ASCII",
                         i, (unsigned char)name[k]);
                goto out;
            }
        }
        if (!isz) {
            snprintf(msg, msg_len, "tensor '%.64s': unknown dtype '%.32s'", name,
                     t[i]->dtype ? t[i]->dtype : "");
            goto out;
        }
        if (t[i]->n_shape > MAX_DIMS) {
            snprintf(msg, msg_len, "tensor '%.64s': %zu dimensions, at most %d", name,
                     t[i]->n_shape, MAX_DIMS);
            goto out;
        }
        for (size_t k = 0; k < t[i]->n_shape; k++) {
            if (t[i]->shape[k] < 0 ||
                __builtin_mul_overflow(elems, (uint64_t)t[i]->shape[k], &elems)) {
                snprintf(msg, msg_len, "tensor '%.64s': dimension %zu is %" PRId64, name, k,
                         t[i]->shape[k]);
                goto out;
            }
        }
        if (__builtin_mul_overflow(elems, (uint64_t)isz, &elems) || elems != t[i]->size) {
            snprintf(msg, msg_len,
                     "tensor '%.64s': size %" PRIu64 " does not match its shape and dtype %s", name,
                     t[i]->size, t[i]->dtype);
            goto out;
        }
        if (__builtin_add_overflow(t[i]->offset, t[i]->size, &end) || end > data_size) {
            snprintf(msg, msg_len,
                     "tensor '%.64s': bytes [%" PRIu64 ", +%" PRIu64 ") outside the data (%" PRIu64
                     " bytes)",
                     name, t[i]->offset, t[i]->size, data_size);
            goto out;
        }
        spans[i] = (span){t[i]->offset, t[i]->size, i};
        if (i)
            sb_str(&b, ",");
        sb_str(&b, "{\"name\":");
        sb_json(&b, name);
        sb_printf(&b, ",\"dtype\":\"%s\",\"shape\":[", t[i]->dtype);
        for (size_t k = 0; k < t[i]->n_shape; k++)
            sb_printf(&b, "%s%" PRId64, k ? "," : "", t[i]->shape[k]);
        sb_printf(&b, "],\"offset\":%" PRIu64 ",\"size\":%" PRIu64 "}", t[i]->offset, t[i]->size);
    }
    sb_str(&b, "]");
    qsort(spans, n, sizeof(*spans), span_cmp);
    for (size_t i = 1; i < n; i++) {
        if (spans[i - 1].size && spans[i].size &&
            spans[i - 1].off + spans[i - 1].size > spans[i].off) {
            snprintf(msg, msg_len, "tensors %zu and %zu overlap", spans[i - 1].idx, spans[i].idx);
            goto out;
        }
    }
    if (b.oom) {
        err = -ENOMEM;
        goto out;
    }
    *json = b.p;
    b.p = NULL;
    err = 0;
out:
    free(b.p);
    free(spans);
    return err;
}

/* 1 if s is well-formed UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
 * protobuf-c does not check `string` fields, and clients that do (Python) would fail to parse
 * every later answer that carries the text. */
static int utf8_ok(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;

    while (*p) {
        unsigned c = *p, n, cp;
        if (c < 0x80) {
            p++;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf)
            n = 1, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef)
            n = 2, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4)
            n = 3, cp = c & 0x07;
        else
            return 0;
        for (unsigned i = 1; i <= n; i++) {
            if ((p[i] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (p[i] & 0x3f);
        }
        if ((n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (n == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return 0;
        p += n + 1;
    }
    return 1;
}

/* Validate job and checkpoint names from the network; answers the call on failure. */
static int names_ok(sl_rpc_call *call, const char *job, const char *name)
{
    if (sl_shard_name_check(job) != 0) {
        sl_rpc_call_fail(call, SL_EINVAL,
                         "job '%.200s' is not a valid name (1-%d of [A-Za-z0-9._-], no leading "
                         "'.', no '..')",
                         job ? job : "", SL_SHARD_NAME_MAX);
        return 0;
    }
    if (name && sl_shard_name_check(name) != 0) {
        sl_rpc_call_fail(call, SL_EINVAL,
                         "checkpoint '%.200s' is not a valid name (1-%d of [A-Za-z0-9._-], no "
                         "leading '.', no '..')",
                         name, SL_SHARD_NAME_MAX);
        return 0;
    }
    return 1;
}

/* Look up a checkpoint; answers the call on failure. */
static int find_ckpt(sl_ckpt_svc *s, sl_rpc_call *call, sl_cat_ckpt *ck, const char *job,
                     const char *name)
{
    int err = sl_cat_ckpt_get(s->d->cat, ck, job, name);

    if (err == SL_ENOTFOUND)
        sl_rpc_call_fail(call, err, "checkpoint %s/%s not found", job, name);
    else if (err)
        sl_rpc_call_fail(call, err, "catalog error: %s", sl_strerror(err));
    return err;
}

static int is_committing(const sl_ckpt_svc *s, int64_t id)
{
    for (const busy *b = s->committing; b; b = b->next)
        if (b->id == id)
            return 1;
    return 0;
}

/* ---- responses ---- */

/* Fill a Checkpoint message with copies of the strings; free with pb_ckpt_clear. */
static void pb_ckpt_fill(Sluice__V1__Checkpoint *m, const sl_cat_ckpt *c)
{
    sluice__v1__checkpoint__init(m);
    m->job = strdup(c->job);
    m->name = strdup(c->name);
    m->step = c->step;
    m->world_size = c->world_size;
    m->state = (Sluice__V1__CheckpointState)c->state;
    m->user_metadata = strdup(c->user_metadata);
    m->created_at_ms = c->created_ms;
    m->committed_at_ms = c->committed_ms;
    m->shards_uploaded = c->shards;
    m->total_bytes = c->total_bytes;
}

static void pb_ckpt_clear(Sluice__V1__Checkpoint *m)
{
    free(m->job);
    free(m->name);
    free(m->user_metadata);
    for (size_t i = 0; i < m->n_shards; i++) {
        free(m->shards[i]->sha256);
        free(m->shards[i]->path);
        free(m->shards[i]);
    }
    free(m->shards);
}

static void reply_ckpt(sl_rpc_call *call, const sl_cat_ckpt *c)
{
    Sluice__V1__Checkpoint m;

    pb_ckpt_fill(&m, c);
    if (!m.job || !m.name || !m.user_metadata)
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
    else
        sl_rpc_call_reply(call, &m.base);
    pb_ckpt_clear(&m);
}

/* ---- files of a checkpoint ---- */

/* Remove a checkpoint's shard files, partial uploads and metadata file, then fsync the
 * directory. Errors are logged: the catalog already forgot them, and the startup sweep removes
 * what is left. */
static void remove_files(sl_ckpt_svc *s, const sl_cat_ckpt *c)
{
    char dir[PATH_MAX], path[PATH_MAX];

    if (job_dir(s, dir, sizeof(dir), c->job) != 0)
        return;
    for (int r = 0; r < c->world_size; r++) {
        if (in_dir(path, sizeof(path), dir, "%s_shard_%d.shard", c->name, r) == 0)
            unlink(path);
        if (in_dir(path, sizeof(path), dir, ".%s_shard_%d" PART_SUFFIX, c->name, r) == 0)
            unlink(path);
    }
    if (in_dir(path, sizeof(path), dir, "%s.metadata.json", c->name) == 0)
        unlink(path);
    if (in_dir(path, sizeof(path), dir, ".%s.metadata.json.tmp", c->name) == 0)
        unlink(path);
    int err = sl_store_fsync_dir(dir);
    if (err && err != -ENOENT)
        sl_log_warn("ckpt_fsync_dir_failed", "dir=%s error=\"%s\"", dir, sl_strerror(err));
}

/* ---- metadata.json: rendered from the catalog, so Verify can compare byte for byte ---- */

typedef struct meta_ctx {
    sbuf *b;
    const char *name;
    int n;
} meta_ctx;

static int meta_shard(const sl_cat_shard *sh, void *arg)
{
    meta_ctx *m = arg;
    char file[NAME_MAX + 1];

    sl_shard_file_name(file, sizeof(file), m->name, sh->rank);
    sb_printf(m->b, "%s\n    {\"rank\":%d,\"file\":", m->n++ ? "," : "", sh->rank);
    sb_json(m->b, file);
    sb_printf(m->b, ",\"file_size\":%" PRIu64 ",\"data_size\":%" PRIu64 ",\"sha256\":\"%s\",",
              sh->file_size, sh->data_size, sh->sha256);
    sb_str(m->b, "\"tensors\":");
    sb_str(m->b, sh->tensors_json ? sh->tensors_json : "[]");
    sb_str(m->b, "}");
    return 0;
}

static int render_metadata(sl_ckpt_svc *s, const sl_cat_ckpt *c, int64_t committed_ms, sbuf *b)
{
    meta_ctx m = {b, c->name, 0};
    int err;

    sb_str(b, "{\n  \"format\": \"sluice.checkpoint\",\n  \"version\": 1,\n  \"job\": ");
    sb_json(b, c->job);
    sb_str(b, ",\n  \"name\": ");
    sb_json(b, c->name);
    sb_printf(b,
              ",\n  \"step\": %" PRIu64 ",\n  \"world_size\": %d,\n  \"created_at_ms\": %" PRId64
              ",\n  \"committed_at_ms\": %" PRId64 ",\n  \"user_metadata\": ",
              c->step, c->world_size, c->created_ms, committed_ms);
    sb_json(b, c->user_metadata);
    sb_str(b, ",\n  \"shards\": [");
    err = sl_cat_shard_list(s->d->cat, c->id, 1, meta_shard, &m);
    sb_str(b, "\n  ]\n}\n");
    if (!err && b->oom)
        err = -ENOMEM;
    return err;
}

/* ---- Begin, Get, List, Latest ---- */

static void ckpt_begin(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__BeginRequest *req = (const void *)msg;
    sl_ckpt_svc *s = arg;
    sl_cat_ckpt ck;
    char name[SL_SHARD_NAME_MAX + 1];
    int created, err;

    if (!names_ok(call, req->job, NULL))
        return;
    if (req->step > (uint64_t)INT64_MAX) {
        sl_rpc_call_fail(call, SL_EINVAL, "step %" PRIu64 " is above %" PRId64, req->step,
                         INT64_MAX);
        return;
    }
    if (req->name && *req->name) {
        if (!names_ok(call, req->job, req->name))
            return;
        snprintf(name, sizeof(name), "%s", req->name);
    } else {
        snprintf(name, sizeof(name), "step_%" PRIu64, req->step);
    }
    if (req->world_size < 1 || req->world_size > MAX_WORLD) {
        sl_rpc_call_fail(call, SL_EINVAL, "world_size %d out of range [1, %d]", req->world_size,
                         MAX_WORLD);
        return;
    }
    if (req->user_metadata && strlen(req->user_metadata) > SL_CAT_USER_MD_MAX) {
        sl_rpc_call_fail(call, SL_EINVAL, "user_metadata has %zu bytes, at most %d",
                         strlen(req->user_metadata), SL_CAT_USER_MD_MAX);
        return;
    }
    if (req->user_metadata && !utf8_ok(req->user_metadata)) {
        sl_rpc_call_fail(call, SL_EINVAL, "user_metadata is not valid UTF-8");
        return;
    }
    err = sl_cat_ckpt_begin(s->d->cat, &ck, &created, req->job, name, req->step, req->world_size,
                            req->user_metadata, now_ms());
    if (err == SL_EEXIST) {
        sl_rpc_call_fail(call, err,
                         "checkpoint %s/%s exists (%s) with world_size %d and step %" PRIu64
                         ", not %d and %" PRIu64,
                         req->job, name, sl_cat_ckpt_state_name(ck.state), ck.world_size, ck.step,
                         req->world_size, req->step);
        return;
    }
    if (err) {
        sl_rpc_call_fail(call, err, "catalog error: %s", sl_strerror(err));
        return;
    }
    if (created)
        sl_log_info("ckpt_begin", "job=%s name=%s world_size=%d", req->job, name, req->world_size);
    reply_ckpt(call, &ck);
}

typedef struct shard_list {
    Sluice__V1__ShardInfo **v;
    size_t n, cap;
    const char *job, *name;
    int oom;
} shard_list;

static int collect_shard(const sl_cat_shard *sh, void *arg)
{
    shard_list *l = arg;
    Sluice__V1__ShardInfo *si;
    char file[NAME_MAX + 1], path[PATH_MAX];

    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        void *v = realloc(l->v, cap * sizeof(*l->v));
        if (!v)
            return l->oom = -ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    si = calloc(1, sizeof(*si));
    if (!si)
        return l->oom = -ENOMEM;
    sluice__v1__shard_info__init(si);
    sl_shard_file_name(file, sizeof(file), l->name, sh->rank);
    snprintf(path, sizeof(path), "checkpoints/%s/%s", l->job, file);
    si->rank = sh->rank;
    si->data_size = sh->data_size;
    si->file_size = sh->file_size;
    si->sha256 = strdup(sh->sha256);
    si->path = strdup(path);
    si->tensor_count = sh->tensor_count;
    l->v[l->n++] = si;
    if (!si->sha256 || !si->path)
        return l->oom = -ENOMEM;
    return 0;
}

static void ckpt_get(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__CheckpointRef *req = (const void *)msg;
    sl_ckpt_svc *s = arg;
    Sluice__V1__Checkpoint m;
    shard_list l = {0};
    sl_cat_ckpt ck;
    int err;

    if (!names_ok(call, req->job, req->name) || find_ckpt(s, call, &ck, req->job, req->name))
        return;
    l.job = ck.job;
    l.name = ck.name;
    err = sl_cat_shard_list(s->d->cat, ck.id, 0, collect_shard, &l);
    pb_ckpt_fill(&m, &ck);
    m.shards = l.v;
    m.n_shards = l.n;
    if (err)
        sl_rpc_call_fail(call, err, "cannot list shards");
    else
        sl_rpc_call_reply(call, &m.base);
    pb_ckpt_clear(&m);
}

typedef struct ckpt_list {
    Sluice__V1__Checkpoint **v;
    size_t n, cap;
} ckpt_list;

static int collect_ckpt(const sl_cat_ckpt *c, void *arg)
{
    ckpt_list *l = arg;
    Sluice__V1__Checkpoint *m;

    if (l->n >= LIST_MAX)
        return 1;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        void *v = realloc(l->v, cap * sizeof(*l->v));
        if (!v)
            return -ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    m = malloc(sizeof(*m));
    if (!m)
        return -ENOMEM;
    pb_ckpt_fill(m, c);
    l->v[l->n++] = m;
    return 0;
}

static void ckpt_list_rpc(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__ListRequest *req = (const void *)msg;
    Sluice__V1__ListResponse resp = SLUICE__V1__LIST_RESPONSE__INIT;
    sl_ckpt_svc *s = arg;
    ckpt_list l = {0};
    int err;

    if (req->job && *req->job && !names_ok(call, req->job, NULL))
        return;
    if ((int)req->state < 0 || (int)req->state > SL_CKPT_INCOMPLETE) {
        sl_rpc_call_fail(call, SL_EINVAL, "state %d is not a checkpoint state", (int)req->state);
        return;
    }
    err = sl_cat_ckpt_list(s->d->cat, req->job, (int)req->state, collect_ckpt, &l);
    resp.checkpoints = l.v;
    resp.n_checkpoints = l.n;
    if (err < 0)
        sl_rpc_call_fail(call, err, "cannot list checkpoints");
    else
        sl_rpc_call_reply(call, &resp.base);
    for (size_t i = 0; i < l.n; i++) {
        pb_ckpt_clear(l.v[i]);
        free(l.v[i]);
    }
    free(l.v);
}

static void ckpt_latest(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__LatestRequest *req = (const void *)msg;
    sl_ckpt_svc *s = arg;
    sl_cat_ckpt ck;
    int err;

    if (!names_ok(call, req->job, NULL))
        return;
    err = sl_cat_ckpt_latest(s->d->cat, &ck, req->job);
    if (err == SL_ENOTFOUND)
        sl_rpc_call_fail(call, err, "job %s has no COMPLETE checkpoint", req->job);
    else if (err)
        sl_rpc_call_fail(call, err, "catalog error: %s", sl_strerror(err));
    else
        reply_ckpt(call, &ck);
}

/* ---- uploads: state ---- */

struct upload {
    sl_ckpt_svc *svc;
    sl_rpc_call *call;
    upload *next; /* in svc->uploads while registered */
    int registered;
    int64_t ckpt_id;
    char job[SL_SHARD_NAME_MAX + 1], name[SL_SHARD_NAME_MAX + 1];
    int32_t rank, world_size;
    char dir[PATH_MAX], part[PATH_MAX], final[PATH_MAX];
    int fd;
    sl_sha256 *sha;
    uint64_t data_size;
    uint64_t received;        /* data bytes accepted from the stream (incl. the resumed prefix) */
    uint64_t written;         /* data bytes written by the write lane (its thread) */
    uint64_t acked;           /* `written` as of the last write job, for the loop thread */
    uint64_t flushed;         /* data bytes whose writeback was started (sync_file_range) */
    uint64_t t_header, t_eof; /* loop time (ms) of the header and of the end of the stream */
    uint64_t resume_from;
    char client_sha[SL_SHARD_HEX_LEN + 1];
    char sha_hex[SL_SHARD_HEX_LEN + 1];
    char *tensors_json;
    uint32_t tensor_count;
    /* The chunk pipeline. Chunks wait in a ring, numbered by arrival; two lanes run at once on
     * the worker pool: the hash lane hashes them in order, the write lane writes them at their
     * offsets (it also runs the open and finalize steps). A lane job works on [next, end) taken
     * at its start; the loop only appends behind it and frees chunks both lanes passed. */
    struct chunk {
        sl_rpc_bytes *bytes; /* as received: the RPC layer's buffers, no copy */
        uint64_t off;        /* data offset */
        size_t len;
    } ring[UP_RING];
    uint64_t seq_tail, seq_free, seq_hash, seq_write, hash_end, write_end;
    uv_work_t work, hwork; /* write lane, hash lane */
    int busy, hbusy, reading, have_header, eof, finalizing;
    int stopped, remove_part, aborted;
    int err, herr; /* lane results */
    char errmsg[256];
    /* A failure decided while a lane job still ran: answered once the upload is released, so a
     * client that retries at once does not find its own failed upload still in progress. */
    int fail_pending, fail_err;
    char fail_msg[512];
};

static upload *find_upload(sl_ckpt_svc *s, int64_t ckpt_id, int32_t rank)
{
    for (upload *u = s->uploads; u; u = u->next)
        if (u->ckpt_id == ckpt_id && (rank < 0 || u->rank == rank))
            return u;
    return NULL;
}

static void up_fail(upload *up, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void up_unregister(upload *up)
{
    if (!up->registered)
        return;
    for (upload **p = &up->svc->uploads; *p; p = &(*p)->next) {
        if (*p == up) {
            *p = up->next;
            break;
        }
    }
    up->registered = 0;
}

/* ---- Abort, Delete, retention, Commit ---- */

static void ckpt_abort(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__CheckpointRef *req = (const void *)msg;
    sl_ckpt_svc *s = arg;
    sl_cat_ckpt ck;
    int err;

    if (!names_ok(call, req->job, req->name) || find_ckpt(s, call, &ck, req->job, req->name))
        return;
    if (ck.state == SL_CKPT_COMPLETE) {
        sl_rpc_call_fail(call, SL_ESTATE, "checkpoint %s/%s is COMPLETE; delete it instead", ck.job,
                         ck.name);
        return;
    }
    if (is_committing(s, ck.id)) {
        sl_rpc_call_fail(call, SL_ESTATE, "checkpoint %s/%s is being committed", ck.job, ck.name);
        return;
    }
    if (ck.state == SL_CKPT_WRITING) {
        /* The catalog forgets first: a crash after this leaves files the startup sweep removes,
         * never rows pointing at missing files. */
        err = sl_cat_shard_delete(s->d->cat, ck.id, -1);
        if (!err)
            err = sl_cat_ckpt_set_state(s->d->cat, ck.id, SL_CKPT_INCOMPLETE, 0);
        if (err) {
            sl_rpc_call_fail(call, err, "catalog error: %s", sl_strerror(err));
            return;
        }
        /* End its running uploads now; one finishing its rename removes its file itself. */
        for (upload *u = s->uploads, *next; u; u = next) {
            next = u->next;
            if (u->ckpt_id != ck.id)
                continue;
            u->aborted = 1;
            if (!u->finalizing)
                up_fail(u, SL_ESTATE, "checkpoint %s/%s was aborted", ck.job, ck.name);
        }
        remove_files(s, &ck);
        sl_log_info("ckpt_abort", "job=%s name=%s", ck.job, ck.name);
        sl_cat_ckpt_get(s->d->cat, &ck, req->job, req->name);
    }
    reply_ckpt(call, &ck);
}

static int delete_ckpt(sl_ckpt_svc *s, const sl_cat_ckpt *ck)
{
    int err = sl_cat_ckpt_delete(s->d->cat, ck->id);

    if (err)
        return err;
    remove_files(s, ck);
    sl_log_info("ckpt_delete", "job=%s name=%s", ck->job, ck->name);
    return 0;
}

static void ckpt_delete(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__CheckpointRef *req = (const void *)msg;
    Sluice__V1__DeleteResponse resp = SLUICE__V1__DELETE_RESPONSE__INIT;
    sl_ckpt_svc *s = arg;
    sl_cat_ckpt ck;
    int err;

    if (!names_ok(call, req->job, req->name) || find_ckpt(s, call, &ck, req->job, req->name))
        return;
    if (ck.state == SL_CKPT_WRITING || find_upload(s, ck.id, -1)) {
        sl_rpc_call_fail(call, SL_ESTATE, "checkpoint %s/%s is being written; abort it first",
                         ck.job, ck.name);
        return;
    }
    err = delete_ckpt(s, &ck);
    if (err)
        sl_rpc_call_fail(call, err, "catalog error: %s", sl_strerror(err));
    else
        sl_rpc_call_reply(call, &resp.base);
}

typedef struct retention {
    uint32_t keep;
    uint32_t seen;
    sl_cat_ckpt *victims;
    size_t n, cap;
} retention;

static int pick_victim(const sl_cat_ckpt *c, void *arg)
{
    retention *r = arg;

    /* Listed newest first: the first `keep` (at least the newest) stay. */
    if (r->seen++ < r->keep)
        return 0;
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 4;
        void *v = realloc(r->victims, cap * sizeof(*r->victims));
        if (!v)
            return -ENOMEM;
        r->victims = v;
        r->cap = cap;
    }
    r->victims[r->n++] = *c;
    return 0;
}

/* Apply the job's retention policy; names of deleted checkpoints go to `deleted` (may be NULL,
 * else an array the caller frees with its strings). Returns 0 or an error. */
static int apply_retention(sl_ckpt_svc *s, const char *job, char ***deleted, size_t *n_deleted)
{
    retention r = {0};
    int err;

    if (deleted) {
        *deleted = NULL;
        *n_deleted = 0;
    }
    err = sl_cat_retention_get(s->d->cat, job, &r.keep);
    if (err || r.keep == 0)
        return err;
    err = sl_cat_ckpt_list(s->d->cat, job, SL_CKPT_COMPLETE, pick_victim, &r);
    if (err < 0)
        goto out;
    err = 0;
    if (deleted && r.n) {
        *deleted = calloc(r.n, sizeof(char *));
        if (!*deleted) {
            err = -ENOMEM;
            goto out;
        }
    }
    for (size_t i = 0; i < r.n; i++) {
        err = delete_ckpt(s, &r.victims[i]);
        if (err)
            break;
        sl_log_info("ckpt_retention_deleted", "job=%s name=%s keep_last=%u", job, r.victims[i].name,
                    r.keep);
        if (deleted)
            (*deleted)[(*n_deleted)++] = strdup(r.victims[i].name);
    }
out:
    free(r.victims);
    return err;
}

static void ckpt_set_retention(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__SetRetentionRequest *req = (const void *)msg;
    Sluice__V1__SetRetentionResponse resp = SLUICE__V1__SET_RETENTION_RESPONSE__INIT;
    sl_ckpt_svc *s = arg;
    char **deleted = NULL;
    size_t n = 0;
    int err;

    if (!names_ok(call, req->job, NULL))
        return;
    err = sl_cat_retention_set(s->d->cat, req->job, req->keep_last);
    if (!err)
        err = apply_retention(s, req->job, &deleted, &n);
    resp.deleted = deleted;
    resp.n_deleted = n;
    if (err)
        sl_rpc_call_fail(call, err, "cannot apply the retention policy");
    else
        sl_rpc_call_reply(call, &resp.base);
    for (size_t i = 0; i < n; i++)
        free(deleted[i]);
    free(deleted);
}

typedef struct commit_job {
    uv_work_t work;
    sl_ckpt_svc *svc;
    sl_rpc_call *call;
    sl_cat_ckpt ck;
    busy mark;
    int64_t committed_ms;
    char dir[PATH_MAX];
    char file[NAME_MAX + 1];
    sbuf json;
    int err;
} commit_job;

typedef struct commit_check {
    sl_ckpt_svc *svc;
    const sl_cat_ckpt *ck;
    const char *dir;
    int32_t next; /* the next rank expected */
    sbuf missing;
    int n_missing;
    char bad[256];
} commit_check;

static void note_missing(commit_check *cc, int32_t from, int32_t to)
{
    for (int32_t r = from; r < to; r++) {
        if (cc->n_missing < 32)
            sb_printf(&cc->missing, "%s%d", cc->n_missing ? ", " : "", r);
        else if (cc->n_missing == 32)
            sb_str(&cc->missing, ", ...");
        cc->n_missing++;
    }
}

static int check_shard(const sl_cat_shard *sh, void *arg)
{
    commit_check *cc = arg;
    char path[PATH_MAX];
    struct stat st;

    if (sh->rank >= cc->ck->world_size)
        return 0;
    note_missing(cc, cc->next, sh->rank);
    cc->next = sh->rank + 1;
    if (!cc->bad[0] &&
        in_dir(path, sizeof(path), cc->dir, "%s_shard_%d.shard", cc->ck->name, sh->rank) == 0 &&
        (stat(path, &st) != 0 || (uint64_t)st.st_size != sh->file_size))
        snprintf(cc->bad, sizeof(cc->bad), "shard file of rank %d is missing or has the wrong size",
                 sh->rank);
    return 0;
}

static void commit_work(uv_work_t *w)
{
    commit_job *j = w->data;

    j->err = sl_store_write_file(j->dir, j->file, j->json.p, j->json.len);
}

static void commit_after(uv_work_t *w, int status)
{
    commit_job *j = w->data;
    sl_ckpt_svc *s = j->svc;
    int err = j->err;

    for (busy **p = &s->committing; *p; p = &(*p)->next) {
        if (*p == &j->mark) {
            *p = j->mark.next;
            break;
        }
    }
    if (err) {
        sl_log_error("ckpt_commit_failed", "job=%s name=%s error=\"%s\"", j->ck.job, j->ck.name,
                     sl_strerror(err));
        sl_rpc_call_fail(j->call, err, "cannot write %s: %s", j->file, sl_strerror(err));
        goto out;
    }
    err = sl_cat_ckpt_set_state(s->d->cat, j->ck.id, SL_CKPT_COMPLETE, j->committed_ms);
    if (!err)
        err = sl_cat_ckpt_get(s->d->cat, &j->ck, j->ck.job, j->ck.name);
    if (err) {
        sl_rpc_call_fail(j->call, err, "catalog error: %s", sl_strerror(err));
        goto out;
    }
    sl_log_info("ckpt_commit", "job=%s name=%s world_size=%d bytes=%" PRIu64, j->ck.job, j->ck.name,
                j->ck.world_size, j->ck.total_bytes);
    reply_ckpt(j->call, &j->ck);
    err = apply_retention(s, j->ck.job, NULL, NULL);
    if (err)
        sl_log_warn("ckpt_retention_failed", "job=%s error=\"%s\"", j->ck.job, sl_strerror(err));
out:
    sl_rpc_call_unref(j->call);
    free(j->json.p);
    free(j);
}

static void ckpt_commit(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__CheckpointRef *req = (const void *)msg;
    sl_ckpt_svc *s = arg;
    commit_check cc;
    commit_job *j = NULL;
    upload *u;
    sl_cat_ckpt ck;
    char dir[PATH_MAX];
    int err;

    memset(&cc, 0, sizeof(cc));
    if (!names_ok(call, req->job, req->name) || find_ckpt(s, call, &ck, req->job, req->name))
        return;
    if (ck.state == SL_CKPT_COMPLETE) {
        reply_ckpt(call, &ck);
        return;
    }
    if (ck.state != SL_CKPT_WRITING) {
        sl_rpc_call_fail(call, SL_ESTATE, "checkpoint %s/%s is %s", ck.job, ck.name,
                         sl_cat_ckpt_state_name(ck.state));
        return;
    }
    if (is_committing(s, ck.id)) {
        sl_rpc_call_fail(call, SL_ESTATE, "checkpoint %s/%s is being committed", ck.job, ck.name);
        return;
    }
    if ((u = find_upload(s, ck.id, -1)) != NULL) {
        sl_rpc_call_fail(call, SL_ESTATE, "an upload of rank %d of %s/%s is in progress", u->rank,
                         ck.job, ck.name);
        return;
    }
    if (job_dir(s, dir, sizeof(dir), ck.job) != 0) {
        sl_rpc_call_fail(call, SL_ELIMIT, "path too long");
        return;
    }
    cc.svc = s;
    cc.ck = &ck;
    cc.dir = dir;
    err = sl_cat_shard_list(s->d->cat, ck.id, 0, check_shard, &cc);
    note_missing(&cc, cc.next, ck.world_size);
    if (err) {
        sl_rpc_call_fail(call, err, "catalog error: %s", sl_strerror(err));
        goto out;
    }
    if (cc.n_missing) {
        sl_rpc_call_fail(call, SL_ESTATE, "%d of %d ranks have no shard: %s", cc.n_missing,
                         ck.world_size, cc.missing.p ? cc.missing.p : "");
        goto out;
    }
    if (cc.bad[0]) {
        sl_rpc_call_fail(call, SL_ECORRUPT, "%s", cc.bad);
        goto out;
    }
    j = calloc(1, sizeof(*j));
    if (!j) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        goto out;
    }
    j->svc = s;
    j->call = call;
    j->ck = ck;
    j->committed_ms = now_ms();
    snprintf(j->dir, sizeof(j->dir), "%s", dir);
    snprintf(j->file, sizeof(j->file), "%s.metadata.json", ck.name);
    err = render_metadata(s, &ck, j->committed_ms, &j->json);
    if (err) {
        sl_rpc_call_fail(call, err, "cannot render the metadata");
        free(j->json.p);
        free(j);
        goto out;
    }
    j->mark.id = ck.id;
    j->mark.next = s->committing;
    s->committing = &j->mark;
    j->work.data = j;
    sl_rpc_call_ref(call);
    uv_queue_work(&s->d->loop, &j->work, commit_work, commit_after);
out:
    free(cc.missing.p);
}

/* ---- UploadShard ---- */

/* Free the chunks both lanes are done with (all of them with `all`, when no lane runs). */
static void up_free_chunks(upload *up, int all)
{
    uint64_t upto =
        all ? up->seq_tail : (up->seq_hash < up->seq_write ? up->seq_hash : up->seq_write);

    for (; up->seq_free < upto; up->seq_free++) {
        struct chunk *c = &up->ring[up->seq_free % UP_RING];
        up->svc->mem_held -= c->len;
        sl_rpc_bytes_free(c->bytes);
        c->bytes = NULL;
    }
}

/* Close the file, drop the registration, remove the partial file if asked. Runs once no job is
 * busy. */
static void up_release(upload *up)
{
    if (up->fd >= 0) {
        close(up->fd);
        up->fd = -1;
    }
    if (up->remove_part && up->part[0])
        unlink(up->part);
    up_unregister(up);
    if (up->fail_pending) {
        up->fail_pending = 0;
        sl_rpc_call_fail(up->call, up->fail_err, "%s", up->fail_msg);
    }
}

/* End the upload's use of the disk: now, or when the running job returns. `remove_part` drops
 * the partial file; otherwise it is kept for a resume. */
static void up_stop(upload *up, int remove_part)
{
    up->stopped = 1;
    up->remove_part |= remove_part;
    if (!up->busy && !up->hbusy) {
        up_free_chunks(up, 1);
        up_release(up);
    }
}

static void up_data_free(void *p)
{
    upload *up = p;

    up->fail_pending = 0; /* the call is going away: nobody to answer */
    up_free_chunks(up, 1);
    up_release(up);
    sl_sha256_free(up->sha);
    free(up->tensors_json);
    free(up);
}

static void __attribute__((format(printf, 3, 4))) up_fail(upload *up, int err, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (up->have_header)
        sl_log_warn("ckpt_upload_failed", "job=%s name=%s rank=%d error=\"%s\"", up->job, up->name,
                    up->rank, msg);
    if (up->registered && (up->busy || up->hbusy) && !up->finalizing && !up->stopped) {
        /* A lane job still uses the partial file: answer when it is released (up_release). */
        up->fail_pending = 1;
        up->fail_err = err;
        snprintf(up->fail_msg, sizeof(up->fail_msg), "%s", msg);
    } else {
        sl_rpc_call_fail(up->call, err, "%s", msg);
    }
    up_stop(up, 1);
}

static int io_err_status(int err)
{
    /* Out of space is a limit, not corruption. */
    return err == -ENOSPC || err == -EDQUOT ? SL_ELIMIT : err;
}

/* Worker: open or resume the partial file. */
static void up_open_work(uv_work_t *w)
{
    upload *up = w->data;
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    sl_shard_header h;
    struct stat st;
    int err;

    err = sl_store_mkdirs(up->dir);
    if (err) {
        snprintf(up->errmsg, sizeof(up->errmsg), "cannot create the checkpoint directory: %s",
                 sl_strerror(err));
        goto out;
    }
    up->fd = open(up->part, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
    if (up->fd < 0) {
        err = -errno;
        snprintf(up->errmsg, sizeof(up->errmsg), "cannot open the partial file: %s",
                 sl_strerror(err));
        goto out;
    }
    if (up->resume_from > 0) {
        if (fstat(up->fd, &st) != 0 || sl_store_pread_all(up->fd, hdr, sizeof(hdr), 0) != 0 ||
            sl_shard_header_decode(&h, hdr, sizeof(hdr)) != 0 || h.rank != up->rank ||
            h.data_len != up->data_size || (uint32_t)h.tensor_count != up->tensor_count ||
            (uint64_t)st.st_size < SL_SHARD_HEADER_SIZE + up->resume_from) {
            err = SL_ESTATE;
            snprintf(up->errmsg, sizeof(up->errmsg),
                     "cannot resume at offset %" PRIu64
                     ": the server holds no matching partial upload (ask UploadStatus)",
                     up->resume_from);
            goto out;
        }
        err = sl_shard_hash_fd(up->sha, up->fd, SL_SHARD_HEADER_SIZE, up->resume_from);
        if (!err && ftruncate(up->fd, (off_t)(SL_SHARD_HEADER_SIZE + up->resume_from)) != 0)
            err = -errno;
        if (err) {
            snprintf(up->errmsg, sizeof(up->errmsg), "cannot re-read the kept prefix: %s",
                     sl_strerror(err));
            goto out;
        }
        up->written = up->resume_from;
        up->flushed = up->resume_from;
    } else {
        memset(&h, 0, sizeof(h));
        h.rank = up->rank;
        memset(h.sha256, '0', SL_SHARD_HEX_LEN);
        h.tensor_count = (int32_t)up->tensor_count;
        h.data_len = up->data_size;
        sl_shard_header_encode(hdr, &h);
        if (ftruncate(up->fd, 0) != 0)
            err = -errno;
        if (!err)
            err = sl_store_pwrite_all(up->fd, hdr, sizeof(hdr), 0);
        if (err) {
            snprintf(up->errmsg, sizeof(up->errmsg), "cannot write the partial file: %s",
                     sl_strerror(err));
            goto out;
        }
    }
    /* Reserve the space now, so a full disk is found before the data is sent. File systems
     * without fallocate are checked by the writes themselves. */
    if (up->data_size > up->written &&
        fallocate(up->fd, FALLOC_FL_KEEP_SIZE, (off_t)(SL_SHARD_HEADER_SIZE + up->written),
                  (off_t)(up->data_size - up->written)) != 0 &&
        errno != EOPNOTSUPP && errno != ENOSYS) {
        err = -errno;
        snprintf(up->errmsg, sizeof(up->errmsg), "cannot reserve %" PRIu64 " bytes: %s",
                 up->data_size - up->written, sl_strerror(err));
    }
out:
    up->err = err;
}

/* Worker, write lane: write the chunks [seq_write, write_end) at their offsets. */
static void up_write_work(uv_work_t *w)
{
    upload *up = w->data;
    int err = 0;

    for (uint64_t q = up->seq_write; q < up->write_end && !err; q++) {
        const struct chunk *c = &up->ring[q % UP_RING];
        int n;
        const struct iovec *iov = sl_rpc_bytes_iov(c->bytes, &n);
        err = sl_store_pwritev_all(up->fd, iov, n, SL_SHARD_HEADER_SIZE + c->off);
        if (!err)
            up->written = c->off + c->len;
    }
    /* Start writeback of what has accumulated, so the final fsync finds little left to write
     * and the disk works while the rest of the shard arrives. Advisory: errors surface at fsync. */
    if (!err && up->written - up->flushed >= FLUSH_EVERY) {
        sync_file_range(up->fd, (off_t)(SL_SHARD_HEADER_SIZE + up->flushed),
                        (off_t)(up->written - up->flushed), SYNC_FILE_RANGE_WRITE);
        up->flushed = up->written;
    }
    if (err)
        snprintf(up->errmsg, sizeof(up->errmsg), "cannot write the shard: %s", sl_strerror(err));
    up->err = err;
}

/* Worker, hash lane: hash the chunks [seq_hash, hash_end) in order. */
static void up_hash_work(uv_work_t *w)
{
    upload *up = w->data;
    int err = 0;

    for (uint64_t q = up->seq_hash; q < up->hash_end && !err; q++) {
        int n;
        const struct iovec *iov = sl_rpc_bytes_iov(up->ring[q % UP_RING].bytes, &n);
        for (int i = 0; i < n && !err; i++)
            err = sl_sha256_update(up->sha, iov[i].iov_base, iov[i].iov_len);
    }
    up->herr = err;
}

/* Worker: make the shard durable under its final name. */
static void up_final_work(uv_work_t *w)
{
    upload *up = w->data;
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    sl_shard_header h;
    const char *step = "write the header";
    int err;

    memset(&h, 0, sizeof(h));
    h.rank = up->rank;
    memcpy(h.sha256, up->sha_hex, sizeof(h.sha256));
    h.tensor_count = (int32_t)up->tensor_count;
    h.data_len = up->data_size;
    sl_shard_header_encode(hdr, &h);
    err = sl_store_pwrite_all(up->fd, hdr, sizeof(hdr), 0);
    if (!err && ftruncate(up->fd, (off_t)(SL_SHARD_HEADER_SIZE + up->data_size)) != 0) {
        err = -errno;
        step = "truncate";
    }
    if (!err && fsync(up->fd) != 0) {
        err = -errno;
        step = "fsync";
    }
    if (close(up->fd) != 0 && !err) {
        err = -errno;
        step = "close";
    }
    up->fd = -1;
    /* The checkpoint is WRITING (checked on the loop), so an older shard of this rank, whose row
     * is already gone, may be replaced; the rename itself never replaces anything. */
    if (!err && unlink(up->final) != 0 && errno != ENOENT) {
        err = -errno;
        step = "remove the old shard";
    }
    if (!err && (err = sl_store_rename_noreplace(up->part, up->final)) != 0)
        step = "rename";
    if (!err && (err = sl_store_fsync_dir(up->dir)) != 0)
        step = "fsync the directory";
    if (err)
        snprintf(up->errmsg, sizeof(up->errmsg), "cannot %s: %s", step, sl_strerror(err));
    up->err = err;
}

static void up_pump(upload *up);
static void up_after(uv_work_t *w, int status);
static void up_hash_after(uv_work_t *w, int status);

/* Start a write-lane job (open, write, finalize). */
static void up_queue(upload *up, uv_work_cb fn)
{
    up->busy = 1;
    up->err = 0;
    up->errmsg[0] = '\0';
    sl_rpc_call_ref(up->call);
    uv_queue_work(&up->svc->d->loop, &up->work, fn, up_after);
}

static void up_finish(upload *up)
{
    sl_ckpt_svc *s = up->svc;
    int err;

    if (up->received != up->data_size) {
        /* A cancelled call can look like a half-closed one here; either way the prefix stays
         * for a resume (the sweep removes it after the upload timeout). */
        sl_rpc_call_fail(up->call, SL_EINVAL,
                         "stream ended after %" PRIu64 " of %" PRIu64
                         " data bytes; resume from there",
                         up->received, up->data_size);
        up_stop(up, 0);
        return;
    }
    err = sl_sha256_final(up->sha, up->sha_hex);
    if (err) {
        up_fail(up, err, "hashing failed");
        return;
    }
    if (up->client_sha[0] && strcmp(up->client_sha, up->sha_hex) != 0) {
        up_fail(up, SL_ECORRUPT,
                "checksum mismatch for rank %d: client sent sha256 %s, server received %s",
                up->rank, up->client_sha, up->sha_hex);
        return;
    }
    if (up->aborted) {
        up_fail(up, SL_ESTATE, "checkpoint %s/%s was aborted", up->job, up->name);
        return;
    }
    /* Forget the rank's previous shard before its file is replaced. */
    err = sl_cat_shard_delete(s->d->cat, up->ckpt_id, up->rank);
    if (err) {
        up_fail(up, err, "catalog error: %s", sl_strerror(err));
        return;
    }
    up->finalizing = 1;
    up->t_eof = uv_now(&s->d->loop);
    up_queue(up, up_final_work);
}

static void up_recorded(upload *up)
{
    Sluice__V1__UploadShardResponse resp = SLUICE__V1__UPLOAD_SHARD_RESPONSE__INIT;
    sl_ckpt_svc *s = up->svc;
    sl_cat_shard sh;
    char path[PATH_MAX];
    int err;

    if (up->aborted) {
        unlink(up->final);
        up_fail(up, SL_ESTATE, "checkpoint %s/%s was aborted", up->job, up->name);
        return;
    }
    memset(&sh, 0, sizeof(sh));
    sh.rank = up->rank;
    sh.data_size = up->data_size;
    sh.file_size = SL_SHARD_HEADER_SIZE + up->data_size;
    memcpy(sh.sha256, up->sha_hex, sizeof(sh.sha256));
    sh.tensor_count = up->tensor_count;
    sh.tensors_json = up->tensors_json;
    err = sl_cat_shard_put(s->d->cat, up->ckpt_id, &sh, now_ms());
    if (err) {
        up_fail(up, err, "catalog error: %s", sl_strerror(err));
        return;
    }
    up_stop(up, 0);
    sl_log_info("ckpt_shard_stored",
                "job=%s name=%s rank=%d bytes=%" PRIu64 " sha256=%s receive_ms=%" PRIu64
                " sync_ms=%" PRIu64,
                up->job, up->name, up->rank, up->data_size, up->sha_hex, up->t_eof - up->t_header,
                uv_now(&s->d->loop) - up->t_eof);
    snprintf(path, sizeof(path), "checkpoints/%s/%s", up->job, strrchr(up->final, '/') + 1);
    resp.rank = up->rank;
    resp.data_size = up->data_size;
    resp.file_size = sh.file_size;
    resp.sha256 = up->sha_hex;
    resp.path = path;
    sl_rpc_call_reply(up->call, &resp.base);
}

/* Pump the uploads that wait for memory, once some is free. */
static void up_wake_blocked(sl_ckpt_svc *s)
{
    if (!s->mem_blocked || s->mem_held >= s->d->cfg.upload_memory)
        return;
    s->mem_blocked = 0;
    for (upload *u = s->uploads, *next; u; u = next) {
        next = u->next; /* u may unregister itself; it never removes another */
        if (u->have_header && !u->reading && !u->stopped && !u->eof)
            up_pump(u);
    }
}

/* After a lane job: go on, or end the disk work of a stopped upload once both lanes are idle. */
static void up_continue(upload *up)
{
    sl_ckpt_svc *s = up->svc;

    if (up->stopped) {
        if (!up->busy && !up->hbusy) {
            up_free_chunks(up, 1);
            up_release(up);
        }
    } else if (sl_rpc_call_is_done(up->call)) {
        up_stop(up, up->aborted);
    } else {
        up_pump(up);
    }
    up_wake_blocked(s);
}

static void up_after(uv_work_t *w, int status)
{
    upload *up = w->data;
    sl_rpc_call *call = up->call;

    up->busy = 0;
    if (up->finalizing && !up->err) {
        /* The bytes are durable: record them even if the client has gone. */
        up_recorded(up);
    } else if (up->stopped) {
        up_continue(up);
    } else if (up->err == SL_ESTATE && !up->have_header) {
        /* A resume that does not match what the server holds: keep the partial file. */
        sl_rpc_call_fail(call, up->err, "%s", up->errmsg);
        up_stop(up, 0);
    } else if (up->err) {
        up_fail(up, io_err_status(up->err), "%s", up->errmsg);
    } else {
        if (up->have_header)
            up->seq_write = up->write_end;
        up->acked = up->written;
        up->have_header = 1;
        up_continue(up);
    }
    sl_rpc_call_unref(call);
}

static void up_hash_after(uv_work_t *w, int status)
{
    upload *up = w->data;
    sl_rpc_call *call = up->call;

    up->hbusy = 0;
    up->seq_hash = up->hash_end;
    if (up->herr && !up->stopped)
        up_fail(up, up->herr, "hashing failed");
    else
        up_continue(up);
    sl_rpc_call_unref(call);
}

/* Keep the pipeline moving: hand pending chunks to a worker, ask for more, finish at the end. */
static void up_pump(upload *up)
{
    if (up->stopped || up->finalizing)
        return;
    up_free_chunks(up, 0);
    if (!up->busy && up->seq_write < up->seq_tail) {
        up->write_end = up->seq_tail;
        up_queue(up, up_write_work);
    }
    if (!up->hbusy && up->seq_hash < up->seq_tail) {
        up->hash_end = up->seq_tail;
        up->hbusy = 1;
        up->herr = 0;
        sl_rpc_call_ref(up->call);
        uv_queue_work(&up->svc->d->loop, &up->hwork, up_hash_work, up_hash_after);
    }
    if (!up->reading && !up->eof && up->seq_tail - up->seq_free < UP_INFLIGHT) {
        /* The budget bounds memory across thousands of concurrent ranks; a waiting upload is
         * pumped again when chunks are freed (up_continue). */
        if (up->svc->mem_held >= up->svc->d->cfg.upload_memory)
            up->svc->mem_blocked = 1;
        else if (sl_rpc_call_read(up->call) == 0)
            up->reading = 1;
    }
    if (up->eof && !up->busy && !up->hbusy && up->seq_hash == up->seq_tail &&
        up->seq_write == up->seq_tail)
        up_finish(up);
}

static void up_header(upload *up, const Sluice__V1__ShardHeader *h)
{
    sl_ckpt_svc *s = up->svc;
    sl_rpc_call *call = up->call;
    char msg[256] = "";
    sl_cat_ckpt ck;
    uint64_t free_bytes;
    upload *other;
    int err;

    if (!names_ok(call, h->job, h->checkpoint) || sl_rpc_call_claim(call, h->job, "job") != 0 ||
        find_ckpt(s, call, &ck, h->job, h->checkpoint))
        return;
    snprintf(up->job, sizeof(up->job), "%s", h->job);
    snprintf(up->name, sizeof(up->name), "%s", h->checkpoint);
    if (h->rank < 0 || h->rank >= ck.world_size) {
        sl_rpc_call_fail(call, SL_EINVAL, "rank %d out of range [0, %d)", h->rank, ck.world_size);
        return;
    }
    if (h->data_size > (uint64_t)INT64_MAX - SL_SHARD_HEADER_SIZE) {
        sl_rpc_call_fail(call, SL_EINVAL, "data_size %" PRIu64 " is not a valid size",
                         h->data_size);
        return;
    }
    if (h->data_size > s->d->cfg.max_shard_bytes) {
        sl_rpc_call_fail(call, SL_ELIMIT, "data_size %" PRIu64 " exceeds max_shard_bytes %" PRIu64,
                         h->data_size, s->d->cfg.max_shard_bytes);
        return;
    }
    if (h->offset > h->data_size) {
        sl_rpc_call_fail(call, SL_EINVAL, "offset %" PRIu64 " beyond data_size %" PRIu64, h->offset,
                         h->data_size);
        return;
    }
    if (h->sha256 && *h->sha256 && sl_shard_hex_check(h->sha256) != 0) {
        sl_rpc_call_fail(call, SL_EINVAL, "sha256 '%.80s' is not 64 lowercase hex digits",
                         h->sha256);
        return;
    }
    err =
        tensors_check(&up->tensors_json, h->tensors, h->n_tensors, h->data_size, msg, sizeof(msg));
    if (err) {
        sl_rpc_call_fail(call, err, "%s", msg[0] ? msg : "out of memory");
        return;
    }
    if (ck.state != SL_CKPT_WRITING) {
        sl_rpc_call_fail(call, SL_ESTATE, "checkpoint %s/%s is %s, not WRITING", ck.job, ck.name,
                         sl_cat_ckpt_state_name(ck.state));
        return;
    }
    if (is_committing(s, ck.id)) {
        sl_rpc_call_fail(call, SL_ESTATE, "checkpoint %s/%s is being committed", ck.job, ck.name);
        return;
    }
    {
        /* Other ranks' lists as recorded; uploads running now are not counted, a bound that is
         * good enough for a limit that only hostile input reaches. */
        uint64_t others = 0;
        size_t mine = strlen(up->tensors_json);
        err = sl_cat_ckpt_tensor_bytes(s->d->cat, &others, ck.id, h->rank);
        if (err) {
            sl_rpc_call_fail(call, err, "catalog error: %s", sl_strerror(err));
            return;
        }
        if (others + mine > META_MAX) {
            sl_rpc_call_fail(call, SL_ELIMIT,
                             "tensor lists of %s/%s would take %" PRIu64
                             " bytes of metadata, at most %u",
                             ck.job, ck.name, others + mine, META_MAX);
            return;
        }
    }
    if ((other = find_upload(s, ck.id, h->rank)) != NULL) {
        sl_rpc_call_fail(call, SL_ESTATE, "an upload of rank %d of %s/%s is already in progress",
                         h->rank, ck.job, ck.name);
        return;
    }
    if (job_dir(s, up->dir, sizeof(up->dir), ck.job) != 0 ||
        in_dir(up->part, sizeof(up->part), up->dir, ".%s_shard_%d" PART_SUFFIX, ck.name, h->rank) !=
            0 ||
        in_dir(up->final, sizeof(up->final), up->dir, "%s_shard_%d.shard", ck.name, h->rank) != 0) {
        up->part[0] = '\0';
        sl_rpc_call_fail(call, SL_EINVAL, "checkpoint path too long");
        return;
    }
    err = sl_store_free_bytes(s->root, &free_bytes);
    if (!err && free_bytes < h->data_size - h->offset + SL_SHARD_HEADER_SIZE) {
        up->part[0] = '\0'; /* nothing of ours to remove: a resumable prefix stays */
        sl_rpc_call_fail(call, SL_ELIMIT,
                         "not enough space for rank %d: %" PRIu64 " bytes needed, %" PRIu64 " free",
                         h->rank, h->data_size - h->offset, free_bytes);
        return;
    }
    err = sl_sha256_new(&up->sha);
    if (err) {
        sl_rpc_call_fail(call, err, "cannot start hashing");
        return;
    }
    up->ckpt_id = ck.id;
    up->rank = h->rank;
    up->world_size = ck.world_size;
    up->data_size = h->data_size;
    up->resume_from = h->offset;
    up->received = h->offset;
    up->tensor_count = (uint32_t)h->n_tensors;
    if (h->sha256 && *h->sha256)
        snprintf(up->client_sha, sizeof(up->client_sha), "%s", h->sha256);
    up->next = s->uploads;
    s->uploads = up;
    up->registered = 1;
    up->t_header = uv_now(&s->d->loop);
    up_queue(up, up_open_work);
}

static void up_start(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    upload *up = calloc(1, sizeof(*up));

    if (!up) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        return;
    }
    up->svc = arg;
    up->call = call;
    up->fd = -1;
    up->work.data = up;
    up->hwork.data = up;
    sl_rpc_call_set_data(call, up, up_data_free);
    if (sl_rpc_call_read(call) == 0)
        up->reading = 1;
}

static void up_message(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    upload *up = sl_rpc_call_data(call);
    const Sluice__V1__UploadShardRequest *m = (const void *)msg;

    up->reading = 0;
    if (up->stopped)
        return;
    if (!up->registered) {
        /* The first message: the header. */
        if (!m) {
            sl_rpc_call_fail(call, SL_EINVAL, "stream ended before the header");
            return;
        }
        if (m->kind_case != SLUICE__V1__UPLOAD_SHARD_REQUEST__KIND_HEADER) {
            sl_rpc_call_fail(call, SL_EINVAL, "the first message must be the header");
            return;
        }
        up_header(up, m->header);
        return;
    }
    if (!m) {
        up->eof = 1;
        up_pump(up);
        return;
    }
    if (m->kind_case != SLUICE__V1__UPLOAD_SHARD_REQUEST__KIND_CHUNK) {
        up_fail(up, SL_EINVAL, "only data chunks may follow the header");
        return;
    }
    if (m->chunk.len > MAX_CHUNK) {
        up_fail(up, SL_EINVAL, "chunk of %zu bytes exceeds %u", m->chunk.len, MAX_CHUNK);
        return;
    }
    if (m->chunk.len > up->data_size - up->received) {
        up_fail(up, SL_EINVAL, "more data than the declared %" PRIu64 " bytes", up->data_size);
        return;
    }
    if (m->chunk.len > 0) {
        struct chunk *c = &up->ring[up->seq_tail % UP_RING];
        c->bytes = sl_rpc_call_take_bytes(call);
        if (!c->bytes) {
            /* The layer hands over every non-empty chunk (bytes_field below). */
            up_fail(up, SL_EINVAL, "chunk of %zu bytes arrived without its data", m->chunk.len);
            return;
        }
        c->len = m->chunk.len;
        c->off = up->received;
        up->svc->mem_held += m->chunk.len;
        up->seq_tail++;
        up->received += m->chunk.len;
    }
    up_pump(up);
}

/* An undecodable message mid-stream: fail like any other bad message, answering only once the
 * upload is released so that a retry of the same rank is not refused as "in progress". */
static void up_bad_message(sl_rpc_call *call, int err, const char *why, void *arg)
{
    upload *up = sl_rpc_call_data(call);

    (void)arg;
    up->reading = 0;
    if (up->stopped)
        return;
    if (!up->registered)
        sl_rpc_call_fail(call, err, "%s", why);
    else
        up_fail(up, err, "%s", why);
}

static void up_cancel(sl_rpc_call *call, void *arg)
{
    upload *up = sl_rpc_call_data(call);

    /* The client went away: keep what was written, so the upload can be resumed; a running
     * finalize still records its durable shard. */
    if (up && up->registered && !up->finalizing)
        up_stop(up, up->aborted);
}

/* ---- UploadStatus ---- */

static void ckpt_upload_status(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__UploadStatusRequest *req = (const void *)msg;
    Sluice__V1__UploadStatusResponse resp = SLUICE__V1__UPLOAD_STATUS_RESPONSE__INIT;
    sl_ckpt_svc *s = arg;
    char dir[PATH_MAX], part[PATH_MAX];
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    sl_shard_header h;
    sl_cat_shard sh;
    sl_cat_ckpt ck;
    struct stat st;
    upload *u;
    int fd;

    if (!names_ok(call, req->job, req->checkpoint) ||
        find_ckpt(s, call, &ck, req->job, req->checkpoint))
        return;
    if (req->rank < 0 || req->rank >= ck.world_size) {
        sl_rpc_call_fail(call, SL_EINVAL, "rank %d out of range [0, %d)", req->rank, ck.world_size);
        return;
    }
    if (sl_cat_shard_get(s->d->cat, &sh, ck.id, req->rank) == 0) {
        resp.stored = 1;
        resp.sha256 = sh.sha256;
    }
    if ((u = find_upload(s, ck.id, req->rank)) != NULL) {
        resp.in_progress = 1;
        resp.held_bytes = u->acked;
    } else if (job_dir(s, dir, sizeof(dir), ck.job) == 0 &&
               in_dir(part, sizeof(part), dir, ".%s_shard_%d" PART_SUFFIX, ck.name, req->rank) ==
                   0 &&
               (fd = open(part, O_RDONLY | O_CLOEXEC)) >= 0) {
        if (fstat(fd, &st) == 0 && sl_store_pread_all(fd, hdr, sizeof(hdr), 0) == 0 &&
            sl_shard_header_decode(&h, hdr, sizeof(hdr)) == 0 && h.rank == req->rank &&
            (uint64_t)st.st_size >= SL_SHARD_HEADER_SIZE) {
            uint64_t held = (uint64_t)st.st_size - SL_SHARD_HEADER_SIZE;
            resp.held_bytes = held < h.data_len ? held : h.data_len;
        }
        close(fd);
    }
    sl_rpc_call_reply(call, &resp.base);
}

/* ---- DownloadShard ---- */

typedef struct download {
    uv_work_t work;
    sl_ckpt_svc *svc;
    sl_rpc_call *call;
    char path[PATH_MAX];
    int32_t rank;
    int fd;
    uint64_t data_size, pos;
    char sha[SL_SHARD_HEX_LEN + 1];
    char got[SL_SHARD_HEX_LEN + 1];
    sl_sha256 *h; /* NULL when resuming from an offset: nothing to compare against */
    uint8_t *buf;
    size_t len;
    int busy, sent_last, err;
    char errmsg[256];
} download;

static void dl_free(void *p)
{
    download *dl = p;

    if (dl->fd >= 0)
        close(dl->fd);
    sl_sha256_free(dl->h);
    free(dl->buf);
    free(dl);
}

static void dl_work(uv_work_t *w)
{
    download *dl = w->data;
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    sl_shard_header h;
    uint64_t left;
    int err = 0;

    if (dl->fd < 0) {
        dl->fd = open(dl->path, O_RDONLY | O_CLOEXEC);
        if (dl->fd < 0) {
            err = -errno;
            snprintf(dl->errmsg, sizeof(dl->errmsg), "shard file of rank %d: %s", dl->rank,
                     sl_strerror(err));
            err = err == -ENOENT ? SL_ECORRUPT : err;
            goto out;
        }
        if (sl_store_pread_all(dl->fd, hdr, sizeof(hdr), 0) != 0 ||
            sl_shard_header_decode(&h, hdr, sizeof(hdr)) != 0 || h.rank != dl->rank ||
            h.data_len != dl->data_size || strcmp(h.sha256, dl->sha) != 0) {
            err = SL_ECORRUPT;
            snprintf(dl->errmsg, sizeof(dl->errmsg),
                     "shard file of rank %d has a header that does not match the catalog",
                     dl->rank);
            goto out;
        }
    }
    left = dl->data_size - dl->pos;
    dl->len = left < DL_CHUNK ? (size_t)left : DL_CHUNK;
    err = sl_store_pread_all(dl->fd, dl->buf, dl->len, SL_SHARD_HEADER_SIZE + dl->pos);
    if (err) {
        snprintf(dl->errmsg, sizeof(dl->errmsg), "cannot read the shard of rank %d: %s", dl->rank,
                 err == -EIO ? "file is truncated" : sl_strerror(err));
        err = err == -EIO ? SL_ECORRUPT : err;
        goto out;
    }
    if (dl->h) {
        err = sl_sha256_update(dl->h, dl->buf, dl->len);
        if (!err && dl->pos + dl->len == dl->data_size)
            err = sl_sha256_final(dl->h, dl->got);
    }
out:
    dl->err = err;
}

static void dl_after(uv_work_t *w, int status);

static void dl_pump(sl_rpc_call *call, void *arg)
{
    download *dl = sl_rpc_call_data(call);

    if (!dl || dl->busy || dl->sent_last || sl_rpc_call_is_done(call))
        return;
    if (sl_rpc_call_send_room(call) <= 0 ||
        64 - sl_rpc_call_send_room(call) >= DL_QUEUED) /* the layer's window is 64 */
        return;
    dl->busy = 1;
    sl_rpc_call_ref(call);
    uv_queue_work(&dl->svc->d->loop, &dl->work, dl_work, dl_after);
}

static void dl_after(uv_work_t *w, int status)
{
    download *dl = w->data;
    sl_rpc_call *call = dl->call;
    Sluice__V1__DownloadShardResponse m = SLUICE__V1__DOWNLOAD_SHARD_RESPONSE__INIT;

    dl->busy = 0;
    if (sl_rpc_call_is_done(call))
        goto out;
    if (dl->err) {
        sl_rpc_call_fail(call, dl->err, "%s", dl->errmsg);
        goto out;
    }
    m.data.data = dl->buf;
    m.data.len = dl->len;
    m.offset = dl->pos;
    m.data_size = dl->data_size;
    dl->pos += dl->len;
    if (dl->pos == dl->data_size) {
        if (dl->h && strcmp(dl->got, dl->sha) != 0) {
            sl_log_error("ckpt_download_corrupt", "path=%s sha256=%s catalog=%s", dl->path, dl->got,
                         dl->sha);
            sl_rpc_call_fail(call, SL_ECORRUPT,
                             "shard of rank %d is corrupt: data hashes to %s, catalog has %s",
                             dl->rank, dl->got, dl->sha);
            goto out;
        }
        m.sha256 = dl->sha;
        dl->sent_last = 1;
    }
    if (sl_rpc_call_send(call, &m.base) != 0)
        goto out;
    if (dl->sent_last)
        sl_rpc_call_finish(call, SL_RPC_OK, NULL);
    else
        dl_pump(call, NULL);
out:
    sl_rpc_call_unref(call);
}

static void ckpt_download(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__DownloadShardRequest *req = (const void *)msg;
    sl_ckpt_svc *s = arg;
    char dir[PATH_MAX];
    download *dl;
    sl_cat_shard sh;
    sl_cat_ckpt ck;
    int err;

    if (!names_ok(call, req->job, req->name) || sl_rpc_call_claim(call, req->job, "job") != 0 ||
        find_ckpt(s, call, &ck, req->job, req->name))
        return;
    if (req->rank < 0 || req->rank >= ck.world_size) {
        sl_rpc_call_fail(call, SL_EINVAL, "rank %d out of range [0, %d)", req->rank, ck.world_size);
        return;
    }
    err = sl_cat_shard_get(s->d->cat, &sh, ck.id, req->rank);
    if (err) {
        sl_rpc_call_fail(call, err, "checkpoint %s/%s has no shard for rank %d", ck.job, ck.name,
                         req->rank);
        return;
    }
    if (req->offset > sh.data_size) {
        sl_rpc_call_fail(call, SL_EINVAL, "offset %" PRIu64 " beyond the data size %" PRIu64,
                         req->offset, sh.data_size);
        return;
    }
    dl = calloc(1, sizeof(*dl));
    if (!dl || !(dl->buf = malloc(DL_CHUNK))) {
        free(dl);
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        return;
    }
    dl->svc = s;
    dl->call = call;
    dl->fd = -1;
    dl->rank = req->rank;
    dl->data_size = sh.data_size;
    dl->pos = req->offset;
    dl->work.data = dl;
    memcpy(dl->sha, sh.sha256, sizeof(dl->sha));
    sl_rpc_call_set_data(call, dl, dl_free);
    if (job_dir(s, dir, sizeof(dir), ck.job) != 0 ||
        in_dir(dl->path, sizeof(dl->path), dir, "%s_shard_%d.shard", ck.name, req->rank) != 0) {
        sl_rpc_call_fail(call, SL_EINVAL, "checkpoint path too long");
        return;
    }
    if (req->offset == 0 && sl_sha256_new(&dl->h) != 0) {
        sl_rpc_call_fail(call, SL_EUNAVAILABLE, "cannot start hashing");
        return;
    }
    dl_pump(call, s);
}

/* ---- Verify ---- */

typedef struct verify verify;

typedef struct vjob {
    uv_work_t work;
    verify *v;
    int32_t rank; /* -1: the metadata file */
    int queued;
    uint64_t data_size, file_size;
    char sha[SL_SHARD_HEX_LEN + 1];
    int verdict;
    char detail[200];
} vjob;

struct verify {
    sl_rpc_call *call;
    sl_ckpt_svc *svc;
    sl_cat_ckpt ck;
    int deep;
    int pending;
    vjob *jobs; /* world_size shards, then the metadata file */
    sbuf meta;  /* the expected metadata.json */
    char dir[PATH_MAX];
};

static void verify_free(verify *v)
{
    free(v->jobs);
    free(v->meta.p);
    free(v);
}

/* Paths are built in the worker, not stored per rank: a world of 65536 ranks would otherwise
 * need PATH_MAX bytes each. */
static void vjob_shard(vjob *j, const char *path, int deep)
{
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    sl_shard_header h;
    sl_sha256 *sha = NULL;
    char got[SL_SHARD_HEX_LEN + 1];
    struct stat st;
    int fd, err;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        j->verdict = errno == ENOENT ? SLUICE__V1__VERDICT__MISSING : SLUICE__V1__VERDICT__IO_ERROR;
        snprintf(j->detail, sizeof(j->detail), "%s", sl_strerror(-errno));
        return;
    }
    if (fstat(fd, &st) != 0) {
        j->verdict = SLUICE__V1__VERDICT__IO_ERROR;
        snprintf(j->detail, sizeof(j->detail), "%s", sl_strerror(-errno));
        goto out;
    }
    if ((uint64_t)st.st_size != j->file_size) {
        j->verdict = SLUICE__V1__VERDICT__SIZE_MISMATCH;
        snprintf(j->detail, sizeof(j->detail), "file has %lld bytes, catalog says %" PRIu64,
                 (long long)st.st_size, j->file_size);
        goto out;
    }
    if (sl_store_pread_all(fd, hdr, sizeof(hdr), 0) != 0 ||
        sl_shard_header_decode(&h, hdr, sizeof(hdr)) != 0) {
        j->verdict = SLUICE__V1__VERDICT__HEADER_CORRUPT;
        snprintf(j->detail, sizeof(j->detail), "header does not parse");
        goto out;
    }
    if (h.rank != j->rank || h.data_len != j->data_size || strcmp(h.sha256, j->sha) != 0) {
        j->verdict = SLUICE__V1__VERDICT__HEADER_CORRUPT;
        snprintf(j->detail, sizeof(j->detail),
                 "header says rank %d, %" PRIu64 " bytes, sha256 %.16s...; catalog says rank %d, "
                 "%" PRIu64 " bytes, sha256 %.16s...",
                 h.rank, h.data_len, h.sha256, j->rank, j->data_size, j->sha);
        goto out;
    }
    if (deep) {
        err = sl_sha256_new(&sha);
        if (!err)
            err = sl_shard_hash_fd(sha, fd, SL_SHARD_HEADER_SIZE, j->data_size);
        if (!err)
            err = sl_sha256_final(sha, got);
        if (err) {
            j->verdict = SLUICE__V1__VERDICT__IO_ERROR;
            snprintf(j->detail, sizeof(j->detail), "cannot hash: %s", sl_strerror(err));
            goto out;
        }
        if (strcmp(got, j->sha) != 0) {
            j->verdict = SLUICE__V1__VERDICT__CHECKSUM_MISMATCH;
            snprintf(j->detail, sizeof(j->detail), "data hashes to %s, catalog has %s", got,
                     j->sha);
            goto out;
        }
    }
    j->verdict = SLUICE__V1__VERDICT__OK;
out:
    sl_sha256_free(sha);
    close(fd);
}

/* The metadata file must be byte for byte what the catalog renders; it is small (metadata, not
 * data), so it is compared in 64 KiB pieces without holding it whole. */
static void vjob_meta(vjob *j, const char *path, const sbuf *expect)
{
    uint8_t buf[65536];
    struct stat st;
    uint64_t pos = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        j->verdict = errno == ENOENT ? SLUICE__V1__VERDICT__MISSING : SLUICE__V1__VERDICT__IO_ERROR;
        snprintf(j->detail, sizeof(j->detail), "%s", sl_strerror(-errno));
        return;
    }
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != expect->len) {
        j->verdict = SLUICE__V1__VERDICT__SIZE_MISMATCH;
        snprintf(j->detail, sizeof(j->detail), "file has %lld bytes, expected %zu",
                 (long long)st.st_size, expect->len);
        goto out;
    }
    while (pos < expect->len) {
        size_t n = expect->len - pos < sizeof(buf) ? expect->len - pos : sizeof(buf);
        if (sl_store_pread_all(fd, buf, n, pos) != 0) {
            j->verdict = SLUICE__V1__VERDICT__IO_ERROR;
            snprintf(j->detail, sizeof(j->detail), "cannot read");
            goto out;
        }
        if (memcmp(buf, expect->p + pos, n) != 0) {
            j->verdict = SLUICE__V1__VERDICT__HEADER_CORRUPT;
            snprintf(j->detail, sizeof(j->detail),
                     "content differs from the catalog near byte %" PRIu64, pos);
            goto out;
        }
        pos += n;
    }
    j->verdict = SLUICE__V1__VERDICT__OK;
out:
    close(fd);
}

static void vjob_work(uv_work_t *w)
{
    vjob *j = w->data;
    verify *v = j->v;
    char path[PATH_MAX];
    int err = j->rank < 0
                  ? in_dir(path, sizeof(path), v->dir, "%s.metadata.json", v->ck.name)
                  : in_dir(path, sizeof(path), v->dir, "%s_shard_%d.shard", v->ck.name, j->rank);

    if (err) {
        j->verdict = SLUICE__V1__VERDICT__IO_ERROR;
        snprintf(j->detail, sizeof(j->detail), "path too long");
    } else if (j->rank < 0) {
        vjob_meta(j, path, &v->meta);
    } else {
        vjob_shard(j, path, v->deep);
    }
}

static void verify_reply(verify *v)
{
    Sluice__V1__VerifyResponse resp = SLUICE__V1__VERIFY_RESPONSE__INIT;
    int32_t n = v->ck.world_size;
    Sluice__V1__ShardVerdict *sv = calloc((size_t)n, sizeof(*sv));
    Sluice__V1__ShardVerdict **pv = calloc((size_t)n, sizeof(*pv));
    int ok = 1, bad = 0;

    if (!sv || !pv) {
        sl_rpc_call_fail(v->call, -ENOMEM, "out of memory");
        goto out;
    }
    for (int32_t r = 0; r < n; r++) {
        sluice__v1__shard_verdict__init(&sv[r]);
        sv[r].rank = r;
        sv[r].verdict = (Sluice__V1__Verdict)v->jobs[r].verdict;
        sv[r].detail = v->jobs[r].detail;
        pv[r] = &sv[r];
        if (sv[r].verdict != SLUICE__V1__VERDICT__OK) {
            ok = 0;
            bad++;
        }
    }
    resp.shards = pv;
    resp.n_shards = (size_t)n;
    resp.metadata = (Sluice__V1__Verdict)v->jobs[n].verdict;
    resp.metadata_detail = v->jobs[n].detail;
    if (v->ck.state == SL_CKPT_COMPLETE && resp.metadata != SLUICE__V1__VERDICT__OK)
        ok = 0;
    resp.ok = ok;
    for (int32_t r = 0; r <= n; r++) {
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(
            &sluice__v1__verdict__descriptor, r < n ? (int)sv[r].verdict : (int)resp.metadata);
        char labels[96];
        snprintf(labels, sizeof(labels), "mode=\"%s\",verdict=\"%s\"", v->deep ? "deep" : "quick",
                 ev ? ev->name : "UNKNOWN");
        sl_metrics_add(v->svc->d->ops.metrics, "sluice_verify_verdicts_total", labels, 1);
    }
    sl_log(ok ? SL_LOG_INFO : SL_LOG_WARN, "ckpt_verify",
           "job=%s name=%s mode=%s ok=%d bad_shards=%d", v->ck.job, v->ck.name,
           v->deep ? "deep" : "quick", ok, bad);
    sl_rpc_call_reply(v->call, &resp.base);
out:
    free(sv);
    free(pv);
}

static void vjob_after(uv_work_t *w, int status)
{
    vjob *j = w->data;
    verify *v = j->v;
    sl_rpc_call *call = v->call;

    if (--v->pending > 0)
        return;
    if (!sl_rpc_call_is_done(call))
        verify_reply(v);
    verify_free(v);
    sl_rpc_call_unref(call);
}

static int verify_collect(const sl_cat_shard *sh, void *arg)
{
    verify *v = arg;
    vjob *j;

    if (sh->rank < 0 || sh->rank >= v->ck.world_size)
        return 0;
    j = &v->jobs[sh->rank];
    j->data_size = sh->data_size;
    j->file_size = sh->file_size;
    memcpy(j->sha, sh->sha256, sizeof(j->sha));
    j->queued = 1;
    return 0;
}

static void ckpt_verify(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__V1__VerifyRequest *req = (const void *)msg;
    sl_ckpt_svc *s = arg;
    verify *v;
    int32_t n;
    int err;

    v = calloc(1, sizeof(*v));
    if (!v) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        return;
    }
    if (!names_ok(call, req->job, req->name))
        goto fail;
    if (req->mode != SLUICE__V1__VERIFY_MODE__QUICK && req->mode != SLUICE__V1__VERIFY_MODE__DEEP) {
        sl_rpc_call_fail(call, SL_EINVAL, "mode %d is not a verify mode (0 quick, 1 deep)",
                         (int)req->mode);
        goto fail;
    }
    if (find_ckpt(s, call, &v->ck, req->job, req->name))
        goto fail;
    if (v->ck.state == SL_CKPT_INCOMPLETE) {
        sl_rpc_call_fail(call, SL_ESTATE, "checkpoint %s/%s is INCOMPLETE (aborted)", req->job,
                         req->name);
        goto fail;
    }
    n = v->ck.world_size;
    v->call = call;
    v->svc = s;
    v->deep = req->mode == SLUICE__V1__VERIFY_MODE__DEEP;
    v->jobs = calloc((size_t)n + 1, sizeof(*v->jobs));
    if (!v->jobs || job_dir(s, v->dir, sizeof(v->dir), v->ck.job) != 0) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        goto fail;
    }
    for (int32_t r = 0; r <= n; r++) {
        v->jobs[r].v = v;
        v->jobs[r].rank = r < n ? r : -1;
        v->jobs[r].work.data = &v->jobs[r];
        v->jobs[r].verdict = SLUICE__V1__VERDICT__NOT_UPLOADED;
    }
    v->jobs[n].verdict = SLUICE__V1__VERDICT__VERDICT_UNSPECIFIED;
    err = sl_cat_shard_list(s->d->cat, v->ck.id, 0, verify_collect, v);
    if (!err && v->ck.state == SL_CKPT_COMPLETE) {
        err = render_metadata(s, &v->ck, v->ck.committed_ms, &v->meta);
        if (!err)
            v->jobs[n].queued = 1;
    }
    if (err) {
        sl_rpc_call_fail(call, err, "catalog error: %s", sl_strerror(err));
        goto fail;
    }
    for (int32_t r = 0; r <= n; r++)
        if (v->jobs[r].queued)
            v->pending++;
    if (v->pending == 0) {
        verify_reply(v);
        verify_free(v);
        return;
    }
    /* One reference for the whole verification, dropped by the last job. */
    sl_rpc_call_ref(call);
    for (int32_t r = 0; r <= n; r++)
        if (v->jobs[r].queued)
            uv_queue_work(&s->d->loop, &v->jobs[r].work, vjob_work, vjob_after);
    return;
fail:
    verify_free(v);
}

/* ---- sweeps: temp files at startup and abandoned partial uploads ---- */

typedef struct sweep_ctx {
    sl_ckpt_svc *svc;
    const char *job;
    int startup;
    int64_t now_ms;
} sweep_ctx;

/* Split "<name>_shard_<rank><suffix>" into name and rank. Returns 0 or SL_EINVAL. */
static int parse_shard_name(const char *file, const char *suffix, char *name, size_t len,
                            int32_t *rank)
{
    size_t n = strlen(file), sl = strlen(suffix);
    const char *end, *mark = NULL, *p;
    char *stop;
    long r;

    if (n <= sl || strcmp(file + n - sl, suffix) != 0)
        return SL_EINVAL;
    end = file + n - sl;
    for (p = file; (p = strstr(p, "_shard_")) != NULL && p < end; p++)
        mark = p;
    if (!mark || mark == file || (size_t)(mark - file) >= len)
        return SL_EINVAL;
    errno = 0;
    r = strtol(mark + 7, &stop, 10);
    if (stop != end || mark + 7 == end || errno || r < 0 || r > SL_SHARD_MAX_RANK)
        return SL_EINVAL;
    memcpy(name, file, (size_t)(mark - file));
    name[mark - file] = '\0';
    *rank = (int32_t)r;
    return 0;
}

static int sweep_keep(const char *file, const struct stat *st, void *arg)
{
    sweep_ctx *c = arg;
    sl_ckpt_svc *s = c->svc;
    char name[NAME_MAX + 1];
    int64_t age_ms = c->now_ms - (int64_t)st->st_mtime * 1000;
    sl_cat_ckpt ck;
    int32_t rank;
    size_t n = strlen(file);
    int err;

    if (file[0] == '.') {
        if (parse_shard_name(file + 1, PART_SUFFIX, name, sizeof(name), &rank) == 0) {
            err = sl_cat_ckpt_get(s->d->cat, &ck, c->job, name);
            if (err && err != SL_ENOTFOUND)
                return 1; /* the catalog cannot say: keep it, a later sweep decides */
            if (err || ck.state != SL_CKPT_WRITING)
                return 0;
            if (find_upload(s, ck.id, rank))
                return 1;
            return age_ms < (int64_t)s->d->cfg.upload_timeout_ms;
        }
        /* Other temp files (metadata being written) belong to a running commit unless the
         * daemon has just started. */
        return !c->startup;
    }
    if (!c->startup)
        return 1;
    /* Files of checkpoints the catalog forgot (a crash between a delete's commit and its
     * unlinks) or aborted. Anything else is not ours and stays. */
    if (parse_shard_name(file, ".shard", name, sizeof(name), &rank) != 0) {
        if (n <= 14 || strcmp(file + n - 14, ".metadata.json") != 0 || n - 14 >= sizeof(name))
            return 1;
        memcpy(name, file, n - 14);
        name[n - 14] = '\0';
    }
    if (sl_shard_name_check(name) != 0)
        return 1;
    err = sl_cat_ckpt_get(s->d->cat, &ck, c->job, name);
    if (err == SL_ENOTFOUND)
        return 0;
    /* A catalog that cannot be read says nothing about the file: keep it. */
    return err || ck.state != SL_CKPT_INCOMPLETE;
}

/* Whether the data dir is still the one whose LOCK the daemon holds. If it was removed (and
 * perhaps made again for another daemon), the files at its path are not in this daemon's
 * catalog and a sweep would remove them: found when a daemon left running on a removed data dir
 * deleted a new daemon's partial uploads every 60 s (tests/bench/soak.c, docs/hardening.md). */
static int data_dir_held(sl_ckpt_svc *s)
{
    char path[PATH_MAX + 8];
    struct stat held, now;

    if (s->d->lock_fd < 0)
        return 1;
    snprintf(path, sizeof(path), "%s/LOCK", s->d->data_dir);
    if (fstat(s->d->lock_fd, &held) != 0)
        return -1;
    if (stat(path, &now) != 0)
        /* Only a missing path is proof; EIO, ESTALE or EACCES may pass: skip this sweep. */
        return errno == ENOENT || errno == ENOTDIR ? 0 : -1;
    return held.st_dev == now.st_dev && held.st_ino == now.st_ino;
}

static void sweep_all(sl_ckpt_svc *s, int startup)
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
                         s->d->data_dir);
        s->dir_lost = 1;
        return;
    }
    d = opendir(s->root);
    if (!d)
        return;
    while ((e = readdir(d)) != NULL) {
        sweep_ctx c = {s, e->d_name, startup, now_ms()};
        if (sl_shard_name_check(e->d_name) != 0 || job_dir(s, dir, sizeof(dir), e->d_name) != 0)
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

static void on_sweep(uv_timer_t *t)
{
    sweep_all(t->data, 0);
}

/* ---- service ---- */

/* Designated initializers: the table stays valid when the layer adds fields. Access: reading
 * and verifying need reader, writing a checkpoint trainer, deleting (Delete, retention) admin. */
static const sl_rpc_method ckpt_methods[] = {
    {
        .name = "Begin",
        .access = SL_ACCESS_TRAINER,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__begin_request__descriptor,
        .response = &sluice__v1__checkpoint__descriptor,
        .on_start = ckpt_begin,
    },
    {
        .name = "UploadShard",
        .access = SL_ACCESS_TRAINER,
        .kind = SL_RPC_CLIENT_STREAM,
        .request = &sluice__v1__upload_shard_request__descriptor,
        .response = &sluice__v1__upload_shard_response__descriptor,
        .on_start = up_start,
        .on_message = up_message,
        .on_cancel = up_cancel,
        .on_bad_message = up_bad_message,
        /* Chunks arrive as the received buffers: hashed and written without a copy. */
        .bytes_field = SLUICE__V1__UPLOAD_SHARD_REQUEST__KIND_CHUNK,
    },
    {
        .name = "UploadStatus",
        .access = SL_ACCESS_READER,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__upload_status_request__descriptor,
        .response = &sluice__v1__upload_status_response__descriptor,
        .on_start = ckpt_upload_status,
    },
    {
        .name = "Commit",
        .access = SL_ACCESS_TRAINER,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__checkpoint_ref__descriptor,
        .response = &sluice__v1__checkpoint__descriptor,
        .on_start = ckpt_commit,
    },
    {
        .name = "Abort",
        .access = SL_ACCESS_TRAINER,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__checkpoint_ref__descriptor,
        .response = &sluice__v1__checkpoint__descriptor,
        .on_start = ckpt_abort,
    },
    {
        .name = "Get",
        .access = SL_ACCESS_READER,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__checkpoint_ref__descriptor,
        .response = &sluice__v1__checkpoint__descriptor,
        .on_start = ckpt_get,
    },
    {
        .name = "List",
        .access = SL_ACCESS_READER,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__list_request__descriptor,
        .response = &sluice__v1__list_response__descriptor,
        .on_start = ckpt_list_rpc,
    },
    {
        .name = "Latest",
        .access = SL_ACCESS_READER,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__latest_request__descriptor,
        .response = &sluice__v1__checkpoint__descriptor,
        .on_start = ckpt_latest,
    },
    {
        .name = "Verify",
        .access = SL_ACCESS_READER,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__verify_request__descriptor,
        .response = &sluice__v1__verify_response__descriptor,
        .on_start = ckpt_verify,
    },
    {
        .name = "DownloadShard",
        .access = SL_ACCESS_READER,
        .kind = SL_RPC_SERVER_STREAM,
        .request = &sluice__v1__download_shard_request__descriptor,
        .response = &sluice__v1__download_shard_response__descriptor,
        .on_start = ckpt_download,
        .on_writable = dl_pump,
    },
    {
        .name = "Delete",
        .access = SL_ACCESS_ADMIN,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__checkpoint_ref__descriptor,
        .response = &sluice__v1__delete_response__descriptor,
        .on_start = ckpt_delete,
    },
    {
        .name = "SetRetention",
        .access = SL_ACCESS_ADMIN,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__set_retention_request__descriptor,
        .response = &sluice__v1__set_retention_response__descriptor,
        .on_start = ckpt_set_retention,
    },
};

int sl_ckpt_svc_new(sl_ckpt_svc **out, sl_daemon *d)
{
    sl_ckpt_svc *s = calloc(1, sizeof(*s));
    uint64_t period;
    int n, err;

    *out = NULL;
    if (!s)
        return -ENOMEM;
    s->d = d;
    n = snprintf(s->root, sizeof(s->root), "%s/checkpoints", d->data_dir);
    if (n < 0 || (size_t)n >= sizeof(s->root)) {
        free(s);
        return -ENAMETOOLONG;
    }
    err = sl_store_mkdirs(s->root);
    if (err) {
        sl_log_error("ckpt_dir_failed", "path=%s error=\"%s\"", s->root, sl_strerror(err));
        free(s);
        return err;
    }
    s->svc = (sl_rpc_service){
        .name = "sluice.v1.Checkpoints",
        .methods = ckpt_methods,
        .n_methods = sizeof(ckpt_methods) / sizeof(ckpt_methods[0]),
        .arg = s,
    };
    sweep_all(s, 1);
    uv_timer_init(&d->loop, &s->sweep);
    s->sweep.data = s;
    period = d->cfg.upload_timeout_ms / 2;
    if (period > SWEEP_PERIOD_MS)
        period = SWEEP_PERIOD_MS;
    if (period < 100)
        period = 100;
    uv_timer_start(&s->sweep, on_sweep, period, period);
    /* The sweep must not keep the loop alive once the server has stopped. */
    uv_unref((uv_handle_t *)&s->sweep);
    *out = s;
    return 0;
}

const sl_rpc_service *sl_ckpt_service(sl_ckpt_svc *s)
{
    return &s->svc;
}

static void svc_closed(uv_handle_t *h)
{
    free(h->data);
}

void sl_ckpt_svc_free(sl_ckpt_svc *s)
{
    if (!s)
        return;
    uv_close((uv_handle_t *)&s->sweep, svc_closed);
}
