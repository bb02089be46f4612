/* libsluice: the daemon's replicas. A client is given one address or a comma-separated list of
 * them ("h1:7700,h2:7700,h3:7700"); it opens one channel per address and sends every call to the
 * current replica. When a call ends UNAVAILABLE (connection refused or reset, the replica killed,
 * or a replica answering that it cannot reach the catalog), the next replica of the list becomes
 * the current one and the call is tried there: each replica at most once per call.
 *
 * Why one channel per address and not gRPC's own multi-address channel ("ipv4:h1:p1,h2:p2" with
 * the pick_first or round_robin policy): the balancer only sees connections. A replica that is up
 * but answers UNAVAILABLE ("catalog server unreachable") keeps a READY connection, so pick_first
 * would send every new call to it again and again, and round_robin would send it every n-th call.
 * A call that was running on a replica that dies fails either way (the core does not replay a
 * started call, and sluice's calls are not declared retryable), so the client has to reopen
 * streams and repeat calls itself; doing that here, with the replica chosen here, keeps one rule
 * for both: stay on the replica that works, move on when it answers UNAVAILABLE. The ipv4:/ipv6:
 * targets also take IP literals only, not host names. A single element that is a DNS name with
 * several A/AAAA records stays one channel, where gRPC's pick_first (its default) connects to the
 * first record that accepts and, after that connection breaks, re-resolves and again tries the
 * records in order; with one address nothing here changes what the client did before. */
#include "sluice.h"

#include "internal.h"

#include "err.h"
#include "util/num.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A target gRPC reads itself (a URI scheme it knows): taken whole, never split at commas, since
 * "ipv4:a:1,b:2" is gRPC's own list. */
static int is_grpc_uri(const char *s)
{
    static const char *const schemes[] = {
        "ipv4:", "ipv6:", "unix:", "unix-abstract:", "dns:", "vsock:"};

    for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++)
        if (strncmp(s, schemes[i], strlen(schemes[i])) == 0)
            return 1;
    return 0;
}

/* The port of "host:port" or "[v6]:port" must be a number in [1, 65535]; "host" without one and
 * a bare IPv6 literal are left to gRPC. Returns 0 or SL_EINVAL (recorded). */
static int check_port(const char *el, const char *list)
{
    const char *port = NULL;
    uint64_t v;

    if (el[0] == '[') {
        const char *end = strchr(el, ']');
        if (!end || (end[1] && end[1] != ':'))
            return sl_client_set_error(SL_EINVAL, "address '%s' of '%s' is not [IPv6]:PORT", el,
                                       list);
        port = end[1] ? end + 2 : NULL;
    } else if (strchr(el, ':') && strchr(el, ':') == strrchr(el, ':')) {
        port = strchr(el, ':') + 1;
    }
    if (!port)
        return 0;
    if (sl_parse_u64(&v, port, 1, 65535) != 0)
        return sl_client_set_error(
            SL_EINVAL, "address '%s' of '%s': port '%s' is not in [1, 65535]", el, list, port);
    return 0;
}

/* Element `el` (len bytes) without the blanks around it, as a new string into *out. */
static int trimmed(char **out, const char *el, size_t len)
{
    while (len && isspace((unsigned char)*el)) {
        el++;
        len--;
    }
    while (len && isspace((unsigned char)el[len - 1]))
        len--;
    *out = malloc(len + 1);
    if (!*out)
        return sl_client_set_error(-ENOMEM, "out of memory");
    memcpy(*out, el, len);
    (*out)[len] = '\0';
    return 0;
}

void sl_client_addrs_free(char **addrs, size_t n)
{
    for (size_t i = 0; addrs && i < n; i++)
        free(addrs[i]);
    free(addrs);
}

