/* Checkpoint file names and paths in the store. See layout.h. */
#include "layout.h"

#include "store.h"

#include "err.h"
#include "shard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARD_SUFFIX ".shard"
#define PART_SUFFIX  ".shard.part"
#define META_SUFFIX  ".metadata.json"

int sl_store_job_dir(char *buf, size_t len, const char *root, const char *job)
{
    int n = snprintf(buf, len, "%s/%s", root, job);

    return n < 0 || (size_t)n >= len ? SL_ELIMIT : 0;
}

int sl_store_file_name(char *file, size_t len, sl_store_kind kind, const char *name, int32_t rank)
{
    int n;

    switch (kind) {
    case SL_STORE_SHARD:
        n = snprintf(file, len, "%s_shard_%d" SHARD_SUFFIX, name, rank);
        break;
    case SL_STORE_PART:
        n = snprintf(file, len, ".%s_shard_%d" PART_SUFFIX, name, rank);
        break;
    case SL_STORE_META:
        n = snprintf(file, len, "%s" META_SUFFIX, name);
        break;
    case SL_STORE_TEMP:
        n = snprintf(file, len, ".%s" META_SUFFIX ".tmp", name);
        break;
    default:
        return SL_EINVAL;
    }
    return n < 0 || (size_t)n >= len ? SL_ELIMIT : 0;
}

int sl_store_path(char *buf, size_t len, const char *dir, sl_store_kind kind, const char *name,
                  int32_t rank)
{
    char file[NAME_MAX + 1];
    int n, err = sl_store_file_name(file, sizeof(file), kind, name, rank);

    if (err)
        return err;
    n = snprintf(buf, len, "%s/%s", dir, file);
    return n < 0 || (size_t)n >= len ? SL_ELIMIT : 0;
}

static int ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);

    return n > k && strcmp(s + n - k, suffix) == 0;
}

/* Split "<name>_shard_<rank><suffix>" into name and rank (the last "_shard_" counts, so a name
 * may contain "_shard_" itself). Returns 0 or SL_EINVAL. */
static int parse_shard(const char *file, const char *suffix, char *name, size_t len, int32_t *rank)
{
    size_t n = strlen(file), sl = strlen(suffix);
    const char *end, *mark = NULL, *p;
    char *stop;
    long r;

    if (!ends_with(file, n, suffix))
        return SL_EINVAL;
    end = file + n - sl;
    for (p = file; (p = strstr(p, "_shard_")) != NULL && p < end; p++)
        mark = p;
    if (!mark || mark == file || (size_t)(mark - file) >= len)
        return SL_EINVAL;
    errno = 0;
    r = strtol(mark + 7, &stop, 10);
    if (stop != end || mark + 7 == end || errno || r < 0 || r > SL_SHARD_MAX_RANK)
        return SL_EINVAL;
    memcpy(name, file, (size_t)(mark - file));
    name[mark - file] = '\0';
    *rank = (int32_t)r;
    return 0;
}

int sl_store_part_name(char *file, size_t len, const char *name, int32_t rank, int64_t gen)
{
    int n;

    if (gen <= 0)
        return sl_store_file_name(file, len, SL_STORE_PART, name, rank);
    n = snprintf(file, len, ".%s_shard_%d" SHARD_SUFFIX ".%lld.part", name, rank, (long long)gen);
    return n < 0 || (size_t)n >= len ? SL_ELIMIT : 0;
}

/* A partial upload's name past its leading '.': "<name>_shard_<rank>.shard.part" (generation 0)
 * or "<name>_shard_<rank>.shard.<gen>.part". Returns 0 or SL_EINVAL. */
static int parse_part(const char *file, char *name, size_t len, int32_t *rank, int64_t *gen)
{
    char base[NAME_MAX + 1], *dot, *stop;
    size_t n = strlen(file);
    long long g;

    *gen = 0;
    if (parse_shard(file, PART_SUFFIX, name, len, rank) == 0)
        return 0;
    if (n >= sizeof(base) || !ends_with(file, n, ".part"))
        return SL_EINVAL;
    memcpy(base, file, n - 5);
    base[n - 5] = '\0';
    if (!(dot = strrchr(base, '.')) || dot[1] < '1' || dot[1] > '9')
        return SL_EINVAL;
    errno = 0;
    g = strtoll(dot + 1, &stop, 10);
    if (*stop || errno || g <= 0)
        return SL_EINVAL;
    *dot = '\0';
    if (parse_shard(base, SHARD_SUFFIX, name, len, rank) != 0)
        return SL_EINVAL;
    *gen = g;
    return 0;
}

