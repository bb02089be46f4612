/* The PostgreSQL engine's statements (server/catalog/pg/ is the only code that includes
 * <libpq-fe.h>; conn.c watches the connection on the loop).
 *
 * One connection per daemon (and one for the feed's writer). A statement in the catalog lane
 * waits for its answer with the lane suspended, the loop going on (conn.c); elsewhere (startup,
 * shutdown, the writer's worker thread) it polls the socket. Parameters go as text (integers) or
 * binary (bytea), results come back as text. A connection the server closed (restart,
 * pg_terminate_backend, network) fails the statement with SL_ECATDOWN and is made again by the next
 * one. No wait on the server is unbounded: a statement unanswered after the catalog timeout
 * (--catalog-timeout) gives the connection up (SL_ECATDOWN; made again as after a close), and TCP
 * keepalives find a server that vanished while the connection was idle. The password is never in
 * the conninfo: it comes from a file named in the configuration or libpq's PGPASSFILE/~/.pgpass.
 */
#include "internal.h"

#include "err.h"
#include "log.h"
#include "util/clock.h"

#include <errno.h>
#include <libpq-fe.h>
#include <poll.h>
#include <uv.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Any constant: the advisory lock that serializes migrations of daemons starting at once. */
#define MIGRATE_LOCK "SELECT pg_advisory_xact_lock(5193041203)"
/* Another: replicas creating names that differ only in case take turns (sl_cat_name_clash). */
#define NAME_LOCK "SELECT pg_advisory_xact_lock(5193041204)"

/* How long one statement (or one reconnect) may go unanswered, in ms: the daemon's
 * --catalog-timeout, the same for all its connections. */
int sl_pg_timeout_ms = SL_CAT_TIMEOUT_MS;

void sl_db_pg_set_timeout(int ms)
{
    sl_pg_timeout_ms = ms > 0 ? ms : SL_CAT_TIMEOUT_MS;
}

/* The sluice code for a failed result (NULL: no result at all) on connection `c`. */
static int code(PGconn *c, const PGresult *res, int constraint_err)
{
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

    if (PQstatus(c) != CONNECTION_OK)
        return SL_ECATDOWN;
    if (!state)
        return SL_EDB;
    if (strncmp(state, "23", 2) == 0 && constraint_err)
        return constraint_err;
    if (!strcmp(state, "40001") || !strcmp(state, "40P01") || !strcmp(state, "55P03"))
        return SL_EDBBUSY;
    if (!strcmp(state, "53100"))
        return -ENOSPC;
    if (!strncmp(state, "08", 2) || !strncmp(state, "57P", 3))
        return SL_ECATDOWN;
    return SL_EDB;
}

/* Count and log a failed statement; returns its code. Constraint violations the caller
 * expects (constraint_err) are neither counted nor logged. */
static int fail(sl_cat *cat, const PGresult *res, const char *op, int constraint_err)
{
    PGconn *c = PG(cat)->conn;
    int err = code(c, res, constraint_err);
    const char *msg = res ? PQresultErrorMessage(res) : PQerrorMessage(c);
    char where[512], line[512];

    if (err == constraint_err && constraint_err)
        return err;
    if (err == SL_ECATDOWN)
        sl_pg_down(PG(cat), mono_ms());
    sl_db_pg_clean(line, sizeof(line), msg);
    sl_db_count_error(cat);
    sl_pg_where(c, where, sizeof(where));
    sl_log_error("catalog_error", "engine=postgresql op=%s sqlstate=%s msg=\"%s\" %s", op,
                 res && PQresultErrorField(res, PG_DIAG_SQLSTATE)
                     ? PQresultErrorField(res, PG_DIAG_SQLSTATE)
                     : "-",
                 line, where);
    return err;
}

/* A connection the server closed is made again before the next statement outside a
 * transaction (inside one, the transaction died with it: its statements fail until it ends). */
static int ready(sl_cat *cat)
{
    pg *p = PG(cat);
    char where[512];

    if (PQstatus(p->conn) == CONNECTION_OK && !p->resetting && !p->stalled)
        return 0;
    /* While listening, the loop makes the connection again in the background (on_reconnect):
     * statements meanwhile are answered at once. */
    if (p->in_tx || p->loop) {
        sl_pg_down(p, mono_ms());
        sl_pg_listen_lost(p);
        return SL_ECATDOWN;
    }
    PQreset(p->conn); /* bounded by connect_timeout */
    sl_pg_where(p->conn, where, sizeof(where));
    if (PQstatus(p->conn) != CONNECTION_OK) {
        sl_pg_unreachable(p);
        return SL_ECATDOWN;
    }
    p->stalled = 0;
    sl_pg_up(p);
    sl_pg_forget_prepared(p);
    sl_log_info("catalog_reconnected", "engine=postgresql %s", where);
    return 0;
}

