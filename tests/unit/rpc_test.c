/* Tests of common/rpc: a real server (tests/rpc/testsvc.c) on 127.0.0.1 and the real client, in
 * one process, over real gRPC. Each test prints its name; any failed check fails the program. */
#include "err.h"
#include "keys.h"
#include "rpc/client.h"
#include "sluice/test/test.pb-c.h"
#include "testsvc.h"

#include <errno.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

static char target[64];

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static sl_rpc_client *new_client(void)
{
    sl_rpc_client *c = NULL;
    int err = sl_rpc_client_new(&c, target, NULL);

    CHECK(err == 0 && c, "client_new: %d", err);
    return c;
}

static int echo(sl_rpc_client *c, const char *text, uint32_t delay_ms, uint32_t fail_code,
                int64_t timeout_ms, sl_rpc_status *st, char *out, size_t out_len)
{
    Sluice__Test__EchoRequest req = SLUICE__TEST__ECHO_REQUEST__INIT;
    Sluice__Test__EchoResponse *resp = NULL;
    int err;

    req.text = (char *)text;
    req.delay_ms = delay_ms;
    req.fail_code = fail_code;
    err = sl_rpc_client_unary(c, "/sluice.test.Test/Echo", &req.base,
                              &sluice__test__echo_response__descriptor, (ProtobufCMessage **)&resp,
                              timeout_ms, st);
    if (resp) {
        if (out)
            snprintf(out, out_len, "%s", resp->text);
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    }
    return err;
}

/* Live calls on the server, not counting the Stats call itself. */
static long live_calls(sl_rpc_client *c)
{
    Sluice__Test__StatsRequest req = SLUICE__TEST__STATS_REQUEST__INIT;
    Sluice__Test__StatsResponse *resp = NULL;
    sl_rpc_status st;
    long n = -1;

    if (sl_rpc_client_unary(c, "/sluice.test.Test/Stats", &req.base,
                            &sluice__test__stats_response__descriptor, (ProtobufCMessage **)&resp,
                            5000, &st) == 0) {
        n = (long)resp->live_calls - 1;
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    }
    return n;
}

/* Poll until the server holds `want` calls other than the poll itself, or `secs` pass; returns
 * the last count seen. The caller checks that value, never a new poll: the previous poll's call
 * may still be being freed when the next one arrives, so a fresh count can read one high. */
static long wait_live(sl_rpc_client *c, long want, double secs)
{
    double end = now_s() + secs;
    long n;

    while ((n = live_calls(c)) != want && now_s() < end)
        usleep(10000);
    return n;
}

/* Poll until the server holds no call state other than the poll itself, or `secs` pass. */
static long wait_idle(sl_rpc_client *c, double secs)
{
    return wait_live(c, 0, secs);
}

static void test_unary(void)
{
    sl_rpc_client *c = new_client();
    sl_rpc_status st;
    char out[64] = "";
    int err = echo(c, "hello", 0, 0, 5000, &st, out, sizeof(out));

    CHECK(err == 0, "echo: %d %s", err, st.message);
    CHECK(st.code == SL_RPC_OK, "code %d", st.code);
    CHECK(strcmp(out, "hello") == 0, "got '%s'", out);
    sl_rpc_client_free(c);
}

static void test_unary_status(void)
{
    sl_rpc_client *c = new_client();
    sl_rpc_status st;
    int err = echo(c, "nope", 0, SL_RPC_NOT_FOUND, 5000, &st, NULL, 0);

    CHECK(err == SL_ENOTFOUND, "err %d", err);
    CHECK(st.code == SL_RPC_NOT_FOUND, "code %d", st.code);
    CHECK(strstr(st.message, "'nope'") != NULL, "message '%s'", st.message);
    sl_rpc_client_free(c);
}

static void test_empty_request(void)
{
    sl_rpc_client *c = new_client();
    sl_rpc_status st;
    /* Zero bytes is a valid, empty EchoRequest. */
    int err = sl_rpc_client_unary_raw(c, "/sluice.test.Test/Echo", "", 0, 5000, &st);

    CHECK(err == 0 && st.code == SL_RPC_OK, "err %d code %d %s", err, st.code, st.message);
    sl_rpc_client_free(c);
}

static void test_server_stream(void)
{
    Sluice__Test__CountRequest req = SLUICE__TEST__COUNT_REQUEST__INIT;
    sl_rpc_client *c = new_client();
    sl_rpc_stream *s = NULL;
    ProtobufCMessage *msg;
    sl_rpc_status st;
    uint64_t expect = 0;
    int r, bad = 0;

    req.count = 1000;
    req.payload_size = 10;
    CHECK(sl_rpc_stream_open(&s, c, "/sluice.test.Test/Count", 10000) == 0, "open");
    CHECK(sl_rpc_stream_write(s, &req.base, 0) == 0, "write");
    CHECK(sl_rpc_stream_close_send(s) == 0, "close_send");
    while ((r = sl_rpc_stream_read(s, &sluice__test__count_response__descriptor, &msg)) == 1) {
        Sluice__Test__CountResponse *m = (void *)msg;
        if (m->value != expect || m->payload.len != 10)
            bad++;
        expect++;
        protobuf_c_message_free_unpacked(msg, NULL);
    }
    CHECK(r == 0, "read end %d", r);
    CHECK(expect == 1000 && bad == 0, "got %llu messages, %d bad", (unsigned long long)expect, bad);
    CHECK(sl_rpc_stream_finish(s, &st) == 0 && st.code == SL_RPC_OK, "status %d %s", st.code,
          st.message);
    sl_rpc_stream_free(s);
    sl_rpc_client_free(c);
}

static void test_client_stream(void)
{
    Sluice__Test__Num num = SLUICE__TEST__NUM__INIT;
    sl_rpc_client *c = new_client();
    sl_rpc_stream *s = NULL;
    ProtobufCMessage *msg = NULL;
    sl_rpc_status st;
    int r;

    CHECK(sl_rpc_stream_open(&s, c, "/sluice.test.Test/Sum", 10000) == 0, "open");
    for (int i = 1; i <= 100; i++) {
        num.value = i;
        CHECK(sl_rpc_stream_write(s, &num.base, i < 100 ? SL_RPC_SEND_MORE : 0) == 0, "write %d",
              i);
    }
    CHECK(sl_rpc_stream_close_send(s) == 0, "close_send");
    r = sl_rpc_stream_read(s, &sluice__test__sum_response__descriptor, &msg);
    CHECK(r == 1, "read %d", r);
    if (r == 1) {
        Sluice__Test__SumResponse *m = (void *)msg;
        CHECK(m->sum == 5050 && m->messages == 100, "sum %lld messages %llu", (long long)m->sum,
              (unsigned long long)m->messages);
        protobuf_c_message_free_unpacked(msg, NULL);
    }
    CHECK(sl_rpc_stream_finish(s, &st) == 0, "status %d %s", st.code, st.message);
    sl_rpc_stream_free(s);
    sl_rpc_client_free(c);
}

static void test_bidi(void)
{
    Sluice__Test__Num num = SLUICE__TEST__NUM__INIT;
    sl_rpc_client *c = new_client();
    sl_rpc_stream *s = NULL;
    ProtobufCMessage *msg = NULL;
    sl_rpc_status st;
    int r;

    CHECK(sl_rpc_stream_open(&s, c, "/sluice.test.Test/Chat", 10000) == 0, "open");
    for (int i = 0; i < 50; i++) {
        num.value = i * 7;
        CHECK(sl_rpc_stream_write(s, &num.base, 0) == 0, "write %d", i);
        r = sl_rpc_stream_read(s, &sluice__test__num__descriptor, &msg);
        CHECK(r == 1, "read %d: %d", i, r);
        if (r != 1)
            break;
        CHECK(((Sluice__Test__Num *)msg)->value == i * 7, "echo %d", i);
        protobuf_c_message_free_unpacked(msg, NULL);
    }
    CHECK(sl_rpc_stream_close_send(s) == 0, "close_send");
    CHECK(sl_rpc_stream_read(s, &sluice__test__num__descriptor, &msg) == 0, "end of stream");
    CHECK(sl_rpc_stream_finish(s, &st) == 0, "status %d %s", st.code, st.message);
    sl_rpc_stream_free(s);
    sl_rpc_client_free(c);
}

static void test_deadline(void)
{
    sl_rpc_client *c = new_client();
    sl_rpc_status st;
    double t0 = now_s();
    int err = echo(c, "slow", 3000, 0, 200, &st, NULL, 0);
    double took = now_s() - t0;

    CHECK(err == SL_ETIMEOUT && st.code == SL_RPC_DEADLINE_EXCEEDED, "err %d code %d", err,
          st.code);
    CHECK(took < 1.5, "deadline took %.3f s", took);
    /* The server learns of the expired deadline and frees the delayed call's state. */
    CHECK(wait_idle(c, 3.0) == 0, "call state left after deadline");
    sl_rpc_client_free(c);
}

