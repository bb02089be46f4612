/* Fuzz target: decoding of every sluice.v1 Checkpoints request by the RPC bridge's decoder
 * (sl_rpc_unpack, common/rpc/codec.c), then the service's pure validation of what decodes
 * (server/ckpt/validate.h): names (sl_shard_name_check), user metadata (size and UTF-8), client
 * checksums, and for UploadShard headers the tensor-list check that renders the catalog's JSON
 * (sl_ckpt_check_tensors), which must be well-formed.
 *
 * The first input byte picks the message type; the rest is its wire encoding. */
#include "fuzz.h"

#include "ckpt/validate.h"
#include "shard.h"
#include "util/utf8.h"

#include "../../common/rpc/internal.h"

#include <stdlib.h>
#include <string.h>

static const ProtobufCMessageDescriptor *const requests[] = {
    &sluice__v1__begin_request__descriptor,         &sluice__v1__upload_shard_request__descriptor,
    &sluice__v1__upload_status_request__descriptor, &sluice__v1__checkpoint_ref__descriptor,
    &sluice__v1__list_request__descriptor,          &sluice__v1__latest_request__descriptor,
    &sluice__v1__verify_request__descriptor,        &sluice__v1__download_shard_request__descriptor,
    &sluice__v1__set_retention_request__descriptor,
};
#define N_REQUESTS (sizeof(requests) / sizeof(requests[0]))

static void check_name(const char *name)
{
    char file[SL_SHARD_NAME_MAX + 64];

    if (!name || sl_shard_name_check(name) != 0)
        return;
    if (strchr(name, '/') || name[0] == '.' || strstr(name, "..") ||
        strlen(name) > SL_SHARD_NAME_MAX)
        abort();
    if (sl_shard_file_name(file, sizeof(file), name, SL_SHARD_MAX_RANK) != 0)
        abort();
}

/* A JSON string the catalog stores must at least be balanced and free of raw control bytes. */
static void check_json(const char *json)
{
    int depth = 0, in_str = 0;

    for (const char *p = json; *p; p++) {
        if ((unsigned char)*p < 0x20)
            abort();
        if (in_str) {
            if (*p == '\\')
                p++;
            else if (*p == '"')
                in_str = 0;
            continue;
        }
        if (*p == '"')
            in_str = 1;
        else if (*p == '[' || *p == '{')
            depth++;
        else if (*p == ']' || *p == '}')
            depth--;
        if (depth < 0)
            abort();
    }
    if (depth != 0 || in_str)
        abort();
}

static void check_header(const Sluice__V1__ShardHeader *h)
{
    char msg[512], *json = NULL;

    check_name(h->job);
    check_name(h->checkpoint);
    if (h->sha256 && *h->sha256)
        (void)sl_shard_hex_check(h->sha256);
    if (sl_ckpt_check_tensors(&json, h->tensors, h->n_tensors, h->data_size, msg, sizeof(msg)) ==
        0) {
        check_json(json);
        free(json);
    }
    /* The whole header check the service runs, for the largest world and no size limit. */
    if (sl_ckpt_check_header(h, SL_CKPT_MAX_WORLD, UINT64_MAX, &json, msg, sizeof(msg)) == 0) {
        check_json(json);
        free(json);
    }
}

/* A Begin request the service accepts names a checkpoint whose name is valid, also when the
 * name is made from the step. */
static void check_begin(const Sluice__V1__BeginRequest *r)
{
    char name[SL_SHARD_NAME_MAX + 1], msg[512];

    check_name(r->job);
    check_name(r->name);
    if (r->user_metadata)
        (void)sl_utf8_check(r->user_metadata, strlen(r->user_metadata));
    if (sl_ckpt_check_begin(r, name, sizeof(name), msg, sizeof(msg)) == 0 &&
        sl_shard_name_check(name) != 0)
        abort();
}

/* Decode as the RPC bridge does (common/rpc/codec.c: protobuf-c, then every string field must
 * be UTF-8 without NUL bytes). What the bridge accepts, protobuf-c alone must accept too. */
