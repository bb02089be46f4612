/* The S3 client's configuration: the store URL (s3://bucket/prefix) and the credentials, from
 * a file or the environment. Messages name what is wrong, never a secret.
 */
#include "store/s3_internal.h"

#include "err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CRED_FILE_MAX (64 * 1024)

static int bucket_ok(const char *b, size_t n)
{
    if (n < 3 || n > 63)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = b[i];
        int alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
        if (!alnum && ch != '.' && ch != '-')
            return 0;
        if ((i == 0 || i == n - 1) && !alnum)
            return 0;
    }
    return 1;
}

/* A prefix: segments of [A-Za-z0-9._-], separated by single '/', no "." or ".." segment. */
static int prefix_ok(const char *p, size_t n)
{
    size_t seg = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || p[i] == '/') {
            if (seg == 0 || (seg == 1 && p[i - 1] == '.') ||
                (seg == 2 && p[i - 1] == '.' && p[i - 2] == '.'))
                return 0;
            seg = 0;
            continue;
        }
        char ch = p[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            return 0;
        seg++;
    }
    return 1;
}

int sl_s3_cfg_url(sl_s3_cfg *cfg, const char *url, char *msg, size_t msglen)
{
    if (!url || strncmp(url, "s3://", 5) != 0) {
        snprintf(msg, msglen, "store URL must start with s3:// (s3://bucket[/prefix])");
        return SL_EINVAL;
    }
    const char *b = url + 5, *slash = strchr(b, '/');
    size_t bn = slash ? (size_t)(slash - b) : strlen(b);
    if (!bucket_ok(b, bn)) {
        snprintf(msg, msglen,
                 "bad bucket name \"%.*s\" in the store URL: 3 to 63 of [a-z0-9.-], starting and "
                 "ending with a letter or digit",
                 (int)(bn < 80 ? bn : 80), b);
        return SL_EINVAL;
    }
    const char *p = slash ? slash + 1 : "";
    size_t pn = strlen(p);
    while (pn > 0 && p[pn - 1] == '/')
        pn--;
    if (pn >= sizeof(cfg->prefix) || (pn > 0 && !prefix_ok(p, pn))) {
        snprintf(msg, msglen,
                 "bad prefix \"%.*s\" in the store URL: at most %zu bytes of [A-Za-z0-9._-] "
                 "segments separated by single '/', no \".\" or \"..\"",
                 (int)(pn < 200 ? pn : 200), p, sizeof(cfg->prefix) - 1);
        return SL_EINVAL;
    }
    memcpy(cfg->bucket, b, bn);
    cfg->bucket[bn] = '\0';
    memcpy(cfg->prefix, p, pn);
    cfg->prefix[pn] = '\0';
    return 0;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

static int put_secret(char *dst, size_t dstlen, const char *v, const char *what, const char *from,
                      char *msg, size_t msglen)
{
    size_t n = strlen(v);
    if (n == 0 || n >= dstlen) {
        snprintf(msg, msglen, "%s: %s is %s (at most %zu bytes)", from, what,
                 n ? "too long" : "empty", dstlen - 1);
        return SL_EINVAL;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)v[i] <= 0x20 || (unsigned char)v[i] >= 0x7f) {
            snprintf(msg, msglen, "%s: %s holds a character that is not printable ASCII", from,
                     what);
            return SL_EINVAL;
        }
    memcpy(dst, v, n + 1);
    return 0;
}

static int parse_line(sl_s3_cfg *cfg, char *line, int lineno, const char *file, char *msg,
                      size_t msglen)
{
    char *s = trim(line);
    if (!*s || *s == '#' || *s == ';' || *s == '[')
        return 0;
    char *eq = strchr(s, '=');
    if (!eq) {
        snprintf(msg, msglen, "%s:%d: expected \"name = value\"", file, lineno);
        return SL_EINVAL;
    }
    *eq = '\0';
    char *name = trim(s), *v = trim(eq + 1);
    if (strncmp(name, "aws_", 4) == 0) /* the names of ~/.aws/credentials work too */
        name += 4;
    if (strcmp(name, "access_key_id") == 0)
        return put_secret(cfg->access_key, sizeof(cfg->access_key), v, "access_key_id", file, msg,
                          msglen);
    if (strcmp(name, "secret_access_key") == 0)
        return put_secret(cfg->secret_key, sizeof(cfg->secret_key), v, "secret_access_key", file,
                          msg, msglen);
    if (strcmp(name, "session_token") == 0)
        return put_secret(cfg->session_token, sizeof(cfg->session_token), v, "session_token", file,
                          msg, msglen);
    snprintf(msg, msglen,
             "%s:%d: unknown name \"%.64s\" (access_key_id, secret_access_key, "
             "session_token)",
             file, lineno, name);
    return SL_EINVAL;
}

