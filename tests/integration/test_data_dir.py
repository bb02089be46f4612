"""What the daemon does with its data dir when others meddle with it.

A daemon whose data dir is removed under it must not touch what appears at that path later.
Found by the soak benchmark (docs/hardening.md, "Load and soak"): a sluiced left running on a data
dir that was then removed and made again for a second sluiced kept sweeping the path every 60 s,
and since its own (deleted) catalog did not know the second daemon's checkpoints, it removed their
partial uploads; the second daemon's uploads failed at the rename with "No such file or
directory". The first daemon now sees that the LOCK file it holds is no longer the one at the
path, logs data_dir_replaced and stops sweeping.

Symbolic links planted in the data dir are never followed (issue 13; server/store/path.c): a
linked job directory, a link at a `.part`, `.metadata.json.tmp` or lengths temp file's name, a
linked shard, a link at the quarantine directory or a batch directory's name, at catalog.db-wal or
catalog.db-shm. A data dir writable by other users is refused unless --allow-shared-data-dir.
The data dir's lock holds even when its LOCK file is removed (issue 25).
"""
import hashlib
import os
import re
import shutil
import tempfile
import threading
import time
import unittest

import grpc

from sluice.v1 import checkpoint_pb2 as pb
from sluice.v1 import checkpoint_pb2_grpc as pbg
from sluice.v1 import feed_pb2 as fpb
from sluice.v1 import feed_pb2_grpc as fpbg
from sltest import Daemon

MiB = 1 << 20


def requests(data, data_size, sha, offset=0):
    yield pb.UploadShardRequest(header=pb.ShardHeader(
        job="j", checkpoint="c", rank=0, data_size=data_size, sha256=sha, offset=offset))
    for i in range(offset, len(data), MiB):
        yield pb.UploadShardRequest(chunk=data[i:i + MiB])


