"""Checkpoints that carry the data position (issue 14, docs/checkpoints.md "Data position"): the
real daemon on 127.0.0.1 (port 0, temporary data dir), Python grpcio stubs and the CLI. Shards
carry their rank's position; Commit (or the auto-commit) stores the feed state with COMPLETE;
Restore rewinds the feed job, across epochs, into another world, and after a daemon restart; bad
input gets a clear status and changes nothing."""
import json
import os
import signal
import threading
import time
import unittest

import grpc

from sluice.client import Client
from sluice.v1 import checkpoint_pb2 as pb
from sluice.v1 import checkpoint_pb2_grpc as pbg
from sluice.v1 import feed_pb2
from sltest import Daemon, cli

N = 1000  # samples


def shard(job, name, rank, world, pos=None, data=b"x" * 64):
    hdr = pb.ShardHeader(job=job, checkpoint=name, rank=rank, data_size=len(data), tensors=[
        pb.TensorInfo(name="w", dtype="uint8", shape=[len(data)], offset=0, size=len(data))])
    if pos is not None:
        epoch, position = pos[:2]
        hdr.data_position.CopyFrom(pb.DataPosition(
            epoch=epoch, position=position, world_size=pos[2] if len(pos) > 2 else world))
    yield pb.UploadShardRequest(header=hdr)
    yield pb.UploadShardRequest(chunk=data)


