/* server/feed/state.c: jobs in memory as the feeding service keeps them — share sizes, reported
 * positions and the reported flags of empty shares, the group's common position, epoch advance,
 * what survives a reload from the catalog, and a mid-epoch resize. The service is built with
 * sl_feed_new over a real catalog in a temporary directory; no RPC server is involved. */
#include "feed/internal.h"

#include "catalog/catalog.h"
#include "catalog/feed.h"
#include "err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static char dir[] = "/tmp/feed-state-test-XXXXXX";
static uv_loop_t loop;

/* A dataset of `samples` and a job over it in the catalog (not yet loaded by a feed). */
static void add_job(sl_cat *cat, const char *name, uint64_t samples, uint32_t world,
                    const char *shuffle, int drop_last)
{
    Sluice__V1__Job spec = SLUICE__V1__JOB__INIT;
    uint8_t buf[256];
    sl_cat_job row;
    char ds[64];

    snprintf(ds, sizeof(ds), "%s-data", name);
    CHECK(sl_cat_dataset_create(cat, ds, samples, 1) == 0);
    spec.name = (char *)name;
    spec.dataset = ds;
    spec.world_size = world;
    spec.shuffle = (char *)shuffle;
    spec.seed = 7;
    spec.drop_last = drop_last;
    memset(&row, 0, sizeof(row));
    row.name = name;
    row.dataset = ds;
    row.spec = buf;
    row.spec_len = sluice__v1__job__pack(&spec, buf);
    row.world_size = world;
    row.created_ms = 1;
    CHECK(sl_cat_job_create(cat, &row) == 0);
}

static sl_feed *open_feed(sl_cat *cat)
{
    sl_feed *f = NULL;

    CHECK(sl_feed_new(&f, &loop, cat, dir, NULL) == 0);
    return f;
}

/* Report `pos` for dp rank `dp` as a durable report would be applied; returns `advanced`. */
static int report(fjob *j, uint32_t dp, uint64_t pos)
{
    int advanced = -1;

    CHECK(sl_cat_progress_set(j->feed->cat, j->name, dp, j->epoch, pos) == 0);
    CHECK(feed_job_report_apply(j, dp, pos, &advanced) == 0);
    return advanced;
}

static void test_empty_shares_need_every_report(sl_cat *cat)
{
    sl_feed *f;
    fjob *j;

    add_job(cat, "empty", 1, 3, "none", 1);
    f = open_feed(cat);
    j = feed_job_find(f, "empty");
    CHECK(j && j->dp_size == 3);
    if (!j)
        goto out;
    for (uint32_t d = 0; d < 3; d++)
        CHECK(j->counts[d] == 0);
    /* Every share is empty, yet the epoch is not complete before its ranks said so. */
    CHECK(!feed_job_complete(j));
    CHECK(feed_job_report_new(j, 0, 0)); /* a first report of 0 is news */
    CHECK(report(j, 0, 0) == 0);
    CHECK(!feed_job_report_new(j, 0, 0)); /* the same again is not */
    CHECK(report(j, 1, 0) == 0);
    CHECK(j->epoch == 0);
    /* A reload keeps who reported (the catalog's rows) */
    sl_feed_free(f);
    f = open_feed(cat);
    j = feed_job_find(f, "empty");
    CHECK(j && j->epoch == 0 && j->reported[0] && j->reported[1] && !j->reported[2]);
    if (!j)
        goto out;
    CHECK(report(j, 2, 0) == 1);
    CHECK(j->epoch == 1);
    /* and the next epoch starts with nobody reported. */
    CHECK(!feed_job_complete(j) && !j->reported[0] && !j->reported[1] && !j->reported[2]);
out:
    sl_feed_free(f);
}

static void test_group_position_and_checks(sl_cat *cat)
{
    char msg[256];
    sl_feed *f;
    fjob *j;

    add_job(cat, "group", 100, 4, "feistel", 0);
    f = open_feed(cat);
    j = feed_job_find(f, "group");
    CHECK(j != NULL);
    if (!j)
        goto out;
    CHECK(feed_job_group_position(j) == 0);
    CHECK(j->counts[0] == 25 && j->counts[3] == 25);
    CHECK(report(j, 0, 25) == 0);
    CHECK(report(j, 1, 20) == 0);
    CHECK(report(j, 2, 25) == 0);
    CHECK(feed_job_group_position(j) == 0); /* dp 3 has not reported */
    CHECK(report(j, 3, 24) == 0);
    CHECK(feed_job_group_position(j) == 20);
    CHECK(!feed_job_report_new(j, 1, 19)); /* monotonic */
    CHECK(feed_job_report_new(j, 1, 21));
    CHECK(feed_job_report_check(j, 1, 1, 3, msg, sizeof(msg)) == SL_ESTATE);
    CHECK(strstr(msg, "epoch 1 is not the current epoch 0") != NULL);
    CHECK(feed_job_report_check(j, 1, 0, 26, msg, sizeof(msg)) == SL_EINVAL);
    CHECK(strstr(msg, "position 26 past the end of dp rank 1's share (25)") != NULL);
    CHECK(feed_job_report_check(j, 1, 0, 25, msg, sizeof(msg)) == 0);
    /* A resize mid-epoch redistributes the rest (0 + 5 + 0 + 1 = 6 indices) over two
     * ranks, positions restart at 0, and the group position with them. */
    CHECK(feed_job_resize(j, 2, NULL, NULL, 0, msg, sizeof(msg)) == 0);
    CHECK(j->dp_size == 2 && j->src != NULL);
    CHECK(j->counts[0] + j->counts[1] == 6);
    CHECK(feed_job_group_position(j) == 0 && !j->reported[0] && !j->reported[1]);
    CHECK(report(j, 0, j->counts[0]) == 0);
    CHECK(report(j, 1, j->counts[1]) == 1);
    CHECK(j->epoch == 1 && j->src == NULL && j->dp_size == 2);
out:
    sl_feed_free(f);
}

