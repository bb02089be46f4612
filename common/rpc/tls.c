/* TLS credentials from PEM files, for the server and the client. */
#include "internal.h"

#include "../err.h"
#include "../log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Certificates and keys are small; anything larger is not a PEM file we want. */
#define PEM_MAX (1 << 20)

/* Read a PEM file into a NUL-terminated heap string (caller frees). */
static int read_pem(char **out, const char *path, const char *what)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f;
    int err = 0;

    *out = NULL;
    if (!path || !*path) {
        sl_log_error("tls_config", "what=%s error=\"no file given\"", what);
        return SL_EINVAL;
    }
    f = fopen(path, "rb");
    if (!f) {
        err = -errno;
        sl_log_error("tls_config", "what=%s path=%s error=\"%s\"", what, path, sl_strerror(err));
        return err;
    }
    buf = malloc(PEM_MAX + 1);
    if (!buf) {
        err = -ENOMEM;
        goto out;
    }
    n = fread(buf, 1, PEM_MAX + 1, f);
    if (ferror(f)) {
        err = -EIO;
    } else if (n > PEM_MAX) {
        err = SL_ELIMIT;
    } else {
        buf[n] = '\0';
        if (!strstr(buf, "-----BEGIN "))
            err = SL_EINVAL;
    }
    if (err)
        sl_log_error("tls_config", "what=%s path=%s error=\"%s\"", what, path,
                     err == SL_EINVAL ? "not a PEM file" : sl_strerror(err));
out:
    fclose(f);
    if (err) {
        free(buf);
        return err;
    }
    *out = buf;
    return 0;
}

/* The PEM files of a TLS configuration, read into memory. */
typedef struct pems {
    char *cert, *key, *ca;
} pems;

static void pems_free(pems *p)
{
    free(p->cert);
    free(p->key);
    free(p->ca);
}

/* Read tls's files: the certificate and key if `pair` (they go together), the CA file if set
 * (logged as `ca_what`). Returns 0 or the error of read_pem; the caller frees with pems_free. */
static int pems_read(pems *p, const sl_rpc_tls *tls, int pair, const char *ca_what)
{
    int err = 0;

    memset(p, 0, sizeof(*p));
    if (pair && ((err = read_pem(&p->cert, tls->cert_file, "tls_cert")) != 0 ||
                 (err = read_pem(&p->key, tls->key_file, "tls_key")) != 0))
        return err;
    if (tls->ca_file && *tls->ca_file)
        err = read_pem(&p->ca, tls->ca_file, ca_what);
    return err;
}

int sl_rpc_server_creds(grpc_server_credentials **out, const sl_rpc_tls *tls)
{
    grpc_ssl_pem_key_cert_pair pair;
    pems p;
    int err;

    *out = NULL;
    if (!tls) {
        *out = grpc_insecure_server_credentials_create();
        return 0;
    }
    err = pems_read(&p, tls, 1, "tls_client_ca");
    if (!err) {
        pair.private_key = p.key;
        pair.cert_chain = p.cert;
        *out = grpc_ssl_server_credentials_create_ex(
            p.ca, &pair, 1,
            p.ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                 : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
        if (!*out)
            err = SL_EINVAL;
    }
    pems_free(&p);
    return err;
}

int sl_rpc_channel_creds(grpc_channel_credentials **out, const sl_rpc_tls *tls)
{
    grpc_ssl_pem_key_cert_pair pair;
    int have_pair = tls && tls->cert_file && *tls->cert_file;
    pems p;
    int err;

    *out = NULL;
    if (!tls) {
        *out = grpc_insecure_credentials_create();
        return 0;
    }
    err = pems_read(&p, tls, have_pair, "tls_ca");
    if (!err) {
        pair.private_key = p.key;
        pair.cert_chain = p.cert;
        *out = grpc_ssl_credentials_create(p.ca, have_pair ? &pair : NULL, NULL, NULL);
        if (!*out)
            err = SL_EINVAL;
    }
    pems_free(&p);
    return err;
}
