/* common/shard: header encoding, name validation, SHA-256 vectors, hashing a file range. */
#include "err.h"
#include "shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static void test_header(void)
{
    uint8_t buf[SL_SHARD_HEADER_SIZE];
    sl_shard_header h = {0}, g;

    h.rank = 7;
    memcpy(h.sha256, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", 65);
    h.tensor_count = 3;
    h.data_len = 0x0102030405060708ull;
    sl_shard_header_encode(buf, &h);
    /* Little-endian layout of DESIGN.md. */
    CHECK(buf[0] == 0x52 && buf[1] == 0x41 && buf[2] == 0x48 && buf[3] == 0x53);
    CHECK(buf[4] == 7 && buf[5] == 0 && buf[8] == 64);
    CHECK(memcmp(buf + 12, h.sha256, 64) == 0);
    CHECK(buf[76] == 3);
    CHECK(buf[80] == 0x08 && buf[87] == 0x01);
    CHECK(sl_shard_header_decode(&g, buf, sizeof(buf)) == 0);
    CHECK(g.rank == 7 && g.tensor_count == 3 && g.data_len == h.data_len);
    CHECK(strcmp(g.sha256, h.sha256) == 0);

    CHECK(sl_shard_header_decode(&g, buf, sizeof(buf) - 1) == SL_ECORRUPT);
    buf[0] ^= 1;
    CHECK(sl_shard_header_decode(&g, buf, sizeof(buf)) == SL_ECORRUPT);
    buf[0] ^= 1;
    buf[8] = 63;
    CHECK(sl_shard_header_decode(&g, buf, sizeof(buf)) == SL_ECORRUPT);
    buf[8] = 64;
    buf[12] = 'G';
    CHECK(sl_shard_header_decode(&g, buf, sizeof(buf)) == SL_ECORRUPT);
    buf[12] = 'e';
    buf[7] = 0x80; /* negative rank */
    CHECK(sl_shard_header_decode(&g, buf, sizeof(buf)) == SL_ECORRUPT);
    buf[7] = 0;
    buf[87] = 0x80; /* data length above INT64_MAX */
    CHECK(sl_shard_header_decode(&g, buf, sizeof(buf)) == SL_ECORRUPT);
}

static void test_names(void)
{
    static const char *const good[] = {"a", "step_100", "run-1.2", "A.b_c-d", "y"};
    static const char *const bad[] = {"",     ".",   "..",   ".hidden", "a/b", "../x",
                                      "a..b", "a b", "a\\b", "é",       "a\n"};
    char buf[200];

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        CHECK(sl_shard_name_check(good[i]) == 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK(sl_shard_name_check(bad[i]) == SL_EINVAL);
    CHECK(sl_shard_name_check(NULL) == SL_EINVAL);
    memset(buf, 'x', sizeof(buf));
    buf[SL_SHARD_NAME_MAX] = '\0';
    CHECK(sl_shard_name_check(buf) == 0);
    buf[SL_SHARD_NAME_MAX] = 'x';
    buf[SL_SHARD_NAME_MAX + 1] = '\0';
    CHECK(sl_shard_name_check(buf) == SL_EINVAL);

    CHECK(sl_shard_file_name(buf, sizeof(buf), "step_1", 12) == 0);
    CHECK(strcmp(buf, "step_1_shard_12.shard") == 0);
    CHECK(sl_shard_file_name(buf, 10, "step_1", 12) == SL_ELIMIT);

    CHECK(sl_shard_hex_check("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") ==
          0);
    CHECK(sl_shard_hex_check("E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855") ==
          SL_EINVAL);
    CHECK(sl_shard_hex_check("e3b0") == SL_EINVAL);
    CHECK(sl_shard_hex_check(NULL) == SL_EINVAL);
}

static void test_sha256(void)
{
    char hex[65];
    sl_sha256 *h = NULL;

    CHECK(sl_sha256_new(&h) == 0);
    CHECK(sl_sha256_final(h, hex) == 0);
    CHECK(strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") == 0);
    CHECK(sl_sha256_reset(h) == 0);
    CHECK(sl_sha256_update(h, "ab", 2) == 0);
    CHECK(sl_sha256_update(h, "c", 1) == 0);
    CHECK(sl_sha256_final(h, hex) == 0);
    CHECK(strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0);
    sl_sha256_free(h);
    sl_sha256_free(NULL);
}

static void test_hash_fd(void)
{
    char path[] = "/tmp/shard_test_XXXXXX";
    char hex[65];
    sl_sha256 *h = NULL;
    size_t n = (3u << 20) + 5;
    uint8_t *buf = malloc(n);
    int fd = mkstemp(path);

    CHECK(fd >= 0 && buf);
    if (fd < 0 || !buf)
        goto out;
    unlink(path);
    /* 1,000,000 'a' bytes have a well-known digest; put them behind a 7-byte prefix. */
    memset(buf, 'a', n);
    memcpy(buf, "prefix!", 7);
    CHECK(write(fd, buf, n) == (ssize_t)n);
    CHECK(sl_sha256_new(&h) == 0);
    CHECK(sl_shard_hash_fd(h, fd, 7, 1000000) == 0);
    CHECK(sl_sha256_final(h, hex) == 0);
    CHECK(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0);
    /* A range past the end of the file is corrupt, not a short success. */
    CHECK(sl_sha256_reset(h) == 0);
    CHECK(sl_shard_hash_fd(h, fd, n - 10, 11) == SL_ECORRUPT);
    /* With a stop flag: unset, the same digest; set, it gives up before reading a block. */
    {
        atomic_int stop = 0;
        CHECK(sl_sha256_reset(h) == 0);
        CHECK(sl_shard_hash_fd_until(h, fd, 7, 1000000, &stop) == 0);
        CHECK(sl_sha256_final(h, hex) == 0);
        CHECK(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0);
        atomic_store(&stop, 1);
        CHECK(sl_sha256_reset(h) == 0);
        CHECK(sl_shard_hash_fd_until(h, fd, 0, n, &stop) == SL_ECANCELLED);
    }
    sl_sha256_free(h);
    close(fd);
out:
    free(buf);
}

/* Block digests: one per block_size bytes (the last shorter), however the updates split the
 * data; the whole digest unchanged; none after a state load (a resume from object storage). */
static void test_blocks(void)
{
    size_t n = 3 * 4096 + 100, count = 0;
    uint8_t *buf = malloc(n), md[SL_SHARD_DIGEST], state[SL_SHA256_STATE_LEN];
    const uint8_t *d = NULL;
    char hex[65], whole[65];
    sl_sha256 *h = NULL;

    CHECK(buf != NULL);
    if (!buf)
        return;
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)(i * 7 + 3);
    CHECK(sl_sha256_new(&h) == 0);
    CHECK(sl_sha256_update(h, buf, n) == 0 && sl_sha256_final(h, whole) == 0);
    CHECK(sl_sha256_blocks(h, &d, &count) == SL_ENOTFOUND);
    CHECK(sl_sha256_blocks_on(h, 100, n) == SL_EINVAL);
    for (size_t step = 1; step < 9000; step = step * 3 + 1) {
        CHECK(sl_sha256_reset(h) == 0 && sl_sha256_blocks_on(h, 4096, n) == 0);
        for (size_t off = 0; off < n; off += step)
            CHECK(sl_sha256_update(h, buf + off, off + step < n ? step : n - off) == 0);
        CHECK(sl_sha256_final(h, hex) == 0 && strcmp(hex, whole) == 0);
        CHECK(sl_sha256_blocks(h, &d, &count) == 0 && count == 4);
        for (size_t k = 0; k < 4 && count == 4; k++) {
            CHECK(sl_sha256_once(buf + k * 4096, k < 3 ? 4096 : 100, md) == 0);
            CHECK(memcmp(md, d + k * SL_SHARD_DIGEST, SL_SHARD_DIGEST) == 0);
        }
    }
    /* More bytes than announced lose the list; a state load loses it too. */
    CHECK(sl_sha256_reset(h) == 0 && sl_sha256_blocks_on(h, 4096, 4096) == 0);
    CHECK(sl_sha256_update(h, buf, n) == 0 && sl_sha256_final(h, hex) == 0);
    CHECK(strcmp(hex, whole) == 0 && sl_sha256_blocks(h, &d, &count) == SL_ENOTFOUND);
    CHECK(sl_sha256_reset(h) == 0 && sl_sha256_blocks_on(h, 4096, n) == 0);
    CHECK(sl_sha256_update(h, buf, 5000) == 0);
    sl_sha256_save(h, state);
    CHECK(sl_sha256_load(h, state) == 0);
    CHECK(sl_sha256_update(h, buf + 5000, n - 5000) == 0 && sl_sha256_final(h, hex) == 0);
    CHECK(strcmp(hex, whole) == 0 && sl_sha256_blocks(h, &d, &count) == SL_ENOTFOUND);
    /* Empty data: no blocks. */
    CHECK(sl_sha256_reset(h) == 0 && sl_sha256_blocks_on(h, 4096, 0) == 0);
    CHECK(sl_sha256_final(h, hex) == 0 && sl_sha256_blocks(h, &d, &count) == 0 && count == 0);
    sl_sha256_free(h);
    free(buf);
}

int main(void)
{
    test_header();
    test_names();
    test_sha256();
    test_hash_fd();
    test_blocks();
    return check_done("shard_test");
}
