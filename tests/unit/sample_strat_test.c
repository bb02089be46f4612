/* Property tests for common/sample/strat.c and the class and weight options of sample.c:
 * stratified shares, class-balanced epochs, weighted shares and chained resizes over random
 * configurations (class imbalance from balanced to 1:10,000, R from 1 to 64, drop_last on and
 * off, several resizes in a row at random progress), plus the errors for bad input. */
#include "err.h"
#include "sample/internal.h"
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

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

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

/* The window property (docs/sampling.md "The window property"): in every window of W consecutive
 * positions of a rank's share, for every W, class c's count differs from W times its proportion
 * in the share by less than S_c = the sum over c's leaf and its ancestors below the root of the
 * rank's count of c over the node's count (tree_bound below). S_c = 1 (strict +-1) for a class
 * the root splits off. The proven constant is for the tree's shape in the epoch's proportions
 * (G_c < 5, tree_shape below); over these random configurations S_c stays below this constant,
 * a regression guard on a measured figure (2.93 is the largest seen over 3,000 configurations),
 * not a proven bound. A strict +-1 for every class and every W does not exist for some shares
 * (test_window_impossible). */
#define WINDOW_BOUND 3.0

/* Random labels: C classes, sizes from balanced to 1:max_ratio, shuffled over [0, n). */
static uint32_t *random_labels(uint64_t *n_out, uint32_t *C_out)
{
    uint32_t C = 1 + (uint32_t)rnd_below(rnd_below(4) ? 12 : 60);
    uint64_t ratio = (uint64_t[]){1, 3, 100, 10000}[rnd_below(4)];
    uint64_t *sz = malloc(C * sizeof(*sz)), n = 0;
    uint32_t *lab;

    for (uint32_t c = 0; c < C; c++) {
        /* One or a few large classes, the rest small. */
        uint64_t small = 1 + rnd_below(ratio >= 100 ? 3 : 40);
        sz[c] = (c == 0 || rnd_below(5) == 0) ? small * ratio : small;
        if (sz[c] > 30000)
            sz[c] = 30000 + rnd_below(1000);
        n += sz[c];
    }
    lab = malloc(n * sizeof(*lab));
    for (uint64_t i = 0, k = 0; k < C; k++)
        for (uint64_t j = 0; j < sz[k]; j++)
            lab[i++] = (uint32_t)k;
    for (uint64_t i = n - 1; i > 0; i--) {
        uint64_t j = rnd_below(i + 1);
        uint32_t t = lab[i];
        lab[i] = lab[j];
        lab[j] = t;
    }
    free(sz);
    *n_out = n;
    *C_out = C;
    return lab;
}

static uint64_t *full_share(const sl_sample_config *c, uint64_t *cnt)
{
    sl_sample *s = NULL;
    char msg[256];
    uint64_t *v;
    int err = sl_sample_new(&s, c, msg, sizeof(msg));

    CHECK(err == 0, "sl_sample_new: %s", msg);
    if (err)
        exit(1);
    *cnt = sl_sample_count(s);
    v = malloc((*cnt + 1) * sizeof(*v));
    CHECK(sl_sample_fill(v, s, 0, *cnt) == 0, "fill");
    /* Seeking: a random slice equals the same positions of the whole share. */
    if (*cnt) {
        uint64_t p = rnd_below(*cnt), m = 1 + rnd_below(*cnt - p), *w = malloc(m * sizeof(*w));
        size_t got;
        CHECK(sl_sample_seek(s, p) == 0, "seek");
        CHECK(sl_sample_next(w, &got, s, m) == 0 && got == m, "next");
        CHECK(memcmp(w, v + p, m * sizeof(*w)) == 0, "slice at %" PRIu64 " differs", p);
        free(w);
    }
    sl_sample_free(s);
    return v;
}

/* Largest |count - W * p| over all windows of the share v[0..M) for class c, through prefix
 * deviations D(t) = P(t) - t*p: a window (a, b] deviates by D(b) - D(a). */
static double window_dev(const uint64_t *v, uint64_t M, const uint32_t *lab, uint32_t c)
{
    uint64_t k = 0;
    double p, d = 0, lo = 0, hi = 0, worst = 0;

    for (uint64_t t = 0; t < M; t++)
        k += lab[v[t]] == c;
    if (!k)
        return 0;
    p = (double)k / (double)M;
    k = 0;
    for (uint64_t t = 1; t <= M; t++) {
        k += lab[v[t - 1]] == c;
        d = (double)k - (double)t * p;
        if (d - lo > worst)
            worst = d - lo;
        if (hi - d > worst)
            worst = hi - d;
        if (d < lo)
            lo = d;
        if (d > hi)
            hi = d;
    }
    return worst;
}

static double max_window_dev, max_tree_bound;
static uint64_t classes_seen, classes_within_one;

/* S_c of each drawn class for rank r: sum over the leaf and its ancestors below the root of
 * count(leaf) / count(node), from the rank's node counts, leaving out nodes whose parent sends
 * the rank's positions all one way. bound[c] is 0 for a class the rank
 * does not hold. */