static void test_cancel_mid_stream(void)
{
    Sluice__Test__CountRequest req = SLUICE__TEST__COUNT_REQUEST__INIT;
    sl_rpc_client *c = new_client();
    sl_rpc_stream *s = NULL;
    ProtobufCMessage *msg;
    double t0;
    long live;
    int got = 0;

    req.count = 0; /* forever */
    req.payload_size = 64;
    CHECK(sl_rpc_stream_open(&s, c, "/sluice.test.Test/Count", 0) == 0, "open");
    CHECK(sl_rpc_stream_write(s, &req.base, 0) == 0, "write");
    CHECK(sl_rpc_stream_close_send(s) == 0, "close_send");
    while (got < 500 &&
           sl_rpc_stream_read(s, &sluice__test__count_response__descriptor, &msg) == 1) {
        protobuf_c_message_free_unpacked(msg, NULL);
        got++;
    }
    CHECK(got == 500, "got %d", got);
    CHECK(wait_live(c, 1, 30.0) == 1, "stream not live on the server");
    t0 = now_s();
    sl_rpc_stream_cancel(s);
    sl_rpc_stream_free(s);
    live = wait_idle(c, 3.0);
    CHECK(live == 0, "stream state not freed after cancel (%ld live)", live);
    printf("  cancel noticed and freed in %.3f s\n", now_s() - t0);
    sl_rpc_client_free(c);
}

static void test_oversized(void)
{
    Sluice__Test__EchoRequest req = SLUICE__TEST__ECHO_REQUEST__INIT;
    Sluice__Test__EchoResponse *resp = NULL;
    sl_rpc_client *c = new_client();
    size_t n = 100 * 1024;
    uint8_t *big = calloc(1, n);
    sl_rpc_status st;
    int err;

    req.text = "big";
    req.payload.data = big;
    req.payload.len = n;
    err = sl_rpc_client_unary(c, "/sluice.test.Test/Echo", &req.base,
                              &sluice__test__echo_response__descriptor, (ProtobufCMessage **)&resp,
                              5000, &st);
    CHECK(err == SL_ELIMIT && st.code == SL_RPC_RESOURCE_EXHAUSTED, "err %d code %d %s", err,
          st.code, st.message);
    /* Just under the limit is fine. */
    req.payload.len = 60 * 1024;
    err = sl_rpc_client_unary(c, "/sluice.test.Test/Echo", &req.base,
                              &sluice__test__echo_response__descriptor, (ProtobufCMessage **)&resp,
                              5000, &st);
    CHECK(err == 0 && resp && resp->payload.len == 60 * 1024, "err %d %s", err, st.message);
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    free(big);
    sl_rpc_client_free(c);
}

static void test_unknown_method(void)
{
    static const char *const paths[] = {"/sluice.test.Test/Nope", "/no.such.Service/Method",
                                        "/garbage"};
    sl_rpc_client *c = new_client();

    for (size_t i = 0; i < 3; i++) {
        sl_rpc_status st;
        double t0 = now_s();
        int err = sl_rpc_client_unary_raw(c, paths[i], "", 0, 10000, &st);
        double took = now_s() - t0;
        CHECK(err == SL_EUNIMPL && st.code == SL_RPC_UNIMPLEMENTED, "%s: err %d code %d", paths[i],
              err, st.code);
        CHECK(strstr(st.message, paths[i]) != NULL, "message '%s'", st.message);
        CHECK(took < 1.0, "%s answered after %.3f s", paths[i], took);
    }
    sl_rpc_client_free(c);
}

static void test_garbage(void)
{
    static const char garbage[] = "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01";
    Sluice__Test__Num num = SLUICE__TEST__NUM__INIT;
    sl_rpc_client *c = new_client();
    sl_rpc_stream *s = NULL;
    sl_rpc_status st;
    char out[16] = "";
    int err;

    err = sl_rpc_client_unary_raw(c, "/sluice.test.Test/Echo", garbage, sizeof(garbage) - 1, 5000,
                                  &st);
    CHECK(err == SL_EINVAL && st.code == SL_RPC_INVALID_ARGUMENT, "err %d code %d", err, st.code);
    CHECK(strstr(st.message, "sluice.test.EchoRequest") != NULL, "message '%s'", st.message);

    /* Garbage in the middle of a client stream. */
    CHECK(sl_rpc_stream_open(&s, c, "/sluice.test.Test/Sum", 5000) == 0, "open");
    num.value = 1;
    sl_rpc_stream_write(s, &num.base, 0);
    sl_rpc_stream_write_raw(s, garbage, sizeof(garbage) - 1, 0);
    sl_rpc_stream_close_send(s);
    err = sl_rpc_stream_finish(s, &st);
    CHECK(err == SL_EINVAL && st.code == SL_RPC_INVALID_ARGUMENT, "stream err %d code %d", err,
          st.code);
    CHECK(strstr(st.message, "message is") == st.message, "layer's message '%s'", st.message);
    sl_rpc_stream_free(s);

    /* A method with on_bad_message answers it itself (Chat). */
    CHECK(sl_rpc_stream_open(&s, c, "/sluice.test.Test/Chat", 5000) == 0, "open chat");
    sl_rpc_stream_write_raw(s, garbage, sizeof(garbage) - 1, 0);
    sl_rpc_stream_close_send(s);
    err = sl_rpc_stream_finish(s, &st);
    CHECK(err == SL_EINVAL && st.code == SL_RPC_INVALID_ARGUMENT, "chat err %d code %d", err,
          st.code);
    CHECK(strstr(st.message, "chat refused: message is") == st.message, "chat message '%s'",
          st.message);
    sl_rpc_stream_free(s);

    /* The server still serves. */
    CHECK(echo(c, "still", 0, 0, 5000, &st, out, sizeof(out)) == 0 && strcmp(out, "still") == 0,
          "after garbage: %s", st.message);
    sl_rpc_client_free(c);
}

/* protobuf-c accepts any bytes in a string field and cuts it at a NUL; the layer refuses both. */
static void test_strings(void)
{
    static const struct {
        const char *bytes;
        size_t len;
        int ok;
    } cases[] = {
        {"\x0a\x03"
         "a\0b",
         5, 0},                             /* embedded NUL */
        {"\x0a\x02\xff\xfe", 4, 0},         /* not UTF-8 */
        {"\x0a\x02\xc0\xaf", 4, 0},         /* overlong encoding */
        {"\x0a\x03\xed\xa0\x80", 5, 0},     /* surrogate */
        {"\x0a\x02\xc3\xa9", 4, 1},         /* e-acute */
        {"\x0a\x04\xf0\x9f\x98\x80", 6, 1}, /* emoji */
        {"\x12\x02\x00\xff", 4, 1},         /* bytes field: anything goes */
    };
    sl_rpc_client *c = new_client();

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        sl_rpc_status st;
        int err = sl_rpc_client_unary_raw(c, "/sluice.test.Test/Echo", cases[i].bytes, cases[i].len,
                                          5000, &st);
        if (cases[i].ok) {
            CHECK(err == 0, "case %zu refused: %s", i, st.message);
        } else {
            CHECK(err == SL_EINVAL && strstr(st.message, "field 'text'"), "case %zu: %d '%s'", i,
                  err, st.message);
        }
    }
    sl_rpc_client_free(c);
}

/* A message that is only a bytes field is decoded with one copy (codec.c's fast path, on the
 * server for the request and on the client for the response); it must give what protobuf-c gives,
 * and leave every other shape to protobuf-c. */
static void test_bytes_field(void)
{
    static const size_t sizes[] = {1, 127, 128, 16383, 16384, 16385, 60000};
    static const struct {
        const char *bytes;
        size_t len;
        int ok;
    } raw[] = {
        {"\x12\x03"
         "abc",
         5, 1}, /* payload only */
        {"\x12\x05"
         "abc",
         5, 0}, /* length beyond the message */
        {"\x12\x02"
         "abc",
         5, 0}, /* trailing garbage */
        {"\x12\x01"
         "a\x12\x01"
         "b",
         6, 1},                                  /* the field twice: protobuf-c's path */
        {"\x92\x80\x80\x80\x80\x00\x01x", 8, 0}, /* 6-byte tag: protobuf-c refuses */
        {"\x12\x81\x80\x80\x80\x00x", 7, 1},     /* 5-byte length prefix */
        {"\x12\x81\x80\x80\x80\x80\x00x", 8, 0}, /* 6-byte length prefix */
        {"\x12\x00", 2, 1},                      /* empty payload */
    };
    sl_rpc_client *c = new_client();
    uint8_t *buf = malloc(60000);

    for (size_t i = 0; i < 60000; i++)
        buf[i] = (uint8_t)(i * 131 + (i >> 8));
    for (size_t k = 0; k < 2 * sizeof(sizes) / sizeof(sizes[0]); k++) {
        Sluice__Test__EchoRequest req = SLUICE__TEST__ECHO_REQUEST__INIT;
        Sluice__Test__EchoResponse *resp = NULL;
        size_t n = sizes[k / 2];
        sl_rpc_status st;
        int err;

        req.payload.data = buf;
        req.payload.len = n;
        req.text = (char *)(k % 2 ? "with text" : ""); /* text: the general path */
        err = sl_rpc_client_unary(c, "/sluice.test.Test/Echo", &req.base,
                                  &sluice__test__echo_response__descriptor,
                                  (ProtobufCMessage **)&resp, 5000, &st);
        CHECK(err == 0 && resp, "size %zu: %d %s", n, err, st.message);
        if (resp) {
            CHECK(resp->payload.len == n && memcmp(resp->payload.data, buf, n) == 0,
                  "size %zu: payload of %zu bytes differs", n, resp->payload.len);
            CHECK(strcmp(resp->text, req.text) == 0, "size %zu: text '%s'", n, resp->text);
            protobuf_c_message_free_unpacked(&resp->base, NULL);
        }
    }
    for (size_t i = 0; i < sizeof(raw) / sizeof(raw[0]); i++) {
        sl_rpc_status st;
        int err = sl_rpc_client_unary_raw(c, "/sluice.test.Test/Echo", raw[i].bytes, raw[i].len,
                                          5000, &st);
        if (raw[i].ok)
            CHECK(err == 0, "raw case %zu refused: %s", i, st.message);
        else
            CHECK(err == SL_EINVAL && st.code == SL_RPC_INVALID_ARGUMENT, "raw case %zu: %d '%s'",
                  i, err, st.message);
    }
    free(buf);
    sl_rpc_client_free(c);
}

