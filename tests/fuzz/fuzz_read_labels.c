/* Fuzz target: the daemon's stored labels-file reader (feed_labels_read, server/feed/labels.c),
 * which checks a dataset's labels file against the catalog's sample count and SHA-256 and groups
 * the labels by class before a stratified or class-balanced job uses them.
 *
 * Input layout: read_case.h (the mode picks the sample count and the expected hash); mode bit
 * 4: a directory instead of a file (it opens and has a size, but reads fail).
 * The reader must accept exactly the regular files of 4 * n bytes (n >= 1) that hash to the
 * expected string and hold no class id of 2^20 or more, and then group them exactly: class c
 * holds the samples labelled c, in ascending order. It must never crash or allocate for a count
 * the file does not bear out. */
#include "fuzz.h"
#include "read_case.h"

#include "feed/internal.h"
#include "sample/internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The grouping of an accepted file: every class's members, ascending, are the samples with that
 * label, and the class count is the largest label + 1. */
static void check_grouping(const sl_sample_labels *l, const uint8_t *file, uint64_t n)
{
    uint32_t top = 0;
    uint64_t k = 0;

    for (uint64_t i = 0; i < n; i++)
        top = le32(file + 4 * i) > top ? le32(file + 4 * i) : top;
    if (sl_sample_labels_count(l) != n || sl_sample_labels_classes(l) != top + 1)
        abort();
    for (uint32_t c = 0; c <= top; c++) {
        uint64_t size = sl_sample_labels_class_size(l, c), seen = 0;
        for (uint64_t i = 0; i < n; i++)
            if (le32(file + 4 * i) == c) {
                if (seen >= size || sl_labels_member(l, k + seen) != i)
                    abort();
                seen++;
            }
        if (seen != size)
            abort();
        k += size;
    }
}

static int over_max(const uint8_t *file, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        if (le32(file + 4 * i) >= SL_SAMPLE_MAX_CLASSES)
            return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    read_case rc;
    uint8_t mode;
    uint64_t n;
    const uint8_t *file;
    size_t fsize;
    char msg[256];
    sl_sample_labels *l = NULL;
    int want, err, fd, dir;

    if (read_case_decode(&rc, data, size) != 0)
        return 0;
    if (!path[0])
        snprintf(path, sizeof(path), "/tmp/sl-fuzz-labels-%d", (int)getpid());
    mode = rc.mode;
    file = rc.file;
    fsize = rc.fsize;
    n = rc.n;
    dir = (mode & 0x10) != 0;
    unlink(path);
    rmdir(path);
    if (dir) {
        if (mkdir(path, 0700) != 0)
            return 0;
    } else {
        FILE *f = fopen(path, "wb");
        if (!f)
            return 0;
        if (fsize && fwrite(file, 1, fsize, f) != fsize) {
            fclose(f);
            unlink(path);
            return 0;
        }
        fclose(f);
    }
    /* Exact arithmetic: 4 * n must equal the size without wrapping. */
    want = !dir && n >= 1 && n <= fsize / 4 && n * 4 == fsize && strcmp(rc.expect, rc.truth) == 0 &&
           !over_max(file, n);
    msg[0] = '\0';
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        abort();
    err = feed_labels_read(&l, fd, n, rc.expect, msg, sizeof(msg));
    close(fd);
    if (want != (err == 0)) {
        fprintf(stderr, "read_labels: n=%llu size=%zu dir=%d err=%d msg=%s\n",
                (unsigned long long)n, fsize, dir, err, msg);
        abort();
    }
    if (err == 0)
        check_grouping(l, file, n);
    else if (l || !msg[0])
        abort(); /* a failure leaves *out NULL and says why */
    sl_sample_labels_free(l);
    if (dir)
        rmdir(path);
    else
        unlink(path);
    return 0;
}
