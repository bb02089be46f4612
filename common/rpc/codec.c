#include "internal.h"

#include "../err.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice_buffer.h>
#include <grpc/support/time.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

grpc_byte_buffer *sl_rpc_pack(const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    grpc_slice slice = grpc_slice_malloc(len);
    grpc_byte_buffer *bb;

    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(slice));
    bb = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    return bb;
}

grpc_byte_buffer *sl_rpc_pack_raw(const void *buf, size_t len)
{
    grpc_slice slice = grpc_slice_from_copied_buffer(buf, len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);

    grpc_slice_unref(slice);
    return bb;
}

/* 1 if s[0..n) is well-formed UTF-8 without NUL bytes (no overlongs, no surrogates). */
static int utf8_ok(const uint8_t *s, size_t n)
{
    size_t i = 0;

    while (i < n) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp;
        if (c == 0)
            return 0;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf) {
            k = 1;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            k = 2;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 3;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (n - i <= k)
            return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if ((k == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (k == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return 0;
        i += k + 1;
    }
    return 1;
}

static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;

    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* Walk the wire form of a message that protobuf-c accepted and check its string fields. The
 * wire form is used because after decoding a NUL byte has already cut the C string. */
static int strings_ok(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n, char *why,
                      size_t why_len, int depth)
{
    const uint8_t *end = p + n;

    if (depth > 32)
        return 1; /* protobuf-c limits nesting itself */
    while (p < end) {
        const ProtobufCFieldDescriptor *f;
        uint64_t tag, len;
        if (read_varint(&p, end, &tag) != 0)
            return 1;
        f = protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3));
        switch (tag & 7) {
        case 0:
            if (read_varint(&p, end, &len) != 0)
                return 1;
            break;
        case 1:
            p += 8;
            break;
        case 5:
            p += 4;
            break;
        case 2:
            if (read_varint(&p, end, &len) != 0 || len > (uint64_t)(end - p))
                return 1;
            if (f && f->type == PROTOBUF_C_TYPE_STRING && !utf8_ok(p, (size_t)len)) {
                if (why)
                    snprintf(why, why_len, "field '%s' of %s is not UTF-8 text without NUL bytes",
                             f->name, d->name);
                return 0;
            }
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE &&
                !strings_ok(f->descriptor, p, (size_t)len, why, why_len, depth + 1))
                return 0;
            p += len;
            break;
        default:
            return 1;
        }
    }
    return 1;
}

/* Copy `len` bytes from offset `off` of a slice buffer into dst. The caller checked the range. */
static void slices_copy(uint8_t *dst, const grpc_slice_buffer *sb, size_t off, size_t len)
{
    for (size_t i = 0; i < sb->count && len > 0; i++) {
        size_t n = GRPC_SLICE_LENGTH(sb->slices[i]);
        if (off >= n) {
            off -= n;
            continue;
        }
        n -= off;
        if (n > len)
            n = len;
        memcpy(dst, GRPC_SLICE_START_PTR(sb->slices[i]) + off, n);
        dst += n;
        len -= n;
        off = 0;
    }
}

const ProtobufCFieldDescriptor *sl_rpc_bytes_field(const ProtobufCMessageDescriptor *desc,
                                                   uint32_t field)
{
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(desc, field);

    if (!f || f->type != PROTOBUF_C_TYPE_BYTES || f->label == PROTOBUF_C_LABEL_REPEATED)
        return NULL;
    return f;
}

#define TAIL_MAX 1024 /* bytes of other fields after a leading bytes field, decoded apart */

/* If the uncompressed wire form in bb begins with a length-delimited field with a non-empty
 * value, that field is a singular bytes field of desc, and at most `tail_max` bytes follow it
 * (other fields: a download chunk's offset and checksum): the field, with *hlen the length of its
 * tag and length prefix, *len the length of its value and *tail what follows. Otherwise NULL. The
 * prefix may span slices. */
