/* Jobs in memory: each epoch's share sizes, progress, epoch advance, resize, elastic state. */
#include "internal.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

fjob *feed_job_find(sl_feed *f, const char *name)
{
    for (fjob *j = f->jobs; j; j = j->next)
        if (strcmp(j->name, name) == 0)
            return j;
    return NULL;
}

void fsrc_unref(fsrc *s)
{
    if (s && --s->refs == 0) {
        sl_sample_elastic_free(s->plan);
        free(s);
    }
}

/* Elastic blobs (little-endian host order: the catalog never leaves the machine that wrote it).
 * "SLE1" (one resize): u32 magic, u32 spec length, the epoch's first spec, u32 n, n x u64
 * consumed; the world after is the job's current one. "SLE2" (any number of resizes): u32 magic,
 * u32 spec length, the spec, u32 steps, then per step u32 n_consumed, u32 new_replicas, u32
 * n_weights, u32 flags, n_consumed x u64 consumed, n_weights x f64 weights. Flags: ELASTIC_EVEN
 * marks a step with equal counts per rank (sl_sample_resize.uneven false); steps of earlier
 * versions have 0 and keep the shares their ranks read (SLE1 likewise), and earlier versions
 * refuse a blob with the flag as corrupt rather than serve other shares than this one.
 * ELASTIC_RUNS: the step's consumed counts are runs of equal values (u32 runs, then per run u32
 * length, u64 value; the lengths add up to n_consumed), written when that is shorter. The ranks
 * of a DDP group consume in step, so a step of 65,536 ranks is a few runs: the catalog row then
 * grows by bytes per resize, not by 512 KiB, and SQLite writes it on the loop thread. */
#define ELASTIC_MAGIC  0x31454c53u /* "SLE1" */
#define ELASTIC_MAGIC2 0x32454c53u /* "SLE2" */
#define ELASTIC_EVEN   1u
#define ELASTIC_RUNS   2u
/* At most this many consumed counts in all the steps of a chain (1 GiB of them, 2 GiB of its
 * index plan): runs make a short blob stand for many counts, so its size no longer bounds what
 * decoding it allocates. 2,048 resizes of 65,536 ranks in one epoch. */
#define ELASTIC_COUNTS_MAX (1ull << 27)
#define ELASTIC_STEPS_MAX  65536u

/* A Resize: the new spec and config the loop decided, the snapshot of the job its chain is built
 * from (on the worker pool when it chains), the chain's products, and the calls waiting. */
struct fresize {
    sl_feed *f;
    fjob *job; /* NULL once the job was freed (deleted, or replaced by a refresh) */
    char name[SL_CAT_FEED_NAME_MAX + 1];
    Sluice__V1__Job *nspec; /* the new spec, unpacked, and packed for the catalog */
    uint8_t *spec_buf;
    size_t spec_len;
    sl_sample_config ncfg; /* borrows nspec and the labels */
    uint32_t world, ndp;
    /* The snapshot: the job is as it was (resize_stale) when these match at the end. */
    uint64_t gen, version;
    uint32_t dp_size;
    uint64_t *progress; /* [dp_size] */
    /* The chain's inputs: the job's blob (NULL: the epoch's first resize, which starts from
     * first_spec), a new step's consumed counts (NULL: nobody progressed since the last
     * resize, whose step is re-planned), the new rank weights ([ndp] or NULL). */
    int chained;
    int load; /* a reload's (feed_job_reload_start): spec_buf is the row's spec, old_blob its
               * elastic state, and the products are the chain and plan of that blob */
    void (*refresh)(sl_feed *f, const char *job); /* a reload's: refreshes the job (sync.c) */
    uint8_t *old_blob;
    size_t old_len;
    Sluice__V1__Job *first_spec;
    uint64_t *cons;
    double *w;
    flabels *labels; /* a reference */
    uint64_t samples, epoch;
    int batching;
    /* The products: the chain, its index plan (index jobs), its blob. */
    fchain *chain;
    sl_sample_elastic *plan;
    uint8_t *blob;
    size_t blob_len;
    int err;
    char msg[320];
    sl_rpc_call *call; /* referenced until cb ran */
    feed_resize_cb cb;
    fwaiters waiters; /* calls on the job, parked until this ends */
    sl_cat_work work;
};

static void chain_free(fchain *c)
{
    if (!c)
        return;
    if (c->spec)
        sluice__v1__job__free_unpacked(c->spec, NULL);
    for (uint32_t k = 0; c->steps && k < c->n; k++) {
        free((void *)c->steps[k].consumed);
        free((void *)c->steps[k].weights);
    }
    free(c->steps);
    free(c);
}

/* Room for one more step. */
static int chain_grow(fchain *c)
{
    sl_sample_resize *st = realloc(c->steps, ((size_t)c->n + 1) * sizeof(*st));

    if (!st)
        return -ENOMEM;
    memset(&st[c->n], 0, sizeof(*st));
    c->steps = st;
    return 0;
}

static int rd32(const uint8_t *b, size_t len, size_t *at, uint32_t *v)
{
    if (len - *at < 4)
        return SL_ECORRUPT;
    memcpy(v, b + *at, 4);
    *at += 4;
    return 0;
}

/* n consumed counts stored as runs (ELASTIC_RUNS) at b[*at..len) into cons. */
static int rd_runs(const uint8_t *b, size_t len, size_t *at, uint64_t *cons, uint32_t n)
{
    uint32_t runs, got = 0;

    if (rd32(b, len, at, &runs) || runs == 0 || runs > n || (len - *at) / 12 < runs)
        return SL_ECORRUPT;
    for (uint32_t i = 0; i < runs; i++) {
        uint32_t cnt = 0;
        uint64_t v;
        rd32(b, len, at, &cnt);
        memcpy(&v, b + *at, 8);
        *at += 8;
        if (cnt == 0 || cnt > n - got)
            return SL_ECORRUPT;
        for (uint32_t k = 0; k < cnt; k++)
            cons[got++] = v;
    }
    return got == n ? 0 : SL_ECORRUPT;
}

