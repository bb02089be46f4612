/* The catalog's engine-neutral part: opening either engine, the migrations, and the statement
 * layer of db.h that the query files use. */
#include "catalog.h"

#include "internal.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sl_db_count_error(sl_cat *cat)
{
    atomic_fetch_add(&cat->errors, 1);
}

void sl_db_q_init(sl_db_q *q, sl_cat *cat, const char *op)
{
    memset(q, 0, sizeof(*q));
    q->cat = cat;
    q->op = op;
}

static sl_db_param *param(sl_db_q *q)
{
    /* A statement with more parameters is a bug caught by every test that runs it. */
    if (q->nparams >= SL_DB_MAX_PARAMS)
        abort();
    return &q->params[q->nparams++];
}

void sl_db_int(sl_db_q *q, int64_t v)
{
    sl_db_param *p = param(q);

    p->kind = SL_DB_P_INT;
    p->i = v;
}

void sl_db_text(sl_db_q *q, const char *s)
{
    sl_db_param *p = param(q);

    p->kind = s ? SL_DB_P_TEXT : SL_DB_P_NULL;
    p->p = s;
}

void sl_db_blob(sl_db_q *q, const void *b, size_t n)
{
    sl_db_param *p = param(q);

    p->kind = b ? SL_DB_P_BLOB : SL_DB_P_NULL;
    p->p = b ? b : "";
    p->n = n;
}

void sl_db_blob_opt(sl_db_q *q, const void *b, size_t n)
{
    sl_db_blob(q, n ? b : NULL, n);
}

int sl_db_run(sl_db_q *q, const char *sql, int constraint_err)
{
    return q->cat->eng->run(q, sql, constraint_err);
}

int sl_db_next(sl_db_q *q)
{
    return q->cat->eng->next(q);
}

int sl_db_isnull(sl_db_q *q, int col)
{
    return q->cat->eng->isnull(q, col);
}

int64_t sl_db_int_col(sl_db_q *q, int col)
{
    return q->cat->eng->int64(q, col);
}

const char *sl_db_text_col(sl_db_q *q, int col)
{
    return q->cat->eng->text(q, col);
}

const void *sl_db_blob_col(sl_db_q *q, int col, size_t *len)
{
    return q->cat->eng->blob(q, col, len);
}

void sl_db_end(sl_db_q *q)
{
    q->cat->eng->end(q);
}

int sl_db_exec(sl_db_q *q, const char *sql, int constraint_err, int64_t *changes)
{
    int err = sl_db_run(q, sql, constraint_err);

    if (changes)
        *changes = q->changes;
    sl_db_end(q);
    return err;
}

void sl_db_copy_text(sl_db_q *q, int col, char *dst, size_t len)
{
    const char *s = sl_db_text_col(q, col);

    snprintf(dst, len, "%s", s ? s : "");
}

int sl_db_copy_blob(sl_db_q *q, int col, sl_cat_blob *b)
{
    size_t n;
    const void *p = sl_db_blob_col(q, col, &n);

    b->p = NULL;
    b->len = 0;
    if (!p)
        return 0;
    if (!(b->p = malloc(n)))
        return -ENOMEM;
    memcpy(b->p, p, n);
    b->len = n;
    return 0;
}

int sl_db_tx_begin(sl_cat *cat)
{
    return cat->eng->tx_begin(cat);
}

int sl_db_tx_end(sl_cat *cat, int err)
{
    return cat->eng->tx_end(cat, err);
}

unsigned long sl_cat_errors(const sl_cat *cat)
{
    return atomic_load(&((sl_cat *)cat)->errors);
}

int sl_cat_latest_version(void)
{
    /* Both engines have the same numbered migrations (checked at open). */
    return sl_db_sqlite.n_migrations;
}

int sl_cat_schema_version(const sl_cat *cat)
{
    return cat->version;
}

const char *sl_cat_engine(const sl_cat *cat)
{
    return cat->eng->name;
}

/* The schema version recorded, -1 when none is. */
static int read_version(sl_cat *cat, int *version)
{
    sl_db_q q;
    int rc, err;

    sl_db_q_init(&q, cat, "read_version");
    err = sl_db_run(&q, "SELECT version FROM schema_version", 0);
    if (!err && (rc = sl_db_next(&q)) >= 0)
        *version = rc == 1 ? (int)sl_db_int_col(&q, 0) : -1;
    else if (!err)
        err = rc;
    sl_db_end(&q);
    return err;
}

