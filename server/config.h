/* sluiced configuration: built-in defaults, then SLUICE_* environment variables, then flags. */
#ifndef SL_CONFIG_H
#define SL_CONFIG_H

#include "log.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>

typedef struct sl_config {
    char listen[256];           /* --listen / SLUICE_LISTEN, "127.0.0.1:7700" */
    char data_dir[PATH_MAX];    /* --data-dir / SLUICE_DATA_DIR, "./sluice-data" */
    char port_file[PATH_MAX];   /* --port-file / SLUICE_PORT_FILE, "" = none */
    sl_log_level log_level;     /* --log-level / SLUICE_LOG_LEVEL, info */
    uint64_t grace_ms;          /* --grace-period / SLUICE_GRACE_PERIOD (seconds), 10 s */
    int max_message_bytes;      /* --max-message-bytes / SLUICE_MAX_MESSAGE_BYTES, 8 MiB */
    int rpc_threads;            /* --rpc-threads / SLUICE_RPC_THREADS, 2 */
    uint64_t max_shard_bytes;   /* --max-shard-bytes / SLUICE_MAX_SHARD_BYTES, 1 TiB */
    uint64_t upload_timeout_ms; /* --upload-timeout / SLUICE_UPLOAD_TIMEOUT (seconds), 1 h */
} sl_config;

/* Outcome of parsing beyond success. */
#define SL_CONFIG_EXIT_OK 1 /* --help or --version was printed: exit 0 */

/* Fill *cfg from defaults, the environment and argv. Returns 0, SL_CONFIG_EXIT_OK, or SL_EINVAL
 * after printing what was wrong (and the usage hint) to `err`. Not thread-safe (getopt). */
int sl_config_parse(sl_config *cfg, int argc, char **argv, FILE *out, FILE *err);

/* Print the usage text. */
void sl_config_usage(FILE *f);

#endif
