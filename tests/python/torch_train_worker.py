"""One trainer of test_torch_train, started by torchrun: DDP (gloo, CPU) on a tiny linear model,
fed by sluice.torch's sampler and DataLoader from a real sluiced.

usage: torch_train_worker.py --addr HOST:PORT --job J --out DIR --epochs E [--mode indices|batches]
       [--samples N] [--seed S] [--drop-last] [--batch-size B] [--num-workers W]

Environment: torchrun's RANK, WORLD_SIZE, TORCHELASTIC_RESTART_COUNT, MASTER_ADDR/PORT, and

  KILL_AT=rank:epoch:step:after_step   (first attempt only) every rank logs step `step` (or
                                       "last") of `epoch`, they meet at a barrier, then `rank`
                                       SIGKILLs itself: after the optimizer step, before the
                                       next batch is requested (so before the DataLoader reports
                                       the batch consumed).
  KILL_AT=rank:epoch:last:last_batch   (first attempt only) once the last batch of `epoch` is
                                       handed to the loop, the ranks meet at a barrier and `rank`
                                       SIGKILLs itself before training it.
  PAUSE_AT=epoch:step:tag[,...]        (first attempt only) after logging step `step` (or "last")
                                       of `epoch`, each rank creates DIR/paused-<tag>-<rank> and
                                       waits until DIR/release-<tag> exists.

Every trained batch is one line of DIR/rank-<rank>.jsonl, written, flushed and fsynced right after
opt.step(): {"rank", "restart", "epoch", "sampler_epoch", "step", "i", "idx", "len", "t"} where
step is the batch's position in the epoch (indices mode: from torch's DistributedSampler order for
the same seed and epoch, -1 if the batch is not a batch-aligned slice of it; batches mode: the
count of batches in this iteration on the first attempt, else -1) and i counts the iteration's
batches. Before the first batch of an iteration: {"rank", "restart", "begin": true, "epoch",
"start" (the sampler's start_position), "t"}. At the end: {"rank", "restart", "done": true,
"epoch", "t", "reconnects", "retries"}.
Before building its sampler a rank creates DIR/started-<rank>-<restart>.
"""
import argparse
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
from torch.utils.data import DistributedSampler as TorchSampler

import sluice.torch as st
from sltest import rank_address
from torchrun_group import init_gloo

PAUSE_LIMIT = 180.0  # seconds a paused rank waits for its release before it gives up


