/* Allocation-failure injection for common/: every public entry point that allocates is run with
 * its k-th allocation failing, for k = 1, 2, ... until a run makes fewer than k allocations (and
 * then must succeed). Every run in which an allocation failed must either succeed with the same
 * result as a run without failures, or return a clean error: a negative code (-ENOMEM where the
 * module allocates itself), the out-pointer NULL, the message set; nothing may crash, and under
 * ASan nothing may leak (LeakSanitizer checks at exit). Each case runs in two modes: only the
 * k-th allocation fails, and the k-th and every later one fails (memory stays exhausted, so the
 * cleanup paths run without memory too).
 *
 * Only sluice's own allocations fail. The test is linked with
 * -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,... (tests/cmake/allocfail.cmake): the linker
 * sends the calls made from sluice's object files and static libraries to the __wrap_ functions
 * below, while libc, OpenSSL, gRPC and protobuf-c keep their own malloc. At the boundary to those
 * libraries the calls sluice makes to their allocating functions are wrapped as well:
 * protobuf_c_message_unpack gets an allocator that fails like malloc (so protobuf-c's decoding
 * allocations fail inside sl_rpc_unpack), EVP_MD_CTX_new returns NULL and EVP_DigestInit_ex
 * fails. ALLOCFAIL_DEBUG=1 prints the error of every failing run. */
#include "../../common/rpc/internal.h"
#include "batch/batch.h"
#include "err.h"
#include "sample/sample.h"
#include "shard.h"
#include "sluice/v1/checkpoint.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK failed: %s (case %s, k=%ld, mode %d)\n", __FILE__,       \
                    __LINE__, #cond, cur_case, inj_at, inj_mode);                                  \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

/* ---- injection ---- */

static const char *cur_case = "";
static long inj_at;   /* fail the inj_at-th counted allocation; 0 = injection off */
static int inj_mode;  /* 0: only that one; 1: that one and every later one */
static long inj_seen; /* allocations counted since arming */
static int inj_hit;   /* an allocation was made to fail */

static int inject(void)
{
    if (!inj_at)
        return 0;
    inj_seen++;
    if (inj_seen == inj_at || (inj_mode == 1 && inj_seen > inj_at)) {
        inj_hit = 1;
        return 1;
    }
    return 0;
}

static void arm(long k, int mode)
{
    inj_at = k;
    inj_mode = mode;
    inj_seen = 0;
    inj_hit = 0;
}

static void disarm(void)
{
    inj_at = 0;
}

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
int __real_posix_memalign(void **p, size_t align, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);
EVP_MD_CTX *__real_EVP_MD_CTX_new(void);
int __real_EVP_DigestInit_ex(EVP_MD_CTX *ctx, const EVP_MD *type, ENGINE *impl);
ProtobufCMessage *__real_protobuf_c_message_unpack(const ProtobufCMessageDescriptor *desc,
                                                   ProtobufCAllocator *allocator, size_t len,
                                                   const uint8_t *data);

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
int __wrap_posix_memalign(void **p, size_t align, size_t n);
void *__wrap_aligned_alloc(size_t align, size_t n);
EVP_MD_CTX *__wrap_EVP_MD_CTX_new(void);
int __wrap_EVP_DigestInit_ex(EVP_MD_CTX *ctx, const EVP_MD *type, ENGINE *impl);
ProtobufCMessage *__wrap_protobuf_c_message_unpack(const ProtobufCMessageDescriptor *desc,
                                                   ProtobufCAllocator *allocator, size_t len,
                                                   const uint8_t *data);

void *__wrap_malloc(size_t n)
{
    return inject() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    return inject() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    return inject() ? NULL : __real_realloc(p, n);
}

char *__wrap_strdup(const char *s)
{
    return inject() ? NULL : __real_strdup(s);
}

char *__wrap_strndup(const char *s, size_t n)
{
    return inject() ? NULL : __real_strndup(s, n);
}

int __wrap_posix_memalign(void **p, size_t align, size_t n)
{
    return inject() ? ENOMEM : __real_posix_memalign(p, align, n);
}

