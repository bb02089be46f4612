"""Catalog loss must not become data loss (issue 13, Hardening II, item 7).

Found by the attack on the daemon as it was: restoring catalog.db from a backup (the method
docs/hardening.md called safe) and restarting deleted every shard, metadata file and lengths file
newer than the backup; deleting catalog.db while the daemon ran went unnoticed (later Commits
answered OK), and the restart deleted every checkpoint. Now files the catalog does not know go to
<data dir>/quarantine, and a catalog file removed or replaced under a running daemon makes it
refuse writes and report NOT_SERVING (docs/checkpoints.md, "Backup and restore").

Each test runs the real sluiced on 127.0.0.1 with real files and real clients (grpcio and the
sluice CLI), and is bounded in time (the daemon's catalog check runs every second).
"""
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import sqlite3
import struct
import time
import unittest
import urllib.request

import grpc

from sluice.v1 import admin_pb2, admin_pb2_grpc
from sluice.v1 import checkpoint_pb2 as cpb
from sluice.v1 import checkpoint_pb2_grpc as cpbg
from sluice.v1 import feed_pb2 as fpb
from sluice.v1 import feed_pb2_grpc as fpbg
from sluice._health import health_pb2, health_pb2_grpc
from sltest import Daemon, cli

C = grpc.StatusCode
JOB = "cj"
KiB = 1 << 10


