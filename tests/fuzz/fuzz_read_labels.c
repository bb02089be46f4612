/* Fuzz target: the daemon's stored labels-file reader (feed_labels_read, server/feed/labels.c),
 * which checks a dataset's labels file against the catalog's sample count and SHA-256 and groups
 * the labels by class before a stratified or class-balanced job uses them.
 *
 * Input layout as fuzz_read_lengths: byte 0 is the mode, byte 1 a small parameter, bytes 2-9 a
 * little-endian u64, then (hash mode 2 only) 64 bytes of expected hash; the rest is the file.
 *   bits 0-1  sample count: the file's size / 4; that plus or minus byte 1; the u64 as is; the
 *             u64 in the top bits (counts whose 4 * n wraps)
 *   bits 2-3  expected hash: the file's true SHA-256; upper-cased; the 64 input bytes (up to a
 *             NUL); the true one with the character at byte 1 changed
 *   bit 4     a directory instead of a file (it opens and has a size, but reads fail)
 * The reader must accept exactly the regular files of 4 * n bytes (n >= 1) that hash to the
 * expected string and hold no class id of 2^20 or more, and then group them exactly: class c
 * holds the samples labelled c, in ascending order. It must never crash or allocate for a count
 * the file does not bear out. */
#include "fuzz.h"

#include "feed/internal.h"
#include "sample/internal.h"

#include <ctype.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEAD 10

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
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
    uint8_t mode, param;
    uint64_t u, n;
    const uint8_t *file;
    size_t fsize;
    char expect[65], truth[65], msg[256];
    sl_sample_labels *l = NULL;
    int want, err, fd, dir;

    if (size < HEAD)
        return 0;
    if (!path[0])
        snprintf(path, sizeof(path), "/tmp/sl-fuzz-labels-%d", (int)getpid());
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
    want = !dir && n >= 1 && n <= fsize / 4 && n * 4 == fsize && strcmp(expect, truth) == 0 &&
           !over_max(file, n);
    msg[0] = '\0';
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        abort();
    err = feed_labels_read(&l, fd, n, expect, msg, sizeof(msg));
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
