/* server/catalog/ckpt.c: checkpoints (begin, reopen, conflicts, get, latest, list, states,
 * delete, abort), fencing (leases, claims, conditional changes), their shards (put, replace, get,
 * list in rank order, delete), tensor-list sizes, state counts, retention policies and recorded
 * removals, and that everything survives closing and reopening; server/catalog/catalog.c: a catalog
 * whose file is removed or replaced refuses writes and keeps answering reads. */
#include "catalog/catalog.h"
#include "catalog/ckpt.h"
#include "err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

typedef struct seen {
    int n;
    char names[8][2 * SL_CAT_NAME_MAX + 2]; /* job/name */
    int32_t ranks[8];
    char tensors[8][64];
    int stop_after; /* return 1 after this many (0: never) */
} seen;

static int on_ckpt(const sl_cat_ckpt *c, void *arg)
{
    seen *s = arg;

    if (s->n < 8)
        snprintf(s->names[s->n], sizeof(s->names[0]), "%s/%s", c->job, c->name);
    s->n++;
    return s->stop_after && s->n >= s->stop_after;
}

static int on_shard(const sl_cat_shard *sh, void *arg)
{
    seen *s = arg;

    if (s->n < 8) {
        s->ranks[s->n] = sh->rank;
        snprintf(s->tensors[s->n], sizeof(s->tensors[0]), "%s",
                 sh->tensors_json ? sh->tensors_json : "(null)");
    }
    s->n++;
    return 0;
}

static sl_cat_shard shard(int32_t rank, uint64_t size, const char *tensors)
{
    sl_cat_shard sh;

    memset(&sh, 0, sizeof(sh));
    sh.rank = rank;
    sh.data_size = size;
    sh.file_size = size + 88;
    memset(sh.sha256, 'a' + rank % 6, 64);
    sh.tensor_count = tensors ? 1 : 0;
    sh.tensors_json = tensors;
    return sh;
}

static void test_begin(sl_cat *cat)
{
    sl_cat_ckpt c, d;
    int created = -1;

    CHECK(sl_cat_ckpt_begin(cat, &c, &created, "job", "step_10", 10, 4, "{\"lr\":1}", 1000) == 0);
    CHECK(created == 1 && c.id > 0 && c.state == SL_CKPT_WRITING && c.world_size == 4);
    CHECK(c.step == 10 && c.created_ms == 1000 && c.committed_ms == 0 && c.shards == 0);
    CHECK(strcmp(c.job, "job") == 0 && strcmp(c.name, "step_10") == 0);
    CHECK(strcmp(c.user_metadata, "{\"lr\":1}") == 0);
    /* The same again: the existing one, not created. */
    CHECK(sl_cat_ckpt_begin(cat, &d, &created, "job", "step_10", 10, 4, "other", 2000) == 0);
    CHECK(created == 0 && d.id == c.id && d.created_ms == 1000);
    /* Another world size or step: a conflict, with the existing one described. */
    CHECK(sl_cat_ckpt_begin(cat, &d, &created, "job", "step_10", 10, 8, NULL, 2000) == SL_EEXIST);
    CHECK(created == 0 && d.world_size == 4);
    CHECK(sl_cat_ckpt_begin(cat, &d, &created, "job", "step_10", 11, 4, NULL, 2000) == SL_EEXIST);
    /* The same name in another job is another checkpoint. */
    CHECK(sl_cat_ckpt_begin(cat, &d, &created, "job2", "step_10", 10, 2, NULL, 3000) == 0);
    CHECK(created == 1 && d.id != c.id && strcmp(d.user_metadata, "") == 0);

    CHECK(sl_cat_ckpt_get(cat, &d, "job", "step_10") == 0 && d.id == c.id);
    CHECK(sl_cat_ckpt_get(cat, &d, "job", "missing") == SL_ENOTFOUND);
    CHECK(sl_cat_ckpt_get(cat, &d, "nojob", "step_10") == SL_ENOTFOUND);
    CHECK(strcmp(sl_cat_ckpt_state_name(SL_CKPT_WRITING), "WRITING") == 0);
    CHECK(strcmp(sl_cat_ckpt_state_name(SL_CKPT_COMPLETE), "COMPLETE") == 0);
    CHECK(strcmp(sl_cat_ckpt_state_name(SL_CKPT_INCOMPLETE), "INCOMPLETE") == 0);
    CHECK(strcmp(sl_cat_ckpt_state_name(0), "UNKNOWN") == 0);
}

