/* What the S3 client computes for SigV4 and integrity beside curl's signature: the URI
 * encoding of keys and query values, and a body's SHA-256 (x-amz-content-sha256) and MD5
 * (Content-MD5, and the ETag the store must answer).
 */
#include "store/s3_internal.h"

#include "err.h"

#include <errno.h>
#include <openssl/evp.h>
#include <string.h>

int s3_uri_encode(sl_buf *b, const char *s, int keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";
    int rc = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && rc == 0; p++) {
        unsigned char ch = *p;
        int plain = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
                    (ch >= '0' && ch <= '9') || ch == '-' || ch == '.' || ch == '_' || ch == '~' ||
                    (keep_slash && ch == '/');
        if (plain) {
            rc = sl_buf_add(b, p, 1);
        } else {
            char e[3] = {'%', hex[ch >> 4], hex[ch & 15]};
            rc = sl_buf_add(b, e, 3);
        }
    }
    return rc;
}

static void to_hex(const unsigned char *d, unsigned n, char *out)
{
    static const char hex[] = "0123456789abcdef";
    for (unsigned i = 0; i < n; i++) {
        out[2 * i] = hex[d[i] >> 4];
        out[2 * i + 1] = hex[d[i] & 15];
    }
    out[2 * n] = '\0';
}

int s3_digests(const struct iovec *iov, int n, char sha256[S3_HEX_SHA256], char md5_b64[32],
               char md5_hex[33])
{
    int rc = SL_ECORRUPT;
    EVP_MD_CTX *sh = EVP_MD_CTX_new(), *md = EVP_MD_CTX_new();
    unsigned char ds[EVP_MAX_MD_SIZE], dm[EVP_MAX_MD_SIZE];
    unsigned ls = 0, lm = 0;
    if (!sh || !md) {
        rc = -ENOMEM;
        goto out;
    }
    if ((sha256 && EVP_DigestInit_ex(sh, EVP_sha256(), NULL) != 1) ||
        EVP_DigestInit_ex(md, EVP_md5(), NULL) != 1)
        goto out;
    for (int i = 0; i < n; i++)
        if ((sha256 && EVP_DigestUpdate(sh, iov[i].iov_base, iov[i].iov_len) != 1) ||
            EVP_DigestUpdate(md, iov[i].iov_base, iov[i].iov_len) != 1)
            goto out;
    if ((sha256 && (EVP_DigestFinal_ex(sh, ds, &ls) != 1 || ls != 32)) ||
        EVP_DigestFinal_ex(md, dm, &lm) != 1 || lm != 16)
        goto out;
    if (sha256)
        to_hex(ds, ls, sha256);
    if (md5_hex)
        to_hex(dm, lm, md5_hex);
    EVP_EncodeBlock((unsigned char *)md5_b64, dm, (int)lm); /* 24 characters + NUL */
    rc = 0;
out:
    EVP_MD_CTX_free(sh);
    EVP_MD_CTX_free(md);
    return rc;
}
