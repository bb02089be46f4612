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
