/* Private to server/feed/: the feeding service's in-memory state. Loop thread only.
 *
 * The catalog is the source of truth; the daemon keeps every job in memory (loaded at start) so a
 * stream or a progress report needs no query. Each job knows its current epoch, the share size of
 * every dp rank in it, every dp rank's reported position, and its open streams.
 */
#ifndef SL_FEED_INTERNAL_H
#define SL_FEED_INTERNAL_H

#include "feed.h"
#include "metrics.h"

#include "auth.h"

#include "batch/batch.h"
#include "catalog/feed.h"
#include "sample/sample.h"
#include "sluice/v1/feed.pb-c.h"
#include "util/name.h"

#include <stdint.h>

#define FEED_MAX_WORLD 65536u

/* Access levels of the methods (sl_rpc_method.access, see auth.h): reading streams and state is
 * for readers, reporting progress for trainers, changing datasets, jobs or epochs for admins. */
#define FEED_ACCESS_ADMIN   SL_ACCESS_ADMIN
#define FEED_ACCESS_READER  SL_ACCESS_READER
#define FEED_ACCESS_TRAINER SL_ACCESS_TRAINER

typedef struct fjob fjob;
typedef struct fresize fresize;
typedef struct fstream fstream;
typedef struct flabels flabels;

/* The source of a job's shares in one epoch when the epoch was resized: the elastic plan,
 * shared by the job and its streams (reference counted, since streams borrow it). */
typedef struct fsrc {
    int refs;
    sl_sample_elastic *plan;
} fsrc;

/* Called when a worker-pool product a call waited for (a batch plan, a torch-mode share) is
 * ready or failed; `job` names the job that asked (it may have been deleted since: look it up,
 * or check the call's own state). */
typedef void (*feed_ready_cb)(sl_rpc_call *call, sl_feed *f, const char *job);

typedef struct fwaiter {
    sl_rpc_call *call; /* referenced until cb ran */
    feed_ready_cb cb;
} fwaiter;

typedef struct fwaiters {
    fwaiter *v;
    size_t n, cap;
} fwaiters;

/* A torch-mode share (its O(N) permutation) of one dp rank in one (job, epoch), built once on the
 * worker pool and shared by every stream of that dp rank (reconnects, tp/cp/pp replicas);
 * sl_sample_fill is thread-safe and streams never move its cursor. Reference counted. */
typedef struct fshare {
    int refs;
    int state; /* 0 building, 1 ready, -1 failed */
    int err;
    char msg[256];
    sl_feed *f;
    sl_sample_config cfg;
    sl_sample *s;
    char job_name[SL_CAT_FEED_NAME_MAX + 1];
    fwaiters waiters; /* streams waiting for it */
    sl_cat_work work;
} fshare;

/* A batch plan for one (job, epoch), computed on the worker pool and shared by all ranks. */
/* One re-plan of a weighted batch job resized mid-epoch (plan.c): the rest of the previous
 * plan's batches, after what each of its ranks consumed, planned again for the new world. */
typedef struct fplan_step {
    sl_batch_config cfg; /* cfg.rank_weights points to w */
    double *w;
    uint64_t *consumed; /* [n_consumed] = the previous plan's world */
    uint32_t n_consumed;
} fplan_step;

typedef struct fplan {
    int refs;
    int state; /* 0 computing, 1 ready, -1 failed */
    int err;
    char msg[256];
    uint64_t epoch;
    sl_batch_plan *plan;
    fjob *job; /* NULL once the job let go of it */
    sl_feed *f;
    char job_name[SL_CAT_FEED_NAME_MAX + 1];
    fwaiters waiters; /* calls waiting for it (streams, Epochs.Get) */
    sl_cat_work work;
    /* inputs for the worker, owned until it finishes */
    sl_batch_config cfg; /* cfg.rank_weights points to rank_weights */
    double *rank_weights;
    sl_sample_config scfg; /* its labels and class_weights point to the two below */
    flabels *labels;       /* a reference while the plan exists, or NULL */
    double *class_weights;
    char path[4200];
    char sha256[65];
    fplan_step *steps; /* re-plans after the epoch's first plan (feed_job_replans), or NULL */
    uint32_t nsteps;
} fplan;

