#include "keys.h"

#include "../err.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
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

/* The IPv6 address inside "[...]" or "%5B...%5D" (gRPC escapes the brackets in some versions)
 * at p, without a zone id, into host. Returns 0 or -1. */
static int bracketed(char *host, size_t len, const char *p)
{
    size_t open = p[0] == '['                                                ? 1
                  : (strncmp(p, "%5B", 3) == 0 || strncmp(p, "%5b", 3) == 0) ? 3
                                                                             : 0;
    size_t n = 0;

    if (!open)
        return -1;
    p += open;
    while (p[n] && p[n] != ']' && p[n] != '%')
        n++;
    if (n == 0 || n >= len)
        return -1;
    memcpy(host, p, n);
    host[n] = '\0';
    return 0;
}

void sl_rpc_peer_key(char *dst, size_t len, const char *peer)
{
    const char *colon = strrchr(peer, ':');
    char host[INET6_ADDRSTRLEN];
    struct in6_addr a;

    if (strncmp(peer, "ipv4:", 5) == 0 && colon > peer + 5) {
        snprintf(dst, len, "%.*s", (int)(colon - peer), peer);
        return;
    }
    if (strncmp(peer, "ipv6:", 5) == 0 && bracketed(host, sizeof(host), peer + 5) == 0 &&
        inet_pton(AF_INET6, host, &a) == 1) {
        if (IN6_IS_ADDR_V4MAPPED(&a)) {
            snprintf(dst, len, "ipv4:%u.%u.%u.%u", a.s6_addr[12], a.s6_addr[13], a.s6_addr[14],
                     a.s6_addr[15]);
            return;
        }
        memset(a.s6_addr + 8, 0, 8);
        if (inet_ntop(AF_INET6, &a, host, sizeof(host))) {
            snprintf(dst, len, "ipv6:[%s]/64", host);
            return;
        }
    }
    snprintf(dst, len, "%s", peer);
}

void sl_rpc_text_clean(char *dst, size_t len, const char *src, size_t n)
{
    size_t keep = n;

    if (len == 0)
        return;
    if (n > len - 1)
        keep = len > 4 ? len - 4 : 0;
    for (size_t i = 0; i < keep; i++) {
        unsigned char ch = (unsigned char)src[i];
        dst[i] = ch < 0x20 || ch > 0x7e || ch == '"' || ch == '\\' ? '?' : (char)ch;
    }
    if (keep < n)
        memcpy(dst + keep, "...", len > 4 ? 3 : 0);
    dst[keep < n && len > 4 ? keep + 3 : keep] = '\0';
}

void sl_rpc_resets_init(sl_rpc_resets *r)
{
    memset(r->slot, 0, sizeof(r->slot));
    pthread_mutex_init(&r->mu, NULL);
}

void sl_rpc_resets_destroy(sl_rpc_resets *r)
{
    pthread_mutex_destroy(&r->mu);
}

int sl_rpc_resets_add(sl_rpc_resets *r, const char *peer, unsigned long long now_ms, unsigned limit)
{
    uint32_t h = 2166136261u;
    int hit = 0;

    for (const unsigned char *p = (const unsigned char *)peer; *p; p++) {
        h ^= *p;
        h *= 16777619u;
    }
    h %= SL_RPC_RESET_SLOTS;
    pthread_mutex_lock(&r->mu);
    if (strncmp(r->slot[h].peer, peer, sizeof(r->slot[h].peer)) != 0 ||
        now_ms - r->slot[h].window_ms >= 1000) {
        snprintf(r->slot[h].peer, sizeof(r->slot[h].peer), "%s", peer);
        r->slot[h].window_ms = now_ms;
        r->slot[h].count = 0;
    }
    hit = ++r->slot[h].count == limit;
    pthread_mutex_unlock(&r->mu);
    return hit;
}

