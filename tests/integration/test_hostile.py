"""Hostile input for every RPC of every service (docs/hardening.md has the same table in prose).

The real daemon on 127.0.0.1 (port 0, temporary data dir) and a real grpcio client. Every case
sends one hostile request (or stream) and checks the status code and that the message names the
bad value. After each group the daemon must still serve (health, Admin.GetInfo), and a COMPLETE
checkpoint created at the start must still deep-verify with its files byte for byte untouched and
no stray file next to them.
"""
import hashlib
import os
import struct
import time
import unittest

import grpc

from sluice.v1 import checkpoint_pb2 as ck
from sluice.v1 import feed_pb2 as fd
from sluice._health import health_pb2 as hp
from sltest import Daemon

C = grpc.StatusCode
MiB = 1 << 20
U64 = (1 << 64) - 1
U32 = (1 << 32) - 1
I32_MIN = -(1 << 31)
MAX_SHARD = 2 * MiB  # --max-shard-bytes of the test daemon

# Kinds of call.
UNARY, CSTREAM, SSTREAM = "unary", "client-stream", "server-stream"

# Names that must never become a path or a catalog key.
BAD_NAMES = [
    ("empty", ""),
    ("dotdot", ".."),
    ("parent", "../x"),
    ("slash", "a/b"),
    ("absolute", "/etc"),
    ("leading dot", ".hidden"),
    ("inner dotdot", "a..b"),
    ("space", "a b"),
    ("newline", "a\nb"),
    ("non-ascii", "\u00e9t\u00e9"),
    ("overlong 129", "x" * 129),
    ("huge 100000", "y" * 100000),
]
# A NUL byte inside a string field. protobuf-c ends C strings at the first NUL, so unless the
# decoder notices, "nul\0../x" is served as "nul" (see test_nul_bytes_in_strings).
NUL_NAME = "nul\x00../x"


def ser(m):
    return m if isinstance(m, bytes) else m.SerializeToString()


def needle_of(value):
    """The part of a bad value the status message must quote (messages cap quoted values)."""
    if value == "":
        return "''"
    return value[:40]


def stream_of(msgs, fail_at=None):
    """Yield msgs; with fail_at, raise after that many (the client aborts: a truncated stream)."""
    for i, m in enumerate(msgs):
        if fail_at is not None and i == fail_at:
            raise RuntimeError("client gives up mid-stream")
        yield m