/* The resizes of the current epoch: the spec it began with and one step per mid-epoch resize
 * (what every rank of the world before consumed, the world after). */
typedef struct fchain {
    Sluice__V1__Job *spec; /* unpacked, owned */
    uint32_t dp0;          /* the dp world size of spec */
    uint32_t n;
    sl_sample_resize *steps; /* [n]; consumed and weights owned */
} fchain;

/* At most this many consumed counts in all the steps of a chain (1 GiB of them, 2 GiB of its
 * index plan): runs make a short blob stand for many counts, so its size no longer bounds what
 * decoding it allocates. 2,048 resizes of 65,536 ranks in one epoch. */
#define ELASTIC_COUNTS_MAX (1ull << 27)
#define ELASTIC_STEPS_MAX  65536u

struct fjob {
    sl_feed *feed;
    char name[SL_CAT_FEED_NAME_MAX + 1];
    char dataset[SL_CAT_FEED_NAME_MAX + 1];
    Sluice__V1__Job *spec; /* unpacked, owned; epoch/created_ms are kept in the fields below */
    uint64_t samples;
    uint64_t epoch;
    int64_t created_ms;
    flabels *labels;      /* the dataset's labels if the spec uses classes, else NULL */
    sl_sample_config cfg; /* the epoch's config for rank 0 (borrows labels and the spec) */
    uint32_t dp_size;
    uint64_t *counts;   /* [dp_size] share size (indices) of each dp rank this epoch */
    uint64_t *progress; /* [dp_size] reported position of each dp rank */
    /* [dp_size] 1 once the dp rank reported in this epoch: an empty share (fewer samples than
     * ranks with drop_last) is done only when its rank said so, so the epochs of a job whose
     * shares are all empty advance in step with the ranks instead of racing ahead. */
    uint8_t *reported;
    /* Elastic remainder of the current epoch (resized mid-epoch), else NULL. Index jobs: the
     * rest of the epoch's indices; batch jobs: the rest of the epoch's batches, numbered
     * step x D0 + rank of the plan made for the epoch's first world D0 (built once that plan is
     * ready: feed_job_batch_src). */
    fsrc *src;
    fchain *chain;         /* the epoch's resizes (decoded elastic_blob), NULL if none */
    uint64_t bcount;       /* batch jobs with a chain: batches per rank on the elastic shares */
    uint8_t *elastic_blob; /* as stored in the catalog */
    size_t elastic_len;
    fplan *plan;      /* batch plan of the current epoch, NULL until first asked for */
    fshare **shares;  /* [dp_size] torch-mode shares of the current epoch, built on demand */
    uint64_t gen;     /* bumped when the epoch advances or the job is resized */
    uint64_t version; /* the catalog's count of resizes and restores (replicas, sync.c) */
    fstream *streams;
    /* A Resize whose chain is being built on the worker pool (feed_job_resize_start), else
     * NULL: the calls on the job wait for it (feed_job_resize_park). */
    fresize *resizing;
    fjob *next;
};

/* A progress report waiting for the next group commit. */
typedef struct freport {
    sl_rpc_call *call; /* referenced until answered */
    char job[SL_CAT_FEED_NAME_MAX + 1];
    uint32_t dp;
    uint64_t epoch, position, gen;
} freport;

/* How the lower files (state.c, plan.c) reach the streams and the jobs above them: through
 * these hooks, registered by feed.c, so that calls between the folder's files point one way
 * (stream.c and jobs.c call state.c, plan.c and share.c; never the reverse). */
typedef struct feed_hooks {
    /* End the job's streams of the current epoch (resize) or all of them (delete). */
    void (*streams_end)(fjob *j, int all, sl_rpc_code code, const char *why);
    /* The job's epoch advanced: start the streams waiting for it. */
    void (*epoch_began)(fjob *j);
    /* The job's current batch plan is ready: reports recorded before it may complete the
     * epoch. */
    void (*plan_ready)(fjob *j);
} feed_hooks;