/* How many runs of equal values v[0..n) holds. */
static size_t count_runs(const uint64_t *v, size_t n)
{
    size_t runs = n != 0;

    for (size_t i = 1; i < n; i++)
        runs += v[i] != v[i - 1];
    return runs;
}

/* Decode a blob; cur_dp is the world after an "SLE1" blob's single resize. */
static int chain_decode(const uint8_t *b, size_t len, uint32_t cur_dp, fchain **out)
{
    fchain *c = calloc(1, sizeof(*c));
    uint32_t magic, spec_len, steps = 1;
    uint64_t total = 0;
    size_t at = 0;
    int err = SL_ECORRUPT;

    *out = NULL;
    if (!c)
        return -ENOMEM;
    if (rd32(b, len, &at, &magic) || rd32(b, len, &at, &spec_len) || spec_len > len - at ||
        (magic != ELASTIC_MAGIC && magic != ELASTIC_MAGIC2))
        goto out;
    c->spec = sluice__v1__job__unpack(NULL, spec_len, b + at);
    if (!c->spec)
        goto out;
    at += spec_len;
    if (magic == ELASTIC_MAGIC2 &&
        (rd32(b, len, &at, &steps) || steps == 0 || steps > ELASTIC_STEPS_MAX))
        goto out;
    for (uint32_t k = 0; k < steps; k++) {
        uint32_t n, nr = cur_dp, nw = 0, flags = 0;
        uint64_t *cons;
        double *w = NULL;

        if (rd32(b, len, &at, &n) || n == 0 || n > FEED_MAX_WORLD ||
            (total += n) > ELASTIC_COUNTS_MAX)
            goto out;
        if (magic == ELASTIC_MAGIC2 &&
            (rd32(b, len, &at, &nr) || rd32(b, len, &at, &nw) || rd32(b, len, &at, &flags) ||
             nr == 0 || nr > FEED_MAX_WORLD || (nw && nw != nr) ||
             (flags & ~(ELASTIC_EVEN | ELASTIC_RUNS))))
            goto out;
        if ((len - at) / 8 < (flags & ELASTIC_RUNS ? 0 : (size_t)n) + nw ||
            (magic == ELASTIC_MAGIC && len - at != 8 * (size_t)n))
            goto out;
        if ((err = chain_grow(c)) != 0)
            goto out;
        err = SL_ECORRUPT;
        cons = malloc(8 * (size_t)n);
        if (nw)
            w = malloc(8 * (size_t)nw);
        if (!cons || (nw && !w)) {
            free(cons);
            free(w);
            err = -ENOMEM;
            goto out;
        }
        c->steps[c->n].consumed = cons;
        c->steps[c->n].weights = w;
        c->n++; /* freed with c from here */
        if (flags & ELASTIC_RUNS) {
            if (rd_runs(b, len, &at, cons, n) != 0 || (len - at) / 8 < nw)
                goto out;
        } else {
            memcpy(cons, b + at, 8 * (size_t)n);
            at += 8 * (size_t)n;
        }
        if (nw)
            memcpy(w, b + at, 8 * (size_t)nw);
        at += 8 * (size_t)nw;
        c->steps[c->n - 1].n_consumed = n;
        c->steps[c->n - 1].new_replicas = nr;
        c->steps[c->n - 1].n_weights = nw;
        c->steps[c->n - 1].uneven = !(flags & ELASTIC_EVEN);
    }
    if (at != len)
        goto out;
    *out = c;
    c = NULL;
    err = 0;
out:
    chain_free(c);
    return err;
}

/* Write v[0..n), which holds `runs` runs, as ELASTIC_RUNS at b + at; returns the end. */
static size_t put_runs(uint8_t *b, size_t at, const uint64_t *v, size_t n, uint32_t runs)
{
    memcpy(b + at, &runs, 4);
    at += 4;
    for (size_t i = 0; i < n;) {
        uint32_t cnt = 1;
        while (i + cnt < n && v[i + cnt] == v[i])
            cnt++;
        memcpy(b + at, &cnt, 4);
        memcpy(b + at + 4, &v[i], 8);
        at += 12;
        i += cnt;
    }
    return at;
}

static int chain_encode(uint8_t **out, size_t *out_len, const fchain *c)
{
    size_t spec_len = sluice__v1__job__get_packed_size(c->spec), len = 12 + spec_len, at;
    uint32_t v;
    uint8_t *b;

    size_t *runs = calloc(c->n ? c->n : 1, sizeof(*runs));

    if (!runs)
        return -ENOMEM;
    for (uint32_t k = 0; k < c->n; k++) {
        const sl_sample_resize *st = &c->steps[k];
        size_t n = count_runs(st->consumed, st->n_consumed);
        /* Runs where they are shorter (0 marks the plain array). */
        runs[k] = 4 + 12 * n < 8 * st->n_consumed ? n : 0;
        len += 16 + (runs[k] ? 4 + 12 * runs[k] : 8 * st->n_consumed) + 8 * st->n_weights;
    }
    if (!(b = malloc(len))) {
        free(runs);
        return -ENOMEM;
    }
    v = ELASTIC_MAGIC2;
    memcpy(b, &v, 4);
    v = (uint32_t)spec_len;
    memcpy(b + 4, &v, 4);
    sluice__v1__job__pack(c->spec, b + 8);
    at = 8 + spec_len;
    memcpy(b + at, &c->n, 4);
    at += 4;
    for (uint32_t k = 0; k < c->n; k++) {
        const sl_sample_resize *st = &c->steps[k];
        uint32_t h[4] = {(uint32_t)st->n_consumed, st->new_replicas, (uint32_t)st->n_weights,
                         (st->uneven ? 0 : ELASTIC_EVEN) | (runs[k] ? ELASTIC_RUNS : 0)};

        memcpy(b + at, h, 16);
        at += 16;
        if (runs[k])
            at = put_runs(b, at, st->consumed, st->n_consumed, (uint32_t)runs[k]);
        else
            memcpy(b + at, st->consumed, 8 * st->n_consumed);
        at += runs[k] ? 0 : 8 * st->n_consumed;
        if (st->n_weights)
            memcpy(b + at, st->weights, 8 * st->n_weights);
        at += 8 * st->n_weights;
    }
    free(runs);
    *out = b;
    *out_len = len;
    return 0;
}

