/* Where a checkpoint's files live in the store, and the few operations on them as a whole.
 *
 * Under the store root every job has a directory, <root>/<job>/, holding for checkpoint <name>:
 *   <name>_shard_<rank>.shard         a durable shard (docs/checkpoints.md has the format)
 *   .<name>_shard_<rank>.shard.part   an upload in progress or kept for a resume (a catalog of
 *                                     one daemon)
 *   .<name>_shard_<rank>.shard.<g>.part  the same, of the upload attempt holding lease
 *                                     generation g (a shared catalog: each attempt its own)
 *   <name>.metadata.json              written last, when the checkpoint is committed
 *   .<name>.metadata.json.tmp         the metadata file being written (sl_store_write_file)
 * Job and checkpoint names were checked by the caller (sl_shard_name_check). Paths that do not
 * fit are refused with SL_ELIMIT, never cut short.
 *
 * Thread-safe (no shared state). Path building is pure; the other functions block on the file
 * system and say so.
 */
#ifndef SL_STORE_LAYOUT_H
#define SL_STORE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

/* The kinds of file in a job directory. */
typedef enum sl_store_kind {
    SL_STORE_OTHER = 0, /* not a checkpoint file: left alone */
    SL_STORE_SHARD,     /* <name>_shard_<rank>.shard */
    SL_STORE_PART,      /* .<name>_shard_<rank>.shard.part */
    SL_STORE_META,      /* <name>.metadata.json */
    SL_STORE_TEMP, /* any other file whose name starts with '.' (e.g. metadata being written) */
} sl_store_kind;

/* "<root>/<job>" into buf. Returns 0 or SL_ELIMIT. */
int sl_store_job_dir(char *buf, size_t len, const char *root, const char *job);

/* The file name (no directory) of checkpoint `name`'s file of `kind`, as sl_store_path. Returns 0,
 * SL_ELIMIT or SL_EINVAL. Pure. */
int sl_store_file_name(char *file, size_t len, sl_store_kind kind, const char *name, int32_t rank);

/* The path of checkpoint `name`'s file of `kind` (SHARD, PART, META; TEMP is the metadata temp
 * file) in job directory `dir`; `rank` is used by SHARD and PART only. Returns 0, SL_ELIMIT if the
 * file name or the path is too long, SL_EINVAL for SL_STORE_OTHER. */
int sl_store_path(char *buf, size_t len, const char *dir, sl_store_kind kind, const char *name,
                  int32_t rank);

/* Classify a file name found in a job directory. For SHARD and PART, `name` (len bytes) receives
 * the checkpoint name and *rank the rank (0..SL_SHARD_MAX_RANK); for META the checkpoint name.
 * Names are returned as found: the caller checks them before use. A name that does not fit in
 * `name` makes the file SL_STORE_OTHER (or SL_STORE_TEMP if it starts with '.'). Pure. */
sl_store_kind sl_store_classify(const char *file, char *name, size_t len, int32_t *rank);

/* The partial upload's file name of attempt `gen` (0: the one name of a catalog of one daemon,
 * as sl_store_file_name's SL_STORE_PART). Returns 0 or SL_ELIMIT. Pure. */
int sl_store_part_name(char *file, size_t len, const char *name, int32_t rank, int64_t gen);

/* sl_store_classify, with a partial upload's generation into *gen (0 for anything else). */
sl_store_kind sl_store_classify_gen(const char *file, char *name, size_t len, int32_t *rank,
                                    int64_t *gen);

/* Every partial upload of checkpoint `name` in job directory `dir`, of rank `rank` (rank < 0:
 * of every rank below -rank), whatever its generation, to fn with its path; fn returns nonzero to
 * stop, which is returned. A missing directory has none. Returns 0 or -errno. Blocking. */
typedef int (*sl_store_part_fn)(const char *path, int32_t rank, int64_t gen, void *arg);
int sl_store_parts_each(const char *dir, const char *name, int32_t rank, sl_store_part_fn fn,
                        void *arg);

/* Remove every file of checkpoint `name` in job directory `dir`: the shards and partial uploads
 * of ranks [0, world_size), the metadata file and its temp file; missing files are skipped. Then
 * fsync the directory. Returns 0 or the -errno of the fsync (-ENOENT if `dir` does not exist);
 * failed removals are left for the caller's sweeps. Blocking. */
int sl_store_remove_ckpt(const char *dir, const char *name, int32_t world_size);

/* How many data bytes the partial upload at `path` holds for `rank`: the file's size past the
 * header, at most the data length its header declares. Returns 0 and *held, or SL_ENOTFOUND if
 * there is no such file or its header does not parse or names another rank. Blocking. */
int sl_store_part_held(const char *path, int32_t rank, uint64_t *held);

#endif