void *__wrap_aligned_alloc(size_t align, size_t n)
{
    return inject() ? NULL : __real_aligned_alloc(align, n);
}

EVP_MD_CTX *__wrap_EVP_MD_CTX_new(void)
{
    return inject() ? NULL : __real_EVP_MD_CTX_new();
}

int __wrap_EVP_DigestInit_ex(EVP_MD_CTX *ctx, const EVP_MD *type, ENGINE *impl)
{
    return inject() ? 0 : __real_EVP_DigestInit_ex(ctx, type, impl);
}

/* protobuf-c's allocator for the decoding sluice asks for: malloc that can fail. Memory comes
 * from the real malloc, so protobuf_c_message_free_unpacked(m, NULL) frees it correctly. */
static void *pb_alloc(void *data, size_t n)
{
    (void)data;
    return __wrap_malloc(n);
}

static void pb_free(void *data, void *p)
{
    (void)data;
    free(p);
}

static ProtobufCAllocator pb_failing = {pb_alloc, pb_free, NULL};

ProtobufCMessage *__wrap_protobuf_c_message_unpack(const ProtobufCMessageDescriptor *desc,
                                                   ProtobufCAllocator *allocator, size_t len,
                                                   const uint8_t *data)
{
    return __real_protobuf_c_message_unpack(desc, allocator ? allocator : &pb_failing, len, data);
}

/* Run `body` (an expression giving 0 or an error code; it checks its own result and frees what
 * it made) with the k-th allocation failing, k = 1, 2, ..., in both modes, until a run needs
 * fewer than k allocations. Returns the allocation count of the clean run. */
typedef int (*case_fn)(int injected);

static long run_case(const char *name, case_fn fn)
{
    long clean = -1;

    cur_case = name;
    for (int mode = 0; mode < 2; mode++) {
        for (long k = 1;; k++) {
            int rc, hit;

            arm(k, mode);
            rc = fn(1);
            hit = inj_hit;
            if (!hit)
                clean = inj_seen;
            disarm();
            if (!hit) {
                /* Fewer than k allocations: nothing failed, so the call must have worked. */
                CHECK(rc == 0);
                break;
            }
            if (k > 1000000) {
                CHECK(!"no end to the allocations");
                break;
            }
        }
    }
    printf("%-36s %ld allocation(s) in a clean run, each one failed in turn\n", name, clean);
    return clean;
}

/* A failing run's error: negative, and -ENOMEM when an allocation made by sluice's own code was
 * what failed (the cases that can also meet a wrapped OpenSSL failure accept any negative code). */
static void check_error(int rc, int any_negative)
{
    if (getenv("ALLOCFAIL_DEBUG"))
        fprintf(stderr, "%s k=%ld mode %d: %s\n", cur_case, inj_at, inj_mode, sl_errname(rc));
    CHECK(rc < 0);
    if (!any_negative)
        CHECK(rc == -ENOMEM);
}

/* ---- common/sample ---- */

#define SAMPLES 1000
#define WORLD   4

static uint64_t ref_stream[WORLD][SAMPLES];
static size_t ref_count[WORLD];

static void sample_cfg(sl_sample_config *c, sl_sample_shuffle shuffle, sl_sample_partition part)
{
    sl_sample_config_init(c);
    c->samples = SAMPLES - 3;
    c->replicas = WORLD;
    c->rank = 1;
    c->partition = part;
    c->chunk_size = 7;
    c->shuffle = shuffle;
    c->seed = 42;
    c->epoch = 3;
}

/* Read the whole stream; 0 or its error. */
static int drain(sl_sample *s, uint64_t *out, size_t cap, size_t *n)
{
    size_t got;
    int err;

    *n = 0;
    do {
        if ((err = sl_sample_next(out + *n, &got, s, cap - *n < 100 ? cap - *n : 100)) != 0)
            return err;
        *n += got;
    } while (got && *n < cap);
    return 0;
}

static sl_sample_shuffle g_shuffle;
static sl_sample_partition g_part;

