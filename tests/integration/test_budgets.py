"""Budgets of issue 13, item 6 (docs/hardening.md, "Hardening II"): the real daemon on 127.0.0.1
and real grpcio clients play the attacks that found them.

- never-read index streams with max_chunk 65536 hold the daemon at its per-stream byte budget;
- readers parked on the next epoch up to the job's feed budget leave its uploads alone;
- deep verifies cancelled at once stop hashing, and a trainer's upload + commit stays fast;
- an upload header announcing a huge size reserves a window of disk, not the whole size, and the
  reservation goes when the upload is cancelled or idle (the partial file stays resumable);
- empty upload chunks do not keep an upload alive past the idle timeout.
"""
import hashlib
import os
import threading
import time
import unittest

import grpc

from sluice.v1 import checkpoint_pb2 as ck
from sluice.v1 import feed_pb2 as fd
from test_limits import Base, wait_for

C = grpc.StatusCode
# In an ASan build freed memory stays in the allocator's quarantine and every allocation carries
# redzones: RSS there measures the sanitizer, not the budget (rpc_test send_budget checks the
# budget's logic in that build).
SANITIZED = os.environ.get("SLUICE_SANITIZE", "") != ""
KiB = 1 << 10
MiB = 1 << 20
HEADER = 88
STREAM_BUDGET = 256 * KiB  # server/feed/stream.c STREAM_BYTES
RESERVE_WINDOW = 64 * MiB  # server/ckpt/internal.h UP_RESERVE
# Filesystems allocate in blocks and extents; what the checks below allow beyond the figures.
SLACK = 4 * MiB