/* A chain's epoch config and dp0 (the epoch's first dp world), for a job of `samples` with its
 * `labels` in `epoch` (any thread: a Resize builds its chain on the worker pool). */
static int chain_config(const sl_sample_labels *labels, uint64_t samples, uint64_t epoch, fchain *c,
                        sl_sample_config *cfg, char *msg, size_t len)
{
    uint32_t dp;
    int err = feed_spec_config(cfg, c->spec, labels, samples, epoch, msg, len);

    if (!err) {
        cfg->rank = 0;
        err = sl_sample_dp_rank(&dp, &c->dp0, cfg, msg, len);
    }
    return err;
}

/* The index plan of a chain (index jobs), as chain_config. */
static int chain_index_plan(const sl_sample_labels *labels, uint64_t samples, uint64_t epoch,
                            fchain *c, sl_sample_elastic **plan, char *msg, size_t len)
{
    sl_sample_config ocfg;
    int err = chain_config(labels, samples, epoch, c, &ocfg, msg, len);

    if (!err)
        err = sl_sample_elastic_chain(plan, &ocfg, c->steps, c->n, msg, len);
    return err;
}

/* A batch job's elastic plan over its epoch plan's batches (sl_sample_elastic_lockstep). */
static int batch_chain_plan(const fchain *c, uint64_t per_rank, int pad, sl_sample_elastic **out,
                            uint64_t *count, char *msg, size_t len)
{
    if (per_rank == 0) {
        snprintf(msg, len, "the epoch's batch plan is empty: nothing to redistribute");
        return SL_ESTATE;
    }
    return sl_sample_elastic_lockstep(out, count, per_rank, c->dp0, pad, c->steps, c->n, msg, len);
}

/* A batch job's chain whose first steps dealt the plan's batches out as they are (no weights
 * then) and whose later step brings weights: re-planning is decided for the whole epoch by its
 * start (feed_job_replans), so such a chain cannot be served. */
static int chain_mixes_modes(const fchain *c)
{
    if (c->spec->n_rank_weights || c->n == 0 || c->steps[0].n_weights)
        return 0;
    for (uint32_t k = 1; k < c->n; k++)
        if (c->steps[k].n_weights)
            return 1;
    return 0;
}

int feed_job_batch_src(fjob *j, char *msg, size_t len)
{
    sl_sample_elastic *e = NULL;
    uint64_t count = 0;
    int err;

    if (!j->spec->batching || !j->chain || j->src || !j->plan || j->plan->state != 1 ||
        feed_job_replans(j)) /* its plan is the re-plan of the rest: no elastic shares */
        return 0;
    err = batch_chain_plan(j->chain, sl_batch_plan_batches_per_rank(j->plan->plan),
                           j->spec->batching->pad_remainder, &e, &count, msg, len);
    if (!err && !(j->src = calloc(1, sizeof(*j->src))))
        err = -ENOMEM;
    if (err) {
        sl_sample_elastic_free(e);
        sl_log_error("elastic_batches_failed", "job=%s epoch=%llu error=\"%s\"", j->name,
                     (unsigned long long)j->epoch, msg);
        return err;
    }
    j->src->refs = 1;
    j->src->plan = e;
    j->bcount = count;
    return 0;
}

/* Install a chain (owned from now on) and its blob as the current epoch's elastic state: index
 * jobs get their plan now (`plan`, owned from now on, when built already), batch jobs once
 * their epoch plan is ready. */
static int elastic_install(fjob *j, fchain *c, const uint8_t *blob, size_t blob_len,
                           sl_sample_elastic *plan, char *msg, size_t len)
{
    sl_sample_config ocfg;
    int err = chain_config(flabels_of(j->labels), j->samples, j->epoch, c, &ocfg, msg, len);

    if (!err && c->steps[c->n - 1].new_replicas != j->dp_size) {
        snprintf(msg, len, "elastic state of job '%s' ends in a world of %u, not %u", j->name,
                 c->steps[c->n - 1].new_replicas, j->dp_size);
        err = SL_ECORRUPT;
    }
    if (!err && !j->spec->batching && !plan)
        err = chain_index_plan(flabels_of(j->labels), j->samples, j->epoch, c, &plan, msg, len);
    if (!err && !j->spec->batching && !(j->src = calloc(1, sizeof(*j->src))))
        err = -ENOMEM;
    if (!err && !(j->elastic_blob = malloc(blob_len)))
        err = -ENOMEM;
    if (err) {
        free(j->src);
        j->src = NULL;
        sl_sample_elastic_free(plan);
        chain_free(c);
        return err;
    }
    if (j->src) {
        j->src->refs = 1;
        j->src->plan = plan;
    } else {
        sl_sample_elastic_free(plan); /* a batch job's: built over its epoch plan */
    }
    memcpy(j->elastic_blob, blob, blob_len);
    j->elastic_len = blob_len;
    j->chain = c;
    return 0;
}

/* Build the elastic source of the current epoch from a blob. */
static int elastic_load(fjob *j, const uint8_t *blob, size_t blob_len, char *msg, size_t len)
{
    fresize *p = j->feed->prebuilt;
    fchain *c = NULL;
    int err;

    if (p && p->chain && strcmp(p->name, j->name) == 0 && p->labels == j->labels &&
        p->epoch == j->epoch && p->old_len == blob_len &&
        memcmp(p->old_blob, blob, blob_len) == 0) {
        /* Built on the worker pool for this load (feed_job_reload_start). */
        sl_sample_elastic *plan = p->plan;
        c = p->chain;
        p->chain = NULL;
        p->plan = NULL;
        return elastic_install(j, c, blob, blob_len, plan, msg, len);
    }
    err = chain_decode(blob, blob_len, j->dp_size, &c);

    if (err) {
        snprintf(msg, len, "elastic state of job '%s' is corrupt", j->name);
        return err;
    }
    return elastic_install(j, c, blob, blob_len, NULL, msg, len);
}

