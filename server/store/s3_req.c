/* One S3 request: an easy handle from the client's pool, the URL and headers SigV4 needs, the
 * body sent from the caller's iovecs (from the start again on each attempt), the answer's body
 * and headers read, and the retries of transient failures (5xx, SlowDown, InternalError,
 * connection errors, timeouts) with exponential backoff and full jitter until the deadline.
 */
#include "store/s3_internal.h"

#include "err.h"
#include "log.h"
#include "util/clock.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define BACKOFF_BASE_MS 50
#define BACKOFF_CAP_MS  2000

/* The state of one attempt. */
typedef struct xfer {
    s3_req *r;
    int idx;          /* iovec being sent */
    size_t off;       /* offset in it */
    int status_seen;  /* a status line was read */
    int to_sink;      /* this answer's body goes to dst/out (2xx) */
    uint64_t skip;    /* body bytes to drop before dst (a 200 to a ranged GET) */
    size_t out_start; /* out's length before this attempt */
    sl_buf err;       /* a non-2xx answer's body */
    int err_cut;      /* the error body reached S3_ERRBODY_MAX: the transfer was stopped there */
} xfer;

static CURL *pool_take(sl_s3 *c)
{
    CURL *h = NULL;
    pthread_mutex_lock(&c->lock);
    if (c->nidle > 0)
        h = c->idle[--c->nidle];
    pthread_mutex_unlock(&c->lock);
    return h ? h : curl_easy_init();
}

static void pool_give(sl_s3 *c, CURL *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&c->lock);
    if (c->nidle < S3_POOL_MAX) {
        c->idle[c->nidle++] = h;
        h = NULL;
    }
    pthread_mutex_unlock(&c->lock);
    curl_easy_cleanup(h);
}

static size_t on_read(char *buf, size_t size, size_t nitems, void *arg)
{
    xfer *x = arg;
    size_t room = size * nitems, n = 0;
    while (n < room && x->idx < x->r->iovn) {
        const struct iovec *v = &x->r->iov[x->idx];
        size_t k = v->iov_len - x->off;
        if (k > room - n)
            k = room - n;
        memcpy(buf + n, (const char *)v->iov_base + x->off, k);
        n += k;
        x->off += k;
        if (x->off == v->iov_len) {
            x->idx++;
            x->off = 0;
        }
    }
    return n;
}

/* curl rewinds the body when it must send it again on the same attempt (a redirect, a
 * connection closed before the answer); only a rewind to an offset is asked for. */
static int on_seek(void *arg, curl_off_t offset, int origin)
{
    xfer *x = arg;
    if (origin != SEEK_SET || offset < 0)
        return CURL_SEEKFUNC_CANTSEEK;
    x->idx = 0;
    x->off = 0;
    uint64_t left = (uint64_t)offset;
    while (x->idx < x->r->iovn && left >= x->r->iov[x->idx].iov_len) {
        left -= x->r->iov[x->idx].iov_len;
        x->idx++;
    }
    if (left > 0 && x->idx == x->r->iovn)
        return CURL_SEEKFUNC_FAIL;
    x->off = (size_t)left;
    return CURL_SEEKFUNC_OK;
}

static size_t on_write(char *data, size_t size, size_t nmemb, void *arg)
{
    xfer *x = arg;
    s3_req *r = x->r;
    size_t n = size * nmemb;
    if (!x->to_sink) {
        size_t room = S3_ERRBODY_MAX - x->err.len;
        (void)sl_buf_add(&x->err, data, n < room ? n : room); /* a cut message is still one */
        if (n < room)
            return n;
        /* Nothing past the cap is read: a store sending an endless error body would hold the
         * worker until the attempt's timeout. Stopping here is CURLE_WRITE_ERROR, judged as
         * the answer read so far. */
        x->err_cut = 1;
        return 0;
    }
    if (r->out) {
        if (sl_buf_add(r->out, data, n) != 0) {
            r->over = 1;
            return 0; /* stops the transfer: CURLE_WRITE_ERROR */
        }
        return n;
    }
    const char *p = data;
    size_t left = n;
    if (x->skip > 0) {
        size_t k = x->skip < left ? (size_t)x->skip : left;
        x->skip -= k;
        p += k;
        left -= k;
    }
    if (r->dst && left > 0 && r->got < r->dst_len) {
        size_t k = r->dst_len - r->got < left ? r->dst_len - r->got : left;
        memcpy((char *)r->dst + r->got, p, k);
        r->got += k;
        left -= k;
    }
    if (left > 0 && (!r->dst || r->got == r->dst_len)) {
        /* More than was asked for (a store ignoring the range, or one that never stops): the
         * rest is not read, and what dst holds is the answer. */
        r->full = 1;
        return 0;
    }
    return n;
}

