/* The S3 client's multipart uploads: create, parts (MD5-checked ETags), complete (a 200 that
 * holds an <Error> is an error) and abort.
 */
#include "store/s3_internal.h"

#include "err.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static int upload_id_check(const char *op, const char *key, const char *id, char *msg,
                           size_t msglen)
{
    size_t n = id ? strlen(id) : 0;
    if (n == 0 || n >= SL_S3_UPLOAD_MAX) {
        snprintf(msg, msglen, "%s %s: bad upload id (1 to %d bytes)", op, key,
                 SL_S3_UPLOAD_MAX - 1);
        return SL_EINVAL;
    }
    return 0;
}

/* "partNumber=N&uploadId=ID" or "uploadId=ID", canonical. */
static int mpu_query(sl_buf *q, int part_no, const char *upload_id)
{
    int rc = part_no > 0 ? sl_buf_printf(q, "partNumber=%d&", part_no) : 0;
    if (rc == 0)
        rc = sl_buf_addstr(q, "uploadId=");
    if (rc == 0)
        rc = s3_uri_encode(q, upload_id, 0);
    return rc;
}

int sl_s3_mpu_create(sl_s3 *c, const char *key, char upload_id[SL_S3_UPLOAD_MAX], char *msg,
                     size_t msglen)
{
    int rc = s3_key_check(c, "CreateMultipartUpload", key, msg, msglen);
    if (rc != 0)
        return rc;
    sl_buf body;
    sl_buf_init(&body, S3_ERRBODY_MAX);
    s3_req r;
    s3_req_init(&r, "CreateMultipartUpload", "POST", key);
    r.query = "uploads=";
    r.hdr[0] = "Content-Type: application/octet-stream";
    r.out = &body;
    rc = s3_perform(c, &r, msg, msglen);
    if (rc == 0) {
        const char *p = body.p ? body.p : "";
        rc = s3_xml_get(p, p + body.len, "UploadId", upload_id, SL_S3_UPLOAD_MAX);
        if (rc == 0 && !upload_id[0])
            rc = SL_ECORRUPT;
        if (rc != 0) {
            rc = SL_ECORRUPT;
            snprintf(msg, msglen,
                     "CreateMultipartUpload %s: the answer holds no readable "
                     "UploadId of at most %d bytes",
                     key, SL_S3_UPLOAD_MAX - 1);
        }
    }
    sl_buf_free(&body);
    return rc;
}

int sl_s3_mpu_part(sl_s3 *c, const char *key, const char *upload_id, int part_no,
                   const struct iovec *iov, int n, char etag[SL_S3_ETAG_MAX], char *msg,
                   size_t msglen)
{
    int rc = s3_key_check(c, "UploadPart", key, msg, msglen);
    if (rc == 0)
        rc = upload_id_check("UploadPart", key, upload_id, msg, msglen);
    if (rc != 0)
        return rc;
    if (part_no < 1 || part_no > 10000 || n < 0 || (n > 0 && !iov)) {
        snprintf(msg, msglen, "UploadPart %s: part number %d out of range [1, 10000]", key,
                 part_no);
        return SL_EINVAL;
    }
    sl_buf q;
    sl_buf_init(&q, 4 * SL_S3_UPLOAD_MAX);
    rc = mpu_query(&q, part_no, upload_id);
    if (rc == 0) {
        s3_req r;
        s3_req_init(&r, "UploadPart", "PUT", key);
        r.query = sl_buf_str(&q);
        r.unsigned_payload = 1;
        rc = s3_put_body(c, &r, iov, n, msg, msglen);
        if (rc == 0)
            memcpy(etag, r.etag, SL_S3_ETAG_MAX);
    } else {
        snprintf(msg, msglen, "UploadPart %s: %s", key, sl_strerror(rc));
    }
    sl_buf_free(&q);
    return rc;
}

