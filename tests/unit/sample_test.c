/* Unit tests for common/sample/: validation, permutations, partition properties, positions,
 * mesh, elastic remainder and the statistical quality of the Feistel shuffle. */
#include "err.h"
#include "sample/sample.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            if (failures > 20)                                                                     \
                exit(1);                                                                           \
        }                                                                                          \
    } while (0)

/* xorshift64* for test inputs: deterministic so failures reproduce. */
static uint64_t rng_state = 0x853c49e6748fea9bULL;

static uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

static uint64_t rnd_below(uint64_t n)
{
    return rnd() % n;
}

static sl_sample_config mkcfg(uint64_t n, uint32_t R, uint32_t r)
{
    sl_sample_config c;

    sl_sample_config_init(&c);
    c.samples = n;
    c.replicas = R;
    c.rank = r;
    return c;
}

/* The whole share of a config; caller frees. */
static uint64_t *share(const sl_sample_config *c, uint64_t *cnt)
{
    sl_sample *s = NULL;
    uint64_t *v;
    char msg[128];
    int err = sl_sample_new(&s, c, msg, sizeof(msg));

    CHECK(err == 0, "sl_sample_new: %s", msg);
    if (err)
        exit(1);
    *cnt = sl_sample_count(s);
    v = malloc((*cnt + 1) * sizeof(*v));
    CHECK(sl_sample_fill(v, s, 0, *cnt) == 0, "fill");
    sl_sample_free(s);
    return v;
}

static void expect_err(const sl_sample_config *c, int code, const char *needle)
{
    char msg[256] = "";
    int err = sl_sample_config_check(c, msg, sizeof(msg));

    CHECK(err == code, "want %s got %s (%s)", sl_errname(code), sl_errname(err), msg);
    CHECK(strstr(msg, needle) != NULL, "message '%s' lacks '%s'", msg, needle);
}

static void test_validation(void)
{
    sl_sample_config c = mkcfg(10, 8, 9);
    sl_sample *s = (sl_sample *)&c;
    char msg[64];

    expect_err(&c, SL_EINVAL, "rank 9 out of range [0, 8)");
    c = mkcfg(0, 8, 0);
    expect_err(&c, SL_EINVAL, "samples 0");
    c = mkcfg(10, 0, 0);
    expect_err(&c, SL_EINVAL, "replicas 0");
    c = mkcfg(10, 2, 0);
    c.partition = SL_SAMPLE_CHUNKED;
    c.chunk_size = 0;
    expect_err(&c, SL_EINVAL, "chunk size 0");
    c = mkcfg(10, 6, 0);
    c.mesh = (sl_sample_mesh){.dp = 2, .tp = 2, .cp = 2, .pp = 1};
    expect_err(&c, SL_EINVAL, "does not match world size 6");
    c.mesh = (sl_sample_mesh){.dp = 3, .tp = 2, .cp = 0, .pp = 1};
    expect_err(&c, SL_EINVAL, "mesh cp size 0");
    c.mesh = (sl_sample_mesh){.dp = 3, .tp = 2, .cp = 1, .pp = 1, .order = {1, 1, 2, 3}};
    expect_err(&c, SL_EINVAL, "mesh order");
    c = mkcfg(10, 2, 0);
    c.epoch = (uint64_t)INT64_MAX + 1;
    expect_err(&c, SL_EINVAL, "epoch 9223372036854775808 out of range");
    c.epoch = 5;
    c.seed = UINT64_MAX - 4;
    expect_err(&c, SL_EINVAL, "epoch 5 out of range");
    c.seed = UINT64_MAX - 5;
    CHECK(sl_sample_config_check(&c, NULL, 0) == 0, "seed + epoch == UINT64_MAX is valid");
    c = mkcfg(SL_SAMPLE_TORCH_MAX_N, 2, 0);
    c.shuffle = SL_SAMPLE_SHUFFLE_TORCH;
    expect_err(&c, SL_ELIMIT, "too many for shuffle torch");
    c.shuffle = SL_SAMPLE_SHUFFLE_FEISTEL;
    CHECK(sl_sample_config_check(&c, NULL, 0) == 0, "feistel has no such limit");
    c.samples = SL_SAMPLE_MAX_N + 1;
    expect_err(&c, SL_ELIMIT, "over the limit");
    c = mkcfg(10, 1, 0); /* one replica is a valid world (seed 000's defect) */
    CHECK(sl_sample_config_check(&c, NULL, 0) == 0, "R = 1");
    c = mkcfg(10, 8, 9);
    CHECK(sl_sample_new(&s, &c, msg, sizeof(msg)) == SL_EINVAL && s == NULL, "new fails cleanly");
    sl_sample_free(NULL);
    sl_sample_elastic_free(NULL);
}

