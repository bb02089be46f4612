/* A PostgreSQL catalog's connection on the loop: its socket watched by libuv for the other
 * replicas' announcements (LISTEN/NOTIFY) and for the answers the catalog lane's statements
 * wait for; a lost connection made again in the background (PQresetPoll), LISTEN then sent again
 * by engine.c's hook in the lane; the helpers engine.c shares (logging, the prepared statements
 * forgotten). Below engine.c: it calls nothing there. Loop thread.
 */
#include "internal.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Where the catalog is, for logs: never the password (which is never in the conninfo). */
void sl_pg_where(PGconn *c, char *dst, size_t len)
{
    snprintf(dst, len, "host=%s port=%s dbname=%s user=%s", PQhost(c) ? PQhost(c) : "",
             PQport(c) ? PQport(c) : "", PQdb(c) ? PQdb(c) : "", PQuser(c) ? PQuser(c) : "");
}

void sl_pg_unreachable(pg *p)
{
    char where[512], msg[512];

    sl_pg_down(p, mono_ms());
    sl_pg_where(p->conn, where, sizeof(where));
    sl_db_pg_clean(msg, sizeof(msg), PQerrorMessage(p->conn));
    sl_log_limited(SL_LOG_WARN, 1000, "catalog_unreachable", "engine=postgresql %s msg=\"%s\"",
                   where, msg);
}

void sl_pg_forget_prepared(pg *p)
{
    for (int i = 0; i < p->nprep; i++)
        free(p->prep[i]);
    p->nprep = 0;
}

static void on_io(uv_poll_t *h, int status, int events);
static int watch(sl_cat *cat);

/* This process's mark on its announcements, the same on all its connections (the feed writes
 * progress on a second one): "<mark> <payload>". Its own are not delivered back to it. */
static char mark[17];

const char *sl_pg_mark(void)
{
    unsigned char rnd[8];

    if (!mark[0]) {
        if (getentropy(rnd, sizeof(rnd)) != 0)
            memset(rnd, 0x5a, sizeof(rnd));
        for (size_t i = 0; i < sizeof(rnd); i++)
            snprintf(mark + 2 * i, 3, "%02x", rnd[i]);
    }
    return mark;
}

static void free_handle(uv_handle_t *h)
{
    free(h);
}

static void close_handle(uv_handle_t *h)
{
    if (h && !uv_is_closing(h))
        uv_close(h, free_handle);
}

static void on_deliver(uv_timer_t *t);

/* Queue a payload for the deliver timer, which hands it over once the loop is back at the top,
 * never inside a statement's caller. Out of memory: "*" is delivered first (read everything). */
void sl_pg_push(pg *p, const char *payload)
{
    char *s = NULL;

    if (p->nq == p->capq) {
        size_t cap = p->capq ? p->capq * 2 : 16;
        char **q = realloc(p->queue, cap * sizeof(*q));
        if (q) {
            p->queue = q;
            p->capq = cap;
        }
    }
    if (p->nq < p->capq && (s = strdup(payload)) != NULL)
        p->queue[p->nq++] = s;
    if (!s)
        p->missed = 1;
    if (p->deliver)
        uv_timer_start(p->deliver, on_deliver, 0, 0);
}

/* Queue what arrived (libpq read it during a statement or from the socket). */
void sl_pg_collect(sl_cat *cat)
{
    pg *p = PG(cat);
    const char *me = sl_pg_mark();
    size_t len = strlen(me);
    PGnotify *n;

    while ((n = PQnotifies(p->conn)) != NULL) {
        const char *s = n->extra;
        /* Another process's ("<mark> <payload>"), not this one's own. */
        if (p->loop && s && strlen(s) > len + 1 && s[len] == ' ' && strncmp(s, me, len) != 0)
            sl_pg_push(p, s + len + 1);
        PQfreemem(n);
    }
}

/* In the lane: the notify callback reads the catalog. */
static void deliver(void *a, int b)
{
    sl_cat *cat = a;
    pg *p = PG(cat);
    char **q = p->queue;
    size_t n = p->nq;

    p->queue = NULL;
    p->nq = p->capq = 0;
    if (p->missed && p->fn) {
        p->missed = 0;
        p->fn("*", p->fn_arg);
    }
    for (size_t i = 0; i < n; i++)
        /* A burst of reports announces the same job many times: once is enough. */
        if (!(i > 0 && !strcmp(q[i], q[i - 1])) && p->fn)
            p->fn(q[i], p->fn_arg);
    for (size_t i = 0; i < n; i++)
        free(q[i]);
    free(q);
    (void)b;
}

