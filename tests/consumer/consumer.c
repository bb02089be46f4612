/* A program outside the sluice tree: built by tests/consumer/test_consumer.py against nothing but
 * what `cmake --install` put in a prefix (headers, libsluice.so, sluice.pc), it uses the error
 * codes, the option structs' _INIT initialisers and their version check, and talks to a real
 * sluiced: a dataset, a job, the index streams of both ranks, a one-rank checkpoint and a
 * NOT_FOUND. Usage: consumer <host:port> <scratch file>. Exit status 0 when every check holds. */
#include <sluice.h>
#include <sluice_ckpt.h>
#include <sluice_feed.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SAMPLES 100

static int failures;

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "FAIL: %s (last error: %s)\n", what, sl_client_error());
        failures++;
    }
}

/* Stream one rank's whole share of epoch 0; marks seen[] and returns the share size, or -1. */
static long stream_share(sl_client *c, uint32_t rank, const sl_stream_opts *opts, int *seen)
{
    sl_index_stream *s = NULL;
    const uint64_t *idx;
    uint64_t start, got = 0;
    size_t n;
    int r;

    if (sl_indices_open(&s, c, "consumer-job", rank, opts) != 0)
        return -1;
    while ((r = sl_indices_next(s, &idx, &n, &start)) == 1) {
        check(start == got, "chunks arrive in order");
        for (size_t i = 0; i < n; i++) {
            check(idx[i] < SAMPLES && !seen[idx[i]], "an index is in range and not seen before");
            if (idx[i] < SAMPLES)
                seen[idx[i]] = 1;
        }
        got += n;
    }
    check(r == 0, "the stream ends cleanly");
    check(got == sl_indices_share_count(s), "the share is complete");
    check(sl_indices_epoch(s) == 0, "the first epoch is 0");
    sl_indices_close(s);
    return r == 0 ? (long)got : -1;
}

static void feed(sl_client *c)
{
    sl_stream_opts so = SL_STREAM_OPTS_INIT, zeroed, future = SL_STREAM_OPTS_INIT;
    sl_index_stream *s = NULL;
    sl_dataset ds;
    sl_job spec, job;
    int seen[SAMPLES] = {0}, all = 1;
    long a, b;

    check(sl_dataset_create(c, "consumer-ds", SAMPLES, &ds) == 0, "create a dataset");
    check(ds.samples == SAMPLES, "the dataset has its sample count");
    memset(&spec, 0, sizeof(spec));
    snprintf(spec.name, sizeof(spec.name), "consumer-job");
    snprintf(spec.dataset, sizeof(spec.dataset), "consumer-ds");
    spec.world_size = 2;
    spec.seed = 7;
    check(sl_job_create(c, &spec, &job) == 0, "create a job");
    check(job.world_size == 2 && job.epoch == 0, "the job is as created");
    sl_job_clear(&job);

    /* Rank 0 with an _INIT struct, rank 1 with a zeroed one: version 0 reads as version 1. */
    so.max_chunk = 16;
    memset(&zeroed, 0, sizeof(zeroed));
    a = stream_share(c, 0, &so, seen);
    b = stream_share(c, 1, &zeroed, seen);
    for (int i = 0; i < SAMPLES; i++)
        all &= seen[i];
    check(a == SAMPLES / 2 && b == SAMPLES / 2 && all, "two ranks cover the dataset once");
    printf("streamed %ld + %ld indices\n", a, b);

    future.version = SL_STREAM_OPTS_VERSION + 1;
    check(sl_indices_open(&s, c, "consumer-job", 0, &future) == SL_EINVAL && !s,
          "an unknown sl_stream_opts version is refused");
    check(strstr(sl_client_error(), "sl_stream_opts") != NULL, "the error names the struct");
}

static void ckpt(sl_client *c, const char *scratch)
{
    static const char data[] = "one rank's shard of the consumer test";
    sl_ckpt_upload_opts uo = SL_CKPT_UPLOAD_OPTS_INIT;
    sl_ckpt_shard receipt;
    sl_ckpt cp;
    int fd = open(scratch, O_RDWR | O_CREAT | O_TRUNC, 0600);

    check(fd >= 0 && write(fd, data, sizeof(data)) == (ssize_t)sizeof(data), "write a shard");
    check(sl_ckpt_begin(c, NULL, "consumer-job", NULL, 10, 1, NULL) == 0, "begin a checkpoint");
    uo.chunk_bytes = 8;
    check(sl_ckpt_upload_fd(c, &receipt, "consumer-job", "step_10", 0, fd, sizeof(data), &uo) == 0,
          "upload the shard");
    check(receipt.data_size == sizeof(data), "the receipt has the size");
    check(sl_ckpt_commit(c, &cp, "consumer-job", "step_10") == 0, "commit");
    check(sl_ckpt_latest(c, &cp, "consumer-job") == 0 && cp.state == SL_CKPT_STATE_COMPLETE,
          "the latest checkpoint is COMPLETE");
    printf("checkpoint %s: %s, sha256 %s\n", cp.name, sl_ckpt_state_name(cp.state), receipt.sha256);
    if (fd >= 0)
        close(fd);
}

int main(int argc, char **argv)
{
    sl_client_opts opts = SL_CLIENT_OPTS_INIT, future = SL_CLIENT_OPTS_INIT;
    sl_client_health_status health = SL_CLIENT_HEALTH_UNKNOWN;
    sl_client *c = NULL;
    sl_job job;
    int err;

    if (argc != 3) {
        fprintf(stderr, "usage: consumer <host:port> <scratch file>\n");
        return 2;
    }
    check(strcmp(sl_errname(SL_ENOTFOUND), "SL_ENOTFOUND") == 0, "sl_errname knows the codes");
    check(strcmp(sl_strerror(SL_ENOTFOUND), "not found") == 0, "sl_strerror knows the codes");

    future.version = SL_CLIENT_OPTS_VERSION + 1;
    check(sl_client_connect(&c, argv[1], &future) == SL_EINVAL && !c,
          "an unknown sl_client_opts version is refused");
    printf("future sl_client_opts: %s\n", sl_client_error());

    opts.timeout_ms = 20000;
    err = sl_client_connect(&c, argv[1], &opts);
    if (err) {
        fprintf(stderr, "FAIL: connect: %s\n", sl_strerror(err));
        return 1;
    }
    check(sl_client_health(c, "", &health) == 0 && health == SL_CLIENT_HEALTH_SERVING,
          "the daemon is SERVING");
    printf("health: %s\n", sl_client_health_name(health));

    feed(c);
    ckpt(c, argv[2]);

    err = sl_job_get(c, "no-such-job", &job);
    check(err == SL_ENOTFOUND, "a missing job is SL_ENOTFOUND");
    printf("missing job: %s (%s): %s\n", sl_errname(err), sl_strerror(err), sl_client_error());

    sl_client_close(c);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("consumer: all checks passed\n");
    return 0;
}
