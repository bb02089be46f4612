#include "health.h"

#include "auth.h"
#include "err.h"
#include "grpc/health/v1/health.pb-c.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct watcher watcher;

struct sl_health {
    char **names;
    sl_health_status *status;
    size_t n;
    int shutting_down;
    watcher *watchers; /* doubly linked */
    sl_rpc_method methods[2];
    sl_rpc_service svc;
};

/* Per-call state of a Watch stream. */
struct watcher {
    sl_health *h;
    sl_rpc_call *call;
    char *service;
    int sent; /* last status sent, -1 before the first */
    int busy; /* a send is outstanding */
    watcher *prev, *next;
};

/* Status of a service name; SERVICE_UNKNOWN for names nobody registered. */
static int lookup(const sl_health *h, const char *name)
{
    for (size_t i = 0; i < h->n; i++)
        if (strcmp(h->names[i], name) == 0)
            return (int)h->status[i];
    return GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
}

static void check_start(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Grpc__Health__V1__HealthCheckRequest *req = (const void *)msg;
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    int st = lookup(arg, req->service);

    if (st == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN) {
        sl_rpc_call_finish(call, SL_RPC_NOT_FOUND, "unknown service '%.200s'", req->service);
        return;
    }
    resp.status = st;
    sl_rpc_call_reply(call, &resp.base);
}

/* Send the current status if it differs from what the watcher saw last; when shutting down and
 * up to date, end the stream. */
static void watcher_pump(watcher *w)
{
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    int st;

    if (w->busy || sl_rpc_call_is_done(w->call))
        return;
    st = lookup(w->h, w->service);
    if (st != w->sent) {
        resp.status = st;
        if (sl_rpc_call_send(w->call, &resp.base) == 0) {
            w->sent = st;
            w->busy = 1;
        }
        return;
    }
    if (w->h->shutting_down)
        sl_rpc_call_finish(w->call, SL_RPC_UNAVAILABLE, "server shutting down");
}

static void watcher_free(void *p)
{
    watcher *w = p;

    if (w->prev)
        w->prev->next = w->next;
    else
        w->h->watchers = w->next;
    if (w->next)
        w->next->prev = w->prev;
    free(w->service);
    free(w);
}

static void watch_start(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Grpc__Health__V1__HealthCheckRequest *req = (const void *)msg;
    sl_health *h = arg;
    watcher *w = calloc(1, sizeof(*w));

    if (!w || !(w->service = strdup(req->service))) {
        free(w);
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        return;
    }
    w->h = h;
    w->call = call;
    w->sent = -1;
    w->next = h->watchers;
    if (h->watchers)
        h->watchers->prev = w;
    h->watchers = w;
    sl_rpc_call_set_data(call, w, watcher_free);
    watcher_pump(w);
}

static void watch_writable(sl_rpc_call *call, void *arg)
{
    watcher *w = sl_rpc_call_data(call);

    w->busy = 0;
    watcher_pump(w);
}

static void on_shutdown(void *arg)
{
    sl_health *h = arg;

    h->shutting_down = 1;
    for (watcher *w = h->watchers; w; w = w->next)
        watcher_pump(w);
}

int sl_health_new(sl_health **out, const char *const *names, size_t n)
{
    static const sl_rpc_budget budget = {SL_HEALTH_MAX_CALLS, SL_HEALTH_MAX_WATCHES};
    sl_health *h = calloc(1, sizeof(*h));

    *out = NULL;
    if (!h)
        return -ENOMEM;
    h->names = calloc(n ? n : 1, sizeof(*h->names));
    h->status = calloc(n ? n : 1, sizeof(*h->status));
    if (!h->names || !h->status)
        goto oom;
    for (size_t i = 0; i < n; i++) {
        h->names[i] = strdup(names[i]);
        if (!h->names[i])
            goto oom;
        h->status[i] = SL_HEALTH_NOT_SERVING;
        h->n++;
    }
    h->methods[0] = (sl_rpc_method){
        .name = "Check",
        .kind = SL_RPC_UNARY,
        .request = &grpc__health__v1__health_check_request__descriptor,
        .response = &grpc__health__v1__health_check_response__descriptor,
        .access = SL_ACCESS_PUBLIC,
        .on_start = check_start,
    };
    h->methods[1] = (sl_rpc_method){
        .name = "Watch",
        .kind = SL_RPC_SERVER_STREAM,
        .request = &grpc__health__v1__health_check_request__descriptor,
        .response = &grpc__health__v1__health_check_response__descriptor,
        .access = SL_ACCESS_PUBLIC,
        .on_start = watch_start,
        .on_writable = watch_writable,
    };
    h->svc = (sl_rpc_service){
        .name = "grpc.health.v1.Health",
        .methods = h->methods,
        .n_methods = 2,
        .arg = h,
        .on_shutdown = on_shutdown,
        /* Anyone may call it, token or not: a budget of its own, so neither probes nor Watch
         * streams touch --max-calls and the per-peer limit, and Watch streams cannot take all
         * of it (Check calls are answered at once: 192 of them in flight are plenty). */
        .budget = &budget,
        /* Answered from memory: a probe is answered while the catalog lane waits. */
        .outside_lane = 1,
    };
    *out = h;
    return 0;
oom:
    sl_health_free(h);
    return -ENOMEM;
}

void sl_health_free(sl_health *h)
{
    if (!h)
        return;
    for (size_t i = 0; h->names && i < h->n; i++)
        free(h->names[i]);
    free(h->names);
    free(h->status);
    free(h);
}

void sl_health_set_all(sl_health *h, sl_health_status status)
{
    for (size_t i = 0; i < h->n; i++)
        h->status[i] = status;
    for (watcher *w = h->watchers; w; w = w->next)
        watcher_pump(w);
}

void sl_health_set(sl_health *h, const char *name, sl_health_status status)
{
    for (size_t i = 0; i < h->n; i++)
        if (strcmp(h->names[i], name) == 0)
            h->status[i] = status;
    for (watcher *w = h->watchers; w; w = w->next)
        watcher_pump(w);
}

const sl_rpc_service *sl_health_service(sl_health *h)
{
    return &h->svc;
}