static int case_sample_new(int injected)
{
    sl_sample_config c;
    sl_sample *s = (sl_sample *)&c; /* must come back NULL on failure */
    char msg[256] = "";
    uint64_t buf[SAMPLES];
    size_t n;
    int rc;

    sample_cfg(&c, g_shuffle, g_part);
    rc = sl_sample_new(&s, &c, msg, sizeof(msg));
    if (rc != 0) {
        check_error(rc, 0);
        CHECK(s == NULL);
        CHECK(msg[0] != '\0');
        sl_sample_free(s);
        return rc;
    }
    (void)injected;
    rc = drain(s, buf, SAMPLES, &n);
    CHECK(rc == 0);
    CHECK(n == ref_count[1] && memcmp(buf, ref_stream[1], n * sizeof(*buf)) == 0);
    sl_sample_free(s);
    return rc;
}

static int case_epoch_order(int injected)
{
    static uint64_t ref[SAMPLES], got[SAMPLES];
    int rc;

    if (!injected)
        return sl_sample_epoch_order(ref, SAMPLES, SL_SAMPLE_SHUFFLE_TORCH, 5, 2);
    rc = sl_sample_epoch_order(got, SAMPLES, SL_SAMPLE_SHUFFLE_TORCH, 5, 2);
    if (rc != 0)
        check_error(rc, 0);
    else
        CHECK(memcmp(got, ref, sizeof(got)) == 0);
    return rc;
}

/* Elastic: an epoch of a world of 4 resumed by 3 ranks after uneven progress. */
static uint64_t consumed[WORLD]; /* a prefix of each old share: 1/16, none, 3/4, all */
static uint64_t ref_elastic[3][2 * SAMPLES];
static size_t ref_elastic_n[3];

static int case_elastic(int injected)
{
    sl_sample_config c;
    sl_sample_elastic *e = (sl_sample_elastic *)&c;
    char msg[256] = "";
    int rc;

    sample_cfg(&c, g_shuffle, g_part);
    rc = sl_sample_elastic_new(&e, &c, consumed, WORLD, 3, msg, sizeof(msg));
    if (rc != 0) {
        check_error(rc, 0);
        CHECK(e == NULL);
        CHECK(msg[0] != '\0');
        sl_sample_elastic_free(e);
        return rc;
    }
    for (uint32_t r = 0; r < 3 && rc == 0; r++) {
        sl_sample *s = (sl_sample *)&c;
        uint64_t buf[2 * SAMPLES];
        size_t n;

        msg[0] = '\0';
        rc = sl_sample_new_elastic(&s, e, r, msg, sizeof(msg));
        if (rc != 0) {
            check_error(rc, 0);
            CHECK(s == NULL);
            CHECK(msg[0] != '\0');
            break;
        }
        rc = drain(s, buf, 2 * SAMPLES, &n);
        CHECK(rc == 0);
        if (!injected) {
            memcpy(ref_elastic[r], buf, n * sizeof(*buf));
            ref_elastic_n[r] = n;
        } else {
            CHECK(n == ref_elastic_n[r] && memcmp(buf, ref_elastic[r], n * sizeof(*buf)) == 0);
        }
        sl_sample_free(s);
    }
    sl_sample_elastic_free(e);
    return rc;
}

