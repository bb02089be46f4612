/* Labels of datasets in memory: each stored labels file grouped by class (sl_sample_labels) once,
 * shared by every job of the dataset across epochs, and freed when the last job lets go. Loop
 * thread only.
 *
 * A labels file holds one u32 little-endian class id per sample; it is read through the store
 * (no symbolic link is followed) and must have the size and the checksum the catalog records.
 * Reading is O(N) and runs on the loop thread when a job is created or loaded; the file is read
 * in bounded pieces and held once per dataset (4 bytes per sample plus 8 per class).
 */
#include "internal.h"

#include "err.h"
#include "shard/shard.h"
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define READ_PIECE (1u << 20)

struct flabels {
    int refs;
    char dataset[SL_CAT_FEED_NAME_MAX + 1];
    char sha256[65];
    sl_sample_labels *l;
    flabels *next;
};

/* Read the n labels of fd, hashing them; the checksum must be `sha256`. */
static int read_labels(uint32_t *v, int fd, uint64_t n, const char *sha256, char *msg, size_t len)
{
    char hex[SL_SHARD_HEX_LEN + 1];
    uint8_t *buf = malloc(READ_PIECE);
    sl_sha256 *h = NULL;
    uint64_t done = 0;
    int err = buf ? sl_sha256_new(&h) : -ENOMEM;

    if (!err)
        err = sl_sha256_reset(h);
    while (!err && done < n) {
        size_t want = (n - done) * 4 < READ_PIECE ? (size_t)(n - done) * 4 : READ_PIECE;
        ssize_t got = pread(fd, buf, want, (off_t)(done * 4));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0 || (size_t)got % 4) {
            err = got < 0 ? -errno : SL_ECORRUPT;
            break;
        }
        err = sl_sha256_update(h, buf, (size_t)got);
        for (size_t i = 0; !err && i < (size_t)got / 4; i++)
            v[done + i] = (uint32_t)buf[4 * i] | (uint32_t)buf[4 * i + 1] << 8 |
                          (uint32_t)buf[4 * i + 2] << 16 | (uint32_t)buf[4 * i + 3] << 24;
        done += (size_t)got / 4;
    }
    if (!err && (err = sl_sha256_final(h, hex)) == 0 && strcmp(hex, sha256) != 0)
        err = SL_ECORRUPT;
    if (err)
        snprintf(msg, len, "labels file: %s",
                 err == SL_ECORRUPT ? "checksum differs from the catalog's" : sl_strerror(err));
    sl_sha256_free(h);
    free(buf);
    return err;
}

int feed_labels_read(sl_sample_labels **out, int fd, uint64_t n, const char *sha256, char *msg,
                     size_t len)
{
    uint32_t *v = NULL;
    struct stat st;
    int err;

    *out = NULL;
    /* The size first: a count from the catalog is trusted only as far as the file bears it out,
     * so nothing is allocated for a file that cannot hold it. */
    if (fstat(fd, &st) != 0) {
        err = -errno;
        snprintf(msg, len, "labels file: %s", sl_strerror(err));
        return err;
    }
    if (n == 0 || n > SL_SAMPLE_MAX_N || n > SIZE_MAX / 4 || (uint64_t)st.st_size != n * 4) {
        snprintf(msg, len, "labels file has %lld bytes, not %llu (4 per sample)",
                 (long long)st.st_size, n > UINT64_MAX / 4 ? 0ull : (unsigned long long)n * 4);
        return SL_ECORRUPT;
    }
    if (!(v = malloc((size_t)n * 4))) {
        snprintf(msg, len, "out of memory for %llu labels", (unsigned long long)n);
        return -ENOMEM;
    }
    err = read_labels(v, fd, n, sha256, msg, len);
    if (!err)
        err = sl_sample_labels_new(out, v, n, msg, len);
    free(v);
    return err;
}

/* Load the labels file of dataset d (which has labels). */
static int load(sl_sample_labels **out, sl_feed *f, const sl_cat_dataset *d, char *msg, size_t len)
{
    char path[4300], why[256];
    int fd, err = feed_labels_path(f, d->name, path, sizeof(path));

    if (err) {
        snprintf(msg, len, "labels path of dataset '%s' too long", d->name);
        return err;
    }
    fd = sl_store_open(path, O_RDONLY, 0);
    if (fd < 0) {
        snprintf(msg, len, "cannot open the labels of dataset '%s': %s", d->name,
                 sl_store_strerror(fd));
        return fd;
    }
    if ((err = feed_labels_read(out, fd, d->samples, d->labels_sha256, why, sizeof(why))) != 0)
        snprintf(msg, len, "dataset '%s': %s", d->name, why);
    close(fd);
    return err;
}

int feed_labels_get(flabels **out, sl_feed *f, const char *dataset, char *msg, size_t len)
{
    flabels *fl;
    sl_cat_dataset d;
    int err = sl_cat_dataset_get(f->cat, &d, dataset);

    *out = NULL;
    if (err) {
        snprintf(msg, len, "dataset '%s': %s", dataset, sl_strerror(err));
        return err;
    }
    if (!d.has_labels) {
        snprintf(msg, len, "dataset '%s' has no labels (upload them with `sluice dataset labels`)",
                 dataset);
        return SL_ESTATE;
    }
    for (fl = f->labels; fl; fl = fl->next)
        if (strcmp(fl->dataset, dataset) == 0 && strcmp(fl->sha256, d.labels_sha256) == 0) {
            fl->refs++;
            *out = fl;
            return 0;
        }
    if (!(fl = calloc(1, sizeof(*fl)))) {
        snprintf(msg, len, "out of memory");
        return -ENOMEM;
    }
    if ((err = load(&fl->l, f, &d, msg, len)) != 0) {
        free(fl);
        return err;
    }
    fl->refs = 1;
    snprintf(fl->dataset, sizeof(fl->dataset), "%s", dataset);
    snprintf(fl->sha256, sizeof(fl->sha256), "%s", d.labels_sha256);
    fl->next = f->labels;
    f->labels = fl;
    *out = fl;
    return 0;
}

const sl_sample_labels *flabels_of(const flabels *fl)
{
    return fl ? fl->l : NULL;
}

flabels *flabels_ref(flabels *fl)
{
    if (fl)
        fl->refs++;
    return fl;
}

void flabels_unref(sl_feed *f, flabels *fl)
{
    flabels **pp = &f->labels;

    if (!fl || --fl->refs > 0)
        return;
    while (*pp && *pp != fl)
        pp = &(*pp)->next;
    if (*pp)
        *pp = fl->next;
    sl_sample_labels_free(fl->l);
    free(fl);
}

int feed_spec_wants_labels(const Sluice__V1__Job *spec)
{
    return spec->stratify || spec->balance_classes || spec->n_class_weights;
}
