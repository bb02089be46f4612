"""Real training with the PyTorch drop-in: torchrun starts 3 DDP trainers (gloo, CPU, a tiny
torch.nn.Linear) fed by sluice.torch's DistributedSampler / BatchSampler and DataLoader from a real
sluiced, and the tests break things while they train: a rank SIGKILLed after its optimizer step or
with the epoch's last batch in flight (torchrun restarts the group), sluiced SIGKILLed or stopped
mid-epoch and at the epoch's last index (the trainers keep going), both at once, a batch job,
empty shares. The trainers (torch_train_worker.py) log every trained batch, fsynced right after
opt.step(); the checks read those logs:

- torchrun exits 0 and every rank wrote its "done" record in the last attempt;
- every batch is a batch-aligned slice of torch's own DistributedSampler order (or the job's
  batch plan) for the epoch it was trained in: no epoch leaks into another's step;
- per epoch every rank trained every step of its share (nothing lost), each attempt in order,
  all ranks the same number of steps, and the union covers the epoch exactly once (drop_last) or
  with torch's padding, apart from re-served batches: at most one per rank per kill or restart;
- sluiced exits 0 when stopped and its log holds no sanitizer report.

The plain-Python tests check job mismatches, lengths right after construction, that the
DataLoader reports only the batches the loop took (also when workers prefetched the whole share),
and torch's own test_DistributedSampler_padding assertions against sluice's sampler.

SLUICE_TEST_KEEP=1 keeps each test's directory (trainer logs, sluiced's log) for a look.
"""
import collections
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import DistributedSampler as TorchSampler

import sluice.torch as st
from sluice.client import Client
from sluice.v1 import feed_pb2
from sltest import Daemon, cli

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torch_train_worker.py")
WORLD = 3
SLOW = float(os.environ.get("SLUICE_SLOWDOWN", "1"))
RUN_TIMEOUT = 180 * SLOW       # one torchrun, restarts included
WAIT_TIMEOUT = 90 * SLOW       # for a marker file the trainers write
KEEP = os.environ.get("SLUICE_TEST_KEEP")  # keep each test's logs (debugging)
BATCHING = dict(strategy="dynamic", max_batch_size=8, max_seq_len=128, max_tokens=256)


def torch_order(n, rank, seed, drop_last, epoch, world=WORLD):
    ts = TorchSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed,
                      drop_last=drop_last)
    ts.set_epoch(epoch)
    return list(ts)