static int fill_pattern(void *dst, size_t len, void *arg)
{
    uint8_t *p = dst;

    (void)arg;
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(i * 131 + (i >> 8));
    return 0;
}

static int fill_fails(void *dst, size_t len, void *arg)
{
    (void)dst;
    (void)len;
    (void)arg;
    return -EIO;
}

/* sl_rpc_stream_write_bytes frames a one-field message by hand, filled in place: the server must
 * decode exactly what sl_rpc_stream_write would have sent (Echo's payload, field 2, echoed back
 * over a stream opened on the unary method). */
static void test_write_bytes(void)
{
    static const size_t sizes[] = {1, 127, 128, 16384, 60000};
    sl_rpc_client *c = new_client();
    uint8_t *want = malloc(60000);

    fill_pattern(want, 60000, NULL);
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        sl_rpc_stream *s = NULL;
        ProtobufCMessage *msg = NULL;
        sl_rpc_status st;
        int r;

        CHECK(sl_rpc_stream_open(&s, c, "/sluice.test.Test/Echo", 5000) == 0, "open");
        CHECK(sl_rpc_stream_write_bytes(s, 2, sizes[k], 0, fill_pattern, NULL) == 0, "write %zu",
              sizes[k]);
        CHECK(sl_rpc_stream_close_send(s) == 0, "close_send");
        r = sl_rpc_stream_read(s, &sluice__test__echo_response__descriptor, &msg);
        CHECK(r == 1, "size %zu: read %d", sizes[k], r);
        if (r == 1) {
            Sluice__Test__EchoResponse *m = (void *)msg;
            CHECK(m->payload.len == sizes[k] && memcmp(m->payload.data, want, sizes[k]) == 0 &&
                      m->text[0] == '\0',
                  "size %zu: payload of %zu bytes differs", sizes[k], m->payload.len);
            protobuf_c_message_free_unpacked(msg, NULL);
        }
        CHECK(sl_rpc_stream_finish(s, &st) == 0, "status %d %s", st.code, st.message);
        sl_rpc_stream_free(s);
    }
    {
        sl_rpc_stream *s = NULL;

        CHECK(sl_rpc_stream_open(&s, c, "/sluice.test.Test/Echo", 5000) == 0, "open");
        CHECK(sl_rpc_stream_write_bytes(s, 2, 10, 0, fill_fails, NULL) == -EIO, "fill error");
        CHECK(sl_rpc_stream_write_bytes(s, 0, 10, 0, fill_pattern, NULL) == SL_EINVAL, "field 0");
        CHECK(sl_rpc_stream_write_bytes(s, 1u << 29, 10, 0, fill_pattern, NULL) == SL_EINVAL,
              "field 2^29");
        sl_rpc_stream_free(s);
    }
    free(want);
    sl_rpc_client_free(c);
}

/* ---- bytes_field: the server takes data fields as the buffers they arrived in ---- */

static uint64_t fnv_update(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static int fill_from(void *dst, size_t len, void *arg)
{
    memcpy(dst, arg, len);
    return 0;
}

/* Finish a Digest stream and compare what the server saw with what was sent. */
static void digest_check(sl_rpc_stream *s, const char *what, uint64_t bytes, uint64_t fnv,
                         uint64_t messages, uint64_t labels)
{
    ProtobufCMessage *msg = NULL;
    sl_rpc_status st;
    int r;

    CHECK(sl_rpc_stream_close_send(s) == 0, "%s: close_send", what);
    r = sl_rpc_stream_read(s, &sluice__test__digest_response__descriptor, &msg);
    CHECK(r == 1, "%s: read %d", what, r);
    if (r == 1) {
        const Sluice__Test__DigestResponse *d = (const void *)msg;
        CHECK(d->bytes == bytes && d->fnv == fnv && d->messages == messages &&
                  d->labels == labels && d->mismatches == 0,
              "%s: server saw %" PRIu64 " bytes (fnv %016" PRIx64 ") in %" PRIu64
              " messages, %" PRIu64 " labels, %" PRIu64 " mismatches; sent %" PRIu64
              " bytes (fnv %016" PRIx64 ") in %" PRIu64 " messages, %" PRIu64 " labels",
              what, d->bytes, d->fnv, d->messages, d->labels, d->mismatches, bytes, fnv, messages,
              labels);
        /* Every message of the data has at least one range; never more than a few per KiB. */
        CHECK(d->ranges >= d->messages && d->ranges <= d->messages * 64 + bytes / 1024,
              "%s: %" PRIu64 " ranges for %" PRIu64 " messages", what, d->ranges, d->messages);
        protobuf_c_message_free_unpacked(msg, NULL);
    }
    CHECK(sl_rpc_stream_finish(s, &st) == 0, "%s: status %d %s", what, st.code, st.message);
}

static void test_bytes_slices(void)
{
    /* Sizes around the 16 KiB HTTP/2 frame and around varint steps; sent back to back with the
     * write hint, so message boundaries (and the tag and length in front of the data) fall at
     * many places inside the transport's buffers. */
    static const size_t sizes[] = {
        1,     2,     127,    128,        129, 16370,          16379,           16384, 16389, 16390,
        65535, 65536, 100003, (1u << 20), 3,   (1u << 20) + 3, (3u << 20) + 17, 16381, 5};
    static const struct {
        const char *bytes;
        size_t len;
        const char *data; /* what the server must see as data, NULL: a label */
    } raw[] = {
        {"\x12\x03"
         "abc\x18\x07",
         7, "abc"}, /* data, then another field: protobuf-c's path, its buffer adopted */
        {"\x18\x07\x12\x03"
         "abc",
         7, "abc"}, /* another field first */
        {"\x12\x01"
         "a\x12\x02"
         "bc",
         7, "bc"}, /* the field twice: the last one counts */
        {"\x0a\x01L\x12\x02"
         "xy",
         7, "xy"},                        /* label, then data in the same oneof */
        {"\x12\x02xy\x0a\x01L", 7, NULL}, /* data, then label: a label */
        {"\x12\x83\x80\x80\x80\x00"
         "abc",
         9, "abc"},          /* 5-byte length prefix, still taken as received */
        {"\x12\x00", 2, ""}, /* empty data: no bytes to take */
    };
    size_t max = (3u << 20) + 17;
    uint8_t *buf = malloc(max);
    sl_testsrv *srv = NULL;
    sl_rpc_client *c = NULL;
    sl_rpc_client_opts co;
    char tgt[64];
    uint64_t fnv = 0xcbf29ce484222325ull, bytes = 0, messages = 0, labels = 0;
    sl_rpc_stream *s = NULL;
    sl_rpc_status st;

    for (size_t i = 0; i < max; i++)
        buf[i] = (uint8_t)(i * 7 + (i >> 9) + (i >> 17));
    CHECK(sl_testsrv_start(&srv, 4 << 20, NULL) == 0, "start");
    if (!srv) {
        free(buf);
        return;
    }
    snprintf(tgt, sizeof(tgt), "127.0.0.1:%d", sl_testsrv_port(srv));
    memset(&co, 0, sizeof(co));
    CHECK(sl_rpc_client_new(&c, tgt, &co) == 0, "client");

    /* Packed messages, messages framed in place, and labels, in one stream. */
    CHECK(sl_rpc_stream_open(&s, c, "/sluice.test.Test/Digest", 60000) == 0, "open");
    for (size_t round = 0; round < 3; round++) {
        for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
            size_t n = sizes[k], off = (k * 4099 + round * 77) % 1000;
            const uint8_t *p = buf + off;
            int last = round == 2 && k + 1 == sizeof(sizes) / sizeof(sizes[0]);
            int flags = last ? 0 : SL_RPC_SEND_MORE, err;
            if (off + n > max)
                p = buf;
            if ((k + round) % 2) {
                Sluice__Test__Piece m = SLUICE__TEST__PIECE__INIT;
                m.kind_case = SLUICE__TEST__PIECE__KIND_DATA;
                m.data.data = (uint8_t *)p;
                m.data.len = n;
                err = sl_rpc_stream_write(s, &m.base, flags);
            } else {
                err = sl_rpc_stream_write_bytes(s, 2, n, flags, fill_from, (void *)p);
            }
            CHECK(err == 0, "write %zu: %d", n, err);
            fnv = fnv_update(fnv, p, n);
            bytes += n;
            messages++;
            if (k % 5 == 0) {
                Sluice__Test__Piece m = SLUICE__TEST__PIECE__INIT;
                m.kind_case = SLUICE__TEST__PIECE__KIND_LABEL;
                m.label = (char *)"label";
                m.tag = (uint32_t)k;
                CHECK(sl_rpc_stream_write(s, &m.base, flags) == 0, "write label");
                labels++;
            }
        }
    }
    digest_check(s, "stream", bytes, fnv, messages, labels);
    sl_rpc_stream_free(s);

    /* Other shapes of the message: decoded by protobuf-c, the data handed over the same way. */
    fnv = 0xcbf29ce484222325ull;
    bytes = messages = labels = 0;
    CHECK(sl_rpc_stream_open(&s, c, "/sluice.test.Test/Digest", 60000) == 0, "open");
    for (size_t i = 0; i < sizeof(raw) / sizeof(raw[0]); i++) {
        CHECK(sl_rpc_stream_write_raw(s, raw[i].bytes, raw[i].len, 0) == 0, "raw %zu", i);
        if (!raw[i].data) {
            labels++;
        } else if (raw[i].data[0]) {
            size_t n = strlen(raw[i].data);
            fnv = fnv_update(fnv, (const uint8_t *)raw[i].data, n);
            bytes += n;
            messages++;
        }
    }
    digest_check(s, "raw", bytes, fnv, messages, labels);
    sl_rpc_stream_free(s);

    /* A length beyond the message is refused as usual. */
    CHECK(sl_rpc_stream_open(&s, c, "/sluice.test.Test/Digest", 60000) == 0, "open");
    sl_rpc_stream_write_raw(s,
                            "\x12\x05"
                            "abc",
                            5, 0);
    sl_rpc_stream_close_send(s);
    CHECK(sl_rpc_stream_finish(s, &st) == SL_EINVAL && st.code == SL_RPC_INVALID_ARGUMENT,
          "bad length: %d %s", st.code, st.message);
    sl_rpc_stream_free(s);

    /* A client that goes away while its data is held: everything is released. */
    CHECK(sl_rpc_stream_open(&s, c, "/sluice.test.Test/Digest", 60000) == 0, "open");
    for (int i = 0; i < 4; i++)
        sl_rpc_stream_write_bytes(s, 2, 1u << 20, SL_RPC_SEND_MORE, fill_from, buf);
    sl_rpc_stream_cancel(s);
    sl_rpc_stream_free(s);

    sl_rpc_client_free(c);
    CHECK(sl_testsrv_stop(srv, 2000) == 0, "calls left at stop");
    free(buf);
}

