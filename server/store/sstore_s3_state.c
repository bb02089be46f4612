/* The state object of a partial upload in a bucket (sstore_s3.c has the design): written after
 * each part that extends the stored prefix, read back by a resume and UploadStatus. Plain text,
 * one "key value" per line; parts as "part N ETAG". */
#include "sstore_s3_internal.h"

#include "layout.h"

#include "err.h"
#include "log.h"
#include "util/buf.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the state object ---- */

static int hex_put(sl_buf *b, const uint8_t *p, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    int err = 0;

    for (size_t i = 0; i < n && !err; i++) {
        char two[2] = {digits[p[i] >> 4], digits[p[i] & 15]};
        err = sl_buf_add(b, two, 2);
    }
    return err;
}

static int hex_get(const char *hex, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int v = 0;
        for (int k = 0; k < 2; k++) {
            char ch = hex[2 * i + k];
            int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
            if (d < 0)
                return SL_ECORRUPT;
            v = v * 16 + d;
        }
        out[i] = (uint8_t)v;
    }
    return hex[2 * n] == '\0' ? 0 : SL_ECORRUPT;
}

/* Write the state object: what is stored so far. */
int s3s_state_save(sl_swriter *w)
{
    sl_buf b;
    int err;

    sl_buf_init(&b, STATE_MAX);
    err = sl_buf_printf(
        &b,
        "sluice-upload 1\nupload_id %s\nrank %d\ndata_size %" PRIu64
        "\ntensor_count %u\npart_size %" PRIu64 "\ndata_done %" PRIu64 "\nsha_state ",
        w->upload_id, w->rank, w->data_size, w->tensor_count, w->part_size, w->data_done);
    if (!err)
        err = hex_put(&b, w->done_state, sizeof(w->done_state));
    if (!err)
        err = sl_buf_addstr(&b, "\n");
    for (int p = 2; p <= w->prefix_upto && !err; p++)
        err = sl_buf_printf(&b, "part %d %s\n", p, w->etags[p]);
    if (!err && w->sealed)
        err = sl_buf_printf(&b, "sealed %s\n", w->sealed_sha);
    for (int p = 1; w->sealed && p <= w->max_part && !err; p++)
        err = sl_buf_printf(&b, "sealed_part %d %s\n", p, w->etags[p]);
    if (!err)
        err = sl_s3_put(w->s->c, w->state_key, b.p, b.len, w->errmsg, sizeof(w->errmsg));
    sl_buf_free(&b);
    return err;
}

/* Parse a state object (NUL-terminated text); etags (may be NULL) receives the parts' ETags. */
static int state_parse(char *text, ustate *u, char (*etags)[SL_S3_ETAG_MAX], int max_part)
{
    int seen = 0;
    char *save = NULL;

    memset(u, 0, sizeof(*u));
    u->last_part = 1;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *sp = strchr(line, ' ');
        const char *v;
        if (!sp)
            return SL_ECORRUPT;
        *sp = '\0';
        v = sp + 1;
        if (strcmp(line, "sluice-upload") == 0) {
            seen |= strcmp(v, "1") == 0;
        } else if (strcmp(line, "upload_id") == 0) {
            if (strlen(v) >= sizeof(u->upload_id))
                return SL_ECORRUPT;
            snprintf(u->upload_id, sizeof(u->upload_id), "%s", v);
        } else if (strcmp(line, "rank") == 0) {
            u->rank = (int32_t)strtol(v, NULL, 10);
        } else if (strcmp(line, "data_size") == 0) {
            u->data_size = strtoull(v, NULL, 10);
        } else if (strcmp(line, "tensor_count") == 0) {
            u->tensor_count = (uint32_t)strtoul(v, NULL, 10);
        } else if (strcmp(line, "part_size") == 0) {
            u->part_size = strtoull(v, NULL, 10);
        } else if (strcmp(line, "data_done") == 0) {
            u->data_done = strtoull(v, NULL, 10);
        } else if (strcmp(line, "sha_state") == 0) {
            if (strlen(v) != 2 * SL_SHA256_STATE_LEN || hex_get(v, u->sha, sizeof(u->sha)) != 0)
                return SL_ECORRUPT;
            seen |= 2;
        } else if (strcmp(line, "sealed") == 0) {
            if (strlen(v) != SL_SHARD_HEX_LEN)
                return SL_ECORRUPT;
            memcpy(u->sealed, v, SL_SHARD_HEX_LEN + 1);
        } else if (strcmp(line, "sealed_part") == 0) {
            char *end;
            long p = strtol(v, &end, 10);
            if (p != u->sealed_parts + 1 || p > max_part || *end != ' ' ||
                strlen(end + 1) >= SL_S3_ETAG_MAX)
                return SL_ECORRUPT;
            if (etags)
                snprintf(etags[p], SL_S3_ETAG_MAX, "%s", end + 1);
            u->sealed_parts = (int)p;
        } else if (strcmp(line, "part") == 0) {
            char *end;
            long p = strtol(v, &end, 10);
            if (p != u->last_part + 1 || p > max_part || *end != ' ' ||
                strlen(end + 1) >= SL_S3_ETAG_MAX)
                return SL_ECORRUPT;
            if (etags)
                snprintf(etags[p], SL_S3_ETAG_MAX, "%s", end + 1);
            u->last_part = (int)p;
        }
    }
    if (u->sealed[0] &&
        (u->part_size < PART_MIN || u->sealed_parts != s3s_part_count(u->data_size, u->part_size)))
        return SL_ECORRUPT;
    return seen == 3 && u->upload_id[0] && u->part_size >= PART_MIN ? 0 : SL_ECORRUPT;
}

