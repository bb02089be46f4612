"""Checkpoints that carry the data position, from Python, against a real sluiced (no torchrun:
one process plays every rank by giving rank and world_size).

- Data positions: what sluice.torch's samplers and DataLoader report as consumed by the loop
  (exact with DataLoader workers prefetching), for index and batch jobs, before, during and
  after an iteration.
- sluice.checkpoint.Checkpoints: Begin's feed_job/no_feed/auto_commit, uploads with a data
  position, the feed state of COMPLETE checkpoints, Restore, and bad input (clear errors, nothing
  changed).
- sluice.torch.CheckpointManager: save/restore round trips that rewind the feed (also across
  epochs, after a mid-epoch resize and into another world size), keep_last, latest_step, a background upload failing
  (daemon killed) raised by the next call with no COMPLETE checkpoint missing a shard.
- sluice.torch.DataLoader's workers start without fork() of the trainer, also while an
  upload is in flight (grpcio's fork handlers can hang a fork: see sluice/torch.py).

The torchrun tests (a rank or the daemon killed, bit-identical parameters) are in
test_torch_ckpt_train.py.
"""
import os
import shutil
import signal
import sys
import tempfile
import time
import unittest
import warnings

import grpc
import torch
import torch.distributed.checkpoint as dcp
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data import DistributedSampler as TorchSampler

import sluice.torch as st
import sluice.torch.dcp
from sluice.checkpoint import COMPLETE, WRITING, Checkpoints, to_data_position
from sluice.client import Client
from sltest import Daemon

KEEP = os.environ.get("SLUICE_TEST_KEEP")
BATCHING = dict(strategy="dynamic", max_batch_size=8, max_seq_len=128, max_tokens=256)


def torch_order(n, rank, seed, drop_last, epoch, world):
    ts = TorchSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed,
                      drop_last=drop_last)
    ts.set_epoch(epoch)
    return list(ts)