/* A bytes_field that is not a singular bytes field of the request, or on a method that does not
 * stream requests, is refused when the server is created. */
static void test_bytes_field_checked(void)
{
    static const sl_rpc_method bad[][1] = {
        {{"Sum", SL_RPC_CLIENT_STREAM, &sluice__test__piece__descriptor,
          &sluice__test__digest_response__descriptor, 0, NULL, NULL, NULL, NULL,
          SLUICE__TEST__PIECE__KIND_LABEL, NULL, 0, 0, NULL}}, /* a string */
        {{"Sum", SL_RPC_CLIENT_STREAM, &sluice__test__piece__descriptor,
          &sluice__test__digest_response__descriptor, 0, NULL, NULL, NULL, NULL, 9, NULL, 0, 0,
          NULL}}, /* none */
        {{"Echo", SL_RPC_UNARY, &sluice__test__echo_request__descriptor,
          &sluice__test__echo_response__descriptor, 0, NULL, NULL, NULL, NULL, 2, NULL, 0, 0,
          NULL}}, /* unary */
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        sl_rpc_service svc = {.name = "sluice.test.Test", .methods = bad[i], .n_methods = 1};
        const sl_rpc_service *svcs[1] = {&svc};
        sl_rpc_server_opts opts;
        sl_rpc_server *srv = NULL;
        uv_loop_t loop;
        int err;

        uv_loop_init(&loop);
        memset(&opts, 0, sizeof(opts));
        opts.listen = "127.0.0.1:0";
        err = sl_rpc_server_new(&srv, &loop, &opts, svcs, 1);
        CHECK(err == SL_EINVAL && !srv, "case %zu: %d", i, err);
        uv_run(&loop, UV_RUN_DEFAULT);
        uv_loop_close(&loop);
    }
}

typedef struct worker {
    sl_rpc_client *c;
    int ok;
} worker;

static void *unary_worker(void *arg)
{
    worker *w = arg;
    sl_rpc_status st;
    char out[16];

    for (int i = 0; i < 200; i++)
        if (echo(w->c, "x", 0, 0, 5000, &st, out, sizeof(out)) == 0 && strcmp(out, "x") == 0)
            w->ok++;
    return NULL;
}

static void test_concurrent(void)
{
    sl_rpc_client *c = new_client();
    pthread_t t[8];
    worker w[8];
    int ok = 0;

    for (int i = 0; i < 8; i++) {
        w[i] = (worker){c, 0};
        pthread_create(&t[i], NULL, unary_worker, &w[i]);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        ok += w[i].ok;
    }
    CHECK(ok == 1600, "%d of 1600 calls succeeded", ok);
    sl_rpc_client_free(c);
}

static void test_async(void)
{
    Sluice__Test__EchoRequest req = SLUICE__TEST__ECHO_REQUEST__INIT;
    sl_rpc_client *c = new_client();
    sl_rpc_async *a = NULL;
    char texts[50][8];
    int seen[50] = {0}, ok = 0;

    CHECK(sl_rpc_async_new(&a, c) == 0, "async_new");
    for (int i = 0; i < 50; i++) {
        snprintf(texts[i], sizeof(texts[i]), "m%d", i);
        req.text = texts[i];
        CHECK(sl_rpc_async_start(a, "/sluice.test.Test/Echo", &req.base, 5000, &seen[i]) == 0,
              "start %d", i);
    }
    CHECK(sl_rpc_async_pending(a) == 50, "pending %zu", sl_rpc_async_pending(a));
    while (sl_rpc_async_pending(a) > 0) {
        ProtobufCMessage *resp = NULL;
        sl_rpc_status st;
        void *user = NULL;
        int err = sl_rpc_async_wait(a, &sluice__test__echo_response__descriptor, &resp, &user, &st);
        int i = (int)((int *)user - seen);
        CHECK(err == 0 && i >= 0 && i < 50, "wait: %d %s", err, st.message);
        if (err == 0 && i >= 0 && i < 50) {
            seen[i]++;
            if (strcmp(((Sluice__Test__EchoResponse *)resp)->text, texts[i]) == 0)
                ok++;
        }
        if (resp)
            protobuf_c_message_free_unpacked(resp, NULL);
    }
    CHECK(ok == 50, "%d of 50 async answers matched", ok);
    CHECK(sl_rpc_async_wait(a, NULL, NULL, NULL, NULL) == SL_ESTATE, "wait with nothing pending");
    /* Freeing with calls in flight cancels them. */
    req.text = "slow";
    req.delay_ms = 5000;
    sl_rpc_async_start(a, "/sluice.test.Test/Echo", &req.base, 10000, NULL);
    sl_rpc_async_free(a);
    CHECK(wait_idle(c, 3.0) == 0, "cancelled async call left state on the server");
    sl_rpc_client_free(c);
}

typedef struct delayed_call {
    sl_rpc_client *c;
    int err;
} delayed_call;

static void *delayed_echo(void *arg)
{
    delayed_call *d = arg;
    sl_rpc_status st;

    d->err = echo(d->c, "late", 300, 0, 10000, &st, NULL, 0);
    return NULL;
}

/* Graceful shutdown: an in-flight unary call finishes within the grace period, an endless stream
 * is cancelled when it expires, and no call state is left. */
static void test_shutdown(void)
{
    Sluice__Test__CountRequest req = SLUICE__TEST__COUNT_REQUEST__INIT;
    sl_testsrv *srv = NULL;
    sl_rpc_client *c;
    sl_rpc_stream *s = NULL;
    ProtobufCMessage *msg;
    sl_rpc_status st;
    delayed_call d;
    pthread_t t;
    char tgt[64];
    double t0;
    size_t left;
    int r;

    CHECK(sl_testsrv_start(&srv, 0, NULL) == 0, "start");
    snprintf(tgt, sizeof(tgt), "127.0.0.1:%d", sl_testsrv_port(srv));
    sl_rpc_client_new(&c, tgt, NULL);
    req.count = 0;
    sl_rpc_stream_open(&s, c, "/sluice.test.Test/Count", 0);
    sl_rpc_stream_write(s, &req.base, 0);
    sl_rpc_stream_close_send(s);
    r = sl_rpc_stream_read(s, &sluice__test__count_response__descriptor, &msg);
    CHECK(r == 1, "stream read %d", r);
    if (r == 1)
        protobuf_c_message_free_unpacked(msg, NULL);
    d.c = c;
    pthread_create(&t, NULL, delayed_echo, &d);
    usleep(100000); /* let the delayed call arrive */
    t0 = now_s();
    left = sl_testsrv_stop(srv, 1000);
    CHECK(left == 0, "%zu calls left after shutdown", left);
    CHECK(now_s() - t0 < 3.0, "shutdown took %.3f s", now_s() - t0);
    pthread_join(t, NULL);
    CHECK(d.err == 0, "in-flight call during grace: err %d", d.err);
    while ((r = sl_rpc_stream_read(s, &sluice__test__count_response__descriptor, &msg)) == 1)
        protobuf_c_message_free_unpacked(msg, NULL);
    r = sl_rpc_stream_finish(s, &st);
    CHECK(r != 0 && st.code != SL_RPC_OK, "endless stream ended with %s",
          sl_rpc_code_name(st.code));
    sl_rpc_stream_free(s);
    sl_rpc_client_free(c);
}