/* One step of the migrations, in one transaction that holds the engine's migration lock: read
 * where the schema is and apply the next migration if it is short of `target`. *done once it is
 * there. Several daemons starting at once on one catalog take turns; each finds the work of
 * the others done. */
static int migrate_step(sl_cat *cat, int target, int *done)
{
    const sl_db_engine *e = cat->eng;
    char sql[64];
    int version = 0, err = sl_db_tx_begin(cat);

    if (err)
        return err;
    if (e->migrate_lock)
        err = e->script(cat, e->migrate_lock, "migrate_lock");
    if (!err)
        err = e->script(cat, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
                        "create_schema_version");
    if (!err)
        err = read_version(cat, &version);
    if (!err && version < 0) {
        err = e->script(cat, "INSERT INTO schema_version(version) VALUES (0)", "init_version");
        version = 0;
    }
    if (!err && version > e->n_migrations) {
        sl_log_error("catalog_too_new", "schema_version=%d supported=%d", version, e->n_migrations);
        err = SL_ESTATE;
    }
    *done = !err && version >= target;
    if (!err && !*done) {
        err = e->script(cat, e->migrations[version], "migrate");
        snprintf(sql, sizeof(sql), "UPDATE schema_version SET version = %d", version + 1);
        if (!err)
            err = e->script(cat, sql, "set_version");
    }
    err = sl_db_tx_end(cat, err);
    if (!err && !*done)
        sl_log_info("catalog_migrated", "engine=%s schema_version=%d", e->name, version + 1);
    if (!err)
        cat->version = *done ? version : version + 1;
    return err;
}

static int migrate(sl_cat *cat, int target)
{
    int done = 0, err = 0;

    while (!err && !done)
        err = migrate_step(cat, target, &done);
    return err;
}