/* The address and port of a gRPC peer string, as a socket address. Returns 0 or -1. */
static int peer_sockaddr(struct sockaddr_storage *ss, const char *peer)
{
    const char *colon = strrchr(peer, ':');
    char host[INET6_ADDRSTRLEN];
    long port;

    memset(ss, 0, sizeof(*ss));
    if (!colon || (port = strtol(colon + 1, NULL, 10)) <= 0 || port > 65535)
        return -1;
    if (strncmp(peer, "ipv4:", 5) == 0) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
        if ((size_t)(colon - peer - 5) >= sizeof(host))
            return -1;
        snprintf(host, sizeof(host), "%.*s", (int)(colon - peer - 5), peer + 5);
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        return inet_pton(AF_INET, host, &s4->sin_addr) == 1 ? 0 : -1;
    }
    if (strncmp(peer, "ipv6:", 5) == 0 && bracketed(host, sizeof(host), peer + 5) == 0) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        return inet_pton(AF_INET6, host, &s6->sin6_addr) == 1 ? 0 : -1;
    }
    return -1;
}

static int local_port(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)ss)->sin_port);
    if (ss->ss_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
    return -1;
}

/* 1 if a and b are the same address and port (an IPv4 peer may show as IPv4-mapped IPv6). */
static int same_peer(const struct sockaddr_storage *a, const struct sockaddr_storage *want)
{
    if (a->ss_family == AF_INET && want->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)want;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    if (a->ss_family == AF_INET6 && want->ss_family == AF_INET6) {
        const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)want;
        return x->sin6_port == y->sin6_port &&
               memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr)) == 0;
    }
    if (a->ss_family == AF_INET6 && want->ss_family == AF_INET) {
        const struct sockaddr_in6 *x = (const void *)a;
        const struct sockaddr_in *y = (const void *)want;
        return x->sin6_port == y->sin_port && IN6_IS_ADDR_V4MAPPED(&x->sin6_addr) &&
               memcmp(x->sin6_addr.s6_addr + 12, &y->sin_addr, 4) == 0;
    }
    return 0;
}

/* Call fn(fd, peer address, arg) for every connected socket of this process whose local port is
 * `port`: fn returns 0 (not this one), 1 (done with it) or 2 (done, stop). Returns how many were
 * done with, or -errno if /proc/self/fd cannot be read. */
static int each_conn(int port, int (*fn)(int fd, const struct sockaddr_storage *peer, void *arg),
                     void *arg)
{
    DIR *dir = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    if (!dir)
        return -errno;
    while ((e = readdir(dir)) != NULL) {
        struct sockaddr_storage local, peer;
        socklen_t len = sizeof(local);
        struct stat st;
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        int r;
        if (*end || end == e->d_name || fd == dirfd(dir))
            continue;
        if (fstat((int)fd, &st) != 0 || !S_ISSOCK(st.st_mode))
            continue;
        if (getsockname((int)fd, (struct sockaddr *)&local, &len) != 0 ||
            local_port(&local) != port)
            continue;
        len = sizeof(peer);
        if (getpeername((int)fd, (struct sockaddr *)&peer, &len) != 0)
            continue; /* the listener itself */
        r = fn((int)fd, &peer, arg);
        n += r > 0;
        if (r > 1)
            break;
    }
    closedir(dir);
    return n;
}

/* End a TCP connection whose fd belongs to someone else: connect() to AF_UNSPEC disconnects the
 * socket (the kernel resets the connection and drops what it had queued, so the peer cannot keep
 * the reader busy; shutdown() would leave the queued bytes readable), and the owner's next read
 * fails, so it closes the fd as for any connection the peer reset. */
static void disconnect(int fd)
{
    struct sockaddr sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_family = AF_UNSPEC;
    if (connect(fd, &sa, sizeof(sa)) != 0)
        shutdown(fd, SHUT_RDWR);
}

static int cut_peer(int fd, const struct sockaddr_storage *peer, void *arg)
{
    if (!same_peer(peer, arg))
        return 0;
    disconnect(fd);
    return 2;
}

static int cut_addr(int fd, const struct sockaddr_storage *peer, void *arg)
{
    char text[INET6_ADDRSTRLEN + 16], key[SL_RPC_PEER_KEY_MAX], host[INET6_ADDRSTRLEN];

    if (peer->ss_family == AF_INET) {
        inet_ntop(AF_INET, &((const struct sockaddr_in *)peer)->sin_addr, host, sizeof(host));
        snprintf(text, sizeof(text), "ipv4:%s:0", host);
    } else if (peer->ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)peer)->sin6_addr, host, sizeof(host));
        snprintf(text, sizeof(text), "ipv6:[%s]:0", host);
    } else {
        return 0;
    }
    sl_rpc_peer_key(key, sizeof(key), text);
    if (strcmp(key, arg) != 0)
        return 0;
    disconnect(fd);
    return 1;
}

