"""Clients with several replicas' addresses (issue 15): replicas of one PostgreSQL catalog on one
data dir, one of them dead from the start or SIGKILLed while a client talks to it, and the
Python package, the `sluice` CLI and libsluice going on on another replica.

Until replicas tell each other about new jobs, a replica knows the jobs that existed when it
started: each test creates its datasets and jobs through the first replica and starts the others
after that.
"""
import hashlib
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import grpc

from pgfixture import PgServer, PgTestCase
from sltest import SLUICE_CLI, Daemon
from sluice._channel import ReplicasUnavailable, split_addresses
from sluice.checkpoint import COMPLETE, Checkpoints
from sluice.client import Client

FAILOVER_CLIENT = os.environ.get("SL_FAILOVER_CLIENT", "failover_client")


def dead_addr():
    """An address nobody listens on (a port the kernel just handed out and took back)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return "127.0.0.1:%d" % port


class ReplicasCase(PgTestCase):
    """A PostgreSQL server for the class; per test a data dir and replicas on it."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="sluice-failover-")
        self.data_dir = os.path.join(self._tmp.name, "data")
        self.replicas = []

    def tearDown(self):
        for d in self.replicas:
            d.stop(timeout=10)
        self._tmp.cleanup()

    def replica(self):
        d = Daemon(data_dir=self.data_dir, catalog="postgresql", pg=self.pg, store="dir")
        self.replicas.append(d.start())
        return d

    @staticmethod
    def kill(d):
        """SIGKILL replica d and wait until it is gone."""
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)

    def make_job(self, d, name, samples, world=1, shuffle="feistel"):
        with Client(d.addr) as c:
            c.create_dataset(name + "-data", samples)
            c.create_job(name, name + "-data", world, shuffle=shuffle, seed=7)

    def make_batch_job(self, d, name, samples):
        """A job of token-budget batches over `samples` sequences of 1..64 tokens."""
        with Client(d.addr) as c:
            c.create_dataset(name + "-data", samples)
            c.upload_lengths(name + "-data", [1 + (i * 7919) % 64 for i in range(samples)])
            c.create_job(name, name + "-data", 1, shuffle="feistel", seed=7,
                         batching={"strategy": "dynamic", "max_batch_size": 4096,
                                   "max_seq_len": 64, "max_tokens": 1 << 16})

    @staticmethod
    def batches(d, job, rank, epoch=0):
        """Rank's batches of `epoch` (lists of indices), streamed from replica d."""
        with Client(d.addr) as c:
            return [list(b.indices) for ch in c.stream_batches(job, rank, epoch=epoch, step=0)
                    for b in ch.batches]

    @staticmethod
    def share(d, job, rank, epoch=0):
        """Rank's whole share of `epoch`, streamed from replica d."""
        with Client(d.addr) as c:
            return [i for ch in c.stream_indices(job, rank, epoch=epoch, position=0,
                                                 max_chunk=1 << 16) for i in ch.indices]


class AddressListTest(unittest.TestCase):
    """The address list's checks (no daemon needed)."""

    def test_split(self):
        self.assertEqual(split_addresses("a:1, b:2 ,[::1]:3"), ["a:1", "b:2", "[::1]:3"])
        self.assertEqual(split_addresses("ipv4:1.2.3.4:1,5.6.7.8:2"),
                         ["ipv4:1.2.3.4:1,5.6.7.8:2"])
        self.assertEqual(split_addresses("localhost:7700"), ["localhost:7700"])

    def test_bad_lists(self):
        for bad, what in (("a:1,,b:2", "element 2 of 3 is empty"), ("a:1,", "element 2 of 2"),
                          ("a:1,b:70000", "port '70000'"), ("a:0", "port '0'"),
                          ("a:x,b:1", "port 'x'")):
            with self.assertRaises(ValueError) as cm:
                Client(bad)
            self.assertIn(what, str(cm.exception))