class Indexed(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def parse_kill(spec):
    if not spec:
        return None
    rank, epoch, step, when = spec.split(":")
    if when not in ("after_step", "last_batch"):
        raise SystemExit("bad KILL_AT %r" % spec)
    return int(rank), int(epoch), (None if step == "last" else int(step)), when


def parse_pauses(spec):
    out = []
    for part in filter(None, (spec or "").split(",")):
        epoch, step, tag = part.split(":")
        out.append((int(epoch), None if step == "last" else int(step), tag))
    return out


class Trainer:
    def __init__(self, args):
        self.args = args
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        first = self.restart == 0
        self.kill = parse_kill(os.environ.get("KILL_AT")) if first else None
        self.pauses = parse_pauses(os.environ.get("PAUSE_AT")) if first else []
        self.log = open(os.path.join(args.out, "rank-%d.jsonl" % self.rank), "a")
        self.orders = {}
        self.slow = float(os.environ.get("SLUICE_SLOWDOWN", "1"))

    def marker(self, name):
        with open(os.path.join(self.args.out, name), "w") as f:
            f.write("%d\n" % os.getpid())

    def order(self, epoch):
        """This rank's share in `epoch` as torch's own DistributedSampler orders it."""
        if epoch not in self.orders:
            ts = TorchSampler(range(self.args.n), num_replicas=self.world, rank=self.rank,
                              shuffle=True, seed=self.args.seed, drop_last=self.args.drop_last)
            ts.set_epoch(epoch)
            self.orders[epoch] = list(ts)
        return self.orders[epoch]

    def step_of(self, epoch, idx, i):
        if self.args.mode == "batches":
            return i if self.restart == 0 else -1
        order, bs = self.order(epoch), self.args.batch_size
        for k in range(0, len(order), bs):
            if order[k:k + bs] == idx:
                return k // bs
        return -1

    def write(self, rec):
        self.log.write(json.dumps(rec) + "\n")
        self.log.flush()
        os.fsync(self.log.fileno())

    def pause(self, epoch, step, last):
        for pe, ps, tag in self.pauses:
            if pe == epoch and (ps == step or (ps is None and last)):
                self.marker("paused-%s-%d" % (tag, self.rank))
                release = os.path.join(self.args.out, "release-" + tag)
                deadline = time.monotonic() + PAUSE_LIMIT
                while not os.path.exists(release):
                    if time.monotonic() > deadline:
                        print("rank %d: no release-%s" % (self.rank, tag), file=sys.stderr)
                        os._exit(3)
                    time.sleep(0.02)

    def maybe_kill(self, when, epoch, step, last):
        if self.kill is None:
            return
        krank, kepoch, kstep, kwhen = self.kill
        if kwhen != when or kepoch != epoch:
            return
        if when == "last_batch" and not last:
            return
        if when == "after_step" and not (kstep == step or (kstep is None and last)):
            return
        # Every rank gets here (DDP lockstep) before the victim dies: the logs of the attempt do
        # not depend on how fast torchrun stops the others.
        dist.barrier()
        if self.rank == krank:
            print("rank %d: SIGKILL at epoch %d step %s (%s)" % (self.rank, epoch, step, when),
                  file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def run(self):
        a = self.args
        # A rank left alone in a collective (the ranks fell out of lockstep) fails after this.
        init_gloo(timedelta(seconds=60 * self.slow))
        ds = Indexed(a.n)
        self.marker("started-%d-%d" % (self.rank, self.restart))
        # REPORT_LAG: the loader's report_lag (its default when unset).
        lag = {"report_lag": int(os.environ["REPORT_LAG"])} if "REPORT_LAG" in os.environ else {}
        if a.mode == "indices":
            sampler = st.DistributedSampler(ds, shuffle=True, seed=a.seed, drop_last=a.drop_last,
                                            job=a.job, address=a.addr)
            loader = st.DataLoader(ds, batch_size=a.batch_size, sampler=sampler,
                                   num_workers=a.num_workers, **lag)
        else:
            sampler = st.BatchSampler(job=a.job, address=a.addr)
            loader = st.DataLoader(ds, batch_sampler=sampler, num_workers=a.num_workers, **lag)
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for epoch in range(sampler.epoch, a.epochs):
            sampler.set_epoch(epoch)
            nbatches = len(loader)
            for i, (x, y, idx) in enumerate(loader):
                if i == 0:
                    self.write({"rank": self.rank, "restart": self.restart, "begin": True,
                                "epoch": epoch, "start": getattr(sampler, "start_position", None),
                                "t": time.time()})
                idx = [int(v) for v in idx]
                step = self.step_of(epoch, idx, i)
                last = step == nbatches - 1
                self.maybe_kill("last_batch", epoch, step, last)
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                self.write({"rank": self.rank, "restart": self.restart, "epoch": epoch,
                            "sampler_epoch": sampler.epoch, "step": step, "i": i, "idx": idx,
                            "len": nbatches, "t": time.time()})
                self.pause(epoch, step, last)
                self.maybe_kill("after_step", epoch, step, last)
        self.write({"rank": self.rank, "restart": self.restart, "done": True,
                    "epoch": sampler.epoch, "t": time.time(),
                    "reconnects": getattr(sampler, "reconnects", None),
                    "retries": getattr(sampler, "retries", None)})
        dist.barrier()
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--addr", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--mode", choices=("indices", "batches"), default="indices")
    p.add_argument("--samples", type=int, default=100, dest="n")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--drop-last", action="store_true")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-workers", type=int, default=0)
    a = p.parse_args()
    a.addr = rank_address(a.addr, int(os.environ["RANK"]))  # the replicas, spread over ranks
    Trainer(a).run()


if __name__ == "__main__":
    main()
