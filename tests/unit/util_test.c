/* common/util: numbers, the capped buffer, JSON strings, UTF-8, names, clocks and the lengths
 * file. realloc is wrapped (tests/cmake/util.cmake) so the buffer's allocation failures can be
 * tested; LeakSanitizer in the ASan run checks that a failure leaks nothing. */
#include "err.h"
#include "shard/shard.h"
#include "util/array.h"
#include "util/buf.h"
#include "util/clock.h"
#include "util/json.h"
#include "util/lengths.h"
#include "util/name.h"
#include "util/num.h"
#include "util/utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

/* ---- realloc failure injection ---- */

static int fail_realloc; /* the next realloc fails */

void *__real_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n);

void *__wrap_realloc(void *p, size_t n)
{
    if (fail_realloc) {
        fail_realloc = 0;
        return NULL;
    }
    return __real_realloc(p, n);
}

/* ---- numbers ---- */

static void test_parse_u64(void)
{
    uint64_t v = 42;

    CHECK(sl_parse_u64(&v, "0", 0, 10) == 0 && v == 0);
    CHECK(sl_parse_u64(&v, "007", 0, 10) == 0 && v == 7);
    CHECK(sl_parse_u64(&v, "18446744073709551615", 0, UINT64_MAX) == 0 && v == UINT64_MAX);
    v = 42;
    CHECK(sl_parse_u64(&v, "18446744073709551616", 0, UINT64_MAX) == -EOVERFLOW && v == 42);
    CHECK(sl_parse_u64(&v, "99999999999999999999999", 0, UINT64_MAX) == -EOVERFLOW);
    CHECK(sl_parse_u64(&v, "11", 0, 10) == -ERANGE && v == 42);
    CHECK(sl_parse_u64(&v, "0", 1, 10) == -ERANGE);
    CHECK(sl_parse_u64(&v, "10", 10, 10) == 0 && v == 10);
    /* Empty and garbage: never a number, whatever the bounds. */
    static const char *const bad[] = {"", "-1", "+1", " 1", "1 ", "1x", "x1", "0x10", "1.5", "1,2"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK(sl_parse_u64(&v, bad[i], 0, UINT64_MAX) == SL_EINVAL);
    CHECK(sl_parse_u64(&v, NULL, 0, 1) == SL_EINVAL);
    /* Trailing garbage is malformed even when the digits overflow. */
    CHECK(sl_parse_u64(&v, "99999999999999999999x", 0, UINT64_MAX) == SL_EINVAL);
    CHECK(v == 10);
}

static void test_parse_list(void)
{
    uint64_t v[4] = {9, 9, 9, 9};

    CHECK(sl_parse_u64_list(v, 4, "2,3,1,10", ',', 1, 10) == 0);
    CHECK(v[0] == 2 && v[1] == 3 && v[2] == 1 && v[3] == 10);
    CHECK(sl_parse_u64_list(v, 1, "5", ',', 0, 10) == 0 && v[0] == 5);
    static const char *const shape[] = {"1,2,3",    "1,2,3,4,5", "1,,3,4", "1,2,3,4,", ",1,2,3",
                                        "1, 2,3,4", "1;2;3;4",   "",       "1,2,3,x"};
    for (size_t i = 0; i < sizeof(shape) / sizeof(shape[0]); i++)
        CHECK(sl_parse_u64_list(v, 4, shape[i], ',', 0, 10) == SL_EINVAL);
    CHECK(v[0] == 5);
    CHECK(sl_parse_u64_list(v, 4, "1,0,1,1", ',', 1, 10) == -ERANGE);
    CHECK(sl_parse_u64_list(v, 4, "1,1,1,99999999999999999999", ',', 1, 10) == -EOVERFLOW);
    /* A wrong shape wins over a bad value. */
    CHECK(sl_parse_u64_list(v, 4, "0,1,1", ',', 1, 10) == SL_EINVAL);
    CHECK(sl_parse_u64_list(v, 0, "", ',', 0, 1) == SL_EINVAL);
    CHECK(sl_parse_u64_list(v, 2, NULL, ',', 0, 1) == SL_EINVAL);
    CHECK(v[0] == 5);
}

/* ---- the buffer ---- */

static void test_buf(void)
{
    static const char hundred[100] = "x";
    sl_buf b;
    char *p;

    sl_buf_init(&b, 10);
    CHECK(strcmp(sl_buf_str(&b), "") == 0 && b.len == 0 && b.p == NULL);
    CHECK(sl_buf_addstr(&b, "hello") == 0 && b.len == 5);
    CHECK(sl_buf_printf(&b, "%d", 1234) == 0 && strcmp(sl_buf_str(&b), "hello1234") == 0);
    /* Over the cap: refused whole, nothing changed. */
    CHECK(sl_buf_addstr(&b, "ab") == SL_ELIMIT && strcmp(sl_buf_str(&b), "hello1234") == 0);
    CHECK(sl_buf_printf(&b, "%s", "ab") == SL_ELIMIT && b.len == 9);
    CHECK(sl_buf_add(&b, "!", 1) == 0 && b.len == 10);
    CHECK(sl_buf_add(&b, "", 0) == 0);
    CHECK(sl_buf_add(&b, "x", 1) == SL_ELIMIT);
    CHECK(b.alloc <= 11);
    sl_buf_setlen(&b, 5);
    CHECK(strcmp(sl_buf_str(&b), "hello") == 0);
    sl_buf_setlen(&b, 7); /* longer: no effect */
    CHECK(b.len == 5);
    p = sl_buf_take(&b);
    CHECK(p && strcmp(p, "hello") == 0);
    free(p);
    CHECK(b.len == 0 && b.p == NULL && b.max == 10);
    CHECK(sl_buf_take(&b) == NULL);
    sl_buf_free(&b);
    sl_buf_free(NULL);

    /* Growth by doubling keeps earlier contents. */
    sl_buf_init(&b, 1 << 20);
    for (int i = 0; i < 10000; i++)
        CHECK(sl_buf_add(&b, "0123456789", 10) == 0);
    CHECK(b.len == 100000 && memcmp(b.p + 99990, "0123456789", 10) == 0);
    CHECK(b.p[b.len] == '\0');
    sl_buf_free(&b);
    CHECK(b.p == NULL && b.len == 0);

    /* A failed allocation leaves the buffer as it was, and it stays usable. */
    sl_buf_init(&b, 1 << 20);
    CHECK(sl_buf_addstr(&b, "abc") == 0);
    fail_realloc = 1;
    CHECK(sl_buf_add(&b, hundred, sizeof(hundred)) == -ENOMEM);
    CHECK(strcmp(sl_buf_str(&b), "abc") == 0);
    fail_realloc = 1;
    CHECK(sl_buf_printf(&b, "%0200d", 1) == -ENOMEM && b.len == 3);
    CHECK(sl_buf_add(&b, "d", 1) == 0 && strcmp(sl_buf_str(&b), "abcd") == 0);
    sl_buf_free(&b);
    sl_buf_init(&b, 100);
    fail_realloc = 1;
    CHECK(sl_buf_addstr(&b, "first") == -ENOMEM && b.p == NULL);
    sl_buf_free(&b);
}

static void test_buf_fixed(void)
{
    char mem[8];
    sl_buf b;

    sl_buf_init_fixed(&b, mem, sizeof(mem));
    CHECK(sl_buf_addstr(&b, "1234567") == 0 && strcmp(mem, "1234567") == 0);
    CHECK(sl_buf_add(&b, "8", 1) == SL_ELIMIT && strcmp(mem, "1234567") == 0);
    CHECK(sl_buf_take(&b) == NULL && b.len == 7);
    sl_buf_free(&b);
    CHECK(b.len == 0 && mem[0] == '\0' && b.p == mem);
    fail_realloc = 1; /* a fixed buffer never allocates: the injection stays armed */
    CHECK(sl_buf_printf(&b, "%s", "abc") == 0);
    CHECK(fail_realloc == 1);
    fail_realloc = 0;
}

/* ---- JSON ---- */

static void test_json(void)
{
    static const char in[] = "a\"b\\c\n\x01\x1f\x7f é";
    char mem[16];
    sl_buf b;

    sl_buf_init(&b, 1000);
    CHECK(sl_json_str(&b, in, strlen(in)) == 0);
    CHECK(strcmp(sl_buf_str(&b), "\"a\\\"b\\\\c\\u000a\\u0001\\u001f\x7f é\"") == 0);
    sl_buf_setlen(&b, 0);
    CHECK(sl_json_str(&b, "", 0) == 0 && strcmp(sl_buf_str(&b), "\"\"") == 0);
    sl_buf_setlen(&b, 0);
    /* Length-bounded: an embedded NUL is escaped too. */
    CHECK(sl_json_esc(&b, "x\0y", 3) == 0 && strcmp(sl_buf_str(&b), "x\\u0000y") == 0);
    sl_buf_free(&b);

    /* Too long: nothing of the string stays. */
    sl_buf_init_fixed(&b, mem, sizeof(mem));
    CHECK(sl_buf_addstr(&b, "{") == 0);
    CHECK(sl_json_str(&b, "0123456789abcdef", 16) == SL_ELIMIT && strcmp(mem, "{") == 0);
    CHECK(sl_json_str(&b, "\n\n\n", 3) == SL_ELIMIT && strcmp(mem, "{") == 0);
    CHECK(sl_json_str(&b, "\n\n", 2) == 0 && strcmp(mem, "{\"\\u000a\\u000a\"") == 0);
}

/* ---- UTF-8 ---- */

static void test_utf8(void)
{
    static const char *const good[] = {
        "",
        "plain ascii",
        "\xc2\x80",
        "\xdf\xbf",
        "\xe0\xa0\x80",
        "\xed\x9f\xbf",
        "\xee\x80\x80",
        "\xef\xbf\xbf",
        "\xf0\x90\x80\x80",
        "\xf4\x8f\xbf\xbf",
        "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80",
    };
    static const char *const bad[] = {
        "\x80",
        "\xbf",
        "\xc0\x80",
        "\xc1\xbf",
        "\xc2",
        "\xc2\x41",
        "\xe0\x80\x80",
        "\xe0\x9f\xbf",
        "\xed\xa0\x80",
        "\xed\xbf\xbf",
        "\xe2\x82",
        "\xf0\x80\x80\x80",
        "\xf0\x8f\xbf\xbf",
        "\xf4\x90\x80\x80",
        "\xf5\x80\x80\x80",
        "\xff",
        "ok\xe2\x82",
        "\xf0\x9f\x98",
    };

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        CHECK(sl_utf8_check(good[i], strlen(good[i])) == 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK(sl_utf8_check(bad[i], strlen(bad[i])) == SL_EINVAL);
    CHECK(sl_utf8_check("a\0b", 3) == SL_EINVAL);
    /* n bounds the check: a sequence cut by n is truncated. */
    CHECK(sl_utf8_check("\xc3\xa9", 1) == SL_EINVAL);
    CHECK(sl_utf8_check("ab\xff", 2) == 0);
}

/* ---- names ---- */

static void test_names(void)
{
    static const char *const good[] = {"a", "step_100", "run-1.2", "A.b_c-d", "y", "a.b"};
    static const char *const bad[] = {"",     ".",   "..",   ".hidden", "a/b", "../x",
                                      "a..b", "a b", "a\\b", "é",       "a\n", "x.."};
    char name[SL_NAME_MAX + 2], msg[256];

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        CHECK(sl_name_check("job", good[i], msg, sizeof(msg)) == 0);
        CHECK(sl_shard_name_check(good[i]) == 0);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK(sl_name_check("job", bad[i], msg, sizeof(msg)) == SL_EINVAL);
        CHECK(sl_name_check("job", bad[i], NULL, 0) == SL_EINVAL);
        CHECK(sl_shard_name_check(bad[i]) == SL_EINVAL);
    }
    CHECK(sl_name_check("job", NULL, msg, sizeof(msg)) == SL_EINVAL);
    CHECK(strcmp(msg, "job name '' must have 1 to 128 characters") == 0);
    CHECK(sl_shard_name_check(NULL) == SL_EINVAL);
    CHECK(sl_name_check("dataset", "a/b", msg, sizeof(msg)) == SL_EINVAL);
    CHECK(strcmp(msg, "dataset name 'a/b' has a character outside [A-Za-z0-9._-]") == 0);
    CHECK(sl_name_check("job", ".x", msg, sizeof(msg)) == SL_EINVAL);
    CHECK(strcmp(msg, "job name '.x' must not start with '.' or contain '..'") == 0);
    /* Characters are checked before dots: "./x" has a '/'. */
    CHECK(sl_name_check("job", "./x", msg, sizeof(msg)) == SL_EINVAL);
    CHECK(strstr(msg, "has a character outside") != NULL);
    memset(name, 'n', SL_NAME_MAX);
    name[SL_NAME_MAX] = '\0';
    CHECK(sl_name_check("job", name, msg, sizeof(msg)) == 0);
    name[SL_NAME_MAX] = 'n';
    name[SL_NAME_MAX + 1] = '\0';
    CHECK(sl_name_check("job", name, msg, sizeof(msg)) == SL_EINVAL);
    CHECK(strstr(msg, "must have 1 to 128 characters") != NULL);
    /* A tiny message buffer is cut, never overrun. */
    CHECK(sl_name_check("job", "", msg, 4) == SL_EINVAL && strcmp(msg, "job") == 0);
}

/* ---- clocks ---- */

static void test_clock(void)
{
    uint64_t a = sl_mono_ns(), b;

    CHECK(sl_now_ms() > INT64_C(1600000000000)); /* after September 2020 */
    usleep(2000);
    b = sl_mono_ns();
    CHECK(b >= a + 1000000u);
}

/* ---- the lengths file ---- */

/* Parse `text` (len bytes) in `form`. Returns the error; *v and *n as sl_lengths_parse. */
static int parse(uint32_t **v, size_t *n, const char *text, size_t len, sl_lengths_form form,
                 size_t max, char *msg, size_t msg_len)
{
    FILE *f = len ? fmemopen((void *)text, len, "rb") : fopen("/dev/null", "rb");
    int err;

    if (!f)
        return -errno;
    err = sl_lengths_parse(v, n, f, form, max, "in", msg, msg_len);
    fclose(f);
    return err;
}

#define PARSE(text, form, max) parse(&v, &n, text, sizeof(text) - 1, form, max, msg, sizeof(msg))

static void test_lengths_text(void)
{
    uint32_t *v = NULL;
    size_t n = 9;
    char msg[256];

    CHECK(PARSE("5\n6\n7\n", SL_LENGTHS_TEXT, 100) == 0 && n == 3);
    CHECK(v && v[0] == 5 && v[1] == 6 && v[2] == 7);
    free(v);
    CHECK(PARSE("5\r\n0006\r\n4294967295", SL_LENGTHS_TEXT, 100) == 0 && n == 3);
    CHECK(v && v[1] == 6 && v[2] == UINT32_MAX);
    free(v);
    CHECK(PARSE("9\r", SL_LENGTHS_TEXT, 100) == 0 && n == 1 && v && v[0] == 9);
    free(v);
    CHECK(PARSE("", SL_LENGTHS_TEXT, 100) == 0 && n == 0 && v == NULL);

    CHECK(PARSE("5\n0\n7\n", SL_LENGTHS_TEXT, 100) == SL_EINVAL && v == NULL && n == 0);
    CHECK(strcmp(msg, "in:2: length 0 (every length must be at least 1)") == 0);
    CHECK(PARSE("5\n6\nseven\n8\n", SL_LENGTHS_TEXT, 100) == SL_EINVAL);
    CHECK(strcmp(msg, "in:3: not a non-negative integer (one length per line)") == 0);
    CHECK(PARSE("5\n\n6\n", SL_LENGTHS_TEXT, 100) == SL_EINVAL && strstr(msg, "in:2: not a"));
    CHECK(PARSE("5\n-6\n", SL_LENGTHS_TEXT, 100) == SL_EINVAL && strstr(msg, "in:2: not a"));
    CHECK(PARSE("5\n 6\n", SL_LENGTHS_TEXT, 100) == SL_EINVAL && strstr(msg, "in:2: not a"));
    CHECK(PARSE("5\r6\n", SL_LENGTHS_TEXT, 100) == SL_EINVAL && strstr(msg, "in:1: not a"));
    CHECK(PARSE("\r\n", SL_LENGTHS_TEXT, 100) == SL_EINVAL && strstr(msg, "in:1: not a"));
    CHECK(PARSE("1\n2x", SL_LENGTHS_TEXT, 100) == SL_EINVAL && strstr(msg, "in:2: not a"));
    CHECK(PARSE("1\n0", SL_LENGTHS_TEXT, 100) == SL_EINVAL && strstr(msg, "in:2: length 0"));
    CHECK(PARSE("99999999999\n", SL_LENGTHS_TEXT, 100) == SL_EINVAL);
    CHECK(strcmp(msg, "in:1: length is over 4294967295") == 0);
    CHECK(PARSE("1\n2\n3\n", SL_LENGTHS_TEXT, 2) == SL_ELIMIT && v == NULL);
    CHECK(strcmp(msg, "in: more than 2 lengths") == 0);
    CHECK(PARSE("1\n2\n", SL_LENGTHS_TEXT, 2) == 0 && n == 2);
    free(v);
    CHECK(PARSE("1\n2\n3\n", SL_LENGTHS_TEXT, 0) == SL_ELIMIT);

    /* Larger than one read buffer. */
    {
        size_t count = 50000, len = 0;
        char *text = malloc(count * 8);

        for (size_t i = 0; text && i < count; i++)
            len += (size_t)sprintf(text + len, "%zu\n", i + 1);
        CHECK(text &&
              parse(&v, &n, text, len, SL_LENGTHS_TEXT, SL_LENGTHS_MAX, msg, sizeof(msg)) == 0);
        CHECK(n == count && v && v[0] == 1 && v[count - 1] == count);
        free(v);
        free(text);
    }
}

static void test_lengths_u32(void)
{
    static const uint32_t in[] = {5, 1, 0x01020304, UINT32_MAX};
    uint8_t raw[16], back_raw[16];
    uint32_t *v = NULL, back[4];
    size_t n, bad = 9;
    char msg[256];
    sl_lengths_form form;

    CHECK(sl_lengths_form_parse(&form, "u32") == 0 && form == SL_LENGTHS_U32);
    CHECK(sl_lengths_form_parse(&form, "text") == 0 && form == SL_LENGTHS_TEXT);
    CHECK(sl_lengths_form_parse(&form, "U32") == SL_EINVAL);
    CHECK(sl_lengths_form_parse(&form, NULL) == SL_EINVAL);

    CHECK(sl_lengths_encode(raw, in, 4, &bad) == 0 && bad == 9);
    CHECK(raw[0] == 5 && raw[4] == 1 && raw[8] == 4 && raw[11] == 1 && raw[15] == 0xff);
    CHECK(sl_lengths_decode(back, raw, 4, NULL) == 0 && memcmp(back, in, sizeof(in)) == 0);
    memcpy(back_raw, raw, sizeof(raw));
    CHECK(sl_lengths_decode((uint32_t *)(void *)back_raw, back_raw, 4, NULL) == 0);
    CHECK(memcmp(back_raw, in, sizeof(in)) == 0);
    back[2] = 0;
    CHECK(sl_lengths_encode(raw, back, 4, &bad) == SL_EINVAL && bad == 2);
    CHECK(sl_lengths_decode(back, (const uint8_t *)"\1\0\0\0\0\0\0\0", 2, &bad) == SL_EINVAL);
    CHECK(bad == 1);

    CHECK(parse(&v, &n, (const char *)raw, 8, SL_LENGTHS_U32, 100, msg, sizeof(msg)) == 0);
    CHECK(n == 2 && v && v[0] == 5 && v[1] == 1);
    free(v);
    CHECK(PARSE("\5\0\0\0\0\0\0\0\7\0\0\0", SL_LENGTHS_U32, 100) == SL_EINVAL && v == NULL);
    CHECK(strcmp(msg, "in: record 1 (byte offset 4) has length 0 (every length must be at least "
                      "1)") == 0);
    CHECK(PARSE("\1\0\0\0\2", SL_LENGTHS_U32, 100) == SL_EINVAL);
    CHECK(strcmp(msg, "in: size is not a multiple of 4 bytes (1 trailing)") == 0);
    CHECK(PARSE("\1\0\0\0\2\0\0\0", SL_LENGTHS_U32, 1) == SL_ELIMIT);
    CHECK(PARSE("", SL_LENGTHS_U32, 1) == 0 && n == 0);
}

/* Write a stored lengths file; returns its SHA-256 in hex. */
static void write_stored(const char *path, const uint8_t *raw, size_t len, char hex[65])
{
    FILE *f = fopen(path, "wb");
    sl_sha256 *h = NULL;

    CHECK(f && fwrite(raw, 1, len, f) == len);
    if (f)
        fclose(f);
    CHECK(sl_sha256_new(&h) == 0 && sl_sha256_reset(h) == 0 && sl_sha256_update(h, raw, len) == 0 &&
          sl_sha256_final(h, hex) == 0);
    sl_sha256_free(h);
}

/* sl_lengths_read of the file at `path` (fd -1 if it cannot be opened). */
static int read_stored(uint32_t **v, const char *path, uint64_t n, const char *hex, char *msg,
                       size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC), err = sl_lengths_read(v, fd, n, hex, msg, len);

    if (fd >= 0)
        close(fd);
    return err;
}