static void drop_epoch_state(fjob *j)
{
    if (j->shares) {
        for (uint32_t d = 0; d < j->dp_size; d++)
            fshare_unref(j->shares[d]);
        free(j->shares);
        j->shares = NULL;
    }
    fsrc_unref(j->src);
    j->src = NULL;
    chain_free(j->chain);
    j->chain = NULL;
    j->bcount = 0;
    free(j->elastic_blob);
    j->elastic_blob = NULL;
    j->elastic_len = 0;
    if (j->plan) {
        j->plan->job = NULL;
        fplan_unref(j->plan);
        j->plan = NULL;
    }
}

/* Compute dp_size, counts and zeroed progress for j->cfg (and j->src when elastic). */
static int setup_counts(fjob *j, char *msg, size_t len)
{
    sl_sample_config c = j->cfg;
    uint32_t dp, dp_size;
    int err = sl_sample_dp_rank(&dp, &dp_size, &c, msg, len);

    if (err)
        return err;
    free(j->counts);
    free(j->progress);
    free(j->reported);
    j->dp_size = dp_size;
    j->counts = calloc(dp_size, sizeof(*j->counts));
    j->progress = calloc(dp_size, sizeof(*j->progress));
    j->reported = calloc(dp_size, sizeof(*j->reported));
    if (!j->counts || !j->progress || !j->reported)
        return -ENOMEM;
    if (j->src)
        return 0; /* filled by setup_elastic_counts once the plan exists */
    for (uint32_t r = 0; r < c.replicas; r++) {
        uint64_t n;
        c.rank = r;
        if ((err = sl_sample_dp_rank(&dp, &dp_size, &c, msg, len)) != 0 ||
            (err = sl_sample_share_count(&n, &c, msg, len)) != 0)
            return err;
        j->counts[dp] = n;
    }
    return 0;
}

static int setup_elastic_counts(fjob *j, char *msg, size_t len)
{
    if (!j->src)
        return 0; /* a batch job's: feed_job_batch_src, once its plan is ready */
    for (uint32_t d = 0; d < j->dp_size; d++) {
        sl_sample *s = NULL;
        int err = sl_sample_new_elastic(&s, j->src->plan, d, msg, len);
        if (err)
            return err;
        j->counts[d] = sl_sample_count(s);
        sl_sample_free(s);
    }
    return 0;
}

static void job_free(fjob *j)
{
    if (!j)
        return;
    if (j->resizing)
        j->resizing->job = NULL; /* its end finds the job gone: the call runs again */
    drop_epoch_state(j);
    flabels_unref(j->feed, j->labels);
    if (j->spec)
        sluice__v1__job__free_unpacked(j->spec, NULL);
    free(j->counts);
    free(j->progress);
    free(j->reported);
    free(j);
}

int feed_job_merge_progress(uint32_t dp, uint64_t epoch, uint64_t position, void *arg)
{
    fjob *j = arg;

    if (epoch == j->epoch && dp < j->dp_size) {
        j->reported[dp] = 1;
        if (position > j->progress[dp])
            j->progress[dp] = position;
    }
    return 0;
}

int feed_job_add(sl_feed *f, fjob **out, const char *name, const char *dataset,
                 Sluice__V1__Job *spec, uint64_t samples, uint64_t epoch, int64_t created_ms,
                 const void *elastic, size_t elastic_len, char *msg, size_t len)
{
    fjob *j = calloc(1, sizeof(*j));
    int err;

    if (!j) {
        sluice__v1__job__free_unpacked(spec, NULL);
        return -ENOMEM;
    }
    j->feed = f;
    snprintf(j->name, sizeof(j->name), "%s", name);
    snprintf(j->dataset, sizeof(j->dataset), "%s", dataset);
    j->spec = spec;
    j->samples = samples;
    j->epoch = epoch;
    j->created_ms = created_ms;
    err = feed_spec_wants_labels(spec) ? feed_labels_get(&j->labels, f, dataset, msg, len) : 0;
    if (err == FEED_PENDING && feed_labels_defer_load(j->labels, name) != 0) {
        snprintf(msg, len, "out of memory");
        err = -ENOMEM;
    }
    if (!err)
        err = feed_spec_config(&j->cfg, spec, flabels_of(j->labels), samples, epoch, msg, len);
    if (!err)
        err = setup_counts(j, msg, len);
    if (!err && elastic && elastic_len) {
        err = elastic_load(j, elastic, elastic_len, msg, len);
        if (!err)
            err = setup_elastic_counts(j, msg, len);
    }
    if (!err)
        err = sl_cat_progress_list(f->cat, j->name, feed_job_merge_progress, j);
    if (err) {
        job_free(j);
        return err;
    }
    j->next = f->jobs;
    f->jobs = j;
    *out = j;
    return 0;
}

void feed_job_remove(sl_feed *f, fjob *j, sl_rpc_code code, const char *why)
{
    fjob **pp = &f->jobs;

    f->hooks.streams_end(j, 1, code, why);
    while (*pp && *pp != j)
        pp = &(*pp)->next;
    if (*pp)
        *pp = j->next;
    job_free(j);
}

int feed_job_dp_rank(const fjob *j, uint32_t rank, uint32_t *dp, char *msg, size_t len)
{
    sl_sample_config c = j->cfg;
    uint32_t dp_size;

    if (rank >= c.replicas) {
        snprintf(msg, len, "rank %u out of range [0, %u) of job '%s'", rank, c.replicas, j->name);
        return SL_EINVAL;
    }
    c.rank = rank;
    return sl_sample_dp_rank(dp, &dp_size, &c, msg, len);
}

