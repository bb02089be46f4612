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

int ckpt_render_metadata(sl_ckpt_svc *s, const sl_cat_ckpt *c, int64_t committed_ms, sl_buf *b)
{
    meta_ctx m = {b, c->name, 0, 0};
    int err = meta_head(b, c, committed_ms);

    if (!err)
        err = sl_cat_shard_list(s->cat, c->id, 1, meta_shard, &m);
    if (m.err)
        err = m.err;
    if (!err)
        err = sl_buf_addstr(b, "\n  ]\n}\n");
    return err;
}