static const ProtobufCFieldDescriptor *leading_bytes_field(const ProtobufCMessageDescriptor *desc,
                                                           grpc_byte_buffer *bb, size_t tail_max,
                                                           size_t *hlen, size_t *len, size_t *tail)
{
    const grpc_slice_buffer *sb;
    uint8_t head[15];
    const uint8_t *p = head, *end;
    uint64_t tag, n;
    size_t h;

    if (!bb || bb->type != GRPC_BB_RAW || bb->data.raw.compression != GRPC_COMPRESS_NONE)
        return NULL;
    sb = &bb->data.raw.slice_buffer;
    h = sb->length < sizeof(head) ? sb->length : sizeof(head);
    slices_copy(head, sb, 0, h);
    end = head + h;
    /* protobuf-c reads tags and length prefixes of at most 5 bytes; leave odder forms to it. */
    if (read_varint(&p, end, &tag) != 0 || p - head > 5 || (tag & 7) != 2 || tag >> 3 == 0 ||
        tag >> 3 > 0x1fffffff)
        return NULL;
    h = (size_t)(p - head);
    if (read_varint(&p, end, &n) != 0 || (size_t)(p - head) - h > 5 || n > UINT32_MAX)
        return NULL;
    h = (size_t)(p - head);
    if (n == 0 || n > sb->length - h || sb->length - h - n > tail_max)
        return NULL;
    *hlen = h;
    *len = (size_t)n;
    *tail = sb->length - h - (size_t)n;
    return sl_rpc_bytes_field(desc, (uint32_t)(tag >> 3));
}

/* The message is exactly one such field. */
static const ProtobufCFieldDescriptor *one_bytes_field(const ProtobufCMessageDescriptor *desc,
                                                       grpc_byte_buffer *bb, size_t *hlen,
                                                       size_t *len)
{
    size_t tail;

    return leading_bytes_field(desc, bb, 0, hlen, len, &tail);
}

/* A message of `desc` with every field at its default, as protobuf-c leaves it, except field f,
 * which is set (present) to len bytes at data (owned by the message; may be NULL). */
static ProtobufCMessage *message_with_bytes(const ProtobufCMessageDescriptor *desc,
                                            const ProtobufCFieldDescriptor *f, uint8_t *data,
                                            size_t len)
{
    static const uint8_t empty[1];
    ProtobufCMessage *msg = protobuf_c_message_unpack(desc, NULL, 0, empty);
    ProtobufCBinaryData *field;

    if (!msg)
        return NULL;
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
        *(uint32_t *)((char *)msg + f->quantifier_offset) = f->id;
    else if (f->label == PROTOBUF_C_LABEL_OPTIONAL)
        *(protobuf_c_boolean *)((char *)msg + f->quantifier_offset) = 1;
    field = (ProtobufCBinaryData *)((char *)msg + f->offset);
    field->len = len;
    field->data = data;
    return msg;
}

/* The fast path of sl_rpc_unpack, for messages whose wire form is exactly one field, a singular
 * (plain, optional or oneof) bytes field: upload and download chunks. The general path flattens
 * the slices into one buffer and protobuf-c copies the field out of it again; here the bytes are
 * copied once, from the received slices into their own allocation, and the message owns it as if
 * protobuf-c had made it (protobuf_c_message_free_unpacked frees it). Returns the message, or
 * NULL if the message has another shape or memory ran out: the general path then decides. */
static ProtobufCMessage *unpack_one_bytes_field(const ProtobufCMessageDescriptor *desc,
                                                grpc_byte_buffer *bb)
{
    const ProtobufCFieldDescriptor *f;
    ProtobufCMessage *msg;
    size_t hlen, len;
    uint8_t *data;

    f = one_bytes_field(desc, bb, &hlen, &len);
    if (!f)
        return NULL;
    data = malloc(len);
    if (!data)
        return NULL;
    slices_copy(data, &bb->data.raw.slice_buffer, hlen, len);
    msg = message_with_bytes(desc, f, data, len);
    if (!msg)
        free(data);
    return msg;
}

