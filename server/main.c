/* sluiced: parse the configuration, open the data dir and catalog, serve gRPC on a libuv loop
 * until SIGTERM/SIGINT, then shut down gracefully and exit 0. */
#include "daemon.h"

#include "err.h"
#include "log.h"
#include "store/s3.h"
#include "store/sstore.h"
#include "store/store.h"
#include "util/clock.h"

#include <ctype.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* A fatal signal (an abort in a library, a crash) leaves a line and the stack on stderr, which
 * the journal keeps, before the default action ends the process: a libuv abort() is otherwise
 * silent. Only async-signal-safe calls (backtrace() is loaded at start, so it allocates
 * nothing here). */
static void on_fatal(int signum)
{
    static const char head[] = "level=error event=fatal_signal signal=";
    void *frames[64];
    const char *name = signum == SIGABRT   ? "SIGABRT\n"
                       : signum == SIGSEGV ? "SIGSEGV\n"
                       : signum == SIGBUS  ? "SIGBUS\n"
                       : signum == SIGILL  ? "SIGILL\n"
                                           : "SIGFPE\n";
    int n = backtrace(frames, 64);

    if (write(STDERR_FILENO, head, sizeof(head) - 1) < 0 ||
        write(STDERR_FILENO, name, strlen(name)) < 0)
        n = 0;
    backtrace_symbols_fd(frames, n, STDERR_FILENO);
    signal(signum, SIG_DFL);
    raise(signum);
}

/* Only where nothing else (a sanitizer) handles the signal already. */
static void catch_fatal(void)
{
    static const int sigs[] = {SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE};
    void *frame;

    (void)backtrace(&frame, 1);
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
        struct sigaction old, sa = {.sa_handler = on_fatal, .sa_flags = SA_RESETHAND};
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_DFL &&
            !(old.sa_flags & SA_SIGINFO))
            sigaction(sigs[i], &sa, NULL);
    }
}

/* mkdir -p with mode 0750 for the directories it creates. The operator's path may go through
 * symbolic links (/var/lib/sluice -> /var/lib/private/sluice under systemd's DynamicUser): it
 * is followed here, once, and made canonical by realpath; below it the store follows none. */
static int make_dirs(const char *path)
{
    char buf[PATH_MAX];
    size_t len = strlen(path);

    if (len == 0 || len >= sizeof(buf))
        return -ENAMETOOLONG;
    memcpy(buf, path, len + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0750) != 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(buf, 0750) != 0 && errno != EEXIST)
        return -errno;
    return 0;
}

/* A data dir other users can write is refused unless the operator allows it: any of them could
 * plant a link or a FIFO where a file is about to be made, or replace files. The group may write
 * (Kubernetes' fsGroup makes a volume g+rwxs; the operator chose that group). */
static int check_data_dir(const sl_daemon *d)
{
    struct stat st;

    if (stat(d->data_dir, &st) != 0) {
        int err = -errno;
        sl_log_error("data_dir_failed", "path=%s error=\"%s\"", d->data_dir, sl_strerror(err));
        return err;
    }
    if (!(st.st_mode & S_IWOTH))
        return 0;
    if (d->cfg.allow_shared_data_dir) {
        sl_log_warn("data_dir_shared", "path=%s mode=%04o allowed_by=--allow-shared-data-dir",
                    d->data_dir, (unsigned)(st.st_mode & 07777));
        return 0;
    }
    sl_log_error("data_dir_shared",
                 "path=%s mode=%04o error=\"the data dir is writable by other users\" "
                 "hint=\"chmod o-w %s, or start with --allow-shared-data-dir\"",
                 d->data_dir, (unsigned)(st.st_mode & 07777), d->data_dir);
    return SL_EPERM;
}

/* flock `fd` (the data dir or its LOCK file) shared or exclusive, without waiting: 0, or the
 * refusal logged. `what` names it for the log. */