class DataDirReplacedTest(unittest.TestCase):
    def test_old_daemon_leaves_the_new_data_dir_alone(self):
        tmp = tempfile.TemporaryDirectory(prefix="sluice-test-")
        self.addCleanup(tmp.cleanup)
        data_dir = os.path.join(tmp.name, "data")
        # The old daemon sweeps every second (half its upload timeout); the new one keeps
        # partial uploads for the default hour.
        old = Daemon(data_dir=data_dir, args=["--upload-timeout", "2"]).start()
        self.addCleanup(old.cleanup)
        shutil.rmtree(data_dir)
        new = Daemon(data_dir=data_dir).start()
        self.addCleanup(new.cleanup)

        channel = grpc.insecure_channel(new.addr)
        self.addCleanup(channel.close)
        stub = pbg.CheckpointsStub(channel)
        stub.Begin(pb.BeginRequest(job="j", name="c", world_size=1), timeout=10)
        data = bytes(range(256)) * (3 * MiB // 256)
        sha = hashlib.sha256(data).hexdigest()
        # A partial upload in the new daemon: 2 MiB of 3, then the client goes away.
        release = threading.Event()

        def cut():
            yield from requests(data[:2 * MiB], len(data), sha)
            release.wait(20)
        fut = stub.UploadShard.future(cut(), timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            st = stub.UploadStatus(pb.UploadStatusRequest(job="j", checkpoint="c", rank=0))
            if st.held_bytes == 2 * MiB:
                break
            time.sleep(0.05)
        fut.cancel()
        release.set()
        part = os.path.join(data_dir, "checkpoints", "j", ".c_shard_0.shard.part")
        self.assertTrue(os.path.exists(part))

        # Wait until the old daemon has looked at the path (it logs that it lost its data dir)
        # or, before the fix, until its sweep has removed the partial file.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "data_dir_replaced" in old.log() or not os.path.exists(part):
                break
            time.sleep(0.1)
        self.assertTrue(os.path.exists(part), "the old daemon removed the new daemon's partial "
                        "upload\n" + old.log())
        self.assertIn("data_dir_replaced", old.log())

        # The upload resumes and completes in the new daemon.
        st = stub.UploadStatus(pb.UploadStatusRequest(job="j", checkpoint="c", rank=0))
        self.assertEqual((st.in_progress, st.held_bytes), (False, 2 * MiB))
        r = stub.UploadShard(requests(data, len(data), sha, offset=2 * MiB), timeout=60)
        self.assertEqual(r.sha256, sha)
        self.assertEqual(stub.Commit(pb.CheckpointRef(job="j", name="c"), timeout=10).state,
                         pb.COMPLETE)

        channel.close()
        self.assertEqual(new.stop(), 0, new.log())
        self.assertEqual(old.stop(), 0, old.log())
        self.assertEqual(new.sanitizer_reports() + old.sanitizer_reports(), [], old.log())


class CatalogPermissionsTest(unittest.TestCase):
    """The catalog and its WAL files are readable by the daemon's user only, whatever the umask
    (SQLite made them 0644), an existing one is tightened, and a symlink in its place is
    refused."""

    def test_catalog_files_are_0600(self):
        old = os.umask(0o022)
        try:
            d = Daemon().start()
        finally:
            os.umask(old)
        try:
            cat = os.path.join(d.data_dir, "catalog.db")
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(cat + suffix):
                    self.assertEqual(os.stat(cat + suffix).st_mode & 0o777, 0o600, suffix)
            self.assertEqual(d.stop(), 0, d.log())
            os.chmod(cat, 0o644)
            d.start()
            self.assertEqual(os.stat(cat).st_mode & 0o777, 0o600)
            self.assertEqual(d.stop(), 0, d.log())
            elsewhere = os.path.join(os.path.dirname(d.data_dir), "elsewhere.db")
            os.rename(cat, elsewhere)
            for suffix in ("-wal", "-shm"):
                if os.path.exists(cat + suffix):
                    os.unlink(cat + suffix)
            os.symlink(elsewhere, cat)
            with self.assertRaises(RuntimeError) as e:
                d.start()
            self.assertIn("catalog_open_failed", str(e.exception))
            self.assertEqual(os.stat(elsewhere).st_mode & 0o777, 0o600)
        finally:
            d.cleanup()

    def test_linked_wal_and_shm_refused(self):
        """A link at catalog.db-wal or catalog.db-shm: SQLite opens neither through it (it opens
        them O_NOFOLLOW) but said only "unable to open database file"; the daemon refuses to
        start naming the file, and the link's target is untouched."""
        d = Daemon()
        self.addCleanup(d.cleanup)
        d.start()
        self.assertEqual(d.stop(), 0, d.log())
        cat = os.path.join(d.data_dir, "catalog.db")
        victim = os.path.join(os.path.dirname(d.data_dir), "victim")
        for suffix in ("-wal", "-shm"):
            with open(victim, "wb") as f:
                f.write(b"not a WAL\n" * 100)
            for s in ("-wal", "-shm"):
                if os.path.lexists(cat + s):
                    os.unlink(cat + s)
            os.symlink(victim, cat + suffix)
            d = Daemon(data_dir=d.data_dir)
            self.addCleanup(d.cleanup)
            with self.assertRaises(RuntimeError) as e:
                d.start()
            msg = str(e.exception)
            self.assertIn("event=catalog_open_failed path=%s%s " % (cat, suffix), msg)
            self.assertIn("symbolic link", msg)
            with open(victim, "rb") as f:
                self.assertEqual(f.read(), b"not a WAL\n" * 100, suffix)
            self.assertTrue(os.path.islink(cat + suffix))
            os.unlink(cat + suffix)
        # With the link gone, the catalog opens as it was.
        d = Daemon(data_dir=d.data_dir)
        self.addCleanup(d.cleanup)
        d.start()
        self.assertEqual(d.stop(), 0, d.log())
        self.assertEqual(d.sanitizer_reports(), [], d.log())


class StoreLinksTest(unittest.TestCase):
    """Links planted inside the data dir (by anyone who can write there) are refused or replaced,
    never followed: nothing is written outside the data dir and no victim file changes."""

    VICTIM = b"victim's bytes, not to be touched\n" * 100

    def setUp(self):
        self.d = Daemon().start()
        self.addCleanup(self.d.cleanup)
        self.outside = os.path.join(os.path.dirname(self.d.data_dir), "outside")
        os.mkdir(self.outside)
        self.victim = os.path.join(self.outside, "victim")
        with open(self.victim, "wb") as f:
            f.write(self.VICTIM)
        self.channel = grpc.insecure_channel(self.d.addr)
        self.addCleanup(self.channel.close)
        self.ck = pbg.CheckpointsStub(self.channel)
        self.job_dir = os.path.join(self.d.data_dir, "checkpoints", "j")

    def tearDown(self):
        self.channel.close()
        self.assertEqual(self.d.stop(), 0, self.d.log())
        self.assertEqual(self.d.sanitizer_reports(), [], self.d.log())

    def assert_victim_intact(self):
        with open(self.victim, "rb") as f:
            self.assertEqual(f.read(), self.VICTIM)
        self.assertEqual(sorted(os.listdir(self.outside)), ["victim"])

    def upload(self, data=b"shard data " * 1000):
        sha = hashlib.sha256(data).hexdigest()
        return self.ck.UploadShard(requests(data, len(data), sha), timeout=30)

    def begin(self):
        self.ck.Begin(pb.BeginRequest(job="j", name="c", world_size=1), timeout=10)

    def test_linked_job_dir(self):
        self.begin()
        if os.path.exists(self.job_dir):
            shutil.rmtree(self.job_dir)
        os.symlink(self.outside, self.job_dir)
        with self.assertRaises(grpc.RpcError) as e:
            self.upload()
        self.assertEqual(e.exception.code(), grpc.StatusCode.INTERNAL)
        self.assertIn("symbolic link", e.exception.details())
        self.assertIn(self.job_dir, e.exception.details())
        self.assert_victim_intact()
        # The daemon goes on serving, and the link stays what it was.
        self.assertTrue(os.path.islink(self.job_dir))
        st = self.ck.UploadStatus(pb.UploadStatusRequest(job="j", checkpoint="c", rank=0))
        self.assertEqual(st.held_bytes, 0)

    def test_linked_part(self):
        self.begin()
        os.makedirs(self.job_dir, exist_ok=True)
        part = os.path.join(self.job_dir, ".c_shard_0.shard.part")
        os.symlink(self.victim, part)
        with self.assertRaises(grpc.RpcError) as e:
            self.upload()
        self.assertEqual(e.exception.code(), grpc.StatusCode.INTERNAL)
        self.assertIn("cannot open the partial file " + part, e.exception.details())
        self.assertIn("symbolic link", e.exception.details())
        self.assert_victim_intact()
        # The failed upload removed the link itself (its name is the upload's temp file); the
        # next attempt succeeds.
        self.assertFalse(os.path.lexists(part))
        self.assertEqual(self.upload().sha256, hashlib.sha256(b"shard data " * 1000).hexdigest())
        self.assert_victim_intact()

    def test_linked_metadata_tmp_and_shard(self):
        self.begin()
        self.upload()
        tmp = os.path.join(self.job_dir, ".c.metadata.json.tmp")
        os.symlink(self.victim, tmp)
        self.assertEqual(self.ck.Commit(pb.CheckpointRef(job="j", name="c"), timeout=10).state,
                         pb.COMPLETE)
        self.assert_victim_intact()
        self.assertFalse(os.path.lexists(tmp))
        meta = os.path.join(self.job_dir, "c.metadata.json")
        self.assertFalse(os.path.islink(meta))
        self.assertTrue(os.path.isfile(meta))
        # A shard replaced by a link to a byte-identical copy outside: verification and
        # download do not read through it.
        shard = os.path.join(self.job_dir, "c_shard_0.shard")
        copy = os.path.join(self.outside, "copy")
        shutil.copyfile(shard, copy)
        os.unlink(shard)
        os.symlink(copy, shard)
        v = self.ck.Verify(pb.VerifyRequest(job="j", name="c", mode=pb.DEEP), timeout=10)
        self.assertFalse(v.ok)
        self.assertEqual(v.shards[0].verdict, pb.IO_ERROR)
        self.assertIn("symbolic link", v.shards[0].detail)
        with self.assertRaises(grpc.RpcError) as e:
            list(self.ck.DownloadShard(pb.DownloadShardRequest(job="j", name="c", rank=0),
                                       timeout=10))
        self.assertIn("symbolic link", e.exception.details())

    def test_linked_lengths_files(self):
        ds = fpbg.DatasetsStub(self.channel)
        ds.Create(fpb.CreateDatasetRequest(name="ds", samples=4), timeout=10)
        lengths = [3, 1, 4, 1]
        sha = hashlib.sha256(b"".join(n.to_bytes(4, "little") for n in lengths)).hexdigest()
        datasets = os.path.join(self.d.data_dir, "datasets")
        # A temp file name of the old form (it now carries a random tag of the process, so it
        # cannot be guessed), the staged name and the final name: all links.
        planted = [os.path.join(datasets, n) for n in
                   (".ds.lengths.1.tmp", ".ds.lengths.%s.new" % sha, "ds.lengths")]
        for p in planted:
            os.symlink(self.victim, p)
        r = ds.UploadLengths(iter([fpb.UploadLengthsRequest(name="ds", lengths=lengths)]),
                             timeout=10)
        self.assertTrue(r.has_lengths)
        self.assert_victim_intact()
        self.assertFalse(os.path.lexists(planted[1]))
        self.assertFalse(os.path.islink(planted[2]))
        with open(planted[2], "rb") as f:
            self.assertEqual(hashlib.sha256(f.read()).hexdigest(), sha)


class QuarantineLinksTest(unittest.TestCase):
    """A link planted at the quarantine directory or at a batch directory's name is never
    followed (server/store/quarantine.c): files the catalog does not know stay where they are (or
    go to a real batch directory), the copy of a lost catalog is not saved through it, and
    nothing lands outside the data dir."""

    def setUp(self):
        self.d = Daemon()
        self.addCleanup(self.d.cleanup)
        self.d.start()
        self.outside = os.path.join(os.path.dirname(self.d.data_dir), "outside")
        os.mkdir(self.outside)
        self.quarantine = os.path.join(self.d.data_dir, "quarantine")
        self.catalog = os.path.join(self.d.data_dir, "catalog.db")
        self.job_dir = os.path.join(self.d.data_dir, "checkpoints", "j")
        channel = grpc.insecure_channel(self.d.addr)
        ck = pbg.CheckpointsStub(channel)
        ck.Begin(pb.BeginRequest(job="j", name="c", world_size=1), timeout=10)
        data = b"shard data " * 1000
        ck.UploadShard(requests(data, len(data), hashlib.sha256(data).hexdigest()), timeout=30)
        self.assertEqual(ck.Commit(pb.CheckpointRef(job="j", name="c"), timeout=10).state,
                         pb.COMPLETE)
        channel.close()
        self.files = sorted(os.listdir(self.job_dir))
        self.assertEqual(self.files, ["c.metadata.json", "c_shard_0.shard"])

    def forget_catalog(self):
        """Stop, remove the catalog: the next start knows none of the files."""
        self.assertEqual(self.d.stop(), 0, self.d.log())
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(self.catalog + suffix):
                os.unlink(self.catalog + suffix)

    def test_linked_quarantine_dir(self):
        os.symlink(self.outside, self.quarantine)
        # While running: the catalog removed, its copy is not saved through the link.
        os.unlink(self.catalog)
        deadline = time.monotonic() + 15
        while "event=catalog_not_rescued" not in self.d.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertRegex(self.d.log(), r"event=catalog_not_rescued path=%s/catalog-lost-\S+ "
                         r"error=\"a symbolic link is in the path" % re.escape(self.quarantine))
        self.assertEqual(os.listdir(self.outside), [])
        # At the restart with a new empty catalog, the files stay where they are.
        self.forget_catalog()
        self.d.start()
        log = self.d.log()
        self.assertRegex(log, r"event=quarantine_failed file=%s/c[._]\S+ quarantine=%s "
                         r"error=\"a symbolic link is in the path" %
                         (re.escape(self.job_dir), re.escape(self.quarantine)))
        self.assertEqual(os.listdir(self.outside), [])
        self.assertEqual(sorted(os.listdir(self.job_dir)), self.files)
        self.assertTrue(os.path.islink(self.quarantine))
        self.assertEqual(self.d.stop(), 0, self.d.log())
        self.assertEqual(self.d.sanitizer_reports(), [], self.d.log())

    def test_linked_batch_dir(self):
        # A batch is named after the UTC second of its first move: links at the names of the
        # next 30 seconds, so that the restart's batch finds its name taken by one.
        os.mkdir(self.quarantine)
        now = time.time()
        stamps = {time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now + i)) for i in range(30)}
        for s in stamps:
            os.symlink(self.outside, os.path.join(self.quarantine, s))
        self.forget_catalog()
        self.d.start()
        self.assertEqual(self.d.stop(), 0, self.d.log())
        self.assertEqual(os.listdir(self.outside), [])
        batches = [b for b in os.listdir(self.quarantine)
                   if not os.path.islink(os.path.join(self.quarantine, b))]
        self.assertEqual(len(batches), 1, os.listdir(self.quarantine))
        self.assertRegex(batches[0], r"^\d{8}T\d{6}Z-2$")
        self.assertIn(batches[0][:-2], stamps)
        self.assertEqual(sorted(os.listdir(os.path.join(self.quarantine, batches[0],
                                                        "checkpoints", "j"))), self.files)
        self.assertEqual(os.listdir(self.job_dir), [])
        self.assertEqual(self.d.sanitizer_reports(), [], self.d.log())


