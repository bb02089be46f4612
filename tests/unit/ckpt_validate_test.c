/* server/ckpt/validate.h: the Checkpoints service's request validation (names, ranks, Begin with
 * its user metadata, UploadShard headers, tensor lists and the JSON they render), with the
 * messages clients see. */
#include "ckpt/validate.h"

#include "catalog/ckpt.h"
#include "err.h"
#include "shard.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* err is `want` and msg is `text` exactly. */
#define CHECK_MSG(err, want, msg, text)                                                            \
    do {                                                                                           \
        CHECK((err) == (want));                                                                    \
        if (strcmp((msg), (text)) != 0) {                                                          \
            fprintf(stderr, "%s:%d: message\n  got  '%s'\n  want '%s'\n", __FILE__, __LINE__,      \
                    (msg), (text));                                                                \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static void test_names_and_rank(void)
{
    char msg[512];
    int err;

    CHECK(sl_ckpt_check_names("job-1", NULL, msg, sizeof(msg)) == 0);
    CHECK(sl_ckpt_check_names("job.a_b", "step_10", msg, sizeof(msg)) == 0);
    err = sl_ckpt_check_names("../etc", "x", msg, sizeof(msg));
    CHECK_MSG(err, SL_EINVAL, msg,
              "job '../etc' is not a valid name (1-128 of [A-Za-z0-9._-], no leading '.', no "
              "'..')");
    err = sl_ckpt_check_names(NULL, NULL, msg, sizeof(msg));
    CHECK_MSG(err, SL_EINVAL, msg,
              "job '' is not a valid name (1-128 of [A-Za-z0-9._-], no leading '.', no '..')");
    err = sl_ckpt_check_names("job", "a/b", msg, sizeof(msg));
    CHECK_MSG(err, SL_EINVAL, msg,
              "checkpoint 'a/b' is not a valid name (1-128 of [A-Za-z0-9._-], no leading '.', no "
              "'..')");
    err = sl_ckpt_check_names("job", "", msg, sizeof(msg));
    CHECK(err == SL_EINVAL);
    {
        /* Long names are quoted up to 200 characters. */
        char name[400], want[512];
        memset(name, 'x', sizeof(name) - 1);
        name[sizeof(name) - 1] = '\0';
        snprintf(want, sizeof(want),
                 "job '%.200s' is not a valid name (1-128 of [A-Za-z0-9._-], no leading '.', no "
                 "'..')",
                 name);
        err = sl_ckpt_check_names(name, NULL, msg, sizeof(msg));
        CHECK_MSG(err, SL_EINVAL, msg, want);
    }

    CHECK(sl_ckpt_check_rank(0, 1, msg, sizeof(msg)) == 0);
    CHECK(sl_ckpt_check_rank(7, 8, msg, sizeof(msg)) == 0);
    err = sl_ckpt_check_rank(8, 8, msg, sizeof(msg));
    CHECK_MSG(err, SL_EINVAL, msg, "rank 8 out of range [0, 8)");
    err = sl_ckpt_check_rank(-1, 8, msg, sizeof(msg));
    CHECK_MSG(err, SL_EINVAL, msg, "rank -1 out of range [0, 8)");
}

static void test_begin(void)
{
    Sluice__V1__BeginRequest r = SLUICE__V1__BEGIN_REQUEST__INIT;
    char name[SL_SHARD_NAME_MAX + 1], msg[512];
    char *big = malloc(SL_CAT_USER_MD_MAX + 2);
    int err;

    r.job = "job";
    r.step = 42;
    r.world_size = 4;
    CHECK(sl_ckpt_check_begin(&r, name, sizeof(name), msg, sizeof(msg)) == 0);
    CHECK(strcmp(name, "step_42") == 0);
    r.name = "best";
    CHECK(sl_ckpt_check_begin(&r, name, sizeof(name), msg, sizeof(msg)) == 0);
    CHECK(strcmp(name, "best") == 0);
    r.name = "";
    r.step = (uint64_t)INT64_MAX;
    CHECK(sl_ckpt_check_begin(&r, name, sizeof(name), msg, sizeof(msg)) == 0);
    CHECK(strcmp(name, "step_9223372036854775807") == 0 && sl_shard_name_check(name) == 0);

    r.step = (uint64_t)INT64_MAX + 1;
    err = sl_ckpt_check_begin(&r, name, sizeof(name), msg, sizeof(msg));
    CHECK_MSG(err, SL_EINVAL, msg, "step 9223372036854775808 is above 9223372036854775807");
    r.step = 1;
    r.name = "..";
    err = sl_ckpt_check_begin(&r, name, sizeof(name), msg, sizeof(msg));
    CHECK(err == SL_EINVAL && strncmp(msg, "checkpoint '..'", 15) == 0);
    r.name = NULL;
    r.job = "a b";
    err = sl_ckpt_check_begin(&r, name, sizeof(name), msg, sizeof(msg));
    CHECK(err == SL_EINVAL && strncmp(msg, "job 'a b'", 9) == 0);
    r.job = "job";
    r.world_size = 0;
    err = sl_ckpt_check_begin(&r, name, sizeof(name), msg, sizeof(msg));
    CHECK_MSG(err, SL_EINVAL, msg, "world_size 0 out of range [1, 65536]");
    r.world_size = SL_CKPT_MAX_WORLD + 1;
    err = sl_ckpt_check_begin(&r, name, sizeof(name), msg, sizeof(msg));
    CHECK_MSG(err, SL_EINVAL, msg, "world_size 65537 out of range [1, 65536]");
    r.world_size = SL_CKPT_MAX_WORLD;
    CHECK(sl_ckpt_check_begin(&r, name, sizeof(name), msg, sizeof(msg)) == 0);

    memset(big, 'm', SL_CAT_USER_MD_MAX + 1);
    big[SL_CAT_USER_MD_MAX + 1] = '\0';
    r.user_metadata = big;
    err = sl_ckpt_check_begin(&r, name, sizeof(name), msg, sizeof(msg));
    CHECK_MSG(err, SL_EINVAL, msg, "user_metadata has 8193 bytes, at most 8192");
    big[SL_CAT_USER_MD_MAX] = '\0';
    CHECK(sl_ckpt_check_begin(&r, name, sizeof(name), msg, sizeof(msg)) == 0);
    r.user_metadata = "caf\xc3";
    err = sl_ckpt_check_begin(&r, name, sizeof(name), msg, sizeof(msg));
    CHECK_MSG(err, SL_EINVAL, msg, "user_metadata is not valid UTF-8");
    r.user_metadata = "caf\xc3\xa9 {\"lr\": 0.1} \xf0\x9f\x98\x80";
    CHECK(sl_ckpt_check_begin(&r, name, sizeof(name), msg, sizeof(msg)) == 0);
    {
        /* Overlong, surrogate, above U+10FFFF, stray continuation, cut short. */
        static const char *const bad[] = {"\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "a\x80",
                                          "\xe2\x82"};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            r.user_metadata = (char *)bad[i];
            err = sl_ckpt_check_begin(&r, name, sizeof(name), msg, sizeof(msg));
            CHECK_MSG(err, SL_EINVAL, msg, "user_metadata is not valid UTF-8");
        }
    }
    free(big);
}

/* A tensor for the tests; `shape` ends with -2. */
static Sluice__V1__TensorInfo tensor(const char *name, const char *dtype, const int64_t *shape,
                                     uint64_t offset, uint64_t size)
{
    Sluice__V1__TensorInfo t = SLUICE__V1__TENSOR_INFO__INIT;

    t.name = (char *)name;
    t.dtype = (char *)dtype;
    t.shape = (int64_t *)shape;
    while (shape && shape[t.n_shape] != -2)
        t.n_shape++;
    t.offset = offset;
    t.size = size;
    return t;
}

/* Check n tensors against data_size; returns the error, msg and (on success) the JSON. */
static int check(Sluice__V1__TensorInfo *v, size_t n, uint64_t data_size, char *msg, size_t len,
                 char **json)
{
    Sluice__V1__TensorInfo *p[8];

    for (size_t i = 0; i < n; i++)
        p[i] = &v[i];
    msg[0] = '\0';
    return sl_ckpt_check_tensors(json, p, n, data_size, msg, len);
}

static void test_tensors(void)
{
    static const int64_t s23[] = {2, 3, -2}, s0[] = {0, 5, -2}, neg[] = {-1, -2},
                         huge[] = {INT64_MAX, INT64_MAX, -2}, scalar[] = {-2};
    char msg[512], *json = NULL;
    Sluice__V1__TensorInfo v[4];
    int err;

    /* Accepted: rendered as the catalog's JSON, names escaped. */
    v[0] = tensor("w", "float32", s23, 0, 24);
    v[1] = tensor("b\"\\", "int8", s23, 24, 6);
    v[2] = tensor("empty", "float64", s0, 10, 0); /* empty tensors may sit anywhere */
    v[3] = tensor("s", "bool", scalar, 30, 1);
    err = check(v, 4, 31, msg, sizeof(msg), &json);
    CHECK(err == 0 && json != NULL);
    if (json)
        CHECK(strcmp(json,
                     "[{\"name\":\"w\",\"dtype\":\"float32\",\"shape\":[2,3],\"offset\":0,\"size\":"
                     "24},{\"name\":\"b\\\"\\\\\",\"dtype\":\"int8\",\"shape\":[2,3],\"offset\":24,"
                     "\"size\":6},{\"name\":\"empty\",\"dtype\":\"float64\",\"shape\":[0,5],"
                     "\"offset\":10,\"size\":0},{\"name\":\"s\",\"dtype\":\"bool\",\"shape\":[],"
                     "\"offset\":30,\"size\":1}]") == 0);
    free(json);
    json = NULL;
    err = check(v, 0, 0, msg, sizeof(msg), &json);
    CHECK(err == 0 && json && strcmp(json, "[]") == 0);
    free(json);

    v[0] = tensor("", "float32", s23, 0, 24);
    err = check(v, 1, 100, msg, sizeof(msg), &json);
    CHECK_MSG(err, SL_EINVAL, msg, "tensor 0: name must have 1..1024 characters");
    CHECK(json == NULL);
    v[0] = tensor("a\tb", "float32", s23, 0, 24);
    err = check(v, 1, 100, msg, sizeof(msg), &json);
    CHECK_MSG(err, SL_EINVAL, msg, "tensor 0: name has a byte 0x09 outside printable ASCII");
    v[0] = tensor("w", "float128", s23, 0, 24);
    err = check(v, 1, 100, msg, sizeof(msg), &json);
    CHECK_MSG(err, SL_EINVAL, msg, "tensor 'w': unknown dtype 'float128'");
    v[0] = tensor("w", "float32", neg, 0, 24);
    err = check(v, 1, 100, msg, sizeof(msg), &json);
    CHECK_MSG(err, SL_EINVAL, msg, "tensor 'w': dimension 0 is -1");
    v[0] = tensor("w", "float32", huge, 0, 24);
    err = check(v, 1, 100, msg, sizeof(msg), &json);
    CHECK_MSG(err, SL_EINVAL, msg, "tensor 'w': dimension 1 is 9223372036854775807");
    v[0] = tensor("w", "float32", s23, 0, 23);
    err = check(v, 1, 100, msg, sizeof(msg), &json);
    CHECK_MSG(err, SL_EINVAL, msg,
              "tensor 'w': size 23 does not match its shape and dtype float32");
    v[0] = tensor("w", "float32", s23, 80, 24);
    err = check(v, 1, 100, msg, sizeof(msg), &json);
    CHECK_MSG(err, SL_EINVAL, msg, "tensor 'w': bytes [80, +24) outside the data (100 bytes)");
    v[0] = tensor("w", "float32", s23, UINT64_MAX - 10, 24);
    err = check(v, 1, UINT64_MAX, msg, sizeof(msg), &json);
    CHECK(err == SL_EINVAL && strstr(msg, "outside the data") != NULL);
    v[0] = tensor("w", "float32", s23, 0, 24);
    v[1] = tensor("x", "float32", s23, 20, 24);
    err = check(v, 2, 100, msg, sizeof(msg), &json);
    CHECK_MSG(err, SL_EINVAL, msg, "tensors 0 and 1 overlap");
    {
        int64_t dims[SL_CKPT_MAX_DIMS + 2];
        for (int i = 0; i <= SL_CKPT_MAX_DIMS; i++)
            dims[i] = 1;
        dims[SL_CKPT_MAX_DIMS + 1] = -2;
        v[0] = tensor("w", "uint8", dims, 0, 1);
        err = check(v, 1, 100, msg, sizeof(msg), &json);
        CHECK_MSG(err, SL_EINVAL, msg, "tensor 'w': 33 dimensions, at most 32");
        dims[SL_CKPT_MAX_DIMS] = -2;
        v[0] = tensor("w", "uint8", dims, 0, 1);
        CHECK(check(v, 1, 100, msg, sizeof(msg), &json) == 0); /* exactly 32 */
        free(json);
        json = NULL;
    }
    {
        char name[SL_CKPT_MAX_TENSOR_NAME + 2];
        memset(name, 'n', sizeof(name) - 1);
        name[sizeof(name) - 1] = '\0';
        v[0] = tensor(name, "uint8", scalar, 0, 1);
        err = check(v, 1, 100, msg, sizeof(msg), &json);
        CHECK_MSG(err, SL_EINVAL, msg, "tensor 0: name must have 1..1024 characters");
        name[SL_CKPT_MAX_TENSOR_NAME] = '\0';
        CHECK(check(v, 1, 100, msg, sizeof(msg), &json) == 0);
        free(json);
        json = NULL;
    }
    err = sl_ckpt_check_tensors(&json, NULL, SL_CKPT_MAX_TENSORS + 1, 0, msg, sizeof(msg));
    CHECK_MSG(err, SL_EINVAL, msg, "65537 tensors, at most 65536 allowed");
}

/* The overlap check against a brute-force one over random tensor lists (1-D uint8 tensors, some
 * empty, at random offsets): refused exactly when two non-empty tensors share a byte. */
static void test_overlap_property(void)
{
    static const char *names[8] = {"t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"};
    static const int64_t s23[] = {2, 3, -2}, s0[] = {0, 5, -2};
    Sluice__V1__TensorInfo v[8];
    int64_t shapes[8][2];
    uint64_t x = 88172645463325252ull; /* xorshift64 */
    char msg[256], *json = NULL;
    int err;

    /* The case that passed before: an empty tensor sorted between two overlapping ones. */
    v[0] = tensor("w", "float32", s23, 0, 24);
    v[1] = tensor("e", "float64", s0, 10, 0);
    v[2] = tensor("b", "int8", s23, 20, 6);
    err = check(v, 3, 100, msg, sizeof(msg), &json);
    CHECK_MSG(err, SL_EINVAL, msg, "tensors 0 and 2 overlap");
    for (int round = 0; round < 20000; round++) {
        size_t n;
        int want = 0;

        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        n = 1 + x % 8;
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            shapes[i][0] = (int64_t)(x % 4 == 0 ? 0 : x % 13);
            shapes[i][1] = -2;
            v[i] = tensor(names[i], "uint8", shapes[i], (x >> 8) % 48, (uint64_t)shapes[i][0]);
        }
        for (size_t i = 0; i < n; i++)
            for (size_t j = i + 1; j < n; j++)
                if (v[i].size && v[j].size && v[i].offset < v[j].offset + v[j].size &&
                    v[j].offset < v[i].offset + v[i].size)
                    want = 1;
        err = check(v, n, 64, msg, sizeof(msg), &json);
        CHECK(want ? err == SL_EINVAL && strstr(msg, "overlap") : err == 0);
        free(json);
        json = NULL;
    }
}

