"""Replicas never lose or damage an acknowledged checkpoint (issue 25): fencing lives in the
catalog, in the transaction of each effect. Three sluiced on one PostgreSQL catalog (a real
PostgreSQL 15, pgfixture.py) and one shared data dir; each race is held at its exact point with
SIGSTOP, a source that stops sending, a claim row or a clock set 45 s ahead (libfaketime), so
every test is deterministic. The randomized test mixes uploads, commits, aborts and a paused
replica over many rounds and checks that every checkpoint ever answered COMPLETE stays COMPLETE
and deep-verifies, byte-identical to what was uploaded.

Each test bounds its waits; a hang is a failure."""
import glob
import os
import random
import signal
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import grpc  # noqa: E402
from test_replicas import Held, ReplicaBase, wait_for  # noqa: E402

MiB = 1 << 20
ROUNDS = int(os.environ.get("SL_FENCING_ROUNDS", "200"))


def libfaketime():
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


class FencingBase(ReplicaBase):
    ARGS = ("--upload-lease", "4")

    def setUp(self):
        super().setUp()
        from sluice.checkpoint import Checkpoints
        self.ks = [Checkpoints(d.addr) for d in self.ds]
        self.threads = []

    def tearDown(self):
        for d in self.ds:
            if d.proc and d.proc.poll() is None:
                os.kill(d.proc.pid, signal.SIGCONT)
        for t in self.threads:
            t.join(30)
        for k in self.ks:
            k.close()
        super().tearDown()

    def sql(self, q):
        return self.pg.psql(q, self.ds[0].pg_db)

    def held_upload(self, k, job, name, rank, data, first):
        """Start an upload through client k that stops sending after `first` bytes; returns the
        source (release it to go on) and the list its error lands in."""
        src, errs = Held(data, first), []

        def up():
            try:
                k.upload(job, name, rank, src, size=len(data), chunk_size=1 << 18)
            except grpc.RpcError as e:
                errs.append(e)
        t = threading.Thread(target=up)
        t.start()
        self.threads.append(t)
        self.assertTrue(src.reached.wait(10), "the upload never got going")
        wait_for(lambda: self.sql("SELECT count(*) FROM upload_leases")[0][0] != "0", 5,
                 "the lease")
        return src, errs, t

    def pause_and_take_over(self, name, data, first, held, bound):
        """Upload rank 0 of job/name through replica 0, pause replica 0 (SIGSTOP) once it holds
        `held` bytes, resume the upload through replica 1 within `bound` s, and wait for the
        auto-commit; returns the paused upload's source, errors and thread."""
        src, errs, t = self.held_upload(self.ks[0], "job", name, 0, data, first)
        wait_for(lambda: self.ks[1].upload_status("job", name, 0).held_bytes >= held, 20,
                 "replica 0 to store %d bytes" % held)
        os.kill(self.ds[0].proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        self.ks[1].upload("job", name, 0, data, resume=True)
        self.assertLess(time.monotonic() - t0, bound, "the takeover waited for the lease")
        wait_for(lambda: self.ks[1].get("job", name).state == 2, 5, "COMPLETE")
        return src, errs, t

    def shard_file(self, job, name, rank):
        return os.path.join(self.data, "checkpoints", job, "%s_shard_%d.shard" % (name, rank))

    def assert_intact(self, job, name, datas):
        from sluice.checkpoint import COMPLETE
        k = self.ks[2]
        self.assertEqual(k.get(job, name).state, COMPLETE)
        v = k.verify(job, name, deep=True)
        self.assertTrue(v.ok, "%s\n%s" % (v, self.logs()))
        for rank, data in enumerate(datas):
            self.assertEqual(k.download(job, name, rank), data, "rank %d's bytes" % rank)


class FencingTest(FencingBase):
    def test_commit_refused_while_an_upload_runs_on_another_replica(self):
        # Every rank has a shard; rank 1 is being uploaded again through replica 1. A commit
        # through replica 2 must not answer COMPLETE under it (before: it did, and the upload
        # then replaced the shard of a COMPLETE checkpoint).
        first = [os.urandom(MiB), os.urandom(MiB)]
        again = os.urandom(2 * MiB)
        self.ks[0].begin("job", "c", 1, 2)
        for r in range(2):
            self.ks[0].upload("job", "c", r, first[r])
        src, errs, t = self.held_upload(self.ks[1], "job", "c", 1, again, MiB // 2)
        with self.assertRaises(grpc.RpcError) as cm:
            self.ks[2].commit("job", "c")
        self.assertEqual(cm.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("rank 1", cm.exception.details())
        self.assertIn("in progress on replica", cm.exception.details())
        src.release.set()
        t.join(30)
        self.assertFalse(errs, errs)
        self.ks[2].commit("job", "c")
        self.assert_intact("job", "c", [first[0], again])

    def test_abort_refused_while_another_replica_commits(self):
        # A replica is mid-commit (its claim is a row); an abort through another replica must
        # leave the checkpoint alone (before: it turned INCOMPLETE and its files were removed
        # while the first answered COMPLETE).
        from sluice.checkpoint import WRITING
        data = os.urandom(4096)
        self.ks[0].begin("job", "a", 1, 1)
        self.ks[0].upload("job", "a", 0, data)
        self.sql("UPDATE checkpoints SET commit_claimer = 'r0', commit_claim_ms = "
                 "(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT WHERE name = 'a'")
        with self.assertRaises(grpc.RpcError) as cm:
            self.ks[1].abort("job", "a")
        self.assertEqual(cm.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("being committed by replica r0", cm.exception.details())
        self.assertEqual(self.ks[2].get("job", "a").state, WRITING)
        self.assertTrue(os.path.exists(self.shard_file("job", "a", 0)))
        # Nor does another replica commit under that claim, or an upload start.
        with self.assertRaises(grpc.RpcError) as cm:
            self.ks[2].commit("job", "a")
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE)
        with self.assertRaises(grpc.RpcError) as cm:
            self.ks[2].upload("job", "a", 0, data)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        # The claim ends (here: as a failed commit would end it); then one of the racing commit
        # and abort wins, and a COMPLETE answer is never undone.
        self.sql("UPDATE checkpoints SET commit_claim_ms = 0 WHERE name = 'a'")
        self.race_commit_abort("a", [data])

    def race_commit_abort(self, name, datas):
        from sluice.checkpoint import COMPLETE, INCOMPLETE
        out = {}
        barrier = threading.Barrier(2)

        def call(what, k):
            barrier.wait(5)
            try:
                out[what] = getattr(k, what)("job", name).state
            except grpc.RpcError as e:
                out[what] = e.code()
        ts = [threading.Thread(target=call, args=("commit", self.ks[0])),
              threading.Thread(target=call, args=("abort", self.ks[1]))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        state = self.ks[2].get("job", name).state
        if out["commit"] == COMPLETE:
            self.assertNotEqual(out["abort"], INCOMPLETE, out)
            self.assert_intact("job", name, datas)
        else:
            self.assertEqual(state, INCOMPLETE, out)
        return out["commit"] == COMPLETE

    def test_commit_and_abort_race_on_two_replicas(self):
        wins = 0
        for i in range(12):
            name = "r%d" % i
            datas = [os.urandom(2048 + r) for r in range(2)]
            self.ks[2].begin("job", name, i, 2)
            for r in range(2):
                self.ks[r].upload("job", name, r, datas[r])
            wins += self.race_commit_abort(name, datas)
        # Whichever wins, the outcome is whole (which one wins depends on the machine's load;
        # the randomized test below sees both many times).
        print("\ncommit vs abort: commit won %d of 12" % wins)

    def test_paused_holder_resumed_after_takeover(self):
        # Replica 0 receives rank 0 and is paused (SIGSTOP) half way; the client moves on to
        # replica 1, which takes over at once and finishes; the checkpoint is committed. Replica
        # 0 resumed (SIGCONT) with the rest of the bytes arriving must not touch the committed
        # shard (before: it truncated it through the descriptor it still held).
        data = os.urandom(4 * MiB)
        self.ks[0].begin("job", "p", 1, 1, auto_commit=True)
        src, errs, t = self.pause_and_take_over("p", data, 2 * MiB, MiB, 2.0)
        size = os.path.getsize(self.shard_file("job", "p", 0))
        os.kill(self.ds[0].proc.pid, signal.SIGCONT)
        src.release.set()
        t.join(30)
        self.assertTrue(errs, "the paused replica's upload must fail")
        self.assertIn(errs[0].code(), (grpc.StatusCode.UNAVAILABLE,
                                       grpc.StatusCode.FAILED_PRECONDITION), errs[0].details())
        time.sleep(2.5)  # past the paused replica's lease fence: its stop and release ran
        self.assertEqual(os.path.getsize(self.shard_file("job", "p", 0)), size)
        self.assert_intact("job", "p", [data])

    def test_lease_generations_never_repeat(self):
        # A generation comes from a sequence: the lease of every attempt has a new one, even
        # after the row of the one before was dropped (before: each upload started at 1, and a
        # stale holder's generation matched again).
        seen = []
        self.ks[0].begin("job", "g", 1, 1)
        for i in range(3):
            data = os.urandom(MiB)
            src, errs, t = self.held_upload(self.ks[i % 3], "job", "g", 0, data, MiB // 2)
            seen.append(int(self.sql("SELECT generation FROM upload_leases")[0][0]))
            src.release.set()
            t.join(30)
            self.assertFalse(errs, errs)
            self.assertEqual(self.sql("SELECT count(*) FROM upload_leases"), [["0"]])
        self.assertEqual(len(set(seen)), 3, seen)
        self.assertEqual(seen, sorted(seen))

    def test_save_right_after_its_replica_is_killed_does_not_wait(self):
        # Default lease (30 s): the client moves to another replica and goes on at once.
        from sluice.checkpoint import COMPLETE
        for i in (0, 1):
            self.ds[i].stop()
            self.ds[i].args = ["--replica-id", "r%d" % i]
            self.ds[i].start()
            self.ks[i].close()
            from sluice.checkpoint import Checkpoints
            self.ks[i] = Checkpoints(self.ds[i].addr)
        data = os.urandom(3 * MiB)
        self.ks[0].begin("job", "k", 1, 1, auto_commit=True)
        src, errs, t = self.held_upload(self.ks[0], "job", "k", 0, data, MiB)
        self.ds[0].stop(signal.SIGKILL)
        src.release.set()
        t.join(30)
        t0 = time.monotonic()
        self.ks[1].upload("job", "k", 0, data, resume=True)
        self.assertLess(time.monotonic() - t0, 2.0)
        wait_for(lambda: self.ks[1].get("job", "k").state == COMPLETE, 5, "COMPLETE")
        self.assert_intact("job", "k", [data])


class S3FencingTest(FencingBase):
    """The same with the shards in one bucket and prefix (the test process's s3rver, behind a
    FaultProxy of this test that also answers AbortMultipartUpload as S3 does) instead of one
    directory."""

    def setUp(self):
        from s3fixture import FaultProxy
        from sltest import shared_s3
        self.s3, _ = shared_s3()
        self.proxy = FaultProxy(self.s3.port, s3rver=self.s3, multipart=True).start()
        super().setUp()

    def tearDown(self):
        self.proxy.release()
        super().tearDown()
        self.proxy.stop()

    def replica(self, i, args=()):
        from sltest import Daemon
        return Daemon(data_dir=self.data, catalog="postgresql", pg=self.pg, store="s3",
                      s3=self.s3, s3_endpoint=self.proxy.endpoint,
                      args=["--replica-id", "r%d" % i, "--upload-lease", "4", "--s3-part-size",
                            str(5 * MiB)] + list(args))

    def complete_of(self, job, name, rank):
        """The proxy's match for CompleteMultipartUpload of that shard object."""
        return "POST /%s/%s/%s/%s_shard_%d.shard?uploadId=" % (
            self.s3.bucket, self.ds[0].s3_prefix, job, name, rank)

    def upload_in_thread(self, k, job, name, rank, data):
        out = []

        def up():
            try:
                out.append(k.upload(job, name, rank, data))
            except grpc.RpcError as e:
                out.append(e)
        t = threading.Thread(target=up)
        t.start()
        self.threads.append(t)
        return t, out

    def partial_objects(self, job):
        return [f for f in self.ds[0].store_files(job) if f.startswith(".")]

    def test_recorded_shard_published_by_commit_s3(self):
        # Replica 0 records rank 0 and is paused (SIGSTOP) with its CompleteMultipartUpload on
        # the wire: the shard is recorded but not under its name. Commit through replica 1
        # publishes it from the sealed upload (before: Complete came before the record, so a
        # holder paused there could complete its upload after another attempt's commit).
        datas = [os.urandom(7 * MiB), os.urandom(1000)]
        self.ks[0].begin("job", "r", 1, 2)
        self.ks[1].upload("job", "r", 1, datas[1])
        self.proxy.hold(self.complete_of("job", "r", 0))
        t, out = self.upload_in_thread(self.ks[0], "job", "r", 0, datas[0])
        self.assertTrue(self.proxy.holding.wait(20), "replica 0's Complete never came")
        os.kill(self.ds[0].proc.pid, signal.SIGSTOP)
        self.assertTrue(self.ks[1].upload_status("job", "r", 0).stored)
        self.assertEqual(self.ks[1].commit("job", "r").state, 2)
        self.assertIn("event=s3_shard_recovered", self.ds[1].log())
        self.assert_intact("job", "r", datas)
        # Replica 0 resumed: its Complete finds the upload completed with its own parts, and
        # the upload is answered as stored.
        os.kill(self.ds[0].proc.pid, signal.SIGCONT)
        self.proxy.release()
        t.join(30)
        self.assertFalse(t.is_alive())
        self.assertNotIsInstance(out[0], grpc.RpcError, out)
        self.assert_intact("job", "r", datas)
        wait_for(lambda: self.partial_objects("job") == [], 10, "no partial objects")

    def test_recorded_holder_paused_before_complete_is_fenced_s3(self):
        # Replica 0 records rank 0 (bytes A) and is paused before its Complete; the rank is
        # uploaded again through replica 1 (bytes B, a new attempt that aborts A's multipart
        # upload) and committed. Replica 0 resumed sends its Complete late: it publishes
        # nothing over B, and its client is told it was overtaken.
        a, b = os.urandom(6 * MiB), os.urandom(6 * MiB)
        self.ks[0].begin("job", "f", 1, 1)
        self.proxy.hold(self.complete_of("job", "f", 0))
        t, out = self.upload_in_thread(self.ks[0], "job", "f", 0, a)
        self.assertTrue(self.proxy.holding.wait(20), "replica 0's Complete never came")
        os.kill(self.ds[0].proc.pid, signal.SIGSTOP)
        self.ks[1].upload("job", "f", 0, b)
        self.assertEqual(self.ks[1].commit("job", "f").state, 2)
        self.assert_intact("job", "f", [b])
        os.kill(self.ds[0].proc.pid, signal.SIGCONT)
        self.proxy.release()
        t.join(30)
        self.assertFalse(t.is_alive())
        self.assertIsInstance(out[0], grpc.RpcError, out)
        self.assertIn("took over", out[0].details())
        time.sleep(1)
        self.assert_intact("job", "f", [b])
        self.assertEqual(self.partial_objects("job"), [])

    def test_publish_failure_keeps_the_recorded_shard_s3(self):
        # The store refuses replica 0's Complete past the retry deadline: the upload answers
        # UNAVAILABLE, but its record stands and its sealed upload stays; the commit publishes
        # it (before: the failure discarded the upload under a recorded row).
        data = os.urandom(6 * MiB)
        self.ds[0].stop()
        self.ds[0].args = self.ds[0].args + ["--s3-retry-deadline", "1"]
        self.ds[0].start()
        self.ks[0].close()
        from sluice.checkpoint import Checkpoints
        self.ks[0] = Checkpoints(self.ds[0].addr)
        self.ks[0].begin("job", "u", 1, 1)
        self.proxy.set(slowdown=1000, match=self.complete_of("job", "u", 0))
        with self.assertRaises(grpc.RpcError) as cm:
            self.ks[0].upload("job", "u", 0, data)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE, cm.exception.details())
        self.proxy.passthrough()
        self.assertTrue(self.ks[1].upload_status("job", "u", 0).stored)
        self.assertEqual(self.ks[1].commit("job", "u").state, 2)
        self.assert_intact("job", "u", [data])
        self.assertEqual(self.partial_objects("job"), [])

    def test_paused_holder_resumed_after_takeover_s3(self):
        # Replica 0 has stored the first part's data (the head) and is paused; replica 1 takes
        # over at once from the stored prefix and finishes; replica 0, resumed, records nothing
        # (the store does not fence its late requests: docs/operations.md, "What fences what").
        data = os.urandom(12 * MiB)
        self.ks[0].begin("job", "p", 1, 1, auto_commit=True)
        src, errs, t = self.pause_and_take_over("p", data, 6 * MiB, 1, 5.0)
        os.kill(self.ds[0].proc.pid, signal.SIGCONT)
        src.release.set()
        t.join(30)
        self.assertTrue(errs, "the paused replica's upload must fail")
        time.sleep(2.5)  # past the paused replica's lease fence: its stop ran
        self.assert_intact("job", "p", [data])
        self.assertEqual(self.ks[2].upload_status("job", "p", 0).held_bytes, 0)


@unittest.skipUnless(libfaketime(), "libfaketime is not installed (Debian: faketime)")
class SkewedClockTest(FencingBase):
    """Replica 2's clock runs 45 s ahead. Decisions that depend on time use the catalog's."""

    def replica(self, i, args=()):
        d = super().replica(i, args)
        if i == 2:
            d.env.update(LD_PRELOAD=libfaketime(), FAKETIME="+45s", DONT_FAKE_MONOTONIC="1",
                         ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") +
                         ":verify_asan_link_order=0")
        return d

    def test_skewed_replica_sees_live_leases_as_live(self):
        # Before: the skewed replica judged replica 0's live lease expired by its own clock.
        self.assertIn("+45s", self.ds[2].env.get("FAKETIME", ""))
        first = [os.urandom(MiB)]
        again = os.urandom(2 * MiB)
        self.ks[0].begin("job", "s", 1, 1)
        self.ks[0].upload("job", "s", 0, first[0])
        src, errs, t = self.held_upload(self.ks[0], "job", "s", 0, again, MiB // 2)
        self.assertTrue(self.ks[2].upload_status("job", "s", 0).in_progress)
        with self.assertRaises(grpc.RpcError) as cm:
            self.ks[2].commit("job", "s")
        self.assertEqual(cm.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        src.release.set()
        t.join(30)
        self.assertFalse(errs, errs)
        self.ks[2].commit("job", "s")
        self.assert_intact("job", "s", [again])


class RandomRaceTest(FencingBase):
    """Uploads, commits, aborts and restarts of uploads on random replicas, one replica paused
    now and then, over ROUNDS rounds: every checkpoint ever answered COMPLETE stays COMPLETE and
    deep-verifies, byte-identical to what was uploaded."""

    def test_random_races(self):
        from sluice.checkpoint import COMPLETE
        rng = random.Random(int(os.environ.get("SL_FENCING_SEED", "25")))
        acked = {}  # name -> the bytes of each rank when COMPLETE was answered
        stats = dict(rounds=0, complete=0, refused=0, aborted=0, paused=0, fenced=0,
                     upload_vs_commit=0, commit_vs_upload=0, abort_vs_commit=0, commit_vs_abort=0)
        for rnd in range(ROUNDS):
            name = "x%d" % rnd
            world = rng.choice((1, 2))
            datas = [os.urandom(rng.choice((1, 64, 300)) * 1024) for _ in range(world)]
            self.ks[rng.randrange(3)].begin("job", name, rnd, world)
            paused = None
            if rng.random() < 0.15:
                paused = rng.randrange(3)
                stats["paused"] += 1
            outcome = self.one_round(rng, name, datas, paused, stats)
            if paused is not None:
                os.kill(self.ds[paused].proc.pid, signal.SIGCONT)
            if outcome is not None:
                acked[name] = outcome
            stats["rounds"] += 1
            # Everything acknowledged so far still holds (a few checked each round, all at the
            # end).
            for n in rng.sample(sorted(acked), min(2, len(acked))):
                self.assert_intact("job", n, acked[n])
        for n, datas in acked.items():
            self.assert_intact("job", n, datas)
        stats["complete"] = len(acked)
        print("\nfencing random races: %s, 0 acknowledged checkpoints damaged" % stats)
        self.assertGreater(stats["complete"], 0)

    def one_round(self, rng, name, datas, paused, stats):
        """Race uploads (some twice, on different replicas) with commits and an abort; returns
        the uploaded bytes if a commit answered COMPLETE."""
        from sluice.checkpoint import COMPLETE, INCOMPLETE
        live = [i for i in range(3) if i != paused]
        final = list(datas)
        out = {"commit": []}
        lock = threading.Lock()

        def upload(rank, data, k):
            try:
                k.upload("job", name, rank, data)
                with lock:
                    final[rank] = data
            except grpc.RpcError as e:
                with lock:
                    count(e, "taken over", "fenced")
                    count(e, "being committed", "upload_vs_commit")
                    count(e, "not WRITING", "upload_vs_commit")

        def count(e, what, key):
            if what in (e.details() or ""):
                stats[key] += 1

        def commit(k):
            try:
                st = k.commit("job", name).state
            except grpc.RpcError as e:
                st = None
                with lock:
                    count(e, "in progress", "commit_vs_upload")
                    count(e, "INCOMPLETE", "commit_vs_abort")
            with lock:
                out["commit"].append((st, list(final)))

        def abort(k):
            try:
                if k.abort("job", name).state == INCOMPLETE:
                    with lock:
                        stats["aborted"] += 1
            except grpc.RpcError as e:
                with lock:
                    count(e, "being committed", "abort_vs_commit")
                    count(e, "COMPLETE", "abort_vs_commit")
        ops = []
        for rank, data in enumerate(datas):
            ops.append((upload, (rank, data, self.ks[rng.choice(live)])))
        # Everything uploaded once, then the race: a re-upload, commits, maybe an abort.
        for f, a in ops:
            f(*a)
        if paused is not None:
            os.kill(self.ds[paused].proc.pid, signal.SIGSTOP)
        race = [(commit, (self.ks[rng.choice(live)],)), (commit, (self.ks[rng.choice(live)],))]
        if rng.random() < 0.5:
            rank = rng.randrange(len(datas))
            race.append((upload, (rank, os.urandom(len(datas[rank])), self.ks[rng.choice(live)])))
        if rng.random() < 0.3:
            race.append((abort, (self.ks[rng.choice(live)],)))
        rng.shuffle(race)
        ts = [threading.Thread(target=f, args=a) for f, a in race]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        self.assertFalse(any(t.is_alive() for t in ts), "a call hung")
        done = [c for c in out["commit"] if c[0] == COMPLETE]
        if not done:
            stats["refused"] += 1
            return None
        # A COMPLETE answer: the checkpoint now holds what was recorded; any of the uploads that
        # succeeded before the answer may have been the one recorded, so compare with the store
        # as the catalog has it, then keep those bytes as the acknowledged state.
        k = self.ks[live[0]]
        self.assertEqual(k.get("job", name).state, COMPLETE)
        v = k.verify("job", name, deep=True)
        self.assertTrue(v.ok, "%s\n%s" % (v, self.logs()))
        got = [k.download("job", name, r) for r in range(len(datas))]
        for r, b in enumerate(got):
            self.assertIn(b, (datas[r], final[r]), "rank %d holds bytes nobody uploaded" % r)
        return got


if __name__ == "__main__":
    unittest.main()