static int lock_one(const sl_daemon *d, int fd, int shared, const char *what)
{
    int err;

    if (flock(fd, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB) == 0)
        return 0;
    err = -errno;
    if (err == -EWOULDBLOCK) {
        sl_log_error("data_dir_locked",
                     "path=%s lock=%s error=\"%s\" hint=\"another sluiced uses it\"", d->data_dir,
                     what, sl_strerror(err));
        return err;
    }
    /* Some filesystems lock no directory (NFS emulates flock with byte-range locks, which a
     * directory does not take): LOCK alone guards it there, as before. */
    sl_log_warn("data_dir_lock_unsupported",
                "path=%s lock=%s error=\"%s\" hint=\"this filesystem does not lock directories: "
                "only <data dir>/LOCK keeps a second sluiced out; do not remove it\"",
                d->data_dir, what, sl_strerror(err));
    return 0;
}

/* Create the data dir, resolve it, check who may write it, and take its lock so two daemons
 * never share one: exclusively with a SQLite catalog; shared with PostgreSQL, where replicas of
 * one catalog share the data dir (a SQLite daemon and replicas still exclude each other). The
 * lock is on the data dir's own descriptor, so removing a file cannot drop it, and on
 * <data dir>/LOCK as well, which is what older daemons take. */
static int open_data_dir(sl_daemon *d)
{
    char lock_path[PATH_MAX + 16];
    int shared = sl_cat_is_pg(d->cfg.catalog), err = make_dirs(d->cfg.data_dir);

    if (err) {
        sl_log_error("data_dir_failed", "path=%s error=\"%s\"", d->cfg.data_dir, sl_strerror(err));
        return err;
    }
    if (!realpath(d->cfg.data_dir, d->data_dir)) {
        err = -errno;
        sl_log_error("data_dir_failed", "path=%s error=\"%s\"", d->cfg.data_dir, sl_strerror(err));
        return err;
    }
    if ((err = check_data_dir(d)) != 0)
        return err;
    d->lock_fd = sl_store_open(d->data_dir, O_RDONLY | O_DIRECTORY, 0);
    snprintf(lock_path, sizeof(lock_path), "%s/LOCK", d->data_dir);
    if (d->lock_fd >= 0)
        d->lock_file_fd = sl_store_open(lock_path, O_RDWR | O_CREAT, 0640);
    if (d->lock_fd < 0 || d->lock_file_fd < 0) {
        err = d->lock_fd < 0 ? d->lock_fd : d->lock_file_fd;
        sl_log_error("data_dir_failed", "path=%s error=\"%s\"",
                     d->lock_fd < 0 ? d->data_dir : lock_path, sl_store_strerror(err));
        return err;
    }
    if ((err = lock_one(d, d->lock_fd, shared, "dir")) != 0)
        return err;
    return lock_one(d, d->lock_file_fd, shared, "LOCK");
}

/* Write the bound port to the port file atomically, so a script never reads half a number. The
 * operator's path may be in a shared directory: the temp file is made anew (O_EXCL, O_NOFOLLOW),
 * so a link planted at its name is never followed, and the rename replaces a link at the port
 * file's name instead of writing through it. */
static int write_port_file(const char *path, int port)
{
    char tmp[PATH_MAX + 8], text[16];
    int n = snprintf(text, sizeof(text), "%d\n", port), fd, err = 0;
    ssize_t w;

    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    if (unlink(tmp) != 0 && errno != ENOENT)
        return -errno;
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    if ((w = write(fd, text, (size_t)n)) != n)
        err = w < 0 ? -errno : -EIO;
    if (close(fd) != 0 && !err)
        err = -errno;
    if (!err && rename(tmp, path) != 0)
        err = -errno;
    if (err)
        unlink(tmp);
    return err;
}

