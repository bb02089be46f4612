#include "testsvc.h"

#include "err.h"
#include "sluice/test/test.pb-c.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sl_testsrv {
    uv_loop_t loop;
    uv_async_t stop;
    sl_rpc_server *srv;
    pthread_t thread;
    /* Set by the stopping thread, read by the loop's on_stop: atomic, since the ordering
     * uv_async_send gives is made inside libuv, which TSan does not see. */
    atomic_uint_least64_t grace_ms;
    size_t live_at_stop;
    int claim_keys;               /* Echo claims its text as a key (sl_rpc_call_claim) */
    atomic_size_t max_send_bytes; /* the most Count had queued or in flight after a send */
    sl_rpc_method methods[6];
    sl_rpc_service svc;
    /* With sl_testsrv_laned: the lane, a queue run on a later turn of the loop (as a lane busy
     * with a statement would). */
    uv_idle_t lane_idle;
    struct lane_item {
        void (*fn)(void *, int);
        void *a;
        int b;
    } * lane, *lane_run;
    size_t lane_n, lane_cap, lane_run_cap;
};

int sl_testsrv_laned;

/* ---- Echo: answers at once, or after delay_ms from a timer ---- */

typedef struct delayed {
    uv_timer_t timer;
    sl_rpc_call *call;
    char *text;
    int closing;
} delayed;

static void delayed_closed(uv_handle_t *h)
{
    delayed *d = h->data;

    sl_rpc_call_unref(d->call);
    free(d->text);
    free(d);
}

static void delayed_close(delayed *d)
{
    if (d->closing)
        return;
    d->closing = 1;
    uv_close((uv_handle_t *)&d->timer, delayed_closed);
}

static void delayed_fire(uv_timer_t *t)
{
    delayed *d = t->data;
    Sluice__Test__EchoResponse resp = SLUICE__TEST__ECHO_RESPONSE__INIT;

    resp.text = d->text;
    sl_rpc_call_reply(d->call, &resp.base);
    delayed_close(d);
}

static void echo_cancel(sl_rpc_call *call, void *arg)
{
    delayed *d = sl_rpc_call_data(call);

    if (d)
        delayed_close(d);
}

static void echo_start(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__Test__EchoRequest *req = (const void *)msg;
    Sluice__Test__EchoResponse resp = SLUICE__TEST__ECHO_RESPONSE__INIT;
    sl_testsrv *s = arg;

    if (s->claim_keys && sl_rpc_call_claim(call, "echo", req->text, "text") != 0)
        return;
    if (req->fail_code) {
        sl_rpc_call_finish(call, (sl_rpc_code)req->fail_code, "failing as asked: '%s'", req->text);
        return;
    }
    if (req->delay_ms) {
        delayed *d = calloc(1, sizeof(*d));
        d->text = strdup(req->text);
        d->call = call;
        sl_rpc_call_ref(call);
        /* The call does not own d (the timer handle must be closed first); it only points to it
         * so on_cancel can find it. */
        sl_rpc_call_set_data(call, d, NULL);
        uv_timer_init(&s->loop, &d->timer);
        d->timer.data = d;
        uv_timer_start(&d->timer, delayed_fire, req->delay_ms, 0);
        return;
    }
    resp.text = req->text;
    resp.payload = req->payload;
    sl_rpc_call_reply(call, &resp.base);
}

/* ---- Count: a server stream ---- */

typedef struct counter {
    uint64_t next, count;
    uint8_t *payload;
    size_t payload_size;
} counter;

static void counter_free(void *p)
{
    counter *c = p;

    free(c->payload);
    free(c);
}

static void count_pump(sl_rpc_call *call, void *arg)
{
    counter *c = sl_rpc_call_data(call);
    Sluice__Test__CountResponse resp = SLUICE__TEST__COUNT_RESPONSE__INIT;
    sl_testsrv *s = arg;

    resp.payload.data = c->payload;
    resp.payload.len = c->payload_size;
    while (sl_rpc_call_send_room(call) > 0) {
        if (c->count && c->next >= c->count) {
            sl_rpc_call_finish(call, SL_RPC_OK, NULL);
            return;
        }
        resp.value = c->next++;
        if (sl_rpc_call_send(call, &resp.base) != 0)
            return;
        if (sl_rpc_call_send_bytes(call) > atomic_load(&s->max_send_bytes))
            atomic_store(&s->max_send_bytes, sl_rpc_call_send_bytes(call));
    }
}

