/* The completion-queue threads and the loop's side of the queue between them: every completion
 * is routed from here, to the files that handle it. The last thread to end tears the core down.
 */
#include "server_internal.h"

void *srv_cq_thread(void *arg)
{
    sl_rpc_server *srv = arg;

    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        if (((tag *)ev.tag)->kind == TAG_SLOT) {
            srv_on_slot(((tag *)ev.tag)->ptr, ev.success);
            continue;
        }
        if (((tag *)ev.tag)->kind == TAG_RECV &&
            srv_on_prefetched(((tag *)ev.tag)->ptr, ev.success))
            continue;
        if (ev.success && ((tag *)ev.tag)->kind == TAG_SEND) {
            sl_rpc_call *c = ((tag *)ev.tag)->ptr;
            int more;
            atomic_fetch_add_explicit(&c->progress, 1, memory_order_relaxed);
            pthread_mutex_lock(&c->mu);
            more = srv_chain_next(c);
            if (!more && c->status_sent && srv_drop_ref_unless_last(c))
                more = 1; /* the call is over: nothing for the loop to do */
            pthread_mutex_unlock(&c->mu);
            if (more)
                continue;
        }
        srv_push_event(srv, ev.tag, ev.success);
    }
    srv_push_event(srv, NULL, 0);
    return NULL;
}

static void on_handle_closed(uv_handle_t *h)
{
    sl_rpc_server *srv = h->data;

    if (--srv->handles_open == 0 && srv->done)
        srv->done(srv->done_arg);
}

static void teardown(sl_rpc_server *srv)
{
    for (int i = 0; i < srv->n_threads; i++)
        pthread_join(srv->threads[i], NULL);
    srv->n_threads = 0;
    grpc_server_destroy(srv->server);
    srv->server = NULL;
    grpc_completion_queue_destroy(srv->cq);
    srv->cq = NULL;
    srv->torn_down = 1;
    uv_close((uv_handle_t *)&srv->async, on_handle_closed);
    uv_close((uv_handle_t *)&srv->grace, on_handle_closed);
    uv_close((uv_handle_t *)&srv->idle_timer, on_handle_closed);
    uv_close((uv_handle_t *)&srv->guard_timer, on_handle_closed);
}

/* One completion of a call's operation, or its start, routed to its handler's side. */
static void route(tag *t, int ok)
{
    switch (t->kind) {
    case TAG_START:
        srv_on_start(t->ptr);
        break;
    case TAG_SEND:
        srv_on_send_done(t->ptr, ok);
        break;
    case TAG_RECV:
        srv_on_recv_done(t->ptr, ok);
        break;
    case TAG_CLOSE:
        srv_on_close_done(t->ptr);
        break;
    case TAG_WRITABLE:
        srv_on_writable(t->ptr);
        break;
    default:
        break;
    }
}

/* In the lane: a call's event, in its turn (the reference taken when it was queued keeps the
 * call). It counts as waiting until its handler returned: an event arriving while the handler
 * is suspended in the lane queues behind it. */
static void in_lane(void *a, int ok)
{
    tag *t = a;
    sl_rpc_call *c = t->ptr;

    route(t, ok);
    c->lane_n--;
    sl_rpc_call_unref(c);
}

/* Whether a call's event goes to the lane: its start, messages and end do (unless its service
 * is outside the lane); its send completions only behind earlier events waiting there. */
static int laned(const sl_rpc_server *srv, tag *t)
{
    sl_rpc_call *c = t->ptr;

    if (!srv->opts.lane || (c->reg && c->reg->svc->outside_lane))
        return 0;
    return t->kind == TAG_START || t->kind == TAG_RECV || t->kind == TAG_CLOSE || c->lane_n > 0;
}

void srv_on_async(uv_async_t *a)
{
    sl_rpc_server *srv = a->data;
    size_t n;

    for (;;) {
        pthread_mutex_lock(&srv->mu);
        n = srv->q_len;
        if (n > 0) {
            /* Swap buffers so the threads can keep pushing while we work. */
            event *tmp = srv->work;
            size_t cap = srv->work_cap;
            srv->work = srv->q;
            srv->work_cap = srv->q_cap;
            srv->q = tmp;
            srv->q_cap = cap;
            srv->q_len = 0;
        }
        pthread_mutex_unlock(&srv->mu);
        if (n == 0)
            break;
        for (size_t i = 0; i < n; i++) {
            tag *t = srv->work[i].tag;
            int ok = srv->work[i].ok;
            if (!t) {
                if (++srv->threads_exited == srv->n_threads)
                    teardown(srv);
                continue;
            }
            switch (t->kind) {
            case TAG_SLOT: /* handled on the completion-queue threads */
                break;
            case TAG_START:
            case TAG_SEND:
            case TAG_RECV:
            case TAG_CLOSE:
            case TAG_WRITABLE:
                if (laned(srv, t)) {
                    sl_rpc_call *c = t->ptr;
                    c->lane_n++;
                    sl_rpc_call_ref(c);
                    srv->opts.lane(srv->opts.lane_arg, in_lane, t, ok);
                } else {
                    route(t, ok);
                }
                break;
            case TAG_KICK:
                srv_maybe_finish_shutdown(srv);
                break;
            case TAG_SHUTDOWN:
                srv->shutdown_seen = 1;
                uv_timer_stop(&srv->grace);
                srv_maybe_finish_shutdown(srv);
                break;
            }
        }
        if (srv->torn_down)
            break;
    }
}