static int complete_body(sl_buf *b, int nparts, const char (*etags)[SL_S3_ETAG_MAX])
{
    int rc = sl_buf_addstr(b, "<CompleteMultipartUpload>");
    for (int i = 0; rc == 0 && i < nparts; i++) {
        rc = sl_buf_printf(b, "<Part><PartNumber>%d</PartNumber><ETag>", i + 1);
        for (const char *p = etags[i]; rc == 0 && *p; p++)
            rc = *p == '"'   ? sl_buf_addstr(b, "&quot;")
                 : *p == '&' ? sl_buf_addstr(b, "&amp;")
                 : *p == '<' ? sl_buf_addstr(b, "&lt;")
                 : *p == '>' ? sl_buf_addstr(b, "&gt;")
                             : sl_buf_add(b, p, 1);
        if (rc == 0)
            rc = sl_buf_addstr(b, "</ETag></Part>");
    }
    if (rc == 0)
        rc = sl_buf_addstr(b, "</CompleteMultipartUpload>");
    return rc;
}

static int hexval(char ch)
{
    return ch >= '0' && ch <= '9'   ? ch - '0'
           : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
           : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                    : -1;
}

/* The ETag S3 gives an object made of these parts: the MD5 of the parts' binary MD5s, "-N".
 * Returns 0, or SL_EINVAL if a part's ETag is not a quoted MD5. */
static int multipart_etag(int nparts, const char (*etags)[SL_S3_ETAG_MAX], char out[SL_S3_ETAG_MAX])
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned dl = 0;
    int rc = md && EVP_DigestInit_ex(md, EVP_md5(), NULL) == 1 ? 0 : SL_EINVAL;
    for (int i = 0; rc == 0 && i < nparts; i++) {
        unsigned char bin[16];
        const char *e = etags[i];
        if (strlen(e) != 34 || e[0] != '"' || e[33] != '"')
            rc = SL_EINVAL;
        for (int k = 0; rc == 0 && k < 16; k++) {
            int hi = hexval(e[1 + 2 * k]), lo = hexval(e[2 + 2 * k]);
            if (hi < 0 || lo < 0)
                rc = SL_EINVAL;
            bin[k] = (unsigned char)(hi << 4 | lo);
        }
        if (rc == 0 && EVP_DigestUpdate(md, bin, 16) != 1)
            rc = SL_EINVAL;
    }
    if (rc == 0 && (EVP_DigestFinal_ex(md, d, &dl) != 1 || dl != 16))
        rc = SL_EINVAL;
    if (rc == 0) {
        char *o = out;
        *o++ = '"';
        for (unsigned k = 0; k < 16; k++)
            o += sprintf(o, "%02x", d[k]);
        snprintf(o, SL_S3_ETAG_MAX - 33, "-%d\"", nparts);
    }
    EVP_MD_CTX_free(md);
    return rc;
}

/* A Complete that found no upload: an earlier attempt (ours, or curl's own resend on a reused
 * connection) may have completed it with its answer lost. It did if the object is there with the
 * multipart ETag of these parts; otherwise the error stands, saying what was found. */
static int complete_landed(sl_s3 *c, const char *key, int nparts,
                           const char (*etags)[SL_S3_ETAG_MAX], char *msg, size_t msglen)
{
    char want[SL_S3_ETAG_MAX], m[256];
    size_t used = strlen(msg);
    if (multipart_etag(nparts, etags, want) != 0)
        return SL_ENOTFOUND;
    s3_req r;
    s3_req_init(&r, "HeadObject", "HEAD", key);
    if (s3_perform(c, &r, m, sizeof(m)) == 0 && strcasecmp(r.etag, want) == 0) {
        msg[0] = '\0';
        return 0;
    }
    if (used + 1 < msglen)
        snprintf(msg + used, msglen - used,
                 " (the object %s, not with ETag %s: no earlier attempt completed it)",
                 r.status == 200 ? "exists" : "is missing", want);
    return SL_ENOTFOUND;
}