static void tree_bound(double *bound, const sl_strat *st, uint32_t r, uint32_t C)
{
    uint64_t *cnt = calloc(st->ctree.nnode + 1, sizeof(*cnt));

    sl_strat_counts(cnt, st, r);
    for (uint32_t c = 0; c < C; c++)
        bound[c] = 0;
    for (uint32_t i = 0; i < st->nleaf; i++) {
        uint32_t nd = st->ctree.leaf[i];
        uint64_t k = cnt[nd];
        double b = 0;
        for (; k && nd != st->ctree.root; nd = st->ctree.node[nd].parent) {
            const sl_mix_node *pn = &st->ctree.node[st->ctree.node[nd].parent];
            /* A split that sends all of the node's positions one way is exact. */
            if (cnt[pn->left] && cnt[pn->right])
                b += (double)k / (double)cnt[nd];
        }
        bound[st->leaf_class[i]] = b;
    }
    free(cnt);
}

static double max_global_bound;

/* The interleave tree's shape, which makes the window bound small (docs/sampling.md, "The window
 * property"): with K the epoch's draws under a node, every child but a class split off alone
 * (heavier than its siblings together) holds less than 3/4 of its parent, so for every class
 * G_c = sum over c's leaf and its ancestors below the root of K_c / K_A is below
 * 1 + 1 + 3/4 + (3/4)^2 + ... = 5. Returns the largest G_c. */
static double tree_shape(const sl_strat *st)
{
    const sl_mix *t = &st->ctree;
    double worst = 0;

#define K(nd) ((double)(st->pre[t->node[nd].b] - st->pre[t->node[nd].a]))
    for (uint32_t nd = 0; nd < t->nnode; nd++) {
        uint32_t ch[2] = {t->node[nd].left, t->node[nd].right};
        for (int k = 0; k < 2 && ch[0] != SL_MIX_NONE; k++) {
            int alone = t->node[ch[k]].left == SL_MIX_NONE && 2 * K(ch[k]) >= K(nd);
            CHECK(alone || 4 * K(ch[k]) < 3 * K(nd), "node %u child %u: %.0f of %.0f", nd, ch[k],
                  K(ch[k]), K(nd));
        }
    }
    for (uint32_t i = 0; i < st->nleaf; i++) {
        uint32_t leaf = t->leaf[i];
        double g = 0;
        for (uint32_t nd = leaf; nd != t->root; nd = t->node[nd].parent)
            g += K(leaf) / K(nd);
        CHECK(g < 5.0, "class %u: G_c %.3f", st->leaf_class[i], g);
        if (g > worst)
            worst = g;
    }
#undef K
    return worst;
}

/* Whether some order of M positions holding counts[c] of each class keeps every class within
 * +-1 of W * p_c in every window (the range of the prefix deviation D(t) = P(t) - t*p at most
 * 1, in units of 1/M to stay exact). Exhaustive, for tiny M only. */
static int exists_balanced(uint32_t *left, const uint32_t *counts, uint32_t C, uint32_t M,
                           uint32_t t, int64_t *P, int64_t *lo, int64_t *hi)
{
    if (t == M)
        return 1;
    for (uint32_t c = 0; c < C; c++) {
        int64_t slo[8], shi[8], ok = 1;
        if (!left[c])
            continue;
        left[c]--;
        P[c]++;
        for (uint32_t k = 0; k < C; k++) {
            int64_t d = P[k] * (int64_t)M - (int64_t)(t + 1) * counts[k];
            slo[k] = lo[k];
            shi[k] = hi[k];
            lo[k] = d < lo[k] ? d : lo[k];
            hi[k] = d > hi[k] ? d : hi[k];
            ok &= hi[k] - lo[k] <= (int64_t)M;
        }
        if (ok && exists_balanced(left, counts, C, M, t + 1, P, lo, hi))
            return 1;
        memcpy(lo, slo, C * sizeof(*lo));
        memcpy(hi, shi, C * sizeof(*hi));
        P[c]--;
        left[c]++;
    }
    return 0;
}

/* Why the window property is S_c and not +-1 for every class: a share of 11 with 1, 2 and 8 of
 * three classes (or 2, 3, 6) has no order at all in which every window of every length holds
 * each class within +-1 of its proportion, while two classes always have one (Bresenham). */
static void test_window_impossible(void)
{
    static const uint32_t cases[][3] = {{1, 2, 8}, {2, 3, 6}, {3, 8, 0}, {5, 6, 0}, {3, 3, 3}};

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint32_t left[3], C = cases[i][2] ? 3 : 2, M = 0;
        int64_t P[3] = {0}, lo[3] = {0}, hi[3] = {0};
        for (uint32_t c = 0; c < C; c++)
            M += left[c] = cases[i][c];
        int want = i >= 2;
        CHECK(exists_balanced(left, cases[i], C, M, 0, P, lo, hi) == want,
              "counts %u,%u,%u: an order within +-1 %s", cases[i][0], cases[i][1], cases[i][2],
              want ? "exists" : "does not exist");
    }
}