int sl_client_addrs_parse(char ***out, size_t *n, const char *list)
{
    size_t count = 1, k = 0;
    char **a;
    int err = 0;

    *out = NULL;
    *n = 0;
    if (!list || !*list)
        return sl_client_set_error(SL_EINVAL, "the daemon's address is empty");
    if (is_grpc_uri(list))
        count = 1;
    else
        for (const char *p = list; *p; p++)
            count += *p == ',';
    if (count > SL_CLIENT_MAX_REPLICAS)
        return sl_client_set_error(SL_EINVAL, "%zu addresses in '%s': at most %d", count, list,
                                   SL_CLIENT_MAX_REPLICAS);
    a = calloc(count, sizeof(*a));
    if (!a)
        return sl_client_set_error(-ENOMEM, "out of memory");
    for (const char *p = list; !err && k < count; k++) {
        const char *end = p;
        while (*end && (count == 1 || *end != ','))
            end++;
        err = trimmed(&a[k], p, (size_t)(end - p));
        if (!err && !a[k][0])
            err = sl_client_set_error(SL_EINVAL, "address list '%s': element %zu of %zu is empty",
                                      list, k + 1, count);
        if (!err && !is_grpc_uri(a[k]))
            err = check_port(a[k], list);
        p = *end ? end + 1 : end;
    }
    if (err) {
        sl_client_addrs_free(a, count);
        return err;
    }
    *out = a;
    *n = count;
    return 0;
}

size_t sl_client_first_replica(size_t n)
{
    const char *names[] = {"SLUICE_RANK", "RANK"};
    uint64_t rank;

    /* Ranks start on different replicas, so that one replica's death reaches 1/n of them, not
     * all at once. */
    for (size_t i = 0; n > 1 && i < sizeof(names) / sizeof(names[0]); i++) {
        const char *v = getenv(names[i]);
        if (v && *v && sl_parse_u64(&rank, v, 0, UINT64_MAX) == 0)
            return (size_t)(rank % n);
    }
    return 0;
}

size_t sl_client_pick(sl_client *c)
{
    return atomic_load(&c->cur) % c->n;
}

static void client_failed(sl_client *c, size_t i)
{
    size_t want = i;

    /* Only the first thread to see replica i fail moves on: another thread's failure of the
     * same replica must not skip its successor. */
    atomic_compare_exchange_strong(&c->cur, &want, (i + 1) % c->n);
}

int sl_client_fail_over(sl_client *c, size_t i, int err, size_t tries)
{
    if (err != SL_EUNAVAILABLE || c->n < 2)
        return 0;
    client_failed(c, i);
    return tries < c->n;
}

int sl_client_record_tried(int err, const sl_rpc_status *st, const sl_client *c, size_t first,
                           size_t tries)
{
    char tried[600];
    size_t len = 0;

    if (c->n < 2 || err != SL_EUNAVAILABLE)
        return sl_client_record(err, st);
    tried[0] = '\0';
    for (size_t k = 0; k < tries && len < sizeof(tried); k++) {
        int w = snprintf(tried + len, sizeof(tried) - len, "%s%s", k ? ", " : "",
                         c->addr[(first + k) % c->n]);
        len += w > 0 ? (size_t)w : 0;
    }
    return sl_client_set_error(err, "%s: %s (tried %s)", sl_rpc_code_name(st->code),
                               st->message[0] ? st->message : sl_strerror(err), tried);
}

int sl_client_unary(sl_client *c, const char *method, const ProtobufCMessage *req,
                    const ProtobufCMessageDescriptor *rd, ProtobufCMessage **resp,
                    int64_t timeout_ms)
{
    size_t first = sl_client_pick(c), i = first, tries = 0;
    sl_rpc_status st;
    int err;

    /* Each try has the whole per-call deadline: a replica that does not answer in time ends the
     * call (DEADLINE_EXCEEDED is not a reason to move on, the call may still be running). */
    for (;;) {
        err = sl_rpc_client_unary(c->rpc[i], method, req, rd, resp, timeout_ms, &st);
        tries++;
        if (!err || !sl_client_fail_over(c, i, err, tries))
            break;
        i = (i + 1) % c->n;
    }
    return err ? sl_client_record_tried(err, &st, c, first, tries) : 0;
}
