/* Request validation of the Checkpoints service. See validate.h. */
#include "validate.h"

#include "catalog/ckpt.h"
#include "err.h"
#include "shard.h"
#include "util/buf.h"
#include "util/json.h"
#include "util/utf8.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int sl_ckpt_check_names(const char *job, const char *name, char *msg, size_t len)
{
    if (sl_shard_name_check(job) != 0) {
        snprintf(msg, len,
                 "job '%.200s' is not a valid name (1-%d of [A-Za-z0-9._-], no leading '.', no "
                 "'..')",
                 job ? job : "", SL_SHARD_NAME_MAX);
        return SL_EINVAL;
    }
    if (name && sl_shard_name_check(name) != 0) {
        snprintf(msg, len,
                 "checkpoint '%.200s' is not a valid name (1-%d of [A-Za-z0-9._-], no leading "
                 "'.', no '..')",
                 name, SL_SHARD_NAME_MAX);
        return SL_EINVAL;
    }
    return 0;
}

int sl_ckpt_check_rank(int32_t rank, int32_t world_size, char *msg, size_t len)
{
    if (rank >= 0 && rank < world_size)
        return 0;
    snprintf(msg, len, "rank %d out of range [0, %d)", rank, world_size);
    return SL_EINVAL;
}

int sl_ckpt_check_begin(const Sluice__V1__BeginRequest *req, char *name, size_t name_len, char *msg,
                        size_t len)
{
    int err = sl_ckpt_check_names(req->job, NULL, msg, len);

    if (err)
        return err;
    if (req->step > (uint64_t)INT64_MAX) {
        snprintf(msg, len, "step %" PRIu64 " is above %" PRId64, req->step, INT64_MAX);
        return SL_EINVAL;
    }
    if (req->name && *req->name) {
        if ((err = sl_ckpt_check_names(req->job, req->name, msg, len)) != 0)
            return err;
        snprintf(name, name_len, "%s", req->name);
    } else {
        snprintf(name, name_len, "step_%" PRIu64, req->step);
    }
    if (req->world_size < 1 || req->world_size > SL_CKPT_MAX_WORLD) {
        snprintf(msg, len, "world_size %d out of range [1, %d]", req->world_size,
                 SL_CKPT_MAX_WORLD);
        return SL_EINVAL;
    }
    if (req->feed_job && *req->feed_job) {
        if (req->no_feed) {
            snprintf(msg, len, "feed_job and no_feed are both set");
            return SL_EINVAL;
        }
        if ((err = sl_ckpt_check_names(req->feed_job, NULL, msg, len)) != 0)
            return err;
    }
    if (req->user_metadata && strlen(req->user_metadata) > SL_CAT_USER_MD_MAX) {
        snprintf(msg, len, "user_metadata has %zu bytes, at most %d", strlen(req->user_metadata),
                 SL_CAT_USER_MD_MAX);
        return SL_EINVAL;
    }
    if (req->user_metadata && sl_utf8_check(req->user_metadata, strlen(req->user_metadata)) != 0) {
        snprintf(msg, len, "user_metadata is not valid UTF-8");
        return SL_EINVAL;
    }
    return 0;
}

int sl_ckpt_check_header(const Sluice__V1__ShardHeader *h, int32_t world_size,
                         uint64_t max_shard_bytes, char **tensors_json, char *msg, size_t len)
{
    int err = sl_ckpt_check_rank(h->rank, world_size, msg, len);

    *tensors_json = NULL;
    if (err)
        return err;
    if (h->data_size > (uint64_t)INT64_MAX - SL_SHARD_HEADER_SIZE) {
        snprintf(msg, len, "data_size %" PRIu64 " is not a valid size", h->data_size);
        return SL_EINVAL;
    }
    if (h->data_size > max_shard_bytes) {
        snprintf(msg, len, "data_size %" PRIu64 " exceeds max_shard_bytes %" PRIu64, h->data_size,
                 max_shard_bytes);
        return SL_ELIMIT;
    }
    if (h->offset > h->data_size) {
        snprintf(msg, len, "offset %" PRIu64 " beyond data_size %" PRIu64, h->offset, h->data_size);
        return SL_EINVAL;
    }
    if (h->sha256 && *h->sha256 && sl_shard_hex_check(h->sha256) != 0) {
        snprintf(msg, len, "sha256 '%.80s' is not 64 lowercase hex digits", h->sha256);
        return SL_EINVAL;
    }
    msg[0] = '\0';
    return sl_ckpt_check_tensors(tensors_json, h->tensors, h->n_tensors, h->data_size, msg, len);
}