/* An elastic blob of the first format ("SLE1", one resize) is still read; a second mid-epoch
 * resize after progress chains (the blob becomes "SLE2"), and both survive a reload. */
static void test_chained_resize_and_old_blob(sl_cat *cat)
{
    Sluice__V1__Job spec = SLUICE__V1__JOB__INIT;
    uint64_t consumed[4] = {25, 20, 25, 24}, c0, c1, c2;
    uint8_t old[256], nspec[256], blob[512];
    uint32_t magic = 0x31454c53u, n = 4, sl;
    size_t old_len, nspec_len, at = 0;
    char msg[256];
    sl_feed *f;
    fjob *j;

    add_job(cat, "legacy", 100, 4, "feistel", 1);
    spec.name = (char *)"legacy";
    spec.dataset = (char *)"legacy-data";
    spec.world_size = 4;
    spec.shuffle = (char *)"feistel";
    spec.seed = 7;
    spec.drop_last = 1;
    old_len = sluice__v1__job__pack(&spec, old);
    spec.world_size = 2;
    nspec_len = sluice__v1__job__pack(&spec, nspec);
    sl = (uint32_t)old_len;
    memcpy(blob, &magic, 4);
    memcpy(blob + 4, &sl, 4);
    memcpy(blob + 8, old, old_len);
    at = 8 + old_len;
    memcpy(blob + at, &n, 4);
    memcpy(blob + at + 4, consumed, sizeof(consumed));
    at += 4 + sizeof(consumed);
    CHECK(sl_cat_job_resize(cat, "legacy", nspec, nspec_len, 2, blob, at, NULL) == 0);
    f = open_feed(cat);
    j = feed_job_find(f, "legacy");
    CHECK(j != NULL && j->src != NULL && j->chain != NULL);
    if (!j || !j->src || !j->chain)
        goto out;
    CHECK(j->dp_size == 2 && j->counts[0] == 3 && j->counts[1] == 3);
    /* The SLE1 step keeps the rule it was recorded with (its ranks read those shares). */
    CHECK(j->chain->steps[0].uneven);
    /* Progress on the elastic shares, then a second resize: the 5 left go to 3 ranks in equal
     * counts (drop_last: 1 each, 2 left out, so DDP ranks take the same steps). */
    CHECK(report(j, 0, 1) == 0);
    CHECK(feed_job_resize(j, 3, NULL, NULL, 0, msg, sizeof(msg)) == 0);
    CHECK(j->dp_size == 3 && j->chain && j->chain->n == 2 && !j->chain->steps[1].uneven);
    CHECK(j->counts[0] == 1 && j->counts[1] == 1 && j->counts[2] == 1);
    CHECK(j->src && sl_sample_elastic_left_out_count(j->src->plan) == 2);
    CHECK(j->elastic_len > 4 && memcmp(j->elastic_blob, "SLE2", 4) == 0);
    /* Nobody progressed since: a third resize re-plans the last step, no new one. */
    CHECK(feed_job_resize(j, 2, NULL, NULL, 0, msg, sizeof(msg)) == 0);
    CHECK(j->chain && j->chain->n == 2 && j->counts[0] == 2 && j->counts[1] == 2);
    CHECK(report(j, 1, 1) == 0);
    CHECK(feed_job_resize(j, 3, NULL, NULL, 0, msg, sizeof(msg)) == 0);
    CHECK(j->chain && j->chain->n == 3);
    c0 = j->counts[0];
    c1 = j->counts[1];
    c2 = j->counts[2];
    CHECK(c0 == 1 && c1 == 1 && c2 == 1); /* 2 + 1 left, 1 of them left out at step 2 */
    CHECK(j->src && sl_sample_elastic_left_out_count(j->src->plan) == 1);
    sl_feed_free(f);
    f = open_feed(cat);
    j = feed_job_find(f, "legacy");
    CHECK(j && j->chain && j->chain->n == 3 && j->dp_size == 3);
    if (!j || !j->chain)
        goto out;
    /* The blob keeps each step's rule across a reload. */
    CHECK(j->chain->steps[0].uneven && !j->chain->steps[1].uneven && !j->chain->steps[2].uneven);
    CHECK(j->counts[0] == c0 && j->counts[1] == c1 && j->counts[2] == c2);
    CHECK(report(j, 0, c0) == 0);
    CHECK(report(j, 1, c1) == 0);
    CHECK(report(j, 2, c2) == 1);
    CHECK(j->epoch == 1 && j->chain == NULL && j->src == NULL);
out:
    sl_feed_free(f);
}

