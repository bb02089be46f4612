"""One trainer of test_torch_ckpt_train, started by torchrun: DDP (gloo, CPU, deterministic) on a
tiny model with dropout, SGD with momentum and a step LR schedule, fed by sluice.torch's sampler
and DataLoader from a real sluiced, checkpointed asynchronously by sluice.torch.CheckpointManager
every K steps and restored from the latest checkpoint when torchrun restarts it.

usage: torch_ckpt_worker.py --addr HOST:PORT --job J --out DIR --epochs E --every K
       [--mode indices|batches] [--samples N] [--seed S] [--drop-last] [--batch-size B]
       [--num-workers W] [--keep-last L] [--restore-first]

--restore-first builds the CheckpointManager from the job's name and restores before the sampler
exists (needed to restart into another world size); otherwise the sampler and DataLoader come
first and restore() rewinds them.

Environment: torchrun's RANK, WORLD_SIZE, TORCHELASTIC_RESTART_COUNT, MASTER_ADDR/PORT, and

  KILL_AT=rank:step[:wait]      (first attempt only) after global step `step` (its optimizer step
                                and its save, if any), every rank meets at a barrier (after
                                mgr.wait() with ":wait"), then `rank` SIGKILLs itself.
  PAUSE_UPLOAD_AT=step:tag      (first attempt only) the background upload of checkpoint `step`
                                creates DIR/paused-<tag>-<rank> and waits for DIR/release-<tag>
                                before it sends anything (training goes on meanwhile).
  SLUICE_TEST_GLOO_TIMEOUT=S    gloo's timeout (default 90 s): a collective that waits longer
                                fails the rank.

DIR/rank-<rank>.jsonl gets one line per trained step, written and fsynced right after the
optimizer step: {"rank", "restart", "world", "step" (global, from 1), "epoch", "idx"}; one line
per restore: {"restored": step or null, "restart", "epoch" (the sampler's)}; and at the end
{"done": true, "restart"}. DIR/final-<rank>.pt holds the model's parameters at the end.
"""
import argparse
import faulthandler
import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset

import sluice.torch as st
from sluice.checkpoint import Checkpoints
from sltest import rank_address
from torchrun_group import init_gloo

PAUSE_LIMIT = 120.0


