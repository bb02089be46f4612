/* Glue between protobuf-c and grpc_byte_buffer, shared by the server (server*.c) and client.c.
 * Private to common/rpc/. */
#ifndef SL_RPC_INTERNAL_H
#define SL_RPC_INTERNAL_H

#include "rpc.h"

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <protobuf-c/protobuf-c.h>

/* Serialize a message into a new byte buffer (caller destroys it), or NULL on allocation
 * failure. */
grpc_byte_buffer *sl_rpc_pack(const ProtobufCMessage *msg);

/* Byte buffer holding a copy of raw bytes (caller destroys it). */
grpc_byte_buffer *sl_rpc_pack_raw(const void *buf, size_t len);

/* Decode a byte buffer, or NULL if the bytes are not a valid message of `desc`: not protobuf, or
 * a string field (at any depth) that is not UTF-8 or holds a NUL byte, which protobuf-c would
 * accept and silently cut. `why` (may be NULL) receives the reason. The caller frees the result
 * with protobuf_c_message_free_unpacked. A message that is exactly one singular bytes field (an
 * upload or download chunk) is decoded with one copy instead of two: the bytes go straight from
 * the received slices into their own allocation, owned by the message as protobuf-c would own it.
 * Any other shape takes protobuf-c's path; both give the same message. */
ProtobufCMessage *sl_rpc_unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb,
                                char *why, size_t why_len);

/* sl_rpc_unpack that says why it failed: 0 and *out, SL_EPROTO (not a valid message) or -ENOMEM
 * (a valid message too large for the memory left: a server answers RESOURCE_EXHAUSTED, not
 * INVALID_ARGUMENT), *out NULL and `why` set. */
int sl_rpc_decode(ProtobufCMessage **out, const ProtobufCMessageDescriptor *desc,
                  grpc_byte_buffer *bb, char *why, size_t why_len);

/* sl_rpc_unpack for a message type whose singular bytes field number `field` is delivered as an
 * sl_rpc_bytes. On success *bytes holds that field's bytes and the message's field keeps its len
 * but has data NULL; *bytes is NULL (and len 0) when the field is absent or empty. A message that
 * is exactly that one field keeps the received slices themselves (moved out of bb, which the
 * caller still destroys): no copy at all. Any other shape is decoded as sl_rpc_unpack does and
 * the field's allocation moves into *bytes. Returns the message or NULL (invalid, or out of
 * memory; `why` says which). The caller frees the message and sl_rpc_bytes_free(*bytes). */
ProtobufCMessage *sl_rpc_unpack_bytes(const ProtobufCMessageDescriptor *desc, uint32_t field,
                                      grpc_byte_buffer *bb, sl_rpc_bytes **bytes, char *why,
                                      size_t why_len);

/* sl_rpc_unpack_bytes that says why it failed, as sl_rpc_decode does. */
int sl_rpc_decode_bytes(ProtobufCMessage **out, const ProtobufCMessageDescriptor *desc,
                        uint32_t field, grpc_byte_buffer *bb, sl_rpc_bytes **bytes, char *why,
                        size_t why_len);

/* The field descriptor of a singular (plain, optional or oneof) bytes field number `field` of
 * `desc`, or NULL if there is no such field. */
const ProtobufCFieldDescriptor *sl_rpc_bytes_field(const ProtobufCMessageDescriptor *desc,
                                                   uint32_t field);

/* Server credentials for `tls` (NULL: plaintext). Returns 0 and *out (release with
 * grpc_server_credentials_release), or the error of an unreadable or non-PEM file (logged with
 * its path). */
int sl_rpc_server_creds(grpc_server_credentials **out, const sl_rpc_tls *tls);

/* Channel credentials for `tls` (NULL: plaintext), as above. */
int sl_rpc_channel_creds(grpc_channel_credentials **out, const sl_rpc_tls *tls);

/* Deadline `timeout_ms` from now; <= 0 means none. */
gpr_timespec sl_rpc_deadline(int64_t timeout_ms);

/* Copy a slice into a NUL-terminated buffer, cut to fit. */
void sl_rpc_slice_copy(char *dst, size_t len, grpc_slice s);

#endif