static void count_start(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__Test__CountRequest *req = (const void *)msg;
    counter *c = calloc(1, sizeof(*c));

    c->count = req->count;
    c->payload_size = req->payload_size > (1u << 20) ? (1u << 20) : req->payload_size;
    c->payload = calloc(1, c->payload_size ? c->payload_size : 1);
    sl_rpc_call_set_data(call, c, counter_free);
    count_pump(call, arg);
}

/* ---- Sum: a client stream ---- */

typedef struct summer {
    int64_t sum;
    uint64_t n;
} summer;

static void sum_start(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    sl_rpc_call_set_data(call, calloc(1, sizeof(summer)), free);
    sl_rpc_call_read(call);
}

static void sum_message(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    summer *s = sl_rpc_call_data(call);
    Sluice__Test__SumResponse resp = SLUICE__TEST__SUM_RESPONSE__INIT;

    if (!msg) {
        resp.sum = s->sum;
        resp.messages = s->n;
        sl_rpc_call_reply(call, &resp.base);
        return;
    }
    s->sum += ((const Sluice__Test__Num *)msg)->value;
    s->n++;
    sl_rpc_call_read(call);
}

/* ---- Chat: bidi, echo each message, read the next once it was written ---- */

/* Chat handles undecodable messages itself (Sum leaves them to the layer). */
static void chat_bad_message(sl_rpc_call *call, int err, const char *why, void *arg)
{
    sl_rpc_call_fail(call, err, "chat refused: %s", why);
}

static void chat_start(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    sl_rpc_call_read(call);
}

static void chat_message(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    if (!msg) {
        sl_rpc_call_finish(call, SL_RPC_OK, NULL);
        return;
    }
    sl_rpc_call_send(call, msg);
}

static void chat_writable(sl_rpc_call *call, void *arg)
{
    sl_rpc_call_read(call);
}

/* ---- Digest: data fields taken as received buffers, hashed and released on a worker ---- */

typedef struct digest {
    uv_work_t work;
    sl_rpc_call *call;
    sl_rpc_bytes *bytes; /* the piece being hashed */
    uint64_t fnv, total, messages, labels, ranges, mismatches;
} digest;

static void digest_free(void *p)
{
    digest *d = p;

    sl_rpc_bytes_free(d->bytes);
    free(d);
}

static void digest_work(uv_work_t *w)
{
    digest *d = w->data;
    int n;
    const struct iovec *iov = sl_rpc_bytes_iov(d->bytes, &n);
    size_t sum = 0;

    for (int i = 0; i < n; i++) {
        const uint8_t *p = iov[i].iov_base;
        for (size_t j = 0; j < iov[i].iov_len; j++) {
            d->fnv ^= p[j];
            d->fnv *= 0x100000001b3ull;
        }
        sum += iov[i].iov_len;
    }
    if (n < 1 || sum != sl_rpc_bytes_len(d->bytes))
        d->mismatches++;
    d->ranges += (uint64_t)n;
    d->total += sum;
    /* Released on a worker thread, as the checkpoint service's lanes may do. */
    sl_rpc_bytes_free(d->bytes);
    d->bytes = NULL;
}

static void digest_after(uv_work_t *w, int status)
{
    digest *d = w->data;
    sl_rpc_call *call = d->call;

    (void)status;
    sl_rpc_call_read(call);
    sl_rpc_call_unref(call);
}

static void digest_start(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    digest *d = calloc(1, sizeof(*d));

    d->call = call;
    d->work.data = d;
    d->fnv = 0xcbf29ce484222325ull;
    sl_rpc_call_set_data(call, d, digest_free);
    sl_rpc_call_read(call);
}

static void digest_message(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__Test__Piece *p = (const void *)msg;
    digest *d = sl_rpc_call_data(call);
    sl_testsrv *s = arg;

    if (!p) {
        Sluice__Test__DigestResponse resp = SLUICE__TEST__DIGEST_RESPONSE__INIT;
        resp.bytes = d->total;
        resp.fnv = d->fnv;
        resp.messages = d->messages;
        resp.labels = d->labels;
        resp.ranges = d->ranges;
        resp.mismatches = d->mismatches;
        sl_rpc_call_reply(call, &resp.base);
        return;
    }
    if (p->kind_case == SLUICE__TEST__PIECE__KIND_LABEL)
        d->labels++;
    if (p->kind_case == SLUICE__TEST__PIECE__KIND_DATA) {
        d->bytes = sl_rpc_call_take_bytes(call);
        /* The field keeps its length, its data stays with the layer; a second take is empty. */
        if (p->data.data || (d->bytes ? sl_rpc_bytes_len(d->bytes) : 0) != p->data.len ||
            sl_rpc_call_take_bytes(call))
            d->mismatches++;
        if (d->bytes) {
            /* Data is progress (with handler_progress, labels and empty data are not). */
            sl_rpc_call_progress(call);
            d->messages++;
            sl_rpc_call_ref(call);
            uv_queue_work(&s->loop, &d->work, digest_work, digest_after);
            return;
        }
    }
    sl_rpc_call_read(call);
}