class LockRemovedTest(unittest.TestCase):
    """The data dir's lock is taken on the directory itself (flock on its descriptor) as well
    as on LOCK: removing LOCK does not let a second daemon in (issue 25), and the first daemon
    goes on sweeping, since its data dir is still the one it locked."""

    def test_removing_lock_lets_no_second_daemon_in(self):
        tmp = tempfile.TemporaryDirectory(prefix="sluice-test-")
        self.addCleanup(tmp.cleanup)
        data_dir = os.path.join(tmp.name, "data")
        # Sweeps every second (half the upload timeout).
        first = Daemon(data_dir=data_dir, catalog="sqlite", args=["--upload-timeout", "2"])
        self.addCleanup(first.cleanup)
        first.start()
        os.unlink(os.path.join(data_dir, "LOCK"))
        second = Daemon(data_dir=data_dir, catalog="sqlite")
        self.addCleanup(second.cleanup)
        with self.assertRaises(RuntimeError) as e:
            second.start()
        self.assertIn("data_dir_locked", str(e.exception))
        self.assertIn("lock=dir", str(e.exception))
        second.stop()
        time.sleep(2.5)  # two sweeps of the first daemon
        self.assertNotIn("data_dir_replaced", first.log())
        self.assertEqual(first.stop(), 0, first.log())
        self.assertEqual(first.sanitizer_reports(), [], first.log())
        # Once the first is gone, a daemon starts there again (and makes LOCK anew).
        second.start()
        self.assertTrue(os.path.exists(os.path.join(data_dir, "LOCK")))
        self.assertEqual(second.stop(), 0, second.log())
        self.assertEqual(second.sanitizer_reports(), [], second.log())