static void test_shards(sl_cat *cat)
{
    sl_cat_refusal why;
    sl_cat_ckpt c;
    sl_cat_shard sh, got;
    seen s;
    uint64_t bytes = 0;

    CHECK(sl_cat_ckpt_get(cat, &c, "job", "step_10") == 0);
    /* Put out of rank order; listed in rank order. */
    sh = shard(2, 200, "[{\"name\":\"b\"}]");
    CHECK(sl_cat_shard_put(cat, c.id, &sh, 5000, 0, &why) == 0);
    sh = shard(0, 100, "[{\"name\":\"a\"}]");
    CHECK(sl_cat_shard_put(cat, c.id, &sh, 5001, 0, &why) == 0);
    sh = shard(1, 50, NULL); /* no tensors: stored as [] */
    CHECK(sl_cat_shard_put(cat, c.id, &sh, 5002, 0, &why) == 0);
    memset(&s, 0, sizeof(s));
    CHECK(sl_cat_shard_list(cat, c.id, 1, on_shard, &s) == 0);
    CHECK(s.n == 3 && s.ranks[0] == 0 && s.ranks[1] == 1 && s.ranks[2] == 2);
    CHECK(strcmp(s.tensors[0], "[{\"name\":\"a\"}]") == 0 && strcmp(s.tensors[1], "[]") == 0);
    memset(&s, 0, sizeof(s));
    CHECK(sl_cat_shard_list(cat, c.id, 0, on_shard, &s) == 0);
    CHECK(s.n == 3 && strcmp(s.tensors[0], "(null)") == 0);

    CHECK(sl_cat_shard_get(cat, &got, c.id, 2) == 0);
    CHECK(got.rank == 2 && got.data_size == 200 && got.file_size == 288);
    CHECK(strncmp(got.sha256, "cccc", 4) == 0 && strlen(got.sha256) == 64);
    CHECK(got.tensor_count == 1 && got.tensors_json == NULL);
    CHECK(sl_cat_shard_get(cat, &got, c.id, 3) == SL_ENOTFOUND);

    /* A new upload of a rank replaces its row. */
    sh = shard(2, 300, "[]");
    CHECK(sl_cat_shard_put(cat, c.id, &sh, 6000, 0, &why) == 0);
    CHECK(sl_cat_shard_get(cat, &got, c.id, 2) == 0 && got.data_size == 300);

    /* Tensor-list bytes of the other ranks. */
    CHECK(sl_cat_ckpt_tensor_bytes(cat, &bytes, c.id, -1) == 0);
    CHECK(bytes == strlen("[{\"name\":\"a\"}]") + 2 + 2);
    CHECK(sl_cat_ckpt_tensor_bytes(cat, &bytes, c.id, 0) == 0 && bytes == 4);
    CHECK(sl_cat_ckpt_tensor_bytes(cat, &bytes, 999999, -1) == 0 && bytes == 0);

    /* The checkpoint counts its shards and their bytes. */
    CHECK(sl_cat_ckpt_get(cat, &c, "job", "step_10") == 0);
    CHECK(c.shards == 3 && c.total_bytes == 100 + 50 + 300);

    CHECK(sl_cat_shard_delete(cat, c.id, 1) == 0);
    CHECK(sl_cat_shard_get(cat, &got, c.id, 1) == SL_ENOTFOUND);
    CHECK(sl_cat_shard_get(cat, &got, c.id, 0) == 0);
    CHECK(sl_cat_shard_delete(cat, c.id, 1) == 0); /* already gone: fine */
}

