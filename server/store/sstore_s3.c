/* The object-storage backend of the shard store (sstore.h) over the S3 client (s3.h).
 *
 * Objects are "<job>/<file>" under the configured prefix, with the same bytes as the directory
 * backend's files. A shard whose header and data fit in one part is written with one PutObject.
 * A larger one is a multipart upload: part 1 is the header and the first data bytes, parts 2..n
 * the rest; part 1 goes last, once the checksum in its header is known, and
 * CompleteMultipartUpload makes the shard visible whole. While it is written, two more objects
 * keep it resumable, by another process too:
 *   .<name>_shard_<rank>.shard.part   the upload's state: its upload id, the parts stored with
 *                                     their ETags, the data bytes they hold and the SHA-256 state
 *                                     after them (written after each part that extends them);
 *   .<name>_shard_<rank>.shard.head   the data bytes of part 1, stored once they are all here.
 * The state object has the name of a directory's partial file, so the sweeps treat both alike; a
 * removed state object takes its multipart upload (aborted) and head object with it.
 *
 * Parts are sent by a pool of threads of this backend, at most `inflight` at once per upload, so
 * the write lane hands over a part and goes on while it travels.
 */
#include "sstore.h"

#include "layout.h"
#include "s3.h"

#include "err.h"
#include "log.h"
#include "util/buf.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATE_MAX   (4u << 20)   /* largest state object read back (10,000 parts fit) */
#define PARTS_MAX   10000        /* S3's limit */
#define PART_MIN    (5ull << 20) /* S3's smallest part but the last */
#define HEAD_SUFFIX ".head"

typedef struct pjob pjob;

typedef struct s3store {
    sl_sstore base;
    sl_s3 *c;
    uint64_t part_size;
    int inflight;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    pjob *q_head, *q_tail;
    int stop, nthreads;
    pthread_t *threads;
} s3store;

/* One part on its way: sent by a pool thread, reaped by its writer in part order. */
struct pjob {
    pjob *next;  /* the pool's queue */
    pjob *wnext; /* the writer's list, in part order */
    sl_s3 *c;
    const char *key, *upload_id;
    int part_no;
    uint8_t *buf;
    size_t len;
    uint64_t data_end; /* data bytes held once this part is stored */
    uint8_t sha_state[SL_SHA256_STATE_LEN];
    char etag[SL_S3_ETAG_MAX];
    int done, err;
    char msg[256];
};

struct sl_swriter {
    s3store *s;
    char job[SL_SHARD_NAME_MAX + 1], name[SL_SHARD_NAME_MAX + 1];
    int32_t rank;
    uint32_t tensor_count;
    uint64_t data_size;
    char key[SL_S3_KEY_MAX], state_key[SL_S3_KEY_MAX], head_key[SL_S3_KEY_MAX];
    char upload_id[SL_S3_UPLOAD_MAX]; /* "" without a multipart upload */
    uint64_t part_size, head_len;     /* head_len: data bytes in part 1 */
    uint8_t *head;                    /* head_len bytes */
    uint8_t *buf;                     /* the part being filled (parts 2..n) */
    size_t fill;
    int next_part;                 /* the part being filled (1: the head) */
    uint64_t data_pos;             /* data bytes accepted */
    sl_sha256 *run;                /* the hash of the accepted data, for the state object */
    char (*etags)[SL_S3_ETAG_MAX]; /* [PARTS_MAX + 1] by part number */
    int done_upto;                 /* parts 2..done_upto stored */
    uint64_t data_done;            /* data bytes stored (head and parts 2..done_upto) */
    uint8_t done_state[SL_SHA256_STATE_LEN];
    int head_stored, finished;
    pjob *jobs, *jobs_tail;
    int njobs;
    int err;
    char errmsg[256];
};

struct sl_sreader {
    s3store *s;
    char key[SL_S3_KEY_MAX];
};

static int obj_key(char *buf, size_t len, const char *job, const char *file, const char *suffix)
{
    int n = snprintf(buf, len, "%s/%s%s", job, file, suffix ? suffix : "");

    return n < 0 || (size_t)n >= len ? SL_ELIMIT : 0;
}

