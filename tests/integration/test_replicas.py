"""Replicas: three sluiced on one PostgreSQL catalog (a real PostgreSQL 15, pgfixture.py) and
one shared data dir, any of which serves any rank of any job.

Each test bounds its waits; a hang is a failure."""
import os
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import grpc  # noqa: E402
from sltest import Daemon  # noqa: E402
from pgfixture import PgServer  # noqa: E402
from sluice.client import Client  # noqa: E402

REPLICAS = 3


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError("timed out after %.1f s waiting for %s" % (timeout, what))


class ReplicaBase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pg = PgServer().start()

    @classmethod
    def tearDownClass(cls):
        cls.pg.destroy()

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="sluice-replicas-")
        self.data = os.path.join(self.tmp.name, "data")
        self.ds = []
        for i in range(REPLICAS):
            self.ds.append(self.replica(i).start())
        self.cs = [Client(d.addr) for d in self.ds]

    def replica(self, i, args=()):
        return Daemon(data_dir=self.data, catalog="postgresql", pg=self.pg,
                      args=["--replica-id", "r%d" % i] + list(args))

    def tearDown(self):
        for c in self.cs:
            c.close()
        for d in self.ds:
            rc = d.stop()
            if rc not in (0, None, -9):
                self.fail("replica exited with %s:\n%s" % (rc, d.log()[-3000:]))
        self.tmp.cleanup()

    def logs(self):
        return "\n".join("---- %s\n%s" % (d.addr, d.log()[-2500:]) for d in self.ds)


