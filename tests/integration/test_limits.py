"""Enforced limits of sluiced: concurrent calls (--max-calls), streams per job
(--max-job-streams) and the idle timeout (--idle-timeout), with the real daemon on 127.0.0.1 and
real grpcio clients (docs/hardening.md, "Limits").

A "stalled" stream below is a server stream the client opened and then stopped reading: grpcio
asks the transport for a message only when the iterator is advanced, so HTTP/2 flow control
stops the daemon's sends once the windows are full.
"""
import hashlib
import os
import re
import threading
import time
import unittest
import urllib.request

import grpc

from sluice.v1 import checkpoint_pb2 as ck
from sluice.v1 import feed_pb2 as fd
from sluice._health import health_pb2 as hp
from sltest import Daemon

C = grpc.StatusCode
MiB = 1 << 20


def ser(m):
    return m if isinstance(m, bytes) else m.SerializeToString()


def wait_for(pred, what, timeout=60.0):
    """Poll pred() until true; the bound only keeps a broken daemon from hanging the test."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


class Base(unittest.TestCase):
    ARGS = []

    def setUp(self):
        self.d = Daemon(args=self.ARGS).start()
        self.ch = grpc.insecure_channel(self.d.addr)
        self.channels = [self.ch]

    def tearDown(self):
        for ch in self.channels:
            ch.close()
        rc = self.d.stop()
        reports = self.d.sanitizer_reports()
        log = self.d.log()
        self.d.cleanup()
        self.assertEqual(rc, 0, "sluiced exit code\n" + log)
        self.assertEqual(reports, [], "sanitizer reports\n" + log)

    def channel(self):
        """A channel of its own (its own HTTP/2 connection)."""
        ch = grpc.insecure_channel(self.d.addr)
        self.channels.append(ch)
        return ch

    def unary(self, method, req, timeout=30, ch=None):
        return (ch or self.ch).unary_unary(method, request_serializer=ser,
                                           response_deserializer=None)(req, timeout=timeout)

    def server_stream(self, method, req, timeout=120, ch=None):
        return (ch or self.ch).unary_stream(method, request_serializer=ser,
                                            response_deserializer=None)(req, timeout=timeout)

    def client_stream_future(self, method, it, timeout=120, ch=None):
        return (ch or self.ch).stream_unary(method, request_serializer=ser,
                                            response_deserializer=None).future(it, timeout=timeout)

    def health(self):
        r = hp.HealthCheckResponse.FromString(
            self.unary("/grpc.health.v1.Health/Check", hp.HealthCheckRequest(service="")))
        return r.status

    def dataset_and_job(self, job, samples, world=4, dataset="ds", **kw):
        try:
            self.unary("/sluice.v1.Datasets/Create",
                       fd.CreateDatasetRequest(name=dataset, samples=samples))
        except grpc.RpcError as e:
            if e.code() != C.ALREADY_EXISTS:
                raise
        self.unary("/sluice.v1.Jobs/Create", fd.CreateJobRequest(
            job=fd.Job(name=job, dataset=dataset, world_size=world, seed=7, **kw)))

    def stalled_indices(self, job, rank, ch=None, max_chunk=0):
        """An index stream whose first message was read (so the daemon holds the call), then
        left unread."""
        it = self.server_stream("/sluice.v1.Feed/StreamIndices",
                                fd.StreamIndicesRequest(job=job, rank=rank, max_chunk=max_chunk),
                                ch=ch)
        next(it)
        return it

    def assert_refused(self, fn, needle, code=C.RESOURCE_EXHAUSTED):
        with self.assertRaises(grpc.RpcError) as e:
            fn()
        self.assertEqual(e.exception.code(), code, e.exception.details())
        self.assertIn(needle, e.exception.details() or "")
        return e.exception

    def metrics(self):
        """The daemon's /metrics text (it runs with --metrics-listen 127.0.0.1:0)."""
        wait_for(lambda: re.search(r"event=metrics_listening .*port=(\d+)", self.d.log()),
                 "the metrics endpoint")
        port = re.search(r"event=metrics_listening .*port=(\d+)", self.d.log()).group(1)
        with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=10) as r:
            return r.read().decode()

    def counter(self, text, series):
        m = re.search(r"^%s (\S+)$" % re.escape(series), text, re.M)
        return float(m.group(1)) if m else 0.0


