"""Integration tests of sluice.v1.Checkpoints: the real daemon on 127.0.0.1 (port 0, temporary
data dir), a Python grpcio client and the `sluice ckpt` CLI."""
import copy
import glob
import hashlib
import io
import json
import math
import os
import re
import signal
import struct
import sys
import tempfile
import threading
import time
import unittest
from collections import OrderedDict

import grpc

from sluice.v1 import checkpoint_pb2 as pb
from sluice.v1 import checkpoint_pb2_grpc as pbg
from sltest import STORE, Daemon, cli

HEADER = 88
MiB = 1 << 20


def held(n):
    """The data bytes a partial upload that received n bytes keeps for a resume: all of them in a
    directory; in object storage only whole parts (8 MiB, the header included), so none of the
    shorter prefixes these tests send (test_s3store.py resumes multipart uploads)."""
    if STORE == "s3":
        assert n + HEADER < 8 * MiB, n
        return 0
    return n


def shard_bytes(rank, size):
    """Deterministic, rank-specific data."""
    seed = hashlib.sha256(b"rank-%d" % rank).digest()
    reps = size // len(seed) + 1
    return (seed * reps)[:size]


def upload_requests(job, name, rank, data, chunk=MiB, sha=None, offset=0, tensors=None,
                    data_size=None):
    if tensors is None:
        tensors = [pb.TensorInfo(name="w", dtype="uint8", shape=[len(data)], offset=0,
                                 size=len(data))]
    yield pb.UploadShardRequest(header=pb.ShardHeader(
        job=job, checkpoint=name, rank=rank, tensors=tensors,
        data_size=len(data) if data_size is None else data_size, sha256=sha or "",
        offset=offset))
    for i in range(offset, len(data), chunk):
        yield pb.UploadShardRequest(chunk=data[i:i + chunk])



class _Pickled:
    """An object the state format has no encoding for (pickled with allow_pickle)."""

    def __init__(self, a, b):
        self.a, self.b = a, b

