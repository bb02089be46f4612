"""Replicas: three sluiced on one PostgreSQL catalog (a real PostgreSQL 15, pgfixture.py) and
one shared data dir, any of which serves any rank of any job.

Each test bounds its waits; a hang is a failure."""
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import grpc  # noqa: E402
from sltest import Daemon  # noqa: E402
import pgfixture  # noqa: E402
from pgfixture import PgTestCase  # noqa: E402
from sluice.client import Client  # noqa: E402

REPLICAS = 3


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError("timed out after %.1f s waiting for %s" % (timeout, what))


class ReplicaBase(PgTestCase):
    ARGS = ()  # every replica's flags

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="sluice-replicas-")
        self.data = os.path.join(self.tmp.name, "data")
        self.ds = []
        for i in range(REPLICAS):
            self.ds.append(self.replica(i).start())
        self.cs = [Client(d.addr) for d in self.ds]

    def replica(self, i, args=()):
        return Daemon(data_dir=self.data, catalog="postgresql", pg=self.pg,
                      args=["--replica-id", "r%d" % i] + list(self.ARGS) + list(args))

    def tearDown(self):
        for c in self.cs:
            c.close()
        for d in self.ds:
            rc = d.stop()
            if rc not in (0, None, -9):
                self.fail("replica exited with %s:\n%s" % (rc, d.log()[-3000:]))
            # Sanitizer reports, and statements that blocked the loop outside the catalog lane.
            self.assertEqual(d.sanitizer_reports(), [], d.log()[-3000:])
        self.tmp.cleanup()

    def logs(self):
        return "\n".join("---- %s\n%s" % (d.addr, d.log()[-2500:]) for d in self.ds)


