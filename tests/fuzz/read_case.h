/* The input layout of the stored-file reader targets (fuzz_read_lengths, fuzz_read_labels): a
 * file of little-endian u32s that the reader checks against the catalog's count and SHA-256.
 *
 * Byte 0 is the mode, byte 1 a small parameter, bytes 2-9 a little-endian u64, then (hash mode 2
 * only) 64 bytes of expected hash; the rest is the file. Mode bits 0-1 pick the sample count (the
 * file's size / 4; that plus or minus byte 1; the u64 as is; the u64 in the top bits, counts
 * whose 4 * n wraps), bits 2-3 the expected hash (the file's true SHA-256; upper-cased; the 64
 * input bytes; the true one with the character at byte 1 changed); bit 4 is each target's. */
#ifndef SL_FUZZ_READ_CASE_H
#define SL_FUZZ_READ_CASE_H

#include <ctype.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define READ_CASE_HEAD 10

typedef struct read_case {
    uint8_t mode, param;
    const uint8_t *file; /* the file's bytes */
    size_t fsize;
    uint64_t n;      /* the sample count the reader is given */
    char expect[65]; /* the SHA-256 the reader is given */
    char truth[65];  /* the file's SHA-256 */
} read_case;

static inline uint64_t read_case_le64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static inline void read_case_hash(const uint8_t *data, size_t size, char hex[65])
{
    unsigned char md[32];
    unsigned int mdlen = 0;

    if (!EVP_Digest(data, size, md, &mdlen, EVP_sha256(), NULL) || mdlen != 32)
        abort();
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

/* Decode an input into c. Returns 0, or -1 for an input too short to be a case (skip it). */
static inline int read_case_decode(read_case *c, const uint8_t *data, size_t size)
{
    uint64_t u;

    if (size < READ_CASE_HEAD)
        return -1;
    c->mode = data[0];
    c->param = data[1];
    u = read_case_le64(data + 2);
    c->file = data + READ_CASE_HEAD;
    c->fsize = size - READ_CASE_HEAD;
    if (((c->mode >> 2) & 3) == 2) {
        if (c->fsize < 64)
            return -1;
        memcpy(c->expect, c->file, 64);
        c->expect[64] = '\0';
        c->file += 64;
        c->fsize -= 64;
    }
    read_case_hash(c->file, c->fsize, c->truth);
    switch ((c->mode >> 2) & 3) {
    case 0:
        strcpy(c->expect, c->truth);
        break;
    case 1:
        for (int i = 0; i < 65; i++)
            c->expect[i] = (char)toupper((unsigned char)c->truth[i]);
        break;
    case 2:
        break;
    default:
        strcpy(c->expect, c->truth);
        c->expect[c->param % 64] = c->expect[c->param % 64] == '0' ? '1' : '0';
        break;
    }
    switch (c->mode & 3) {
    case 0:
        c->n = c->fsize / 4;
        break;
    case 1:
        c->n = c->fsize / 4 + (uint64_t)(int64_t)(int8_t)c->param;
        break;
    case 2:
        c->n = u;
        break;
    default:
        c->n = u << 56 | c->fsize / 4;
        break;
    }
    return 0;
}

#endif