int feed_job_count(const fjob *j, uint32_t dp, uint64_t *count)
{
    if (j->spec->batching) {
        int elastic = j->chain && !feed_job_replans(j);
        if (!j->plan || j->plan->state != 1 || (elastic && !j->src))
            return SL_ESTATE;
        *count = elastic ? j->bcount : sl_batch_plan_batches_per_rank(j->plan->plan);
        return 0;
    }
    *count = j->counts[dp];
    return 0;
}

int feed_job_complete(const fjob *j)
{
    for (uint32_t d = 0; d < j->dp_size; d++) {
        uint64_t n;
        if (feed_job_count(j, d, &n) != 0 || j->progress[d] < n || !j->reported[d])
            return 0;
    }
    return 1;
}

int feed_job_report_new(const fjob *j, uint32_t dp, uint64_t position)
{
    return position > j->progress[dp] || !j->reported[dp];
}

uint64_t feed_job_group_position(const fjob *j)
{
    uint64_t low = UINT64_MAX;

    for (uint32_t d = 0; d < j->dp_size; d++)
        if (j->progress[d] < low)
            low = j->progress[d];
    return j->dp_size ? low : 0;
}

int feed_job_advance(fjob *j)
{
    uint64_t next = j->epoch + 1;
    int err;

    if (next > SL_SAMPLE_EPOCH_MAX || next > UINT64_MAX - j->cfg.seed) {
        sl_log_warn("epoch_limit", "job=%s epoch=%llu", j->name, (unsigned long long)j->epoch);
        return SL_ELIMIT;
    }
    err = sl_cat_job_set_epoch(j->feed->cat, j->name, j->epoch, next);
    if (err == SL_ESTATE)
        sl_log_info("epoch_advanced_elsewhere", "job=%s epoch=%llu", j->name,
                    (unsigned long long)j->epoch);
    return err ? err : feed_job_enter(j, next);
}

int feed_job_enter(fjob *j, uint64_t next)
{
    char msg[256];
    int err;

    drop_epoch_state(j);
    j->gen++;
    j->epoch = next;
    j->cfg.epoch = next;
    err = setup_counts(j, msg, sizeof(msg));
    if (err) {
        sl_log_error("epoch_setup_failed", "job=%s epoch=%llu error=\"%s\"", j->name,
                     (unsigned long long)next, msg);
        return err;
    }
    sl_log_info("epoch_began", "job=%s epoch=%llu", j->name, (unsigned long long)next);
    j->feed->hooks.epoch_began(j);
    return 0;
}

void feed_job_plan_ready(fjob *j)
{
    char msg[256];

    feed_job_batch_src(j, msg, sizeof(msg));
    if (!j->spec->manual_advance && feed_job_complete(j))
        feed_job_advance(j);
}

int feed_job_report_check(const fjob *j, uint32_t dp, uint64_t epoch, uint64_t position, char *msg,
                          size_t len)
{
    uint64_t count;

    if (epoch != j->epoch) {
        snprintf(msg, len, "epoch %llu is not the current epoch %llu of job '%s'",
                 (unsigned long long)epoch, (unsigned long long)j->epoch, j->name);
        return SL_ESTATE;
    }
    /* A batch job's count is known once its plan is ready; before that (right after a daemon
     * restart) the report is bounded by the sample count and completion waits for the plan. */
    if (feed_job_count(j, dp, &count) != 0)
        count = j->samples; /* no rank gets more batches than there are samples */
    if (position > count) {
        snprintf(msg, len, "position %llu past the end of dp rank %u's share (%llu)",
                 (unsigned long long)position, dp, (unsigned long long)count);
        return SL_EINVAL;
    }
    return 0;
}

int feed_job_report_apply(fjob *j, uint32_t dp, uint64_t position, int *advanced)
{
    int err;

    *advanced = 0;
    j->reported[dp] = 1;
    if (position > j->progress[dp])
        j->progress[dp] = position;
    if (!j->spec->manual_advance && feed_job_complete(j)) {
        err = feed_job_advance(j);
        /* SL_ESTATE: another replica began the next epoch first; its announcement brings it. */
        if (err)
            return err == SL_ESTATE ? 0 : err;
        *advanced = 1;
    }
    return 0;
}

static void resize_free(fresize *r)
{
    if (!r)
        return;
    if (r->nspec)
        sluice__v1__job__free_unpacked(r->nspec, NULL);
    if (r->first_spec)
        sluice__v1__job__free_unpacked(r->first_spec, NULL);
    if (r->labels)
        flabels_unref(r->f, r->labels);
    free(r->spec_buf);
    free(r->progress);
    free(r->old_blob);
    free(r->cons);
    free(r->w);
    chain_free(r->chain);
    sl_sample_elastic_free(r->plan);
    free(r->blob);
    free(r);
}

/* A copy of a spec (packed and unpacked again), or NULL (out of memory). */
static Sluice__V1__Job *spec_copy(const Sluice__V1__Job *spec, uint8_t **packed, size_t *len)
{
    size_t l = sluice__v1__job__get_packed_size(spec);
    uint8_t *b = malloc(l ? l : 1);
    Sluice__V1__Job *out = NULL;

    if (b) {
        sluice__v1__job__pack(spec, b);
        out = sluice__v1__job__unpack(NULL, l, b);
    }
    if (packed && out) {
        *packed = b;
        *len = l;
    } else {
        free(b);
    }
    return out;
}

