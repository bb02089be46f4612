/* Standalone replay driver: runs every file named on the command line (or every regular file in
 * a named directory) through LLVMFuzzerTestOneInput once. Linked instead of libFuzzer in the
 * normal gcc build, so ctest replays the committed corpora under ASan+UBSan. Exit 0 when every
 * input ran; a sanitizer report aborts the process. */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    long n;
    int err = 1;

    if (!f) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return 1;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        goto out;
    /* One extra byte so an empty file still gets a valid pointer. */
    if (!(buf = malloc((size_t)n + 1)))
        goto out;
    if (n && fread(buf, 1, (size_t)n, f) != (size_t)n)
        goto out;
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    err = 0;
out:
    if (err)
        fprintf(stderr, "%s: cannot read\n", path);
    free(buf);
    fclose(f);
    return err;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_dir(const char *dir, int *count)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char **names = NULL;
    size_t n = 0, cap = 0;
    int err = 0;

    if (!d) {
        fprintf(stderr, "%s: %s\n", dir, strerror(errno));
        return 1;
    }
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            char **nn = realloc(names, (cap = cap ? cap * 2 : 64) * sizeof(*names));
            if (!nn) {
                err = 1;
                break;
            }
            names = nn;
        }
        if (!(names[n] = malloc(strlen(dir) + strlen(e->d_name) + 2))) {
            err = 1;
            break;
        }
        sprintf(names[n++], "%s/%s", dir, e->d_name);
    }
    closedir(d);
    /* Sorted, so a failure names the same input on every run. */
    qsort(names, n, sizeof(*names), name_cmp);
    for (size_t i = 0; i < n; i++) {
        if (!err) {
            err = run_file(names[i]);
            (*count)++;
        }
        free(names[i]);
    }
    free(names);
    return err;
}

int main(int argc, char **argv)
{
    int count = 0, err = 0;

    if (argc < 2) {
        fprintf(stderr, "usage: %s <corpus file or dir>...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc && !err; i++) {
        struct stat st;

        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "%s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        if (S_ISDIR(st.st_mode)) {
            err = run_dir(argv[i], &count);
        } else {
            err = run_file(argv[i]);
            count++;
        }
    }
    printf("%d input(s) replayed%s\n", count, err ? ", with errors" : "");
    return err;
}