int sl_rpc_conn_shutdown_key(const char *key, int port)
{
    return each_conn(port, cut_addr, (void *)key);
}

int sl_rpc_conn_shutdown(const char *peer, int port)
{
    struct sockaddr_storage want;
    int n;

    if (peer_sockaddr(&want, peer) != 0)
        return SL_EINVAL;
    n = each_conn(port, cut_peer, &want);
    return n < 0 ? n : n == 0 ? SL_ENOTFOUND : 0;
}

void sl_rpc_bans_init(sl_rpc_bans *b)
{
    memset(b->slot, 0, sizeof(b->slot));
    b->gen = 0;
    pthread_mutex_init(&b->mu, NULL);
}

void sl_rpc_bans_destroy(sl_rpc_bans *b)
{
    pthread_mutex_destroy(&b->mu);
}

void sl_rpc_bans_add(sl_rpc_bans *b, const char *key, unsigned long long until_ms)
{
    size_t pick = 0;

    pthread_mutex_lock(&b->mu);
    for (size_t i = 0; i < SL_RPC_BAN_SLOTS; i++) {
        if (strcmp(b->slot[i].key, key) == 0) {
            pick = i;
            break;
        }
        if (b->slot[i].until_ms < b->slot[pick].until_ms)
            pick = i;
    }
    snprintf(b->slot[pick].key, sizeof(b->slot[pick].key), "%s", key);
    if (b->slot[pick].until_ms < until_ms)
        b->slot[pick].until_ms = until_ms;
    b->gen++;
    pthread_mutex_unlock(&b->mu);
}

int sl_rpc_bans_check(sl_rpc_bans *b, const char *key, unsigned long long now_ms)
{
    int hit = 0;

    pthread_mutex_lock(&b->mu);
    for (size_t i = 0; i < SL_RPC_BAN_SLOTS && !hit; i++)
        hit = b->slot[i].until_ms > now_ms && strcmp(b->slot[i].key, key) == 0;
    pthread_mutex_unlock(&b->mu);
    return hit;
}

unsigned sl_rpc_bans_gen(sl_rpc_bans *b)
{
    unsigned gen;

    pthread_mutex_lock(&b->mu);
    gen = b->gen;
    pthread_mutex_unlock(&b->mu);
    return gen;
}

int sl_rpc_bans_active(sl_rpc_bans *b, char (*keys)[SL_RPC_PEER_KEY_MAX], unsigned long long now_ms,
                       unsigned *gen, unsigned long long *next_ms)
{
    int n = 0;

    *next_ms = ~0ULL;
    pthread_mutex_lock(&b->mu);
    for (size_t i = 0; i < SL_RPC_BAN_SLOTS; i++) {
        if (b->slot[i].until_ms <= now_ms)
            continue;
        memcpy(keys[n++], b->slot[i].key, SL_RPC_PEER_KEY_MAX);
        if (b->slot[i].until_ms < *next_ms)
            *next_ms = b->slot[i].until_ms;
    }
    *gen = b->gen;
    pthread_mutex_unlock(&b->mu);
    return n;
}

/* Classic BPF, run by the kernel on every packet for the socket; offsets from SKF_NET_OFF reach
 * the IP header. IPv4 source in the list -> drop; IPv6 source whose first 64 bits are in the
 * list -> drop; anything else -> accept:
 *
 *   0 ldb [net+0]; 1 rsh #4; 2 jeq #4 ? 3 : v6
 *   3 ld [net+12]; jeq ip_i ? drop : next ...; ret accept
 *   v6: jeq #6 ? next : accept2; (ld [net+8]; jeq hi ? next : +2; ld [net+12]; jeq lo ? drop)...
 *   accept2: ret accept; drop: ret 0
 *
 * Jump offsets are 8 bits: the lists are cut to fit. Returns the length. */
