"""The data position as a torch Stateful: sampler.state_dict() / load_state_dict() (and
sluice.torch.DataLoader's), against a real sluiced, in one process (the ranks of a group are
samplers of their ranks):
- a state saved mid-epoch and loaded after the group went further: every rank resumes exactly
  after the saved position, and the epoch is covered exactly once;
- loaded into another world size (2 -> 3): the samplers are built first (as before a
  torch.distributed.checkpoint load), the rest of the epoch is redistributed in equal shares
  (what does not divide is left out, as the job reports), nothing twice;
- the state survives torch.save / torch.load(weights_only=True);
- as the sampler of torchdata's StatefulDataLoader (with workers): a state taken after k batches
  resumes at batch k;
- a state of another job or other settings raises ValueError naming the difference;
- under torchrun (2 ranks, gloo): the loader in the state dict torch.distributed.checkpoint saves,
  a rank SIGKILLed between two checkpoints, the group restarted by torchrun loading the newest:
  every epoch is trained exactly once by the effective timeline, with equal steps per rank.
"""
import collections
import io
import os
import signal
import subprocess
import sys
import tempfile
import unittest

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

import sluice.torch as st
from sltest import Daemon

N = 101


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return i


def take(it, k):
    return [next(it) for _ in range(k)]


class StatefulTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon()
        cls.d.start()

    @classmethod
    def tearDownClass(cls):
        cls.d.cleanup()

    def samplers(self, job, world, **kw):
        return [st.DistributedSampler(num_replicas=world, rank=r, address=self.d.addr, job=job,
                                      dataset_name=job, num_samples=N, seed=7,
                                      drop_last=True, **kw) for r in range(world)]

    def shares(self, job, world):
        """Each rank's whole share of epoch 0 (a twin job of the same settings)."""
        return [list(s) for s in self.samplers(job + "-ref", world)]

    def test_resume_after_going_further(self):
        want = self.shares("same", 2)
        group = self.samplers("same", 2)
        its = [iter(s) for s in group]
        got = [take(it, 10) for it in its]
        for s in group:
            s.report()
        state = torch.load(io.BytesIO(_saved(group[0].state_dict())), weights_only=True)
        self.assertEqual((state["epoch"], state["position"], state["world_size"]), (0, 10, 2))
        for s, it in zip(group, its):       # the group trains on, then dies without a save
            take(it, 15)
            s.report()
        again = self.samplers("same", 2)    # restarted: load, then iterate
        for s in again:
            s.load_state_dict(state)
        rest = [list(s) for s in again]
        for r in range(2):
            self.assertEqual(got[r] + rest[r], want[r])

    def test_into_another_world(self):
        group = self.samplers("grow", 2)
        its = [iter(s) for s in group]
        seen = [i for it in its for i in take(it, 12)]
        for s in group:
            s.report()
        state = group[0].state_dict()
        bigger = self.samplers("grow", 3)   # built before the load: the job still has 2 ranks
        with self.assertRaises(st.JobMismatchError):
            iter(bigger[1]).__next__()
        for s in bigger:
            s.load_state_dict(state)
        left_out = bigger[0].client.get_epoch("grow").left_out
        rest = [i for s in bigger for i in s]
        counts = {}
        for i in seen + rest:
            counts[i] = counts.get(i, 0) + 1
        # drop_last: 101 samples over 2 ranks use 100; 24 were seen, and the rest of 76 is cut
        # to equal shares of 25 for 3 ranks (every rank the same number of steps): one is left
        # out, and the job says so. Nothing twice.
        self.assertEqual(len(seen), 24)
        self.assertEqual(len(rest), 75)
        self.assertEqual(set(counts.values()), {1})
        self.assertEqual(left_out, 1)

    def test_stateful_dataloader(self):
        for workers in (0, 2):
            with self.subTest(workers=workers):
                job = "sdl%d" % workers
                want = self.shares(job, 1)[0]
                s = self.samplers(job, 1)[0]
                kw = dict(num_workers=workers, multiprocessing_context="forkserver") \
                    if workers else {}
                loader = StatefulDataLoader(Items(), sampler=s, batch_size=4, **kw)
                it = iter(loader)
                first = [int(x) for b in take(it, 5) for x in b]
                state = loader.state_dict()
                del it
                s2 = self.samplers(job, 1)[0]
                loader2 = StatefulDataLoader(Items(), sampler=s2, batch_size=4, **kw)
                loader2.load_state_dict(state)
                rest = [int(x) for b in loader2 for x in b]
                self.assertEqual(first + rest, want)

    def test_in_a_dcp_checkpoint(self):
        # The torchtitan pattern: the loader itself in the state dict DCP saves and loads.
        import tempfile
        import torch.distributed.checkpoint as dcp
        want = self.shares("dcp", 1)[0]
        s = self.samplers("dcp", 1)[0]
        loader = st.DataLoader(Items(), sampler=s, batch_size=4)
        it = iter(loader)
        first = [int(x) for b in take(it, 6) for x in b]
        weights = torch.arange(8.0)
        with tempfile.TemporaryDirectory() as tmp:
            dcp.save({"model": {"w": weights}, "dataloader": loader}, checkpoint_id=tmp)
            take(it, 3)    # trained on, then killed before the next save
            del it
            s2 = self.samplers("dcp", 1)[0]
            loader2 = st.DataLoader(Items(), sampler=s2, batch_size=4)
            state = {"model": {"w": torch.zeros(8)}, "dataloader": loader2}
            dcp.load(state, checkpoint_id=tmp)
        self.assertTrue(torch.equal(state["model"]["w"], weights))
        rest = [int(x) for b in loader2 for x in b]
        # The loop had taken 6 batches; the checkpoint was taken while it held the 6th, after
        # training it (the position sluice.torch.DataLoader counts).
        self.assertEqual(first + rest, want)

    def test_other_job_or_settings_refused(self):
        s = self.samplers("one", 1)[0]
        state = s.state_dict()
        other = self.samplers("two", 1)[0]
        with self.assertRaises(ValueError) as e:
            other.load_state_dict(state)
        self.assertIn("job", str(e.exception))
        reseeded = dict(state, settings=dict(state["settings"], seed=8))
        with self.assertRaises(ValueError) as e:
            s.load_state_dict(reseeded)
        self.assertIn("seed: state has 8, job 7", str(e.exception))
        with self.assertRaises(ValueError):
            s.load_state_dict({"position": 3})