static void test_stratified_random(int rounds)
{
    for (int it = 0; it < rounds; it++) {
        uint64_t n, *hits, *ccount, *rank_cls;
        uint32_t C, R = 1 + (uint32_t)rnd_below(rnd_below(2) ? 8 : 64);
        uint32_t *lab = random_labels(&n, &C);
        sl_sample_labels *L = NULL;
        sl_sample_config cfg;
        char msg[256];
        int weighted = rnd_below(3) == 0;
        double w[64], *bound;
        uint64_t total = 0, padding = 0, expect_total, q[64];
        sl_strat st;

        CHECK(sl_sample_labels_new(&L, lab, n, msg, sizeof(msg)) == 0, "%s", msg);
        sl_sample_config_init(&cfg);
        cfg.samples = n;
        cfg.replicas = R;
        cfg.seed = rnd();
        cfg.epoch = rnd_below(1000);
        cfg.drop_last = rnd_below(2);
        cfg.shuffle = rnd_below(4) ? SL_SAMPLE_SHUFFLE_FEISTEL : SL_SAMPLE_SHUFFLE_NONE;
        cfg.classes = SL_SAMPLE_CLASSES_STRATIFY;
        cfg.labels = L;
        if (weighted) {
            for (uint32_t r = 0; r < R; r++)
                w[r] = 0.5 + (double)rnd_below(4);
            cfg.rank_weights = w;
            cfg.n_rank_weights = R;
            if (n < 16 * (uint64_t)R) {
                cfg.n_rank_weights = 0; /* too few draws for every rank: tested below */
                weighted = 0;
            }
        }
        hits = calloc(n, sizeof(*hits));
        ccount = calloc(C, sizeof(*ccount));
        rank_cls = calloc((size_t)C * R, sizeof(*rank_cls));
        bound = calloc(C, sizeof(*bound));
        for (uint32_t c = 0; c < C; c++)
            ccount[c] = sl_sample_labels_class_size(L, c);
        if (weighted)
            CHECK(sl_weights_quantize(q, w, R, "rank", msg, sizeof(msg)) == 0, "%s", msg);
        CHECK(sl_strat_init(&st, &cfg, R, weighted ? q : NULL, msg, sizeof(msg)) == 0, "%s", msg);
        double g = tree_shape(&st);
        if (g > max_global_bound)
            max_global_bound = g;
        for (uint32_t r = 0; r < R; r++) {
            uint64_t M, real;
            cfg.rank = r;
            uint64_t *v = full_share(&cfg, &M);
            tree_bound(bound, &st, r, C);
            if (weighted || cfg.drop_last)
                real = M;
            else
                real = n > r ? (n - r - 1) / R + 1 : 0;
            for (uint64_t i = 0; i < M; i++) {
                CHECK(v[i] < n, "index %" PRIu64 " out of range", v[i]);
                if (v[i] >= n)
                    break;
                if (i < real) {
                    hits[v[i]]++;
                    rank_cls[(size_t)r * C + lab[v[i]]]++;
                } else {
                    padding++;
                }
            }
            total += real;
            for (uint32_t c = 0; c < C && weighted; c++) {
                double want = (double)ccount[c] * w[r], sum = 0;
                for (uint32_t k = 0; k < R; k++)
                    sum += w[k];
                want /= sum;
                CHECK(fabs((double)rank_cls[(size_t)r * C + c] - want) < WINDOW_BOUND + 1,
                      "weighted rank %u class %u: %" PRIu64 " want %.2f", r, c,
                      rank_cls[(size_t)r * C + c], want);
            }
            for (uint32_t c = 0; c < C; c++) {
                double d = window_dev(v, real, lab, c);
                if (d > max_window_dev)
                    max_window_dev = d;
                if (bound[c] > max_tree_bound)
                    max_tree_bound = bound[c];
                classes_seen += bound[c] > 0;
                classes_within_one += bound[c] > 0 && d <= 1;
                CHECK(d < bound[c] + 1e-9 || (bound[c] == 0 && d == 0),
                      "rank %u class %u window deviation %.3f over its bound %.3f (R %u C %u n "
                      "%" PRIu64 ")",
                      r, c, d, bound[c], R, C, n);
                CHECK(bound[c] < WINDOW_BOUND, "rank %u class %u bound %.3f", r, c, bound[c]);
            }
            free(v);
        }
        /* Per-rank class counts: floor or ceil of the class's dealt draws over R (all of the
         * class but what drop_last trims from the end of the grouped order, heaviest class
         * first). */
        for (uint32_t c = 0; c < C && !weighted; c++) {
            uint64_t kept = 0;
            for (uint32_t r = 0; r < R; r++)
                kept += rank_cls[(size_t)r * C + c];
            CHECK(kept == ccount[c] || cfg.drop_last, "class %u kept %" PRIu64, c, kept);
            for (uint32_t r = 0; r < R; r++) {
                uint64_t k = rank_cls[(size_t)r * C + c];
                CHECK(k == kept / R || k == (kept + R - 1) / R,
                      "rank %u class %u: %" PRIu64 " of %" PRIu64 " over %u ranks", r, c, k, kept,
                      R);
            }
        }
        /* Exact coverage: every index once (drop_last: all but n mod R of the largest class;
         * weighted drop_last: the floors), no repeats but padding. */
        expect_total = cfg.drop_last && !weighted ? n - n % R : n;
        if (weighted && cfg.drop_last)
            expect_total = total;
        CHECK(total == expect_total, "covered %" PRIu64 " want %" PRIu64, total, expect_total);
        if (!cfg.drop_last && !weighted)
            CHECK(padding == (n + R - 1) / R * R - n, "padding %" PRIu64, padding);
        for (uint64_t i = 0; i < n; i++)
            CHECK(hits[i] <= 1, "index %" PRIu64 " read %" PRIu64 " times", i, hits[i]);
        free(hits);
        free(ccount);
        free(rank_cls);
        free(bound);
        free(lab);
        sl_strat_close(&st);
        sl_sample_labels_free(L);
    }
}