class SharedDataDirTest(unittest.TestCase):
    """A data dir other users can write (o+w) is refused at start, naming the path, its mode and
    the flag that allows it; a group-writable one is accepted (Kubernetes' fsGroup)."""

    def test_world_writable_refused_unless_allowed(self):
        tmp = tempfile.TemporaryDirectory(prefix="sluice-test-")
        self.addCleanup(tmp.cleanup)
        data_dir = os.path.join(tmp.name, "data")
        os.mkdir(data_dir)
        os.chmod(data_dir, 0o777)
        d = Daemon(data_dir=data_dir)
        self.addCleanup(d.cleanup)
        with self.assertRaises(RuntimeError) as e:
            d.start()
        self.assertIn("data_dir_shared", str(e.exception))
        self.assertIn("path=" + data_dir + " mode=0777", str(e.exception))
        self.assertIn("--allow-shared-data-dir", str(e.exception))
        self.assertFalse(os.path.exists(os.path.join(data_dir, "catalog.db")))

        for how in (["--allow-shared-data-dir"], {"SLUICE_ALLOW_SHARED_DATA_DIR": "true"}):
            d = Daemon(data_dir=data_dir, args=how if isinstance(how, list) else (),
                       env=how if isinstance(how, dict) else None)
            self.addCleanup(d.cleanup)
            d.start()
            self.assertIn("data_dir_shared", d.log())
            self.assertEqual(d.stop(), 0, d.log())

        os.chmod(data_dir, 0o770)
        d = Daemon(data_dir=data_dir)
        self.addCleanup(d.cleanup)
        d.start()
        self.assertEqual(d.stop(), 0, d.log())
        self.assertEqual(d.sanitizer_reports(), [], d.log())


if __name__ == "__main__":
    unittest.main()
