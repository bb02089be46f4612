/* The RPC server: construction (the core's channel arguments, registered methods, request
 * slots, threads and the loop's handles), graceful shutdown, counters, free. The server's other
 * files are listed in server_internal.h.
 */
#include "server_internal.h"

#include "../err.h"
#include "../log.h"

#include <errno.h>
#include <grpc/compression.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Default bound of calls that arrived and that the loop has not started. */
#define MAX_PENDING 8192

/* ---- shutdown ---- */

static void on_grace_expired(uv_timer_t *t)
{
    sl_rpc_server *srv = t->data;

    sl_log_info("rpc_grace_expired", "cancelling=%zu", atomic_load(&srv->live_calls));
    grpc_server_cancel_all_calls(srv->server);
}

void sl_rpc_server_shutdown(sl_rpc_server *srv, uint64_t grace_ms, void (*done)(void *arg),
                            void *arg)
{
    if (srv->shutting_down)
        return;
    srv->shutting_down = 1;
    atomic_store(&srv->stopping, 1);
    {
        sl_rpc_server_counters n;
        sl_rpc_server_get_counters(srv, &n);
        sl_log_info("rpc_answered_early",
                    "reset=%llu no_request=%llu unknown=%llu peer_limit=%llu busy=%llu "
                    "idle=%llu cut=%llu blocked=%llu",
                    (unsigned long long)n.reset, (unsigned long long)n.no_request,
                    (unsigned long long)n.unknown, (unsigned long long)n.peer_limit,
                    (unsigned long long)n.busy, (unsigned long long)n.idle,
                    (unsigned long long)n.cut, (unsigned long long)n.blocked);
    }
    srv->done = done;
    srv->done_arg = arg;
    for (size_t i = 0; i < srv->n_services; i++)
        if (srv->services[i]->on_shutdown)
            srv->services[i]->on_shutdown(srv->services[i]->arg);
    grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->shutdown_tag);
    /* Calls still waiting for their first message have not started: nothing to finish. */
    srv_cancel_prefetching(srv, UINT64_MAX, GRPC_STATUS_UNAVAILABLE, "server shutting down");
    uv_timer_start(&srv->grace, on_grace_expired, grace_ms, 0);
}

/* ---- construction ---- */

static void set_arg(grpc_arg *a, const char *key, int value)
{
    a->type = GRPC_ARG_INTEGER;
    a->key = (char *)key;
    a->value.integer = value;
}

static int ms_arg(uint64_t ms)
{
    return ms == 0 || ms > INT_MAX ? INT_MAX : (int)ms;
}

/* The server's channel arguments (at most 8). Returns how many. */
static size_t server_args(grpc_arg *args, const sl_rpc_server_opts *o)
{
    size_t n = 0;

    set_arg(&args[n++], GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, o->max_recv_bytes);
    set_arg(&args[n++], GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
            o->max_send_bytes ? o->max_send_bytes : -1);
    set_arg(&args[n++], GRPC_ARG_ENABLE_PER_MESSAGE_COMPRESSION, 0);
    /* Identity encoding only: the core answers a message compressed with anything else
     * UNIMPLEMENTED before inflating it, and with decompression off it never inflates one
     * either (gRPC 1.51 inflates in full before applying the message limit: a 512 KiB gzip body
     * became 512 MiB). A compressed message that slipped through anyway reaches sl_rpc_decode
     * still compressed, which refuses it. */
    set_arg(&args[n++], GRPC_COMPRESSION_CHANNEL_ENABLED_ALGORITHMS_BITSET,
            1 << GRPC_COMPRESS_NONE);
    set_arg(&args[n++], GRPC_ARG_ENABLE_PER_MESSAGE_DECOMPRESSION, 0);
    set_arg(&args[n++], GRPC_ARG_MAX_CONNECTION_IDLE_MS, ms_arg(o->max_connection_idle_ms));
    set_arg(&args[n++], GRPC_ARG_MAX_CONNECTION_AGE_MS, ms_arg(o->max_connection_age_ms));
    /* A connection that has not finished its HTTP/2 (and TLS) handshake holds an fd: 20 s instead
     * of the core's 120 s. */
    set_arg(&args[n++], GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 20000);
    return n;
}