static void check_perm(const uint64_t *v, uint64_t n, const char *what)
{
    uint8_t *seen = calloc(n, 1);
    uint64_t bad = 0;

    for (uint64_t i = 0; i < n; i++) {
        if (v[i] >= n || seen[v[i]]++)
            bad++;
    }
    CHECK(bad == 0, "%s: n=%" PRIu64 " is not a permutation (%" PRIu64 " bad)", what, n, bad);
    free(seen);
}

static void feistel_perm(uint64_t n, uint64_t seed, uint64_t epoch)
{
    uint64_t *v = malloc(n * sizeof(*v)), x;

    CHECK(sl_sample_epoch_order(v, n, SL_SAMPLE_SHUFFLE_FEISTEL, seed, epoch) == 0, "order");
    check_perm(v, n, "feistel");
    for (int k = 0; k < 4; k++) {
        uint64_t p = rnd_below(n);
        CHECK(sl_sample_feistel_at(&x, n, seed, epoch, p) == 0 && x == v[p], "feistel_at");
    }
    free(v);
}

static void test_feistel_bijection(void)
{
    for (uint64_t n = 1; n <= 3; n++)
        for (uint64_t seed = 0; seed < 50; seed++)
            feistel_perm(n, seed, seed % 3);
    for (int k = 2; k <= 20; k++) {
        uint64_t p = UINT64_C(1) << k;
        for (uint64_t seed = 0; seed < 3; seed++) {
            feistel_perm(p - 1, seed, 0);
            feistel_perm(p, seed, 1);
            feistel_perm(p + 1, seed, 2);
        }
    }
    for (int i = 0; i < 200; i++)
        feistel_perm(1 + rnd_below(100000), rnd(), rnd_below(1000));
    /* At sizes too big to enumerate, check that the per-position inverse walk never lands out
     * of range and that distinct positions map to distinct values in a sample. */
    for (int i = 0; i < 1000; i++) {
        uint64_t n = SL_SAMPLE_MAX_N - rnd_below(1000), x, y, p = rnd_below(n), q = (p + 1) % n;
        CHECK(sl_sample_feistel_at(&x, n, 3, 4, p) == 0 && x < n, "large n");
        CHECK(sl_sample_feistel_at(&y, n, 3, 4, q) == 0 && y < n && x != y, "large n distinct");
    }
    CHECK(sl_sample_feistel_at(&(uint64_t){0}, 5, 0, 0, 5) == SL_EINVAL, "pos >= n");
}

static void test_torch_known(void)
{
    /* Expected values printed by python3-torch 1.13:
     * torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist() */
    static const uint64_t p10[] = {4, 1, 7, 5, 3, 9, 0, 8, 6, 2};
    static const uint64_t p16[] = {6, 3, 0, 7, 10, 15, 2, 12, 14, 9, 8, 5, 4, 13, 11, 1};
    static const uint64_t p7[] = {3, 5, 4, 2, 6, 0, 1};
    uint64_t v[16], *big = malloc(100000 * sizeof(*big)), dot = 0;

    CHECK(sl_sample_epoch_order(v, 10, SL_SAMPLE_SHUFFLE_TORCH, 0, 0) == 0, "torch");
    CHECK(memcmp(v, p10, sizeof(p10)) == 0, "randperm(10, seed 0)");
    CHECK(sl_sample_epoch_order(v, 16, SL_SAMPLE_SHUFFLE_TORCH, 40, 2) == 0, "torch");
    CHECK(memcmp(v, p16, sizeof(p16)) == 0, "randperm(16, seed 40 + epoch 2)");
    CHECK(sl_sample_epoch_order(v, 7, SL_SAMPLE_SHUFFLE_TORCH, 123456789012ULL, 0) == 0, "t");
    CHECK(memcmp(v, p7, sizeof(p7)) == 0, "randperm(7, seed 123456789012)");
    CHECK(sl_sample_epoch_order(big, 100000, SL_SAMPLE_SHUFFLE_TORCH, 7, 0) == 0, "torch");
    for (uint64_t i = 0; i < 100000; i++)
        dot += big[i] * i;
    CHECK(big[0] == 41615 && big[4] == 28607 && big[99999] == 73623 && dot == 250090304507815ULL,
          "randperm(100000, seed 7): %" PRIu64 " %" PRIu64, big[0], dot);
    CHECK(sl_sample_epoch_order(big, 1, SL_SAMPLE_SHUFFLE_TORCH, 7, 0) == 0 && big[0] == 0, "n1");
    CHECK(sl_sample_epoch_order(big, 0, SL_SAMPLE_SHUFFLE_TORCH, 7, 0) == SL_EINVAL, "n0");
    CHECK(sl_sample_epoch_order(big, 10, 3, 7, 0) == SL_EINVAL, "bad mode");
    free(big);
}