/* Read the state object at key into *u. SL_ENOTFOUND if there is none. */
int s3s_state_load(s3store *s, const char *key, ustate *u, char (*etags)[SL_S3_ETAG_MAX],
                   int max_part, char *msg, size_t msglen)
{
    sl_buf b;
    int err;

    sl_buf_init(&b, STATE_MAX + 1);
    err = sl_s3_get_all(s->c, key, STATE_MAX, &b, msg, msglen);
    if (!err && (err = sl_buf_add(&b, "", 1)) == 0) /* NUL-terminate */
        err = state_parse(b.p, u, etags, etags ? max_part : PARTS_MAX);
    if (err == SL_ECORRUPT)
        snprintf(msg, msglen, "the upload state %.200s does not parse", key);
    sl_buf_free(&b);
    return err;
}

/* The shard's key of the state object "<job>/.<file>.part": "<job>/<file>", the key its
 * multipart upload was started on (an abort names the upload by that key and its id). */
static int state_shard_key(const char *state_key, char *out, size_t len)
{
    const char *slash = strrchr(state_key, '/');
    const char *base = slash ? slash + 1 : state_key;
    size_t blen = strlen(base), sfx = strlen(".part");

    if (base[0] != '.' || blen <= 1 + sfx || strcmp(base + blen - sfx, ".part") != 0)
        return SL_EINVAL;
    int n = snprintf(out, len, "%.*s%.*s", (int)(base - state_key), state_key,
                     (int)(blen - 1 - sfx), base + 1);
    return n < 0 || (size_t)n >= len ? SL_ELIMIT : 0;
}

/* Abort the multipart upload a state object names and remove it with its head object. Best
 * effort: what stays is the sweeps'. */
void s3s_state_discard(s3store *s, const char *state_key)
{
    char msg[256], head_key[SL_S3_KEY_MAX], key[SL_S3_KEY_MAX];
    ustate u;

    if (s3s_state_load(s, state_key, &u, NULL, 0, msg, sizeof(msg)) == 0 && u.upload_id[0] &&
        state_shard_key(state_key, key, sizeof(key)) == 0) {
        int err = sl_s3_mpu_abort(s->c, key, u.upload_id, msg, sizeof(msg));
        if (err && err != SL_EUNIMPL)
            sl_log_warn("s3_abort_failed", "key=%s error=\"%s\"", state_key, msg);
    }
    if (snprintf(head_key, sizeof(head_key), "%s%s", state_key, HEAD_SUFFIX) <
        (int)sizeof(head_key))
        sl_s3_delete(s->c, head_key, msg, sizeof(msg));
    sl_s3_delete(s->c, state_key, msg, sizeof(msg));
}

/* ---- the shard's header, a recorded shard published late ---- */

int s3s_shard_sha(sl_sstore *base, const char *job, const char *file, uint64_t *size,
                  char sha[SL_SHARD_HEX_LEN + 1])
{
    s3store *s = (s3store *)base;
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    char key[SL_S3_KEY_MAX], msg[256];
    sl_shard_header h;
    int err;

    if (obj_key(key, sizeof(key), job, file, NULL) != 0)
        return SL_ENOTFOUND;
    if ((err = sl_s3_head(s->c, key, size, NULL, msg, sizeof(msg))) != 0)
        return err;
    if (*size < SL_SHARD_HEADER_SIZE)
        return SL_ECORRUPT;
    if ((err = sl_s3_get(s->c, key, 0, hdr, sizeof(hdr), msg, sizeof(msg))) != 0)
        return err;
    if (sl_shard_header_decode(&h, hdr, sizeof(hdr)) != 0)
        return SL_ECORRUPT;
    memcpy(sha, h.sha256, SL_SHARD_HEX_LEN + 1);
    return 0;
}

/* A shard the catalog recorded whose holder died, or paused, between the record and
 * CompleteMultipartUpload: the sealed state with the record's checksum has every part's ETag, and
 * the commit (holding its claim: nothing records or publishes meanwhile) completes it. */
