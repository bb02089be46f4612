/* sluice.v1.Admin: questions about the daemon itself. */
#include "daemon.h"

#include "sluice/v1/admin.pb-c.h"

#include <unistd.h>

static void get_info(sl_rpc_call *call, const ProtobufCMessage *req, void *arg)
{
    sl_daemon *d = arg;
    Sluice__V1__GetInfoResponse resp = SLUICE__V1__GET_INFO_RESPONSE__INIT;
    const char *problem = sl_cat_problem(d->cat);
    sl_quar_counts q;

    resp.version = (char *)SLUICE_VERSION;
    resp.uptime_ms = uv_now(&d->loop) - d->start_ms;
    resp.data_dir = d->data_dir;
    resp.schema_version = (uint32_t)sl_cat_schema_version(d->cat);
    resp.pid = (uint64_t)getpid();
    resp.listen = d->listen;
    /* An operator may have removed or restored quarantined files since the last walk. */
    sl_quar_refresh(d->quar);
    sl_quar_get_counts(d->quar, &q);
    resp.quarantine_files = q.files;
    resp.quarantine_bytes = q.bytes;
    resp.quarantine_dir = (char *)sl_quar_path(d->quar);
    resp.catalog_problem = (char *)(problem ? problem : "");
    resp.shard_store = d->store_desc;
    resp.replica = d->replica;
    resp.catalog = d->catalog_desc;
    sl_rpc_call_reply(call, &resp.base);
}

static const sl_rpc_method admin_methods[] = {
    {
        .name = "GetInfo",
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__get_info_request__descriptor,
        .response = &sluice__v1__get_info_response__descriptor,
        .access = SL_ACCESS_READER,
        .on_start = get_info,
    },
};

const sl_rpc_service *sl_admin_service(sl_daemon *d)
{
    static sl_rpc_service svc = {
        .name = "sluice.v1.Admin",
        .methods = admin_methods,
        .n_methods = sizeof(admin_methods) / sizeof(admin_methods[0]),
    };

    svc.arg = d;
    return &svc;
}