HERE = os.path.dirname(os.path.abspath(__file__))
RUN_TIMEOUT = 240


class TorchrunTest(unittest.TestCase):
    def test_kill_and_restart_from_dcp(self):
        every, kill = 4, 7
        with Daemon() as d, tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                   "--nproc_per_node", "2", "--max_restarts", "1", "--monitor_interval", "0.5",
                   os.path.join(HERE, "torch_state_worker.py"), "--addr", d.addrs,
                   "--job", "titan", "--out", out, "--every", str(every),
                   "--kill", "1:%d" % kill]
            with open(os.path.join(out, "run.log"), "wb") as f:
                p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                     start_new_session=True,
                                     env=dict(os.environ, OMP_NUM_THREADS="1"))
            try:
                rc = p.wait(timeout=RUN_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                rc = "timeout"
            with open(os.path.join(out, "run.log"), errors="replace") as f:
                text = f.read()
            self.assertEqual(rc, 0, text[-12000:])
            saved = (kill - 1) // every * every    # the checkpoint the restart loaded
            per_epoch = collections.defaultdict(list)
            steps = collections.defaultdict(collections.Counter)
            restarts = set()
            for r in range(2):
                with open(os.path.join(out, "rank-%d.log" % r)) as f:
                    for line in f:
                        restart, step, epoch, idx = line.split()
                        restarts.add(int(restart))
                        if int(restart) == 0 and int(step) > saved:
                            continue    # trained after the checkpoint, then lost with the kill
                        per_epoch[int(epoch)].extend(int(i) for i in idx.split(","))
                        steps[int(epoch)][r] += 1
            self.assertEqual(sorted(per_epoch), [0, 1], text[-3000:])
            for epoch, idx in per_epoch.items():
                self.assertEqual(len(idx), 100, (epoch, sorted(idx)))
                self.assertEqual(len(set(idx)), 100, (epoch, collections.Counter(idx)))
                self.assertEqual(steps[epoch][0], steps[epoch][1], epoch)
            self.assertEqual(restarts, {0, 1})    # the kill happened and torchrun restarted


def _saved(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


if __name__ == "__main__":
    unittest.main()
