/* Declarations shared by the S3 client's files (s3.c: requests; s3_req.c: one signed request
 * with its retries; s3_xml.c: the store's XML answers; s3_cfg.c: configuration). Not a contract
 * for anything outside server/store/s3*.c.
 */
#ifndef SL_STORE_S3_INTERNAL_H
#define SL_STORE_S3_INTERNAL_H

#include "store/s3.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdint.h>

#define S3_POOL_MAX     8                  /* idle easy handles kept for reuse */
#define S3_ERRBODY_MAX  (64 * 1024)        /* an error answer's body we read */
#define S3_XMLBODY_MAX  (16 * 1024 * 1024) /* a listing page or another XML answer */
#define S3_HEX_SHA256   65                 /* 64 hex digits + NUL */
#define S3_PUT_RESENDS  3     /* a body the store rejected or stored wrong is sent again so often */
#define S3_LIST_PAGES   10000 /* pages of one listing when list_max_pages is 0 */
#define S3_EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

struct sl_s3 {
    sl_s3_cfg cfg;
    char base[1024];      /* scheme://host[:port] the requests go to (virtual host included) */
    char bpath[80];       /* "/<bucket>" with path-style addressing, "" with virtual hosts */
    char sigv4[128];      /* "aws:amz:<region>:s3" */
    pthread_mutex_t lock; /* the pool and the health counts */
    CURL *idle[S3_POOL_MAX];
    int nidle;
    sl_s3_health health; /* s3_perform counts every request's outcome (sl_s3_health_get) */
};

/* One request. The caller fills the inputs; s3_perform fills the outputs. */
typedef struct s3_req {
    const char *op; /* "PutObject": names the request in messages */
    const char *method;
    const char *key;         /* relative to the configured prefix; NULL: the bucket itself */
    const char *query;       /* canonical (sorted, encoded) query without '?', or NULL */
    const struct iovec *iov; /* the body, or NULL */
    int iovn;
    uint64_t body_len;
    char sha256[S3_HEX_SHA256]; /* of the body (the empty string's when there is none) */
    const char *md5_b64;        /* Content-MD5, or NULL */
    const char *hdr[4];         /* more request headers ("Range: bytes=0-9"), NULL-terminated */
    /* Where a 2xx body goes: dst (at most dst_len bytes, skipping dst_skip first) or out. */
    void *dst;
    size_t dst_len;
    uint64_t dst_skip;
    sl_buf *out;
    int retry_error_body; /* a 200 whose body is an <Error> (Complete, Copy) is retried/mapped */
    /* s3_put_body: sign "UNSIGNED-PAYLOAD" instead of the body's SHA-256 (UploadPart: the part's
     * integrity is its Content-MD5, checked by the store and against the ETag, and the shard's
     * SHA-256 over all parts; a second SHA-256 per part cost 0.58 CPU-s per GiB). */
    int unsigned_payload;
    /* Outputs. */
    long status;
    size_t got; /* bytes written at dst */
    int over;   /* out would have grown past its cap */
    int full;   /* dst was full and the store sent more: the transfer was stopped there */
    char etag[SL_S3_ETAG_MAX];
    char code[64];    /* the S3 error code of a failed answer ("BadDigest"), "" if none */
    int64_t length;   /* Content-Length, -1 if absent */
    int64_t mtime_ms; /* Last-Modified, -1 if absent */
} s3_req;

/* Send req, retrying transient failures until the configured deadline. Returns 0 for a 2xx
 * answer (req's outputs filled), or the SL_E* its failure maps to with msg written. */
int s3_perform(sl_s3 *c, s3_req *req, char *msg, size_t msglen);

/* s3.c's helpers for the requests in s3_mpu.c: a request's defaults (no body: the empty
 * string's SHA-256), the check of a caller's key (SL_EINVAL with msg), and the PUT of a body
 * with Content-MD5 whose answered ETag must be the MD5: a wrong ETag, or a 400 that rejects the
 * body as received (BadDigest, InvalidDigest, IncompleteBody, XAmzContentSHA256Mismatch), sends
 * it again, S3_PUT_RESENDS times at most; then SL_ECORRUPT (ETag) or the store's error. */
void s3_req_init(s3_req *r, const char *op, const char *method, const char *key);
int s3_key_check(sl_s3 *c, const char *op, const char *key, char *msg, size_t msglen);
int s3_put_body(sl_s3 *c, s3_req *r, const struct iovec *iov, int n, char *msg, size_t msglen);

/* Paged listings (ListObjectsV2 in s3.c, ListMultipartUploads in s3_mpu.c): `query` writes a
 * page's canonical query from the listing's markers in ctx (into an empty q of query_cap
 * bytes), each <entry> of the answer's <result> element goes to entry_fn, and while the answer
 * says IsTruncated, `next` moves the markers on (SL_ECORRUPT with msg if they did not move). */
typedef struct s3_pager {
    const char *op, *result, *entry;
    size_t query_cap;
    int (*query)(sl_s3 *c, void *ctx, sl_buf *q);
    int (*entry_fn)(sl_s3 *c, const char *p, const char *end, void *ctx, char *msg, size_t msglen);
    int (*next)(sl_s3 *c, const char *p, const char *end, void *ctx, char *msg, size_t msglen);
} s3_pager;
int s3_list_pages(sl_s3 *c, const s3_pager *pg, void *ctx, char *msg, size_t msglen);
/* A listed key relative to the store's prefix; NULL (msg: op and key) if it is outside it. */
const char *s3_key_rel(sl_s3 *c, const char *op, const char *key, char *msg, size_t msglen);
/* Append "prefix=" and the encoded store prefix, '/' and `prefix` (may be NULL). */
int s3_query_prefix(sl_s3 *c, sl_buf *q, const char *prefix);

/* The SL_E* code for an HTTP status and S3 error code ("" if none). */
int s3_status_err(long status, const char *code);

/* Append the SigV4 URI encoding of s (unreserved bytes kept; '/' kept when keep_slash). */
int s3_uri_encode(sl_buf *b, const char *s, int keep_slash);

/* Lowercase hex SHA-256 and base64 MD5 of the n ranges of iov. Returns 0 or SL_ECORRUPT
 * (OpenSSL failed). sha256 and md5_hex may be NULL (not computed). */
int s3_digests(const struct iovec *iov, int n, char sha256[S3_HEX_SHA256], char md5_b64[32],
               char md5_hex[33]);

/* XML answers. s3_xml_find finds the first element <tag> (attributes allowed) between p and end
 * and returns 1 with its contents in [*vs, *ve) up to its own closing tag (elements of the same
 * name inside it are skipped whole), or 0. s3_xml_text decodes an element's text
 * (the five entities and numeric references) into out; SL_ECORRUPT if it is not text or does
 * not fit. */
int s3_xml_find(const char *p, const char *end, const char *tag, const char **vs, const char **ve);
int s3_xml_text(const char *vs, const char *ve, char *out, size_t outlen);
/* Text of <tag> in [p, end) into out: 0, SL_ENOTFOUND (absent) or SL_ECORRUPT. */
int s3_xml_get(const char *p, const char *end, const char *tag, char *out, size_t outlen);

/* "2026-11-24T01:57:37.123Z" -> ms since the epoch; -1 if it does not parse. */
int64_t s3_iso8601_ms(const char *s);

#endif
