/* Private to server/catalog/: the statements of the catalog, written once (feed.c, ckpt.c,
 * catalog.c) against this engine-neutral layer and run by one of two engines: sqlite/ (the
 * embedded default) and pg/ (PostgreSQL through libpq).
 *
 * SQL is written in the dialect both engines share: parameters are ?1 .. ?N (the PostgreSQL
 * engine turns them into $1 .. $N), conflicts are INSERT .. ON CONFLICT .. DO UPDATE/NOTHING, a
 * parameter whose type the statement does not fix is CAST, no engine-only function (max() of
 * two values is a CASE). Only the migrations' DDL differs per engine (same numbers, same tables).
 *
 * A query: sl_db_q_init, bind the parameters in order (sl_db_int, sl_db_text, sl_db_blob), then
 * sl_db_run with its SQL; read rows with sl_db_next and the column getters; sl_db_end always
 * (also after a failed run). Text and blob parameters are borrowed until sl_db_run returns;
 * column values until the next sl_db_next or sl_db_end.
 */
#ifndef SL_CATALOG_DB_H
#define SL_CATALOG_DB_H

#include "catalog.h"
#include "feed.h"

#include <stddef.h>
#include <stdint.h>

#define SL_DB_MAX_PARAMS 16

enum { SL_DB_P_NULL, SL_DB_P_INT, SL_DB_P_TEXT, SL_DB_P_BLOB };

typedef struct sl_db_param {
    int kind;
    int64_t i;
    const void *p; /* text (NUL-terminated) or blob bytes */
    size_t n;      /* blob length */
} sl_db_param;

typedef struct sl_db_q {
    sl_cat *cat;
    const char *op; /* names the statement in logs */
    int nparams;
    sl_db_param params[SL_DB_MAX_PARAMS];
    void *res;       /* the engine's statement or result */
    int row, rows;   /* pg: the current row, how many */
    int pending;     /* sqlite: the first row was stepped by run */
    int64_t changes; /* rows a write changed */
    void *tmp[16];   /* pg: blobs decoded for the current row */
    size_t tmp_len[16];
} sl_db_q;

void sl_db_q_init(sl_db_q *q, sl_cat *cat, const char *op);
void sl_db_int(sl_db_q *q, int64_t v);
void sl_db_text(sl_db_q *q, const char *s);               /* NULL binds NULL */
void sl_db_blob(sl_db_q *q, const void *p, size_t n);     /* NULL binds NULL */
void sl_db_blob_opt(sl_db_q *q, const void *p, size_t n); /* NULL or 0 bytes bind NULL */

/* Run `sql` with the bound parameters. 0, `constraint_err` (when nonzero) for a violated
 * unique, foreign-key or check constraint, else the catalog's failure code (see catalog.h). */
int sl_db_run(sl_db_q *q, const char *sql, int constraint_err);

/* 1 when a row is ready, 0 at the end, or a failure code. */
int sl_db_next(sl_db_q *q);

int sl_db_isnull(sl_db_q *q, int col);
int64_t sl_db_int_col(sl_db_q *q, int col);
const char *sl_db_text_col(sl_db_q *q, int col); /* NULL for NULL */
/* A blob column, borrowed: NULL (and *len 0) for NULL or empty. */
const void *sl_db_blob_col(sl_db_q *q, int col, size_t *len);

void sl_db_end(sl_db_q *q);

/* sl_db_run of a statement that writes no rows back; *changes (may be NULL) gets how many rows
 * it changed. The common case, in one call. */
int sl_db_exec(sl_db_q *q, const char *sql, int constraint_err, int64_t *changes);

/* Copy text column `col` (NULL as "") into dst, cut to fit. */
void sl_db_copy_text(sl_db_q *q, int col, char *dst, size_t len);

/* Copy a blob column into b (malloc'd; NULL or empty: b->p NULL, len 0). 0 or -ENOMEM. */
int sl_db_copy_blob(sl_db_q *q, int col, sl_cat_blob *b);

/* A transaction: begin, the statements, end(err): commits if err is 0, else rolls back; returns
 * err or the commit's failure. */