/* A step's consumed counts are stored as runs of equal values when shorter (64 ranks, 2 runs:
 * 28 bytes instead of 512), read back to the same shares; runs that do not add up to the
 * step's ranks are refused as corrupt (the job does not load). */
static void test_blob_runs(sl_cat *cat)
{
    uint64_t counts[64];
    uint8_t spec[256], *blob = NULL;
    uint32_t spec_len, cnt;
    size_t len = 0, at, sl;
    char msg[256];
    sl_feed *f;
    fjob *j;

    add_job(cat, "runs", 6400, 64, "feistel", 0);
    f = open_feed(cat);
    j = feed_job_find(f, "runs");
    CHECK(j != NULL);
    if (!j)
        goto out;
    CHECK(report(j, 0, 3) == 0);
    CHECK(feed_job_resize(j, 64, NULL, NULL, 0, msg, sizeof(msg)) == 0);
    CHECK(j->chain && j->chain->n == 1 && j->src && j->elastic_blob);
    if (!j->chain || !j->elastic_blob)
        goto out;
    memcpy(&spec_len, j->elastic_blob + 4, 4);
    CHECK(j->elastic_len == 8 + spec_len + 4 + 16 + 4 + 2 * 12);
    memcpy(counts, j->counts, sizeof(counts));
    CHECK(counts[0] + counts[63] > 0 && counts[0] == counts[63]);
    len = j->elastic_len;
    blob = malloc(len);
    sl = sluice__v1__job__pack(j->spec, spec);
    if (blob)
        memcpy(blob, j->elastic_blob, len);
    sl_feed_free(f);
    f = open_feed(cat);
    j = feed_job_find(f, "runs");
    CHECK(j && j->src && j->dp_size == 64 && memcmp(j->counts, counts, sizeof(counts)) == 0);
    sl_feed_free(f);
    if (!blob)
        goto done;
    /* The first run (rank 0's 3) now claims 2 ranks: 65 in all. */
    at = 8 + spec_len + 4 + 16 + 4;
    memcpy(&cnt, blob + at, 4);
    CHECK(cnt == 1);
    cnt = 2;
    memcpy(blob + at, &cnt, 4);
    CHECK(sl_cat_job_resize(cat, "runs", spec, sl, 64, blob, len, NULL) == 0);
    f = open_feed(cat);
    CHECK(feed_job_find(f, "runs") == NULL);
out:
    sl_feed_free(f);
done:
    free(blob);
}

/* feed_index_chunk: a message of that many indices, each as wide as the largest, fits. */
static void test_index_chunk(void)
{
    static const uint64_t samples[] = {1,        2,          128,          129,       1u << 21,
                                       1u << 30, 1ull << 33, (1ull << 62), UINT64_MAX};
    size_t limit = 64u << 10;

    /* 2^30 samples: 5 bytes per index; 65536 of them (320 KiB) are cut to what fits. */
    CHECK(feed_index_chunk(65536, 1u << 30, limit) == (limit - FEED_CHUNK_OVERHEAD) / 5);
    /* Small datasets keep the request's chunk; the default chunk stays whole below 2^35. */
    CHECK(feed_index_chunk(32768, 100, limit) == 32768);
    CHECK(feed_index_chunk(8192, 1ull << 35, limit) == 8192);
    CHECK(feed_index_chunk(7, 1u << 30, 10) == 1);
    for (size_t i = 0; i < sizeof(samples) / sizeof(samples[0]); i++) {
        uint64_t top = samples[i] - 1;
        size_t width = 1, n = feed_index_chunk(65536, samples[i], limit);
        while (top >= 0x80) {
            top >>= 7;
            width++;
        }
        CHECK(n >= 1 && n <= 65536);
        CHECK(n * width + FEED_CHUNK_OVERHEAD <= limit);
        CHECK(n == 65536 || (n + 1) * width + FEED_CHUNK_OVERHEAD > limit);
    }
}

int main(void)
{
    char path[sizeof(dir) + 32], cmd[sizeof(dir) + 16];
    sl_cat *cat = NULL;

    if (!mkdtemp(dir) || uv_loop_init(&loop) != 0) {
        perror("feed_state_test setup");
        return 1;
    }
    snprintf(path, sizeof(path), "%s/catalog.db", dir);
    CHECK(sl_cat_open(&cat, path) == 0);
    test_index_chunk();
    if (cat) {
        test_empty_shares_need_every_report(cat);
        test_group_position_and_checks(cat);
        test_chained_resize_and_old_blob(cat);
        test_blob_runs(cat);
    }
    sl_cat_close(cat);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(uv_loop_close(&loop) == 0);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "feed_state_test: could not remove %s\n", dir);
    return check_done("feed_state_test");
}
