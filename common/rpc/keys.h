/* Per-key call counts for sl_rpc_call_claim: how many calls are open under each key (a job
 * name), so a limit can refuse one more. Private to common/rpc/. Loop thread only. */
#ifndef SL_RPC_KEYS_H
#define SL_RPC_KEYS_H

#include <stddef.h>

#define SL_RPC_KEY_BUCKETS 256

/* One key with at least one call counted under it. */
typedef struct sl_rpc_key {
    struct sl_rpc_key *next;
    size_t count;
    char name[];
} sl_rpc_key;

/* The table; zero-initialised is empty. */
typedef struct sl_rpc_keys {
    sl_rpc_key *buckets[SL_RPC_KEY_BUCKETS];
} sl_rpc_keys;

/* Count one more call under `name`, unless `limit` (0: none) calls already are. Returns 0 and
 * *out (release it with sl_rpc_keys_release), SL_ELIMIT when the key is at the limit, or
 * -ENOMEM. */
int sl_rpc_keys_acquire(sl_rpc_keys *k, sl_rpc_key **out, const char *name, size_t limit);

/* Count one call less under the key; the entry is freed when its count reaches 0. Accepts NULL. */
void sl_rpc_keys_release(sl_rpc_keys *k, sl_rpc_key *key);

/* Calls counted under `name` (0 if none). */
size_t sl_rpc_keys_count(const sl_rpc_keys *k, const char *name);

/* Free every entry (the server is going away). */
void sl_rpc_keys_clear(sl_rpc_keys *k);

#endif
