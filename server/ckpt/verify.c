/* Verify: every recorded shard checked on the worker pool in parallel (quick: size and header
 * against the catalog; deep: also the data's SHA-256), and for a COMPLETE checkpoint the
 * metadata file compared byte for byte with what the catalog renders.
 *
 * Deep verification is the one that can hold the worker pool (seconds per shard), so its shard
 * jobs have a budget of their own: at most opts.max_deep_verifies of them on the pool at once,
 * all calls together, the others waiting in the service's queue (calls served in turn, one shard
 * at a time), at most DEEP_CALLS_MAX deep calls in progress. A cancelled call leaves the queue
 * at once and its running jobs stop within one 1 MiB block. */
#include "internal.h"

#include "err.h"
#include "log.h"
#include "metrics.h"
#include "store/layout.h"
#include "store/sstore.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct vjob {
    sl_cat_work work;
    verify *v;
    int32_t rank; /* -1: the metadata file */
    int queued;
    int deep; /* on the pool as one of the service's deep hash jobs */
    uint64_t data_size, file_size;
    char sha[SL_SHARD_HEX_LEN + 1];
    int verdict;
    char detail[200];
} vjob;

struct verify {
    sl_rpc_call *call;
    sl_ckpt_svc *svc;
    sl_cat_ckpt ck;
    int deep;
    int pending;
    atomic_int cancelled; /* set on the loop, read by the workers between blocks */
    int counted;          /* counts in svc->deep_calls */
    int32_t next;         /* deep: the first shard not yet handed to the pool */
    int waiting;          /* deep: in the service's queue */
    verify *qnext;
    vjob *jobs;  /* world_size shards, then the metadata file */
    sl_buf meta; /* the expected metadata.json */
};

static void verify_free(verify *v)
{
    free(v->jobs);
    sl_buf_free(&v->meta);
    free(v);
}

/* Object storage: FETCHERS threads GET the next blocks (ranged GETs of FETCH_BLOCK bytes) into
 * FETCH_BUFS buffers while the worker hashes the earlier ones in order, so the network and the
 * hash overlap. A block is fetched only once the hash is within FETCH_BUFS blocks of it. */
#define FETCHERS    2
#define FETCH_BUFS  4
#define FETCH_BLOCK (8u << 20)

typedef struct fetch {
    const sl_sstore *st;
    sl_sreader *r;
    uint64_t data_size;
    uint64_t nblocks;
    uint8_t *buf[FETCH_BUFS];
    int ready[FETCH_BUFS]; /* 1: block `slot_block[i]` is in buf[i] */
    uint64_t slot_block[FETCH_BUFS];
    uint64_t claim;  /* the next block a fetcher takes */
    uint64_t hashed; /* blocks hashed */
    int err, quit;
    char why[160];
    const atomic_int *stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} fetch;

static size_t fetch_len(const fetch *f, uint64_t b)
{
    uint64_t pos = b * FETCH_BLOCK;

    return f->data_size - pos < FETCH_BLOCK ? (size_t)(f->data_size - pos) : FETCH_BLOCK;
}