/* Properties of one (N, partition, shuffle, drop_last) over every rank of R. */
static void check_partition(uint64_t n, uint32_t R, sl_sample_partition part, uint64_t C,
                            sl_sample_shuffle sh, bool drop)
{
    uint32_t *hits = calloc(n, sizeof(*hits));
    uint64_t total = 0, maxc = 0, minc = UINT64_MAX;
    char what[160];

    snprintf(what, sizeof(what), "N=%" PRIu64 " R=%" PRIu32 " %s C=%" PRIu64 " %s drop=%d", n, R,
             sl_sample_partition_name(part), C, sl_sample_shuffle_name(sh), drop);
    for (uint32_t r = 0; r < R; r++) {
        sl_sample_config c = mkcfg(n, R, r);
        uint64_t cnt, cnt2, want, *v, *w, buf[7];
        sl_sample *s = NULL;
        size_t got;

        c.partition = part;
        c.chunk_size = C;
        c.shuffle = sh;
        c.drop_last = drop;
        c.seed = 11;
        c.epoch = 3;
        v = share(&c, &cnt);
        CHECK(sl_sample_share_count(&want, &c, NULL, 0) == 0 && want == cnt, "%s count", what);
        total += cnt;
        maxc = cnt > maxc ? cnt : maxc;
        minc = cnt < minc ? cnt : minc;
        for (uint64_t i = 0; i < cnt; i++) {
            CHECK(v[i] < n, "%s: index %" PRIu64 " out of range", what, v[i]);
            if (v[i] < n)
                hits[v[i]]++;
        }
        /* Determinism: a second stream gives the same share. */
        w = share(&c, &cnt2);
        CHECK(cnt2 == cnt && memcmp(v, w, cnt * sizeof(*v)) == 0, "%s: determinism", what);
        free(w);
        /* Position k: seek + next in odd-sized pieces equals the tail of the full share. */
        CHECK(sl_sample_new(&s, &c, NULL, 0) == 0, "new");
        for (int t = 0; t < 3 && s; t++) {
            uint64_t k = rnd_below(cnt + 1), i = k;
            CHECK(sl_sample_seek(s, k) == 0, "seek");
            while (sl_sample_next(buf, &got, s, 1 + rnd_below(7)) == 0 && got) {
                for (size_t j = 0; j < got; j++, i++)
                    CHECK(i < cnt && buf[j] == v[i], "%s: position %" PRIu64, what, i);
            }
            CHECK(i == cnt && sl_sample_pos(s) == cnt, "%s: stream ends at count", what);
        }
        CHECK(sl_sample_seek(s, cnt + 1) == SL_EINVAL, "seek past end");
        CHECK(sl_sample_fill(buf, s, cnt, 1) == SL_EINVAL, "fill past end");
        sl_sample_free(s);
        free(v);
    }
    /* Coverage. */
    if (part == SL_SAMPLE_INTERLEAVED) {
        uint64_t per = drop ? n / R : (n + R - 1) / R;
        CHECK(minc == per && maxc == per, "%s: every rank reads %" PRIu64, what, per);
        CHECK(total == per * R, "%s: total", what);
    } else if (part == SL_SAMPLE_CONTIGUOUS) {
        CHECK(total == (drop ? n / R * R : n), "%s: total %" PRIu64, what, total);
        if (drop)
            CHECK(maxc == minc, "%s: equal blocks", what);
    } else {
        CHECK(total == (drop ? n / C / R * R * C : n), "%s: total %" PRIu64, what, total);
        if (drop)
            CHECK(maxc == minc, "%s: equal shares", what);
    }
    for (uint64_t i = 0; i < n; i++) {
        if (drop || part != SL_SAMPLE_INTERLEAVED) {
            /* Exactly once, or dropped (at most N mod R, or the chunks that do not divide). */
            CHECK(hits[i] <= 1, "%s: index %" PRIu64 " read %" PRIu32 " times", what, i, hits[i]);
        } else {
            /* Padding: every index at least once; duplicates only from wrapping around. */
            uint64_t most = ((n + R - 1) / R * R + n - 1) / n;
            CHECK(hits[i] >= 1 && hits[i] <= most, "%s: index %" PRIu64 " read %" PRIu32, what, i,
                  hits[i]);
        }
    }
    if (!drop)
        for (uint64_t i = 0; i < n; i++)
            CHECK(hits[i] >= 1, "%s: index %" PRIu64 " lost", what, i);
    free(hits);
}

