/* Fuzz target: the sluiced configuration parser (server/config.c: sl_config_parse, the INI
 * handler and every value parser). The input is written as the config file; the parse then
 * goes through --config exactly as the daemon's does, and the result is printed. */
#include "fuzz.h"

#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    static FILE *null;
    char *argv[] = {"sluiced", "--config", path, "--check-config", NULL};
    sl_config cfg;
    FILE *f;

    if (!path[0]) {
        snprintf(path, sizeof(path), "/tmp/sl-fuzz-config-%d.ini", (int)getpid());
        /* The environment ranks above the file: keep it out of the way. */
        unsetenv("SLUICE_CONFIG");
        null = fopen("/dev/null", "w");
    }
    if (!null || !(f = fopen(path, "wb")))
        return 0;
    if (size)
        fwrite(data, 1, size, f);
    fclose(f);
    if (sl_config_parse(&cfg, 4, argv, null, null) == 0)
        sl_config_print(&cfg, null);
    unlink(path);
    return 0;
}