def shard_data(name, rank, size=300 * KiB + 7):
    h = hashlib.sha256(b"%s/%d" % (name.encode(), rank)).digest()
    return (h * (size // 32 + 1))[:size]


def upload_reqs(name, rank, data, chunk=64 * KiB):
    yield cpb.UploadShardRequest(header=cpb.ShardHeader(
        job=JOB, checkpoint=name, rank=rank, data_size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        tensors=[cpb.TensorInfo(name="w", dtype="uint8", shape=[len(data)], offset=0,
                                size=len(data))]))
    for i in range(0, len(data), chunk):
        yield cpb.UploadShardRequest(chunk=data[i:i + chunk])


def lengths(name, n):
    vals = [1 + (i * 7919 + len(name)) % 4000 for i in range(n)]
    return vals, hashlib.sha256(struct.pack("<%dI" % n, *vals)).hexdigest()


def files_under(root, *subdirs):
    """{path relative to root: sha256} of every regular file under root/<subdir>."""
    out = {}
    for sub in subdirs:
        for dirpath, _, names in os.walk(os.path.join(root, sub)):
            for n in names:
                p = os.path.join(dirpath, n)
                with open(p, "rb") as f:
                    out[os.path.relpath(p, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


class Base(unittest.TestCase):
    def setUp(self):
        self.d = Daemon(args=["--metrics-listen", "127.0.0.1:0"])
        self.addCleanup(self.d.cleanup)
        self.d.start()
        self.connect()

    def connect(self):
        self.ch = grpc.insecure_channel(self.d.addr)
        self.ck = cpbg.CheckpointsStub(self.ch)
        self.ds = fpbg.DatasetsStub(self.ch)
        self.jobs = fpbg.JobsStub(self.ch)
        self.admin = admin_pb2_grpc.AdminStub(self.ch)
        self.health = health_pb2_grpc.HealthStub(self.ch)

    def restart(self):
        self.ch.close()
        self.assertEqual(self.d.stop(), 0, self.d.log())
        self.d.start()
        self.connect()

    def tearDown(self):
        self.ch.close()
        self.assertEqual(self.d.stop(), 0, self.d.log())
        self.assertEqual(self.d.sanitizer_reports(), [], self.d.log())

    @property
    def catalog(self):
        return os.path.join(self.d.data_dir, "catalog.db")

    def checkpoint(self, name, world=2, commit=True, ranks=None):
        self.ck.Begin(cpb.BeginRequest(job=JOB, name=name, world_size=world), timeout=10)
        for r in range(world) if ranks is None else ranks:
            self.ck.UploadShard(upload_reqs(name, r, shard_data(name, r)), timeout=30)
        if commit:
            self.assertEqual(self.ck.Commit(cpb.CheckpointRef(job=JOB, name=name),
                                            timeout=10).state, cpb.COMPLETE)

    def partial(self, name, rank):
        """An upload of `rank` cut after its first chunks: the daemon keeps the partial file."""
        data = shard_data(name, rank)
        with self.assertRaises(grpc.RpcError) as e:
            self.ck.UploadShard(itertools.islice(upload_reqs(name, rank, data), 3), timeout=30)
        self.assertEqual(e.exception.code(), C.INVALID_ARGUMENT, e.exception.details())

    def dataset(self, name, n=5000):
        vals, sha = lengths(name, n)
        self.ds.Create(fpb.CreateDatasetRequest(name=name, samples=n), timeout=10)
        got = self.ds.UploadLengths(iter([fpb.UploadLengthsRequest(name=name, lengths=vals)]),
                                    timeout=30)
        self.assertEqual(got.lengths_sha256, sha)

    def verify(self, name):
        v = self.ck.Verify(cpb.VerifyRequest(job=JOB, name=name, mode=cpb.DEEP), timeout=30)
        self.assertTrue(v.ok, v)

    def metrics(self):
        port = re.findall(r"event=metrics_listening .*port=(\d+)", self.d.log())[-1]
        with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=10) as r:
            return r.read().decode()

    def metric(self, text, series):
        m = re.search(r"^%s (\S+)$" % re.escape(series), text, re.M)
        self.assertIsNotNone(m, series + " missing from /metrics")
        return float(m.group(1))

    def quarantined(self):
        """{path relative to the batch dir: sha256} of what the quarantine holds (one batch)."""
        q = os.path.join(self.d.data_dir, "quarantine")
        batches = [b for b in os.listdir(q) if os.path.isdir(os.path.join(q, b))] \
            if os.path.isdir(q) else []
        self.assertLessEqual(len(batches), 1, batches)
        return files_under(os.path.join(q, batches[0]), ".") if batches else {}

    def assert_nothing_lost(self, before):
        """Every file of `before` is at its place or in the quarantine, unchanged. Returns the
        ones in the quarantine."""
        now = files_under(self.d.data_dir, "checkpoints", "datasets")
        moved = {os.path.normpath(k): v for k, v in self.quarantined().items()}
        gone = [p for p in before if now.get(p) != before[p] and moved.get(p) != before[p]]
        self.assertEqual(gone, [], "files deleted or changed:\n" + self.d.log()[-6000:])
        return {p for p in before if p not in now}


class BackupRestoreTest(Base):
    """(a) An online backup restored the documented way: nothing newer is deleted."""

    def test_restored_backup_quarantines_newer_files(self):
        self.dataset("old")
        self.checkpoint("s1")
        self.checkpoint("s2")
        # Aborted before the backup, begun again and committed after it: the restored catalog
        # has it INCOMPLETE with its removal recorded, but its files are newer than that.
        self.checkpoint("ab", commit=False)
        self.ck.Abort(cpb.CheckpointRef(job=JOB, name="ab"), timeout=10)
        time.sleep(0.05)

        backup = os.path.join(os.path.dirname(self.d.data_dir), "backup.db")
        src, dst = sqlite3.connect(self.catalog), sqlite3.connect(backup)
        with dst:
            src.backup(dst)  # online, while the daemon runs
        src.close()
        dst.close()
        time.sleep(0.05)

        self.checkpoint("ab")
        self.checkpoint("s3")
        self.checkpoint("s4", commit=False, ranks=[0])  # WRITING: one shard,
        self.partial("s4", 1)                           # and a partial upload kept for a resume
        self.dataset("new")
        before = files_under(self.d.data_dir, "checkpoints", "datasets")
        newer = {p for p in before if re.search(r"/(ab|s3|s4)[._]|/\.s4_|new\.lengths", p)}
        # ab and s3: 2 shards and metadata each; s4: a shard and a partial; new.lengths.
        self.assertEqual(len(newer), 3 + 3 + 2 + 1, sorted(newer))

        # Restore: stop, replace catalog.db, start.
        self.ch.close()
        self.assertEqual(self.d.stop(), 0, self.d.log())
        self.assertFalse(os.path.exists(self.catalog + "-wal"))
        os.replace(backup, self.catalog)
        self.d.start()
        self.connect()

        moved = self.assert_nothing_lost(before)
        self.assertEqual(moved, newer)
        self.assertEqual(set(os.path.normpath(p) for p in self.quarantined()), newer)
        for name in ("s1", "s2"):
            self.verify(name)
        self.assertEqual(self.ds.Get(fpb.GetDatasetRequest(name="old"), timeout=10).lengths_sha256,
                         lengths("old", 5000)[1])
        nbytes = sum(os.path.getsize(os.path.join(self.d.data_dir, "quarantine", b, p))
                     for b in os.listdir(os.path.join(self.d.data_dir, "quarantine"))
                     for p in newer)

        info = self.admin.GetInfo(admin_pb2.GetInfoRequest(), timeout=10)
        self.assertEqual((info.quarantine_files, info.quarantine_bytes), (len(newer), nbytes))
        self.assertEqual(info.quarantine_dir, os.path.join(self.d.data_dir, "quarantine"))
        self.assertEqual(info.catalog_problem, "")
        out = cli("--json", "info", addr=self.d.addr)
        self.assertEqual(out.returncode, 0, out.stderr)
        j = json.loads(out.stdout)
        self.assertEqual((j["quarantine_files"], j["quarantine_bytes"]), (len(newer), nbytes))
        text = cli("info", addr=self.d.addr).stdout
        self.assertIn("quarantine:      %d files, %d bytes" % (len(newer), nbytes), text)
        m = self.metrics()
        self.assertEqual(self.metric(m, "sluice_quarantined_files_total"), len(newer))
        self.assertEqual(self.metric(m, "sluice_quarantine_files"), len(newer))
        self.assertEqual(self.metric(m, "sluice_quarantine_bytes"), nbytes)
        self.assertEqual(self.metric(m, "sluice_catalog_lost"), 0)
        log = self.d.log()
        self.assertEqual(len(re.findall(r"event=quarantined ", log)), len(newer))
        self.assertRegex(log, r"event=quarantine_batch files=%d bytes=%d path=\S+/quarantine/\d{8}T"
                         % (len(newer), nbytes))

        # The restored daemon writes again, and a second restart moves nothing more.
        self.checkpoint("s5")
        self.restart()
        self.verify("s5")
        self.assertEqual(self.admin.GetInfo(admin_pb2.GetInfoRequest(),
                                            timeout=10).quarantine_files, len(newer))
        self.assertEqual(self.metric(self.metrics(), "sluice_quarantined_files_total"), 0)


class CatalogGoneTest(Base):
    """(b) catalog.db deleted, (c) another file renamed over it, while the daemon runs."""

    def prepare(self):
        self.checkpoint("a")
        self.checkpoint("w", commit=False)  # every rank stored: a Commit would succeed
        self.dataset("d")
        return files_under(self.d.data_dir, "checkpoints", "datasets")

    def assert_writes_refused(self, change):
        deadline = time.monotonic() + 10
        for call in (lambda: self.ck.Commit(cpb.CheckpointRef(job=JOB, name="w"), timeout=10),
                     lambda: self.ck.Begin(cpb.BeginRequest(job=JOB, name="x", world_size=1),
                                           timeout=10),
                     lambda: self.ck.UploadShard(upload_reqs("w", 1, shard_data("w", 1)),
                                                 timeout=30),
                     lambda: self.ds.Create(fpb.CreateDatasetRequest(name="e", samples=3),
                                            timeout=10),
                     lambda: self.ck.Delete(cpb.CheckpointRef(job=JOB, name="a"), timeout=10)):
            with self.assertRaises(grpc.RpcError) as e:
                call()
            self.assertEqual(e.exception.code(), C.FAILED_PRECONDITION, e.exception.details())
            self.assertIn("catalog %s was %s while sluiced ran" % (self.catalog, change),
                          e.exception.details())
            self.assertIn("restarted", e.exception.details())
        # Reads go on, from the file still open.
        self.assertEqual(self.ck.Get(cpb.CheckpointRef(job=JOB, name="a"), timeout=10).state,
                         cpb.COMPLETE)
        self.verify("a")
        self.assertEqual(len(self.ds.List(fpb.ListDatasetsRequest(), timeout=10).datasets), 1)
        info = self.admin.GetInfo(admin_pb2.GetInfoRequest(), timeout=10)
        self.assertIn("was %s" % change, info.catalog_problem)
        self.assertIn("was %s" % change, cli("info", addr=self.d.addr).stdout)
        # Health says NOT_SERVING (an orchestrator restarts the daemon), now and after the timer.
        while time.monotonic() < deadline:
            st = self.health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
            if st == health_pb2.HealthCheckResponse.NOT_SERVING:
                break
            time.sleep(0.1)
        self.assertEqual(st, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.assertNotEqual(cli("health", addr=self.d.addr).returncode, 0)
        self.assertEqual(self.metric(self.metrics(), "sluice_catalog_lost"), 1)
        self.assertIn("event=catalog_lost", self.d.log())
        self.assertIn("event=catalog_rescued", self.d.log())

    def test_removed_catalog_refuses_writes_and_restart_quarantines(self):
        before = self.prepare()
        os.unlink(self.catalog)
        self.assert_writes_refused("removed")
        self.assertFalse(os.path.exists(os.path.join(self.d.data_dir, "checkpoints", JOB,
                                                     "w.metadata.json")))

        # The restart makes a new empty catalog: every file goes to the quarantine, not away.
        self.restart()
        moved = self.assert_nothing_lost(before)
        self.assertEqual(moved, set(before))
        self.assertEqual(len(self.ck.List(cpb.ListRequest(), timeout=10).checkpoints), 0)
        info = self.admin.GetInfo(admin_pb2.GetInfoRequest(), timeout=10)
        self.assertEqual(info.catalog_problem, "")
        # The shards, metadata and lengths, and the copy of the lost catalog the daemon saved.
        self.assertEqual(info.quarantine_files, len(before) + 1)
        self.assertEqual(self.health.Check(health_pb2.HealthCheckRequest(service=""),
                                           timeout=10).status,
                         health_pb2.HealthCheckResponse.SERVING)
        self.assertEqual(self.metric(self.metrics(), "sluice_catalog_lost"), 0)

        # The saved copy is the catalog that was lost: restored with the files, all is back.
        q = os.path.join(self.d.data_dir, "quarantine")
        saved = [f for f in os.listdir(q) if f.startswith("catalog-lost-")]
        self.assertEqual(len(saved), 1, os.listdir(q))
        batch = [b for b in os.listdir(q) if os.path.isdir(os.path.join(q, b))][0]
        self.ch.close()
        self.assertEqual(self.d.stop(), 0, self.d.log())
        os.replace(os.path.join(q, saved[0]), self.catalog)
        for sub in ("checkpoints", "datasets"):
            shutil.copytree(os.path.join(q, batch, sub), os.path.join(self.d.data_dir, sub),
                            dirs_exist_ok=True, copy_function=os.link)
        shutil.rmtree(os.path.join(q, batch))
        self.d.start()
        self.connect()
        self.verify("a")
        self.assertEqual(self.ck.Commit(cpb.CheckpointRef(job=JOB, name="w"), timeout=10).state,
                         cpb.COMPLETE)
        self.verify("w")
        self.assertEqual(self.admin.GetInfo(admin_pb2.GetInfoRequest(),
                                            timeout=10).quarantine_files, 0)

    def test_replaced_catalog_refuses_writes(self):
        before = self.prepare()
        other = os.path.join(os.path.dirname(self.d.data_dir), "other.db")
        db = sqlite3.connect(other)
        db.execute("CREATE TABLE t (x)")
        db.close()
        os.rename(other, self.catalog)
        self.assert_writes_refused("replaced")
        # The WAL the daemon left was folded into its own file and emptied: it cannot be applied
        # to the file now at the path.
        wal = self.catalog + "-wal"
        self.assertTrue(not os.path.exists(wal) or os.path.getsize(wal) == 0)
        self.ch.close()
        self.assertEqual(self.d.stop(), 0, self.d.log())
        self.assertEqual(self.d.sanitizer_reports(), [], self.d.log())
        db = sqlite3.connect(self.catalog)
        self.assertEqual(db.execute("PRAGMA integrity_check").fetchall(), [("ok",)])
        self.assertEqual(db.execute("SELECT name FROM sqlite_master").fetchall(), [("t",)])
        db.close()
        # The restart opens the file now at the path and quarantines what it does not know.
        self.d.start()
        self.connect()
        self.assertEqual(self.assert_nothing_lost(before), set(before))


if __name__ == "__main__":
    unittest.main()