/* The new spec (the old one with the new world, mesh and weights) and its config. */
static int resize_spec(fresize *r, fjob *j, uint32_t world, const Sluice__V1__Mesh *mesh,
                       const double *weights, size_t nw, char *msg, size_t len)
{
    Sluice__V1__Mesh *saved_mesh = j->spec->mesh;
    uint32_t saved_world = j->spec->world_size, dpi;
    size_t saved_nw = j->spec->n_rank_weights;
    double *saved_w = j->spec->rank_weights;
    int err;

    if (feed_mesh_set(j->spec->mesh) && !feed_mesh_set(mesh)) {
        snprintf(msg, len, "job '%s' has a mesh: give the new mesh (its product = world_size)",
                 j->name);
        return SL_EINVAL;
    }
    if (nw > FEED_MAX_WORLD) {
        snprintf(msg, len, "%zu rank weights: at most %u", nw, FEED_MAX_WORLD);
        return SL_EINVAL;
    }
    /* Build the new spec by packing the old one with the new world, mesh and weights. Without
     * new weights the job's are kept while the dp world keeps its size; another size makes the
     * shares even. A wrong count of new weights is refused by the config check below. */
    j->spec->world_size = world;
    j->spec->mesh = feed_mesh_set(mesh) ? (Sluice__V1__Mesh *)mesh : NULL;
    if (nw) {
        j->spec->rank_weights = (double *)weights;
        j->spec->n_rank_weights = nw;
    } else if (saved_nw && saved_nw != (feed_mesh_set(mesh) ? mesh->dp : world)) {
        j->spec->n_rank_weights = 0;
    }
    r->nspec = spec_copy(j->spec, &r->spec_buf, &r->spec_len);
    j->spec->world_size = saved_world;
    j->spec->mesh = saved_mesh;
    j->spec->rank_weights = saved_w;
    j->spec->n_rank_weights = saved_nw;
    if (!r->nspec)
        return -ENOMEM;
    r->world = world;
    err =
        feed_spec_config(&r->ncfg, r->nspec, flabels_of(j->labels), j->samples, j->epoch, msg, len);
    if (err)
        return err;
    r->ncfg.rank = 0;
    return sl_sample_dp_rank(&dpi, &r->ndp, &r->ncfg, msg, len);
}

/* What the chain is built from: the job's blob (copied: the job may drop it meanwhile), what
 * each rank consumed, the new weights; cheap, O(dp world + blob). */
static int resize_snapshot(fresize *r, fjob *j)
{
    int any = 0;

    for (uint32_t d = 0; d < j->dp_size; d++)
        any |= j->progress[d] > 0;
    r->gen = j->gen;
    r->version = j->version;
    r->dp_size = j->dp_size;
    r->chained = j->chain || any;
    if (!(r->progress = malloc(8 * (size_t)j->dp_size)))
        return -ENOMEM;
    memcpy(r->progress, j->progress, 8 * (size_t)j->dp_size);
    if (!r->chained)
        return 0;
    r->labels = flabels_ref(j->labels);
    r->samples = j->samples;
    r->epoch = j->epoch;
    r->batching = j->spec->batching != NULL;
    if (j->chain) {
        if (!(r->old_blob = malloc(j->elastic_len)))
            return -ENOMEM;
        memcpy(r->old_blob, j->elastic_blob, j->elastic_len);
        r->old_len = j->elastic_len;
    } else if (!(r->first_spec = spec_copy(j->spec, NULL, NULL))) {
        return -ENOMEM; /* the first resize of the epoch: the chain starts from the job's spec */
    }
    if (any || !j->chain) {
        /* Ranks progressed on the current shares: one more step, redistributing what each of
         * them has not consumed. */
        if (!(r->cons = malloc(8 * (size_t)j->dp_size)))
            return -ENOMEM;
        for (uint32_t d = 0; d < j->dp_size; d++) {
            uint64_t n;
            /* A batch job's count needs its plan; without it the position stands (the report
             * check bounded it) and is clipped when the shares are built. */
            if (feed_job_count(j, d, &n) != 0)
                n = UINT64_MAX;
            r->cons[d] = j->progress[d] < n ? j->progress[d] : n;
        }
    }
    if (r->nspec->n_rank_weights == r->ndp) {
        if (!(r->w = malloc(8 * (size_t)r->ndp)))
            return -ENOMEM;
        memcpy(r->w, r->nspec->rank_weights, 8 * (size_t)r->ndp);
    }
    return 0;
}

/* The chain with the resize's step, its index plan and its blob, from the snapshot alone: runs
 * on the worker pool (O(resizes x ranks), the reason it leaves the loop). */
static int resize_build(fresize *r, char *msg, size_t len)
{
    const sl_sample_labels *labels = flabels_of(r->labels);
    fchain *c = NULL;
    sl_sample_resize *last;
    int err = -ENOMEM;

    msg[0] = '\0';
    if (r->old_blob) {
        if (chain_decode(r->old_blob, r->old_len, r->dp_size, &c) != 0)
            goto out;
    } else if ((c = calloc(1, sizeof(*c))) != NULL) {
        c->spec = r->first_spec;
        r->first_spec = NULL;
    }
    if (!c)
        goto out;
    if (r->cons) {
        uint64_t total = r->dp_size;
        for (uint32_t k = 0; k < c->n; k++)
            total += c->steps[k].n_consumed;
        if (total > ELASTIC_COUNTS_MAX) {
            snprintf(msg, len,
                     "job '%s' was resized %u times in this epoch: at most %llu ranks' "
                     "positions in all (resize at the epoch boundary)",
                     r->name, c->n, (unsigned long long)ELASTIC_COUNTS_MAX);
            err = SL_ELIMIT;
            goto out;
        }
        if (chain_grow(c) != 0)
            goto out;
        c->steps[c->n].consumed = r->cons;
        c->steps[c->n].n_consumed = r->dp_size;
        c->n++;
        r->cons = NULL;
    }
    /* Nobody progressed since the last resize: re-plan its step for the new world, with equal
     * counts whatever rule it was recorded with. */
    last = &c->steps[c->n - 1];
    last->new_replicas = r->ndp;
    last->uneven = false;
    free((void *)last->weights);
    last->weights = r->w;
    last->n_weights = r->w ? r->ndp : 0;
    r->w = NULL;
    err = chain_config(labels, r->samples, r->epoch, c, &(sl_sample_config){0}, msg, len);
    if (!err && r->batching && chain_mixes_modes(c)) {
        snprintf(msg, len,
                 "job '%s' was resized in this epoch without rank weights: its ranks hold "
                 "the plan's batches as they were sized, so new rank weights apply from the "
                 "next epoch (resize without them now, or at the epoch boundary)",
                 r->name);
        err = SL_ESTATE;
    }
    /* The index plan is built now, so that a refused chain leaves the job as it was, and the
     * commit only installs it. */
    if (!err && !r->batching)
        err = chain_index_plan(labels, r->samples, r->epoch, c, &r->plan, msg, len);
    if (!err)
        err = chain_encode(&r->blob, &r->blob_len, c);
out:
    if (err == -ENOMEM && !msg[0])
        snprintf(msg, len, "out of memory");
    if (err)
        chain_free(c);
    else
        r->chain = c;
    return err;
}