/* protobuf-c's allocator for decoding: malloc and free, noting a failure, so that a message too
 * large for the memory left is told apart from a malformed one (protobuf-c returns NULL for
 * both). Messages it made are freed with the default allocator, which is free() as well. */
typedef struct pb_mem {
    int failed;
} pb_mem;

static void *pb_alloc(void *data, size_t n)
{
    void *p = malloc(n);

    if (!p)
        ((pb_mem *)data)->failed = 1;
    return p;
}

static void pb_free(void *data, void *p)
{
    (void)data;
    free(p);
}

int sl_rpc_decode(ProtobufCMessage **out, const ProtobufCMessageDescriptor *desc,
                  grpc_byte_buffer *bb, char *why, size_t why_len)
{
    pb_mem mem = {0};
    ProtobufCAllocator alloc = {pb_alloc, pb_free, &mem};
    grpc_byte_buffer_reader reader;
    ProtobufCMessage *msg;
    grpc_slice slice;
    int err = 0;

    *out = NULL;
    if (why && why_len)
        snprintf(why, why_len, "not a valid %s message", desc->name);
    if (!bb)
        return SL_EPROTO;
    /* The server accepts identity encoding only and has the core leave messages as they came:
     * a compressed message reaching here is refused before the reader would inflate it, which
     * it does in full whatever the message limit (a 512 KiB gzip body inflates to 512 MiB). */
    if (bb->type == GRPC_BB_RAW && bb->data.raw.compression != GRPC_COMPRESS_NONE) {
        if (why && why_len)
            snprintf(why, why_len, "compressed (only identity encoding is accepted)");
        return SL_EPROTO;
    }
    msg = unpack_one_bytes_field(desc, bb);
    if (msg) {
        *out = msg;
        return 0;
    }
    if (!grpc_byte_buffer_reader_init(&reader, bb))
        return SL_EPROTO;
    slice = grpc_byte_buffer_reader_readall(&reader);
    msg = protobuf_c_message_unpack(desc, &alloc, GRPC_SLICE_LENGTH(slice),
                                    GRPC_SLICE_START_PTR(slice));
    if (!msg) {
        err = mem.failed ? -ENOMEM : SL_EPROTO;
        if (mem.failed && why && why_len)
            snprintf(why, why_len, "too large to hold (out of memory)");
    } else if (!strings_ok(desc, GRPC_SLICE_START_PTR(slice), GRPC_SLICE_LENGTH(slice), why,
                           why_len, 0)) {
        protobuf_c_message_free_unpacked(msg, NULL);
        msg = NULL;
        err = SL_EPROTO;
    }
    grpc_slice_unref(slice);
    grpc_byte_buffer_reader_destroy(&reader);
    *out = msg;
    return err;
}

ProtobufCMessage *sl_rpc_unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb,
                                char *why, size_t why_len)
{
    ProtobufCMessage *msg;

    sl_rpc_decode(&msg, desc, bb, why, why_len);
    return msg;
}

/* ---- bytes delivered as received ---- */

struct sl_rpc_bytes {
    grpc_slice_buffer sb; /* the received slices; empty when `heap` holds the bytes */
    uint8_t *heap;
    size_t len;
    int n_iov;
    struct iovec iov[];
};

/* Slices are kept as they are unless there are more than JOIN_BASE + len / JOIN_MIN of them
 * (a peer sending tiny frames): then they are joined into one allocation, so a range list never
 * costs much more than the bytes it describes and consumers see few, large ranges. */
#define JOIN_BASE 64
#define JOIN_MIN  4096

size_t sl_rpc_bytes_len(const sl_rpc_bytes *b)
{
    return b->len;
}

const struct iovec *sl_rpc_bytes_iov(const sl_rpc_bytes *b, int *n)
{
    *n = b->n_iov;
    return b->iov;
}