class PositionTest(unittest.TestCase):
    def setUp(self):
        self.d = Daemon().start()
        self.connect()

    def connect(self):
        self.ch = grpc.insecure_channel(self.d.addr)
        self.ck = pbg.CheckpointsStub(self.ch)
        self.feed = Client(self.d.addr)

    def tearDown(self):
        self.ch.close()
        self.feed.close()
        rc = self.d.stop()
        self.d.cleanup()
        self.assertEqual(rc, 0)

    def restart(self):
        self.ch.close()
        self.feed.close()
        self.assertEqual(self.d.stop(), 0)
        self.d.start()
        self.connect()

    def job(self, name="run", world=2, **kw):
        self.feed.create_dataset(name + "-ds", N)
        self.feed.create_job(name, name + "-ds", world_size=world, shuffle="feistel", seed=3, **kw)

    def save(self, name, positions, job="run", auto=True, step=0, world=None, **begin):
        world = world or len(positions)
        c = self.ck.Begin(pb.BeginRequest(job=job, name=name, step=step, world_size=world,
                                          auto_commit=auto, **begin), timeout=10)
        for r, p in enumerate(positions):
            self.ck.UploadShard(shard(job, name, r, world, p), timeout=10)
        return c

    def wait_complete(self, name, job="run"):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            c = self.ck.Get(pb.CheckpointRef(job=job, name=name), timeout=10)
            if c.state == pb.COMPLETE:
                return c
            time.sleep(0.02)
        self.fail("checkpoint %s not COMPLETE: %s" % (name, c))

    def indices(self, rank, epoch=None, position=None):
        out = []
        for chunk in self.feed.stream_indices("run", rank, epoch=epoch, position=position):
            out += list(chunk.indices)
        return out

    def restore(self, name, job="run", **kw):
        return self.ck.Restore(pb.RestoreRequest(job=job, name=name, **kw), timeout=10)

    # ---- the feed state is stored with COMPLETE ----

    def test_auto_commit_stores_feed_state(self):
        self.job()
        c = self.save("s1", [(0, 100), (0, 120)])
        self.assertEqual(c.feed_job, "run")  # bound to the namesake feed job by default
        self.assertTrue(c.auto_commit)
        c = self.wait_complete("s1")
        fs = c.feed_state
        self.assertEqual((fs.job, fs.epoch, fs.world_size, fs.unit), ("run", 0, 2, "indices"))
        self.assertEqual(list(fs.positions), [100, 120])
        self.assertEqual(fs.samples, N)
        latest = self.ck.Latest(pb.LatestRequest(job="run"), timeout=10)
        self.assertEqual(list(latest.feed_state.positions), [100, 120])
        with open(os.path.join(self.d.data_dir, "checkpoints", "run", "s1.metadata.json")) as f:
            meta = json.load(f)
        self.assertEqual(meta["feed_job"], "run")
        self.assertEqual(meta["feed_state"]["positions"], [100, 120])
        v = self.ck.Verify(pb.VerifyRequest(job="run", name="s1", mode=pb.QUICK), timeout=10)
        self.assertTrue(v.ok, v)
        out = cli("ckpt", "show", "run", "s1", addr=self.d.addr)
        self.assertIn("feed", out.stdout + out.stderr)

    def test_unbound_and_no_feed(self):
        self.job()
        c = self.ck.Begin(pb.BeginRequest(job="other", name="a", world_size=1), timeout=10)
        self.assertEqual(c.feed_job, "")
        c = self.ck.Begin(pb.BeginRequest(job="run", name="b", world_size=1, no_feed=True),
                          timeout=10)
        self.assertEqual(c.feed_job, "")
        with self.assertRaises(grpc.RpcError) as e:
            self.ck.UploadShard(shard("run", "b", 0, 1, (0, 5)), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("not bound to a feed job", e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            self.ck.Begin(pb.BeginRequest(job="x", name="c", world_size=1, feed_job="nope"),
                          timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("'nope'", e.exception.details())
        # Without positions a bound checkpoint commits as before, with no feed state.
        self.ck.Begin(pb.BeginRequest(job="run", name="plain", world_size=1), timeout=10)
        self.ck.UploadShard(shard("run", "plain", 0, 1), timeout=10)
        c = self.ck.Commit(pb.CheckpointRef(job="run", name="plain"), timeout=10)
        self.assertEqual(c.state, pb.COMPLETE)
        self.assertFalse(c.HasField("feed_state"))
        with self.assertRaises(grpc.RpcError) as e:
            self.restore("plain")
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("carries no data position", e.exception.details())

    def test_bad_saves_are_refused(self):
        self.job()
        # Ranks that disagree on the epoch: the commit names them, nothing is COMPLETE.
        self.save("e", [(0, 10), (1, 0)], auto=False)
        with self.assertRaises(grpc.RpcError) as e:
            self.ck.Commit(pb.CheckpointRef(job="run", name="e"), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("disagree on the epoch: rank 0 was in epoch 0, rank 1 in epoch 1",
                      e.exception.details())
        # One rank with a position, one without.
        self.save("m", [(0, 10), None], auto=False)
        with self.assertRaises(grpc.RpcError) as e:
            self.ck.Commit(pb.CheckpointRef(job="run", name="m"), timeout=10)
        self.assertIn("rank 1 sent no data position", e.exception.details())
        # A position past the end of the rank's share (500 indices each): named at commit.
        self.save("p", [(0, 10), (0, 501)], auto=False)
        with self.assertRaises(grpc.RpcError) as e:
            self.ck.Commit(pb.CheckpointRef(job="run", name="p"), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("rank 1's position 501 is past the end of its share (500 indices)",
                      e.exception.details())
        # A world that is not the checkpoint's.
        self.ck.Begin(pb.BeginRequest(job="run", name="w", world_size=2), timeout=10)
        with self.assertRaises(grpc.RpcError) as e:
            self.ck.UploadShard(shard("run", "w", 0, 2, (0, 1, 3)), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("world_size 3", e.exception.details())
        # The auto-commit refuses the same way: the checkpoint stays WRITING.
        self.save("a", [(0, 10), (1, 0)])
        time.sleep(0.3)
        c = self.ck.Get(pb.CheckpointRef(job="run", name="a"), timeout=10)
        self.assertEqual(c.state, pb.WRITING)
        self.assertIn("ckpt_auto_commit_refused", self.d.log())
        for bad in ({"world_size": 65537}, {"name": "../x"}):
            with self.assertRaises(grpc.RpcError) as e:
                self.restore(**dict({"name": "a"}, **bad))
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        with self.assertRaises(grpc.RpcError) as e:
            self.ck.Begin(pb.BeginRequest(job="run", name="z", world_size=1, feed_job="run",
                                          no_feed=True), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        # A WRITING checkpoint cannot be restored.
        with self.assertRaises(grpc.RpcError) as e:
            self.restore("a")
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("is WRITING", e.exception.details())

    # ---- restore ----

    def test_restore_rewinds_progress_and_ends_streams(self):
        self.job()
        self.save("s", [(0, 100), (0, 120)])
        self.wait_complete("s")
        full0 = self.indices(0, epoch=0, position=0)
        # Later progress, then a stream left open (it waits for epoch 1).
        self.feed.report_progress("run", 0, 0, 300)
        self.feed.report_progress("run", 1, 0, 350)
        got = {}

        def reader():
            try:
                for _ in self.feed.stream_indices("run", 1, epoch=1):
                    pass
            except grpc.RpcError as e:
                got["code"] = e.code()
        t = threading.Thread(target=reader)
        t.start()
        time.sleep(0.3)
        r = self.restore("s")
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertEqual(got.get("code"), grpc.StatusCode.ABORTED)
        self.assertEqual((r.feed_job, r.epoch, r.world_size), ("run", 0, 2))
        self.assertEqual(list(r.restored.positions), [100, 120])
        st = self.feed.get_epoch("run")
        self.assertEqual(st.epoch, 0)
        self.assertEqual([p.position for p in st.ranks], [100, 120])
        # Streams resume exactly there: rank 0 reads its share from position 100 on.
        self.assertEqual(self.indices(0), full0[100:])
        # A report below the restored position no longer moves it back; one above does.
        self.feed.report_progress("run", 0, 0, 150)
        self.assertEqual(self.feed.get_epoch("run").ranks[0].position, 150)

    def test_restore_across_epochs_and_after_restart(self):
        self.job()
        self.save("e0", [(0, 200), (0, 200)])
        self.wait_complete("e0")
        want = self.indices(1, epoch=0, position=200)
        for ep in range(3):  # the job moves on to epoch 3
            for r in range(2):
                self.feed.report_progress("run", r, ep, N // 2)
        self.assertEqual(self.feed.get_epoch("run").epoch, 3)
        self.restart()
        r = self.restore("e0")
        self.assertEqual(r.epoch, 0)
        self.assertEqual(self.indices(1), want)
        # Progress reported after the restore point is gone (epochs 1..3 are not remembered).
        st = self.feed.get_epoch("run")
        self.assertEqual([p.position for p in st.ranks], [200, 200])

    def test_commit_after_the_epoch_moved_on(self):
        self.job()
        self.ck.Begin(pb.BeginRequest(job="run", name="late", world_size=2, auto_commit=True),
                      timeout=10)
        self.ck.UploadShard(shard("run", "late", 0, 2, (0, 500)), timeout=10)
        for r in range(2):
            self.feed.report_progress("run", r, 0, N // 2)
        self.assertEqual(self.feed.get_epoch("run").epoch, 1)
        self.ck.UploadShard(shard("run", "late", 1, 2, (0, 500)), timeout=10)
        c = self.wait_complete("late")
        self.assertEqual((c.feed_state.epoch, list(c.feed_state.positions)), (0, [500, 500]))
        r = self.restore("late")
        # Both shares were done at 500: the restored state ends epoch 0, so epoch 1 begins.
        self.assertEqual(r.epoch, 1)

    def test_restore_into_another_world_covers_the_rest_once(self):
        self.job(world=2)
        self.save("s", [(0, 100), (0, 300)])
        self.wait_complete("s")
        consumed = set(self.indices(0, epoch=0, position=0)[:100]) | \
            set(self.indices(1, epoch=0, position=0)[:300])
        r = self.restore("s", world_size=3)
        self.assertEqual(r.world_size, 3)
        rest = []
        for rank in range(3):
            rest += self.indices(rank)
        self.assertEqual(len(rest), len(set(rest)))
        self.assertEqual(set(rest) | consumed, set(range(N)))
        self.assertFalse(set(rest) & consumed)

    def test_restore_refuses_a_changed_dataset_or_job(self):
        self.job()
        self.save("s", [(0, 10), (0, 10)])
        self.wait_complete("s")
        self.feed.delete_job("run")
        with self.assertRaises(grpc.RpcError) as e:
            self.restore("s")
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.feed.delete_dataset("run-ds")
        self.feed.create_dataset("run-ds", N + 1)
        self.feed.create_job("run", "run-ds", world_size=2, shuffle="feistel", seed=3)
        self.feed.report_progress("run", 1, 0, 5)
        with self.assertRaises(grpc.RpcError) as e:
            self.restore("s")
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("has 1001 samples; the checkpoint was taken with 1000",
                      e.exception.details())
        ep = self.feed.get_epoch("run")                   # nothing changed
        self.assertEqual((ep.epoch, [p.position for p in ep.ranks]), (0, [0, 5]))
        self.feed.delete_job("run")
        self.feed.delete_dataset("run-ds")
        self.feed.create_dataset("run-ds", N)
        self.feed.create_job("run", "run-ds", world_size=2, shuffle="feistel", seed=4)
        self.feed.report_progress("run", 0, 0, 7)
        with self.assertRaises(grpc.RpcError) as e:
            self.restore("s")
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("other settings", e.exception.details())
        self.assertEqual(self.feed.get_epoch("run").ranks[0].position, 7)  # nothing changed

    def test_restore_refuses_changed_labels(self):
        # Issue 25 item 6: a stratified job's order is a function of the labels; the same
        # samples under other labels would serve some samples twice and others never.
        labels = [i % 3 for i in range(N)]
        self.feed.create_dataset("run-ds", N)
        self.feed.upload_labels("run-ds", labels)
        self.feed.create_job("run", "run-ds", world_size=2, shuffle="feistel", seed=3,
                             stratify=True)
        self.save("l", [(0, 10), (0, 10)])
        fs = self.wait_complete("l").feed_state
        self.assertEqual(fs.format, 1)
        self.assertEqual(len(fs.labels_sha256), 64)
        self.feed.delete_job("run")
        self.feed.upload_labels("run-ds", [(i + 1) % 3 for i in range(N)])
        self.feed.create_job("run", "run-ds", world_size=2, shuffle="feistel", seed=3,
                             stratify=True)
        self.feed.report_progress("run", 0, 0, 4)
        with self.assertRaises(grpc.RpcError) as e:
            self.restore("l")
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("labels of dataset 'run-ds' changed", e.exception.details())
        self.assertIn(fs.labels_sha256[:16], e.exception.details())
        self.assertEqual(self.feed.get_epoch("run").ranks[0].position, 4)  # nothing changed
        # The same labels again: the checkpoint's order exists again, and Restore takes it.
        self.feed.delete_job("run")
        self.feed.upload_labels("run-ds", labels)
        self.feed.create_job("run", "run-ds", world_size=2, shuffle="feistel", seed=3,
                             stratify=True)
        r = self.restore("l")
        self.assertEqual(list(r.restored.positions), [10, 10])
        # A job whose order uses no labels records none (and so no label change refuses it).
        self.feed.delete_job("run")
        self.feed.create_job("run", "run-ds", world_size=2, shuffle="feistel", seed=3)
        self.save("p", [(0, 3), (0, 3)])
        fs = self.wait_complete("p").feed_state
        self.assertEqual((fs.format, fs.labels_sha256), (1, ""))

    def test_checkpoint_without_recorded_labels_restores_unchecked(self):
        # A checkpoint taken before feed states recorded the labels (format 0): made here by
        # rewriting a new one's feed state in the catalog (SQLite, daemon stopped). Its restore
        # cannot check the labels: it goes on as before, and says so in the log.
        if self.d.catalog != "sqlite":
            self.skipTest("rewrites the SQLite catalog file")
        import sqlite3
        self.feed.create_dataset("run-ds", N)
        self.feed.upload_labels("run-ds", [i % 3 for i in range(N)])
        self.feed.create_job("run", "run-ds", world_size=2, shuffle="feistel", seed=3,
                             stratify=True)
        self.save("old", [(0, 10), (0, 10)])
        self.wait_complete("old")
        self.ch.close()
        self.feed.close()
        self.assertEqual(self.d.stop(), 0)
        db = sqlite3.connect(os.path.join(self.d.data_dir, "catalog.db"))
        (blob,) = db.execute("SELECT feed_state FROM checkpoints WHERE name = 'old'").fetchone()
        fs = pb.FeedState.FromString(blob)
        fs.ClearField("labels_sha256")
        fs.ClearField("format")
        db.execute("UPDATE checkpoints SET feed_state = ? WHERE name = 'old'",
                   (fs.SerializeToString(),))
        db.commit()
        db.close()
        self.d.start()
        self.connect()
        self.feed.delete_job("run")
        self.feed.upload_labels("run-ds", [(i + 1) % 3 for i in range(N)])
        self.feed.create_job("run", "run-ds", world_size=2, shuffle="feistel", seed=3,
                             stratify=True)
        r = self.restore("old")
        self.assertEqual((r.restored.format, list(r.restored.positions)), (0, [10, 10]))
        self.assertIn("event=restore_labels_unchecked job=run dataset=run-ds", self.d.log())

    def test_restore_decides_from_the_catalog_not_a_replicas_copy(self):
        # Issue 25 item 12: a job deleted and made again through replica A, and Restore through
        # replica B at once. B is stopped meanwhile, so that its copy of the job and the
        # announcements it has not read are as stale as they can be; then B must still decide
        # from the catalog. With one daemon (SQLite) A and B are the same process.
        reps = self.d.replicas
        a_addr = "127.0.0.1:%d" % reps[0].port
        b = reps[1] if len(reps) > 1 else reps[0]
        a = Client(a_addr)
        bch = grpc.insecure_channel("127.0.0.1:%d" % b.port)
        bck = pbg.CheckpointsStub(bch)
        bfeed = Client("127.0.0.1:%d" % b.port)
        try:
            a.create_dataset("run-ds", N)
            a.create_job("run", "run-ds", world_size=2, shuffle="feistel", seed=3)
            self.save("s", [(0, 10), (0, 10)])
            self.wait_complete("s")

            def remake(samples, seed):
                # B holds a copy of the job (a call through it loads one), then sleeps while A
                # makes the job again.
                self.assertEqual(bfeed.get_job("run").seed, bfeed.get_job("run").seed)
                if b is not reps[0]:
                    os.kill(b.proc.pid, signal.SIGSTOP)
                try:
                    a.delete_job("run")
                    a.delete_dataset("run-ds")
                    a.create_dataset("run-ds", samples)
                    a.create_job("run", "run-ds", world_size=2, shuffle="feistel", seed=seed)
                    a.report_progress("run", 1, 0, 5)
                finally:
                    if b is not reps[0]:
                        os.kill(b.proc.pid, signal.SIGCONT)

            def restore_b():
                return bck.Restore(pb.RestoreRequest(job="run", name="s"), timeout=10)

            # B's copy: N+1 samples, seed 3; the catalog: N samples, seed 4. The check that
            # matters is the settings' (the samples match the checkpoint's).
            remake(N + 1, 3)
            remake(N, 4)
            with self.assertRaises(grpc.RpcError) as e:
                restore_b()
            self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("other settings", e.exception.details())
            # B's copy: N samples, seed 3 (it would pass); the catalog: N+1 samples. A stale
            # copy must not let the restore through.
            remake(N, 3)
            remake(N + 1, 3)
            with self.assertRaises(grpc.RpcError) as e:
                restore_b()
            self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("has 1001 samples; the checkpoint was taken with 1000",
                          e.exception.details())
            ep = a.get_epoch("run")                         # nothing changed
            self.assertEqual((ep.epoch, [p.position for p in ep.ranks]), (0, [0, 5]))
            # And B's copy follows the catalog for streaming too: it serves the new job.
            self.assertEqual(bfeed.get_job("run").seed, 3)
            ep = bfeed.get_epoch("run")
            self.assertEqual([p.position for p in ep.ranks], [0, 5])
            # The catalog's job as the checkpoint had it: B restores it.
            remake(N, 3)
            r = restore_b()
            self.assertEqual(list(r.restored.positions), [10, 10])
            self.assertEqual([p.position for p in a.get_epoch("run").ranks], [10, 10])
        finally:
            a.close()
            bfeed.close()
            bch.close()

    def batch_job(self, lengths):
        self.feed.create_dataset("tok", N)
        self.feed.upload_lengths("tok", lengths)
        self.feed.create_job("run", "tok", world_size=2, shuffle="feistel", seed=5, batching={
            "strategy": "dynamic", "max_batch_size": 8, "max_seq_len": 64, "max_tokens": 256})

    def steps(self, rank, epoch=None, step=None):
        out = []
        for chunk in self.feed.stream_batches("run", rank, epoch=epoch, step=step):
            out += [(b.step, tuple(b.indices)) for b in chunk.batches]
        return out

    def test_batch_job_restores_in_batches_and_checks_lengths(self):
        self.batch_job([1 + (i * 7) % 60 for i in range(N)])
        full = self.steps(1, epoch=0, step=0)
        self.save("b", [(0, 3), (0, 3)])
        c = self.wait_complete("b")
        self.assertEqual((c.feed_state.unit, list(c.feed_state.positions)), ("batches", [3, 3]))
        self.feed.report_progress("run", 1, 0, 9)
        self.restore("b")
        self.assertEqual(self.steps(1), full[3:])
        # Other lengths under the same name: the checkpoint's batches no longer exist.
        self.feed.delete_job("run")
        self.feed.upload_lengths("tok", [1 + (i * 11) % 60 for i in range(N)])
        self.feed.create_job("run", "tok", world_size=2, shuffle="feistel", seed=5, batching={
            "strategy": "dynamic", "max_batch_size": 8, "max_seq_len": 64, "max_tokens": 256})
        with self.assertRaises(grpc.RpcError) as e:
            self.restore("b")
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("lengths of dataset 'tok' changed", e.exception.details())
        # A batch job restored mid-epoch into another world (issue 17): the rest of the epoch's
        # batches is redistributed, equal counts per rank, nothing served twice, and only the
        # remainder rule's last batches (fewer than the new world) left out.
        self.feed.delete_job("run")
        self.feed.delete_dataset("tok")
        self.batch_job([1 + (i * 7) % 60 for i in range(N)])
        plan = [self.steps(r, epoch=0, step=0) for r in range(2)]
        self.restore("b", world_size=3)
        self.assertEqual(self.feed.get_job("run").world_size, 3)
        rest = [self.steps(r) for r in range(3)]
        self.assertEqual(len({len(x) for x in rest}), 1)
        self.assertEqual([x[0][0] for x in rest], [0, 0, 0])  # steps restart at 0
        served = [b for r in range(2) for _, b in plan[r][:3]] + [b for x in rest for _, b in x]
        every = [b for r in range(2) for _, b in plan[r]]
        self.assertEqual(len(served), len(set(served)))
        self.assertTrue(set(served) <= set(every))
        self.assertLess(len(every) - len(served), 3)
        self.assertEqual(self.feed.get_epoch("run").ranks[2].count, len(rest[0]))

    def test_weighted_batch_job_restores_into_another_world(self):
        # A batch job with rank weights restored mid-epoch into another world re-plans the rest
        # of its epoch for the new ranks (their weights dropped: the dp size changed), equal
        # counts per rank, nothing served twice.
        lengths = [1 + (i * 7) % 60 for i in range(N)]
        self.feed.create_dataset("tok", N)
        self.feed.upload_lengths("tok", lengths)
        self.feed.create_job("run", "tok", world_size=2, shuffle="feistel", seed=5, batching={
            "strategy": "dynamic", "max_batch_size": 8, "max_seq_len": 64, "max_tokens": 256},
            rank_weights=[1, 0.5])
        plan = [self.steps(r, epoch=0, step=0) for r in range(2)]
        self.save("w", [(0, 3), (0, 2)])
        self.wait_complete("w")
        self.restore("w", world_size=3)
        job = self.feed.get_job("run")
        self.assertEqual((job.world_size, list(job.rank_weights)), (3, []))
        rest = [self.steps(r) for r in range(3)]
        self.assertEqual(len({len(x) for x in rest}), 1)
        self.assertEqual([x[0][0] for x in rest], [0, 0, 0])  # steps restart at 0
        for x in rest:
            for _, b in x:
                self.assertLessEqual(len(b) * max(lengths[i] for i in b), 256)
        served = [i for r, k in ((0, 3), (1, 2)) for _, b in plan[r][:k] for i in b] + \
            [i for x in rest for _, b in x for i in b]
        every = {i for r in range(2) for _, b in plan[r] for i in b}
        self.assertEqual(len(served), len(set(served)))
        self.assertTrue(set(served) <= every)
        self.assertGreater(len(served), 0.9 * len(every))

    def test_cli_restore(self):
        self.job()
        self.save("s", [(0, 40), (0, 60)])
        self.wait_complete("s")
        self.feed.report_progress("run", 0, 0, 90)
        out = cli("ckpt", "restore", "run", "s", addr=self.d.addr)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("epoch 0", out.stdout)
        self.assertEqual(self.feed.get_epoch("run").ranks[0].position, 40)


    def test_cli_begin_binds_and_shows_the_feed_state(self):
        # sluice ckpt begin --auto-commit / --feed-job / --no-feed (libsluice's
        # sl_ckpt_begin_ex), then ckpt show --json and ckpt feed state of the COMPLETE one.
        self.job()
        self.job("other")
        out = cli("ckpt", "begin", "run", "a", "--world", "2", "--auto-commit", addr=self.d.addr)
        self.assertEqual(out.returncode, 0, out.stderr)
        for r, p in enumerate((40, 60)):
            self.ck.UploadShard(shard("run", "a", r, 2, (0, p)), timeout=10)
        self.wait_complete("a")
        out = cli("--json", "ckpt", "show", "run", "a", addr=self.d.addr)
        self.assertEqual(out.returncode, 0, out.stderr)
        doc = json.loads(out.stdout)
        fs = doc["feed_state"]
        self.assertEqual(doc["checkpoint"]["state"], "COMPLETE")   # committed by the daemon
        self.assertEqual((fs["feed_job"], fs["epoch"], fs["world_size"], fs["unit"],
                          fs["positions"]), ("run", 0, 2, "indices", [40, 60]))
        text = cli("ckpt", "show", "run", "a", addr=self.d.addr)
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertRegex(text.stdout, r"feed.*run.*epoch 0")
        self.assertIn("40", text.stdout)

        out = cli("ckpt", "begin", "run", "b", "--world", "2", "--feed-job", "other",
                  addr=self.d.addr)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(self.ck.Get(pb.CheckpointRef(job="run", name="b"), timeout=10).feed_job,
                         "other")
        out = cli("ckpt", "begin", "run", "c", "--world", "2", "--no-feed", addr=self.d.addr)
        self.assertEqual(out.returncode, 0, out.stderr)
        c = self.ck.Get(pb.CheckpointRef(job="run", name="c"), timeout=10)
        self.assertEqual((c.feed_job, c.auto_commit), ("", False))
        # Bad combinations and a feed job that does not exist: exit 1, the value named.
        out = cli("ckpt", "begin", "run", "d", "--world", "2", "--feed-job", "nosuch",
                  addr=self.d.addr)
        self.assertEqual(out.returncode, 1, out.stdout)
        self.assertIn("nosuch", out.stderr)
        out = cli("ckpt", "begin", "run", "d", "--world", "2", "--feed-job", "other",
                  "--no-feed", addr=self.d.addr)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("no_feed", out.stderr)

    # ---- review of issue 14 ----

    def test_restore_refused_by_its_resize_changes_nothing(self):
        # A job with a mesh restored into another world without a mesh, or with one that does
        # not fit: refused before anything is rewound.
        self.job(world=4, mesh={"dp": 2, "tp": 2, "cp": 1, "pp": 1})
        self.save("s", [(0, 100), (0, 90), (0, 200), (0, 210)])
        c = self.wait_complete("s")
        self.assertEqual(list(c.feed_state.positions), [90, 200])  # the lowest of each dp rank
        self.feed.report_progress("run", 0, 0, 300)
        for kw, code, text in (
                ({}, grpc.StatusCode.INVALID_ARGUMENT, "give the new mesh"),
                ({"mesh": feed_pb2.Mesh(dp=2, tp=2, cp=1, pp=1)},
                 grpc.StatusCode.INVALID_ARGUMENT, "does not match world size 6")):
            with self.assertRaises(grpc.RpcError) as e:
                self.restore("s", world_size=6, **kw)
            self.assertEqual(e.exception.code(), code)
            self.assertIn(text, e.exception.details())
            self.assertEqual([p.position for p in self.feed.get_epoch("run").ranks], [300, 0])
            self.assertEqual(self.feed.get_job("run").world_size, 4)
        r = self.restore("s", world_size=6, mesh=feed_pb2.Mesh(dp=3, tp=2, cp=1, pp=1))
        self.assertEqual((r.epoch, r.world_size), (0, 6))

    def test_restore_at_the_end_of_an_epoch_into_another_world(self):
        # Every share consumed: the next epoch begins, and the new world starts it whole
        # (no elastic remainder of the finished epoch).
        self.job(world=2)
        self.save("s", [(0, N // 2), (0, N // 2)])
        self.wait_complete("s")
        r = self.restore("s", world_size=3)
        self.assertEqual((r.epoch, r.world_size), (1, 3))
        j = self.feed.get_job("run")
        self.assertEqual((j.epoch, j.world_size, j.resized_in_epoch), (1, 3, False))
        rest = []
        for rank in range(3):
            rest += self.indices(rank)
        self.assertEqual(set(rest), set(range(N)))  # padded to equal shares

    def test_batch_job_restored_at_the_end_of_its_epoch_advances(self):
        self.batch_job([1 + (i * 7) % 60 for i in range(N)])
        n = len(self.steps(0, epoch=0, step=0))
        self.save("b", [(0, n), (0, n)])
        self.wait_complete("b")
        self.feed.report_progress("run", 0, 0, 2)
        self.restore("b")
        # Nobody streams or asks for the epoch: the plan is built all the same, and the state
        # that ends epoch 0 begins epoch 1.
        deadline = time.monotonic() + 10
        while self.feed.get_job("run").epoch != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.feed.get_job("run").epoch, 1)

    def test_auto_commit_after_a_reupload_that_failed(self):
        self.job()
        self.save("s", [(0, 10)], world=2)
        go = threading.Event()

        def slow():
            hdr = next(shard("run", "s", 0, 2, (0, 10), data=b"y" * 4096))
            hdr.header.data_size = 1 << 20
            hdr.header.tensors[0].shape[:] = [1 << 20]
            hdr.header.tensors[0].size = 1 << 20
            yield hdr
            yield pb.UploadShardRequest(chunk=b"y" * 4096)
            go.wait(10)
        fut = self.ck.UploadShard.future(slow(), timeout=10)
        time.sleep(0.3)  # rank 0's re-upload is running
        self.ck.UploadShard(shard("run", "s", 1, 2, (0, 20)), timeout=10)
        time.sleep(0.2)
        self.assertEqual(self.ck.Get(pb.CheckpointRef(job="run", name="s")).state, pb.WRITING)
        fut.cancel()  # the re-upload ends without replacing rank 0's shard
        go.set()
        c = self.wait_complete("s")
        self.assertEqual(list(c.feed_state.positions), [10, 20])


if __name__ == "__main__":
    unittest.main()