class CheckpointTest(unittest.TestCase):
    daemon_args = ()

    def setUp(self):
        self.d = Daemon(args=self.daemon_args).start()
        self.channel = grpc.insecure_channel(self.d.addr, options=[
            ("grpc.max_receive_message_length", 64 * MiB)])
        self.stub = pbg.CheckpointsStub(self.channel)

    def tearDown(self):
        self.channel.close()
        rc = self.d.stop()
        reports = self.d.sanitizer_reports()
        log = self.d.log()
        self.d.cleanup()
        self.assertEqual(rc, 0, "sluiced exit code\n" + log)
        self.assertEqual(reports, [], "sanitizer reports\n" + log)

    # -- helpers --

    def begin(self, job="job1", name="", step=0, world=1, md=""):
        return self.stub.Begin(pb.BeginRequest(job=job, name=name, step=step, world_size=world,
                                               user_metadata=md), timeout=10)

    def upload(self, job, name, rank, data, **kw):
        return self.stub.UploadShard(upload_requests(job, name, rank, data, **kw), timeout=60)

    def code_of(self, fn, *args, **kw):
        with self.assertRaises(grpc.RpcError) as e:
            fn(*args, **kw)
        return e.exception.code(), e.exception.details()

    def download(self, job, name, rank, offset=0):
        out, sha = bytearray(), None
        for m in self.stub.DownloadShard(pb.DownloadShardRequest(job=job, name=name, rank=rank,
                                                                 offset=offset), timeout=60):
            self.assertEqual(m.offset, offset + len(out))
            out += m.data
            if m.sha256:
                sha = m.sha256
        return bytes(out), sha

    @staticmethod
    def shard_file(name, rank):
        return "%s_shard_%d.shard" % (name, rank)

    def wait_gone(self, job, file, timeout=10):
        """A removal is done at once in a directory, on a worker after the catalog's change with
        object storage: wait (bounded) for the file to go."""
        deadline = time.time() + timeout
        while self.d.store_exists(job, file) and time.time() < deadline:
            time.sleep(0.05)
        self.assertFalse(self.d.store_exists(job, file), file)

    def dot_files(self, job):
        """Temp files and partial uploads of `job` left in the store."""
        return [f for f in self.d.store_files(job) if f.startswith(".")]

    def verify(self, job, name, deep):
        return self.stub.Verify(pb.VerifyRequest(job=job, name=name,
                                                 mode=pb.DEEP if deep else pb.QUICK), timeout=60)

    def full_checkpoint(self, job="job1", name="ck", world=8, size=MiB + 123, parallel=True):
        self.begin(job=job, name=name, world=world)
        datas = [shard_bytes(r, size + r) for r in range(world)]
        receipts = [None] * world
        errors = []

        def run(r):
            try:
                receipts[r] = self.upload(job, name, r, datas[r], chunk=256 * 1024)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
        threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
        for t in threads:
            t.start()
            if not parallel:
                t.join()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        for r in range(world):
            self.assertEqual(receipts[r].sha256, hashlib.sha256(datas[r]).hexdigest())
            self.assertEqual(receipts[r].data_size, len(datas[r]))
            self.assertEqual(receipts[r].file_size, len(datas[r]) + HEADER)
        ck = self.stub.Commit(pb.CheckpointRef(job=job, name=name), timeout=10)
        self.assertEqual(ck.state, pb.COMPLETE)
        return datas

    # -- tests --

    def test_parallel_upload_commit_verify_download(self):
        datas = self.full_checkpoint()
        v = self.verify("job1", "ck", deep=True)
        self.assertTrue(v.ok, v)
        self.assertEqual([s.verdict for s in v.shards], [pb.OK] * 8)
        self.assertEqual(v.metadata, pb.OK)
        for r in (0, 7):
            data, sha = self.download("job1", "ck", r)
            self.assertEqual(data, datas[r])
            self.assertEqual(sha, hashlib.sha256(datas[r]).hexdigest())
        # Resume a download from an offset.
        data, _ = self.download("job1", "ck", 3, offset=1000)
        self.assertEqual(data, datas[3][1000:])
        # The file layout of DESIGN.md.
        raw = self.d.store_read("job1", self.shard_file("ck", 5))
        magic, rank, clen = struct.unpack_from("<Iii", raw, 0)
        self.assertEqual((magic, rank, clen), (0x53484152, 5, 64))
        self.assertEqual(raw[12:76].decode(), hashlib.sha256(datas[5]).hexdigest())
        count, dlen = struct.unpack_from("<iq", raw, 76)
        self.assertEqual((count, dlen), (1, len(datas[5])))
        self.assertEqual(raw[HEADER:], datas[5])
        meta = json.loads(self.d.store_read("job1", "ck.metadata.json"))
        self.assertEqual(meta["world_size"], 8)
        self.assertEqual([s["rank"] for s in meta["shards"]], list(range(8)))
        self.assertEqual(meta["shards"][2]["sha256"], hashlib.sha256(datas[2]).hexdigest())
        self.assertEqual(meta["shards"][2]["tensors"][0]["name"], "w")
        # Get, List, Latest.
        g = self.stub.Get(pb.CheckpointRef(job="job1", name="ck"), timeout=10)
        self.assertEqual(len(g.shards), 8)
        self.assertEqual(g.shards[4].path, "checkpoints/job1/ck_shard_4.shard")
        self.assertEqual(g.total_bytes, sum(len(d) for d in datas))
        self.assertEqual(self.stub.Latest(pb.LatestRequest(job="job1"), timeout=10).name, "ck")
        lst = self.stub.List(pb.ListRequest(job="job1"), timeout=10)
        self.assertEqual([c.name for c in lst.checkpoints], ["ck"])
        # No temp file is left.
        self.assertEqual(self.dot_files("job1"), [])

    def test_corruption_detected(self):
        self.full_checkpoint(world=4, size=300 * 1024)
        # Flip one data byte of rank 1: deep names exactly rank 1, quick passes.
        self.d.store_flip("job1", self.shard_file("ck", 1), HEADER + 1000)
        self.assertTrue(self.verify("job1", "ck", deep=False).ok)
        v = self.verify("job1", "ck", deep=True)
        self.assertFalse(v.ok)
        self.assertEqual([s.verdict for s in v.shards],
                         [pb.OK, pb.CHECKSUM_MISMATCH, pb.OK, pb.OK])
        code, _ = self.code_of(lambda: self.download("job1", "ck", 1))
        self.assertEqual(code, grpc.StatusCode.DATA_LOSS)
        # Truncate rank 2: quick flags its size.
        self.d.store_truncate("job1", self.shard_file("ck", 2), HEADER + 10)
        v = self.verify("job1", "ck", deep=False)
        self.assertEqual(v.shards[2].verdict, pb.SIZE_MISMATCH)
        self.assertIn("catalog", v.shards[2].detail)
        # Delete rank 3: missing.
        self.d.store_remove("job1", self.shard_file("ck", 3))
        v = self.verify("job1", "ck", deep=False)
        self.assertEqual([s.verdict for s in v.shards],
                         [pb.OK, pb.OK, pb.SIZE_MISMATCH, pb.MISSING])
        # A damaged header.
        self.d.store_patch("job1", self.shard_file("ck", 0), 4, struct.pack("<i", 9))
        self.assertEqual(self.verify("job1", "ck", deep=False).shards[0].verdict,
                         pb.HEADER_CORRUPT)
        # The metadata file.
        self.d.store_append("job1", "ck.metadata.json", b" ")
        self.assertNotEqual(self.verify("job1", "ck", deep=False).metadata, pb.OK)

    def test_lifecycle(self):
        ck = self.begin(step=100, world=2, md='{"lr": 0.1}')
        self.assertEqual((ck.name, ck.state, ck.step), ("step_100", pb.WRITING, 100))
        # Idempotent Begin; another world size is refused.
        self.assertEqual(self.begin(step=100, world=2).name, "step_100")
        code, msg = self.code_of(self.begin, step=100, world=3)
        self.assertEqual(code, grpc.StatusCode.ALREADY_EXISTS)
        self.assertIn("world_size 2", msg)
        code, msg = self.code_of(self.begin, name="step_100", step=101, world=2)
        self.assertEqual(code, grpc.StatusCode.ALREADY_EXISTS)
        # Commit with missing ranks names them.
        self.upload("job1", "step_100", 1, b"abc")
        code, msg = self.code_of(self.stub.Commit, pb.CheckpointRef(job="job1", name="step_100"))
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("0", msg)
        # Re-upload into WRITING replaces the shard.
        self.upload("job1", "step_100", 1, b"abcd")
        self.upload("job1", "step_100", 0, b"")
        g = self.stub.Get(pb.CheckpointRef(job="job1", name="step_100"))
        self.assertEqual([s.data_size for s in g.shards], [0, 4])
        ck = self.stub.Commit(pb.CheckpointRef(job="job1", name="step_100"))
        self.assertEqual(ck.state, pb.COMPLETE)
        self.assertEqual(ck.user_metadata, '{"lr": 0.1}')
        # Commit again is idempotent; uploads into COMPLETE fail.
        self.assertEqual(self.stub.Commit(pb.CheckpointRef(job="job1", name="step_100")).state,
                         pb.COMPLETE)
        code, _ = self.code_of(self.upload, "job1", "step_100", 1, b"zz")
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION)
        code, _ = self.code_of(self.stub.Abort, pb.CheckpointRef(job="job1", name="step_100"))
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual(self.verify("job1", "step_100", deep=True).ok, True)
        # Abort a WRITING checkpoint: INCOMPLETE, files gone.
        self.begin(step=200, world=2)
        self.upload("job1", "step_200", 0, b"x" * 5000)
        self.assertTrue(self.d.store_exists("job1", self.shard_file("step_200", 0)))
        ck = self.stub.Abort(pb.CheckpointRef(job="job1", name="step_200"))
        self.assertEqual(ck.state, pb.INCOMPLETE)
        self.wait_gone("job1", self.shard_file("step_200", 0))
        self.assertEqual(self.stub.Latest(pb.LatestRequest(job="job1")).name, "step_100")
        lst = self.stub.List(pb.ListRequest(job="job1", state=pb.INCOMPLETE))
        self.assertEqual([c.name for c in lst.checkpoints], ["step_200"])
        # Delete.
        code, _ = self.code_of(self.stub.Latest, pb.LatestRequest(job="nojob"))
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)
        self.stub.Delete(pb.CheckpointRef(job="job1", name="step_100"))
        self.wait_gone("job1", self.shard_file("step_100", 0))
        code, _ = self.code_of(self.stub.Get, pb.CheckpointRef(job="job1", name="step_100"))
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)

    def test_client_checksum_and_sizes(self):
        self.begin(name="c", world=1)
        data = shard_bytes(0, 10000)
        code, msg = self.code_of(self.upload, "job1", "c", 0, data, sha="0" * 64)
        self.assertEqual(code, grpc.StatusCode.DATA_LOSS)
        self.assertIn(hashlib.sha256(data).hexdigest(), msg)
        r = self.upload("job1", "c", 0, data, sha=hashlib.sha256(data).hexdigest())
        self.assertEqual(r.sha256, hashlib.sha256(data).hexdigest())
        # Short and long streams.
        code, msg = self.code_of(self.upload, "job1", "c", 0, data, data_size=20000,
                                 tensors=[])
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("10000 of 20000", msg)
        # A short stream keeps its prefix for a resume.
        st = self.stub.UploadStatus(pb.UploadStatusRequest(job="job1", checkpoint="c", rank=0))
        self.assertEqual((st.held_bytes, st.stored), (held(10000), True))
        code, _ = self.code_of(self.upload, "job1", "c", 0, data, data_size=100, tensors=[])
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        # The stored shard is untouched by the failed attempts.
        self.assertEqual(self.download("job1", "c", 0)[0], data)
        self.assertEqual(self.dot_files("job1"), [])

    def test_hostile_input(self):
        INVALID = grpc.StatusCode.INVALID_ARGUMENT
        for job in ["", "..", "../etc", "a/b", ".hidden", "x" * 129, "a b", "é"]:
            code, _ = self.code_of(self.begin, job=job, name="n", world=1)
            self.assertEqual(code, INVALID, job)
        for name in ["..", "a/../b", "/abs", ".x", "x" * 200, "a\nb"]:
            code, _ = self.code_of(self.begin, name=name, world=1)
            self.assertEqual(code, INVALID, name)
        for world in [0, -1, 65537]:
            code, _ = self.code_of(self.begin, name="w", world=world)
            self.assertEqual(code, INVALID, world)
        code, _ = self.code_of(self.begin, name="m", world=1, md="x" * 9000)
        self.assertEqual(code, INVALID)
        # Invalid UTF-8 in a string field (grpcio would refuse to send it: raw bytes).
        for bad in (b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"ok\xe2\x82"):
            raw = pb.BeginRequest(job="job1", name="u", world_size=1).SerializeToString()
            raw += b"\x2a" + bytes([len(bad)]) + bad  # field 5 (user_metadata), length-delimited
            call = self.channel.unary_unary("/sluice.v1.Checkpoints/Begin",
                                            request_serializer=None,
                                            response_deserializer=None)
            code, _ = self.code_of(call, raw, timeout=10)
            self.assertEqual(code, INVALID, bad)
        ck = self.begin(name="u8", world=1, md="größe ✓ 🚀")
        self.assertEqual(ck.user_metadata, "größe ✓ 🚀")
        self.begin(name="h", world=4)
        ok_t = [pb.TensorInfo(name="t", dtype="float32", shape=[2, 2], offset=0, size=16)]
        cases = [
            dict(rank=4), dict(rank=-1),
            dict(job="../x"), dict(name="h/../../x"),
            dict(data_size=(1 << 64) - 1),
            dict(sha="XYZ"), dict(offset=17),
            dict(tensors=[pb.TensorInfo(name="t", dtype="float32", shape=[4], offset=0, size=15)]),
            dict(tensors=[pb.TensorInfo(name="t", dtype="nope", shape=[4], offset=0, size=4)]),
            dict(tensors=[pb.TensorInfo(name="t", dtype="uint8", shape=[-1], offset=0, size=1)]),
            dict(tensors=[pb.TensorInfo(name="t", dtype="uint8", shape=[8], offset=10, size=8)]),
            dict(tensors=[pb.TensorInfo(name="t", dtype="uint8", shape=[1 << 62, 1 << 62],
                                        offset=0, size=0)]),
            dict(tensors=[pb.TensorInfo(name="", dtype="uint8", shape=[1], offset=0, size=1)]),
            dict(tensors=[pb.TensorInfo(name="a\x01", dtype="uint8", shape=[1], offset=0,
                                        size=1)]),
            dict(tensors=[pb.TensorInfo(name="a", dtype="uint8", shape=[8], offset=0, size=8),
                          pb.TensorInfo(name="b", dtype="uint8", shape=[8], offset=4, size=8)]),
            dict(tensors=[pb.TensorInfo(name="a", dtype="uint8", shape=[1] * 33, offset=0,
                                        size=1)]),
        ]
        for c in cases:
            job, name = c.pop("job", "job1"), c.pop("name", "h")
            rank = c.pop("rank", 0)
            kw = dict(tensors=ok_t)
            kw.update(c)
            code, msg = self.code_of(self.upload, job, name, rank, b"\0" * 16, **kw)
            self.assertEqual(code, INVALID, (c, msg))
        # Chunk first, two headers, oversized chunk.
        code, _ = self.code_of(self.stub.UploadShard, iter([pb.UploadShardRequest(chunk=b"x")]))
        self.assertEqual(code, INVALID)
        reqs = list(upload_requests("job1", "h", 0, b"\0" * 16, tensors=ok_t))
        code, _ = self.code_of(self.stub.UploadShard, iter([reqs[0], reqs[0]]))
        self.assertEqual(code, INVALID)
        code, _ = self.code_of(self.stub.UploadShard, iter([]))
        self.assertEqual(code, INVALID)
        big = shard_bytes(0, 5 * MiB)
        code, _ = self.code_of(self.upload, "job1", "h", 0, big, chunk=5 * MiB, tensors=[])
        self.assertEqual(code, INVALID)
        # Unknown checkpoint; bad rank for download; nothing was written.
        code, _ = self.code_of(self.upload, "job1", "nope", 0, b"x")
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)
        code, _ = self.code_of(lambda: self.download("job1", "h", 9))
        self.assertEqual(code, INVALID)
        code, _ = self.code_of(lambda: self.download("job1", "h", 1))
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)
        # A directory makes the job's directory at Begin; a bucket has no empty directories.
        self.assertEqual(self.d.store_jobs(), [] if self.d.store == "s3" else ["job1"])
        self.assertEqual(self.d.store_files("job1"), [])

    def test_retention(self):
        for step in (1, 2, 3):
            self.begin(step=step, world=1)
            self.upload("job1", "step_%d" % step, 0, b"s%d" % step)
            self.stub.Commit(pb.CheckpointRef(job="job1", name="step_%d" % step))
        self.begin(step=4, world=1)  # being written: never deleted
        r = self.stub.SetRetention(pb.SetRetentionRequest(job="job1", keep_last=2))
        self.assertEqual(list(r.deleted), ["step_1"])
        self.upload("job1", "step_4", 0, b"s4")
        self.stub.Commit(pb.CheckpointRef(job="job1", name="step_4"))
        names = [c.name for c in self.stub.List(pb.ListRequest(job="job1")).checkpoints]
        self.assertEqual(names, ["step_4", "step_3"])
        self.wait_gone("job1", self.shard_file("step_2", 0))

    def test_resume_upload(self):
        self.begin(name="r", world=1)
        data = shard_bytes(0, 3 * MiB + 7)
        sha = hashlib.sha256(data).hexdigest()
        # Send the header and 2 MiB, then cancel.
        gen = upload_requests("job1", "r", 0, data[:2 * MiB], chunk=MiB, data_size=len(data),
                              tensors=[], sha=sha)
        ev = threading.Event()

        def cut():
            yield from gen
            ev.wait(10)  # keep the stream open until we cancel it
        fut = self.stub.UploadShard.future(cut(), timeout=30)
        deadline = time.time() + 10
        st = None
        while time.time() < deadline:
            st = self.stub.UploadStatus(pb.UploadStatusRequest(job="job1", checkpoint="r", rank=0))
            if st.held_bytes == 2 * MiB:
                break
            time.sleep(0.05)
        self.assertEqual(st.held_bytes, 2 * MiB)
        self.assertTrue(st.in_progress)
        fut.cancel()
        ev.set()
        deadline = time.time() + 10
        while time.time() < deadline:
            st = self.stub.UploadStatus(pb.UploadStatusRequest(job="job1", checkpoint="r", rank=0))
            if not st.in_progress:
                break
            time.sleep(0.05)
        self.assertEqual((st.in_progress, st.held_bytes, st.stored),
                         (False, held(2 * MiB), False))
        # A wrong offset is refused and keeps the partial upload.
        code, _ = self.code_of(self.upload, "job1", "r", 0, data, offset=3 * MiB, tensors=[])
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION)
        # Resume after a restart: the server re-hashes the kept prefix.
        self.channel.close()
        self.assertEqual(self.d.stop(), 0)
        self.d.start()
        self.channel = grpc.insecure_channel(self.d.addr)
        self.stub = pbg.CheckpointsStub(self.channel)
        st = self.stub.UploadStatus(pb.UploadStatusRequest(job="job1", checkpoint="r", rank=0))
        self.assertEqual(st.held_bytes, held(2 * MiB))
        r = self.upload("job1", "r", 0, data, offset=st.held_bytes, tensors=[], sha=sha)
        self.assertEqual(r.sha256, sha)
        self.assertEqual(self.download("job1", "r", 0)[0], data)
        st = self.stub.UploadStatus(pb.UploadStatusRequest(job="job1", checkpoint="r", rank=0))
        self.assertEqual((st.stored, st.held_bytes, st.sha256), (True, 0, sha))

    def test_metadata_cap(self):
        # Tensor lists are capped at 64 MiB of metadata per checkpoint: ~7.7 MB per rank here, so
        # the ninth rank is refused and nothing of it is stored.
        self.begin(name="meta", world=10)
        tensors = [pb.TensorInfo(name="t%05d" % i + "x" * 1000, dtype="uint8", shape=[0],
                                 offset=0, size=0) for i in range(7000)]
        for rank in range(8):
            self.upload("job1", "meta", rank, b"", tensors=tensors)
        code, msg = self.code_of(self.upload, "job1", "meta", 8, b"", tensors=tensors)
        self.assertEqual(code, grpc.StatusCode.RESOURCE_EXHAUSTED, msg)
        self.assertIn("metadata", msg)
        self.assertEqual(self.stub.Get(pb.CheckpointRef(job="job1", name="meta")).shards_uploaded,
                         8)

    def test_abort_during_upload(self):
        self.begin(name="ab", world=2)
        ev = threading.Event()

        def slow():
            yield from upload_requests("job1", "ab", 0, b"x" * MiB, data_size=4 * MiB,
                                       tensors=[])
            ev.wait(10)
        fut = self.stub.UploadShard.future(slow(), timeout=30)
        deadline = time.time() + 10
        while time.time() < deadline:
            st = self.stub.UploadStatus(pb.UploadStatusRequest(job="job1", checkpoint="ab",
                                                               rank=0))
            if st.held_bytes == MiB:
                break
            time.sleep(0.02)
        self.assertEqual(self.stub.Abort(pb.CheckpointRef(job="job1", name="ab")).state,
                         pb.INCOMPLETE)
        with self.assertRaises(grpc.RpcError) as e:
            fut.result(timeout=10)
        ev.set()
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("aborted", e.exception.details())
        deadline = time.time() + 10
        while self.d.store_files("job1") and time.time() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.d.store_files("job1"), [])

    def test_restart_keeps_complete_and_sweeps_temp(self):
        self.full_checkpoint(world=2, size=1000)
        self.channel.close()
        self.assertEqual(self.d.stop(), 0)
        # Leftovers of a crash: a metadata temp file, a partial upload of an unknown checkpoint
        # and the files of a checkpoint the catalog does not know.
        for f in (".ck.metadata.json.tmp", ".zz_shard_0.shard.part", "gone_shard_0.shard",
                  "gone.metadata.json"):
            self.d.store_write("job1", f, b"junk")
        self.d.start()
        self.channel = grpc.insecure_channel(self.d.addr)
        self.stub = pbg.CheckpointsStub(self.channel)
        self.assertEqual(self.d.store_files("job1"),
                         ["ck.metadata.json", "ck_shard_0.shard", "ck_shard_1.shard"])
        self.assertTrue(self.verify("job1", "ck", deep=True).ok)