static void test_states_and_latest(sl_cat *cat)
{
    sl_cat_ckpt c, a, b, got;
    uint64_t counts[4];
    int created;
    seen s;

    CHECK(sl_cat_ckpt_latest(cat, &got, "job") == SL_ENOTFOUND);
    CHECK(sl_cat_ckpt_begin(cat, &a, &created, "job", "step_20", 20, 1, NULL, 7000) == 0);
    CHECK(sl_cat_ckpt_begin(cat, &b, &created, "job", "step_5", 5, 1, NULL, 7001) == 0);
    CHECK(sl_cat_ckpt_set_state(cat, a.id, SL_CKPT_COMPLETE, 8000) == 0);
    CHECK(sl_cat_ckpt_set_state(cat, b.id, SL_CKPT_COMPLETE, 9000) == 0);
    CHECK(sl_cat_ckpt_set_state(cat, 999999, SL_CKPT_COMPLETE, 1) == SL_ENOTFOUND);
    /* Latest is the highest step, not the newest commit. */
    CHECK(sl_cat_ckpt_latest(cat, &got, "job") == 0 && got.id == a.id);
    CHECK(got.state == SL_CKPT_COMPLETE && got.committed_ms == 8000);
    CHECK(sl_cat_ckpt_latest(cat, &got, "job2") == SL_ENOTFOUND); /* WRITING only */

    /* Listed by job, then newest step first; filtered by job and state; stopped early. */
    memset(&s, 0, sizeof(s));
    CHECK(sl_cat_ckpt_list(cat, NULL, 0, on_ckpt, &s) == 0);
    CHECK(s.n == 4 && strcmp(s.names[0], "job/step_20") == 0);
    CHECK(strcmp(s.names[1], "job/step_10") == 0 && strcmp(s.names[2], "job/step_5") == 0);
    CHECK(strcmp(s.names[3], "job2/step_10") == 0);
    memset(&s, 0, sizeof(s));
    CHECK(sl_cat_ckpt_list(cat, "job", SL_CKPT_COMPLETE, on_ckpt, &s) == 0 && s.n == 2);
    memset(&s, 0, sizeof(s));
    CHECK(sl_cat_ckpt_list(cat, "", SL_CKPT_WRITING, on_ckpt, &s) == 0 && s.n == 2);
    memset(&s, 0, sizeof(s));
    s.stop_after = 1;
    CHECK(sl_cat_ckpt_list(cat, NULL, 0, on_ckpt, &s) == 1 && s.n == 1);

    CHECK(sl_cat_ckpt_count_states(cat, counts) == 0);
    CHECK(counts[SL_CKPT_WRITING] == 2 && counts[SL_CKPT_COMPLETE] == 2);
    CHECK(counts[SL_CKPT_INCOMPLETE] == 0);

    /* An aborted (INCOMPLETE) checkpoint is reopened by Begin with its new world and step. */
    CHECK(sl_cat_ckpt_get(cat, &c, "job2", "step_10") == 0);
    CHECK(sl_cat_ckpt_set_state(cat, c.id, SL_CKPT_INCOMPLETE, 0) == 0);
    CHECK(sl_cat_ckpt_begin(cat, &got, &created, "job2", "step_10", 12, 3, "again", 9500) == 0);
    CHECK(created == 1 && got.id == c.id && got.state == SL_CKPT_WRITING);
    CHECK(got.world_size == 3 && got.step == 12 && got.created_ms == 9500);
    CHECK(strcmp(got.user_metadata, "again") == 0);
}

static void test_delete_and_retention(sl_cat *cat)
{
    sl_cat_refusal why;
    sl_cat_ckpt c, got;
    sl_cat_shard sh;
    uint32_t keep = 99;
    int64_t removed_ms = 0;
    int created = 0;
    seen s;

    CHECK(sl_cat_retention_get(cat, "job", &keep) == 0 && keep == 0);
    CHECK(sl_cat_retention_set(cat, "job", 3) == 0);
    CHECK(sl_cat_retention_set(cat, "job", 2) == 0); /* replaces */
    CHECK(sl_cat_retention_get(cat, "job", &keep) == 0 && keep == 2);
    CHECK(sl_cat_retention_get(cat, "job2", &keep) == 0 && keep == 0);

    /* Deleting a checkpoint takes its shard rows with it and records the removal of its files;
     * a second delete of the same name records the later time. */
    CHECK(sl_cat_ckpt_get(cat, &c, "job", "step_10") == 0);
    CHECK(sl_cat_removal_get(cat, "job", "step_10", &removed_ms) == SL_ENOTFOUND);
    CHECK(sl_cat_ckpt_delete(cat, c.id, 5000) == 0);
    CHECK(sl_cat_ckpt_get(cat, &got, "job", "step_10") == SL_ENOTFOUND);
    CHECK(sl_cat_shard_get(cat, &sh, c.id, 0) == SL_ENOTFOUND);
    memset(&s, 0, sizeof(s));
    CHECK(sl_cat_shard_list(cat, c.id, 0, on_shard, &s) == 0 && s.n == 0);
    CHECK(sl_cat_removal_get(cat, "job", "step_10", &removed_ms) == 0 && removed_ms == 5000);
    CHECK(sl_cat_ckpt_delete(cat, c.id, 6000) == 0); /* gone already: fine, nothing recorded */
    CHECK(sl_cat_removal_get(cat, "job", "step_10", &removed_ms) == 0 && removed_ms == 5000);

    /* Abort: shards forgotten, INCOMPLETE, removal recorded, all at once. */
    CHECK(sl_cat_ckpt_begin(cat, &c, &created, "job", "ab", 1, 2, "", 100) == 0 && created);
    sh = shard(0, 10, NULL);
    CHECK(sl_cat_shard_put(cat, c.id, &sh, 6500, 0, &why) == 0);
    CHECK(sl_cat_ckpt_abort(cat, c.id, 7000, &why) == 0);
    CHECK(sl_cat_ckpt_get(cat, &got, "job", "ab") == 0 && got.state == SL_CKPT_INCOMPLETE);
    CHECK(got.shards == 0);
    CHECK(sl_cat_removal_get(cat, "job", "ab", &removed_ms) == 0 && removed_ms == 7000);
    CHECK(sl_cat_ckpt_abort(cat, c.id + 1000, 8000, &why) == SL_ENOTFOUND);
    CHECK(sl_cat_removals_clear(cat) == 0);
    CHECK(sl_cat_removal_get(cat, "job", "ab", &removed_ms) == SL_ENOTFOUND);
    CHECK(sl_cat_removal_get(cat, "job", "step_10", &removed_ms) == SL_ENOTFOUND);
}

