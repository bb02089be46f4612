/* Private to server/catalog/pg/: the connection's state, shared by engine.c (statements) and
 * conn.c (the connection on the loop: announcements, reconnecting, the lane's waits). */
#ifndef SL_CATALOG_PG_INTERNAL_H
#define SL_CATALOG_PG_INTERNAL_H

#include "../internal.h"

#include "util/clock.h"

#include <libpq-fe.h>
#include <stdint.h>
#include <uv.h>

/* Listening for the other replicas' announcements (NOTIFY on CHANNEL). Handles are on the heap:
 * each is freed by its close callback, which may run after the catalog is gone. */
#define CHANNEL "sluice"

#define PREP_MAX 256
#define SEEN_MAX 64

typedef struct pg {
    PGconn *conn;
    int in_tx; /* a transaction is open (a lost connection ends it) */
    char sql[8192];
    /* Statements prepared on this connection (their text, translated, and its hash; the name
     * is "s<index>"): parsed and planned once, not per call. Forgotten when the connection is
     * made again. `seen`: hashes of texts run once, unprepared (a ring). */
    char *prep[PREP_MAX];
    uint64_t prep_hash[PREP_MAX], seen[SEEN_MAX];
    int nprep, seen_at;
    uv_loop_t *loop; /* set while listening */
    sl_cat_notify_fn fn;
    void *fn_arg;
    uv_poll_t *poll;         /* readable: notifications (or the connection's end) */
    uv_timer_t *deliver;     /* hands queued payloads to fn outside any statement */
    uv_timer_t *reconnect;   /* every second while the connection is lost */
    uv_timer_t *wait_timer;  /* a lane statement's deadline */
    uv_prepare_t *guard;     /* before each poll: no watch on a socket libpq closed */
    sl_cat_work_fn relisten; /* engine.c's LISTEN after a reconnect, run in the lane */
    int waiting;             /* a lane statement waits for the socket (or its deadline) */
    int woke;                /* why it was resumed: 1 the socket, 0 the deadline, -1 an error */
    char **queue;
    size_t nq, capq;
    int missed;        /* a payload could not be queued: deliver "*" */
    int resetting;     /* the connection is being made again (PQresetStart .. PQresetPoll) */
    int stalled;       /* a statement went unanswered: the connection is given up */
    uint64_t reset_ms; /* when `resetting` began (mono_ms) */
    /* Since when (mono_ms) the server has answered nothing: the start of the first statement or
     * reconnect that failed to reach it since its last answer; 0 while it answers. */
    uint64_t down_ms;
} pg;

#define PG(cat) ((pg *)(cat)->conn)

/* How long one statement (or one reconnect) may go unanswered, in ms (engine.c). */
extern int sl_pg_timeout_ms;

static inline uint64_t mono_ms(void)
{
    return sl_mono_ns() / 1000000;
}

/* The server failed to answer what was sent at `since` (mono_ms): unreachable from then on,
 * unless it already was. */
static inline void sl_pg_down(pg *p, uint64_t since)
{
    if (!p->down_ms)
        p->down_ms = since ? since : 1;
}

/* The server answered. */
static inline void sl_pg_up(pg *p)
{
    p->down_ms = 0;
}

/* engine.c (above conn.c: it calls conn.c, never the other way) */
int sl_pg_script(sl_cat *cat, const char *sql, const char *op);

/* conn.c: the connection on the loop */
void sl_pg_where(PGconn *c, char *dst, size_t len); /* for logs: never a password */
void sl_pg_unreachable(pg *p);                      /* logged, rate-limited */
void sl_pg_forget_prepared(pg *p);
const char *sl_pg_mark(void); /* this process's mark on its connections and announcements */
/* Watch the connection's socket on `loop`: announcements are handed to fn (in the lane); after
 * a reconnect, relisten(cat, 0) runs in the lane (it sends LISTEN). */
int sl_pg_watch_start(sl_cat *cat, uv_loop_t *loop, sl_cat_notify_fn fn, void *arg,
                      sl_cat_work_fn relisten);
void sl_pg_unlisten(sl_cat *cat);
/* The connection is lost: stop watching its socket, try again every second. */
void sl_pg_listen_lost(pg *p);
/* Queue a payload for fn, or the announcements libpq read (during a statement or from the
 * socket). */
void sl_pg_push(pg *p, const char *payload);
void sl_pg_collect(sl_cat *cat);
/* In the lane: wait for the socket (POLLIN/POLLOUT) or the deadline (mono_ms) with the lane
 * suspended: 1 ready, 0 the deadline passed, -1 an error. */
int sl_pg_lane_wait(sl_cat *cat, short events, uint64_t deadline);

#endif
