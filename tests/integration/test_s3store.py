"""sluiced with its checkpoint shards in S3-compatible object storage (issue 16, "Tests"): s3rver
started by the tests (tests/python/s3fixture.py), boto3 as the independent reader, FaultProxy
in front for 503s, resets, a dead store and SigV4 verification; the real daemon, the `sluice` CLI
and the Python client. Every test starts its own s3rver (some kill it) and bounds every wait."""
import hashlib
import json
import os
import re
import signal
import struct
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.request

import grpc

from sluice.v1 import checkpoint_pb2 as pb
from sluice.v1 import checkpoint_pb2_grpc as pbg
from s3fixture import FaultProxy, S3Server
from sltest import SLUICED, Daemon, cli
from test_checkpoints import HEADER, MiB, shard_bytes, upload_requests

PART = 5 * MiB  # --s3-part-size: the smallest S3 allows, to keep multipart shards small
PART_ARGS = ["--s3-part-size", str(PART)]
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def wait_for(what, fn, timeout=15.0, every=0.05):
    """Poll fn until it returns something true; fail saying `what` after timeout s."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(every)


class Held:
    """A request stream that sends the header and data[:upto], then waits until released (or
    the call is cancelled), then sends the rest (or ends, if cut)."""

    def __init__(self, job, name, rank, data, upto, offset=0, chunk=MiB):
        self.reqs = list(upload_requests(job, name, rank, data, chunk=chunk, offset=offset,
                                         tensors=[], sha=hashlib.sha256(data).hexdigest()))
        self.n = 1 + (upto - offset + chunk - 1) // chunk
        self.release = threading.Event()
        self.cut = False

    def __iter__(self):
        yield from self.reqs[:self.n]
        self.release.wait(60)
        if not self.cut:
            yield from self.reqs[self.n:]


class S3StoreTest(unittest.TestCase):
    proxy_verify = None

    def setUp(self):
        self.s3 = S3Server().start()
        self.addCleanup(self.s3.stop)
        self.boto = self.s3.boto3_client()
        self.addCleanup(self.boto.close)
        self.d = None
        self.proxy = None
        self.channel = None

    def tearDown(self):
        if self.channel is not None:
            self.channel.close()
        if self.d is not None:
            rc = self.d.stop()
            log = self.d.log()
            self.d.cleanup()
            self.assertEqual(rc, 0, "sluiced exit code\n" + log)
            self.assertEqual(self.d.sanitizer_reports(), [], log)
        if self.proxy is not None:
            self.proxy.stop()

    # -- helpers --

    def start(self, args=(), via_proxy=False, env=None, data_dir=None, multipart=False):
        """multipart: the proxy answers ListMultipartUploads and AbortMultipartUpload, which
        s3rver 3.7.1 does not implement."""
        if via_proxy and self.proxy is None:
            self.proxy = FaultProxy(self.s3.port, verify=self.proxy_verify,
                                    s3rver=self.s3 if multipart else None,
                                    multipart=multipart).start()
        if self.d is None:
            self.d = Daemon(data_dir=data_dir, store="s3", s3=self.s3, args=list(args), env=env,
                            s3_endpoint=self.proxy.endpoint if via_proxy else None)
        self.d.start()
        self.connect()
        return self.d

    def connect(self):
        if self.channel is not None:
            self.channel.close()
        self.channel = grpc.insecure_channel(self.d.addr)
        self.stub = pbg.CheckpointsStub(self.channel)

    def kill_daemon(self):
        self.channel.close()
        self.channel = None
        self.d.signal(signal.SIGKILL)
        self.assertEqual(self.d.stop(), -signal.SIGKILL)

    def upload(self, job, name, rank, data, offset=0, timeout=60):
        return self.stub.UploadShard(upload_requests(job, name, rank, data, offset=offset,
                                                     tensors=[],
                                                     sha=hashlib.sha256(data).hexdigest()),
                                     timeout=timeout)

    def status(self, job, name, rank):
        return self.stub.UploadStatus(pb.UploadStatusRequest(job=job, checkpoint=name, rank=rank),
                                      timeout=30)

    def state(self, job, name):
        return self.stub.Get(pb.CheckpointRef(job=job, name=name), timeout=30).state

    def deep_ok(self, job, name):
        v = self.stub.Verify(pb.VerifyRequest(job=job, name=name, mode=pb.DEEP), timeout=60)
        self.assertTrue(v.ok, v)

    def key(self, job, file):
        return self.d.store_key(job, file)

    def check_object(self, job, name, rank, data):
        """boto3 fetches the shard and checks the SHAR layout and its SHA-256."""
        raw = self.d.store_read(job, "%s_shard_%d.shard" % (name, rank))
        magic, r, clen = struct.unpack_from("<Iii", raw, 0)
        self.assertEqual((magic, r, clen), (0x53484152, rank, 64))
        self.assertEqual(raw[12:76].decode(), hashlib.sha256(raw[HEADER:]).hexdigest())
        self.assertEqual(raw[12:76].decode(), hashlib.sha256(data).hexdigest())
        count, dlen = struct.unpack_from("<iq", raw, 76)
        self.assertEqual(dlen, len(data))
        self.assertEqual(raw[HEADER:], data)

    def stored_bytes(self, job, name, rank):
        """The data bytes the upload's state object says are stored (0 without one); peeks at
        its text (server/store/sstore_s3.c: a line "data_done N") and needs the head object."""
        state = ".%s_shard_%d.shard.part" % (name, rank)
        files = self.d.store_files(job)
        if state not in files or state + ".head" not in files:
            return 0
        try:
            text = self.d.store_read(job, state).decode()
        except Exception:  # noqa: BLE001 - replaced meanwhile
            return 0
        m = re.search(r"^data_done (\d+)$", text, re.M)
        return int(m.group(1)) if m else 0

    def hold_until_part_stored(self, job, name, rank, data, upto, timeout=30):
        """Start an upload that stops after `upto` bytes (at least the head's), wait until the
        state object says the head's data is stored; returns (held stream, future). The daemon
        records the parts after it only when more data arrives (it collects finished parts on
        the next write), so no state is being written while the stream waits and the test
        strikes (a kill of s3rver during that PUT would tear the state)."""
        held = Held(job, name, rank, data, upto)
        fut = self.stub.UploadShard.future(iter(held), timeout=timeout)
        want = PART - HEADER
        self.assertGreaterEqual(upto, want)
        wait_for("%d bytes stored" % want, lambda: self.stored_bytes(job, name, rank) >= want)
        return held, fut

    # -- tests --

    def test_layout_read_back_by_boto3(self):
        """What sluice wrote, listed and fetched by boto3: the layout of docs/checkpoints.md,
        the SHAR header with the hex SHA-256 of the data, a multipart shard (ETag "-2")."""
        self.start(PART_ARGS)
        self.stub.Begin(pb.BeginRequest(job="lay", name="ck", world_size=3), timeout=10)
        datas = [shard_bytes(0, PART + MiB + 5), shard_bytes(1, 1000), shard_bytes(2, 0)]
        for r, data in enumerate(datas):
            rec = self.upload("lay", "ck", r, data)
            self.assertEqual(rec.sha256, hashlib.sha256(data).hexdigest())
            self.assertEqual(rec.path, "checkpoints/lay/ck_shard_%d.shard" % r)
        self.assertEqual(self.stub.Commit(pb.CheckpointRef(job="lay", name="ck"), timeout=30).state,
                         pb.COMPLETE)
        listed = self.boto.list_objects_v2(Bucket=self.s3.bucket,
                                           Prefix=self.d.s3_prefix + "/")["Contents"]
        self.assertEqual(sorted(o["Key"] for o in listed),
                         [self.key("lay", f) for f in ("ck.metadata.json", "ck_shard_0.shard",
                                                       "ck_shard_1.shard", "ck_shard_2.shard")])
        sizes = {o["Key"]: o["Size"] for o in listed}
        for r, data in enumerate(datas):
            self.assertEqual(sizes[self.key("lay", "ck_shard_%d.shard" % r)], HEADER + len(data))
            self.check_object("lay", "ck", r, data)
        meta = json.loads(self.d.store_read("lay", "ck.metadata.json"))
        self.assertEqual([s["sha256"] for s in meta["shards"]],
                         [hashlib.sha256(d).hexdigest() for d in datas])
        self.deep_ok("lay", "ck")
        r = cli("info", "--json", addr=self.d.addr, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("s3://%s/%s" % (self.s3.bucket, self.d.s3_prefix), r.stdout)

    def test_damage_named_by_deep_verify(self):
        """Objects flipped, deleted or truncated behind sluice's back: `sluice ckpt verify --deep`
        names exactly those ranks; quick verify sees what HEAD and the header show."""
        self.start(PART_ARGS)
        world = 5
        self.stub.Begin(pb.BeginRequest(job="dmg", name="ck", world_size=world), timeout=10)
        datas = [shard_bytes(r, 300 * 1024 + r) for r in range(world)]
        datas[4] = shard_bytes(4, PART + 3 * MiB)  # a multipart one, damaged in its second part
        for r in range(world):
            self.upload("dmg", "ck", r, datas[r])
        self.stub.Commit(pb.CheckpointRef(job="dmg", name="ck"), timeout=30)
        r = cli("ckpt", "verify", "dmg", "ck", "--deep", addr=self.d.addr, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.d.store_flip("dmg", "ck_shard_1.shard", HEADER + 777)
        self.d.store_remove("dmg", "ck_shard_3.shard")
        self.d.store_flip("dmg", "ck_shard_4.shard", PART + MiB)
        r = cli("ckpt", "verify", "dmg", "ck", "--deep", "--json", addr=self.d.addr, timeout=60)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        got = {s["rank"]: s["verdict"] for s in json.loads(r.stdout)["shards"]}
        self.assertEqual(got, {0: "OK", 1: "CHECKSUM_MISMATCH", 2: "OK", 3: "MISSING",
                               4: "CHECKSUM_MISMATCH"})
        r = cli("ckpt", "verify", "dmg", "ck", "--deep", addr=self.d.addr, timeout=60)
        self.assertEqual(r.returncode, 1)
        bad = sorted(line.split(":")[0] for line in r.stdout.splitlines()
                     if line.startswith("rank "))
        self.assertEqual(bad, ["rank 1", "rank 3", "rank 4"], r.stdout)
        # Quick: the flips are in the data (not seen), the deleted one is MISSING, a truncated
        # one SIZE_MISMATCH.
        self.d.store_truncate("dmg", "ck_shard_2.shard", HEADER + 10)
        v = self.stub.Verify(pb.VerifyRequest(job="dmg", name="ck", mode=pb.QUICK), timeout=60)
        self.assertEqual([s.verdict for s in v.shards],
                         [pb.OK, pb.OK, pb.SIZE_MISMATCH, pb.MISSING, pb.OK])
        # A download of the flipped shard ends with DATA_LOSS.
        with self.assertRaises(grpc.RpcError) as e:
            for _ in self.stub.DownloadShard(pb.DownloadShardRequest(job="dmg", name="ck",
                                                                     rank=1), timeout=60):
                pass
        self.assertEqual(e.exception.code(), grpc.StatusCode.DATA_LOSS)

    def test_sigkill_mid_multipart_resumes(self):
        """sluiced killed in a multipart upload: after the restart UploadStatus holds the parts
        stored, the resume completes, the catalog says COMPLETE only after the commit."""
        self.start(PART_ARGS)
        self.stub.Begin(pb.BeginRequest(job="k", name="ck", world_size=2), timeout=10)
        data = shard_bytes(0, 3 * PART + 2 * MiB + 7)
        held, fut = self.hold_until_part_stored("k", "ck", 0, data, 2 * PART + MiB)
        self.kill_daemon()
        held.cut = True
        held.release.set()
        with self.assertRaises(grpc.RpcError):
            fut.result(timeout=30)
        # Nothing under the shard's name; the state and the head kept.
        files = self.d.store_files("k")
        self.assertEqual(files, [".ck_shard_0.shard.part", ".ck_shard_0.shard.part.head"])
        self.d.start()
        self.connect()
        st = self.status("k", "ck", 0)
        self.assertFalse(st.stored)
        self.assertGreater(st.held_bytes, 0)
        self.assertEqual((st.held_bytes + HEADER) % PART, 0, st)  # whole parts
        self.assertLessEqual(st.held_bytes, 2 * PART + MiB)
        self.assertEqual(self.state("k", "ck"), pb.WRITING)
        rec = self.upload("k", "ck", 0, data, offset=st.held_bytes)
        self.assertEqual(rec.sha256, hashlib.sha256(data).hexdigest())
        self.assertEqual(self.state("k", "ck"), pb.WRITING)
        self.assertFalse(self.d.store_exists("k", "ck.metadata.json"))
        self.upload("k", "ck", 1, b"one")
        self.assertEqual(self.stub.Commit(pb.CheckpointRef(job="k", name="ck"), timeout=30).state,
                         pb.COMPLETE)
        self.deep_ok("k", "ck")
        self.check_object("k", "ck", 0, data)
        self.assertEqual(self.d.store_files("k"),
                         ["ck.metadata.json", "ck_shard_0.shard", "ck_shard_1.shard"])

    def test_store_killed_mid_upload(self):
        """s3rver killed while a multipart upload streams (restarted on its directory and port):
        the upload fails with UNAVAILABLE once the retry deadline passes, nothing is COMPLETE,
        and the upload resumes from the parts stored before."""
        self.start(PART_ARGS + ["--s3-retry-deadline", "2"])
        self.stub.Begin(pb.BeginRequest(job="sk", name="ck", world_size=1), timeout=10)
        data = shard_bytes(0, 3 * PART + 11)
        held, fut = self.hold_until_part_stored("sk", "ck", 0, data, 2 * PART)
        self.s3.kill()
        held.release.set()
        with self.assertRaises(grpc.RpcError) as e:
            fut.result(timeout=60)
        self.assertEqual(e.exception.code(), UNAVAILABLE, e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            self.stub.Commit(pb.CheckpointRef(job="sk", name="ck"), timeout=30)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.s3.restart()
        st = self.status("sk", "ck", 0)
        self.assertGreater(st.held_bytes, 0)
        self.upload("sk", "ck", 0, data, offset=st.held_bytes)
        self.assertEqual(self.stub.Commit(pb.CheckpointRef(job="sk", name="ck"), timeout=30).state,
                         pb.COMPLETE)
        self.deep_ok("sk", "ck")
        self.check_object("sk", "ck", 0, data)

    def test_store_killed_mid_commit(self):
        """s3rver killed while Commit writes metadata.json: the commit fails, the checkpoint stays
        WRITING (never COMPLETE with a missing object); with the store back it commits."""
        self.start(["--s3-retry-deadline", "2"], via_proxy=True)
        self.stub.Begin(pb.BeginRequest(job="sc", name="ck", world_size=2), timeout=10)
        datas = [shard_bytes(r, 2000 + r) for r in range(2)]
        for r in range(2):
            self.upload("sc", "ck", r, datas[r])
        self.proxy.clear_log()
        self.proxy.set(delay_ms=800)
        out = {}

        def commit():
            try:
                out["ck"] = self.stub.Commit(pb.CheckpointRef(job="sc", name="ck"), timeout=60)
            except grpc.RpcError as err:
                out["err"] = err
        t = threading.Thread(target=commit)
        t.start()
        wait_for("the commit's first request", lambda: self.proxy.requests)
        self.s3.kill()
        t.join(60)
        self.assertFalse(t.is_alive())
        self.assertIn("err", out, out)
        self.assertEqual(out["err"].code(), UNAVAILABLE, out["err"].details())
        self.assertEqual(self.state("sc", "ck"), pb.WRITING)
        self.proxy.passthrough()
        self.s3.restart()
        self.assertFalse(self.d.store_exists("sc", "ck.metadata.json"))
        self.assertEqual(self.stub.Commit(pb.CheckpointRef(job="sc", name="ck"), timeout=30).state,
                         pb.COMPLETE)
        self.deep_ok("sc", "ck")
        self.assertTrue(self.d.store_exists("sc", "ck.metadata.json"))

    def test_slowdown_and_resets_retried(self):
        """503 SlowDown and connection resets during an upload (parts, PutObject, Complete) are
        retried: the uploads succeed and verify."""
        self.start(PART_ARGS, via_proxy=True)
        self.stub.Begin(pb.BeginRequest(job="f", name="ck", world_size=2), timeout=10)
        big, small = shard_bytes(0, 2 * PART + 3), shard_bytes(1, 4000)
        self.proxy.set(slowdown=3, match="partNumber=")
        self.proxy.set(reset=2, match="partNumber=", after=1)
        self.upload("f", "ck", 0, big)
        self.proxy.set(slowdown=2, match="PUT ")
        self.proxy.set(reset=1, match="PUT ", after=2)
        self.upload("f", "ck", 1, small)
        with self.proxy.lock:
            self.assertEqual([v[0] for v in self.proxy.faults.values()],
                             [0] * len(FaultProxy.FAULTS), "every fault was used")
        self.assertGreaterEqual(self.proxy.seen("PUT", "partNumber="), 3 + 3 + 2)
        self.assertEqual(self.stub.Commit(pb.CheckpointRef(job="f", name="ck"), timeout=30).state,
                         pb.COMPLETE)
        self.deep_ok("f", "ck")
        self.check_object("f", "ck", 0, big)
        self.assertIn("event=s3_retry", self.d.log())

    def test_deadline_exhausted_then_resume(self):
        """The store down longer than --s3-retry-deadline: the upload fails with UNAVAILABLE
        saying so, keeps the parts stored before, and resumes once the store is back."""
        self.start(PART_ARGS + ["--s3-retry-deadline", "1"], via_proxy=True)
        self.stub.Begin(pb.BeginRequest(job="dl", name="ck", world_size=1), timeout=10)
        data = shard_bytes(0, 2 * PART + MiB)
        held, fut = self.hold_until_part_stored("dl", "ck", 0, data, PART + MiB)
        self.proxy.set(reset=10 ** 6)  # every connection reset: the store is down
        t0 = time.monotonic()
        held.release.set()
        with self.assertRaises(grpc.RpcError) as e:
            fut.result(timeout=60)
        self.assertEqual(e.exception.code(), UNAVAILABLE, e.exception.details())
        self.assertIn("retry deadline", e.exception.details())
        self.assertLess(time.monotonic() - t0, 20)
        self.proxy.passthrough()
        st = self.status("dl", "ck", 0)
        self.assertGreater(st.held_bytes, 0)
        self.upload("dl", "ck", 0, data, offset=st.held_bytes)
        self.assertEqual(self.stub.Commit(pb.CheckpointRef(job="dl", name="ck"), timeout=30).state,
                         pb.COMPLETE)
        self.deep_ok("dl", "ck")

    def test_resume_of_vanished_upload(self):
        """A partial upload whose multipart upload the store no longer has (completed by a
        daemon killed before it removed the state, or aborted by a lifecycle rule): S3 answers
        NoSuchUpload to its parts. The resume fails with FAILED_PRECONDITION (a resume that
        does not match), the useless state is dropped (held 0), and the client that asks
        UploadStatus again finishes the shard."""
        self.start(PART_ARGS, via_proxy=True)
        self.stub.Begin(pb.BeginRequest(job="v", name="ck", world_size=1), timeout=10)
        data = shard_bytes(0, 2 * PART + MiB)
        held, fut = self.hold_until_part_stored("v", "ck", 0, data, PART + MiB)
        held.cut = True
        held.release.set()
        with self.assertRaises(grpc.RpcError):
            fut.result(timeout=30)
        upload_id = re.search(r"^upload_id (\S+)$", self.d.store_read(
            "v", ".ck_shard_0.shard.part").decode(), re.M).group(1)
        self.proxy.set(no_such_upload=10 ** 6, match="uploadId=" + upload_id)
        st = self.status("v", "ck", 0)
        self.assertGreater(st.held_bytes, 0)
        with self.assertRaises(grpc.RpcError) as e:
            self.upload("v", "ck", 0, data, offset=st.held_bytes)
        # A resume that does not match (ask UploadStatus), not NOT_FOUND (the checkpoint is).
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION,
                         e.exception.details())
        self.assertIn("NoSuchUpload", e.exception.details())
        with self.proxy.lock:
            self.assertLess(self.proxy.faults["no_such_upload"][0], 10 ** 6, "never answered")
        wait_for("the state dropped", lambda: not self.d.store_files("v"))
        st = self.status("v", "ck", 0)
        self.assertEqual((st.held_bytes, st.stored), (0, False))
        done = self.upload("v", "ck", 0, data, offset=st.held_bytes)
        self.assertEqual(done.sha256, hashlib.sha256(data).hexdigest())
        self.assertEqual(self.stub.Commit(pb.CheckpointRef(job="v", name="ck"), timeout=30).state,
                         pb.COMPLETE)
        self.deep_ok("v", "ck")

    def test_resume_without_head(self):
        """A state object whose head object is gone (a kill between the two removals that end an
        upload: the head goes first): the resume is FAILED_PRECONDITION and drops the state, so
        that UploadStatus says 0 and the client's next upload finishes the shard."""
        self.start(PART_ARGS)
        self.stub.Begin(pb.BeginRequest(job="h", name="ck", world_size=1), timeout=10)
        data = shard_bytes(0, 2 * PART + MiB)
        held, fut = self.hold_until_part_stored("h", "ck", 0, data, PART + MiB)
        held.cut = True
        held.release.set()
        with self.assertRaises(grpc.RpcError):
            fut.result(timeout=30)
        self.d.store_remove("h", ".ck_shard_0.shard.part.head")
        st = self.status("h", "ck", 0)
        self.assertGreater(st.held_bytes, 0)
        with self.assertRaises(grpc.RpcError) as e:
            self.upload("h", "ck", 0, data, offset=st.held_bytes)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION,
                         e.exception.details())
        st = self.status("h", "ck", 0)
        self.assertEqual((st.held_bytes, st.stored), (0, False))
        self.assertEqual(self.d.store_files("h"), [])
        self.upload("h", "ck", 0, data, offset=st.held_bytes)
        self.assertEqual(self.stub.Commit(pb.CheckpointRef(job="h", name="ck"), timeout=30).state,
                         pb.COMPLETE)
        self.deep_ok("h", "ck")

    def test_resume_after_kill_before_complete(self):
        """Every part stored, sluiced killed while CompleteMultipartUpload is retried: after the
        restart the upload resumes from what UploadStatus holds. The state recorded when the
        last, partly filled part was stored must be one a resume can load (the service has
        finalized the hasher by then)."""
        self.start(PART_ARGS, via_proxy=True)
        self.stub.Begin(pb.BeginRequest(job="fc", name="ck", world_size=1), timeout=10)
        data = shard_bytes(0, 2 * PART + 12345)
        self.proxy.faults["reset"] = [10 ** 6, "POST ", 1]  # Create goes by, Complete never
        fut = self.stub.UploadShard.future(upload_requests(
            "fc", "ck", 0, data, tensors=[], sha=hashlib.sha256(data).hexdigest()), timeout=60)
        wait_for("a CompleteMultipartUpload", lambda: self.proxy.seen("POST", "uploadId="))
        self.kill_daemon()
        with self.assertRaises(grpc.RpcError):
            fut.result(timeout=30)
        self.proxy.passthrough()
        self.d.start()
        self.connect()
        st = self.status("fc", "ck", 0)
        self.assertGreater(st.held_bytes, 0)
        rec = self.upload("fc", "ck", 0, data, offset=st.held_bytes)
        self.assertEqual(rec.sha256, hashlib.sha256(data).hexdigest())
        self.assertEqual(self.stub.Commit(pb.CheckpointRef(job="fc", name="ck"), timeout=30).state,
                         pb.COMPLETE)
        self.deep_ok("fc", "ck")
        self.check_object("fc", "ck", 0, data)

    def test_abandoned_upload_swept(self):
        """A partial multipart upload idle past --upload-timeout is swept: its multipart upload
        aborted (DELETE ?uploadId=), its state and head objects removed."""
        self.start(PART_ARGS + ["--upload-timeout", "1"], via_proxy=True)
        self.stub.Begin(pb.BeginRequest(job="ab", name="ck", world_size=1), timeout=10)
        data = shard_bytes(0, 2 * PART)
        held, fut = self.hold_until_part_stored("ab", "ck", 0, data, PART + MiB)
        held.cut = True
        held.release.set()
        with self.assertRaises(grpc.RpcError):
            fut.result(timeout=30)
        wait_for("the sweep to remove the partial upload",
                 lambda: self.d.store_files("ab") == [], timeout=20)
        aborts = [t for m, t in self.proxy.requests if m == "DELETE" and "uploadId=" in t]
        self.assertTrue(aborts, self.proxy.requests)
        self.assertIn("/%s/%s?uploadId=" % (self.s3.bucket, self.key("ab", "ck_shard_0.shard")),
                      aborts[0])
        self.assertEqual(self.status("ab", "ck", 0).held_bytes, 0)

    def test_orphan_multipart_uploads_aborted(self):
        """The sweep lists the multipart uploads under the prefix and aborts exactly those that
        no upload state names and that are older than --upload-timeout: one started by a daemon
        that died before its first state (made here with boto3), not a young one, not a live
        upload's (old too, but its state names it), nor that of a live upload whose state was
        removed behind the daemon's back (it runs here); both live uploads then complete."""
        self.start(PART_ARGS + ["--upload-timeout", "10"], via_proxy=True, multipart=True)
        self.stub.Begin(pb.BeginRequest(job="or", name="ck", world_size=2), timeout=10)
        data = [shard_bytes(r, 2 * PART + 999 + r) for r in range(2)]
        helds = [self.hold_until_part_stored("or", "ck", r, data[r], PART + MiB)
                 for r in range(2)]
        lives = []
        for r in range(2):
            text = self.d.store_read("or", ".ck_shard_%d.shard.part" % r).decode()
            lives.append(re.search(r"^upload_id (\S+)$", text, re.M).group(1))
        self.d.store_remove("or", ".ck_shard_1.shard.part")
        orphan = self.boto.create_multipart_upload(
            Bucket=self.s3.bucket, Key=self.key("or", "gone_shard_1.shard"))["UploadId"]
        self.boto.upload_part(Bucket=self.s3.bucket, Key=self.key("or", "gone_shard_1.shard"),
                              UploadId=orphan, PartNumber=2, Body=b"x" * 1000)
        young = self.boto.create_multipart_upload(
            Bucket=self.s3.bucket, Key=self.key("or", "new_shard_0.shard"))["UploadId"]
        long_ago = time.time() - 3600
        for u in [orphan] + lives:
            self.proxy.set_initiated(u, long_ago)
        abort = ("DELETE", "/%s/%s?uploadId=%s" % (self.s3.bucket,
                                                    self.key("or", "gone_shard_1.shard"), orphan))
        wait_for("the sweep's abort of the orphan", lambda: abort in self.proxy.requests,
                 timeout=8)
        aborts = [t for m, t in self.proxy.requests if m == "DELETE" and "uploadId=" in t]
        self.assertEqual(aborts, [abort[1]], self.d.log())
        self.assertGreaterEqual(self.proxy.seen("GET", "uploads="), 1)
        ids = [u[1] for u in self.proxy.uploads()]
        self.assertNotIn(orphan, ids)
        self.assertIn(young, ids)
        for u in lives:
            self.assertIn(u, ids)
        # The proxy saw the DELETE when it was sent; the daemon logs it once answered.
        wait_for("the abort's log line", lambda: "event=s3_upload_aborted" in self.d.log())
        wait_for("the sweep's count", lambda: "uploads_aborted=1 " in self.d.log())
        for r, (held, fut) in enumerate(helds):
            held.release.set()
            rec = fut.result(timeout=30)
            self.assertEqual(rec.sha256, hashlib.sha256(data[r]).hexdigest())
        self.assertEqual(self.stub.Commit(pb.CheckpointRef(job="or", name="ck"), timeout=30).state,
                         pb.COMPLETE)
        self.deep_ok("or", "ck")
        for r in range(2):
            self.check_object("or", "ck", r, data[r])

    def test_rejected_part_sent_again(self):
        """A part the store rejects as received (400 BadDigest) is sent again: the upload
        completes, deep verify is OK and the bytes are the client's."""
        self.start(PART_ARGS, via_proxy=True)
        self.stub.Begin(pb.BeginRequest(job="bd", name="ck", world_size=1), timeout=10)
        data = shard_bytes(0, 3 * PART + 4321)
        self.proxy.set(bad_digest=1, match="partNumber=3&")
        rec = self.upload("bd", "ck", 0, data)
        self.assertEqual(rec.sha256, hashlib.sha256(data).hexdigest())
        self.assertEqual(self.proxy.seen("PUT", "partNumber=3&"), 2)
        self.assertEqual(self.stub.Commit(pb.CheckpointRef(job="bd", name="ck"), timeout=30).state,
                         pb.COMPLETE)
        self.deep_ok("bd", "ck")
        self.check_object("bd", "ck", 0, data)

    def test_slow_store_removals_do_not_starve_uploads(self):
        """Issue 25 item 7: the store answers the removals of one job's checkpoints at 2 bytes a
        second. 24 aborted checkpoints queue 24 removals; they hold at most --s3-store-jobs
        workers (4 here), so an upload and commit of another job, whose chunks, finish and
        commit need workers of the same pool, go through at once. Before the cap the removals
        took all 16 workers until the store's answers ended, and the upload waited."""
        self.start(["--s3-store-jobs", "4", "--s3-request-timeout", "120"], via_proxy=True)
        names = ["ck%02d" % i for i in range(24)]
        for n in names:
            self.stub.Begin(pb.BeginRequest(job="slowjob", name=n, world_size=1), timeout=10)
        self.proxy.clear_log()
        # A removal lists the checkpoint's keys (prefix=<prefix>/slowjob/ckNN), then deletes.
        self.proxy.set(slow_body=10 ** 6, match="slowjob")
        try:
            for n in names:
                self.stub.Abort(pb.CheckpointRef(job="slowjob", name=n), timeout=10)
            wait_for("removals stuck on the store",
                     lambda: self.proxy.seen("GET", "slowjob") >= 4, timeout=15)
            time.sleep(1.0)  # any removal the cap would let by has reached the store by now
            self.assertEqual(self.proxy.seen("GET", "slowjob"), 4,
                             "4 removals at once, each in its first listing")
            t0 = time.monotonic()
            self.stub.Begin(pb.BeginRequest(job="fast", name="ck", world_size=1), timeout=10)
            data = shard_bytes(0, 4000)
            self.upload("fast", "ck", 0, data, timeout=20)
            self.assertEqual(
                self.stub.Commit(pb.CheckpointRef(job="fast", name="ck"), timeout=20).state,
                pb.COMPLETE)
            self.assertLess(time.monotonic() - t0, 15)
            self.check_object("fast", "ck", 0, data)
        finally:
            self.proxy.passthrough()  # the dribbled answers end at once: the removals finish
        wait_for("every removal's two listings",
                 lambda: self.proxy.seen("GET", "slowjob") >= 2 * len(names), timeout=60)

    def test_health_reports_a_failing_store(self):
        """Issue 25 item 7: once every request to the store failed for --s3-unhealthy-after
        (3 at least), grpc.health.v1 reports sluice.v1.Checkpoints NOT_SERVING (the feed
        services and "" stay SERVING: feeding does not need the store), the metric
        sluice_store_healthy is 0; after the store answers again (a probe sees it, no traffic
        needed), SERVING."""
        from sluice._health import health_pb2, health_pb2_grpc
        self.start(["--s3-unhealthy-after", "2", "--s3-retry-deadline", "1",
                    "--s3-request-timeout", "1"], via_proxy=True)
        health = health_pb2_grpc.HealthStub(self.channel)

        def status(service):
            return health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status

        SERVING, NOT_SERVING = (health_pb2.HealthCheckResponse.SERVING,
                                health_pb2.HealthCheckResponse.NOT_SERVING)
        self.assertEqual(status("sluice.v1.Checkpoints"), SERVING)
        self.stub.Begin(pb.BeginRequest(job="h", name="ck", world_size=1), timeout=10)
        self.proxy.set(reset=10 ** 9)  # every connection reset: the store is down
        t0 = time.monotonic()
        self.status("h", "ck", 0)  # its request to the store fails (held 0): the count starts
        wait_for("Checkpoints NOT_SERVING",
                 lambda: status("sluice.v1.Checkpoints") == NOT_SERVING, timeout=20)
        self.assertGreaterEqual(time.monotonic() - t0, 2.0)
        self.assertEqual(status(""), SERVING)
        self.assertEqual(status("sluice.v1.Feed"), SERVING)
        self.assertIn("event=store_unhealthy", self.d.log())
        self.proxy.passthrough()
        wait_for("Checkpoints SERVING again",
                 lambda: status("sluice.v1.Checkpoints") == SERVING, timeout=20)
        self.assertIn("event=store_recovered", self.d.log())
        self.assertEqual(self.status("h", "ck", 0).held_bytes, 0)


