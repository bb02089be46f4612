/* The Checkpoints service: its state, its method table, its lifecycle and the sweep timer. The
 * methods live in the files of their concern (internal.h). */
#include "internal.h"

#include "auth.h"
#include "err.h"
#include "log.h"
#include "metrics.h"
#include "store/store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Designated initializers: the table stays valid when the layer adds fields. Access: reading
 * and verifying need reader, writing a checkpoint trainer, deleting (Delete, retention) admin. */
static const sl_rpc_method ckpt_methods[] = {
    {
        .name = "Begin",
        .access = SL_ACCESS_TRAINER,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__begin_request__descriptor,
        .response = &sluice__v1__checkpoint__descriptor,
        .on_start = ckpt_begin,
    },
    {
        .name = "UploadShard",
        .access = SL_ACCESS_TRAINER,
        .kind = SL_RPC_CLIENT_STREAM,
        .request = &sluice__v1__upload_shard_request__descriptor,
        .response = &sluice__v1__upload_shard_response__descriptor,
        .on_start = ckpt_upload_start,
        .on_message = ckpt_upload_message,
        .on_cancel = ckpt_upload_cancel,
        .on_bad_message = ckpt_upload_bad_message,
        /* Chunks arrive as the received buffers: hashed and written without a copy. */
        .bytes_field = SLUICE__V1__UPLOAD_SHARD_REQUEST__KIND_CHUNK,
        /* Only the header and data bytes are progress: empty chunks do not hold a rank's upload
         * open past the idle timeout. */
        .handler_progress = 1,
    },
    {
        .name = "UploadStatus",
        .access = SL_ACCESS_READER,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__upload_status_request__descriptor,
        .response = &sluice__v1__upload_status_response__descriptor,
        .on_start = ckpt_upload_status,
    },
    {
        .name = "Commit",
        .access = SL_ACCESS_TRAINER,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__checkpoint_ref__descriptor,
        .response = &sluice__v1__checkpoint__descriptor,
        .on_start = ckpt_commit,
    },
    {
        .name = "Abort",
        .access = SL_ACCESS_TRAINER,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__checkpoint_ref__descriptor,
        .response = &sluice__v1__checkpoint__descriptor,
        .on_start = ckpt_abort,
    },
    {
        .name = "Get",
        .access = SL_ACCESS_READER,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__checkpoint_ref__descriptor,
        .response = &sluice__v1__checkpoint__descriptor,
        .on_start = ckpt_get,
    },
    {
        .name = "List",
        .access = SL_ACCESS_READER,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__list_request__descriptor,
        .response = &sluice__v1__list_response__descriptor,
        .on_start = ckpt_list,
    },
    {
        .name = "Latest",
        .access = SL_ACCESS_READER,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__latest_request__descriptor,
        .response = &sluice__v1__checkpoint__descriptor,
        .on_start = ckpt_latest,
    },
    {
        .name = "Verify",
        .access = SL_ACCESS_READER,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__verify_request__descriptor,
        .response = &sluice__v1__verify_response__descriptor,
        .on_start = ckpt_verify,
        .on_cancel = ckpt_verify_cancel,
    },
    {
        .name = "DownloadShard",
        .access = SL_ACCESS_READER,
        .kind = SL_RPC_SERVER_STREAM,
        .request = &sluice__v1__download_shard_request__descriptor,
        .response = &sluice__v1__download_shard_response__descriptor,
        .on_start = ckpt_download,
        .on_writable = ckpt_download_pump,
    },
    {
        .name = "Delete",
        .access = SL_ACCESS_ADMIN,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__checkpoint_ref__descriptor,
        .response = &sluice__v1__delete_response__descriptor,
        .on_start = ckpt_delete,
    },
    {
        .name = "SetRetention",
        .access = SL_ACCESS_ADMIN,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__set_retention_request__descriptor,
        .response = &sluice__v1__set_retention_response__descriptor,
        .on_start = ckpt_set_retention,
    },
    {
        /* Trainers restart from checkpoints: rewinding their job's data position is theirs. */
        .name = "Restore",
        .access = SL_ACCESS_TRAINER,
        .kind = SL_RPC_UNARY,
        .request = &sluice__v1__restore_request__descriptor,
        .response = &sluice__v1__restore_response__descriptor,
        .on_start = ckpt_restore,
    },
};

static void sweep(void *arg, int b)
{
    (void)b;
    ckpt_sweep(arg, 0);
    ckpt_auto_commit_pending(arg);
}

static void on_sweep(uv_timer_t *t)
{
    sl_ckpt_svc *s = t->data;

    sl_cat_lane_run(s->cat, sweep, s, 0);
}

/* Every half upload timeout, at most every SWEEP_PERIOD_MS, at least every 100 ms. */
static void start_sweeps(sl_ckpt_svc *s)
{
    uint64_t period = s->opts.upload_timeout_ms / 2;

    if (period > SWEEP_PERIOD_MS)
        period = SWEEP_PERIOD_MS;
    if (period < 100)
        period = 100;
    uv_timer_init(s->loop, &s->sweep);
    s->timer_open = 1;
    s->sweep.data = s;
    uv_timer_start(&s->sweep, on_sweep, period, period);
    /* The sweep must not keep the loop alive once the server has stopped. */
    uv_unref((uv_handle_t *)&s->sweep);
}

int sl_ckpt_svc_new(sl_ckpt_svc **out, uv_loop_t *loop, sl_cat *cat, const char *data_dir,
                    const sl_ckpt_opts *opts)
{
    sl_ckpt_svc *s = calloc(1, sizeof(*s));
    int n;

    *out = NULL;
    if (!s)
        return -ENOMEM;
    s->loop = loop;
    s->cat = cat;
    s->upload_settled = ckpt_auto_commit;
    s->opts = *opts;
    if (s->opts.max_deep_verifies < 1)
        s->opts.max_deep_verifies = 2;
    if (s->opts.store_jobs < 1)
        s->opts.store_jobs = 4;
    if (s->opts.metrics)
        sl_metrics_set(s->opts.metrics, "sluice_verify_hash_jobs", NULL, 0);
    n = snprintf(s->data_dir, sizeof(s->data_dir), "%s", data_dir);
    if (n < 0 || (size_t)n >= sizeof(s->data_dir) || !opts->store) {
        free(s);
        return n < 0 || (size_t)n >= sizeof(s->data_dir) ? -ENAMETOOLONG : -EINVAL;
    }
    s->svc = (sl_rpc_service){
        .name = "sluice.v1.Checkpoints",
        .methods = ckpt_methods,
        .n_methods = sizeof(ckpt_methods) / sizeof(ckpt_methods[0]),
        .arg = s,
    };
    ckpt_lease_restarted(s);
    ckpt_sweep(s, 1);
    ckpt_auto_commit_pending(s);
    start_sweeps(s);
    *out = s;
    return 0;
}

const sl_rpc_service *sl_ckpt_service(sl_ckpt_svc *s)
{
    return &s->svc;
}

static void svc_closed(uv_handle_t *h)
{
    sl_ckpt_svc *s = h->data;

    s->timer_open = 0;
    ckpt_svc_release(s);
}

void sl_ckpt_svc_free(sl_ckpt_svc *s)
{
    if (!s)
        return;
    s->stopping = 1;
    ckpt_store_jobs_flush(s);
    uv_close((uv_handle_t *)&s->sweep, svc_closed);
}
