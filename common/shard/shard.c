/* SHA256_Init and friends are deprecated in OpenSSL 3 but kept: unlike EVP they expose the hash
 * state, which a resumable upload to object storage saves and loads (sl_sha256_save). They run
 * the same block function as EVP's SHA-256. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include "shard.h"

#include "err.h"
#include "log.h"
#include "util/name.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct sl_sha256 {
    SHA256_CTX c;
    /* Block digests (sl_sha256_blocks_on): the current block's hash and how many of its bytes
     * were hashed, the finished blocks' digests (n of cap allocated, at most max). */
    SHA256_CTX b;
    uint32_t bsize;
    uint32_t bfill;
    int lost;
    uint8_t *digests;
    size_t n, cap, max;
};

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;

    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void sl_shard_header_encode(uint8_t out[SL_SHARD_HEADER_SIZE], const sl_shard_header *h)
{
    put_u32(out, SL_SHARD_MAGIC);
    put_u32(out + 4, (uint32_t)h->rank);
    put_u32(out + 8, SL_SHARD_HEX_LEN);
    memcpy(out + 12, h->sha256, SL_SHARD_HEX_LEN);
    put_u32(out + 76, (uint32_t)h->tensor_count);
    put_u64(out + 80, h->data_len);
}

static int is_hex_char(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

int sl_shard_header_decode(sl_shard_header *out, const uint8_t *buf, size_t len)
{
    int32_t rank, count;
    uint64_t data_len;

    if (len < SL_SHARD_HEADER_SIZE || get_u32(buf) != SL_SHARD_MAGIC ||
        get_u32(buf + 8) != SL_SHARD_HEX_LEN)
        return SL_ECORRUPT;
    for (int i = 0; i < SL_SHARD_HEX_LEN; i++)
        if (!is_hex_char((char)buf[12 + i]))
            return SL_ECORRUPT;
    rank = (int32_t)get_u32(buf + 4);
    count = (int32_t)get_u32(buf + 76);
    data_len = get_u64(buf + 80);
    if (rank < 0 || count < 0 || data_len > (uint64_t)INT64_MAX)
        return SL_ECORRUPT;
    out->rank = rank;
    memcpy(out->sha256, buf + 12, SL_SHARD_HEX_LEN);
    out->sha256[SL_SHARD_HEX_LEN] = '\0';
    out->tensor_count = count;
    out->data_len = data_len;
    return 0;
}

int sl_shard_name_check(const char *name)
{
    return sl_name_check("", name, NULL, 0);
}

int sl_shard_hex_check(const char *hex)
{
    if (!hex || strnlen(hex, SL_SHARD_HEX_LEN + 1) != SL_SHARD_HEX_LEN)
        return SL_EINVAL;
    for (int i = 0; i < SL_SHARD_HEX_LEN; i++)
        if (!is_hex_char(hex[i]))
            return SL_EINVAL;
    return 0;
}

int sl_shard_file_name(char *buf, size_t len, const char *prefix, int rank)
{
    int n = snprintf(buf, len, "%s_shard_%d.shard", prefix, rank);

    return n < 0 || (size_t)n >= len ? SL_ELIMIT : 0;
}

static int ossl_fail(const char *op)
{
    char msg[256];

    ERR_error_string_n(ERR_get_error(), msg, sizeof(msg));
    sl_log_error("openssl_error", "op=%s msg=\"%s\"", op, msg);
    return SL_EUNAVAILABLE;
}

int sl_sha256_new(sl_sha256 **out)
{
    sl_sha256 *h = calloc(1, sizeof(*h));

    *out = NULL;
    if (!h)
        return -ENOMEM;
    if (sl_sha256_reset(h) != 0) {
        sl_sha256_free(h);
        return SL_EUNAVAILABLE;
    }
    *out = h;
    return 0;
}

int sl_sha256_reset(sl_sha256 *h)
{
    h->n = 0;
    h->bfill = 0;
    h->lost = 0;
    if (SHA256_Init(&h->c) != 1 || SHA256_Init(&h->b) != 1)
        return ossl_fail("sha256_init");
    return 0;
}

int sl_sha256_blocks_on(sl_sha256 *h, uint32_t block_size, uint64_t max_bytes)
{
    if (block_size < SL_SHARD_BLOCK_MIN || block_size > SL_SHARD_BLOCK_MAX)
        return SL_EINVAL;
    h->bsize = block_size;
    h->max = (size_t)(max_bytes / block_size + (max_bytes % block_size != 0));
    return 0;
}

/* The current block is complete (or the data ended): append its digest. A list that cannot
 * grow is dropped (lost): the shard is then recorded without one, as an older shard is. */
static int block_end(sl_sha256 *h)
{
    uint8_t *d;

    if (h->n == h->max)
        h->lost = 1;
    if (!h->lost && h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 64;
        cap = cap > h->max ? h->max : cap;
        d = realloc(h->digests, cap * SL_SHARD_DIGEST);
        if (d) {
            h->digests = d;
            h->cap = cap;
        } else {
            h->lost = 1;
        }
    }
    if (!h->lost && SHA256_Final(h->digests + h->n * SL_SHARD_DIGEST, &h->b) != 1)
        return ossl_fail("sha256_final");
    if (!h->lost)
        h->n++;
    h->bfill = 0;
    if (SHA256_Init(&h->b) != 1)
        return ossl_fail("sha256_init");
    return 0;
}

static int blocks_update(sl_sha256 *h, const uint8_t *p, size_t len)
{
    int err = 0;

    while (len && !err) {
        size_t k = h->bsize - h->bfill;
        k = k < len ? k : len;
        if (!h->lost && SHA256_Update(&h->b, p, k) != 1)
            return ossl_fail("sha256_update");
        h->bfill += (uint32_t)k;
        p += k;
        len -= k;
        if (h->bfill == h->bsize)
            err = block_end(h);
    }
    return err;
}

int sl_sha256_update(sl_sha256 *h, const void *buf, size_t len)
{
    if (len && SHA256_Update(&h->c, buf, len) != 1)
        return ossl_fail("sha256_update");
    return h->bsize ? blocks_update(h, buf, len) : 0;
}

int sl_sha256_blocks(const sl_sha256 *h, const uint8_t **digests, size_t *count)
{
    *digests = NULL;
    *count = 0;
    if (!h->bsize || h->lost)
        return SL_ENOTFOUND;
    *digests = h->digests;
    *count = h->n;
    return 0;
}

int sl_sha256_once(const void *buf, size_t len, uint8_t out[SL_SHARD_DIGEST])
{
    SHA256_CTX c;

    if (SHA256_Init(&c) != 1 || SHA256_Update(&c, buf, len) != 1 || SHA256_Final(out, &c) != 1)
        return ossl_fail("sha256");
    return 0;
}

int sl_sha256_final(sl_sha256 *h, char hex[SL_SHARD_HEX_LEN + 1])
{
    static const char digits[] = "0123456789abcdef";
    unsigned char md[SHA256_DIGEST_LENGTH];

    if (h->bsize && h->bfill && block_end(h) != 0)
        return SL_EUNAVAILABLE;
    if (SHA256_Final(md, &h->c) != 1)
        return ossl_fail("sha256_final");
    for (unsigned i = 0; i < 32; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[SL_SHARD_HEX_LEN] = '\0';
    return 0;
}

/* The saved state: the eight chaining words, the bit count (low, high), the bytes buffered and
 * the buffer, all little-endian. */
void sl_sha256_save(const sl_sha256 *h, uint8_t out[SL_SHA256_STATE_LEN])
{
    for (int i = 0; i < 8; i++)
        put_u32(out + 4 * i, h->c.h[i]);
    put_u32(out + 32, h->c.Nl);
    put_u32(out + 36, h->c.Nh);
    put_u32(out + 40, h->c.num);
    memcpy(out + 44, h->c.data, 64);
}

int sl_sha256_load(sl_sha256 *h, const uint8_t in[SL_SHA256_STATE_LEN])
{
    uint32_t num = get_u32(in + 40);

    if (num >= 64 || (get_u32(in + 32) & 7) != 0 || (get_u32(in + 32) >> 3) % 64 != num)
        return SL_ECORRUPT;
    if (sl_sha256_reset(h) != 0)
        return SL_EUNAVAILABLE;
    for (int i = 0; i < 8; i++)
        h->c.h[i] = get_u32(in + 4 * i);
    h->c.Nl = get_u32(in + 32);
    h->c.Nh = get_u32(in + 36);
    h->c.num = num;
    memcpy(h->c.data, in + 44, 64);
    /* The saved state carries no block list: the bytes before it cannot be listed. */
    h->lost = h->bsize != 0;
    return 0;
}

void sl_sha256_free(sl_sha256 *h)
{
    if (h)
        free(h->digests);
    free(h);
}

#define HASH_BUF (1u << 20)

int sl_shard_hash_fd(sl_sha256 *h, int fd, uint64_t offset, uint64_t len)
{
    return sl_shard_hash_fd_until(h, fd, offset, len, NULL);
}

int sl_shard_hash_fd_until(sl_sha256 *h, int fd, uint64_t offset, uint64_t len,
                           const atomic_int *stop)
{
    uint8_t *buf = malloc(HASH_BUF);
    int err = 0;

    if (!buf)
        return -ENOMEM;
    while (len > 0) {
        size_t want = len < HASH_BUF ? (size_t)len : HASH_BUF;
        ssize_t n;
        if (stop && atomic_load_explicit(stop, memory_order_relaxed)) {
            err = SL_ECANCELLED;
            goto out;
        }
        n = pread(fd, buf, want, (off_t)offset);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            err = -errno;
            goto out;
        }
        if (n == 0) {
            err = SL_ECORRUPT;
            goto out;
        }
        err = sl_sha256_update(h, buf, (size_t)n);
        if (err)
            goto out;
        offset += (uint64_t)n;
        len -= (uint64_t)n;
    }
out:
    free(buf);
    return err;
}