struct sl_feed {
    uv_loop_t *loop;
    sl_cat *cat;
    char data_dir[4096];
    fjob *jobs;
    int shutting_down;
    uint64_t upload_seq;
    char tmp_tag[17]; /* random, this process's: replicas sharing the data dir never pick one
                       * temporary name */
    /* Progress reports are written in one transaction per loop iteration (a uv_check after
     * the poll phase), so one fsync covers every report that arrived together. */
    freport *pending;
    size_t n_pending, cap_pending;
    uv_check_t *flush; /* heap: it outlives the feed until its close callback */
    /* A shared catalog: a connection of its own on which a worker writes the group commits
     * (one at a time: `flushing`), so the loop never waits for them (sl_feed_set_writer). */
    sl_cat *wcat;
    int flushing;
    uv_timer_t *orphans; /* shared catalog: advances epochs left complete (sync.c); heap */
    feed_hooks hooks;
    sl_rpc_service svcs[4];
    sl_metrics *metrics; /* NULL: not counted */
    /* Where streams build their next message (indices, batch structs): one buffer for all, as
     * a message is packed before the next stream runs; streams hold no buffer of their own. */
    void *scratch;
    size_t scratch_cap;
    flabels *labels; /* labels in memory, one per (dataset, checksum) (labels.c) */
    /* An elastic state built on the worker pool for the load about to run (state.c,
     * feed_job_reload_start), taken by the load of its job with the same blob; else NULL. */
    fresize *prebuilt;
    /* Loads a job from its catalog row unless it is in memory already; labels.c runs it for the
     * loads that waited for labels (feed.c sets it, so labels.c calls neither state.c nor
     * sync.c, which call it). */
    int (*load_row)(const sl_cat_job *row, void *feed);
};

/* ---- spec.c: names and specs (pure) ---- */

/* data_dir/datasets/<name>.lengths into buf (name already checked). */
int feed_lengths_path(const sl_feed *f, const char *name, char *buf, size_t len);

/* data_dir/datasets/<name>.labels into buf (name already checked). */
int feed_labels_path(const sl_feed *f, const char *name, char *buf, size_t len);

/* 1 if the mesh is set (any dimension non-zero). */
int feed_mesh_set(const Sluice__V1__Mesh *m);

/* Build the epoch's sample config of a spec for `samples` with the dataset's labels (NULL if it
 * has none or the spec uses no classes); validates everything about the spec. The config borrows
 * the spec's weights and the labels. Returns 0 or SL_EINVAL / SL_ELIMIT with a message. */
int feed_spec_config(sl_sample_config *cfg, const Sluice__V1__Job *spec,
                     const sl_sample_labels *labels, uint64_t samples, uint64_t epoch, char *msg,
                     size_t len);

/* The spec's batch config for dp_size ranks (spec->batching must be set). */
int feed_spec_batch_config(sl_batch_config *bc, const Sluice__V1__Job *spec, uint32_t dp_size,
                           uint64_t seed, uint64_t epoch, char *msg, size_t len);

/* What an IndexChunk packs besides its indices, at most: epoch, start and share_count (a tag and
 * up to 10 varint bytes each) and the indices' tag and length. */
#define FEED_CHUNK_OVERHEAD 48

/* Indices per IndexChunk: `max_chunk` (the request's), but no more than pack into `msg_bytes`
 * when every index takes the varint bytes of the largest one (samples - 1). At least 1. */
uint32_t feed_index_chunk(uint32_t max_chunk, uint64_t samples, size_t msg_bytes);

/* ---- state.c: jobs in memory ---- */

fjob *feed_job_find(sl_feed *f, const char *name);

/* Create the in-memory job (and compute its epoch state). Takes ownership of spec. Returns 0,
 * FEED_PENDING when its labels are being read (no job is added: it is loaded from the catalog
 * once they are, feed_labels_defer_load), or a failure with msg. */
int feed_job_add(sl_feed *f, fjob **out, const char *name, const char *dataset,
                 Sluice__V1__Job *spec, uint64_t samples, uint64_t epoch, int64_t created_ms,
                 const void *elastic, size_t elastic_len, char *msg, size_t len);

/* Remove and free a job, ending its streams with `code`. */
void feed_job_remove(sl_feed *f, fjob *j, sl_rpc_code code, const char *why);

