/* Per-key call counts: how many calls are open under each key (a job name for
 * sl_rpc_call_claim, a peer address for max_peer_calls), so a limit can refuse one more; and the
 * two ways of turning what a client sent into such a key or into text fit for a log line.
 * Private to common/rpc/. A table is not thread-safe (the loop owns the claims' table, a mutex
 * guards the peers'); the text functions are. */
#ifndef SL_RPC_KEYS_H
#define SL_RPC_KEYS_H

#include <pthread.h>
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

/* Room for a peer key, NUL included. */
#define SL_RPC_PEER_KEY_MAX 80

/* The address calls are counted under for a gRPC peer string: the port is dropped
 * ("ipv4:10.0.0.7:5555" -> "ipv4:10.0.0.7") and an IPv6 address is cut to its /64
 * ("ipv6:[2001:db8:1:2:3::4]:5555" -> "ipv6:[2001:db8:1:2::]/64"), since one host commonly holds
 * a whole /64. Anything else is kept as it is, cut to fit. Thread-safe. */
void sl_rpc_peer_key(char *dst, size_t len, const char *peer);

/* Room for a cleaned text, NUL included. */
#define SL_RPC_TEXT_MAX 132

/* Copy n bytes a client chose (a method path) into dst for status messages and logs: every byte
 * outside printable ASCII, and '"' and '\\', becomes '?'; a text that does not fit in len - 1
 * bytes is cut and ends in "...". Thread-safe. */
void sl_rpc_text_clean(char *dst, size_t len, const char *src, size_t n);

/* Connections that reset calls faster than any client has a reason to (HTTP/2 rapid reset): a
 * table of reset counts per connection (its full peer string, port included) over one-second
 * windows. Approximate by design: a fixed number of slots, a colliding connection takes the slot
 * over. Guarded by its own mutex: initialise with sl_rpc_resets_init. */
#define SL_RPC_RESET_SLOTS 256

typedef struct sl_rpc_resets {
    pthread_mutex_t mu;
    struct {
        char peer[SL_RPC_PEER_KEY_MAX];
        unsigned long long window_ms;
        unsigned count;
    } slot[SL_RPC_RESET_SLOTS];
} sl_rpc_resets;

void sl_rpc_resets_init(sl_rpc_resets *r);
void sl_rpc_resets_destroy(sl_rpc_resets *r);

/* Count one reset of `peer` at `now_ms`. Returns 1 when this makes `limit` within the current
 * one-second window (once per window: the caller cuts the connection), else 0. Thread-safe. */
int sl_rpc_resets_add(sl_rpc_resets *r, const char *peer, unsigned long long now_ms,
                      unsigned limit);

/* Addresses (peer keys) refused for a while: a connection that flooded the server gets its
 * address blocked, so that reconnecting at once does not start the flood over. A fixed number of
 * entries; when full, the one that expires first is replaced. Thread-safe (own mutex). */
#define SL_RPC_BAN_SLOTS 64

typedef struct sl_rpc_bans {
    pthread_mutex_t mu;
    unsigned gen; /* bumped by every sl_rpc_bans_add */
    struct {
        char key[SL_RPC_PEER_KEY_MAX];
        unsigned long long until_ms;
    } slot[SL_RPC_BAN_SLOTS];
} sl_rpc_bans;

void sl_rpc_bans_init(sl_rpc_bans *b);
void sl_rpc_bans_destroy(sl_rpc_bans *b);

/* Block `key` until `until_ms`. Bumps the table's generation. */
void sl_rpc_bans_add(sl_rpc_bans *b, const char *key, unsigned long long until_ms);

/* 1 if `key` is blocked at `now_ms`. */
int sl_rpc_bans_check(sl_rpc_bans *b, const char *key, unsigned long long now_ms);

/* The table's generation. */
unsigned sl_rpc_bans_gen(sl_rpc_bans *b);

/* Copy the keys blocked at `now_ms` into keys (room for SL_RPC_BAN_SLOTS). Returns how many, and
 * in *gen the generation and in *next_ms when the first of them expires. */
int sl_rpc_bans_active(sl_rpc_bans *b, char (*keys)[SL_RPC_PEER_KEY_MAX], unsigned long long now_ms,
                       unsigned *gen, unsigned long long *next_ms);

/* Attach to this process's listening sockets of `port` a socket filter that drops every packet
 * from the n addresses (peer keys: "ipv4:a.b.c.d", "ipv6:[p::]/64"), in the kernel, before a
 * connection is even set up: a blocked client's SYNs go unanswered. n == 0 detaches the filter.
 * Connections accepted before keep the filter they were accepted with. Returns the number of
 * sockets set, or -errno. */
int sl_rpc_listener_filter(int port, char (*keys)[SL_RPC_PEER_KEY_MAX], int n);

/* Reset the TCP connection of this process whose local port is `port` and whose remote address
 * is the gRPC peer string `peer` ("ipv4:a.b.c.d:p", "ipv6:[..]:p"). The fd stays open: its owner
 * (the gRPC core) sees the connection end and closes it, cancelling its calls. Returns 0,
 * SL_ENOTFOUND if no such connection, SL_EINVAL for a peer that is not an IP address. Thread-safe;
 * scans /proc/self/fd. */
int sl_rpc_conn_shutdown(const char *peer, int port);

/* Reset every TCP connection on local `port` from the address of peer key `key` (as made by
 * sl_rpc_peer_key). Returns how many, or -errno. Thread-safe; scans /proc/self/fd. */
int sl_rpc_conn_shutdown_key(const char *key, int port);

#endif