class Trained:
    """The logs of one torchrun: per rank the batch records and the done records."""

    def __init__(self, out):
        self.out = out
        self.recs, self.batches, self.begins, self.done = {}, {}, {}, {}
        for r in range(WORLD):
            path = os.path.join(out, "rank-%d.jsonl" % r)
            recs = []
            if os.path.exists(path):
                with open(path) as f:
                    recs = [json.loads(line) for line in f if line.endswith("\n")]
            self.batches[r] = [x for x in recs if not x.get("done") and not x.get("begin")]
            self.begins[r] = [x for x in recs if x.get("begin")]
            self.done[r] = [x for x in recs if x.get("done")]
            self.recs[r] = recs

    def summary(self):
        """Per rank: attempt/epoch, where each iteration began, the steps trained."""
        lines = []
        for r in range(WORLD):
            parts = []
            for x in self.recs[r]:
                if x.get("begin"):
                    parts.append("| a%d e%d start=%s:" % (x["restart"], x["epoch"], x["start"]))
                elif x.get("done"):
                    parts.append("| a%d done" % x["restart"])
                else:
                    parts.append(str(x["step"]))
            lines.append("rank %d: %s" % (r, " ".join(parts)))
        return "\n".join(lines)


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="sluice-train-")
        self.d = Daemon(data_dir=os.path.join(self.tmp, "data"), stable_port=True).start()

    def tearDown(self):
        rc = self.d.stop()
        log = self.d.log()
        reports = self.d.sanitizer_reports()
        self.d.cleanup()
        if KEEP:
            print("kept " + self.tmp, file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
        self.assertEqual(rc, 0, "sluiced exit code\n" + log[-6000:])
        self.assertEqual(reports, [], log[-20000:])

    # ---- sluiced ----

    def restart_daemon(self, sig, down=1.5, while_down=None):
        """Stop sluiced with sig and start it again on the same port and data dir after `down`
        seconds (while_down() runs first, with the daemon down)."""
        port = self.d.port
        self.d.pin_ports()
        rc = self.d.stop(sig)
        self.assertEqual(rc, 0 if sig == signal.SIGTERM else -sig, self.d.log()[-6000:])
        if while_down:
            while_down()
        time.sleep(down)
        self.d.start()
        self.daemon_up = time.time()
        self.assertEqual(self.d.port, port)

    # ---- torchrun ----

    def wait_files(self, out, names, deadline, what):
        """Wait for the trainers to create every file of names (fail early if torchrun ends)."""
        while True:
            if all(os.path.exists(os.path.join(out, n)) for n in names):
                return
            if self.proc.poll() is not None:
                raise AssertionError("torchrun exited (%d) before %s" % (self.proc.returncode,
                                                                         what))
            if time.monotonic() > deadline:
                raise AssertionError("timed out waiting for %s (%s)" % (what, names))
            time.sleep(0.02)

    def torchrun(self, name, job, epochs=2, max_restarts=0, env=None, during=None, extra=()):
        """Run the trainers under torchrun; during(out, deadline) runs meanwhile. A hang or a
        failure kills the whole process group and fails with the logs."""
        out = os.path.join(self.tmp, name)
        os.makedirs(out)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
               "--nproc_per_node", str(WORLD), "--redirects", "2", "--tee", "2",
               "--max_restarts", str(max_restarts), "--monitor_interval", "0.5", WORKER,
               "--addr", self.d.addrs, "--job", job, "--out", out, "--epochs", str(epochs)]
        cmd += list(extra)
        run_env = dict(os.environ, OMP_NUM_THREADS="1", KILL_AT="", PAUSE_AT="")
        run_env.update(env or {})
        logpath = os.path.join(self.tmp, name + ".log")
        t0 = time.monotonic()
        with open(logpath, "wb") as logf:
            p = self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                             env=run_env, start_new_session=True)
        deadline = t0 + RUN_TIMEOUT
        try:
            if during:
                during(out, deadline)
            rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except (Exception, AssertionError) as e:  # a timeout, a failed step of during()
            self.kill_group(p)
            self.fail("%s: %s: %s\n%s" % (name, type(e).__name__, e, self.logs(logpath)))
        self.kill_group(p)  # DataLoader workers left behind, if any
        self.assertEqual(rc, 0, "%s: torchrun exit code %d\n%s" % (name, rc, self.logs(logpath)))
        print("%s: %.1f s" % (name, time.monotonic() - t0), file=sys.stderr)
        return Trained(out), logpath

    @staticmethod
    def kill_group(p):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()

    def logs(self, logpath):
        with open(logpath, errors="replace") as f:
            text = f.read()
        out = logpath[:-len(".log")]
        trained = Trained(out).summary() if os.path.isdir(out) else ""
        return ("---- trained (the worker's step numbers)\n" + trained +
                "\n---- torchrun (last 15000 chars)\n" + text[-15000:] +
                "\n---- sluiced (last 4000 chars)\n" + self.d.log()[-4000:])

    # ---- checks ----

    def check_done(self, t, restarts, logpath):
        for r in range(WORLD):
            self.assertTrue(t.done[r], "rank %d wrote no done record\n%s" % (r, self.logs(logpath)))
            self.assertEqual(len(t.done[r]), 1, t.done[r])
            self.assertEqual(t.done[r][0]["restart"], restarts,
                             "rank %d finished in attempt %d, expected %d"
                             % (r, t.done[r][0]["restart"], restarts))

    def check_steps(self, t, plans, epochs, redo, logpath, redo_steps=None):
        """plans[e][r]: the batches (lists of indices) rank r's share has in epoch e. Every
        logged batch must be plans[e][r][step] for the epoch e it was logged under; returns
        {epoch: {rank: [steps in log order]}}."""
        ctx = "\n" + self.logs(logpath)
        steps = {e: {r: [] for r in range(WORLD)} for e in range(epochs)}
        for r in range(WORLD):
            attempt_epochs = collections.defaultdict(list)
            for b in t.batches[r]:
                e = b["epoch"]
                self.assertIn(e, steps, "rank %d logged epoch %d" % (r, e))
                self.assertEqual(b["sampler_epoch"], e, "sampler.epoch differs: %s" % b)
                plan = plans[e][r]
                found = [k for k, pb in enumerate(plan) if pb == b["idx"]]
                if not found:
                    others = [oe for oe in plans if b["idx"] in plans[oe][r]]
                    self.fail("rank %d attempt %d: batch %s is no batch of epoch %d (it is one "
                              "of epoch(s) %s): epochs mixed or batches misaligned%s"
                              % (r, b["restart"], b["idx"], e, others, ctx))
                steps[e][r].append(found[0])
                attempt_epochs[b["restart"]].append((e, found[0]))
            # Each attempt trains in order: epochs non-decreasing, steps consecutive.
            for a, seq in attempt_epochs.items():
                for (e0, s0), (e1, s1) in zip(seq, seq[1:]):
                    ok = (e1 == e0 and s1 == s0 + 1) or e1 > e0
                    self.assertTrue(ok, "rank %d attempt %d: epoch %d step %d followed by epoch "
                                    "%d step %d%s" % (r, a, e0, s0, e1, s1, ctx))
        dup_total = collections.Counter()
        for e in range(epochs):
            for r in range(WORLD):
                got, want = steps[e][r], len(plans[e][r])
                self.assertEqual(sorted(set(got)), list(range(want)),
                                 "epoch %d rank %d: steps trained %s, share has %d batches%s"
                                 % (e, r, got, want, ctx))
                dups = sorted(s for s, c in collections.Counter(got).items() for _ in range(c - 1))
                dup_total[r] += len(dups)
                if redo_steps is not None:
                    self.assertLessEqual(set(dups), set(redo_steps.get(e, ())),
                                         "epoch %d rank %d re-served steps %s%s"
                                         % (e, r, dups, ctx))
            counts = {r: len(steps[e][r]) for r in range(WORLD)}
            self.assertEqual(len(set(counts.values())), 1,
                             "epoch %d: steps per rank differ %s%s" % (e, counts, ctx))
            # Coverage: the union of what was trained is the epoch (each sample once with
            # drop_last, torch's padding otherwise), beyond the re-served batches.
            trained = collections.Counter(i for r in range(WORLD) for b in t.batches[r]
                                          if b["epoch"] == e for i in b["idx"])
            want_cov = collections.Counter(i for r in range(WORLD) for pb in plans[e][r]
                                           for i in pb)
            self.assertEqual(set(trained), set(want_cov), "epoch %d coverage%s" % (e, ctx))
            extra = trained - want_cov
            self.assertFalse(want_cov - trained, "epoch %d: samples lost%s" % (e, ctx))
            bmax = max((len(pb) for r in range(WORLD) for pb in plans[e][r]), default=0)
            self.assertLessEqual(sum(extra.values()), redo * WORLD * bmax,
                                 "epoch %d: samples trained twice %s%s" % (e, dict(extra), ctx))
        for r in range(WORLD):
            self.assertLessEqual(dup_total[r], redo, "rank %d re-served %d batches, bound %d%s"
                                 % (r, dup_total[r], redo, ctx))
        return steps

    def index_plans(self, n, seed, drop_last, bs, epochs):
        plans = {}
        for e in range(epochs):
            plans[e] = {}
            for r in range(WORLD):
                order = torch_order(n, r, seed, drop_last, e)
                plans[e][r] = [order[k:k + bs] for k in range(0, len(order), bs)]
        return plans

    def check_coverage_torch(self, plans, n, drop_last, epochs):
        """The plans themselves are torch's coverage (a sanity check of the reference)."""
        for e in range(epochs):
            allidx = [i for r in range(WORLD) for b in plans[e][r] for i in b]
            if drop_last:
                self.assertEqual(len(allidx), n - n % WORLD)
                self.assertEqual(len(set(allidx)), len(allidx))
            else:
                self.assertEqual(set(allidx), set(range(n)))
                self.assertEqual(len(allidx), -(-n // WORLD) * WORLD)

    def train_indices(self, name, *, n=100, seed=0, drop_last=False, bs=8, workers=0, epochs=2,
                      restarts=0, redo=0, redo_steps=None, env=None, during=None):
        job = name.replace("_", "-")
        extra = ["--samples", str(n), "--seed", str(seed), "--batch-size", str(bs),
                 "--num-workers", str(workers)] + (["--drop-last"] if drop_last else [])
        t, logpath = self.torchrun(name, job, epochs=epochs, max_restarts=restarts, env=env,
                                   during=during, extra=extra)
        self.check_done(t, restarts, logpath)
        plans = self.index_plans(n, seed, drop_last, bs, epochs)
        self.check_coverage_torch(plans, n, drop_last, epochs)
        steps = self.check_steps(t, plans, epochs, redo, logpath, redo_steps)
        self.assertEqual(Client(self.d.addr).get_epoch(job).epoch, epochs)
        return t, steps


class RankKillTest(Base):
    """A rank SIGKILLed mid-epoch; torchrun restarts the group (--max_restarts 1) from the
    positions the daemon recorded. REPORT_LAG=0 (every report landed before the next batch is
    handed out): the restart resumes exactly after the last trained step; with the loader's
    default report_lag the reports go in the background and the restart may resume up to
    LAG batches earlier, never later."""

    LAG = 64  # sluice.torch.DataLoader's default report_lag (report_every 1)

    def check_resumed_at(self, steps, epoch, k, lag=0):
        # Every rank resumed at the group's position p: the killed rank had reported [0, k) (or,
        # with a lag, at least [0, k - lag)), the others at least as much; each trains steps
        # [p, k] twice and nothing else.
        p = None
        for r in range(WORLD):
            got = steps[epoch][r]
            self.assertEqual(got[:k + 1], list(range(k + 1)), "epoch %d rank %d" % (epoch, r))
            p = got[k + 1] if p is None else p
            self.assertTrue(max(0, k - lag) <= p <= k, "epoch %d rank %d resumed at %d, after "
                            "step %d (lag %d): %s" % (epoch, r, p, k, lag, got))
            self.assertEqual(got, list(range(k + 1)) + list(range(p, len(set(got)))),
                             "epoch %d rank %d" % (epoch, r))

    def test_killed_after_step_no_workers(self):
        _, steps = self.train_indices("kill_step_w0", seed=7, drop_last=True, workers=0,
                                      restarts=1, redo=1, redo_steps={0: {2}},
                                      env={"KILL_AT": "1:0:2:after_step", "REPORT_LAG": "0"})
        self.check_resumed_at(steps, 0, 2)

    def test_killed_after_step_two_workers(self):
        # The loader's default report_lag: reports in the background.
        _, steps = self.train_indices("kill_step_w2", seed=3, drop_last=False, workers=2,
                                      restarts=1, redo=self.LAG + 1,
                                      redo_steps={1: set(range(3 + 1))},
                                      env={"KILL_AT": "2:1:3:after_step"})
        self.check_resumed_at(steps, 1, 3, lag=self.LAG)

    def test_killed_after_last_step(self):
        # Rank 1 dies after training the epoch's last batch, before its loop ends (its end-of-epoch
        # report never leaves); the others finished the epoch and wait for the next. After the
        # restart the group is still in epoch 0 at rank 1's position: every rank trains the last
        # batch again, then epoch 1.
        _, steps = self.train_indices("kill_last_step", seed=6, drop_last=True, workers=0,
                                      restarts=1, redo=1, redo_steps={0: {4}},
                                      env={"KILL_AT": "1:0:last:after_step",
                                           "REPORT_LAG": "0"})
        self.check_resumed_at(steps, 0, 4)

    def test_killed_with_last_batch_in_flight(self):
        # The last batch of epoch 0 was handed to every rank's loop (batches before it are
        # reported), rank 0 dies before training it: after the restart every rank trains it
        # (once), and epoch 1 follows.
        _, steps = self.train_indices("kill_last", seed=5, drop_last=False, workers=2,
                                      restarts=1, redo=1, redo_steps={},
                                      env={"KILL_AT": "0:0:last:last_batch",
                                           "REPORT_LAG": "0"})
        for r in range(WORLD):
            self.assertEqual(steps[0][r], list(range(len(steps[0][r]))))


class DaemonRestartTest(Base):
    """sluiced goes away while the trainers run; they carry on without a torchrun restart."""

    def daemon_restart(self, sig, tag):
        def during(out, deadline):
            self.wait_files(out, ["paused-%s-%d" % (tag, r) for r in range(WORLD)], deadline,
                            "every rank paused at " + tag)

            def release():
                # The ranks go on while the daemon is down: their next report (and stream)
                # meets no daemon and has to be retried.
                with open(os.path.join(out, "release-" + tag), "w"):
                    pass
            self.restart_daemon(sig, down=1.5, while_down=release)
        return during

    def train_indices(self, name, **kw):
        t, steps = super().train_indices(name, **kw)
        # How long the trainers took to go on once sluiced was back (informational: the
        # channel's reconnect backoff, not the sampler's, dominates it).
        after = [b["t"] for r in range(WORLD) for b in t.batches[r] + t.done[r]
                 if b["t"] > self.daemon_up]
        print("%s: first step %.1f s after sluiced was back" % (name, min(after) - self.daemon_up),
              file=sys.stderr)
        return t, steps

    def test_sigkill_mid_epoch(self):
        self.train_indices("d_kill_mid", seed=1, drop_last=True, workers=2, redo=1,
                           env={"PAUSE_AT": "0:2:mid"},
                           during=self.daemon_restart(signal.SIGKILL, "mid"))

    def test_sigterm_mid_epoch(self):
        self.train_indices("d_term_mid", seed=2, drop_last=False, workers=0, redo=1,
                           env={"PAUSE_AT": "1:1:mid"},
                           during=self.daemon_restart(signal.SIGTERM, "mid"))

    def test_sigkill_at_last_index(self):
        # Every rank has trained the epoch's last batch: the end-of-epoch reports (and the next
        # epoch's streams) meet a down daemon.
        self.train_indices("d_kill_last", seed=4, drop_last=False, workers=0, redo=1,
                           env={"PAUSE_AT": "0:last:end"},
                           during=self.daemon_restart(signal.SIGKILL, "end"))

    def test_daemon_restart_and_rank_kill(self):
        # sluiced is SIGKILLed at epoch 1 step 1, rank 1 dies right after while the daemon is
        # down, torchrun restarts the group, and the new samplers are built before sluiced is
        # back: they wait for it.
        def during(out, deadline):
            self.wait_files(out, ["paused-both-%d" % r for r in range(WORLD)], deadline,
                            "every rank paused")

            def release_and_wait():
                with open(os.path.join(out, "release-both"), "w"):
                    pass
                self.wait_files(out, ["started-%d-1" % r for r in range(WORLD)], deadline,
                                "the restarted ranks")
            self.restart_daemon(signal.SIGKILL, down=1.0, while_down=release_and_wait)

        self.train_indices("d_kill_rank_kill", seed=9, drop_last=True, workers=2, restarts=1,
                           redo=2, env={"PAUSE_AT": "1:1:both", "KILL_AT": "1:1:1:after_step"},
                           during=during)


class BatchJobTest(Base):
    def test_batch_job_rank_killed_after_step(self):
        import random
        n, epochs = 120, 2
        rnd = random.Random(11)
        lengths = [rnd.randint(1, 100) for _ in range(n)]
        c = Client(self.d.addr)
        c.create_dataset("tok", n)
        c.upload_lengths("tok", lengths)
        c.create_job("jb", "tok", WORLD, seed=3, batching=BATCHING)
        # The reference: the same job spec, advanced by hand, streamed from step 0.
        c.create_job("jb-ref", "tok", WORLD, seed=3, batching=BATCHING, manual_advance=True)
        plans = {}
        for e in range(epochs):
            plans[e] = {}
            for r in range(WORLD):
                req = feed_pb2.StreamBatchesRequest(job="jb-ref", rank=r, epoch=e, epoch_set=True,
                                                    step=0, step_set=True)
                plans[e][r] = [list(b.indices) for ch in c.feed.StreamBatches(req, timeout=30)
                               for b in ch.batches]
            self.assertEqual(len({len(plans[e][r]) for r in range(WORLD)}), 1)
            self.assertGreater(len(plans[e][0]), 3)
            c.next_epoch("jb-ref", expect_epoch=e)
        self.assertNotEqual(plans[0], plans[1])

        t, logpath = self.torchrun("batch_kill", "jb", epochs=epochs, max_restarts=1,
                                   env={"KILL_AT": "2:0:1:after_step", "REPORT_LAG": "0"},
                                   extra=["--mode", "batches", "--samples", str(n),
                                          "--num-workers", "2"])
        self.check_done(t, 1, logpath)
        steps = self.check_steps(t, plans, epochs, 1, logpath, redo_steps={0: {1}})
        for r in range(WORLD):
            self.assertEqual(steps[0][r][:3], [0, 1, 1], steps[0][r])
            for b in t.batches[r]:
                self.assertLessEqual(len(b["idx"]) * max(lengths[i] for i in b["idx"]), 256)
        self.assertEqual(c.get_epoch("jb").epoch, epochs)


class EmptyShareTest(Base):
    def check_empty(self, name, n):
        job = name.replace("_", "-")
        t, logpath = self.torchrun(name, job, epochs=3,
                                   extra=["--samples", str(n), "--drop-last", "--num-workers", "2"])
        self.check_done(t, 0, logpath)
        for r in range(WORLD):
            self.assertEqual(t.batches[r], [], "rank %d trained on an empty share" % r)
        self.assertEqual(Client(self.d.addr).get_epoch(job).epoch, 3)

    def test_fewer_samples_than_ranks_drop_last(self):
        self.check_empty("empty_n2", 2)

    def test_one_sample_drop_last(self):
        self.check_empty("empty_n1", 1)


class SamplerApiTest(Base):
    """No torchrun: one process plays every rank (num_replicas and rank given)."""

    def sampler(self, ds, job, rank=0, world=1, **kw):
        return st.DistributedSampler(ds, num_replicas=world, rank=rank, job=job,
                                     address=self.d.addr, **kw)

    def test_job_mismatch(self):
        c = Client(self.d.addr)
        c.create_dataset("d10", 10)
        c.create_job("mm", "d10", 1, shuffle="torch", seed=0)
        with self.assertRaises(ValueError) as cm:
            self.sampler(range(20), "mm", shuffle=True, seed=42)
        msg = str(cm.exception)
        for word in ("10", "20", "seed", "42"):
            self.assertIn(word, msg, "the message names sample count and seed: %r" % msg)
        # attach_any: the job's settings rule (10 samples, seed 0).
        s = self.sampler(range(20), "mm", shuffle=True, seed=42, attach_any=True)
        self.assertEqual(len(s), 10)
        self.assertEqual(list(s), torch_order(10, 0, 0, False, 0, world=1))

        cases = [("drop_last", dict(drop_last=True), {}),
                 ("partition", dict(partition="contiguous"), {}),
                 ("seed", dict(seed=1), dict(seed=2))]
        for key, job_kw, sampler_kw in cases:
            with self.subTest(key):
                job = "mm-" + key.replace("_", "-")
                c.create_job(job, "d10", 1, shuffle="torch", **job_kw)
                with self.assertRaises(ValueError) as cm:
                    self.sampler(range(10), job, shuffle=True, **sampler_kw)
                self.assertIn(key, str(cm.exception))

        # A job made with the CLI (feistel shuffle) and a sampler asking for torch's order.
        r = cli("dataset", "create", "cd", "--samples", "12", addr=self.d.addr)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = cli("job", "create", "cj", "--dataset", "cd", "--world-size", "1", "--shuffle",
                "feistel", "--seed", "0", addr=self.d.addr)
        self.assertEqual(r.returncode, 0, r.stderr)
        with self.assertRaises(ValueError) as cm:
            self.sampler(range(12), "cj", shuffle=True, seed=0)
        self.assertIn("shuffle", str(cm.exception))
        self.assertIn("feistel", str(cm.exception))
        s = self.sampler(range(12), "cj", shuffle=True, seed=0, attach_any=True)
        self.assertEqual(sorted(s), list(range(12)))

    def test_lengths_right_after_construction(self):
        n, bs = 103, 8
        ds = list(range(n))
        for drop_last in (False, True):
            job = "len-%d" % drop_last
            for r in range(WORLD):
                s = self.sampler(ds, job, rank=r, world=WORLD, shuffle=True, seed=5,
                                 drop_last=drop_last)
                ts = TorchSampler(ds, num_replicas=WORLD, rank=r, shuffle=True, seed=5,
                                  drop_last=drop_last)
                self.assertEqual(s.epoch, 0)
                self.assertEqual(len(s), len(ts))
                for attr in ("num_replicas", "rank", "seed", "shuffle", "drop_last",
                             "num_samples", "total_size"):
                    self.assertEqual(getattr(s, attr), getattr(ts, attr), attr)
                self.assertIs(s.dataset, ds)
                for loader_drop in (False, True):
                    loader = st.DataLoader(ds, batch_size=bs, sampler=s, drop_last=loader_drop)
                    self.assertEqual(len(loader), len(TorchLoader(ds, batch_size=bs, sampler=ts,
                                                                  drop_last=loader_drop)))
        # An existing job: the sampler knows the coordinator's epoch before any stream.
        c = Client(self.d.addr)
        c.next_epoch("len-0")
        c.next_epoch("len-0")
        c.report_progress("len-0", 1, 2, 8)
        for r in range(WORLD):
            s = self.sampler(ds, "len-0", rank=r, world=WORLD, shuffle=True, seed=5)
            self.assertEqual(s.epoch, c.get_epoch("len-0").epoch)
            self.assertEqual(s.epoch, 2)
            self.assertEqual(len(s), math.ceil(n / WORLD))
        # BatchSampler: the plan's count per rank.
        import random
        rnd = random.Random(2)
        c.create_dataset("tokl", n)
        c.upload_lengths("tokl", [rnd.randint(1, 100) for _ in range(n)])
        c.create_job("jbl", "tokl", WORLD, seed=1, batching=BATCHING)
        for r in range(WORLD):
            bsamp = st.BatchSampler(num_replicas=WORLD, rank=r, job="jbl", address=self.d.addr)
            count = c.get_epoch("jbl").ranks[r].count
            self.assertGreater(count, 0)
            self.assertEqual(len(bsamp), count)
            self.assertEqual(len(st.DataLoader(ds, batch_sampler=bsamp)), count)
            self.assertEqual(bsamp.epoch, 0)
            self.assertEqual(len(list(bsamp)), count)

    def test_loader_reports_only_what_the_loop_took(self):
        # While the loop holds batch k, the coordinator has [0, k) consumed and the epoch is not
        # over, whatever DataLoader workers prefetched (here the whole share fits in the
        # prefetch of 2 workers); the epoch ends when the loop is exhausted.
        c = Client(self.d.addr)
        n, bs = 20, 8
        c.create_dataset("tokp", n)
        c.upload_lengths("tokp", [1 + i % 7 for i in range(n)])
        # report_lag=0: exactly [0, k) recorded; the default lag: never more, at most the lag
        # less.
        for workers, lag in ((0, 0), (2, 0), (0, 8), (2, 1)):
            with self.subTest(workers=workers, lag=lag):
                job = "took-%d-%d" % (workers, lag)
                s = self.sampler(list(range(n)), job, shuffle=True)
                self.check_took(c, job, st.DataLoader(list(range(n)), batch_size=bs, sampler=s,
                                                      num_workers=workers, report_lag=lag), bs,
                                lag)
                job = "took-b%d-%d" % (workers, lag)
                c.create_job(job, "tokp", 1, batching=BATCHING)
                b = st.BatchSampler(num_replicas=1, rank=0, job=job, address=self.d.addr)
                self.assertLessEqual(len(b), 4)
                self.check_took(c, job, st.DataLoader(list(range(n)), batch_sampler=b,
                                                      num_workers=workers, report_lag=lag), 1,
                                lag)

    def check_took(self, c, job, loader, per_batch, lag=0):
        k = 0
        for k, _ in enumerate(loader):
            st_ = c.get_epoch(job)
            self.assertEqual(st_.epoch, 0, "holding batch %d" % k)
            self.assertLessEqual(st_.ranks[0].position, k * per_batch, "holding batch %d" % k)
            self.assertGreaterEqual(st_.ranks[0].position, max(0, k - lag) * per_batch,
                                    "holding batch %d, lag %d" % (k, lag))
        self.assertEqual(k + 1, len(loader))
        self.assertEqual(c.get_epoch(job).epoch, 1)

    def test_background_reports_hold_the_loop_at_the_lag(self):
        # A daemon that stops answering (SIGSTOP): the loop goes on for report_lag batches past
        # what the daemon recorded, then waits for it; once it answers again the loop goes on
        # and the epoch ends with the whole share recorded.
        import threading
        n, bs, lag = 64, 2, 3
        c = Client(self.d.addr)
        s = self.sampler(list(range(n)), "lagged", shuffle=False)
        it = iter(st.DataLoader(list(range(n)), batch_size=bs, sampler=s, report_lag=lag))
        for _ in range(4):
            next(it)  # batches 0-3 taken: at most [0, 3) reported, coalesced
        s._report_wait()  # the one in flight landed
        recorded = c.get_epoch("lagged").ranks[0].position // bs
        self.assertTrue(1 <= recorded <= 3, recorded)
        got = []
        self.d.proc.send_signal(signal.SIGSTOP)
        try:
            t = threading.Thread(target=lambda: got.extend(next(it) for _ in range(lag + 2)))
            t.start()
            t.join(2.0)
            self.assertTrue(t.is_alive())
            # Batch k is handed out while k - recorded <= lag.
            self.assertEqual(len(got), recorded + lag - 3,
                             "batches handed out with [0, %d) recorded" % recorded)
        finally:
            self.d.proc.send_signal(signal.SIGCONT)
        t.join(30)
        self.assertFalse(t.is_alive())
        self.assertEqual(len(got), lag + 2)
        self.assertEqual([b.tolist() for b in got],
                         [[i, i + 1] for i in range(4 * bs, (4 + lag + 2) * bs, bs)])
        for _ in it:
            pass
        st_ = c.get_epoch("lagged")
        self.assertEqual(st_.epoch, 1)

    def test_torch_distributed_sampler_padding(self):
        # torch's test_DistributedSampler_padding (distributed_test.py), each world size played
        # by one process: the same assertions against sluice's sampler.
        for world in (2, 3, 4, 5):
            with self.subTest(world=world):
                self.padding_assertions(world)

    def padding_assertions(self, world):
        dataset_size = 100 + world + 1
        dataset = list(range(dataset_size))
        dataset_tiny_size = max(world // 2 - 1, 1)
        dataset_tiny = list(range(dataset_tiny_size))

        def samplers(job, ds, **kw):
            return [self.sampler(ds, job, rank=r, world=world, **kw) for r in range(world)]

        def validate_global_samples(counts):
            self.assertEqual(len(set(counts)), 1)

        # drop_last: the tail that does not divide evenly is dropped.
        counts = []
        for s in samplers("pad-dl-%d" % world, dataset, drop_last=True):
            effective = (math.ceil((dataset_size - world) / world)
                         if dataset_size % world else dataset_size / world)
            self.assertEqual(s.num_samples, effective)
            self.assertEqual(s.total_size, s.num_samples * world)
            self.assertEqual(len(list(iter(s))), s.num_samples)
            counts.append(s.num_samples)
        validate_global_samples(counts)
        # Padded up to a multiple of the world.
        counts = []
        for s in samplers("pad-add-%d" % world, dataset):
            self.assertEqual(s.num_samples, math.ceil(dataset_size / world))
            self.assertEqual(s.total_size, s.num_samples * world)
            self.assertEqual(len(list(iter(s))), s.num_samples)
            counts.append(s.num_samples)
        validate_global_samples(counts)
        # A dataset smaller than the world: padded too.
        counts = []
        for s in samplers("pad-tiny-%d" % world, dataset_tiny):
            self.assertEqual(s.num_samples, math.ceil(dataset_tiny_size / world))
            self.assertEqual(s.total_size, s.num_samples * world)
            self.assertEqual(len(list(iter(s))), s.num_samples)
            counts.append(s.num_samples)
        validate_global_samples(counts)


if __name__ == "__main__":
    unittest.main()