/* Certificates made by the openssl CLI: a CA, a server certificate for 127.0.0.1 and a client
 * certificate signed by it, and a second, unrelated CA with its own client certificate. */
static int make_certs(const char *dir)
{
    char cmd[4096];

    snprintf(cmd, sizeof(cmd),
             "set -e; cd '%s'; exec >/dev/null 2>&1;"
             "for ca in ca other; do"
             " openssl req -x509 -newkey rsa:2048 -nodes -keyout $ca.key -out $ca.pem -days 2"
             "  -subj /CN=$ca-test-ca; done;"
             "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > san.ext;"
             "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr"
             " -subj /CN=127.0.0.1;"
             "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial"
             " -out server.pem -days 2 -extfile san.ext;"
             "for c in client:ca rogue:other; do n=${c%%:*}; ca=${c#*:};"
             " openssl req -newkey rsa:2048 -nodes -keyout $n.key -out $n.csr -subj /CN=$n;"
             " openssl x509 -req -in $n.csr -CA $ca.pem -CAkey $ca.key -CAcreateserial"
             "  -out $n.pem -days 2; done",
             dir);
    return system(cmd);
}

static int tls_echo(const char *tgt, const sl_rpc_tls *tls, sl_rpc_status *st)
{
    sl_rpc_client_opts opts = {.tls = tls};
    sl_rpc_client *c = NULL;
    char out[16] = "";
    int err = sl_rpc_client_new(&c, tgt, &opts);

    if (err)
        return err;
    err = echo(c, "tls", 0, 0, 3000, st, out, sizeof(out));
    if (err == 0 && strcmp(out, "tls") != 0)
        err = SL_EPROTO;
    sl_rpc_client_free(c);
    return err;
}