static void *fetch_main(void *arg)
{
    fetch *f = arg;
    char why[160];

    pthread_mutex_lock(&f->mu);
    for (;;) {
        uint64_t b;
        int slot, err;
        while (!f->quit && !f->err && f->claim < f->nblocks && f->claim >= f->hashed + FETCH_BUFS)
            pthread_cond_wait(&f->cv, &f->mu);
        if (f->quit || f->err || f->claim >= f->nblocks)
            break;
        b = f->claim++;
        slot = (int)(b % FETCH_BUFS);
        pthread_mutex_unlock(&f->mu);
        why[0] = '\0';
        err = atomic_load(f->stop)
                  ? SL_ECANCELLED
                  : f->st->ops->r_read(f->r, f->buf[slot], fetch_len(f, b),
                                       SL_SHARD_HEADER_SIZE + b * FETCH_BLOCK, why, sizeof(why));
        pthread_mutex_lock(&f->mu);
        if (err && !f->err) {
            f->err = err;
            snprintf(f->why, sizeof(f->why), "%s", why);
        }
        f->slot_block[slot] = b;
        f->ready[slot] = 1;
        pthread_cond_broadcast(&f->cv);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

/* Hash the data of a remote shard into sha with the fetchers. Returns 0 or the error (why). */
static int hash_remote(const sl_sstore *st, sl_sreader *r, uint64_t data_size, sl_sha256 *sha,
                       const atomic_int *stop, char *why, size_t whylen)
{
    fetch f;
    pthread_t th[FETCHERS];
    int started = 0, err = 0;

    memset(&f, 0, sizeof(f));
    f.st = st;
    f.r = r;
    f.data_size = data_size;
    f.nblocks = (data_size + FETCH_BLOCK - 1) / FETCH_BLOCK;
    f.stop = stop;
    pthread_mutex_init(&f.mu, NULL);
    pthread_cond_init(&f.cv, NULL);
    for (int i = 0; i < FETCH_BUFS && !err; i++)
        if (!(f.buf[i] = malloc(FETCH_BLOCK)))
            err = -ENOMEM;
    for (int i = 0; i < FETCHERS && !err && (uint64_t)i < f.nblocks; i++) {
        if (pthread_create(&th[i], NULL, fetch_main, &f) != 0)
            break;
        started++;
    }
    if (!err && !started && f.nblocks)
        err = -EAGAIN;
    for (uint64_t b = 0; !err && b < f.nblocks; b++) {
        int slot = (int)(b % FETCH_BUFS);
        pthread_mutex_lock(&f.mu);
        while (!f.err && !(f.ready[slot] && f.slot_block[slot] == b))
            pthread_cond_wait(&f.cv, &f.mu);
        err = f.err;
        pthread_mutex_unlock(&f.mu);
        if (!err && atomic_load(stop))
            err = SL_ECANCELLED;
        if (!err)
            err = sl_sha256_update(sha, f.buf[slot], fetch_len(&f, b));
        pthread_mutex_lock(&f.mu);
        f.ready[slot] = 0;
        f.hashed = b + 1;
        pthread_cond_broadcast(&f.cv);
        pthread_mutex_unlock(&f.mu);
    }
    pthread_mutex_lock(&f.mu);
    f.quit = 1;
    pthread_cond_broadcast(&f.cv);
    pthread_mutex_unlock(&f.mu);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    if (f.err)
        snprintf(why, whylen, "%s", f.why);
    for (int i = 0; i < FETCH_BUFS; i++)
        free(f.buf[i]);
    pthread_cond_destroy(&f.cv);
    pthread_mutex_destroy(&f.mu);
    return err;
}

/* Deep: the data section must hash to the catalog's checksum. From a directory it is read in
 * 1 MiB blocks, the cancel flag checked before each; from object storage with ranged GETs that
 * overlap the hashing (hash_remote). Returns the verdict. */
static int vjob_hash(vjob *j, sl_sreader *r)
{
    const sl_sstore *st = j->v->svc->opts.store;
    size_t block = 1u << 20;
    char got[SL_SHARD_HEX_LEN + 1], why[160] = "";
    sl_sha256 *sha = NULL;
    uint8_t *buf = NULL;
    int err = sl_sha256_new(&sha);

    if (!err && sl_sstore_remote(st)) {
        err = hash_remote(st, r, j->data_size, sha, &j->v->cancelled, why, sizeof(why));
    } else if (!err && !(buf = malloc(block))) {
        err = -ENOMEM;
    } else {
        for (uint64_t pos = 0; !err && pos < j->data_size; pos += block) {
            size_t n = j->data_size - pos < block ? (size_t)(j->data_size - pos) : block;
            if (atomic_load(&j->v->cancelled))
                err = SL_ECANCELLED;
            else if ((err = st->ops->r_read(r, buf, n, SL_SHARD_HEADER_SIZE + pos, why,
                                            sizeof(why))) == 0)
                err = sl_sha256_update(sha, buf, n);
        }
    }
    if (!err)
        err = sl_sha256_final(sha, got);
    sl_sha256_free(sha);
    free(buf);
    if (err) {
        snprintf(j->detail, sizeof(j->detail), "cannot hash: %s", why[0] ? why : sl_strerror(err));
        return err == SL_ECORRUPT ? SLUICE__V1__VERDICT__SIZE_MISMATCH
                                  : SLUICE__V1__VERDICT__IO_ERROR;
    }
    if (strcmp(got, j->sha) != 0) {
        snprintf(j->detail, sizeof(j->detail), "data hashes to %s, catalog has %s", got, j->sha);
        return SLUICE__V1__VERDICT__CHECKSUM_MISMATCH;
    }
    return SLUICE__V1__VERDICT__OK;
}

/* Quick: size and header against the catalog. Returns the verdict. */
static int vjob_header(vjob *j, sl_sreader *r, uint64_t size)
{
    const sl_sstore *st = j->v->svc->opts.store;
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    char why[160];
    sl_shard_header h;

    if (size != j->file_size) {
        snprintf(j->detail, sizeof(j->detail), "file has %" PRIu64 " bytes, catalog says %" PRIu64,
                 size, j->file_size);
        return SLUICE__V1__VERDICT__SIZE_MISMATCH;
    }
    if (st->ops->r_read(r, hdr, sizeof(hdr), 0, why, sizeof(why)) != 0 ||
        sl_shard_header_decode(&h, hdr, sizeof(hdr)) != 0) {
        snprintf(j->detail, sizeof(j->detail), "header does not parse");
        return SLUICE__V1__VERDICT__HEADER_CORRUPT;
    }
    if (h.rank != j->rank || h.data_len != j->data_size || strcmp(h.sha256, j->sha) != 0) {
        snprintf(j->detail, sizeof(j->detail),
                 "header says rank %d, %" PRIu64 " bytes, sha256 %.16s...; catalog says rank %d, "
                 "%" PRIu64 " bytes, sha256 %.16s...",
                 h.rank, h.data_len, h.sha256, j->rank, j->data_size, j->sha);
        return SLUICE__V1__VERDICT__HEADER_CORRUPT;
    }
    return SLUICE__V1__VERDICT__OK;
}

/* Open a file of the checkpoint; on failure sets the verdict (MISSING or IO_ERROR). */
static sl_sreader *vjob_open(vjob *j, const char *file, uint64_t *size)
{
    sl_sstore *st = j->v->svc->opts.store;
    sl_sreader *r = NULL;
    char why[160] = "";
    int err = st->ops->r_open(st, j->v->ck.job, file, &r, size, why, sizeof(why));

    if (err) {
        j->verdict =
            err == SL_ENOTFOUND ? SLUICE__V1__VERDICT__MISSING : SLUICE__V1__VERDICT__IO_ERROR;
        snprintf(j->detail, sizeof(j->detail), "%s", why[0] ? why : sl_strerror(err));
        return NULL;
    }
    return r;
}

/* File names are built in the worker, not stored per rank: a world of 65536 ranks would
 * otherwise need NAME_MAX bytes each. */
static void vjob_shard(vjob *j, const char *file, int deep)
{
    uint64_t size = 0;
    sl_sreader *r = vjob_open(j, file, &size);

    if (!r)
        return;
    j->verdict = vjob_header(j, r, size);
    if (j->verdict == SLUICE__V1__VERDICT__OK && deep)
        j->verdict = vjob_hash(j, r);
    j->v->svc->opts.store->ops->r_close(r);
}

/* The metadata file must be byte for byte what the catalog renders; it is small (metadata, not
 * data), so it is compared in 64 KiB pieces without holding it whole. */
static void vjob_meta(vjob *j, const char *file, const sl_buf *expect)
{
    const sl_sstore *st = j->v->svc->opts.store;
    uint8_t buf[65536];
    uint64_t pos = 0, size = 0;
    char why[160];
    sl_sreader *r = vjob_open(j, file, &size);

    if (!r)
        return;
    if (size != expect->len) {
        j->verdict = SLUICE__V1__VERDICT__SIZE_MISMATCH;
        snprintf(j->detail, sizeof(j->detail), "file has %" PRIu64 " bytes, expected %zu", size,
                 expect->len);
        goto out;
    }
    while (pos < expect->len) {
        size_t n = expect->len - pos < sizeof(buf) ? expect->len - pos : sizeof(buf);
        if (st->ops->r_read(r, buf, n, pos, why, sizeof(why)) != 0) {
            j->verdict = SLUICE__V1__VERDICT__IO_ERROR;
            snprintf(j->detail, sizeof(j->detail), "cannot read: %s", why);
            goto out;
        }
        if (memcmp(buf, expect->p + pos, n) != 0) {
            j->verdict = SLUICE__V1__VERDICT__HEADER_CORRUPT;
            snprintf(j->detail, sizeof(j->detail),
                     "content differs from the catalog near byte %" PRIu64, pos);
            goto out;
        }
        pos += n;
    }
    j->verdict = SLUICE__V1__VERDICT__OK;
out:
    st->ops->r_close(r);
}

static void vjob_work(uv_work_t *w)
{
    vjob *j = w->data;
    verify *v = j->v;
    char file[NAME_MAX + 1];
    int err = j->rank < 0
                  ? sl_store_file_name(file, sizeof(file), SL_STORE_META, v->ck.name, 0)
                  : sl_store_file_name(file, sizeof(file), SL_STORE_SHARD, v->ck.name, j->rank);

    if (atomic_load(&v->cancelled)) {
        j->verdict = SLUICE__V1__VERDICT__IO_ERROR;
        snprintf(j->detail, sizeof(j->detail), "cancelled");
    } else if (err) {
        j->verdict = SLUICE__V1__VERDICT__IO_ERROR;
        snprintf(j->detail, sizeof(j->detail), "path too long");
    } else if (j->rank < 0) {
        vjob_meta(j, file, &v->meta);
    } else {
        vjob_shard(j, file, v->deep);
    }
}

static void verify_reply(verify *v)
{
    Sluice__V1__VerifyResponse resp = SLUICE__V1__VERIFY_RESPONSE__INIT;
    int32_t n = v->ck.world_size;
    Sluice__V1__ShardVerdict *sv = calloc((size_t)n, sizeof(*sv));
    Sluice__V1__ShardVerdict **pv = calloc((size_t)n, sizeof(*pv));
    int ok = 1, bad = 0;

    if (!sv || !pv) {
        sl_rpc_call_fail(v->call, -ENOMEM, "out of memory");
        goto out;
    }
    for (int32_t r = 0; r < n; r++) {
        sluice__v1__shard_verdict__init(&sv[r]);
        sv[r].rank = r;
        sv[r].verdict = (Sluice__V1__Verdict)v->jobs[r].verdict;
        sv[r].detail = v->jobs[r].detail;
        pv[r] = &sv[r];
        if (sv[r].verdict != SLUICE__V1__VERDICT__OK) {
            ok = 0;
            bad++;
        }
    }
    resp.shards = pv;
    resp.n_shards = (size_t)n;
    resp.metadata = (Sluice__V1__Verdict)v->jobs[n].verdict;
    resp.metadata_detail = v->jobs[n].detail;
    if (v->ck.state == SL_CKPT_COMPLETE && resp.metadata != SLUICE__V1__VERDICT__OK)
        ok = 0;
    resp.ok = ok;
    for (int32_t r = 0; r <= n; r++) {
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(
            &sluice__v1__verdict__descriptor, r < n ? (int)sv[r].verdict : (int)resp.metadata);
        char labels[96];
        snprintf(labels, sizeof(labels), "mode=\"%s\",verdict=\"%s\"", v->deep ? "deep" : "quick",
                 ev ? ev->name : "UNKNOWN");
        sl_metrics_add(v->svc->opts.metrics, "sluice_verify_verdicts_total", labels, 1);
    }
    sl_log(ok ? SL_LOG_INFO : SL_LOG_WARN, "ckpt_verify",
           "job=%s name=%s mode=%s ok=%d bad_shards=%d", v->ck.job, v->ck.name,
           v->deep ? "deep" : "quick", ok, bad);
    sl_rpc_call_reply(v->call, &resp.base);
out:
    free(sv);
    free(pv);
}

/* ---- the deep-verify budget ---- */

static void deep_gauge(sl_ckpt_svc *s)
{
    if (s->opts.metrics)
        sl_metrics_set(s->opts.metrics, "sluice_verify_hash_jobs", NULL, (double)s->deep_running);
}

static void deep_enqueue(sl_ckpt_svc *s, verify *v)
{
    v->qnext = NULL;
    v->waiting = 1;
    if (s->deep_tail)
        s->deep_tail->qnext = v;
    else
        s->deep_head = v;
    s->deep_tail = v;
}

static void deep_remove(sl_ckpt_svc *s, verify *v)
{
    verify *prev = NULL;

    for (verify *q = s->deep_head; q; prev = q, q = q->qnext) {
        if (q != v)
            continue;
        if (prev)
            prev->qnext = q->qnext;
        else
            s->deep_head = q->qnext;
        if (s->deep_tail == q)
            s->deep_tail = prev;
        break;
    }
    v->waiting = 0;
    v->qnext = NULL;
}

/* The next shard of v to hash from v->next on, or world_size if none is left. */
static int32_t deep_next(const verify *v)
{
    int32_t r = v->next;

    while (r < v->ck.world_size && !v->jobs[r].queued)
        r++;
    return r;
}

static void vjob_after(uv_work_t *w, int status);

/* Hand shards to the pool while the budget allows, one per waiting call in turn. */
static void deep_dispatch(sl_ckpt_svc *s)
{
    while (s->deep_running < s->opts.max_deep_verifies && s->deep_head) {
        verify *v = s->deep_head;
        int32_t r = deep_next(v);
        deep_remove(s, v);
        if (r >= v->ck.world_size)
            continue;
        v->next = r + 1;
        v->jobs[r].deep = 1;
        s->deep_running++;
        sl_cat_queue_work(s->cat, s->loop, &v->jobs[r].work, vjob_work, vjob_after);
        if (deep_next(v) < v->ck.world_size)
            deep_enqueue(s, v);
    }
    deep_gauge(s);
}

/* Every job of v returned (or will never run): answer unless the call ended, and let go. */
static void verify_done(verify *v)
{
    sl_rpc_call *call = v->call;

    if (!sl_rpc_call_is_done(call) && !atomic_load(&v->cancelled))
        verify_reply(v);
    if (v->counted)
        v->svc->deep_calls--;
    sl_rpc_call_set_data(call, NULL, NULL);
    verify_free(v);
    sl_rpc_call_unref(call);
}

static void vjob_after(uv_work_t *w, int status)
{
    vjob *j = w->data;
    verify *v = j->v;
    sl_ckpt_svc *s = v->svc;
    int deep = j->deep;

    (void)status;
    if (deep)
        s->deep_running--;
    if (--v->pending == 0)
        verify_done(v);
    if (deep)
        deep_dispatch(s);
}

void ckpt_verify_cancel(sl_rpc_call *call, void *arg)
{
    verify *v = sl_rpc_call_data(call);
    int32_t left = 0;

    (void)arg;
    if (!v)
        return;
    /* Running jobs see the flag before their next block; shards still waiting never run. */
    atomic_store(&v->cancelled, 1);
    if (v->waiting)
        deep_remove(v->svc, v);
    for (int32_t r = deep_next(v); v->deep && r < v->ck.world_size; r++)
        left += v->jobs[r].queued;
    v->next = v->ck.world_size;
    v->pending -= left;
    if (v->pending == 0)
        verify_done(v);
}

static int verify_collect(const sl_cat_shard *sh, void *arg)
{
    verify *v = arg;
    vjob *j;

    if (sh->rank < 0 || sh->rank >= v->ck.world_size)
        return 0;
    j = &v->jobs[sh->rank];
    j->data_size = sh->data_size;
    j->file_size = sh->file_size;
    memcpy(j->sha, sh->sha256, sizeof(j->sha));
    j->queued = 1;
    return 0;
}

/* Check the request and look the checkpoint up; answers the call and returns NULL if refused. */
static verify *verify_new(sl_ckpt_svc *s, sl_rpc_call *call, const Sluice__V1__VerifyRequest *req)
{
    verify *v = calloc(1, sizeof(*v));

    if (!v) {
        sl_rpc_call_fail(call, -ENOMEM, "out of memory");
        return NULL;
    }
    sl_buf_init(&v->meta, SIZE_MAX);
    if (!ckpt_names_ok(call, req->job, req->name))
        goto fail;
    if (req->mode != SLUICE__V1__VERIFY_MODE__QUICK && req->mode != SLUICE__V1__VERIFY_MODE__DEEP) {
        sl_rpc_call_fail(call, SL_EINVAL, "mode %d is not a verify mode (0 quick, 1 deep)",
                         (int)req->mode);
        goto fail;
    }
    if (ckpt_find(s, call, &v->ck, req->job, req->name))
        goto fail;
    if (v->ck.state == SL_CKPT_INCOMPLETE) {
        sl_rpc_call_fail(call, SL_ESTATE, "checkpoint %s/%s is INCOMPLETE (aborted)", req->job,
                         req->name);
        goto fail;
    }
    v->call = call;
    v->svc = s;
    v->deep = req->mode == SLUICE__V1__VERIFY_MODE__DEEP;
    return v;
fail:
    verify_free(v);
    return NULL;
}

/* One job per rank (NOT_UPLOADED unless the catalog has its shard) and one for the metadata file
 * of a COMPLETE checkpoint, rendered now. Answers the call and returns an error on failure. */
static int verify_plan(verify *v)
{
    int32_t n = v->ck.world_size;
    int err;

    v->jobs = calloc((size_t)n + 1, sizeof(*v->jobs));
    if (!v->jobs) {
        sl_rpc_call_fail(v->call, -ENOMEM, "out of memory");
        return -ENOMEM;
    }
    for (int32_t r = 0; r <= n; r++) {
        v->jobs[r].v = v;
        v->jobs[r].rank = r < n ? r : -1;
        v->jobs[r].work.work.data = &v->jobs[r];
        v->jobs[r].verdict = SLUICE__V1__VERDICT__NOT_UPLOADED;
    }
    v->jobs[n].verdict = SLUICE__V1__VERDICT__VERDICT_UNSPECIFIED;
    err = sl_cat_shard_list(v->svc->cat, v->ck.id, 0, verify_collect, v);
    if (!err && v->ck.state == SL_CKPT_COMPLETE) {
        err = ckpt_render_metadata(v->svc, &v->ck, v->ck.committed_ms, NULL, &v->meta);
        if (!err)
            v->jobs[n].queued = 1;
    }
    if (err)
        sl_rpc_call_fail(v->call, err, "catalog error: %s", sl_strerror(err));
    return err;
}

/* A deep verify over DEEP_CALLS_MAX in progress is refused; answers the call. Returns 1 if so. */
static int deep_refused(sl_ckpt_svc *s, sl_rpc_call *call)
{
    if (s->deep_calls < DEEP_CALLS_MAX)
        return 0;
    sl_log_limited(SL_LOG_WARN, 1000, "ckpt_verify_refused", "limit=%d peer=%s", DEEP_CALLS_MAX,
                   sl_rpc_call_peer(call));
    if (s->opts.metrics)
        sl_metrics_add(s->opts.metrics, "sluice_rpc_refused_total", "limit=\"deep_verifies\"", 1);
    sl_rpc_call_fail(call, SL_ELIMIT,
                     "too many deep verifications in progress (limit %d; %d shards hashed at once)",
                     DEEP_CALLS_MAX, s->opts.max_deep_verifies);
    return 1;
}

void ckpt_verify(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    sl_ckpt_svc *s = arg;
    verify *v = verify_new(s, call, (const Sluice__V1__VerifyRequest *)msg);
    int32_t n;

    if (!v)
        return;
    if ((v->deep && deep_refused(s, call)) || verify_plan(v) != 0) {
        verify_free(v);
        return;
    }
    n = v->ck.world_size;
    for (int32_t r = 0; r <= n; r++)
        if (v->jobs[r].queued)
            v->pending++;
    if (v->pending == 0) {
        verify_reply(v);
        verify_free(v);
        return;
    }
    /* One reference for the whole verification, dropped by the last job; the call points to v
     * so that a cancel finds it. */
    sl_rpc_call_ref(call);
    sl_rpc_call_set_data(call, v, NULL);
    for (int32_t r = 0; r <= n; r++)
        if (v->jobs[r].queued && (!v->deep || r == n))
            sl_cat_queue_work(s->cat, s->loop, &v->jobs[r].work, vjob_work, vjob_after);
    if (v->deep) {
        v->counted = 1;
        s->deep_calls++;
        deep_enqueue(s, v);
        deep_dispatch(s);
    }
}