int sl_s3_mpu_complete(sl_s3 *c, const char *key, const char *upload_id, int nparts,
                       const char (*etags)[SL_S3_ETAG_MAX], char *msg, size_t msglen)
{
    int rc = s3_key_check(c, "CompleteMultipartUpload", key, msg, msglen);
    if (rc == 0)
        rc = upload_id_check("CompleteMultipartUpload", key, upload_id, msg, msglen);
    if (rc != 0)
        return rc;
    if (nparts < 1 || nparts > 10000) {
        snprintf(msg, msglen, "CompleteMultipartUpload %s: %d parts, not in [1, 10000]", key,
                 nparts);
        return SL_EINVAL;
    }
    sl_buf q, req_body, body;
    char md5_b64[32];
    sl_buf_init(&q, 4 * SL_S3_UPLOAD_MAX);
    sl_buf_init(&req_body, (size_t)nparts * (SL_S3_ETAG_MAX * 6 + 64) + 128);
    sl_buf_init(&body, S3_XMLBODY_MAX);
    s3_req r;
    s3_req_init(&r, "CompleteMultipartUpload", "POST", key);
    rc = mpu_query(&q, 0, upload_id);
    if (rc == 0)
        rc = complete_body(&req_body, nparts, etags);
    struct iovec v = {req_body.p, req_body.len};
    if (rc == 0)
        rc = s3_digests(&v, 1, r.sha256, md5_b64, NULL);
    if (rc != 0) {
        snprintf(msg, msglen, "CompleteMultipartUpload %s: %s", key, sl_strerror(rc));
        goto out;
    }
    r.query = sl_buf_str(&q);
    r.iov = &v;
    r.iovn = 1;
    r.body_len = req_body.len;
    r.md5_b64 = md5_b64;
    r.hdr[0] = "Content-Type: application/xml";
    r.out = &body;
    r.retry_error_body = 1;
    rc = s3_perform(c, &r, msg, msglen);
    int landed = 0;
    if (rc == SL_ENOTFOUND)
        landed = (rc = complete_landed(c, key, nparts, etags, msg, msglen)) == 0;
    const char *vs, *ve;
    if (rc == 0 && !landed &&
        !s3_xml_find(body.p ? body.p : "", body.p ? body.p + body.len : "",
                     "CompleteMultipartUploadResult", &vs, &ve)) {
        snprintf(msg, msglen,
                 "CompleteMultipartUpload %s: the answer is not a "
                 "CompleteMultipartUploadResult",
                 key);
        rc = SL_ECORRUPT;
    }
out:
    sl_buf_free(&q);
    sl_buf_free(&req_body);
    sl_buf_free(&body);
    return rc;
}

int sl_s3_mpu_abort(sl_s3 *c, const char *key, const char *upload_id, char *msg, size_t msglen)
{
    int rc = s3_key_check(c, "AbortMultipartUpload", key, msg, msglen);
    if (rc == 0)
        rc = upload_id_check("AbortMultipartUpload", key, upload_id, msg, msglen);
    if (rc != 0)
        return rc;
    sl_buf q;
    sl_buf_init(&q, 4 * SL_S3_UPLOAD_MAX);
    rc = mpu_query(&q, 0, upload_id);
    if (rc == 0) {
        s3_req r;
        s3_req_init(&r, "AbortMultipartUpload", "DELETE", key);
        r.query = sl_buf_str(&q);
        rc = s3_perform(c, &r, msg, msglen);
        if (rc == SL_ENOTFOUND) { /* already gone: what an abort wants */
            rc = 0;
            msg[0] = '\0';
        }
    }
    sl_buf_free(&q);
    return rc;
}

/* ListMultipartUploads: the pages' markers, and where each upload goes. */
typedef struct {
    const char *prefix;
    sl_s3_upload_fn fn;
    void *arg;
    char key_marker[SL_S3_KEY_MAX + 1], id_marker[SL_S3_UPLOAD_MAX];
} uploads_ctx;

