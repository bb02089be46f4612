"""Fault injection: the real sluiced is killed with SIGKILL at random moments under a mixed
workload of real clients, its data dir sits on a full disk, and another process holds the
catalog's write lock. After each fault the catalog must pass SQLite's integrity check, every
COMPLETE checkpoint must deep-verify, no temp file may be visible but resumable partial uploads,
everything a client was told succeeded must still be there, and interrupted work must be
retryable. See docs/hardening.md, "Fault injection".

Environment: SLUICE_FAULT_ROUNDS (kill rounds, default 50), SLUICE_FAULT_SEED (default: random;
the seed is printed so a failing run can be repeated), SLUICE_TEST_VERBOSE (per-round lines).
"""
import hashlib
import itertools
import os
import random
import signal
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc

from sluice.v1 import checkpoint_pb2 as cpb
from sluice.v1 import checkpoint_pb2_grpc as cpbg
from sluice.v1 import feed_pb2 as fpb
from sluice.v1 import feed_pb2_grpc as fpbg
from sltest import STORE, Daemon, cli

MiB = 1 << 20
C = grpc.StatusCode
VERBOSE = bool(os.environ.get("SLUICE_TEST_VERBOSE"))
ROUNDS = int(os.environ.get("SLUICE_FAULT_ROUNDS") or "50")
SEED = int(os.environ.get("SLUICE_FAULT_SEED") or random.SystemRandom().randrange(1 << 32))
JOB = "fj"  # the checkpoints' job
SIZES = [0, 1, 4099, 100000, 700001, 1500000, 3 * MiB + 5]
# With object storage (SL_TEST_STORE=s3): parts of 5 MiB, and shards of two parts among the
# sizes, so that kills also land in multipart uploads.
S3_PART = 5 * MiB
S3_ARGS = ["--s3-part-size", str(S3_PART)] if STORE == "s3" else []
if STORE == "s3":
    SIZES.append(S3_PART + MiB + 3)


def note(*a):
    if VERBOSE:
        print(*a, file=sys.stderr, flush=True)