class CrashTest(unittest.TestCase):
    """SIGKILL the daemon during uploads and commits, many rounds: after each restart no COMPLETE
    checkpoint has a bad or missing shard, no temp file is left but resumable partial uploads,
    and the interrupted checkpoints can be finished by retrying."""

    ROUNDS = 8
    WORLD = 4
    SIZE = 3 * MiB + 11

    def test_sigkill_rounds(self):
        import random
        rnd = random.Random(6)
        with tempfile.TemporaryDirectory() as tmp:
            data_dir = os.path.join(tmp, "data")
            d = Daemon(data_dir=data_dir)
            datas = [shard_bytes(r, self.SIZE + r) for r in range(self.WORLD)]
            try:
                for rnd_i in range(self.ROUNDS):
                    d.start()
                    ch = grpc.insecure_channel(d.addr)
                    stub = pbg.CheckpointsStub(ch)
                    self.check_invariants(stub, d, datas)
                    name = "r%d" % rnd_i
                    stub.Begin(pb.BeginRequest(job="crash", name=name, world_size=self.WORLD),
                               timeout=10)

                    def work(stub=stub, name=name):
                        try:
                            for r in range(self.WORLD):
                                stub.UploadShard(upload_requests("crash", name, r, datas[r],
                                                                 chunk=256 * 1024), timeout=30)
                            stub.Commit(pb.CheckpointRef(job="crash", name=name), timeout=30)
                        except grpc.RpcError:
                            pass
                    threads = [threading.Thread(target=work) for _ in range(2)]
                    for t in threads:
                        t.start()
                    time.sleep(rnd.uniform(0.0, 0.06))
                    d.proc.send_signal(signal.SIGKILL)
                    d.stop()
                    for t in threads:
                        t.join()
                    ch.close()
                # A last start: invariants, then every interrupted checkpoint can be finished.
                d.start()
                ch = grpc.insecure_channel(d.addr)
                stub = pbg.CheckpointsStub(ch)
                self.check_invariants(stub, d, datas)
                states = [c.state for c in stub.List(pb.ListRequest(job="crash")).checkpoints]
                if os.environ.get("SLUICE_TEST_VERBOSE"):
                    print("states after the kills:", states, file=sys.stderr)
                for c in stub.List(pb.ListRequest(job="crash", state=pb.WRITING)).checkpoints:
                    for r in range(self.WORLD):
                        stub.UploadShard(upload_requests("crash", c.name, r, datas[r]),
                                         timeout=30)
                    stub.Commit(pb.CheckpointRef(job="crash", name=c.name), timeout=30)
                done = stub.List(pb.ListRequest(job="crash", state=pb.COMPLETE)).checkpoints
                self.assertEqual(len(done), self.ROUNDS)
                self.check_invariants(stub, d, datas)
                ch.close()
                self.assertEqual(d.stop(), 0, d.log())
                self.assertEqual(d.sanitizer_reports(), [], d.log())
            finally:
                d.cleanup()

    def check_invariants(self, stub, d, datas):
        known = {c.name: c for c in stub.List(pb.ListRequest(job="crash")).checkpoints}
        for c in known.values():
            if c.state == pb.COMPLETE:
                v = stub.Verify(pb.VerifyRequest(job="crash", name=c.name, mode=pb.DEEP),
                                timeout=60)
                self.assertTrue(v.ok, (c.name, v))
        for f in d.store_files("crash"):
            if f.startswith("."):
                # Only resumable partial uploads of checkpoints being written survive a restart
                # (with replicas, each upload attempt's own, named by its lease generation; on
                # s3 the state object and the object holding the head's data).
                self.assertTrue(re.search(r"\.shard(\.[1-9][0-9]*)?\.part$", f) or
                                (d.store == "s3" and f.endswith(".shard.part.head")), f)
                self.assertEqual(known[f[1:].split("_shard_")[0]].state, pb.WRITING, f)
            else:
                self.assertIn(f.split("_shard_")[0].replace(".metadata.json", ""), known, f)


