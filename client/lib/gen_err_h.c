/* Build-time generator of the installed sluice_err.h: copies the template given as argv[1] to
 * argv[2], replacing the line "@SL_ERR_ENUM@" with one enumerator per entry of SL_ERR_TABLE
 * (common/err.h). The C preprocessor expands the table, so the installed codes cannot drift from
 * the ones the daemon and the library use. */
#include "err.h"

#include <stdio.h>
#include <string.h>

static int emit_enum(FILE *out)
{
    int bad = 0, width = 0;

    /* The message becomes a comment: a "*" "/" in it would end the comment early. */
#define SL_ERR_CHECK(name, value, msg)                                                             \
    if (strstr(msg, "*/"))                                                                         \
        bad = 1;                                                                                   \
    if ((int)strlen(#name " = " #value ",") > width)                                               \
        width = (int)strlen(#name " = " #value ",");
    SL_ERR_TABLE(SL_ERR_CHECK)
#undef SL_ERR_CHECK
    if (bad) {
        fprintf(stderr, "gen_err_h: a message of SL_ERR_TABLE contains \"*/\"\n");
        return -1;
    }
#define SL_ERR_LINE(name, value, msg)                                                              \
    fprintf(out, "    %-*s /* %s */\n", width, #name " = " #value ",", msg);
    SL_ERR_TABLE(SL_ERR_LINE)
#undef SL_ERR_LINE
    return 0;
}

int main(int argc, char **argv)
{
    char line[1024];
    FILE *in = NULL, *out = NULL;
    int rc = 1, found = 0;

    if (argc != 3) {
        fprintf(stderr, "usage: gen_err_h <template> <output>\n");
        goto out;
    }
    in = fopen(argv[1], "r");
    out = fopen(argv[2], "w");
    if (!in || !out) {
        fprintf(stderr, "gen_err_h: cannot open %s\n", in ? argv[2] : argv[1]);
        goto out;
    }
    while (fgets(line, sizeof(line), in)) {
        if (strcmp(line, "@SL_ERR_ENUM@\n") == 0) {
            if (emit_enum(out) != 0)
                goto out;
            found = 1;
        } else {
            fputs(line, out);
        }
    }
    if (!found) {
        fprintf(stderr, "gen_err_h: no @SL_ERR_ENUM@ line in %s\n", argv[1]);
        goto out;
    }
    rc = ferror(in) || ferror(out) ? 1 : 0;
out:
    if (in)
        fclose(in);
    if (out && fclose(out) != 0)
        rc = 1;
    if (rc && argc == 3)
        remove(argv[2]);
    return rc;
}
