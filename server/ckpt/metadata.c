/* metadata.json: rendered from the catalog, so Verify can compare the file byte for byte with
 * what Commit wrote. */
#include "internal.h"

#include "util/json.h"

#include <inttypes.h>
#include <string.h>

typedef struct meta_ctx {
    sl_buf *b;
    const char *name;
    int n;
    int err; /* the buffer's first error */
} meta_ctx;

static int meta_shard(const sl_cat_shard *sh, void *arg)
{
    meta_ctx *m = arg;
    char file[NAME_MAX + 1];
    int err;

    sl_shard_file_name(file, sizeof(file), m->name, sh->rank);
    err = sl_buf_printf(m->b, "%s\n    {\"rank\":%d,\"file\":", m->n++ ? "," : "", sh->rank);
    if (!err)
        err = sl_json_str(m->b, file, strlen(file));
    if (!err)
        err = sl_buf_printf(m->b,
                            ",\"file_size\":%" PRIu64 ",\"data_size\":%" PRIu64
                            ",\"sha256\":\"%s\",\"tensors\":",
                            sh->file_size, sh->data_size, sh->sha256);
    if (!err)
        err = sl_buf_addstr(m->b, sh->tensors_json ? sh->tensors_json : "[]");
    if (!err)
        err = sl_buf_addstr(m->b, "}");
    m->err = err;
    return err;
}

/* Everything before the shards. */
static int meta_head(sl_buf *b, const sl_cat_ckpt *c, int64_t committed_ms)
{
    int err = sl_buf_addstr(b, "{\n  \"format\": \"sluice.checkpoint\",\n  \"version\": 1,\n"
                               "  \"job\": ");

    if (!err)
        err = sl_json_str(b, c->job, strlen(c->job));
    if (!err)
        err = sl_buf_addstr(b, ",\n  \"name\": ");
    if (!err)
        err = sl_json_str(b, c->name, strlen(c->name));
    if (!err)
        err = sl_buf_printf(b,
                            ",\n  \"step\": %" PRIu64 ",\n  \"world_size\": %d,\n"
                            "  \"created_at_ms\": %" PRId64 ",\n  \"committed_at_ms\": %" PRId64
                            ",\n  \"user_metadata\": ",
                            c->step, c->world_size, c->created_ms, committed_ms);
    if (!err)
        err = sl_json_str(b, c->user_metadata, strlen(c->user_metadata));
    if (!err)
        err = sl_buf_addstr(b, ",\n  \"shards\": [");
    return err;
}

/* The feed state a checkpoint carries, as "feed_state": {...} (after the shards). */
static int meta_feed(sl_buf *b, const sl_cat_ckpt *c, const Sluice__V1__FeedState *fs)
{
    int err = sl_buf_addstr(b, ",\n  \"feed_job\": ");

    if (!err)
        err = sl_json_str(b, c->feed_job, strlen(c->feed_job));
    if (err || !fs)
        return err;
    err = sl_buf_printf(b,
                        ",\n  \"feed_state\": {\"epoch\":%" PRIu64 ",\"world_size\":%u,"
                        "\"unit\":\"%s\",\"samples\":%" PRIu64 ",\"lengths_sha256\":\"%s\","
                        "\"labels_sha256\":\"%s\",\"elastic\":%s",
                        fs->epoch, fs->world_size, fs->unit ? fs->unit : "", fs->samples,
                        fs->lengths_sha256 ? fs->lengths_sha256 : "",
                        fs->labels_sha256 ? fs->labels_sha256 : "", fs->elastic ? "true" : "false");
    if (!err && fs->mesh)
        err = sl_buf_printf(b, ",\"mesh\":{\"dp\":%u,\"tp\":%u,\"cp\":%u,\"pp\":%u}", fs->mesh->dp,
                            fs->mesh->tp, fs->mesh->cp, fs->mesh->pp);
    if (!err)
        err = sl_buf_addstr(b, ",\"positions\":[");
    for (size_t i = 0; !err && i < fs->n_positions; i++)
        err = sl_buf_printf(b, "%s%" PRIu64, i ? "," : "", fs->positions[i]);
    if (!err)
        err = sl_buf_addstr(b, "]}");
    return err;
}

int ckpt_render_metadata(sl_ckpt_svc *s, const sl_cat_ckpt *c, int64_t committed_ms,
                         const Sluice__V1__FeedState *fs, sl_buf *b)
{
    meta_ctx m = {b, c->name, 0, 0};
    Sluice__V1__FeedState *stored = NULL;
    int err = meta_head(b, c, committed_ms);

    if (!err)
        err = sl_cat_shard_list(s->cat, c->id, 1, meta_shard, &m);
    if (m.err)
        err = m.err;
    if (!err)
        err = sl_buf_addstr(b, "\n  ]");
    if (!err && !fs && c->has_feed_state)
        err = ckpt_feed_state_load(s, c, &stored);
    if (!err && c->feed_job[0])
        err = meta_feed(b, c, fs ? fs : stored);
    if (!err)
        err = sl_buf_addstr(b, "\n}\n");
    if (stored)
        sluice__v1__feed_state__free_unpacked(stored, NULL);
    return err;
}