void sl_rpc_bytes_free(sl_rpc_bytes *b)
{
    if (!b)
        return;
    grpc_slice_buffer_destroy(&b->sb);
    free(b->heap);
    free(b);
}

/* Bytes that own `data` (malloc'd, len > 0). Returns NULL if memory ran out (data is not freed). */
static sl_rpc_bytes *bytes_adopt(uint8_t *data, size_t len)
{
    sl_rpc_bytes *b = malloc(sizeof(*b) + sizeof(struct iovec));

    if (!b)
        return NULL;
    grpc_slice_buffer_init(&b->sb);
    b->heap = data;
    b->len = len;
    b->n_iov = 1;
    b->iov[0].iov_base = data;
    b->iov[0].iov_len = len;
    return b;
}

/* Bytes holding [hlen, hlen + len) of bb (what follows is left out). The slices move out of bb
 * (bb is left empty) unless they are too many and small, then they are copied. Returns NULL if
 * memory ran out; bb is then unchanged. */
static sl_rpc_bytes *bytes_from_slices(grpc_byte_buffer *bb, size_t hlen, size_t len)
{
    grpc_slice_buffer *src = &bb->data.raw.slice_buffer;
    size_t skip = hlen, left = len;
    sl_rpc_bytes *b;
    int n = 0;

    if (src->count > JOIN_BASE + len / JOIN_MIN) {
        uint8_t *data = malloc(len);
        if (!data)
            return NULL;
        slices_copy(data, src, hlen, len);
        b = bytes_adopt(data, len);
        if (!b)
            free(data);
        return b;
    }
    b = malloc(sizeof(*b) + src->count * sizeof(struct iovec));
    if (!b)
        return NULL;
    b->heap = NULL;
    b->len = len;
    grpc_slice_buffer_init(&b->sb);
    grpc_slice_buffer_swap(&b->sb, src);
    /* After the swap: an inlined slice keeps its bytes inside the slice struct, which now lives
     * in b->sb and stays put. */
    for (size_t i = 0; i < b->sb.count && left > 0; i++) {
        uint8_t *p = GRPC_SLICE_START_PTR(b->sb.slices[i]);
        size_t l = GRPC_SLICE_LENGTH(b->sb.slices[i]);
        if (skip >= l) {
            skip -= l;
            continue;
        }
        l -= skip;
        l = l < left ? l : left;
        b->iov[n].iov_base = p + skip;
        b->iov[n].iov_len = l;
        left -= l;
        skip = 0;
        n++;
    }
    b->n_iov = n;
    return b;
}

/* 1 if singular field f of msg is set (for a plain proto3 field: non-empty). */
static int field_present(const ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f)
{
    const ProtobufCBinaryData *bd = (const void *)((const char *)msg + f->offset);

    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
        return *(const uint32_t *)((const char *)msg + f->quantifier_offset) == f->id;
    if (f->label == PROTOBUF_C_LABEL_OPTIONAL)
        return *(const protobuf_c_boolean *)((const char *)msg + f->quantifier_offset) != 0;
    return bd->len > 0;
}

/* The message of the `tail` bytes at offset `at` of bb (the fields after a leading bytes field f,
 * decoded apart from it) with f then set to `len` bytes (data NULL). NULL with *err 0 if the tail
 * sets f (or another field of its oneof) again, which protobuf's last-one-wins leaves to the
 * general path; NULL with *err SL_EPROTO or -ENOMEM (why set) if the tail is not valid. */
