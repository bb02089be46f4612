/* libsluice: the C client of the sluice daemon.
 *
 * A client holds one gRPC channel; it is thread-safe except for sl_client_error, which reports
 * the last failure of the calling thread's most recent call.
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

#include <stdint.h>

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

/* Create a client for the daemon at `addr` ("host:port"); connects lazily. opts may be NULL.
 * Returns 0 and *out (free with sl_client_close), SL_EINVAL for an empty address, an unknown
 * opts->version or a TLS file that is not PEM, -errno for an unreadable TLS file. */
int sl_client_connect(sl_client **out, const char *addr, const sl_client_opts *opts);

/* Close the client. Accepts NULL. */
void sl_client_close(sl_client *c);

/* The status code name and message of this thread's last failed call ("UNAVAILABLE: failed to
 * connect to all addresses"). Thread-local static buffer. */
const char *sl_client_error(void);

/* grpc.health.v1 Check of `service` ("" for the whole daemon). Returns 0 and *status, or a
 * negative sluice error (SL_ENOTFOUND for a service the daemon does not know). */
int sl_client_health(sl_client *c, const char *service, sl_client_health_status *status);

/* Name of a health status ("SERVING"). Static string. */
const char *sl_client_health_name(sl_client_health_status status);

/* Admin.GetInfo. Returns 0 and *info, or a negative sluice error. */
int sl_client_info(sl_client *c, sl_info *info);

#endif
