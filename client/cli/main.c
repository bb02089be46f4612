/* sluice: the command-line client. Parses its own options (the common ones and --version), then
 * hands the rest to a command. */
#include "cli.h"

#include "opt.h"

#include <stdlib.h>
#include <string.h>

static const sl_cli_cmd *const commands[] = {
    &sl_cli_health,  &sl_cli_info, &sl_cli_sample, &sl_cli_batch,   &sl_cli_ckpt,
    &sl_cli_dataset, &sl_cli_job,  &sl_cli_epoch,  &sl_cli_indices, &sl_cli_batches,
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static int version(void *field, const char *arg)
{
    printf("sluice %s\n", SLUICE_VERSION);
    return SL_CLI_DONE;
}

static const sl_cli_opt main_opts[] = {
    {"version", SL_CLI_CALL, NULL, "print the version", .letter = 'V', .call = version},
    SL_CLI_OPTS_END,
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "Usage: sluice [--addr HOST:PORT[,...]] [--json] [--timeout SECONDS] <command> [options]\n"
        "\n"
        "Commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-10s %s\n", commands[i]->name, commands[i]->summary);
    fprintf(f, "\nOptions:\n");
    sl_cli_help_rows(f, sl_cli_common_opts, 19);
    sl_cli_help_rows(f, main_opts, 19);
    fprintf(f, "\n'sluice <command> --help' describes a command. Exit codes: 0 ok, 1 error, "
               "2 usage.\n");
}

/* sluice's own options: those before the command. */
static const sl_cli_cmd root = {
    .name = "",
    .opts = main_opts,
    .help = usage,
    .flags = SL_CLI_STOP_AT_ARG,
};

static void from_env(sl_cli *cli)
{
    const char *env = getenv("SLUICE_ADDR");

    if (env && *env)
        cli->addr = env;
    cli->tls_ca = getenv("SLUICE_TLS_CA");
    cli->tls_cert = getenv("SLUICE_TLS_CERT");
    cli->tls_key = getenv("SLUICE_TLS_KEY");
    cli->token_file = getenv("SLUICE_TOKEN_FILE");
    env = getenv("SLUICE_TOKEN");
    if (env && *env)
        cli->token = strdup(env);
}

int main(int argc, char **argv)
{
    sl_cli cli = {.addr = "127.0.0.1:7700", .json = 0, .timeout_ms = 10000};
    int first = 0, r;

    from_env(&cli);
    r = sl_cli_parse(&cli, &root, NULL, NULL, argc, argv, &first);
    if (r == 0 && first >= argc) {
        usage(stderr);
        r = SL_CLI_USAGE;
    }
    if (r != 0) {
        free(cli.token);
        return r == SL_CLI_DONE ? SL_CLI_OK : r;
    }
    r = -1;
    for (size_t i = 0; i < N_COMMANDS && r < 0; i++)
        if (strcmp(argv[first], commands[i]->name) == 0)
            r = sl_cli_run(&cli, commands[i], argc - first, argv + first);
    if (r < 0) {
        fprintf(stderr, "sluice: unknown command '%s'\nTry 'sluice --help'.\n", argv[first]);
        r = SL_CLI_USAGE;
    }
    free(cli.token);
    return r;
}