static ProtobufCMessage *decode(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n)
{
    grpc_byte_buffer *bb = sl_rpc_pack_raw(p, n);
    ProtobufCMessage *m, *plain;
    char why[256];

    if (!bb)
        return NULL;
    m = sl_rpc_unpack(d, bb, why, sizeof(why));
    grpc_byte_buffer_destroy(bb);
    plain = protobuf_c_message_unpack(d, NULL, n, p);
    if (m && !plain)
        abort();
    if (plain)
        protobuf_c_message_free_unpacked(plain, NULL);
    return m;
}

/* The decoder UploadShard runs (sl_rpc_unpack_bytes: chunks taken as the received slices) must
 * give the same message as sl_rpc_unpack, and the same chunk bytes, wherever the transport split
 * the message into slices: here at up to 7 places taken from the input. */
static void check_upload_bytes(const uint8_t *p, size_t n, const ProtobufCMessage *want)
{
    const Sluice__V1__UploadShardRequest *w = (const void *)want;
    const Sluice__V1__UploadShardRequest *g;
    grpc_slice slices[8];
    size_t k = 0, at = 0;
    grpc_byte_buffer *bb;
    sl_rpc_bytes *bytes = NULL;
    ProtobufCMessage *m;

    while (k < 7 && at < n) {
        size_t len = 1 + (p[at] * 131u + k) % (n - at);
        slices[k++] = grpc_slice_from_copied_buffer((const char *)p + at, len);
        at += len;
    }
    if (at < n)
        slices[k++] = grpc_slice_from_copied_buffer((const char *)p + at, n - at);
    bb = grpc_raw_byte_buffer_create(slices, k);
    for (size_t i = 0; i < k; i++)
        grpc_slice_unref(slices[i]);
    m = sl_rpc_unpack_bytes(&sluice__v1__upload_shard_request__descriptor,
                            SLUICE__V1__UPLOAD_SHARD_REQUEST__KIND_CHUNK, bb, &bytes, NULL, 0);
    grpc_byte_buffer_destroy(bb);
    if (!m != !want)
        abort();
    if (!m)
        return;
    g = (const void *)m;
    if (g->kind_case != w->kind_case)
        abort();
    if (g->kind_case == SLUICE__V1__UPLOAD_SHARD_REQUEST__KIND_CHUNK) {
        size_t off = 0;
        int nr = 0;
        const struct iovec *iov = bytes ? sl_rpc_bytes_iov(bytes, &nr) : NULL;
        if (g->chunk.data || g->chunk.len != w->chunk.len ||
            (bytes ? sl_rpc_bytes_len(bytes) : 0) != w->chunk.len)
            abort();
        for (int i = 0; i < nr; i++) {
            if (off + iov[i].iov_len > w->chunk.len ||
                memcmp(iov[i].iov_base, w->chunk.data + off, iov[i].iov_len) != 0)
                abort();
            off += iov[i].iov_len;
        }
        if (off != w->chunk.len)
            abort();
    } else if (bytes) {
        abort();
    }
    sl_rpc_bytes_free(bytes);
    protobuf_c_message_free_unpacked(m, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const ProtobufCMessageDescriptor *d;
    ProtobufCMessage *m;

    if (size < 1)
        return 0;
    d = requests[data[0] % N_REQUESTS];
    m = decode(d, data + 1, size - 1);
    if (d == &sluice__v1__upload_shard_request__descriptor)
        check_upload_bytes(data + 1, size - 1, m);
    if (!m)
        return 0;
    if (d == &sluice__v1__begin_request__descriptor) {
        check_begin((const void *)m);
    } else if (d == &sluice__v1__upload_shard_request__descriptor) {
        const Sluice__V1__UploadShardRequest *r = (const void *)m;
        if (r->kind_case == SLUICE__V1__UPLOAD_SHARD_REQUEST__KIND_HEADER && r->header)
            check_header(r->header);
    } else if (d == &sluice__v1__upload_status_request__descriptor) {
        const Sluice__V1__UploadStatusRequest *r = (const void *)m;
        check_name(r->job);
        check_name(r->checkpoint);
    } else if (d == &sluice__v1__checkpoint_ref__descriptor) {
        const Sluice__V1__CheckpointRef *r = (const void *)m;
        check_name(r->job);
        check_name(r->name);
    } else if (d == &sluice__v1__download_shard_request__descriptor) {
        const Sluice__V1__DownloadShardRequest *r = (const void *)m;
        check_name(r->job);
        check_name(r->name);
    }
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}
