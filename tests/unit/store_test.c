/* server/store/: durable writes, rename without replacing, sweeps, the positional I/O helpers,
 * the checkpoint layout (paths, file classification, removal of a checkpoint's files, what a
 * partial upload holds), and paths resolved without following a symbolic link, through openat2
 * and through the fallback walk (also with openat2 filtered out by seccomp, as some container
 * runtimes do). Every test works in its own temporary directory. */
#include "store/layout.h"
#include "store/store.h"

#include "err.h"
#include "shard.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static char root[] = "/tmp/store-test-XXXXXX";

/* root/<name> into buf. */
static const char *at(char *buf, size_t len, const char *name)
{
    if ((size_t)snprintf(buf, len, "%s/%s", root, name) >= len)
        buf[0] = '\0';
    return buf;
}

/* dir/name into buf (PATH_MAX bytes). */
static const char *in(char *buf, const char *dir, const char *name)
{
    if (snprintf(buf, PATH_MAX, "%s/%s", dir, name) >= PATH_MAX)
        buf[0] = '\0';
    return buf;
}

static int exists(const char *path)
{
    struct stat st;

    return lstat(path, &st) == 0;
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* The file's content (up to 255 bytes) into buf; "" if it cannot be read. */
static const char *content(char *buf, size_t len, const char *path)
{
    FILE *f = fopen(path, "r");
    size_t n = 0;

    if (f) {
        n = fread(buf, 1, len - 1, f);
        fclose(f);
    }
    buf[n] = '\0';
    return buf;
}

static void test_mkdirs(void)
{
    char p[PATH_MAX], q[PATH_MAX];
    struct stat st;

    CHECK(sl_store_mkdirs(at(p, sizeof(p), "a/b/c")) == 0);
    CHECK(stat(p, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0750);
    CHECK(sl_store_mkdirs(p) == 0); /* exists: fine */
    CHECK(sl_store_mkdirs(at(q, sizeof(q), "a/b/c/")) == 0);
    CHECK(sl_store_fsync_dir(p) == 0);
    CHECK(sl_store_fsync_dir(at(p, sizeof(p), "missing")) == -ENOENT);
    put(at(p, sizeof(p), "afile"), "x");
    CHECK(sl_store_mkdirs(at(p, sizeof(p), "afile/sub")) == -ENOTDIR);
    CHECK(sl_store_mkdirs("") == -ENAMETOOLONG);
    /* One directory alone: made with its mode, never over anything (a link included). */
    CHECK(sl_store_mkdir(at(p, sizeof(p), "a/one"), 0700) == 0);
    CHECK(stat(p, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
    CHECK(sl_store_mkdir(p, 0700) == -EEXIST);
    CHECK(symlink(at(q, sizeof(q), "a/elsewhere"), at(p, sizeof(p), "a/linked")) == 0);
    CHECK(sl_store_mkdir(p, 0700) == -EEXIST);
    CHECK(lstat(q, &st) != 0 && errno == ENOENT);
    CHECK(sl_store_mkdir(at(p, sizeof(p), "missing/one"), 0700) == -ENOENT);
    {
        char *long_path = malloc(PATH_MAX + 16);
        memset(long_path, 'a', PATH_MAX + 15);
        long_path[0] = '/';
        long_path[PATH_MAX + 15] = '\0';
        CHECK(sl_store_mkdirs(long_path) == -ENAMETOOLONG);
        free(long_path);
    }
}

static void test_rename_and_write(void)
{
    char a[PATH_MAX], b[PATH_MAX], d[PATH_MAX], buf[256];

    put(at(a, sizeof(a), "from"), "new");
    put(at(b, sizeof(b), "to"), "old");
    CHECK(sl_store_rename_noreplace(a, b) == -EEXIST);
    CHECK(exists(a) && strcmp(content(buf, sizeof(buf), b), "old") == 0);
    CHECK(unlink(b) == 0);
    CHECK(sl_store_rename_noreplace(a, b) == 0);
    CHECK(!exists(a) && strcmp(content(buf, sizeof(buf), b), "new") == 0);
    CHECK(sl_store_rename_noreplace(a, b) == -ENOENT);

    /* write_file replaces an existing file and leaves no temp file behind. */
    CHECK(sl_store_mkdirs(at(d, sizeof(d), "w")) == 0);
    CHECK(sl_store_write_file(d, "doc.json", "{}", 2) == 0);
    CHECK(sl_store_write_file(d, "doc.json", "[1,2]", 5) == 0);
    in(a, d, "doc.json");
    CHECK(strcmp(content(buf, sizeof(buf), a), "[1,2]") == 0);
    in(a, d, ".doc.json.tmp");
    CHECK(!exists(a));
    CHECK(sl_store_write_file(d, "empty", "", 0) == 0);
    /* A directory that does not exist: an error, and nothing is left. */
    CHECK(sl_store_write_file(at(a, sizeof(a), "nodir"), "x", "1", 1) == -ENOENT);
    CHECK(!exists(a));

    CHECK(sl_store_remove(d, "doc.json") == 0);
    CHECK(sl_store_remove(d, "doc.json") == 0); /* missing: not an error */
    in(a, d, "doc.json");
    CHECK(!exists(a));
}

static void test_free_and_same_file(void)
{
    char p[PATH_MAX], q[PATH_MAX];
    uint64_t free_bytes = 0;
    int fd;

    CHECK(sl_store_free_bytes(root, &free_bytes) == 0 && free_bytes > 0);
    CHECK(sl_store_free_bytes(at(p, sizeof(p), "missing"), &free_bytes) == -ENOENT);

    /* A lock file stays "the same" until its path names another file or nothing. */
    fd = open(at(p, sizeof(p), "LOCK"), O_RDWR | O_CREAT | O_CLOEXEC, 0640);
    CHECK(fd >= 0);
    CHECK(sl_store_same_file(fd, p) == 1);
    CHECK(sl_store_same_file(fd, at(q, sizeof(q), "afile")) == 0);
    CHECK(unlink(p) == 0);
    CHECK(sl_store_same_file(fd, p) == 0);
    put(p, "");
    CHECK(sl_store_same_file(fd, p) == 0);
    CHECK(sl_store_same_file(fd, at(q, sizeof(q), "afile/LOCK")) == 0); /* ENOTDIR */
    close(fd);
    CHECK(sl_store_same_file(fd, p) == -EBADF);
}

/* Keep every file whose name does not start with "drop". */
static int keep_not_drop(const char *name, const struct stat *st, void *arg)
{
    int *calls = arg;

    (*calls)++;
    return strncmp(name, "drop", 4) != 0;
}

static void test_sweep(void)
{
    char d[PATH_MAX], p[PATH_MAX];
    int removed = -1, calls = 0;

    CHECK(sl_store_mkdirs(at(d, sizeof(d), "sweep/subdir")) == 0);
    at(d, sizeof(d), "sweep");
    in(p, d, ".temp");
    put(p, "t");
    in(p, d, "keep");
    put(p, "k");
    in(p, d, "drop1");
    put(p, "d");
    in(p, d, ".dropdir");
    CHECK(mkdir(p, 0750) == 0);
    in(p, d, "droplink");
    CHECK(symlink("keep", p) == 0);

    /* Without a callback: regular files starting with '.' go; directories and links stay. */
    CHECK(sl_store_sweep(d, NULL, NULL, &removed) == 0);
    CHECK(removed == 1);
    in(p, d, ".temp");
    CHECK(!exists(p));
    in(p, d, ".dropdir");
    CHECK(exists(p));

    /* With one: it sees regular files only (keep, drop1) and decides. */
    CHECK(sl_store_sweep(d, keep_not_drop, &calls, &removed) == 0);
    CHECK(removed == 1 && calls == 2);
    in(p, d, "drop1");
    CHECK(!exists(p));
    in(p, d, "droplink");
    CHECK(exists(p));
    in(p, d, "keep");
    CHECK(exists(p));

    CHECK(sl_store_sweep(at(p, sizeof(p), "missing"), NULL, NULL, &removed) == 0 && removed == 0);
    CHECK(sl_store_sweep(d, NULL, NULL, NULL) == 0);
}

static void test_positional_io(void)
{
    enum { N = 3000 }; /* more ranges than IOV_MAX (1024) */
    static char parts[N][3];
    struct iovec iov[N];
    char p[PATH_MAX], *back = malloc(3 * N);
    int fd;

    for (int i = 0; i < N; i++) {
        snprintf(parts[i], sizeof(parts[i]), "%02d", i % 100);
        iov[i].iov_base = parts[i];
        iov[i].iov_len = (size_t)(i % 3); /* 0, 1 or 2 bytes: empty ranges too */
    }
    fd = open(at(p, sizeof(p), "io"), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    CHECK(fd >= 0 && back != NULL);
    CHECK(sl_store_pwrite_all(fd, "HEAD", 4, 0) == 0);
    CHECK(sl_store_pwritev_all(fd, iov, N, 4) == 0);
    {
        size_t off = 0, total = 0;
        for (int i = 0; i < N; i++)
            total += iov[i].iov_len;
        CHECK(sl_store_pread_all(fd, back, total, 4) == 0);
        for (int i = 0; i < N && back; i++) {
            CHECK(memcmp(back + off, parts[i], iov[i].iov_len) == 0);
            off += iov[i].iov_len;
        }
        /* Reading past the end is a premature end of file, not a short read. */
        CHECK(sl_store_pread_all(fd, back, 8, 4 + total - 4) == -EIO);
    }
    CHECK(sl_store_pread_all(fd, back, 4, 0) == 0 && memcmp(back, "HEAD", 4) == 0);
    CHECK(sl_store_pwritev_all(fd, iov, 0, 0) == 0);
    close(fd);
    CHECK(sl_store_pwrite_all(fd, "x", 1, 0) == -EBADF);
    CHECK(sl_store_pread_all(fd, back, 1, 0) == -EBADF);
    free(back);
}

static void test_paths(void)
{
    char buf[PATH_MAX], small[16];

    CHECK(sl_store_job_dir(buf, sizeof(buf), "/data/checkpoints", "job") == 0 &&
          strcmp(buf, "/data/checkpoints/job") == 0);
    CHECK(sl_store_job_dir(small, sizeof(small), "/data/checkpoints", "job") == SL_ELIMIT);
    CHECK(sl_store_path(buf, sizeof(buf), "/d", SL_STORE_SHARD, "ck", 7) == 0 &&
          strcmp(buf, "/d/ck_shard_7.shard") == 0);
    CHECK(sl_store_path(buf, sizeof(buf), "/d", SL_STORE_PART, "ck", 0) == 0 &&
          strcmp(buf, "/d/.ck_shard_0.shard.part") == 0);
    CHECK(sl_store_path(buf, sizeof(buf), "/d", SL_STORE_META, "ck", 3) == 0 &&
          strcmp(buf, "/d/ck.metadata.json") == 0);
    CHECK(sl_store_path(buf, sizeof(buf), "/d", SL_STORE_TEMP, "ck", 0) == 0 &&
          strcmp(buf, "/d/.ck.metadata.json.tmp") == 0);
    CHECK(sl_store_path(buf, sizeof(buf), "/d", SL_STORE_OTHER, "ck", 0) == SL_EINVAL);
    CHECK(sl_store_path(small, sizeof(small), "/d", SL_STORE_SHARD, "checkpoint", 0) == SL_ELIMIT);
    {
        /* A file name over NAME_MAX is refused even when the path buffer is large. */
        char longname[300];
        memset(longname, 'n', sizeof(longname) - 1);
        longname[sizeof(longname) - 1] = '\0';
        CHECK(sl_store_path(buf, sizeof(buf), "/d", SL_STORE_META, longname, 0) == SL_ELIMIT);
    }
}

static void test_part_names(void)
{
    char file[NAME_MAX + 1], name[64];
    int32_t rank = -1;
    int64_t gen = -1;

    CHECK(sl_store_part_name(file, sizeof(file), "ck", 3, 0) == 0 &&
          strcmp(file, ".ck_shard_3.shard.part") == 0);
    CHECK(sl_store_part_name(file, sizeof(file), "ck", 3, 9007199254740993LL) == 0 &&
          strcmp(file, ".ck_shard_3.shard.9007199254740993.part") == 0);
    CHECK(sl_store_classify_gen(file, name, sizeof(name), &rank, &gen) == SL_STORE_PART);
    CHECK(strcmp(name, "ck") == 0 && rank == 3 && gen == 9007199254740993LL);
    CHECK(sl_store_classify_gen(".ck_shard_3.shard.part", name, sizeof(name), &rank, &gen) ==
              SL_STORE_PART &&
          gen == 0);
    CHECK(sl_store_part_name(file, 8, "ck", 3, 5) == SL_ELIMIT);
}

static void test_classify(void)
{
    static const struct {
        const char *file;
        sl_store_kind kind;
        const char *name;
        int32_t rank;
    } cases[] = {
        {"ck_shard_3.shard", SL_STORE_SHARD, "ck", 3},
        {"a_shard_b_shard_65535.shard", SL_STORE_SHARD, "a_shard_b", 65535},
        {".ck_shard_0.shard.part", SL_STORE_PART, "ck", 0},
        {".ck_shard_2.shard.17.part", SL_STORE_PART, "ck", 2}, /* an attempt's own (gen 17) */
        {".ck_shard_2.shard.0.part", SL_STORE_TEMP, NULL, -1}, /* generations start at 1 */
        {".ck_shard_2.shard.x.part", SL_STORE_TEMP, NULL, -1},
        {".ck_shard_2.shard.-3.part", SL_STORE_TEMP, NULL, -1},
        {".ck_shard_2.17.part", SL_STORE_TEMP, NULL, -1},
        {"ck.metadata.json", SL_STORE_META, "ck", -1},
        {".ck.metadata.json.tmp", SL_STORE_TEMP, NULL, -1},
        {".anything", SL_STORE_TEMP, NULL, -1},
        {".ck_shard_65536.shard.part", SL_STORE_TEMP, NULL, -1}, /* rank out of range */
        {"ck_shard_65536.shard", SL_STORE_OTHER, NULL, -1},
        {"ck_shard_-1.shard", SL_STORE_OTHER, NULL, -1},
        {"ck_shard_.shard", SL_STORE_OTHER, NULL, -1},
        {"ck_shard_1x.shard", SL_STORE_OTHER, NULL, -1},
        {"_shard_1.shard", SL_STORE_OTHER, NULL, -1},        /* no name */
        {"ck_shard_1.shard.part", SL_STORE_OTHER, NULL, -1}, /* a part without its dot */
        {".metadata.json", SL_STORE_TEMP, NULL, -1},
        {"metadata.json", SL_STORE_OTHER, NULL, -1},
        {"catalog.db", SL_STORE_OTHER, NULL, -1},
        {"LOCK", SL_STORE_OTHER, NULL, -1},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char name[64] = "";
        int32_t rank = -1;
        sl_store_kind k = sl_store_classify(cases[i].file, name, sizeof(name), &rank);
        if (k != cases[i].kind) {
            fprintf(stderr, "classify %s: kind %d, expected %d\n", cases[i].file, k, cases[i].kind);
            failures++;
            continue;
        }
        if (cases[i].name)
            CHECK(strcmp(name, cases[i].name) == 0);
        if (cases[i].rank >= 0)
            CHECK(rank == cases[i].rank);
    }
    {
        /* A name that does not fit the caller's buffer is not a checkpoint file. */
        char name[4];
        int32_t rank;
        CHECK(sl_store_classify("long_shard_1.shard", name, sizeof(name), &rank) == SL_STORE_OTHER);
        CHECK(sl_store_classify("long.metadata.json", name, sizeof(name), &rank) == SL_STORE_OTHER);
        CHECK(sl_store_classify(".long_shard_1.shard.part", name, sizeof(name), &rank) ==
              SL_STORE_TEMP);
        CHECK(sl_store_classify("abc.metadata.json", name, sizeof(name), &rank) == SL_STORE_META &&
              strcmp(name, "abc") == 0);
    }
}

static void test_remove_ckpt(void)
{
    static const char *const files[] = {
        "ck_shard_0.shard",
        ".ck_shard_0.shard.part",
        "ck_shard_2.shard",
        ".ck_shard_1.shard.part",
        "ck.metadata.json",
        ".ck.metadata.json.tmp",
        ".ck_shard_2.shard.5.part",
        ".ck_shard_0.shard.77.part",
        "ck_shard_3.shard",
        "other_shard_0.shard",
        "ck2.metadata.json",
        ".ck_shard_3.shard.6.part",
        ".other_shard_0.shard.8.part",
    };
    char d[PATH_MAX], p[PATH_MAX];

    CHECK(sl_store_mkdirs(at(d, sizeof(d), "ckpts/job")) == 0);
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        in(p, d, files[i]);
        put(p, "x");
    }
    /* World size 3: ranks 0..2; a rank-3 file is not this checkpoint's and stays. */
    CHECK(sl_store_remove_ckpt(d, "ck", 3) == 0);
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        int stays = i >= 8;
        in(p, d, files[i]);
        if (exists(p) != stays) {
            fprintf(stderr, "remove_ckpt: %s %s\n", files[i], stays ? "removed" : "left");
            failures++;
        }
    }
    CHECK(sl_store_remove_ckpt(d, "ck", 3) == 0); /* nothing left: fine */
    CHECK(sl_store_remove_ckpt(at(p, sizeof(p), "ckpts/nojob"), "ck", 1) == -ENOENT);
}

/* A partial upload file: header for (rank, data_len), then `have` data bytes. */
static void put_part(const char *path, int32_t rank, uint64_t data_len, size_t have)
{
    uint8_t hdr[SL_SHARD_HEADER_SIZE];
    sl_shard_header h;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);

    memset(&h, 0, sizeof(h));
    h.rank = rank;
    memset(h.sha256, '0', SL_SHARD_HEX_LEN);
    h.data_len = data_len;
    sl_shard_header_encode(hdr, &h);
    CHECK(fd >= 0);
    CHECK(sl_store_pwrite_all(fd, hdr, sizeof(hdr), 0) == 0);
    for (size_t i = 0; i < have; i++)
        CHECK(sl_store_pwrite_all(fd, "d", 1, sizeof(hdr) + i) == 0);
    close(fd);
}

static void test_part_held(void)
{
    char p[PATH_MAX];
    uint64_t held = 99;

    at(p, sizeof(p), ".ck_shard_1.shard.part");
    CHECK(sl_store_part_held(p, 1, &held) == SL_ENOTFOUND && held == 99);
    put_part(p, 1, 100, 40);
    CHECK(sl_store_part_held(p, 1, &held) == 0 && held == 40);
    CHECK(sl_store_part_held(p, 2, &held) == SL_ENOTFOUND); /* another rank's header */
    put_part(p, 1, 10, 25);                                 /* more bytes than declared: capped */
    CHECK(sl_store_part_held(p, 1, &held) == 0 && held == 10);
    put_part(p, 1, 100, 0);
    CHECK(sl_store_part_held(p, 1, &held) == 0 && held == 0);
    put(p, "short"); /* no header */
    CHECK(sl_store_part_held(p, 1, &held) == SL_ENOTFOUND);
}

/* sl_store_open or its fallback walk, as a test picks. */
typedef int (*open_fn)(const char *path, int flags, mode_t mode);

/* Every way the store opens `p` (a path with a link at one component) fails with -ELOOP, and
 * `victim` (what the link leads to) keeps its content "data". */
static void refused(open_fn open_path, const char *p, const char *victim, int last)
{
    char buf[256];
    static const int flags[] = {
        O_RDONLY, O_RDWR | O_CREAT,    O_WRONLY | O_CREAT | O_TRUNC, O_RDONLY | O_DIRECTORY,
        O_PATH,   O_PATH | O_DIRECTORY};
    struct stat st;

    for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
        int fd = open_path(p, flags[i], 0640);
        if (fd != -ELOOP) {
            fprintf(stderr, "%s with flags %#x: %d, not -ELOOP\n", p, flags[i], fd);
            failures++;
        }
        if (fd >= 0)
            close(fd);
    }
    CHECK(strcmp(content(buf, sizeof(buf), victim), "data") == 0);
    /* Operations on the name: through a link on the way they fail; a link as the last component
     * is acted on as itself (create replaces the link with a new file), never its target. */
    if (!last) {
        CHECK(sl_store_stat(p, &st) == -ELOOP);
        CHECK(sl_store_unlink(p) == -ELOOP);
        CHECK(sl_store_create(p, 0640) == -ELOOP);
    } else {
        CHECK(sl_store_stat(p, &st) == 0 && S_ISLNK(st.st_mode));
        int fd = sl_store_create(p, 0640);
        CHECK(fd >= 0);
        if (fd >= 0) {
            CHECK(write(fd, "new", 3) == 3);
            close(fd);
        }
        CHECK(lstat(p, &st) == 0 && S_ISREG(st.st_mode));
        CHECK(sl_store_unlink(p) == 0 && !exists(p));
    }
    CHECK(strcmp(content(buf, sizeof(buf), victim), "data") == 0);
}

/* A link at each component of <root>/links/<k>/a/b/f, to the same component of <root>/real. */
static void test_no_links(open_fn open_path, const char *label)
{
    static const char *const comps[] = {"a", "b", "f"};
    char p[PATH_MAX], to[PATH_MAX], q[PATH_MAX], r[PATH_MAX], victim[PATH_MAX], buf[256];
    uint64_t free_bytes;
    DIR *d;
    int fd;

    fprintf(stderr, "test_no_links: %s\n", label);
    CHECK(sl_store_mkdirs(at(p, sizeof(p), "real/a/b")) == 0);
    put(at(victim, sizeof(victim), "real/a/b/f"), "data");
    /* Without links: opened, created, read back. */
    fd = open_path(victim, O_RDONLY, 0);
    CHECK(fd >= 0 && read(fd, buf, 4) == 4 && memcmp(buf, "data", 4) == 0);
    if (fd >= 0)
        close(fd);
    fd = open_path(at(p, sizeof(p), "real/a/b/new"), O_RDWR | O_CREAT, 0640);
    CHECK(fd >= 0);
    if (fd >= 0)
        close(fd);
    CHECK(unlink(p) == 0);
    fd = open_path(at(p, sizeof(p), "real/a/"), O_RDONLY | O_DIRECTORY, 0);
    CHECK(fd >= 0);
    if (fd >= 0)
        close(fd);
    fd = open_path("/", O_PATH | O_DIRECTORY, 0);
    CHECK(fd >= 0);
    if (fd >= 0)
        close(fd);

    /* The link at component k (0: a, 1: b, 2: f), the components before it directories. */
    for (int k = 0; k < 3; k++) {
        snprintf(q, sizeof(q), "links/%d", k);
        CHECK(sl_store_mkdirs(at(p, sizeof(p), q)) == 0);
        at(to, sizeof(to), "real");
        for (int i = 0; i <= k; i++) {
            size_t n = strlen(p), m = strlen(to);
            snprintf(p + n, sizeof(p) - n, "/%s", comps[i]);
            snprintf(to + m, sizeof(to) - m, "/%s", comps[i]);
            if (i < k)
                CHECK(mkdir(p, 0750) == 0);
        }
        CHECK(symlink(to, p) == 0);
        if (k < 2) {
            /* A linked directory: not listed, synced, made in, written in, renamed into. */
            CHECK(sl_store_opendir(&d, p) == -ELOOP && d == NULL);
            CHECK(sl_store_fsync_dir(p) == -ELOOP);
            CHECK(sl_store_free_bytes(p, &free_bytes) == -ELOOP);
            CHECK(sl_store_mkdirs(in(q, p, "sub")) == -ELOOP);
            CHECK(sl_store_mkdir(in(q, p, "sub"), 0750) == -ELOOP);
            CHECK(sl_store_write_file(p, "m.json", "{}", 2) == -ELOOP);
            CHECK(sl_store_rename_noreplace(victim, in(q, p, "moved")) == -ELOOP);
            CHECK(sl_store_rename(in(q, p, "f"), at(r, sizeof(r), "real/moved")) == -ELOOP);
            CHECK(!exists(in(q, to, "sub")) && !exists(in(q, to, "m.json")) &&
                  !exists(in(q, to, "moved")) && exists(victim));
        }
        for (int i = k + 1; i < 3; i++) {
            size_t n = strlen(p);
            snprintf(p + n, sizeof(p) - n, "/%s", comps[i]);
        }
        refused(open_path, p, victim, k == 2);
    }
    /* A dangling link where a file is to be made: nothing is made at its target. */
    at(p, sizeof(p), "links/dangling");
    CHECK(symlink(at(q, sizeof(q), "real/made"), p) == 0);
    CHECK(open_path(p, O_WRONLY | O_CREAT, 0640) == -ELOOP);
    CHECK(!exists(q));
    {
        char cmd[PATH_MAX + 32];
        snprintf(cmd, sizeof(cmd), "rm -rf %s/links %s/real", root, root);
        CHECK(system(cmd) == 0);
    }
}

/* What else may not be opened: a FIFO (without blocking), a file with another hard link for
 * writing, a file as a directory; O_TRUNC applies to a plain file. */
static void test_file_kinds(open_fn open_path)
{
    char p[PATH_MAX], q[PATH_MAX], buf[256];
    int fd;

    CHECK(mkfifo(at(p, sizeof(p), "fifo"), 0640) == 0);
    CHECK(open_path(p, O_RDONLY, 0) == -ENXIO);
    CHECK(open_path(p, O_RDWR | O_CREAT, 0640) == -ENXIO);
    CHECK(unlink(p) == 0);
    put(at(p, sizeof(p), "victim"), "data");
    CHECK(link(p, at(q, sizeof(q), "hardlink")) == 0);
    CHECK(open_path(q, O_RDWR | O_CREAT | O_TRUNC, 0640) == -EMLINK);
    CHECK(strcmp(content(buf, sizeof(buf), p), "data") == 0);
    fd = open_path(q, O_RDONLY, 0); /* reading is harmless */
    CHECK(fd >= 0);
    if (fd >= 0)
        close(fd);
    CHECK(unlink(q) == 0);
    CHECK(open_path(p, O_RDONLY | O_DIRECTORY, 0) == -ENOTDIR);
    fd = open_path(p, O_WRONLY | O_TRUNC, 0);
    CHECK(fd >= 0 && (fcntl(fd, F_GETFL) & O_NONBLOCK) == 0);
    if (fd >= 0)
        close(fd);
    CHECK(strcmp(content(buf, sizeof(buf), p), "") == 0);
    CHECK(open_path(at(q, sizeof(q), "victim/x"), O_RDONLY, 0) == -ENOTDIR);
    CHECK(open_path(at(q, sizeof(q), "missing/x"), O_RDONLY, 0) == -ENOENT);
    CHECK(unlink(p) == 0);
    CHECK(sl_store_strerror(-ELOOP) != NULL && strstr(sl_store_strerror(-ELOOP), "symbolic link"));
}

/* In a child whose seccomp filter answers openat2 with ENOSYS (as container runtimes' profiles
 * that predate openat2 do), sl_store_open takes the walk: it still opens files and still refuses
 * links. */
static void test_fallback_taken(void)
{
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat2, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof(filter) / sizeof(filter[0]), filter};
    int status = -1;
    pid_t pid = fork();

    CHECK(pid >= 0);
    if (pid == 0) {
        failures = 0; /* the child's own count */
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
            prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
            perror("seccomp");
            _exit(2);
        }
        CHECK(syscall(SYS_openat2, AT_FDCWD, "/", NULL, 0) == -1 && errno == ENOSYS);
        test_no_links(sl_store_open, "sl_store_open, openat2 filtered: the walk");
        test_file_kinds(sl_store_open);
        _exit(failures ? 1 : 0);
    }
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void)
{
    char cmd[64];

    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    test_mkdirs();
    test_rename_and_write();
    test_free_and_same_file();
    test_sweep();
    test_positional_io();
    test_paths();
    test_classify();
    test_part_names();
    test_remove_ckpt();
    test_part_held();
    test_no_links(sl_store_open, "sl_store_open");
    test_no_links(sl_store_open_walk, "sl_store_open_walk");
    test_file_kinds(sl_store_open);
    test_file_kinds(sl_store_open_walk);
    test_fallback_taken();
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "store_test: cannot remove %s\n", root);
    return check_done("store_test");
}