class MaxCallsTest(Base):
    ARGS = ["--max-calls", "4", "--metrics-listen", "127.0.0.1:0"]

    def test_cap_refuses_the_fifth_call_keeps_health_and_recovers(self):
        self.dataset_and_job("j", 1 << 30)
        streams = [self.stalled_indices("j", r) for r in range(4)]
        needle = "too many concurrent calls (limit 4)"
        # Every kind of call is refused at once while 4 are open.
        self.assert_refused(lambda: self.unary("/sluice.v1.Admin/GetInfo", b""), needle)
        self.assert_refused(lambda: next(self.server_stream(
            "/sluice.v1.Feed/StreamIndices", fd.StreamIndicesRequest(job="j", rank=0))), needle)
        self.assert_refused(lambda: self.client_stream_future(
            "/sluice.v1.Datasets/UploadLengths",
            iter([fd.UploadLengthsRequest(name="ds", lengths=[1])])).result(), needle)
        # Also on another connection, and health checks still answer.
        self.assert_refused(lambda: self.unary("/sluice.v1.Jobs/List", b"", ch=self.channel()),
                            needle)
        self.assertEqual(self.health(), hp.HealthCheckResponse.SERVING)
        # Health calls have a budget of their own, apart from --max-calls (test_attacks.py
        # checks that Watch streams cannot use it up): a Watch is served at the cap.
        w = self.server_stream("/grpc.health.v1.Health/Watch", hp.HealthCheckRequest(service=""))
        self.assertEqual(hp.HealthCheckResponse.FromString(next(w)).status,
                         hp.HealthCheckResponse.SERVING)
        w.cancel()
        self.assertEqual(self.health(), hp.HealthCheckResponse.SERVING)
        # Nothing of the refused upload is left, the open streams still flow.
        self.assertEqual([f for f in os.listdir(os.path.join(self.d.data_dir, "datasets"))
                          if f.endswith(".tmp")], [])
        for s in streams:
            self.assertTrue(len(next(s)) > 0)
        # When the streams end, calls are served again.
        for s in streams:
            s.cancel()

        def served():
            try:
                self.unary("/sluice.v1.Admin/GetInfo", b"")
                return True
            except grpc.RpcError as e:
                self.assertEqual(e.code(), C.RESOURCE_EXHAUSTED, e.details())
                return False
        wait_for(served, "a call to be served after the streams ended")
        more = [self.stalled_indices("j", r) for r in range(4)]
        for s in more:
            s.cancel()
        wait_for(served, "a call to be served after the second round")
        # Four refusals above (GetInfo, StreamIndices, UploadLengths, Jobs.List), and those of
        # the polls, all counted. The metrics endpoint is not a gRPC call: it answers anyway.
        self.assertGreaterEqual(self.counter(
            self.metrics(), 'sluice_rpc_refused_total{limit="max_calls"}'), 4)