int s3s_recover(sl_sstore *base, const char *job, const char *name, int32_t rank, const char *sha)
{
    s3store *s = (s3store *)base;
    char file[NAME_MAX + 1], part[NAME_MAX + 1], key[SL_S3_KEY_MAX], state_key[SL_S3_KEY_MAX];
    char msg[256] = "";
    char(*etags)[SL_S3_ETAG_MAX] = NULL;
    ustate u;
    int err;

    if (sl_store_file_name(file, sizeof(file), SL_STORE_SHARD, name, rank) != 0 ||
        sl_store_file_name(part, sizeof(part), SL_STORE_PART, name, rank) != 0 ||
        obj_key(key, sizeof(key), job, file, NULL) != 0 ||
        obj_key(state_key, sizeof(state_key), job, part, NULL) != 0)
        return SL_ENOTFOUND;
    err = s3s_state_load(s, state_key, &u, NULL, 0, msg, sizeof(msg));
    if (!err && (u.rank != rank || strcmp(u.sealed, sha) != 0))
        err = SL_ENOTFOUND;
    if (!err && !(etags = calloc((size_t)u.sealed_parts + 1, sizeof(*etags))))
        err = -ENOMEM;
    if (!err)
        err = s3s_state_load(s, state_key, &u, etags, u.sealed_parts, msg, sizeof(msg));
    if (!err && strcmp(u.sealed, sha) != 0)
        err = SL_ENOTFOUND;
    if (!err)
        err = sl_s3_mpu_complete(s->c, key, u.upload_id, u.sealed_parts,
                                 (const char(*)[SL_S3_ETAG_MAX])(etags + 1), msg, sizeof(msg));
    free(etags);
    if (err == SL_ECORRUPT && !msg[0])
        err = SL_ENOTFOUND;
    if (err) {
        if (err != SL_ENOTFOUND)
            sl_log_warn("s3_recover_failed", "key=%s error=\"%s\"", key, msg);
        return err;
    }
    sl_log_info("s3_shard_recovered", "key=%s upload_id=%s sha256=%s", key, u.upload_id, sha);
    {
        char head_key[SL_S3_KEY_MAX];
        if (snprintf(head_key, sizeof(head_key), "%s%s", state_key, HEAD_SUFFIX) <
            (int)sizeof(head_key))
            sl_s3_delete(s->c, head_key, msg, sizeof(msg));
        sl_s3_delete(s->c, state_key, msg, sizeof(msg));
    }
    return 0;
}

typedef struct tidy_ctx {
    s3store *s;
    const char *name;
    int32_t world_size;
    const char (*shas)[SL_SHARD_HEX_LEN + 1];
    int removed;
} tidy_ctx;

static int tidy_one(const char *key, uint64_t size, int64_t mtime_ms, void *arg)
{
    tidy_ctx *t = arg;
    const char *file = strchr(key, '/');
    char name[NAME_MAX + 1], head_key[SL_S3_KEY_MAX], msg[256];
    int32_t rank;
    ustate u;

    (void)size;
    (void)mtime_ms;
    if (!file || strchr(file + 1, '/') ||
        sl_store_classify(file + 1, name, sizeof(name), &rank) != SL_STORE_PART ||
        strcmp(name, t->name) != 0 || rank < 0 || rank >= t->world_size)
        return 0;
    /* Only the sealed state of the very shard that is published: anything else is an attempt
     * the sweeps judge. */
    if (s3s_state_load(t->s, key, &u, NULL, 0, msg, sizeof(msg)) != 0 || u.rank != rank ||
        strcmp(u.sealed, t->shas[rank]) != 0)
        return 0;
    if (snprintf(head_key, sizeof(head_key), "%s%s", key, HEAD_SUFFIX) < (int)sizeof(head_key))
        sl_s3_delete(t->s->c, head_key, msg, sizeof(msg));
    sl_s3_delete(t->s->c, key, msg, sizeof(msg));
    t->removed++;
    return 0;
}

void s3s_tidy(sl_sstore *base, const char *job, const char *name, int32_t world_size,
              const char (*shas)[SL_SHARD_HEX_LEN + 1])
{
    s3store *s = (s3store *)base;
    tidy_ctx t = {s, name, world_size, shas, 0};
    char prefix[SL_S3_KEY_MAX], msg[256];
    int n = snprintf(prefix, sizeof(prefix), "%s/.%s_shard_", job, name);

    if (n < 0 || (size_t)n >= sizeof(prefix))
        return;
    if (sl_s3_list(s->c, prefix, tidy_one, &t, msg, sizeof(msg)) != 0)
        sl_log_warn("s3_tidy_failed", "job=%s name=%s error=\"%s\"", job, name, msg);
    else if (t.removed)
        sl_log_info("s3_upload_states_removed", "job=%s name=%s count=%d", job, name, t.removed);
}

