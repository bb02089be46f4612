/* server/catalog/feed.c: datasets, jobs, progress, epoch and resize transactions, foreign keys,
 * and that everything survives closing and reopening the catalog. */
#include "catalog/catalog.h"
#include "catalog/feed.h"
#include "err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

typedef struct seen {
    int n;
    uint64_t pos[8];
    uint64_t epoch[8];
    char names[8][SL_CAT_FEED_NAME_MAX + 1];
    uint64_t job_epoch[8];
    size_t elastic_len[8];
    uint32_t world[8];
} seen;

static int on_progress(uint32_t dp, uint64_t epoch, uint64_t position, void *arg)
{
    seen *s = arg;

    if (dp < 8) {
        s->pos[dp] = position;
        s->epoch[dp] = epoch;
    }
    s->n++;
    return 0;
}

static int on_job(const sl_cat_job *j, void *arg)
{
    seen *s = arg;

    if (s->n < 8) {
        snprintf(s->names[s->n], sizeof(s->names[0]), "%s", j->name);
        s->job_epoch[s->n] = j->epoch;
        s->elastic_len[s->n] = j->elastic_len;
        s->world[s->n] = j->world_size;
    }
    s->n++;
    return 0;
}

static int on_dataset(const sl_cat_dataset *d, void *arg)
{
    seen *s = arg;

    if (s->n < 8)
        snprintf(s->names[s->n], sizeof(s->names[0]), "%s", d->name);
    s->n++;
    return 0;
}