def shard_data(rank, size):
    seed = hashlib.sha256(b"hostile-%d" % rank).digest()
    return (seed * (size // len(seed) + 1))[:size]


def header(job="cj", name="w", rank=0, data_size=16, tensors=None, sha="", offset=0):
    if tensors is None:
        tensors = [ck.TensorInfo(name="t", dtype="uint8", shape=[data_size], offset=0,
                                 size=data_size)]
    return ck.UploadShardRequest(header=ck.ShardHeader(
        job=job, checkpoint=name, rank=rank, tensors=tensors, data_size=data_size, sha256=sha,
        offset=offset))


def chunk(b):
    return ck.UploadShardRequest(chunk=b)


def tensor(name="t", dtype="uint8", shape=(16,), offset=0, size=16):
    return ck.TensorInfo(name=name, dtype=dtype, shape=list(shape), offset=offset, size=size)


def with_field(msg, field, wire):
    """msg's encoding plus one raw length-delimited field (bytes a normal client cannot send)."""
    return ser(msg) + bytes([field << 3 | 2, len(wire)]) + wire


GARBAGE = b"\xff\xff\xff\xff"  # an incomplete varint tag: not a valid message of any type
TRUNCATED = ser(fd.CreateDatasetRequest(name="truncated", samples=5))[:-3]


class HostileTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon(args=["--max-shard-bytes", str(MAX_SHARD)]).start()
        cls.ch = grpc.insecure_channel(cls.d.addr, options=[
            ("grpc.max_send_message_length", 64 * MiB),
            ("grpc.max_receive_message_length", 64 * MiB)])
        cls.lengths = [i % 50 + 1 for i in range(100)]
        cls.rpc(UNARY, "/sluice.v1.Datasets/Create", fd.CreateDatasetRequest(name="ds", samples=100))
        cls.rpc(CSTREAM, "/sluice.v1.Datasets/UploadLengths",
                [fd.UploadLengthsRequest(name="ds", lengths=cls.lengths)])
        cls.rpc(UNARY, "/sluice.v1.Datasets/Create",
                fd.CreateDatasetRequest(name="nolen", samples=10))
        cls.rpc(UNARY, "/sluice.v1.Jobs/Create",
                fd.CreateJobRequest(job=fd.Job(name="j", dataset="ds", world_size=4, seed=1)))
        cls.rpc(UNARY, "/sluice.v1.Jobs/Create", fd.CreateJobRequest(job=fd.Job(
            name="jb", dataset="ds", world_size=2,
            batching=fd.BatchConfig(max_batch_size=4, max_seq_len=64))))
        # The checkpoint that must survive everything: COMPLETE, 2 ranks.
        cls.rpc(UNARY, "/sluice.v1.Checkpoints/Begin",
                ck.BeginRequest(job="cj", name="keep", step=1, world_size=2))
        cls.keep_data = [shard_data(r, 300 * 1024 + r) for r in range(2)]
        for r, data in enumerate(cls.keep_data):
            cls.rpc(CSTREAM, "/sluice.v1.Checkpoints/UploadShard",
                    [header(name="keep", rank=r, data_size=len(data)),
                     chunk(data[:100000]), chunk(data[100000:])])
        cls.rpc(UNARY, "/sluice.v1.Checkpoints/Commit", ck.CheckpointRef(job="cj", name="keep"))
        # A WRITING checkpoint the upload cases aim at.
        cls.rpc(UNARY, "/sluice.v1.Checkpoints/Begin",
                ck.BeginRequest(job="cj", name="w", step=2, world_size=4))
        cls.keep_files = cls.snapshot()

    @classmethod
    def tearDownClass(cls):
        cls.ch.close()
        rc = cls.d.stop()
        reports = cls.d.sanitizer_reports()
        log = cls.d.log()
        cls.d.cleanup()
        assert rc == 0, "sluiced exit code %r\n%s" % (rc, log)
        assert reports == [], "sanitizer reports\n" + log

    # -- plumbing --

    @classmethod
    def rpc(cls, kind, method, req, timeout=30):
        if kind == UNARY:
            return cls.ch.unary_unary(method, request_serializer=ser,
                                      response_deserializer=None)(req, timeout=timeout)
        if kind == CSTREAM:
            it = req if hasattr(req, "__next__") else iter(req)
            return cls.ch.stream_unary(method, request_serializer=ser,
                                       response_deserializer=None)(it, timeout=timeout)
        return list(cls.ch.unary_stream(method, request_serializer=ser,
                                        response_deserializer=None)(req, timeout=timeout))

    @classmethod
    def snapshot(cls):
        """SHA-256 of every file under checkpoints/cj that belongs to 'keep'."""
        out = {}
        jd = os.path.join(cls.d.data_dir, "checkpoints", "cj")
        for f in sorted(os.listdir(jd)):
            if f.startswith("keep"):
                with open(os.path.join(jd, f), "rb") as fh:
                    out[f] = hashlib.sha256(fh.read()).hexdigest()
        return out

    def run_cases(self, cases):
        """cases: (label, kind, method, request, expected code or None for OK, needle)."""
        for label, kind, method, req, code, needle in cases:
            with self.subTest(method=method, case=label):
                if code is None:
                    self.rpc(kind, method, req)
                    continue
                with self.assertRaises(grpc.RpcError) as e:
                    self.rpc(kind, method, req)
                got, details = e.exception.code(), e.exception.details() or ""
                self.assertEqual(got, code, "%s %s: %s" % (method, label, details))
                if needle is not None:
                    self.assertIn(needle, details, "%s %s" % (method, label))
                if "client aborts" in label:
                    self.settle()
        self.assert_still_serving()

    def settle(self, timeout=10.0):
        """After a client gave up on an upload the server keeps the partial file for a resume
        and ends the upload when its running write returns: wait for that, since the next case
        uploads the same rank (a server-side failure is answered only once the upload ended, so
        it needs no wait)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = ck.UploadStatusResponse.FromString(self.rpc(
                UNARY, "/sluice.v1.Checkpoints/UploadStatus",
                ck.UploadStatusRequest(job="cj", checkpoint="w", rank=0)))
            if not st.in_progress:
                return
            time.sleep(0.01)
        self.fail("upload of cj/w rank 0 still in progress after %.0f s" % timeout)

    def assert_still_serving(self):
        self.assertIsNone(self.d.proc.poll(), "sluiced died\n" + self.d.log())
        r = hp.HealthCheckResponse.FromString(
            self.rpc(UNARY, "/grpc.health.v1.Health/Check", hp.HealthCheckRequest(service="")))
        self.assertEqual(r.status, hp.HealthCheckResponse.SERVING)
        self.rpc(UNARY, "/sluice.v1.Admin/GetInfo", b"")
        v = ck.VerifyResponse.FromString(self.rpc(
            UNARY, "/sluice.v1.Checkpoints/Verify",
            ck.VerifyRequest(job="cj", name="keep", mode=ck.DEEP)))
        self.assertTrue(v.ok, str(v))
        self.assertEqual(self.snapshot(), self.keep_files)
        got = ck.Checkpoint.FromString(self.rpc(UNARY, "/sluice.v1.Checkpoints/Get",
                                                ck.CheckpointRef(job="cj", name="keep")))
        self.assertEqual(got.state, ck.COMPLETE)
        # Nothing but shards, metadata and part files of the WRITING checkpoint in the job dir.
        jd = os.path.join(self.d.data_dir, "checkpoints")
        self.assertEqual(sorted(os.listdir(jd)), ["cj"])
        for f in os.listdir(os.path.join(jd, "cj")):
            self.assertTrue(f.startswith(("keep", "w_", ".w_", "ok")), f)

    def name_cases(self, kind, method, make, what):
        """Every bad name in the field `make` fills, expecting INVALID_ARGUMENT naming it."""
        cases = [("%s %s" % (what, label), kind, method, make(v), C.INVALID_ARGUMENT,
                  needle_of(v) if label != "huge 100000" else "yyyy")
                 for label, v in BAD_NAMES]
        cases.append(("garbage bytes", kind, method, [GARBAGE] if kind == CSTREAM else GARBAGE,
                      C.INVALID_ARGUMENT, None))
        return cases

    # -- grpc.health.v1 and Admin --

    def test_health_and_admin(self):
        H = "/grpc.health.v1.Health/"
        self.run_cases([
            ("unknown service", UNARY, H + "Check", hp.HealthCheckRequest(service="nope"),
             C.NOT_FOUND, "nope"),
            ("huge service name", UNARY, H + "Check",
             hp.HealthCheckRequest(service="s" * 100000), C.NOT_FOUND, "ssss"),
            ("garbage bytes", UNARY, H + "Check", GARBAGE, C.INVALID_ARGUMENT, None),
            ("truncated message", UNARY, H + "Check", b"\x0a\x05ab", C.INVALID_ARGUMENT, None),
            ("garbage bytes", SSTREAM, H + "Watch", GARBAGE, C.INVALID_ARGUMENT, None),
            ("garbage bytes", UNARY, "/sluice.v1.Admin/GetInfo", GARBAGE, C.INVALID_ARGUMENT,
             None),
            ("unknown field (ignored)", UNARY, "/sluice.v1.Admin/GetInfo", b"\xf8\x06\x01", None,
             None),
            ("unknown method", UNARY, "/sluice.v1.Admin/Nope", b"", C.UNIMPLEMENTED, None),
            ("unknown service", UNARY, "/sluice.v9.Nope/Get", b"", C.UNIMPLEMENTED, None),
        ])

    # -- Datasets --

    def test_datasets(self):
        D = "/sluice.v1.Datasets/"
        up = D + "UploadLengths"
        cases = self.name_cases(UNARY, D + "Create",
                                lambda n: fd.CreateDatasetRequest(name=n, samples=10), "name")
        cases += [
            ("zero samples", UNARY, D + "Create", fd.CreateDatasetRequest(name="z", samples=0),
             C.INVALID_ARGUMENT, "0"),
            ("existing", UNARY, D + "Create", fd.CreateDatasetRequest(name="ds", samples=10),
             C.ALREADY_EXISTS, "ds"),
            ("truncated message", UNARY, D + "Create", TRUNCATED, C.INVALID_ARGUMENT, None),
        ]
        cases += self.name_cases(CSTREAM, up,
                                 lambda n: [fd.UploadLengthsRequest(name=n, lengths=[1])], "name")
        cases += [
            ("empty stream", CSTREAM, up, [], C.INVALID_ARGUMENT, None),
            ("unknown dataset", CSTREAM, up, [fd.UploadLengthsRequest(name="nope", lengths=[1])],
             C.NOT_FOUND, "nope"),
            ("too few", CSTREAM, up, [fd.UploadLengthsRequest(name="nolen", lengths=[1, 2, 3])],
             C.INVALID_ARGUMENT, "got 3 lengths"),
            ("too many", CSTREAM, up, [fd.UploadLengthsRequest(name="nolen", lengths=[1] * 11)],
             C.INVALID_ARGUMENT, "10"),
            ("too many over two messages", CSTREAM, up,
             [fd.UploadLengthsRequest(name="nolen", lengths=[1] * 6),
              fd.UploadLengthsRequest(lengths=[1] * 6)], C.INVALID_ARGUMENT, "10"),
            ("length 0", CSTREAM, up, [fd.UploadLengthsRequest(name="nolen", lengths=[1, 0] * 5)],
             C.INVALID_ARGUMENT, "length 0"),
            ("other name in a later message", CSTREAM, up,
             [fd.UploadLengthsRequest(name="nolen", lengths=[1] * 5),
              fd.UploadLengthsRequest(name="ds", lengths=[1] * 5)], C.INVALID_ARGUMENT, "ds"),
            ("garbage after a good message", CSTREAM, up,
             [fd.UploadLengthsRequest(name="nolen", lengths=[1] * 5), GARBAGE],
             C.INVALID_ARGUMENT, None),
            # grpcio cancels the call and reports the iterator's exception as UNKNOWN.
            ("truncated stream (client aborts)", CSTREAM, up,
             stream_of([fd.UploadLengthsRequest(name="nolen", lengths=[1] * 5)] * 2, fail_at=1),
             C.UNKNOWN, None),
            ("replace lengths of a dataset in use", CSTREAM, up,
             [fd.UploadLengthsRequest(name="ds", lengths=[1] * 100)], C.FAILED_PRECONDITION,
             "ds"),
        ]
        cases += self.name_cases(UNARY, D + "Get", lambda n: fd.GetDatasetRequest(name=n), "name")
        cases += [
            ("unknown", UNARY, D + "Get", fd.GetDatasetRequest(name="nope"), C.NOT_FOUND, "nope"),
            ("garbage bytes", UNARY, D + "List", GARBAGE, C.INVALID_ARGUMENT, None),
        ]
        cases += self.name_cases(UNARY, D + "Delete", lambda n: fd.DeleteDatasetRequest(name=n),
                                 "name")
        cases += [
            ("unknown", UNARY, D + "Delete", fd.DeleteDatasetRequest(name="nope"), C.NOT_FOUND,
             "nope"),
            ("in use by jobs", UNARY, D + "Delete", fd.DeleteDatasetRequest(name="ds"),
             C.FAILED_PRECONDITION, "ds"),
        ]
        self.run_cases(cases)
        # Nothing above changed the stored lengths or left a temp file.
        ds = fd.Dataset.FromString(self.rpc(UNARY, D + "Get", fd.GetDatasetRequest(name="ds")))
        self.assertEqual(ds.lengths_sha256, hashlib.sha256(
            struct.pack("<%dI" % len(self.lengths), *self.lengths)).hexdigest())
        nolen = fd.Dataset.FromString(self.rpc(UNARY, D + "Get",
                                               fd.GetDatasetRequest(name="nolen")))
        self.assertFalse(nolen.has_lengths)
        self.assertEqual(sorted(os.listdir(os.path.join(self.d.data_dir, "datasets"))),
                         ["ds.lengths"])

    # -- Jobs --

    def test_jobs(self):
        J = "/sluice.v1.Jobs/"

        def job(**kw):
            base = dict(name="new", dataset="ds", world_size=2)
            base.update(kw)
            return fd.CreateJobRequest(job=fd.Job(**base))

        def batching(**kw):
            base = dict(max_batch_size=4, max_seq_len=64)
            base.update(kw)
            return job(batching=fd.BatchConfig(**base))

        cases = self.name_cases(UNARY, J + "Create", lambda n: job(name=n), "job")
        cases += [c for c in self.name_cases(UNARY, J + "Create", lambda n: job(dataset=n),
                                             "dataset") if c[0] != "garbage bytes"]
        cases += [
            ("missing job", UNARY, J + "Create", fd.CreateJobRequest(), C.INVALID_ARGUMENT,
             "job"),
            ("unknown dataset", UNARY, J + "Create", job(dataset="nope"), C.NOT_FOUND, "nope"),
            ("existing", UNARY, J + "Create", job(name="j"), C.ALREADY_EXISTS, "j"),
            ("world 0", UNARY, J + "Create", job(world_size=0), C.INVALID_ARGUMENT, "0"),
            ("world 65537", UNARY, J + "Create", job(world_size=65537), C.INVALID_ARGUMENT,
             "65537"),
            ("world u32 max", UNARY, J + "Create", job(world_size=U32), C.INVALID_ARGUMENT,
             str(U32)),
            ("mesh product", UNARY, J + "Create",
             job(world_size=8, mesh=fd.Mesh(dp=2, tp=2, cp=1, pp=1)), C.INVALID_ARGUMENT, "8"),
            ("mesh huge", UNARY, J + "Create",
             job(world_size=16, mesh=fd.Mesh(dp=U32, tp=U32, cp=U32, pp=U32)),
             C.INVALID_ARGUMENT, None),
            ("mesh order", UNARY, J + "Create",
             job(world_size=4, mesh=fd.Mesh(dp=2, tp=2, cp=1, pp=1, order="dp,dp,xx,../")),
             C.INVALID_ARGUMENT, "dp,dp"),
            ("partition", UNARY, J + "Create", job(partition="diagonal"), C.INVALID_ARGUMENT,
             "diagonal"),
            ("shuffle", UNARY, J + "Create", job(shuffle="../random"), C.INVALID_ARGUMENT,
             "../random"),
            ("chunked without chunk_size", UNARY, J + "Create", job(partition="chunked"),
             C.INVALID_ARGUMENT, "chunk"),
            ("batch size 0", UNARY, J + "Create", batching(max_batch_size=0),
             C.INVALID_ARGUMENT, "max_batch_size"),
            ("seq len 0", UNARY, J + "Create", batching(max_seq_len=0), C.INVALID_ARGUMENT,
             "max_seq_len"),
            ("seq len u32 max", UNARY, J + "Create", batching(max_seq_len=U32),
             C.RESOURCE_EXHAUSTED, str(U32)),
            ("strategy", UNARY, J + "Create", batching(strategy="greedy"), C.INVALID_ARGUMENT,
             "greedy"),
            ("cost", UNARY, J + "Create", batching(cost="free"), C.INVALID_ARGUMENT, "free"),
            ("max_tokens below seq len", UNARY, J + "Create", batching(max_tokens=3),
             C.INVALID_ARGUMENT, "3"),
            ("multiple above batch size", UNARY, J + "Create",
             batching(batch_size_multiple=1000), C.INVALID_ARGUMENT, "1000"),
            ("truncated message", UNARY, J + "Create", ser(job())[:-2], C.INVALID_ARGUMENT, None),
        ]
        cases += self.name_cases(UNARY, J + "Get", lambda n: fd.GetJobRequest(name=n), "name")
        cases += [
            ("unknown", UNARY, J + "Get", fd.GetJobRequest(name="nope"), C.NOT_FOUND, "nope"),
            ("garbage bytes", UNARY, J + "List", GARBAGE, C.INVALID_ARGUMENT, None),
        ]
        cases += self.name_cases(UNARY, J + "Delete", lambda n: fd.DeleteJobRequest(name=n),
                                 "name")
        cases += [
            ("unknown", UNARY, J + "Delete", fd.DeleteJobRequest(name="nope"), C.NOT_FOUND,
             "nope"),
        ]
        cases += self.name_cases(UNARY, J + "Resize",
                                 lambda n: fd.ResizeJobRequest(name=n, world_size=2), "name")
        cases += [
            ("unknown", UNARY, J + "Resize", fd.ResizeJobRequest(name="nope", world_size=2),
             C.NOT_FOUND, "nope"),
            ("world 0", UNARY, J + "Resize", fd.ResizeJobRequest(name="j", world_size=0),
             C.INVALID_ARGUMENT, "0"),
            ("world u32 max", UNARY, J + "Resize", fd.ResizeJobRequest(name="j", world_size=U32),
             C.INVALID_ARGUMENT, str(U32)),
            ("mesh product", UNARY, J + "Resize",
             fd.ResizeJobRequest(name="j", world_size=4, mesh=fd.Mesh(dp=3, tp=1, cp=1, pp=1)),
             C.INVALID_ARGUMENT, None),
        ]
        self.run_cases(cases)
        names = fd.ListJobsResponse.FromString(self.rpc(UNARY, J + "List",
                                                        fd.ListJobsRequest()))
        self.assertEqual(sorted(x.name for x in names.jobs), ["j", "jb"])
        j = fd.Job.FromString(self.rpc(UNARY, J + "Get", fd.GetJobRequest(name="j")))
        self.assertEqual((j.world_size, j.epoch), (4, 0))

    # -- Epochs --

    def test_epochs(self):
        E = "/sluice.v1.Epochs/"
        cases = self.name_cases(UNARY, E + "Get", lambda n: fd.GetEpochRequest(job=n), "job")
        cases += [("unknown", UNARY, E + "Get", fd.GetEpochRequest(job="nope"), C.NOT_FOUND,
                   "nope")]
        cases += self.name_cases(UNARY, E + "ReportProgress",
                                 lambda n: fd.ReportProgressRequest(job=n, rank=0, position=1),
                                 "job")
        rp = E + "ReportProgress"
        cases += [
            ("unknown", UNARY, rp, fd.ReportProgressRequest(job="nope", rank=0, position=1),
             C.NOT_FOUND, "nope"),
            ("rank 4 of 4", UNARY, rp, fd.ReportProgressRequest(job="j", rank=4, position=1),
             C.INVALID_ARGUMENT, "rank 4"),
            ("rank u32 max", UNARY, rp, fd.ReportProgressRequest(job="j", rank=U32, position=1),
             C.INVALID_ARGUMENT, str(U32)),
            ("position past the share", UNARY, rp,
             fd.ReportProgressRequest(job="j", rank=0, position=26), C.INVALID_ARGUMENT, "26"),
            ("position u64 max", UNARY, rp,
             fd.ReportProgressRequest(job="j", rank=0, position=U64), C.INVALID_ARGUMENT,
             str(U64)),
            ("future epoch", UNARY, rp,
             fd.ReportProgressRequest(job="j", rank=0, epoch=U64, position=1),
             C.FAILED_PRECONDITION, str(U64)),
        ]
        cases += self.name_cases(UNARY, E + "Next", lambda n: fd.NextEpochRequest(job=n), "job")
        rw = E + "Rewind"
        cases += self.name_cases(UNARY, rw, lambda n: fd.RewindRequest(job=n, world_size=1), "job")
        cases += [
            ("unknown", UNARY, rw, fd.RewindRequest(job="nope", world_size=1), C.NOT_FOUND,
             "nope"),
            ("world 0", UNARY, rw, fd.RewindRequest(job="j"), C.INVALID_ARGUMENT, "world_size 0"),
            ("world u32 max", UNARY, rw, fd.RewindRequest(job="j", world_size=2**32 - 1),
             C.INVALID_ARGUMENT, str(2**32 - 1)),
            ("to world u32 max", UNARY, rw,
             fd.RewindRequest(job="j", world_size=1, to_world_size=2**32 - 1), C.INVALID_ARGUMENT,
             str(2**32 - 1)),
            ("epoch u64 max", UNARY, rw, fd.RewindRequest(job="j", world_size=1, epoch=U64),
             C.FAILED_PRECONDITION, str(U64)),
            ("position u64 max", UNARY, rw, fd.RewindRequest(job="j", world_size=4, position=U64),
             C.INVALID_ARGUMENT, str(U64)),
        ]
        cases += [
            ("unknown", UNARY, E + "Next", fd.NextEpochRequest(job="nope"), C.NOT_FOUND, "nope"),
            ("wrong expected epoch", UNARY, E + "Next",
             fd.NextEpochRequest(job="j", expect_epoch=U64, check_epoch=True),
             C.FAILED_PRECONDITION, str(U64)),
        ]
        self.run_cases(cases)
        st = fd.EpochState.FromString(self.rpc(UNARY, E + "Get", fd.GetEpochRequest(job="j")))
        self.assertEqual(st.epoch, 0)
        self.assertEqual([r.position for r in st.ranks], [0, 0, 0, 0])

    # -- Feed --

    def test_feed(self):
        F = "/sluice.v1.Feed/"
        si, sb = F + "StreamIndices", F + "StreamBatches"
        cases = self.name_cases(SSTREAM, si, lambda n: fd.StreamIndicesRequest(job=n), "job")
        cases += [
            ("unknown", SSTREAM, si, fd.StreamIndicesRequest(job="nope"), C.NOT_FOUND, "nope"),
            ("rank 4 of 4", SSTREAM, si, fd.StreamIndicesRequest(job="j", rank=4),
             C.INVALID_ARGUMENT, "rank 4 out of range [0, 4)"),
            ("rank u32 max", SSTREAM, si, fd.StreamIndicesRequest(job="j", rank=U32),
             C.INVALID_ARGUMENT, str(U32)),
            ("max_chunk 65537", SSTREAM, si, fd.StreamIndicesRequest(job="j", max_chunk=65537),
             C.INVALID_ARGUMENT, "65537"),
            ("max_chunk u32 max", SSTREAM, si, fd.StreamIndicesRequest(job="j", max_chunk=U32),
             C.INVALID_ARGUMENT, str(U32)),
            ("position past the share", SSTREAM, si,
             fd.StreamIndicesRequest(job="j", position=26, position_set=True),
             C.INVALID_ARGUMENT, "26"),
            ("position u64 max", SSTREAM, si,
             fd.StreamIndicesRequest(job="j", position=U64, position_set=True),
             C.INVALID_ARGUMENT, str(U64)),
            ("future epoch", SSTREAM, si,
             fd.StreamIndicesRequest(job="j", epoch=U64, epoch_set=True), C.FAILED_PRECONDITION,
             str(U64)),
            ("past epoch", SSTREAM, si,
             fd.StreamIndicesRequest(job="j", epoch=0, epoch_set=True, position=25,
                                     position_set=True), None, None),
        ]
        cases += self.name_cases(SSTREAM, sb, lambda n: fd.StreamBatchesRequest(job=n), "job")
        cases += [
            ("unknown", SSTREAM, sb, fd.StreamBatchesRequest(job="nope"), C.NOT_FOUND, "nope"),
            ("job without batching", SSTREAM, sb, fd.StreamBatchesRequest(job="j"),
             C.FAILED_PRECONDITION, "j"),
            ("rank 2 of 2", SSTREAM, sb, fd.StreamBatchesRequest(job="jb", rank=2),
             C.INVALID_ARGUMENT, "rank 2"),
            ("max_batches 1025", SSTREAM, sb, fd.StreamBatchesRequest(job="jb", max_batches=1025),
             C.INVALID_ARGUMENT, "1025"),
            ("step u64 max", SSTREAM, sb,
             fd.StreamBatchesRequest(job="jb", step=U64, step_set=True), C.INVALID_ARGUMENT,
             str(U64)),
            ("future epoch", SSTREAM, sb,
             fd.StreamBatchesRequest(job="jb", epoch=U64, epoch_set=True),
             C.FAILED_PRECONDITION, str(U64)),
        ]
        self.run_cases(cases)

    # -- Checkpoints --

    def test_checkpoints_unary(self):
        K = "/sluice.v1.Checkpoints/"

        def ref_cases(method):
            cases = self.name_cases(UNARY, K + method,
                                    lambda n: ck.CheckpointRef(job=n, name="keep"), "job")
            cases += [c for c in self.name_cases(
                UNARY, K + method, lambda n: ck.CheckpointRef(job="cj", name=n), "name")
                if c[0] != "garbage bytes"]
            cases.append(("unknown", UNARY, K + method, ck.CheckpointRef(job="cj", name="nope"),
                          C.NOT_FOUND, "nope"))
            return cases

        begin = K + "Begin"
        cases = self.name_cases(UNARY, begin, lambda n: ck.BeginRequest(job=n, world_size=1),
                                "job")
        cases += [c for c in self.name_cases(
            UNARY, begin, lambda n: ck.BeginRequest(job="cj", name=n, world_size=1), "name")
            if c[0] not in ("garbage bytes", "name empty")]
        cases += [
            ("world 0", UNARY, begin, ck.BeginRequest(job="cj", name="b", world_size=0),
             C.INVALID_ARGUMENT, "world_size 0"),
            ("world -1", UNARY, begin, ck.BeginRequest(job="cj", name="b", world_size=-1),
             C.INVALID_ARGUMENT, "-1"),
            ("world int32 min", UNARY, begin,
             ck.BeginRequest(job="cj", name="b", world_size=I32_MIN), C.INVALID_ARGUMENT,
             str(I32_MIN)),
            ("world 65537", UNARY, begin, ck.BeginRequest(job="cj", name="b", world_size=65537),
             C.INVALID_ARGUMENT, "65537"),
            ("step u64 max", UNARY, begin,
             ck.BeginRequest(job="cj", step=U64, world_size=1), C.INVALID_ARGUMENT, str(U64)),
            ("metadata 8 KiB + 1", UNARY, begin,
             ck.BeginRequest(job="cj", name="b", world_size=1, user_metadata="m" * 8193),
             C.INVALID_ARGUMENT, "8193"),
            ("metadata invalid UTF-8", UNARY, begin,
             with_field(ck.BeginRequest(job="cj", name="b", world_size=1), 5, b"\xc0\xaf"),
             C.INVALID_ARGUMENT, "UTF-8"),
            ("existing with another world", UNARY, begin,
             ck.BeginRequest(job="cj", name="keep", step=1, world_size=3), C.ALREADY_EXISTS,
             "keep"),
        ]
        st = K + "UploadStatus"
        cases += self.name_cases(UNARY, st,
                                 lambda n: ck.UploadStatusRequest(job=n, checkpoint="w"), "job")
        cases += [
            ("unknown", UNARY, st, ck.UploadStatusRequest(job="cj", checkpoint="nope"),
             C.NOT_FOUND, "nope"),
            ("rank 4 of 4", UNARY, st, ck.UploadStatusRequest(job="cj", checkpoint="w", rank=4),
             C.INVALID_ARGUMENT, "rank 4"),
            ("rank -1", UNARY, st, ck.UploadStatusRequest(job="cj", checkpoint="w", rank=-1),
             C.INVALID_ARGUMENT, "rank -1"),
        ]
        cases += ref_cases("Commit")
        cases += [("missing ranks", UNARY, K + "Commit", ck.CheckpointRef(job="cj", name="w"),
                   C.FAILED_PRECONDITION, "have no shard")]
        cases += ref_cases("Abort")
        cases += [("abort a COMPLETE checkpoint", UNARY, K + "Abort",
                   ck.CheckpointRef(job="cj", name="keep"), C.FAILED_PRECONDITION, "keep")]
        cases += ref_cases("Get")
        cases += [c for c in self.name_cases(UNARY, K + "List", lambda n: ck.ListRequest(job=n),
                                             "job") if c[0] != "job empty"]
        cases += [
            ("unknown state", UNARY, K + "List", ck.ListRequest(job="cj", state=99),
             C.INVALID_ARGUMENT, "99"),
            ("negative state", UNARY, K + "List", ck.ListRequest(job="cj", state=-5),
             C.INVALID_ARGUMENT, "-5"),
        ]
        cases += self.name_cases(UNARY, K + "Latest", lambda n: ck.LatestRequest(job=n), "job")
        cases += [("no complete checkpoint", UNARY, K + "Latest", ck.LatestRequest(job="none"),
                   C.NOT_FOUND, "none")]
        cases += ref_cases("Verify")
        cases += [("unknown mode", UNARY, K + "Verify",
                   ck.VerifyRequest(job="cj", name="keep", mode=7), C.INVALID_ARGUMENT, "7")]
        dl = K + "DownloadShard"
        cases += self.name_cases(SSTREAM, dl, lambda n: ck.DownloadShardRequest(job=n, name="keep"),
                                 "job")
        cases += [
            ("unknown", SSTREAM, dl, ck.DownloadShardRequest(job="cj", name="nope"), C.NOT_FOUND,
             "nope"),
            ("rank 2 of 2", SSTREAM, dl, ck.DownloadShardRequest(job="cj", name="keep", rank=2),
             C.INVALID_ARGUMENT, "rank 2"),
            ("rank -1", SSTREAM, dl, ck.DownloadShardRequest(job="cj", name="keep", rank=-1),
             C.INVALID_ARGUMENT, "rank -1"),
            ("offset past the data", SSTREAM, dl,
             ck.DownloadShardRequest(job="cj", name="keep", offset=len(self.keep_data[0]) + 1),
             C.INVALID_ARGUMENT, str(len(self.keep_data[0]) + 1)),
            ("offset u64 max", SSTREAM, dl,
             ck.DownloadShardRequest(job="cj", name="keep", offset=U64), C.INVALID_ARGUMENT,
             str(U64)),
            ("no shard yet", SSTREAM, dl, ck.DownloadShardRequest(job="cj", name="w", rank=1),
             C.NOT_FOUND, "1"),
        ]
        cases += ref_cases("Delete")
        cases += self.name_cases(UNARY, K + "SetRetention",
                                 lambda n: ck.SetRetentionRequest(job=n, keep_last=1), "job")
        self.run_cases(cases)
        # The newest COMPLETE checkpoint survives the tightest policy.
        self.rpc(UNARY, K + "SetRetention", ck.SetRetentionRequest(job="cj", keep_last=1))
        self.assert_still_serving()

    def test_checkpoint_uploads(self):
        K = "/sluice.v1.Checkpoints/"
        up = K + "UploadShard"
        data = b"\x01" * 16
        good = header()

        def bad_header(label, h, code, needle):
            return (label, CSTREAM, up, [h, chunk(data)], code, needle)

        cases = [c for c in self.name_cases(CSTREAM, up, lambda n: [header(job=n)], "job")
                 if c[0] != "garbage bytes"]
        cases += [c for c in self.name_cases(CSTREAM, up, lambda n: [header(name=n)], "name")
                  if c[0] != "garbage bytes"]
        cases += [
            ("empty stream", CSTREAM, up, [], C.INVALID_ARGUMENT, "header"),
            ("data before header", CSTREAM, up, [chunk(data), good], C.INVALID_ARGUMENT,
             "header"),
            ("repeated header", CSTREAM, up, [good, good, chunk(data)], C.INVALID_ARGUMENT,
             "header"),
            ("header after data", CSTREAM, up, [good, chunk(data[:8]), good, chunk(data[8:])],
             C.INVALID_ARGUMENT, "header"),
            ("garbage as the header", CSTREAM, up, [GARBAGE], C.INVALID_ARGUMENT, None),
            ("garbage after the header", CSTREAM, up, [good, GARBAGE], C.INVALID_ARGUMENT, None),
            ("truncated: stream ends early", CSTREAM, up, [good, chunk(data[:10])],
             C.INVALID_ARGUMENT, "16"),
            ("truncated: client aborts", CSTREAM, up,
             stream_of([good, chunk(data[:8]), chunk(data[8:])], fail_at=2), C.UNKNOWN, None),
            ("more data than declared", CSTREAM, up, [good, chunk(data), chunk(b"x")],
             C.INVALID_ARGUMENT, "16"),
            ("chunk over 4 MiB", CSTREAM, up,
             [header(data_size=MAX_SHARD, tensors=[]), chunk(b"\0" * (4 * MiB + 1))],
             C.INVALID_ARGUMENT, str(4 * MiB + 1)),
            ("message over the 8 MiB limit", CSTREAM, up,
             [header(data_size=MAX_SHARD, tensors=[]), chunk(b"\0" * (9 * MiB))],
             C.RESOURCE_EXHAUSTED, None),
            bad_header("unknown checkpoint", header(name="nope"), C.NOT_FOUND, "nope"),
            bad_header("into COMPLETE", header(name="keep"), C.FAILED_PRECONDITION, "keep"),
            bad_header("rank 4 of 4", header(rank=4), C.INVALID_ARGUMENT, "rank 4"),
            bad_header("rank -1", header(rank=-1), C.INVALID_ARGUMENT, "rank -1"),
            bad_header("rank int32 min", header(rank=I32_MIN), C.INVALID_ARGUMENT, str(I32_MIN)),
            bad_header("data_size u64 max", header(data_size=U64, tensors=[]),
                       C.INVALID_ARGUMENT, str(U64)),
            bad_header("data_size over max_shard_bytes", header(data_size=MAX_SHARD + 1,
                                                                tensors=[]),
                       C.RESOURCE_EXHAUSTED, str(MAX_SHARD + 1)),
            bad_header("offset past data_size", header(offset=17), C.INVALID_ARGUMENT, "17"),
            bad_header("sha256 not hex", header(sha="XYZ"), C.INVALID_ARGUMENT, "XYZ"),
            bad_header("sha256 uppercase", header(sha="A" * 64), C.INVALID_ARGUMENT, "AAAA"),
            bad_header("sha256 mismatch", header(sha="0" * 64), C.DATA_LOSS, "0000"),
            bad_header("tensor size vs shape", header(tensors=[tensor(size=15)]),
                       C.INVALID_ARGUMENT, "15"),
            bad_header("tensor dtype", header(tensors=[tensor(dtype="../x")]),
                       C.INVALID_ARGUMENT, "../x"),
            bad_header("tensor negative dim", header(tensors=[tensor(shape=(-1,), size=1)]),
                       C.INVALID_ARGUMENT, "-1"),
            bad_header("tensor out of the data", header(tensors=[tensor(offset=10)]),
                       C.INVALID_ARGUMENT, "10"),
            bad_header("tensor offset wraps", header(tensors=[tensor(offset=U64 - 7)]),
                       C.INVALID_ARGUMENT, str(U64 - 7)),
            bad_header("tensor shape overflows", header(tensors=[tensor(shape=(1 << 62, 1 << 62),
                                                                        size=0)]),
                       C.INVALID_ARGUMENT, None),
            bad_header("tensor name empty", header(tensors=[tensor(name="")]),
                       C.INVALID_ARGUMENT, "name"),
            bad_header("tensor name control byte", header(tensors=[tensor(name="a\x01")]),
                       C.INVALID_ARGUMENT, "0x01"),
            bad_header("tensor name 1025", header(tensors=[tensor(name="n" * 1025)]),
                       C.INVALID_ARGUMENT, "1024"),
            bad_header("tensors overlap", header(tensors=[tensor(shape=(8,), size=8),
                                                          tensor(name="u", shape=(8,), offset=4,
                                                                 size=8)]),
                       C.INVALID_ARGUMENT, "overlap"),
            bad_header("33 dimensions", header(tensors=[tensor(shape=(1,) * 33, size=1)]),
                       C.INVALID_ARGUMENT, "33"),
            bad_header("65537 tensors", header(tensors=[tensor(name="t%d" % i, shape=(0,), size=0)
                                                        for i in range(65537)]),
                       C.INVALID_ARGUMENT, "65537"),
        ]
        self.run_cases(cases)
        # A failure found while a chunk is being written is answered once the upload ended: an
        # immediate retry must not find the failed upload still in progress.
        big = [header(data_size=MAX_SHARD, tensors=[]), chunk(b"\0" * MiB),
               chunk(b"\0" * MiB), chunk(b"x")]
        for i in range(20):
            with self.assertRaises(grpc.RpcError) as e:
                self.rpc(CSTREAM, up, big)
            self.assertEqual(e.exception.code(), C.INVALID_ARGUMENT, e.exception.details())
            st = ck.UploadStatusResponse.FromString(self.rpc(
                UNARY, K + "UploadStatus", ck.UploadStatusRequest(job="cj", checkpoint="w")))
            self.assertFalse(st.in_progress, "round %d" % i)
        # Nothing of the WRITING checkpoint became a shard; a correct upload still works after.
        s = ck.UploadStatusResponse.FromString(self.rpc(
            UNARY, K + "UploadStatus", ck.UploadStatusRequest(job="cj", checkpoint="w", rank=0)))
        self.assertFalse(s.stored)
        r = ck.UploadShardResponse.FromString(self.rpc(CSTREAM, up, [good, chunk(data)]))
        self.assertEqual(r.sha256, hashlib.sha256(data).hexdigest())
        self.assert_still_serving()


class NulBytesTest(HostileTest):
    """A NUL byte inside a name ("nul\\0../x"), once per RPC that takes a name.

    protobuf-c decodes a `string` field into a NUL-terminated C string, so everything after the
    first NUL is silently dropped and the daemon acts on "nul" instead of refusing the name. No
    path is built from the dropped part, but the answer concerns another object than the one
    named (Delete "nul\\0x" deletes "nul"). The RPC bridge's decoder (common/rpc/codec.c) refuses
    a string field containing a NUL byte (or invalid UTF-8) with INVALID_ARGUMENT.
    """

    for _name in [n for n in dir(HostileTest) if n.startswith("test_")]:
        locals()[_name] = None  # only the case below runs in this class
    del _name

    def test_nul_bytes_in_strings(self):
        n = NUL_NAME
        D, J, E, F = ("/sluice.v1.Datasets/", "/sluice.v1.Jobs/", "/sluice.v1.Epochs/",
                      "/sluice.v1.Feed/")
        K = "/sluice.v1.Checkpoints/"
        self.run_cases([(m.split("/")[-1] + " " + m.split("/")[-2], kind, m, req,
                         C.INVALID_ARGUMENT, "NUL") for kind, m, req in [
            (UNARY, "/grpc.health.v1.Health/Check", hp.HealthCheckRequest(service=n)),
            (UNARY, D + "Create", fd.CreateDatasetRequest(name=n, samples=10)),
            (CSTREAM, D + "UploadLengths", [fd.UploadLengthsRequest(name=n, lengths=[1])]),
            (UNARY, D + "Get", fd.GetDatasetRequest(name=n)),
            (UNARY, D + "Delete", fd.DeleteDatasetRequest(name=n)),
            (UNARY, J + "Create", fd.CreateJobRequest(job=fd.Job(name=n, dataset="ds",
                                                                 world_size=1))),
            (UNARY, J + "Get", fd.GetJobRequest(name=n)),
            (UNARY, J + "Delete", fd.DeleteJobRequest(name=n)),
            (UNARY, J + "Resize", fd.ResizeJobRequest(name=n, world_size=1)),
            (UNARY, E + "Get", fd.GetEpochRequest(job=n)),
            (UNARY, E + "ReportProgress", fd.ReportProgressRequest(job=n, position=1)),
            (UNARY, E + "Next", fd.NextEpochRequest(job=n)),
            (UNARY, E + "Rewind", fd.RewindRequest(job=n, world_size=1)),
            (SSTREAM, F + "StreamIndices", fd.StreamIndicesRequest(job=n)),
            (SSTREAM, F + "StreamBatches", fd.StreamBatchesRequest(job=n)),
            (UNARY, K + "Begin", ck.BeginRequest(job="cj", name=n, world_size=1)),
            (CSTREAM, K + "UploadShard", [header(name=n)]),
            (UNARY, K + "UploadStatus", ck.UploadStatusRequest(job="cj", checkpoint=n)),
            (UNARY, K + "Commit", ck.CheckpointRef(job="cj", name=n)),
            (UNARY, K + "Abort", ck.CheckpointRef(job="cj", name=n)),
            (UNARY, K + "Get", ck.CheckpointRef(job="cj", name=n)),
            (UNARY, K + "List", ck.ListRequest(job=n)),
            (UNARY, K + "Latest", ck.LatestRequest(job=n)),
            (UNARY, K + "Verify", ck.VerifyRequest(job="cj", name=n)),
            (SSTREAM, K + "DownloadShard", ck.DownloadShardRequest(job="cj", name=n)),
            (UNARY, K + "Delete", ck.CheckpointRef(job="cj", name=n)),
            (UNARY, K + "SetRetention", ck.SetRetentionRequest(job=n, keep_last=1)),
        ]])


class EveryLengthSkippedTest(unittest.TestCase):
    """A batching job whose every sequence is over max_seq_len with skip_overlong: the planner
    sorts an empty window. Found by fuzz_lengths: sort_window (common/batch/window.c) called
    qsort(NULL, 0, ...), undefined behaviour that UBSan aborts on, so the ASan+UBSan daemon died
    (release builds happened to survive). Fixed: the sort is skipped for fewer than two keys."""

    def test_every_length_skipped(self):
        with Daemon() as d, grpc.insecure_channel(d.addr) as chan:
            def call(kind, method, req):
                if kind == UNARY:
                    return chan.unary_unary(method, request_serializer=ser)(req, timeout=30)
                if kind == CSTREAM:
                    return chan.stream_unary(method, request_serializer=ser)(iter(req),
                                                                             timeout=30)
                return list(chan.unary_stream(method, request_serializer=ser)(req, timeout=30))

            call(UNARY, "/sluice.v1.Datasets/Create", fd.CreateDatasetRequest(name="d",
                                                                              samples=50))
            call(CSTREAM, "/sluice.v1.Datasets/UploadLengths",
                 [fd.UploadLengthsRequest(name="d", lengths=[100] * 50)])
            for st in ("pad", "bucket", "dynamic", "packed"):
                call(UNARY, "/sluice.v1.Jobs/Create", fd.CreateJobRequest(job=fd.Job(
                    name="j" + st, dataset="d", world_size=2,
                    batching=fd.BatchConfig(strategy=st, max_batch_size=4, max_seq_len=8,
                                            skip_overlong=True))))
                try:
                    call(SSTREAM, "/sluice.v1.Feed/StreamBatches",
                         fd.StreamBatchesRequest(job="j" + st, rank=0))
                except grpc.RpcError as e:
                    self.assertNotEqual(e.code(), C.UNAVAILABLE, (st, d.log()))
            self.assertIsNone(d.proc.poll(), d.log())
            self.assertEqual(d.sanitizer_reports(), [], d.log())


if __name__ == "__main__":
    unittest.main()