static void test_tls(void)
{
    char dir[] = "/tmp/sluice-tls-XXXXXX", p[16][300], tgt[64], cmd[400];
    const char *names[] = {"ca.pem",     "server.pem", "server.key", "client.pem",
                           "client.key", "other.pem",  "rogue.pem",  "rogue.key"};
    sl_testsrv *srv = NULL;
    sl_rpc_status st;
    int err;

    if (!mkdtemp(dir) || make_certs(dir) != 0) {
        CHECK(0, "cannot make certificates with the openssl CLI in %s", dir);
        return;
    }
    for (int i = 0; i < 8; i++)
        snprintf(p[i], sizeof(p[i]), "%s/%s", dir, names[i]);
    sl_rpc_tls server_tls = {p[1], p[2], NULL};
    sl_rpc_tls server_mtls = {p[1], p[2], p[0]};
    sl_rpc_tls client_ca = {NULL, NULL, p[0]};
    sl_rpc_tls client_wrong_ca = {NULL, NULL, p[5]};
    sl_rpc_tls client_cert = {p[3], p[4], p[0]};
    sl_rpc_tls client_rogue = {p[6], p[7], p[0]};
    sl_rpc_tls missing = {"/nonexistent/cert.pem", p[2], NULL};
    sl_rpc_tls not_pem = {p[1], "/etc/hostname", NULL};

    /* Server-side TLS. */
    CHECK(sl_testsrv_start(&srv, 0, &server_tls) == 0, "tls server");
    snprintf(tgt, sizeof(tgt), "127.0.0.1:%d", sl_testsrv_port(srv));
    err = tls_echo(tgt, &client_ca, &st);
    CHECK(err == 0, "TLS client with the CA: %d %s", err, st.message);
    err = tls_echo(tgt, NULL, &st);
    CHECK(err != 0 && st.code == SL_RPC_UNAVAILABLE, "plaintext client accepted: %d", err);
    err = tls_echo(tgt, &client_wrong_ca, &st);
    CHECK(err != 0 && st.code == SL_RPC_UNAVAILABLE, "client trusting another CA: %d", err);
    CHECK(sl_testsrv_stop(srv, 500) == 0, "stop");

    /* mTLS: client certificates required and verified. */
    CHECK(sl_testsrv_start(&srv, 0, &server_mtls) == 0, "mtls server");
    snprintf(tgt, sizeof(tgt), "127.0.0.1:%d", sl_testsrv_port(srv));
    err = tls_echo(tgt, &client_cert, &st);
    CHECK(err == 0, "mTLS client with its certificate: %d %s", err, st.message);
    err = tls_echo(tgt, &client_ca, &st);
    CHECK(err != 0, "mTLS server accepted a client without a certificate");
    err = tls_echo(tgt, &client_rogue, &st);
    CHECK(err != 0, "mTLS server accepted a certificate from another CA");
    err = tls_echo(tgt, NULL, &st);
    CHECK(err != 0, "mTLS server accepted plaintext");
    CHECK(sl_testsrv_stop(srv, 500) == 0, "stop");

    /* Unreadable or non-PEM files are refused up front. */
    CHECK(sl_testsrv_start(&srv, 0, &missing) == -ENOENT, "missing certificate file");
    CHECK(sl_testsrv_start(&srv, 0, &not_pem) == SL_EINVAL, "non-PEM key file");
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

/* One unary exchange with `method` as a client holding `token`. */
static int auth_call(const char *tgt, const char *token, const char *method, sl_rpc_status *st)
{
    sl_rpc_client_opts opts = {.token = token};
    sl_rpc_client *c = NULL;
    int err = sl_rpc_client_new(&c, tgt, &opts);

    if (err)
        return err;
    /* Count streams one message for count=1; the other methods take an empty request. */
    if (strstr(method, "/Count"))
        err = sl_rpc_client_unary_raw(c, method, "\x08\x01", 2, 3000, st);
    else
        err = sl_rpc_client_unary_raw(c, method, "", 0, 3000, st);
    sl_rpc_client_free(c);
    return err;
}

static void test_auth(void)
{
    sl_testsrv *srv = NULL;
    sl_rpc_status st;
    char tgt[64];
    int err;

    CHECK(sl_testsrv_start_auth(&srv) == 0, "auth server");
    snprintf(tgt, sizeof(tgt), "127.0.0.1:%d", sl_testsrv_port(srv));
    err = auth_call(tgt, NULL, "/sluice.test.Test/Stats", &st);
    CHECK(err == 0, "public method without a token: %d %s", err, st.message);
    err = auth_call(tgt, NULL, "/sluice.test.Test/Echo", &st);
    CHECK(err == SL_EAUTH && st.code == SL_RPC_UNAUTHENTICATED, "no token: %d", err);
    CHECK(strstr(st.message, "/sluice.test.Test/Echo") != NULL, "message '%s'", st.message);
    err = auth_call(tgt, "bogus", "/sluice.test.Test/Echo", &st);
    CHECK(err == SL_EAUTH, "unknown token: %d", err);
    CHECK(strstr(st.message, "bogus") == NULL, "the token leaked into '%s'", st.message);
    err = auth_call(tgt, "r-token", "/sluice.test.Test/Echo", &st);
    CHECK(err == 0, "reader on a reader method: %d %s", err, st.message);
    err = auth_call(tgt, "r-token", "/sluice.test.Test/Count", &st);
    CHECK(err == SL_EPERM && st.code == SL_RPC_PERMISSION_DENIED, "reader on a writer method: %d",
          err);
    err = auth_call(tgt, "w-token", "/sluice.test.Test/Count", &st);
    CHECK(err == 0, "writer: %d %s", err, st.message);
    /* A method's scope (Echo's text) is authorized once its request is decoded; without a
     * token the call is refused before (a garbage request: UNAUTHENTICATED, not a decode
     * error). */
    {
        sl_rpc_client_opts opts = {.token = "r-token"};
        sl_rpc_client *c = NULL;
        CHECK(sl_rpc_client_new(&c, tgt, &opts) == 0, "client");
        err = sl_rpc_client_unary_raw(c, "/sluice.test.Test/Echo",
                                      "\x0a\x09"
                                      "forbidden",
                                      11, 3000, &st);
        CHECK(err == SL_EPERM && strstr(st.message, "scope 'forbidden'") != NULL,
              "forbidden scope: %d %s", err, st.message);
        err = sl_rpc_client_unary_raw(c, "/sluice.test.Test/Echo", "\x0a\x02ok", 4, 3000, &st);
        CHECK(err == 0, "allowed scope: %d %s", err, st.message);
        sl_rpc_client_free(c);
        opts.token = NULL;
        CHECK(sl_rpc_client_new(&c, tgt, &opts) == 0, "client");
        err =
            sl_rpc_client_unary_raw(c, "/sluice.test.Test/Echo", "\xff\xff\xff\xff", 4, 3000, &st);
        CHECK(err == SL_EAUTH, "garbage without a token: %d %s", err, st.message);
        sl_rpc_client_free(c);
    }
    CHECK(sl_testsrv_stop(srv, 500) == 0, "stop");
}

/* ---- limits: max_calls, per-key claims, the idle sweep (each on its own server) ---- */

/* Start a server with `lim` and point `target` at it; the previous target goes to `saved`. */
static sl_testsrv *start_limited(const sl_rpc_server_opts *lim, char *saved, size_t len)
{
    sl_testsrv *srv = NULL;
    int err = sl_testsrv_start_limits(&srv, lim);

    CHECK(err == 0, "start_limits: %d", err);
    if (err)
        return NULL;
    snprintf(saved, len, "%s", target);
    snprintf(target, sizeof(target), "127.0.0.1:%d", sl_testsrv_port(srv));
    return srv;
}

static void stop_limited(sl_testsrv *srv, const char *saved)
{
    size_t left = sl_testsrv_stop(srv, 2000);

    CHECK(left == 0, "%zu calls left at stop", left);
    snprintf(target, sizeof(target), "%s", saved);
}

/* A Count stream (forever, 1 KiB messages) whose first message was read, so the server holds it;
 * the client then stops reading. */
static sl_rpc_stream *open_count(sl_rpc_client *c, uint32_t payload)
{
    Sluice__Test__CountRequest req = SLUICE__TEST__COUNT_REQUEST__INIT;
    sl_rpc_stream *s = NULL;
    ProtobufCMessage *msg = NULL;
    int n;

    req.payload_size = payload;
    CHECK(sl_rpc_stream_open(&s, c, "/sluice.test.Test/Count", 60000) == 0, "open");
    CHECK(sl_rpc_stream_write(s, &req.base, 0) == 0, "write");
    CHECK(sl_rpc_stream_close_send(s) == 0, "close_send");
    n = sl_rpc_stream_read(s, &sluice__test__count_response__descriptor, &msg);
    CHECK(n == 1, "first message: %d", n);
    if (msg)
        protobuf_c_message_free_unpacked(msg, NULL);
    return s;
}

/* Echo until it answers OK (calls are released asynchronously), for up to 60 s. */
static int echo_until_ok(sl_rpc_client *c, const char *text, sl_rpc_status *st)
{
    double end = now_s() + 60.0;
    int err;

    while ((err = echo(c, text, 0, 0, 10000, st, NULL, 0)) != 0 && now_s() < end)
        usleep(20000);
    return err;
}

static void test_max_calls(void)
{
    sl_rpc_server_opts lim = {0};
    Sluice__Test__Num num = SLUICE__TEST__NUM__INIT;
    char saved[64];
    sl_testsrv *srv;
    sl_rpc_client *c;
    sl_rpc_stream *s[2], *sum = NULL;
    sl_rpc_status st;
    int err;

    lim.max_calls = 2;
    if (!(srv = start_limited(&lim, saved, sizeof(saved))))
        return;
    c = new_client();
    s[0] = open_count(c, 1024);
    s[1] = open_count(c, 1024);
    /* Both slots are taken: a unary call and a client stream are refused at once. */
    err = echo(c, "third", 0, 0, 5000, &st, NULL, 0);
    CHECK(err == SL_ELIMIT && st.code == SL_RPC_RESOURCE_EXHAUSTED, "err %d code %d '%s'", err,
          st.code, st.message);
    CHECK(strstr(st.message, "too many concurrent calls (limit 2)") != NULL, "message '%s'",
          st.message);
    CHECK(sl_rpc_stream_open(&sum, c, "/sluice.test.Test/Sum", 10000) == 0, "open sum");
    num.value = 1;
    sl_rpc_stream_write(sum, &num.base, 0); /* may fail: the call may already be over */
    sl_rpc_stream_close_send(sum);
    err = sl_rpc_stream_finish(sum, &st);
    CHECK(st.code == SL_RPC_RESOURCE_EXHAUSTED && strstr(st.message, "limit 2"),
          "sum: err %d code %d '%s'", err, st.code, st.message);
    sl_rpc_stream_free(sum);
    /* Ending the streams frees their slots. */
    for (int i = 0; i < 2; i++) {
        sl_rpc_stream_cancel(s[i]);
        sl_rpc_stream_free(s[i]);
    }
    err = echo_until_ok(c, "again", &st);
    CHECK(err == 0, "echo after the streams ended: %d '%s'", err, st.message);
    sl_rpc_client_free(c);
    stop_limited(srv, saved);
}

static void test_max_key_calls(void)
{
    Sluice__Test__EchoRequest req = SLUICE__TEST__ECHO_REQUEST__INIT;
    static const char *const texts[3] = {"k", "k", "other"};
    sl_rpc_server_opts lim = {0};
    sl_rpc_stream *slow[3] = {NULL, NULL, NULL};
    char saved[64];
    sl_testsrv *srv;
    sl_rpc_client *c;
    sl_rpc_status st;
    int err;

    lim.max_key_calls = 2;
    if (!(srv = start_limited(&lim, saved, sizeof(saved))))
        return;
    c = new_client();
    /* Two slow calls under key "k" and one under "other" hold their claims. They go through
     * the stream API, whose writes return once the transport took the request. */
    req.delay_ms = 60000;
    for (int i = 0; i < 3; i++) {
        req.text = (char *)texts[i];
        CHECK(sl_rpc_stream_open(&slow[i], c, "/sluice.test.Test/Echo", 60000) == 0, "open");
        CHECK(sl_rpc_stream_write(slow[i], &req.base, 0) == 0, "write");
        CHECK(sl_rpc_stream_close_send(slow[i]) == 0, "close_send");
    }
    /* Wait until the server holds all three (a quick "k" call sent meanwhile could take a
     * slow one's place), then a third "k" is refused. */
    CHECK(wait_live(c, 3, 60.0) == 3, "slow calls not all live");
    err = echo(c, "k", 0, 0, 10000, &st, NULL, 0);
    CHECK(err == SL_ELIMIT && st.code == SL_RPC_RESOURCE_EXHAUSTED, "err %d code %d '%s'", err,
          st.code, st.message);
    CHECK(strstr(st.message, "too many concurrent echo streams for text 'k' (limit 2)") != NULL,
          "message '%s'", st.message);
    /* Another key is not affected. */
    err = echo(c, "other", 0, 0, 10000, &st, NULL, 0);
    CHECK(err == 0, "other key: %d '%s'", err, st.message);
    for (int i = 0; i < 3; i++) {
        sl_rpc_stream_cancel(slow[i]);
        sl_rpc_stream_free(slow[i]);
    }
    err = echo_until_ok(c, "k", &st);
    CHECK(err == 0, "echo after the slow calls ended: %d '%s'", err, st.message);
    CHECK(wait_idle(c, 30.0) == 0, "call state left");
    sl_rpc_client_free(c);
    stop_limited(srv, saved);
}

static void test_idle_timeout(void)
{
    Sluice__Test__Num num = SLUICE__TEST__NUM__INIT;
    sl_rpc_server_opts lim = {0};
    ProtobufCMessage *msg;
    char saved[64], out[16] = "";
    sl_testsrv *srv;
    sl_rpc_client *c;
    sl_rpc_stream *s = NULL;
    sl_rpc_status st;
    int err, n, got = 0;

    lim.idle_timeout_ms = 300;
    if (!(srv = start_limited(&lim, saved, sizeof(saved))))
        return;
    c = new_client();
    /* A client stream that sends nothing, and one that stops after a message. The client's own
     * deadline (30 s) only keeps a broken server from hanging the test. */
    for (int i = 0; i < 2; i++) {
        CHECK(sl_rpc_stream_open(&s, c, "/sluice.test.Test/Sum", 30000) == 0, "open sum");
        num.value = 5;
        if (i == 1)
            CHECK(sl_rpc_stream_write(s, &num.base, 0) == 0, "write");
        err = sl_rpc_stream_finish(s, &st);
        CHECK(st.code == SL_RPC_DEADLINE_EXCEEDED && strstr(st.message, "no message for 0.3 s"),
              "sum %d: err %d code %d '%s'", i, err, st.code, st.message);
        sl_rpc_stream_free(s);
    }
    /* A server stream whose client stops reading: the server's sends stop completing, and the
     * sweep ends it. The client then reads what was buffered and gets the status. */
    s = open_count(c, 16384);
    usleep(1500 * 1000);
    while (got < 20000 &&
           (n = sl_rpc_stream_read(s, &sluice__test__count_response__descriptor, &msg)) == 1) {
        protobuf_c_message_free_unpacked(msg, NULL);
        got++;
    }
    err = sl_rpc_stream_finish(s, &st);
    CHECK(st.code == SL_RPC_DEADLINE_EXCEEDED && strstr(st.message, "no send progress for 0.3 s"),
          "count: err %d code %d '%s' after %d messages", err, st.code, st.message, got);
    printf("  stalled stream ended after %d buffered messages\n", got);
    sl_rpc_stream_free(s);
    /* A call that waits for the handler (not the client) is not idle. */
    err = echo(c, "slow", 1000, 0, 30000, &st, out, sizeof(out));
    CHECK(err == 0 && strcmp(out, "slow") == 0, "slow echo: %d '%s'", err, st.message);
    CHECK(wait_idle(c, 30.0) == 0, "call state left");
    sl_rpc_client_free(c);
    stop_limited(srv, saved);
}

/* A Digest stream that sends `n` pieces 100 ms apart: labels (no progress with handler_progress)
 * or 1 KiB of data; returns the status. */
static void drip_digest(sl_rpc_client *c, int data, int n, sl_rpc_status *st)
{
    Sluice__Test__Piece p = SLUICE__TEST__PIECE__INIT;
    uint8_t buf[1024] = {0};
    ProtobufCMessage *msg = NULL;
    sl_rpc_stream *s = NULL;

    if (data) {
        p.kind_case = SLUICE__TEST__PIECE__KIND_DATA;
        p.data.data = buf;
        p.data.len = sizeof(buf);
    } else {
        p.kind_case = SLUICE__TEST__PIECE__KIND_LABEL;
        p.label = "tick";
    }
    CHECK(sl_rpc_stream_open(&s, c, "/sluice.test.Test/Digest", 30000) == 0, "open digest");
    for (int i = 0; i < n && sl_rpc_stream_write(s, &p.base, 0) == 0; i++)
        usleep(100 * 1000);
    sl_rpc_stream_close_send(s);
    /* The answer must be read before the status arrives. */
    if (sl_rpc_stream_read(s, &sluice__test__digest_response__descriptor, &msg) == 1)
        protobuf_c_message_free_unpacked(msg, NULL);
    sl_rpc_stream_finish(s, st);
    sl_rpc_stream_free(s);
}

/* handler_progress: messages the handler does not call progress do not keep a call alive. */
static void test_handler_progress(void)
{
    sl_rpc_server_opts lim = {0};
    char saved[64];
    sl_testsrv *srv;
    sl_rpc_client *c;
    sl_rpc_status st;

    lim.idle_timeout_ms = 300;
    if (!(srv = start_limited(&lim, saved, sizeof(saved))))
        return;
    c = new_client();
    /* Labels every 100 ms for 2 s: ended as idle after the timeout. */
    drip_digest(c, 0, 20, &st);
    CHECK(st.code == SL_RPC_DEADLINE_EXCEEDED && strstr(st.message, "no progress for 0.3 s"),
          "labels: code %d '%s'", st.code, st.message);
    /* Data every 100 ms for 1 s: progress, answered at the end. */
    drip_digest(c, 1, 10, &st);
    CHECK(st.code == SL_RPC_OK, "data: code %d '%s'", st.code, st.message);
    CHECK(wait_idle(c, 30.0) == 0, "call state left");
    sl_rpc_client_free(c);
    stop_limited(srv, saved);
}

/* send_budget: a reader that stops reading holds at most the budget in queued messages. */
static void test_send_budget(void)
{
    sl_rpc_server_opts lim = {0};
    ProtobufCMessage *msg;
    char saved[64];
    sl_testsrv *srv;
    sl_rpc_client *c;
    sl_rpc_stream *s;
    int n = 0;

    if (!(srv = start_limited(&lim, saved, sizeof(saved))))
        return;
    c = new_client();
    /* 16 KiB messages: without the budget the window of 64 queued messages takes 1 MiB. */
    s = open_count(c, 16384);
    usleep(1000 * 1000);
    CHECK(sl_testsrv_max_send_bytes(srv) <= SL_TESTSRV_COUNT_BUDGET,
          "stalled reader: %zu bytes queued, budget %u", sl_testsrv_max_send_bytes(srv),
          SL_TESTSRV_COUNT_BUDGET);
    /* The stream still flows once the client reads. */
    while (n < 500 && sl_rpc_stream_read(s, &sluice__test__count_response__descriptor, &msg) == 1) {
        protobuf_c_message_free_unpacked(msg, NULL);
        n++;
    }
    CHECK(n == 500, "read %d messages", n);
    CHECK(sl_testsrv_max_send_bytes(srv) <= SL_TESTSRV_COUNT_BUDGET, "%zu bytes queued",
          sl_testsrv_max_send_bytes(srv));
    printf("  at most %zu bytes queued\n", sl_testsrv_max_send_bytes(srv));
    sl_rpc_stream_cancel(s);
    sl_rpc_stream_free(s);
    CHECK(wait_idle(c, 30.0) == 0, "call state left");
    sl_rpc_client_free(c);
    stop_limited(srv, saved);
}

/* ---- admission on the completion-queue threads (a server of its own: testsvc does not set
 * these limits) ---- */

typedef struct adm_srv {
    uv_loop_t loop;
    uv_async_t stop;
    sl_rpc_server *srv;
    pthread_t thread;
    atomic_int starts;   /* Sum calls that reached their handler */
    atomic_int block_ms; /* Echo holds the loop this long */
    sl_rpc_method methods[2];
    sl_rpc_service svc;
    char target[64];
} adm_srv;

static void adm_echo(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    const Sluice__Test__EchoRequest *req = (const void *)msg;
    Sluice__Test__EchoResponse resp = SLUICE__TEST__ECHO_RESPONSE__INIT;
    adm_srv *a = arg;

    if (req->delay_ms)
        usleep((useconds_t)atomic_load(&a->block_ms) * 1000u); /* the whole loop waits */
    resp.text = req->text;
    sl_rpc_call_reply(call, &resp.base);
}

static void adm_sum_start(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    adm_srv *a = arg;

    atomic_fetch_add(&a->starts, 1);
    sl_rpc_call_read(call);
}

static void adm_sum_message(sl_rpc_call *call, const ProtobufCMessage *msg, void *arg)
{
    Sluice__Test__SumResponse resp = SLUICE__TEST__SUM_RESPONSE__INIT;

    if (msg) {
        sl_rpc_call_read(call);
        return;
    }
    sl_rpc_call_reply(call, &resp.base);
}

static void adm_stopped(void *arg)
{
    adm_srv *a = arg;

    uv_close((uv_handle_t *)&a->stop, NULL);
}

static void adm_on_stop(uv_async_t *h)
{
    adm_srv *a = h->data;

    sl_rpc_server_shutdown(a->srv, 1000, adm_stopped, a);
}

static void *adm_main(void *arg)
{
    adm_srv *a = arg;

    uv_run(&a->loop, UV_RUN_DEFAULT);
    return NULL;
}

static adm_srv *adm_start(int max_peer_calls, int max_pending)
{
    adm_srv *a = calloc(1, sizeof(*a));
    const sl_rpc_service *svcs[1];
    sl_rpc_server_opts o;
    int err;

    uv_loop_init(&a->loop);
    uv_async_init(&a->loop, &a->stop, adm_on_stop);
    a->stop.data = a;
    a->methods[0] = (sl_rpc_method){.name = "Echo",
                                    .kind = SL_RPC_UNARY,
                                    .request = &sluice__test__echo_request__descriptor,
                                    .response = &sluice__test__echo_response__descriptor,
                                    .on_start = adm_echo};
    a->methods[1] = (sl_rpc_method){.name = "Sum",
                                    .kind = SL_RPC_CLIENT_STREAM,
                                    .request = &sluice__test__num__descriptor,
                                    .response = &sluice__test__sum_response__descriptor,
                                    .on_start = adm_sum_start,
                                    .on_message = adm_sum_message};
    a->svc = (sl_rpc_service){
        .name = "sluice.test.Test", .methods = a->methods, .n_methods = 2, .arg = a};
    svcs[0] = &a->svc;
    memset(&o, 0, sizeof(o));
    o.listen = "127.0.0.1:0";
    o.max_peer_calls = max_peer_calls;
    o.max_pending = max_pending;
    err = sl_rpc_server_new(&a->srv, &a->loop, &o, svcs, 1);
    CHECK(err == 0, "server_new: %d", err);
    snprintf(a->target, sizeof(a->target), "127.0.0.1:%d", sl_rpc_server_port(a->srv));
    pthread_create(&a->thread, NULL, adm_main, a);
    return a;
}

static void adm_stop(adm_srv *a)
{
    uv_async_send(&a->stop);
    pthread_join(a->thread, NULL);
    CHECK(sl_rpc_server_live_calls(a->srv) == 0, "%zu calls left",
          sl_rpc_server_live_calls(a->srv));
    sl_rpc_server_free(a->srv);
    uv_loop_close(&a->loop);
    free(a);
}

static sl_rpc_client *adm_client(adm_srv *a)
{
    sl_rpc_client_opts o = {0};
    sl_rpc_client *c = NULL;

    o.own_connection = 1;
    CHECK(sl_rpc_client_new(&c, a->target, &o) == 0, "client_new");
    return c;
}

static int adm_echo_call(sl_rpc_client *c, int block, sl_rpc_status *st)
{
    Sluice__Test__EchoRequest req = SLUICE__TEST__ECHO_REQUEST__INIT;
    Sluice__Test__EchoResponse *resp = NULL;
    int err;

    req.text = "x";
    req.delay_ms = (uint32_t)block;
    err = sl_rpc_client_unary(c, "/sluice.test.Test/Echo", &req.base,
                              &sluice__test__echo_response__descriptor, (ProtobufCMessage **)&resp,
                              20000, st);
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    return err;
}

/* Wait until the server holds `n` calls (or 20 s pass). */
static void adm_wait_live(adm_srv *a, size_t n)
{
    double end = now_s() + 20.0;

    while (sl_rpc_server_live_calls(a->srv) != n && now_s() < end)
        usleep(5000);
    CHECK(sl_rpc_server_live_calls(a->srv) == n, "live %zu, want %zu",
          sl_rpc_server_live_calls(a->srv), n);
}

/* max_peer_calls: two Sum streams that sent a message (so the loop holds them) fill 127.0.0.1's
 * share; a third call is refused before the loop, and served once one of them ends. */
static void test_peer_limit(void)
{
    Sluice__Test__Num num = SLUICE__TEST__NUM__INIT;
    adm_srv *a = adm_start(2, 0);
    sl_rpc_client *c = adm_client(a);
    sl_rpc_stream *s[2];
    sl_rpc_server_counters n;
    sl_rpc_status st;
    int err;

    for (int i = 0; i < 2; i++) {
        CHECK(sl_rpc_stream_open(&s[i], c, "/sluice.test.Test/Sum", 30000) == 0, "open");
        CHECK(sl_rpc_stream_write(s[i], &num.base, 0) == 0, "write");
    }
    adm_wait_live(a, 2);
    err = adm_echo_call(c, 0, &st);
    CHECK(err == SL_ELIMIT && st.code == SL_RPC_RESOURCE_EXHAUSTED &&
              strstr(st.message, "too many concurrent calls from ipv4:127.0.0.1 (limit 2)"),
          "err %d code %d '%s'", err, st.code, st.message);
    sl_rpc_stream_cancel(s[0]);
    sl_rpc_stream_free(s[0]);
    adm_wait_live(a, 1);
    CHECK(adm_echo_call(c, 0, &st) == 0, "after a stream ended: '%s'", st.message);
    sl_rpc_stream_cancel(s[1]);
    sl_rpc_stream_free(s[1]);
    sl_rpc_server_get_counters(a->srv, &n);
    CHECK(n.peer_limit == 1, "peer_limit %llu", (unsigned long long)n.peer_limit);
    sl_rpc_client_free(c);
    adm_stop(a);
}

typedef struct adm_job {
    adm_srv *a;
    int block, err;
    sl_rpc_status st;
} adm_job;

static void *adm_echo_thread(void *arg)
{
    adm_job *j = arg;
    sl_rpc_client *c = adm_client(j->a);

    j->err = adm_echo_call(c, j->block, &j->st);
    sl_rpc_client_free(c);
    return NULL;
}

/* max_pending bounds the queue between the completion-queue threads and the loop: while a
 * handler holds the loop, at most 2 calls wait for it and the others are refused at once. */
static void test_pending_bound(void)
{
    enum { N = 8 };
    adm_srv *a = adm_start(0, 2);
    adm_job blocker = {a, 1, 0, {0}}, jobs[N];
    pthread_t bt, t[N];
    sl_rpc_server_counters n;
    int busy = 0, ok = 0;
    double t0;

    atomic_store(&a->block_ms, 1500);
    pthread_create(&bt, NULL, adm_echo_thread, &blocker);
    adm_wait_live(a, 1);
    usleep(100 * 1000); /* the handler is sleeping on the loop now */
    t0 = now_s();
    for (int i = 0; i < N; i++) {
        jobs[i] = (adm_job){a, 0, 0, {0}};
        pthread_create(&t[i], NULL, adm_echo_thread, &jobs[i]);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        if (jobs[i].err == 0)
            ok++;
        else if (jobs[i].st.code == SL_RPC_RESOURCE_EXHAUSTED &&
                 strstr(jobs[i].st.message, "server busy: 2 calls waiting to start"))
            busy++;
        else
            CHECK(0, "call %d: err %d code %d '%s'", i, jobs[i].err, jobs[i].st.code,
                  jobs[i].st.message);
    }
    pthread_join(bt, NULL);
    CHECK(blocker.err == 0, "blocker: %d '%s'", blocker.err, blocker.st.message);
    CHECK(ok <= 2 && busy >= N - 2, "ok %d busy %d", ok, busy);
    printf("  %d served, %d refused while the loop was held (%.2f s)\n", ok, busy, now_s() - t0);
    sl_rpc_server_get_counters(a->srv, &n);
    CHECK(n.busy == (uint64_t)busy && n.pending == 0, "busy %llu pending %llu",
          (unsigned long long)n.busy, (unsigned long long)n.pending);
    adm_stop(a);
}

/* A client-streaming call ended before its first message (as in an HTTP/2 rapid reset) never
 * reaches its handler; one that half-closes without a message does. */
static void test_reset_before_request(void)
{
    adm_srv *a = adm_start(0, 0);
    sl_rpc_client *c = adm_client(a);
    Sluice__Test__SumResponse *resp = NULL;
    sl_rpc_server_counters n;
    sl_rpc_stream *s;
    sl_rpc_status st;
    int err;
    double end;

    for (int i = 0; i < 200; i++) {
        CHECK(sl_rpc_stream_open(&s, c, "/sluice.test.Test/Sum", 30000) == 0, "open");
        sl_rpc_stream_cancel(s);
        sl_rpc_stream_free(s);
    }
    /* The core may end some before publishing them; most come through and are dropped. */
    end = now_s() + 5.0;
    do {
        usleep(5000);
        sl_rpc_server_get_counters(a->srv, &n);
    } while ((n.reset < 200 || sl_rpc_server_live_calls(a->srv) != 0) && now_s() < end);
    CHECK(atomic_load(&a->starts) == 0, "%d reset calls reached the handler",
          atomic_load(&a->starts));
    CHECK(sl_rpc_server_live_calls(a->srv) == 0, "live %zu", sl_rpc_server_live_calls(a->srv));
    printf("  200 reset: %llu dropped before the loop\n", (unsigned long long)n.reset);
    CHECK(sl_rpc_stream_open(&s, c, "/sluice.test.Test/Sum", 30000) == 0, "open");
    CHECK(sl_rpc_stream_close_send(s) == 0, "close_send");
    err =
        sl_rpc_stream_read(s, &sluice__test__sum_response__descriptor, (ProtobufCMessage **)&resp);
    CHECK(err == 1 && resp && resp->sum == 0, "empty stream: %d", err);
    if (resp)
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    CHECK(sl_rpc_stream_finish(s, &st) == 0, "finish: '%s'", st.message);
    sl_rpc_stream_free(s);
    CHECK(atomic_load(&a->starts) == 1, "starts %d", atomic_load(&a->starts));
    sl_rpc_client_free(c);
    adm_stop(a);
}

/* The pure helpers behind the per-peer limit and the texts a client controls. */
static void test_peer_keys(void)
{
    static const struct {
        const char *peer, *key;
    } cases[] = {
        {"ipv4:10.0.0.7:5555", "ipv4:10.0.0.7"},
        {"ipv6:[2001:db8:1:2:3::4]:5555", "ipv6:[2001:db8:1:2::]/64"},
        {"ipv6:%5B2001:db8:1:2:3::4%5D:5555", "ipv6:[2001:db8:1:2::]/64"},
        {"ipv6:[::ffff:127.0.0.1]:80", "ipv4:127.0.0.1"},
        {"ipv6:[fe80::1%eth0]:80", "ipv6:[fe80::]/64"},
        {"unix:/run/s.sock", "unix:/run/s.sock"},
        {"ipv4:", "ipv4:"},
    };
    char buf[SL_RPC_PEER_KEY_MAX], text[16];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        sl_rpc_peer_key(buf, sizeof(buf), cases[i].peer);
        CHECK(strcmp(buf, cases[i].key) == 0, "%s -> %s, want %s", cases[i].peer, buf,
              cases[i].key);
    }
    sl_rpc_text_clean(text, sizeof(text), "/a\"b\\c\nd\x80", 9);
    CHECK(strcmp(text, "/a?b?c?d?") == 0, "clean '%s'", text);
    sl_rpc_text_clean(text, sizeof(text), "/0123456789abcdefghij", 21);
    CHECK(strcmp(text, "/0123456789a...") == 0, "cut '%s'", text);
}

