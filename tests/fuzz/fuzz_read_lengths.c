/* Fuzz target: the daemon's lengths-file reader (sl_lengths_read, common/util/lengths_read.c),
 * which re-checks the file's size and SHA-256 against the catalog before a batch plan is computed.
 *
 * Input layout: byte 0 is the mode, byte 1 a small parameter, bytes 2-9 a little-endian u64,
 * then (hash mode 2 only) 64 bytes of expected hash; the rest is the file. The mode picks how the
 * sample count and the expected hash are derived:
 *   bits 0-1  sample count: the file's size / 4; that plus or minus byte 1; the u64 as is; the
 *             u64 in the top bits (counts whose 4 * n wraps a size_t)
 *   bits 2-3  expected hash: the file's true SHA-256; the true one upper-cased; the 64 input
 *             bytes (up to a NUL); the true one with the character at byte 1 changed
 *   bit 4     the file does not exist (the reader gets fd -1)
 * The reader must accept exactly the files that exist, are 4 * n bytes long, hash to the
 * expected string and hold no length of 0, and then return the lengths little-endian decoded;
 * it must never crash. */
#include "fuzz.h"

#include "util/lengths.h"

#include <ctype.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HEAD 10

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void true_hash(const uint8_t *data, size_t size, char hex[65])
{
    unsigned char md[32];
    unsigned int mdlen = 0;

    if (!EVP_Digest(data, size, md, &mdlen, EVP_sha256(), NULL) || mdlen != 32)
        abort();
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

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
    uint8_t mode, param;
    uint64_t u, n;
    const uint8_t *file;
    size_t fsize;
    char expect[65], truth[65], msg[256];
    uint32_t *v = NULL;
    int exists, want, err, fd;

    if (size < HEAD)
        return 0;
    if (!path[0])
        snprintf(path, sizeof(path), "/tmp/sl-fuzz-lengths-%d", (int)getpid());
    mode = data[0];
    param = data[1];
    u = le64(data + 2);
    file = data + HEAD;
    fsize = size - HEAD;
    if (((mode >> 2) & 3) == 2) {
        if (fsize < 64)
            return 0;
        memcpy(expect, file, 64);
        expect[64] = '\0';
        file += 64;
        fsize -= 64;
    }
    true_hash(file, fsize, truth);
    switch ((mode >> 2) & 3) {
    case 0:
        strcpy(expect, truth);
        break;
    case 1:
        for (int i = 0; i < 65; i++)
            expect[i] = (char)toupper((unsigned char)truth[i]);
        break;
    case 2:
        break;
    default:
        strcpy(expect, truth);
        expect[param % 64] = expect[param % 64] == '0' ? '1' : '0';
        break;
    }
    switch (mode & 3) {
    case 0:
        n = fsize / 4;
        break;
    case 1:
        n = fsize / 4 + (uint64_t)(int64_t)(int8_t)param;
        break;
    case 2:
        n = u;
        break;
    default:
        n = u << 56 | fsize / 4;
        break;
    }
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
    want = exists && n <= fsize / 4 && n * 4 == fsize && strcmp(expect, truth) == 0 &&
           !has_zero(file, fsize / 4);
    msg[0] = '\0';
    fd = open(path, O_RDONLY | O_CLOEXEC); /* -1 for a missing file: a read error */
    err = sl_lengths_read(&v, fd, n, expect, msg, sizeof(msg));
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