/* Write the resize to the catalog and make it the job's state (the loop). */
static int resize_commit(fjob *j, fresize *r, char *msg, size_t len)
{
    int err = sl_cat_job_resize(j->feed->cat, j->name, r->spec_buf, r->spec_len, r->world, r->blob,
                                r->blob_len, &j->version);

    if (err) {
        snprintf(msg, len, "catalog write failed: %s", sl_strerror(err));
        return err;
    }
    /* Committed: the old world's streams of this epoch are void. */
    j->feed->hooks.streams_end(j, 0, SL_RPC_ABORTED, "job resized; reopen the stream");
    drop_epoch_state(j);
    j->gen++;
    sluice__v1__job__free_unpacked(j->spec, NULL);
    j->spec = r->nspec;
    r->nspec = NULL;
    j->cfg = r->ncfg;
    setup_counts(j, msg, len);
    if (r->chain) {
        err = elastic_install(j, r->chain, r->blob, r->blob_len, r->plan, msg, len);
        r->chain = NULL;
        r->plan = NULL;
        if (err)
            return err;
        setup_elastic_counts(j, msg, len);
        if (j->spec->batching) {
            /* The rest of the epoch's batches come from the plan of its first world. */
            char why[256];
            if (feed_plan_request(j, why, sizeof(why)) != 0)
                sl_log_warn("job_resize_plan_failed", "job=%s error=\"%s\"", j->name, why);
        }
    }
    sl_log_info("job_resized", "job=%s epoch=%llu world=%u dp=%u elastic=%d resizes=%u", j->name,
                (unsigned long long)j->epoch, r->world, j->dp_size, j->chain != NULL,
                j->chain ? j->chain->n : 0);
    return 0;
}

/* The new spec and the snapshot of a resize of j. */
static int resize_prepare(fresize **out, fjob *j, uint32_t world, const Sluice__V1__Mesh *mesh,
                          const double *weights, size_t nw, char *msg, size_t len)
{
    fresize *r = calloc(1, sizeof(*r));
    int err;

    *out = NULL;
    if (!r)
        return -ENOMEM;
    r->f = j->feed;
    snprintf(r->name, sizeof(r->name), "%s", j->name);
    err = resize_spec(r, j, world, mesh, weights, nw, msg, len);
    if (!err)
        err = resize_snapshot(r, j);
    if (err) {
        resize_free(r);
        return err;
    }
    *out = r;
    return 0;
}

int feed_job_resize(fjob *j, uint32_t world, const Sluice__V1__Mesh *mesh, const double *weights,
                    size_t nw, char *msg, size_t len)
{
    fresize *r = NULL;
    int err = resize_prepare(&r, j, world, mesh, weights, nw, msg, len);

    if (!err && r->chained)
        err = resize_build(r, msg, len);
    if (!err)
        err = resize_commit(j, r, msg, len);
    resize_free(r);
    return err;
}

static void resize_done(uv_work_t *w, int status);

/* A reload's products: the chain and index plan of the row's elastic state (worker pool). */
static int reload_build(fresize *r, char *msg, size_t len)
{
    Sluice__V1__Job *spec = sluice__v1__job__unpack(NULL, r->spec_len, r->spec_buf);
    const sl_sample_labels *labels = flabels_of(r->labels);
    sl_sample_config cfg;
    uint32_t dp, dp_size;
    int err = spec ? 0 : SL_ECORRUPT;

    if (!err)
        err = feed_spec_config(&cfg, spec, labels, r->samples, r->epoch, msg, len);
    if (!err) {
        cfg.rank = 0;
        err = sl_sample_dp_rank(&dp, &dp_size, &cfg, msg, len);
    }
    if (!err && (err = chain_decode(r->old_blob, r->old_len, dp_size, &r->chain)) != 0)
        snprintf(msg, len, "elastic state of job '%s' is corrupt", r->name);
    if (!err)
        err = chain_index_plan(labels, r->samples, r->epoch, r->chain, &r->plan, msg, len);
    if (spec)
        sluice__v1__job__free_unpacked(spec, NULL);
    return err;
}

static void resize_work(uv_work_t *w)
{
    fresize *r = w->data;

    r->err =
        r->load ? reload_build(r, r->msg, sizeof(r->msg)) : resize_build(r, r->msg, sizeof(r->msg));
}

/* A reload's products are ready: the job is refreshed, and its load takes them (elastic_load).
 * A job changed again meanwhile loads as it is now (built again off the loop if it must be). */
static void reload_done(fresize *r, int status)
{
    sl_feed *f = r->f;

    if (r->job)
        r->job->resizing = NULL;
    if (status != 0 || r->err) {
        sl_log_warn("job_reload_build_failed", "job=%s error=\"%s\"", r->name,
                    status != 0 ? "cancelled" : r->msg);
        sl_sample_elastic_free(r->plan);
        r->plan = NULL;
        chain_free(r->chain);
        r->chain = NULL; /* the load then fails, or succeeds, on the loop as before */
    }
    if (r->job && !f->shutting_down) {
        f->prebuilt = r;
        r->refresh(f, r->name);
        f->prebuilt = NULL;
    }
    feed_waiters_run(&r->waiters, f, r->name);
    resize_free(r);
}

