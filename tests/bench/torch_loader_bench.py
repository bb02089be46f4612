"""The PyTorch drop-in against torch's own sampler, side by side in one run: one epoch of a
DataLoader over a map-style dataset with

  torch      torch.utils.data.DataLoader + torch.utils.data.DistributedSampler (the peer)
  sluice     torch.utils.data.DataLoader + sluice.torch.DistributedSampler (reports at the end)
  sluice+dl  sluice.torch.DataLoader + sluice.torch.DistributedSampler (reports every step)

with a real sluiced on loopback, world 1 (rank 0's share), num_workers 0 and 2. It prints the
median epoch time and per-step time of each, and their ratio to torch. The per-step report of
sluice+dl is a synchronous ReportProgress (group-committed by the daemon, one fsync each here).

    torch_loader_bench.py [--samples N] [--batch B] [--runs R] [--workers W,...] [--smoke]

Needs SLUICED and PYTHONPATH as ctest sets them (build/python and tests/python).
"""
import argparse
import statistics
import time

import torch
import torch.utils.data as tud

import sluice.torch as st
from sltest import Daemon


class Tensors(tud.Dataset):
    def __init__(self, n):
        self.x = torch.arange(n, dtype=torch.float32)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i]


def epoch_seconds(loader):
    t0 = time.perf_counter()
    steps = sum(1 for _ in loader)
    return time.perf_counter() - t0, steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.samples, a.runs, a.workers = 2000, 1, "0"
    ds = Tensors(a.samples)
    with Daemon(args=["--log-level", "warn"]) as d:
        for workers in [int(w) for w in a.workers.split(",")]:
            kw = dict(batch_size=a.batch, num_workers=workers)
            ts = tud.DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
            s1 = st.DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0,
                                       address=d.addr, job="plain%d" % workers)
            s2 = st.DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0,
                                       address=d.addr, job="dl%d" % workers)
            loaders = {"torch": tud.DataLoader(ds, sampler=ts, **kw),
                       "sluice": tud.DataLoader(ds, sampler=s1, **kw),
                       "sluice+dl": st.DataLoader(ds, sampler=s2, **kw)}
            times = {k: [] for k in loaders}
            steps = {}
            for r in range(a.runs):
                for name, loader in loaders.items():  # interleaved: same machine state
                    if name == "torch":
                        ts.set_epoch(r)
                    secs, steps[name] = epoch_seconds(loader)
                    times[name].append(secs)
            base = statistics.median(times["torch"])
            for name in loaders:
                m = statistics.median(times[name])
                print("N=%d batch=%d workers=%d %-9s epoch %.3f s  %.1f us/step  "
                      "ratio to torch %.2f" % (a.samples, a.batch, workers, name, m,
                                               m / max(steps[name], 1) * 1e6, m / base))


if __name__ == "__main__":
    main()
