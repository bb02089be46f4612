/* The S3 client's multipart uploads: create, parts (MD5-checked ETags), complete (a 200 that
 * holds an <Error> is an error) and abort.
 */
#include "store/s3_internal.h"

#include "err.h"

#include <stdio.h>
#include <string.h>

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
    const char *vs, *ve;
    if (rc == 0 && !s3_xml_find(body.p ? body.p : "", body.p ? body.p + body.len : "",
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
