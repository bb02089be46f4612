/* Upload leases of a shared catalog (engine-neutral, db.h): taking one at once under a new
 * generation, renewing it, finding a live one held elsewhere. Declared in ckpt.h; the fence they
 * share with the checkpoint changes is ckpt.c's sl_cat_fence_ckpt (internal.h). */
#include "ckpt.h"

#include "internal.h"

#include "err.h"

#include <string.h>

static int take_tx(sl_cat *cat, int64_t ckpt_id, int32_t rank, const char *replica, int64_t ttl_ms,
                   int64_t *gen, sl_cat_refusal *why)
{
    sl_db_q q;
    int rc, err = sl_cat_fence_ckpt(cat, ckpt_id, &why->state, why->who, sizeof(why->who));

    if (err)
        return err;
    /* Whoever held it (still uploading, or gone) is fenced out by the new generation. */
    sl_db_q_init(&q, cat, "lease_take_prev");
    sl_db_int(&q, ckpt_id);
    sl_db_int(&q, rank);
    err = sl_db_run(&q,
                    "SELECT replica FROM upload_leases WHERE checkpoint_id = ?1 AND rank = ?2 AND "
                    "expires_ms >= sl_now_ms()",
                    0);
    if (!err && (rc = sl_db_next(&q)) != 1)
        err = rc;
    else if (!err)
        sl_db_copy_text(&q, 0, why->who, sizeof(why->who));
    sl_db_end(&q);
    if (err)
        return err;
    sl_db_q_init(&q, cat, "lease_take");
    sl_db_int(&q, ckpt_id);
    sl_db_int(&q, rank);
    sl_db_text(&q, replica);
    sl_db_int(&q, ttl_ms);
    err = sl_db_run(&q,
                    "INSERT INTO upload_leases(checkpoint_id, rank, replica, generation, "
                    "expires_ms) VALUES (?1, ?2, ?3, sl_lease_generation(), sl_now_ms() + ?4) "
                    "ON CONFLICT (checkpoint_id, rank) DO UPDATE SET replica = excluded.replica, "
                    "generation = excluded.generation, expires_ms = excluded.expires_ms "
                    "RETURNING generation",
                    0);
    if (!err) {
        rc = sl_db_next(&q);
        if (rc == 1)
            *gen = sl_db_int_col(&q, 0);
        err = rc == 1 ? 0 : rc == 0 ? SL_ENOTFOUND : rc;
    }
    sl_db_end(&q);
    return err;
}

int sl_cat_lease_take(sl_cat *cat, int64_t ckpt_id, int32_t rank, const char *replica,
                      int64_t ttl_ms, int64_t *gen, sl_cat_refusal *why)
{
    int err = sl_db_tx_begin(cat);

    memset(why, 0, sizeof(*why));
    why->rank = -1;
    *gen = 0;
    if (err)
        return err;
    err = take_tx(cat, ckpt_id, rank, replica, ttl_ms, gen, why);
    return sl_db_tx_end(cat, err);
}

int sl_cat_lease_renew(sl_cat *cat, int64_t ckpt_id, int32_t rank, int64_t gen, int64_t ttl_ms)
{
    int64_t changes = 0;
    sl_db_q q;
    int err;

    sl_db_q_init(&q, cat, "lease_renew");
    sl_db_int(&q, ckpt_id);
    sl_db_int(&q, rank);
    sl_db_int(&q, gen);
    sl_db_int(&q, ttl_ms);
    err = sl_db_exec(
        &q,
        "UPDATE upload_leases SET expires_ms = sl_now_ms() + ?4 WHERE checkpoint_id = ?1 AND "
        "rank = ?2 AND generation = ?3",
        0, &changes);
    return err ? err : changes ? 0 : SL_ESTATE;
}

int sl_cat_lease_elsewhere(sl_cat *cat, int64_t ckpt_id, int32_t rank, const char *replica,
                           char *holder, size_t len)
{
    sl_db_q q;
    int rc, err;

    sl_db_q_init(&q, cat, "lease_elsewhere");
    sl_db_int(&q, ckpt_id);
    sl_db_int(&q, rank);
    sl_db_text(&q, replica);
    err = sl_db_run(&q,
                    "SELECT replica FROM upload_leases WHERE checkpoint_id = ?1 AND rank = ?2 "
                    "AND replica != ?3 AND expires_ms >= sl_now_ms()",
                    0);
    if (!err) {
        rc = sl_db_next(&q);
        if (rc == 1)
            sl_db_copy_text(&q, 0, holder, len);
        err = rc;
    }
    sl_db_end(&q);
    return err;
}