static void test_lengths_read(void)
{
    static const uint32_t in[] = {3, 1, 4, 1, 5};
    char path[64], hex[65], zhex[65], msg[256];
    uint8_t raw[20];
    uint32_t *v = (uint32_t *)1;

    snprintf(path, sizeof(path), "/tmp/sl-util-test-%d", (int)getpid());
    CHECK(sl_lengths_encode(raw, in, 5, NULL) == 0);
    write_stored(path, raw, sizeof(raw), hex);
    CHECK(read_stored(&v, path, 5, hex, msg, sizeof(msg)) == 0);
    CHECK(v && memcmp(v, in, sizeof(in)) == 0);
    free(v);
    CHECK(read_stored(&v, path, 4, hex, msg, sizeof(msg)) == SL_ECORRUPT && v == NULL);
    CHECK(strcmp(msg, "lengths file has 20 bytes, expected 16") == 0);
    CHECK(read_stored(&v, path, (UINT64_C(1) << 62) + 5, hex, msg, sizeof(msg)) == SL_ECORRUPT);
    CHECK(strstr(msg, "do not fit in memory") != NULL);
    hex[0] = hex[0] == '0' ? '1' : '0';
    CHECK(read_stored(&v, path, 5, hex, msg, sizeof(msg)) == SL_ECORRUPT && v == NULL);
    CHECK(strstr(msg, "does not match the catalog's") != NULL);
    /* A length of 0 cannot come from an upload: the file is not the uploaded one. */
    raw[8] = 0;
    write_stored(path, raw, sizeof(raw), zhex);
    CHECK(read_stored(&v, path, 5, zhex, msg, sizeof(msg)) == SL_ECORRUPT && v == NULL);
    CHECK(strcmp(msg, "lengths file has length 0 at record 2") == 0);
    write_stored(path, raw, 0, zhex);
    CHECK(read_stored(&v, path, 0, zhex, msg, sizeof(msg)) == 0 && v != NULL);
    free(v);
    unlink(path);
    CHECK(read_stored(&v, path, 5, zhex, msg, sizeof(msg)) == -EBADF && v == NULL);
    CHECK(strstr(msg, "cannot read the lengths file") != NULL);
}

static void test_array_grow(void)
{
    int *v = NULL;
    size_t cap = 0, n = 0;

    for (int i = 0; i < 100; i++) {
        CHECK(sl_array_grow((void **)&v, &cap, n, sizeof(*v), 4) == 0);
        CHECK(cap > n);
        v[n++] = i;
    }
    CHECK(cap == 128);
    for (int i = 0; i < 100; i++)
        CHECK(v[i] == i);
    /* Room already there: nothing moves. */
    CHECK(sl_array_grow((void **)&v, &cap, 5, sizeof(*v), 4) == 0 && cap == 128);
    /* A size that overflows is refused and leaves the array as it was. */
    {
        int *before = v;
        CHECK(sl_array_grow((void **)&v, &cap, 128, SIZE_MAX / 64, 4) == -ENOMEM);
        CHECK(v == before && cap == 128);
    }
    free(v);
}

int main(void)
{
    test_parse_u64();
    test_parse_list();
    test_buf();
    test_buf_fixed();
    test_json();
    test_utf8();
    test_names();
    test_clock();
    test_lengths_text();
    test_lengths_u32();
    test_lengths_read();
    test_array_grow();
    return check_done("util_test");
}
