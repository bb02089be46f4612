#include "keys.h"

#include "../err.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* FNV-1a: keys are short names, a few per daemon; any spread will do. */
static size_t bucket_of(const char *name)
{
    uint32_t h = 2166136261u;

    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 16777619u;
    }
    return h % SL_RPC_KEY_BUCKETS;
}

static sl_rpc_key *find(const sl_rpc_keys *k, const char *name)
{
    for (sl_rpc_key *e = k->buckets[bucket_of(name)]; e; e = e->next)
        if (strcmp(e->name, name) == 0)
            return e;
    return NULL;
}

int sl_rpc_keys_acquire(sl_rpc_keys *k, sl_rpc_key **out, const char *name, size_t limit)
{
    sl_rpc_key *e = find(k, name);
    size_t len;

    *out = NULL;
    if (e) {
        if (limit && e->count >= limit)
            return SL_ELIMIT;
        e->count++;
        *out = e;
        return 0;
    }
    len = strlen(name);
    e = malloc(sizeof(*e) + len + 1);
    if (!e)
        return -ENOMEM;
    memcpy(e->name, name, len + 1);
    e->count = 1;
    e->next = k->buckets[bucket_of(name)];
    k->buckets[bucket_of(name)] = e;
    *out = e;
    return 0;
}

void sl_rpc_keys_release(sl_rpc_keys *k, sl_rpc_key *key)
{
    sl_rpc_key **pp;

    if (!key || --key->count > 0)
        return;
    for (pp = &k->buckets[bucket_of(key->name)]; *pp; pp = &(*pp)->next) {
        if (*pp == key) {
            *pp = key->next;
            break;
        }
    }
    free(key);
}

size_t sl_rpc_keys_count(const sl_rpc_keys *k, const char *name)
{
    const sl_rpc_key *e = find(k, name);

    return e ? e->count : 0;
}

void sl_rpc_keys_clear(sl_rpc_keys *k)
{
    for (size_t i = 0; i < SL_RPC_KEY_BUCKETS; i++) {
        while (k->buckets[i]) {
            sl_rpc_key *e = k->buckets[i];
            k->buckets[i] = e->next;
            free(e);
        }
    }
}
