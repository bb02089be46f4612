"""The feeding service end to end: the real sluiced on 127.0.0.1 (port 0, temporary data dir), the
real `sluice` CLI and the Python client (sluice.client) over grpcio."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc

from sluice.client import Client
from sltest import DaemonClientTest, cli

HERE = os.path.dirname(os.path.abspath(__file__))
C = grpc.StatusCode


def share(client, job, rank, **kw):
    """All (epoch, positions, indices) of one stream."""
    epoch, start, out = None, None, []
    for ch in client.stream_indices(job, rank, **kw):
        if epoch is None:
            epoch, start = ch.epoch, ch.start
        out.extend(ch.indices)
    return epoch, start, out


class NameCaseTest(DaemonClientTest):
    """Names that differ only in case are one name (issue 25): their directories and files
    would collide on a case-insensitive filesystem. The second is refused ALREADY_EXISTS naming
    both; the exact name behaves as before."""

    def test_names_differing_in_case_are_refused(self):
        from sluice.checkpoint import Checkpoints
        self.c.create_dataset("Images", 10)
        code, msg = self.code(self.c.create_dataset, "images", 10)
        self.assertEqual(code, grpc.StatusCode.ALREADY_EXISTS)
        self.assertIn("'images'", msg)
        self.assertIn("'Images'", msg)
        code, msg = self.code(self.c.create_dataset, "Images", 10)
        self.assertEqual((code, msg), (grpc.StatusCode.ALREADY_EXISTS,
                                       "dataset 'Images' already exists"))
        self.assertEqual([d.name for d in self.c.list_datasets()], ["Images"])

        self.c.create_job("Run-1", "Images", 1)
        code, msg = self.code(self.c.create_job, "run-1", "Images", 1)
        self.assertEqual(code, grpc.StatusCode.ALREADY_EXISTS)
        self.assertIn("'run-1' differs only in case from the existing job 'Run-1'", msg)

        with Checkpoints(self.d.addr) as ck:
            # A checkpoint's job shares checkpoints/<job> with the feed job of that name.
            code, msg = self.code(ck.begin, "RUN-1", "c", world_size=1, no_feed=True)
            self.assertEqual(code, grpc.StatusCode.ALREADY_EXISTS)
            self.assertIn("'RUN-1' differs only in case from the existing job 'Run-1'", msg)
            ck.begin("Run-1", "Step_1", world_size=1)
            code, msg = self.code(ck.begin, "Run-1", "step_1", world_size=1)
            self.assertEqual(code, grpc.StatusCode.ALREADY_EXISTS)
            self.assertIn("Run-1/step_1 differs only in case from the existing checkpoint "
                          "Run-1/Step_1", msg)
            self.assertEqual(ck.begin("Run-1", "Step_1", world_size=1).name, "Step_1")
            # Checkpoints of a job with no feed job claim its name too.
            ck.begin("solo", "a", world_size=1, no_feed=True)
            code, msg = self.code(self.c.create_job, "SOLO", "Images", 1)
            self.assertEqual(code, grpc.StatusCode.ALREADY_EXISTS)
            self.assertIn("'SOLO' differs only in case from the existing job 'solo'", msg)
        # Other names stay free: the same letters in another kind, other names altogether.
        self.c.create_dataset("run-1", 5)
        self.c.create_job("Run-2", "Images", 1)


class FeedTest(DaemonClientTest):

    # ---- datasets and jobs ----

    def test_dataset_lifecycle_and_lengths(self):
        d = self.c.create_dataset("ds", 5)
        self.assertEqual((d.name, d.samples, d.has_lengths), ("ds", 5, False))
        d = self.c.upload_lengths("ds", [3, 1, 4, 1, 5])
        self.assertTrue(d.has_lengths)
        import hashlib
        import struct
        self.assertEqual(d.lengths_sha256,
                         hashlib.sha256(struct.pack("<5I", 3, 1, 4, 1, 5)).hexdigest())
        path = os.path.join(self.d.data_dir, "datasets", "ds.lengths")
        with open(path, "rb") as f:
            self.assertEqual(struct.unpack("<5I", f.read()), (3, 1, 4, 1, 5))
        self.assertEqual([x.name for x in self.c.list_datasets()], ["ds"])
        # A count that does not match the sample count leaves the old file in place.
        code, msg = self.code(self.c.upload_lengths, "ds", [1, 2, 3])
        self.assertEqual(code, C.INVALID_ARGUMENT)
        self.assertIn("got 3 lengths", msg)
        self.assertIn("5 samples", msg)
        code, msg = self.code(self.c.upload_lengths, "ds", [1] * 6)
        self.assertEqual(code, C.INVALID_ARGUMENT)
        code, msg = self.code(self.c.upload_lengths, "ds", [1, 0, 1, 1, 1])
        self.assertEqual(code, C.INVALID_ARGUMENT)
        self.assertIn("sample 1", msg)
        self.assertEqual(self.c.get_dataset("ds").lengths_sha256, d.lengths_sha256)
        self.assertEqual([n for n in os.listdir(os.path.dirname(path))], ["ds.lengths"])
        self.c.delete_dataset("ds")
        self.assertFalse(os.path.exists(path))
        self.assertEqual(self.code(self.c.get_dataset, "ds")[0], C.NOT_FOUND)

    def test_hostile_input(self):
        c = self.c
        self.assertEqual(self.code(c.create_dataset, "zero", 0)[0], C.INVALID_ARGUMENT)
        for bad in ["", "../etc", ".hidden", "a/b", "x" * 129, "a..b", "sp ace"]:
            code, msg = self.code(c.create_dataset, bad, 10)
            self.assertEqual(code, C.INVALID_ARGUMENT, bad)
        c.create_dataset("ds", 10)
        code, msg = self.code(c.create_dataset, "ds", 10)
        self.assertEqual(code, C.ALREADY_EXISTS)
        self.assertIn("'ds'", msg)
        code, msg = self.code(c.create_job, "j", "nope", 2)
        self.assertEqual(code, C.NOT_FOUND)
        self.assertIn("nope", msg)
        self.assertEqual(self.code(c.create_job, "j", "ds", 0)[0], C.INVALID_ARGUMENT)
        code, msg = self.code(c.create_job, "j", "ds", 8, mesh=dict(dp=2, tp=2, cp=1, pp=1))
        self.assertEqual(code, C.INVALID_ARGUMENT)
        code, msg = self.code(c.create_job, "j", "ds", 2, partition="diagonal")
        self.assertEqual(code, C.INVALID_ARGUMENT)
        self.assertIn("diagonal", msg)
        code, msg = self.code(c.create_job, "j", "ds", 2, partition="chunked")
        self.assertEqual(code, C.INVALID_ARGUMENT)
        code, msg = self.code(c.create_job, "j", "ds", 2, batching=dict(max_batch_size=0))
        self.assertEqual(code, C.INVALID_ARGUMENT)
        c.create_job("j", "ds", 4)
        self.assertEqual(self.code(c.create_job, "j", "ds", 4)[0], C.ALREADY_EXISTS)
        code, msg = self.code(c.stream_indices, "j", 4)
        self.assertEqual(code, C.INVALID_ARGUMENT)
        self.assertIn("rank 4 out of range [0, 4)", msg)
        self.assertEqual(self.code(c.stream_indices, "nope", 0)[0], C.NOT_FOUND)
        self.assertEqual(self.code(c.stream_indices, "j", 0, max_chunk=1 << 20)[0],
                         C.INVALID_ARGUMENT)
        self.assertEqual(self.code(c.stream_indices, "j", 0, position=4)[0], C.INVALID_ARGUMENT)
        self.assertEqual(self.code(c.stream_indices, "j", 0, epoch=5)[0], C.FAILED_PRECONDITION)
        self.assertEqual(self.code(c.stream_batches, "j", 0)[0], C.FAILED_PRECONDITION)
        code, msg = self.code(c.report_progress, "j", 0, 0, 4)
        self.assertEqual(code, C.INVALID_ARGUMENT)
        self.assertIn("position 4", msg)
        self.assertEqual(self.code(c.report_progress, "j", 9, 0, 1)[0], C.INVALID_ARGUMENT)
        self.assertEqual(self.code(c.report_progress, "j", 0, 3, 1)[0], C.FAILED_PRECONDITION)
        self.assertEqual(self.code(c.report_progress, "nope", 0, 0, 1)[0], C.NOT_FOUND)
        self.assertEqual(self.code(c.get_epoch, "nope")[0], C.NOT_FOUND)
        self.assertEqual(self.code(c.next_epoch, "j", expect_epoch=7)[0], C.FAILED_PRECONDITION)
        code, msg = self.code(c.delete_dataset, "ds")
        self.assertEqual(code, C.FAILED_PRECONDITION)
        self.assertEqual(self.code(c.upload_lengths, "nope", [1])[0], C.NOT_FOUND)
        self.assertEqual(self.code(c.resize_job, "j", 0)[0], C.INVALID_ARGUMENT)
        self.assertEqual(self.code(c.delete_job, "nope")[0], C.NOT_FOUND)
        # Garbage bytes instead of a request.
        raw = self.c.channel.unary_unary("/sluice.v1.Jobs/Create")
        with self.assertRaises(grpc.RpcError) as e:
            raw(b"\xff\xff\xff\xff", timeout=5)
        self.assertEqual(e.exception.code(), C.INVALID_ARGUMENT)
        self.assertEqual(c.get_job("j").epoch, 0)

    # ---- streams, progress, epochs ----

    def test_streams_cover_epoch_resume_and_advance(self):
        c = self.c
        c.create_dataset("ds", 1003)
        c.create_job("j", "ds", 4, shuffle="feistel", seed=7, drop_last=True)
        shares = [share(c, "j", r, max_chunk=100) for r in range(4)]
        self.assertEqual({s[0] for s in shares}, {0})
        allidx = [i for s in shares for i in s[2]]
        self.assertEqual(len(allidx), 1000)
        self.assertEqual(len(set(allidx)), 1000)
        # Report rank 1 halfway: a new stream resumes there.
        c.report_progress("j", 1, 0, 100)
        ep, start, rest = share(c, "j", 1)
        self.assertEqual((ep, start), (0, 100))
        self.assertEqual(rest, shares[1][2][100:])
        # A lower report is ignored (monotonic).
        self.assertEqual(c.report_progress("j", 1, 0, 50).position, 100)
        st = c.get_epoch("j")
        self.assertEqual([r.position for r in st.ranks], [0, 100, 0, 0])
        self.assertFalse(st.complete)
        # A stream for the next epoch waits until every rank is done.
        got = {}

        def waiter():
            got["v"] = share(Client(self.d.addr), "j", 2, epoch=1)

        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.3)
        self.assertNotIn("v", got)
        for r in range(4):
            resp = c.report_progress("j", r, 0, 250)
        self.assertTrue(resp.advanced)
        self.assertEqual(resp.epoch, 1)
        t.join(10)
        self.assertEqual(got["v"][0], 1)
        self.assertNotEqual(got["v"][2], shares[2][2])
        epoch1 = got["v"][2] + [i for r in (0, 1, 3) for i in share(c, "j", r)[2]]
        self.assertEqual(len(set(epoch1)), 1000)
        self.assertEqual(self.code(c.stream_indices, "j", 0, epoch=0)[0], C.FAILED_PRECONDITION)

    def test_concurrent_reports_group_commit(self):
        from sluice.v1 import feed_pb2
        c = self.c
        c.create_dataset("ds", 64 * 10)
        c.create_job("g", "ds", 64, shuffle="none")

        def wave(positions, epoch=0):
            futs = [c.epochs.ReportProgress.future(feed_pb2.ReportProgressRequest(
                job="g", rank=r, epoch=epoch, position=p), timeout=30)
                for r, p in enumerate(positions)]
            return [f.result() for f in futs]

        wave([5] * 64)
        self.assertEqual([r.position for r in c.get_epoch("g").ranks], [5] * 64)
        # Two reports of one rank in flight together: the higher one wins, in memory and on disk.
        futs = [c.epochs.ReportProgress.future(feed_pb2.ReportProgressRequest(
            job="g", rank=0, epoch=0, position=p), timeout=30) for p in (9, 7, 8)]
        [f.result() for f in futs]
        self.assertEqual(c.get_epoch("g").ranks[0].position, 9)
        out = wave([10] * 64)
        self.assertEqual(sum(r.advanced for r in out), 1)
        self.assertEqual({r.epoch for r in out} - {0}, {1})
        self.assertEqual(c.get_epoch("g").epoch, 1)
        wave([3] * 32, epoch=1)
        self.restart()
        st = self.c.get_epoch("g")
        self.assertEqual((st.epoch, [r.position for r in st.ranks]), (1, [3] * 32 + [0] * 32))

    def test_manual_advance_and_cli(self):
        c = self.c
        c.create_dataset("ds", 10)
        c.create_job("m", "ds", 2, shuffle="none", manual_advance=True)
        for r in range(2):
            c.report_progress("m", r, 0, 5)
        st = c.get_epoch("m")
        self.assertTrue(st.complete)
        self.assertEqual(st.epoch, 0)
        r = cli("epoch", "next", "m", "--expect", "0", "--json", addr=self.d.addr)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["epoch"], 1)
        r = cli("epoch", "next", "m", "--expect", "0", addr=self.d.addr)
        self.assertEqual(r.returncode, 1)
        self.assertIn("FAILED_PRECONDITION", r.stderr)
        r = cli("indices", "--job", "m", "--rank", "1", "--json", addr=self.d.addr)
        self.assertEqual(json.loads(r.stdout),
                         {"epoch": 1, "start": 0, "share_count": 5, "indices": [1, 3, 5, 7, 9]})
        r = cli("indices", "--job", "m", "--rank", "0", "--count", "2", "--report",
                addr=self.d.addr)
        self.assertEqual(r.stdout.split(), ["0", "2"])
        r = cli("epoch", "show", "m", "--json", addr=self.d.addr)
        e = json.loads(r.stdout)
        self.assertEqual([x["position"] for x in e["ranks"]], [2, 0])
        r = cli("indices", "--job", "m", "--rank", "0", addr=self.d.addr)
        self.assertEqual(r.stdout.split(), ["4", "6", "8"])
        r = cli("indices", "--job", "m", "--rank", "7", addr=self.d.addr)
        self.assertEqual(r.returncode, 1)
        self.assertIn("rank 7 out of range", r.stderr)
        r = cli("job", "ls", "--json", addr=self.d.addr)
        self.assertEqual([j["name"] for j in json.loads(r.stdout)], ["m"])
        r = cli("job", "show", "m", addr=self.d.addr)
        self.assertIn("manual advance", r.stdout)
        r = cli("dataset", "show", "ds", "--json", addr=self.d.addr)
        self.assertEqual(json.loads(r.stdout)["jobs"], 1)
        r = cli("job", "rm", "m", addr=self.d.addr)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = cli("dataset", "rm", "ds", addr=self.d.addr)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = cli("job", "create", "x", "--world-size", "2", addr=self.d.addr)
        self.assertEqual(r.returncode, 2)

    def test_restart_mid_epoch_keeps_jobs_epochs_progress(self):
        c = self.c
        c.create_dataset("ds", 100)
        c.create_job("j", "ds", 2, shuffle="torch", seed=3, drop_last=True)
        for r in range(2):
            c.report_progress("j", r, 0, 50)
        self.assertEqual(c.get_epoch("j").epoch, 1)
        full = share(c, "j", 0)[2]
        c.report_progress("j", 0, 1, 20)
        # A stream open across the restart ends with UNAVAILABLE; the next one continues.
        stream = c.stream_indices("j", 1, max_chunk=1)
        next(iter(stream))
        self.restart()
        with self.assertRaises(grpc.RpcError):
            list(stream)
        c = self.c
        job = c.get_job("j")
        self.assertEqual((job.epoch, job.world_size, job.shuffle), (1, 2, "torch"))
        self.assertEqual([r.position for r in c.get_epoch("j").ranks], [20, 0])
        ep, start, rest = share(c, "j", 0)
        self.assertEqual((ep, start, rest), (1, 20, full[20:]))

    def test_sigkill_trainer_resumes_after_reported(self):
        c = self.c
        c.create_dataset("ds", 400)
        c.create_job("j", "ds", 1, shuffle="feistel", seed=1, drop_last=True)
        out = tempfile.NamedTemporaryFile(prefix="trainer-", delete=False).name
        env = dict(os.environ, SLUICE_ADDR=self.d.addr)
        cmd = [sys.executable, os.path.join(HERE, "feed_trainer.py"), "j", "0", out]
        p = subprocess.Popen(cmd, env=env)
        # Wait until it reported some progress, then kill it hard.
        deadline = time.monotonic() + 20
        while c.get_epoch("j").ranks[0].position < 100 and time.monotonic() < deadline:
            time.sleep(0.02)
        p.send_signal(signal.SIGKILL)
        p.wait()
        # A report the trainer sent just before it died is still recorded (the daemon got it):
        # the position counts once it stopped moving.
        reported = c.get_epoch("j").ranks[0].position
        for _ in range(20):
            time.sleep(0.3)
            now = c.get_epoch("j").ranks[0].position
            if now == reported:
                break
            reported = now
        self.assertGreater(reported, 0)
        self.assertLess(reported, 400)
        with open(out) as f:
            first = [json.loads(l) for l in f if l.endswith("\n")]
        consumed_before = [i for rec in first for i in rec["indices"]]
        # Restart: it resumes right after the last reported position.
        os.unlink(out)
        subprocess.run(cmd + ["--no-delay"], env=env, check=True, timeout=60)
        with open(out) as f:
            second = [json.loads(l) for l in f]
        self.assertEqual(second[0]["start"], reported)
        after = [i for rec in second for i in rec["indices"]]
        whole = share(c, "j", 0, epoch=1)  # next epoch began; the full epoch-0 order:
        self.assertEqual(whole[0], 1)
        self.assertEqual(c.get_job("j").epoch, 1)
        # Nothing reported is served again, nothing is lost.
        self.assertEqual(len(after), 400 - reported)
        self.assertEqual(sorted(consumed_before[:reported] + after), list(range(400)))

    def test_resize_mid_epoch_exactly_once(self):
        c = self.c
        c.create_dataset("ds", 100000)
        c.create_job("j", "ds", 4, shuffle="feistel", seed=5, drop_last=True)
        consumed = []
        for r, k in zip(range(4), (10, 100, 0, 250)):
            ep, start, idx = share(c, "j", r)
            consumed += idx[:k]
            if k:
                c.report_progress("j", r, 0, k)
        # A stream of the old world ends when the job is resized.
        # A small flow-control window keeps the old stream from finishing before the resize.
        slow = Client(self.d.addr)
        slow.channel.close()
        slow.channel = grpc.insecure_channel(self.d.addr, options=[
            ("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)])
        from sluice.v1 import feed_pb2_grpc
        slow.feed = feed_pb2_grpc.FeedStub(slow.channel)
        old = slow.stream_indices("j", 0, max_chunk=1)
        next(iter(old))
        job = c.resize_job("j", 3)
        self.assertTrue(job.resized_in_epoch)
        with self.assertRaises(grpc.RpcError) as e:
            list(old)
        self.assertEqual(e.exception.code(), C.ABORTED)
        slow.close()
        self.assertEqual(self.code(c.stream_indices, "j", 3)[0], C.INVALID_ARGUMENT)
        # Resizing again after progress in the elastic epoch is refused.
        self.restart()
        c = self.c
        self.assertTrue(c.get_job("j").resized_in_epoch)
        rest = []
        for r in range(3):
            ep, start, idx = share(c, "j", r)
            self.assertEqual((ep, start), (0, 0))
            rest += idx
        # Every rank gets the same count (issue 25: equal steps for DDP); with drop_last the
        # rest is cut to a multiple of the new world, and what was cut is stated (left_out).
        self.assert_once_but_left_out(c, consumed + rest, 100000, 3)
        # Resizing again after progress on the elastic shares chains (issue 17): the rest of
        # the rest is redistributed, exactly.
        ep, start, idx = share(c, "j", 0)
        consumed += idx[:1]
        c.report_progress("j", 0, 0, 1)
        job = c.resize_job("j", 2)
        self.assertTrue(job.resized_in_epoch)
        rest = [i for r in range(2) for i in share(c, "j", r)[2]]
        self.assert_once_but_left_out(c, consumed + rest, 100000, 3 + 2)
        for r in range(2):
            resp = c.report_progress("j", r, 0, c.get_epoch("j").ranks[r].count)
        self.assertTrue(resp.advanced)
        job = c.get_job("j")
        self.assertEqual((job.epoch, job.world_size, job.resized_in_epoch), (1, 2, False))
        allidx = [i for r in range(2) for i in share(c, "j", r)[2]]
        self.assertEqual(len(allidx), 100000)
        self.assertEqual(len(set(allidx)), 100000)

    def assert_once_but_left_out(self, c, seen, n, bound, job="j"):
        """`seen` holds no index twice, and with the job's stated left_out covers all n (fewer
        than `bound` left out: each resize cuts less than its new world)."""
        left = c.get_epoch(job).left_out
        self.assertEqual(len(set(seen)), len(seen))
        self.assertTrue(set(seen) <= set(range(n)))
        self.assertEqual(len(seen) + left, n)
        self.assertLess(left, bound)

    def test_batches(self):
        c = self.c
        import random
        rnd = random.Random(4)
        lengths = [rnd.randint(1, 200) for _ in range(500)]
        c.create_dataset("tok", 500)
        code, _ = self.code(c.stream_batches, "x", 0)
        self.assertEqual(code, C.NOT_FOUND)
        c.create_job("b", "tok", 4, seed=2, batching=dict(strategy="dynamic", max_batch_size=16,
                                                         max_seq_len=256, max_tokens=1024))
        code, msg = self.code(c.stream_batches, "b", 0)
        self.assertEqual(code, C.FAILED_PRECONDITION)
        self.assertIn("no lengths", msg)
        self.assertEqual(self.code(c.stream_indices, "b", 0)[0], C.FAILED_PRECONDITION)
        # Before the plan exists a report is bounded by the sample count.
        self.assertEqual(self.code(c.report_progress, "b", 0, 0, 2**64 - 1)[0],
                         C.INVALID_ARGUMENT)
        self.assertEqual(c.get_epoch("b").ranks[0].count, 0)  # no lengths: no plan yet
        c.upload_lengths("tok", lengths)
        # Epochs.Get waits for the plan: the counts are known before any rank streams.
        before = c.get_epoch("b")
        self.assertGreater(before.ranks[0].count, 0)
        per_rank = []
        for r in range(4):
            bs = [b for ch in c.stream_batches("b", r) for b in ch.batches]
            per_rank.append(bs)
            for b in bs:
                self.assertLessEqual(len(b.indices) * max(lengths[i] for i in b.indices), 1024)
                self.assertEqual(b.max_len, max(lengths[i] for i in b.indices))
        self.assertEqual(len({len(bs) for bs in per_rank}), 1)
        seen = [i for bs in per_rank for b in bs for i in b.indices]
        self.assertEqual(len(seen), len(set(seen)))
        st = c.get_epoch("b")
        self.assertEqual(st.unit, "batches")
        self.assertEqual(st.ranks[0].count, len(per_rank[0]))
        self.assertEqual(before.ranks[0].count, len(per_rank[0]))
        # Resume by step, CLI output.
        c.report_progress("b", 1, 0, 2)
        rest = [b for ch in c.stream_batches("b", 1) for b in ch.batches]
        self.assertEqual([b.step for b in rest][:1], [2])
        self.assertEqual([list(b.indices) for b in rest], [list(b.indices) for b in per_rank[1][2:]])
        r = cli("batches", "--job", "b", "--rank", "0", "--json", "--count", "2", addr=self.d.addr)
        lines = [json.loads(l) for l in r.stdout.splitlines()]
        self.assertEqual([l["indices"] for l in lines], [list(b.indices) for b in per_rank[0][:2]])
        # Every rank done: the next epoch's plan differs.
        for r in range(4):
            resp = c.report_progress("b", r, 0, len(per_rank[0]))
        self.assertTrue(resp.advanced)
        nxt = [b for ch in c.stream_batches("b", 0) for b in ch.batches]
        self.assertEqual(len(nxt), len(per_rank[0]))
        self.assertNotEqual([list(b.indices) for b in nxt], [list(b.indices) for b in per_rank[0]])

    def test_empty_shares_advance_when_every_rank_reported(self):
        # 1 sample, 3 ranks, drop_last: every share is empty. The epoch is done only when every
        # rank reported its empty share (so the epochs advance in step with the ranks), and the
        # reports survive a restart.
        c = self.c
        c.create_dataset("one", 1)
        c.create_job("e", "one", 3, shuffle="none", drop_last=True)
        st = c.get_epoch("e")
        self.assertEqual([r.count for r in st.ranks], [0, 0, 0])
        self.assertFalse(st.complete)
        self.assertEqual([(ch.epoch, list(ch.indices), ch.share_count)
                          for ch in c.stream_indices("e", 1)], [(0, [], 0)])
        self.assertFalse(c.report_progress("e", 0, 0, 0).advanced)
        self.assertEqual([r.done for r in c.get_epoch("e").ranks], [True, False, False])
        self.restart()
        c = self.c
        self.assertEqual([r.done for r in c.get_epoch("e").ranks], [True, False, False])
        self.assertFalse(c.report_progress("e", 1, 0, 0).advanced)
        resp = c.report_progress("e", 2, 0, 0)
        self.assertTrue(resp.advanced)
        self.assertEqual(resp.epoch, 1)
        self.assertFalse(c.get_epoch("e").complete)

    def test_reports_are_idempotent(self):
        # The report that completed an epoch, sent again (its answer was lost), is answered OK
        # with the current epoch and changes nothing; a future epoch is still refused.
        c = self.c
        c.create_dataset("ds", 10)
        c.create_job("j", "ds", 2, shuffle="none")
        c.report_progress("j", 0, 0, 5)
        self.assertTrue(c.report_progress("j", 1, 0, 5).advanced)
        again = c.report_progress("j", 1, 0, 5)
        self.assertEqual((again.epoch, again.advanced), (1, False))
        self.assertEqual([r.position for r in c.get_epoch("j").ranks], [0, 0])
        code, msg = self.code(c.report_progress, "j", 0, 2, 1)
        self.assertEqual(code, C.FAILED_PRECONDITION)
        self.assertIn("epoch 2", msg)

    def test_group_position_resumes_every_rank_at_the_lowest(self):
        c = self.c
        c.create_dataset("ds", 100)
        c.create_job("g", "ds", 2, shuffle="feistel", seed=3)
        full = [share(c, "g", r)[2] for r in range(2)]
        c.report_progress("g", 0, 0, 30)
        c.report_progress("g", 1, 0, 20)
        self.assertEqual(c.get_epoch("g").group_position, 20)
        for r in range(2):
            epoch, start, idx = share(c, "g", r, group_position=True)
            self.assertEqual((epoch, start, idx), (0, 20, full[r][20:]))
        self.assertEqual(share(c, "g", 0)[1], 30)  # own position without the flag
        self.assertEqual(share(c, "g", 0, group_position=True, position=40)[1], 40)
        bq = c.stream_batches("g", 0, group_position=True)
        self.assertEqual(self.code(list, bq)[0], C.FAILED_PRECONDITION)

    def test_mesh_ranks_share_dp_streams(self):
        c = self.c
        c.create_dataset("ds", 100)
        job = c.create_job("mj", "ds", 8, shuffle="feistel", seed=9,
                           mesh=dict(dp=2, tp=2, cp=2, pp=1))
        self.assertEqual(job.dp_size, 2)
        streams = [share(c, "mj", r)[2] for r in range(8)]
        # Default order pp,dp,cp,tp: ranks 0-3 are dp 0, ranks 4-7 dp 1.
        for r in range(8):
            self.assertEqual(streams[r], streams[0 if r < 4 else 4])
        self.assertEqual(sorted(streams[0] + streams[4]), list(range(100)))
        c.report_progress("mj", 1, 0, 10)
        self.assertEqual([x.position for x in c.get_epoch("mj").ranks], [10, 0])
        self.assertEqual(share(c, "mj", 3)[2], streams[0][10:])
        # torch mode: one permutation per dp rank, built once on the worker pool and shared by
        # the streams of its tp/cp replicas (opened together here).
        c.create_job("mt", "ds", 8, shuffle="torch", seed=2, mesh=dict(dp=2, tp=2, cp=2, pp=1))
        opened = [c.stream_indices("mt", r, max_chunk=7) for r in range(8)]
        tstreams = [[i for ch in st for i in ch.indices] for st in opened]
        for r in range(8):
            self.assertEqual(tstreams[r], tstreams[0 if r < 4 else 4])
        self.assertEqual(sorted(tstreams[0] + tstreams[4]), list(range(100)))
        self.assertNotEqual(tstreams[0], streams[0])
        code, msg = self.code(c.resize_job, "mj", 4)
        self.assertEqual(code, C.INVALID_ARGUMENT)
        job = c.resize_job("mj", 4, mesh=dict(dp=4, tp=1, cp=1, pp=1))
        self.assertEqual((job.world_size, job.dp_size, job.resized_in_epoch), (4, 4, True))
        rest = [i for r in range(4) for i in share(c, "mj", r)[2]]
        # Without drop_last the 90 left are padded to 4 x 23 by wrapping around (torch's rule).
        self.assertEqual(len(rest), 92)
        self.assertEqual(set(streams[0][:10] + rest), set(range(100)))
        self.assertEqual(len(set(rest)), 90)

    def test_cli_lengths_and_resize(self):
        tmp = tempfile.mkdtemp(prefix="sluice-cli-")
        text = os.path.join(tmp, "len.txt")
        with open(text, "w") as f:
            f.write("".join("%d\n" % (i + 1) for i in range(6)))
        raw = os.path.join(tmp, "len.u32")
        import struct
        with open(raw, "wb") as f:
            f.write(struct.pack("<6I", 6, 5, 4, 3, 2, 1))
        a = self.d.addr
        self.assertEqual(cli("dataset", "create", "cl", "--samples", "6", addr=a).returncode, 0)
        r = cli("dataset", "lengths", "cl", "--file", text, "--json", addr=a)
        self.assertEqual(r.returncode, 0, r.stderr)
        d1 = json.loads(r.stdout)
        self.assertTrue(d1["has_lengths"])
        r = cli("dataset", "lengths", "cl", "--file", raw, "--format", "u32", "--json", addr=a)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotEqual(json.loads(r.stdout)["lengths_sha256"], d1["lengths_sha256"])
        with open(text, "a") as f:
            f.write("7\n")
        r = cli("dataset", "lengths", "cl", "--file", text, addr=a)
        self.assertEqual(r.returncode, 1)
        self.assertIn("INVALID_ARGUMENT", r.stderr)
        r = cli("dataset", "ls", "--json", addr=a)
        self.assertEqual([x["name"] for x in json.loads(r.stdout)], ["cl"])
        r = cli("job", "create", "cj", "--dataset", "cl", "--world-size", "2", "--shuffle", "none",
                "--drop-last", "--json", addr=a)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["shuffle"], "none")
        r = cli("indices", "--job", "cj", "--rank", "0", "--count", "1", "--report", addr=a)
        self.assertEqual(r.stdout.split(), ["0"])
        r = cli("job", "resize", "cj", "--world-size", "3", "--json", addr=a)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(json.loads(r.stdout)["resized_in_epoch"])
        got = []
        for rank in range(3):
            r = cli("indices", "--job", "cj", "--rank", str(rank), addr=a)
            got += [int(x) for x in r.stdout.split()]
        # 5 left for 3 ranks with drop_last: one each, the other 2 stated as left out.
        self.assertEqual(len(got), 3)
        self.assert_once_but_left_out(self.c, [0] + got, 6, 3, job="cj")
        r = cli("job", "create", "cb", "--dataset", "cl", "--world-size", "1",
                "--max-batch-size", "2", "--max-seq-len", "8", addr=a)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = cli("batches", "--job", "cb", "--rank", "0", addr=a)
        self.assertEqual(sorted(int(x) for x in r.stdout.split()), list(range(6)))
        self.assertEqual(cli("dataset", "--help").returncode, 0)
        self.assertEqual(cli("job", "frobnicate", "x", addr=a).returncode, 2)

    def test_batch_stream_survives_next_while_planning(self):
        c = self.c
        n = 1 << 21
        c.create_dataset("big", n)
        c.upload_lengths("big", [1 + (i * 7919) % 500 for i in range(n)], per_message=1 << 20)
        c.create_job("bn", "big", 2, manual_advance=True,
                     batching=dict(max_batch_size=64, max_seq_len=512))
        from sluice.v1 import feed_pb2
        req = c.feed.StreamBatches(feed_pb2.StreamBatchesRequest(job="bn", rank=0,
                                                                 max_batches=1024), timeout=60)
        c.next_epoch("bn")  # most likely while epoch 0's plan is being computed
        chunks = list(req)
        got = [b.step for ch in chunks for b in ch.batches]
        # Most likely the stream began in epoch 0: then either the whole old share (the plan won
        # the race) or nothing left of it. The two calls are two HTTP/2 streams, so the daemon
        # may also take Next first: then the stream is epoch 1's. One epoch, never a hang.
        epochs = {ch.epoch for ch in chunks}
        self.assertEqual(len(epochs), 1, epochs)
        self.assertIn(epochs.pop(), (0, 1))
        self.assertIn(len(got), (0, chunks[0].batches_per_rank))
        self.assertEqual(c.get_epoch("bn").epoch, 1)

    def test_shutdown_ends_waiting_stream(self):
        c = self.c
        c.create_dataset("ds", 10)
        c.create_job("j", "ds", 2)
        stream = c.stream_indices("j", 0, epoch=1)
        time.sleep(0.2)
        self.d.signal(signal.SIGTERM)
        with self.assertRaises(grpc.RpcError) as e:
            list(stream)
        self.assertEqual(e.exception.code(), C.UNAVAILABLE)


if __name__ == "__main__":
    unittest.main()
