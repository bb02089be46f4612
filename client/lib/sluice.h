/* libsluice: the C client of the sluice daemon. This header: the client itself, health and the
 * daemon's info. sluice_feed.h has datasets, jobs, epochs and the index and batch streams,
 * sluice_ckpt.h the checkpoint shards, sluice_err.h (included here) the error codes. Link with
 * -lsluice (`pkg-config --cflags --libs sluice`).
 *
 * Errors: every function that returns int returns 0 on success or a negative code, -errno or an
 * SL_E* code of sluice_err.h; sl_strerror() describes either. After a failed call,
 * sl_client_error() says what the daemon (or the local system) reported.
 *
 * Threads: a client holds one gRPC channel and may be used by several threads at once. Objects a
 * function hands out (streams, arrays) belong to the caller and are used by one thread at a time.
 *
 * Option structs (sl_client_opts, sl_stream_opts, sl_ckpt_upload_opts) begin with a version
 * field. Initialise them with their _INIT macro and set the fields you need:
 *
 *     sl_client_opts opts = SL_CLIENT_OPTS_INIT;
 *     opts.timeout_ms = 30000;
 *
 * A later libsluice may add fields at the end of a struct and raise its _VERSION; it keeps
 * reading the versions it knew. A struct zeroed with memset or {0} reads as version 1. A version
 * the library does not know fails with SL_EINVAL (sl_client_error() names the struct).
 */
#ifndef SLUICE_H
#define SLUICE_H

#include "sluice_err.h"
#include "sluice_export.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sl_client sl_client;

#define SL_CLIENT_OPTS_VERSION 1

typedef struct sl_client_opts {
    unsigned int version; /* SL_CLIENT_OPTS_VERSION (0 reads as 1) */
    int64_t timeout_ms;   /* per-call deadline; 0 means 10 s, < 0 means none */
    /* TLS: set tls to 1 (or any of the files) to connect with TLS; tls_ca verifies the daemon
     * (NULL: the system roots); tls_cert + tls_key present a client certificate (mTLS). */
    int tls;
    const char *tls_ca;
    const char *tls_cert;
    const char *tls_key;
    const char *token; /* bearer token sent with every call, NULL: none */
    /* 1: this client gets a TCP connection of its own; by default the clients of one process
     * that have equal options share one connection (gRPC's subchannel pool). */
    int own_connection;
} sl_client_opts;

/* The defaults: 10 s deadline, no TLS, no token, shared connection. */
#define SL_CLIENT_OPTS_INIT                                                                        \
    {                                                                                              \
        .version = SL_CLIENT_OPTS_VERSION                                                          \
    }

/* Health of a service as grpc.health.v1 reports it. */
typedef enum sl_client_health_status {
    SL_CLIENT_HEALTH_UNKNOWN = 0,
    SL_CLIENT_HEALTH_SERVING = 1,
    SL_CLIENT_HEALTH_NOT_SERVING = 2,
    SL_CLIENT_HEALTH_SERVICE_UNKNOWN = 3,
} sl_client_health_status;

typedef struct sl_info {
    char version[64];
    uint64_t uptime_ms;
    char data_dir[4096];
    uint32_t schema_version;
    uint64_t pid;
    char listen[300];
} sl_info;

#define SL_STORE_INFO_VERSION 3

/* What Admin.GetInfo says about the daemon's storage (sl_client_info_store). It begins with a
 * version, as the option structs do (set it with SL_STORE_INFO_INIT): a later libsluice may add
 * fields at the end and fills only those of the version the caller set. */
typedef struct sl_store_info {
    unsigned int version; /* SL_STORE_INFO_VERSION (0 reads as 1) */
    /* Files the catalog did not know, moved to the quarantine instead of being removed. */
    uint64_t quarantine_files;
    uint64_t quarantine_bytes;
    char quarantine_dir[4096];
    /* "" while the catalog file is the one the daemon opened; else what happened to it (the
     * daemon then refuses writes until it is restarted). */
    char catalog_problem[4608];
    /* Version 2: where checkpoint shards are stored (a directory, or "s3://bucket/prefix at
     * ENDPOINT"); "" from a daemon that does not say. */
    char shard_store[2048];
    /* Version 3: the replica that answered (its --replica-id) and where its catalog is
     * ("sqlite:PATH" or "postgresql host=... dbname=..."); "" from a daemon that does not say. */
    char replica[300];
    char catalog[600];
} sl_store_info;

#define SL_STORE_INFO_INIT                                                                         \
    {                                                                                              \
        .version = SL_STORE_INFO_VERSION                                                           \
    }

/* Create a client for the daemon at `addr` ("host:port"); it connects lazily, at the first call.
 * `addr` may also list the replicas of one catalog comma-separated ("h1:7700,h2:7700", at most
 * 64): the client keeps a channel per address and sends calls to the current replica; a call
 * that ends SL_EUNAVAILABLE there (refused, reset, the replica killed, or a replica that cannot
 * reach the catalog) makes the next replica the current one and is tried again on it, each
 * replica at most once per call, each try with the per-call deadline; if all fail,
 * sl_client_error() names the replicas tried. Index and batch streams are reopened on the next
 * replica at the position reached, uploads resume there from what the store holds, downloads go
 * on at their offset. A gRPC target URI ("ipv4:a:1,b:2", "dns:///name:7700") is one address.
 * opts may be NULL (the defaults); the client copies what it needs, so opts and its strings may
 * be freed on return. Returns 0 and *out, which the caller frees with sl_client_close; SL_EINVAL
 * for an empty address or list element, a port outside [1, 65535], an unknown opts->version or
 * a TLS file that is not PEM (sl_client_error() says which), -errno for an unreadable TLS file
 * (*out is then NULL). Thread-safe. */
SL_API int sl_client_connect(sl_client **out, const char *addr, const sl_client_opts *opts);

/* Close the client and free it; calls still running on other threads must have returned.
 * Accepts NULL. */
SL_API void sl_client_close(sl_client *c);

/* What the calling thread's last failed call reported: the status code name and message
 * ("UNAVAILABLE: failed to connect to all addresses"), or the local failure. Returns a
 * thread-local string owned by libsluice, valid until this thread's next call; "" if nothing
 * failed yet. Thread-safe. */
SL_API const char *sl_client_error(void);

/* grpc.health.v1 Check of `service` ("" or NULL for the whole daemon). Returns 0 and *status, or
 * a negative error (SL_ENOTFOUND for a service the daemon does not know). Thread-safe. */
SL_API int sl_client_health(sl_client *c, const char *service, sl_client_health_status *status);

/* Name of a health status ("SERVING"; "UNKNOWN" for any other value). Returns a static string.
 * Thread-safe. */
SL_API const char *sl_client_health_name(sl_client_health_status status);

/* Admin.GetInfo: the daemon's version, uptime, data dir, catalog schema, pid and listen address
 * into the caller's *info. Returns 0 or a negative error. Thread-safe. */
SL_API int sl_client_info(sl_client *c, sl_info *info);

/* Admin.GetInfo as sl_client_info (info may be NULL), and what it says about the daemon's
 * quarantine and catalog file into *store (its version set by the caller). Returns 0 or a
 * negative error (SL_EINVAL for an unknown store->version). Thread-safe. */
SL_API int sl_client_info_store(sl_client *c, sl_info *info, sl_store_info *store);

#ifdef __cplusplus
}
#endif

#endif