static void on_deliver(uv_timer_t *t)
{
    sl_cat_lane_run(t->data, deliver, t->data, 0);
}

/* The connection's socket: a lane statement waiting for it continues; otherwise announcements
 * (or the connection's end) arrived. */
static void on_io(uv_poll_t *h, int status, int events)
{
    sl_cat *cat = h->data;
    pg *p = PG(cat);

    (void)events;
    if (p->waiting) {
        p->waiting = 0;
        p->woke = status < 0 ? -1 : 1;
        sl_lane_resume(cat->lane);
        return;
    }
    if (status < 0 || !PQconsumeInput(p->conn) || PQstatus(p->conn) != CONNECTION_OK) {
        /* The server went away: watch no dead socket; the reconnect timer takes over. */
        sl_pg_listen_lost(p);
        return;
    }
    sl_pg_collect(cat);
}

static void reset_step(sl_cat *cat);

static void on_reset_io(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    reset_step(h->data);
}

/* One step of making the connection again without blocking: libpq says which way its socket
 * must be ready next (it may change sockets between hosts), the loop waits for that. */
static void reset_step(sl_cat *cat)
{
    pg *p = PG(cat);
    PostgresPollingStatusType st = PQresetPoll(p->conn);
    char where[512];

    close_handle((uv_handle_t *)p->poll);
    p->poll = NULL;
    if (st == PGRES_POLLING_FAILED) {
        p->resetting = 0;
        sl_pg_unreachable(p); /* the reconnect timer tries again in a second */
        return;
    }
    if (st == PGRES_POLLING_OK) {
        p->resetting = 0;
        p->stalled = 0;
        sl_pg_up(p);
        sl_pg_forget_prepared(p);
        uv_timer_stop(p->reconnect);
        sl_pg_where(p->conn, where, sizeof(where));
        sl_log_info("catalog_reconnected", "engine=postgresql %s", where);
        /* The socket is watched at once (the lane's statements wait on it); LISTEN is a
         * statement, sent in the lane. */
        if (watch(cat) != 0)
            sl_pg_listen_lost(p);
        else
            sl_cat_lane_run(cat, p->relisten, cat, 0);
        return;
    }
    if (!(p->poll = calloc(1, sizeof(*p->poll))) ||
        uv_poll_init_socket(p->loop, p->poll, PQsocket(p->conn)) != 0) {
        free(p->poll);
        p->poll = NULL;
        p->resetting = 0;
        return;
    }
    p->poll->data = cat;
    uv_poll_start(p->poll, st == PGRES_POLLING_WRITING ? UV_WRITABLE : UV_READABLE, on_reset_io);
}

static void on_reconnect(uv_timer_t *t)
{
    sl_cat *cat = t->data;
    pg *p = PG(cat);

    if (p->in_tx)
        return;
    if (p->resetting && mono_ms() - p->reset_ms < (uint64_t)sl_pg_timeout_ms)
        return;
    if (p->resetting) { /* the server took the connection but never answered: again */
        close_handle((uv_handle_t *)p->poll);
        p->poll = NULL;
        p->resetting = 0;
        sl_pg_down(p, p->reset_ms);
        sl_pg_unreachable(p);
    }
    if (PQstatus(p->conn) == CONNECTION_OK && !p->stalled) {
        uv_timer_stop(t);
        return;
    }
    if (!PQresetStart(p->conn)) {
        sl_pg_unreachable(p);
        return;
    }
    p->resetting = 1;
    p->reset_ms = mono_ms();
    reset_step(cat);
}

/* The connection is lost (or about to be made again): stop watching its socket, try again every
 * second. */
void sl_pg_listen_lost(pg *p)
{
    if (!p->loop || p->resetting)
        return;
    close_handle((uv_handle_t *)p->poll);
    p->poll = NULL;
    if (!uv_is_active((uv_handle_t *)p->reconnect))
        uv_timer_start(p->reconnect, on_reconnect, 1000, 1000);
}

/* Watch the (new) connection's socket: announcements, and the lane's statements. */
static int watch(sl_cat *cat)
{
    pg *p = PG(cat);

    close_handle((uv_handle_t *)p->poll);
    if (!(p->poll = calloc(1, sizeof(*p->poll))))
        return -ENOMEM;
    if (uv_poll_init_socket(p->loop, p->poll, PQsocket(p->conn)) != 0) {
        free(p->poll);
        p->poll = NULL;
        return SL_ECATDOWN;
    }
    p->poll->data = cat;
    uv_poll_start(p->poll, UV_READABLE, on_io);
    return 0;
}

