"""4 trainer processes with torch.distributed (gloo, CPU) train a tiny model for 2 epochs with
sluice.torch samplers fed by a real sluiced: every epoch covers the dataset exactly once (drop_last)
or with torch's padding, epochs differ, the per-rank order equals torch's own DistributedSampler
for the same seed, and token-budget batches come in equal counts per rank within the budget."""
import collections
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import torch
from torch.utils.data import DistributedSampler as TorchSampler

from sluice.client import Client
from sltest import Daemon

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 4
N = 103


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TorchDDPTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon().start()
        cls.tmp = tempfile.TemporaryDirectory(prefix="sluice-ddp-")

    @classmethod
    def tearDownClass(cls):
        rc = cls.d.stop()
        log = cls.d.log()
        reports = cls.d.sanitizer_reports()
        cls.d.cleanup()
        cls.tmp.cleanup()
        assert rc == 0, "sluiced exit code %s\n%s" % (rc, log)
        assert not reports, log

    def run_world(self, job, mode, epochs=2, extra=()):
        port = free_port()
        procs, outs = [], []
        for r in range(WORLD):
            out = os.path.join(self.tmp.name, "%s-%d.jsonl" % (job, r))
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                       WORLD_SIZE=str(WORLD), SLUICE_ADDR=self.d.addrs, N_SAMPLES=str(N),
                       OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen(
                [sys.executable, os.path.join(HERE, "torch_ddp_worker.py"), job, out, mode,
                 str(epochs)] + list(extra), env=env))
            outs.append(out)
        for p in procs:
            self.assertEqual(p.wait(timeout=240), 0)
        recs = []
        for out in outs:
            with open(out) as f:
                recs.append([json.loads(l) for l in f])
        return recs

    def check_indices(self, job, drop_last, seed):
        recs = self.run_world(job, "indices",
                              extra=(["--drop-last"] if drop_last else []) + ["--seed", str(seed)])
        orders = []
        for e in range(2):
            per_rank = [recs[r][e] for r in range(WORLD)]
            self.assertEqual({p["epoch"] for p in per_rank}, {e})
            allidx = [i for p in per_rank for i in p["indices"]]
            counts = collections.Counter(allidx)
            if drop_last:
                self.assertEqual(len(allidx), N - N % WORLD)
                self.assertEqual(max(counts.values()), 1)
            else:
                self.assertEqual(set(allidx), set(range(N)))
                self.assertEqual(len(allidx), -(-N // WORLD) * WORLD)
            # Exactly torch's DistributedSampler for the same seed and epoch.
            for r in range(WORLD):
                ts = TorchSampler(range(N), num_replicas=WORLD, rank=r, shuffle=True, seed=seed,
                                  drop_last=drop_last)
                ts.set_epoch(e)
                self.assertEqual(per_rank[r]["indices"], list(ts))
            orders.append([p["indices"] for p in per_rank])
        self.assertNotEqual(orders[0], orders[1])
        st = Client(self.d.addr).get_epoch(job)
        self.assertEqual(st.epoch, 2)

    def test_indices_drop_last(self):
        self.check_indices("ddp-drop", True, 11)

    def test_indices_padded(self):
        self.check_indices("ddp-pad", False, 4)

    def test_token_budget_batches(self):
        import random
        rnd = random.Random(5)
        lengths = [rnd.randint(1, 100) for _ in range(N)]
        c = Client(self.d.addr)
        c.create_dataset("tok", N)
        c.upload_lengths("tok", lengths)
        c.create_job("ddp-batches", "tok", WORLD, seed=3,
                     batching=dict(strategy="dynamic", max_batch_size=8, max_seq_len=128,
                                   max_tokens=256))
        recs = self.run_world("ddp-batches", "batches")
        seen_epochs = []
        for e in range(2):
            per_rank = [recs[r][e] for r in range(WORLD)]
            self.assertEqual({p["epoch"] for p in per_rank}, {e})
            self.assertEqual(len({len(p["batches"]) for p in per_rank}), 1)
            self.assertGreater(len(per_rank[0]["batches"]), 0)
            allidx = []
            for p in per_rank:
                for b in p["batches"]:
                    self.assertLessEqual(len(b) * max(lengths[i] for i in b), 256)
                    allidx.extend(b)
            self.assertEqual(len(allidx), len(set(allidx)))
            seen_epochs.append([p["batches"] for p in per_rank])
        self.assertNotEqual(seen_epochs[0], seen_epochs[1])


class ResizeLockstepTest(unittest.TestCase):
    """Issue 25 item 9: a mid-epoch `sluice job resize` from 3 to 2 ranks with an uneven rest
    (N=81, batch 8, drop_last: each rank read 2 batches, 33 samples left). Both new ranks must
    take the same number of steps, or one waits in an all-reduce the other never joins (before:
    17/16, 3 and 2 batches, and the group hung until gloo's timeout). Bounded: gloo gives up
    after GLOO_TIMEOUT s, and the test kills the trainers after RUN_TIMEOUT s."""

    N, BATCH, SEED = 81, 8, 7
    GLOO_TIMEOUT, RUN_TIMEOUT = 20, 120

    def setUp(self):
        self.d = Daemon().start()
        self.tmp = tempfile.TemporaryDirectory(prefix="sluice-ddp-resize-")

    def tearDown(self):
        rc = self.d.stop()
        log = self.d.log()
        reports = self.d.sanitizer_reports()
        self.d.cleanup()
        self.tmp.cleanup()
        self.assertEqual(rc, 0, log)
        self.assertEqual(reports, [], log)

    def run_group(self, job, world, tag, epochs, extra=()):
        port = free_port()
        procs, outs = [], []
        for r in range(world):
            out = os.path.join(self.tmp.name, "%s-%s-%d.jsonl" % (job, tag, r))
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                       WORLD_SIZE=str(world), SLUICE_ADDR=self.d.addrs, N_SAMPLES=str(self.N),
                       OMP_NUM_THREADS="1")
            with open(out + ".log", "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, os.path.join(HERE, "torch_ddp_worker.py"), job, out,
                     "indices", str(epochs), "--drop-last", "--seed", str(self.SEED),
                     "--batch-size", str(self.BATCH), "--timeout", str(self.GLOO_TIMEOUT)] +
                    list(extra), env=env, stdout=log, stderr=subprocess.STDOUT))
            outs.append(out)
        # Bounded: past RUN_TIMEOUT, or 10 s after a rank failed (gloo's timeout), the ranks
        # still running are killed and the test fails with what they wrote.
        deadline = time.monotonic() + self.RUN_TIMEOUT
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                deadline = min(deadline, time.monotonic() + 10)
            time.sleep(0.2)
        failed = []
        for r, p in enumerate(procs):
            hung = p.poll() is None
            if hung:
                p.kill()
            p.wait()
            with open(outs[r] + ".log", errors="replace") as f:
                text = f.read()
            if hung or p.returncode != 0:
                failed.append("rank %d %s:\n%s" % (
                    r, "hung, killed" if hung else "exit %s" % p.returncode, text[-3000:]))
        recs = []
        for out in outs:
            try:
                with open(out) as f:
                    recs.append([json.loads(l) for l in f])
            except FileNotFoundError:
                recs.append([])
        self.assertFalse(failed, "%s world %d: %s\nrecords: %s\n%s" % (
            tag, world, "\n".join(failed), recs, self.d.log()[-3000:]))
        return recs

    def test_resize_uneven_rest_equal_steps(self):
        job = "ddp-resize"
        first = self.run_group(job, 3, "w3", 1, ["--stop-after", "2"])
        read = [i for r in range(3) for i in first[r][0]["indices"]]
        self.assertEqual([len(first[r][0]["indices"]) for r in range(3)], [16, 16, 16])
        p = subprocess.run([os.environ.get("SLUICE_CLI", "sluice"), "--addr", self.d.addr, "job",
                            "resize", job, "--world-size", "2"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        st = Client(self.d.addr).get_epoch(job)
        cli = [os.environ.get("SLUICE_CLI", "sluice"), "sample", "--samples", str(self.N),
               "--replicas", "3", "--shuffle", "torch", "--seed", str(self.SEED), "--drop-last",
               "--consumed", "16,16,16", "--new-replicas", "2", "--left-out"]
        p = subprocess.run(cli, capture_output=True, text=True)
        # The 2 new ranks train the rest of epoch 0 and epoch 1 (where the 17/16 split hung).
        second = self.run_group(job, 2, "w2", 2)
        # 33 left, cut to 2 x 16: the rest's last index is left out, and so stated (Epochs.Get,
        # sluice sample --left-out): the last position of the rest, old rank 2's last index
        # (torch's own sampler's).
        self.assertEqual([r.count for r in st.ranks], [16, 16])
        self.assertEqual((st.left_out, st.padded), (1, 0))
        self.assertEqual(p.returncode, 0, p.stderr)
        left_out = [int(x) for x in p.stdout.split()]
        ts = TorchSampler(range(self.N), num_replicas=3, rank=2, shuffle=True, seed=self.SEED,
                          drop_last=True)
        ts.set_epoch(0)
        self.assertEqual(left_out, [list(ts)[-1]])
        e0 = [second[r][0] for r in range(2)]
        self.assertEqual({e["epoch"] for e in e0}, {0})
        self.assertEqual([len(e["batches"]) for e in e0], [2, 2], "equal steps after the resize")
        rest = [i for e in e0 for i in e["indices"]]
        trained = collections.Counter(read + rest)
        self.assertEqual(max(trained.values()), 1, "a sample trained twice in epoch 0")
        self.assertEqual(sorted(list(trained) + left_out), list(range(self.N)),
                         "epoch 0: every sample trained once but the one stated left out")
        # Epoch 1 is a whole epoch of the new world: torch's own sampler's shares.
        for r in range(2):
            ts = TorchSampler(range(self.N), num_replicas=2, rank=r, shuffle=True,
                              seed=self.SEED, drop_last=True)
            ts.set_epoch(1)
            self.assertEqual(second[r][1]["epoch"], 1)
            self.assertEqual(second[r][1]["indices"], list(ts))
        self.assertEqual(Client(self.d.addr).get_epoch(job).epoch, 2)


class SamplerRestartTest(unittest.TestCase):
    def test_daemon_restart_mid_epoch_sampler_continues(self):
        import sluice.torch as st
        d = Daemon(stable_port=True).start()
        try:
            port = d.port
            # A small flow-control window keeps most of the epoch on the daemon's side.
            import grpc
            from sluice.v1 import feed_pb2_grpc
            client = Client(d.addr)
            client.channel.close()
            client.channel = grpc.insecure_channel(d.addr, options=[
                ("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)])
            client.feed = feed_pb2_grpc.FeedStub(client.channel)
            client.jobs = feed_pb2_grpc.JobsStub(client.channel)
            client.epochs = feed_pb2_grpc.EpochsStub(client.channel)
            client.datasets = feed_pb2_grpc.DatasetsStub(client.channel)
            sampler = st.DistributedSampler(range(5000), num_replicas=1, rank=0, shuffle=True,
                                            seed=1, job="rs", max_chunk=100, retry_seconds=30,
                                            client=client)
            it = iter(sampler)
            first = [next(it) for _ in range(1234)]
            sampler.report()
            # Same port after the restart, as a supervisor would do.
            d.pin_ports()
            self.assertEqual(d.stop(), 0, d.log())
            d.start()
            rest = list(it)
            self.assertGreaterEqual(sampler.reconnects, 1)
            client.close()
            self.assertEqual(sorted(first + rest), list(range(5000)))
            ts = TorchSampler(range(5000), num_replicas=1, rank=0, shuffle=True, seed=1)
            self.assertEqual(first + rest, list(ts))
            self.assertEqual(Client(d.addr).get_epoch("rs").epoch, 1)
        finally:
            rc = d.stop()
            log = d.log()
            reports = d.sanitizer_reports()
            d.cleanup()
        self.assertEqual(rc, 0, log)
        self.assertEqual(reports, [], log)


if __name__ == "__main__":
    unittest.main()