@unittest.skipIf(STORE == "s3", "a full disk under the data dir: the shards are not on that disk "
                 "with an object store (which says nothing about room left)")
class DiskFullTest(unittest.TestCase):
    """A small tmpfs as the data dir: uploads that do not fit fail with RESOURCE_EXHAUSTED, their
    temp files are removed and existing checkpoints still verify. Needs permission to mount."""

    def test_disk_full(self):
        import subprocess
        with tempfile.TemporaryDirectory() as tmp:
            mnt = os.path.join(tmp, "mnt")
            os.makedirs(mnt)
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", mnt],
                               capture_output=True)
            if r.returncode != 0:
                self.skipTest("cannot mount a tmpfs here: %s" % r.stderr.decode().strip())
            d = None
            try:
                d = Daemon(data_dir=os.path.join(mnt, "data")).start()
                ch = grpc.insecure_channel(d.addr)
                stub = pbg.CheckpointsStub(ch)
                stub.Begin(pb.BeginRequest(job="j", name="a", world_size=2), timeout=10)
                for rank in range(2):
                    stub.UploadShard(upload_requests("j", "a", rank, shard_bytes(rank, 4 * MiB)),
                                     timeout=30)
                stub.Commit(pb.CheckpointRef(job="j", name="a"), timeout=10)
                stub.Begin(pb.BeginRequest(job="j", name="b", world_size=2), timeout=10)
                # Larger than the file system: refused before any byte is written.
                with self.assertRaises(grpc.RpcError) as e:
                    stub.UploadShard(upload_requests("j", "b", 0, b"", data_size=40 * MiB,
                                                     tensors=[]), timeout=30)
                self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
                self.assertIn("free", e.exception.details())
                # Two uploads that each fit but not together: the second to reserve its space
                # fails while the first completes.
                results = []

                def up(rank):
                    try:
                        stub.UploadShard(upload_requests("j", "b", rank,
                                                         shard_bytes(rank, 9 * MiB)), timeout=30)
                        results.append("ok")
                    except grpc.RpcError as err:
                        results.append(err.code())
                ts = [threading.Thread(target=up, args=(r,)) for r in range(2)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                self.assertIn(grpc.StatusCode.RESOURCE_EXHAUSTED, results)
                jobdir = os.path.join(d.data_dir, "checkpoints", "j")
                self.assertEqual([f for f in os.listdir(jobdir) if f.startswith(".")], [])
                v = stub.Verify(pb.VerifyRequest(job="j", name="a", mode=pb.DEEP), timeout=30)
                self.assertTrue(v.ok, v)
                ch.close()
                self.assertEqual(d.stop(), 0, d.log())
                self.assertEqual(d.sanitizer_reports(), [], d.log())
            finally:
                if d is not None:
                    d.cleanup()
                subprocess.run(["umount", mnt], capture_output=True)


class PythonHelpersTest(CheckpointTest):
    """sluice.checkpoint: upload from bytes, a path and a file object, resume, verify, download."""

    def test_helpers(self):
        from sluice.checkpoint import COMPLETE, Checkpoints
        with Checkpoints(self.d.addr) as ck, tempfile.TemporaryDirectory() as tmp:
            ck.begin("py", step=3, world_size=3, user_metadata="{}")
            datas = [shard_bytes(r, 2 * MiB + r) for r in range(3)]
            path = os.path.join(tmp, "r1.bin")
            with open(path, "wb") as f:
                f.write(datas[1])
            r0 = ck.upload("py", "step_3", 0, datas[0], tensors=[
                {"name": "a", "dtype": "float32", "shape": [2], "offset": 0, "size": 8}])
            self.assertEqual(r0.sha256, hashlib.sha256(datas[0]).hexdigest())
            ck.upload("py", "step_3", 1, path, chunk_size=300000)
            # A stream that ends early keeps its prefix; resume sends the rest.
            with self.assertRaises(grpc.RpcError):
                self.stub.UploadShard(upload_requests("py", "step_3", 2, datas[2][:MiB],
                                                      data_size=len(datas[2]), tensors=[]))
            self.assertEqual(ck.upload_status("py", "step_3", 2).held_bytes, held(MiB))
            ck.upload("py", "step_3", 2, io.BytesIO(datas[2]), resume=True, tensors=[])
            self.assertEqual(ck.commit("py", "step_3").state, COMPLETE)
            self.assertTrue(ck.verify("py", "step_3", deep=True).ok)
            self.assertEqual(ck.latest("py").name, "step_3")
            self.assertEqual(ck.download("py", "step_3", 2), datas[2])
            out = os.path.join(tmp, "out.bin")
            ck.download("py", "step_3", 1, dest=out)
            with open(out, "rb") as f:
                self.assertEqual(f.read(), datas[1])
            self.assertEqual([c.name for c in ck.list("py")], ["step_3"])

    def test_torch_state_dict(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        from sluice.checkpoint import Checkpoints

        def model(seed):
            torch.manual_seed(seed)
            m = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.LayerNorm(32),
                                    torch.nn.Linear(32, 8))
            sd = m.state_dict()
            sd["step"] = torch.tensor(1234, dtype=torch.int64)
            sd["half"] = torch.randn(3, 5).to(torch.bfloat16)
            sd["mask"] = torch.rand(7) > 0.5
            sd["empty"] = torch.zeros(0, 4)
            return sd
        world = 2
        with Checkpoints(self.d.addr) as ck:
            ck.begin("torch", step=10, world_size=world)
            for rank in range(world):
                ck.save_state_dict("torch", "step_10", rank, model(rank))
            ck.commit("torch", "step_10")
            self.assertTrue(ck.verify("torch", "step_10", deep=True).ok)
            for rank in range(world):
                want = model(rank)
                got = ck.load_state_dict("torch", "step_10", rank, model(99))
                self.assertEqual(list(got), list(want))
                for k in want:
                    self.assertEqual(got[k].dtype, want[k].dtype, k)
                    self.assertTrue(torch.equal(got[k], want[k]), k)
        meta = json.loads(self.d.store_read("torch", "step_10.metadata.json"))
        t = {x["name"]: x for x in meta["shards"][1]["tensors"]}
        self.assertEqual(t["0.weight"]["shape"], [32, 64])
        self.assertEqual(t["0.weight"]["dtype"], "float32")
        self.assertEqual(t["half"]["dtype"], "bfloat16")
        self.assertEqual(t["mask"]["dtype"], "bool")

    test_parallel_upload_commit_verify_download = None
    test_corruption_detected = None
    test_resume_upload = None
    test_restart_keeps_complete_and_sweeps_temp = None
    test_abort_during_upload = None
    test_metadata_cap = None
    test_lifecycle = None
    test_client_checksum_and_sizes = None
    test_hostile_input = None
    test_retention = None


class CheckpointDDPTest(unittest.TestCase):
    """Two torch.distributed (gloo) trainers save their rank's state_dict (model, Adam state,
    RNG) through sluice.checkpoint; rank 0 commits and deep-verifies; each loads its own back."""

    def test_ddp_state_dict_per_rank(self):
        try:
            import torch.distributed  # noqa: F401
        except ImportError:
            self.skipTest("torch is not installed")
        import socket
        import subprocess
        world = 2
        with Daemon() as d, tempfile.TemporaryDirectory() as tmp:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            here = os.path.dirname(os.path.abspath(__file__))
            procs, outs = [], []
            for rank in range(world):
                out = os.path.join(tmp, "rank%d.json" % rank)
                outs.append(out)
                env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                           RANK=str(rank), WORLD_SIZE=str(world), SLUICE_ADDR=d.addr)
                procs.append(subprocess.Popen(
                    [sys.executable, os.path.join(here, "ckpt_ddp_worker.py"), "ddp", "step_3",
                     out], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
            logs = [p.communicate(timeout=240)[0].decode(errors="replace") for p in procs]
            for p, log in zip(procs, logs):
                self.assertEqual(p.returncode, 0, log)
            results = []
            for out in outs:
                with open(out) as f:
                    results.append(json.load(f))
            self.assertTrue(all(r["same"] for r in results), results)
            self.assertTrue(results[0]["verify_ok"])
            # The ranks' shards differ (their RNG states do).
            self.assertNotEqual(results[0]["sha256"], results[1]["sha256"])
            with grpc.insecure_channel(d.addr) as ch:
                g = pbg.CheckpointsStub(ch).Get(pb.CheckpointRef(job="ddp", name="step_3"))
            self.assertEqual(g.state, pb.COMPLETE)
            self.assertEqual([s.sha256 for s in g.shards], [r["sha256"] for r in results])
            self.assertEqual(d.stop(), 0, d.log())
            self.assertEqual(d.sanitizer_reports(), [], d.log())


# A subprocess for StateDictTest.test_memory: saves ("save") or loads ("load") a state with one
# tensor of SIZE bytes and prints how much that raised the peak RSS, and the tensor's SHA-256.
MEMORY_SCRIPT = r"""
import hashlib, resource, sys, torch
from sluice.checkpoint import Checkpoints
addr, mode, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with Checkpoints(addr) as ck:
    if mode == "save":
        ck.begin("mem", "m", world_size=2)
        ck.save_state_dict("mem", "m", 1, {"warm": torch.ones(1000)})   # imports, channel
        torch.manual_seed(0)
        t = torch.empty(size // 4, dtype=torch.float32).uniform_()
        base = peak()
        ck.save_state_dict("mem", "m", 0, {"big": t, "step": 1})
        ck.commit("mem", "m")
    else:
        ck.load_state_dict("mem", "m", 1)
        base = peak()
        t = ck.load_state_dict("mem", "m", 0)["big"]
    grew = peak() - base
    print(grew, hashlib.sha256(memoryview(t.view(torch.uint8).numpy())).hexdigest())
"""


class StateDictTest(unittest.TestCase):
    """Checkpoints.save_state_dict / load_state_dict: nested model + optimizer state, every dtype,
    no template needed, streamed, and safe and strict about bad data."""

    def setUp(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        from sluice.checkpoint import Checkpoints
        self.torch = torch
        self.d = Daemon().start()
        self.ck = Checkpoints(self.d.addr)

    def tearDown(self):
        self.ck.close()
        rc = self.d.stop()
        reports = self.d.sanitizer_reports()
        log = self.d.log()
        self.d.cleanup()
        self.assertEqual(rc, 0, "sluiced exit code\n" + log)
        self.assertEqual(reports, [], "sanitizer reports\n" + log)

    def assertSame(self, got, want, path="state"):
        """Same types all the way down, same keys in the same order, tensors with the same
        dtype, shape and bytes, other values equal (nan equal to nan)."""
        torch = self.torch
        self.assertIs(type(got), type(want) if not isinstance(want, torch.Tensor)
                      else torch.Tensor, path)
        if isinstance(want, torch.Tensor):
            self.assertEqual((got.dtype, got.shape), (want.dtype, want.shape), path)
            self.assertTrue(torch.equal(self.bits(got), self.bits(want)), path)
        elif isinstance(want, dict):
            self.assertEqual(list(got), list(want), path)
            self.assertEqual([type(k) for k in got], [type(k) for k in want], path)
            for k in want:
                self.assertSame(got[k], want[k], "%s[%r]" % (path, k))
        elif isinstance(want, (list, tuple)):
            self.assertEqual(len(got), len(want), path)
            for i, (g, w) in enumerate(zip(got, want)):
                self.assertSame(g, w, "%s[%d]" % (path, i))
        elif isinstance(want, float) and math.isnan(want):
            self.assertTrue(math.isnan(got), path)
        else:
            self.assertEqual(got, want, path)
            if isinstance(want, float):
                self.assertEqual(math.copysign(1, got), math.copysign(1, want), path)

    def bits(self, t):
        return t.detach().resolve_conj().contiguous().reshape(-1).view(self.torch.uint8)

    def metadata_tensors(self, job, name, rank):
        return json.loads(self.d.store_read(job, name + ".metadata.json"))["shards"][rank][
            "tensors"]

    def test_model_and_optimizer(self):
        torch = self.torch

        def build():
            torch.manual_seed(0)
            m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8),
                                    torch.nn.ReLU(), torch.nn.Linear(8, 2))
            return m, torch.optim.Adam(m.parameters(), lr=0.01, betas=(0.8, 0.95))

        def step(m, opt, seed):
            torch.manual_seed(seed)
            x = torch.randn(16, 6)
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), x[:, :2]).backward()
            opt.step()
        m, opt = build()
        for i in range(3):
            step(m, opt, i)
        state = {"model": m.state_dict(), "optimizer": opt.state_dict(), "step": 5, "lr": 0.1,
                 "name": "x", "extra": None}
        want = copy.deepcopy(state)
        self.ck.begin("sd", "step_5", world_size=1)
        self.ck.save_state_dict("sd", "step_5", 0, state)
        self.ck.commit("sd", "step_5")
        self.assertTrue(self.ck.verify("sd", "step_5", deep=True).ok)
        got = self.ck.load_state_dict("sd", "step_5", 0)
        self.assertSame(got, want)
        self.assertIs(type(got["model"]), OrderedDict)
        self.assertEqual(got["optimizer"]["param_groups"], want["optimizer"]["param_groups"])
        self.assertEqual(got["optimizer"]["param_groups"][0]["betas"], (0.8, 0.95))
        self.assertEqual(sorted(got["optimizer"]["state"]), [0, 1, 2, 3, 4, 5])
        # The restored model and optimizer take the next step bit for bit like the originals.
        m2, opt2 = build()
        m2.load_state_dict(got["model"])
        opt2.load_state_dict(got["optimizer"])
        step(m, opt, 99)
        step(m2, opt2, 99)
        for (k, a), b in zip(m.state_dict().items(), m2.state_dict().values()):
            self.assertTrue(torch.equal(self.bits(a), self.bits(b)), k)
        self.assertSame(opt2.state_dict(), opt.state_dict())
        # A template of the same structure is accepted; one of another structure is refused.
        self.assertSame(self.ck.load_state_dict("sd", "step_5", 0, template=want), want)
        fresh = {"model": build()[0].state_dict(), "optimizer": build()[1].state_dict(),
                 "step": 0, "lr": 0.0, "name": "", "extra": None}
        with self.assertRaisesRegex(ValueError, r"optimizer\.state: keys differ"):
            self.ck.load_state_dict("sd", "step_5", 0, template=fresh)
        # Flattened key paths name the tensors in metadata.json; the skeleton comes first.
        t = self.metadata_tensors("sd", "step_5", 0)
        self.assertEqual((t[0]["name"], t[0]["dtype"], t[0]["offset"]),
                         ("__sluice_skeleton__", "bytes", 0))
        byname = {x["name"]: x for x in t}
        self.assertEqual(byname["model.0.weight"]["shape"], [8, 6])
        self.assertEqual(byname["model.1.num_batches_tracked"]["dtype"], "int64")
        self.assertEqual(byname["optimizer.state.0.exp_avg"]["shape"], [8, 6])
        self.assertEqual(len(t), 1 + 9 + 6 * 3)
        self.assertTrue(all(x["offset"] % 64 == 0 for x in t if x["size"]))

    def test_every_dtype_and_value(self):
        torch = self.torch
        torch.manual_seed(1)
        base = torch.randn(4, 6, dtype=torch.float64)
        specials = torch.tensor([float("nan"), -0.0, float("inf"), -float("inf"), 1e-310])
        tensors = OrderedDict()
        for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                   torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
                   torch.complex64, torch.complex128):
            name = str(dt)[len("torch."):]
            if dt.is_complex:
                v = torch.complex(base, -base).to(dt)
            elif dt == torch.bool:
                v = base > 0
            elif dt.is_floating_point:
                v = (base * 100).to(dt)
                tensors[name + "_special"] = specials.to(dt)
            else:
                v = (base * 50).to(dt)
            tensors[name] = v
            tensors[name + "_0dim"] = v[1, 2].clone()
            tensors[name + "_empty"] = v[:0]
            tensors[name + "_strided"] = v.t()[::2]        # not contiguous, a view of v
            self.assertFalse(tensors[name + "_strided"].is_contiguous())
        tensors["conj"] = tensors["complex64"].conj()
        tensors["param"] = torch.nn.Parameter(torch.ones(3))
        tensors["big_empty"] = torch.zeros(7, 0, 5)
        state = {
            "tensors": tensors,
            "values": [0, -1, 2 ** 63 - 1, -2 ** 63, 2 ** 200, -3 ** 90, 0.1, -0.0, 1e-310,
                       float("nan"), float("inf"), -float("inf"), True, False, None, "",
                       "ünïcödé \n\x00 \ud800", b"\x00\xff" * 10, bytearray(b"ba"), (), [], {},
                       OrderedDict(), (1, (2.5, [3, {"k": None}]))],
            "torch": {"dtype": torch.bfloat16, "qdtype": torch.qint8, "size": torch.Size([2, 0, 3]),
                      "cpu": torch.device("cpu"), "cuda": torch.device("cuda", 1)},
            "keys": {0: "int", -5: "neg", 2.5: "float", True: "bool", None: "none", "": "empty",
                     (1, "a", (None, 0.5)): "tuple", "a.b": "dotted", float("inf"): "inf"},
        }
        state["nested"] = OrderedDict([("z", [tensors["int8"], (tensors["bool"], {})])])
        self.ck.begin("dt", "all", world_size=1)
        self.ck.save_state_dict("dt", "all", 0, state)
        got = self.ck.load_state_dict("dt", "all", 0)
        self.assertSame(got, state)
        # Views are saved as copies of their own and load contiguous; Parameters as tensors.
        self.assertTrue(got["tensors"]["float32_strided"].is_contiguous())
        self.assertNotEqual(got["tensors"]["float32_strided"].data_ptr(),
                            got["tensors"]["float32"].data_ptr())
        self.assertIs(type(got["tensors"]["param"]), torch.Tensor)
        self.ck.commit("dt", "all")
        t = {x["name"]: x for x in self.metadata_tensors("dt", "all", 0)}
        self.assertEqual(t["tensors.bfloat16"]["dtype"], "bfloat16")
        self.assertEqual(t["tensors.complex64_strided"]["shape"], [3, 4])
        self.assertEqual(t["tensors.bool_0dim"]["shape"], [])
        self.assertEqual(t["nested.z.1.0"]["dtype"], "bool")
        # A tensor as the whole state, and an empty state.
        self.ck.begin("dt", "plain", world_size=2)
        self.ck.save_state_dict("dt", "plain", 0, tensors["bfloat16"])
        self.ck.save_state_dict("dt", "plain", 1, {})
        self.assertSame(self.ck.load_state_dict("dt", "plain", 0), tensors["bfloat16"])
        self.assertSame(self.ck.load_state_dict("dt", "plain", 1), {})

    def test_unsupported_value_refused_before_upload(self):
        torch = self.torch
        self.ck.begin("bad", "c", world_size=1)
        import numpy as np
        cases = [
            ({"a": [1, 2, object()]}, TypeError, r"a\.2: .*object.*allow_pickle=True"),
            ({"x": {"y": len}}, TypeError, r"x\.y: .*builtin_function"),
            ({"k": {len: 1}}, TypeError, r"k: cannot save a dict key or set item of type builtin"),
            ({"o": np.array([object()])}, TypeError, r"o: .*numpy\.ndarray"),
            ({"r": np.zeros(2, dtype=[("a", "i4")])}, TypeError, r"r: .*numpy\.ndarray"),
            ({"v": {"s": {1, (2, len)}}}, TypeError, r"v\.s: .*dict key or set item of type builtin"),
            ({"q": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)}, TypeError,
             r"q: cannot save a quantized tensor"),
            ({"s": torch.ones(2, 2).to_sparse()}, TypeError, r"s: .*layout"),
            ({"m": torch.empty(2, device="meta")}, TypeError, r"m: .*meta"),
        ]
        loop = {"a": []}
        loop["a"].append(loop)
        cases.append((loop, ValueError, r"a\.0: the state refers to itself"))
        for state, exc, msg in cases:
            with self.subTest(msg=msg):
                with self.assertRaisesRegex(exc, msg):
                    self.ck.save_state_dict("bad", "c", 0, state)
        st = self.ck.upload_status("bad", "c", 0)
        self.assertEqual((st.stored, st.in_progress, st.held_bytes), (False, False, 0))
        self.assertEqual(self.ck.get("bad", "c").shards_uploaded, 0)
        with self.assertRaises(grpc.RpcError) as e:
            self.ck.download("bad", "c", 0)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_numpy_sets_complex_and_pickled_objects(self):
        # What else torch.save takes: numpy arrays and scalars (numpy's RNG state), sets,
        # complex numbers natively; any other object pickled, only when asked on both sides.
        import numpy as np
        torch = self.torch
        rng = np.random.RandomState(7)
        state = {
            "np_rng": rng.get_state(),
            "arrays": [np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2],
                       np.array([], dtype=np.int64).reshape(0, 3), np.array(["ab", "c"]),
                       np.array([1, 2], dtype=">u2"), np.array(np.datetime64("2026-11-24")),
                       np.array([True, False]), np.array([1 + 2j], dtype=np.complex64)],
            "scalars": [np.float64(0.5), np.int8(-3), np.bool_(True), np.uint64(2 ** 64 - 1),
                        np.float32("nan")],
            "sets": {"s": {1, "a", (2, 3.5)}, "fs": frozenset([None, 1j]), "empty": set()},
            "keys": {frozenset([1, 2]): "fs", 2j: "c", np.int32(4): "np"},
            "complex": [1.5j, complex(float("inf"), -0.0), complex("nan+1j")],
        }
        self.ck.begin("np", "a", world_size=1)
        self.ck.save_state_dict("np", "a", 0, state)
        got = self.ck.load_state_dict("np", "a", 0)
        self.assertEqual(type(got["np_rng"][1]), np.ndarray)
        rng2 = np.random.RandomState()
        rng2.set_state(got["np_rng"])
        self.assertEqual(rng2.randint(0, 2 ** 31, 5).tolist(), rng.randint(0, 2 ** 31, 5).tolist())
        for g, w in zip(got["arrays"], state["arrays"]):
            self.assertIs(type(g), np.ndarray)
            self.assertEqual((g.dtype, g.shape), (w.dtype, w.shape))
            self.assertTrue(np.array_equal(g, w))
        g = got["arrays"][0]
        g[0, 0] = 5                                    # loaded arrays are writable
        for g, w in zip(got["scalars"], state["scalars"]):
            self.assertIs(type(g), type(w))
            self.assertEqual(g.tobytes(), w.tobytes())
        self.assertEqual(got["sets"], state["sets"])
        self.assertIs(type(got["sets"]["fs"]), frozenset)
        self.assertEqual(got["keys"], state["keys"])
        self.assertEqual(got["complex"][:2], state["complex"][:2])
        self.assertTrue(math.isnan(got["complex"][2].real))
        self.assertEqual(math.copysign(1, got["complex"][1].imag), -1)

        # Other objects: pickled with allow_pickle; loading them needs it too.
        obj = {"w": torch.ones(3), "custom": _Pickled(5, "x"), "fn": math.sqrt}
        self.ck.begin("np", "p", world_size=1)
        with self.assertRaisesRegex(TypeError, r"custom: .*_Pickled.*allow_pickle=True"):
            self.ck.save_state_dict("np", "p", 0, obj)
        with self.assertRaisesRegex(TypeError, r"lam: cannot pickle"):
            self.ck.save_state_dict("np", "p", 0, {"lam": lambda: 0}, allow_pickle=True)
        self.ck.save_state_dict("np", "p", 0, obj, allow_pickle=True)
        with self.assertRaisesRegex(ValueError, r"custom: the state holds a pickled "
                                    r".*_Pickled, which only allow_pickle=True loads"):
            self.ck.load_state_dict("np", "p", 0)
        got = self.ck.load_state_dict("np", "p", 0, allow_pickle=True)
        self.assertEqual((got["custom"].a, got["custom"].b, got["fn"]), (5, "x", math.sqrt))
        self.assertTrue(torch.equal(got["w"], torch.ones(3)))

    def test_changed_while_saved(self):
        # The daemon checks the hash taken before sending: a state changed in between is
        # refused and nothing is stored.
        torch = self.torch
        w = torch.zeros(1000)
        upload = self.ck.upload

        def racing_upload(*args, **kw):
            w.add_(1)
            return upload(*args, **kw)
        self.ck.upload = racing_upload
        self.ck.begin("race", "c", world_size=1)
        from sluice.checkpoint import ChecksumError
        with self.assertRaisesRegex(ChecksumError, "changed while it was saved"):
            self.ck.save_state_dict("race", "c", 0, {"w": w})
        self.assertFalse(self.ck.upload_status("race", "c", 0).stored)
        self.ck.upload = upload
        self.ck.save_state_dict("race", "c", 0, {"w": w})
        self.assertSame(self.ck.load_state_dict("race", "c", 0), {"w": torch.ones(1000)})

    def test_bad_data_refused(self):
        from sluice.checkpoint import SKELETON_MAGIC
        torch = self.torch

        def shard(doc, data=b"", raw=None):
            text = raw if raw is not None else json.dumps(doc).encode()
            head = SKELETON_MAGIC + struct.pack("<Q", len(text)) + text
            return head + bytes(-len(head) % 64) + data
        ok = {"format": "sluice.state_dict", "version": 1, "tensors": [["float32", [2], 0]],
              "root": ["d", "w", ["T", 0]]}

        def doc(**kw):
            return dict(ok, **kw)
        good = shard(ok, struct.pack("<2f", 1.5, 2.5))
        cases = [
            (good[:-1], "beyond the shard"),                          # truncated tensor data
            (good[:40], "claims"),                                    # truncated skeleton
            (shard(None, raw=b'{"format": "sluice.state_dict", "ver'), "not valid JSON"),
            (shard(None, raw=b"[" * 100000 + b"]" * 100000), "nested too deeply|not a sluice"),
            (shard(doc(version=2)), "version 2"),
            (shard(doc(format="pickle")), "not a sluice.state_dict"),
            (shard(doc(tensors=[["float99", [2], 0]]), bytes(8)), "unknown dtype 'float99'"),
            (shard(doc(tensors=[["qint8", [2], 0]]), bytes(2)), "unknown dtype 'qint8'"),
            (shard(doc(tensors=[["float32", [2], 64]]), bytes(8)), "beyond the shard"),
            (shard(doc(tensors=[["float32", [1 << 40, 1 << 40], 0]]), bytes(8)), "beyond"),
            (shard(doc(tensors=[["float32", [-2], 0]]), bytes(8)), "not \\[dtype, shape"),
            (shard(doc(root=["d", "w", ["T", 1]]), bytes(8)), "tensor reference 1"),
            (shard(doc(root=["l", ["T", 0], ["T", 0]]), bytes(8)), "tensor reference 0"),
            (shard(doc(root=["d", "w", ["T", 0], "w", 1]), bytes(8)), "duplicate key"),
            (shard(doc(root=["d", ["l"], ["T", 0]]), bytes(8)), "dict key"),
            (shard(doc(root=["pickle", "cos\nsystem\n(S'touch /tmp/x'\ntR."]), bytes(8)),
             "bad node"),
            (shard(doc(root=["d", "w", ["T", 0], "x", ["dev", "nodevice:9"]]), bytes(8)),
             "bad device"),
            (shard(doc(root=["d", "w", ["T", 0], "x", ["i", "12"]]), bytes(8)), "bad node"),
            (shard(doc(root=["d", "w", ["T", 0], "x", ["b", "!!"]]), bytes(8)), "bad base64"),
            (good + b"tail", "its content ends at"),
            (shard(doc(root=["l"]), bytes(8)), "1 of its 1 tensors are not referenced"),
        ]
        self.ck.begin("bad", "data", world_size=len(cases) + 1)
        for rank, (data, _) in enumerate(cases):
            self.ck.upload("bad", "data", rank, data)
        self.ck.upload("bad", "data", len(cases), good)
        self.ck.commit("bad", "data")
        for rank, (_, msg) in enumerate(cases):
            with self.subTest(rank=rank, msg=msg):
                with self.assertRaisesRegex(ValueError, msg):
                    self.ck.load_state_dict("bad", "data", rank)
        got = self.ck.load_state_dict("bad", "data", len(cases))
        self.assertSame(got, {"w": torch.tensor([1.5, 2.5])})

    def test_flat_format_compat(self):
        # A shard as the earlier save_state_dict wrote it: tensors back to back, no skeleton.
        torch = self.torch
        torch.manual_seed(2)
        sd = OrderedDict([("w", torch.randn(3, 4)), ("b", torch.randn(4).to(torch.bfloat16)),
                          ("n", torch.tensor(7)), ("e", torch.zeros(0))])
        data = b"".join(self.bits(t).numpy().tobytes() for t in sd.values())
        layout, off = [], 0
        for k, t in sd.items():
            size = t.numel() * t.element_size()
            layout.append({"name": k, "dtype": str(t.dtype)[6:], "shape": list(t.shape),
                           "offset": off, "size": size})
            off += size
        self.ck.begin("old", "c", world_size=2)
        self.ck.upload("old", "c", 0, data, tensors=layout)
        self.ck.upload("old", "c", 1, b"", tensors=[])
        got = self.ck.load_state_dict("old", "c", 0, sd)
        self.assertSame(got, dict(sd))
        self.assertEqual(self.ck.load_state_dict("old", "c", 1, {}), {})
        with self.assertRaisesRegex(ValueError, "no state skeleton .*template"):
            self.ck.load_state_dict("old", "c", 0)
        with self.assertRaisesRegex(ValueError, "the shard holds 64 bytes, the template 16"):
            self.ck.load_state_dict("old", "c", 0, OrderedDict(list(sd.items())[1:]))

    def test_memory(self):
        # Saving streams the tensor (no copy of the shard or of the tensor in memory); loading
        # fills the result as the data arrives (no second copy of the shard).
        import subprocess
        size = 200 * MiB
        out = {}
        for mode in ("save", "load"):
            p = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, self.d.addr, mode,
                                str(size)], capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            grew, sha = p.stdout.split()
            out[mode] = (int(grew), sha)
        self.assertLess(out["save"][0], size // 2, out)
        self.assertLess(out["load"][0], size * 3 // 2, out)
        self.assertEqual(out["save"][1], out["load"][1])


class AccessTest(unittest.TestCase):
    """With a token file: readers read, trainers write checkpoints, only admins delete."""

    TOKENS = {"reader": "r" * 24, "trainer": "t" * 24, "admin": "a" * 24}

    def test_roles(self):
        with tempfile.TemporaryDirectory() as tmp:
            tf = os.path.join(tmp, "tokens")
            with open(tf, "w") as f:
                for role, tok in self.TOKENS.items():
                    f.write("%s %s\n" % (role, tok))
            with Daemon(args=["--token-file", tf]) as d:
                from sluice.checkpoint import Checkpoints
                DENIED = grpc.StatusCode.PERMISSION_DENIED
                with Checkpoints(d.addr, token=self.TOKENS["trainer"]) as t, \
                        Checkpoints(d.addr, token=self.TOKENS["reader"]) as r, \
                        Checkpoints(d.addr, token=self.TOKENS["admin"]) as a, \
                        Checkpoints(d.addr) as anon:
                    t.begin("acl", name="c", world_size=1)
                    t.upload("acl", "c", 0, b"data")
                    t.commit("acl", "c")
                    self.assertTrue(r.verify("acl", "c", deep=True).ok)
                    self.assertEqual(r.download("acl", "c", 0), b"data")
                    for fn in (lambda: r.begin("acl", name="d", world_size=1),
                               lambda: r.upload("acl", "c", 0, b"x"),
                               lambda: t.delete("acl", "c"),
                               lambda: t.set_retention("acl", 1)):
                        with self.assertRaises(grpc.RpcError) as e:
                            fn()
                        self.assertEqual(e.exception.code(), DENIED)
                    with self.assertRaises(grpc.RpcError) as e:
                        anon.list("acl")
                    self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
                    a.delete("acl", "c")
                self.assertEqual(d.stop(), 0, d.log())
                self.assertEqual(d.sanitizer_reports(), [], d.log())


class CliTest(CheckpointTest):
    """`sluice ckpt` end to end: directory upload in parallel, commit, verify, download."""

    def test_cli_workflow(self):
        a = self.d.addr
        with tempfile.TemporaryDirectory() as tmp:
            src, out = os.path.join(tmp, "src"), os.path.join(tmp, "out")
            os.makedirs(src)
            os.makedirs(out)
            datas = [shard_bytes(r, 200000 + 17 * r) for r in range(4)]
            for r, d in enumerate(datas):
                with open(os.path.join(src, "model_shard_%d.pt" % r), "wb") as f:
                    f.write(d)
            r = cli("ckpt", "begin", "j", "--step", "7", "--world", "4", "--json", addr=a)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(json.loads(r.stdout)["name"], "step_7")
            r = cli("ckpt", "upload", "j", "step_7", "--dir", src, "-j", "4", "--json", addr=a)
            self.assertEqual(r.returncode, 0, r.stderr)
            got = json.loads(r.stdout)
            self.assertEqual([g["sha256"] for g in got],
                             [hashlib.sha256(d).hexdigest() for d in datas])
            r = cli("ckpt", "commit", "j", "step_7", addr=a)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("COMPLETE", r.stdout)
            r = cli("ckpt", "verify", "j", "step_7", "--deep", "--json", addr=a)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(json.loads(r.stdout)["ok"])
            r = cli("ckpt", "latest", "j", addr=a)
            self.assertEqual(r.stdout.strip(), "step_7")
            r = cli("ckpt", "ls", "j", "--state", "COMPLETE", "--json", addr=a)
            self.assertEqual([c["name"] for c in json.loads(r.stdout)], ["step_7"])
            r = cli("ckpt", "show", "j", "step_7", "--json", addr=a)
            self.assertEqual(len(json.loads(r.stdout)["shards"]), 4)
            r = cli("ckpt", "download", "j", "step_7", "--dir", out, addr=a)
            self.assertEqual(r.returncode, 0, r.stderr)
            for i, d in enumerate(datas):
                with open(os.path.join(out, "rank_%d.bin" % i), "rb") as f:
                    self.assertEqual(f.read(), d)
            # Errors: exit 1 with the status; usage: exit 2.
            r = cli("ckpt", "upload", "j", "step_7", os.path.join(src, "model_shard_0.pt"),
                    "--rank", "0", addr=a)
            self.assertEqual(r.returncode, 1)
            self.assertIn("FAILED_PRECONDITION", r.stderr)
            self.d.store_remove("j", self.shard_file("step_7", 2))
            r = cli("ckpt", "verify", "j", "step_7", addr=a)
            self.assertEqual(r.returncode, 1)
            self.assertIn("rank 2: MISSING", r.stdout)
            self.assertEqual(cli("ckpt", "begin", "j", addr=a).returncode, 2)
            self.assertEqual(cli("ckpt", "ls", "--deep", addr=a).returncode, 2)
            self.assertEqual(cli("ckpt", "nope", addr=a).returncode, 2)
            r = cli("ckpt", "upload", "--help", addr=a)
            self.assertEqual(r.returncode, 0)
            self.assertIn("--resume", r.stdout)
            r = cli("ckpt", "rm", "j", "step_7", addr=a)
            self.assertEqual(r.returncode, 0, r.stderr)
            # Resume an interrupted upload from the CLI.
            cli("ckpt", "begin", "j", "res", "--world", "1", addr=a)
            big = shard_bytes(9, 3 * MiB)
            with open(os.path.join(src, "big.bin"), "wb") as f:
                f.write(big)
            with self.assertRaises(grpc.RpcError):
                self.stub.UploadShard(upload_requests("j", "res", 0, big[:2 * MiB],
                                                      data_size=len(big)))
            r = cli("ckpt", "status", "j", "res", "--rank", "0", "--json", addr=a)
            self.assertEqual(json.loads(r.stdout)["held_bytes"], held(2 * MiB))
            r = cli("ckpt", "upload", "j", "res", os.path.join(src, "big.bin"), "--rank", "0",
                    "--resume", addr=a)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(hashlib.sha256(big).hexdigest(), r.stdout)
            self.assertEqual(self.download("j", "res", 0)[0], big)

    test_parallel_upload_commit_verify_download = None
    test_corruption_detected = None
    test_resume_upload = None
    test_restart_keeps_complete_and_sweeps_temp = None
    test_abort_during_upload = None
    test_metadata_cap = None
    test_lifecycle = None
    test_client_checksum_and_sizes = None
    test_hostile_input = None
    test_retention = None


class SmallLimitsTest(CheckpointTest):
    daemon_args = ("--max-shard-bytes", str(8 * MiB), "--upload-timeout", "0.3",
                   "--upload-memory", str(8 * MiB))

    def test_memory_budget(self):
        # 6 ranks x 6 MiB in 1 MiB chunks through an 8 MiB budget: all complete, none starves.
        self.begin(name="m", world=6)
        datas = [shard_bytes(r, 6 * MiB - r) for r in range(6)]
        out, errors = [None] * 6, []

        def run(r):
            try:
                out[r] = self.upload("job1", "m", r, datas[r])
            except grpc.RpcError as e:
                errors.append(e)
        ts = [threading.Thread(target=run, args=(r,)) for r in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual([o.sha256 for o in out], [hashlib.sha256(d).hexdigest() for d in datas])

    def test_limits(self):
        self.begin(name="l", world=1)
        code, msg = self.code_of(self.upload, "job1", "l", 0, b"", data_size=8 * MiB + 1,
                                 tensors=[])
        self.assertEqual(code, grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn(str(8 * MiB), msg)

    def test_abandoned_partial_removed(self):
        self.begin(name="a", world=1)
        part = ".a_shard_0.shard.part"
        self.d.store_write("job1", part, b"x" * 100)
        deadline = time.time() + 10
        while self.d.store_exists("job1", part) and time.time() < deadline:
            time.sleep(0.05)
        self.assertFalse(self.d.store_exists("job1", part))

    # The big tests run in CheckpointTest only.
    test_parallel_upload_commit_verify_download = None
    test_corruption_detected = None
    test_resume_upload = None
    test_restart_keeps_complete_and_sweeps_temp = None
    test_abort_during_upload = None
    test_metadata_cap = None
    test_lifecycle = None
    test_client_checksum_and_sizes = None
    test_hostile_input = None
    test_retention = None


if __name__ == "__main__":
    unittest.main()