class SpreadByRankTest(unittest.TestCase):
    """Clients start on replica RANK mod n (issue 25): two single daemons stand in for two
    replicas, told apart by the world size of a job of the same name."""

    def setUp(self):
        self.ds = [Daemon(catalog="sqlite", replicas=1).start() for _ in range(2)]
        for w, d in enumerate(self.ds):
            with Client(d.addr) as c:
                c.create_dataset("d", 10)
                c.create_job("j", "d", 2 + w)
        self.addrs = ",".join(d.addr for d in self.ds)

    def tearDown(self):
        for d in self.ds:
            d.stop(timeout=10)

    def worlds(self, env):
        saved = {k: os.environ.pop(k, None) for k in ("RANK", "SLUICE_RANK")}
        os.environ.update(env)
        try:
            with Client(self.addrs) as c:
                py = c.get_job("j").world_size
        finally:
            for k in ("RANK", "SLUICE_RANK"):
                os.environ.pop(k, None)
                if saved[k] is not None:
                    os.environ[k] = saved[k]
        r = subprocess.run([FAILOVER_CLIENT, "job", self.addrs, "j"], capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, **env))
        self.assertEqual(r.returncode, 0, r.stderr)
        return py, int(r.stdout.split()[1])

    def test_rank_picks_the_first_replica(self):
        self.assertEqual(self.worlds({}), (2, 2))
        self.assertEqual(self.worlds({"RANK": "0"}), (2, 2))
        self.assertEqual(self.worlds({"RANK": "1"}), (3, 3))
        self.assertEqual(self.worlds({"RANK": "4"}), (2, 2))
        self.assertEqual(self.worlds({"RANK": "0", "SLUICE_RANK": "3"}), (3, 3))
        self.assertEqual(self.worlds({"RANK": "x"}), (2, 2))