static void test_partitions(void)
{
    static const uint64_t ns[] = {1, 2, 3, 7, 10, 64, 100, 1001};
    static const uint32_t rs[] = {1, 2, 3, 4, 8, 13};
    static const uint64_t cs[] = {1, 3, 16};

    for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++)
        for (size_t b = 0; b < sizeof(rs) / sizeof(rs[0]); b++)
            for (int sh = 0; sh < 3; sh++)
                for (int drop = 0; drop < 2; drop++) {
                    check_partition(ns[a], rs[b], SL_SAMPLE_INTERLEAVED, 1, sh, drop);
                    check_partition(ns[a], rs[b], SL_SAMPLE_CONTIGUOUS, 1, sh, drop);
                    for (size_t c = 0; c < 3; c++)
                        check_partition(ns[a], rs[b], SL_SAMPLE_CHUNKED, cs[c], sh, drop);
                }
}

static void test_exact_layouts(void)
{
    sl_sample_config c = mkcfg(10, 4, 3);
    uint64_t cnt, *v;

    /* Seed 000's defect: N=10, R=4 without drop_last must serve 6..9 to the last rank. */
    c.partition = SL_SAMPLE_CONTIGUOUS;
    c.shuffle = SL_SAMPLE_SHUFFLE_NONE;
    v = share(&c, &cnt);
    CHECK(cnt == 4 && v[0] == 6 && v[1] == 7 && v[2] == 8 && v[3] == 9, "contiguous remainder");
    free(v);
    c.drop_last = true;
    v = share(&c, &cnt);
    CHECK(cnt == 2 && v[0] == 6 && v[1] == 7, "contiguous drop_last");
    free(v);
    /* Seed 004: chunk c goes to rank c mod R. N=10, C=3, R=2: rank 1 reads chunk 1 (3..5) and,
     * without drop_last, the partial chunk 3 (9). */
    c = mkcfg(10, 2, 1);
    c.partition = SL_SAMPLE_CHUNKED;
    c.chunk_size = 3;
    c.shuffle = SL_SAMPLE_SHUFFLE_NONE;
    v = share(&c, &cnt);
    CHECK(cnt == 4 && v[0] == 3 && v[1] == 4 && v[2] == 5 && v[3] == 9, "chunked rank 1");
    free(v);
    /* Shuffled chunks stay whole: every run of C positions is one chunk. */
    c = mkcfg(1000, 3, 2);
    c.partition = SL_SAMPLE_CHUNKED;
    c.chunk_size = 10;
    v = share(&c, &cnt);
    for (uint64_t i = 0; i < cnt; i++)
        CHECK(v[i] / 10 == v[i - i % 10] / 10, "chunk locality at %" PRIu64, i);
    free(v);
    /* Each epoch a new order; the same (seed, epoch) the same order. */
    for (int sh = SL_SAMPLE_SHUFFLE_TORCH; sh <= SL_SAMPLE_SHUFFLE_FEISTEL; sh++) {
        uint64_t *a, *b, n1, n2;
        c = mkcfg(1000, 2, 1);
        c.shuffle = sh;
        a = share(&c, &n1);
        c.epoch = 1;
        b = share(&c, &n2);
        CHECK(memcmp(a, b, n1 * sizeof(*a)) != 0, "%s: epochs differ", sl_sample_shuffle_name(sh));
        free(b);
        c.epoch = 0;
        c.seed = 1;
        b = share(&c, &n2);
        CHECK(memcmp(a, b, n1 * sizeof(*a)) != 0, "%s: seeds differ", sl_sample_shuffle_name(sh));
        free(a);
        free(b);
    }
}

