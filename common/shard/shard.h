/* The shard file format and streaming SHA-256.
 *
 * A shard file is `{prefix}_shard_{rank}.shard`: a fixed 88-byte header, then the data section.
 * All integers are little-endian:
 *
 *   u32 magic 0x53484152 ("SHAR") | i32 rank | i32 checksum length (64) |
 *   64 bytes: lowercase hex SHA-256 of the data section | i32 tensor count | i64 data length
 *
 * Tensor names, dtypes, shapes and offsets live in the catalog and in the metadata file. While a
 * shard is being written its checksum field holds 64 '0' characters; the real value is written
 * last, before the file is made durable.
 *
 * Everything here is pure or works on a caller's file descriptor; every function is thread-safe
 * (an sl_sha256 object is used by one thread at a time).
 */
#ifndef SL_SHARD_H
#define SL_SHARD_H

#include "util/name.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define SL_SHARD_MAGIC       0x53484152u
#define SL_SHARD_HEX_LEN     64 /* lowercase hex SHA-256 */
#define SL_SHARD_HEADER_SIZE 88 /* 4 + 4 + 4 + 64 + 4 + 8 */
#define SL_SHARD_NAME_MAX    SL_NAME_MAX
#define SL_SHARD_MAX_RANK    65535

typedef struct sl_shard_header {
    int32_t rank;
    char sha256[SL_SHARD_HEX_LEN + 1]; /* NUL-terminated; all '0' while writing */
    int32_t tensor_count;
    uint64_t data_len;
} sl_shard_header;

/* Encode `h` into exactly SL_SHARD_HEADER_SIZE bytes. h->sha256 must be 64 characters. */
void sl_shard_header_encode(uint8_t out[SL_SHARD_HEADER_SIZE], const sl_shard_header *h);

/* Decode a header from `len` bytes. Returns 0, or SL_ECORRUPT if the buffer is short, the magic
 * is wrong, the checksum length is not 64, the checksum is not lowercase hex, the rank or tensor
 * count is negative, or the data length exceeds INT64_MAX. */
int sl_shard_header_decode(sl_shard_header *out, const uint8_t *buf, size_t len);

/* Check a name that becomes part of a path (job, checkpoint): sl_name_check's rule (util/name.h:
 * 1..SL_SHARD_NAME_MAX characters of [A-Za-z0-9._-], not starting with '.', no ".."), without a
 * message. Returns 0 or SL_EINVAL. */
int sl_shard_name_check(const char *name);

/* Check a lowercase hex SHA-256 string (exactly 64 of [0-9a-f]). Returns 0 or SL_EINVAL. */
int sl_shard_hex_check(const char *hex);

/* Write "{prefix}_shard_{rank}.shard" into buf. Returns 0, or SL_ELIMIT if it does not fit. */
int sl_shard_file_name(char *buf, size_t len, const char *prefix, int rank);

/* Streaming SHA-256 over OpenSSL EVP. */
typedef struct sl_sha256 sl_sha256;

/* Allocate a hasher. Returns 0 and *out (free with sl_sha256_free), -ENOMEM. */
int sl_sha256_new(sl_sha256 **out);

/* Restart the hash. Returns 0 or SL_EUNAVAILABLE if OpenSSL failed (logged). */
int sl_sha256_reset(sl_sha256 *h);

/* Hash `len` more bytes. Returns 0 or SL_EUNAVAILABLE. */
int sl_sha256_update(sl_sha256 *h, const void *buf, size_t len);

/* Finish: write the lowercase hex digest (64 characters + NUL) into hex. The hasher must be
 * reset before it is used again. Returns 0 or SL_EUNAVAILABLE. */
int sl_sha256_final(sl_sha256 *h, char hex[SL_SHARD_HEX_LEN + 1]);

/* The hash state after the bytes hashed so far, to continue later, perhaps in another process
 * or on another machine (a resumable upload): sl_sha256_save writes it, sl_sha256_load makes `h`
 * continue from it (SL_ECORRUPT if it is not a state save wrote). */
#define SL_SHA256_STATE_LEN 108
void sl_sha256_save(const sl_sha256 *h, uint8_t out[SL_SHA256_STATE_LEN]);
int sl_sha256_load(sl_sha256 *h, const uint8_t in[SL_SHA256_STATE_LEN]);

/* Block digests: with sl_sha256_blocks_on, the hasher also keeps the raw SHA-256 (32 bytes) of
 * every block of `block_size` bytes of what it hashes from its last reset on (the last block may
 * be shorter), so that a reader of a range can check the blocks it covers without hashing from
 * the start (DownloadShard from an offset). Every update then hashes its bytes twice.
 *
 * on: start keeping them (after a reset, before any update); at most ceil(max_bytes /
 * block_size) blocks are kept: more bytes lose the list. block_size in [SL_SHARD_BLOCK_MIN,
 * SL_SHARD_BLOCK_MAX], else SL_EINVAL. The list grows as the bytes come (memory: 32 bytes per
 * block). Returns 0, SL_EINVAL.
 * blocks: after sl_sha256_final, the list (borrowed, valid until the next reset or free) and its
 * length. SL_ENOTFOUND if it was not kept or was lost: sl_sha256_load continues from a saved
 * state, which carries no list (a resumed upload to object storage), or memory ran out. */
#define SL_SHARD_BLOCK     (1u << 20) /* the block size of new shards */
#define SL_SHARD_BLOCK_MIN (4u << 10)
#define SL_SHARD_BLOCK_MAX (16u << 20)
#define SL_SHARD_DIGEST    32
int sl_sha256_blocks_on(sl_sha256 *h, uint32_t block_size, uint64_t max_bytes);
int sl_sha256_blocks(const sl_sha256 *h, const uint8_t **digests, size_t *count);

/* The raw SHA-256 of one buffer into out (a block's check). Returns 0 or SL_EUNAVAILABLE. */
int sl_sha256_once(const void *buf, size_t len, uint8_t out[SL_SHARD_DIGEST]);

/* Free a hasher. Accepts NULL. */
void sl_sha256_free(sl_sha256 *h);

/* Hash `len` bytes of `fd` starting at `offset` (pread, 1 MiB at a time, never the whole range in
 * memory) into an existing hasher, which is not reset first. Returns 0, -errno, or SL_ECORRUPT
 * if the file ends before offset + len. Blocking: worker threads. */
int sl_shard_hash_fd(sl_sha256 *h, int fd, uint64_t offset, uint64_t len);

/* sl_shard_hash_fd that gives up once *stop is non-zero (another thread sets it, e.g. when the
 * caller's request was cancelled): it is checked before each 1 MiB block, so the work stops
 * within one block. Returns what sl_shard_hash_fd does, or SL_ECANCELLED. `stop` may be NULL. */
int sl_shard_hash_fd_until(sl_sha256 *h, int fd, uint64_t offset, uint64_t len,
                           const atomic_int *stop);

#endif