/* A WAL without its catalog: catalog.db was removed while the daemon was down, or while it ran
 * and was killed before it noticed (once it notices, it empties its WAL). SQLite deletes a WAL it
 * finds next to the new empty catalog it makes; this one holds the lost catalog's last
 * transactions, so it goes to the quarantine instead, for an operator. Only the data dir's own
 * catalog: the quarantine takes files under the data dir. Looked at with no link followed: a
 * link at either name is left for the catalog's open to refuse (server/catalog/sqlite). */
static void quarantine_stale_wal(sl_daemon *d)
{
    char cat[PATH_MAX + 32], wal[PATH_MAX + 48];
    struct stat st;

    snprintf(cat, sizeof(cat), "%s/catalog.db", d->data_dir);
    snprintf(wal, sizeof(wal), "%s-wal", cat);
    if (sl_store_stat(cat, &st) == -ENOENT && sl_store_stat(wal, &st) == 0 && S_ISREG(st.st_mode) &&
        st.st_size > 0)
        sl_quar_move(d->quar, d->data_dir, "catalog.db-wal", "WAL of a catalog that is gone");
}

/* Replicas of one PostgreSQL catalog must share one data dir (shard files, lengths, labels): the
 * catalog holds a token, and <data dir>/CATALOG-ID holds it too. A replica whose data dir is not
 * the shared one (a mount missing, another catalog's dir) stops at start instead of serving files
 * no other replica can see.
 *
 * Replicas may start together (a StatefulSet with parallel pod management, systemd units started
 * at once): the catalog row decides who writes the file (the replica whose token the row took),
 * and the others wait for the file, at most SHARED_DIR_WAIT_MS. The writer then records in the
 * catalog that the file is written (data_dir_token_written): from then on a dir without the file
 * is refused at once, since it cannot be the one the writer wrote into. Should the writer die
 * between its claim and its write, a waiter writes the catalog's token itself once the wait is
 * over; the token is the catalog's, so two replicas writing it write the same bytes, and the
 * write never replaces a file (the first one stays). */
#define SHARED_DIR_WAIT_MS 10000
#define SHARED_DIR_POLL_MS 50

/* The token in <data dir>/CATALOG-ID into out: 0, -ENOENT when there is none, or -errno. */
static int read_catalog_id(const char *data_dir, char *out, size_t len)
{
    char path[PATH_MAX + 16];
    ssize_t n;
    int fd;

    snprintf(path, sizeof(path), "%s/CATALOG-ID", data_dir);
    fd = sl_store_open(path, O_RDONLY, 0);
    if (fd < 0)
        return fd;
    n = read(fd, out, len - 1);
    close(fd);
    out[n > 0 ? n : 0] = '\0';
    out[strcspn(out, "\n")] = '\0';
    return n < 0 ? -EIO : 0;
}

/* Write the catalog's token `want` to CATALOG-ID and record in the catalog that it is written.
 * Two replicas may write at once (the claimer and a waiter whose wait is over): each writes its
 * own temp file (named after its own token) and renames it into place without replacing, so the
 * file appears once, whole; both write the same token. */
static int write_catalog_id(sl_daemon *d, const char *want, const char *mine)
{
    char text[96], done[80], tmp[PATH_MAX + 128], path[PATH_MAX + 16];
    int fd, err;

    snprintf(text, sizeof(text), "%s\n", want);
    snprintf(tmp, sizeof(tmp), "%s/.CATALOG-ID.%s.tmp", d->data_dir, mine);
    snprintf(path, sizeof(path), "%s/CATALOG-ID", d->data_dir);
    if ((fd = sl_store_create(tmp, 0640)) < 0) {
        err = fd;
        goto out;
    }
    err = sl_store_pwrite_all(fd, text, strlen(text), 0);
    if (!err && fsync(fd) != 0)
        err = -errno;
    if (close(fd) != 0 && !err)
        err = -errno;
    if (!err)
        err = sl_store_rename_noreplace(tmp, path);
    if (err == -EEXIST)
        err = 0; /* another replica's is there: the caller compares it */
    else if (!err)
        err = sl_store_fsync_dir(d->data_dir);
    if (!err)
        err = sl_cat_meta_claim(d->cat, "data_dir_token_written", want, done, sizeof(done));
out:
    sl_store_unlink(tmp);
    return err;
}