/* Weighted class-blind shares: sizes by largest remainders, disjoint, complete. */
static void test_weighted_random(int rounds)
{
    for (int it = 0; it < rounds; it++) {
        uint32_t R = 1 + (uint32_t)rnd_below(64);
        uint64_t n = 1 + rnd_below(5000), *hits = calloc(n, sizeof(*hits)), total = 0;
        double w[64], sum = 0;
        sl_sample_config cfg;

        sl_sample_config_init(&cfg);
        cfg.samples = n;
        cfg.replicas = R;
        cfg.seed = rnd();
        cfg.drop_last = rnd_below(2);
        cfg.partition = rnd_below(2) ? SL_SAMPLE_INTERLEAVED : SL_SAMPLE_CONTIGUOUS;
        cfg.shuffle = (sl_sample_shuffle)rnd_below(3);
        if (cfg.partition == SL_SAMPLE_CONTIGUOUS && cfg.shuffle == SL_SAMPLE_SHUFFLE_TORCH)
            cfg.shuffle = SL_SAMPLE_SHUFFLE_FEISTEL;
        for (uint32_t r = 0; r < R; r++) {
            w[r] = 0.25 + (double)rnd_below(16) / 4.0;
            sum += w[r];
        }
        cfg.rank_weights = w;
        cfg.n_rank_weights = R;
        for (uint32_t r = 0; r < R; r++) {
            uint64_t M, *v;
            double want = (double)n * w[r] / sum;
            cfg.rank = r;
            v = full_share(&cfg, &M);
            if (cfg.drop_last)
                CHECK(M == (uint64_t)floor(want + 1e-9) || M + 1 == (uint64_t)floor(want + 1e-9),
                      "drop_last rank %u: %" PRIu64 " want floor(%.3f)", r, M, want);
            else
                CHECK(fabs((double)M - want) < 1.0, "rank %u: %" PRIu64 " want %.3f", r, M, want);
            for (uint64_t i = 0; i < M; i++)
                hits[v[i]]++;
            total += M;
            free(v);
        }
        if (!cfg.drop_last)
            CHECK(total == n, "total %" PRIu64 " of %" PRIu64, total, n);
        CHECK(n - total < R, "dropped %" PRIu64 " with %u ranks", n - total, R);
        for (uint64_t i = 0; i < n; i++)
            CHECK(hits[i] <= 1, "index %" PRIu64 " read %" PRIu64 " times", i, hits[i]);
        free(hits);
    }
}

/* Class-balanced epochs over R up to 64, drop_last on and off: every epoch draws its length
 * (drop_last: the multiple of R below it) with the target class proportions (within one without
 * drop_last, which trims fewer than R draws), each rank's share its dealt draws and then the
 * padding (the torch rule, repeats of the epoch's draws); and across epochs each sample of a
 * class is drawn floor or ceil of (draws so far / class size) times: no sample of a class comes
 * twice before every sample of it came once. */
static void test_balanced_random(int rounds)
{
    for (int it = 0; it < rounds; it++) {
        uint64_t n;
        uint32_t C, R = 1 + (uint32_t)rnd_below(rnd_below(2) ? 16 : 64);
        uint32_t *lab = random_labels(&n, &C);
        sl_sample_labels *L = NULL;
        sl_sample_config cfg;
        double cw[64], wsum = 0;
        char msg[256];
        uint64_t *times = calloc(n, sizeof(*times)), *drawn = calloc(C, sizeof(*drawn));
        int epochs = 2 + (int)rnd_below(5);

        CHECK(sl_sample_labels_new(&L, lab, n, msg, sizeof(msg)) == 0, "%s", msg);
        sl_sample_config_init(&cfg);
        cfg.samples = n;
        cfg.replicas = R;
        cfg.seed = rnd();
        cfg.classes = SL_SAMPLE_CLASSES_BALANCE;
        cfg.labels = L;
        cfg.drop_last = rnd_below(2);
        cfg.epoch_length = rnd_below(2) ? 0 : 1 + rnd_below(3 * n);
        if (rnd_below(2)) {
            for (uint32_t c = 0; c < C; c++) {
                cw[c] = 1.0 + (double)rnd_below(4);
                wsum += cw[c];
            }
            cfg.class_weights = cw;
            cfg.n_class_weights = C;
        } else {
            for (uint32_t c = 0; c < C; c++)
                cw[c] = 1.0;
            wsum = C;
        }
        uint64_t Lep = cfg.epoch_length ? cfg.epoch_length : n;
        if (Lep < R)
            cfg.epoch_length = Lep = R;
        uint64_t kept = cfg.drop_last ? Lep / R * R : Lep;
        for (int e = 0; e < epochs; e++) {
            uint64_t *cls = calloc(C, sizeof(*cls)), got = 0, all = 0;
            sl_strat st;
            cfg.epoch = (uint64_t)e; /* the pass rule needs the epochs in a row */
            CHECK(sl_strat_init(&st, &cfg, R, NULL, msg, sizeof(msg)) == 0, "%s", msg);
            for (uint32_t r = 0; r < R; r++) {
                uint64_t M, *v, real = sl_strat_real(&st, r);
                cfg.rank = r;
                v = full_share(&cfg, &M);
                CHECK(M == (cfg.drop_last ? Lep / R : (Lep + R - 1) / R),
                      "rank %u share %" PRIu64 " of an epoch of %" PRIu64 " over %u", r, M, Lep, R);
                CHECK(real <= M && (cfg.drop_last ? real == M : M - real <= 1),
                      "rank %u real %" PRIu64 " of %" PRIu64, r, real, M);
                for (uint64_t i = 0; i < M && i < real; i++) {
                    times[v[i]]++;
                    cls[lab[v[i]]]++;
                }
                for (uint64_t i = real; i < M; i++)
                    CHECK(v[i] < n, "padding %" PRIu64, v[i]);
                got += real;
                all += M;
                free(v);
            }
            sl_strat_close(&st);
            CHECK(got == kept, "epoch %d drew %" PRIu64 " of %" PRIu64, e, got, kept);
            CHECK(all == (cfg.drop_last ? kept : (Lep + R - 1) / R * R), "epoch %d: %" PRIu64, e,
                  all);
            for (uint32_t c = 0; c < C; c++) {
                double want = (double)Lep * cw[c] / wsum;
                /* Largest remainders give within one of the target; drop_last trims fewer
                 * than R from the last class dealt. */
                CHECK(fabs((double)cls[c] - want) < (cfg.drop_last ? 1.0 + R : 1.0),
                      "epoch %d class %u: %" PRIu64 " want %.2f (R %u drop_last %d)", e, c, cls[c],
                      want, R, cfg.drop_last);
                drawn[c] += cls[c];
            }
            free(cls);
        }
        /* The pass rule, also for the class drop_last trims (its stream moves on by what was
         * dealt, so nothing is skipped). */
        for (uint64_t i = 0; i < n; i++) {
            uint32_t c = lab[i];
            uint64_t nc = sl_sample_labels_class_size(L, c);
            CHECK(times[i] == drawn[c] / nc || times[i] == (drawn[c] + nc - 1) / nc,
                  "sample %" PRIu64 " of class %u (size %" PRIu64 ") drawn %" PRIu64
                  " times of %" PRIu64,
                  i, c, nc, times[i], drawn[c]);
        }
        free(times);
        free(drawn);
        free(lab);
        sl_sample_labels_free(L);
    }
}