class PythonFailoverTest(ReplicasCase):

    def test_unary_first_address_dead(self):
        a = self.replica()
        self.make_job(a, "u", 100)
        dead = dead_addr()
        with Client("%s,%s" % (dead, a.addr), timeout=5) as c:
            self.assertEqual(c.get_job("u").world_size, 1)
            self.assertEqual(c.channel.current(), 1)       # stays on the live replica
            self.assertEqual(c.get_epoch("u").epoch, 0)
            self.assertEqual(c.channel.failovers, 1)

    def test_replica_without_catalog(self):
        """A replica that is up but cannot reach its catalog answers UNAVAILABLE ("catalog
        server unreachable"), which gRPC's balancers would not see: the client goes on to the
        next replica and stays there."""
        pg2 = PgServer().start()
        try:
            lost = Daemon(data_dir=os.path.join(self._tmp.name, "other"), catalog="postgresql",
                          pg=pg2, store="dir").start()
            self.replicas.append(lost)
            pg2.stop(mode="immediate")
            with Client(lost.addr, timeout=5) as c:
                with self.assertRaises(grpc.RpcError) as cm:
                    c.create_dataset("cd", 10)
            self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertIn("catalog", cm.exception.details())
            b = self.replica()
            with Client("%s,%s" % (lost.addr, b.addr), timeout=5) as c:
                c.create_dataset("cd", 10)
                self.assertEqual(c.channel.current(), 1)
                self.assertEqual(c.get_dataset("cd").samples, 10)
        finally:
            pg2.destroy()

    def test_all_dead(self):
        addrs = [dead_addr(), dead_addr(), dead_addr()]
        t0 = time.monotonic()
        with Client(",".join(addrs), timeout=5) as c:
            with self.assertRaises(ReplicasUnavailable) as cm:
                c.get_job("x")
        self.assertLess(time.monotonic() - t0, 10)
        e = cm.exception
        self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE)
        for a in addrs:
            self.assertIn(a, e.details())

    def test_sampler_fails_over_mid_epoch(self):
        """A DistributedSampler streams through A, A is SIGKILLed mid-epoch: the sampler goes on
        through B at the position reached, and rank 0's share of the epoch comes out whole."""
        import sluice.torch
        n = 8_000_000  # a share (32 MB) far larger than what HTTP/2 windows and sockets hold
        a = self.replica()
        self.make_job(a, "s", n, world=2)
        b = self.replica()
        sampler = sluice.torch.DistributedSampler(
            num_replicas=2, rank=0, address="%s,%s" % (a.addr, b.addr), job="s",
            num_samples=n, seed=7, shuffle_mode="feistel", max_chunk=4096, retry_seconds=20)
        got = []
        for i in sampler:
            got.append(i)
            if len(got) == 1:   # early: later, the client may hold the whole share already
                self.kill(a)
        self.assertGreaterEqual(sampler.reconnects, 1)
        self.assertEqual(sampler.client.channel.current(), 1)
        want = self.share(b, "s", 0)
        self.assertEqual(len(got), len(want))
        self.assertEqual(got, want)         # no gap, no duplicate, in order

    def test_dataloader_batches_fail_over_mid_epoch(self):
        """sluice.torch.DataLoader over a BatchSampler, A SIGKILLed mid-epoch: the batches go on
        through B from the step reached, the epoch's batches come out once each, and the
        end-of-epoch report reaches B (the next epoch begins there)."""
        import sluice.torch
        a = self.replica()
        self.make_batch_job(a, "b", 2_000_000)   # far more than buffers hold when A dies
        b = self.replica()
        want = self.batches(b, "b", 0)      # before the epoch ends: then it is not served
        bs = sluice.torch.BatchSampler(num_replicas=1, rank=0, address="%s,%s" % (a.addr, b.addr),
                                       job="b", retry_seconds=20)
        loader = sluice.torch.DataLoader(range(2_000_000), batch_sampler=bs,
                                         collate_fn=lambda items: list(items))
        got = []
        for batch in loader:
            got.append(batch)
            if len(got) == 1:       # early: later, the client may hold the rest already
                self.kill(a)
        self.assertGreaterEqual(bs.reconnects, 1)
        self.assertEqual(len(got), len(want))
        self.assertEqual(got, want)
        with Client(b.addr) as c:
            self.assertEqual(c.get_epoch("b").epoch, 1)

    def test_checkpoint_manager_upload_fails_over(self):
        """CheckpointManager uploads through A, A is SIGKILLed after 8 MiB: the upload resumes
        on B and the checkpoint is COMPLETE with the right bytes."""
        import torch
        from sluice.torch import CheckpointManager
        a = self.replica()
        b = self.replica()
        mgr = CheckpointManager(job="ck", address="%s,%s" % (a.addr, b.addr), rank=0,
                                world_size=1, retry_seconds=20, chunk_size=256 << 10)
        orig, killed = mgr.ck.upload, []

        def upload(job, name, rank, source, **kw):
            if killed:
                return orig(job, name, rank, source, **kw)

            class Reader:
                read_bytes = 0

                def read(self, k):
                    data = source.read(k)
                    self.read_bytes += len(data)
                    if self.read_bytes >= (8 << 20) and not killed:
                        killed.append(True)
                        self.kill_a()
                    return data

                @staticmethod
                def kill_a():
                    self.kill(a)
            return orig(job, name, rank, Reader(), **kw)
        mgr.ck.upload = upload
        g = torch.Generator().manual_seed(3)
        state = {"w": torch.randint(0, 255, (32 << 20,), dtype=torch.uint8, generator=g),
                 "step": 1}
        mgr.save(1, state)
        mgr.wait()
        self.assertTrue(killed)
        self.assertGreaterEqual(mgr.retries, 1)
        mgr.close()
        with Checkpoints(b.addr) as ck:
            # B commits it (auto-commit) after it answered the upload: wait for that.
            deadline = time.monotonic() + 20
            while ck.get("ck", "step_1").state != COMPLETE and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertEqual(ck.get("ck", "step_1").state, COMPLETE)
            self.assertTrue(ck.verify("ck", "step_1", deep=True).ok)
            # The manager's checkpoint is DCP's: read it back through the Reader.
            import warnings
            import torch.distributed.checkpoint as dcp
            import sluice.torch.dcp as sdcp
            back = {"w": torch.zeros_like(state["w"]), "step": 0}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")      # "assuming ... a single process"
                dcp.load(back, storage_reader=sdcp.Reader("sluice://ck/1", checkpoints=ck))
        self.assertTrue(torch.equal(back["w"], state["w"]))
        self.assertEqual(back["step"], 1)

    def test_download_fails_over(self):
        """A download through A whose replica dies mid-stream goes on at the offset reached on
        B: the bytes and their SHA-256 are the shard's."""
        a = self.replica()
        data = os.urandom(24 << 20)
        with Checkpoints(a.addr) as ck:
            ck.begin("dl", "c1", world_size=1)
            ck.upload("dl", "c1", 0, data)
            ck.commit("dl", "c1")
        b = self.replica()
        with Checkpoints("%s,%s" % (a.addr, b.addr)) as ck:
            out = bytearray()
            for m in ck._download_messages("dl", "c1", 0):
                out += m.data
                if len(out) >= (4 << 20) and a.proc.poll() is None:
                    self.kill(a)
            self.assertEqual(ck.channel.current(), 1)
        self.assertEqual(hashlib.sha256(out).hexdigest(), hashlib.sha256(data).hexdigest())


