/* Types shared by the sluice RPC server and client: status codes and their mapping to sluice
 * error codes. Nothing here exposes gRPC types; common/rpc/ is the only code that includes
 * <grpc/...>.
 */
#ifndef SL_RPC_H
#define SL_RPC_H

#include <stddef.h>
#include <sys/uio.h>

/* gRPC status codes, same numbers as on the wire. */
typedef enum sl_rpc_code {
    SL_RPC_OK = 0,
    SL_RPC_CANCELLED = 1,
    SL_RPC_UNKNOWN = 2,
    SL_RPC_INVALID_ARGUMENT = 3,
    SL_RPC_DEADLINE_EXCEEDED = 4,
    SL_RPC_NOT_FOUND = 5,
    SL_RPC_ALREADY_EXISTS = 6,
    SL_RPC_PERMISSION_DENIED = 7,
    SL_RPC_RESOURCE_EXHAUSTED = 8,
    SL_RPC_FAILED_PRECONDITION = 9,
    SL_RPC_ABORTED = 10,
    SL_RPC_OUT_OF_RANGE = 11,
    SL_RPC_UNIMPLEMENTED = 12,
    SL_RPC_INTERNAL = 13,
    SL_RPC_UNAVAILABLE = 14,
    SL_RPC_DATA_LOSS = 15,
    SL_RPC_UNAUTHENTICATED = 16,
} sl_rpc_code;

/* Flag for sending: more messages follow at once, so the transport may buffer this one. Never
 * set it on the last message of a burst: it would be held back until a later write. */
#define SL_RPC_SEND_MORE 1

/* The outcome of a call as a client sees it. */
typedef struct sl_rpc_status {
    sl_rpc_code code;
    char message[1024]; /* status details, NUL-terminated, cut to fit */
} sl_rpc_status;

/* TLS settings, by PEM file path. Server: cert_file + key_file are required; ca_file, if set,
 * makes client certificates mandatory and verified against it (mTLS). Client: ca_file verifies
 * the server (NULL: the system roots); cert_file + key_file present a client certificate. */
typedef struct sl_rpc_tls {
    const char *cert_file;
    const char *key_file;
    const char *ca_file;
} sl_rpc_tls;

/* The bytes of one received field, kept in the buffers they arrived in (no copy): a list of
 * memory ranges, in order, whose lengths add up to sl_rpc_bytes_len(). The server hands them out
 * for methods that ask for it (sl_rpc_method.bytes_field, sl_rpc_call_take_bytes). An
 * sl_rpc_bytes is immutable: any number of threads may read it at once. */
typedef struct sl_rpc_bytes sl_rpc_bytes;

/* Total length in bytes. Thread-safe. */
size_t sl_rpc_bytes_len(const sl_rpc_bytes *b);

/* The ranges: returns the array and sets *n to its length (at least 1; at most one range per
 * received buffer, and few: many tiny buffers are joined into one). Valid until the bytes are
 * freed. Thread-safe. */
const struct iovec *sl_rpc_bytes_iov(const sl_rpc_bytes *b, int *n);

/* Release the bytes. Any thread, but before the server that delivered them is freed. Accepts
 * NULL. */
void sl_rpc_bytes_free(sl_rpc_bytes *b);

/* "OK", "INVALID_ARGUMENT", ... Static string. Thread-safe. */
const char *sl_rpc_code_name(sl_rpc_code code);

/* Parse a name as printed by sl_rpc_code_name. Returns 0 or SL_EINVAL. Thread-safe. */
int sl_rpc_code_parse(sl_rpc_code *out, const char *name);

/* The status a sluice error code is answered with (the one mapping of DESIGN.md "Errors").
 * Thread-safe. */
sl_rpc_code sl_rpc_code_from_err(int err);

/* The sluice error code a client reports for a status (0 for OK). Thread-safe. */
int sl_rpc_err_from_code(sl_rpc_code code);

#endif