/* dp rank of a global rank in the job's current world. SL_EINVAL if out of range. */
int feed_job_dp_rank(const fjob *j, uint32_t rank, uint32_t *dp, char *msg, size_t len);

/* Whether positions are counted in batches (the job has batching) and the dp rank's share size
 * in that unit; for batch jobs the plan must be ready, else SL_ESTATE. */
int feed_job_count(const fjob *j, uint32_t dp, uint64_t *count);

/* Check a report against the job's current epoch and the share size. */
int feed_job_report_check(const fjob *j, uint32_t dp, uint64_t epoch, uint64_t position, char *msg,
                          size_t len);

/* 1 if the dp rank's report is news: a higher position, or its first report in the epoch. */
int feed_job_report_new(const fjob *j, uint32_t dp, uint64_t position);

/* The group's common position: the lowest position any dp rank reported in the epoch. Streams
 * that ask for it (group_position) resume there, so after a group restart every dp rank has the
 * same number of steps left. */
uint64_t feed_job_group_position(const fjob *j);

/* Apply a durable report in memory; advances the epoch when complete (unless manual). */
int feed_job_report_apply(fjob *j, uint32_t dp, uint64_t position, int *advanced);

/* Queue a checked report for the next group commit (reports.c); the call is answered then. */
int feed_report_enqueue(sl_feed *f, sl_rpc_call *call, const fjob *j, uint32_t dp, uint64_t epoch,
                        uint64_t position);

/* Start the group-commit machinery / stop it (feed.c). */
int feed_reports_init(sl_feed *f);
void feed_reports_close(sl_feed *f);

/* Begin epoch j->epoch + 1. */
int feed_job_advance(fjob *j);

/* Make `next` the job's current epoch in memory (the catalog has it already: written by
 * feed_job_advance, or by another replica) and start the streams waiting for it. */
int feed_job_enter(fjob *j, uint64_t next);

/* sl_cat_progress_list's callback (arg: the fjob): a row of the job's current epoch raises the
 * dp rank's position in memory (never lowers it) and marks it reported. */
int feed_job_merge_progress(uint32_t dp, uint64_t epoch, uint64_t position, void *arg);

/* ---- sync.c: replicas of a shared catalog ---- */

/* A job's row as the catalog has it (loaded at start, or when another replica made or changed
 * it): added to memory; a complete epoch advanced. Returns 0 (a job that does not load is logged
 * and skipped) or SL_EDB. sl_cat_job_list / sl_cat_job_get callback, arg: the sl_feed. */
int feed_job_load(const sl_cat_job *row, void *arg);

/* Bring job `name` in memory in step with the catalog: loaded if new, removed if gone (its
 * streams end with NOT_FOUND), replaced if resized or restored (ABORTED: reopen), moved to the
 * next epoch, its progress merged. *out: the job after (NULL if none). No-op with SQLite. Any
 * fjob pointer of the caller may be stale after it: look the job up again. */
int feed_job_refresh(sl_feed *f, const char *name, fjob **out);

/* feed_job_refresh for a call that wants the catalog's state of the job, except that when the
 * catalog cannot be read a job this replica has is answered from its copy (0; reads and streams
 * go on while PostgreSQL is away, as of a moment ago); an unknown one gets the error. */
int feed_job_current(sl_feed *f, const char *name, fjob **out);

/* A shared catalog: listen to the other replicas' announcements. feed_sync_close when done. */
int feed_sync_init(sl_feed *f);
void feed_sync_close(sl_feed *f);

/* A job that another replica's write made complete: advanced in a moment unless that replica
 * advances it first (it does, unless it died in between). */
void feed_sync_unadvanced(sl_feed *f);

/* The plan_ready hook: advance the epoch if reports recorded before the plan complete it. */
void feed_job_plan_ready(fjob *j);

/* Whether a batch job resized mid-epoch re-plans the rest of its epoch: decided by the epoch's
 * start, its first spec's rank weights or its first resize's. Each resize's rest — the previous
 * plan's batches after what each rank consumed — is then planned again for the new world and
 * weights, so budgets follow the new ranks. Otherwise the plan's batches are dealt out as they
 * are (elastic shares, feed_job_batch_src), and a later resize may not bring weights (state.c
 * refuses such a chain). */