class CliFailoverTest(ReplicasCase):

    def cli(self, *args, timeout=30):
        return subprocess.run([SLUICE_CLI] + [str(a) for a in args], capture_output=True,
                              text=True, timeout=timeout)

    def test_job_show_first_dead(self):
        a = self.replica()
        self.make_job(a, "j", 100)
        for first in ("deadhost.invalid:7700", dead_addr()):
            r = self.cli("--addr", "%s,%s" % (first, a.addr), "--json", "job", "show", "j")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn('"world_size":1', r.stdout.replace(" ", ""))
        r = subprocess.run([SLUICE_CLI, "job", "show", "j"], capture_output=True, text=True,
                           timeout=30, env=dict(os.environ, SLUICE_ADDR="%s,%s"
                                                % (dead_addr(), a.addr)))
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_batches_fail_over_mid_stream(self):
        a = self.replica()
        self.make_batch_job(a, "bb", 2_000_000)
        b = self.replica()
        p = subprocess.Popen([SLUICE_CLI, "--addr", "%s,%s" % (a.addr, b.addr), "batches",
                              "--job", "bb", "--rank", "0", "--epoch", "0", "--from", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        got = [p.stdout.readline()]
        self.kill(a)
        timer = threading.Timer(120, p.kill)
        timer.start()
        try:
            got += p.stdout.readlines()
            err = p.stderr.read()
            p.wait()
        finally:
            timer.cancel()
        self.assertEqual(p.returncode, 0, err)
        want = self.batches(b, "bb", 0)
        self.assertEqual([[int(x) for x in line.split()] for line in got], want)

    def test_bad_addresses(self):
        for bad, what in (("a:1,,b:2", "element 2 of 3 is empty"),
                          ("127.0.0.1:1,127.0.0.1:65536", "port '65536' is not in [1, 65535]")):
            r = self.cli("--addr", bad, "health")
            self.assertEqual(r.returncode, 1)
            self.assertIn(what, r.stderr)
        addrs = [dead_addr(), dead_addr()]
        t0 = time.monotonic()
        r = self.cli("--addr", ",".join(addrs), "--timeout", 5, "job", "show", "j")
        self.assertLess(time.monotonic() - t0, 12)
        self.assertEqual(r.returncode, 1)
        self.assertIn("UNAVAILABLE", r.stderr)
        self.assertIn("tried %s, %s" % tuple(addrs), r.stderr)

    def test_indices_fail_over_mid_stream(self):
        n = 4_000_000
        a = self.replica()
        self.make_job(a, "i", n)
        b = self.replica()
        p = subprocess.Popen([SLUICE_CLI, "--addr", "%s,%s,%s" % (dead_addr(), a.addr, b.addr),
                              "indices",
                              "--job", "i", "--rank", "0", "--epoch", "0", "--from", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        got = [int(p.stdout.readline()) for _ in range(1000)]
        self.kill(a)
        timer = threading.Timer(120, p.kill)
        timer.start()
        try:
            # Not communicate(): it would skip what p.stdout has buffered already.
            rest = p.stdout.read()
            err = p.stderr.read()
            p.wait()
        finally:
            timer.cancel()
        self.assertEqual(p.returncode, 0, err)
        got += [int(x) for x in rest.split()]
        want = self.share(b, "i", 0)
        self.assertEqual(len(got), n)
        self.assertEqual(got, want)


class LibsluiceFailoverTest(ReplicasCase):

    def run_client(self, *args, timeout=60, **kw):
        return subprocess.run([FAILOVER_CLIENT] + [str(a) for a in args], capture_output=True,
                              text=True, timeout=timeout, **kw)

    def test_job_first_dead(self):
        a = self.replica()
        self.make_job(a, "c", 100, world=3)
        r = self.run_client("job", "%s,%s" % (dead_addr(), a.addr), "c")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "world 3\n")

    def test_bad_lists(self):
        for bad, what in (("a:1,,b:2", "element 2 of 3 is empty"),
                          ("a:1,b:0", "port '0' is not in [1, 65535]")):
            r = self.run_client("job", bad, "c")
            self.assertEqual(r.returncode, 1)
            self.assertIn("SL_EINVAL", r.stderr)
            self.assertIn(what, r.stderr)
        addrs = [dead_addr(), dead_addr(), dead_addr()]
        t0 = time.monotonic()
        r = self.run_client("job", ",".join(addrs), "c")
        self.assertLess(time.monotonic() - t0, 10)
        self.assertEqual(r.returncode, 1)
        self.assertIn("SL_EUNAVAILABLE", r.stderr)
        self.assertIn("tried " + ", ".join(addrs), r.stderr)

    def test_indices_fail_over(self):
        n = 200_000
        a = self.replica()
        self.make_job(a, "ci", n)
        b = self.replica()
        # The first address is dead: the stream opens on A, and goes on on B when A dies.
        addrs = "%s,%s,%s" % (dead_addr(), a.addr, b.addr)
        p = subprocess.Popen([FAILOVER_CLIENT, "indices", addrs, "ci", "0"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        got = []
        for line in p.stdout:
            if line == "paused\n":
                break
            got.append(int(line))
        # The client holds its first chunk; A dies before it reads on.
        self.kill(a)
        timer = threading.Timer(60, p.kill)
        timer.start()
        try:
            rest, err = p.communicate("go\n")
        finally:
            timer.cancel()
        self.assertEqual(p.returncode, 0, err)
        got += [int(x) for x in rest.split()]
        self.assertEqual(got, self.share(b, "ci", 0))

    def test_upload_and_download_fail_over(self):
        """An upload through a list whose first replica is dead; a download whose replica is
        killed midway (into a FIFO, so that the client stops while A holds the rest) goes on at
        its offset on B."""
        a = self.replica()
        src = os.path.join(self._tmp.name, "shard.bin")
        data = os.urandom(16 << 20)
        with open(src, "wb") as f:
            f.write(data)
        with Checkpoints(a.addr) as ck:
            ck.begin("cu", "c1", world_size=1)
        r = self.run_client("upload", "%s,%s" % (dead_addr(), a.addr), "cu", "c1", src)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["sha256", hashlib.sha256(data).hexdigest()])
        with Checkpoints(a.addr) as ck:
            ck.commit("cu", "c1")
            self.assertTrue(ck.verify("cu", "c1", deep=True).ok)
        b = self.replica()
        fifo = os.path.join(self._tmp.name, "back.fifo")
        os.mkfifo(fifo)
        p = subprocess.Popen([FAILOVER_CLIENT, "download", "%s,%s" % (a.addr, b.addr), "cu",
                              "c1", fifo], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        timer = threading.Timer(60, p.kill)
        timer.start()
        try:
            with open(fifo, "rb") as f:
                back = f.read(2 << 20)
                self.kill(a)
                back += f.read()
            out, err = p.communicate()
        finally:
            timer.cancel()
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual(out.split(), ["sha256", hashlib.sha256(data).hexdigest()])
        self.assertEqual(back, data)


    def test_upload_killed_midway_resumes(self):
        """An upload whose replica is SIGKILLed after 4 MiB resumes on the next one (what the
        store holds, then the rest): the checkpoint commits and verifies, the bytes are the
        file's."""
        a = self.replica()
        with Checkpoints(a.addr) as ck:
            ck.begin("cm", "c1", world_size=1)
        b = self.replica()
        src = os.path.join(self._tmp.name, "shard.bin")
        data = os.urandom(48 << 20)
        with open(src, "wb") as f:
            f.write(data)
        p = subprocess.Popen([FAILOVER_CLIENT, "upload-pause", "%s,%s" % (a.addr, b.addr), "cm",
                              "c1", src], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        timer = threading.Timer(60, p.kill)
        timer.start()
        try:
            self.assertEqual(p.stdout.readline(), "paused\n")
            self.kill(a)
            out, err = p.communicate("go\n")
        finally:
            timer.cancel()
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual(out.split(), ["sha256", hashlib.sha256(data).hexdigest()])
        with Checkpoints(b.addr) as ck:
            ck.commit("cm", "c1")
            self.assertTrue(ck.verify("cm", "c1", deep=True).ok)
            self.assertEqual(ck.download("cm", "c1", 0), data)


if __name__ == "__main__":
    unittest.main()