static void test_sample(void)
{
    static const struct {
        const char *name;
        sl_sample_shuffle shuffle;
        sl_sample_partition part;
    } cases[] = {
        {"sample_new torch interleaved", SL_SAMPLE_SHUFFLE_TORCH, SL_SAMPLE_INTERLEAVED},
        {"sample_new torch contiguous", SL_SAMPLE_SHUFFLE_TORCH, SL_SAMPLE_CONTIGUOUS},
        {"sample_new torch chunked", SL_SAMPLE_SHUFFLE_TORCH, SL_SAMPLE_CHUNKED},
        {"sample_new feistel", SL_SAMPLE_SHUFFLE_FEISTEL, SL_SAMPLE_INTERLEAVED},
        {"sample_new none chunked", SL_SAMPLE_SHUFFLE_NONE, SL_SAMPLE_CHUNKED},
    };
    static const char *const elastic_names[] = {"elastic torch interleaved",
                                                "elastic torch contiguous", "elastic torch chunked",
                                                "elastic feistel", "elastic none chunked"};

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        sl_sample_config c;
        char msg[256];

        g_shuffle = cases[i].shuffle;
        g_part = cases[i].part;
        /* The reference streams, without injection. */
        for (uint32_t r = 0; r < WORLD; r++) {
            sl_sample *s;
            sample_cfg(&c, g_shuffle, g_part);
            c.rank = r;
            CHECK(sl_sample_new(&s, &c, msg, sizeof(msg)) == 0);
            CHECK(drain(s, ref_stream[r], SAMPLES, &ref_count[r]) == 0);
            sl_sample_free(s);
        }
        consumed[0] = ref_count[0] / 16;
        consumed[1] = 0;
        consumed[2] = ref_count[2] * 3 / 4;
        consumed[3] = ref_count[3];
        run_case(cases[i].name, case_sample_new);
        CHECK(case_elastic(0) == 0);
        run_case(elastic_names[i], case_elastic);
    }
    CHECK(case_epoch_order(0) == 0);
    run_case("sample_epoch_order torch", case_epoch_order);
}

/* ---- common/batch ---- */

#define SEQS 300

static uint32_t lengths[SEQS];
static uint64_t order[SEQS + 20];
static sl_batch_config g_bcfg;
static sl_batch_plan *ref_plan;

static int same_plans(const sl_batch_plan *a, const sl_batch_plan *b)
{
    uint64_t per = sl_batch_plan_batches_per_rank(a);
    sl_batch_stats sa, sb;

    if (per != sl_batch_plan_batches_per_rank(b) ||
        sl_batch_plan_replicas(a) != sl_batch_plan_replicas(b))
        return 0;
    for (uint32_t r = 0; r < sl_batch_plan_replicas(a); r++)
        for (uint64_t i = 0; i < per; i++) {
            sl_batch x, y;
            if (sl_batch_plan_get(a, r, i, &x) != 0 || sl_batch_plan_get(b, r, i, &y) != 0 ||
                x.count != y.count || x.tokens != y.tokens || x.max_len != y.max_len ||
                memcmp(x.indices, y.indices, x.count * sizeof(*x.indices)) != 0)
                return 0;
        }
    if (sl_batch_plan_stats(a, -1, &sa) != 0 || sl_batch_plan_stats(b, -1, &sb) != 0)
        return 0;
    return sa.batches == sb.batches && sa.tokens == sb.tokens && sa.skipped == sb.skipped &&
           sa.dropped == sb.dropped && sa.repeated == sb.repeated;
}

static int case_batch(int injected)
{
    sl_batch_plan *p = (sl_batch_plan *)&g_bcfg;
    char msg[256] = "";
    int rc;

    (void)injected;
    rc = sl_batch_plan_new(&p, &g_bcfg, lengths, SEQS, order, SEQS + 20, msg, sizeof(msg));
    if (rc != 0) {
        check_error(rc, 0);
        CHECK(p == NULL);
        CHECK(msg[0] != '\0');
        return rc;
    }
    CHECK(same_plans(p, ref_plan));
    sl_batch_plan_free(p);
    return 0;
}

