/* Validation of sluice.v1.Checkpoints requests: the checks that need neither the catalog nor the
 * disk, shared by the service, its unit test (tests/unit/ckpt_validate_test.c) and the fuzz target
 * (tests/fuzz/fuzz_ckpt_rpc.c).
 *
 * Every function is pure and thread-safe. Each returns 0, or a negative code with `msg` (len
 * bytes, 512 are enough for every message) saying what was wrong and with which value; the
 * service answers the call with that code and message (INVALID_ARGUMENT for SL_EINVAL,
 * RESOURCE_EXHAUSTED for SL_ELIMIT).
 */
#ifndef SL_CKPT_VALIDATE_H
#define SL_CKPT_VALIDATE_H

#include "sluice/v1/checkpoint.pb-c.h"

#include <stddef.h>
#include <stdint.h>

#define SL_CKPT_MAX_WORLD       65536      /* ranks per checkpoint */
#define SL_CKPT_MAX_CHUNK       (4u << 20) /* data bytes per upload message */
#define SL_CKPT_MAX_TENSORS     65536      /* tensors per shard */
#define SL_CKPT_MAX_TENSOR_NAME 1024       /* bytes of a tensor name */
#define SL_CKPT_MAX_DIMS        32         /* dimensions of a tensor */

/* Job name (always) and checkpoint name (unless NULL): sl_shard_name_check. Returns 0 or
 * SL_EINVAL. */
int sl_ckpt_check_names(const char *job, const char *name, char *msg, size_t len);

/* A rank of a checkpoint of `world_size` ranks: [0, world_size). Returns 0 or SL_EINVAL. */
int sl_ckpt_check_rank(int32_t rank, int32_t world_size, char *msg, size_t len);

/* A Begin request: names, step (at most INT64_MAX), world size [1, SL_CKPT_MAX_WORLD], user
 * metadata (at most SL_CAT_USER_MD_MAX bytes of UTF-8, sl_utf8_check). The checkpoint's name goes
 * to `name` (name_len > SL_SHARD_NAME_MAX): the request's, or "step_<step>" when it has none.
 * Returns 0 or SL_EINVAL. */
int sl_ckpt_check_begin(const Sluice__V1__BeginRequest *req, char *name, size_t name_len, char *msg,
                        size_t len);

/* An UploadShard header for a checkpoint of `world_size` ranks, once its names were checked:
 * rank, data size (a valid file size, at most max_shard_bytes), resume offset (at most the data
 * size), client checksum (empty or 64 lowercase hex digits) and tensor list
 * (sl_ckpt_check_tensors). Returns 0 and *tensors_json (caller frees), SL_EINVAL, SL_ELIMIT
 * (data size over max_shard_bytes) or -ENOMEM (msg empty). */
int sl_ckpt_check_header(const Sluice__V1__ShardHeader *h, int32_t world_size,
                         uint64_t max_shard_bytes, char **tensors_json, char *msg, size_t len);

/* A shard's tensor list against its data size: at most SL_CKPT_MAX_TENSORS tensors; names of 1 to
 * SL_CKPT_MAX_TENSOR_NAME printable ASCII characters; known dtypes; at most SL_CKPT_MAX_DIMS
 * dimensions, each >= 0; size = product of the shape x dtype size, without overflow; bytes inside
 * [0, data_size) and no two non-empty tensors overlapping. Renders the list as the JSON array the
 * catalog and metadata.json store. Returns 0 and *json (caller frees), SL_EINVAL, or -ENOMEM (msg
 * untouched). */
int sl_ckpt_check_tensors(char **json, Sluice__V1__TensorInfo *const *t, size_t n,
                          uint64_t data_size, char *msg, size_t len);

#endif