/* Wait until the connection's socket is ready for `events` or the deadline (mono_ms): 1
 * ready, 0 the deadline passed, -1 an error. */
static int wait_socket(PGconn *c, short events, uint64_t deadline)
{
    struct pollfd pfd = {.fd = PQsocket(c), .events = events};

    for (;;) {
        uint64_t now = mono_ms();
        int n;
        if (pfd.fd < 0)
            return -1;
        if (now >= deadline)
            return 0;
        n = poll(&pfd, 1, (int)(deadline - now > 60000 ? 60000 : deadline - now));
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

/* The lane's statements wait through the loop (the connection's socket watch); any other waits
 * on the socket (startup, shutdown, the feed's worker connection). */
static int wait_for(sl_cat *cat, short events, uint64_t deadline, int in_lane)
{
    if (in_lane) /* no watch: the connection is being made again */
        return PG(cat)->poll ? sl_pg_lane_wait(cat, events, deadline) : -1;
    return wait_socket(PG(cat)->conn, events, deadline);
}

/* The results of the statement(s) just sent (PQsendQuery*), waited for no longer than the
 * catalog timeout: the first failed result, else the last; NULL when the connection failed (its
 * status says so) or, with *late set, when the server did not answer in time (the connection
 * must be given up). */
static PGresult *await(sl_cat *cat, int *late, const char *op)
{
    uint64_t deadline = mono_ms() + (uint64_t)sl_pg_timeout_ms;
    PGconn *c = PG(cat)->conn;
    PGresult *keep = NULL, *r;
    int w, in_lane = sl_lane_here(cat->lane);

    *late = 0;
    sl_db_outside_lane(cat, op);
    while ((w = PQflush(c)) == 1) {
        if ((w = wait_for(cat, POLLOUT | POLLIN, deadline, in_lane)) <= 0)
            goto out;
        if (!PQconsumeInput(c))
            return NULL;
    }
    if (w < 0)
        return NULL;
    for (;;) {
        while (PQisBusy(c)) {
            if ((w = wait_for(cat, POLLIN, deadline, in_lane)) <= 0)
                goto out;
            if (!PQconsumeInput(c))
                goto out;
        }
        if (!(r = PQgetResult(c)))
            return keep;
        if (PQstatus(c) == CONNECTION_OK)
            sl_pg_up(PG(cat)); /* an answer, if only an error */
        if (!keep ||
            (PQresultStatus(keep) != PGRES_FATAL_ERROR && PQresultStatus(r) == PGRES_FATAL_ERROR)) {
            PQclear(keep);
            keep = r;
        } else {
            PQclear(r);
        }
    }
out:
    /* The deadline passed, or waiting failed while the connection still looks fine: a statement
     * may be in flight on it, so it is given up either way. */
    PQclear(keep);
    *late = w == 0 || PQstatus(c) == CONNECTION_OK;
    return NULL;
}

/* A statement went unanswered for the catalog timeout: the connection is given up (a reply may
 * still be on its way) and made again as after a close; meanwhile statements fail at once. */
static int timed_out(sl_cat *cat, const char *op)
{
    pg *p = PG(cat);
    char where[512];

    p->stalled = 1;
    /* Since the statement was sent. */
    sl_pg_down(p,
               mono_ms() > (uint64_t)sl_pg_timeout_ms ? mono_ms() - (uint64_t)sl_pg_timeout_ms : 1);
    sl_db_count_error(cat);
    sl_pg_where(p->conn, where, sizeof(where));
    sl_log_error("catalog_timeout", "engine=postgresql op=%s after_ms=%d %s", op, sl_pg_timeout_ms,
                 where);
    sl_pg_listen_lost(p);
    return SL_ECATDOWN;
}

int sl_pg_script(sl_cat *cat, const char *sql, const char *op)
{
    PGresult *res;
    int late, err = ready(cat);

    if (err)
        return err;
    if (!PQsendQuery(PG(cat)->conn, sql))
        return fail(cat, NULL, op, 0);
    res = await(cat, &late, op);
    if (late)
        return timed_out(cat, op);
    if (!res || (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK))
        err = fail(cat, res, op, 0);
    PQclear(res);
    sl_pg_collect(cat);
    return err;
}

/* ?N -> $N (the SQL of the query files has no '?' elsewhere). */
static int translate(pg *p, const char *sql)
{
    size_t n = strlen(sql);

    if (n >= sizeof(p->sql))
        return SL_EINVAL;
    for (size_t i = 0; i <= n; i++)
        p->sql[i] = sql[i] == '?' ? '$' : sql[i];
    return 0;
}

/* FNV-1a of a statement's text. */
static uint64_t text_hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL;

    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* The name of p->sql prepared on the connection (preparing it if needed) into name: 1; 0 to
 * send it unprepared (its first use, the cache is full, or PostgreSQL refused it: the unprepared
 * statement then reports why); SL_ECATDOWN if the connection failed or timed out. */
static int prepared(sl_cat *cat, int nparams, char *name, size_t len, const char *op)
{
    pg *p = PG(cat);
    uint64_t h = text_hash(p->sql);
    PGresult *res;
    int late, ok, k;

    for (int i = 0; i < p->nprep; i++)
        if (p->prep_hash[i] == h && strcmp(p->prep[i], p->sql) == 0) {
            snprintf(name, len, "s%d", i);
            return 1;
        }
    /* Prepared at its second use: a text that carries its values (a group commit's rows) is
     * run once and never prepared. */
    for (k = 0; k < SEEN_MAX && p->seen[k] != h; k++)
        ;
    if (k == SEEN_MAX) {
        p->seen[p->seen_at] = h;
        p->seen_at = (p->seen_at + 1) % SEEN_MAX;
        return 0;
    }
    if (p->nprep == PREP_MAX)
        return 0;
    snprintf(name, len, "s%d", p->nprep);
    if (!PQsendPrepare(p->conn, name, p->sql, nparams, NULL))
        return fail(cat, NULL, op, 0);
    res = await(cat, &late, op);
    if (late)
        return timed_out(cat, op);
    ok = res && PQresultStatus(res) == PGRES_COMMAND_OK;
    PQclear(res);
    if (!ok)
        return PQstatus(p->conn) == CONNECTION_OK ? 0 : SL_ECATDOWN;
    if (!(p->prep[p->nprep] = strdup(p->sql)))
        return 0; /* prepared but unnamed here: harmless */
    p->prep_hash[p->nprep++] = h;
    return 1;
}

static int run(sl_db_q *q, const char *sql, int constraint_err)
{
    pg *p = PG(q->cat);
    const char *values[SL_DB_MAX_PARAMS];
    int lengths[SL_DB_MAX_PARAMS], formats[SL_DB_MAX_PARAMS];
    char nums[SL_DB_MAX_PARAMS][24];
    PGresult *res;
    ExecStatusType st;
    char name[16];
    int late, prep, err = ready(q->cat);

    if (err)
        return err;
    if ((err = translate(p, sql)) != 0)
        return err;
    for (int i = 0; i < q->nparams; i++) {
        const sl_db_param *pa = &q->params[i];
        lengths[i] = formats[i] = 0;
        values[i] = NULL;
        if (pa->kind == SL_DB_P_INT) {
            snprintf(nums[i], sizeof(nums[i]), "%lld", (long long)pa->i);
            values[i] = nums[i];
        } else if (pa->kind == SL_DB_P_TEXT) {
            values[i] = pa->p;
        } else if (pa->kind == SL_DB_P_BLOB) {
            values[i] = pa->p;
            lengths[i] = (int)pa->n;
            formats[i] = 1;
        }
    }
    if ((prep = prepared(q->cat, q->nparams, name, sizeof(name), q->op)) < 0)
        return prep;
    if (!(prep ? PQsendQueryPrepared(p->conn, name, q->nparams, values, lengths, formats, 0)
               : PQsendQueryParams(p->conn, p->sql, q->nparams, NULL, values, lengths, formats, 0)))
        return fail(q->cat, NULL, q->op, constraint_err);
    res = await(q->cat, &late, q->op);
    if (late)
        return timed_out(q->cat, q->op);
    sl_pg_collect(q->cat);
    st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        err = fail(q->cat, res, q->op, constraint_err);
        PQclear(res);
        return err;
    }
    q->res = res;
    q->row = -1;
    q->rows = PQntuples(res);
    q->changes = strtoll(PQcmdTuples(res)[0] ? PQcmdTuples(res) : "0", NULL, 10);
    return 0;
}

static void free_tmp(sl_db_q *q)
{
    for (size_t i = 0; i < sizeof(q->tmp) / sizeof(q->tmp[0]); i++) {
        if (q->tmp[i])
            PQfreemem(q->tmp[i]);
        q->tmp[i] = NULL;
    }
}

static int next(sl_db_q *q)
{
    free_tmp(q);
    if (!q->res || q->row + 1 >= q->rows)
        return 0;
    q->row++;
    return 1;
}

static int isnull(sl_db_q *q, int col)
{
    return PQgetisnull(q->res, q->row, col);
}

static int64_t int64(sl_db_q *q, int col)
{
    return isnull(q, col) ? 0 : strtoll(PQgetvalue(q->res, q->row, col), NULL, 10);
}

static const char *text(sl_db_q *q, int col)
{
    return isnull(q, col) ? NULL : PQgetvalue(q->res, q->row, col);
}

static const void *blob(sl_db_q *q, int col, size_t *len)
{
    size_t n = 0;

    *len = 0;
    if (isnull(q, col) || col >= (int)(sizeof(q->tmp) / sizeof(q->tmp[0])))
        return NULL;
    if (!q->tmp[col]) {
        q->tmp[col] = PQunescapeBytea((const unsigned char *)PQgetvalue(q->res, q->row, col), &n);
        q->tmp_len[col] = n;
    }
    *len = q->tmp[col] ? q->tmp_len[col] : 0;
    return *len ? q->tmp[col] : NULL;
}

static void end(sl_db_q *q)
{
    free_tmp(q);
    PQclear(q->res);
    q->res = NULL;
}

static int tx_begin(sl_cat *cat)
{
    int err = sl_pg_script(cat, "BEGIN", "begin");

    if (!err)
        PG(cat)->in_tx = 1;
    return err;
}

static int tx_end(sl_cat *cat, int err)
{
    pg *p = PG(cat);

    if (!err)
        err = sl_pg_script(cat, "COMMIT", "commit");
    if (err && PQstatus(p->conn) == CONNECTION_OK && PQtransactionStatus(p->conn) != PQTRANS_IDLE)
        sl_pg_script(cat, "ROLLBACK", "rollback");
    p->in_tx = 0;
    return err;
}

static int check(sl_cat *cat)
{
    (void)cat;
    return 0;
}

static int copy(sl_cat *cat, int fd)
{
    (void)cat;
    (void)fd;
    return SL_EUNIMPL;
}

static const char *problem(const sl_cat *cat)
{
    (void)cat;
    return NULL;
}

/* Unreachable once nothing sent for the catalog timeout got an answer: a statement that timed
 * out counts from when it was sent, a refused connection from when it was refused. */
static int unreachable(const sl_cat *cat)
{
    const pg *p = PG(cat);

    return p->down_ms && mono_ms() - p->down_ms >= (uint64_t)sl_pg_timeout_ms;
}

static void describe(const sl_cat *cat, char *buf, size_t len)
{
    char where[512];

    sl_pg_where(((const pg *)cat->conn)->conn, where, sizeof(where));
    snprintf(buf, len, "postgresql %s", where);
}

static void pg_close(sl_cat *cat)
{
    pg *p = PG(cat);

    if (!p)
        return;
    sl_pg_forget_prepared(p);
    PQfinish(p->conn);
    explicit_bzero(p, sizeof(*p));
    free(p);
    cat->conn = NULL;
}

static int announce(sl_cat *cat, const char *payload)
{
    char text[SL_CAT_FEED_NAME_MAX + 32];
    sl_db_q q;

    snprintf(text, sizeof(text), "%s %s", sl_pg_mark(), payload);
    sl_db_q_init(&q, cat, "announce");
    sl_db_text(&q, text);
    return sl_db_exec(&q, "SELECT pg_notify('" CHANNEL "', ?1)", 0, NULL);
}

/* LISTEN on the connection. */
static int listen_cmd(sl_cat *cat)
{
    return sl_pg_script(cat, "LISTEN " CHANNEL, "listen");
}

/* In the lane, after a reconnect: LISTEN again, and "*" since announcements made while there was
 * no connection were lost. */
static void relisten(void *arg, int b)
{
    sl_cat *cat = arg;

    (void)b;
    if (!PG(cat)->loop)
        return;
    if (listen_cmd(cat) != 0)
        sl_pg_listen_lost(PG(cat));
    else
        sl_pg_push(PG(cat), "*");
}

static int pg_listen(sl_cat *cat, uv_loop_t *loop, sl_cat_notify_fn fn, void *arg)
{
    int err = sl_pg_watch_start(cat, loop, fn, arg, relisten);

    return err ? err : listen_cmd(cat);
}

/* Session advisory locks: held until released or the connection ends. The key is the
 * migration lock's plus the chore's id. */
static int chore(sl_cat *cat, int id, int how)
{
    static const char *const sql[] = {
        "SELECT CASE WHEN pg_advisory_unlock(?1) THEN 1 ELSE 0 END",
        "SELECT CASE WHEN pg_try_advisory_lock(?1) THEN 1 ELSE 0 END",
        "SELECT 1 FROM (SELECT pg_advisory_lock(?1)) AS l",
    };
    sl_db_q q;
    int rc, err;

    sl_db_q_init(&q, cat, how ? "chore_take" : "chore_done");
    sl_db_int(&q, 5193041203LL + id);
    err = sl_db_run(&q, sql[how], 0);
    if (!err) {
        rc = sl_db_next(&q);
        err = rc == 1 ? (int)sl_db_int_col(&q, 0) : rc == 0 ? SL_EDB : rc;
    }
    sl_db_end(&q);
    return err;
}

const sl_db_engine sl_db_pg = {
    .name = "postgresql",
    .migrations = sl_db_pg_migrations,
    .n_migrations = SL_DB_PG_MIGRATIONS,
    .migrate_lock = MIGRATE_LOCK,
    .name_lock = NAME_LOCK,
    .script = sl_pg_script,
    .run = run,
    .next = next,
    .isnull = isnull,
    .int64 = int64,
    .text = text,
    .blob = blob,
    .end = end,
    .tx_begin = tx_begin,
    .tx_end = tx_end,
    .check = check,
    .copy = copy,
    .problem = problem,
    .describe = describe,
    .unreachable = unreachable,
    .announce = announce,
    .listen = pg_listen,
    .unlisten = sl_pg_unlisten,
    .chore = chore,
    .close = pg_close,
};

/* The server's notices ("relation ... already exists, skipping") are not for the daemon's
 * log: libpq would print them to stderr. */
static void quiet(void *arg, const char *message)
{
    (void)arg;
    (void)message;
}

int sl_db_pg_open(sl_cat *cat, const char *where, const char *password_file)
{
    pg *p = calloc(1, sizeof(*p));
    char pw[1024] = "", desc[512];
    /* Before dbname: the conninfo's own settings of these win. Keepalives find a server gone
     * while the connection is idle (listening) within ~25 s; tcp_user_timeout bounds unacked
     * writes. */
    const char *keys[] = {"connect_timeout",  "keepalives",
                          "keepalives_idle",  "keepalives_interval",
                          "keepalives_count", "tcp_user_timeout",
                          "application_name", "dbname",
                          "password",         NULL};
    char app[32], connect_s[16], user_ms[16];
    const char *vals[] = {connect_s, "1", "10", "5", "3", user_ms, app, where, NULL, NULL};
    int err;

    if (!p)
        return -ENOMEM;
    cat->conn = p;
    /* "sluiced <mark>": the process's connections tell other replicas' apart (sl_cat_peers). */
    snprintf(app, sizeof(app), "sluiced %s", sl_pg_mark());
    snprintf(connect_s, sizeof(connect_s), "%d", (sl_pg_timeout_ms + 999) / 1000);
    snprintf(user_ms, sizeof(user_ms), "%d", sl_pg_timeout_ms > 10000 ? sl_pg_timeout_ms : 10000);
    if ((err = sl_db_pg_check_conninfo(where)) != 0)
        return err;
    if (password_file && (err = sl_db_pg_read_password(password_file, pw, sizeof(pw))) != 0)
        return err;
    if (pw[0])
        vals[8] = pw;
    else
        keys[8] = NULL;
    p->conn = PQconnectdbParams(keys, vals, 1);
    explicit_bzero(pw, sizeof(pw));
    if (!p->conn)
        return -ENOMEM;
    PQsetNoticeProcessor(p->conn, quiet, NULL);
    sl_pg_where(p->conn, desc, sizeof(desc));
    if (PQstatus(p->conn) != CONNECTION_OK) {
        char msg[512];
        sl_db_pg_clean(msg, sizeof(msg), PQerrorMessage(p->conn));
        sl_log_error("catalog_open_failed", "engine=postgresql %s msg=\"%s\"", desc, msg);
        return SL_ECATDOWN;
    }
    sl_log_info("catalog_connected", "engine=postgresql %s server_version=%d", desc,
                PQserverVersion(p->conn));
    return 0;
}
