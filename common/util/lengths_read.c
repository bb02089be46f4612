/* Reading a stored lengths file, checked against the catalog's count and SHA-256. See lengths.h.
 * Apart from the rest of the format (sl_common) because it hashes with common/shard. */
#include "util/lengths.h"

#include "err.h"
#include "shard/shard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int read_all(int fd, uint8_t *buf, size_t n)
{
    size_t got = 0;

    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);

        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? -errno : SL_ECORRUPT;
        got += (size_t)r;
    }
    return 0;
}

static int hash(char hex[SL_SHARD_HEX_LEN + 1], const uint8_t *buf, size_t n)
{
    sl_sha256 *h = NULL;
    int err;

    if ((err = sl_sha256_new(&h)) == 0 && (err = sl_sha256_reset(h)) == 0 &&
        (err = sl_sha256_update(h, buf, n)) == 0)
        err = sl_sha256_final(h, hex);
    sl_sha256_free(h);
    return err;
}

int sl_lengths_read(uint32_t **out, int fd, uint64_t n, const char *sha256, char *msg, size_t len)
{
    char hex[SL_SHARD_HEX_LEN + 1];
    uint8_t *raw = NULL;
    struct stat st;
    size_t bytes = (size_t)n * 4, bad;
    int err = 0;

    *out = NULL;
    /* 4 * n must not wrap: a count of 2^62 + 5 would otherwise match a 20-byte file. */
    if (n > SIZE_MAX / 4) {
        snprintf(msg, len, "%llu lengths do not fit in memory", (unsigned long long)n);
        return SL_ECORRUPT;
    }
    if (fstat(fd, &st) != 0) {
        err = -errno;
        snprintf(msg, len, "cannot read the lengths file: %s", sl_strerror(err));
        goto out;
    }
    if ((uint64_t)st.st_size != (uint64_t)bytes) {
        err = SL_ECORRUPT;
        snprintf(msg, len, "lengths file has %lld bytes, expected %zu", (long long)st.st_size,
                 bytes);
        goto out;
    }
    if (!(raw = malloc(bytes ? bytes : 4))) {
        err = -ENOMEM;
        snprintf(msg, len, "out of memory for %zu lengths", (size_t)n);
        goto out;
    }
    if ((err = read_all(fd, raw, bytes)) != 0) {
        snprintf(msg, len, "cannot read the lengths file: %s", sl_strerror(err));
        goto out;
    }
    if ((err = hash(hex, raw, bytes)) != 0) {
        snprintf(msg, len, "hashing failed");
        goto out;
    }
    if (strcmp(hex, sha256) != 0) {
        err = SL_ECORRUPT;
        snprintf(msg, len, "lengths file checksum %s does not match the catalog's %s", hex, sha256);
        goto out;
    }
    /* Uploads refuse a length of 0, so one here means the file is not what was uploaded. */
    if (sl_lengths_decode((uint32_t *)(void *)raw, raw, (size_t)n, &bad) != 0) {
        err = SL_ECORRUPT;
        snprintf(msg, len, "lengths file has length 0 at record %zu", bad);
        goto out;
    }
out:
    if (err)
        free(raw);
    else
        *out = (uint32_t *)(void *)raw;
    return err;
}