static int listener_program(struct sock_filter *prog, char (*keys)[SL_RPC_PEER_KEY_MAX], int n)
{
    uint32_t v4[SL_RPC_BAN_SLOTS], v6[SL_RPC_BAN_SLOTS][2];
    size_t n4 = 0, n6 = 0, k = 0, v6_at, accept2, drop;

    for (int i = 0; i < n && n4 + 4 * n6 < 240; i++) {
        char host[INET6_ADDRSTRLEN];
        struct in6_addr a6;
        struct in_addr a4;
        if (strncmp(keys[i], "ipv4:", 5) == 0 && inet_pton(AF_INET, keys[i] + 5, &a4) == 1) {
            v4[n4++] = ntohl(a4.s_addr);
        } else if (strncmp(keys[i], "ipv6:", 5) == 0 &&
                   bracketed(host, sizeof(host), keys[i] + 5) == 0 &&
                   inet_pton(AF_INET6, host, &a6) == 1) {
            v6[n6][0] = (uint32_t)a6.s6_addr[0] << 24 | (uint32_t)a6.s6_addr[1] << 16 |
                        (uint32_t)a6.s6_addr[2] << 8 | a6.s6_addr[3];
            v6[n6][1] = (uint32_t)a6.s6_addr[4] << 24 | (uint32_t)a6.s6_addr[5] << 16 |
                        (uint32_t)a6.s6_addr[6] << 8 | a6.s6_addr[7];
            n6++;
        }
    }
    v6_at = 5 + n4;
    accept2 = v6_at + 1 + 4 * n6;
    drop = accept2 + 1;
    prog[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_B | BPF_ABS, SKF_NET_OFF);
    prog[k++] = (struct sock_filter)BPF_STMT(BPF_ALU | BPF_RSH | BPF_K, 4);
    prog[k] =
        (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 4, 0, (uint8_t)(v6_at - k - 1));
    k++;
    prog[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, SKF_NET_OFF + 12);
    for (size_t i = 0; i < n4; i++, k++)
        prog[k] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, v4[i],
                                               (uint8_t)(drop - k - 1), 0);
    prog[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, 0xffffffffu);
    prog[k] =
        (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 6, 0, (uint8_t)(accept2 - k - 1));
    k++;
    for (size_t i = 0; i < n6; i++) {
        prog[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, SKF_NET_OFF + 8);
        prog[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, v6[i][0], 0, 2);
        prog[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, SKF_NET_OFF + 12);
        prog[k] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, v6[i][1],
                                               (uint8_t)(drop - k - 1), 0);
        k++;
    }
    prog[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, 0xffffffffu);
    prog[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, 0);
    return (int)k;
}

/* Call fn(fd, arg) for every listening socket of this process on local `port`. Returns how many
 * calls returned 0, or -errno. */
static int each_listener(int port, int (*fn)(int fd, void *arg), void *arg)
{
    DIR *dir = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    if (!dir)
        return -errno;
    while ((e = readdir(dir)) != NULL) {
        struct sockaddr_storage local;
        socklen_t len = sizeof(local);
        struct stat st;
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        int listening = 0;
        if (*end || end == e->d_name || fd == dirfd(dir))
            continue;
        if (fstat((int)fd, &st) != 0 || !S_ISSOCK(st.st_mode))
            continue;
        if (getsockname((int)fd, (struct sockaddr *)&local, &len) != 0 ||
            local_port(&local) != port)
            continue;
        len = sizeof(listening);
        if (getsockopt((int)fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening)
            continue;
        n += fn((int)fd, arg) == 0;
    }
    closedir(dir);
    return n;
}

static int set_filter(int fd, void *arg)
{
    const struct sock_fprog *prog = arg;
    int zero = 0;

    if (!prog)
        return setsockopt(fd, SOL_SOCKET, SO_DETACH_FILTER, &zero, sizeof(zero)) == 0 ||
                       errno == ENOENT
                   ? 0
                   : -1;
    return setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, prog, sizeof(*prog));
}

int sl_rpc_listener_filter(int port, char (*keys)[SL_RPC_PEER_KEY_MAX], int n)
{
    struct sock_filter prog[8 + 240 + 8];
    struct sock_fprog fprog;

    if (n <= 0)
        return each_listener(port, set_filter, NULL);
    fprog.len = (unsigned short)listener_program(prog, keys, n);
    fprog.filter = prog;
    return each_listener(port, set_filter, &fprog);
}