static void test_mesh(void)
{
    /* Seed 001: 8 ranks, DP=2 TP=2 CP=2 -> dp rank 0 reads 0,2,4,..., dp rank 1 reads 1,3,5,...;
     * with the default order pp,dp,cp,tp ranks 0-3 are dp 0 and ranks 4-7 dp 1. */
    for (uint32_t rank = 0; rank < 8; rank++) {
        sl_sample_config c = mkcfg(16, 8, rank);
        uint32_t dp, dps;
        uint64_t cnt, *v;
        c.shuffle = SL_SAMPLE_SHUFFLE_NONE;
        c.mesh = (sl_sample_mesh){.dp = 2, .tp = 2, .cp = 2, .pp = 1};
        CHECK(sl_sample_dp_rank(&dp, &dps, &c, NULL, 0) == 0 && dps == 2 && dp == rank / 4,
              "dp of %" PRIu32, rank);
        v = share(&c, &cnt);
        CHECK(cnt == 8, "mesh count");
        for (uint64_t i = 0; i < cnt; i++)
            CHECK(v[i] == 2 * i + rank / 4, "rank %" PRIu32 " position %" PRIu64, rank, i);
        free(v);
        /* dp innermost: dp alternates with the rank. */
        CHECK(sl_sample_mesh_order_parse(c.mesh.order, "pp,tp,cp,dp") == 0, "parse");
        CHECK(sl_sample_dp_rank(&dp, &dps, &c, NULL, 0) == 0 && dp == rank % 2, "dp inner");
        /* Shuffled: ranks with the same dp coordinate read identical streams. */
        if (rank % 2 == 0) {
            sl_sample_config c2 = c;
            uint64_t *a, *b, n1, n2;
            c2.shuffle = SL_SAMPLE_SHUFFLE_FEISTEL;
            a = share(&c2, &n1);
            c2.rank = 0;
            b = share(&c2, &n2);
            CHECK(n1 == n2 && memcmp(a, b, n1 * sizeof(*a)) == 0, "tp/cp ranks identical");
            free(a);
            free(b);
        }
    }
    uint8_t ord[4];
    CHECK(sl_sample_mesh_order_parse(ord, "dp,tp,cp") == SL_EINVAL, "3 axes");
    CHECK(sl_sample_mesh_order_parse(ord, "dp,tp,cp,dp") == SL_EINVAL, "repeat");
    CHECK(sl_sample_mesh_order_parse(ord, "dp,tp,cp,pp,") == SL_EINVAL, "trailing comma");
}

/* Elastic: consume random prefixes, re-plan over a new world, and check the consumed prefixes
 * plus the new shares are the epoch's multiset, with duplicates only from the padding rule. */