/* ---- the part pool ---- */

static void *pool_main(void *arg)
{
    s3store *s = arg;

    pthread_mutex_lock(&s->mu);
    for (;;) {
        pjob *j;
        while (!s->stop && !s->q_head)
            pthread_cond_wait(&s->work_cv, &s->mu);
        if (!s->q_head)
            break; /* stopping and nothing queued */
        j = s->q_head;
        s->q_head = j->next;
        if (!s->q_head)
            s->q_tail = NULL;
        pthread_mutex_unlock(&s->mu);
        struct iovec iov = {j->buf, j->len};
        int err = sl_s3_mpu_part(j->c, j->key, j->upload_id, j->part_no, &iov, 1, j->etag, j->msg,
                                 sizeof(j->msg));
        pthread_mutex_lock(&s->mu);
        j->err = err;
        j->done = 1;
        pthread_cond_broadcast(&s->done_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void pool_submit(s3store *s, pjob *j)
{
    pthread_mutex_lock(&s->mu);
    j->next = NULL;
    if (s->q_tail)
        s->q_tail->next = j;
    else
        s->q_head = j;
    s->q_tail = j;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
}

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
static int state_save(sl_swriter *w)
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
    for (int p = 2; p <= w->done_upto && !err; p++)
        err = sl_buf_printf(&b, "part %d %s\n", p, w->etags[p]);
    if (!err)
        err = sl_s3_put(w->s->c, w->state_key, b.p, b.len, w->errmsg, sizeof(w->errmsg));
    sl_buf_free(&b);
    return err;
}

typedef struct ustate {
    char upload_id[SL_S3_UPLOAD_MAX];
    int32_t rank;
    uint64_t data_size, part_size, data_done;
    uint32_t tensor_count;
    uint8_t sha[SL_SHA256_STATE_LEN];
    int last_part;
} ustate;

/* Parse a state object (NUL-terminated text); etags (may be NULL) receives the parts' ETags. */
static int state_parse(char *text, ustate *u, char (*etags)[SL_S3_ETAG_MAX])
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
        } else if (strcmp(line, "part") == 0) {
            char *end;
            long p = strtol(v, &end, 10);
            if (p != u->last_part + 1 || p > PARTS_MAX || *end != ' ' ||
                strlen(end + 1) >= SL_S3_ETAG_MAX)
                return SL_ECORRUPT;
            if (etags)
                snprintf(etags[p], SL_S3_ETAG_MAX, "%s", end + 1);
            u->last_part = (int)p;
        }
    }
    return seen == 3 && u->upload_id[0] && u->part_size >= PART_MIN ? 0 : SL_ECORRUPT;
}