int s3s_held(sl_sstore *base, const char *job, const char *name, int32_t rank, uint64_t *held)
{
    s3store *s = (s3store *)base;
    char part[NAME_MAX + 1], key[SL_S3_KEY_MAX], msg[256];
    ustate u;
    int err;

    if (sl_store_file_name(part, sizeof(part), SL_STORE_PART, name, rank) != 0 ||
        obj_key(key, sizeof(key), job, part, NULL) != 0)
        return SL_ENOTFOUND;
    err = s3s_state_load(s, key, &u, NULL, 0, msg, sizeof(msg));
    if (err)
        return err == SL_ECORRUPT ? SL_ENOTFOUND : err;
    if (u.rank != rank)
        return SL_ENOTFOUND;
    *held = u.data_done;
    return 0;
}

/* ---- multipart uploads that no state names ---- */

typedef struct orphan_ctx {
    s3store *s;
    int64_t before_ms;
    sl_sstore_orphan_fn fn;
    void *arg;
} orphan_ctx;

/* Does the state object at "<dir><job>/.<file>.part" name upload_id? 1 yes, 0 no (none, another
 * upload, unreadable text), -1 if the store could not say (kept: the next sweep decides). */
static int state_names(s3store *s, const char *dir, const char *job, const char *file,
                       const char *upload_id)
{
    char key[SL_S3_KEY_MAX], msg[256];
    ustate u;
    int n = snprintf(key, sizeof(key), "%s%s/.%s.part", dir, job, file);
    int err;

    if (n < 0 || (size_t)n >= sizeof(key))
        return -1;
    err = s3s_state_load(s, key, &u, NULL, 0, msg, sizeof(msg));
    if (err == SL_ENOTFOUND || err == SL_ECORRUPT)
        return 0;
    if (err)
        return -1;
    return strcmp(u.upload_id, upload_id) == 0;
}

static int orphan_one(const char *key, const char *upload_id, int64_t initiated_ms, void *arg)
{
    orphan_ctx *o = arg;
    const char *slash = strchr(key, '/');
    char job[SL_SHARD_NAME_MAX + 1], name[NAME_MAX + 1];
    size_t n = slash ? (size_t)(slash - key) : 0;
    int32_t rank;

    /* Only what this store starts: an upload on "<job>/<shard file>", old enough that a live
     * writer has written its first state long since. */
    if (initiated_ms < 0 || initiated_ms >= o->before_ms || !slash || n == 0 ||
        n > SL_SHARD_NAME_MAX || strchr(slash + 1, '/') ||
        strlen(upload_id) >= SL_SSTORE_UPLOAD_MAX)
        return 0;
    memcpy(job, key, n);
    job[n] = '\0';
    if (sl_shard_name_check(job) != 0 ||
        sl_store_classify(slash + 1, name, sizeof(name), &rank) != SL_STORE_SHARD)
        return 0;
    /* Named by its partial upload (the sweep of that state object decides), or by one in the
     * quarantine (an operator may still complete it): not an orphan. */
    if (state_names(o->s, "", job, slash + 1, upload_id) != 0 ||
        state_names(o->s, "quarantine/", job, slash + 1, upload_id) != 0)
        return 0;
    return o->fn(job, slash + 1, upload_id, initiated_ms, o->arg);
}

int s3s_orphans(sl_sstore *base, int64_t before_ms, sl_sstore_orphan_fn fn, void *arg)
{
    s3store *s = (s3store *)base;
    orphan_ctx o = {s, before_ms, fn, arg};
    char msg[256];
    int err = sl_s3_mpu_list(s->c, "", orphan_one, &o, msg, sizeof(msg));

    if (err == SL_EUNIMPL) {
        sl_log_limited(SL_LOG_INFO, 3600 * 1000, "s3_list_uploads_unsupported",
                       "error=\"%s\" hint=\"multipart uploads left without a state are not "
                       "aborted; a lifecycle rule on the bucket can\"",
                       msg);
        return 0;
    }
    if (err)
        sl_log_warn("s3_list_uploads_failed", "error=\"%s\"", msg);
    return err;
}

int s3s_abort_upload(sl_sstore *base, const char *job, const char *file, const char *upload_id)
{
    s3store *s = (s3store *)base;
    char key[SL_S3_KEY_MAX], msg[256];
    int err;

    if (obj_key(key, sizeof(key), job, file, NULL) != 0)
        return SL_ELIMIT;
    err = sl_s3_mpu_abort(s->c, key, upload_id, msg, sizeof(msg));
    if (err && err != SL_EUNIMPL)
        sl_log_warn("s3_abort_failed", "key=%s error=\"%s\"", key, msg);
    return err;
}