static void check_elastic(uint64_t n, uint32_t R, uint32_t R2, sl_sample_partition part,
                          sl_sample_shuffle sh, bool drop, int spread)
{
    sl_sample_config c = mkcfg(n, R, 0);
    uint64_t *consumed = calloc(R, sizeof(*consumed)), total_old = 0, rest = 0, max2 = 0, min2;
    int64_t *diff = calloc(n, sizeof(*diff));
    sl_sample_elastic *e = NULL;
    char msg[160];
    uint64_t base = 0;

    c.partition = part;
    c.chunk_size = 4;
    c.shuffle = sh;
    c.drop_last = drop;
    c.seed = 99;
    c.epoch = 7;
    for (uint32_t r = 0; r < R; r++) {
        uint64_t cnt, *v;
        c.rank = r;
        v = share(&c, &cnt);
        if (r == 0)
            base = cnt ? rnd_below(cnt + 1) : 0;
        /* spread 0: ranks close to each other; 1: anywhere in their share. */
        uint64_t near = base + rnd_below(3);
        consumed[r] = spread ? rnd_below(cnt + 1) : (near > cnt ? cnt : near);
        for (uint64_t i = 0; i < cnt; i++)
            diff[v[i]]++; /* the epoch as planned */
        for (uint64_t i = 0; i < consumed[r]; i++)
            diff[v[i]]--; /* already read */
        total_old += cnt;
        rest += cnt - consumed[r];
        free(v);
    }
    c.rank = 0;
    CHECK(sl_sample_elastic_new(&e, &c, consumed, R, R2, msg, sizeof(msg)) == 0, "plan: %s", msg);
    if (!e)
        goto out;
    CHECK(sl_sample_elastic_remaining(e) == rest, "remaining");
    min2 = UINT64_MAX;
    uint64_t got_total = 0;
    for (uint32_t s = 0; s < R2; s++) {
        sl_sample *st = NULL;
        uint64_t buf[64];
        size_t got;
        CHECK(sl_sample_new_elastic(&st, e, s, NULL, 0) == 0, "elastic stream");
        uint64_t cnt = sl_sample_count(st);
        max2 = cnt > max2 ? cnt : max2;
        min2 = cnt < min2 ? cnt : min2;
        got_total += cnt;
        while (sl_sample_next(buf, &got, st, 64) == 0 && got)
            for (size_t j = 0; j < got; j++)
                diff[buf[j]]--;
        sl_sample_free(st);
    }
    /* Equal counts (DDP lockstep whatever the batch size): drop_last cuts the rest to a
     * multiple of R2, leaving out its last rest mod R2 positions, else padding fills it up. */
    CHECK(max2 == min2, "new counts %" PRIu64 "..%" PRIu64, min2, max2);
    uint64_t out_n = sl_sample_elastic_left_out_count(e);
    CHECK(out_n == (drop ? rest % R2 : 0), "left out %" PRIu64 " of %" PRIu64, out_n, rest);
    for (uint64_t i = 0; i < out_n; i++) {
        uint64_t v = n;
        CHECK(sl_sample_elastic_left_out(&v, e, i) == 0 && v < n, "left out %" PRIu64, i);
        if (v < n)
            diff[v]--; /* stated, never served */
    }
    uint64_t extra = got_total + out_n - rest;
    CHECK(drop ? extra == 0 : extra < R2, "padding %" PRIu64, extra);
    CHECK(sl_sample_elastic_padded(e) == extra, "padded %" PRIu64 " of %" PRIu64,
          sl_sample_elastic_padded(e), extra);
    /* Every planned read happened exactly once; padding may re-read up to `extra`. */
    uint64_t over = 0;
    for (uint64_t i = 0; i < n; i++) {
        CHECK(diff[i] <= 0,
              "N=%" PRIu64 " R=%" PRIu32 "->%" PRIu32 " %s %s drop=%d: index %" PRIu64 " lost", n,
              R, R2, sl_sample_partition_name(part), sl_sample_shuffle_name(sh), drop, i);
        over += diff[i] < 0 ? (uint64_t)-diff[i] : 0;
    }
    CHECK(over == extra, "repeats %" PRIu64 " beyond padding %" PRIu64, over, extra);
    (void)total_old;
    sl_sample_elastic_free(e);
out:
    free(consumed);
    free(diff);
}

/* Issue 25 item 9: N=81, 3 ranks, drop_last, each rank consumed 2 batches of 8, the rest (33)
 * restored into 2 ranks. The old rule split it 17/16, so with batch 8 one rank took 3 steps and
 * the other 2 and DDP hung; now both get 16 and the rest's last index is left out, stated. */
static void test_elastic_ddp_restore(void)
{
    sl_sample_config c = mkcfg(81, 3, 0);
    uint64_t cons[3] = {16, 16, 16}, v = 0, last = 0;
    sl_sample_resize old = {cons, 3, 2, NULL, 0, true}, now = {cons, 3, 2, NULL, 0, false};
    sl_sample_elastic *e = NULL;
    sl_sample *s = NULL;
    char msg[128];

    c.drop_last = true;
    c.shuffle = SL_SAMPLE_SHUFFLE_TORCH;
    CHECK(sl_sample_elastic_chain(&e, &c, &old, 1, msg, sizeof(msg)) == 0, "%s", msg);
    CHECK(sl_sample_new_elastic(&s, e, 0, NULL, 0) == 0 && sl_sample_count(s) == 17, "old 17");
    /* The old rule's 17th of rank 0 is the rest's last position, the one the cut leaves out. */
    CHECK(sl_sample_fill(&last, s, 16, 1) == 0, "fill");
    sl_sample_free(s);
    CHECK(sl_sample_elastic_left_out_count(e) == 0, "old rule leaves nothing out");
    sl_sample_elastic_free(e);
    CHECK(sl_sample_elastic_chain(&e, &c, &now, 1, msg, sizeof(msg)) == 0, "%s", msg);
    for (uint32_t r = 0; r < 2; r++) {
        CHECK(sl_sample_new_elastic(&s, e, r, NULL, 0) == 0 && sl_sample_count(s) == 16,
              "rank %u: 16", r);
        sl_sample_free(s);
    }
    CHECK(sl_sample_elastic_left_out_count(e) == 1 && sl_sample_elastic_padded(e) == 0, "one out");
    CHECK(sl_sample_elastic_left_out(&v, e, 0) == 0 && v == last, "left out %" PRIu64, v);
    sl_sample_elastic_free(e);
    /* Without drop_last (N=80: 27, 27, 26): the rest of 32 is padded to 17 each, one repeat. */
    c = mkcfg(80, 3, 0);
    CHECK(sl_sample_elastic_chain(&e, &c, &now, 1, msg, sizeof(msg)) == 0, "%s", msg);
    CHECK(sl_sample_elastic_remaining(e) == 33 && sl_sample_elastic_padded(e) == 1, "pad 1");
    sl_sample_elastic_free(e);
}

