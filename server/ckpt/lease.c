/* Upload leases: with a catalog shared by replicas, one upload attempt per (checkpoint, rank)
 * counts at a time across all of them. The replica that receives a header takes the lease (a
 * row in the catalog) with a new generation from the catalog's sequence, at once, whoever held
 * it: a client that moved on from a dead or unreachable replica resumes without waiting for the
 * old lease to expire, and the old attempt is fenced out. It renews the lease while the upload
 * moves; the shard is recorded only in a transaction that finds the generation unchanged and
 * the checkpoint WRITING (sl_cat_shard_put), so an attempt that was taken over never records.
 * Each attempt writes a partial file of its own, named by its generation, and a new attempt
 * removes the older ones' before it writes (server/store/sstore_dir.c): a fenced-out attempt's
 * late writes, truncations or renames touch only its own file, or nothing.
 *
 * A replica that cannot renew (the catalog unreachable, or it is partitioned away) stops writing
 * for the upload at its fence, half the TTL after the last renewal (its own monotonic clock).
 * Expiry is judged by the catalog's clock only: it decides whether a lease still holds back a
 * commit (sl_cat_ckpt_claim) or a sweep. */
#include "internal.h"

#include "err.h"
#include "log.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static int shared(const sl_ckpt_svc *s)
{
    return sl_cat_shared(s->cat) && s->opts.replica;
}

/* The lease's time to live (--upload-lease); renewed every sixth of it. */
static int64_t ttl(const sl_ckpt_svc *s)
{
    return s->opts.lease_ms ? (int64_t)s->opts.lease_ms : 30000;
}

void ckpt_lease_restarted(sl_ckpt_svc *s)
{
    int64_t n = 0;
    int err;

    if (!shared(s))
        return;
    err = sl_cat_replica_restarted(s->cat, s->opts.replica, &n);
    if (err)
        sl_log_warn("replica_release_failed", "error=\"%s\"", sl_strerror(err));
    else if (n)
        sl_log_info("replica_released", "replica=%s leases_and_claims=%lld", s->opts.replica,
                    (long long)n);
}

int ckpt_lease_take(upload *up, int64_t ckpt_id, int32_t rank)
{
    sl_ckpt_svc *s = up->svc;
    sl_cat_refusal why;
    int64_t gen = 0;
    int err;

    if (!shared(s))
        return 1;
    err = sl_cat_lease_take(s->cat, ckpt_id, rank, s->opts.replica, ttl(s), &gen, &why);
    if (err) {
        ckpt_refusal_fail(up->call, err, &why, up->job, up->name);
        return 0;
    }
    if (why.who[0] && strcmp(why.who, s->opts.replica) != 0)
        sl_log_info("upload_lease_taken_over", "job=%s name=%s rank=%d from=%s generation=%" PRId64,
                    up->job, up->name, rank, why.who, gen);
    up->lease = gen;
    up->lease_renewed_ms = uv_now(s->loop);
    up->lease_fence_ms = up->lease_renewed_ms + (uint64_t)ttl(s) / 2;
    return 1;
}

int ckpt_lease_keep(upload *up, char *msg, size_t len)
{
    sl_ckpt_svc *s = up->svc;
    uint64_t now = uv_now(s->loop);
    int err;

    if (!up->lease)
        return 0;
    if (now - up->lease_renewed_ms >= (uint64_t)ttl(s) / 6) {
        err = sl_cat_lease_renew(s->cat, up->ckpt_id, up->rank, up->lease, ttl(s));
        if (err == SL_ESTATE) {
            snprintf(msg, len, "rank %d's upload was taken over by another replica", up->rank);
            up->lease = 0; /* not ours to drop */
            return SL_EUNAVAILABLE;
        }
        if (!err) {
            up->lease_renewed_ms = now;
            up->lease_fence_ms = now + (uint64_t)ttl(s) / 2;
        }
    }
    if (now >= up->lease_fence_ms) {
        snprintf(msg, len,
                 "rank %d's upload lease could not be renewed (catalog unreachable): resume the "
                 "upload later",
                 up->rank);
        return SL_EUNAVAILABLE;
    }
    return 0;
}

void ckpt_lease_drop(upload *up)
{
    int err;

    if (!up->lease)
        return;
    err = sl_cat_lease_release(up->svc->cat, up->ckpt_id, up->rank, up->lease);
    if (err)
        sl_log_warn("upload_lease_release_failed", "job=%s name=%s rank=%d error=\"%s\"", up->job,
                    up->name, up->rank, sl_strerror(err));
    up->lease = 0;
}

int ckpt_lease_elsewhere(sl_ckpt_svc *s, int64_t ckpt_id, int32_t rank)
{
    char holder[300];

    return shared(s) && sl_cat_lease_elsewhere(s->cat, ckpt_id, rank, s->opts.replica, holder,
                                               sizeof(holder)) == 1;
}