class BadConfigTest(unittest.TestCase):
    """A store sluiced cannot use is a clear error at start: exit code 1 and a message saying
    what is wrong; the secret key never in what it prints."""

    SECRET = "sEcReT-never-shown-8c1f0e"

    def run_daemon(self, args, env=None, timeout=60):
        with tempfile.TemporaryDirectory() as tmp:
            p = subprocess.run([SLUICED, "--listen", "127.0.0.1:0", "--data-dir",
                                os.path.join(tmp, "data")] + args, capture_output=True,
                               text=True, timeout=timeout, env=dict(os.environ, **(env or {})))
        return p.returncode, p.stdout + p.stderr

    def test_bad_config_exits_1(self):
        keys = {"AWS_ACCESS_KEY_ID": S3Server.access_key, "AWS_SECRET_ACCESS_KEY": self.SECRET}
        with S3Server() as s3, FaultProxy(s3.port, verify=(s3.access_key, s3.secret_key)) as px:
            cases = [
                ("missing bucket", ["--store", "s3://nobucket/p", "--s3-endpoint", s3.endpoint,
                                    "--s3-retry-deadline", "2"], "nobucket"),
                ("wrong secret key", ["--store", "s3://%s/p" % s3.bucket, "--s3-endpoint",
                                      px.endpoint, "--s3-retry-deadline", "2"],
                 "403"),
                ("unknown store", ["--store", "gs://x"], "gs://x"),
                ("bad addressing", ["--store", "s3://%s/p" % s3.bucket, "--s3-endpoint",
                                    s3.endpoint, "--s3-addressing", "bogus"], "bogus"),
            ]
            for what, args, says in cases:
                with self.subTest(what):
                    t0 = time.monotonic()
                    rc, out = self.run_daemon(args, env=keys)
                    self.assertEqual(rc, 1, out)
                    self.assertIn(says, out)
                    self.assertIn("event=store_failed", out)
                    self.assertNotIn(self.SECRET, out)
                    self.assertLess(time.monotonic() - t0, 30, out)
            self.assertTrue(any(code == "SignatureDoesNotMatch" for _, _, code in px.rejected))

    def test_secret_never_shown(self):
        """The secret key from the environment or a credentials file is in neither argv, the
        log, `sluice info` nor /metrics."""
        with S3Server() as s3, tempfile.TemporaryDirectory() as tmp:
            creds = os.path.join(tmp, "creds")
            with open(creds, "w") as f:
                f.write("access_key_id = %s\nsecret_access_key = %s\n"
                        % (s3.access_key, self.SECRET))
            os.chmod(creds, 0o600)
            for how, env, args in (
                    ("env", {"AWS_ACCESS_KEY_ID": s3.access_key,
                             "AWS_SECRET_ACCESS_KEY": self.SECRET}, []),
                    ("file", {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""},
                     ["--s3-credentials-file", creds])):
                with self.subTest(how):
                    d = Daemon(store="s3", s3=s3, env=env,
                               args=args + ["--metrics-listen", "127.0.0.1:0"])
                    if how == "file":
                        d.env.pop("AWS_ACCESS_KEY_ID")
                        d.env.pop("AWS_SECRET_ACCESS_KEY")
                    try:
                        d.start()
                        ch = grpc.insecure_channel(d.addr)
                        stub = pbg.CheckpointsStub(ch)
                        stub.Begin(pb.BeginRequest(job="s", name="ck", world_size=1), timeout=10)
                        stub.UploadShard(upload_requests("s", "ck", 0, b"x" * 1000), timeout=30)
                        stub.Commit(pb.CheckpointRef(job="s", name="ck"), timeout=30)
                        ch.close()
                        with open("/proc/%d/cmdline" % d.proc.pid, "rb") as f:
                            self.assertNotIn(self.SECRET.encode(), f.read())
                        info = cli("info", addr=d.addr, timeout=30)
                        self.assertEqual(info.returncode, 0, info.stderr)
                        self.assertIn("s3://", info.stdout)
                        info_json = cli("info", "--json", addr=d.addr, timeout=30)
                        m = wait_for("the metrics port in the log", lambda: re.search(
                            r"event=metrics_listening addr=\S+ port=(\d+)", d.log()))
                        with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % m.group(1),
                                                    timeout=10) as r:
                            metrics = r.read().decode()
                        self.assertIn("sluice_", metrics)
                        self.assertEqual(d.stop(), 0, d.log())
                        for text in (d.log(), info.stdout, info.stderr, info_json.stdout,
                                     metrics):
                            self.assertNotIn(self.SECRET, text)
                        self.assertEqual(d.sanitizer_reports(), [], d.log())
                    finally:
                        d.cleanup()


if __name__ == "__main__":
    unittest.main()