static void test_batch(void)
{
    static const char *const names[] = {"batch pad", "batch bucket", "batch dynamic",
                                        "batch packed"};
    char msg[256], name[96];

    /* Lengths 1..700 in a fixed pseudo-random pattern, some over max_seq_len; an order with
     * repeats, as a padded epoch has. */
    for (uint32_t i = 0; i < SEQS; i++)
        lengths[i] = 1 + (i * 7919u) % 700;
    for (uint32_t i = 0; i < SEQS + 20; i++)
        order[i] = (i * 131u) % SEQS;
    for (int strategy = SL_BATCH_PAD; strategy <= SL_BATCH_PACKED; strategy++) {
        for (int variant = 0; variant < 4; variant++) {
            sl_batch_config_init(&g_bcfg);
            g_bcfg.strategy = (sl_batch_strategy)strategy;
            g_bcfg.max_batch_size = 8;
            g_bcfg.max_seq_len = 512;
            g_bcfg.max_tokens = 2048;
            g_bcfg.replicas = 3;
            g_bcfg.seed = 9;
            if (variant == 1) {
                g_bcfg.overlong = SL_BATCH_SKIP;
                g_bcfg.remainder = SL_BATCH_REPEAT;
                g_bcfg.balance = 1;
                g_bcfg.window = 50;
                g_bcfg.batch_size_multiple = 2;
            } else if (variant == 2) {
                g_bcfg.keep_order = 1;
                g_bcfg.bucket_width = 16;
                g_bcfg.cost = SL_BATCH_COST_SUM;
            } else if (variant == 3) {
                /* One or two sequences per batch: many more batches than the planner's first
                 * guess, so its record and bin arrays grow (realloc) while planning. */
                g_bcfg.max_tokens = 512;
                g_bcfg.remainder = SL_BATCH_REPEAT;
            }
            CHECK(sl_batch_config_check(&g_bcfg, msg, sizeof(msg)) == 0);
            CHECK(sl_batch_plan_new(&ref_plan, &g_bcfg, lengths, SEQS, order, SEQS + 20, msg,
                                    sizeof(msg)) == 0);
            snprintf(name, sizeof(name), "%s, variant %d", names[strategy], variant);
            if (ref_plan)
                run_case(name, case_batch);
            sl_batch_plan_free(ref_plan);
            ref_plan = NULL;
        }
    }
}

/* ---- common/shard ---- */

static const char abc_sha256[] = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
static char tmp_path[64];

static int case_sha256(int injected)
{
    sl_sha256 *h = (sl_sha256 *)tmp_path;
    char hex[SL_SHARD_HEX_LEN + 1];
    int rc;

    (void)injected;
    rc = sl_sha256_new(&h);
    if (rc != 0) {
        check_error(rc, 1); /* EVP_DigestInit_ex failing is SL_EUNAVAILABLE */
        CHECK(h == NULL);
        return rc;
    }
    /* Reset allocates nothing new but may fail like the init inside sl_sha256_new. */
    if ((rc = sl_sha256_reset(h)) == 0 && (rc = sl_sha256_update(h, "abc", 3)) == 0 &&
        (rc = sl_sha256_final(h, hex)) == 0)
        CHECK(strcmp(hex, abc_sha256) == 0);
    else
        check_error(rc, 1);
    sl_sha256_free(h);
    return rc;
}

static int case_hash_fd(int injected)
{
    sl_sha256 *h = NULL;
    char hex[SL_SHARD_HEX_LEN + 1];
    int fd, rc;

    (void)injected;
    if ((rc = sl_sha256_new(&h)) != 0) {
        check_error(rc, 1);
        return rc;
    }
    fd = open(tmp_path, O_RDONLY);
    CHECK(fd >= 0);
    rc = sl_shard_hash_fd(h, fd, 1, 3);
    close(fd);
    if (rc == 0 && (rc = sl_sha256_final(h, hex)) == 0)
        CHECK(strcmp(hex, abc_sha256) == 0);
    else
        check_error(rc, 1);
    sl_sha256_free(h);
    return rc;
}

static void test_shard(void)
{
    FILE *f;

    snprintf(tmp_path, sizeof(tmp_path), "/tmp/sl-allocfail-%d", (int)getpid());
    f = fopen(tmp_path, "wb");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs("xabcx", f);
    fclose(f);
    run_case("sha256_new/update/final", case_sha256);
    run_case("shard_hash_fd", case_hash_fd);
    unlink(tmp_path);
}

/* ---- common/rpc/tls.c: credentials from PEM files ---- */

static char pem_path[64];
static int tls_server;

