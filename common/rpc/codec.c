#include "internal.h"

#include "../err.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/support/time.h>
#include <errno.h>
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

ProtobufCMessage *sl_rpc_unpack(const ProtobufCMessageDescriptor *desc, grpc_byte_buffer *bb)
{
    grpc_byte_buffer_reader reader;
    ProtobufCMessage *msg;
    grpc_slice slice;

    if (!bb || !grpc_byte_buffer_reader_init(&reader, bb))
        return NULL;
    slice = grpc_byte_buffer_reader_readall(&reader);
    msg = protobuf_c_message_unpack(desc, NULL, GRPC_SLICE_LENGTH(slice),
                                    GRPC_SLICE_START_PTR(slice));
    grpc_slice_unref(slice);
    grpc_byte_buffer_reader_destroy(&reader);
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
        return SL_RPC_FAILED_PRECONDITION;
    case SL_ESHUTDOWN:
    case SL_EUNAVAILABLE:
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