int feed_job_reload_start(fjob *j, const sl_cat_job *row, void (*refresh)(sl_feed *, const char *))
{
    sl_feed *f = j->feed;
    Sluice__V1__Job *spec;
    sl_cat_dataset d;
    fresize *r = NULL;
    int ok;

    if (!row->elastic_len || j->resizing || f->shutting_down)
        return 0;
    if (f->prebuilt && strcmp(f->prebuilt->name, j->name) == 0 &&
        f->prebuilt->old_len == row->elastic_len &&
        memcmp(f->prebuilt->old_blob, row->elastic, row->elastic_len) == 0)
        return 0; /* built: the load takes it */
    if (!(spec = sluice__v1__job__unpack(NULL, row->spec_len, row->spec)))
        return 0;
    /* A batch job builds no plan when loaded; a job whose labels would be read again loads as
     * before. */
    ok = !spec->batching && (!feed_spec_wants_labels(spec) || flabels_of(j->labels));
    sluice__v1__job__free_unpacked(spec, NULL);
    if (!ok || sl_cat_dataset_get(f->cat, &d, row->dataset) != 0 || !(r = calloc(1, sizeof(*r))))
        return 0;
    r->f = f;
    r->job = j;
    r->load = 1;
    r->refresh = refresh;
    snprintf(r->name, sizeof(r->name), "%s", j->name);
    r->samples = d.samples;
    r->epoch = row->epoch;
    r->labels = flabels_ref(j->labels);
    r->spec_buf = malloc(row->spec_len ? row->spec_len : 1);
    r->old_blob = malloc(row->elastic_len);
    r->spec_len = row->spec_len;
    r->old_len = row->elastic_len;
    r->work.work.data = r;
    if (!r->spec_buf || !r->old_blob) {
        resize_free(r);
        return 0;
    }
    memcpy(r->spec_buf, row->spec, row->spec_len);
    memcpy(r->old_blob, row->elastic, row->elastic_len);
    if (sl_cat_queue_work(f->cat, f->loop, &r->work, resize_work, resize_done) != 0) {
        resize_free(r);
        return 0;
    }
    j->resizing = r;
    sl_log_info("job_reload_building", "job=%s epoch=%llu version=%llu", j->name,
                (unsigned long long)row->epoch, (unsigned long long)row->version);
    return FEED_PENDING;
}

/* Whether the job changed since the snapshot: its chain would not be what it has consumed. */
static int resize_stale(const fjob *j, const fresize *r)
{
    return !j || j->gen != r->gen || j->version != r->version || j->dp_size != r->dp_size ||
           memcmp(j->progress, r->progress, 8 * (size_t)r->dp_size) != 0;
}

static void resize_done(uv_work_t *w, int status)
{
    fresize *r = w->data;
    fjob *j = r->job;
    int err = r->err;

    if (r->load) {
        reload_done(r, status);
        return;
    }
    if (j)
        j->resizing = NULL;
    if (status != 0) {
        err = SL_ECANCELLED;
        snprintf(r->msg, sizeof(r->msg), "cancelled");
    } else if (resize_stale(j, r)) {
        err = FEED_RETRY;
    } else if (!err) {
        err = resize_commit(j, r, r->msg, sizeof(r->msg));
    }
    r->cb(r->call, r->f, r->name, err, r->msg);
    sl_rpc_call_unref(r->call);
    feed_waiters_run(&r->waiters, r->f, r->name);
    resize_free(r);
}

int feed_job_resize_start(fjob *j, uint32_t world, const Sluice__V1__Mesh *mesh,
                          const double *weights, size_t nw, sl_rpc_call *call, feed_resize_cb cb,
                          char *msg, size_t len)
{
    fresize *r = NULL;
    int err = resize_prepare(&r, j, world, mesh, weights, nw, msg, len);

    if (!err && !r->chained)
        err = resize_commit(j, r, msg, len); /* nothing to chain: a plain change, at once */
    if (err || !r->chained) {
        resize_free(r);
        return err;
    }
    r->job = j;
    r->call = call;
    r->cb = cb;
    r->work.work.data = r;
    if (sl_cat_queue_work(j->feed->cat, j->feed->loop, &r->work, resize_work, resize_done) != 0) {
        resize_free(r);
        snprintf(msg, len, "cannot queue work");
        return SL_EUNAVAILABLE;
    }
    sl_rpc_call_ref(call);
    j->resizing = r;
    return FEED_PENDING;
}

int feed_job_resize_park(fjob *j, sl_rpc_call *call, feed_ready_cb cb)
{
    return feed_waiters_add(&j->resizing->waiters, call, cb);
}

int feed_job_rewind(fjob *j, Sluice__V1__Job *spec, uint64_t epoch, const void *elastic,
                    size_t elastic_len, const uint64_t *positions, uint32_t n, char *msg,
                    size_t len)
{
    sl_sample_config cfg;
    int err = feed_spec_config(&cfg, spec, flabels_of(j->labels), j->samples, epoch, msg, len);

    if (err) {
        sluice__v1__job__free_unpacked(spec, NULL);
        return err;
    }
    j->feed->hooks.streams_end(j, 1, SL_RPC_ABORTED,
                               "job restored to a checkpoint's data position; reopen the stream");
    drop_epoch_state(j);
    j->gen++;
    sluice__v1__job__free_unpacked(j->spec, NULL);
    j->spec = spec;
    j->epoch = epoch;
    j->cfg = cfg;
    err = setup_counts(j, msg, len);
    if (!err && elastic && elastic_len) {
        err = elastic_load(j, elastic, elastic_len, msg, len);
        if (!err)
            err = setup_elastic_counts(j, msg, len);
    }
    if (err) {
        sl_log_error("job_restore_failed", "job=%s epoch=%llu error=\"%s\"", j->name,
                     (unsigned long long)epoch, msg);
        return err;
    }
    for (uint32_t d = 0; d < j->dp_size && d < n; d++) {
        j->progress[d] = positions[d];
        j->reported[d] = 1;
    }
    sl_log_info("job_restored", "job=%s epoch=%llu world=%u dp=%u elastic=%d", j->name,
                (unsigned long long)epoch, spec->world_size, j->dp_size, j->src != NULL);
    return 0;
}
