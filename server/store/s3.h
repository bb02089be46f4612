/* A small S3 client over libcurl: the requests the shard store needs, signed with SigV4
 * (CURLOPT_AWS_SIGV4; x-amz-content-sha256 set by this code, since curl 7.88 does not: the
 * body's SHA-256, or UNSIGNED-PAYLOAD for UploadPart, whose Content-MD5 guards it), retried
 * with exponential backoff and full jitter on 500/503 (SlowDown, InternalError) and connection
 * errors until a deadline, then SL_EUNAVAILABLE.
 *
 * Blocking: every request runs on the calling thread (the daemon calls these from libuv's worker
 * pool, never from the loop). An sl_s3 is thread-safe: any number of threads may call it at once
 * (each request takes an easy handle from a small pool; connections are reused).
 *
 * Keys are relative to the configured prefix: the client prepends "<prefix>/" to every key and
 * strips it from listed keys. Keys are made of [A-Za-z0-9._/-] by the caller; they are still
 * URI-encoded here as SigV4 requires.
 *
 * Errors: every function returns 0 or a negative SL_E* (err.h) and, where it takes msg/msglen,
 * writes one line naming the request, the key and the store's answer (HTTP status, S3 error
 * code and message) into msg: SL_ENOTFOUND (404 NoSuchKey, NoSuchUpload, NoSuchBucket),
 * SL_EAUTH (403 InvalidAccessKeyId, SignatureDoesNotMatch, AccessDenied), SL_EINVAL (other 4xx),
 * SL_EUNIMPL (the store does not implement the request: 501, or 405 MethodNotAllowed),
 * SL_ECORRUPT (the store answered something that does not match what was sent or asked: an ETag
 * that is not the part's MD5, a short range, XML that does not parse), SL_EUNAVAILABLE (retries
 * exhausted: 5xx, resets, timeouts: an attempt never lasts longer than request_timeout_ms),
 * SL_ELIMIT (a listing longer than list_max_pages pages, an answer larger than its bound),
 * -ENOMEM.
 *
 * Bodies are bounded: an error answer is read up to 64 KiB and the transfer then stopped, a
 * listing page or another XML answer up to 16 MiB (SL_ELIMIT beyond), a ranged GET no further
 * than the bytes asked for. Credentials never appear in messages or logs.
 */
#ifndef SL_STORE_S3_H
#define SL_STORE_S3_H

#include "util/buf.h"

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define SL_S3_KEY_MAX    1024
#define SL_S3_ETAG_MAX   80  /* a quoted ETag as the store returns it */
#define SL_S3_UPLOAD_MAX 512 /* a multipart upload id */

typedef struct sl_s3_cfg {
    char bucket[64];
    char prefix[512];       /* no leading or trailing '/'; may be empty */
    char endpoint[512];     /* "http(s)://host[:port]"; empty: https://s3.<region>.amazonaws.com */
    char region[64];        /* default "us-east-1" */
    int path_style;         /* 1: <endpoint>/<bucket>/<key>; 0: <bucket>.<endpoint host>/<key> */
    int tls_no_verify;      /* 1: do not verify the store's certificate (tests only) */
    char ca_file[PATH_MAX]; /* extra CA bundle; empty: the system's */
    char access_key[256];   /* never logged */
    char secret_key[256];   /* never logged */
    char session_token[4096];   /* optional; never logged */
    uint32_t retry_deadline_ms; /* retry a request this long; 0 means 30000 */
    /* One attempt's whole time, connection, request and answer (CURLOPT_TIMEOUT_MS), plus 1 ms
     * per KiB of the body sent or of the range asked for (a 1 MiB/s floor, so that big parts
     * are not cut by a bound meant for small requests); 0: 60000. A store that answers 2 bytes
     * a second stays under any low-speed limit: only a total bound ends it. A request as a
     * whole (its retries) ends within retry_deadline_ms plus one attempt. */
    uint32_t request_timeout_ms;
    uint32_t list_max_keys; /* keys (uploads) per ListObjectsV2 (ListMultipartUploads) page; 0: the
                               store's (1000) */
    /* Pages one listing may take; one more is SL_ELIMIT (a store that paginates forever, with
     * a new marker each time, would otherwise hold a worker for good). 0: 10000. */
    uint32_t list_max_pages;
} sl_s3_cfg;

/* Parse "s3://bucket[/prefix]" into cfg->bucket and cfg->prefix (other fields untouched).
 * Returns 0 or SL_EINVAL with msg naming the bad part (bucket names: 3..63 of [a-z0-9.-]). */
int sl_s3_cfg_url(sl_s3_cfg *cfg, const char *url, char *msg, size_t msglen);

/* Credentials: from `file` when not NULL/empty (lines "access_key_id = ...",
 * "secret_access_key = ...", optional "session_token = ..."; '#' comments; the file must not be
 * readable by others: refused otherwise), else from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
 * optional AWS_SESSION_TOKEN. Returns 0 or SL_EINVAL/-errno with msg (never the secret). */
int sl_s3_cfg_credentials(sl_s3_cfg *cfg, const char *file, char *msg, size_t msglen);

typedef struct sl_s3 sl_s3;

/* libcurl's global state: init once per process before the first client is made (and before
 * threads that use it start), cleanup after the last client is freed. Counted: every init needs
 * one cleanup; a cleanup without an init does nothing. Not thread-safe. Returns 0 or
 * SL_EUNAVAILABLE. */
int sl_s3_global_init(void);
void sl_s3_global_cleanup(void);