/* Chained resizes, over plain, stratified and class-balanced epochs, worlds of 1 to 64 ranks,
 * weighted or not, 1 to 5 resizes in a row, each world reading a random prefix of its share:
 * what every world consumed plus the last world's real entries are the epoch's shares exactly
 * (as a multiset: a balanced epoch draws some samples more than once, and padding repeats are
 * passed on only from the epoch's own shares). */
static void test_chain_random(int rounds)
{
    for (int it = 0; it < rounds; it++) {
        uint64_t n;
        uint32_t C, R = 1 + (uint32_t)rnd_below(rnd_below(2) ? 24 : 64);
        uint32_t *lab = random_labels(&n, &C);
        sl_sample_labels *L = NULL;
        sl_sample_config cfg;
        sl_sample_elastic *e = NULL;
        char msg[256];
        int64_t *bal = calloc(n, sizeof(*bal));
        int steps = 1 + (int)rnd_below(5);
        int kind = (int)rnd_below(3); /* 0 plain, 1 stratified, 2 class-balanced */

        CHECK(sl_sample_labels_new(&L, lab, n, msg, sizeof(msg)) == 0, "%s", msg);
        sl_sample_config_init(&cfg);
        cfg.samples = n;
        cfg.replicas = R;
        cfg.seed = rnd();
        cfg.epoch = rnd_below(5);
        cfg.drop_last = rnd_below(2);
        if (kind) {
            cfg.classes = kind == 1 ? SL_SAMPLE_CLASSES_STRATIFY : SL_SAMPLE_CLASSES_BALANCE;
            cfg.labels = L;
            if (kind == 2 && rnd_below(2))
                cfg.epoch_length = R + rnd_below(2 * n);
        } else {
            cfg.partition = (sl_sample_partition)rnd_below(3);
            cfg.chunk_size = 1 + rnd_below(9);
            cfg.shuffle = (sl_sample_shuffle)rnd_below(3);
        }
        /* The epoch's shares, with their padding, are what the plan must cover. */
        uint32_t wR = R;
        uint64_t *cons = malloc(64 * sizeof(*cons)), out_before = 0;
        for (uint32_t r = 0; r < R; r++) {
            uint64_t M, *v;
            cfg.rank = r;
            v = full_share(&cfg, &M);
            cons[r] = rnd_below(2) ? rnd_below(M + 1) : M / 2;
            for (uint64_t i = 0; i < M; i++)
                bal[v[i]] += i < cons[r] ? 0 : 1; /* the rest, to be read after resizes */
            free(v);
        }
        for (int k = 0; k < steps; k++) {
            sl_sample_elastic *ne = NULL;
            uint32_t nR = 1 + (uint32_t)rnd_below(rnd_below(2) ? 24 : 64);
            double w[64];
            sl_sample_resize st = {cons, wR, nR, NULL, 0, rnd_below(4) == 0};
            uint64_t first_M = UINT64_MAX, out_n;
            int err;
            if (rnd_below(3) == 0) {
                for (uint32_t s = 0; s < nR; s++)
                    w[s] = 1.0 + (double)rnd_below(3);
                st.weights = w;
                st.n_weights = nR;
            }
            if (k == 0) {
                cfg.rank = 0;
                err = sl_sample_elastic_chain(&ne, &cfg, &st, 1, msg, sizeof(msg));
            } else {
                err = sl_sample_elastic_extend(&ne, e, &st, msg, sizeof(msg));
            }
            CHECK(err == 0, "resize %d: %s", k, msg);
            if (err)
                exit(1);
            sl_sample_elastic_free(e);
            e = ne;
            /* The new world consumes a random prefix (the last world reads everything). */
            uint64_t T = sl_sample_elastic_remaining(e), realsum = 0;
            for (uint32_t s = 0; s < nR; s++) {
                sl_sample *ss = NULL;
                uint64_t M, *v, real;
                CHECK(sl_sample_new_elastic(&ss, e, s, msg, sizeof(msg)) == 0, "%s", msg);
                M = sl_sample_count(ss);
                v = malloc((M + 1) * sizeof(*v));
                CHECK(sl_sample_fill(v, ss, 0, M) == 0, "fill");
                /* Real entries: the position in the rest is below T. */
                /* Unweighted steps give every rank the same count (not so the old rule). */
                if (first_M == UINT64_MAX)
                    first_M = M;
                CHECK(M == first_M || st.n_weights || st.uneven,
                      "step %d rank %u: %" PRIu64 " where rank 0 has %" PRIu64, k, s, M, first_M);
                if (st.n_weights || cfg.drop_last ||
                    (cfg.partition == SL_SAMPLE_CHUNKED && st.uneven))
                    real = M;
                else if (cfg.partition == SL_SAMPLE_INTERLEAVED)
                    real = T > s ? (T - s - 1) / nR + 1 : 0;
                else
                    real = T / nR + (s < T % nR);
                realsum += real;
                cons[s] = k + 1 == steps ? M : rnd_below(M + 1);
                for (uint64_t i = 0; i < cons[s] && i < real; i++)
                    bal[v[i]]--;
                free(v);
                sl_sample_free(ss);
            }
            /* What the cut left out is stated exactly and never served (the count covers
             * every step so far). */
            out_n = sl_sample_elastic_left_out_count(e) - out_before;
            CHECK(out_n == (cfg.drop_last && !st.uneven && !st.n_weights ? T % nR : 0),
                  "step %d: %" PRIu64 " left out of a rest of %" PRIu64 " over %u", k, out_n, T,
                  nR);
            for (uint64_t i = out_before; i < out_before + out_n; i++) {
                uint64_t v = UINT64_MAX;
                CHECK(sl_sample_elastic_left_out(&v, e, i) == 0 && v < n, "left out %" PRIu64, i);
                if (v < n)
                    bal[v]--;
            }
            out_before += out_n;
            CHECK(sl_sample_elastic_left_out(&(uint64_t){0}, e, out_before) == SL_EINVAL, "past");
            CHECK(realsum + out_n == T, "step %d: real %" PRIu64 " of the rest %" PRIu64, k,
                  realsum, T);
            wR = nR;
        }
        for (uint64_t i = 0; i < n; i++)
            CHECK(bal[i] == 0,
                  "index %" PRIu64 " balance %" PRId64 " after %d resizes (kind %d R %u)", i,
                  bal[i], steps, kind, R);
        sl_sample_elastic_free(e);
        free(cons);
        free(bal);
        free(lab);
        sl_sample_labels_free(L);
    }
}