static void test_header(void)
{
    static const int64_t s4[] = {4, -2};
    Sluice__V1__ShardHeader h = SLUICE__V1__SHARD_HEADER__INIT;
    Sluice__V1__TensorInfo t = tensor("w", "float32", s4, 0, 16), *tp = &t;
    char msg[512], *json = NULL;
    int err;

    h.job = "job";
    h.checkpoint = "ck";
    h.rank = 1;
    h.data_size = 16;
    h.n_tensors = 1;
    h.tensors = &tp;
    CHECK(sl_ckpt_check_header(&h, 2, 1000, &json, msg, sizeof(msg)) == 0 && json != NULL);
    free(json);
    json = NULL;

    err = sl_ckpt_check_header(&h, 1, 1000, &json, msg, sizeof(msg));
    CHECK_MSG(err, SL_EINVAL, msg, "rank 1 out of range [0, 1)");
    h.data_size = (uint64_t)INT64_MAX;
    err = sl_ckpt_check_header(&h, 2, UINT64_MAX, &json, msg, sizeof(msg));
    CHECK_MSG(err, SL_EINVAL, msg, "data_size 9223372036854775807 is not a valid size");
    h.data_size = 2000;
    err = sl_ckpt_check_header(&h, 2, 1000, &json, msg, sizeof(msg));
    CHECK_MSG(err, SL_ELIMIT, msg, "data_size 2000 exceeds max_shard_bytes 1000");
    h.data_size = 16;
    h.offset = 17;
    err = sl_ckpt_check_header(&h, 2, 1000, &json, msg, sizeof(msg));
    CHECK_MSG(err, SL_EINVAL, msg, "offset 17 beyond data_size 16");
    h.offset = 16; /* everything already held: a resume that only finishes */
    CHECK(sl_ckpt_check_header(&h, 2, 1000, &json, msg, sizeof(msg)) == 0);
    free(json);
    json = NULL;
    h.sha256 = "ABCDEF";
    err = sl_ckpt_check_header(&h, 2, 1000, &json, msg, sizeof(msg));
    CHECK_MSG(err, SL_EINVAL, msg, "sha256 'ABCDEF' is not 64 lowercase hex digits");
    h.sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    CHECK(sl_ckpt_check_header(&h, 2, 1000, &json, msg, sizeof(msg)) == 0);
    free(json);
    json = NULL;
    t.size = 8;
    err = sl_ckpt_check_header(&h, 2, 1000, &json, msg, sizeof(msg));
    CHECK_MSG(err, SL_EINVAL, msg, "tensor 'w': size 8 does not match its shape and dtype float32");
    CHECK(json == NULL);
}

int main(void)
{
    test_names_and_rank();
    test_begin();
    test_tensors();
    test_overlap_property();
    test_header();
    return check_done("ckpt_validate_test");
}