static int case_tls(int injected)
{
    sl_rpc_tls tls = {pem_path, pem_path, pem_path};
    int rc;

    (void)injected;
    if (tls_server) {
        grpc_server_credentials *c = (grpc_server_credentials *)pem_path;
        rc = sl_rpc_server_creds(&c, &tls);
        if (rc != 0)
            CHECK(c == NULL);
        else if (c)
            grpc_server_credentials_release(c);
    } else {
        grpc_channel_credentials *c = (grpc_channel_credentials *)pem_path;
        rc = sl_rpc_channel_creds(&c, &tls);
        if (rc != 0)
            CHECK(c == NULL);
        else if (c)
            grpc_channel_credentials_release(c);
    }
    if (rc != 0)
        check_error(rc, 0);
    return rc;
}

static void test_tls(void)
{
    FILE *f;

    /* gRPC keeps the PEM text without parsing it here: a placeholder is enough. */
    snprintf(pem_path, sizeof(pem_path), "/tmp/sl-allocfail-%d.pem", (int)getpid());
    f = fopen(pem_path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", f);
    fclose(f);
    tls_server = 1;
    run_case("rpc_server_creds (mTLS)", case_tls);
    tls_server = 0;
    run_case("rpc_channel_creds (mTLS)", case_tls);
    unlink(pem_path);
}

/* ---- common/rpc/codec.c: decoding ---- */

static uint8_t wire[4096];
static size_t wire_len;
static const ProtobufCMessageDescriptor *wire_desc;

static int case_unpack(int injected)
{
    grpc_slice slice = grpc_slice_from_copied_buffer((const char *)wire, wire_len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
    ProtobufCMessage *m;
    char why[256] = "";
    uint8_t again[sizeof(wire)];
    int rc = 0;

    (void)injected;
    grpc_slice_unref(slice);
    rc = sl_rpc_decode(&m, wire_desc, bb, why, sizeof(why));
    grpc_byte_buffer_destroy(bb);
    if (rc != 0) {
        if (getenv("ALLOCFAIL_DEBUG"))
            fprintf(stderr, "%s k=%ld mode %d: %s\n", cur_case, inj_at, inj_mode, why);
        /* The message is valid: running out of memory is the only way to fail, and it must not
         * be answered as an invalid message (INVALID_ARGUMENT). */
        CHECK(rc == -ENOMEM);
        CHECK(m == NULL);
        CHECK(strstr(why, "out of memory") != NULL);
        return rc;
    }
    /* Decoded in full: it packs to the same bytes. */
    CHECK(protobuf_c_message_get_packed_size(m) == wire_len);
    CHECK(protobuf_c_message_pack(m, again) == wire_len && memcmp(again, wire, wire_len) == 0);
    protobuf_c_message_free_unpacked(m, NULL);
    return rc;
}

/* sl_rpc_unpack_bytes on wire[] cut into slices of `wire_cut` bytes (0: one slice). */
static size_t wire_cut;
static const uint8_t *wire_chunk;
static size_t wire_chunk_len;

static int case_unpack_bytes(int injected)
{
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(wire_desc, "chunk");
    grpc_slice slices[sizeof(wire)];
    size_t n = 0, step = wire_cut ? wire_cut : wire_len;
    grpc_byte_buffer *bb;
    ProtobufCMessage *m;
    sl_rpc_bytes *b = (sl_rpc_bytes *)wire;
    char why[256] = "";
    int rc;

    (void)injected;
    for (size_t off = 0; off < wire_len; off += step)
        slices[n++] = grpc_slice_from_copied_buffer((const char *)wire + off,
                                                    wire_len - off < step ? wire_len - off : step);
    bb = grpc_raw_byte_buffer_create(slices, n);
    for (size_t i = 0; i < n; i++)
        grpc_slice_unref(slices[i]);
    rc = sl_rpc_decode_bytes(&m, wire_desc, f->id, bb, &b, why, sizeof(why));
    /* Whatever happened, bb is still the caller's to destroy (its slices may have moved out). */
    grpc_byte_buffer_destroy(bb);
    if (rc != 0) {
        CHECK(rc == -ENOMEM);
        CHECK(m == NULL && b == NULL);
        CHECK(strstr(why, "out of memory") != NULL);
        return rc;
    }
    if (wire_chunk_len) {
        const struct iovec *iov;
        size_t got = 0;
        int n_iov;

        CHECK(b != NULL);
        if (b) {
            CHECK(sl_rpc_bytes_len(b) == wire_chunk_len);
            iov = sl_rpc_bytes_iov(b, &n_iov);
            for (int i = 0; i < n_iov; i++) {
                CHECK(got + iov[i].iov_len <= wire_chunk_len &&
                      memcmp(iov[i].iov_base, wire_chunk + got, iov[i].iov_len) == 0);
                got += iov[i].iov_len;
            }
            CHECK(got == wire_chunk_len);
        }
    } else {
        CHECK(b == NULL);
        /* No bytes field: the message is all there is, and it packs to the same bytes. */
        CHECK(protobuf_c_message_get_packed_size(m) == wire_len);
    }
    sl_rpc_bytes_free(b);
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}

static void test_codec(void)
{
    Sluice__V1__UploadShardRequest req = SLUICE__V1__UPLOAD_SHARD_REQUEST__INIT;
    Sluice__V1__ShardHeader hdr = SLUICE__V1__SHARD_HEADER__INIT;
    Sluice__V1__TensorInfo t[3], *tp[3];
    int64_t shape[3][2] = {{4, 8}, {16, 1}, {2, 2}};
    static uint8_t chunk[3000];

    wire_desc = &sluice__v1__upload_shard_request__descriptor;
    /* A header: strings, repeated nested messages, packed repeated integers. */
    for (int i = 0; i < 3; i++) {
        static char names[3][16];
        sluice__v1__tensor_info__init(&t[i]);
        snprintf(names[i], sizeof(names[i]), "layer.%d.weight", i);
        t[i].name = names[i];
        t[i].dtype = "float32";
        t[i].n_shape = 2;
        t[i].shape = shape[i];
        t[i].offset = (uint64_t)i * 512;
        tp[i] = &t[i];
    }
    hdr.job = "job-1";
    hdr.checkpoint = "step_100";
    hdr.rank = 3;
    hdr.n_tensors = 3;
    hdr.tensors = tp;
    hdr.data_size = 1536;
    hdr.sha256 = (char *)abc_sha256;
    req.kind_case = SLUICE__V1__UPLOAD_SHARD_REQUEST__KIND_HEADER;
    req.header = &hdr;
    wire_len = protobuf_c_message_pack(&req.base, wire);
    CHECK(case_unpack(0) == 0);
    run_case("rpc_unpack header", case_unpack);
    CHECK(case_unpack_bytes(0) == 0);
    run_case("rpc_unpack_bytes header", case_unpack_bytes);

    /* A chunk: the one-bytes-field fast path. */
    for (size_t i = 0; i < sizeof(chunk); i++)
        chunk[i] = (uint8_t)(i * 31);
    req.kind_case = SLUICE__V1__UPLOAD_SHARD_REQUEST__KIND_CHUNK;
    req.chunk.data = chunk;
    req.chunk.len = sizeof(chunk);
    wire_len = protobuf_c_message_pack(&req.base, wire);
    CHECK(case_unpack(0) == 0);
    run_case("rpc_unpack chunk", case_unpack);
    /* The received slices kept as they are (one, or 31 of 100 bytes), and 101 slices of 30 bytes
     * (a peer sending small frames: more than 64), which are joined into one allocation. Slices
     * of at most 23 bytes would not do: gRPC merges such inlined slices as they are added. */
    wire_chunk = chunk;
    wire_chunk_len = sizeof(chunk);
    CHECK(case_unpack_bytes(0) == 0);
    run_case("rpc_unpack_bytes chunk", case_unpack_bytes);
    wire_cut = 100;
    CHECK(case_unpack_bytes(0) == 0);
    run_case("rpc_unpack_bytes chunk, 31 slices", case_unpack_bytes);
    wire_cut = 30;
    CHECK(case_unpack_bytes(0) == 0);
    run_case("rpc_unpack_bytes chunk, 101 slices", case_unpack_bytes);
    wire_cut = 0;
}

int main(void)
{
    grpc_init();
    test_sample();
    test_batch();
    test_shard();
    test_tls();
    test_codec();
    grpc_shutdown();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("all allocation-failure checks passed\n");
    return 0;
}