int sl_db_tx_begin(sl_cat *cat);
int sl_db_tx_end(sl_cat *cat, int err);

/* What an engine provides (sqlite/engine.c, pg/engine.c). */
typedef struct sl_db_engine {
    const char *name;
    const char *const *migrations; /* the DDL of migration 1 .. n, in this engine's dialect */
    int n_migrations;
    const char *migrate_lock; /* a statement that serializes migrations between processes */
    /* A statement that serializes, until the transaction ends, the processes that create
     * names (sl_cat_name_clash); NULL where a write transaction already excludes the others. */
    const char *name_lock;
    int (*script)(sl_cat *cat, const char *sql, const char *op); /* several statements */
    int (*run)(sl_db_q *q, const char *sql, int constraint_err);
    int (*next)(sl_db_q *q);
    int (*isnull)(sl_db_q *q, int col);
    int64_t (*int64)(sl_db_q *q, int col);
    const char *(*text)(sl_db_q *q, int col);
    const void *(*blob)(sl_db_q *q, int col, size_t *len);
    void (*end)(sl_db_q *q);
    int (*tx_begin)(sl_cat *cat);
    int (*tx_end)(sl_cat *cat, int err);
    int (*check)(sl_cat *cat);
    int (*copy)(sl_cat *cat, int fd);
    const char *(*problem)(const sl_cat *cat);
    void (*describe)(const sl_cat *cat, char *buf, size_t len);
    /* Shared catalogs only (NULL for SQLite). */
    int (*announce)(sl_cat *cat, const char *payload);
    int (*listen)(sl_cat *cat, struct uv_loop_s *loop, sl_cat_notify_fn fn, void *arg);
    void (*unlisten)(sl_cat *cat);
    int (*chore)(sl_cat *cat, int id, int how); /* 1: try the lock, 2: wait for it, 0: release */
    int (*unreachable)(const sl_cat *cat);      /* sl_cat_unreachable */
    void (*close)(sl_cat *cat);
} sl_db_engine;

extern const sl_db_engine sl_db_sqlite;
extern const sl_db_engine sl_db_pg;

/* Open the engine's connection into cat->conn (sqlite: the file at `where`; pg: the conninfo,
 * the password from `password_file` when not NULL). 0 or a failure code (logged). */
int sl_db_sqlite_open(sl_cat *cat, const char *where);
int sl_db_pg_open(sl_cat *cat, const char *where, const char *password_file);

/* The first line of `path` (a file only its owner may read) into pw (pg/conninfo.c). */
int sl_db_pg_read_password(const char *path, char *pw, size_t len);

/* sl_db_pg_check, its refusal logged (pg/conninfo.c). */
int sl_db_pg_check_conninfo(const char *where);

/* libpq's message on one line, fit for a quoted log value (pg/conninfo.c). */
void sl_db_pg_clean(char *dst, size_t len, const char *msg);

/* The PostgreSQL engine's migrations 1 .. SL_DB_PG_MIGRATIONS (pg/schema.c): the same tables as
 * the SQLite engine's, in PostgreSQL's dialect. Append only. */
#define SL_DB_PG_MIGRATIONS 9
extern const char *const sl_db_pg_migrations[SL_DB_PG_MIGRATIONS];

/* sl_cat_set_timeout for the PostgreSQL engine. */
void sl_db_pg_set_timeout(int ms);

/* The checks sl_db_pg_open makes before connecting: SL_EINVAL and a sentence in msg. */
int sl_db_pg_check(const char *where, char *msg, size_t len);
int sl_db_pg_password_check(const char *path, char *msg, size_t len);

/* Tell the other replicas (sl_cat_listen) that rows changed: `kind` 'j' (a job's row) or 'p'
 * (its progress) of job `name`; inside a transaction, they hear it once it commits. Nothing for
 * SQLite. */
int sl_db_announce(sl_cat *cat, char kind, const char *name);

/* Count a failed statement (for the metrics endpoint). Any thread. */
void sl_db_count_error(sl_cat *cat);

#endif