int sl_rpc_server_new(sl_rpc_server **out, uv_loop_t *loop, const sl_rpc_server_opts *opts,
                      const sl_rpc_service *const *services, size_t n_services)
{
    sl_rpc_server *srv = NULL;
    grpc_server_credentials *creds;
    grpc_arg args[8];
    grpc_channel_args chargs;
    size_t n_generic = 4, k = 0;
    int err = 0, per;

    *out = NULL;
    if (!opts || !opts->listen || !*opts->listen || opts->max_recv_bytes < 0 ||
        opts->max_send_bytes < 0 || opts->cq_threads < 0 || opts->slots_per_method < 0 ||
        opts->max_calls < 0 || opts->max_key_calls < 0 || opts->max_peer_calls < 0 ||
        opts->max_pending < 0)
        return SL_EINVAL;
    srv = calloc(1, sizeof(*srv));
    if (!srv)
        return -ENOMEM;
    grpc_init();
    srv->loop = loop;
    srv->opts = *opts;
    srv->opts.listen = NULL;
    srv->opts.tls = NULL; /* only used here; the caller's struct need not outlive the call */
    if (srv->opts.cq_threads == 0)
        srv->opts.cq_threads = 4;
    if (srv->opts.cq_threads < 2)
        srv->opts.cq_threads = 2;
    if (srv->opts.max_recv_bytes == 0)
        srv->opts.max_recv_bytes = 4 << 20;
    if (srv->opts.max_pending == 0)
        srv->opts.max_pending = MAX_PENDING;
    per = srv->opts.slots_per_method ? srv->opts.slots_per_method : 16;
    srv->services = calloc(n_services ? n_services : 1, sizeof(*srv->services));
    if (!srv->services) {
        free(srv);
        grpc_shutdown_blocking();
        return -ENOMEM;
    }
    memcpy(srv->services, services, n_services * sizeof(*services));
    srv->n_services = n_services;
    srv->shutdown_tag = (tag){TAG_SHUTDOWN, srv};
    srv->kick_tag = (tag){TAG_KICK, srv};
    pthread_mutex_init(&srv->mu, NULL);
    pthread_mutex_init(&srv->peers_mu, NULL);
    pthread_mutex_init(&srv->pf_mu, NULL);
    sl_rpc_resets_init(&srv->resets);
    sl_rpc_resets_init(&srv->cuts);
    sl_rpc_bans_init(&srv->bans);

    for (size_t i = 0; i < n_services; i++)
        srv->n_regs += services[i]->n_methods;
    srv->regs = calloc(srv->n_regs ? srv->n_regs : 1, sizeof(*srv->regs));
    srv->n_slots = srv->n_regs * (size_t)per + n_generic;
    srv->slots = calloc(srv->n_slots, sizeof(*srv->slots));
    srv->threads = calloc((size_t)srv->opts.cq_threads, sizeof(*srv->threads));
    srv->svc_calls = calloc(n_services ? n_services : 1, sizeof(*srv->svc_calls));
    srv->svc_streams = calloc(n_services ? n_services : 1, sizeof(*srv->svc_streams));
    srv->svc_pending = calloc(n_services ? n_services : 1, sizeof(*srv->svc_pending));
    if (!srv->regs || !srv->slots || !srv->threads || !srv->svc_calls || !srv->svc_streams ||
        !srv->svc_pending) {
        err = -ENOMEM;
        goto out;
    }

    chargs.num_args = server_args(args, &srv->opts);
    chargs.args = args;
    srv->server = grpc_server_create(&chargs, NULL);
    srv->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(srv->server, srv->cq, NULL);

    for (size_t i = 0; i < n_services; i++) {
        for (size_t j = 0; j < services[i]->n_methods; j++) {
            const sl_rpc_method *m = &services[i]->methods[j];
            reg *r = &srv->regs[k++];
            size_t len = strlen(services[i]->name) + strlen(m->name) + 3;
            r->svc = services[i];
            r->svc_idx = i;
            r->m = m;
            r->path = malloc(len);
            if (!r->path) {
                err = -ENOMEM;
                goto out;
            }
            snprintf(r->path, len, "/%s/%s", services[i]->name, m->name);
            if (m->bytes_field &&
                ((m->kind != SL_RPC_CLIENT_STREAM && m->kind != SL_RPC_BIDI_STREAM) ||
                 !sl_rpc_bytes_field(m->request, m->bytes_field))) {
                sl_log_error("rpc_bad_bytes_field", "method=%s field=%u", r->path,
                             (unsigned)m->bytes_field);
                err = SL_EINVAL;
                goto out;
            }
            /* The request is read by the server itself (prefetch), for every kind: the core's
             * own read of it (GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER) stopped publishing new
             * calls altogether under a reset flood, while they piled up in its memory. */
            r->handle =
                grpc_server_register_method(srv->server, r->path, NULL, GRPC_SRM_PAYLOAD_NONE, 0);
            if (!r->handle) {
                sl_log_error("rpc_register_failed", "method=%s", r->path);
                err = SL_EINVAL;
                goto out;
            }
        }
    }

    err = sl_rpc_server_creds(&creds, opts->tls);
    if (err)
        goto out;
    srv->port = grpc_server_add_http2_port(srv->server, opts->listen, creds);
    grpc_server_credentials_release(creds);
    if (srv->port <= 0) {
        sl_log_error("rpc_bind_failed", "listen=%s", opts->listen);
        err = SL_EUNAVAILABLE;
        goto out;
    }

    if (uv_async_init(loop, &srv->async, srv_on_async) != 0) {
        err = SL_EINVAL;
        goto out;
    }
    srv->async.data = srv;
    uv_timer_init(loop, &srv->grace);
    srv->grace.data = srv;
    uv_timer_init(loop, &srv->idle_timer);
    srv->idle_timer.data = srv;
    uv_timer_init(loop, &srv->guard_timer);
    srv->guard_timer.data = srv;
    srv->handles_open = 4;
    uv_timer_start(&srv->guard_timer, srv_on_guard, GUARD_TICK_MS, GUARD_TICK_MS);
    if (srv->opts.idle_timeout_ms > 0) {
        /* A few sweeps per timeout, at most one a second: ends come at most a quarter late. */
        uint64_t every = srv->opts.idle_timeout_ms / 4;
        every = every < 50 ? 50 : every > 1000 ? 1000 : every;
        uv_timer_start(&srv->idle_timer, srv_on_idle_sweep, every, every);
    }

    grpc_server_start(srv->server);
    k = 0;
    for (size_t i = 0; i < srv->n_regs; i++) {
        for (int j = 0; j < per; j++) {
            slot *s = &srv->slots[k++];
            s->tag = (tag){TAG_SLOT, s};
            s->srv = srv;
            s->reg = &srv->regs[i];
            grpc_metadata_array_init(&s->md);
            srv_arm_slot(s);
        }
    }
    for (size_t i = 0; i < n_generic; i++) {
        slot *s = &srv->slots[k++];
        s->tag = (tag){TAG_SLOT, s};
        s->srv = srv;
        grpc_metadata_array_init(&s->md);
        grpc_call_details_init(&s->details);
        srv_arm_slot(s);
    }
    for (int i = 0; i < srv->opts.cq_threads; i++) {
        if (pthread_create(&srv->threads[i], NULL, srv_cq_thread, srv) != 0) {
            /* The server runs with the threads it has; at least one is needed. */
            if (i == 0)
                abort();
            break;
        }
        srv->n_threads++;
    }
    *out = srv;
    return 0;

out:
    if (srv->server) {
        grpc_server_destroy(srv->server);
        grpc_completion_queue_shutdown(srv->cq);
        while (grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
               GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(srv->cq);
        srv->server = NULL;
    }
    sl_rpc_server_free(srv);
    return err;
}

int sl_rpc_server_port(const sl_rpc_server *srv)
{
    return srv->port;
}

size_t sl_rpc_server_live_calls(const sl_rpc_server *srv)
{
    return atomic_load(&((sl_rpc_server *)srv)->live_calls);
}

size_t sl_rpc_server_live_streams(const sl_rpc_server *srv)
{
    return atomic_load(&((sl_rpc_server *)srv)->live_streams);
}

void sl_rpc_server_get_counters(const sl_rpc_server *srv, sl_rpc_server_counters *out)
{
    sl_rpc_server *s = (sl_rpc_server *)srv;

    out->reset = atomic_load(&s->n_reset);
    out->no_request = atomic_load(&s->n_no_request);
    out->unknown = atomic_load(&s->n_unknown);
    out->peer_limit = atomic_load(&s->n_peer_limit);
    out->busy = atomic_load(&s->n_busy);
    out->idle = atomic_load(&s->n_idle);
    out->cut = atomic_load(&s->n_cut);
    out->blocked = atomic_load(&s->n_banned);
    out->pending = atomic_load(&s->pending);
}

void sl_rpc_server_free(sl_rpc_server *srv)
{
    if (!srv)
        return;
    for (size_t i = 0; srv->slots && i < srv->n_slots; i++) {
        if (srv->slots[i].srv) {
            grpc_metadata_array_destroy(&srv->slots[i].md);
            if (!srv->slots[i].reg)
                grpc_call_details_destroy(&srv->slots[i].details);
        }
    }
    for (size_t i = 0; srv->regs && i < srv->n_regs; i++)
        free(srv->regs[i].path);
    free(srv->regs);
    free(srv->services);
    free(srv->slots);
    free(srv->threads);
    free(srv->svc_calls);
    free(srv->svc_streams);
    free(srv->svc_pending);
    sl_rpc_keys_clear(&srv->keys);
    sl_rpc_keys_clear(&srv->peers);
    free(srv->q);
    free(srv->work);
    pthread_mutex_destroy(&srv->mu);
    pthread_mutex_destroy(&srv->peers_mu);
    pthread_mutex_destroy(&srv->pf_mu);
    sl_rpc_resets_destroy(&srv->resets);
    sl_rpc_resets_destroy(&srv->cuts);
    sl_rpc_bans_destroy(&srv->bans);
    free(srv);
    grpc_shutdown_blocking();
}