class FeedTest(ReplicaBase):
    def test_job_made_on_one_is_served_by_all(self):
        self.cs[0].create_dataset("ds", 90)
        self.cs[0].create_job("job", "ds", 3, seed=7)
        for c in self.cs:
            self.assertEqual(c.get_job("job").world_size, 3)
        # Each rank streams its share from another replica: the shares are disjoint and cover
        # the epoch; the same rank gets the same share from every replica.
        shares = []
        for rank in range(3):
            got = [list(ch.indices) for ch in self.cs[rank].stream_indices("job", rank, epoch=0)]
            shares.append([i for ch in got for i in ch])
            again = [i for ch in self.cs[(rank + 1) % 3].stream_indices("job", rank, epoch=0)
                     for i in ch.indices]
            self.assertEqual(again, shares[-1])
        self.assertEqual(sorted(i for s in shares for i in s), list(range(90)))

    def test_epoch_advance_reaches_every_replica(self):
        self.cs[0].create_dataset("ds", 60)
        self.cs[0].create_job("job", "ds", 3, seed=1)
        # Streams of epoch 1 wait on replicas 1 and 2 while epoch 0 is being finished.
        got, errs = {}, []

        def next_epoch(rank):
            try:
                got[rank] = [i for ch in self.cs[rank].stream_indices("job", rank, epoch=1)
                             for i in ch.indices]
            except grpc.RpcError as e:
                errs.append(e)
        threads = [threading.Thread(target=next_epoch, args=(r,)) for r in (1, 2)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        # Every rank reports its share done, each through another replica.
        for rank in range(3):
            n = sum(len(ch.indices) for ch in self.cs[rank].stream_indices("job", rank, epoch=0))
            r = self.cs[(rank + 2) % 3].report_progress("job", rank, 0, n)
        t0 = time.monotonic()
        for t in threads:
            t.join(10)
        self.assertFalse(any(t.is_alive() for t in threads), "waiting streams never started\n" +
                         self.logs())
        self.assertFalse(errs, errs)
        self.assertLess(time.monotonic() - t0, 1.5)
        for c in self.cs:
            wait_for(lambda c=c: c.get_epoch("job").epoch == 1, 1, "epoch 1 on every replica")
        self.assertTrue(got[1] and got[2])
        del r

    def test_progress_through_different_replicas_never_moves_back(self):
        self.cs[0].create_dataset("ds", 300)
        self.cs[0].create_job("job", "ds", 1, seed=2)
        # Reports of one rank alternate replicas, some of them stale: the recorded position
        # only grows, and every replica answers with it.
        for step, pos in enumerate([10, 50, 20, 80, 30, 81]):
            self.cs[step % 3].report_progress("job", 0, 0, pos)
        for c in self.cs:
            wait_for(lambda c=c: c.get_epoch("job").ranks[0].position == 81, 3,
                     "progress 81 on every replica")

    def test_replica_killed_mid_epoch(self):
        # Rank 0 streams through replica 0, which is SIGKILLed mid-share: rank 0 reopens on
        # replica 1 at the position it reached and the epoch is covered exactly once; the
        # epoch advances on the survivors and the restarted replica finds it there.
        # Shares far bigger than a stream's flow-control window: most of rank 0's is still on
        # the replica when it dies.
        n = 3000000
        self.cs[0].create_dataset("ds", n)
        self.cs[0].create_job("job", "ds", 3, seed=11)
        whole = [i for ch in self.cs[2].stream_indices("job", 0, epoch=0) for i in ch.indices]
        got = []
        it = self.cs[0].stream_indices("job", 0, epoch=0, max_chunk=64)
        for ch in it:
            got.extend(ch.indices)
            if len(got) >= 640:
                break
        self.cs[0].report_progress("job", 0, 0, len(got))
        self.ds[0].stop(signal.SIGKILL)
        with self.assertRaises(grpc.RpcError) as cm:
            for ch in it:
                got.extend(ch.indices)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE)
        # The position reached (what the client consumed), reopened on another replica.
        got.extend(i for ch in self.cs[1].stream_indices("job", 0, epoch=0, position=len(got))
                   for i in ch.indices)
        self.assertEqual(got, whole)
        self.assertEqual(self.cs[2].get_epoch("job").ranks[0].position, 640)
        everything = list(got)
        for rank in (1, 2):
            share = [i for ch in self.cs[rank].stream_indices("job", rank, epoch=0)
                     for i in ch.indices]
            everything.extend(share)
            self.cs[rank].report_progress("job", rank, 0, len(share))
        self.assertEqual(sorted(everything), list(range(n)))
        self.cs[1].report_progress("job", 0, 0, len(got))
        for c in self.cs[1:]:
            wait_for(lambda c=c: c.get_epoch("job").epoch == 1, 5, "epoch 1 on the survivors")
        self.ds[0].start()
        self.cs[0].close()
        self.cs[0] = Client(self.ds[0].addr)
        self.assertEqual(self.cs[0].get_epoch("job").epoch, 1)

    def test_racing_advances_exactly_one_wins(self):
        self.cs[0].create_dataset("ds", 30)
        self.cs[0].create_job("job", "ds", 1, manual_advance=True)
        for c in self.cs:
            c.get_epoch("job")
        results, lock = [], threading.Lock()
        barrier = threading.Barrier(REPLICAS)

        def advance(c):
            barrier.wait(5)
            try:
                e = c.next_epoch("job", expect_epoch=0).epoch
                with lock:
                    results.append(("ok", e))
            except grpc.RpcError as e:
                with lock:
                    results.append((e.code(), e.details()))
        threads = [threading.Thread(target=advance, args=(c,)) for c in self.cs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        oks = [r for r in results if r[0] == "ok"]
        self.assertEqual(len(oks), 1, results)
        self.assertEqual(oks[0][1], 1)
        for r in results:
            if r[0] != "ok":
                self.assertEqual(r[0], grpc.StatusCode.FAILED_PRECONDITION, r)
        for c in self.cs:
            wait_for(lambda c=c: c.get_epoch("job").epoch == 1, 3, "epoch 1 everywhere")

    def test_delete_and_resize_elsewhere(self):
        # A share far bigger than the stream's flow-control window: it is still open at the
        # resize.
        self.cs[0].create_dataset("ds", 4000000)
        self.cs[0].create_job("job", "ds", 4, seed=3)
        for c in self.cs:
            c.get_job("job")
        it = self.cs[1].stream_indices("job", 0, epoch=0, max_chunk=16)
        next(it)
        self.cs[0].resize_job("job", 2)
        for c in self.cs:
            wait_for(lambda c=c: c.get_job("job").world_size == 2, 3, "the resize everywhere")
        with self.assertRaises(grpc.RpcError) as cm:
            for _ in it:
                pass
        self.assertEqual(cm.exception.code(), grpc.StatusCode.ABORTED)
        self.cs[2].delete_job("job")
        for c in self.cs:
            def gone(c=c):
                try:
                    c.get_job("job")
                    return False
                except grpc.RpcError as e:
                    return e.code() == grpc.StatusCode.NOT_FOUND
            wait_for(gone, 3, "the delete everywhere")


class Held:
    """A file-like source that hands out `first` bytes, then blocks until released."""

    def __init__(self, data, first):
        self.data, self.first, self.pos = data, first, 0
        self.release = threading.Event()
        self.reached = threading.Event()

    def read(self, n):
        if self.pos >= self.first and not self.release.is_set():
            self.reached.set()
            self.release.wait(30)
        b = self.data[self.pos:self.pos + n]
        self.pos += len(b)
        return b

    def tell(self):
        return self.pos

    def seek(self, pos, whence=0):
        self.pos = pos if whence == 0 else len(self.data) + pos
        return self.pos


class CkptTest(ReplicaBase):
    def setUp(self):
        super().setUp()
        from sluice.checkpoint import Checkpoints
        self.ks = [Checkpoints(d.addr) for d in self.ds]

    def tearDown(self):
        for k in self.ks:
            k.close()
        super().tearDown()

    def test_racing_auto_commits_complete_once(self):
        from sluice.checkpoint import COMPLETE
        data = [os.urandom(200000 + r) for r in range(2)]
        for step in range(4):
            name = "step_%d" % step
            self.ks[2].begin("job", name, step, 2, auto_commit=True)
            barrier = threading.Barrier(2)
            errs = []

            def up(rank):
                try:
                    barrier.wait(5)
                    self.ks[rank].upload("job", name, rank, data[rank])
                except Exception as e:  # noqa: BLE001 - reported below
                    errs.append(e)
            threads = [threading.Thread(target=up, args=(r,)) for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            self.assertFalse(errs, errs)
            wait_for(lambda: self.ks[0].get("job", name).state == COMPLETE, 5,
                     "%s COMPLETE" % name)
            v = self.ks[2].verify("job", name, deep=True)
            self.assertTrue(v.ok, "%s\n%s" % (v, self.logs()))
        self.assertEqual(sum(d.log().count("event=ckpt_commit ") for d in self.ds), 4,
                         self.logs())

    def test_commit_cut_short_is_finished_at_start(self):
        # Every shard recorded, the commit not made (the replica that recorded the last shard
        # died first; simulated by turning auto-commit on in the catalog afterwards): a replica
        # that starts commits it.
        from sluice.checkpoint import COMPLETE, WRITING
        self.ks[0].begin("job", "cut", 1, 1)
        self.ks[0].upload("job", "cut", 0, os.urandom(1000))
        self.assertEqual(self.ks[1].get("job", "cut").state, WRITING)
        self.pg.psql("UPDATE checkpoints SET auto_commit = 1 WHERE name = 'cut'",
                     self.ds[0].pg_db)
        self.ds[2].stop()
        self.ds[2].start()
        wait_for(lambda: self.ks[0].get("job", "cut").state == COMPLETE, 10, "COMPLETE")
        self.assertTrue(self.ks[1].verify("job", "cut", deep=True).ok)

    def test_upload_lease_and_takeover_after_a_replica_dies(self):
        from sluice.checkpoint import COMPLETE
        for i in (0, 1):
            self.ds[i].stop()
            self.ds[i].args = ["--replica-id", "r%d" % i, "--upload-lease", "2"]
            self.ds[i].start()
            self.cs[i].close()
            self.ks[i].close()
            self.cs[i] = Client(self.ds[i].addr)
            from sluice.checkpoint import Checkpoints
            self.ks[i] = Checkpoints(self.ds[i].addr)
        data = os.urandom(3 << 20)
        self.ks[0].begin("job", "s", 1, 1, auto_commit=True)
        src = Held(data, 1 << 20)
        errs = []

        def up():
            try:
                self.ks[0].upload("job", "s", 0, src, size=len(data), chunk_size=1 << 18)
            except grpc.RpcError as e:
                errs.append(e)
        t = threading.Thread(target=up)
        t.start()
        self.assertTrue(src.reached.wait(10), "the upload never got going")
        time.sleep(0.3)
        # The rank is taken on replica 0: replica 1 says so.
        self.assertTrue(self.ks[1].upload_status("job", "s", 0).in_progress)
        # Replica 0 dies with the upload half done; replica 1 resumes it at once, under a new
        # lease generation, without waiting for the dead replica's lease to run out.
        self.ds[0].stop(signal.SIGKILL)
        src.release.set()
        t.join(30)
        t0 = time.monotonic()
        r = self.ks[1].upload("job", "s", 0, data, resume=True)
        self.assertLess(time.monotonic() - t0, 1.5)
        self.assertEqual(r.data_size, len(data))
        wait_for(lambda: self.ks[1].get("job", "s").state == COMPLETE, 5, "COMPLETE")
        self.assertTrue(self.ks[2].verify("job", "s", deep=True).ok)


class Staged(Held):
    """Held that also pauses `pause_s` once at `pause_at` bytes, so that the parts handed over
    before are stored before the next part boundary records them in the upload's state."""

    def __init__(self, data, first, pause_at, pause_s=1.0):
        super().__init__(data, first)
        self.pause_at, self.pause_s, self.paused = pause_at, pause_s, False

    def read(self, n):
        if self.pos >= self.pause_at and not self.paused:
            self.paused = True
            time.sleep(self.pause_s)
        return super().read(n)


class CkptS3Test(ReplicaBase):
    """Replicas sharing one bucket and prefix (the test process's s3rver behind its FaultProxy,
    sltest.shared_s3) instead of one directory."""

    PART = 5 << 20  # --s3-part-size: the smallest S3 allows

    def replica(self, i, args=()):
        return Daemon(data_dir=self.data, catalog="postgresql", pg=self.pg, store="s3",
                      args=["--replica-id", "r%d" % i, "--upload-lease", "2", "--s3-part-size",
                            str(self.PART)] + list(args))

    def setUp(self):
        super().setUp()
        from sluice.checkpoint import Checkpoints
        self.ks = [Checkpoints(d.addr) for d in self.ds]

    def tearDown(self):
        for k in self.ks:
            k.close()
        super().tearDown()

    def upload_state(self, job, name, rank):
        """The state object of the partial upload (sstore_s3.c): {key: value}, {} without one."""
        try:
            text = self.ds[2].store_read(job, ".%s_shard_%d.shard.part" % (name, rank)).decode()
        except Exception:  # noqa: BLE001 - not there (yet), or replaced meanwhile
            return {}
        return dict(line.split(" ", 1) for line in text.splitlines() if " " in line)

    def test_multipart_upload_taken_over_after_a_replica_dies(self):
        """A multipart upload (state object, head object and parts stored) started on replica 0,
        which is SIGKILLed; once its lease ran out, replica 1 resumes the same multipart upload
        from its state and completes it: COMPLETE, deep verify OK, the object's bytes the
        client's."""
        import hashlib
        from sltest import shared_s3
        from sluice.checkpoint import COMPLETE
        _, proxy = shared_s3()
        part = self.PART
        data = os.urandom(5 * part + 12345)  # part 1 (header + head) and 5 more
        self.ks[0].begin("job", "s3", 1, 1, auto_commit=True)
        src = Staged(data, 4 * part + (1 << 20), pause_at=3 * part + (1 << 20))
        errs = []

        def up():
            try:
                self.ks[0].upload("job", "s3", 0, src, size=len(data), chunk_size=1 << 18)
            except grpc.RpcError as e:
                errs.append(e)
        t = threading.Thread(target=up)
        t.start()
        self.assertTrue(src.reached.wait(30), "the upload never got going")
        head = part - 88  # data bytes in part 1
        wait_for(lambda: int(self.upload_state("job", "s3", 0).get("data_done", 0)) >=
                 head + 2 * part, 15, "parts 2 and 3 recorded in the upload's state")
        state = self.upload_state("job", "s3", 0)
        upload_id = state["upload_id"]
        self.assertIn(".s3_shard_0.shard.part.head", self.ds[2].store_files("job"))
        self.assertGreaterEqual(proxy.seen("PUT", "partNumber=3&uploadId=" + upload_id), 1)
        # Replica 0 dies mid-upload; replica 1 refuses the rank until the lease runs out.
        self.ds[0].stop(signal.SIGKILL)
        src.release.set()
        t.join(30)
        wait_for(lambda: not self.ks[1].upload_status("job", "s3", 0).in_progress, 10,
                 "the dead replica's lease to run out")
        held = self.ks[1].upload_status("job", "s3", 0).held_bytes
        self.assertGreaterEqual(held, head + 2 * part)
        r = self.ks[1].upload("job", "s3", 0, data, resume=True)
        self.assertEqual(r.data_size, len(data))
        self.assertEqual(r.sha256, hashlib.sha256(data).hexdigest())
        wait_for(lambda: self.ks[1].get("job", "s3").state == COMPLETE, 5, "COMPLETE")
        # The same multipart upload, finished by replica 1: its Complete names the id that
        # replica 0 created.
        self.assertGreaterEqual(proxy.seen("POST", "uploadId=" + upload_id), 1)
        v = self.ks[2].verify("job", "s3", deep=True)
        self.assertTrue(v.ok, "%s\n%s" % (v, self.logs()))
        raw = self.ds[2].store_read("job", "s3_shard_0.shard")
        self.assertEqual(raw[88:], data)
        self.assertEqual(raw[12:76].decode(), hashlib.sha256(data).hexdigest())
        self.assertEqual([f for f in self.ds[2].store_files("job") if f.startswith(".")], [])


class PgFaultTest(ReplicaBase):
    ARGS = ("--catalog-timeout", "2")

    def unavailable_or_ok(self, fn):
        """fn() while the catalog is away: it either works (no catalog needed) or fails with
        UNAVAILABLE and a message that says what is wrong."""
        try:
            fn()
            return "ok"
        except grpc.RpcError as e:
            self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, e.details())
            self.assertIn("catalog", e.details(), self.logs())
            return "unavailable"

    def test_connections_terminated(self):
        self.cs[0].create_dataset("ds", 300)
        self.cs[0].create_job("job", "ds", 1)
        self.cs[1].report_progress("job", 0, 0, 40)
        n = self.pg.terminate(self.ds[0].pg_db)
        self.assertGreaterEqual(n, REPLICAS)
        # The first statement of each replica meets the dead connection: UNAVAILABLE, then the
        # replica connects again by itself.
        probes = iter(range(1000))
        for i, c in enumerate(self.cs):
            wait_for(lambda c=c: self.unavailable_or_ok(
                lambda: c.create_dataset("probe-%d" % next(probes), 5)) == "ok", 10,
                "replica %d to reconnect" % i)
        # Progress goes through a second connection of each replica, made again in turn.
        wait_for(lambda: self.unavailable_or_ok(
            lambda: self.cs[2].report_progress("job", 0, 0, 50)) == "ok", 10,
            "replica 2's writer to reconnect")
        # Announcements flow again: a job made through replica 0 reaches replica 1's stream.
        self.cs[0].create_job("job2", "ds", 1)
        wait_for(lambda: self.unavailable_or_ok(lambda: self.cs[1].get_job("job2")) == "ok", 5,
                 "job2 on replica 1")
        for c in self.cs:
            wait_for(lambda c=c: c.get_epoch("job").ranks[0].position == 50, 5, "position 50")

    def test_connection_terminated_mid_statement(self):
        # The server ends a connection while a statement waits for its answer (here: for a lock
        # another session holds): libpq reads the error, then the connection's end, and closes
        # the socket within the statement. The replica answers UNAVAILABLE, stays up (it once
        # aborted, registering the closed socket with its loop) and connects again.
        self.cs[0].create_dataset("ds", 300)
        db = self.ds[0].pg_db
        env = dict(os.environ, PGPASSWORD=self.pg.password, PGAPPNAME="locker")
        locker = subprocess.Popen(
            [pgfixture.PSQL, "-X", "-q", "-h", "127.0.0.1", "-p", str(self.pg.port), "-U",
             self.pg.user, "-d", db, "-c",
             "BEGIN; LOCK TABLE feed_datasets IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(30)"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        outcome = []
        t = threading.Thread(target=lambda: outcome.append(self.unavailable_or_ok(
            lambda: self.cs[0].create_dataset("mid", 5))))
        try:
            wait_for(lambda: self.pg.psql(
                "SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "WHERE c.relname = 'feed_datasets' AND l.mode = 'AccessExclusiveLock' "
                "AND l.granted", db=db), 10, "the lock")
            t.start()
            wait_for(lambda: self.pg.psql(
                "SELECT 1 FROM pg_stat_activity WHERE datname = '%s' AND application_name "
                "LIKE 'sluiced %%' AND wait_event_type = 'Lock'" % db), 1.5,
                "the statement to wait for the lock")  # the catalog timeout is 2 s
            self.assertGreaterEqual(self.pg.terminate(db), REPLICAS)
        finally:
            # The lock's session ends with its backend (pg_sleep never notices its client gone).
            self.pg.psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE application_name = 'locker'")
            locker.kill()
            locker.wait()
        t.join(10)
        self.assertFalse(t.is_alive(), "the call hung")
        self.assertEqual(outcome, ["unavailable"], self.logs())
        for d in self.ds:
            self.assertIsNone(d.proc.poll(), self.logs())
        probes = iter(range(1000))
        for i, c in enumerate(self.cs):
            wait_for(lambda c=c: self.unavailable_or_ok(
                lambda: c.create_dataset("probe-%d" % next(probes), 5)) == "ok", 10,
                "replica %d to reconnect" % i)

    def test_postgresql_frozen(self):
        # The server stops answering (SIGSTOP: its host hangs, or the network drops packets
        # without resets): a call that needs the catalog fails after the catalog timeout (2 s
        # here) instead of hanging the replica; the next ones fail at once while the replica
        # connects again in the background, calls that need no catalog are answered; once the
        # server answers again the replicas go on by themselves, nothing acknowledged lost.
        self.cs[0].create_dataset("ds", 300)
        self.cs[0].create_job("job", "ds", 1)
        self.cs[0].report_progress("job", 0, 0, 30)
        for c in self.cs:
            wait_for(lambda c=c: c.get_epoch("job").ranks[0].position == 30, 5, "position 30")
        self.pg.freeze()
        try:
            for i, c in enumerate(self.cs):
                t0 = time.monotonic()
                self.assertEqual(self.unavailable_or_ok(
                    lambda: c.create_job("j%d" % i, "ds", 1)), "unavailable")
                self.assertLess(time.monotonic() - t0, 2 + 3, "the first call on replica %d" % i)
                t0 = time.monotonic()
                self.assertEqual(self.unavailable_or_ok(
                    lambda: c.create_dataset("d%d" % i, 5)), "unavailable")
                self.assertLess(time.monotonic() - t0, 1.5, "the next call on replica %d" % i)
                self.assertEqual(c.get_job("job").world_size, 1)  # from memory
            self.assertIn("catalog_timeout", self.ds[0].log())
        finally:
            self.pg.thaw()
        for i, c in enumerate(self.cs):
            wait_for(lambda c=c, i=i: self.unavailable_or_ok(
                lambda: c.create_dataset("back-%d" % i, 5)) == "ok", 15,
                "replica %d to reconnect" % i)
        wait_for(lambda: self.unavailable_or_ok(
            lambda: self.cs[1].report_progress("job", 0, 0, 60)) == "ok", 15,
            "replica 1's writer to reconnect")
        for c in self.cs:
            wait_for(lambda c=c: c.get_epoch("job").ranks[0].position == 60, 5, "position 60")

    def health(self, i):
        from sluice._health import health_pb2 as hp
        check = self.cs[i].channel.unary_unary("/grpc.health.v1.Health/Check")
        r = check(hp.HealthCheckRequest().SerializeToString(), timeout=5)
        return hp.HealthCheckResponse.ServingStatus.Name(
            hp.HealthCheckResponse.FromString(r).status)

    def test_health_follows_the_catalog(self):
        # While the catalog server answers nothing for the catalog timeout (2 s here), every
        # call that needs it fails: health says NOT_SERVING, on a replica that made calls and on
        # idle ones (their 5 s gauge refresh meets the frozen server), and SERVING again once
        # the server answers.
        self.cs[0].create_dataset("ds", 30)
        for i in range(REPLICAS):
            wait_for(lambda i=i: self.health(i) == "SERVING", 5, "replica %d serving" % i)
        self.pg.freeze()
        try:
            self.assertEqual(self.unavailable_or_ok(lambda: self.cs[0].create_dataset("d", 5)),
                             "unavailable")
            wait_for(lambda: self.health(0) == "NOT_SERVING", 2.5,
                     "replica 0 NOT_SERVING after a call timed out")
            for i in range(1, REPLICAS):
                wait_for(lambda i=i: self.health(i) == "NOT_SERVING", 10,
                         "idle replica %d NOT_SERVING" % i)
            self.assertIn("event=catalog_down", self.ds[1].log())
        finally:
            self.pg.thaw()
        for i in range(REPLICAS):
            wait_for(lambda i=i: self.health(i) == "SERVING", 10, "replica %d serving again" % i)
        self.assertIn("event=catalog_up", self.ds[0].log())
        self.cs[1].create_dataset("after", 5)

    def test_loop_serves_while_a_statement_waits(self):
        # A statement waits for the catalog server in the catalog lane, not on the loop thread:
        # while a CreateJob waits for a frozen server (up to the catalog timeout, 2 s here), the
        # same replica answers health checks and keeps an open index stream flowing.
        from sluice._health import health_pb2 as hp
        self.cs[0].create_dataset("ds", 200000)
        self.cs[0].create_job("job", "ds", 1)
        stream = self.cs[0].stream_indices("job", 0, max_chunk=16)
        self.assertEqual(next(stream).start, 0)
        check = self.cs[0].channel.unary_unary("/grpc.health.v1.Health/Check")
        outcome = []
        self.pg.freeze()
        try:
            waiter = threading.Thread(target=lambda: outcome.append(self.unavailable_or_ok(
                lambda: self.cs[0].create_job("j2", "ds", 1))))
            waiter.start()
            time.sleep(0.3)  # CreateJob's statement is on its way
            t0 = time.monotonic()
            r = check(hp.HealthCheckRequest().SerializeToString(), timeout=5)
            self.assertEqual(hp.HealthCheckResponse.FromString(r).status,
                             hp.HealthCheckResponse.SERVING)
            chunks = [next(stream) for _ in range(200)]
            took = time.monotonic() - t0
            self.assertTrue(waiter.is_alive(), "CreateJob did not wait for the frozen server")
            self.assertLess(took, 1.0, "a health check and 200 chunks while a statement waits")
            self.assertEqual(chunks[-1].start, 200 * 16)
            waiter.join(10)
            self.assertEqual(outcome, ["unavailable"])
        finally:
            self.pg.thaw()
        stream.cancel()

    def test_postgresql_restarted(self):
        self.cs[0].create_dataset("ds", 300)
        self.cs[0].create_job("job", "ds", 1)
        self.cs[0].report_progress("job", 0, 0, 70)
        self.pg.stop()
        try:
            outcomes = {self.unavailable_or_ok(lambda: self.cs[1].create_job("j2", "ds", 1)),
                        self.unavailable_or_ok(lambda: self.cs[2].report_progress("job", 0, 0,
                                                                                  80))}
            self.assertIn("unavailable", outcomes)
        finally:
            self.pg.start()
        # Back: every replica serves again by itself, and what was acknowledged is there.
        for c in self.cs:
            wait_for(lambda c=c: self.unavailable_or_ok(lambda: c.get_epoch("job")) == "ok"
                     and c.get_epoch("job").ranks[0].position >= 70, 15,
                     "the replica back with position 70")
        # The first statement after the restart meets the dead connection (UNAVAILABLE); the
        # replica connects again in the background within a second or two.
        wait_for(lambda: self.unavailable_or_ok(
            lambda: self.cs[1].report_progress("job", 0, 0, 90)) == "ok", 10,
            "replica 1 to reconnect")
        for c in self.cs:
            wait_for(lambda c=c: c.get_epoch("job").ranks[0].position == 90, 5, "position 90")


class StartTogetherTest(PgTestCase):
    ROUNDS = 20

    def test_replicas_started_together_all_serve(self):
        # Three replicas started at the same instant on a fresh catalog and a fresh data dir,
        # 20 times over: every one serves, every time (one of them writes CATALOG-ID, the others
        # wait for it instead of refusing a dir that lacks it yet). Each round empties the
        # database (a new one costs more than a round) and removes the data dir.
        import shutil
        with tempfile.TemporaryDirectory(prefix="sluice-together-") as tmp:
            data = os.path.join(tmp, "data")
            ds = [Daemon(data_dir=data, catalog="postgresql", pg=self.pg, replicas=1,
                         args=["--replica-id", "r%d" % i]) for i in range(REPLICAS)]
            db = ds[0].pg_db
            for rnd in range(self.ROUNDS):
                shutil.rmtree(data, ignore_errors=True)
                self.pg.psql("DROP SCHEMA public CASCADE; CREATE SCHEMA public", db)
                try:
                    try:
                        Daemon.start_together(ds)
                    except RuntimeError as e:
                        self.fail("round %d: %s" % (rnd, e))
                    with Client(ds[0].addr) as c:
                        c.create_dataset("ds", 10)
                    for d in ds:
                        with Client(d.addr) as c:
                            self.assertEqual(c.get_dataset("ds").samples, 10)
                    with open(os.path.join(data, "CATALOG-ID")) as f:
                        token = f.read().strip()
                    self.assertEqual(self.pg.psql("SELECT value FROM catalog_meta WHERE key "
                                                  "LIKE 'data_dir_token%' ORDER BY key", db),
                                     [[token], [token]])
                finally:
                    rcs = [d.stop() for d in ds]
                for d, rc in zip(ds, rcs):
                    self.assertIn(rc, (0, None), "round %d:\n%s" % (rnd, d.log()[-3000:]))
                    self.assertEqual(d.sanitizer_reports(), [], d.log()[-3000:])
                    os.unlink(d.stderr_path)


    def test_claimer_died_before_writing(self):
        # The replica whose token the catalog took died before it wrote CATALOG-ID (the catalog
        # has the token, nobody recorded the file written): the next replica waits 10 s for the
        # file, then writes the catalog's token itself and serves.
        with tempfile.TemporaryDirectory(prefix="sluice-together-") as tmp:
            data = os.path.join(tmp, "data")
            d = Daemon(data_dir=data, catalog="postgresql", pg=self.pg, replicas=1)
            d.start()
            self.assertEqual(d.stop(), 0, d.log())
            db = d.pg_db
            self.pg.psql("DELETE FROM catalog_meta WHERE key = 'data_dir_token_written'; "
                         "UPDATE catalog_meta SET value = 'feedc0de' "
                         "WHERE key = 'data_dir_token'", db)
            os.unlink(os.path.join(data, "CATALOG-ID"))
            t0 = time.monotonic()
            d.start(timeout=30)
            try:
                self.assertGreater(time.monotonic() - t0, 9)
                self.assertIn("event=data_dir_id_wait", d.log())
                self.assertIn("event=data_dir_id_taken_over", d.log())
                with open(os.path.join(data, "CATALOG-ID")) as f:
                    self.assertEqual(f.read(), "feedc0de\n")
                self.assertEqual(self.pg.psql("SELECT value FROM catalog_meta WHERE key = "
                                              "'data_dir_token_written'", db), [["feedc0de"]])
                with Client(d.addr) as c:
                    c.create_dataset("ds", 3)
            finally:
                self.assertEqual(d.stop(), 0, d.log())
            self.assertEqual(d.sanitizer_reports(), [], d.log())
            self.assertEqual([n for n in os.listdir(data) if n.startswith(".CATALOG-ID")], [])


class IdentityTest(ReplicaBase):
    def test_getinfo_logs_metrics(self):
        import subprocess
        from sltest import SLUICE_CLI
        out = subprocess.run([SLUICE_CLI, "--addr", self.ds[1].addr, "--json", "info"],
                             capture_output=True, text=True, timeout=20)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn('"r1"', out.stdout)
        self.assertIn("postgresql", out.stdout)
        self.assertNotIn(self.pg.password, out.stdout)
        self.assertIn("replica=r1", self.ds[1].log())
        for d in self.ds:
            self.assertNotIn(self.pg.password, d.log())

    def test_data_dir_not_shared_is_refused(self):
        other = os.path.join(self.tmp.name, "elsewhere")
        d = Daemon(data_dir=other, catalog="postgresql", pg=self.pg)
        # Named after its data dir, its database would be another one: point it at ours.
        d.fixed_args = ["--catalog", self.pg.conninfo(self.ds[0].pg_db),
                        "--catalog-password-file", self.pg.password_file]
        with self.assertRaises(RuntimeError) as cm:
            d.start()
        self.assertIn("data_dir_not_shared", str(cm.exception))

    def start_fails(self, args, env=None):
        d = Daemon(catalog="sqlite", env=env)
        d.args = args
        t0 = time.monotonic()
        with self.assertRaises(RuntimeError) as cm:
            d.start(timeout=30)
        d.stop()
        self.assertLess(time.monotonic() - t0, 20)
        return str(cm.exception)

    def test_bad_catalogs_are_clear_errors_at_start(self):
        from pgfixture import free_port
        # Nothing listens there.
        err = self.start_fails(["--catalog", "postgresql://sluice@127.0.0.1:%d/x" % free_port(),
                                "--catalog-password-file", self.pg.password_file])
        self.assertIn("catalog_open_failed", err)
        self.assertIn("Connection refused", err)
        # A wrong password.
        bad = os.path.join(self.tmp.name, "bad-password")
        with open(bad, "w") as f:
            f.write("wrong\n")
        os.chmod(bad, 0o600)
        err = self.start_fails(["--catalog", self.pg.conninfo(self.ds[0].pg_db),
                                "--catalog-password-file", bad])
        self.assertIn("password authentication failed", err)
        self.assertNotIn("wrong", err.split("password authentication failed")[0][-200:])
        # Not a conninfo at all.
        err = self.start_fails(["--catalog", "postgresql:host"])
        self.assertIn("--catalog", err)

    def test_catalog_of_a_newer_sluiced_is_refused(self):
        db = self.ds[0].pg_db
        self.pg.psql("UPDATE schema_version SET version = 99", db)
        try:
            err = self.start_fails(["--catalog", self.pg.conninfo(db), "--catalog-password-file",
                                    self.pg.password_file])
            self.assertIn("catalog_too_new", err)
            self.assertIn("schema_version=99", err)
        finally:
            self.pg.psql("UPDATE schema_version SET version = %d" % 7, db)

    def test_password_in_conninfo_is_refused(self):
        d = Daemon(catalog="sqlite")
        d.args = ["--catalog", "postgresql://sluice:secret@127.0.0.1:1/x"]
        with self.assertRaises(RuntimeError) as cm:
            d.start()
        self.assertIn("holds a password", str(cm.exception))
        self.assertNotIn("secret", str(cm.exception).split("holds a password")[1][:0] + "")


if __name__ == "__main__":
    unittest.main()