def vm_rss(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def header(job, name, rank, size, offset=0, sha=""):
    return ck.UploadShardRequest(header=ck.ShardHeader(
        job=job, checkpoint=name, rank=rank, data_size=size, offset=offset, sha256=sha,
        tensors=[ck.TensorInfo(name="t", dtype="uint8", shape=[size], offset=0, size=size)]))


def data_of(n, seed=b"budget"):
    block = hashlib.sha256(seed).digest() * (MiB // 32)
    return (block * (n // MiB + 1))[:n]


def finished_within(f, secs):
    """True if the call f ended (with any status) within secs."""
    try:
        f.exception(timeout=secs)
        return True
    except grpc.FutureTimeoutError:
        return False


def chunks(data, step=MiB):
    for i in range(0, len(data), step):
        yield ck.UploadShardRequest(chunk=data[i:i + step])


class StreamMemoryTest(Base):
    """400 never-read StreamIndices with max_chunk 65536 held 1.3 MB each before the budget."""
    ARGS = []
    STREAMS = 400

    def test_never_read_streams_stay_under_the_byte_budget(self):
        # 2^30 samples: indices take 5 bytes each on the wire, 320 KiB per 65536 of them.
        self.dataset_and_job("big", 1 << 30, world=self.STREAMS)
        # Without BDP probing the client grants each stream its initial 64 KiB window and no
        # more, as an attacker would; with it, grpcio takes in megabytes per stream itself.
        chs = [grpc.insecure_channel(self.d.addr, options=[("grpc.http2.bdp_probe", 0)])
               for _ in range(8)]
        self.channels += chs
        # Warm up with a few streams, so allocator arenas and gRPC's buffers are in place.
        warm = [self.stalled_indices("big", r, ch=chs[r % 8], max_chunk=65536)
                for r in range(16)]
        time.sleep(1.0)
        base = vm_rss(self.d.proc.pid)
        held = [self.stalled_indices("big", r, ch=chs[r % 8], max_chunk=65536)
                for r in range(16, self.STREAMS)]
        # The daemon fills each stream up to its budget: wait until RSS stops growing.
        last, stable = vm_rss(self.d.proc.pid), 0
        while stable < 10:
            time.sleep(0.1)
            now = vm_rss(self.d.proc.pid)
            stable = stable + 1 if now <= last + 256 * KiB else 0
            last = max(last, now)
        per = (last - base) / len(held)
        print("\n%d never-read streams (max_chunk 65536): VmRSS %.1f -> %.1f MiB, %.0f KiB per "
              "stream" % (len(held), base / MiB, last / MiB, per / KiB))
        if not SANITIZED:
            self.assertLess(per, STREAM_BUDGET, "daemon RSS per never-read stream")
        # Every stream still serves its reader.
        for s in (warm + held)[:8]:
            self.assertEqual(fd.IndexChunk.FromString(next(s)).epoch, 0)
        for s in warm + held:
            s.cancel()


class ParkedReadersTest(Base):
    """Readers parked on epoch current+1 fill the job's feed budget; its uploads still go."""
    LIMIT = 128
    ARGS = ["--max-job-streams", str(LIMIT), "--metrics-listen", "127.0.0.1:0"]

    def test_parked_readers_do_not_refuse_uploads(self):
        self.dataset_and_job("j", 1000, world=self.LIMIT)
        chs = [self.channel() for _ in range(4)]
        parked = [self.server_stream("/sluice.v1.Feed/StreamIndices", fd.StreamIndicesRequest(
            job="j", rank=r, epoch=1, epoch_set=True), ch=chs[r % 4]) for r in range(self.LIMIT)]
        # Every parked reader is held by the daemon (streams of other kinds: none yet).
        wait_for(lambda: self.counter(self.metrics(), "sluice_rpc_active_streams") >= self.LIMIT,
                 "%d parked readers" % self.LIMIT)
        # One more reader of the job is refused: its feed budget is used up.
        refusal = self.assert_refused(lambda: next(self.server_stream(
            "/sluice.v1.Feed/StreamIndices",
            fd.StreamIndicesRequest(job="j", rank=0, epoch=1, epoch_set=True))),
            "for job 'j' (limit %d)" % self.LIMIT).details()
        # The trainer's upload of the same job is not refused, and nor is a download.
        self.unary("/sluice.v1.Checkpoints/Begin",
                   ck.BeginRequest(job="j", name="c", step=1, world_size=1))
        data = data_of(3 * MiB)
        got = ck.UploadShardResponse.FromString(self.client_stream_future(
            "/sluice.v1.Checkpoints/UploadShard",
            iter([header("j", "c", 0, len(data))] + list(chunks(data)))).result(timeout=60))
        self.assertEqual(got.sha256, hashlib.sha256(data).hexdigest())
        self.unary("/sluice.v1.Checkpoints/Commit", ck.CheckpointRef(job="j", name="c"))
        back = b"".join(ck.DownloadShardResponse.FromString(m).data for m in self.server_stream(
            "/sluice.v1.Checkpoints/DownloadShard", ck.DownloadShardRequest(job="j", name="c",
                                                                            rank=0)))
        self.assertEqual(back, data)
        # The refusal names the kind whose budget is used up.
        self.assertIn("too many concurrent feed streams for job 'j' (limit %d)" % self.LIMIT,
                      refusal)
        for s in parked:
            s.cancel()
        self.assertGreaterEqual(self.counter(
            self.metrics(), 'sluice_rpc_refused_total{limit="max_job_streams"}'), 1)


class DeepVerifyTest(Base):
    """300 deep Verify calls cancelled after 50 ms kept hashing on the shared worker pool and
    stretched a trainer's upload + commit from 0.00 s to 25 s."""
    ARGS = ["--metrics-listen", "127.0.0.1:0"]
    RANKS = 4
    SHARD = 32 * MiB
    CALLS = 300

    def upload_commit(self, job, name, data):
        t0 = time.monotonic()
        self.unary("/sluice.v1.Checkpoints/Begin",
                   ck.BeginRequest(job=job, name=name, step=1, world_size=1))
        self.client_stream_future("/sluice.v1.Checkpoints/UploadShard", iter(
            [header(job, name, 0, len(data))] + list(chunks(data)))).result(timeout=120)
        self.unary("/sluice.v1.Checkpoints/Commit", ck.CheckpointRef(job=job, name=name),
                   timeout=120)
        return time.monotonic() - t0

    def test_cancelled_deep_verifies_stop(self):
        self.unary("/sluice.v1.Checkpoints/Begin",
                   ck.BeginRequest(job="big", name="c", step=1, world_size=self.RANKS))
        for r in range(self.RANKS):
            d = data_of(self.SHARD, b"rank-%d" % r)
            self.client_stream_future("/sluice.v1.Checkpoints/UploadShard", iter(
                [header("big", "c", r, len(d))] + list(chunks(d, 4 * MiB)))).result(timeout=120)
        self.unary("/sluice.v1.Checkpoints/Commit", ck.CheckpointRef(job="big", name="c"))
        small = data_of(MiB, b"trainer")
        quiet = self.upload_commit("t", "c0", small)
        # The attack: deep verifies of 4 x 32 MiB, each cancelled by its 50 ms deadline.
        verify = self.ch.unary_unary("/sluice.v1.Checkpoints/Verify",
                                     request_serializer=ck.VerifyRequest.SerializeToString,
                                     response_deserializer=ck.VerifyResponse.FromString)
        req = ck.VerifyRequest(job="big", name="c", mode=ck.DEEP)
        calls = [verify.future(req, timeout=0.05) for _ in range(self.CALLS)]
        codes = {}
        for f in calls:
            try:
                f.result()
                codes["OK"] = codes.get("OK", 0) + 1
            except grpc.RpcError as e:
                codes[e.code().name] = codes.get(e.code().name, 0) + 1
        loaded = self.upload_commit("t", "c1", small)
        print("\ndeep verifies %s; upload + commit of 1 MiB: %.2f s quiet, %.2f s after %d "
              "cancelled deep verifies" % (codes, quiet, loaded, self.CALLS))
        self.assertLess(loaded, 3.0, "upload + commit while cancelled deep verifies hash")
        # The hashing workers stop soon after.
        text = self.metrics()
        self.assertIn("sluice_verify_hash_jobs ", text)
        wait_for(lambda: self.counter(self.metrics(), "sluice_verify_hash_jobs") == 0,
                 "deep-verify hash jobs back to 0", timeout=5)
        # A deep verify left alone still works.
        v = ck.VerifyResponse.FromString(self.unary(
            "/sluice.v1.Checkpoints/Verify", ck.VerifyRequest(job="big", name="c",
                                                              mode=ck.DEEP), timeout=120))
        self.assertTrue(v.ok, str(v))


class ReserveTest(Base):
    """A header announcing the free space minus 64 KiB, then nothing, reserved the disk for the
    upload timeout (1 h); other jobs' uploads and Begin failed with no space."""
    ARGS = ["--idle-timeout", "1"]

    def blocked(self, first, release):
        for m in first:
            yield m
        release.wait(120)

    def part(self, job, name, rank):
        return os.path.join(self.d.data_dir, "checkpoints", job,
                            ".%s_shard_%d.shard.part" % (name, rank))

    def allocated(self, path):
        return os.stat(path).st_blocks * 512

    def status(self, job, name, rank):
        return ck.UploadStatusResponse.FromString(self.unary(
            "/sluice.v1.Checkpoints/UploadStatus",
            ck.UploadStatusRequest(job=job, checkpoint=name, rank=rank)))

    def test_huge_announcement_reserves_a_window_released_on_cancel(self):
        self.unary("/sluice.v1.Checkpoints/Begin",
                   ck.BeginRequest(job="j", name="c", step=1, world_size=1))
        huge = 2 << 30
        release = threading.Event()
        part = self.part("j", "c", 0)
        try:
            f = self.client_stream_future("/sluice.v1.Checkpoints/UploadShard", self.blocked(
                [header("j", "c", 0, huge)], release))
            wait_for(lambda: os.path.exists(part) and self.status("j", "c", 0).in_progress,
                     "the partial file")
            time.sleep(0.2)
            held = self.allocated(part)
            print("\nheader announcing %d GiB: %.1f MiB reserved" % (huge >> 30, held / MiB))
            self.assertLessEqual(held, RESERVE_WINDOW + SLACK, "space reserved ahead")
            f.cancel()
        finally:
            release.set()
        wait_for(lambda: not self.status("j", "c", 0).in_progress, "the upload to stop")
        wait_for(lambda: self.allocated(part) <= SLACK, "the reservation to be released")
        print("cancelled: %.1f MiB allocated" % (self.allocated(part) / MiB))

    def test_reservation_grows_is_released_when_idle_and_resumes(self):
        self.unary("/sluice.v1.Checkpoints/Begin",
                   ck.BeginRequest(job="j", name="c", step=1, world_size=1))
        data = data_of(160 * MiB)
        half = 80 * MiB
        release = threading.Event()
        part = self.part("j", "c", 0)
        try:
            f = self.client_stream_future("/sluice.v1.Checkpoints/UploadShard", self.blocked(
                [header("j", "c", 0, len(data))] + list(chunks(data[:half], 4 * MiB)), release))
            wait_for(lambda: os.path.exists(part) and os.stat(part).st_size >= HEADER + half,
                     "the first 80 MiB written")
            held = self.allocated(part)
            print("\n80 of 160 MiB written: %.1f MiB allocated" % (held / MiB))
            self.assertLessEqual(held, half + RESERVE_WINDOW + SLACK, "space reserved ahead")
            self.assertGreaterEqual(held, half)
            # The idle timeout ends the upload; what is beyond the written bytes is released.
            with self.assertRaises(grpc.RpcError) as e:
                f.result(timeout=60)
            self.assertEqual(e.exception.code(), C.DEADLINE_EXCEEDED, e.exception.details())
        finally:
            release.set()
        wait_for(lambda: not self.status("j", "c", 0).in_progress, "the upload to stop")
        wait_for(lambda: self.allocated(part) <= half + SLACK, "the reservation to be released")
        print("ended as idle: %.1f MiB allocated" % (self.allocated(part) / MiB))
        st = self.status("j", "c", 0)
        self.assertEqual(st.held_bytes, half)
        got = ck.UploadShardResponse.FromString(self.client_stream_future(
            "/sluice.v1.Checkpoints/UploadShard", iter(
                [header("j", "c", 0, len(data), offset=half,
                        sha=hashlib.sha256(data).hexdigest())] +
                list(chunks(data[half:], 4 * MiB)))).result(timeout=120))
        self.assertEqual(got.data_size, len(data))
        self.unary("/sluice.v1.Checkpoints/Commit", ck.CheckpointRef(job="j", name="c"))


class EmptyChunkTest(Base):
    """Empty chunks reset the idle timer, so a rank could be held 'in progress' forever."""
    ARGS = ["--idle-timeout", "1"]

    def drip(self, first, empty, stop):
        for m in first:
            yield m
        while not stop.wait(0.2):
            yield empty

    def test_empty_chunks_do_not_keep_an_upload_alive(self):
        self.unary("/sluice.v1.Checkpoints/Begin",
                   ck.BeginRequest(job="j", name="c", step=1, world_size=1))
        stop = threading.Event()
        t0 = time.monotonic()
        try:
            f = self.client_stream_future("/sluice.v1.Checkpoints/UploadShard", self.drip(
                [header("j", "c", 0, 2 * MiB), ck.UploadShardRequest(chunk=b"x" * 1000)],
                ck.UploadShardRequest(chunk=b""), stop))
            done = finished_within(f, 8)
            took = time.monotonic() - t0
            self.assertTrue(done, "an upload sending empty chunks still open after 8 s "
                            "(--idle-timeout 1)")
        finally:
            stop.set()
        self.assertEqual(f.code(), C.DEADLINE_EXCEEDED, f.details())
        self.assertIn("no progress for 1 s", f.details())
        print("\nempty chunks every 0.2 s: ended after %.1f s" % took)
        self.assertLess(took, 4.0)

    def test_empty_lengths_do_not_keep_an_upload_alive(self):
        self.unary("/sluice.v1.Datasets/Create", fd.CreateDatasetRequest(name="ds", samples=1000))
        stop = threading.Event()
        try:
            f = self.client_stream_future("/sluice.v1.Datasets/UploadLengths", self.drip(
                [fd.UploadLengthsRequest(name="ds", lengths=[3] * 100)],
                fd.UploadLengthsRequest(name="ds"), stop))
            done = finished_within(f, 8)
            self.assertTrue(done, "a lengths upload sending empty messages still open after 8 s "
                            "(--idle-timeout 1)")
        finally:
            stop.set()
        self.assertEqual(f.code(), C.DEADLINE_EXCEEDED, f.details())
        self.assertIn("no progress for 1 s", f.details())


if __name__ == "__main__":
    unittest.main()