static uint64_t pre_count(const void *ctx, const sl_mix *t, uint32_t nd)
{
    const uint64_t *pre = ctx;

    return pre[t->node[nd].b] - pre[t->node[nd].a];
}

/* The interleave tree's three queries agree with each other on random counts: position p is
 * the ord-th of its leaf, select gives p back and prefix counts the leaf's earlier positions. */
static void test_mix(void)
{
    for (int it = 0; it < 300; it++) {
        uint32_t nl = 1 + (uint32_t)rnd_below(20);
        uint64_t pre[21], *seen;
        sl_mix t;

        pre[0] = 0;
        for (uint32_t i = 0; i < nl; i++)
            pre[i + 1] = pre[i] + 1 + rnd_below(rnd_below(2) ? 5 : 500);
        CHECK(sl_mix_build(&t, pre, nl) == 0, "build");
        seen = calloc(nl, sizeof(*seen));
        for (uint64_t p = 0; p < pre[nl]; p++) {
            uint32_t leaf;
            uint64_t ord;
            sl_mix_at(&leaf, &ord, &t, p, pre_count, pre);
            CHECK(leaf < nl && ord == seen[leaf], "at %" PRIu64 ": leaf %u ord %" PRIu64, p, leaf,
                  ord);
            if (leaf >= nl)
                break;
            CHECK(sl_mix_select(&t, leaf, ord, pre_count, pre) == p, "select leaf %u ord %" PRIu64,
                  leaf, ord);
            CHECK(sl_mix_prefix(&t, leaf, p, pre_count, pre) == ord, "prefix leaf %u at %" PRIu64,
                  leaf, p);
            seen[leaf]++;
        }
        for (uint32_t i = 0; i < nl; i++)
            CHECK(seen[i] == pre[i + 1] - pre[i], "leaf %u saw %" PRIu64, i, seen[i]);
        free(seen);
        sl_mix_close(&t);
    }
}

static void expect(int got, int want, const char *msg, const char *needle)
{
    CHECK(got == want, "want %s got %s (%s)", sl_errname(want), sl_errname(got), msg);
    CHECK(strstr(msg, needle) != NULL, "message '%s' lacks '%s'", msg, needle);
}