/* Wait for CATALOG-ID while nobody recorded it written, writing it when this replica made the
 * catalog's token or the wait is over. Returns 0 with what the file holds in `found` ("" if it
 * is missing although recorded written), or an error. */
static int await_catalog_id(sl_daemon *d, const char *want, const char *token, char *found,
                            size_t len)
{
    uint64_t deadline = sl_mono_ns() + (uint64_t)SHARED_DIR_WAIT_MS * 1000000u;
    int mine = !strcmp(want, token), waited = 0, err;
    char done[80];

    for (;;) {
        err = read_catalog_id(d->data_dir, found, len);
        if (err != -ENOENT)
            return err;
        found[0] = '\0';
        if (mine || sl_mono_ns() >= deadline) {
            if (!mine)
                sl_log_warn("data_dir_id_taken_over",
                            "path=%s/CATALOG-ID waited_ms=%d hint=\"the replica that claimed "
                            "the catalog did not write CATALOG-ID: this one writes it\"",
                            d->data_dir, SHARED_DIR_WAIT_MS);
            if ((err = write_catalog_id(d, want, token)) != 0)
                return err;
            /* Read back what is there now: ours, or another replica's written first. */
            return read_catalog_id(d->data_dir, found, len);
        }
        err = sl_cat_meta_get(d->cat, "data_dir_token_written", done, sizeof(done));
        if (err == 0) {
            /* Written: read once more, for it may have appeared since the read above; if it
             * is still missing, it was written into another dir. */
            err = read_catalog_id(d->data_dir, found, len);
            if (err == -ENOENT)
                found[0] = '\0';
            return err == -ENOENT ? 0 : err;
        }
        if (err != SL_ENOTFOUND)
            return err;
        if (!waited++)
            sl_log_info("data_dir_id_wait",
                        "path=%s/CATALOG-ID reason=\"another replica is writing it (replicas "
                        "started together)\"",
                        d->data_dir);
        usleep(SHARED_DIR_POLL_MS * 1000);
    }
}

static int check_shared_dir(sl_daemon *d)
{
    char token[80], want[80], found[80] = "", done[80];
    unsigned char rnd[16];
    int err;

    if (!sl_cat_is_pg(d->cfg.catalog))
        return 0;
    if (getentropy(rnd, sizeof(rnd)) != 0)
        return -errno;
    for (size_t i = 0; i < sizeof(rnd); i++)
        snprintf(token + 2 * i, 3, "%02x", rnd[i]);
    if ((err = sl_cat_meta_claim(d->cat, "data_dir_token", token, want, sizeof(want))) != 0)
        return err;
    if ((err = await_catalog_id(d, want, token, found, sizeof(found))) != 0) {
        sl_log_error("data_dir_failed", "path=%s/CATALOG-ID error=\"%s\"", d->data_dir,
                     sl_store_strerror(err));
        return err;
    }
    if (strcmp(found, want) != 0) {
        sl_log_error("data_dir_not_shared",
                     "path=%s found=\"%s\" catalog_token=%s hint=\"replicas of one catalog "
                     "share one data dir (a shared filesystem mounted at the same path on each): "
                     "%s\"",
                     d->data_dir, found, want,
                     found[0] ? "this dir belongs to another catalog"
                              : "this one lacks the CATALOG-ID the first replica wrote");
        return SL_ESTATE;
    }
    /* A catalog of an older sluiced has the file but no record of it: record it now. */
    return sl_cat_meta_claim(d->cat, "data_dir_token_written", want, done, sizeof(done));
}

/* The replica's name: --replica-id, else <hostname>:<port>. With a PostgreSQL catalog every
 * log line carries it. */