/* Read the state object at key into *u. SL_ENOTFOUND if there is none. */
static int state_load(s3store *s, const char *key, ustate *u, char (*etags)[SL_S3_ETAG_MAX],
                      char *msg, size_t msglen)
{
    sl_buf b;
    int err;

    sl_buf_init(&b, STATE_MAX + 1);
    err = sl_s3_get_all(s->c, key, STATE_MAX, &b, msg, msglen);
    if (!err && (err = sl_buf_add(&b, "", 1)) == 0) /* NUL-terminate */
        err = state_parse(b.p, u, etags);
    if (err == SL_ECORRUPT)
        snprintf(msg, msglen, "the upload state %s does not parse", key);
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
static void state_discard(s3store *s, const char *state_key)
{
    char msg[256], head_key[SL_S3_KEY_MAX], key[SL_S3_KEY_MAX];
    ustate u;

    if (state_load(s, state_key, &u, NULL, msg, sizeof(msg)) == 0 && u.upload_id[0] &&
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

/* ---- writers ---- */

static void w_header(const sl_swriter *w, const char *sha, uint8_t hdr[SL_SHARD_HEADER_SIZE])
{
    sl_shard_header h;

    memset(&h, 0, sizeof(h));
    h.rank = w->rank;
    memcpy(h.sha256, sha, SL_SHARD_HEX_LEN);
    h.tensor_count = (int32_t)w->tensor_count;
    h.data_len = w->data_size;
    sl_shard_header_encode(hdr, &h);
}

/* Reap the parts that are stored, in order; wait while more than `keep` are in flight. Writes
 * the state object when the stored prefix grew. Returns the first failure. */
static int w_reap(sl_swriter *w, int keep)
{
    s3store *s = w->s;
    int grew = 0, err = 0;

    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (w->jobs && w->jobs->done) {
            pjob *j = w->jobs;
            w->jobs = j->wnext;
            if (!w->jobs)
                w->jobs_tail = NULL;
            w->njobs--;
            if (j->err && !w->err) {
                w->err = j->err;
                snprintf(w->errmsg, sizeof(w->errmsg), "part %d: %.200s", j->part_no, j->msg);
            } else if (!j->err) {
                memcpy(w->etags[j->part_no], j->etag, SL_S3_ETAG_MAX);
                w->done_upto = j->part_no;
                w->data_done = j->data_end;
                memcpy(w->done_state, j->sha_state, sizeof(w->done_state));
                grew = 1;
            }
            free(j->buf);
            free(j);
        }
        if (w->njobs <= keep)
            break;
        pthread_cond_wait(&s->done_cv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    if (w->err)
        return w->err;
    if (grew && w->head_stored && (err = state_save(w)) != 0)
        w->err = err;
    return err;
}

/* Hand the filled part buffer to the pool. */
static int w_send_part(sl_swriter *w)
{
    pjob *j = calloc(1, sizeof(*j));

    if (!j)
        return -ENOMEM;
    j->c = w->s->c;
    j->key = w->key;
    j->upload_id = w->upload_id;
    j->part_no = w->next_part++;
    j->buf = w->buf;
    j->len = w->fill;
    j->data_end = w->data_pos;
    sl_sha256_save(w->run, j->sha_state);
    w->buf = NULL;
    w->fill = 0;
    pthread_mutex_lock(&w->s->mu);
    if (w->jobs_tail)
        w->jobs_tail->wnext = j;
    else
        w->jobs = j;
    w->jobs_tail = j;
    w->njobs++;
    pthread_mutex_unlock(&w->s->mu);
    pool_submit(w->s, j);
    return w_reap(w, w->s->inflight);
}

/* The head is complete: store it, so that a resume elsewhere can build part 1. */
static int w_store_head(sl_swriter *w)
{
    int err = sl_s3_put(w->s->c, w->head_key, w->head, w->head_len, w->errmsg, sizeof(w->errmsg));

    if (err)
        return err;
    w->head_stored = 1;
    w->data_done = w->head_len;
    w->done_upto = 1;
    w->next_part = 2;
    sl_sha256_save(w->run, w->done_state);
    return state_save(w);
}

static uint64_t pick_part_size(const s3store *s, uint64_t data_size)
{
    uint64_t p = s->part_size;
    uint64_t need = (data_size + SL_SHARD_HEADER_SIZE + PARTS_MAX - 1) / PARTS_MAX;

    if (p < need)
        p = (need + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
    return p;
}

/* A new upload: any earlier partial upload of the rank goes, and a multipart upload starts when
 * the shard does not fit in one part. */
static int w_start(sl_swriter *w, char *msg, size_t msglen)
{
    int err;

    state_discard(w->s, w->state_key);
    if (w->data_size <= w->head_len)
        return 0;
    err = sl_s3_mpu_create(w->s->c, w->key, w->upload_id, msg, msglen);
    if (!err && (err = state_save(w)) != 0)
        snprintf(msg, msglen, "%s", w->errmsg);
    return err;
}

/* A resume at `from`: the state object must describe this shard and hold exactly `from` bytes. */
static int w_resume(sl_swriter *w, uint64_t from, sl_sha256 *sha, char *msg, size_t msglen)
{
    ustate u;
    int err = state_load(w->s, w->state_key, &u, w->etags, msg, msglen);

    if (err == 0 && (u.rank != w->rank || u.data_size != w->data_size ||
                     u.tensor_count != w->tensor_count || u.data_done != from))
        err = SL_ESTATE;
    if (err) {
        snprintf(msg, msglen,
                 "cannot resume at offset %" PRIu64
                 ": the store holds no matching partial upload (ask UploadStatus)",
                 from);
        return SL_ESTATE;
    }
    w->part_size = u.part_size;
    w->head_len = w->part_size - SL_SHARD_HEADER_SIZE;
    if (w->head_len > w->data_size)
        w->head_len = w->data_size;
    snprintf(w->upload_id, sizeof(w->upload_id), "%s", u.upload_id);
    if ((err = sl_sha256_load(sha, u.sha)) != 0 || (err = sl_sha256_load(w->run, u.sha)) != 0) {
        snprintf(msg, msglen, "the upload state's hash does not load");
        return SL_ESTATE;
    }
    err = sl_s3_get(w->s->c, w->head_key, 0, w->head, w->head_len, msg, msglen);
    if (err == SL_ENOTFOUND || err == SL_ECORRUPT) {
        /* A state without its head (a kill between the two removals that end an upload) can
         * never be resumed: it goes, so that UploadStatus stops offering its bytes. */
        state_discard(w->s, w->state_key);
        snprintf(msg, msglen,
                 "cannot resume at offset %" PRIu64
                 ": the partial upload lost its head object and was discarded (ask UploadStatus)",
                 from);
        return SL_ESTATE;
    }
    if (err)
        return err;
    w->head_stored = 1;
    w->done_upto = u.last_part;
    w->next_part = u.last_part + 1;
    w->data_done = from;
    w->data_pos = from;
    memcpy(w->done_state, u.sha, sizeof(u.sha));
    return 0;
}

static void w_free(sl_swriter *w)
{
    free(w->head);
    free(w->buf);
    free(w->etags);
    sl_sha256_free(w->run);
    free(w);
}

static int s_w_open(sl_sstore *base, const sl_swriter_spec *spec, sl_sha256 *sha, sl_swriter **out,
                    char *msg, size_t msglen)
{
    s3store *s = (s3store *)base;
    sl_swriter *w = calloc(1, sizeof(*w));
    char file[NAME_MAX + 1], part[NAME_MAX + 1];
    int err;

    *out = NULL;
    if (!w)
        return -ENOMEM;
    w->s = s;
    snprintf(w->job, sizeof(w->job), "%s", spec->job);
    snprintf(w->name, sizeof(w->name), "%s", spec->name);
    w->rank = spec->rank;
    w->tensor_count = spec->tensor_count;
    w->data_size = spec->data_size;
    w->part_size = pick_part_size(s, spec->data_size);
    w->head_len = w->part_size - SL_SHARD_HEADER_SIZE;
    if (w->head_len > w->data_size)
        w->head_len = w->data_size;
    w->next_part = 1;
    if (sl_store_file_name(file, sizeof(file), SL_STORE_SHARD, spec->name, spec->rank) != 0 ||
        sl_store_file_name(part, sizeof(part), SL_STORE_PART, spec->name, spec->rank) != 0 ||
        obj_key(w->key, sizeof(w->key), spec->job, file, NULL) != 0 ||
        obj_key(w->state_key, sizeof(w->state_key), spec->job, part, NULL) != 0 ||
        obj_key(w->head_key, sizeof(w->head_key), spec->job, part, HEAD_SUFFIX) != 0) {
        snprintf(msg, msglen, "object key too long");
        w_free(w);
        return SL_EINVAL;
    }
    /* The head is at most one part: memory for it and the etag table is what an upload costs
     * besides its parts in flight. */
    w->head = malloc(w->head_len ? w->head_len : 1);
    w->etags = calloc(PARTS_MAX + 1, sizeof(*w->etags));
    if (!w->head || !w->etags || sl_sha256_new(&w->run) != 0) {
        w_free(w);
        return -ENOMEM;
    }
    *out = w;
    err = spec->resume_from > 0 ? w_resume(w, spec->resume_from, sha, msg, msglen)
                                : w_start(w, msg, msglen);
    return err;
}

static int s_w_write(sl_swriter *w, const struct iovec *iov, int n, uint64_t off, char *msg,
                     size_t msglen)
{
    int err = w->err;

    if (!err && off != w->data_pos) {
        snprintf(msg, msglen, "data at offset %" PRIu64 ", expected %" PRIu64, off, w->data_pos);
        return SL_EINVAL;
    }
    for (int i = 0; i < n && !err; i++) {
        const uint8_t *p = iov[i].iov_base;
        size_t left = iov[i].iov_len;
        while (left && !err) {
            size_t k;
            if (w->data_pos < w->head_len) {
                k = w->head_len - w->data_pos < left ? (size_t)(w->head_len - w->data_pos) : left;
                memcpy(w->head + w->data_pos, p, k);
            } else {
                if (!w->buf && !(w->buf = malloc(w->part_size))) {
                    err = -ENOMEM;
                    break;
                }
                k = w->part_size - w->fill < left ? (size_t)(w->part_size - w->fill) : left;
                memcpy(w->buf + w->fill, p, k);
                w->fill += k;
            }
            /* Hashed piece by piece, so that the state saved at a boundary (the head's end, a
             * part's end) is the hash of exactly the data before it. */
            if ((err = sl_sha256_update(w->run, p, k)) != 0)
                break;
            w->data_pos += k;
            p += k;
            left -= k;
            if (w->data_pos == w->head_len && w->head_len < w->data_size && !w->head_stored)
                err = w_store_head(w);
            else if (w->fill == w->part_size)
                err = w_send_part(w);
        }
    }
    if (err && !w->err)
        w->err = err;
    if (err && !msg[0])
        snprintf(msg, msglen, "%s", w->errmsg[0] ? w->errmsg : sl_strerror(err));
    return err;
}

static int s_w_finish(sl_swriter *w, const char *sha_hex, char *msg, size_t msglen)
{
    uint8_t *part1 = NULL;
    int err = w->err;

    if (!err && w->data_pos != w->data_size) {
        snprintf(msg, msglen, "%" PRIu64 " of %" PRIu64 " data bytes written", w->data_pos,
                 w->data_size);
        return SL_EINVAL;
    }
    if (!err && !(part1 = malloc(SL_SHARD_HEADER_SIZE + w->head_len)))
        err = -ENOMEM;
    if (!err) {
        w_header(w, sha_hex, part1);
        memcpy(part1 + SL_SHARD_HEADER_SIZE, w->head, w->head_len);
    }
    if (!err && !w->upload_id[0]) {
        /* One part: one PutObject. */
        err = sl_s3_put(w->s->c, w->key, part1, SL_SHARD_HEADER_SIZE + w->head_len, msg, msglen);
    } else if (!err) {
        struct iovec iov = {part1, SL_SHARD_HEADER_SIZE + w->head_len};
        if (w->fill)
            err = w_send_part(w);
        if (!err)
            err = w_reap(w, 0);
        if (!err)
            err =
                sl_s3_mpu_part(w->s->c, w->key, w->upload_id, 1, &iov, 1, w->etags[1], msg, msglen);
        if (!err)
            err = sl_s3_mpu_complete(w->s->c, w->key, w->upload_id, w->done_upto,
                                     (const char(*)[SL_S3_ETAG_MAX])(w->etags + 1), msg, msglen);
        if (!err) {
            char m2[256];
            sl_s3_delete(w->s->c, w->head_key, m2, sizeof(m2));
            sl_s3_delete(w->s->c, w->state_key, m2, sizeof(m2));
            w->upload_id[0] = '\0';
        }
    }
    free(part1);
    if (err && !msg[0])
        snprintf(msg, msglen, "%s", w->errmsg[0] ? w->errmsg : sl_strerror(err));
    if (!err)
        w->finished = 1;
    return err;
}

static void s_w_release(sl_swriter *w)
{
    (void)w; /* nothing is reserved in a bucket */
}

static void s_w_close(sl_swriter *w, int discard)
{
    char msg[256];

    if (!w)
        return;
    /* Parts in flight hold the writer's key and upload id: they return first. A stopped upload
     * that stored more parts meanwhile records them, for the resume. */
    w_reap(w, 0);
    if (discard && w->finished) {
        sl_s3_delete(w->s->c, w->key, msg, sizeof(msg));
    } else if (discard) {
        if (w->upload_id[0]) {
            int err = sl_s3_mpu_abort(w->s->c, w->key, w->upload_id, msg, sizeof(msg));
            if (err && err != SL_EUNIMPL)
                sl_log_warn("s3_abort_failed", "key=%s error=\"%s\"", w->key, msg);
        }
        sl_s3_delete(w->s->c, w->head_key, msg, sizeof(msg));
        sl_s3_delete(w->s->c, w->state_key, msg, sizeof(msg));
    }
    w_free(w);
}

static int s_held(sl_sstore *base, const char *job, const char *name, int32_t rank, uint64_t *held)
{
    s3store *s = (s3store *)base;
    char part[NAME_MAX + 1], key[SL_S3_KEY_MAX], msg[256];
    ustate u;
    int err;

    if (sl_store_file_name(part, sizeof(part), SL_STORE_PART, name, rank) != 0 ||
        obj_key(key, sizeof(key), job, part, NULL) != 0)
        return SL_ENOTFOUND;
    err = state_load(s, key, &u, NULL, msg, sizeof(msg));
    if (err)
        return err == SL_ECORRUPT ? SL_ENOTFOUND : err;
    if (u.rank != rank)
        return SL_ENOTFOUND;
    *held = u.data_done;
    return 0;
}

/* ---- readers, small objects ---- */

static int s_r_open(sl_sstore *base, const char *job, const char *file, sl_sreader **out,
                    uint64_t *size, char *msg, size_t msglen)
{
    s3store *s = (s3store *)base;
    sl_sreader *r = calloc(1, sizeof(*r));
    int err;

    *out = NULL;
    if (!r)
        return -ENOMEM;
    r->s = s;
    if (obj_key(r->key, sizeof(r->key), job, file, NULL) != 0) {
        snprintf(msg, msglen, "object key too long");
        free(r);
        return SL_ELIMIT;
    }
    err = sl_s3_head(s->c, r->key, size, NULL, msg, msglen);
    if (err) {
        free(r);
        return err;
    }
    *out = r;
    return 0;
}

static int s_r_read(sl_sreader *r, void *buf, size_t len, uint64_t off, char *msg, size_t msglen)
{
    return len ? sl_s3_get(r->s->c, r->key, off, buf, len, msg, msglen) : 0;
}

static void s_r_close(sl_sreader *r)
{
    free(r);
}

static int s_put(sl_sstore *base, const char *job, const char *file, const void *buf, size_t len,
                 char *msg, size_t msglen)
{
    s3store *s = (s3store *)base;
    char key[SL_S3_KEY_MAX];

    if (obj_key(key, sizeof(key), job, file, NULL) != 0) {
        snprintf(msg, msglen, "object key too long");
        return SL_ELIMIT;
    }
    return sl_s3_put(s->c, key, buf, len, msg, msglen);
}

static int s_stat(sl_sstore *base, const char *job, const char *file, uint64_t *size)
{
    s3store *s = (s3store *)base;
    char key[SL_S3_KEY_MAX], msg[256];

    if (obj_key(key, sizeof(key), job, file, NULL) != 0)
        return SL_ELIMIT;
    return sl_s3_head(s->c, key, size, NULL, msg, sizeof(msg));
}

/* Remove an object; a partial upload's state object takes its upload and head with it. */
static int remove_key(s3store *s, const char *job, const char *file)
{
    char key[SL_S3_KEY_MAX], msg[256], name[NAME_MAX + 1];
    int32_t rank;

    if (obj_key(key, sizeof(key), job, file, NULL) != 0)
        return SL_ELIMIT;
    if (sl_store_classify(file, name, sizeof(name), &rank) == SL_STORE_PART) {
        state_discard(s, key);
        return 0;
    }
    return sl_s3_delete(s->c, key, msg, sizeof(msg));
}

static int s_remove(sl_sstore *base, const char *job, const char *file)
{
    return remove_key((s3store *)base, job, file);
}

typedef struct ckpt_files {
    const char *name;
    char (*files)[NAME_MAX + 1];
    size_t n, cap;
} ckpt_files;

static int collect_ckpt(const char *key, uint64_t size, int64_t mtime_ms, void *arg)
{
    ckpt_files *f = arg;
    const char *file = strchr(key, '/');
    char name[NAME_MAX + 1];
    int32_t rank;
    sl_store_kind kind;

    if (!file || strchr(file + 1, '/'))
        return 0;
    file++;
    kind = sl_store_classify(file, name, sizeof(name), &rank);
    if (kind == SL_STORE_OTHER || kind == SL_STORE_TEMP || strcmp(name, f->name) != 0)
        return 0;
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 64;
        char(*p)[NAME_MAX + 1] = realloc(f->files, cap * sizeof(*p));
        if (!p)
            return -ENOMEM;
        f->files = p;
        f->cap = cap;
    }
    snprintf(f->files[f->n++], NAME_MAX + 1, "%s", file);
    return 0;
}

static int s_remove_ckpt(sl_sstore *base, const char *job, const char *name, int32_t world_size)
{
    s3store *s = (s3store *)base;
    char prefix[SL_S3_KEY_MAX], msg[256];
    ckpt_files f = {name, NULL, 0, 0};
    int err, n = snprintf(prefix, sizeof(prefix), "%s/%s", job, name);

    (void)world_size; /* the listing finds every rank's files */
    if (n < 0 || (size_t)n >= sizeof(prefix))
        return SL_ELIMIT;
    /* One listing of the keys starting with the checkpoint's name, then one request per file. */
    err = sl_s3_list(s->c, prefix, collect_ckpt, &f, msg, sizeof(msg));
    if (!err) {
        /* Partial uploads start with '.': list them too. */
        n = snprintf(prefix, sizeof(prefix), "%s/.%s", job, name);
        if (n > 0 && (size_t)n < sizeof(prefix))
            err = sl_s3_list(s->c, prefix, collect_ckpt, &f, msg, sizeof(msg));
    }
    for (size_t i = 0; i < f.n; i++) {
        int e = remove_key(s, job, f.files[i]);
        if (e && !err)
            err = e;
    }
    free(f.files);
    return err;
}

static int s_free_bytes(sl_sstore *base, uint64_t *out)
{
    (void)base;
    *out = UINT64_MAX;
    return 0;
}

/* ---- sweeps: list, then act ---- */

typedef struct list_ctx {
    sl_sstore_verdict_fn fn;
    void *arg;
} list_ctx;

static int list_one(const char *key, uint64_t size, int64_t mtime_ms, void *arg)
{
    list_ctx *c = arg;
    const char *slash = strchr(key, '/');
    char job[SL_SHARD_NAME_MAX + 1];
    size_t n = slash ? (size_t)(slash - key) : 0;
    size_t k = strlen(key);

    (void)size;
    /* "<job>/<file>" only: the quarantine's keys and anything deeper are not checkpoint files;
     * head objects go with their state object. */
    if (!slash || n == 0 || n > SL_SHARD_NAME_MAX || strchr(slash + 1, '/') ||
        (k > sizeof(HEAD_SUFFIX) - 1 &&
         strcmp(key + k - (sizeof(HEAD_SUFFIX) - 1), HEAD_SUFFIX) == 0))
        return 0;
    memcpy(job, key, n);
    job[n] = '\0';
    if (sl_shard_name_check(job) != 0)
        return 0;
    return c->fn(job, slash + 1, mtime_ms, c->arg);
}

static int s_list(sl_sstore *base, sl_sstore_verdict_fn fn, void *arg)
{
    s3store *s = (s3store *)base;
    list_ctx c = {fn, arg};
    char msg[256];
    int err = sl_s3_list(s->c, "", list_one, &c, msg, sizeof(msg));

    if (err)
        sl_log_warn("s3_list_failed", "error=\"%s\"", msg);
    return err;
}

static int s_act(sl_sstore *base, const char *job, const char *file, int64_t mtime_ms, int action)
{
    s3store *s = (s3store *)base;
    char key[SL_S3_KEY_MAX], to[SL_S3_KEY_MAX], msg[256];
    int64_t now_ms = 0;
    int err;

    if (obj_key(key, sizeof(key), job, file, NULL) != 0)
        return SL_ELIMIT;
    /* Changed since it was listed (a resumed upload wrote its state again): kept. Last-Modified
     * of a HEAD has whole seconds. */
    err = sl_s3_head(s->c, key, NULL, &now_ms, msg, sizeof(msg));
    if (err)
        return err;
    if (now_ms / 1000 != mtime_ms / 1000)
        return SL_ESTATE;
    if (action == SL_SSTORE_QUARANTINE) {
        if (snprintf(to, sizeof(to), "quarantine/%s/%s", job, file) >= (int)sizeof(to))
            return SL_ELIMIT;
        err = sl_s3_copy(s->c, key, to, msg, sizeof(msg));
        if (err) {
            sl_log_warn("s3_quarantine_failed", "key=%s error=\"%s\"", key, msg);
            return err;
        }
        sl_log_warn("quarantined", "key=%s to=%s why=\"checkpoint file the catalog does not know\"",
                    key, to);
        return sl_s3_delete(s->c, key, msg, sizeof(msg));
    }
    return remove_key(s, job, file);
}

static void s_free(sl_sstore *base)
{
    s3store *s = (s3store *)base;

    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->nthreads; i++)
        pthread_join(s->threads[i], NULL);
    free(s->threads);
    pthread_cond_destroy(&s->work_cv);
    pthread_cond_destroy(&s->done_cv);
    pthread_mutex_destroy(&s->mu);
    sl_s3_free(s->c);
    free(s);
}

static const sl_sstore_ops s3_ops = {
    .kind = "s3",
    .remote = 1,
    .w_open = s_w_open,
    .w_write = s_w_write,
    .w_finish = s_w_finish,
    .w_release = s_w_release,
    .w_close = s_w_close,
    .held = s_held,
    .r_open = s_r_open,
    .r_read = s_r_read,
    .r_close = s_r_close,
    .put = s_put,
    .stat = s_stat,
    .remove = s_remove,
    .remove_ckpt = s_remove_ckpt,
    .free_bytes = s_free_bytes,
    .sweep = NULL,
    .list = s_list,
    .act = s_act,
    .free = s_free,
};

int sl_sstore_s3_new(sl_sstore **out, const sl_s3_cfg *cfg, uint64_t part_size, int inflight,
                     char *msg, size_t msglen)
{
    s3store *s = calloc(1, sizeof(*s));
    int err;

    *out = NULL;
    if (!s)
        return -ENOMEM;
    s->base.ops = &s3_ops;
    s->part_size = part_size < PART_MIN ? PART_MIN : part_size;
    s->inflight = inflight < 1 ? 1 : inflight;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    err = sl_s3_new(&s->c, cfg, msg, msglen);
    if (!err)
        err = sl_s3_check(s->c, msg, msglen);
    /* Parts of several uploads travel at once: twice one upload's share. */
    s->nthreads = 2 * s->inflight;
    if (!err && !(s->threads = calloc((size_t)s->nthreads, sizeof(*s->threads))))
        err = -ENOMEM;
    for (int i = 0; !err && i < s->nthreads; i++) {
        if (pthread_create(&s->threads[i], NULL, pool_main, s) != 0) {
            s->nthreads = i;
            err = -EAGAIN;
            snprintf(msg, msglen, "cannot start the part threads");
        }
    }
    if (err) {
        if (!s->threads)
            s->nthreads = 0;
        s_free(&s->base);
        return err;
    }
    *out = &s->base;
    return 0;
}