static void test_elastic(void)
{
    for (int t = 0; t < 300; t++) {
        uint64_t n = 1 + rnd_below(500);
        uint32_t R = 1 + (uint32_t)rnd_below(9), R2 = 1 + (uint32_t)rnd_below(9);
        check_elastic(n, R, R2, (sl_sample_partition)rnd_below(3), (sl_sample_shuffle)rnd_below(3),
                      rnd_below(2), t % 2);
    }
    /* Errors. */
    sl_sample_config c = mkcfg(10, 2, 0);
    sl_sample_elastic *e = NULL;
    uint64_t cons[2] = {6, 0};
    char msg[128];
    CHECK(sl_sample_elastic_new(&e, &c, cons, 2, 3, msg, sizeof(msg)) == SL_EINVAL &&
              strstr(msg, "consumed 6 for old rank 0 exceeds its share of 5"),
          "%s", msg);
    CHECK(sl_sample_elastic_new(&e, &c, cons, 1, 3, msg, sizeof(msg)) == SL_EINVAL, "count");
    cons[0] = 5;
    CHECK(sl_sample_elastic_new(&e, &c, cons, 2, 0, msg, sizeof(msg)) == SL_EINVAL, "R2 0");
    CHECK(sl_sample_elastic_new(&e, &c, cons, 2, 3, msg, sizeof(msg)) == 0, "ok");
    sl_sample *s = NULL;
    CHECK(sl_sample_new_elastic(&s, e, 3, msg, sizeof(msg)) == SL_EINVAL &&
              strstr(msg, "rank 3 out of range [0, 3)"),
          "%s", msg);
    /* Rank 0 finished: the rest is rank 1's 5 indices over 3 new ranks, padded to 2 each. */
    CHECK(sl_sample_elastic_remaining(e) == 5, "rest");
    CHECK(sl_sample_new_elastic(&s, e, 2, NULL, 0) == 0 && sl_sample_count(s) == 2, "pad count");
    sl_sample_free(s);
    sl_sample_elastic_free(e);
    test_elastic_ddp_restore();
}

/* Feistel quality: for small N, over S seeds, count how often index i lands at position p.
 * A uniform shuffle gives S/N everywhere. The chi-square statistic has (N-1)^2 degrees of
 * freedom; we fail above dof + 6 * sqrt(2 * dof), about p < 1e-8 under the normal
 * approximation, so a correct shuffle does not fail by chance, while a biased one (e.g. a
 * 2-round network, or a key ignoring the seed) exceeds it by orders of magnitude. Seeds are
 * fixed, so the test is deterministic. */
static double chi_square(uint64_t n, uint64_t seeds, uint64_t epoch)
{
    uint64_t *cnt = calloc(n * n, sizeof(*cnt)), *v = malloc(n * sizeof(*v));
    double exp = (double)seeds / (double)n, chi = 0;

    for (uint64_t s = 0; s < seeds; s++) {
        sl_sample_epoch_order(v, n, SL_SAMPLE_SHUFFLE_FEISTEL, s, epoch);
        for (uint64_t p = 0; p < n; p++)
            cnt[v[p] * n + p]++;
    }
    for (uint64_t i = 0; i < n * n; i++)
        chi += ((double)cnt[i] - exp) * ((double)cnt[i] - exp) / exp;
    free(cnt);
    free(v);
    return chi;
}

static void test_feistel_uniformity(void)
{
    static const uint64_t ns[] = {2, 3, 4, 5, 7, 8, 9, 10, 16, 17, 31, 33, 64};

    for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
        uint64_t n = ns[k], seeds = 2000 * n;
        double dof = (double)((n - 1) * (n - 1)), lim = dof + 6 * sqrt(2 * dof);
        double chi = chi_square(n, seeds, 5);
        printf("chi-square N=%-3" PRIu64 " seeds=%-6" PRIu64 " chi2=%9.1f dof=%5.0f limit=%7.1f\n",
               n, seeds, chi, dof, lim);
        CHECK(chi <= lim, "N=%" PRIu64 ": chi2 %.1f over %.1f", n, chi, lim);
    }
}