class MaxJobStreamsTest(Base):
    ARGS = ["--max-job-streams", "2", "--metrics-listen", "127.0.0.1:0"]

    def test_per_job_stream_limit(self):
        self.dataset_and_job("a", 1 << 30)
        self.dataset_and_job("b", 1 << 30)
        held = [self.stalled_indices("a", 0), self.stalled_indices("a", 1)]
        needle = "too many concurrent feed streams for job 'a' (limit 2)"
        self.assert_refused(lambda: next(self.server_stream(
            "/sluice.v1.Feed/StreamIndices", fd.StreamIndicesRequest(job="a", rank=2))), needle)
        # Checkpoint streams of the same job have budgets of their own, one per kind: with the
        # feed budget used up an upload of the job goes through, and so do two downloads.
        self.unary("/sluice.v1.Checkpoints/Begin",
                   ck.BeginRequest(job="a", name="c1", step=1, world_size=1))
        data = hashlib.sha256(b"streams").digest() * (3 * MiB // 32)  # 3 MiB: downloads stall
        hdr = ck.UploadShardRequest(header=ck.ShardHeader(
            job="a", checkpoint="c1", rank=0, data_size=len(data),
            tensors=[ck.TensorInfo(name="t", dtype="uint8", shape=[len(data)], offset=0,
                                   size=len(data))]))
        self.client_stream_future("/sluice.v1.Checkpoints/UploadShard", iter(
            [hdr] + [ck.UploadShardRequest(chunk=data[i:i + MiB])
                     for i in range(0, len(data), MiB)])).result(timeout=60)
        self.unary("/sluice.v1.Checkpoints/Commit", ck.CheckpointRef(job="a", name="c1"))
        # Without BDP probing the client grants a stream 64 KiB, so a download it does not read
        # stays open (with it, grpcio would take in the whole 3 MiB itself).
        slow = grpc.insecure_channel(self.d.addr, options=[("grpc.http2.bdp_probe", 0)])
        self.channels.append(slow)
        downloads = []
        for _ in range(2):
            it = self.server_stream("/sluice.v1.Checkpoints/DownloadShard",
                                    ck.DownloadShardRequest(job="a", name="c1", rank=0), ch=slow)
            next(it)
            downloads.append(it)
        self.assert_refused(lambda: next(self.server_stream(
            "/sluice.v1.Checkpoints/DownloadShard",
            ck.DownloadShardRequest(job="a", name="c1", rank=0))),
            "too many concurrent download streams for job 'a' (limit 2)")
        # Two uploads that sent their header hold the upload budget: a third is refused.
        self.unary("/sluice.v1.Checkpoints/Begin",
                   ck.BeginRequest(job="a", name="c2", step=2, world_size=3))
        release = threading.Event()

        def header_then_wait(rank):
            yield ck.UploadShardRequest(header=ck.ShardHeader(
                job="a", checkpoint="c2", rank=rank, data_size=10,
                tensors=[ck.TensorInfo(name="t", dtype="uint8", shape=[10], offset=0, size=10)]))
            release.wait(60)
        uploads = [self.client_stream_future("/sluice.v1.Checkpoints/UploadShard",
                                             header_then_wait(r)) for r in range(2)]

        def status(rank):
            return ck.UploadStatusResponse.FromString(self.unary(
                "/sluice.v1.Checkpoints/UploadStatus",
                ck.UploadStatusRequest(job="a", checkpoint="c2", rank=rank)))
        wait_for(lambda: status(0).in_progress and status(1).in_progress, "two uploads running")
        self.assert_refused(lambda: self.client_stream_future(
            "/sluice.v1.Checkpoints/UploadShard", header_then_wait(2)).result(),
            "too many concurrent upload streams for job 'a' (limit 2)")
        release.set()
        for f in uploads:
            f.cancel()
        for it in downloads:
            it.cancel()
        # Another job is not affected: two streams of b, then a third is refused naming b.
        other = [self.stalled_indices("b", 0), self.stalled_indices("b", 1)]
        self.assert_refused(lambda: next(self.server_stream(
            "/sluice.v1.Feed/StreamIndices", fd.StreamIndicesRequest(job="b", rank=3))),
            "too many concurrent feed streams for job 'b' (limit 2)")
        # Unary calls on the job are not streams: they still work.
        self.unary("/sluice.v1.Epochs/Get", fd.GetEpochRequest(job="a"))
        # Ending a's streams frees its slots: a new stream of a is served.
        for s in held:
            s.cancel()

        def served():
            try:
                it = self.server_stream("/sluice.v1.Feed/StreamIndices",
                                        fd.StreamIndicesRequest(job="a", rank=2))
                self.assertEqual(fd.IndexChunk.FromString(next(it)).epoch, 0)
                it.cancel()
                return True
            except grpc.RpcError as e:
                self.assertEqual(e.code(), C.RESOURCE_EXHAUSTED, e.details())
                return False
        wait_for(served, "a stream of a to be served after a's streams ended")
        for s in other:
            s.cancel()
        self.assertGreaterEqual(self.counter(
            self.metrics(), 'sluice_rpc_refused_total{limit="max_job_streams"}'), 4)


class IdleTimeoutTest(Base):
    ARGS = ["--idle-timeout", "1", "--metrics-listen", "127.0.0.1:0"]

    def tearDown(self):
        # Every test here but one ends at least one call by the idle timeout.
        # The counter goes up when the ended call's state is freed, which may trail the status
        # the client saw (an upload's state waits for its worker): poll for it.
        try:
            if self.d.proc.poll() is None and not getattr(self, "no_idle_end", False):
                wait_for(lambda: self.counter(self.metrics(),
                                              "sluice_rpc_idle_timeouts_total") >= 1,
                         "sluice_rpc_idle_timeouts_total >= 1", timeout=10)
        finally:
            super().tearDown()

    def blocked_iter(self, first, release):
        """Yields `first`, then waits (sending nothing) until `release` is set."""
        for m in first:
            yield m
        release.wait(120)

    def test_silent_upload_is_ended_and_resumable(self):
        self.unary("/sluice.v1.Checkpoints/Begin",
                   ck.BeginRequest(job="cj", name="c", step=1, world_size=1))
        data = hashlib.sha256(b"idle").digest() * 4096  # 128 KiB
        hdr = ck.ShardHeader(job="cj", checkpoint="c", rank=0, data_size=len(data),
                             tensors=[ck.TensorInfo(name="t", dtype="uint8", shape=[len(data)],
                                                    offset=0, size=len(data))])
        release = threading.Event()
        try:
            # The header and the first 64 KiB, then silence.
            f = self.client_stream_future("/sluice.v1.Checkpoints/UploadShard", self.blocked_iter(
                [ck.UploadShardRequest(header=hdr), ck.UploadShardRequest(chunk=data[:65536])],
                release))
            with self.assertRaises(grpc.RpcError) as e:
                f.result(timeout=120)
        finally:
            release.set()
        self.assertEqual(e.exception.code(), C.DEADLINE_EXCEEDED, e.exception.details())
        self.assertIn("no message for 1 s", e.exception.details())

        def status():
            return ck.UploadStatusResponse.FromString(self.unary(
                "/sluice.v1.Checkpoints/UploadStatus",
                ck.UploadStatusRequest(job="cj", checkpoint="c", rank=0)))
        # The partial file is kept for a resume once the upload has stopped.
        wait_for(lambda: not status().in_progress, "the upload to stop")
        st = status()
        self.assertEqual(st.held_bytes, 65536, str(st))
        self.assertFalse(st.stored)
        # Resume from the held offset and finish.
        hdr.offset = st.held_bytes
        hdr.sha256 = hashlib.sha256(data).hexdigest()
        self.client_stream_future("/sluice.v1.Checkpoints/UploadShard", iter(
            [ck.UploadShardRequest(header=hdr),
             ck.UploadShardRequest(chunk=data[65536:])])).result(timeout=60)
        self.unary("/sluice.v1.Checkpoints/Commit", ck.CheckpointRef(job="cj", name="c"))
        v = ck.VerifyResponse.FromString(self.unary(
            "/sluice.v1.Checkpoints/Verify", ck.VerifyRequest(job="cj", name="c", mode=ck.DEEP)))
        self.assertTrue(v.ok, str(v))

    def test_upload_that_sends_nothing_is_ended(self):
        release = threading.Event()
        try:
            f = self.client_stream_future("/sluice.v1.Checkpoints/UploadShard",
                                          self.blocked_iter([], release))
            self.assertRaisesRegex(grpc.RpcError, "no message for 1 s", f.result, timeout=120)
            self.assertEqual(f.code(), C.DEADLINE_EXCEEDED)
        finally:
            release.set()

    def test_silent_lengths_upload_is_ended_without_temp_file(self):
        self.unary("/sluice.v1.Datasets/Create", fd.CreateDatasetRequest(name="ds", samples=1000))
        dsdir = os.path.join(self.d.data_dir, "datasets")
        for first in ([], [fd.UploadLengthsRequest(name="ds", lengths=[3] * 100)]):
            release = threading.Event()
            try:
                f = self.client_stream_future("/sluice.v1.Datasets/UploadLengths",
                                              self.blocked_iter(first, release))
                self.assertRaisesRegex(grpc.RpcError, "no message for 1 s", f.result,
                                       timeout=120)
                self.assertEqual(f.code(), C.DEADLINE_EXCEEDED)
            finally:
                release.set()
            # The temporary file goes when the call's state is freed, just after the status.
            wait_for(lambda: [n for n in os.listdir(dsdir) if n.startswith(".")] == [],
                     "the temporary lengths file to be removed")
        got = fd.Dataset.FromString(self.unary("/sluice.v1.Datasets/Get",
                                               fd.GetDatasetRequest(name="ds")))
        self.assertFalse(got.lengths_sha256)

    def test_waiting_stream_is_not_idle(self):
        """A stream that waits for the server (the next epoch), not for its client, stays."""
        self.no_idle_end = True
        self.dataset_and_job("j", 100, world=1, manual_advance=True)
        it = self.server_stream("/sluice.v1.Feed/StreamIndices",
                                fd.StreamIndicesRequest(job="j", rank=0, epoch=1, epoch_set=True))
        # Longer than the idle timeout (if the machine is slower, the test proves less but
        # cannot fail wrongly).
        time.sleep(2.5)
        self.unary("/sluice.v1.Epochs/Next", fd.NextEpochRequest(job="j"))
        got = fd.IndexChunk.FromString(next(it))
        self.assertEqual(got.epoch, 1)
        it.cancel()
        self.assertEqual(self.counter(self.metrics(), "sluice_rpc_idle_timeouts_total"), 0)


class SamplerIdleTest(Base):
    """The PyTorch samplers reopen a stream the daemon ended as idle, at the position reached:
    a training loop that pauses longer than --idle-timeout loses and repeats nothing.

    The timeout is 5 s here, not 1: a reader that is merely slow (Python consuming a stream of
    small indices, under a sanitized daemon on a loaded machine) frees flow-control window only
    every so often, and with 1 s a stream that is being read could be ended too."""
    ARGS = ["--idle-timeout", "5", "--metrics-listen", "127.0.0.1:0"]

    def setUp(self):
        try:
            import sluice.torch  # noqa: F401
        except ImportError as e:
            self.skipTest("torch not importable: %s" % e)
        super().setUp()

    def pause_until_idle_ended(self, n):
        """The consumer stops reading; wait until the daemon has ended n streams as idle."""
        wait_for(lambda: self.counter(self.metrics(), "sluice_rpc_idle_timeouts_total") >= n,
                 "the daemon to end the paused stream")

    def read_past_reconnect(self, sampler, it, k, limit):
        """Read what the transport had buffered before the daemon ended the stream, through the
        sampler's reconnect, then k more (at most `limit` in all)."""
        out = []
        while sampler.reconnects == 0 and len(out) < limit:
            out.append(next(it))
        for _ in range(k):
            out.append(next(it))
        return out

    def test_index_sampler_resumes_after_pause(self):
        from sluice.client import Client
        from sluice.torch import DistributedSampler
        k = 100000
        sampler = DistributedSampler(num_samples=8 << 20, num_replicas=1, rank=0, shuffle=False,
                                     address=self.d.addr, job="s", client=Client(self.d.addr))
        it = iter(sampler)
        got = [next(it) for _ in range(k)]
        # 8 Mi indices are tens of MiB on the wire: more than the windows hold, so the daemon's
        # sends stall while the loop "evaluates".
        self.pause_until_idle_ended(1)
        got += self.read_past_reconnect(sampler, it, k, 8 << 20)
        # shuffle none, one rank: the share is 0, 1, 2, ... in order.
        self.assertEqual(got, list(range(len(got))))
        self.assertEqual(sampler.reconnects, 1)
        self.assertEqual(sampler.position, len(got))
        it.close()

    def test_batch_sampler_resumes_after_pause(self):
        from sluice.client import Client
        from sluice.torch import BatchSampler
        n, k = 2 << 20, 50000
        c = Client(self.d.addr)
        c.create_dataset("bd", n)
        c.upload_lengths("bd", [i % 100 + 1 for i in range(n)])
        c.create_job("bj", "bd", 1, batching={"max_batch_size": 1, "max_seq_len": 128})
        sampler = BatchSampler(num_replicas=1, rank=0, address=self.d.addr, job="bj", client=c)
        it = iter(sampler)
        got = [next(it) for _ in range(k)]
        # 2 Mi one-sample batches: again more than the windows hold.
        self.pause_until_idle_ended(1)
        got += self.read_past_reconnect(sampler, it, k, n)
        self.assertEqual(sampler.reconnects, 1)
        it.close()
        # The same epoch's plan read in one go, without a pause.
        ref = []
        stream = c.stream_batches("bj", 0, epoch=0)
        for chunk in stream:
            ref += [list(b.indices) for b in chunk.batches]
            if len(ref) >= len(got):
                break
        stream.cancel()
        self.assertEqual(got, ref[:len(got)])


class StalledReaderTest(Base):
    ARGS = []

    def rss(self):
        with open("/proc/%d/status" % self.d.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def stall_and_measure(self, n=4):
        self.dataset_and_job("big", 1 << 33, world=1)
        chs = [self.channel() for _ in range(n)]
        # Warm up: a stream read for a while, so the daemon's allocator and gRPC's buffers
        # reach their working size before the baseline.
        warm = self.server_stream("/sluice.v1.Feed/StreamIndices",
                                  fd.StreamIndicesRequest(job="big", rank=0))
        try:
            for _ in range(200):
                next(warm)
        except grpc.RpcError as e:
            # With a 1 s idle timeout a reader slowed down by a loaded machine may be ended
            # too; the warm-up has done its job either way.
            self.assertEqual(e.code(), C.DEADLINE_EXCEEDED, e.details())
        warm.cancel()
        streams = [self.stalled_indices("big", 0, ch=ch) for ch in chs]
        base = self.rss()
        peak = base
        # Each stream would carry 2^33 indices (tens of GiB); unread, they must hold the daemon
        # at its window of queued messages. Sample for a few seconds.
        for _ in range(30):
            time.sleep(0.1)
            peak = max(peak, self.rss())
        return streams, base, peak

    def test_stalled_readers_keep_memory_flat(self):
        streams, base, peak = self.stall_and_measure()
        print("\nstalled readers: VmRSS %.1f MiB -> peak %.1f MiB" % (base / MiB, peak / MiB))
        self.assertLess(peak - base, 32 * MiB)
        # The streams are alive (no idle timeout by default within this time) and still serve.
        for s in streams:
            self.assertTrue(len(next(s)) > 0)
            s.cancel()


class StalledReaderIdleTest(StalledReaderTest):
    ARGS = ["--idle-timeout", "1"]

    def test_stalled_readers_keep_memory_flat(self):
        streams, base, peak = self.stall_and_measure()
        self.assertLess(peak - base, 32 * MiB)
        # The idle timeout ends every stalled stream; the client reads what the transport had
        # buffered, then gets the status.
        for s in streams:
            with self.assertRaises(grpc.RpcError) as e:
                for _ in s:
                    pass
            self.assertEqual(e.exception.code(), C.DEADLINE_EXCEEDED, e.exception.details())
            self.assertIn("no send progress for 1 s", e.exception.details())
        # Nothing is left holding a slot: a new stream starts and reads.
        it = self.server_stream("/sluice.v1.Feed/StreamIndices",
                                fd.StreamIndicesRequest(job="big", rank=0))
        self.assertTrue(len(next(it)) > 0)
        it.cancel()


if __name__ == "__main__":
    unittest.main()