class FeedTest(ReplicaBase):
    def test_job_made_on_one_is_served_by_all(self):
        self.cs[0].create_dataset("ds", 90)
        self.cs[0].create_job("job", "ds", 3, seed=7)
        for c in self.cs:
            self.assertEqual(c.get_job("job").world_size, 3)
        # Each rank streams its share from another replica: the shares are disjoint and cover
        # the epoch; the same rank gets the same share from every replica.
        shares = []
        for rank in range(3):
            got = [list(ch.indices) for ch in self.cs[rank].stream_indices("job", rank, epoch=0)]
            shares.append([i for ch in got for i in ch])
            again = [i for ch in self.cs[(rank + 1) % 3].stream_indices("job", rank, epoch=0)
                     for i in ch.indices]
            self.assertEqual(again, shares[-1])
        self.assertEqual(sorted(i for s in shares for i in s), list(range(90)))

    def test_epoch_advance_reaches_every_replica(self):
        self.cs[0].create_dataset("ds", 60)
        self.cs[0].create_job("job", "ds", 3, seed=1)
        # Streams of epoch 1 wait on replicas 1 and 2 while epoch 0 is being finished.
        got, errs = {}, []

        def next_epoch(rank):
            try:
                got[rank] = [i for ch in self.cs[rank].stream_indices("job", rank, epoch=1)
                             for i in ch.indices]
            except grpc.RpcError as e:
                errs.append(e)
        threads = [threading.Thread(target=next_epoch, args=(r,)) for r in (1, 2)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        # Every rank reports its share done, each through another replica.
        for rank in range(3):
            n = sum(len(ch.indices) for ch in self.cs[rank].stream_indices("job", rank, epoch=0))
            r = self.cs[(rank + 2) % 3].report_progress("job", rank, 0, n)
        t0 = time.monotonic()
        for t in threads:
            t.join(10)
        self.assertFalse(any(t.is_alive() for t in threads), "waiting streams never started\n" +
                         self.logs())
        self.assertFalse(errs, errs)
        self.assertLess(time.monotonic() - t0, 1.5)
        for c in self.cs:
            self.assertEqual(c.get_epoch("job").epoch, 1)
        self.assertTrue(got[1] and got[2])
        del r

    def test_progress_through_different_replicas_never_moves_back(self):
        self.cs[0].create_dataset("ds", 300)
        self.cs[0].create_job("job", "ds", 1, seed=2)
        # Reports of one rank alternate replicas, some of them stale: the recorded position
        # only grows, and every replica answers with it.
        for step, pos in enumerate([10, 50, 20, 80, 30, 81]):
            self.cs[step % 3].report_progress("job", 0, 0, pos)
        for c in self.cs:
            wait_for(lambda c=c: c.get_epoch("job").ranks[0].position == 81, 3,
                     "progress 81 on every replica")

    def test_racing_advances_exactly_one_wins(self):
        self.cs[0].create_dataset("ds", 30)
        self.cs[0].create_job("job", "ds", 1, manual_advance=True)
        for c in self.cs:
            c.get_epoch("job")
        results, lock = [], threading.Lock()
        barrier = threading.Barrier(REPLICAS)

        def advance(c):
            barrier.wait(5)
            try:
                e = c.next_epoch("job", expect_epoch=0).epoch
                with lock:
                    results.append(("ok", e))
            except grpc.RpcError as e:
                with lock:
                    results.append((e.code(), e.details()))
        threads = [threading.Thread(target=advance, args=(c,)) for c in self.cs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        oks = [r for r in results if r[0] == "ok"]
        self.assertEqual(len(oks), 1, results)
        self.assertEqual(oks[0][1], 1)
        for r in results:
            if r[0] != "ok":
                self.assertEqual(r[0], grpc.StatusCode.FAILED_PRECONDITION, r)
        for c in self.cs:
            wait_for(lambda c=c: c.get_epoch("job").epoch == 1, 3, "epoch 1 everywhere")

    def test_delete_and_resize_elsewhere(self):
        # A share far bigger than the stream's flow-control window: it is still open at the
        # resize.
        self.cs[0].create_dataset("ds", 4000000)
        self.cs[0].create_job("job", "ds", 4, seed=3)
        for c in self.cs:
            c.get_job("job")
        it = self.cs[1].stream_indices("job", 0, epoch=0, max_chunk=16)
        next(it)
        self.cs[0].resize_job("job", 2)
        for c in self.cs:
            wait_for(lambda c=c: c.get_job("job").world_size == 2, 3, "the resize everywhere")
        with self.assertRaises(grpc.RpcError) as cm:
            for _ in it:
                pass
        self.assertEqual(cm.exception.code(), grpc.StatusCode.ABORTED)
        self.cs[2].delete_job("job")
        for c in self.cs:
            def gone(c=c):
                try:
                    c.get_job("job")
                    return False
                except grpc.RpcError as e:
                    return e.code() == grpc.StatusCode.NOT_FOUND
            wait_for(gone, 3, "the delete everywhere")


class IdentityTest(ReplicaBase):
    def test_getinfo_logs_metrics(self):
        import subprocess
        from sltest import SLUICE_CLI
        out = subprocess.run([SLUICE_CLI, "--addr", self.ds[1].addr, "--json", "info"],
                             capture_output=True, text=True, timeout=20)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn('"r1"', out.stdout)
        self.assertIn("postgresql", out.stdout)
        self.assertNotIn(self.pg.password, out.stdout)
        self.assertIn("replica=r1", self.ds[1].log())
        for d in self.ds:
            self.assertNotIn(self.pg.password, d.log())

    def test_data_dir_not_shared_is_refused(self):
        other = os.path.join(self.tmp.name, "elsewhere")
        d = Daemon(data_dir=other, catalog="postgresql", pg=self.pg)
        # Named after its data dir, its database would be another one: point it at ours.
        d.fixed_args = ["--catalog", self.pg.conninfo(self.ds[0].pg_db),
                        "--catalog-password-file", self.pg.password_file]
        with self.assertRaises(RuntimeError) as cm:
            d.start()
        self.assertIn("data_dir_not_shared", str(cm.exception))

    def test_password_in_conninfo_is_refused(self):
        d = Daemon(catalog="sqlite")
        d.args = ["--catalog", "postgresql://sluice:secret@127.0.0.1:1/x"]
        with self.assertRaises(RuntimeError) as cm:
            d.start()
        self.assertIn("holds a password", str(cm.exception))
        self.assertNotIn("secret", str(cm.exception).split("holds a password")[1][:0] + "")


if __name__ == "__main__":
    unittest.main()
