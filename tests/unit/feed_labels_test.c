/* server/feed/labels.c and catalog migration 6 (dataset labels): the stored labels-file reader
 * (size before allocation, checksum, class-id cap, grouping), labels shared per (dataset,
 * checksum) by reference, refused when missing or damaged; and a catalog of schema 5 migrated to
 * 6 keeps its datasets, without labels, and records labels after. Real catalog and files in a
 * temporary directory; no RPC server. */
#include "feed/internal.h"

#include "catalog/catalog.h"
#include "catalog/feed.h"
#include "err.h"
#include "sample/internal.h"
#include "shard/shard.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static char dir[] = "/tmp/feed-labels-test-XXXXXX";
static uv_loop_t loop;

static void sha_hex(const uint32_t *v, size_t n, char hex[65])
{
    sl_sha256 *h = NULL;
    uint8_t b[4];

    CHECK(sl_sha256_new(&h) == 0 && sl_sha256_reset(h) == 0);
    for (size_t i = 0; i < n; i++) {
        b[0] = (uint8_t)v[i];
        b[1] = (uint8_t)(v[i] >> 8);
        b[2] = (uint8_t)(v[i] >> 16);
        b[3] = (uint8_t)(v[i] >> 24);
        CHECK(sl_sha256_update(h, b, 4) == 0);
    }
    CHECK(sl_sha256_final(h, hex) == 0);
    sl_sha256_free(h);
}

/* Write labels v[0..n) little-endian to path plus `extra` trailing bytes. */
static void write_labels(const char *path, const uint32_t *v, size_t n, size_t extra)
{
    FILE *f = fopen(path, "wb");

    CHECK(f != NULL);
    if (!f)
        return;
    for (size_t i = 0; i < n; i++) {
        uint8_t b[4] = {(uint8_t)v[i], (uint8_t)(v[i] >> 8), (uint8_t)(v[i] >> 16),
                        (uint8_t)(v[i] >> 24)};
        CHECK(fwrite(b, 1, 4, f) == 4);
    }
    for (size_t i = 0; i < extra; i++)
        fputc(7, f);
    fclose(f);
}

static int read_file(sl_sample_labels **out, const char *path, uint64_t n, const char *sha,
                     char *msg, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC), err;

    CHECK(fd >= 0);
    err = feed_labels_read(out, fd, n, sha, msg, len);
    close(fd);
    return err;
}

static void test_read(void)
{
    const uint32_t v[] = {2, 0, 2, 1, 0, 2, 5};
    uint32_t over[] = {1, SL_SAMPLE_MAX_CLASSES};
    char path[sizeof(dir) + 16], sha[65], msg[256];
    sl_sample_labels *l = NULL;

    snprintf(path, sizeof(path), "%s/t.labels", dir);
    write_labels(path, v, 7, 0);
    sha_hex(v, 7, sha);
    CHECK(read_file(&l, path, 7, sha, msg, sizeof(msg)) == 0 && l);
    if (l) {
        /* Grouped by class, ascending within: 0 -> {1, 4}, 1 -> {3}, 2 -> {0, 2, 5}, 5 -> {6}. */
        static const uint64_t want[] = {1, 4, 3, 0, 2, 5, 6};
        CHECK(sl_sample_labels_count(l) == 7 && sl_sample_labels_classes(l) == 6);
        CHECK(sl_sample_labels_class_size(l, 2) == 3 && sl_sample_labels_class_size(l, 3) == 0);
        for (uint64_t k = 0; k < 7; k++)
            CHECK(sl_labels_member(l, k) == want[k]);
    }
    sl_sample_labels_free(l);
    l = NULL;
    /* The count the catalog gives must be the file's: one more, one less, a huge one (nothing
     * allocated for it), none. */
    CHECK(read_file(&l, path, 8, sha, msg, sizeof(msg)) == SL_ECORRUPT && !l);
    CHECK(strstr(msg, "28 bytes, not 32") != NULL);
    CHECK(read_file(&l, path, 6, sha, msg, sizeof(msg)) == SL_ECORRUPT && !l);
    CHECK(read_file(&l, path, UINT64_C(1) << 61, sha, msg, sizeof(msg)) == SL_ECORRUPT && !l);
    CHECK(read_file(&l, path, 0, sha, msg, sizeof(msg)) == SL_ECORRUPT && !l);
    /* Another checksum, or an upper-case one: not the catalog's file. */
    sha[5] = sha[5] == 'a' ? 'b' : 'a';
    CHECK(read_file(&l, path, 7, sha, msg, sizeof(msg)) == SL_ECORRUPT && !l);
    CHECK(strstr(msg, "checksum differs") != NULL);
    sha_hex(v, 7, sha);
    for (char *p = sha; *p; p++)
        *p = *p >= 'a' && *p <= 'f' ? (char)(*p - 32) : *p;
    CHECK(read_file(&l, path, 7, sha, msg, sizeof(msg)) == SL_ECORRUPT && !l);
    /* A trailing partial label. */
    write_labels(path, v, 7, 3);
    sha_hex(v, 7, sha);
    CHECK(read_file(&l, path, 7, sha, msg, sizeof(msg)) == SL_ECORRUPT && !l);
    /* A class id over the maximum (a file no upload would have stored). */
    write_labels(path, over, 2, 0);
    sha_hex(over, 2, sha);
    CHECK(read_file(&l, path, 2, sha, msg, sizeof(msg)) == SL_EINVAL && !l);
    CHECK(strstr(msg, "label 1048576 of sample 1") != NULL);
    unlink(path);
}