static inline int feed_job_replans(const fjob *j)
{
    if (!j->spec->batching || !j->chain)
        return 0;
    return j->chain->spec->n_rank_weights || (j->chain->n && j->chain->steps[0].n_weights);
}

/* The plan and dp world a batch job's epoch plan is made for: the epoch's first spec when it
 * was resized mid-epoch (the rest of its batches is redistributed), else the job's own. */
static inline const Sluice__V1__Job *feed_job_plan_spec(const fjob *j, uint32_t *dp_size)
{
    if (j->chain) {
        *dp_size = j->chain->dp0;
        return j->chain->spec;
    }
    *dp_size = j->dp_size;
    return j->spec;
}

/* A resized batch job whose plan is ready: build its elastic shares of the rest of the epoch's
 * batches if not built yet. Returns 0 (also when there is nothing to build) or an error with a
 * message. */
int feed_job_batch_src(fjob *j, char *msg, size_t len);

/* Resize to a new world (and mesh), with new rank weights (weights[0..nw), one per new dp rank)
 * or none (nw 0: the job's weights stay while the dp world keeps its size). Any number of times
 * in an epoch: mid-epoch, what every dp rank has not consumed yet is redistributed over the new
 * world (index jobs: the indices, in proportion to the weights; batch jobs: the batches, equal
 * counts per rank, re-planned for the new budgets when weights are involved, feed_job_replans).
 * The weights are copied. */
int feed_job_resize(fjob *j, uint32_t world, const Sluice__V1__Mesh *mesh, const double *weights,
                    size_t nw, char *msg, size_t len);

/* What feed_job_resize_start's callback gets when the job changed while the chain was built (a
 * report raised a position, the epoch advanced, a restore or another replica replaced the job):
 * nothing was written; run the Resize again on the job as it is now. */
#define FEED_RETRY 2

/* Called on the loop (lane) when a Resize started with feed_job_resize_start ends: err 0 (the
 * job, looked up by `job`, has its new world), FEED_RETRY, or a failure with msg. */
typedef void (*feed_resize_cb)(sl_rpc_call *call, sl_feed *f, const char *job, int err,
                               const char *msg);

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

/* feed_job_resize for a call: a resize that chains (mid-epoch, or after another in the epoch)
 * builds its chain, index plan and elastic blob on the worker pool from a snapshot of the job,
 * then commits on the loop if the job is as it was (else cb gets FEED_RETRY); meanwhile the job
 * keeps its old state, its streams go on and its calls wait (feed_job_resize_park). Returns
 * FEED_PENDING (cb runs later, with `call` referenced until then), or the result of a resize
 * done at once (0 or a failure with msg; cb is not called). The job must not be resizing. */
int feed_job_resize_start(fjob *j, uint32_t world, const Sluice__V1__Mesh *mesh,
                          const double *weights, size_t nw, sl_rpc_call *call, feed_resize_cb cb,
                          char *msg, size_t len);

/* Another replica resized or restored job j (sync.c): build the chain and index plan of the
 * row's elastic state on the worker pool first, the job keeping its old state meanwhile and its
 * calls waiting (j->resizing); then refresh(f, job) runs (sync.c, which reads the row again and
 * loads the job: the load takes them, if the blob is still the same). Returns
 * FEED_PENDING, or 0 when there is nothing to build off the loop (no elastic state, a batch job,
 * a job already resizing or reloading): replace the job now. Loop thread (lane). */
int feed_job_reload_start(fjob *j, const sl_cat_job *row,
                          void (*refresh)(sl_feed *f, const char *job));

/* Park `call` until the job's Resize in flight ends (j->resizing set): cb runs then (look the job
 * up again). Returns 0 or -ENOMEM. */
int feed_job_resize_park(fjob *j, sl_rpc_call *call, feed_ready_cb cb);

/* Put the job back to a checkpoint's state in memory (the catalog already has it): `spec`
 * (owned from now on), `epoch`, its elastic state and each dp rank's position, reported. Ends
 * every stream of the job with ABORTED. */
int feed_job_rewind(fjob *j, Sluice__V1__Job *spec, uint64_t epoch, const void *elastic,
                    size_t elastic_len, const uint64_t *positions, uint32_t n, char *msg,
                    size_t len);