class Indexed(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


class PausingCheckpoints(Checkpoints):
    """Checkpoints whose upload of one step waits for a release file (PAUSE_UPLOAD_AT)."""

    def __init__(self, address, out, rank, step, tag):
        super().__init__(address)
        self.out, self.rank, self.name, self.tag = out, rank, "step_%d" % step, tag
        self.paused = False

    def upload(self, job, name, rank, source, **kw):
        if name == self.name and not self.paused:
            self.paused = True
            with open(os.path.join(self.out, "paused-%s-%d" % (self.tag, self.rank)), "w"):
                pass
            release = os.path.join(self.out, "release-" + self.tag)
            deadline = time.monotonic() + PAUSE_LIMIT
            while not os.path.exists(release):
                if time.monotonic() > deadline:
                    os._exit(3)
                time.sleep(0.02)
        return super().upload(job, name, rank, source, **kw)


class Trainer:
    def __init__(self, a):
        self.a = a
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        first = self.restart == 0
        kill = os.environ.get("KILL_AT") if first else ""
        self.kill = None
        if kill:
            parts = kill.split(":")
            self.kill = (int(parts[0]), int(parts[1]), parts[2:] == ["wait"])
        pause = os.environ.get("PAUSE_UPLOAD_AT") if first else ""
        self.pause = (int(pause.split(":")[0]), pause.split(":")[1]) if pause else None
        self.log = open(os.path.join(a.out, "rank-%d.jsonl" % self.rank), "a")

    def write(self, rec):
        rec.update(rank=self.rank, restart=self.restart, world=self.world)
        self.log.write(json.dumps(rec) + "\n")
        self.log.flush()
        os.fsync(self.log.fileno())

    def data(self, ds):
        a = self.a
        # The DataLoader gets its own generator: torch draws the workers' base seed from the
        # global RNG at every iter() otherwise, and a restart resumes mid-epoch, where the
        # uninterrupted run drew nothing; the dropout RNG would differ from there on.
        gen = torch.Generator().manual_seed(1)
        if a.mode == "indices":
            sampler = st.DistributedSampler(ds, shuffle=True, seed=a.seed, drop_last=a.drop_last,
                                            job=a.job, address=a.addr)
            loader = st.DataLoader(ds, batch_size=a.batch_size, sampler=sampler,
                                   num_workers=a.num_workers, generator=gen)
        else:
            sampler = st.BatchSampler(job=a.job, address=a.addr)
            loader = st.DataLoader(ds, batch_sampler=sampler, num_workers=a.num_workers,
                                   generator=gen)
        return sampler, loader

    def run(self):
        a = self.a
        gloo = float(os.environ.get("SLUICE_TEST_GLOO_TIMEOUT") or 90)
        init_gloo(timedelta(seconds=gloo))
        torch.manual_seed(0)
        torch.use_deterministic_algorithms(True)
        ds = Indexed(a.n)
        ck = None
        if self.pause:
            ck = PausingCheckpoints(a.addr, a.out, self.rank, *self.pause)
        if a.restore_first:
            mgr = st.CheckpointManager(a.job, address=a.addr, keep_last=a.keep_last,
                                       checkpoints=ck)
        else:
            sampler, loader = self.data(ds)
            mgr = st.CheckpointManager(loader, keep_last=a.keep_last, checkpoints=ck)
        model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(),
                                    torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.8)
        step = 0
        state = mgr.restore()
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            sched.load_state_dict(state["sched"])
            torch.set_rng_state(state["rng"])
            step = state["step"]
        if a.restore_first:
            sampler, loader = self.data(ds)
            mgr.data = loader
        self.write({"restored": mgr.restored_step, "epoch": sampler.epoch,
                    "position": sampler.data_position()["position"]})
        # find_unused_parameters=True keeps DDP's initial gradient buckets: by default DDP
        # re-buckets after its first step, so a group restarted mid-run all-reduces its first
        # step in another layout than the uninterrupted run did at that step (gloo's ring sums
        # each element in an order that depends on its offset): the same math, other rounding.
        ddp = DDP(model, find_unused_parameters=True)
        for epoch in range(sampler.epoch, a.epochs):
            sampler.set_epoch(epoch)
            for x, y, idx in loader:
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(ddp(x), y)
                loss.backward()
                opt.step()
                sched.step()
                step += 1
                self.write({"step": step, "epoch": epoch, "idx": [int(i) for i in idx]})
                if step % a.every == 0:
                    mgr.save(step, {"model": model.state_dict(), "opt": opt.state_dict(),
                                    "sched": sched.state_dict(), "rng": torch.get_rng_state(),
                                    "step": step})
                self.maybe_kill(step, mgr)
        mgr.close()
        torch.save({k: v.clone() for k, v in model.state_dict().items()},
                   os.path.join(a.out, "final-%d.pt" % self.rank))
        self.write({"done": True, "step": step})
        dist.barrier()
        dist.destroy_process_group()

    def maybe_kill(self, step, mgr):
        if self.kill is None or self.kill[1] != step:
            return
        krank, _, wait = self.kill
        if wait:
            mgr.wait()
        dist.barrier()
        if self.rank == krank:
            print("rank %d: SIGKILL after step %d" % (self.rank, step), file=sys.stderr,
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    # The test's watchdog sends SIGUSR1 when training stalls: every thread's stack goes to this
    # rank's stderr (and its DataLoader workers', which inherit the handler), before gloo's
    # timeout ends the run.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    p = argparse.ArgumentParser()
    p.add_argument("--addr", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--mode", choices=("indices", "batches"), default="indices")
    p.add_argument("--samples", type=int, default=96, dest="n")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--drop-last", action="store_true")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--keep-last", type=int, default=None)
    p.add_argument("--restore-first", action="store_true")
    a = p.parse_args()
    a.addr = rank_address(a.addr, int(os.environ["RANK"]))  # the replicas, spread over ranks
    Trainer(a).run()


if __name__ == "__main__":
    main()
