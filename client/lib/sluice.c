#include "sluice.h"

#include "internal.h"

#include "err.h"
#include "rpc/client.h"
#include "grpc/health/v1/health.pb-c.h"
#include "sluice/v1/admin.pb-c.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sl_opts_check(unsigned int version, unsigned int known, const char *type)
{
    if (version <= known)
        return 0;
    return sl_client_set_error(SL_EINVAL, "%s version %u is unknown: this libsluice reads up to %u",
                               type, version, known);
}

/* One channel per address of c->addr, with the options of `opts`. Returns 0 or the error. */
static int open_channels(sl_client *c, const sl_client_opts *opts)
{
    sl_rpc_tls tls = {NULL, NULL, NULL};
    sl_rpc_client_opts ro;
    int err = 0;

    memset(&ro, 0, sizeof(ro));
    if (opts->tls || opts->tls_ca || opts->tls_cert) {
        tls.ca_file = opts->tls_ca;
        tls.cert_file = opts->tls_cert;
        tls.key_file = opts->tls_key;
        ro.tls = &tls;
    }
    ro.token = opts->token;
    ro.own_connection = opts->own_connection;
    c->rpc = calloc(c->n, sizeof(*c->rpc));
    if (!c->rpc)
        return -ENOMEM;
    for (size_t i = 0; !err && i < c->n; i++)
        err = sl_rpc_client_new(&c->rpc[i], c->addr[i], &ro);
    return err;
}

int sl_client_connect(sl_client **out, const char *addr, const sl_client_opts *opts)
{
    static const sl_client_opts defaults = SL_CLIENT_OPTS_INIT;
    sl_client *c;
    int err;

    *out = NULL;
    if (!opts)
        opts = &defaults;
    err = sl_opts_check(opts->version, SL_CLIENT_OPTS_VERSION, "sl_client_opts");
    if (err)
        return err;
    if (!addr || !*addr)
        return SL_EINVAL;
    c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->timeout_ms = opts->timeout_ms ? opts->timeout_ms : 10000;
    err = sl_client_addrs_parse(&c->addr, &c->n, addr);
    if (!err)
        atomic_store(&c->cur, sl_client_first_replica(c->n));
    if (!err)
        err = open_channels(c, opts);
    if (err) {
        sl_client_close(c);
        return err;
    }
    *out = c;
    return 0;
}

void sl_client_close(sl_client *c)
{
    if (!c)
        return;
    for (size_t i = 0; c->rpc && i < c->n; i++)
        sl_rpc_client_free(c->rpc[i]);
    free(c->rpc);
    sl_client_addrs_free(c->addr, c->n);
    free(c);
}

const char *sl_client_health_name(sl_client_health_status status)
{
    switch (status) {
    case SL_CLIENT_HEALTH_SERVING:
        return "SERVING";
    case SL_CLIENT_HEALTH_NOT_SERVING:
        return "NOT_SERVING";
    case SL_CLIENT_HEALTH_SERVICE_UNKNOWN:
        return "SERVICE_UNKNOWN";
    default:
        return "UNKNOWN";
    }
}

int sl_client_health(sl_client *c, const char *service, sl_client_health_status *status)
{
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    Grpc__Health__V1__HealthCheckResponse *resp = NULL;
    int err;

    req.service = (char *)(service ? service : "");
    err = sl_client_unary(c, "/grpc.health.v1.Health/Check", &req.base,
                          &grpc__health__v1__health_check_response__descriptor,
                          (ProtobufCMessage **)&resp, c->timeout_ms);
    if (err)
        return err;
    *status = (sl_client_health_status)resp->status;
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return 0;
}

static void copy_str(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src ? src : "");
}

int sl_client_info_store(sl_client *c, sl_info *info, sl_store_info *store)
{
    Sluice__V1__GetInfoRequest req = SLUICE__V1__GET_INFO_REQUEST__INIT;
    Sluice__V1__GetInfoResponse *resp = NULL;
    int err;

    if (store && (err = sl_opts_check(store->version, SL_STORE_INFO_VERSION, "sl_store_info")))
        return err;
    err = sl_client_unary(c, "/sluice.v1.Admin/GetInfo", &req.base,
                          &sluice__v1__get_info_response__descriptor, (ProtobufCMessage **)&resp,
                          c->timeout_ms);
    if (err)
        return err;
    if (info) {
        memset(info, 0, sizeof(*info));
        copy_str(info->version, sizeof(info->version), resp->version);
        info->uptime_ms = resp->uptime_ms;
        copy_str(info->data_dir, sizeof(info->data_dir), resp->data_dir);
        info->schema_version = resp->schema_version;
        info->pid = resp->pid;
        copy_str(info->listen, sizeof(info->listen), resp->listen);
    }
    if (store) {
        store->quarantine_files = resp->quarantine_files;
        store->quarantine_bytes = resp->quarantine_bytes;
        copy_str(store->quarantine_dir, sizeof(store->quarantine_dir), resp->quarantine_dir);
        copy_str(store->catalog_problem, sizeof(store->catalog_problem), resp->catalog_problem);
        if (store->version >= 2)
            copy_str(store->shard_store, sizeof(store->shard_store), resp->shard_store);
        if (store->version >= 3) {
            copy_str(store->replica, sizeof(store->replica), resp->replica);
            copy_str(store->catalog, sizeof(store->catalog), resp->catalog);
        }
    }
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return 0;
}

int sl_client_info(sl_client *c, sl_info *info)
{
    return sl_client_info_store(c, info, NULL);
}