/* feed_labels_get as a caller that waits: the first get of labels not in memory starts their
 * read on the worker pool (FEED_PENDING); the loop runs until it is done, then the get again
 * has them (or the read's failure). */
static int get_read(flabels **out, sl_feed *f, const char *ds, char *msg, size_t len)
{
    flabels *fl = NULL;
    int err = feed_labels_get(&fl, f, ds, msg, len);

    if (err != FEED_PENDING) {
        *out = fl;
        return err;
    }
    CHECK(fl && flabels_state(fl) == 0 && flabels_of(fl) == NULL);
    while (flabels_state(fl) == 0)
        uv_run(&loop, UV_RUN_ONCE);
    err = feed_labels_get(out, f, ds, msg, len);
    flabels_unref(f, fl);
    return err;
}

/* feed_labels_get: read off the loop, shared per (dataset, checksum), refused without labels or
 * with a damaged file, a new object once the catalog records other labels. */
static void test_get(sl_cat *cat)
{
    const uint32_t v[] = {0, 1, 1, 0, 3}, w[] = {1, 1, 1, 1, 0};
    char path[sizeof(dir) + 64], sha[65], msg[256];
    flabels *a = NULL, *b = NULL, *c = NULL;
    sl_feed *f = NULL;

    CHECK(sl_cat_dataset_create(cat, "ds", 5, 1) == 0);
    CHECK(sl_feed_new(&f, &loop, cat, dir, NULL) == 0);
    if (!f)
        return;
    CHECK(get_read(&a, f, "ds", msg, sizeof(msg)) == SL_ESTATE && !a);
    CHECK(strstr(msg, "has no labels") != NULL);
    CHECK(get_read(&a, f, "nope", msg, sizeof(msg)) == SL_ENOTFOUND);
    CHECK(feed_labels_path(f, "ds", path, sizeof(path)) == 0);
    snprintf(msg, sizeof(msg), "%s/datasets", dir);
    mkdir(msg, 0700);
    write_labels(path, v, 5, 0);
    sha_hex(v, 5, sha);
    CHECK(sl_cat_dataset_set_labels(cat, "ds", sha, 4) == 0);
    CHECK(get_read(&a, f, "ds", msg, sizeof(msg)) == 0 && a);
    CHECK(feed_labels_get(&b, f, "ds", msg, sizeof(msg)) == 0 && b == a); /* one copy */
    CHECK(sl_sample_labels_classes(flabels_of(a)) == 4);
    CHECK(sl_sample_labels_class_size(flabels_of(a), 1) == 2);
    flabels_unref(f, b);
    /* New labels in the catalog: a new object; the old one lives while referenced. */
    write_labels(path, w, 5, 0);
    sha_hex(w, 5, sha);
    CHECK(sl_cat_dataset_set_labels(cat, "ds", sha, 2) == 0);
    CHECK(get_read(&c, f, "ds", msg, sizeof(msg)) == 0 && c && c != a);
    CHECK(sl_sample_labels_class_size(flabels_of(c), 1) == 4);
    CHECK(sl_sample_labels_class_size(flabels_of(a), 1) == 2);
    flabels_unref(f, a);
    flabels_unref(f, c);
    flabels_unref(f, NULL);
    /* Damaged (same size, other bytes) and missing files are refused, naming the dataset. */
    write_labels(path, v, 5, 0);
    CHECK(get_read(&a, f, "ds", msg, sizeof(msg)) == SL_ECORRUPT && !a);
    CHECK(strstr(msg, "dataset 'ds'") != NULL && strstr(msg, "checksum") != NULL);
    unlink(path);
    CHECK(get_read(&a, f, "ds", msg, sizeof(msg)) != 0 && !a);
    CHECK(strstr(msg, "cannot open the labels of dataset 'ds'") != NULL);
    sl_feed_free(f);
}