int main(void)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        {"unary", test_unary},
        {"unary_status", test_unary_status},
        {"empty_request", test_empty_request},
        {"server_stream", test_server_stream},
        {"client_stream", test_client_stream},
        {"bidi", test_bidi},
        {"deadline", test_deadline},
        {"cancel_mid_stream", test_cancel_mid_stream},
        {"oversized", test_oversized},
        {"unknown_method", test_unknown_method},
        {"garbage", test_garbage},
        {"strings", test_strings},
        {"bytes_field", test_bytes_field},
        {"write_bytes", test_write_bytes},
        {"bytes_slices", test_bytes_slices},
        {"bytes_field_checked", test_bytes_field_checked},
        {"concurrent", test_concurrent},
        {"async", test_async},
        {"tls", test_tls},
        {"auth", test_auth},
        {"max_calls", test_max_calls},
        {"max_key_calls", test_max_key_calls},
        {"idle_timeout", test_idle_timeout},
        {"handler_progress", test_handler_progress},
        {"send_budget", test_send_budget},
        {"peer_limit", test_peer_limit},
        {"pending_bound", test_pending_bound},
        {"reset_before_request", test_reset_before_request},
        {"peer_keys", test_peer_keys},
    };
    sl_testsrv *srv = NULL;
    size_t left;
    int err;

    setvbuf(stdout, NULL, _IOLBF, 0);
    /* Twice: handlers run as their events arrive, then through a lane that runs them a turn of
     * the loop later (sl_rpc_server_opts.lane, as the daemon's catalog lane). */
    for (sl_testsrv_laned = 0; sl_testsrv_laned < 2; sl_testsrv_laned++) {
        const char *how = sl_testsrv_laned ? " (laned)" : "";
        err = sl_testsrv_start(&srv, 64 * 1024, NULL);
        if (err) {
            fprintf(stderr, "cannot start the test server: %d\n", err);
            return 1;
        }
        snprintf(target, sizeof(target), "127.0.0.1:%d", sl_testsrv_port(srv));
        for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
            int before = failures;
            tests[i].fn();
            printf("%s %s%s\n", failures == before ? "ok  " : "FAIL", tests[i].name, how);
        }
        left = sl_testsrv_stop(srv, 2000);
        CHECK(left == 0, "%zu calls left at stop", left);
        test_shutdown();
        printf("%s shutdown%s\n", failures ? "?" : "ok  ", how);
    }
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
