/* The resize chain of a job's epoch (fchain): its elastic blob (the catalog's form: decoding,
 * encoding) and what it plans (the epoch config, index plan, batch plan). Any thread: a Resize
 * builds its chain on the worker pool (resize.c). */
#include "internal.h"

#include "err.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void feed_chain_free(fchain *c)
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
int feed_chain_grow(fchain *c)
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
int feed_chain_decode(const uint8_t *b, size_t len, uint32_t cur_dp, fchain **out)
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
        if ((err = feed_chain_grow(c)) != 0)
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
    feed_chain_free(c);
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

int feed_chain_encode(uint8_t **out, size_t *out_len, const fchain *c)
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
int feed_chain_config(const sl_sample_labels *labels, uint64_t samples, uint64_t epoch, fchain *c,
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

/* The index plan of a chain (index jobs), as feed_chain_config. */
int feed_chain_index_plan(const sl_sample_labels *labels, uint64_t samples, uint64_t epoch,
                          fchain *c, sl_sample_elastic **plan, char *msg, size_t len)
{
    sl_sample_config ocfg;
    int err = feed_chain_config(labels, samples, epoch, c, &ocfg, msg, len);

    if (!err)
        err = sl_sample_elastic_chain(plan, &ocfg, c->steps, c->n, msg, len);
    return err;
}

/* A batch job's elastic plan over its epoch plan's batches (sl_sample_elastic_lockstep). */
int feed_chain_batch_plan(const fchain *c, uint64_t per_rank, int pad, sl_sample_elastic **out,
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
int feed_chain_mixes_modes(const fchain *c)
{
    if (c->spec->n_rank_weights || c->n == 0 || c->steps[0].n_weights)
        return 0;
    for (uint32_t k = 1; k < c->n; k++)
        if (c->steps[k].n_weights)
            return 1;
    return 0;
}