int main(void)
{
    uint64_t version = 0;
    char dir[] = "/tmp/feed-cat-XXXXXX", path[64];
    sl_cat *cat = NULL;
    sl_cat_dataset d;
    sl_cat_job j;
    seen s;
    const char spec[] = "spec-bytes", el[] = "elastic";

    if (!mkdtemp(dir))
        return 1;
    snprintf(path, sizeof(path), "%s/catalog.db", dir);
    CHECK(sl_cat_open(&cat, path) == 0);
    CHECK(sl_cat_schema_version(cat) == sl_cat_latest_version());

    CHECK(sl_cat_dataset_create(cat, "ds", 10, 1) == 0);
    CHECK(sl_cat_dataset_create(cat, "ds", 10, 1) == SL_EEXIST);
    CHECK(sl_cat_dataset_create(cat, "ds2", 5, 2) == 0);
    CHECK(sl_cat_dataset_get(cat, &d, "nope") == SL_ENOTFOUND);
    CHECK(sl_cat_dataset_get(cat, &d, "ds") == 0 && d.samples == 10 && !d.has_lengths);
    CHECK(sl_cat_dataset_set_lengths(cat, "ds", "ab12") == 0);
    CHECK(sl_cat_dataset_set_lengths(cat, "nope", "ab12") == SL_ENOTFOUND);
    CHECK(sl_cat_dataset_get(cat, &d, "ds") == 0 && d.has_lengths &&
          strcmp(d.lengths_sha256, "ab12") == 0);

    memset(&j, 0, sizeof(j));
    j.name = "job";
    j.dataset = "nope";
    j.spec = spec;
    j.spec_len = sizeof(spec);
    j.world_size = 4;
    CHECK(sl_cat_job_create(cat, &j) == SL_ENOTFOUND);
    j.dataset = "ds";
    CHECK(sl_cat_job_create(cat, &j) == 0);
    CHECK(sl_cat_job_create(cat, &j) == SL_EEXIST);
    CHECK(sl_cat_dataset_get(cat, &d, "ds") == 0 && d.jobs == 1);
    CHECK(sl_cat_dataset_delete(cat, "ds") == SL_ESTATE);
    CHECK(sl_cat_dataset_delete(cat, "nope") == SL_ENOTFOUND);

    CHECK(sl_cat_progress_set(cat, "job", 0, 0, 3) == 0);
    CHECK(sl_cat_progress_set(cat, "job", 2, 0, 5) == 0);
    CHECK(sl_cat_progress_set(cat, "job", 2, 0, 6) == 0);
    /* Group commit may write an older report after a newer one: the higher position stays. */
    CHECK(sl_cat_feed_begin(cat) == 0);
    CHECK(sl_cat_progress_set(cat, "job", 2, 0, 4) == 0);
    CHECK(sl_cat_feed_end(cat, 0) == 0);
    CHECK(sl_cat_feed_begin(cat) == 0);
    CHECK(sl_cat_progress_set(cat, "job", 3, 0, 4) == 0);
    CHECK(sl_cat_feed_end(cat, SL_EINVAL) == SL_EINVAL); /* rolled back */
    CHECK(sl_cat_progress_set(cat, "nope", 0, 0, 1) == SL_ENOTFOUND);
    memset(&s, 0, sizeof(s));
    CHECK(sl_cat_progress_list(cat, "job", on_progress, &s) == 0);
    CHECK(s.n == 2 && s.pos[0] == 3 && s.pos[2] == 6);

    /* Survives a reopen. */
    sl_cat_close(cat);
    CHECK(sl_cat_open(&cat, path) == 0);
    memset(&s, 0, sizeof(s));
    CHECK(sl_cat_progress_list(cat, "job", on_progress, &s) == 0);
    CHECK(s.n == 2 && s.pos[2] == 6);

    /* A new epoch clears progress in the same transaction. */
    CHECK(sl_cat_job_set_epoch(cat, "job", 0, 1) == 0);
    CHECK(sl_cat_job_set_epoch(cat, "nope", 0, 1) == SL_ENOTFOUND);
    /* A second advance from the same epoch (another replica's, racing) changes nothing. */
    CHECK(sl_cat_job_set_epoch(cat, "job", 0, 1) == SL_ESTATE);
    memset(&s, 0, sizeof(s));
    CHECK(sl_cat_progress_list(cat, "job", on_progress, &s) == 0 && s.n == 0);
    CHECK(sl_cat_progress_set(cat, "job", 1, 0, 9) == 0);
    CHECK(sl_cat_progress_set(cat, "job", 1, 1, 2) == 0); /* another epoch replaces */
    memset(&s, 0, sizeof(s));
    CHECK(sl_cat_progress_list(cat, "job", on_progress, &s) == 0);
    CHECK(s.n == 1 && s.pos[1] == 2 && s.epoch[1] == 1);
    {
        /* Reports of one rank in one group commit: one row, the highest. */
        sl_cat_progress many[] = {{1, 1, 3}, {0, 1, 4}, {1, 1, 7}, {1, 1, 5}};
        CHECK(sl_cat_progress_put(cat, "job", many, 4) == 0);
        CHECK(sl_cat_progress_put(cat, "job", many, 0) == 0);
        memset(&s, 0, sizeof(s));
        CHECK(sl_cat_progress_list(cat, "job", on_progress, &s) == 0);
        CHECK(s.n == 2 && s.pos[1] == 7 && s.pos[0] == 4);
    }
    CHECK(sl_cat_job_resize(cat, "job", spec, sizeof(spec), 3, el, sizeof(el), &version) == 0);
    CHECK(version == 1);
    CHECK(sl_cat_job_resize(cat, "nope", spec, sizeof(spec), 3, NULL, 0, NULL) == SL_ENOTFOUND);
    memset(&s, 0, sizeof(s));
    CHECK(sl_cat_progress_list(cat, "job", on_progress, &s) == 0 && s.n == 0);
    memset(&s, 0, sizeof(s));
    CHECK(sl_cat_job_list(cat, on_job, &s) == 0);
    CHECK(s.n == 1 && strcmp(s.names[0], "job") == 0 && s.job_epoch[0] == 1 &&
          s.elastic_len[0] == sizeof(el) && s.world[0] == 3);
    CHECK(sl_cat_job_set_epoch(cat, "job", 1, 2) == 0);
    memset(&s, 0, sizeof(s));
    CHECK(sl_cat_job_list(cat, on_job, &s) == 0 && s.elastic_len[0] == 0);

    /* Deleting the job removes its progress and frees the dataset. */
    CHECK(sl_cat_progress_set(cat, "job", 0, 2, 1) == 0);
    CHECK(sl_cat_job_delete(cat, "job") == 0);
    CHECK(sl_cat_job_delete(cat, "job") == SL_ENOTFOUND);
    memset(&s, 0, sizeof(s));
    CHECK(sl_cat_progress_list(cat, "job", on_progress, &s) == 0 && s.n == 0);
    CHECK(sl_cat_dataset_delete(cat, "ds") == 0);
    memset(&s, 0, sizeof(s));
    CHECK(sl_cat_dataset_list(cat, on_dataset, &s) == 0);
    CHECK(s.n == 1 && strcmp(s.names[0], "ds2") == 0);
    sl_cat_close(cat);

    snprintf(path, sizeof(path), "rm -rf %s", dir);
    if (system(path) != 0)
        failures++;
    return check_done("feed_catalog_test");
}