/* Copy a header's value (trimmed) into out; 0 if it does not fit. */
static int hdr_value(const char *v, size_t n, char *out, size_t outlen)
{
    while (n > 0 && (*v == ' ' || *v == '\t')) {
        v++;
        n--;
    }
    while (n > 0 && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
        n--;
    if (n >= outlen)
        return 0;
    memcpy(out, v, n);
    out[n] = '\0';
    return 1;
}

static size_t on_header(char *line, size_t size, size_t nitems, void *arg)
{
    xfer *x = arg;
    s3_req *r = x->r;
    size_t n = size * nitems;
    char v[256];
    if (n > 5 && memcmp(line, "HTTP/", 5) == 0) {
        const char *sp = memchr(line, ' ', n);
        r->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        r->etag[0] = '\0';
        r->length = -1;
        r->mtime_ms = -1;
        x->status_seen = 1;
        x->to_sink = r->status >= 200 && r->status < 300;
        x->skip = r->status == 200 ? r->dst_skip : 0;
        return n;
    }
    const char *colon = memchr(line, ':', n);
    if (!colon)
        return n;
    size_t nl = (size_t)(colon - line), vl = n - nl - 1;
    if (nl == 4 && strncasecmp(line, "etag", 4) == 0) {
        if (!hdr_value(colon + 1, vl, r->etag, sizeof(r->etag)))
            r->etag[0] = '\0';
    } else if (nl == 14 && strncasecmp(line, "content-length", 14) == 0) {
        if (hdr_value(colon + 1, vl, v, sizeof(v))) {
            char *end;
            errno = 0;
            unsigned long long len = strtoull(v, &end, 10);
            if (errno == 0 && *end == '\0' && end != v && len <= INT64_MAX)
                r->length = (int64_t)len;
        }
    } else if (nl == 13 && strncasecmp(line, "last-modified", 13) == 0) {
        if (hdr_value(colon + 1, vl, v, sizeof(v))) {
            time_t t = curl_getdate(v, NULL);
            r->mtime_ms = t == (time_t)-1 ? -1 : (int64_t)t * 1000;
        }
    }
    return n;
}

/* Build the request's URL into u. */
static int build_url(sl_s3 *c, const s3_req *r, sl_buf *u)
{
    int rc = sl_buf_printf(u, "%s%s", c->base, c->bpath);
    if (rc == 0 && r->key) {
        rc = sl_buf_addstr(u, "/");
        if (rc == 0 && c->cfg.prefix[0]) {
            rc = s3_uri_encode(u, c->cfg.prefix, 1);
            if (rc == 0)
                rc = sl_buf_addstr(u, "/");
        }
        if (rc == 0)
            rc = s3_uri_encode(u, r->key, 1);
    } else if (rc == 0 && !c->bpath[0]) {
        rc = sl_buf_addstr(u, "/");
    }
    if (rc == 0 && r->query)
        rc = sl_buf_printf(u, "?%s", r->query);
    return rc;
}

static int add_hdr(struct curl_slist **l, const char *h)
{
    struct curl_slist *n = curl_slist_append(*l, h);
    if (!n)
        return -ENOMEM;
    *l = n;
    return 0;
}

static int build_headers(sl_s3 *c, const s3_req *r, struct curl_slist **l)
{
    char h[128];
    snprintf(h, sizeof(h), "x-amz-content-sha256: %s", r->sha256);
    int rc = add_hdr(l, h);
    if (rc == 0)
        rc = add_hdr(l, "Expect:"); /* no 100-continue round trip */
    if (rc == 0 && r->md5_b64) {
        snprintf(h, sizeof(h), "Content-MD5: %s", r->md5_b64);
        rc = add_hdr(l, h);
    }
    for (int i = 0; rc == 0 && i < 4 && r->hdr[i]; i++)
        rc = add_hdr(l, r->hdr[i]);
    if (rc == 0 && c->cfg.session_token[0]) {
        sl_buf t;
        sl_buf_init(&t, sizeof(c->cfg.session_token) + 32);
        rc = sl_buf_printf(&t, "x-amz-security-token: %s", c->cfg.session_token);
        if (rc == 0)
            rc = add_hdr(l, sl_buf_str(&t));
        if (t.p)
            explicit_bzero(t.p, t.alloc);
        sl_buf_free(&t);
    }
    return rc;
}

static int set_options(sl_s3 *c, CURL *h, s3_req *r, xfer *x, const char *url,
                       struct curl_slist *hdrs, char *errbuf)
{
    const sl_s3_cfg *g = &c->cfg;
    uint64_t tmo_ms = g->request_timeout_ms ? g->request_timeout_ms : 60000;
    long tmo_s = (long)(tmo_ms + 999) / 1000;
    CURLcode e = CURLE_OK;
    /* The whole attempt is bounded, not only its speed: a store dribbling 2 bytes a second
     * passes any low-speed limit. Bodies get 1 ms per KiB on top (a 1 MiB/s floor), so that
     * a 64 MiB part is not held to a bound meant for a HEAD. */
    tmo_ms += (r->body_len + r->dst_len) / 1024;
#define SET(opt, val)                                                                              \
    if (e == CURLE_OK)                                                                             \
    e = curl_easy_setopt(h, opt, val)
    SET(CURLOPT_URL, url);
    SET(CURLOPT_PROTOCOLS_STR, "http,https");
    SET(CURLOPT_NOSIGNAL, 1L);
    SET(CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    SET(CURLOPT_AWS_SIGV4, c->sigv4);
    SET(CURLOPT_USERNAME, g->access_key);
    SET(CURLOPT_PASSWORD, g->secret_key);
    SET(CURLOPT_HTTPHEADER, hdrs);
    SET(CURLOPT_ERRORBUFFER, errbuf);
    SET(CURLOPT_CONNECTTIMEOUT, tmo_s < 10 ? tmo_s : 10L);
    SET(CURLOPT_TIMEOUT_MS, (long)tmo_ms);
    SET(CURLOPT_LOW_SPEED_LIMIT, 1L);
    SET(CURLOPT_LOW_SPEED_TIME, tmo_s);
    SET(CURLOPT_SSL_VERIFYPEER, g->tls_no_verify ? 0L : 1L);
    SET(CURLOPT_SSL_VERIFYHOST, g->tls_no_verify ? 0L : 2L);
    if (g->ca_file[0])
        SET(CURLOPT_CAINFO, g->ca_file);
    SET(CURLOPT_WRITEFUNCTION, on_write);
    SET(CURLOPT_WRITEDATA, x);
    SET(CURLOPT_HEADERFUNCTION, on_header);
    SET(CURLOPT_HEADERDATA, x);
    if (strcmp(r->method, "HEAD") == 0) {
        SET(CURLOPT_NOBODY, 1L);
    } else if (strcmp(r->method, "PUT") == 0) {
        SET(CURLOPT_UPLOAD, 1L);
        SET(CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->body_len);
    } else if (strcmp(r->method, "POST") == 0) {
        SET(CURLOPT_POST, 1L);
        SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
    } else if (strcmp(r->method, "GET") != 0) {
        SET(CURLOPT_CUSTOMREQUEST, r->method);
    }
    if (strcmp(r->method, "PUT") == 0 || strcmp(r->method, "POST") == 0) {
        SET(CURLOPT_READFUNCTION, on_read);
        SET(CURLOPT_READDATA, x);
        SET(CURLOPT_SEEKFUNCTION, on_seek);
        SET(CURLOPT_SEEKDATA, x);
    }
#undef SET
    return e == CURLE_OK ? 0 : SL_EINVAL;
}

/* Where a request points, for messages: s3://bucket/prefix/key. */
static void where(const sl_s3 *c, const s3_req *r, char *out, size_t outlen)
{
    snprintf(out, outlen, "s3://%s%s%s%s%s", c->cfg.bucket, r->key || c->cfg.prefix[0] ? "/" : "",
             c->cfg.prefix, c->cfg.prefix[0] && r->key ? "/" : "", r->key ? r->key : "");
}

/* Printable ASCII only and no double quote or backslash, so a store's answer cannot forge or
 * break a log line. */
static void clean(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e || *s == '\\')
            *s = '?';
        else if (*s == '"')
            *s = '\'';
}

static int retry_code(const char *code)
{
    return strcmp(code, "SlowDown") == 0 || strcmp(code, "InternalError") == 0 ||
           strcmp(code, "RequestTimeout") == 0 || strcmp(code, "ServiceUnavailable") == 0;
}

int s3_status_err(long status, const char *code)
{
    if (strcmp(code, "NoSuchKey") == 0 || strcmp(code, "NoSuchUpload") == 0 ||
        strcmp(code, "NoSuchBucket") == 0 || status == 404)
        return SL_ENOTFOUND;
    if (strcmp(code, "InvalidAccessKeyId") == 0 || strcmp(code, "SignatureDoesNotMatch") == 0 ||
        strcmp(code, "AccessDenied") == 0 || strcmp(code, "ExpiredToken") == 0 ||
        strcmp(code, "InvalidToken") == 0 || status == 401 || status == 403)
        return SL_EAUTH;
    if (strcmp(code, "NotImplemented") == 0 || strcmp(code, "MethodNotAllowed") == 0 ||
        status == 405 || status == 501)
        return SL_EUNIMPL;
    if (retry_code(code) || status >= 500)
        return SL_EUNAVAILABLE;
    return SL_EINVAL;
}

/* What one attempt came to. */
typedef struct outcome {
    int retry;      /* transient: try again */
    int rc;         /* else: 0 or the error */
    char what[400]; /* the failure, for messages */
} outcome;

/* A reason for answers without a body (HEAD). */
static const char *reason(long status)
{
    switch (status) {
    case 400:
        return "Bad Request";
    case 403:
        return "Forbidden (wrong credentials or no permission)";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 501:
        return "Not Implemented";
    case 503:
        return "Service Unavailable";
    default:
        return "";
    }
}

static void judge(xfer *x, CURLcode e, const char *errbuf, outcome *o)
{
    s3_req *r = x->r;
    char code[64] = "", text[256] = "";
    o->retry = 0;
    o->rc = 0;
    o->what[0] = '\0';
    if (e == CURLE_WRITE_ERROR && (r->full || x->err_cut))
        e = CURLE_OK; /* stopped by on_write at the body's bound: judged as answered */
    if (e != CURLE_OK) {
        if (e == CURLE_WRITE_ERROR && r->over) {
            o->rc = SL_ELIMIT;
            snprintf(o->what, sizeof(o->what), "the object is larger than %zu bytes",
                     r->out ? r->out->max : (size_t)0);
            return;
        }
        snprintf(o->what, sizeof(o->what), "%s%s%s", curl_easy_strerror(e), errbuf[0] ? ": " : "",
                 errbuf);
        clean(o->what);
        o->retry = e == CURLE_COULDNT_CONNECT || e == CURLE_OPERATION_TIMEDOUT ||
                   e == CURLE_SEND_ERROR || e == CURLE_RECV_ERROR || e == CURLE_GOT_NOTHING ||
                   e == CURLE_PARTIAL_FILE || e == CURLE_COULDNT_RESOLVE_HOST ||
                   e == CURLE_SSL_CONNECT_ERROR || e == CURLE_HTTP2 || e == CURLE_HTTP2_STREAM;
        o->rc = o->retry                              ? SL_EUNAVAILABLE
                : e == CURLE_PEER_FAILED_VERIFICATION ? SL_EAUTH /* not the store it claims */
                                                      : SL_EINVAL;
        return;
    }
    const char *body = NULL, *end = NULL;
    if (r->status >= 200 && r->status < 300) {
        if (!r->retry_error_body || !r->out)
            return;
        body = r->out->p ? r->out->p + x->out_start : NULL;
        end = body ? r->out->p + r->out->len : NULL;
        const char *vs, *ve;
        if (!body || !s3_xml_find(body, end, "Error", &vs, &ve) ||
            s3_xml_find(body, end, "CompleteMultipartUploadResult", &vs, &ve) ||
            s3_xml_find(body, end, "CopyObjectResult", &vs, &ve))
            return;
    } else {
        body = x->err.p;
        end = body ? body + x->err.len : NULL;
    }
    if (body) {
        (void)s3_xml_get(body, end, "Code", code, sizeof(code));
        (void)s3_xml_get(body, end, "Message", text, sizeof(text));
        clean(code);
        clean(text);
    }
    if (!code[0] && !text[0])
        snprintf(text, sizeof(text), "%s", reason(r->status));
    snprintf(o->what, sizeof(o->what), "HTTP %ld%s%s%s%s", r->status, code[0] ? " " : "", code,
             text[0] ? ": " : "", text);
    snprintf(r->code, sizeof(r->code), "%s", code);
    o->retry = r->status == 500 || r->status == 502 || r->status == 503 || r->status == 504 ||
               retry_code(code);
    o->rc = o->retry ? SL_EUNAVAILABLE : s3_status_err(r->status, code);
}

static int attempt(sl_s3 *c, s3_req *r, xfer *x, outcome *o)
{
    char errbuf[CURL_ERROR_SIZE] = "";
    struct curl_slist *hdrs = NULL;
    sl_buf url;
    sl_buf_init(&url, 8192);
    CURL *h = pool_take(c);
    int rc = h ? 0 : -ENOMEM;
    if (rc == 0)
        rc = build_url(c, r, &url);
    if (rc == 0)
        rc = build_headers(c, r, &hdrs);
    if (rc == 0) {
        curl_easy_reset(h);
        rc = set_options(c, h, r, x, sl_buf_str(&url), hdrs, errbuf);
    }
    if (rc == 0) {
        CURLcode e = curl_easy_perform(h);
        judge(x, e, errbuf, o);
        /* The credentials are not left in an idle handle. */
        curl_easy_setopt(h, CURLOPT_PASSWORD, "");
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
    }
    pool_give(c, h);
    curl_slist_free_all(hdrs);
    sl_buf_free(&url);
    return rc;
}

/* Count a request's outcome for sl_s3_health_get: only a store that did not answer usably
 * (SL_EUNAVAILABLE) is a failure. */
static void count(sl_s3 *c, int rc)
{
    sl_s3_health *h = &c->health;
    pthread_mutex_lock(&c->lock);
    if (rc == SL_EUNAVAILABLE) {
        if (h->failures++ == 0)
            h->failing_since_ms = sl_now_ms();
        h->failed_total++;
    } else {
        h->failures = 0;
        h->failing_since_ms = 0;
        h->last_ok_ms = sl_now_ms();
        h->ok_total++;
    }
    pthread_mutex_unlock(&c->lock);
}

void sl_s3_health_get(sl_s3 *c, sl_s3_health *out)
{
    pthread_mutex_lock(&c->lock);
    *out = c->health;
    pthread_mutex_unlock(&c->lock);
}

static void sleep_ms(uint64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int perform(sl_s3 *c, s3_req *req, char *msg, size_t msglen)
{
    uint64_t t0 = sl_mono_ns();
    uint64_t deadline_ms = c->cfg.retry_deadline_ms ? c->cfg.retry_deadline_ms : 30000;
    unsigned seed = (unsigned)(t0 ^ (uint64_t)(uintptr_t)req);
    size_t out_start = req->out ? req->out->len : 0;
    char at[SL_S3_KEY_MAX + 700];
    outcome o;
    int rc = 0, tries = 0;
    if (msglen > 0)
        msg[0] = '\0';
    where(c, req, at, sizeof(at));
    for (;;) {
        xfer x = {.r = req, .out_start = out_start};
        sl_buf_init(&x.err, S3_ERRBODY_MAX);
        req->status = 0;
        req->got = 0;
        req->over = 0;
        req->full = 0;
        req->etag[0] = '\0';
        req->code[0] = '\0';
        req->length = req->mtime_ms = -1;
        if (req->out)
            sl_buf_setlen(req->out, out_start);
        rc = attempt(c, req, &x, &o);
        sl_buf_free(&x.err);
        tries++;
        if (rc != 0) {
            snprintf(msg, msglen, "%s %s: %s", req->op, at, sl_strerror(rc));
            return rc;
        }
        if (!o.retry)
            break;
        /* Full jitter: a wait drawn from [0, min(2 s, 50 ms * 2^(attempt - 1))]. */
        uint64_t cap = (uint64_t)BACKOFF_BASE_MS << (tries - 1 < 6 ? tries - 1 : 6);
        uint64_t wait =
            (uint64_t)rand_r(&seed) % ((cap < BACKOFF_CAP_MS ? cap : BACKOFF_CAP_MS) + 1);
        uint64_t spent = (sl_mono_ns() - t0) / 1000000;
        if (spent + wait >= deadline_ms) {
            snprintf(msg, msglen,
                     "%s %s: store unavailable, gave up after %d attempts in %" PRIu64
                     " ms (retry deadline %" PRIu64 " ms); last: %s",
                     req->op, at, tries, spent, deadline_ms, o.what);
            return SL_EUNAVAILABLE;
        }
        sl_log_limited(SL_LOG_WARN, 1000, "s3_retry",
                       "op=%s object=\"%s\" attempt=%d wait_ms=%" PRIu64 " failure=\"%s\"", req->op,
                       at, tries, wait, o.what);
        sleep_ms(wait);
    }
    if (o.rc != 0)
        snprintf(msg, msglen, "%s %s: %s", req->op, at, o.what);
    return o.rc;
}

int s3_perform(sl_s3 *c, s3_req *req, char *msg, size_t msglen)
{
    int rc = perform(c, req, msg, msglen);
    count(c, rc);
    return rc;
}