void sl_pg_unlisten(sl_cat *cat)
{
    pg *p = PG(cat);

    if (!p || !p->loop)
        return;
    close_handle((uv_handle_t *)p->poll);
    close_handle((uv_handle_t *)p->deliver);
    close_handle((uv_handle_t *)p->reconnect);
    close_handle((uv_handle_t *)p->wait_timer);
    close_handle((uv_handle_t *)p->guard);
    p->poll = NULL;
    p->deliver = p->reconnect = p->wait_timer = NULL;
    p->guard = NULL;
    p->loop = NULL;
    for (size_t i = 0; i < p->nq; i++)
        free(p->queue[i]);
    free(p->queue);
    p->queue = NULL;
    p->nq = p->capq = 0;
}

static void on_wait_timeout(uv_timer_t *t)
{
    sl_cat *cat = t->data;
    pg *p = PG(cat);

    if (p->waiting) {
        p->waiting = 0;
        p->woke = 0;
        sl_lane_resume(cat->lane);
    }
}

/* 1 if the socket watch is the live connection's. libpq closes its socket when the connection
 * fails (PQsocket is then -1); libuv aborts the process when the events of a watch on a closed
 * descriptor change (epoll_ctl fails with EBADF), so such a watch is never started again. A
 * watch made for a reconnect (reset_step) is not the lane's either. */
static int watch_live(pg *p)
{
    uv_os_fd_t fd;

    return p->poll && !p->resetting && PQstatus(p->conn) == CONNECTION_OK &&
           uv_fileno((uv_handle_t *)p->poll, &fd) == 0 && fd == PQsocket(p->conn);
}

/* Right before the loop polls. Every uv_poll_start makes libuv register the descriptor again at
 * the next poll; a statement that meets the connection's end after its wait (PQconsumeInput,
 * PQgetResult) has libpq close the socket in between, and registering a closed descriptor makes
 * libuv abort the process. So a watch that is no longer the live connection's is dropped here,
 * whoever closed its socket, and the reconnect timer takes over. A reconnect's own watch
 * (reset_step) is replaced in the same callback that changes its socket. */
static void on_guard(uv_prepare_t *h)
{
    pg *p = PG((sl_cat *)h->data);

    if (p->poll && !p->resetting && !watch_live(p))
        sl_pg_listen_lost(p);
}

/* wait_socket for a statement in the catalog lane: the lane is suspended, the loop goes on. */
int sl_pg_lane_wait(sl_cat *cat, short events, uint64_t deadline)
{
    pg *p = PG(cat);
    uint64_t now = mono_ms();

    if (!watch_live(p)) {
        sl_pg_listen_lost(p);
        return -1;
    }
    if (now >= deadline)
        return 0;
    p->waiting = 1;
    p->woke = -1;
    uv_poll_start(p->poll, (events & POLLOUT ? UV_WRITABLE : 0) | UV_READABLE, on_io);
    uv_timer_start(p->wait_timer, on_wait_timeout, deadline - now, 0);
    sl_lane_suspend(cat->lane);
    uv_timer_stop(p->wait_timer);
    p->waiting = 0;
    if (watch_live(p)) /* else on_guard drops the watch before the loop polls */
        uv_poll_start(p->poll, UV_READABLE, on_io);
    return p->woke;
}

/* Watch the connection on `loop`: announcements go to fn; after a reconnect, relisten runs in
 * the lane. */
int sl_pg_watch_start(sl_cat *cat, uv_loop_t *loop, sl_cat_notify_fn fn, void *arg,
                      sl_cat_work_fn relisten)
{
    pg *p = PG(cat);

    p->fn = fn;
    p->fn_arg = arg;
    p->relisten = relisten;
    p->deliver = calloc(1, sizeof(*p->deliver));
    p->reconnect = calloc(1, sizeof(*p->reconnect));
    p->wait_timer = calloc(1, sizeof(*p->wait_timer));
    p->guard = calloc(1, sizeof(*p->guard));
    if (!p->deliver || !p->reconnect || !p->wait_timer || !p->guard) {
        free(p->deliver);
        free(p->reconnect);
        free(p->wait_timer);
        free(p->guard);
        p->deliver = p->reconnect = p->wait_timer = NULL;
        p->guard = NULL;
        return -ENOMEM;
    }
    uv_timer_init(loop, p->deliver);
    uv_timer_init(loop, p->reconnect);
    uv_timer_init(loop, p->wait_timer);
    uv_prepare_init(loop, p->guard);
    p->deliver->data = p->reconnect->data = p->wait_timer->data = p->guard->data = cat;
    uv_prepare_start(p->guard, on_guard);
    uv_unref((uv_handle_t *)p->guard); /* it never keeps the loop running */
    p->loop = loop;
    return watch(cat);
}
