/* The `sluice` command: shared state and helpers for subcommands.
 *
 * Each subcommand is `int cmd_<name>(sl_cli *cli, int argc, char **argv)` where argv[0] is the
 * subcommand's name; it returns an exit code: SL_CLI_OK, SL_CLI_ERROR or SL_CLI_USAGE.
 */
#ifndef SL_CLI_H
#define SL_CLI_H

#include <getopt.h>
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
    char *token;            /* SLUICE_TOKEN or read from token_file */
} sl_cli;

/* Options every subcommand accepts, to splice into its getopt_long table (terminated by
 * SL_CLI_COMMON_OPTS_END). Their ids start at 1000. */
#define SL_CLI_OPT_ADDR       1000
#define SL_CLI_OPT_JSON       1001
#define SL_CLI_OPT_TIMEOUT    1002
#define SL_CLI_OPT_HELP       'h'
#define SL_CLI_OPT_TLS        1003
#define SL_CLI_OPT_TLS_CA     1004
#define SL_CLI_OPT_TLS_CERT   1005
#define SL_CLI_OPT_TLS_KEY    1006
#define SL_CLI_OPT_TOKEN_FILE 1007
#define SL_CLI_COMMON_OPTS                                                                         \
    {"addr", required_argument, NULL, SL_CLI_OPT_ADDR},                                            \
        {"json", no_argument, NULL, SL_CLI_OPT_JSON},                                              \
        {"timeout", required_argument, NULL, SL_CLI_OPT_TIMEOUT},                                  \
        {"tls", no_argument, NULL, SL_CLI_OPT_TLS},                                                \
        {"tls-ca", required_argument, NULL, SL_CLI_OPT_TLS_CA},                                    \
        {"tls-cert", required_argument, NULL, SL_CLI_OPT_TLS_CERT},                                \
        {"tls-key", required_argument, NULL, SL_CLI_OPT_TLS_KEY},                                  \
        {"token-file", required_argument, NULL, SL_CLI_OPT_TOKEN_FILE},                            \
    {                                                                                              \
        "help", no_argument, NULL, SL_CLI_OPT_HELP                                                 \
    }
#define SL_CLI_COMMON_HELP                                                                         \
    "  --addr HOST:PORT   daemon address [SLUICE_ADDR] (default 127.0.0.1:7700)\n"                 \
    "  --json             print JSON instead of text\n"                                            \
    "  --timeout SECONDS  per-call deadline (default 10)\n"                                        \
    "  --tls              connect with TLS (implied by --tls-ca/--tls-cert)\n"                     \
    "  --tls-ca FILE      PEM CA that signed the daemon's certificate [SLUICE_TLS_CA]\n"           \
    "  --tls-cert FILE    PEM client certificate for mTLS [SLUICE_TLS_CERT]\n"                     \
    "  --tls-key FILE     PEM key of --tls-cert [SLUICE_TLS_KEY]\n"                                \
    "  --token-file FILE  bearer token (first line of FILE) [SLUICE_TOKEN_FILE; or "               \
    "SLUICE_TOKEN]\n"                                                                              \
    "  -h, --help         show this help\n"

/* Handle a common option id. Returns 0 if handled, 1 if `c` is not a common option,
 * SL_CLI_USAGE after printing an error. */
int sl_cli_common_opt(sl_cli *cli, const char *cmd, int c, const char *arg);

/* Connect to the daemon with the common options (address, timeout, TLS, token). Returns 0, or
 * SL_CLI_ERROR after printing why. */
struct sl_client;
int sl_cli_connect(struct sl_client **out, sl_cli *cli, const char *cmd);

/* Report a getopt error ('?' or ':') for `cmd` and return SL_CLI_USAGE. */
int sl_cli_bad_opt(const char *cmd, int c, char **argv);

/* Print an error line "sluice <cmd>: <message>" to stderr. Returns SL_CLI_ERROR. */
int sl_cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Write `s` as a JSON string literal (quoted, escaped). */
void sl_cli_json_str(FILE *f, const char *s);

int cmd_health(sl_cli *cli, int argc, char **argv);
int cmd_info(sl_cli *cli, int argc, char **argv);
int cmd_sample(sl_cli *cli, int argc, char **argv);
int cmd_batch(sl_cli *cli, int argc, char **argv);
int cmd_ckpt(sl_cli *cli, int argc, char **argv);
int cmd_dataset(sl_cli *cli, int argc, char **argv);
int cmd_job(sl_cli *cli, int argc, char **argv);
int cmd_epoch(sl_cli *cli, int argc, char **argv);
int cmd_indices(sl_cli *cli, int argc, char **argv);
int cmd_batches(sl_cli *cli, int argc, char **argv);

#endif
