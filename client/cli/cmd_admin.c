/* sluice health, sluice info. */
#include "cli.h"

#include "err.h"
#include "opt.h"
#include "sluice.h"

typedef struct health_opts {
    const char *service;
} health_opts;

static const sl_cli_opt health_table[] = {
    {"service", SL_CLI_STR, "NAME", "fully qualified service to ask about (default: the daemon)",
     .letter = 's', SL_CLI_AT(health_opts, service)},
    SL_CLI_OPTS_END,
};

static void health_init(void *o)
{
    ((health_opts *)o)->service = "";
}

static int health_run(sl_cli *cli, sl_client *c, void *opts, int argc, char **argv)
{
    const health_opts *o = opts;
    sl_client_health_status status;

    if (sl_client_health(c, o->service, &status) != 0)
        return sl_cli_call_fail(cli, "health");
    if (cli->json) {
        printf("{\"service\":");
        sl_cli_json_str(stdout, o->service);
        printf(",\"status\":\"%s\"}\n", sl_client_health_name(status));
    } else {
        printf("%s\n", sl_client_health_name(status));
    }
    return status == SL_CLIENT_HEALTH_SERVING ? SL_CLI_OK : SL_CLI_ERROR;
}

const sl_cli_cmd sl_cli_health = {
    .name = "health",
    .summary = "check the daemon's health (grpc.health.v1)",
    .opts = health_table,
    .opts_size = sizeof(health_opts),
    .init = health_init,
    .run = health_run,
    .flags = SL_CLI_CONNECT,
    .head = "Usage: sluice health [--service NAME] [options]\n"
            "\n"
            "Ask the daemon's grpc.health.v1 service whether it is serving. Prints SERVING or\n"
            "NOT_SERVING; exits 0 only when SERVING.\n"
            "\n"
            "Options:\n",
};

static int info_run(sl_cli *cli, sl_client *c, void *opts, int argc, char **argv)
{
    sl_info info;
    sl_store_info store = SL_STORE_INFO_INIT;

    if (sl_client_info_store(c, &info, &store) != 0)
        return sl_cli_call_fail(cli, "info");
    if (cli->json) {
        printf("{\"version\":");
        sl_cli_json_str(stdout, info.version);
        printf(",\"uptime_ms\":%llu,\"data_dir\":", (unsigned long long)info.uptime_ms);
        sl_cli_json_str(stdout, info.data_dir);
        printf(",\"schema_version\":%u,\"pid\":%llu,\"listen\":", info.schema_version,
               (unsigned long long)info.pid);
        sl_cli_json_str(stdout, info.listen);
        printf(",\"quarantine_files\":%llu,\"quarantine_bytes\":%llu,\"quarantine_dir\":",
               (unsigned long long)store.quarantine_files,
               (unsigned long long)store.quarantine_bytes);
        sl_cli_json_str(stdout, store.quarantine_dir);
        printf(",\"catalog_problem\":");
        sl_cli_json_str(stdout, store.catalog_problem);
        printf(",\"shard_store\":");
        sl_cli_json_str(stdout, store.shard_store);
        printf(",\"replica\":");
        sl_cli_json_str(stdout, store.replica);
        printf(",\"catalog\":");
        sl_cli_json_str(stdout, store.catalog);
        printf("}\n");
    } else {
        printf("version:         %s\n"
               "uptime:          %.3f s\n"
               "data dir:        %s\n"
               "schema version:  %u\n"
               "pid:             %llu\n"
               "listen:          %s\n"
               "quarantine:      %llu files, %llu bytes in %s\n"
               "catalog:         %s (%s)\n"
               "shard store:     %s\n"
               "replica:         %s\n",
               info.version, (double)info.uptime_ms / 1000.0, info.data_dir, info.schema_version,
               (unsigned long long)info.pid, info.listen,
               (unsigned long long)store.quarantine_files,
               (unsigned long long)store.quarantine_bytes, store.quarantine_dir, store.catalog,
               store.catalog_problem[0] ? store.catalog_problem : "ok", store.shard_store,
               store.replica);
    }
    return SL_CLI_OK;
}

const sl_cli_cmd sl_cli_info = {
    .name = "info",
    .summary = "show the daemon's version, uptime, data dir, schema version and quarantine",
    .run = info_run,
    .flags = SL_CLI_CONNECT,
    .head = "Usage: sluice info [options]\n"
            "\n"
            "Show the daemon's version, uptime, data dir, catalog schema version, pid and\n"
            "listen address, the files in its quarantine (files its catalog did not know,\n"
            "moved aside instead of removed) and whether its catalog file was removed or\n"
            "replaced while it ran (sluice.v1.Admin/GetInfo).\n"
            "\n"
            "Options:\n",
};