/* The canonical query of one ListMultipartUploads page (parameters sorted by name). */
static int uploads_query(sl_s3 *c, void *ctx, sl_buf *q)
{
    const uploads_ctx *u = ctx;
    int rc = 0;
    if (u->key_marker[0]) {
        rc = sl_buf_addstr(q, "key-marker=");
        if (rc == 0)
            rc = s3_uri_encode(q, u->key_marker, 0);
        if (rc == 0)
            rc = sl_buf_addstr(q, "&");
    }
    if (rc == 0 && c->cfg.list_max_keys)
        rc = sl_buf_printf(q, "max-uploads=%u&", c->cfg.list_max_keys);
    if (rc == 0)
        rc = s3_query_prefix(c, q, u->prefix);
    if (rc == 0 && u->id_marker[0]) {
        rc = sl_buf_addstr(q, "&upload-id-marker=");
        if (rc == 0)
            rc = s3_uri_encode(q, u->id_marker, 0);
    }
    if (rc == 0)
        rc = sl_buf_addstr(q, "&uploads=");
    return rc;
}

/* One <Upload> of a listing page. */
static int upload_entry(sl_s3 *c, const char *p, const char *end, void *ctx, char *msg,
                        size_t msglen)
{
    uploads_ctx *u = ctx;
    char key[SL_S3_KEY_MAX + 1], id[SL_S3_UPLOAD_MAX], when[64];
    int rk = s3_xml_get(p, end, "Key", key, sizeof(key));
    int ri = s3_xml_get(p, end, "UploadId", id, sizeof(id));
    if (rk == SL_ECORRUPT || ri == SL_ECORRUPT)
        return 0; /* a key or id longer than any of ours: another tool's upload, not ours to abort
                   */
    if (rk != 0 || ri != 0 || !id[0]) {
        snprintf(msg, msglen,
                 "ListMultipartUploads s3://%s: an upload without a readable Key or UploadId",
                 c->cfg.bucket);
        return SL_ECORRUPT;
    }
    int64_t t = s3_xml_get(p, end, "Initiated", when, sizeof(when)) == 0 ? s3_iso8601_ms(when) : -1;
    const char *rel = s3_key_rel(c, "ListMultipartUploads", key, msg, msglen);
    return rel ? u->fn(rel, id, t, u->arg) : SL_ECORRUPT;
}

/* The markers of the next page, which must move on. */
static int uploads_next(sl_s3 *c, const char *p, const char *end, void *ctx, char *msg,
                        size_t msglen)
{
    uploads_ctx *u = ctx;
    char nk[SL_S3_KEY_MAX + 1] = "", ni[SL_S3_UPLOAD_MAX] = "";
    (void)s3_xml_get(p, end, "NextKeyMarker", nk, sizeof(nk));
    (void)s3_xml_get(p, end, "NextUploadIdMarker", ni, sizeof(ni));
    if (!nk[0] || (strcmp(nk, u->key_marker) == 0 && strcmp(ni, u->id_marker) == 0)) {
        snprintf(msg, msglen,
                 "ListMultipartUploads s3://%s: a truncated page without new "
                 "NextKeyMarker/NextUploadIdMarker",
                 c->cfg.bucket);
        return SL_ECORRUPT;
    }
    memcpy(u->key_marker, nk, sizeof(nk));
    memcpy(u->id_marker, ni, sizeof(ni));
    return 0;
}

int sl_s3_mpu_list(sl_s3 *c, const char *prefix, sl_s3_upload_fn fn, void *arg, char *msg,
                   size_t msglen)
{
    static const s3_pager pager = {"ListMultipartUploads",
                                   "ListMultipartUploadsResult",
                                   "Upload",
                                   6 * SL_S3_KEY_MAX + 4 * SL_S3_UPLOAD_MAX,
                                   uploads_query,
                                   upload_entry,
                                   uploads_next};
    uploads_ctx u = {prefix, fn, arg, "", ""};
    return s3_list_pages(c, &pager, &u, msg, msglen);
}