/* Migration 6: a catalog left at schema 5 (before labels) is migrated on open; its datasets
 * have no labels, and labels are recorded and kept after. */
static void test_migration_6(void)
{
    char path[sizeof(dir) + 32];
    sl_cat *cat = NULL;
    sl_cat_dataset d;

    snprintf(path, sizeof(path), "%s/old.db", dir);
    CHECK(sl_cat_open_upto(&cat, path, sl_cat_latest_version() + 1) == SL_EINVAL && !cat);
    CHECK(sl_cat_open_upto(&cat, path, 5) == 0 && cat);
    if (!cat)
        return;
    CHECK(sl_cat_schema_version(cat) == 5);
    CHECK(sl_cat_dataset_create(cat, "old", 12, 1) == 0);
    CHECK(sl_cat_dataset_get(cat, &d, "old") != 0); /* no labels columns before 6 */
    sl_cat_close(cat);
    CHECK(sl_cat_open(&cat, path) == 0 && cat);
    if (!cat)
        return;
    CHECK(sl_cat_schema_version(cat) == sl_cat_latest_version() && sl_cat_latest_version() >= 6);
    memset(&d, 0, sizeof(d));
    CHECK(sl_cat_dataset_get(cat, &d, "old") == 0 && d.samples == 12);
    CHECK(!d.has_labels && d.labels_sha256[0] == '\0' && d.classes == 0);
    CHECK(sl_cat_dataset_set_labels(cat, "old", "ab", 9) == 0);
    CHECK(sl_cat_dataset_set_labels(cat, "nope", "ab", 9) == SL_ENOTFOUND);
    sl_cat_close(cat);
    CHECK(sl_cat_open(&cat, path) == 0 && cat);
    if (!cat)
        return;
    CHECK(sl_cat_dataset_get(cat, &d, "old") == 0 && d.has_labels && d.classes == 9 &&
          strcmp(d.labels_sha256, "ab") == 0);
    sl_cat_close(cat);
}

int main(void)
{
    char path[sizeof(dir) + 32], cmd[sizeof(dir) + 16];
    sl_cat *cat = NULL;

    if (!mkdtemp(dir) || uv_loop_init(&loop) != 0) {
        perror("feed_labels_test setup");
        return 1;
    }
    test_read();
    test_migration_6();
    snprintf(path, sizeof(path), "%s/catalog.db", dir);
    CHECK(sl_cat_open(&cat, path) == 0);
    if (cat)
        test_get(cat);
    sl_cat_close(cat);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(uv_loop_close(&loop) == 0);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "feed_labels_test: could not remove %s\n", dir);
    return check_done("feed_labels_test");
}