/* ---- Stats ---- */

static void stats_start(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    sl_testsrv *s = arg;
    Sluice__Test__StatsResponse resp = SLUICE__TEST__STATS_RESPONSE__INIT;

    resp.live_calls = sl_rpc_server_live_calls(s->srv);
    sl_rpc_call_reply(call, &resp.base);
}

/* Echo's scope: its text (the authorize callback below refuses the scope "forbidden"). */
static const char *echo_scope(const ProtobufCMessage *msg)
{
    return ((const Sluice__Test__EchoRequest *)msg)->text;
}

/* Access levels of the test service: 0 writer, 1 public, 2 reader. */
static const sl_rpc_method methods[] = {
    {"Echo", SL_RPC_UNARY, &sluice__test__echo_request__descriptor,
     &sluice__test__echo_response__descriptor, 2, echo_start, NULL, NULL, echo_cancel, 0, NULL, 0,
     0, echo_scope},
    {"Count", SL_RPC_SERVER_STREAM, &sluice__test__count_request__descriptor,
     &sluice__test__count_response__descriptor, 0, count_start, NULL, count_pump, NULL, 0, NULL, 0,
     0, NULL},
    {"Sum", SL_RPC_CLIENT_STREAM, &sluice__test__num__descriptor,
     &sluice__test__sum_response__descriptor, 0, sum_start, sum_message, NULL, NULL, 0, NULL, 0, 0,
     NULL},
    {"Chat", SL_RPC_BIDI_STREAM, &sluice__test__num__descriptor, &sluice__test__num__descriptor, 0,
     chat_start, chat_message, chat_writable, NULL, 0, chat_bad_message, 0, 0, NULL},
    {"Stats", SL_RPC_UNARY, &sluice__test__stats_request__descriptor,
     &sluice__test__stats_response__descriptor, 1, stats_start, NULL, NULL, NULL, 0, NULL, 0, 0,
     NULL},
    {"Digest", SL_RPC_CLIENT_STREAM, &sluice__test__piece__descriptor,
     &sluice__test__digest_response__descriptor, 0, digest_start, digest_message, NULL, NULL,
     SLUICE__TEST__PIECE__KIND_DATA, NULL, 0, 0, NULL},
};

static int authorize(const char *method, unsigned access, const char *token, const char *scope,
                     char *msg, size_t len, void *arg)
{
    if (access == 1)
        return 0;
    if (!token || (strcmp(token, "r-token") != 0 && strcmp(token, "w-token") != 0)) {
        snprintf(msg, len, "%s needs a token", method);
        return SL_EAUTH;
    }
    if (access == 0 && strcmp(token, "w-token") != 0) {
        snprintf(msg, len, "reader may not call %s", method);
        return SL_EPERM;
    }
    if (scope && strcmp(scope, "forbidden") == 0) {
        snprintf(msg, len, "scope '%s' is not for this token", scope);
        return SL_EPERM;
    }
    return 0;
}

/* ---- harness ---- */

static void lane_drain(uv_idle_t *h)
{
    sl_testsrv *s = h->data;
    struct lane_item *run = s->lane;
    size_t n = s->lane_n, cap = s->lane_cap;

    /* Swap: what the items queue runs on the next turn. */
    s->lane = s->lane_run;
    s->lane_cap = s->lane_run_cap;
    s->lane_n = 0;
    s->lane_run = run;
    s->lane_run_cap = cap;
    for (size_t i = 0; i < n; i++)
        run[i].fn(run[i].a, run[i].b);
    if (s->lane_n == 0)
        uv_idle_stop(h);
}

