/* The feeding service's lifecycle: load jobs from the catalog, hand out the service tables. */
#include "internal.h"

#include "err.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int load_job(const sl_cat_job *row, void *arg)
{
    sl_feed *f = arg;
    Sluice__V1__Job *spec = sluice__v1__job__unpack(NULL, row->spec_len, row->spec);
    sl_cat_dataset d;
    char msg[256];
    fjob *j;
    int err;

    if (!spec) {
        sl_log_error("job_load_failed", "job=%s error=\"spec does not decode\"", row->name);
        return 0;
    }
    err = sl_cat_dataset_get(f->cat, &d, row->dataset);
    if (err) {
        sluice__v1__job__free_unpacked(spec, NULL);
        sl_log_error("job_load_failed", "job=%s error=\"dataset %s: %s\"", row->name, row->dataset,
                     sl_strerror(err));
        return err == SL_EDB ? err : 0;
    }
    err = feed_job_add(f, &j, row->name, row->dataset, spec, d.samples, row->epoch, row->created_ms,
                       row->elastic, row->elastic_len, msg, sizeof(msg));
    if (err) {
        /* Keep serving the other jobs; this one stays in the catalog for an operator. */
        sl_log_error("job_load_failed", "job=%s error=\"%s\"", row->name, msg);
        return err == SL_EDB ? err : 0;
    }
    sl_log_info("job_loaded", "job=%s epoch=%llu world=%u resized_in_epoch=%d", j->name,
                (unsigned long long)j->epoch, j->spec->world_size, j->src != NULL);
    return 0;
}

int sl_feed_new(sl_feed **out, uv_loop_t *loop, sl_cat *cat, const char *data_dir)
{
    sl_feed *f = calloc(1, sizeof(*f));
    char dir[sizeof(f->data_dir) + 16];
    int err;

    *out = NULL;
    if (!f)
        return -ENOMEM;
    f->loop = loop;
    f->cat = cat;
    if (strlen(data_dir) >= sizeof(f->data_dir) - 64) {
        free(f);
        return -ENAMETOOLONG;
    }
    snprintf(f->data_dir, sizeof(f->data_dir), "%s", data_dir);
    snprintf(dir, sizeof(dir), "%s/datasets", f->data_dir);
    if (mkdir(dir, 0750) != 0 && errno != EEXIST) {
        err = -errno;
        sl_log_error("datasets_dir_failed", "path=%s error=\"%s\"", dir, sl_strerror(err));
        free(f);
        return err;
    }
    err = feed_reports_init(f);
    if (!err)
        err = sl_cat_job_list(cat, load_job, f);
    if (err) {
        sl_feed_free(f);
        return err;
    }
    feed_datasets_service(f);
    feed_jobs_service(f);
    feed_epochs_service(f);
    feed_stream_service(f);
    *out = f;
    return 0;
}

void sl_feed_free(sl_feed *f)
{
    if (!f)
        return;
    feed_reports_close(f);
    while (f->jobs)
        feed_job_remove(f, f->jobs, SL_RPC_UNAVAILABLE, "server shutting down");
    free(f);
}

void sl_feed_set_metrics(sl_feed *f, sl_metrics *m)
{
    f->metrics = m;
}

const sl_rpc_service *sl_feed_service(sl_feed *f, int i)
{
    return i >= 0 && i < SL_FEED_N_SERVICES ? &f->svcs[i] : NULL;
}
