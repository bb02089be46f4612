/* The flood guard: a connection that resets calls before their request, ends them without one
 * or calls unknown methods by the hundreds within a second, or has a backlog of calls waiting
 * for their first message, is cut with every other connection from its address, and the address
 * is refused for a while: calls from it are dropped, and a kernel filter on the listening socket
 * drops its packets. The counts, bans and socket operations are in keys.c.
 */
#include "server_internal.h"

#include "../log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A connection that, within a second, resets this many calls before their request, ends them
 * without one or calls unknown methods is cut (HTTP/2 rapid reset and its kin): no client has a
 * reason to, and gRPC 1.51 has no limit of its own. */
#define RESET_FLOOD 500

/* The address of a connection cut for a flood is refused this long: a kernel filter on the
 * listening socket drops its packets, and a call from it that was parsed already is dropped. */
#define BAN_MS 10000

/* Every GUARD_TICK_MS the loop looks for connections with BACKLOG_CALLS calls that arrived
 * BACKLOG_MS ago or earlier and still wait for their first message. */
#define BACKLOG_CALLS 1024
#define BACKLOG_MS    200

/* Close the connection of `peer`, which flooded the server (`why`), and refuse its address for
 * BAN_MS. Any thread. */
static void cut_connection(sl_rpc_server *srv, const char *peer, const char *why)
{
    char key[SL_RPC_PEER_KEY_MAX];
    int n;

    sl_rpc_peer_key(key, sizeof(key), peer);
    if (sl_rpc_bans_check(&srv->bans, key, now_us() / 1000))
        return; /* already cut, with every connection from its address */
    sl_rpc_bans_add(&srv->bans, key, now_us() / 1000 + BAN_MS);
    n = sl_rpc_conn_shutdown_key(key, srv->port);
    atomic_fetch_add(&srv->n_cut, 1);
    sl_log_limited(SL_LOG_WARN, 1000, "rpc_flood",
                   "peer=%s reason=\"%s\" action=close_connections closed=%d blocked=%s "
                   "blocked_s=%d",
                   peer, why, n, key, BAN_MS / 1000);
}

/* Count a call of `peer` that did nothing but cost: reset before its request, ended without
 * one, or to an unknown method. RESET_FLOOD of them within a second cut the connection. */
void srv_junk(sl_rpc_server *srv, const char *peer)
{
    if (peer && sl_rpc_resets_add(&srv->resets, peer, now_us() / 1000, RESET_FLOOD))
        cut_connection(srv, peer,
                       "500 calls reset, without a request or to unknown methods "
                       "within a second");
}

/* 1 if the call comes from a blocked address: it is then dropped, and its connection closed
 * (once a second at most). Completion-queue thread. */
int srv_blocked(sl_rpc_server *srv, grpc_call *call, const char *peer)
{
    char key[SL_RPC_PEER_KEY_MAX];
    uint64_t now_ms = now_us() / 1000;

    if (!peer)
        return 0;
    sl_rpc_peer_key(key, sizeof(key), peer);
    if (!sl_rpc_bans_check(&srv->bans, key, now_ms))
        return 0;
    atomic_fetch_add(&srv->n_banned, 1);
    if (sl_rpc_resets_add(&srv->cuts, peer, now_ms, 1))
        sl_rpc_conn_shutdown(peer, srv->port);
    /* No status: the connection is going away, and an answer would only cost more work. */
    grpc_call_unref(call);
    return 1;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Cut the connections with BACKLOG_CALLS or more calls that arrived BACKLOG_MS ago or earlier
 * and still wait for their first message. A client sends a call's request right behind its
 * headers, so such a backlog means the core cannot deliver what the connection sends: a reset
 * flood it is still parsing. Returns how many connections were cut. */
static int cut_backlogged_peers(sl_rpc_server *srv, uint64_t now_us_)
{
    char(*cut)[SL_RPC_PEER_KEY_MAX] = NULL;
    const char **peers = NULL;
    size_t n = 0, n_cut = 0, cap = 0;

    pthread_mutex_lock(&srv->pf_mu);
    for (sl_rpc_call *c = srv->prefetch; c; c = c->pf_next) {
        if (!c->peer || now_us_ - c->arrived_us < (uint64_t)BACKLOG_MS * 1000u)
            continue;
        if (n == cap) {
            const char **p = realloc(peers, (cap = cap ? cap * 2 : 256) * sizeof(*p));
            if (!p)
                break;
            peers = p;
        }
        peers[n++] = c->peer;
    }
    if (n >= BACKLOG_CALLS) {
        qsort(peers, n, sizeof(*peers), cmp_str);
        cut = malloc((n / BACKLOG_CALLS) * sizeof(*cut));
        for (size_t i = 0, j; cut && i < n; i = j) {
            for (j = i; j < n && strcmp(peers[i], peers[j]) == 0; j++) {
            }
            if (j - i >= BACKLOG_CALLS)
                snprintf(cut[n_cut++], sizeof(cut[0]), "%s", peers[i]);
        }
    }
    pthread_mutex_unlock(&srv->pf_mu);
    for (size_t i = 0; i < n_cut; i++)
        cut_connection(srv, cut[i], "calls waiting for their first message");
    free(cut);
    free(peers);
    return (int)n_cut;
}

/* Keep the listener's kernel filter in step with the blocked addresses: rebuilt when one is
 * added or the first of them expires. */
static void refresh_filter(sl_rpc_server *srv, uint64_t now_ms)
{
    char keys[SL_RPC_BAN_SLOTS][SL_RPC_PEER_KEY_MAX];
    unsigned long long next;
    unsigned gen;
    int n;

    if (srv->filter_gen == sl_rpc_bans_gen(&srv->bans) && now_ms < srv->filter_next_ms)
        return;
    n = sl_rpc_bans_active(&srv->bans, keys, now_ms, &gen, &next);
    if (n == 0 && srv->filter_n == 0) {
        srv->filter_gen = gen;
        srv->filter_next_ms = next;
        return;
    }
    if (sl_rpc_listener_filter(srv->port, keys, n) <= 0)
        sl_log_limited(SL_LOG_WARN, 60000, "rpc_filter_failed", "blocked=%d", n);
    else
        sl_log_info("rpc_blocked_addresses", "count=%d", n);
    srv->filter_gen = gen;
    srv->filter_next_ms = next;
    srv->filter_n = n;
}

void srv_on_guard(uv_timer_t *t)
{
    sl_rpc_server *srv = t->data;
    uint64_t now = now_us();

    if (srv->cq_shut)
        return;
    cut_backlogged_peers(srv, now);
    refresh_filter(srv, now / 1000u);
}