/* 1 if every dp rank finished the epoch. */
int feed_job_complete(const fjob *j);

/* ---- state.c: a job's epoch state, shared with resize.c ---- */

/* Install a chain (owned from now on) and its blob as the current epoch's elastic state: index
 * jobs get their plan now (`plan`, owned from now on, when built already), batch jobs once
 * their epoch plan is ready. */
int feed_job_elastic_install(fjob *j, fchain *c, const uint8_t *blob, size_t blob_len,
                             sl_sample_elastic *plan, char *msg, size_t len);
/* Build the elastic source of the current epoch from a blob. */
int feed_job_elastic_load(fjob *j, const uint8_t *blob, size_t blob_len, char *msg, size_t len);
/* Forget the epoch's shares, elastic state and progress. */
void feed_job_drop_epoch(fjob *j);
/* Compute dp_size, counts and zeroed progress for j->cfg (and j->src when elastic). */
int feed_job_setup_counts(fjob *j, char *msg, size_t len);
/* The per-rank counts of an elastic epoch (j->src; nothing without one). */
int feed_job_setup_elastic_counts(fjob *j, char *msg, size_t len);

/* ---- chain.c: a chain's elastic blob and plans (any thread) ---- */

void feed_chain_free(fchain *c);
/* Room for one more step. */
int feed_chain_grow(fchain *c);
/* Decode an elastic blob ("SLE1"/"SLE2", chain.c); cur_dp is the world after an "SLE1" blob's
 * single resize. */
int feed_chain_decode(const uint8_t *b, size_t len, uint32_t cur_dp, fchain **out);
int feed_chain_encode(uint8_t **out, size_t *out_len, const fchain *c);
/* A chain's epoch config and dp0 (the epoch's first dp world), for a job of `samples` with its
 * `labels` in `epoch`. */
int feed_chain_config(const sl_sample_labels *labels, uint64_t samples, uint64_t epoch, fchain *c,
                      sl_sample_config *cfg, char *msg, size_t len);
/* The index plan of a chain (index jobs), as feed_chain_config. */
int feed_chain_index_plan(const sl_sample_labels *labels, uint64_t samples, uint64_t epoch,
                          fchain *c, sl_sample_elastic **plan, char *msg, size_t len);
/* A batch job's elastic plan over its epoch plan's batches (sl_sample_elastic_lockstep). */
int feed_chain_batch_plan(const fchain *c, uint64_t per_rank, int pad, sl_sample_elastic **out,
                          uint64_t *count, char *msg, size_t len);
/* 1 if a batch job's chain dealt batches out unweighted first and brings weights later (it
 * cannot be served: feed_job_replans). */
int feed_chain_mixes_modes(const fchain *c);

void fsrc_unref(fsrc *s);

/* ---- labels.c: datasets' labels in memory ---- */

/* 1 if the spec needs its dataset's labels (stratify, balance_classes or class_weights). */
int feed_spec_wants_labels(const Sluice__V1__Job *spec);

/* What feed_labels_get returns while the labels are being read on the worker pool. */
#define FEED_PENDING 1

/* A reference to the labels of `dataset` as the catalog has them now. Returns 0 (read),
 * FEED_PENDING (being read on the worker pool: the reading is started if no one held them; wait
 * with feed_labels_park or feed_labels_defer_load, or let go), SL_ESTATE (the dataset has no
 * labels), SL_ECORRUPT (the file is not the catalog's), -errno or -ENOMEM with msg. Release with
 * flabels_unref. Loop thread (lane). */
int feed_labels_get(flabels **out, sl_feed *f, const char *dataset, char *msg, size_t len);
/* 0 while being read, 1 read, -1 failed. */
int flabels_state(const flabels *fl);
/* A unary or server-streaming handler, as the RPC layer calls it. */
typedef void (*feed_handler)(sl_rpc_call *call, const ProtobufCMessage *m, void *arg);
/* Park `call` until the labels fl are read (or failed), then run h(call, a copy of m, arg) again
 * (or end the call UNAVAILABLE at shutdown); fl is held meanwhile. Returns 0, -ENOMEM, or
 * SL_ESTATE when fl is not being read. */