/* The same idea for domains wide enough to use the 8-round network: index and position are
 * grouped into 16 buckets each (dof 225, same limit rule). N = 65537 has the narrowest halves
 * (8 and 9 bits) that get 8 rounds, 100003 is a typical size and 2^20 + 1 walks the most
 * (nearly half of each pass lands outside [0, N)). */
static void feistel_uniformity_wide(uint64_t n, uint64_t seeds)
{
    const uint64_t B = 16;
    uint64_t *v = malloc(n * sizeof(*v)), cnt[16 * 16] = {0}, size[16] = {0};
    double chi = 0, dof = (double)((B - 1) * (B - 1)), lim = dof + 6 * sqrt(2 * dof);

    for (uint64_t i = 0; i < n; i++)
        size[i * B / n]++;
    for (uint64_t s = 0; s < seeds; s++) {
        sl_sample_epoch_order(v, n, SL_SAMPLE_SHUFFLE_FEISTEL, 1000 + s, 0);
        for (uint64_t p = 0; p < n; p++)
            cnt[(v[p] * B / n) * B + p * B / n]++;
    }
    for (uint64_t a = 0; a < B; a++)
        for (uint64_t b = 0; b < B; b++) {
            double e = (double)seeds * (double)size[a] * (double)size[b] / (double)n;
            chi += ((double)cnt[a * B + b] - e) * ((double)cnt[a * B + b] - e) / e;
        }
    printf("chi-square N=%" PRIu64 " (16x16 buckets) seeds=%" PRIu64 " chi2=%.1f dof=%.0f "
           "limit=%.1f\n",
           n, seeds, chi, dof, lim);
    CHECK(chi <= lim, "wide N=%" PRIu64 ": chi2 %.1f over %.1f", n, chi, lim);
    free(v);
}

static void test_feistel_uniformity_wide(void)
{
    feistel_uniformity_wide(65537, 60);
    feistel_uniformity_wide(100003, 60);
    feistel_uniformity_wide((UINT64_C(1) << 20) + 1, 60);
}

/* The vectorized block path (sl_sample_fill / epoch order) and the per-position path
 * (sl_sample_feistel_at) must agree, on both sides of the 32-bit/64-bit word boundary, at
 * block edges and in the padding tail. */
static void test_feistel_paths(void)
{
    static const uint64_t ns[] = {1,
                                  2,
                                  17,
                                  1000003,
                                  (UINT64_C(1) << 31) + 1,
                                  (UINT64_C(1) << 32) - 1,
                                  UINT64_C(1) << 32,
                                  (UINT64_C(1) << 32) + 1,
                                  (UINT64_C(1) << 40) + 3};
    static uint64_t buf[3000];

    for (size_t t = 0; t < sizeof(ns) / sizeof(ns[0]); t++) {
        uint64_t n = ns[t];
        for (uint32_t R = 1; R <= 7; R += 3) {
            sl_sample_config c;
            sl_sample *s;
            uint64_t pos, cnt, x;
            size_t m;
            sl_sample_config_init(&c);
            c.samples = n;
            c.replicas = R;
            c.rank = R - 1;
            c.seed = 11 + t;
            c.epoch = R;
            CHECK(sl_sample_new(&s, &c, NULL, 0) == 0, "new");
            cnt = sl_sample_count(s);
            /* The last positions of the share (the padding tail when R does not divide n). */
            pos = cnt > 2900 ? cnt - 2900 : 0;
            m = (size_t)(cnt - pos);
            CHECK(sl_sample_fill(buf, s, pos, m) == 0, "fill");
            for (size_t k = 0; k < m; k++) {
                uint64_t p = c.rank + (pos + k) * R;
                CHECK(sl_sample_feistel_at(&x, n, c.seed, c.epoch, p % n) == 0 && x == buf[k],
                      "n=%" PRIu64 " R=%" PRIu32 " position %" PRIu64 ": %" PRIu64
                      " from the stream, %" PRIu64 " alone",
                      n, R, pos + k, buf[k], x);
            }
            sl_sample_free(s);
        }
    }
}

int main(void)
{
    test_validation();
    test_torch_known();
    test_feistel_bijection();
    test_feistel_paths();
    test_partitions();
    test_exact_layouts();
    test_mesh();
    test_elastic();
    test_feistel_uniformity();
    test_feistel_uniformity_wide();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("sample_test: all checks passed\n");
    return 0;
}