/* Make a client (sl_s3_global_init is the caller's, once, before threads start). cfg is copied.
 * Returns 0 and *out, SL_EINVAL (msg) or -ENOMEM. */
int sl_s3_new(sl_s3 **out, const sl_s3_cfg *cfg, char *msg, size_t msglen);
void sl_s3_free(sl_s3 *c); /* accepts NULL */

/* HEAD the bucket (and, with a prefix, nothing else): a wrong endpoint, a missing bucket or bad
 * credentials are a clear error at start. */
int sl_s3_check(sl_s3 *c, char *msg, size_t msglen);

/* How the store has answered lately, for health: counted by every request when it ends. A
 * request fails here when the store did not answer usably within its retry deadline
 * (SL_EUNAVAILABLE: timeouts, resets, 5xx); any answer of the store (a 404 included) is a
 * success and ends the run of failures. */
typedef struct sl_s3_health {
    uint64_t failures;        /* failed requests in a row since the last success */
    int64_t failing_since_ms; /* wall clock of the first of them; 0 when failures == 0 */
    int64_t last_ok_ms;       /* wall clock of the last success; 0: none yet */
    uint64_t ok_total, failed_total;
} sl_s3_health;

/* A snapshot of the counts above. Thread-safe. */
void sl_s3_health_get(sl_s3 *c, sl_s3_health *out);

/* PutObject of len bytes (Content-MD5 and the payload's SHA-256 sent; the returned ETag checked
 * against the MD5, and the body sent again as by sl_s3_mpu_part). Atomic: readers see the old
 * object or the new one. */
int sl_s3_put(sl_s3 *c, const char *key, const void *buf, size_t len, char *msg, size_t msglen);

/* Ranged GET of exactly len bytes at off into buf (SL_ECORRUPT if the object is shorter). */
int sl_s3_get(sl_s3 *c, const char *key, uint64_t off, void *buf, size_t len, char *msg,
              size_t msglen);

/* GET a whole small object into out (appended; SL_ELIMIT beyond max bytes). */
int sl_s3_get_all(sl_s3 *c, const char *key, size_t max, sl_buf *out, char *msg, size_t msglen);

/* HEAD an object: its size and Last-Modified (ms since the epoch). Either pointer may be NULL. */
int sl_s3_head(sl_s3 *c, const char *key, uint64_t *size, int64_t *mtime_ms, char *msg,
               size_t msglen);

/* DeleteObject; a missing object is not an error. */
int sl_s3_delete(sl_s3 *c, const char *key, char *msg, size_t msglen);

/* CopyObject within the bucket (from and to relative to the prefix). */
int sl_s3_copy(sl_s3 *c, const char *from, const char *to, char *msg, size_t msglen);

/* ListObjectsV2 of every key under `prefix` (relative, e.g. "job/"), all pages; fn gets each key
 * (relative to the configured prefix), its size and Last-Modified; a non-zero return stops the
 * listing and is returned. */
typedef int (*sl_s3_list_fn)(const char *key, uint64_t size, int64_t mtime_ms, void *arg);
int sl_s3_list(sl_s3 *c, const char *prefix, sl_s3_list_fn fn, void *arg, char *msg, size_t msglen);

/* Multipart uploads. */
int sl_s3_mpu_create(sl_s3 *c, const char *key, char upload_id[SL_S3_UPLOAD_MAX], char *msg,
                     size_t msglen);
/* UploadPart number part_no (1..10000) of the n ranges of iov, in order. Signed
 * UNSIGNED-PAYLOAD (no SHA-256 of the part: the caller hashes the shard's data, and the part's
 * integrity is its Content-MD5, which the store checks); the ETag returned must be the MD5. A
 * wrong ETag, or a 400 rejecting the body as received (BadDigest, InvalidDigest, IncompleteBody),
 * sends the part again, 3 times at most; then SL_ECORRUPT (ETag) or the store's error
 * (SL_EINVAL). etag receives the quoted ETag for Complete. */
int sl_s3_mpu_part(sl_s3 *c, const char *key, const char *upload_id, int part_no,
                   const struct iovec *iov, int n, char etag[SL_S3_ETAG_MAX], char *msg,
                   size_t msglen);
/* CompleteMultipartUpload of parts 1..nparts with their ETags, in order. A 200 whose body holds
 * an <Error> is an error (S3 may answer so after a long complete). */
int sl_s3_mpu_complete(sl_s3 *c, const char *key, const char *upload_id, int nparts,
                       const char (*etags)[SL_S3_ETAG_MAX], char *msg, size_t msglen);
/* AbortMultipartUpload: the parts stored are freed. A missing upload is not an error;
 * SL_EUNIMPL where the store does not implement it (s3rver 3.7). */
int sl_s3_mpu_abort(sl_s3 *c, const char *key, const char *upload_id, char *msg, size_t msglen);

/* ListMultipartUploads of the uploads in progress on keys under `prefix` (relative, "" for all
 * under the configured prefix), all pages (list_max_keys uploads per page when set): fn gets
 * each upload's key (relative to the configured prefix), its upload id and when it was
 * initiated (ms since the epoch; -1 if the store did not say); a non-zero return stops the
 * listing and is returned. SL_EUNIMPL where the store does not implement it (s3rver 3.7). */
typedef int (*sl_s3_upload_fn)(const char *key, const char *upload_id, int64_t initiated_ms,
                               void *arg);
int sl_s3_mpu_list(sl_s3 *c, const char *prefix, sl_s3_upload_fn fn, void *arg, char *msg,
                   size_t msglen);

#endif