static int read_file(sl_s3_cfg *cfg, const char *file, char *msg, size_t msglen)
{
    char *text = NULL;
    struct stat st;
    int rc = 0, fd = open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 || fstat(fd, &st) != 0) {
        rc = -errno;
        snprintf(msg, msglen, "credentials file %s: %s", file, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode) || st.st_size > CRED_FILE_MAX) {
        rc = SL_EINVAL;
        snprintf(msg, msglen, "credentials file %s: not a regular file of at most %d bytes", file,
                 CRED_FILE_MAX);
        goto out;
    }
    if (st.st_mode & S_IRWXO) {
        rc = SL_EINVAL;
        snprintf(msg, msglen,
                 "credentials file %s is accessible by others (mode %04o): "
                 "chmod o-rwx it",
                 file, (unsigned)(st.st_mode & 07777));
        goto out;
    }
    text = calloc(1, (size_t)st.st_size + 1);
    if (!text) {
        rc = -ENOMEM;
        goto out;
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, text + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = n < 0 ? -errno : SL_EINVAL;
            snprintf(msg, msglen, "credentials file %s: %s", file,
                     n < 0 ? strerror(errno) : "shorter than its size");
            goto out;
        }
        got += (size_t)n;
    }
    int lineno = 1;
    for (char *line = text, *nl; rc == 0 && line; line = nl ? nl + 1 : NULL, lineno++) {
        nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        rc = parse_line(cfg, line, lineno, file, msg, msglen);
    }
    if (rc == 0 && (!cfg->access_key[0] || !cfg->secret_key[0])) {
        rc = SL_EINVAL;
        snprintf(msg, msglen,
                 "credentials file %s: access_key_id and secret_access_key are both "
                 "required",
                 file);
    }
out:
    if (text) {
        explicit_bzero(text, (size_t)st.st_size);
        free(text);
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

int sl_s3_cfg_credentials(sl_s3_cfg *cfg, const char *file, char *msg, size_t msglen)
{
    int rc;
    cfg->access_key[0] = cfg->secret_key[0] = cfg->session_token[0] = '\0';
    if (file && file[0]) {
        rc = read_file(cfg, file, msg, msglen);
    } else {
        const char *ak = getenv("AWS_ACCESS_KEY_ID"), *sk = getenv("AWS_SECRET_ACCESS_KEY");
        const char *tok = getenv("AWS_SESSION_TOKEN");
        if (!ak || !ak[0] || !sk || !sk[0]) {
            snprintf(msg, msglen,
                     "no S3 credentials: set AWS_ACCESS_KEY_ID and "
                     "AWS_SECRET_ACCESS_KEY, or name a credentials file");
            return SL_EINVAL;
        }
        rc = put_secret(cfg->access_key, sizeof(cfg->access_key), ak, "AWS_ACCESS_KEY_ID",
                        "environment", msg, msglen);
        if (rc == 0)
            rc = put_secret(cfg->secret_key, sizeof(cfg->secret_key), sk, "AWS_SECRET_ACCESS_KEY",
                            "environment", msg, msglen);
        if (rc == 0 && tok && tok[0])
            rc = put_secret(cfg->session_token, sizeof(cfg->session_token), tok,
                            "AWS_SESSION_TOKEN", "environment", msg, msglen);
    }
    if (rc != 0) {
        explicit_bzero(cfg->access_key, sizeof(cfg->access_key));
        explicit_bzero(cfg->secret_key, sizeof(cfg->secret_key));
        explicit_bzero(cfg->session_token, sizeof(cfg->session_token));
    }
    return rc;
}
