/* Fuzz target: the daemon's lengths-file reader (sl_lengths_read, common/util/lengths_read.c),
 * which re-checks the file's size and SHA-256 against the catalog before a batch plan is computed.
 *
 * Input layout: read_case.h (the mode picks the sample count and the expected hash); mode bit
 * 4: the file does not exist (the reader gets fd -1).
 * The reader must accept exactly the files that exist, are 4 * n bytes long, hash to the
 * expected string and hold no length of 0, and then return the lengths little-endian decoded;
 * it must never crash. */
#include "fuzz.h"
#include "read_case.h"

#include "util/lengths.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A stored lengths file never holds a length of 0 (every upload refuses it): one that does is
 * not the file the catalog describes. */
static int has_zero(const uint8_t *file, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!(file[4 * i] | file[4 * i + 1] | file[4 * i + 2] | file[4 * i + 3]))
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
    uint32_t *v = NULL;
    int exists, want, err, fd;

    if (read_case_decode(&rc, data, size) != 0)
        return 0;
    if (!path[0])
        snprintf(path, sizeof(path), "/tmp/sl-fuzz-lengths-%d", (int)getpid());
    mode = rc.mode;
    file = rc.file;
    fsize = rc.fsize;
    n = rc.n;
    exists = !(mode & 0x10);
    if (exists) {
        FILE *f = fopen(path, "wb");

        if (!f)
            return 0;
        if (fsize && fwrite(file, 1, fsize, f) != fsize) {
            fclose(f);
            unlink(path);
            return 0;
        }
        fclose(f);
    } else {
        unlink(path);
    }
    /* Written with exact arithmetic: 4 * n must equal the size without wrapping. */
    want = exists && n <= fsize / 4 && n * 4 == fsize && strcmp(rc.expect, rc.truth) == 0 &&
           !has_zero(file, fsize / 4);
    msg[0] = '\0';
    fd = open(path, O_RDONLY | O_CLOEXEC); /* -1 for a missing file: a read error */
    err = sl_lengths_read(&v, fd, n, rc.expect, msg, sizeof(msg));
    if (fd >= 0)
        close(fd);
    if (want != (err == 0)) {
        fprintf(stderr, "read_lengths: n=%llu size=%zu err=%d msg=%s\n", (unsigned long long)n,
                fsize, err, msg);
        abort();
    }
    if (err == 0) {
        for (size_t i = 0; i < n; i++) {
            uint32_t w = (uint32_t)file[4 * i] | (uint32_t)file[4 * i + 1] << 8 |
                         (uint32_t)file[4 * i + 2] << 16 | (uint32_t)file[4 * i + 3] << 24;
            if (v[i] != w)
                abort();
        }
    } else if (v || !msg[0]) {
        abort(); /* a failure leaves *out NULL and says why */
    }
    free(v);
    if (exists)
        unlink(path);
    return 0;
}