/* Fencing (issue 25): every change that needs a checkpoint WRITING is conditional on it in its
 * own transaction; a commit claim holds back leases, shard records and aborts; COMPLETE needs
 * the claim still held; lease generations never repeat. */
static void test_fencing(sl_cat *cat)
{
    sl_cat_refusal why;
    sl_cat_ckpt c, got;
    sl_cat_shard sh;
    int64_t gen1 = 0, gen2 = 0, gen3 = 0, token = 0, token2 = 0;
    int created = 0;

    CHECK(sl_cat_ckpt_begin(cat, &c, &created, "fence", "ck", 1, 2, "", 100) == 0 && created);
    /* Generations come from a sequence: a new take fences the old one out, a release and a take
     * again never give an old number back. */
    CHECK(sl_cat_lease_take(cat, c.id, 0, "r1", 30000, &gen1, &why) == 0 && gen1 > 0);
    CHECK(sl_cat_lease_take(cat, c.id, 0, "r2", 30000, &gen2, &why) == 0 && gen2 > gen1);
    CHECK(strcmp(why.who, "r1") == 0); /* taken over from a live holder at once */
    CHECK(sl_cat_lease_renew(cat, c.id, 0, gen1, 30000) == SL_ESTATE);
    sh = shard(0, 10, NULL);
    CHECK(sl_cat_shard_put(cat, c.id, &sh, 1000, gen1, &why) == SL_EFENCED);
    CHECK(sl_cat_shard_get(cat, &sh, c.id, 0) == SL_ENOTFOUND);
    CHECK(sl_cat_lease_release(cat, c.id, 0, gen2) == 0);
    CHECK(sl_cat_lease_take(cat, c.id, 0, "r1", 30000, &gen3, &why) == 0 && gen3 > gen2);
    sh = shard(0, 10, NULL);
    CHECK(sl_cat_shard_put(cat, c.id, &sh, 1000, gen3, &why) == 0);

    /* A live lease holds back the claim; the claim holds back leases, records and aborts. */
    CHECK(sl_cat_lease_take(cat, c.id, 1, "r2", 30000, &gen1, &why) == 0);
    CHECK(sl_cat_ckpt_claim(cat, c.id, "r1", &token, &why) == SL_ESTATE);
    CHECK(why.rank == 1 && strcmp(why.who, "r2") == 0 && token == 0);
    sh = shard(1, 10, NULL);
    CHECK(sl_cat_shard_put(cat, c.id, &sh, 1000, gen1, &why) == 0);
    CHECK(sl_cat_ckpt_claim(cat, c.id, "r1", &token, &why) == 0 && token > 0);
    CHECK(sl_cat_ckpt_claim(cat, c.id, "r2", &token2, &why) == SL_EUNAVAILABLE);
    CHECK(strcmp(why.who, "r1") == 0);
    CHECK(sl_cat_lease_take(cat, c.id, 1, "r2", 30000, &gen2, &why) == SL_EUNAVAILABLE);
    CHECK(sl_cat_shard_put(cat, c.id, &sh, 1000, 0, &why) == SL_EUNAVAILABLE);
    CHECK(sl_cat_ckpt_abort(cat, c.id, 2000, &why) == SL_EUNAVAILABLE);
    CHECK(sl_cat_ckpt_get(cat, &got, "fence", "ck") == 0 && got.state == SL_CKPT_WRITING);
    /* COMPLETE only with the claim that holds. */
    CHECK(sl_cat_ckpt_complete(cat, c.id, 3000, "r2", token, NULL, NULL, NULL) == SL_ESTATE);
    CHECK(sl_cat_ckpt_complete(cat, c.id, 3000, "r1", token + 1, NULL, NULL, NULL) == SL_ESTATE);
    CHECK(sl_cat_ckpt_complete(cat, c.id, 3000, "r1", token, NULL, NULL, NULL) == 0);
    CHECK(sl_cat_ckpt_get(cat, &got, "fence", "ck") == 0 && got.state == SL_CKPT_COMPLETE);
    CHECK(got.shards == 2);
    /* A COMPLETE checkpoint is never aborted, never takes a lease or a shard. */
    CHECK(sl_cat_ckpt_abort(cat, c.id, 4000, &why) == SL_ESTATE && why.state == SL_CKPT_COMPLETE);
    CHECK(sl_cat_lease_take(cat, c.id, 0, "r2", 30000, &gen2, &why) == SL_ESTATE);
    CHECK(sl_cat_shard_put(cat, c.id, &sh, 1000, 0, &why) == SL_ESTATE);
    CHECK(sl_cat_ckpt_complete(cat, c.id, 5000, "r1", 0, NULL, NULL, NULL) == SL_ESTATE);
    CHECK(sl_cat_ckpt_get(cat, &got, "fence", "ck") == 0 && got.state == SL_CKPT_COMPLETE);
    CHECK(got.committed_ms == 3000 && got.shards == 2);
    CHECK(sl_cat_ckpt_delete(cat, c.id, 6000) == 0);
}