static void test_bad_input(void)
{
    uint32_t lab[6] = {0, 1, 1, 2, 0, 1}, big[2] = {0, 2000000};
    sl_sample_labels *L = NULL;
    sl_sample_config cfg;
    char msg[256] = "";
    double w[4] = {1, 0, 1, 1}, nanw[2] = {1, NAN}, cw[3] = {1, 1, 1};
    double out[8];
    size_t n;

    expect(sl_sample_labels_new(&L, big, 2, msg, sizeof(msg)), SL_EINVAL, msg,
           "label 2000000 of sample 1 over the maximum class id 1048575");
    CHECK(sl_sample_labels_new(&L, lab, 6, msg, sizeof(msg)) == 0, "%s", msg);
    sl_sample_config_init(&cfg);
    cfg.samples = 7;
    cfg.classes = SL_SAMPLE_CLASSES_STRATIFY;
    expect(sl_sample_config_check(&cfg, msg, sizeof(msg)), SL_EINVAL, msg,
           "stratify needs labels: the dataset has none");
    cfg.labels = L;
    expect(sl_sample_config_check(&cfg, msg, sizeof(msg)), SL_EINVAL, msg,
           "labels count 6 does not match samples 7");
    cfg.samples = 6;
    CHECK(sl_sample_config_check(&cfg, msg, sizeof(msg)) == 0, "%s", msg);
    cfg.shuffle = SL_SAMPLE_SHUFFLE_TORCH;
    expect(sl_sample_config_check(&cfg, msg, sizeof(msg)), SL_EINVAL, msg, "not torch");
    cfg.shuffle = SL_SAMPLE_SHUFFLE_FEISTEL;
    cfg.replicas = 4;
    cfg.rank_weights = w;
    cfg.n_rank_weights = 3;
    expect(sl_sample_config_check(&cfg, msg, sizeof(msg)), SL_EINVAL, msg,
           "3 rank weights for a dp world of 4 ranks");
    cfg.n_rank_weights = 4;
    expect(sl_sample_config_check(&cfg, msg, sizeof(msg)), SL_EINVAL, msg, "rank weight 1 is 0");
    w[1] = -2;
    expect(sl_sample_config_check(&cfg, msg, sizeof(msg)), SL_EINVAL, msg, "rank weight 1 is -2");
    cfg.replicas = 2;
    cfg.rank_weights = nanw;
    cfg.n_rank_weights = 2;
    expect(sl_sample_config_check(&cfg, msg, sizeof(msg)), SL_EINVAL, msg, "rank weight 1 is nan");
    cfg.n_rank_weights = 0;
    cfg.classes = SL_SAMPLE_CLASSES_BALANCE;
    cfg.class_weights = cw;
    cfg.n_class_weights = 2;
    expect(sl_sample_config_check(&cfg, msg, sizeof(msg)), SL_EINVAL, msg,
           "2 class weights for 3 class ids");
    cfg.n_class_weights = 3;
    cw[2] = INFINITY;
    expect(sl_sample_config_check(&cfg, msg, sizeof(msg)), SL_EINVAL, msg, "class weight 2 is inf");
    cfg.classes = SL_SAMPLE_CLASSES_STRATIFY;
    expect(sl_sample_config_check(&cfg, msg, sizeof(msg)), SL_EINVAL, msg,
           "class weights and epoch length need class-balanced epochs");
    expect(sl_sample_weights_parse(out, &n, 8, "1,0.5,0", "rank", msg, sizeof(msg)), SL_EINVAL, msg,
           "rank weight 2 is 0");
    expect(sl_sample_weights_parse(out, &n, 8, "1,x", "rank", msg, sizeof(msg)), SL_EINVAL, msg,
           "rank weight 1 is not a number");
    CHECK(sl_sample_weights_parse(out, &n, 8, "1,0.5,2", "rank", msg, sizeof(msg)) == 0 && n == 3 &&
              out[1] == 0.5,
          "parse");
    sl_sample_labels_free(L);
}

/* The block fill (sl_strat_fill, what streams use) gives exactly the per-position walk
 * (sl_strat_at) for stratified and class-balanced layouts, weighted or not, shuffled or not, at
 * random positions and lengths across block edges and into the padding. */
