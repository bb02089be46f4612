/* The S3 client's requests (s3.h): each one fills an s3_req and hands it to s3_perform
 * (s3_req.c), then reads what the store answered.
 */
#include "store/s3_internal.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define QUERY_MAX 4096

/* Split the endpoint into scheme://host[:port] and check it. */
static int set_base(sl_s3 *c, char *msg, size_t msglen)
{
    const sl_s3_cfg *g = &c->cfg;
    char ep[sizeof(g->endpoint)];
    if (g->endpoint[0])
        snprintf(ep, sizeof(ep), "%s", g->endpoint);
    else
        snprintf(ep, sizeof(ep), "https://s3.%s.amazonaws.com", g->region);
    size_t n = strlen(ep);
    while (n > 0 && ep[n - 1] == '/')
        ep[--n] = '\0';
    const char *host = strstr(ep, "://");
    if (!host || (strncmp(ep, "http://", 7) != 0 && strncmp(ep, "https://", 8) != 0) || !host[3] ||
        strpbrk(host + 3, "/?#@ ")) {
        snprintf(msg, msglen, "bad S3 endpoint \"%.200s\": expected http(s)://host[:port]", ep);
        return SL_EINVAL;
    }
    if (g->path_style) {
        snprintf(c->base, sizeof(c->base), "%s", ep);
        snprintf(c->bpath, sizeof(c->bpath), "/%s", g->bucket);
    } else {
        snprintf(c->base, sizeof(c->base), "%.*s%s.%s", (int)(host + 3 - ep), ep, g->bucket,
                 host + 3);
        c->bpath[0] = '\0';
    }
    return 0;
}

