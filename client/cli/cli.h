/* The `sluice` command: state shared by the subcommands and their small helpers.
 *
 * Each subcommand is an sl_cli_cmd (opt.h): its options as a table, and a run function the
 * dispatcher calls with them parsed. Exit codes: SL_CLI_OK, SL_CLI_ERROR or SL_CLI_USAGE.
 * Main thread only, except where a function says otherwise.
 */
#ifndef SL_CLI_H
#define SL_CLI_H

#include <stdint.h>
#include <stdio.h>

#define SL_CLI_OK    0
#define SL_CLI_ERROR 1
#define SL_CLI_USAGE 2

typedef struct sl_cli {
    const char *addr;       /* --addr / SLUICE_ADDR, default 127.0.0.1:7700 */
    int json;               /* --json */
    int64_t timeout_ms;     /* --timeout SECONDS, default 10 s */
    int tls;                /* --tls (implied by the TLS files) */
    const char *tls_ca;     /* --tls-ca / SLUICE_TLS_CA */
    const char *tls_cert;   /* --tls-cert / SLUICE_TLS_CERT */
    const char *tls_key;    /* --tls-key / SLUICE_TLS_KEY */
    const char *token_file; /* --token-file / SLUICE_TOKEN_FILE */
    char *token;            /* SLUICE_TOKEN or read from token_file; freed by main */
} sl_cli;

/* Connect to the daemon with the common options (address, timeout, TLS, token). Returns 0 and *out
 * (close with sl_client_close), or SL_CLI_ERROR after printing why. */
struct sl_client;
int sl_cli_connect(struct sl_client **out, sl_cli *cli, const char *cmd);

/* Report a getopt error ('?' unknown option, ':' missing value) of `cmd` ("" for sluice's own
 * options) and return SL_CLI_USAGE. */
int sl_cli_bad_opt(const char *cmd, int c, char **argv);

/* Print an error line "sluice <cmd>: <message>" to stderr. Returns SL_CLI_ERROR. Thread-safe. */
int sl_cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* After a failed libsluice call: "sluice <cmd>: <sl_client_error()> (daemon <addr>)". Returns
 * SL_CLI_ERROR. */
int sl_cli_call_fail(const sl_cli *cli, const char *cmd);

/* Write `s` as a JSON string literal (quoted, escaped by util/json.h). */
void sl_cli_json_str(FILE *f, const char *s);

/* "DP,TP,CP,PP": four mesh sizes >= 1 into *dp, *tp, *cp, *pp (set only on success). Returns 0 or
 * the error of sl_parse_u64_list. */
int sl_cli_mesh(const char *arg, uint32_t *dp, uint32_t *tp, uint32_t *cp, uint32_t *pp);

/* Read class ids from f, in the text form (one decimal per line) or with u32 the stored
 * little-endian form, at most SL_LENGTHS_MAX of them (their range and count are checked by the
 * sampler or the daemon). *out: a new array of *n ids (caller frees, also on failure). Returns
 * 0, or SL_CLI_ERROR after printing "sluice <cmd>: <path>:<line>: ..." . */
int sl_cli_labels_read(uint32_t **out, size_t *n, FILE *f, int u32, const char *path,
                       const char *cmd);

/* The commands, in cmd_<name>.c. */
struct sl_cli_cmd;
extern const struct sl_cli_cmd sl_cli_health, sl_cli_info, sl_cli_sample, sl_cli_batch, sl_cli_ckpt,
    sl_cli_dataset, sl_cli_job, sl_cli_epoch, sl_cli_indices, sl_cli_batches;

#endif