static ProtobufCMessage *decode_tail(const ProtobufCMessageDescriptor *desc,
                                     const ProtobufCFieldDescriptor *f, grpc_byte_buffer *bb,
                                     size_t at, size_t tail, size_t len, char *why, size_t why_len,
                                     int *err)
{
    pb_mem mem = {0};
    ProtobufCAllocator alloc = {pb_alloc, pb_free, &mem};
    uint8_t buf[TAIL_MAX];
    ProtobufCMessage *msg;

    *err = 0;
    slices_copy(buf, &bb->data.raw.slice_buffer, at, tail);
    msg = protobuf_c_message_unpack(desc, &alloc, tail, buf);
    if (!msg || !strings_ok(desc, buf, tail, why, why_len, 0)) {
        if (msg)
            protobuf_c_message_free_unpacked(msg, NULL);
        else if (why && why_len)
            snprintf(why, why_len,
                     mem.failed ? "too large to hold (out of memory)" : "not a valid %s message",
                     desc->name);
        *err = mem.failed ? -ENOMEM : SL_EPROTO;
        return NULL;
    }
    if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
            ? *(const uint32_t *)((const char *)msg + f->quantifier_offset) != 0
            : field_present(msg, f)) {
        protobuf_c_message_free_unpacked(msg, NULL);
        return NULL;
    }
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
        *(uint32_t *)((char *)msg + f->quantifier_offset) = f->id;
    else if (f->label == PROTOBUF_C_LABEL_OPTIONAL)
        *(protobuf_c_boolean *)((char *)msg + f->quantifier_offset) = 1;
    ((ProtobufCBinaryData *)((char *)msg + f->offset))->len = len;
    return msg;
}

int sl_rpc_decode_bytes(ProtobufCMessage **out, const ProtobufCMessageDescriptor *desc,
                        uint32_t field, grpc_byte_buffer *bb, sl_rpc_bytes **bytes, char *why,
                        size_t why_len)
{
    const ProtobufCFieldDescriptor *want = sl_rpc_bytes_field(desc, field);
    ProtobufCMessage *msg;
    ProtobufCBinaryData *bd;
    size_t hlen, len, tail;
    int err;

    *out = NULL;
    *bytes = NULL;
    if (want && leading_bytes_field(desc, bb, TAIL_MAX, &hlen, &len, &tail) == want) {
        sl_rpc_bytes *b = NULL;
        if (!tail) {
            msg = message_with_bytes(desc, want, NULL, len);
        } else {
            msg = decode_tail(desc, want, bb, hlen + len, tail, len, why, why_len, &err);
            if (!msg && err)
                return err;
            if (!msg)
                goto general; /* the tail sets the field again */
        }
        if (msg)
            b = bytes_from_slices(bb, hlen, len);
        if (!b) {
            if (msg)
                protobuf_c_message_free_unpacked(msg, NULL);
            if (why && why_len)
                snprintf(why, why_len, "too large to hold (out of memory)");
            return -ENOMEM;
        }
        *bytes = b;
        *out = msg;
        return 0;
    }
general:
    if ((err = sl_rpc_decode(&msg, desc, bb, why, why_len)) != 0)
        return err;
    if (want && field_present(msg, want)) {
        bd = (ProtobufCBinaryData *)((char *)msg + want->offset);
        if (bd->len > 0) {
            if (!(*bytes = bytes_adopt(bd->data, bd->len))) {
                protobuf_c_message_free_unpacked(msg, NULL);
                if (why && why_len)
                    snprintf(why, why_len, "too large to hold (out of memory)");
                return -ENOMEM;
            }
            bd->data = NULL;
        }
    }
    *out = msg;
    return 0;
}

ProtobufCMessage *sl_rpc_unpack_bytes(const ProtobufCMessageDescriptor *desc, uint32_t field,
                                      grpc_byte_buffer *bb, sl_rpc_bytes **bytes, char *why,
                                      size_t why_len)
{
    ProtobufCMessage *msg;

    sl_rpc_decode_bytes(&msg, desc, field, bb, bytes, why, why_len);
    return msg;
}