static void lane_push(void *arg, void (*fn)(void *, int), void *a, int b)
{
    sl_testsrv *s = arg;

    if (s->lane_n == s->lane_cap) {
        size_t cap = s->lane_cap ? 2 * s->lane_cap : 64;
        struct lane_item *q = realloc(s->lane, cap * sizeof(*q));
        if (!q) {
            fn(a, b);
            return;
        }
        s->lane = q;
        s->lane_cap = cap;
    }
    s->lane[s->lane_n++] = (struct lane_item){fn, a, b};
    uv_idle_start(&s->lane_idle, lane_drain);
}

static void on_stopped(void *arg)
{
    sl_testsrv *s = arg;

    uv_close((uv_handle_t *)&s->stop, NULL);
    uv_close((uv_handle_t *)&s->lane_idle, NULL);
}

static void on_stop(uv_async_t *a)
{
    sl_testsrv *s = a->data;

    sl_rpc_server_shutdown(s->srv, atomic_load(&s->grace_ms), on_stopped, s);
}

static void *loop_main(void *arg)
{
    sl_testsrv *s = arg;

    uv_run(&s->loop, UV_RUN_DEFAULT);
    s->live_at_stop = sl_rpc_server_live_calls(s->srv);
    return NULL;
}

static int start(sl_testsrv **out, int max_recv_bytes, const sl_rpc_tls *tls, int auth,
                 const sl_rpc_server_opts *limits)
{
    sl_testsrv *s = calloc(1, sizeof(*s));
    const sl_rpc_service *svcs[1];
    sl_rpc_server_opts opts;
    int err;

    uv_loop_init(&s->loop);
    uv_async_init(&s->loop, &s->stop, on_stop);
    s->stop.data = s;
    uv_idle_init(&s->loop, &s->lane_idle);
    s->lane_idle.data = s;
    _Static_assert(sizeof(s->methods) == sizeof(methods), "the method table is copied whole");
    memcpy(s->methods, methods, sizeof(methods));
    s->svc = (sl_rpc_service){
        "sluice.test.Test", s->methods, sizeof(methods) / sizeof(methods[0]), s, NULL, 0, 0};
    svcs[0] = &s->svc;
    memset(&opts, 0, sizeof(opts));
    opts.listen = "127.0.0.1:0";
    opts.max_recv_bytes = max_recv_bytes;
    opts.tls = tls;
    opts.authorize = auth ? authorize : NULL;
    if (sl_testsrv_laned) {
        opts.lane = lane_push;
        opts.lane_arg = s;
    }
    if (limits) {
        opts.max_calls = limits->max_calls;
        opts.max_key_calls = limits->max_key_calls;
        opts.idle_timeout_ms = limits->idle_timeout_ms;
        s->claim_keys = limits->max_key_calls > 0;
        s->methods[1].send_budget = SL_TESTSRV_COUNT_BUDGET;
        s->methods[5].handler_progress = 1;
    }
    err = sl_rpc_server_new(&s->srv, &s->loop, &opts, svcs, 1);
    if (err) {
        uv_close((uv_handle_t *)&s->stop, NULL);
        uv_close((uv_handle_t *)&s->lane_idle, NULL);
        uv_run(&s->loop, UV_RUN_DEFAULT);
        uv_loop_close(&s->loop);
        free(s);
        return err;
    }
    pthread_create(&s->thread, NULL, loop_main, s);
    *out = s;
    return 0;
}

int sl_testsrv_start(sl_testsrv **out, int max_recv_bytes, const sl_rpc_tls *tls)
{
    return start(out, max_recv_bytes, tls, 0, NULL);
}

int sl_testsrv_start_auth(sl_testsrv **out)
{
    return start(out, 0, NULL, 1, NULL);
}

int sl_testsrv_start_limits(sl_testsrv **out, const sl_rpc_server_opts *limits)
{
    return start(out, 0, NULL, 0, limits);
}

size_t sl_testsrv_max_send_bytes(sl_testsrv *s)
{
    return atomic_load(&s->max_send_bytes);
}

int sl_testsrv_port(const sl_testsrv *s)
{
    return sl_rpc_server_port(s->srv);
}

size_t sl_testsrv_stop(sl_testsrv *s, uint64_t grace_ms)
{
    size_t live;

    atomic_store(&s->grace_ms, grace_ms);
    uv_async_send(&s->stop);
    pthread_join(s->thread, NULL);
    live = s->live_at_stop;
    sl_rpc_server_free(s->srv);
    uv_loop_close(&s->loop);
    free(s->lane);
    free(s->lane_run);
    free(s);
    return live;
}