def poll(fn, what, timeout=20.0):
    """fn() until it returns something true (returned), else fail after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.02)



class _Opaque:
    """An object the state format has no encoding for (saved only with allow_pickle)."""

    def __init__(self, v):
        self.v = v

class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="sluice-tckpt-")
        self.d = Daemon(data_dir=os.path.join(self.tmp, "data"), stable_port=True).start()
        self.c = Client(self.d.addr)
        self.ck = Checkpoints(self.d.addr)
        self.expect_rc = 0

    def tearDown(self):
        self.c.close()
        self.ck.close()
        rc = self.d.stop()
        log = self.d.log()
        reports = self.d.sanitizer_reports()
        self.d.cleanup()
        if KEEP:
            print("kept " + self.tmp, file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
        self.assertEqual(rc, self.expect_rc, "sluiced exit code\n" + log[-6000:])
        self.assertEqual(reports, [], log[-20000:])

    def restart_daemon(self, sig=signal.SIGKILL, down=0.0):
        port = self.d.port
        self.d.pin_ports()
        self.d.stop(sig)
        time.sleep(down)
        self.d.start()
        self.assertEqual(self.d.port, port)

    def up(self):
        try:
            self.ck.list("-")
            return True
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False

    def sampler(self, job, n, rank=0, world=1, **kw):
        kw.setdefault("shuffle", True)
        return st.DistributedSampler(range(n), num_replicas=world, rank=rank, job=job,
                                     address=self.d.addr, **kw)

    def batch_job(self, job, n, world, seed=1):
        data = job + "-tok"
        self.c.create_dataset(data, n)
        self.c.upload_lengths(data, [1 + (i * 37) % 100 for i in range(n)])
        self.c.create_job(job, data, world, seed=seed, batching=BATCHING)

    def complete(self, job, name, timeout=20.0):
        """Wait until (job, name) is COMPLETE (the daemon auto-commits) and return it."""
        return poll(lambda: (lambda c: c if c.state == COMPLETE else None)(
            self.ck.get(job, name)), "%s/%s COMPLETE" % (job, name), timeout)


class DataPositionTest(Base):
    """What the loop consumed, as the samplers and the DataLoader count it."""

    def check_loader(self, job, loader, sampler, per_batch, share, epoch=0):
        # Before the iteration: the end of the previous epoch's share, or the job's position.
        pos0 = loader.data_position()
        self.assertIn((pos0["epoch"], pos0["position"]), ((epoch, 0), (epoch - 1, share)))
        seen = []
        for k, batch in enumerate(loader):
            want = min(sampler.start_position + (k + 1) * per_batch, share)
            self.assertEqual(loader.data_position(),
                             {"job": job, "epoch": epoch, "position": want,
                              "world_size": sampler.num_replicas}, "holding batch %d" % k)
            self.assertEqual(sampler.data_position(), loader.data_position())
            seen.append(batch)
        self.assertEqual(loader.data_position()["position"], share)
        self.assertEqual(loader.data_position()["epoch"], epoch)
        return seen

    def test_index_sampler_with_and_without_workers(self):
        n, bs = 50, 8
        for workers in (0, 2):
            with self.subTest(workers=workers):
                job = "pos-%d" % workers
                s = self.sampler(job, n)
                self.assertEqual(s.data_position(), {"job": job, "epoch": 0, "position": 0,
                                                     "world_size": 1})
                loader = st.DataLoader(list(range(n)), batch_size=bs, sampler=s,
                                       num_workers=workers)
                self.check_loader(job, loader, s, bs, n)
                # The epoch ended: its share is consumed; the job went on to epoch 1, where a
                # new iteration starts at 0.
                self.assertEqual(self.c.get_epoch(job).epoch, 1)
                self.check_loader(job, loader, s, bs, n, epoch=1)

    def test_loader_drop_last_tail(self):
        # DataLoader(drop_last=True) never hands the tail to the loop: the position stays at the
        # last full batch until the loop ends, then the share is consumed.
        n, bs = 20, 8
        s = self.sampler("tail", n)
        loader = st.DataLoader(list(range(n)), batch_size=bs, sampler=s, drop_last=True,
                               num_workers=2)
        got = []
        for _ in loader:
            got.append(loader.data_position()["position"])
        self.assertEqual(got, [8, 16])
        self.assertEqual(loader.data_position()["position"], n)

    def test_ranks_of_a_world(self):
        n, bs, world = 40, 4, 3
        samplers = [self.sampler("w3", n, rank=r, world=world, drop_last=True)
                    for r in range(world)]
        loaders = [st.DataLoader(list(range(n)), batch_size=bs, sampler=s) for s in samplers]
        its = [iter(ld) for ld in loaders]
        for k in range(2):
            for r in range(world):
                next(its[r])
                self.assertEqual(loaders[r].data_position(),
                                 {"job": "w3", "epoch": 0, "position": (k + 1) * bs,
                                  "world_size": world})
        for it in its:
            it.close()

    def test_batch_sampler(self):
        n = 60
        for workers in (0, 2):
            with self.subTest(workers=workers):
                job = "posb-%d" % workers
                self.batch_job(job, n, 1)
                b = st.BatchSampler(num_replicas=1, rank=0, job=job, address=self.d.addr)
                loader = st.DataLoader(list(range(n)), batch_sampler=b, num_workers=workers)
                self.check_loader(job, loader, b, 1, len(b))

    def test_plain_loader_counts_what_was_handed_out(self):
        # Without sluice.torch.DataLoader the sampler only knows what it handed out: exact
        # without workers (torch asks for a batch's indices when the loop asks for the batch).
        n, bs = 30, 4
        s = self.sampler("plain", n)
        for k, _ in enumerate(TorchLoader(list(range(n)), batch_size=bs, sampler=s)):
            self.assertEqual(s.data_position()["position"], min((k + 1) * bs, n))
        self.assertEqual(s.data_position(), {"job": "plain", "epoch": 0, "position": n,
                                             "world_size": 1})

    def test_fresh_process_reads_the_group_position(self):
        # A sampler that has not iterated yet reports where its next iteration starts: the
        # group's position (the lowest any dp rank reported), which is what it will serve.
        n, world = 30, 3
        self.sampler("grp", n, rank=0, world=world)
        self.c.report_progress("grp", 0, 0, 6)
        self.c.report_progress("grp", 1, 0, 4)
        self.c.report_progress("grp", 2, 0, 5)
        s = self.sampler("grp", n, rank=0, world=world)
        self.assertEqual(s.data_position()["position"], 4)
        s2 = self.sampler("grp", n, rank=0, world=world, lockstep=False)
        self.assertEqual(s2.data_position()["position"], 6)
        self.assertEqual(next(iter(s)), torch_order(n, 0, 0, False, 0, world)[4])


class ClientTest(Base):
    """sluice.checkpoint.Checkpoints: the contract's new fields, and bad input."""

    def test_data_position_argument(self):
        dp = to_data_position({"job": "j", "epoch": 2, "position": 5, "world_size": 3})
        self.assertEqual((dp.job, dp.epoch, dp.position, dp.world_size), ("j", 2, 5, 3))
        self.assertIs(to_data_position(dp), dp)
        self.assertIsNone(to_data_position(None))
        for bad, words in (({"epoch": 1, "position": 2, "rank": 0}, ["rank"]),
                           ({"position": 2}, ["epoch", "required"]),
                           ({"epoch": -1, "position": 2}, ["epoch", "-1"]),
                           ({"epoch": 1, "position": 2, "world_size": 70000}, ["world_size",
                                                                                "70000"]),
                           ({"epoch": 1, "position": 2.5}, ["position", "2.5"]),
                           ({"epoch": True, "position": 2}, ["epoch"]),
                           ({"job": 3, "epoch": 1, "position": 2}, ["job"])):
            with self.subTest(bad=bad):
                with self.assertRaises(ValueError) as cm:
                    to_data_position(bad)
                for w in words:
                    self.assertIn(w, str(cm.exception))
        with self.assertRaises(TypeError):
            to_data_position([1, 2])
        # Bad positions are refused before anything is hashed or sent.
        with self.assertRaises(ValueError):
            self.ck.save_state_dict("j", "x", 0, {"a": torch.zeros(2)},
                                    data_position={"epoch": 0})
        with self.assertRaises(ValueError):
            self.ck.begin("j", "x", world_size=1, feed_job="f", no_feed=True)

    def test_feed_state_and_restore(self):
        # Two ranks upload their positions by hand; auto-commit makes the checkpoint COMPLETE
        # with the feed state; Restore puts the job back there after it went on.
        n, world = 40, 2
        self.sampler("fj", n, world=world)
        ck = self.ck.begin("fj", "s1", step=1, world_size=world, feed_job="fj", auto_commit=True)
        self.assertEqual((ck.feed_job, ck.auto_commit, ck.state), ("fj", True, WRITING))
        for r, p in ((0, 6), (1, 6)):
            self.c.report_progress("fj", r, 0, p)
            self.ck.save_state_dict("fj", "s1", r, {"r": r},
                                    data_position={"job": "fj", "epoch": 0, "position": p,
                                                   "world_size": world})
        done = self.complete("fj", "s1")
        fs = done.feed_state
        self.assertEqual((fs.job, fs.epoch, fs.world_size, fs.unit, list(fs.positions),
                          fs.samples), ("fj", 0, world, "indices", [6, 6], n))
        self.assertEqual(self.ck.feed_state("fj", "s1"), fs)
        self.assertEqual(self.ck.latest("fj").feed_state, fs)
        # The job goes on into epoch 1, then is restored.
        for r in range(world):
            self.c.report_progress("fj", r, 0, n // world)
        self.c.report_progress("fj", 0, 1, 4)
        self.assertEqual(self.c.get_epoch("fj").epoch, 1)
        resp = self.ck.restore("fj", "s1")
        self.assertEqual((resp.feed_job, resp.epoch, resp.world_size), ("fj", 0, world))
        e = self.c.get_epoch("fj")
        self.assertEqual((e.epoch, [r.position for r in e.ranks]), (0, [6, 6]))
        # Twice is harmless.
        self.ck.restore("fj", "s1")
        self.assertEqual([r.position for r in self.c.get_epoch("fj").ranks], [6, 6])

    def test_restore_bad_input(self):
        n = 20
        self.sampler("bj", n)
        # Not COMPLETE.
        self.ck.begin("bj", "w", step=1, world_size=1, feed_job="bj")
        with self.assertRaises(grpc.RpcError) as cm:
            self.ck.restore("bj", "w")
        self.assertEqual(cm.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        # Unknown.
        with self.assertRaises(grpc.RpcError) as cm:
            self.ck.restore("bj", "nope")
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)
        # Without a feed state.
        self.ck.begin("bj", "nf", step=2, world_size=1, no_feed=True)
        self.ck.save_state_dict("bj", "nf", 0, {"a": 1})
        self.ck.commit("bj", "nf")
        self.assertIsNone(self.ck.feed_state("bj", "nf"))
        with self.assertRaises(grpc.RpcError) as cm:
            self.ck.restore("bj", "nf")
        self.assertEqual(cm.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("nf", cm.exception.details())
        with self.assertRaises(ValueError):
            self.ck.restore("bj", "nf", world_size=-1)
        with self.assertRaises(ValueError):
            self.ck.restore("bj", "nf", mesh={"dp": 1})

    def test_restore_after_the_dataset_changed(self):
        n = 40
        self.batch_job("chg", n, 1)
        self.ck.begin("chg", "s", step=1, world_size=1, feed_job="chg", auto_commit=True)
        self.ck.save_state_dict("chg", "s", 0, {},
                                data_position={"epoch": 0, "position": 1, "world_size": 1})
        fs = self.complete("chg", "s").feed_state
        self.assertEqual(fs.unit, "batches")
        self.assertEqual(len(fs.lengths_sha256), 64)
        # Other lengths under the same names: the checkpoint's batches no longer exist.
        self.c.delete_job("chg")
        self.c.upload_lengths("chg-tok", [2 + (i * 13) % 90 for i in range(n)])
        self.c.create_job("chg", "chg-tok", 1, seed=1, batching=BATCHING)
        self.c.report_progress("chg", 0, 0, 2)
        before = self.c.get_epoch("chg")
        with self.assertRaises(grpc.RpcError) as cm:
            self.ck.restore("chg", "s")
        self.assertEqual(cm.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("length", cm.exception.details())
        self.assertEqual(self.c.get_epoch("chg"), before)

    def test_ranks_disagree_on_the_epoch(self):
        n, world = 40, 2
        self.sampler("dis", n, world=world)
        self.ck.begin("dis", "s", step=1, world_size=world, feed_job="dis")
        for r, e in ((0, 0), (1, 1)):
            self.ck.save_state_dict("dis", "s", r, {"r": r},
                                    data_position={"epoch": e, "position": 0,
                                                   "world_size": world})
        with self.assertRaises(grpc.RpcError) as cm:
            self.ck.commit("dis", "s")
        self.assertIn("epoch", cm.exception.details())
        self.assertEqual(self.ck.get("dis", "s").state, WRITING)


# Forks of this process by os.fork() (what torch's "fork" workers use) while _FORKS[0] is set.
_FORKS = [False, 0]


def _count_fork():
    if _FORKS[0]:
        _FORKS[1] += 1


os.register_at_fork(before=_count_fork)


class ManagerBase(Base):
    def managers(self, job_or_data, world, **kw):
        if isinstance(job_or_data, list):
            return [st.CheckpointManager(d, rank=r, world_size=world, address=self.d.addr, **kw)
                    for r, d in enumerate(job_or_data)]
        return [st.CheckpointManager(job_or_data, rank=r, world_size=world,
                                     address=self.d.addr, **kw) for r in range(world)]


def model_state(seed):
    g = torch.Generator().manual_seed(seed)
    m = torch.nn.Linear(4, 3)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m(torch.randn(2, 4, generator=g)).sum().backward()
    opt.step()
    return {"model": m.state_dict(), "opt": opt.state_dict(),
            "rng": torch.Generator().manual_seed(seed).get_state(), "step": seed}


def assert_state_equal(test, got, want, path="state"):
    if isinstance(want, torch.Tensor):
        test.assertTrue(isinstance(got, torch.Tensor) and got.dtype == want.dtype
                        and torch.equal(got, want), path)
    elif isinstance(want, dict):
        test.assertEqual(set(got), set(want), path)
        for k in want:
            assert_state_equal(test, got[k], want[k], "%s.%s" % (path, k))
    elif isinstance(want, (list, tuple)):
        test.assertEqual(len(got), len(want), path)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_state_equal(test, g, w, "%s.%d" % (path, i))
    else:
        test.assertEqual(got, want, path)


class ManagerTest(ManagerBase):
    def take(self, its, k):
        """Let every rank's loop take k batches; returns them per rank."""
        return [[next(it) for _ in range(k)] for it in its]

    def test_round_trip_rewinds_the_feed(self):
        n, bs, world = 60, 4, 3
        samplers = [self.sampler("rt", n, rank=r, world=world, drop_last=True)
                    for r in range(world)]
        loaders = [st.DataLoader(list(range(n)), batch_size=bs, sampler=s, num_workers=2)
                   for s in samplers]
        mgrs = self.managers(loaders, world, keep_last=2)
        self.assertIsNone(mgrs[0].latest_step())
        for m in mgrs:
            self.assertIsNone(m.restore())     # nothing yet
        its = [iter(ld) for ld in loaders]
        self.take(its, 2)
        states = [model_state(r) for r in range(world)]
        for m, s in zip(mgrs, states):
            m.save(2, s)
            self.assertIsNotNone(m.last_stall)
        # The state is copied when save() returns: changing it now changes nothing saved.
        for s in states:
            s["model"]["weight"].add_(1.0)
        for m in mgrs:
            m.wait()
        ck = self.complete("rt", "step_2")
        self.assertEqual(list(ck.feed_state.positions), [2 * bs] * world)
        self.assertEqual(mgrs[1].latest_step(), 2)
        after = self.take(its, 2)          # what follows the checkpoint
        for it in its:
            it.close()
        # The run dies; new samplers attach (the job is further on), the managers restore.
        samplers = [self.sampler("rt", n, rank=r, world=world, drop_last=True)
                    for r in range(world)]
        loaders = [st.DataLoader(list(range(n)), batch_size=bs, sampler=s) for s in samplers]
        mgrs2 = self.managers(loaders, world)
        for r, m in enumerate(mgrs2):
            got = m.restore()
            want = model_state(r)
            assert_state_equal(self, got, want)
            self.assertEqual(m.restored_step, 2)
            self.assertEqual(samplers[r].epoch, 0)
        its = [iter(ld) for ld in loaders]
        again = self.take(its, 2)
        for r in range(world):
            for a, b in zip(after[r], again[r]):
                self.assertTrue(torch.equal(a, b), "rank %d resumes after the checkpoint" % r)
        for it in its:
            it.close()
        for m in mgrs + mgrs2:
            m.close()

    def test_workers_start_without_forking_the_trainer(self):
        # torch forks DataLoader workers at every epoch; a fork of this process runs grpcio's
        # pthread_atfork handlers, which sometimes never return (a rank hung at an epoch start
        # with its checkpoint upload in flight, until gloo timed out). sluice.torch.DataLoader
        # starts them from a fork server: 3 epochs, each begun while a save uploads, and no
        # fork here; an explicit multiprocessing_context is kept.
        n, bs = 24, 4
        s = self.sampler("nofork", n)
        loader = st.DataLoader(list(range(n)), batch_size=bs, sampler=s, num_workers=2)
        self.assertEqual(loader.multiprocessing_context.get_start_method(), "forkserver")
        mgr = st.CheckpointManager(loader, address=self.d.addr)
        _FORKS[:] = [True, 0]
        try:
            for epoch in range(3):
                s.set_epoch(epoch)
                got = sorted(int(i) for b in loader for i in b)
                self.assertEqual(got, list(range(n)), "epoch %d" % epoch)
                mgr.save(epoch + 1, model_state(epoch))
            mgr.wait()
        finally:
            _FORKS[0] = False
        self.assertEqual(_FORKS[1], 0, "the trainer process forked")
        self.complete("nofork", "step_3")
        mgr.close()
        forked = st.DataLoader(list(range(n)), batch_size=bs, num_workers=2,
                               multiprocessing_context="fork")
        self.assertEqual(forked.multiprocessing_context.get_start_method(), "fork")

    def test_restore_across_epochs_batch_job(self):
        # A checkpoint of epoch 0 restored while the job is in epoch 2: the sampler serves
        # epoch 0 again from the checkpoint's batch on.
        n, world = 80, 2
        self.batch_job("xe", n, world)
        samplers = [st.BatchSampler(num_replicas=world, rank=r, job="xe", address=self.d.addr)
                    for r in range(world)]
        loaders = [st.DataLoader(list(range(n)), batch_sampler=b) for b in samplers]
        mgrs = self.managers(loaders, world)
        its = [iter(ld) for ld in loaders]
        self.take(its, 1)
        for r, m in enumerate(mgrs):
            m.save(1, {"r": r})
        for m in mgrs:
            m.wait()
        self.complete("xe", "step_1")
        rest = [list(it) for it in its]        # epoch 0 to its end
        for _ in range(2):                     # epochs 1 and 2 go by
            its = [iter(ld) for ld in loaders]
            for it in its:
                list(it)
        self.assertEqual(self.c.get_epoch("xe").epoch, 3)
        for r, m in enumerate(mgrs):
            self.assertEqual(m.restore(), {"r": r})
            self.assertEqual(samplers[r].epoch, 0)
            self.assertEqual(m.data.data_position()["position"], 1)
        self.assertEqual(self.c.get_epoch("xe").epoch, 0)
        its = [iter(ld) for ld in loaders]
        for r in range(world):
            got = list(its[r])
            self.assertEqual([b.tolist() for b in got], [b.tolist() for b in rest[r]])
        for m in mgrs:
            m.close()

    def test_restore_into_another_world(self):
        # Saved by 3 ranks mid-epoch, restored by 2 (the managers come first, the samplers
        # after): the rest of the epoch is served once over the 2 ranks.
        n, bs = 48, 4
        samplers = [self.sampler("rw", n, rank=r, world=3, drop_last=True) for r in range(3)]
        loaders = [st.DataLoader(list(range(n)), batch_size=bs, sampler=s) for s in samplers]
        mgrs = self.managers(loaders, 3)
        its = [iter(ld) for ld in loaders]
        before = [i for r in self.take(its, 2) for b in r for i in b.tolist()]
        for r, m in enumerate(mgrs):
            m.save(7, {"r": r})
        for m in mgrs:
            m.close()
        self.complete("rw", "step_7")
        self.take(its, 1)                  # progress after the checkpoint: discarded
        for it in its:
            it.close()
        mgrs2 = self.managers("rw", 2)
        states = [m.restore() for m in mgrs2]
        self.assertEqual(states, [{"r": 0}, {"r": 1}])   # rank r loads shard r mod 3
        self.assertEqual(self.c.get_job("rw").world_size, 2)
        samplers = [self.sampler("rw", n, rank=r, world=2, drop_last=True) for r in range(2)]
        for m, s in zip(mgrs2, samplers):
            m.data = s
        rest = [i for s in samplers for i in s]
        self.assertEqual(sorted(before + rest), sorted(
            i for r in range(3) for i in torch_order(n, r, 0, True, 0, 3)))
        self.assertEqual(len(before + rest), len(set(before + rest)))
        for m in mgrs2:
            m.close()

    def test_restore_after_a_resize(self):
        # 3 ranks take a batch each, the job is resized to 2 mid-epoch (the rest redistributed),
        # 2 ranks take a batch each of their elastic shares and save, then one more (discarded
        # by the restore). Restored, they finish the epoch: every sample exactly once.
        n, bs = 48, 4
        seen = []
        for r in range(3):
            s = self.sampler("ar", n, rank=r, world=3, drop_last=True)
            it = iter(s)
            seen += [next(it) for _ in range(bs)]
            s.report(bs)          # consumed (the progress a resize redistributes after)
            it.close()
        self.c.resize_job("ar", 2)
        s2 = [self.sampler("ar", n, rank=r, world=2, drop_last=True) for r in range(2)]
        loaders = [st.DataLoader(list(range(n)), batch_size=bs, sampler=s) for s in s2]
        mgrs = self.managers(loaders, 2)
        its = [iter(ld) for ld in loaders]
        seen += [i for r in self.take(its, 1) for b in r for i in b.tolist()]
        for r, m in enumerate(mgrs):
            m.save(5, {"r": r})
        for m in mgrs:
            m.close()
        fs = self.complete("ar", "step_5").feed_state
        self.assertTrue(fs.elastic)
        self.assertEqual((fs.world_size, list(fs.positions)), (2, [bs, bs]))
        self.take(its, 1)
        for it in its:
            it.close()
        s2 = [self.sampler("ar", n, rank=r, world=2, drop_last=True) for r in range(2)]
        for r, m in enumerate(self.managers(s2, 2)):
            self.assertEqual(m.restore(), {"r": r})
        rest = [i for s in s2 for i in s]
        self.assertEqual(sorted(seen + rest), sorted(
            i for r in range(3) for i in torch_order(n, r, 0, True, 0, 3)))
        self.assertEqual(len(seen + rest), len(set(seen + rest)))
        self.assertEqual(self.c.get_epoch("ar").epoch, 1)

    def test_keep_last_and_latest(self):
        world = 2
        samplers = [self.sampler("kl", 30, rank=r, world=world) for r in range(world)]
        mgrs = self.managers(samplers, world, keep_last=2)
        for step in (1, 2, 3, 4, 5):
            for r, m in enumerate(mgrs):
                m.save(step, {"step": step, "w": torch.full((3,), float(r))})
            for m in mgrs:
                m.wait()
            self.complete("kl", "step_%d" % step)
        poll(lambda: mgrs[0].all_steps() == [4, 5], "retention down to steps 4 and 5")
        self.assertEqual(mgrs[1].latest_step(), 5)
        for r, m in enumerate(mgrs):
            state = m.restore(step=4)
            self.assertEqual(state["step"], 4)
            self.assertTrue(torch.equal(state["w"], torch.full((3,), float(r))))
        with self.assertRaises(st.CheckpointError) as cm:
            mgrs[0].restore(step=1)
        self.assertIn("step_1", str(cm.exception))
        for m in mgrs:
            m.close()

    def test_reserve_and_context(self):
        # reserve() allocates the buffers the saves copy into; a save copies, nothing more.
        s = self.sampler("res", 10)
        state = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2, dtype=torch.int64),
                 "n": 3}
        with st.CheckpointManager(s, address=self.d.addr, rank=0, world_size=1) as m:
            m.reserve(state)
            bufs = [b.data_ptr() for b in m._staged]
            m.save(1, state)
            self.assertEqual([b.data_ptr() for b in m._staged], bufs)
            state["w"].mul_(2)
            m.save(2, state)
            self.assertEqual([b.data_ptr() for b in m._staged], bufs)
        self.assertIsNotNone(m.last_upload)
        self.complete("res", "step_2")
        # The manager's checkpoints are DCP checkpoints: dcp.load reads them into a template.
        for step, scale in ((1, 1), (2, 2)):
            got = {"w": torch.zeros(2, 3), "b": torch.zeros(2, dtype=torch.int64), "n": 0}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")      # "assuming ... a single process"
                dcp.load(got, storage_reader=sluice.torch.dcp.Reader(
                    "sluice://res/%d" % step, address=self.d.addr))
            self.assertTrue(torch.equal(got["w"], scale * torch.arange(6.0).reshape(2, 3)))
            self.assertTrue(torch.equal(got["b"], torch.ones(2, dtype=torch.int64)))
            self.assertEqual(got["n"], 3)
        with self.assertRaises(ValueError):
            st.CheckpointManager(s, address=self.d.addr, rank=0, world_size=1,
                                 reuse_buffers=False).reserve(state)
        # restore(state_dict=...) allocates them in the background (with a checkpoint to load,
        # and on a fresh start with none): the first save copies into them.
        for job, n in (("res", 10), ("res-fresh", 10)):
            s2 = s if job == "res" else self.sampler(job, n)
            with st.CheckpointManager(s2, address=self.d.addr, rank=0, world_size=1) as m:
                got = {"w": torch.zeros(2, 3), "b": torch.zeros(2, dtype=torch.int64), "n": 0}
                out = m.restore(state_dict=got)
                self.assertIs(out, None if job == "res-fresh" else got)
                m._reserved()
                self.assertEqual(m._staged_key, [(torch.float32, (2, 3), False),
                                                 (torch.int64, (2,), False)])
                bufs = [b.data_ptr() for b in m._staged]
                m.save(3, got)
                self.assertEqual([b.data_ptr() for b in m._staged], bufs)

    def test_one_save_in_flight_and_every_rng_state(self):
        # The next save() waits for the upload in flight; the state may hold every RNG state a
        # training loop keeps (torch's, numpy's, Python's) and, with allow_pickle, any object.
        import random
        import threading

        import numpy as np
        s = self.sampler("inflight", 10)
        m = st.CheckpointManager(s, address=self.d.addr, rank=0, world_size=1, allow_pickle=True)
        gate, entered = threading.Event(), threading.Event()
        upload = m._upload

        def held_upload(*args):
            entered.set()
            if not gate.wait(30):
                raise RuntimeError("the test never opened the gate")
            return upload(*args)
        m._upload = held_upload
        random.seed(3)
        np.random.seed(4)
        torch.manual_seed(5)
        state = {"py": random.getstate(), "np": np.random.get_state(),
                 "torch": torch.get_rng_state(), "obj": _Opaque(7), "np_scalar": np.float32(1.5)}
        m.save(1, state)
        self.assertTrue(entered.wait(10), "the upload of step 1 started")
        second = threading.Thread(target=m.save, args=(2, {"n": 2}))
        second.start()
        second.join(0.5)
        self.assertTrue(second.is_alive(), "save(2) waits while step 1 uploads")
        gate.set()
        second.join(30)
        self.assertFalse(second.is_alive(), "save(2) returned once step 1 was durable")
        m.wait()
        self.complete("inflight", "step_1")
        self.complete("inflight", "step_2")
        want = (random.random(), np.random.random(), torch.rand(1))
        got = m.restore(step=1)
        random.setstate(got["py"])
        np.random.set_state(got["np"])
        torch.set_rng_state(got["torch"])
        self.assertEqual((random.random(), np.random.random()), want[:2])
        self.assertTrue(torch.equal(torch.rand(1), want[2]))
        self.assertEqual((type(got["obj"]), got["obj"].v), (_Opaque, 7))
        self.assertIs(type(got["np_scalar"]), np.float32)
        # Without allow_pickle the pickled object is refused, naming where it is.
        plain = st.CheckpointManager(s, address=self.d.addr, rank=0, world_size=1)
        with self.assertRaisesRegex(ValueError, r"item obj of inflight/step_1 is a pickle"):
            plain.restore(step=1)
        with self.assertRaisesRegex(TypeError, r"obj: .*allow_pickle=True"):
            plain.save(3, {"obj": _Opaque(1)})
        m.close()
        plain.close()

    def test_dcp_form_and_damage(self):
        # The manager's checkpoint is DCP's: every rank's shard ends in its part of the
        # metadata. Restored without a template, the optimizer's int keys come back as ints (DCP
        # str()s them); a key every rank saved whole comes from the loading rank's shard. A
        # damaged byte in a footer or an item is refused (the daemon's block digests:
        # DATA_LOSS), and a checkpoint of the older state format still restores.
        world = 2
        mgrs = self.managers("dform", world)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.Adam(model.parameters())
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        for r, m in enumerate(mgrs):
            m.save(1, {"model": model.state_dict(), "opt": opt.state_dict(), "rank": r,
                       "pair": (r, "x"), "empty": {}})
        for m in mgrs:
            m.wait()
        ck = self.complete("dform", "step_1")
        for r, m in enumerate(mgrs):
            got = m.restore()
            self.assertEqual((got["rank"], got["pair"], got["empty"]), (r, (r, "x"), {}))
            assert_state_equal(self, got["model"], model.state_dict())
            fresh = torch.optim.Adam(torch.nn.Linear(3, 2).parameters())
            fresh.load_state_dict(got["opt"])          # int parameter ids, as saved
            assert_state_equal(self, fresh.state_dict(), opt.state_dict())
        size = {sh.rank: sh.file_size for sh in ck.shards}
        self.d.store_flip("dform", "step_1_shard_1.shard", size[1] - 30)   # rank 1's footer
        with self.assertRaises(grpc.RpcError) as cm:
            mgrs[0].restore()
        self.assertEqual(cm.exception.code(), grpc.StatusCode.DATA_LOSS)
        for m in mgrs:
            m.save(2, {"w": torch.arange(5.0)})
        for m in mgrs:
            m.wait()
        self.complete("dform", "step_2")
        self.d.store_flip("dform", "step_2_shard_0.shard", 200)           # inside an item
        with self.assertRaises(grpc.RpcError) as cm:
            mgrs[1].restore(step=2)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.DATA_LOSS)
        # The older state format (Checkpoints.save_state_dict), bound to the feed.
        pos = mgrs[0].data.data_position() if mgrs[0].data else None
        self.assertIsNone(pos)
        self.ck.begin("dform", "step_3", step=3, world_size=world, no_feed=True)
        for r in range(world):
            self.ck.save_state_dict("dform", "step_3", r, {"old": r, "t": torch.ones(2)})
        self.ck.commit("dform", "step_3")
        for r, m in enumerate(mgrs):
            got = m.restore(step=3)
            self.assertEqual(got["old"], r)
            into = {"old": -1, "t": torch.zeros(2)}
            self.assertIs(m.restore(step=3, state_dict=into), into)
            self.assertEqual(into["old"], r)
            self.assertTrue(torch.equal(into["t"], torch.ones(2)))
        for m in mgrs:
            m.close()

    def test_bad_input(self):
        s = self.sampler("bad", 10)
        m = st.CheckpointManager(s, address=self.d.addr, rank=0, world_size=1)
        with self.assertRaises(TypeError) as cm:
            m.save(1, {"model": {"w": object()}})
        self.assertIn("model.w", str(cm.exception))
        for step in (-1, 1.5, True):
            with self.assertRaises(ValueError):
                m.save(step, {})
        with self.assertRaisesRegex(ValueError, "user_metadata"):
            m.save(1, {}, user_metadata='{"format": "sluice-dcp 1", "ranks": 1}')
        m.wait()                              # nothing was started
        self.assertIsNone(m.latest_step())
        with self.assertRaises(ValueError):
            st.CheckpointManager(s, address=self.d.addr, rank=1, world_size=2)
        with self.assertRaises(ValueError):
            st.CheckpointManager(s, address=self.d.addr, rank=0, world_size=1, keep_last=-1)
        with self.assertRaises(ValueError):
            st.CheckpointManager(None, address=self.d.addr, rank=0, world_size=1)
        with self.assertRaises(TypeError):
            st.CheckpointManager([1], address=self.d.addr, rank=0, world_size=1)
        # A checkpoint without a data position cannot rewind a feed.
        self.ck.begin("bad", "step_3", step=3, world_size=1, no_feed=True)
        self.ck.save_state_dict("bad", "step_3", 0, {"a": 1})
        self.ck.commit("bad", "step_3")
        with self.assertRaises(st.CheckpointError) as cm:
            m.restore()
        self.assertIn("data position", str(cm.exception))
        # A step saved once is not saved again.
        m.save(3, {"b": 2})
        with self.assertRaises(st.CheckpointError) as cm:
            m.wait()
        self.assertIn("COMPLETE", str(cm.exception))
        m.close()