gpr_timespec sl_rpc_deadline(int64_t timeout_ms)
{
    if (timeout_ms <= 0)
        return gpr_inf_future(GPR_CLOCK_REALTIME);
    return gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
                        gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

void sl_rpc_slice_copy(char *dst, size_t len, grpc_slice s)
{
    size_t n = GRPC_SLICE_LENGTH(s);

    if (len == 0)
        return;
    if (n >= len)
        n = len - 1;
    memcpy(dst, GRPC_SLICE_START_PTR(s), n);
    dst[n] = '\0';
}

static const char *const code_names[] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

const char *sl_rpc_code_name(sl_rpc_code code)
{
    return (unsigned)code < sizeof(code_names) / sizeof(code_names[0]) ? code_names[code]
                                                                       : "UNKNOWN";
}

int sl_rpc_code_parse(sl_rpc_code *out, const char *name)
{
    for (size_t i = 0; i < sizeof(code_names) / sizeof(code_names[0]); i++) {
        if (strcmp(code_names[i], name) == 0) {
            *out = (sl_rpc_code)i;
            return 0;
        }
    }
    return SL_EINVAL;
}

sl_rpc_code sl_rpc_code_from_err(int err)
{
    switch (err) {
    case 0:
        return SL_RPC_OK;
    case SL_EINVAL:
    case SL_EPROTO:
    case -EINVAL:
        return SL_RPC_INVALID_ARGUMENT;
    case SL_ENOTFOUND:
    case -ENOENT:
        return SL_RPC_NOT_FOUND;
    case SL_EEXIST:
    case -EEXIST:
        return SL_RPC_ALREADY_EXISTS;
    case SL_ELIMIT:
    case -ENOSPC:
    case -EDQUOT:
    case -ENOMEM:
        return SL_RPC_RESOURCE_EXHAUSTED;
    case SL_ECORRUPT:
        return SL_RPC_DATA_LOSS;
    case SL_ESTATE:
    case SL_ECATLOST:
        return SL_RPC_FAILED_PRECONDITION;
    case SL_ESHUTDOWN:
    case SL_EUNAVAILABLE:
    case SL_EDBBUSY:
    case SL_ECATDOWN:
    case SL_EFENCED:
        return SL_RPC_UNAVAILABLE;
    case SL_ECANCELLED:
        return SL_RPC_CANCELLED;
    case SL_ETIMEOUT:
        return SL_RPC_DEADLINE_EXCEEDED;
    case SL_EAUTH:
        return SL_RPC_UNAUTHENTICATED;
    case SL_EPERM:
        return SL_RPC_PERMISSION_DENIED;
    case SL_EUNIMPL:
        return SL_RPC_UNIMPLEMENTED;
    default:
        return SL_RPC_INTERNAL;
    }
}

int sl_rpc_err_from_code(sl_rpc_code code)
{
    switch (code) {
    case SL_RPC_OK:
        return 0;
    case SL_RPC_INVALID_ARGUMENT:
    case SL_RPC_OUT_OF_RANGE:
        return SL_EINVAL;
    case SL_RPC_NOT_FOUND:
        return SL_ENOTFOUND;
    case SL_RPC_ALREADY_EXISTS:
        return SL_EEXIST;
    case SL_RPC_RESOURCE_EXHAUSTED:
        return SL_ELIMIT;
    case SL_RPC_DATA_LOSS:
        return SL_ECORRUPT;
    case SL_RPC_FAILED_PRECONDITION:
    case SL_RPC_ABORTED:
        return SL_ESTATE;
    case SL_RPC_UNAVAILABLE:
        return SL_EUNAVAILABLE;
    case SL_RPC_CANCELLED:
        return SL_ECANCELLED;
    case SL_RPC_DEADLINE_EXCEEDED:
        return SL_ETIMEOUT;
    case SL_RPC_UNAUTHENTICATED:
        return SL_EAUTH;
    case SL_RPC_PERMISSION_DENIED:
        return SL_EPERM;
    case SL_RPC_UNIMPLEMENTED:
        return SL_EUNIMPL;
    default:
        return SL_ERPC;
    }
}