int sl_s3_new(sl_s3 **out, const sl_s3_cfg *cfg, char *msg, size_t msglen)
{
    *out = NULL;
    if (!cfg->bucket[0] || !cfg->access_key[0] || !cfg->secret_key[0]) {
        snprintf(msg, msglen, "S3 store: %s missing", !cfg->bucket[0] ? "bucket" : "credentials");
        return SL_EINVAL;
    }
    sl_s3 *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    pthread_mutex_init(&c->lock, NULL);
    c->cfg = *cfg;
    if (!c->cfg.region[0])
        snprintf(c->cfg.region, sizeof(c->cfg.region), "us-east-1");
    for (const char *p = c->cfg.region; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-')) {
            snprintf(msg, msglen, "bad S3 region \"%.64s\": [a-z0-9-] only", c->cfg.region);
            sl_s3_free(c);
            return SL_EINVAL;
        }
    snprintf(c->sigv4, sizeof(c->sigv4), "aws:amz:%s:s3", c->cfg.region);
    int rc = set_base(c, msg, msglen);
    if (rc != 0) {
        sl_s3_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

void sl_s3_free(sl_s3 *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->nidle; i++)
        curl_easy_cleanup(c->idle[i]);
    pthread_mutex_destroy(&c->lock);
    explicit_bzero(&c->cfg, sizeof(c->cfg));
    free(c);
}

void s3_req_init(s3_req *r, const char *op, const char *method, const char *key)
{
    memset(r, 0, sizeof(*r));
    r->op = op;
    r->method = method;
    r->key = key;
    snprintf(r->sha256, sizeof(r->sha256), "%s", S3_EMPTY_SHA256);
}

/* A key the caller gives: non-empty, bounded (with the prefix), no empty or dot segment. */
int s3_key_check(sl_s3 *c, const char *op, const char *key, char *msg, size_t msglen)
{
    size_t n = key ? strlen(key) : 0;
    if (n == 0 || n + strlen(c->cfg.prefix) + 1 > SL_S3_KEY_MAX || key[0] == '/') {
        snprintf(msg, msglen,
                 "%s: bad key \"%.100s\" (1 to %d bytes with the prefix, no leading "
                 "'/')",
                 op, key ? key : "", SL_S3_KEY_MAX);
        return SL_EINVAL;
    }
    return 0;
}

int sl_s3_check(sl_s3 *c, char *msg, size_t msglen)
{
    s3_req r;
    s3_req_init(&r, "HeadBucket", "HEAD", NULL);
    int rc = s3_perform(c, &r, msg, msglen);
    size_t used = rc == SL_ENOTFOUND ? strlen(msg) : msglen;
    if (used + 1 < msglen)
        snprintf(msg + used, msglen - used, " (no bucket \"%s\" at %s)", c->cfg.bucket,
                 c->cfg.endpoint[0] ? c->cfg.endpoint : "the AWS endpoint");
    return rc;
}

/* The ETag the store answered for a body: the quoted hex MD5? */
static int etag_is_md5(const char *etag, const char *md5_hex)
{
    size_t n = strlen(etag);
    return n == 34 && etag[0] == '"' && etag[33] == '"' && strncasecmp(etag + 1, md5_hex, 32) == 0;
}

/* An answer that rejects the body as received (a digest that does not match what arrived, a
 * body cut short): the bytes were damaged on their way, so sending them again can succeed. */
static int body_rejected(const s3_req *r)
{
    return r->status == 400 &&
           (strcmp(r->code, "BadDigest") == 0 || strcmp(r->code, "InvalidDigest") == 0 ||
            strcmp(r->code, "IncompleteBody") == 0 ||
            strcmp(r->code, "XAmzContentSHA256Mismatch") == 0);
}

/* PUT a body (PutObject or UploadPart), checking the ETag. A wrong ETag, or an answer that
 * rejects the body as received, sends it again, at most S3_PUT_RESENDS times. */
int s3_put_body(sl_s3 *c, s3_req *r, const struct iovec *iov, int n, char *msg, size_t msglen)
{
    char md5_b64[32], md5_hex[33];
    uint64_t len = 0;
    for (int i = 0; i < n; i++)
        len += iov[i].iov_len;
    int rc = s3_digests(iov, n, r->unsigned_payload ? NULL : r->sha256, md5_b64, md5_hex);
    if (rc != 0) {
        snprintf(msg, msglen, "%s %s: hashing the body failed", r->op, r->key);
        return rc;
    }
    if (r->unsigned_payload)
        snprintf(r->sha256, sizeof(r->sha256), "UNSIGNED-PAYLOAD");
    r->iov = iov;
    r->iovn = n;
    r->body_len = len;
    r->md5_b64 = md5_b64;
    r->hdr[0] = "Content-Type: application/octet-stream";
    for (int round = 0; round <= S3_PUT_RESENDS; round++) {
        rc = s3_perform(c, r, msg, msglen);
        if (rc == 0 && etag_is_md5(r->etag, md5_hex))
            return 0;
        if (rc != 0 && !body_rejected(r))
            return rc;
        if (round < S3_PUT_RESENDS)
            sl_log_limited(SL_LOG_WARN, 1000, "s3_body_resent",
                           "op=%s key=%s send=%d failure=\"%s\"", r->op, r->key, round + 1,
                           rc ? r->code : "ETag is not the body's MD5");
    }
    if (rc != 0) {
        size_t used = strlen(msg);
        if (used + 1 < msglen)
            snprintf(msg + used, msglen - used, " (sent %d times)", S3_PUT_RESENDS + 1);
        return rc;
    }
    snprintf(msg, msglen,
             "%s %s: the store answered ETag %.80s for a body whose MD5 is %s "
             "(sent %d times)",
             r->op, r->key, r->etag[0] ? r->etag : "(none)", md5_hex, S3_PUT_RESENDS + 1);
    return SL_ECORRUPT;
}

int sl_s3_put(sl_s3 *c, const char *key, const void *buf, size_t len, char *msg, size_t msglen)
{
    int rc = s3_key_check(c, "PutObject", key, msg, msglen);
    if (rc != 0)
        return rc;
    s3_req r;
    s3_req_init(&r, "PutObject", "PUT", key);
    struct iovec v = {(void *)buf, len};
    return s3_put_body(c, &r, &v, len ? 1 : 0, msg, msglen);
}

int sl_s3_get(sl_s3 *c, const char *key, uint64_t off, void *buf, size_t len, char *msg,
              size_t msglen)
{
    int rc = s3_key_check(c, "GetObject", key, msg, msglen);
    if (rc != 0 || len == 0)
        return rc;
    if (off > UINT64_MAX - len) {
        snprintf(msg, msglen, "GetObject %s: range beyond 2^64", key);
        return SL_EINVAL;
    }
    char range[80];
    snprintf(range, sizeof(range), "Range: bytes=%" PRIu64 "-%" PRIu64, off, off + len - 1);
    s3_req r;
    s3_req_init(&r, "GetObject", "GET", key);
    r.hdr[0] = range;
    r.dst = buf;
    r.dst_len = len;
    r.dst_skip = off;
    rc = s3_perform(c, &r, msg, msglen);
    if (rc == SL_EINVAL && r.status == 416)
        rc = SL_ECORRUPT; /* the object ends before off */
    if (rc == 0 && r.got < len) {
        snprintf(msg, msglen,
                 "GetObject %s: %zu bytes at %" PRIu64 " asked, %zu answered (the "
                 "object is shorter)",
                 key, len, off, r.got);
        rc = SL_ECORRUPT;
    }
    return rc;
}

int sl_s3_get_all(sl_s3 *c, const char *key, size_t max, sl_buf *out, char *msg, size_t msglen)
{
    int rc = s3_key_check(c, "GetObject", key, msg, msglen);
    if (rc != 0)
        return rc;
    size_t cap = out->max, start = out->len;
    if (max < out->max - start)
        out->max = start + max;
    s3_req r;
    s3_req_init(&r, "GetObject", "GET", key);
    r.out = out;
    rc = s3_perform(c, &r, msg, msglen);
    out->max = cap;
    if (rc == SL_ELIMIT)
        snprintf(msg, msglen, "GetObject %s: the object is larger than %zu bytes", key,
                 max < cap - start ? max : cap - start);
    if (rc != 0)
        sl_buf_setlen(out, start);
    return rc;
}

int sl_s3_head(sl_s3 *c, const char *key, uint64_t *size, int64_t *mtime_ms, char *msg,
               size_t msglen)
{
    int rc = s3_key_check(c, "HeadObject", key, msg, msglen);
    if (rc != 0)
        return rc;
    s3_req r;
    s3_req_init(&r, "HeadObject", "HEAD", key);
    rc = s3_perform(c, &r, msg, msglen);
    if (rc == 0 && r.length < 0) {
        snprintf(msg, msglen, "HeadObject %s: the answer has no Content-Length", key);
        rc = SL_ECORRUPT;
    }
    if (rc == 0 && size)
        *size = (uint64_t)r.length;
    if (rc == 0 && mtime_ms)
        *mtime_ms = r.mtime_ms;
    return rc;
}

int sl_s3_delete(sl_s3 *c, const char *key, char *msg, size_t msglen)
{
    int rc = s3_key_check(c, "DeleteObject", key, msg, msglen);
    if (rc != 0)
        return rc;
    s3_req r;
    s3_req_init(&r, "DeleteObject", "DELETE", key);
    rc = s3_perform(c, &r, msg, msglen);
    if (rc == SL_ENOTFOUND && r.status == 404) {
        rc = 0;
        msg[0] = '\0';
    }
    return rc;
}

int sl_s3_copy(sl_s3 *c, const char *from, const char *to, char *msg, size_t msglen)
{
    int rc = s3_key_check(c, "CopyObject", from, msg, msglen);
    if (rc == 0)
        rc = s3_key_check(c, "CopyObject", to, msg, msglen);
    if (rc != 0)
        return rc;
    sl_buf src, body;
    sl_buf_init(&src, 3 * SL_S3_KEY_MAX + 128);
    sl_buf_init(&body, S3_ERRBODY_MAX);
    rc = sl_buf_printf(&src, "x-amz-copy-source: /%s/", c->cfg.bucket);
    if (rc == 0 && c->cfg.prefix[0]) {
        rc = s3_uri_encode(&src, c->cfg.prefix, 1);
        if (rc == 0)
            rc = sl_buf_addstr(&src, "/");
    }
    if (rc == 0)
        rc = s3_uri_encode(&src, from, 1);
    if (rc != 0) {
        snprintf(msg, msglen, "CopyObject %s: %s", from, sl_strerror(rc));
        goto out;
    }
    s3_req r;
    s3_req_init(&r, "CopyObject", "PUT", to);
    r.hdr[0] = sl_buf_str(&src);
    r.out = &body;
    r.retry_error_body = 1;
    rc = s3_perform(c, &r, msg, msglen);
out:
    sl_buf_free(&src);
    sl_buf_free(&body);
    return rc;
}

const char *s3_key_rel(sl_s3 *c, const char *op, const char *key, char *msg, size_t msglen)
{
    size_t pl = strlen(c->cfg.prefix);
    if (!pl)
        return key;
    if (strncmp(key, c->cfg.prefix, pl) != 0 || key[pl] != '/') {
        snprintf(msg, msglen, "%s: key %.200s is outside the prefix %s", op, key, c->cfg.prefix);
        return NULL;
    }
    return key + pl + 1;
}

int s3_query_prefix(sl_s3 *c, sl_buf *q, const char *prefix)
{
    int rc = sl_buf_addstr(q, "prefix=");
    if (rc == 0 && c->cfg.prefix[0]) {
        rc = s3_uri_encode(q, c->cfg.prefix, 0);
        if (rc == 0)
            rc = sl_buf_addstr(q, "%2F");
    }
    if (rc == 0 && prefix)
        rc = s3_uri_encode(q, prefix, 0);
    return rc;
}

int s3_list_pages(sl_s3 *c, const s3_pager *pg, void *ctx, char *msg, size_t msglen)
{
    sl_buf q, body;
    char trunc[16];
    uint32_t max_pages = c->cfg.list_max_pages ? c->cfg.list_max_pages : S3_LIST_PAGES;
    uint32_t pages = 0;
    int rc = 0;
    sl_buf_init(&q, pg->query_cap);
    sl_buf_init(&body, S3_XMLBODY_MAX);
    do {
        s3_req r;
        /* The markers moving on each page (checked by `next`) do not make a listing end: a
         * store may hand out new ones forever. */
        if (pages++ == max_pages) {
            snprintf(msg, msglen,
                     "%s s3://%s: the store still had more after %" PRIu32
                     " pages (the bound, --s3-list-max-pages): listing stopped",
                     pg->op, c->cfg.bucket, max_pages);
            rc = SL_ELIMIT;
            break;
        }
        sl_buf_setlen(&q, 0);
        rc = pg->query(c, ctx, &q);
        if (rc != 0) {
            snprintf(msg, msglen, "%s: %s", pg->op, sl_strerror(rc));
            break;
        }
        s3_req_init(&r, pg->op, "GET", NULL);
        r.query = sl_buf_str(&q);
        r.out = &body;
        sl_buf_setlen(&body, 0);
        rc = s3_perform(c, &r, msg, msglen);
        if (rc != 0)
            break;
        const char *p = body.p ? body.p : "", *end = p + body.len, *vs, *ve;
        if (!s3_xml_find(p, end, pg->result, &vs, &ve)) {
            snprintf(msg, msglen, "%s s3://%s: the answer is not a %s", pg->op, c->cfg.bucket,
                     pg->result);
            rc = SL_ECORRUPT;
            break;
        }
        end = ve;
        for (p = vs; rc == 0 && s3_xml_find(p, end, pg->entry, &vs, &ve); p = ve)
            rc = pg->entry_fn(c, vs, ve, ctx, msg, msglen);
        if (rc != 0)
            break;
        p = body.p;
        end = body.p + body.len;
        if (s3_xml_get(p, end, "IsTruncated", trunc, sizeof(trunc)) != 0 ||
            strcmp(trunc, "true") != 0)
            break;
        rc = pg->next(c, p, end, ctx, msg, msglen);
    } while (rc == 0);
    sl_buf_free(&q);
    sl_buf_free(&body);
    return rc;
}

/* ListObjectsV2: the pages' continuation token, and where each object goes. */
typedef struct {
    const char *prefix;
    sl_s3_list_fn fn;
    void *arg;
    char token[SL_S3_KEY_MAX + 1];
} list_ctx;

/* One Contents entry of a listing. */
static int list_entry(sl_s3 *c, const char *p, const char *end, void *ctx, char *msg, size_t msglen)
{
    list_ctx *l = ctx;
    char key[SL_S3_KEY_MAX + 1], size[32], lm[64];
    if (s3_xml_get(p, end, "Key", key, sizeof(key)) != 0 ||
        s3_xml_get(p, end, "Size", size, sizeof(size)) != 0) {
        snprintf(msg, msglen, "ListObjectsV2 s3://%s: an entry without a readable Key or Size",
                 c->cfg.bucket);
        return SL_ECORRUPT;
    }
    char *e;
    errno = 0;
    unsigned long long sz = strtoull(size, &e, 10);
    if (errno || *e || e == size || size[0] == '-') {
        snprintf(msg, msglen, "ListObjectsV2: key %s has a bad Size \"%s\"", key, size);
        return SL_ECORRUPT;
    }
    int64_t mt = s3_xml_get(p, end, "LastModified", lm, sizeof(lm)) == 0 ? s3_iso8601_ms(lm) : -1;
    const char *rel = s3_key_rel(c, "ListObjectsV2", key, msg, msglen);
    return rel ? l->fn(rel, (uint64_t)sz, mt, l->arg) : SL_ECORRUPT;
}

/* The canonical query of one listing page (parameters sorted by name, values encoded). */
static int list_query(sl_s3 *c, void *ctx, sl_buf *q)
{
    const list_ctx *l = ctx;
    int rc = 0;
    if (l->token[0]) {
        rc = sl_buf_addstr(q, "continuation-token=");
        if (rc == 0)
            rc = s3_uri_encode(q, l->token, 0);
        if (rc == 0)
            rc = sl_buf_addstr(q, "&");
    }
    if (rc == 0)
        rc = sl_buf_addstr(q, "list-type=2&");
    if (rc == 0 && c->cfg.list_max_keys)
        rc = sl_buf_printf(q, "max-keys=%u&", c->cfg.list_max_keys);
    return rc == 0 ? s3_query_prefix(c, q, l->prefix) : rc;
}

/* The next page's continuation token, which must be new. */
static int list_next(sl_s3 *c, const char *p, const char *end, void *ctx, char *msg, size_t msglen)
{
    list_ctx *l = ctx;
    char next[sizeof(l->token)];
    if (s3_xml_get(p, end, "NextContinuationToken", next, sizeof(next)) != 0 || !next[0] ||
        strcmp(next, l->token) == 0) {
        snprintf(msg, msglen,
                 "ListObjectsV2 s3://%s: a truncated page without a new NextContinuationToken",
                 c->cfg.bucket);
        return SL_ECORRUPT;
    }
    memcpy(l->token, next, sizeof(l->token));
    return 0;
}

int sl_s3_list(sl_s3 *c, const char *prefix, sl_s3_list_fn fn, void *arg, char *msg, size_t msglen)
{
    static const s3_pager pager = {
        "ListObjectsV2", "ListBucketResult", "Contents", 3 * SL_S3_KEY_MAX + QUERY_MAX,
        list_query,      list_entry,         list_next};
    list_ctx l = {prefix, fn, arg, ""};
    return s3_list_pages(c, &pager, &l, msg, msglen);
}

static int g_inits;

int sl_s3_global_init(void)
{
    if (g_inits++ == 0 && curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        g_inits = 0;
        return SL_EUNAVAILABLE;
    }
    return 0;
}

void sl_s3_global_cleanup(void)
{
    if (g_inits > 0 && --g_inits == 0)
        curl_global_cleanup();
}