static void on_lost(const char *problem, void *arg)
{
    (*(int *)arg)++;
}

/* A catalog whose file is removed or replaced under it refuses every write from then on (the
 * writes would go to a file nobody opens again) and keeps answering reads from the open file. */
static void test_lost(const char *dir, int replace)
{
    char path[64], other[80];
    sl_cat *cat = NULL, *tmp = NULL;
    sl_cat_ckpt c, got;
    int created, lost = 0;

    snprintf(path, sizeof(path), "%s/lost%d.db", dir, replace);
    snprintf(other, sizeof(other), "%s/other%d.db", dir, replace);
    CHECK(sl_cat_open(&cat, path) == 0);
    if (!cat)
        return;
    sl_cat_on_lost(cat, on_lost, &lost);
    CHECK(sl_cat_check(cat) == 0 && sl_cat_problem(cat) == NULL);
    CHECK(sl_cat_ckpt_begin(cat, &c, &created, "j", "a", 1, 1, "", 1) == 0);
    if (replace) {
        CHECK(sl_cat_open(&tmp, other) == 0);
        sl_cat_close(tmp);
        CHECK(rename(other, path) == 0);
    } else {
        CHECK(unlink(path) == 0);
    }
    CHECK(sl_cat_ckpt_begin(cat, &c, &created, "j", "b", 1, 1, "", 2) == SL_ECATLOST);
    CHECK(lost == 1 && sl_cat_problem(cat) != NULL);
    CHECK(strstr(sl_cat_problem(cat), path) != NULL);
    CHECK(strstr(sl_cat_problem(cat), replace ? "was replaced" : "was removed") != NULL);
    CHECK(sl_cat_ckpt_delete(cat, c.id, 3) == SL_ECATLOST);
    CHECK(sl_cat_removals_clear(cat) == SL_ECATLOST);
    CHECK(sl_cat_check(cat) == SL_ECATLOST && lost == 1); /* told once */
    CHECK(sl_cat_ckpt_get(cat, &got, "j", "a") == 0 && got.id == c.id);
    CHECK(sl_cat_ckpt_get(cat, &got, "j", "b") == SL_ENOTFOUND);
    sl_cat_close(cat);
}

