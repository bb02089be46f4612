/* The lengths file: the token count of every sample of a dataset, the input of batch planning.
 *
 * Stored form: one little-endian u32 per sample, in sample order, nothing else; every length is
 * at least 1. The daemon keeps one per dataset and records its SHA-256 in the catalog. The
 * command-line client reads lengths from a file (or stdin) in one of two input forms:
 *   text  one decimal per line; CRLF line ends and a last line without a newline are fine
 *   u32   the stored form itself
 * A length of 0 is refused everywhere: in both input forms, in uploads (sl_lengths_encode) and
 * in stored files (sl_lengths_read).
 *
 * Everything but sl_lengths_read is in sl_common. sl_lengths_read hashes with common/shard's
 * SHA-256 and lives in the sl_lengths library. All functions are thread-safe. See docs/util.md.
 */
#ifndef SL_UTIL_LENGTHS_H
#define SL_UTIL_LENGTHS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Most lengths one file may hold (also the batch planner's limit, SL_BATCH_MAX_SEQUENCES). */
#define SL_LENGTHS_MAX ((size_t)UINT32_MAX)

typedef enum sl_lengths_form {
    SL_LENGTHS_TEXT = 0,
    SL_LENGTHS_U32 = 1,
} sl_lengths_form;

/* Parse an input form's name, "text" or "u32". Returns 0 or SL_EINVAL. */
int sl_lengths_form_parse(sl_lengths_form *out, const char *s);

/* Encode n lengths into 4 * n bytes of the stored form. Returns 0, or SL_EINVAL if one of them is
 * 0: *bad (may be NULL) is its index and out holds the records before it. */
int sl_lengths_encode(uint8_t *out, const uint32_t *v, size_t n, size_t *bad);

/* Decode 4 * n bytes of the stored form into n lengths; out may be (uint32_t *)raw (decoding in
 * place). Returns 0, or SL_EINVAL at the first length 0 (*bad, may be NULL, is its index). */
int sl_lengths_decode(uint32_t *out, const uint8_t *raw, size_t n, size_t *bad);

/* Read lengths in input form `form` from f until its end: at most `max` of them (at most
 * SL_LENGTHS_MAX). Returns 0 with *out a new array of *n lengths (caller frees with free(); NULL
 * when *n is 0). On failure *out is NULL, *n 0, and msg[0..len) says what was wrong and where,
 * starting with `name` (a path; "name:3: length 0 (every length must be at least 1)"): SL_EINVAL
 * for malformed input or a length of 0, SL_ELIMIT for more than max lengths, -ENOMEM, or -errno
 * from reading. Blocking. */
int sl_lengths_parse(uint32_t **out, size_t *n, FILE *f, sl_lengths_form form, size_t max,
                     const char *name, char *msg, size_t len);

/* Read a stored lengths file, open as `fd` at its start, that must hold exactly n lengths and hash
 * to `sha256` (lowercase hex, as recorded in the catalog). The caller opens the file (the daemon
 * through its store, which follows no symbolic link) and closes it. Returns 0 with *out a new
 * array of n lengths (caller frees with free()). On failure *out is NULL and msg[0..len) says
 * why: -errno if the file cannot be read (-EBADF for fd -1), -ENOMEM, SL_ECORRUPT if its size,
 * checksum or a length of 0 shows it is not the file the catalog describes (or 4 * n does not fit
 * in memory), SL_EUNAVAILABLE if hashing failed. Blocking: worker threads. In sl_lengths. */
int sl_lengths_read(uint32_t **out, int fd, uint64_t n, const char *sha256, char *msg, size_t len);

#endif
