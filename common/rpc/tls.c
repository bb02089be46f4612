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

int sl_rpc_server_creds(grpc_server_credentials **out, const sl_rpc_tls *tls)
{
    grpc_ssl_pem_key_cert_pair pair;
    char *cert = NULL, *key = NULL, *ca = NULL;
    int err;

    *out = NULL;
    if (!tls) {
        *out = grpc_insecure_server_credentials_create();
        return 0;
    }
    if ((err = read_pem(&cert, tls->cert_file, "tls_cert")) != 0 ||
        (err = read_pem(&key, tls->key_file, "tls_key")) != 0)
        goto out;
    if (tls->ca_file && *tls->ca_file && (err = read_pem(&ca, tls->ca_file, "tls_client_ca")) != 0)
        goto out;
    pair.private_key = key;
    pair.cert_chain = cert;
    *out = grpc_ssl_server_credentials_create_ex(
        ca, &pair, 1,
        ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
           : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
    if (!*out)
        err = SL_EINVAL;
out:
    free(cert);
    free(key);
    free(ca);
    return err;
}

int sl_rpc_channel_creds(grpc_channel_credentials **out, const sl_rpc_tls *tls)
{
    grpc_ssl_pem_key_cert_pair pair;
    char *cert = NULL, *key = NULL, *ca = NULL;
    int have_pair = tls && tls->cert_file && *tls->cert_file;
    int err = 0;

    *out = NULL;
    if (!tls) {
        *out = grpc_insecure_credentials_create();
        return 0;
    }
    if (tls->ca_file && *tls->ca_file && (err = read_pem(&ca, tls->ca_file, "tls_ca")) != 0)
        goto out;
    if (have_pair && ((err = read_pem(&cert, tls->cert_file, "tls_cert")) != 0 ||
                      (err = read_pem(&key, tls->key_file, "tls_key")) != 0))
        goto out;
    pair.private_key = key;
    pair.cert_chain = cert;
    *out = grpc_ssl_credentials_create(ca, have_pair ? &pair : NULL, NULL, NULL);
    if (!*out)
        err = SL_EINVAL;
out:
    free(cert);
    free(key);
    free(ca);
    return err;
}
