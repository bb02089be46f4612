"""Stratified shares under torchrun (issue 17): 3 DDP ranks (gloo, CPU) train on an imbalanced
dataset (classes 100:10:3:1) with sluice.torch.DistributedSampler(stratify=True, labels=...);
every rank's share of every epoch holds each class in floor or ceil of n_c / 3 samples, the shares
are disjoint, and the run ends within RUN_TIMEOUT seconds."""
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import unittest

from sltest import Daemon

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_strat_worker import labels_of  # noqa: E402

WORLD, SAMPLES, EPOCHS = 3, 600, 2
RUN_TIMEOUT = 240 * float(os.environ.get("SLUICE_SLOWDOWN", "1"))


class TorchStratTest(unittest.TestCase):
    def setUp(self):
        self.d = Daemon().start()
        self._tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        rc = self.d.stop()
        log = self.d.log()
        reports = self.d.sanitizer_reports()
        self.d.cleanup()
        self._tmp.cleanup()
        self.assertEqual(rc, 0, log)
        self.assertEqual(reports, [], log)

    def test_stratified_ddp(self):
        out = self._tmp.name
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(WORLD), "--redirects", "2", "--tee", "2",
               os.path.join(HERE, "torch_strat_worker.py"), "--addr", self.d.addrs,
               "--job", "strat", "--out", out, "--epochs", str(EPOCHS),
               "--samples", str(SAMPLES)]
        log = os.path.join(out, "run.log")
        with open(log, "wb") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                 env=dict(os.environ, OMP_NUM_THREADS="1"))
        try:
            rc = p.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = "timeout"
        with open(log, errors="replace") as f:
            text = f.read()
        self.assertEqual(rc, 0, text[-6000:])
        labels = labels_of(SAMPLES)
        counts = collections.Counter(labels)
        ranks = []
        for r in range(WORLD):
            with open(os.path.join(out, "rank-%d.json" % r)) as f:
                ranks.append(json.load(f)["epochs"])
        for e in range(EPOCHS):
            shares = [ranks[r][e] for r in range(WORLD)]
            flat = [i for s in shares for i in s]
            self.assertEqual(len(flat), len(set(flat)), "epoch %d: shares overlap" % e)
            self.assertGreaterEqual(len(flat), SAMPLES - WORLD * len(counts))
            for s in shares:
                got = collections.Counter(labels[i] for i in s)
                for c, nc in counts.items():
                    self.assertIn(got[c], (nc // WORLD, -(-nc // WORLD)), (e, c, nc, got[c]))
        self.assertNotEqual(ranks[0][0], ranks[0][1])


if __name__ == "__main__":
    unittest.main()