sl_store_kind sl_store_classify_gen(const char *file, char *name, size_t len, int32_t *rank,
                                    int64_t *gen)
{
    size_t n = strlen(file), k = sizeof(META_SUFFIX) - 1;

    *gen = 0;
    if (file[0] == '.')
        return parse_part(file + 1, name, len, rank, gen) == 0 ? SL_STORE_PART : SL_STORE_TEMP;
    if (parse_shard(file, SHARD_SUFFIX, name, len, rank) == 0)
        return SL_STORE_SHARD;
    if (!ends_with(file, n, META_SUFFIX) || n - k >= len)
        return SL_STORE_OTHER;
    memcpy(name, file, n - k);
    name[n - k] = '\0';
    return SL_STORE_META;
}

sl_store_kind sl_store_classify(const char *file, char *name, size_t len, int32_t *rank)
{
    int64_t gen;

    return sl_store_classify_gen(file, name, len, rank, &gen);
}

int sl_store_parts_each(const char *dir, const char *name, int32_t rank, sl_store_part_fn fn,
                        void *arg)
{
    char found[NAME_MAX + 1], path[PATH_MAX];
    struct dirent *e;
    int32_t r;
    int64_t gen;
    DIR *d;
    int n, err = sl_store_opendir(&d, dir);

    if (err)
        return err == -ENOENT ? 0 : err;
    while (!err && (e = readdir(d)) != NULL) {
        if (sl_store_classify_gen(e->d_name, found, sizeof(found), &r, &gen) != SL_STORE_PART ||
            strcmp(found, name) != 0 || (rank >= 0 ? r != rank : r >= -rank))
            continue;
        n = snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (n > 0 && (size_t)n < sizeof(path))
            err = fn(path, r, gen, arg);
    }
    closedir(d);
    return err;
}

static void remove_one(const char *dir, sl_store_kind kind, const char *name, int32_t rank)
{
    char path[PATH_MAX];

    if (sl_store_path(path, sizeof(path), dir, kind, name, rank) == 0)
        sl_store_unlink(path);
}

static int unlink_part(const char *path, int32_t rank, int64_t gen, void *arg)
{
    (void)rank;
    (void)gen;
    (void)arg;
    sl_store_unlink(path);
    return 0;
}

int sl_store_remove_ckpt(const char *dir, const char *name, int32_t world_size)
{
    for (int32_t r = 0; r < world_size; r++)
        remove_one(dir, SL_STORE_SHARD, name, r);
    /* Partial uploads of every attempt (each names its own by its lease generation). */
    sl_store_parts_each(dir, name, -world_size, unlink_part, NULL);
    remove_one(dir, SL_STORE_META, name, 0);
    remove_one(dir, SL_STORE_TEMP, name, 0);
    return sl_store_fsync_dir(dir);
}

int sl_store_part_held(const char *path, int32_t rank, uint64_t *held)
{
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    sl_shard_header h;
    struct stat st;
    int err = SL_ENOTFOUND, fd = sl_store_open(path, O_RDONLY, 0);

    if (fd < 0)
        return SL_ENOTFOUND;
    if (fstat(fd, &st) == 0 && sl_store_pread_all(fd, hdr, sizeof(hdr), 0) == 0 &&
        sl_shard_header_decode(&h, hdr, sizeof(hdr)) == 0 && h.rank == rank &&
        (uint64_t)st.st_size >= SL_SHARD_HEADER_SIZE) {
        uint64_t n = (uint64_t)st.st_size - SL_SHARD_HEADER_SIZE;
        *held = n < h.data_len ? n : h.data_len;
        err = 0;
    }
    close(fd);
    return err;
}