static void set_replica(sl_daemon *d, int port)
{
    char host[256] = "localhost", tag[320];

    if (d->cfg.replica_id[0]) {
        snprintf(d->replica, sizeof(d->replica), "%s", d->cfg.replica_id);
    } else {
        gethostname(host, sizeof(host) - 1);
        host[sizeof(host) - 1] = '\0';
        snprintf(d->replica, sizeof(d->replica), "%s:%d", host, port);
    }
    /* A hostname's characters are a label's (the flag's were checked at start). */
    for (char *c = d->replica; *c; c++)
        if (!isalnum((unsigned char)*c) && !strchr("._:-", *c))
            *c = '_';
    if (sl_cat_is_pg(d->cfg.catalog)) {
        snprintf(tag, sizeof(tag), "replica=%s", d->replica);
        sl_log_set_tag(tag);
    }
}

/* The catalog: SQLite in the data dir (a stale WAL is moved away first; a file removed or
 * replaced while the daemon runs turns health NOT_SERVING, server/ops.c), another SQLite file, or
 * PostgreSQL. */
static int open_catalog(sl_daemon *d)
{
    const char *spec = d->cfg.catalog;
    char path[PATH_MAX + 16];
    int err;

    if ((err = sl_quar_new(&d->quar, d->data_dir)) != 0)
        return err;
    if (!spec[0] || !sl_cat_is_pg(spec)) {
        if (!spec[0]) {
            snprintf(path, sizeof(path), "%s/catalog.db", d->data_dir);
            quarantine_stale_wal(d);
        } else {
            snprintf(path, sizeof(path), "%s", strncmp(spec, "sqlite:", 7) ? spec : spec + 7);
        }
        spec = path;
    }
    sl_cat_set_timeout((int)d->cfg.catalog_timeout_ms);
    err = sl_cat_open_spec(&d->cat, spec,
                           d->cfg.catalog_password_file[0] ? d->cfg.catalog_password_file : NULL);
    if (err)
        return err;
    sl_cat_describe(d->cat, d->catalog_desc, sizeof(d->catalog_desc));
    if ((err = check_shared_dir(d)) != 0)
        return err;
    sl_ops_watch_catalog(&d->ops);
    return 0;
}

/* Object storage from the s3-* settings; every error names what is wrong (never a secret). */
static int open_s3_store(sl_daemon *d)
{
    const sl_config *c = &d->cfg;
    sl_s3_cfg s3;
    char msg[512] = "";
    int err;

    err = sl_ops_s3_cfg(c, &s3, msg, sizeof(msg));
    if (!err && (err = sl_s3_global_init()) != 0)
        snprintf(msg, sizeof(msg), "libcurl did not initialize");
    if (!err)
        err = sl_sstore_s3_new(&d->store, &s3, c->s3_part_size, c->s3_parts_in_flight, msg,
                               sizeof(msg));
    explicit_bzero(&s3, sizeof(s3));
    if (err)
        sl_log_error("store_failed", "store=%s error=\"%s\"", c->store,
                     msg[0] ? msg : sl_strerror(err));
    else
        sl_log_info("store_ready", "store=%s endpoint=%s", c->store,
                    c->s3_endpoint[0] ? c->s3_endpoint : "aws");
    snprintf(d->store_desc, sizeof(d->store_desc), "%.1000s at %.512s", c->store,
             c->s3_endpoint[0] ? c->s3_endpoint : "AWS");
    return err;
}

/* The shard store: <data dir>/checkpoints, or object storage (--store s3://...). */
static int open_store(sl_daemon *d)
{
    char root[PATH_MAX];
    int n;

    if (strncmp(d->cfg.store, "s3://", 5) == 0)
        return open_s3_store(d);
    if (d->cfg.store[0]) {
        sl_log_error("store_failed",
                     "store=%s error=\"not a store URL: s3://BUCKET[/PREFIX], or leave it empty "
                     "for <data dir>/checkpoints\"",
                     d->cfg.store);
        return SL_EINVAL;
    }
    n = snprintf(root, sizeof(root), "%s/checkpoints", d->data_dir);
    if (n < 0 || (size_t)n >= sizeof(root))
        return -ENAMETOOLONG;
    snprintf(d->store_desc, sizeof(d->store_desc), "%.2000s", root);
    return sl_sstore_dir_new(&d->store, root, d->quar);
}

