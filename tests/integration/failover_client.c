/* libsluice through a list of replicas, driven by tests/python/test_failover.py.
 *
 * Usage:
 *   failover_client job ADDRS JOB          sl_job_get through ADDRS; prints "world <n>"
 *   failover_client indices ADDRS JOB RANK sl_indices_* of epoch 0 from position 0; prints
 *                                          one index per line, then pauses after the first
 *                                          chunk until a line arrives on stdin (the test
 *                                          kills a replica meanwhile)
 *   failover_client upload ADDRS JOB NAME FILE   sl_ckpt_upload_fd of FILE as rank 0
 *   failover_client upload-pause ...       the same, pausing once 4 MiB are sent: prints
 *                                          "paused" and waits for a line on stdin
 *   failover_client download ADDRS JOB NAME FILE sl_ckpt_download_fd of rank 0 into FILE
 * Exit status 0 on success; otherwise the error (sl_errname and sl_client_error) on stderr and
 * exit status 1; 2 for bad usage. */
#include "sluice.h"
#include "sluice_ckpt.h"
#include "sluice_feed.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(const char *what, int err)
{
    fprintf(stderr, "%s: %s: %s\n", what, sl_errname(err), sl_client_error());
    return 1;
}

static int job(sl_client *c, const char *name)
{
    sl_job j;
    int err = sl_job_get(c, name, &j);

    if (err)
        return fail("sl_job_get", err);
    printf("world %u\n", j.world_size);
    sl_job_clear(&j);
    return 0;
}

static int indices(sl_client *c, const char *name, uint32_t rank)
{
    sl_stream_opts so = SL_STREAM_OPTS_INIT;
    sl_index_stream *s = NULL;
    const uint64_t *idx;
    uint64_t start;
    size_t n;
    char line[16];
    int r, paused = 0;

    so.epoch_set = so.position_set = 1;
    so.max_chunk = 64;
    r = sl_indices_open(&s, c, name, rank, &so);
    if (r)
        return fail("sl_indices_open", r);
    while ((r = sl_indices_next(s, &idx, &n, &start)) == 1) {
        for (size_t i = 0; i < n; i++)
            printf("%" PRIu64 "\n", idx[i]);
        if (!paused) {
            paused = 1;
            printf("paused\n");
            fflush(stdout);
            if (!fgets(line, sizeof(line), stdin))
                break;
        }
    }
    sl_indices_close(s);
    fflush(stdout);
    return r < 0 ? fail("sl_indices_next", r) : 0;
}

/* Progress of an upload-pause: the first time 4 MiB are sent, wait for the test. */
static void pause_once(uint64_t done, uint64_t total, void *arg)
{
    int *paused = arg;
    char line[16];

    (void)total;
    if (*paused || done < (4u << 20))
        return;
    *paused = 1;
    printf("paused\n");
    fflush(stdout);
    if (!fgets(line, sizeof(line), stdin))
        line[0] = '\0';
}

static int upload(sl_client *c, const char *name, const char *ck, const char *path, int pause)
{
    sl_ckpt_upload_opts uo = SL_CKPT_UPLOAD_OPTS_INIT;
    sl_ckpt_shard receipt;
    int paused = 0;
    struct stat sb;
    int fd = open(path, O_RDONLY), err;

    if (fd < 0 || fstat(fd, &sb) != 0) {
        perror(path);
        return 1;
    }
    if (pause) {
        uo.progress = pause_once;
        uo.arg = &paused;
    }
    err = sl_ckpt_upload_fd(c, &receipt, name, ck, 0, fd, (uint64_t)sb.st_size, &uo);
    close(fd);
    if (err)
        return fail("sl_ckpt_upload_fd", err);
    printf("sha256 %s\n", receipt.sha256);
    return 0;
}

static int download(sl_client *c, const char *name, const char *ck, const char *path)
{
    char sha[65];
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600), err;

    if (fd < 0) {
        perror(path);
        return 1;
    }
    err = sl_ckpt_download_fd(c, sha, name, ck, 0, fd, NULL, NULL);
    close(fd);
    if (err)
        return fail("sl_ckpt_download_fd", err);
    printf("sha256 %s\n", sha);
    return 0;
}

int main(int argc, char **argv)
{
    sl_client_opts opts = SL_CLIENT_OPTS_INIT;
    sl_client *c = NULL;
    int err, rc = 2;

    if (argc < 4)
        goto usage;
    opts.timeout_ms = 5000;
    err = sl_client_connect(&c, argv[2], &opts);
    if (err)
        return fail("sl_client_connect", err);
    if (strcmp(argv[1], "job") == 0 && argc == 4)
        rc = job(c, argv[3]);
    else if (strcmp(argv[1], "indices") == 0 && argc == 5)
        rc = indices(c, argv[3], (uint32_t)strtoul(argv[4], NULL, 10));
    else if (strcmp(argv[1], "upload") == 0 && argc == 6)
        rc = upload(c, argv[3], argv[4], argv[5], 0);
    else if (strcmp(argv[1], "upload-pause") == 0 && argc == 6)
        rc = upload(c, argv[3], argv[4], argv[5], 1);
    else if (strcmp(argv[1], "download") == 0 && argc == 6)
        rc = download(c, argv[3], argv[4], argv[5]);
    sl_client_close(c);
    if (rc != 2)
        return rc;
usage:
    fprintf(stderr, "usage: failover_client job|indices|upload|download ADDRS ...\n");
    return 2;
}