/* Block digests: recorded with the row, read a window at a time, only while the row is the one
 * with that checksum; a row without them reads as block size 0. */
static void test_blocks(sl_cat *cat)
{
    uint8_t digests[5 * SL_CAT_DIGEST], out[5 * SL_CAT_DIGEST];
    uint32_t n = 9, bs = 9;
    sl_cat_refusal why;
    sl_cat_ckpt c;
    sl_cat_shard sh;

    for (size_t i = 0; i < sizeof(digests); i++)
        digests[i] = (uint8_t)i;
    CHECK(sl_cat_ckpt_get(cat, &c, "job", "step_10") == 0);
    sh = shard(1, 5 * 4096 - 7, NULL);
    sh.block_size = 4096;
    sh.blocks = digests;
    sh.block_count = 5;
    CHECK(sl_cat_shard_put(cat, c.id, &sh, 7000, 0, &why) == 0);
    CHECK(sl_cat_shard_blocks(cat, c.id, 1, sh.sha256, 0, 5, out, &n, &bs) == 0);
    CHECK(n == 5 && bs == 4096 && memcmp(out, digests, sizeof(digests)) == 0);
    CHECK(sl_cat_shard_blocks(cat, c.id, 1, sh.sha256, 3, 5, out, &n, &bs) == 0);
    CHECK(n == 2 && memcmp(out, digests + 3 * SL_CAT_DIGEST, 2 * SL_CAT_DIGEST) == 0);
    CHECK(sl_cat_shard_blocks(cat, c.id, 1, sh.sha256, 1, 2, out, &n, &bs) == 0);
    CHECK(n == 2 && memcmp(out, digests + SL_CAT_DIGEST, 2 * SL_CAT_DIGEST) == 0);
    CHECK(sl_cat_shard_blocks(cat, c.id, 1, sh.sha256, 0, 0, out, &n, &bs) == 0);
    CHECK(n == 0 && bs == 4096);
    /* Another checksum: the row was replaced since. */
    CHECK(sl_cat_shard_blocks(cat, c.id, 1, "dddd", 0, 5, out, &n, &bs) == SL_ENOTFOUND);
    /* Recorded without them (an older shard's row). */
    sh.block_size = 0;
    sh.blocks = NULL;
    sh.block_count = 0;
    CHECK(sl_cat_shard_put(cat, c.id, &sh, 7001, 0, &why) == 0);
    CHECK(sl_cat_shard_blocks(cat, c.id, 1, sh.sha256, 0, 5, out, &n, &bs) == 0);
    CHECK(n == 0 && bs == 0);
    CHECK(sl_cat_shard_delete(cat, c.id, 1) == 0);
}

int main(void)
{
    char dir[] = "/tmp/ckpt-cat-XXXXXX", path[64];
    sl_cat *cat = NULL;
    sl_cat_ckpt c;
    uint32_t keep = 0;
    uint64_t counts[4];

    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(path, sizeof(path), "%s/catalog.db", dir);
    CHECK(sl_cat_open(&cat, path) == 0);
    if (cat) {
        test_begin(cat);
        test_shards(cat);
        test_blocks(cat);
        test_states_and_latest(cat);
        test_delete_and_retention(cat);
        test_fencing(cat);
        sl_cat_close(cat);
        cat = NULL;
    }

    /* Everything is still there after reopening. */
    CHECK(sl_cat_open(&cat, path) == 0);
    if (cat) {
        CHECK(sl_cat_ckpt_get(cat, &c, "job", "step_20") == 0 && c.state == SL_CKPT_COMPLETE);
        CHECK(sl_cat_ckpt_get(cat, &c, "job2", "step_10") == 0 && c.world_size == 3);
        CHECK(sl_cat_retention_get(cat, "job", &keep) == 0 && keep == 2);
        CHECK(sl_cat_ckpt_count_states(cat, counts) == 0 && counts[SL_CKPT_COMPLETE] == 2);
        CHECK(counts[SL_CKPT_WRITING] == 1);
        sl_cat_close(cat);
    }
    test_lost(dir, 0);
    test_lost(dir, 1);

    snprintf(path, sizeof(path), "rm -rf %s", dir);
    if (system(path) != 0)
        fprintf(stderr, "ckpt_catalog_test: cannot remove %s\n", dir);
    return check_done("ckpt_catalog_test");
}