/* One tensor's name, dtype, shape and size. */
static int check_tensor(const Sluice__V1__TensorInfo *t, size_t i, char *msg, size_t len)
{
    const char *name = t->name ? t->name : "";
    size_t nl = strnlen(name, SL_CKPT_MAX_TENSOR_NAME + 1);
    unsigned isz = dtype_size(t->dtype ? t->dtype : "");
    uint64_t elems = 1;

    if (nl == 0 || nl > SL_CKPT_MAX_TENSOR_NAME) {
        snprintf(msg, len, "tensor %zu: name must have 1..%d characters", i,
                 SL_CKPT_MAX_TENSOR_NAME);
        return SL_EINVAL;
    }
    for (size_t k = 0; k < nl; k++) {
        if ((unsigned char)name[k] < 0x20 || (unsigned char)name[k] > 0x7e) {
            snprintf(msg, len, "tensor %zu: name has a byte 0x%02x outside printable ASCII", i,
                     (unsigned char)name[k]);
            return SL_EINVAL;
        }
    }
    if (!isz) {
        snprintf(msg, len, "tensor '%.64s': unknown dtype '%.32s'", name, t->dtype ? t->dtype : "");
        return SL_EINVAL;
    }
    if (t->n_shape > SL_CKPT_MAX_DIMS) {
        snprintf(msg, len, "tensor '%.64s': %zu dimensions, at most %d", name, t->n_shape,
                 SL_CKPT_MAX_DIMS);
        return SL_EINVAL;
    }
    for (size_t k = 0; k < t->n_shape; k++) {
        if (t->shape[k] < 0 || __builtin_mul_overflow(elems, (uint64_t)t->shape[k], &elems)) {
            snprintf(msg, len, "tensor '%.64s': dimension %zu is %" PRId64, name, k, t->shape[k]);
            return SL_EINVAL;
        }
    }
    if (__builtin_mul_overflow(elems, (uint64_t)isz, &elems) || elems != t->size) {
        snprintf(msg, len, "tensor '%.64s': size %" PRIu64 " does not match its shape and dtype %s",
                 name, t->size, t->dtype);
        return SL_EINVAL;
    }
    return 0;
}

/* Append a checked tensor as an element of the JSON array. Returns 0 or the buffer's error. */
static int render_tensor(sl_buf *b, const Sluice__V1__TensorInfo *t, size_t i)
{
    int err = i ? sl_buf_addstr(b, ",") : 0;

    if (!err)
        err = sl_buf_addstr(b, "{\"name\":");
    if (!err)
        err = sl_json_str(b, t->name, strlen(t->name));
    if (!err)
        err = sl_buf_printf(b, ",\"dtype\":\"%s\",\"shape\":[", t->dtype);
    for (size_t k = 0; k < t->n_shape && !err; k++)
        err = sl_buf_printf(b, "%s%" PRId64, k ? "," : "", t->shape[k]);
    if (!err)
        err =
            sl_buf_printf(b, "],\"offset\":%" PRIu64 ",\"size\":%" PRIu64 "}", t->offset, t->size);
    return err;
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

/* No two non-empty tensors share a byte. Sorts spans. In offset order, a non-empty span overlaps
 * an earlier one exactly when it starts before the furthest end of the earlier non-empty spans
 * (comparing only neighbours let an empty tensor sorted between two overlapping ones hide it). */
static int check_overlap(span *spans, size_t n, char *msg, size_t len)
{
    const span *far = NULL; /* the earlier non-empty span that ends last */

    qsort(spans, n, sizeof(*spans), span_cmp);
    for (size_t i = 0; i < n; i++) {
        if (!spans[i].size)
            continue;
        if (far && far->off + far->size > spans[i].off) {
            snprintf(msg, len, "tensors %zu and %zu overlap", far->idx, spans[i].idx);
            return SL_EINVAL;
        }
        if (!far || spans[i].off + spans[i].size > far->off + far->size)
            far = &spans[i];
    }
    return 0;
}

int sl_ckpt_check_tensors(char **json, Sluice__V1__TensorInfo *const *t, size_t n,
                          uint64_t data_size, char *msg, size_t len)
{
    span *spans = NULL;
    sl_buf b;
    int err = 0, berr;

    *json = NULL;
    if (n > SL_CKPT_MAX_TENSORS) {
        snprintf(msg, len, "%zu tensors, at most %d allowed", n, SL_CKPT_MAX_TENSORS);
        return SL_EINVAL;
    }
    spans = calloc(n ? n : 1, sizeof(*spans));
    if (!spans)
        return -ENOMEM;
    /* No cap of its own: the list is bounded by the message it came in (--max-message-bytes)
     * and SL_CKPT_MAX_TENSORS, and the service caps what a checkpoint stores (META_MAX). */
    sl_buf_init(&b, SIZE_MAX);
    berr = sl_buf_addstr(&b, "[");
    for (size_t i = 0; i < n && !err; i++) {
        uint64_t end;
        err = check_tensor(t[i], i, msg, len);
        if (!err && (__builtin_add_overflow(t[i]->offset, t[i]->size, &end) || end > data_size)) {
            snprintf(msg, len,
                     "tensor '%.64s': bytes [%" PRIu64 ", +%" PRIu64 ") outside the data (%" PRIu64
                     " bytes)",
                     t[i]->name, t[i]->offset, t[i]->size, data_size);
            err = SL_EINVAL;
        }
        if (err)
            break;
        spans[i] = (span){t[i]->offset, t[i]->size, i};
        if (!berr)
            berr = render_tensor(&b, t[i], i);
    }
    if (!berr)
        berr = sl_buf_addstr(&b, "]");
    if (!err)
        err = check_overlap(spans, n, msg, len);
    if (!err && berr)
        err = -ENOMEM;
    if (!err)
        *json = sl_buf_take(&b);
    sl_buf_free(&b);
    free(spans);
    return err;
}
