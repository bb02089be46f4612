/* sluiced configuration. Precedence: flags > SLUICE_* environment variables > config file >
 * built-in defaults. One table describes every setting: its flag, variable and file key. */
#ifndef SL_CONFIG_H
#define SL_CONFIG_H

#include "log.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>

typedef struct sl_config {
    char config_file[PATH_MAX];   /* --config / SLUICE_CONFIG, "" = none */
    char listen[256];             /* listen, "127.0.0.1:7700" */
    char data_dir[PATH_MAX];      /* data-dir, "./sluice-data" */
    char port_file[PATH_MAX];     /* port-file, "" = none */
    sl_log_level log_level;       /* log-level, info */
    sl_log_format log_format;     /* log-format, logfmt */
    uint64_t grace_ms;            /* grace-period (seconds), 10 s */
    int max_message_bytes;        /* max-message-bytes, 8 MiB */
    int rpc_threads;              /* rpc-threads, 4 */
    uint64_t max_shard_bytes;     /* max-shard-bytes, 1 TiB */
    uint64_t upload_timeout_ms;   /* upload-timeout (seconds), 1 h */
    uint64_t upload_lease_ms;     /* upload-lease (seconds): replicas' upload leases, 30 s */
    uint64_t catalog_timeout_ms;  /* catalog-timeout (seconds): a PostgreSQL answer, 5 s */
    uint64_t upload_memory;       /* upload-memory: chunks held by all uploads, 1 GiB */
    char metrics_listen[256];     /* metrics-listen, "" = no metrics endpoint */
    char tls_cert[PATH_MAX];      /* tls-cert, "" = plaintext */
    char tls_key[PATH_MAX];       /* tls-key */
    char tls_client_ca[PATH_MAX]; /* tls-client-ca, "" = no client certificates (no mTLS) */
    char token_file[PATH_MAX];    /* token-file, "" = no authentication */
    int max_calls;                /* max-calls: concurrent calls, 4096, 0 = unlimited */
    int max_job_streams;          /* max-job-streams: concurrent streams per job and kind, 8192 */
    int max_deep_verifies;        /* max-deep-verifies: deep-verify hash jobs at once, 2 */
    uint64_t idle_timeout_ms;     /* idle-timeout (seconds): stalled stream ended, 300 s, 0 = off */
    int max_peer_calls;           /* max-peer-calls: concurrent calls per client address, 4096 */
    uint64_t max_connection_idle_ms; /* max-connection-idle (seconds): 300 s, 0 = never */
    uint64_t max_connection_age_ms;  /* max-connection-age (seconds): 0 = never */
    uint64_t self_check_ms;          /* self-check-interval (seconds): 10 s, 0 = off */
    int allow_shared_data_dir;       /* allow-shared-data-dir: use a data dir others can write */
    char catalog[1024];              /* catalog: "" = sqlite:<data dir>/catalog.db, sqlite:PATH or a
                                      * postgresql:// conninfo (never with a password) */
    char catalog_password_file[PATH_MAX]; /* catalog-password-file: "" = PGPASSFILE/~/.pgpass */
    char replica_id[256];                 /* replica-id: "" = <hostname>:<port> */
    char store[1024];       /* store: "" = <data dir>/checkpoints, or s3://BUCKET[/PREFIX] */
    char s3_endpoint[512];  /* s3-endpoint: "" = AWS for the region */
    char s3_region[64];     /* s3-region, "us-east-1" */
    char s3_addressing[16]; /* s3-addressing: path, virtual or auto (path with an
                             * endpoint, virtual without) */
    char s3_credentials_file[PATH_MAX]; /* s3-credentials-file: "" = AWS_* environment */
    char s3_ca_file[PATH_MAX];          /* s3-ca-file: "" = the system's CAs */
    int s3_tls_verify;                  /* s3-tls-verify, true */
    uint64_t s3_part_size;              /* s3-part-size, 8 MiB */
    int s3_parts_in_flight;             /* s3-parts-in-flight: per upload, 4 */
    uint64_t s3_retry_deadline_ms;      /* s3-retry-deadline (seconds), 30 s */
    uint64_t s3_request_timeout_ms;     /* s3-request-timeout (seconds): one attempt, 60 s */
    int s3_list_max_pages;              /* s3-list-max-pages: pages of one listing, 10000 */
    int s3_store_jobs;                  /* s3-store-jobs: small store jobs on the pool, 4 */
    uint64_t s3_unhealthy_after_ms;     /* s3-unhealthy-after (seconds): 0 = never, 30 s */
    int check_config;                   /* --check-config */
} sl_config;

/* Outcome of parsing beyond success. */
#define SL_CONFIG_EXIT_OK 1 /* --help or --version was printed: exit 0 */

/* Fill *cfg from defaults, the config file, the environment and argv. Returns 0,
 * SL_CONFIG_EXIT_OK, or SL_EINVAL after printing what was wrong (naming the flag, variable or
 * file line) to `err`. Not thread-safe (getopt). */
int sl_config_parse(sl_config *cfg, int argc, char **argv, FILE *out, FILE *err);

/* Print the effective configuration in config-file syntax. */
void sl_config_print(const sl_config *cfg, FILE *f);

/* Print the usage text. */
void sl_config_usage(FILE *f);

/* The name of the first setting whose value differs between a and b, or NULL if every setting of
 * the table is equal (settings added later are compared too). For tests and the fuzzer. */
const char *sl_config_diff(const sl_config *a, const sl_config *b);

/* The SLUICE_* environment variable of the i-th setting, or NULL for i past the last one. */
const char *sl_config_env_name(size_t i);

#endif
