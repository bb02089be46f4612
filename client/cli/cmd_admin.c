/* sluice health, sluice info. */
#include "cli.h"

#include "err.h"
#include "sluice.h"

#include <string.h>

int cmd_health(sl_cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        SL_CLI_COMMON_OPTS,
        {"service", required_argument, NULL, 's'},
        {NULL, 0, NULL, 0},
    };
    sl_client_health_status status;
    const char *service = "";
    sl_client *c = NULL;
    int ch, r, err;

    opterr = 0;
    while ((ch = getopt_long(argc, argv, ":hs:", opts, NULL)) != -1) {
        if (ch == 'h') {
            printf(
                "Usage: sluice health [--service NAME] [options]\n"
                "\n"
                "Ask the daemon's grpc.health.v1 service whether it is serving. Prints SERVING or\n"
                "NOT_SERVING; exits 0 only when SERVING.\n"
                "\n"
                "Options:\n"
                "  -s, --service NAME fully qualified service to ask about (default: the "
                "daemon)\n" SL_CLI_COMMON_HELP);
            return SL_CLI_OK;
        }
        if (ch == 's') {
            service = optarg;
            continue;
        }
        if (ch == '?' || ch == ':')
            return sl_cli_bad_opt("health", ch, argv);
        if ((r = sl_cli_common_opt(cli, "health", ch, optarg)) != 0)
            return SL_CLI_USAGE;
    }
    if (optind < argc) {
        fprintf(stderr, "sluice health: unexpected argument '%s'\n", argv[optind]);
        return SL_CLI_USAGE;
    }
    if ((r = sl_cli_connect(&c, cli, "health")) != 0)
        return r;
    err = sl_client_health(c, service, &status);
    sl_client_close(c);
    if (err)
        return sl_cli_fail("health", "%s (daemon %s)", sl_client_error(), cli->addr);
    if (cli->json) {
        printf("{\"service\":");
        sl_cli_json_str(stdout, service);
        printf(",\"status\":\"%s\"}\n", sl_client_health_name(status));
    } else {
        printf("%s\n", sl_client_health_name(status));
    }
    return status == SL_CLIENT_HEALTH_SERVING ? SL_CLI_OK : SL_CLI_ERROR;
}

int cmd_info(sl_cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {SL_CLI_COMMON_OPTS, {NULL, 0, NULL, 0}};
    sl_client *c = NULL;
    sl_info info;
    int ch, r, err;

    opterr = 0;
    while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        if (ch == 'h') {
            printf("Usage: sluice info [options]\n"
                   "\n"
                   "Show the daemon's version, uptime, data dir, catalog schema version, pid and\n"
                   "listen address (sluice.v1.Admin/GetInfo).\n"
                   "\n"
                   "Options:\n" SL_CLI_COMMON_HELP);
            return SL_CLI_OK;
        }
        if (ch == '?' || ch == ':')
            return sl_cli_bad_opt("info", ch, argv);
        if ((r = sl_cli_common_opt(cli, "info", ch, optarg)) != 0)
            return SL_CLI_USAGE;
    }
    if (optind < argc) {
        fprintf(stderr, "sluice info: unexpected argument '%s'\n", argv[optind]);
        return SL_CLI_USAGE;
    }
    if ((r = sl_cli_connect(&c, cli, "info")) != 0)
        return r;
    err = sl_client_info(c, &info);
    sl_client_close(c);
    if (err)
        return sl_cli_fail("info", "%s (daemon %s)", sl_client_error(), cli->addr);
    if (cli->json) {
        printf("{\"version\":");
        sl_cli_json_str(stdout, info.version);
        printf(",\"uptime_ms\":%llu,\"data_dir\":", (unsigned long long)info.uptime_ms);
        sl_cli_json_str(stdout, info.data_dir);
        printf(",\"schema_version\":%u,\"pid\":%llu,\"listen\":", info.schema_version,
               (unsigned long long)info.pid);
        sl_cli_json_str(stdout, info.listen);
        printf("}\n");
    } else {
        printf("version:         %s\n"
               "uptime:          %.3f s\n"
               "data dir:        %s\n"
               "schema version:  %u\n"
               "pid:             %llu\n"
               "listen:          %s\n",
               info.version, (double)info.uptime_ms / 1000.0, info.data_dir, info.schema_version,
               (unsigned long long)info.pid, info.listen);
    }
    return SL_CLI_OK;
}