int feed_labels_park(flabels *fl, sl_rpc_call *call, const ProtobufCMessage *m, feed_handler h,
                     void *arg);
/* Load job `job` from its catalog row (feed_job_load) once fl is read. Returns 0 or -ENOMEM. */
int feed_labels_defer_load(flabels *fl, const char *job);
/* 1 if a load of `job` waits for labels being read (feed_labels_defer_load). */
int feed_labels_loading(sl_feed *f, const char *job);
/* 1 while any labels are being read on the worker pool. */
int feed_labels_reading(const sl_feed *f);
/* If a load of `job` waits for labels (feed_labels_defer_load), park `call` as feed_labels_park
 * does and return 1; else 0 (-ENOMEM if parking failed). */
int feed_labels_park_job(sl_feed *f, const char *job, sl_rpc_call *call, const ProtobufCMessage *m,
                         feed_handler h, void *arg);
/* The grouped labels once read, else NULL. */
const sl_sample_labels *flabels_of(const flabels *fl);
/* Read and group a stored labels file: fd open for reading, n labels (one u32 little-endian per
 * sample) whose SHA-256 must be `sha256` (lowercase hex). The size is checked before anything is
 * allocated. Returns 0 and *out (free with sl_sample_labels_free), SL_ECORRUPT (size or checksum
 * not the catalog's), SL_EINVAL (a class id of 2^20 or more), -errno or -ENOMEM, with msg.
 * Any thread (also the fuzz target tests/fuzz/fuzz_read_labels.c). */
int feed_labels_read(sl_sample_labels **out, int fd, uint64_t n, const char *sha256, char *msg,
                     size_t len);
/* Take another reference (a batch plan's while a worker reads the labels; a job's across its
 * replacement) and return fl / release one. Accept NULL. */
flabels *flabels_ref(flabels *fl);
void flabels_unref(sl_feed *f, flabels *fl);

/* ---- wait.c ---- */

/* Park `call` (referenced until cb ran) in w. Returns 0 or -ENOMEM. */
int feed_waiters_add(fwaiters *w, sl_rpc_call *call, feed_ready_cb cb);

/* Call every waiter's cb(call, f, job), release the calls and empty w. */
void feed_waiters_run(fwaiters *w, sl_feed *f, const char *job);

/* ---- share.c: torch-mode shares ---- */

/* Take a reference to dp rank `dp`'s torch-mode share of the job's current epoch (`cfg` its
 * sample config), starting its build on the worker pool if needed, into *out (release with
 * fshare_unref), and call cb once it is built or failed: at once if it is. Returns 0, or -ENOMEM
 * or SL_EUNAVAILABLE with msg (cb is not called). */
int feed_share_wait(fshare **out, fjob *j, uint32_t dp, const sl_sample_config *cfg,
                    sl_rpc_call *call, feed_ready_cb cb, char *msg, size_t len);
void fshare_unref(fshare *s);

/* ---- plan.c: batch plans ---- */

void fplan_unref(fplan *p);

/* Ask for the current epoch's plan (starts it on the worker pool if needed). */
int feed_plan_request(fjob *j, char *msg, size_t len);

/* Call cb once the current epoch's plan is ready (or failed): at once if it is, else when it
 * is (the call is parked). Returns 0, or the error of feed_plan_request (e.g. SL_ESTATE: no
 * lengths) or -ENOMEM with msg set; then cb is not called and the caller answers the call. */
int feed_plan_wait(fjob *j, sl_rpc_call *call, feed_ready_cb cb, char *msg, size_t len);

/* ---- stream.c ---- */

/* The streams_end hook: end every stream of the job in the current epoch (resize) or all
 * (delete). */
void feed_streams_end(fjob *j, int all, sl_rpc_code code, const char *why);

/* The epoch_began hook: the job's epoch advanced, start the streams waiting for it. */
void feed_streams_epoch_began(fjob *j);

const sl_rpc_service *feed_datasets_service(sl_feed *f);
const sl_rpc_service *feed_jobs_service(sl_feed *f);
const sl_rpc_service *feed_epochs_service(sl_feed *f);
const sl_rpc_service *feed_stream_service(sl_feed *f);

#endif