static void test_fill_matches_at(int rounds)
{
    for (int it = 0; it < rounds; it++) {
        uint64_t n;
        uint32_t C, R = 1 + (uint32_t)rnd_below(rnd_below(2) ? 8 : 64);
        uint32_t *lab = random_labels(&n, &C);
        sl_sample_labels *L = NULL;
        sl_sample_config cfg;
        sl_strat st;
        uint64_t q[64], *cnt, *out;
        char msg[256];
        int weighted = rnd_below(3) == 0;

        CHECK(sl_sample_labels_new(&L, lab, n, msg, sizeof(msg)) == 0, "%s", msg);
        sl_sample_config_init(&cfg);
        cfg.samples = n;
        cfg.replicas = R;
        cfg.seed = rnd();
        cfg.epoch = rnd_below(1000);
        cfg.drop_last = rnd_below(2);
        cfg.shuffle = rnd_below(4) ? SL_SAMPLE_SHUFFLE_FEISTEL : SL_SAMPLE_SHUFFLE_NONE;
        cfg.classes = rnd_below(2) ? SL_SAMPLE_CLASSES_STRATIFY : SL_SAMPLE_CLASSES_BALANCE;
        cfg.labels = L;
        for (uint32_t r = 0; r < R; r++)
            q[r] = (1 + rnd_below(4)) << 30;
        if (n < 16 * (uint64_t)R)
            weighted = 0;
        memset(&st, 0, sizeof(st));
        if (sl_strat_init(&st, &cfg, R, weighted ? q : NULL, msg, sizeof(msg)) != 0) {
            CHECK(0, "init: %s", msg);
            sl_sample_labels_free(L);
            free(lab);
            continue;
        }
        cnt = calloc(st.ctree.nnode + 1, sizeof(*cnt));
        for (uint32_t r = 0; r < R; r += 1 + R / 4) {
            uint64_t count = sl_strat_count(&st, r);
            sl_strat_counts(cnt, &st, r);
            for (int k = 0; k < 4 && count; k++) {
                uint64_t pos = rnd_below(count), m = 1 + rnd_below(count - pos);
                if (m > 9000)
                    m = 9000;
                out = malloc(m * sizeof(*out));
                sl_strat_fill(out, &st, r, rnd_below(2) ? cnt : NULL, pos, (size_t)m);
                for (uint64_t i = 0; i < m; i++)
                    if (out[i] != sl_strat_at(&st, r, cnt, pos + i)) {
                        CHECK(0, "fill != at: rank %u pos %" PRIu64 " (R %u, n %" PRIu64 ")", r,
                              pos + i, R, n);
                        break;
                    }
                free(out);
            }
        }
        free(cnt);
        sl_strat_close(&st);
        sl_sample_labels_free(L);
        free(lab);
    }
}

/* Rounds of each random test times SAMPLE_STRAT_SCALE (default 1; e.g. 0.25 under ASan). */
static int rounds(int n)
{
    const char *e = getenv("SAMPLE_STRAT_SCALE");
    double k = e ? atof(e) : 1.0;

    return k > 0 && n * k >= 1 ? (int)(n * k) : 1;
}

/* sl_sample_plan_order: the one-rank share of the class layout (with classes), the epoch order
 * otherwise; whatever the config's world, weights or drop_last; the limit refused. */
static void test_plan_order(int n_rounds)
{
    for (int it = 0; it < n_rounds; it++) {
        uint64_t n, m = 0, cnt, *order = NULL, *want;
        uint32_t C;
        uint32_t *lab = random_labels(&n, &C);
        sl_sample_labels *L = NULL;
        sl_sample_config cfg, one;
        sl_sample *s = NULL;
        double w[2] = {1, 2};
        char msg[256];

        CHECK(sl_sample_labels_new(&L, lab, n, msg, sizeof(msg)) == 0, "%s", msg);
        sl_sample_config_init(&cfg);
        cfg.samples = n;
        cfg.seed = rnd();
        cfg.epoch = rnd_below(1000);
        cfg.classes = (sl_sample_classes)rnd_below(3);
        cfg.labels = cfg.classes ? L : NULL;
        cfg.epoch_length = cfg.classes == SL_SAMPLE_CLASSES_BALANCE ? rnd_below(3 * n) : 0;
        one = cfg;
        cfg.replicas = 2; /* ignored, as are weights and drop_last */
        cfg.rank = 1;
        cfg.rank_weights = w;
        cfg.n_rank_weights = 2;
        cfg.drop_last = true;
        CHECK(sl_sample_plan_order(&order, &m, &cfg, UINT32_MAX, msg, sizeof(msg)) == 0, "%s", msg);
        CHECK(sl_sample_new(&s, &one, msg, sizeof(msg)) == 0, "%s", msg);
        cnt = s ? sl_sample_count(s) : 0;
        CHECK(m == cnt, "order of %" PRIu64 " entries, share of %" PRIu64, m, cnt);
        want = malloc((cnt ? cnt : 1) * sizeof(*want));
        if (s && order && m == cnt && sl_sample_fill(want, s, 0, (size_t)cnt) == 0)
            CHECK(memcmp(order, want, cnt * sizeof(*want)) == 0, "order != one-rank share");
        free(want);
        free(order);
        order = NULL;
        if (cnt > 1) {
            CHECK(sl_sample_plan_order(&order, &m, &cfg, cnt - 1, msg, sizeof(msg)) == SL_ELIMIT,
                  "limit %" PRIu64, cnt - 1);
            CHECK(order == NULL && m == 0, "nothing stored on failure");
        }
        sl_sample_free(s);
        sl_sample_labels_free(L);
        free(lab);
    }
}

int main(void)
{
    test_bad_input();
    test_window_impossible();
    test_mix();
    test_weighted_random(rounds(300));
    test_stratified_random(rounds(300));
    test_balanced_random(rounds(300));
    test_chain_random(rounds(600));
    test_fill_matches_at(rounds(300));
    test_plan_order(rounds(100));
    printf("largest window deviation seen: %.3f, largest S_c %.3f (bound %.1f), largest G_c "
           "%.3f (proven < 5); classes within +-1 in every window: %" PRIu64 " of %" PRIu64 "\n",
           max_window_dev, max_tree_bound, WINDOW_BOUND, max_global_bound, classes_within_one,
           classes_seen);
    if (failures) {
        fprintf(stderr, "sample_strat_test: %d failure(s)\n", failures);
        return 1;
    }
    printf("sample_strat_test: ok\n");
    return 0;
}