static int prefixed(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

int sl_cat_is_pg(const char *spec)
{
    return prefixed(spec, "postgresql://") || prefixed(spec, "postgres://") ||
           prefixed(spec, "postgresql:") || prefixed(spec, "pg:");
}

/* A PostgreSQL spec without its "pg:" / "postgresql:" prefix (URIs keep theirs). */
static const char *pg_conninfo(const char *spec)
{
    if (prefixed(spec, "pg:"))
        return spec + 3;
    if (prefixed(spec, "postgresql:") && !prefixed(spec, "postgresql://"))
        return spec + strlen("postgresql:");
    return spec;
}

int sl_cat_spec_check(const char *spec, const char *password_file, char *msg, size_t len)
{
    int err = 0;

    msg[0] = '\0';
    if (sl_cat_is_pg(spec)) {
        err = sl_db_pg_check(pg_conninfo(spec), msg, len);
        if (!err && password_file && password_file[0])
            err = sl_db_pg_password_check(password_file, msg, len);
    } else if (password_file && password_file[0]) {
        snprintf(msg, len, "--catalog-password-file is for a PostgreSQL --catalog");
        err = SL_EINVAL;
    } else if (prefixed(spec, "sqlite:") && !spec[7]) {
        snprintf(msg, len, "--catalog sqlite: names no file");
        err = SL_EINVAL;
    }
    return err;
}

static int open_spec(sl_cat **out, const char *spec, const char *password_file, int version)
{
    sl_cat *cat;
    int err;

    *out = NULL;
    if (sl_db_pg.n_migrations != sl_db_sqlite.n_migrations)
        abort(); /* a migration added to one engine only: caught by every test */
    if (version < 0 || version > sl_db_sqlite.n_migrations)
        return SL_EINVAL;
    if (!(cat = calloc(1, sizeof(*cat))))
        return -ENOMEM;
    if (sl_cat_is_pg(spec)) {
        cat->eng = &sl_db_pg;
        err = sl_db_pg_open(cat, pg_conninfo(spec), password_file);
    } else {
        cat->eng = &sl_db_sqlite;
        err = sl_db_sqlite_open(cat, prefixed(spec, "sqlite:") ? spec + 7 : spec);
    }
    if (!err)
        err = migrate(cat, version);
    if (err) {
        sl_cat_close(cat);
        return err;
    }
    *out = cat;
    return 0;
}

int sl_cat_open(sl_cat **out, const char *path)
{
    return open_spec(out, path, NULL, sl_db_sqlite.n_migrations);
}

int sl_cat_open_upto(sl_cat **out, const char *path, int version)
{
    return open_spec(out, path, NULL, version);
}

int sl_cat_open_spec(sl_cat **out, const char *spec, const char *password_file)
{
    return open_spec(out, spec, password_file, sl_db_sqlite.n_migrations);
}

int sl_cat_open_spec_upto(sl_cat **out, const char *spec, const char *password_file, int version)
{
    return open_spec(out, spec, password_file, version);
}

void sl_cat_describe(const sl_cat *cat, char *buf, size_t len)
{
    cat->eng->describe(cat, buf, len);
}

int sl_cat_meta_claim(sl_cat *cat, const char *key, const char *value, char *out, size_t len)
{
    sl_db_q q;
    int err;

    sl_db_q_init(&q, cat, "meta_claim");
    sl_db_text(&q, key);
    sl_db_text(&q, value);
    err = sl_db_exec(&q,
                     "INSERT INTO catalog_meta(key, value) VALUES (?1, ?2) "
                     "ON CONFLICT (key) DO NOTHING",
                     0, NULL);
    if (err)
        return err;
    err = sl_cat_meta_get(cat, key, out, len);
    /* The row was just made or found: its absence now is the catalog's failure. */
    return err == SL_ENOTFOUND ? SL_EDB : err;
}

int sl_cat_meta_get(sl_cat *cat, const char *key, char *out, size_t len)
{
    sl_db_q q;
    int rc, err;

    sl_db_q_init(&q, cat, "meta_get");
    sl_db_text(&q, key);
    err = sl_db_run(&q, "SELECT value FROM catalog_meta WHERE key = ?1", 0);
    if (!err) {
        rc = sl_db_next(&q);
        if (rc == 1)
            sl_db_copy_text(&q, 0, out, len);
        err = rc == 1 ? 0 : rc == 0 ? SL_ENOTFOUND : rc;
    }
    sl_db_end(&q);
    return err;
}

int sl_cat_name_clash(sl_cat *cat, int kind, const char *job, const char *name, char *other,
                      size_t len)
{
    /* lower() folds ASCII letters in both engines, and names are ASCII (sl_name_check). */
    static const char *const sql[] = {
        [SL_CAT_NAME_DATASET] = "SELECT name FROM feed_datasets WHERE lower(name) = lower(?1) "
                                "AND name <> ?1 LIMIT 1",
        [SL_CAT_NAME_JOB] = "SELECT name FROM feed_jobs WHERE lower(name) = lower(?1) AND "
                            "name <> ?1 UNION SELECT job FROM checkpoints WHERE lower(job) = "
                            "lower(?1) AND job <> ?1 LIMIT 1",
        [SL_CAT_NAME_CKPT] = "SELECT name FROM checkpoints WHERE job = ?2 AND lower(name) = "
                             "lower(?1) AND name <> ?1 LIMIT 1",
    };
    sl_db_q q;
    int rc, err = 0;

    if (kind < SL_CAT_NAME_DATASET || kind > SL_CAT_NAME_CKPT)
        return SL_EINVAL;
    if (cat->eng->name_lock)
        err = cat->eng->script(cat, cat->eng->name_lock, "name_lock");
    if (err)
        return err;
    sl_db_q_init(&q, cat, "name_clash");
    sl_db_text(&q, name);
    if (kind == SL_CAT_NAME_CKPT)
        sl_db_text(&q, job);
    err = sl_db_run(&q, sql[kind], 0);
    if (!err) {
        rc = sl_db_next(&q);
        if (rc == 1)
            sl_db_copy_text(&q, 0, other, len);
        err = rc == 1 ? SL_EEXIST : rc;
    }
    sl_db_end(&q);
    return err;
}

int sl_cat_unreachable(const sl_cat *cat)
{
    return cat && cat->eng->unreachable ? cat->eng->unreachable(cat) : 0;
}

int sl_cat_shared(const sl_cat *cat)
{
    return cat->eng->announce != NULL;
}

int sl_db_announce(sl_cat *cat, char kind, const char *name)
{
    char payload[SL_CAT_FEED_NAME_MAX + 4];

    if (!cat->eng->announce)
        return 0;
    snprintf(payload, sizeof(payload), "%c %s", kind, name);
    return cat->eng->announce(cat, payload);
}

int sl_cat_listen(sl_cat *cat, struct uv_loop_s *loop, sl_cat_notify_fn fn, void *arg)
{
    return cat->eng->listen ? cat->eng->listen(cat, loop, fn, arg) : 0;
}

static void unlisten_now(void *arg)
{
    sl_cat *cat = arg;

    cat->lane_on = 0;
    if (cat->eng->unlisten)
        cat->eng->unlisten(cat);
}

/* The socket watch the lane's statements wait on goes only once the lane is idle. */
void sl_cat_unlisten(sl_cat *cat)
{
    if (!cat)
        return;
    if (cat->lane)
        sl_lane_when_idle(cat->lane, unlisten_now, cat);
    else
        unlisten_now(cat);
}

int sl_cat_lane_start(sl_cat *cat)
{
    int err;

    if (!sl_cat_shared(cat) || cat->lane)
        return 0;
    if ((err = sl_lane_new(&cat->lane)) != 0)
        return err;
    cat->lane_on = 1;
    return 0;
}

void sl_cat_lane_run(sl_cat *cat, sl_cat_work_fn fn, void *a, int b)
{
    if (cat && cat->lane_on)
        sl_lane_run(cat->lane, fn, a, b);
    else
        fn(a, b);
}

static void after_in_lane(void *a, int status)
{
    sl_cat_work *w = a;

    w->after(&w->work, status);
}

static void after_work(uv_work_t *u, int status)
{
    sl_cat_work *w = (sl_cat_work *)u; /* `work` is its first member */

    sl_cat_lane_run(w->cat, after_in_lane, w, status);
}

int sl_cat_queue_work(sl_cat *cat, uv_loop_t *loop, sl_cat_work *w, uv_work_cb fn,
                      uv_after_work_cb after)
{
    w->cat = cat;
    w->after = after;
    return uv_queue_work(loop, &w->work, fn, after_work);
}

unsigned long sl_cat_blocking(const sl_cat *cat)
{
    return cat ? atomic_load(&cat->blocking) : 0;
}

int sl_db_outside_lane(sl_cat *cat, const char *op)
{
    if (!cat->lane_on || sl_lane_here(cat->lane))
        return 0;
    atomic_fetch_add(&cat->blocking, 1);
    sl_log_limited(SL_LOG_ERROR, 1000, "catalog_blocking",
                   "op=%s msg=\"a statement waited on the loop thread outside the catalog lane\"",
                   op);
    return 1;
}

int sl_cat_peers(sl_cat *cat)
{
    sl_db_q q;
    int n = 0;

    if (!sl_cat_shared(cat))
        return 0;
    sl_db_q_init(&q, cat, "peers");
    /* Other processes' sessions: this one's all carry its own application_name. */
    if (sl_db_run(&q,
                  "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "
                  "application_name LIKE 'sluiced %' AND application_name != "
                  "current_setting('application_name')",
                  0) == 0 &&
        sl_db_next(&q) == 1)
        n = (int)sl_db_int_col(&q, 0);
    sl_db_end(&q);
    return n;
}

void sl_cat_set_timeout(int ms)
{
    sl_db_pg_set_timeout(ms);
}

int sl_cat_chore_try(sl_cat *cat, int id)
{
    return cat->eng->chore ? cat->eng->chore(cat, id, 1) : 1;
}

int sl_cat_chore_wait(sl_cat *cat, int id)
{
    int err = cat->eng->chore ? cat->eng->chore(cat, id, 2) : 1;

    return err == 1 ? 0 : err < 0 ? err : SL_EDB;
}

void sl_cat_chore_done(sl_cat *cat, int id)
{
    if (cat->eng->chore)
        cat->eng->chore(cat, id, 0);
}

int sl_cat_check(sl_cat *cat)
{
    return cat->eng->check(cat);
}

int sl_cat_copy(sl_cat *cat, int fd)
{
    return cat->eng->copy(cat, fd);
}

const char *sl_cat_problem(const sl_cat *cat)
{
    return cat->eng->problem(cat);
}

void sl_cat_on_lost(sl_cat *cat, sl_cat_lost_fn fn, void *arg)
{
    cat->on_lost = fn;
    cat->on_lost_arg = arg;
}

void sl_cat_close(sl_cat *cat)
{
    if (!cat)
        return;
    sl_cat_unlisten(cat);
    if (cat->conn)
        cat->eng->close(cat);
    sl_lane_free(cat->lane);
    free(cat);
}
