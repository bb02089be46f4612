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


def twin_shares(addr, job, world, epochs):
    """[rank][epoch] -> the indices of that share, from a twin job of the worker's settings:
    what an uninterrupted run trains on, in order."""
    group = [st.DistributedSampler(num_replicas=world, rank=r, address=addr, job=job,
                                   dataset_name=job, num_samples=N, seed=3, drop_last=True)
             for r in range(world)]
    out = [[] for _ in range(world)]
    for e in range(epochs):     # the next epoch starts once every rank has ended this one
        for r, s in enumerate(group):
            s.set_epoch(e)
            out[r].append(list(s))
    return out


def batches(idx, size):
    return [idx[k:k + size] for k in range(0, len(idx), size)]


def trained(out, world, saved):
    """{rank: [(epoch, [i, ...]), ...]}: the batches the model kept, in order: the first run's
    up to the checkpoint step `saved` (what followed was lost with the kill or the stop), then
    the restarted run's. Also the restart counts seen."""
    kept, restarts = {}, set()
    for r in range(world):
        if not os.path.exists(os.path.join(out, "rank-%d.log" % r)):
            continue
        with open(os.path.join(out, "rank-%d.log" % r)) as f:
            for line in f:
                restart, step, epoch, idx = line.split()
                restarts.add(int(restart))
                if int(restart) == 0 and int(step) > saved:
                    continue
                kept.setdefault(r, []).append((int(epoch), [int(i) for i in idx.split(",")]))
    return kept, restarts


def weight_after(per_rank):
    """The worker's model weight after training per_rank[r][k] on rank r at step k from its
    initial state (the update of a step: every rank's batch summed)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    for step in zip(*per_rank):
        g = sum(torch.tensor(b).float().sum() for b in step).reshape(1)
        model.weight.data += g * 1e-6
    return float(model.weight.data.item()).hex()


def _children():
    """The pids whose parent is this process (orphans come here once it is a subreaper)."""
    me, out = str(os.getpid()), []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            if fields[1] == me:
                out.append(int(d))
    return out


def _reap_orphans(keep):
    """SIGKILL and reap what a group left behind (this process's children but those in `keep`,
    the daemon's): torch elastic starts each rank in a session of its own, and a SIGKILLed
    rank's forkserver DataLoader workers outlive it (torch's worker watchdog watches the
    forkserver, not the rank)."""
    for _ in range(100):
        pids = [p for p in _children() if p not in keep]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


class TorchrunTest(unittest.TestCase):
    """torchrun groups of torch_state_worker.py: the loader's state inside DCP checkpoints in
    sluiced, a rank killed, the group restarted (or stopped and restarted in another world)."""

    @classmethod
    def setUpClass(cls):
        import ctypes
        # PR_SET_CHILD_SUBREAPER: the groups' orphans become this process's children.
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)

    def run_group(self, d, out, nproc, *args, restarts=1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
               "--nproc_per_node", str(nproc), "--max_restarts", str(restarts),
               "--monitor_interval", "0.5", os.path.join(HERE, "torch_state_worker.py"),
               "--addr", d.addrs, "--job", "titan", "--out", out] + list(args)
        log = os.path.join(out, "run-%d.log" % nproc)
        keep = set(_children())
        with open(log, "wb") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                 start_new_session=True,
                                 env=dict(os.environ, OMP_NUM_THREADS="1"))
        try:
            rc = p.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
            _reap_orphans(keep)
        with open(log, errors="replace") as f:
            text = f.read()
        self.assertEqual(rc, 0, text[-12000:])
        return text

    def kill_and_restart(self, loader):
        every, kill, world = 4, 7, 2
        with Daemon() as d, tempfile.TemporaryDirectory() as out:
            text = self.run_group(d, out, world, "--every", str(every), "--kill",
                                  "1:%d" % kill, "--loader", loader)
            saved = (kill - 1) // every * every    # the checkpoint the restart loaded
            kept, restarts = trained(out, world, saved)
            self.assertEqual(restarts, {0, 1})    # the kill happened and torchrun restarted
            want = twin_shares(d.addr, "titan-ref", world, 2)
            for r in range(world):
                # Exactly the uninterrupted run's batches, in its order, each epoch once...
                self.assertEqual(kept[r], [(e, b) for e in range(2)
                                           for b in batches(want[r][e], 4)], (r, text[-3000:]))
            # ...and the model the uninterrupted run ends with, bit for bit.
            want_w = weight_after([[b for _, b in kept[r]] for r in range(world)])
            for r in range(world):
                with open(os.path.join(out, "final-%d.txt" % r)) as f:
                    self.assertEqual(f.read(), want_w, r)
            for e in range(2):
                idx = [i for r in range(world) for i in want[r][e]]
                self.assertEqual(len(set(idx)), 100)

    def test_kill_and_restart_from_dcp(self):
        self.kill_and_restart("sluice")

    def test_stateful_dataloader_kill_and_restart(self):
        # torchdata's StatefulDataLoader with 2 workers and sluice's sampler: its state_dict
        # (the sampler's inside) saved in the DCP checkpoint, a rank killed, the group resumed.
        self.kill_and_restart("stateful")

    def test_restart_into_another_world(self):
        # 3 ranks train and stop after the step-8 checkpoint; 2 ranks load it and finish: the
        # rest of epoch 0 is redistributed over 2, nothing is trained twice.
        with Daemon() as d, tempfile.TemporaryDirectory() as out:
            self.run_group(d, out, 3, "--every", "4", "--stop-after", "8", restarts=0)
            first, _ = trained(out, 3, 8)
            for r in range(3):
                os.rename(os.path.join(out, "rank-%d.log" % r),
                          os.path.join(out, "first-%d.log" % r))
            text = self.run_group(d, out, 2, "--every", "4", restarts=0)
            second, _ = trained(out, 2, 1 << 30)
            per_epoch = collections.defaultdict(list)
            for kept in (first, second):
                for r in kept:
                    for e, b in kept[r]:
                        per_epoch[e].extend(b)
            for r in range(2):
                steps = collections.Counter(e for e, _ in second[r])
                self.assertEqual(steps, collections.Counter(e for e, _ in second[0]), text[-3000:])
            # Epoch 0: 3 ranks of 33 (drop_last) trained 8 batches of 4 each: 96; the 3 left are
            # cut to equal shares of 1 for 2 ranks (one left out). Epoch 1: 2 ranks of 50.
            self.assertEqual(len(per_epoch[0]), 98, sorted(per_epoch[0]))
            self.assertEqual(len(set(per_epoch[0])), 98)
            self.assertEqual(len(per_epoch[1]), 100)
            self.assertEqual(len(set(per_epoch[1])), 100)


def _saved(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


if __name__ == "__main__":
    unittest.main()