/* The Checkpoints service with the configured limits; its sweeps watch the data dir's inode. */
static int open_ckpt(sl_daemon *d)
{
    int err = open_store(d);

    if (err)
        return err;
    sl_ckpt_opts o = {
        .max_shard_bytes = d->cfg.max_shard_bytes,
        .upload_timeout_ms = d->cfg.upload_timeout_ms,
        .upload_memory = d->cfg.upload_memory,
        .lock_fd = d->lock_fd,
        .max_deep_verifies = d->cfg.max_deep_verifies,
        .metrics = d->ops.metrics,
        .feed = d->feed,
        .quarantine = d->quar,
        .store = d->store,
        .replica = d->replica,
        .lease_ms = d->cfg.upload_lease_ms,
        .store_jobs = d->cfg.s3_store_jobs,
    };

    return sl_ckpt_svc_new(&d->ckpt, &d->loop, d->cat, d->data_dir, &o);
}

/* sl_rpc_server_opts.lane: handlers run in the catalog lane (PostgreSQL; SQLite: at once). */
static void run_in_lane(void *cat, void (*fn)(void *a, int b), void *a, int b)
{
    sl_cat_lane_run(cat, fn, a, b);
}

static void on_handle_closed(uv_handle_t *h)
{
}

static void on_rpc_stopped(void *arg)
{
    sl_daemon *d = arg;

    sl_log_info("stopped", NULL);
    sl_cat_unlisten(d->cat); /* its socket watch would keep the loop running */
    sl_ops_stop(&d->ops);
    sl_memtrim_stop(&d->memtrim);
    uv_close((uv_handle_t *)&d->sigterm, on_handle_closed);
    uv_close((uv_handle_t *)&d->sigint, on_handle_closed);
    /* Closing the handles restored the default action; a repeated signal from an impatient
     * supervisor must not turn a clean exit into a kill. */
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
}

/* In the catalog lane: the services' shutdown callbacks change what lane work may hold. */
static void stop(void *arg, int signum)
{
    sl_daemon *d = arg;

    if (d->stopping) {
        sl_log_info("signal_ignored", "signal=%s reason=\"already stopping\"", strsignal(signum));
        return;
    }
    d->stopping = 1;
    sl_log_info("stopping", "signal=%s grace_ms=%llu", strsignal(signum),
                (unsigned long long)d->cfg.grace_ms);
    sl_ops_stopping(&d->ops);
    sl_health_set_all(d->health, SL_HEALTH_NOT_SERVING);
    sl_rpc_server_shutdown(d->rpc, d->cfg.grace_ms, on_rpc_stopped, d);
}

static void on_signal(uv_signal_t *s, int signum)
{
    sl_daemon *d = s->data;

    sl_cat_lane_run(d->cat, stop, d, signum);
}

