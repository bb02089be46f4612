/* Fuzz target: sluiced's command line and SLUICE_* environment (server/config.c,
 * sl_config_parse), then sl_config_print, whose output must parse again (as a config file, with
 * no flags and no environment) to the very same settings, unless a value is too long for a
 * config-file line: then the parser must refuse the printed file.
 *
 * Input layout: everything after the first 0x01 byte is a config file (passed with --config);
 * before it, NUL-separated tokens. A token "SLUICE_<NAME>=<value>" sets that variable, any other
 * token is the next argv element. Tokens that would name another config file (--config and its
 * abbreviations, SLUICE_CONFIG) are dropped: the target must not read arbitrary files.
 *
 * The comparison walks config.c's settings table (sl_config_diff): every setting, including ones
 * added later, is compared. */
#include "fuzz.h"

#include "config.h"

#include <ini.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_ARGS 64
#define MAX_ENV  32

static void same_settings(const sl_config *a, const sl_config *b)
{
    const char *name = sl_config_diff(a, b);

    if (name) {
        fprintf(stderr, "fuzz_flags: '%s' changed when its printed value was parsed again\n", name);
        abort();
    }
}

static size_t longest_line(const char *s)
{
    size_t max = 0;

    while (*s) {
        size_t n = strcspn(s, "\n");
        if (n > max)
            max = n;
        s += n + (s[n] == '\n');
    }
    return max;
}

static int write_file(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    int ok;

    if (!f)
        return -1;
    ok = !size || fwrite(data, 1, size, f) == size;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* True for tokens getopt_long would take as --config (any unambiguous prefix, with or without
 * "=value"). Only "--check-config" shares the "--c" prefix, and it needs "--ch". */
static int names_config(const char *t)
{
    return strncmp(t, "--c", 3) == 0 && strncmp(t, "--ch", 4) != 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64], path2[64];
    static FILE *null;
    char *copy, *argv[MAX_ARGS + 4], *env[MAX_ENV], *printed = NULL, *printed2 = NULL;
    const uint8_t *sep = memchr(data, 1, size);
    size_t head = sep ? (size_t)(sep - data) : size, plen = 0, plen2 = 0;
    int argc = 1, nenv = 0;
    sl_config cfg, again;
    FILE *mem;

    if (!path[0]) {
        snprintf(path, sizeof(path), "/tmp/sl-fuzz-flags-%d.ini", (int)getpid());
        snprintf(path2, sizeof(path2), "/tmp/sl-fuzz-flags-%d-printed.ini", (int)getpid());
        /* Only the input's variables: none of the fuzzing process's own. */
        for (size_t i = 0; sl_config_env_name(i); i++)
            unsetenv(sl_config_env_name(i));
        unsetenv("SLUICE_CONFIG");
        null = fopen("/dev/null", "w");
    }
    if (!null || !(copy = malloc(head + 1)))
        return 0;
    memcpy(copy, data, head);
    copy[head] = '\0';
    argv[0] = "sluiced";
    if (sep) {
        if (write_file(path, sep + 1, size - head - 1) != 0)
            goto out;
        argv[argc++] = "--config";
        argv[argc++] = path;
    }
    for (char *t = copy; t < copy + head; t += strlen(t) + 1) {
        char *eq = strchr(t, '=');

        if (strncmp(t, "SLUICE_", 7) == 0 && eq) {
            *eq = '\0';
            if (strcmp(t, "SLUICE_CONFIG") != 0 && nenv < MAX_ENV && setenv(t, eq + 1, 1) == 0)
                env[nenv++] = t;
        } else if (!names_config(t) && argc < MAX_ARGS) {
            argv[argc++] = t;
        }
    }
    argv[argc] = NULL;

    if (sl_config_parse(&cfg, argc, argv, null, null) != 0)
        goto out;
    /* Accepted: print it, and the printed file alone must give the same configuration. */
    if (!(mem = open_memstream(&printed, &plen)))
        goto out;
    sl_config_print(&cfg, mem);
    if (fclose(mem) != 0 || write_file(path2, printed, plen) != 0)
        goto out;
    for (int i = 0; i < nenv; i++)
        unsetenv(env[i]);
    nenv = 0;
    {
        char *argv2[] = {"sluiced", "--config", path2, NULL};

        if (sl_config_parse(&again, 3, argv2, null, null) != 0) {
            /* A config file line holds at most INI_MAX_LINE - 2 characters (inih's buffer, less
             * the newline and the NUL); a longer value can only be given as a flag or variable,
             * and the parser then refuses the printed file. Any other failure is a finding. */
            if (longest_line(printed) > INI_MAX_LINE - 2)
                goto out;
            fprintf(stderr, "fuzz_flags: the printed configuration does not parse:\n%s", printed);
            abort();
        }
    }
    same_settings(&cfg, &again);
    /* And printing is stable: the same text apart from the "# config file" comment. */
    if ((mem = open_memstream(&printed2, &plen2)) != NULL) {
        sl_config_print(&again, mem);
        fclose(mem);
        if (!strstr(printed2, "\n[sluiced]\n") ||
            strcmp(strstr(printed, "\n[sluiced]\n"), strstr(printed2, "\n[sluiced]\n")) != 0)
            abort();
    }
out:
    for (int i = 0; i < nenv; i++)
        unsetenv(env[i]);
    unlink(path);
    unlink(path2);
    free(printed);
    free(printed2);
    free(copy);
    return 0;
}
