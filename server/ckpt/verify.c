/* Verify: every recorded shard checked on the worker pool in parallel (quick: size and header
 * against the catalog; deep: also the data's SHA-256), and for a COMPLETE checkpoint the
 * metadata file compared byte for byte with what the catalog renders. */
#include "internal.h"

#include "err.h"
#include "log.h"
#include "metrics.h"
#include "store/layout.h"
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct verify verify;

typedef struct vjob {
    uv_work_t work;
    verify *v;
    int32_t rank; /* -1: the metadata file */
    int queued;
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
    vjob *jobs;  /* world_size shards, then the metadata file */
    sl_buf meta; /* the expected metadata.json */
    char dir[PATH_MAX];
};

static void verify_free(verify *v)
{
    free(v->jobs);
    sl_buf_free(&v->meta);
    free(v);
}

/* Deep: the data section must hash to the catalog's checksum. Returns the verdict. */
static int vjob_hash(vjob *j, int fd)
{
    char got[SL_SHARD_HEX_LEN + 1];
    sl_sha256 *sha = NULL;
    int err = sl_sha256_new(&sha);

    if (!err)
        err = sl_shard_hash_fd(sha, fd, SL_SHARD_HEADER_SIZE, j->data_size);
    if (!err)
        err = sl_sha256_final(sha, got);
    sl_sha256_free(sha);
    if (err) {
        snprintf(j->detail, sizeof(j->detail), "cannot hash: %s", sl_strerror(err));
        return SLUICE__V1__VERDICT__IO_ERROR;
    }
    if (strcmp(got, j->sha) != 0) {
        snprintf(j->detail, sizeof(j->detail), "data hashes to %s, catalog has %s", got, j->sha);
        return SLUICE__V1__VERDICT__CHECKSUM_MISMATCH;
    }
    return SLUICE__V1__VERDICT__OK;
}

/* Quick: size and header against the catalog. Returns the verdict. */
static int vjob_header(vjob *j, int fd)
{
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    sl_shard_header h;
    struct stat st;

    if (fstat(fd, &st) != 0) {
        snprintf(j->detail, sizeof(j->detail), "%s", sl_strerror(-errno));
        return SLUICE__V1__VERDICT__IO_ERROR;
    }
    if ((uint64_t)st.st_size != j->file_size) {
        snprintf(j->detail, sizeof(j->detail), "file has %lld bytes, catalog says %" PRIu64,
                 (long long)st.st_size, j->file_size);
        return SLUICE__V1__VERDICT__SIZE_MISMATCH;
    }
    if (sl_store_pread_all(fd, hdr, sizeof(hdr), 0) != 0 ||
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

/* Paths are built in the worker, not stored per rank: a world of 65536 ranks would otherwise
 * need PATH_MAX bytes each. */
static void vjob_shard(vjob *j, const char *path, int deep)
{
    int fd = sl_store_open(path, O_RDONLY, 0);

    if (fd < 0) {
        j->verdict = fd == -ENOENT ? SLUICE__V1__VERDICT__MISSING : SLUICE__V1__VERDICT__IO_ERROR;
        snprintf(j->detail, sizeof(j->detail), "%s", sl_store_strerror(fd));
        return;
    }
    j->verdict = vjob_header(j, fd);
    if (j->verdict == SLUICE__V1__VERDICT__OK && deep)
        j->verdict = vjob_hash(j, fd);
    close(fd);
}

/* The metadata file must be byte for byte what the catalog renders; it is small (metadata, not
 * data), so it is compared in 64 KiB pieces without holding it whole. */
static void vjob_meta(vjob *j, const char *path, const sl_buf *expect)
{
    uint8_t buf[65536];
    struct stat st;
    uint64_t pos = 0;
    int fd = sl_store_open(path, O_RDONLY, 0);

    if (fd < 0) {
        j->verdict = fd == -ENOENT ? SLUICE__V1__VERDICT__MISSING : SLUICE__V1__VERDICT__IO_ERROR;
        snprintf(j->detail, sizeof(j->detail), "%s", sl_store_strerror(fd));
        return;
    }
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != expect->len) {
        j->verdict = SLUICE__V1__VERDICT__SIZE_MISMATCH;
        snprintf(j->detail, sizeof(j->detail), "file has %lld bytes, expected %zu",
                 (long long)st.st_size, expect->len);
        goto out;
    }
    while (pos < expect->len) {
        size_t n = expect->len - pos < sizeof(buf) ? expect->len - pos : sizeof(buf);
        if (sl_store_pread_all(fd, buf, n, pos) != 0) {
            j->verdict = SLUICE__V1__VERDICT__IO_ERROR;
            snprintf(j->detail, sizeof(j->detail), "cannot read");
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
    close(fd);
}

static void vjob_work(uv_work_t *w)
{
    vjob *j = w->data;
    verify *v = j->v;
    char path[PATH_MAX];
    int err = j->rank < 0
                  ? sl_store_path(path, sizeof(path), v->dir, SL_STORE_META, v->ck.name, 0)
                  : sl_store_path(path, sizeof(path), v->dir, SL_STORE_SHARD, v->ck.name, j->rank);

    if (err) {
        j->verdict = SLUICE__V1__VERDICT__IO_ERROR;
        snprintf(j->detail, sizeof(j->detail), "path too long");
    } else if (j->rank < 0) {
        vjob_meta(j, path, &v->meta);
    } else {
        vjob_shard(j, path, v->deep);
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

static void vjob_after(uv_work_t *w, int status)
{
    vjob *j = w->data;
    verify *v = j->v;
    sl_rpc_call *call = v->call;

    if (--v->pending > 0)
        return;
    if (!sl_rpc_call_is_done(call))
        verify_reply(v);
    verify_free(v);
    sl_rpc_call_unref(call);
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
    if (!v->jobs || ckpt_job_dir(v->svc, v->dir, sizeof(v->dir), v->ck.job) != 0) {
        sl_rpc_call_fail(v->call, -ENOMEM, "out of memory");
        return -ENOMEM;
    }
    for (int32_t r = 0; r <= n; r++) {
        v->jobs[r].v = v;
        v->jobs[r].rank = r < n ? r : -1;
        v->jobs[r].work.data = &v->jobs[r];
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

void ckpt_verify(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    verify *v = verify_new(arg, call, (const Sluice__V1__VerifyRequest *)msg);
    int32_t n;

    if (!v)
        return;
    if (verify_plan(v) != 0) {
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
    /* One reference for the whole verification, dropped by the last job. */
    sl_rpc_call_ref(call);
    for (int32_t r = 0; r <= n; r++)
        if (v->jobs[r].queued)
            uv_queue_work(v->svc->loop, &v->jobs[r].work, vjob_work, vjob_after);
}