int main(int argc, char **argv)
{
    static const char *const health_names[] = {"",
                                               "sluice.v1.Admin",
                                               "sluice.v1.Checkpoints",
                                               "sluice.v1.Datasets",
                                               "sluice.v1.Jobs",
                                               "sluice.v1.Epochs",
                                               "sluice.v1.Feed"};
    const sl_rpc_service *services[3 + SL_FEED_N_SERVICES];
    sl_rpc_server_opts opts;
    sl_daemon d;
    int err, rc = 1;

    memset(&d, 0, sizeof(d));
    d.lock_fd = -1;
    d.lock_file_fd = -1;
    err = sl_config_parse(&d.cfg, argc, argv, stdout, stderr);
    if (err == SL_CONFIG_EXIT_OK)
        return 0;
    if (err)
        return 2;
    if (d.cfg.check_config)
        return sl_ops_check_config(&d.cfg, stdout) == 0 ? 0 : 1;
    {
        char msg[512];
        if (sl_ops_check_replica(&d.cfg, msg, sizeof(msg)) != 0 ||
            sl_cat_spec_check(d.cfg.catalog, d.cfg.catalog_password_file, msg, sizeof(msg)) != 0) {
            fprintf(stderr, "sluiced: %s\n", msg);
            return 2;
        }
    }
    signal(SIGPIPE, SIG_IGN);
    catch_fatal();
    /* With object storage, upload write lanes, removals and verifies wait on the network in
     * libuv's worker pool (4 threads by default): give it more, unless the operator chose. Set
     * before the pool's first use. */
    if (strncmp(d.cfg.store, "s3://", 5) == 0)
        setenv("UV_THREADPOOL_SIZE", "16", 0);
    /* Upload chunks are 1-4 MiB messages allocated and freed many times a second: served from
     * the heap instead of fresh mmap()s, they cost no page faults (measured: about 10% of the
     * daemon's CPU during a 1 GiB upload). */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 20);

    if (uv_loop_init(&d.loop) != 0)
        return 1;
    if (sl_ops_init(&d.ops, &d, argc, argv) != 0)
        goto out;
    d.start_ms = uv_now(&d.loop);
    {
        const char *colon = strrchr(d.cfg.listen, ':');
        set_replica(&d, colon ? atoi(colon + 1) : 0);
    }
    if (open_data_dir(&d) != 0)
        goto out;
    if (open_catalog(&d) != 0)
        goto out;
    if (sl_feed_new(&d.feed, &d.loop, d.cat, d.data_dir, d.quar) != 0)
        goto out;
    /* Progress is written from a worker on a connection of its own (the loop never waits). */
    if (sl_cat_shared(d.cat)) {
        if (sl_cat_open_spec(&d.wcat, d.cfg.catalog,
                             d.cfg.catalog_password_file[0] ? d.cfg.catalog_password_file : NULL) !=
            0)
            goto out;
        sl_feed_set_writer(d.feed, d.wcat);
    }
    if (open_ckpt(&d) != 0) /* after the feed: checkpoints carry its data positions */
        goto out;
    /* The startup's sweeps (checkpoints, lengths, a stale WAL) are one quarantine batch. */
    sl_quar_end(d.quar);
    sl_feed_set_metrics(d.feed, d.ops.metrics);
    if (sl_health_new(&d.health, health_names, 3 + SL_FEED_N_SERVICES) != 0)
        goto out;

    services[0] = sl_health_service(d.health);
    services[1] = sl_admin_service(&d);
    services[2] = sl_ckpt_service(d.ckpt);
    for (int i = 0; i < SL_FEED_N_SERVICES; i++)
        services[3 + i] = sl_feed_service(d.feed, i);
    memset(&opts, 0, sizeof(opts));
    opts.listen = d.cfg.listen;
    opts.cq_threads = d.cfg.rpc_threads;
    opts.max_recv_bytes = d.cfg.max_message_bytes;
    opts.max_calls = d.cfg.max_calls;
    opts.max_key_calls = d.cfg.max_job_streams;
    opts.idle_timeout_ms = d.cfg.idle_timeout_ms;
    sl_ops_rpc_opts(&d.ops, &opts);
    if (sl_cat_shared(d.cat)) {
        opts.lane = run_in_lane;
        opts.lane_arg = d.cat;
    }
    err = sl_rpc_server_new(&d.rpc, &d.loop, &opts, services, 3 + SL_FEED_N_SERVICES);
    if (err) {
        sl_log_error("listen_failed", "listen=%s error=\"%s\"", d.cfg.listen, sl_strerror(err));
        goto out;
    }
    {
        /* Replace the port of the configured address with the bound one. */
        const char *colon = strrchr(d.cfg.listen, ':');
        int host_len = colon ? (int)(colon - d.cfg.listen) : (int)strlen(d.cfg.listen);
        snprintf(d.listen, sizeof(d.listen), "%.*s:%d", host_len, d.cfg.listen,
                 sl_rpc_server_port(d.rpc));
        set_replica(&d, sl_rpc_server_port(d.rpc));
    }
    if (d.cfg.port_file[0]) {
        err = write_port_file(d.cfg.port_file, sl_rpc_server_port(d.rpc));
        if (err) {
            sl_log_error("port_file_failed", "path=%s error=\"%s\"", d.cfg.port_file,
                         sl_strerror(err));
            sl_rpc_server_shutdown(d.rpc, 0, NULL, NULL);
            uv_run(&d.loop, UV_RUN_DEFAULT);
            goto out;
        }
    }

    if (sl_ops_start(&d.ops) != 0) {
        sl_rpc_server_shutdown(d.rpc, 0, NULL, NULL);
        uv_run(&d.loop, UV_RUN_DEFAULT);
        goto out;
    }

    /* The heap is checked every 10 s: see memtrim.h. */
    if ((err = sl_memtrim_start(&d.memtrim, &d.loop, 10000)) != 0)
        sl_log_warn("memtrim_failed", "error=\"%s\"", uv_strerror(err));

    uv_signal_init(&d.loop, &d.sigterm);
    uv_signal_init(&d.loop, &d.sigint);
    d.sigterm.data = d.sigint.data = &d;
    uv_signal_start(&d.sigterm, on_signal, SIGTERM);
    uv_signal_start(&d.sigint, on_signal, SIGINT);

    sl_ops_health_update(&d.ops);
    sl_ops_store_watch_start(&d.ops);
    sl_log_info("listening", "addr=%s port=%d data_dir=%s version=%s catalog=%s schema_version=%d",
                d.listen, sl_rpc_server_port(d.rpc), d.data_dir, SLUICE_VERSION,
                sl_cat_engine(d.cat), sl_cat_schema_version(d.cat));
    {
        char status[400];
        snprintf(status, sizeof(status), "serving on %s", d.listen);
        sl_ops_ready(&d.ops, status);
    }
    /* From here on the loop never waits for a catalog server: see server/catalog/lane.h. */
    if ((err = sl_cat_lane_start(d.cat)) != 0) {
        sl_log_error("lane_failed", "error=\"%s\"", sl_strerror(err));
        sl_rpc_server_shutdown(d.rpc, 0, NULL, NULL);
        uv_run(&d.loop, UV_RUN_DEFAULT);
        goto out;
    }
    uv_run(&d.loop, UV_RUN_DEFAULT);
    rc = 0;

out:
    /* A start that failed before the loop ran may have labels being read on the worker pool
     * (jobs loaded from the catalog): they complete before anything they reach is freed. */
    sl_feed_drain(d.feed);
    sl_rpc_server_free(d.rpc);
    sl_ckpt_svc_free(d.ckpt);
    sl_feed_free(d.feed);
    sl_health_free(d.health);
    sl_cat_close(d.cat);
    sl_cat_close(d.wcat);
    if (d.lock_fd >= 0)
        close(d.lock_fd);
    if (d.lock_file_fd >= 0)
        close(d.lock_file_fd);
    sl_ops_stop(&d.ops);
    sl_ops_store_watch_stop(&d.ops);
    sl_memtrim_stop(&d.memtrim);
    uv_run(&d.loop, UV_RUN_DEFAULT);
    sl_ops_free(&d.ops);
    /* After the loop ran out: no worker job uses the store any more. */
    sl_sstore_free(d.store);
    sl_s3_global_cleanup();
    /* After the metrics endpoint stopped: its thread reads the quarantine's counters. */
    sl_quar_free(d.quar);
    if (uv_loop_close(&d.loop) != 0)
        sl_log_warn("loop_close_busy", NULL);
    return rc;
}