def shard_data(name, rank):
    """Deterministic data of (checkpoint, rank), so any round can retry any upload."""
    h = hashlib.sha256(b"%s/%d" % (name.encode(), rank)).digest()
    size = SIZES[h[0] % len(SIZES)]
    return (h * (size // 32 + 1))[:size]


def upload_reqs(name, rank, data, offset=0, sha="", chunk=256 * 1024):
    tensors = [cpb.TensorInfo(name="w", dtype="uint8", shape=[len(data)], offset=0,
                              size=len(data))] if data else []
    yield cpb.UploadShardRequest(header=cpb.ShardHeader(
        job=JOB, checkpoint=name, rank=rank, tensors=tensors, data_size=len(data), sha256=sha,
        offset=offset))
    for i in range(offset, len(data), chunk):
        yield cpb.UploadShardRequest(chunk=data[i:i + chunk])


def lengths_of(rnd, n):
    vals = [rnd.randint(1, 4096) for _ in range(n)]
    return vals, hashlib.sha256(struct.pack("<%dI" % n, *vals)).hexdigest()


def lengths_reqs(name, vals, per=20000):
    yield fpb.UploadLengthsRequest(name=name, lengths=vals[:per])
    for i in range(per, len(vals), per):
        yield fpb.UploadLengthsRequest(lengths=vals[i:i + per])


def catalog_check(tc, data_dir):
    """SQLite's own checks on the catalog, read-only, with no daemon running."""
    path = os.path.join(data_dir, "catalog.db")
    if not os.path.exists(path):
        return
    db = sqlite3.connect("file:%s?mode=ro" % path, uri=True, timeout=30)
    try:
        tc.assertEqual(db.execute("PRAGMA integrity_check").fetchall(), [("ok",)])
        tc.assertEqual(db.execute("PRAGMA foreign_key_check").fetchall(), [])
        bad = db.execute("SELECT c.name, c.world_size, count(s.rank) FROM checkpoints c "
                         "LEFT JOIN checkpoint_shards s ON s.checkpoint_id = c.id "
                         "WHERE c.state = 2 GROUP BY c.id "
                         "HAVING count(s.rank) != c.world_size").fetchall()
        tc.assertEqual(bad, [], "COMPLETE checkpoints without all ranks")
    finally:
        db.close()


class Model:
    """What the clients were told. Everything under one lock; `inflight` entries are requests
    sent without an answer yet (their effect may or may not have happened)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ckpts = {}            # name -> world size (registered before Begin is sent)
        self.complete = set()      # Commit answered COMPLETE
        self.aborted = set()       # Abort answered
        self.aborting = set()      # Abort sent
        self.deleted = set()       # Delete answered
        self.deleting = set()      # Delete sent
        self.shards = set()        # (name, rank) whose upload got a receipt
        self.datasets = {}         # name -> samples (Create sent)
        self.ds_acked = set()      # Create answered
        self.ds_deleting = set()   # Delete sent
        self.ds_deleted = set()    # Delete answered
        self.lengths = {}          # name -> [sha of each UploadLengths sent, in order]
        self.lengths_ok = {}       # name -> index in lengths[name] of the last answered one
        self.ds_jobs = set()       # datasets a job was (maybe) created on
        self.jobs_acked = set()
        self.progress = {}         # rank -> (epoch, position) acknowledged
        self.epoch_min = 0         # Next / an advancing report answered this epoch
        self.seen = {}             # rank -> (epoch, position) observed after the last restart
        self.world = 2             # resize job: last answered world size
        self.world_sent = None     # resize sent without answer
        self.counts = {}           # ack counters, for the report


PDS, PJ, RJ = "pds", "pj", "rj"  # progress dataset, progress job, resize job
PWORLD, PSAMPLES = 4, 40


class KillTest(unittest.TestCase):
    """SIGKILL at a random moment of a mixed workload, ROUNDS times, with checks after each."""

    def test_sigkill_mixed_workload(self):
        print("test_faults: KillTest rounds=%d seed=%d (SLUICE_FAULT_SEED=%d repeats the kill "
              "delays)" % (ROUNDS, SEED, SEED), file=sys.stderr, flush=True)
        self.rnd = random.Random(SEED)
        self.m = Model()
        self.failures = []
        with tempfile.TemporaryDirectory(prefix="sluice-faults-") as tmp:
            self.data_dir = os.path.join(tmp, "data")
            self.d = Daemon(data_dir=self.data_dir, args=S3_ARGS)
            self.file_dir = os.path.join(tmp, "files")
            os.makedirs(self.file_dir)
            try:
                self.d.start()
                self.connect()
                self.setup_feed()
                for r in range(ROUNDS):
                    self.round(r)
                # A clean stop at the end: the daemon must exit 0 and sanitizers stay quiet.
                self.close()
                self.assertEqual(self.d.stop(), 0, self.d.log())
                catalog_check(self, self.data_dir)
                self.d.start()
                self.connect()
                self.check_all()
                self.retry_all()
                self.close()
                self.assertEqual(self.d.stop(), 0, self.d.log())
                self.assertEqual(self.d.sanitizer_reports(), [], self.d.log())
                print("test_faults: %d kills survived, seed %d, acknowledged: %s" %
                      (ROUNDS, SEED, dict(sorted(self.m.counts.items()))),
                      file=sys.stderr, flush=True)
            finally:
                self.d.cleanup()

    # ---- connection ----

    def connect(self):
        self.ch = grpc.insecure_channel(self.d.addr)
        self.ck = cpbg.CheckpointsStub(self.ch)
        self.ds = fpbg.DatasetsStub(self.ch)
        self.jobs = fpbg.JobsStub(self.ch)
        self.ep = fpbg.EpochsStub(self.ch)

    def close(self):
        self.ch.close()

    def count(self, what):
        with self.m.lock:
            self.m.counts[what] = self.m.counts.get(what, 0) + 1

    # ---- setup ----

    def setup_feed(self):
        self.ds.Create(fpb.CreateDatasetRequest(name=PDS, samples=PSAMPLES), timeout=10)
        self.jobs.Create(fpb.CreateJobRequest(job=fpb.Job(name=PJ, dataset=PDS,
                                                          world_size=PWORLD, seed=7)), timeout=10)
        self.jobs.Create(fpb.CreateJobRequest(job=fpb.Job(name=RJ, dataset=PDS, world_size=2)),
                         timeout=10)
        with self.m.lock:
            self.m.progress = {r: (0, 0) for r in range(PWORLD)}
            self.m.seen = dict(self.m.progress)

    # ---- one round ----

    def round(self, r):
        self.stop = threading.Event()
        wrnd = random.Random(self.rnd.randrange(1 << 32))
        self.killed = False
        work = [(self.w_ckpt, r, 0), (self.w_ckpt, r, 1), (self.w_cli, r), (self.w_datasets, r),
                (self.w_progress,), (self.w_resize,)]
        workers = [threading.Thread(target=self.run_worker,
                                    args=w + (random.Random(wrnd.random()),)) for w in work]
        for t in workers:
            t.start()
        delay = self.rnd.uniform(0.02, 0.9)
        time.sleep(delay)
        self.killed = True
        self.d.proc.send_signal(signal.SIGKILL)
        rc = self.d.stop()
        self.stop.set()
        for t in workers:
            t.join()
        self.close()
        self.assertEqual(rc, -signal.SIGKILL, self.d.log())
        self.assertEqual(self.d.sanitizer_reports(), [], self.d.log())
        note("round %d: killed after %.3f s" % (r, delay))
        # The catalog as the kill left it, before the daemon touches it again.
        catalog_check(self, self.data_dir)
        self.d.start()
        self.connect()
        self.check_all()
        self.retry_all()

    # ---- workers: each stops at the first failed RPC (the daemon is gone) ----

    def w_ckpt(self, r, t, rnd):
        k = 0
        while not self.stop.is_set():
            name = "c%d_%d_%d" % (r, t, k)
            k += 1
            world = rnd.randint(1, 4)
            with self.m.lock:
                self.m.ckpts[name] = world
            self.ck.Begin(cpb.BeginRequest(job=JOB, name=name, step=k, world_size=world),
                          timeout=20)
            for rank in rnd.sample(range(world), world):
                data = shard_data(name, rank)
                sha = hashlib.sha256(data).hexdigest() if rnd.random() < 0.5 else ""
                self.ck.UploadShard(upload_reqs(name, rank, data, sha=sha), timeout=30)
                with self.m.lock:
                    self.m.shards.add((name, rank))
                self.count("shard")
            act = rnd.random()
            if act < 0.75:
                c = self.ck.Commit(cpb.CheckpointRef(job=JOB, name=name), timeout=30)
                self.assertEqual(c.state, cpb.COMPLETE)
                with self.m.lock:
                    self.m.complete.add(name)
                self.count("commit")
            elif act < 0.9:
                with self.m.lock:
                    self.m.aborting.add(name)
                self.ck.Abort(cpb.CheckpointRef(job=JOB, name=name), timeout=30)
                with self.m.lock:
                    self.m.aborted.add(name)
                self.count("abort")
            if rnd.random() < 0.3:
                self.delete_one(rnd)

    def delete_one(self, rnd):
        with self.m.lock:
            live = sorted(self.m.complete - self.m.deleted - self.m.deleting)
            if not live:
                return
            victim = rnd.choice(live)
            self.m.deleting.add(victim)
        self.ck.Delete(cpb.CheckpointRef(job=JOB, name=victim), timeout=20)
        with self.m.lock:
            self.m.deleted.add(victim)
        self.count("delete")

    def w_cli(self, r, rnd):
        """Uploads through the C client library (the `sluice` CLI)."""
        k = 0
        while not self.stop.is_set():
            name = "cli%d_%d" % (r, k)
            k += 1
            world = rnd.randint(1, 3)
            with self.m.lock:
                self.m.ckpts[name] = world
            self.ck.Begin(cpb.BeginRequest(job=JOB, name=name, step=k, world_size=world),
                          timeout=20)
            for rank in range(world):
                path = os.path.join(self.file_dir, "%s_%d" % (name, rank))
                with open(path, "wb") as f:
                    f.write(shard_data(name, rank))
                p = cli("ckpt", "upload", JOB, name, path, "--rank", str(rank),
                        addr=self.d.addr)
                os.unlink(path)
                if p.returncode != 0:
                    return  # the daemon is gone
                with self.m.lock:
                    self.m.shards.add((name, rank))
                self.count("cli_shard")
            c = self.ck.Commit(cpb.CheckpointRef(job=JOB, name=name), timeout=30)
            self.assertEqual(c.state, cpb.COMPLETE)
            with self.m.lock:
                self.m.complete.add(name)
            self.count("commit")

    def w_datasets(self, r, rnd):
        k = 0
        while not self.stop.is_set():
            act = rnd.random()
            with self.m.lock:
                free = sorted(n for n in self.m.ds_acked - self.m.ds_deleting
                              if n not in self.m.ds_jobs and n != PDS)
                withl = sorted(n for n in self.m.ds_acked - self.m.ds_deleting
                               if n != PDS and n in self.m.lengths_ok)
            if act < 0.15 and free:
                name = rnd.choice(free)
                with self.m.lock:
                    self.m.ds_deleting.add(name)
                self.ds.Delete(fpb.DeleteDatasetRequest(name=name), timeout=20)
                with self.m.lock:
                    self.m.ds_deleted.add(name)
                self.count("dataset_delete")
            elif act < 0.35 and len(free) < 6 or not free:
                name = "d%d_%d" % (r, k)
                k += 1
                n = rnd.choice([5, 300, 5000, 60000])
                with self.m.lock:
                    self.m.datasets[name] = n
                self.ds.Create(fpb.CreateDatasetRequest(name=name, samples=n), timeout=20)
                with self.m.lock:
                    self.m.ds_acked.add(name)
                self.count("dataset")
            elif act < 0.8:
                # New lengths, for a new dataset or replacing a dataset's lengths.
                name = rnd.choice(free)
                vals, sha = lengths_of(rnd, self.m.datasets[name])
                with self.m.lock:
                    self.m.lengths.setdefault(name, []).append(sha)
                    idx = len(self.m.lengths[name]) - 1
                try:
                    d = self.ds.UploadLengths(lengths_reqs(name, vals), timeout=30)
                except grpc.RpcError as e:
                    # A job was created on it meanwhile.
                    if e.code() != C.FAILED_PRECONDITION:
                        raise
                    continue
                self.assertEqual(d.lengths_sha256, sha)
                with self.m.lock:
                    self.m.lengths_ok[name] = max(idx, self.m.lengths_ok.get(name, -1))
                self.count("lengths")
            elif withl:
                ds = rnd.choice(withl)
                name = "j%d_%d" % (r, k)
                k += 1
                with self.m.lock:
                    self.m.ds_jobs.add(ds)
                self.jobs.Create(fpb.CreateJobRequest(job=fpb.Job(
                    name=name, dataset=ds, world_size=rnd.randint(1, 8))), timeout=20)
                with self.m.lock:
                    self.m.jobs_acked.add(name)
                self.count("job")

    def w_progress(self, rnd):
        st = self.ep.Get(fpb.GetEpochRequest(job=PJ), timeout=20)
        while not self.stop.is_set():
            if rnd.random() < 0.05:
                st = self.ep.Next(fpb.NextEpochRequest(job=PJ, expect_epoch=st.epoch,
                                                       check_epoch=True), timeout=20)
                with self.m.lock:
                    self.m.epoch_min = max(self.m.epoch_min, st.epoch)
                self.count("next")
                continue
            r = rnd.randrange(PWORLD)
            rp = st.ranks[r]
            if rp.position >= rp.count:
                st = self.ep.Get(fpb.GetEpochRequest(job=PJ), timeout=20)
                continue
            pos = min(rp.count, rp.position + rnd.randint(1, 4))
            try:
                resp = self.ep.ReportProgress(fpb.ReportProgressRequest(
                    job=PJ, rank=r, epoch=st.epoch, position=pos), timeout=20)
            except grpc.RpcError as e:
                if e.code() != C.FAILED_PRECONDITION:  # the epoch moved on
                    raise
                st = self.ep.Get(fpb.GetEpochRequest(job=PJ), timeout=20)
                continue
            with self.m.lock:
                if resp.advanced:
                    self.m.epoch_min = max(self.m.epoch_min, resp.epoch)
                else:
                    self.m.progress[r] = max(self.m.progress[r], (st.epoch, resp.position))
            self.count("report")
            st = self.ep.Get(fpb.GetEpochRequest(job=PJ), timeout=20)

    def w_resize(self, rnd):
        while not self.stop.is_set():
            w = rnd.randint(1, 5)
            with self.m.lock:
                self.m.world_sent = w
            j = self.jobs.Resize(fpb.ResizeJobRequest(name=RJ, world_size=w), timeout=20)
            self.assertEqual(j.world_size, w)
            with self.m.lock:
                self.m.world, self.m.world_sent = w, None
            self.count("resize")
            time.sleep(rnd.uniform(0, 0.05))

    def run_worker(self, fn, *args):
        """Run a worker until it stops or an RPC fails. A failure before the kill is a defect
        (kept in self.failures and reported by the next check); after it, expected."""
        try:
            fn(*args)
        except grpc.RpcError as e:
            if not self.killed:
                self.failures.append("%s: %s %s" % (fn.__name__, e.code(), e.details()))
        except Exception as e:  # an assertion of the worker
            self.failures.append("%s: %r" % (fn.__name__, e))

    # ---- checks after a restart ----

    def check_all(self):
        self.assertEqual(self.failures, [], "RPCs failed before the kill")
        self.check_checkpoints()
        self.check_datasets()
        self.check_progress()

    def check_checkpoints(self):
        m = self.m
        cat = {c.name: c for c in self.ck.List(cpb.ListRequest(job=JOB), timeout=30).checkpoints}
        for name in m.complete - m.deleted - m.deleting:
            self.assertIn(name, cat, "a checkpoint answered COMPLETE is gone")
            self.assertEqual(cat[name].state, cpb.COMPLETE, name)
        for name in m.deleted:
            self.assertNotIn(name, cat, "a deleted checkpoint came back")
        # Deletes the kill interrupted happened or not; from now on they are known.
        m.deleted |= {n for n in m.deleting if n not in cat}
        m.deleting.clear()
        for name in m.aborted:
            self.assertEqual(cat[name].state, cpb.INCOMPLETE, name)
        for name, c in cat.items():
            self.assertIn(name, m.ckpts, "a checkpoint nobody began")
            self.assertEqual(c.world_size, m.ckpts[name], name)
            if c.state == cpb.COMPLETE:
                v = self.ck.Verify(cpb.VerifyRequest(job=JOB, name=name, mode=cpb.DEEP),
                                   timeout=60)
                self.assertTrue(v.ok, (name, v))
                g = self.ck.Get(cpb.CheckpointRef(job=JOB, name=name), timeout=30)
                self.assertEqual(sorted(s.rank for s in g.shards), list(range(c.world_size)))
                for s in g.shards:
                    self.assertEqual(s.sha256,
                                     hashlib.sha256(shard_data(name, s.rank)).hexdigest())
            elif c.state == cpb.WRITING:
                for rank in range(c.world_size):
                    st = self.ck.UploadStatus(cpb.UploadStatusRequest(
                        job=JOB, checkpoint=name, rank=rank), timeout=30)
                    if (name, rank) in m.shards and name not in m.aborting:
                        self.assertTrue(st.stored, "a shard with a receipt is gone: %s/%d" %
                                        (name, rank))
                    if st.stored:
                        self.assertEqual(st.sha256, hashlib.sha256(
                            shard_data(name, rank)).hexdigest())
                    self.assertFalse(st.in_progress)
        # Files: only what the design keeps (docs/checkpoints.md, server/ckpt/sweep.c
        # sweep_keep): shard files and metadata of known checkpoints that are not INCOMPLETE,
        # and hidden partial uploads (".<name>_shard_<r>.shard.part", on s3 also its ".head")
        # of WRITING ones.
        files = self.d.store_files(JOB)
        for f in files:
            if f.startswith("."):
                if self.d.store == "s3" and f.endswith(".shard.part.head"):
                    # With its state, or alone where s3rver lost the state: a kill during an
                    # overwrite of the state tears it in s3rver (S3 keeps the old one), and
                    # drop_torn_objects can only remove it. A new upload of the rank removes
                    # the head.
                    name = f[1:-len(".shard.part.head")].rsplit("_shard_", 1)[0]
                    self.assertEqual(cat[name].state, cpb.WRITING, f)
                    continue
                self.assertTrue(f.endswith(".shard.part"), "temp file left: " + f)
                name, rank = f[1:-len(".shard.part")].rsplit("_shard_", 1)
                self.assertEqual(cat[name].state, cpb.WRITING, f)
                self.assertLess(int(rank), cat[name].world_size, f)
            elif f.endswith(".metadata.json"):
                name = f[:-len(".metadata.json")]
                self.assertIn(name, cat, "metadata of an unknown checkpoint: " + f)
                self.assertNotEqual(cat[name].state, cpb.INCOMPLETE, f)
            else:
                self.assertTrue(f.endswith(".shard"), f)
                name, rank = f[:-len(".shard")].rsplit("_shard_", 1)
                self.assertIn(name, cat, "shard of an unknown checkpoint: " + f)
                self.assertNotEqual(cat[name].state, cpb.INCOMPLETE, f)
                self.assertLess(int(rank), cat[name].world_size, f)
        for name, c in cat.items():
            if c.state == cpb.COMPLETE:
                self.assertIn(name + ".metadata.json", files)
                for rank in range(c.world_size):
                    self.assertIn("%s_shard_%d.shard" % (name, rank), files)

    def check_datasets(self):
        m = self.m
        cat = {d.name: d for d in self.ds.List(fpb.ListDatasetsRequest(), timeout=30).datasets}
        for name in m.ds_acked - m.ds_deleting:
            self.assertIn(name, cat, "a dataset answered created is gone")
        for name in m.ds_deleted:
            self.assertNotIn(name, cat, "a deleted dataset came back")
        m.ds_deleted |= {n for n in m.ds_deleting if n not in cat}
        m.ds_deleting = set(m.ds_deleted)
        for name, d in cat.items():
            self.assertIn(name, m.datasets if name != PDS else {PDS: 0})
            path = os.path.join(self.data_dir, "datasets", name + ".lengths")
            if name in m.lengths_ok:
                self.assertTrue(d.has_lengths, "answered lengths are gone: " + name)
            if d.has_lengths:
                # The stored lengths are the last answered upload or one sent after it.
                sent = m.lengths[name]
                self.assertIn(d.lengths_sha256, sent[m.lengths_ok.get(name, 0):], name)
                with open(path, "rb") as f:
                    self.assertEqual(hashlib.sha256(f.read()).hexdigest(), d.lengths_sha256,
                                     "lengths file does not match the catalog: " + name)
        jobs = {j.name for j in self.jobs.List(fpb.ListJobsRequest(), timeout=30).jobs}
        self.assertLessEqual(m.jobs_acked, jobs, "a job answered created is gone")
        for f in os.listdir(os.path.join(self.data_dir, "datasets")):
            self.assertFalse(f.startswith("."), "temp file left: datasets/" + f)
            self.assertTrue(f.endswith(".lengths"), f)
            name = f[:-len(".lengths")]
            self.assertIn(name, cat, "lengths of an unknown dataset: " + f)
            self.assertTrue(cat[name].has_lengths, "lengths file of a dataset without: " + f)

    def check_progress(self):
        m = self.m
        st = self.ep.Get(fpb.GetEpochRequest(job=PJ), timeout=30)
        self.assertGreaterEqual(st.epoch, m.epoch_min, "epoch went back")
        # The job advances by itself: a complete epoch must have been followed by the next.
        self.assertFalse(st.complete, "epoch %d is complete but did not advance: %s" %
                         (st.epoch, st))
        for rp in st.ranks:
            now = (st.epoch, rp.position)
            self.assertGreaterEqual(now, m.progress[rp.dp_rank],
                                    "acknowledged progress lost, rank %d" % rp.dp_rank)
            self.assertGreaterEqual(now, m.seen[rp.dp_rank],
                                    "progress went back across a restart, rank %d" % rp.dp_rank)
            m.seen[rp.dp_rank] = now
        j = self.jobs.Get(fpb.GetJobRequest(name=RJ), timeout=30)
        self.assertIn(j.world_size, (m.world, m.world_sent), "resize lost")
        m.world, m.world_sent = j.world_size, None

    # ---- retry what the kill interrupted ----

    def retry_all(self):
        """Every checkpoint left WRITING can be finished: resume or redo its uploads, commit,
        deep-verify. Old COMPLETE ones are deleted so the checks stay cheap."""
        m = self.m
        writing = self.ck.List(cpb.ListRequest(job=JOB, state=cpb.WRITING), timeout=30)
        for c in writing.checkpoints:
            for rank in range(c.world_size):
                data = shard_data(c.name, rank)
                sha = hashlib.sha256(data).hexdigest()
                st = self.ck.UploadStatus(cpb.UploadStatusRequest(
                    job=JOB, checkpoint=c.name, rank=rank), timeout=30)
                if st.stored:
                    continue
                try:
                    r = self.ck.UploadShard(upload_reqs(c.name, rank, data,
                                                        offset=st.held_bytes, sha=sha),
                                            timeout=60)
                except grpc.RpcError as e:
                    # The protocol of a resume that does not match: ask again, send again. On
                    # s3 a kill between CompleteMultipartUpload and the removal of the upload's
                    # state leaves a state naming an upload the store no longer has.
                    if e.code() != C.FAILED_PRECONDITION or self.d.store != "s3":
                        raise
                    self.count("resume_refused")
                    st = self.ck.UploadStatus(cpb.UploadStatusRequest(
                        job=JOB, checkpoint=c.name, rank=rank), timeout=30)
                    r = self.ck.UploadShard(upload_reqs(c.name, rank, data,
                                                        offset=st.held_bytes, sha=sha),
                                            timeout=60)
                self.assertEqual(r.sha256, sha)
                if st.held_bytes:
                    self.count("resumed")
                m.shards.add((c.name, rank))
            done = self.ck.Commit(cpb.CheckpointRef(job=JOB, name=c.name), timeout=60)
            self.assertEqual(done.state, cpb.COMPLETE)
            v = self.ck.Verify(cpb.VerifyRequest(job=JOB, name=c.name, mode=cpb.DEEP), timeout=60)
            self.assertTrue(v.ok, (c.name, v))
            m.complete.add(c.name)
            self.count("retried")
        done = self.ck.List(cpb.ListRequest(job=JOB, state=cpb.COMPLETE), timeout=30)
        for c in list(done.checkpoints)[6:]:
            self.ck.Delete(cpb.CheckpointRef(job=JOB, name=c.name), timeout=30)
            m.deleted.add(c.name)
        # Nothing left behind after the retries either.
        self.assertEqual([f for f in self.d.store_files(JOB) if f.startswith(".")], [])


if __name__ == "__main__":
    unittest.main()


def status_of(fn, *a, **kw):
    """(code, details) of a call: OK and the reply, or the error."""
    try:
        return C.OK, fn(*a, **kw)
    except grpc.RpcError as e:
        return e.code(), e.details()


class Clients:
    def __init__(self, addr):
        self.ch = grpc.insecure_channel(addr)
        self.ck = cpbg.CheckpointsStub(self.ch)
        self.ds = fpbg.DatasetsStub(self.ch)
        self.jobs = fpbg.JobsStub(self.ch)
        self.ep = fpbg.EpochsStub(self.ch)

    def close(self):
        self.ch.close()

    def alive(self, tc):
        """The daemon answers reads."""
        tc.assertGreaterEqual(len(self.ds.List(fpb.ListDatasetsRequest(), timeout=30).datasets), 1)
        self.jobs.Get(fpb.GetJobRequest(name="pj"), timeout=30)


class DiskFullTest(unittest.TestCase):
    """The data dir on a 24 MiB tmpfs (skipped without permission to mount): lengths that do not
    fit, then every catalog write with the disk filled up by another file. Each failure must be
    RESOURCE_EXHAUSTED naming the cause, nothing stored may change, the daemon keeps serving,
    and once space is back everything works and survives a SIGKILL."""

    def test_disk_full(self):
        with tempfile.TemporaryDirectory(prefix="sluice-faults-") as tmp:
            mnt = os.path.join(tmp, "mnt")
            os.makedirs(mnt)
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", mnt],
                               capture_output=True)
            if r.returncode != 0:
                self.skipTest("cannot mount a tmpfs here: %s" % r.stderr.decode().strip())
            d = None
            try:
                d = Daemon(data_dir=os.path.join(mnt, "data")).start()
                self.run_full(d, mnt)
            finally:
                if d is not None:
                    d.cleanup()
                if subprocess.run(["umount", mnt], capture_output=True).returncode != 0:
                    subprocess.run(["umount", "-l", mnt], capture_output=True)

    def run_full(self, d, mnt):
        rnd = random.Random(5)
        c = Clients(d.addr)
        dsdir = os.path.join(d.data_dir, "datasets")
        # Stored before the disk fills: lengths of 3.5 M samples (13.4 MiB), a job with progress,
        # a COMPLETE checkpoint, a WRITING one with its shard.
        big, big_sha = lengths_of(rnd, 3500000)
        c.ds.Create(fpb.CreateDatasetRequest(name="big", samples=len(big)), timeout=10)
        self.assertEqual(c.ds.UploadLengths(lengths_reqs("big", big, per=500000),
                                            timeout=120).lengths_sha256, big_sha)
        c.ds.Create(fpb.CreateDatasetRequest(name=PDS, samples=8), timeout=10)
        c.jobs.Create(fpb.CreateJobRequest(job=fpb.Job(name="pj", dataset=PDS, world_size=2)),
                      timeout=10)
        c.ep.ReportProgress(fpb.ReportProgressRequest(job="pj", rank=0, epoch=0, position=1),
                            timeout=10)
        for name in ("done", "open"):
            c.ck.Begin(cpb.BeginRequest(job=JOB, name=name, world_size=1), timeout=10)
            c.ck.UploadShard(upload_reqs(name, 0, shard_data("done", 0)), timeout=30)
        c.ck.Commit(cpb.CheckpointRef(job=JOB, name="done"), timeout=10)

        # New lengths that do not fit next to the old ones.
        new, _ = lengths_of(rnd, 3500000)
        code, msg = status_of(c.ds.UploadLengths, lengths_reqs("big", new, per=500000),
                              timeout=120)
        self.assertEqual(code, C.RESOURCE_EXHAUSTED, msg)
        self.assertIn("No space", msg)
        self.assertEqual([f for f in os.listdir(dsdir) if f.startswith(".")], [])
        self.assertEqual(c.ds.Get(fpb.GetDatasetRequest(name="big"), timeout=10).lengths_sha256,
                         big_sha)
        with open(os.path.join(dsdir, "big.lengths"), "rb") as f:
            self.assertEqual(hashlib.sha256(f.read()).hexdigest(), big_sha)

        # Fill the disk to the last byte with another file.
        filler = os.path.join(mnt, "filler")
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for size in (MiB, 4096, 1):
                try:
                    while True:
                        os.write(fd, b"\0" * size)
                except OSError:
                    pass
        finally:
            os.close(fd)
        # Every catalog write now fails cleanly (SQLite cannot grow its WAL), or succeeds if it
        # found room: never another status, never a dead daemon.
        writes = {
            "Datasets.Create": lambda: c.ds.Create(fpb.CreateDatasetRequest(
                name="late", samples=4), timeout=30),
            "Jobs.Create": lambda: c.jobs.Create(fpb.CreateJobRequest(job=fpb.Job(
                name="late", dataset=PDS, world_size=2)), timeout=30),
            "Epochs.ReportProgress": lambda: c.ep.ReportProgress(fpb.ReportProgressRequest(
                job="pj", rank=1, epoch=0, position=2), timeout=30),
            "Checkpoints.Begin": lambda: c.ck.Begin(cpb.BeginRequest(
                job=JOB, name="late", world_size=1), timeout=30),
            "Checkpoints.Commit": lambda: c.ck.Commit(cpb.CheckpointRef(
                job=JOB, name="open"), timeout=30),
            "Jobs.Resize": lambda: c.jobs.Resize(fpb.ResizeJobRequest(
                name="pj", world_size=4), timeout=30),
        }
        failed = []
        for what, fn in writes.items():
            code, msg = status_of(fn)
            note("disk full: %s -> %s %s" % (what, code, msg if code != C.OK else ""))
            if code != C.OK:
                self.assertEqual(code, C.RESOURCE_EXHAUSTED, (what, msg))
                self.assertIn("No space left on device", msg, what)
                failed.append(what)
            c.alive(self)
        self.assertIn("Datasets.Create", failed)
        self.assertIn("Checkpoints.Commit", failed)
        # Nothing stored changed, nothing half-written is visible.
        self.assertEqual([f for f in os.listdir(dsdir) if f.startswith(".")], [])
        v = c.ck.Verify(cpb.VerifyRequest(job=JOB, name="done", mode=cpb.DEEP), timeout=30)
        self.assertTrue(v.ok, v)
        self.assertEqual(c.ck.Get(cpb.CheckpointRef(job=JOB, name="open"), timeout=10).state,
                         cpb.WRITING)
        self.assertEqual(c.ds.Get(fpb.GetDatasetRequest(name="big"), timeout=10).lengths_sha256,
                         big_sha)

        # Space is back: every write works, and survives a SIGKILL (no transaction was left
        # open by a failed one).
        os.unlink(filler)
        for what, fn in writes.items():
            code, msg = status_of(fn)
            self.assertEqual(code, C.OK, (what, msg))
        self.assertEqual(c.ck.Get(cpb.CheckpointRef(job=JOB, name="open"), timeout=10).state,
                         cpb.COMPLETE)
        c.close()
        d.signal(signal.SIGKILL)
        d.stop()
        catalog_check(self, d.data_dir)
        d.start()
        c = Clients(d.addr)
        c.ds.Get(fpb.GetDatasetRequest(name="late"), timeout=10)
        c.jobs.Get(fpb.GetJobRequest(name="late"), timeout=10)
        self.assertEqual(c.jobs.Get(fpb.GetJobRequest(name="pj"), timeout=10).world_size, 4)
        self.assertEqual(c.ck.Get(cpb.CheckpointRef(job=JOB, name="late"), timeout=10).state,
                         cpb.WRITING)
        for name in ("done", "open"):
            v = c.ck.Verify(cpb.VerifyRequest(job=JOB, name=name, mode=cpb.DEEP), timeout=30)
            self.assertTrue(v.ok, (name, v))
        c.close()
        self.assertEqual(d.stop(), 0, d.log())
        self.assertEqual(d.sanitizer_reports(), [], d.log())
        catalog_check(self, d.data_dir)


LOCKER = r"""
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
db.execute("ROLLBACK")
db.close()
"""


class CatalogBusyTest(unittest.TestCase):
    """Another process holds the catalog's write lock (BEGIN IMMEDIATE on the WAL database).
    The daemon waits up to its busy timeout (5 s): a lock released sooner delays the write,
    one held longer fails it with UNAVAILABLE naming the busy catalog; reads go on, nothing is
    damaged, and after the release every write works."""

    def lock(self, path):
        p = subprocess.Popen([sys.executable, "-c", LOCKER, path], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        self.assertEqual(p.stdout.readline().strip(), "locked")
        return p

    def release(self, p):
        p.stdin.write("\n")
        p.stdin.close()
        self.assertEqual(p.wait(30), 0)
        p.stdout.close()

    def test_catalog_busy(self):
        with Daemon() as d:
            c = Clients(d.addr)
            path = os.path.join(d.data_dir, "catalog.db")
            c.ds.Create(fpb.CreateDatasetRequest(name=PDS, samples=8), timeout=10)
            c.jobs.Create(fpb.CreateJobRequest(job=fpb.Job(name="pj", dataset=PDS,
                                                           world_size=2)), timeout=10)
            c.ck.Begin(cpb.BeginRequest(job=JOB, name="a", world_size=1), timeout=10)

            # Held for longer than the busy timeout: the writes fail, UNAVAILABLE, and say why.
            p = self.lock(path)
            try:
                for what, fn in (
                        ("Datasets.Create", lambda: c.ds.Create(fpb.CreateDatasetRequest(
                            name="x", samples=4), timeout=60)),
                        ("Epochs.ReportProgress", lambda: c.ep.ReportProgress(
                            fpb.ReportProgressRequest(job="pj", rank=0, epoch=0, position=1),
                            timeout=60)),
                        ("Checkpoints.UploadShard", lambda: c.ck.UploadShard(
                            upload_reqs("a", 0, shard_data("a", 0)), timeout=60))):
                    code, msg = status_of(fn)
                    note("catalog locked: %s -> %s %s" % (what, code, msg))
                    self.assertEqual(code, C.UNAVAILABLE, (what, msg))
                    self.assertIn("catalog busy", msg, what)
                    c.alive(self)
            finally:
                self.release(p)
            # Nothing was half-done: the shard can be uploaded again (no partial row or file),
            # and every write works.
            st = c.ck.UploadStatus(cpb.UploadStatusRequest(job=JOB, checkpoint="a", rank=0),
                                   timeout=10)
            self.assertFalse(st.stored)
            c.ck.UploadShard(upload_reqs("a", 0, shard_data("a", 0), offset=st.held_bytes),
                             timeout=30)
            self.assertEqual(c.ck.Commit(cpb.CheckpointRef(job=JOB, name="a"), timeout=10).state,
                             cpb.COMPLETE)
            c.ds.Create(fpb.CreateDatasetRequest(name="x", samples=4), timeout=10)

            # Held for less than the busy timeout: the write waits for it and succeeds.
            p = self.lock(path)
            results = []
            t = threading.Thread(target=lambda: results.append(status_of(
                c.ds.Create, fpb.CreateDatasetRequest(name="y", samples=4), timeout=60)))
            t.start()
            time.sleep(1.0)
            self.release(p)
            t.join()
            self.assertEqual(results[0][0], C.OK, results)
            v = c.ck.Verify(cpb.VerifyRequest(job=JOB, name="a", mode=cpb.DEEP), timeout=30)
            self.assertTrue(v.ok, v)
            c.close()
            self.assertEqual(d.stop(), 0, d.log())
            self.assertEqual(d.sanitizer_reports(), [], d.log())
            catalog_check(self, d.data_dir)


def quarantined_ckpt(d):
    """Paths "checkpoints/<job>/<file>" of the checkpoint files the store quarantined: in the
    data dir's quarantine (a directory store) or under the bucket's PREFIX/quarantine/."""
    if d.store == "s3":
        pre = d.s3_prefix + "/quarantine/"
        return {"checkpoints/" + k[len(pre):] for k in d._list_keys(pre)}
    return {p for p in quarantined(d.data_dir) if p.startswith("checkpoints/")}


def quarantined(data_dir):
    """Paths (relative to the data dir) of the files in the quarantine's batches."""
    q, out = os.path.join(data_dir, "quarantine"), set()
    for dirpath, _, names in os.walk(q):
        rel = os.path.relpath(dirpath, q).split(os.sep, 1)
        out.update(os.path.join(rel[1], n) if len(rel) > 1 else n for n in names if rel[0] != ".")
    return out


def partial_upload(tc, c, d, name, seed):
    """Rank 0 of checkpoint `name` sends part of its shard, and the stream ends early: the daemon
    keeps the prefix for a resume. In a directory that is the 512 KiB sent of 1 MiB; in object
    storage only whole parts are kept, so the shard has two parts (S3_PART) and the first is sent.
    Returns (data, held bytes, the store's files of the partial upload)."""
    if d.store == "s3":
        data = random.Random(seed).randbytes(S3_PART + MiB)
        chunks = 1 + (S3_PART + 256 * 1024) // (256 * 1024)  # the header, a part and a bit
        held = S3_PART - 88  # part 1 holds the header and the first data bytes
        files = [".%s_shard_0.shard.part" % name, ".%s_shard_0.shard.part.head" % name]
    else:
        data = random.Random(seed).randbytes(MiB)
        chunks, held, files = 3, 512 * 1024, [".%s_shard_0.shard.part" % name]
    code, msg = status_of(c.ck.UploadShard, itertools.islice(
        upload_reqs(name, 0, data, sha=hashlib.sha256(data).hexdigest()), chunks), timeout=30)
    tc.assertEqual(code, C.INVALID_ARGUMENT, msg)
    st = c.ck.UploadStatus(cpb.UploadStatusRequest(job=JOB, checkpoint=name, rank=0), timeout=30)
    tc.assertEqual((st.held_bytes, st.in_progress), (held, False))
    return data, held, files


class CrashStateTest(unittest.TestCase):
    """The states a SIGKILL can leave between two steps, made on purpose (the kill rounds hit
    these windows only by chance): the daemon must finish or undo them at startup."""

    def sql(self, d, *stmts):
        db = sqlite3.connect(os.path.join(d.data_dir, "catalog.db"), isolation_level=None)
        try:
            for s, args in stmts:
                db.execute(s, args)
        finally:
            db.close()

    def test_lengths_between_steps(self):
        rnd = random.Random(3)
        with Daemon() as d:
            c = Clients(d.addr)
            vals = {}
            for name in ("recorded", "unrecorded", "kept"):
                c.ds.Create(fpb.CreateDatasetRequest(name=name, samples=1000), timeout=10)
                vals[name], sha = lengths_of(rnd, 1000)
                self.assertEqual(c.ds.UploadLengths(lengths_reqs(name, vals[name]),
                                                    timeout=30).lengths_sha256, sha)
            c.ds.Create(fpb.CreateDatasetRequest(name="deleted", samples=3), timeout=10)
            c.close()
            d.signal(signal.SIGKILL)
            d.stop()
            dsdir = os.path.join(d.data_dir, "datasets")

            def stage(name, n, recorded):
                new, sha = lengths_of(rnd, n)
                with open(os.path.join(dsdir, ".%s.lengths.%s.new" % (name, sha)), "wb") as f:
                    f.write(struct.pack("<%dI" % n, *new))
                if recorded:
                    self.sql(d, ("UPDATE feed_datasets SET lengths_sha256 = ? WHERE name = ?",
                                 (sha, name)))
                return sha
            # New lengths recorded in the catalog, the kill before the rename into place.
            rec_sha = stage("recorded", 1000, True)
            # New lengths staged, the kill before the catalog write: the old ones stay.
            unrec_sha = stage("unrecorded", 1000, False)
            # An upload cut short (removed), and the file of a dataset whose delete was committed
            # (quarantined: the catalog does not know it).
            with open(os.path.join(dsdir, ".kept.lengths.9.tmp"), "wb") as f:
                f.write(b"\1\0\0\0" * 10)
            self.sql(d, ("DELETE FROM feed_datasets WHERE name = ?", ("deleted",)))
            with open(os.path.join(dsdir, "deleted.lengths"), "wb") as f:
                f.write(b"\1\0\0\0" * 3)

            d.start()
            c = Clients(d.addr)
            self.assertEqual(sorted(os.listdir(dsdir)),
                             ["kept.lengths", "recorded.lengths", "unrecorded.lengths"])
            # Staged lengths the catalog never recorded are not removed either.
            self.assertEqual(quarantined(d.data_dir), {
                "datasets/deleted.lengths", "datasets/.unrecorded.lengths.%s.new" % unrec_sha})
            for name in ("recorded", "unrecorded", "kept"):
                ds = c.ds.Get(fpb.GetDatasetRequest(name=name), timeout=10)
                with open(os.path.join(dsdir, name + ".lengths"), "rb") as f:
                    self.assertEqual(hashlib.sha256(f.read()).hexdigest(), ds.lengths_sha256,
                                     name)
            self.assertEqual(c.ds.Get(fpb.GetDatasetRequest(name="recorded"),
                                      timeout=10).lengths_sha256, rec_sha)
            # The recovered lengths are usable: a batching job plans from them.
            c.jobs.Create(fpb.CreateJobRequest(job=fpb.Job(
                name="b", dataset="recorded", world_size=1,
                batching=fpb.BatchConfig(max_batch_size=8, max_seq_len=4096))), timeout=10)
            feed = fpbg.FeedStub(c.ch)
            got = sum(len(b.indices) for ch in feed.StreamBatches(
                fpb.StreamBatchesRequest(job="b", rank=0), timeout=30) for b in ch.batches)
            self.assertGreater(got, 0)
            c.close()
            self.assertEqual(d.stop(), 0, d.log())
            self.assertEqual(d.sanitizer_reports(), [], d.log())

    def test_complete_epoch_advances_at_start(self):
        """The report that completed an epoch was recorded, the kill came before the next
        epoch was: the job must not stay stuck on a complete epoch."""
        with Daemon() as d:
            c = Clients(d.addr)
            c.ds.Create(fpb.CreateDatasetRequest(name=PDS, samples=8), timeout=10)
            c.jobs.Create(fpb.CreateJobRequest(job=fpb.Job(name="pj", dataset=PDS,
                                                           world_size=2)), timeout=10)
            c.ep.ReportProgress(fpb.ReportProgressRequest(job="pj", rank=0, epoch=0, position=4),
                                timeout=10)
            c.close()
            d.signal(signal.SIGKILL)
            d.stop()
            self.sql(d, ("INSERT INTO feed_progress(job, dp_rank, epoch, position) "
                         "VALUES ('pj', 1, 0, 4)", ()))
            d.start()
            c = Clients(d.addr)
            st = c.ep.Get(fpb.GetEpochRequest(job="pj"), timeout=10)
            self.assertEqual(st.epoch, 1, st)
            self.assertFalse(st.complete, st)
            self.assertEqual([r.position for r in st.ranks], [0, 0])
            c.close()
            self.assertEqual(d.stop(), 0, d.log())
            self.assertEqual(d.sanitizer_reports(), [], d.log())

    def test_checkpoint_files_at_start(self):
        """What the startup sweep keeps (docs/checkpoints.md): the young partial upload of a
        WRITING checkpoint (a stream that ended early), which then resumes. It removes an
        abandoned one (older than --upload-timeout), metadata temp files, and files of an aborted
        checkpoint no newer than the abort; newer files of it and files of checkpoints the catalog
        does not know go to the quarantine."""
        with Daemon(args=["--upload-timeout", "600"] + S3_ARGS) as d:
            c = Clients(d.addr)
            for name, world in (("w", 2), ("gone", 1), ("ab", 1)):
                c.ck.Begin(cpb.BeginRequest(job=JOB, name=name, world_size=world), timeout=10)
            c.ck.Abort(cpb.CheckpointRef(job=JOB, name="ab"), timeout=10)
            # An upload of rank 0 the client gave up on after 512 KiB (s3: after its first
            # part): its partial stays.
            data, held, young = partial_upload(self, c, d, "w", 1)
            sha = hashlib.sha256(data).hexdigest()
            c.close()
            d.signal(signal.SIGKILL)
            d.stop()
            self.sql(d, ("DELETE FROM checkpoints WHERE name = 'gone'", ()))
            self.assertEqual(d.store_files(JOB), young)
            files = {".w_shard_1.shard.part": b"\0" * 88,       # abandoned: old mtime below
                     ".ab_shard_0.shard.part": b"\0" * 88,      # aborted checkpoint, older
                     ".gone_shard_0.shard.part": b"\0" * 88,    # unknown checkpoint
                     "gone_shard_0.shard": b"\0" * 88,
                     "gone.metadata.json": b"{}",
                     "ab.metadata.json": b"{}",
                     ".w.metadata.json.tmp": b"{"}
            for f, content in files.items():
                d.store_write(JOB, f, content)
            old = time.time() - 3600
            d.store_set_mtime(JOB, ".w_shard_1.shard.part", old)
            d.store_set_mtime(JOB, ".ab_shard_0.shard.part", old)
            if d.store == "s3":
                # Last-Modified counts whole seconds: the metadata written just now could look
                # no newer than the abort of a moment ago (and be removed, not quarantined).
                d.store_set_mtime(JOB, "ab.metadata.json", time.time() + 2)
            d.start()
            c = Clients(d.addr)
            self.assertEqual(d.store_files(JOB), young)
            self.assertEqual(quarantined_ckpt(d), {
                "checkpoints/%s/%s" % (JOB, f) for f in (
                    "ab.metadata.json", ".gone_shard_0.shard.part", "gone_shard_0.shard",
                    "gone.metadata.json")})
            st = c.ck.UploadStatus(cpb.UploadStatusRequest(job=JOB, checkpoint="w", rank=0),
                                   timeout=10)
            self.assertEqual(st.held_bytes, held)
            c.ck.UploadShard(upload_reqs("w", 0, data, offset=held, sha=sha), timeout=30)
            c.ck.UploadShard(upload_reqs("w", 1, shard_data("w", 1)), timeout=30)
            self.assertEqual(c.ck.Commit(cpb.CheckpointRef(job=JOB, name="w"), timeout=10).state,
                             cpb.COMPLETE)
            v = c.ck.Verify(cpb.VerifyRequest(job=JOB, name="w", mode=cpb.DEEP), timeout=30)
            self.assertTrue(v.ok, v)
            c.close()
            self.assertEqual(d.stop(), 0, d.log())
            self.assertEqual(d.sanitizer_reports(), [], d.log())

    def test_unreadable_catalog_keeps_files(self):
        """A catalog the startup sweep cannot read (here: its checkpoints table renamed away)
        must not make the daemon remove checkpoint files: it cannot know they are abandoned."""
        with Daemon(args=S3_ARGS) as d:
            c = Clients(d.addr)
            c.ck.Begin(cpb.BeginRequest(job=JOB, name="done", world_size=1), timeout=10)
            c.ck.UploadShard(upload_reqs("done", 0, shard_data("done", 0)), timeout=30)
            c.ck.Commit(cpb.CheckpointRef(job=JOB, name="done"), timeout=10)
            c.ck.Begin(cpb.BeginRequest(job=JOB, name="w", world_size=1), timeout=10)
            data, _, _ = partial_upload(self, c, d, "w", 2)
            c.close()
            d.signal(signal.SIGKILL)
            d.stop()
            before = d.store_files(JOB)
            self.assertIn(".w_shard_0.shard.part", before)
            self.sql(d, ("ALTER TABLE checkpoints RENAME TO checkpoints_away", ()))
            d.start()
            self.assertEqual(d.store_files(JOB), before)
            d.stop()
            self.sql(d, ("ALTER TABLE checkpoints_away RENAME TO checkpoints", ()))
            d.start()
            c = Clients(d.addr)
            self.assertEqual(d.store_files(JOB), before)
            v = c.ck.Verify(cpb.VerifyRequest(job=JOB, name="done", mode=cpb.DEEP), timeout=30)
            self.assertTrue(v.ok, v)
            st = c.ck.UploadStatus(cpb.UploadStatusRequest(job=JOB, checkpoint="w", rank=0),
                                   timeout=10)
            c.ck.UploadShard(upload_reqs("w", 0, data, offset=st.held_bytes,
                                         sha=hashlib.sha256(data).hexdigest()), timeout=30)
            self.assertEqual(c.ck.Commit(cpb.CheckpointRef(job=JOB, name="w"), timeout=10).state,
                             cpb.COMPLETE)
            c.close()
            self.assertEqual(d.stop(), 0, d.log())
            self.assertEqual(d.sanitizer_reports(), [], d.log())