class ManagerFailureTest(ManagerBase):
    def test_failed_upload_raises_at_the_next_call(self):
        # Step 1 completes. Step 2: rank 0's shard is durable, rank 1's upload is cut by
        # SIGKILLing sluiced and no daemon comes back within retry_seconds: rank 1's next call
        # raises, and no COMPLETE checkpoint misses a shard.
        world = 2
        samplers = [self.sampler("fail", 30, rank=r, world=world) for r in range(world)]
        mgrs = self.managers(samplers, world, retry_seconds=1.5)
        for r, m in enumerate(mgrs):
            m.save(1, {"w": torch.zeros(4)})
        for m in mgrs:
            m.wait()
        self.complete("fail", "step_1")
        mgrs[0].save(2, {"w": torch.ones(4)})
        mgrs[0].wait()
        big = {"w": torch.ones(96 << 20, dtype=torch.uint8)}  # 96 MiB: still uploading...
        mgrs[1].save(2, big)
        self.d.stop(signal.SIGKILL)                          # ...when the daemon dies
        t0 = time.monotonic()
        with self.assertRaises(st.CheckpointError) as cm:
            mgrs[1].save(3, big)
        self.assertLess(time.monotonic() - t0, 30)
        self.assertIn("step 2", str(cm.exception))
        self.assertIsInstance(cm.exception.__cause__, grpc.RpcError)
        # The error is raised once; the manager goes on.
        self.d.pin_ports()
        self.d.start()
        mgrs[1].wait()
        # The channels may still wait out their reconnect backoff from the outage.
        cks = poll(lambda: self.ck.list("fail") if self.up() else None, "sluiced back")
        for c in cks:
            if c.state == COMPLETE:
                full = self.ck.get("fail", c.name)
                self.assertEqual(sorted(s.rank for s in full.shards), list(range(world)),
                                 c.name)
                self.assertTrue(self.ck.verify("fail", c.name, deep=True).ok, c.name)
        self.assertNotEqual(self.ck.get("fail", "step_2").state, COMPLETE)
        self.assertEqual(mgrs[0].latest_step(), 1)
        for m in mgrs:
            m.close()

    def test_upload_survives_a_daemon_restart(self):
        # Within retry_seconds the upload resumes once sluiced is back, and the checkpoint
        # completes.
        world = 2
        samplers = [self.sampler("surv", 30, rank=r, world=world) for r in range(world)]
        mgrs = self.managers(samplers, world, retry_seconds=30)
        mgrs[0].save(1, {"w": torch.zeros(4)})
        mgrs[0].wait()
        mgrs[1].save(1, {"w": torch.ones(256 << 20, dtype=torch.uint8)})
        self.restart_daemon(signal.SIGKILL, down=1.0)
        mgrs[1].wait()
        self.assertGreater(mgrs[1].retries, 0)
        ck = self.complete("surv", "step_1")
        self.assertEqual(ck.shards_uploaded, world)
        self.assertTrue(self.ck.verify("surv", "step_1", deep=True).ok)
        for m in mgrs:
            m.close()


if __name__ == "__main__":
    unittest.main()
