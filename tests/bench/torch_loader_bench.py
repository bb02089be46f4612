"""The PyTorch drop-in against torch's and torchdata's loaders, side by side in one run: epochs of
a map-style dataset with a real model step of about --step-ms per batch (an MLP's forward,
backward and SGD, on --device: cpu, or cuda on a GPU machine), through

  torch        torch.utils.data.DataLoader + torch.utils.data.DistributedSampler (the peer)
  sluice       torch.utils.data.DataLoader + sluice.torch.DistributedSampler (reports at the end)
  sluice+dl    sluice.torch.DataLoader + sluice.torch.DistributedSampler (a report every step,
               in the background: report_lag 8)
  sluice+dl/0  the same with report_lag=0 (every report waited for before the next batch)
  sdl          torchdata's StatefulDataLoader + StatefulDistributedSampler (the peer)
  sdl+sluice   StatefulDataLoader + sluice.torch.DistributedSampler

with a real sluiced on loopback, world 1 (rank 0's share), for each --workers count. It prints
the median epoch time and time per step of each, and the ratio of each sluice row to its peer
(torch's loader for the first three, StatefulDataLoader for the last).

    torch_loader_bench.py [--samples N] [--batch B] [--step-ms MS] [--runs R] [--workers W,...]
                          [--device cpu|cuda] [--smoke]

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


class Step:
    """A training step of about `ms` milliseconds on `device`: an MLP of 256-wide Linear+Tanh
    layers, forward, backward and SGD on the batch (each sample spread over the width), its
    depth measured once; on a GPU it waits for the step (as a loss.item() would)."""

    def __init__(self, ms, device="cpu"):
        self.device = torch.device(device)
        self.model = None
        if ms <= 0:
            return
        per = self._probe(8)
        depth = max(1, round(ms / 1e3 / per))
        self._build(depth)
        self.depth = depth

    def _build(self, depth):
        layers = []
        for _ in range(depth):
            layers += [torch.nn.Linear(256, 256), torch.nn.Tanh()]
        self.model = torch.nn.Sequential(*layers).to(self.device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)

    def _probe(self, depth):
        self._build(depth)
        x = torch.rand(64)
        for _ in range(5):
            self(x)
        t0, k = time.perf_counter(), 30
        for _ in range(k):
            self(x)
        return (time.perf_counter() - t0) / k / depth

    def __call__(self, batch):
        if self.model is None:
            return None
        x = batch.to(self.device, non_blocking=True).float().reshape(-1, 1).expand(-1, 256)
        x = x.contiguous()
        loss = self.model(x).square().mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return loss


def epoch_seconds(loader, step):
    t0 = time.perf_counter()
    steps = 0
    for batch in loader:
        step(batch)
        steps += 1
    return time.perf_counter() - t0, steps


def loaders(ds, d, workers, batch):
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler
    kw = dict(batch_size=batch, num_workers=workers)
    if workers:
        kw["multiprocessing_context"] = "forkserver"  # as sluice.torch.DataLoader's default

    def sampler(tag):
        return st.DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0,
                                     address=d.addr, job="%s-w%d" % (tag, workers))
    torch_sampler = tud.DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
    sdl_sampler = StatefulDistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
    return {
        "torch": (tud.DataLoader(ds, sampler=torch_sampler, **kw), torch_sampler),
        "sluice": (tud.DataLoader(ds, sampler=sampler("plain"), **kw), None),
        "sluice+dl": (st.DataLoader(ds, sampler=sampler("dl"), **kw), None),
        "sluice+dl/0": (st.DataLoader(ds, sampler=sampler("dl0"), report_lag=0, **kw), None),
        "sdl": (StatefulDataLoader(ds, sampler=sdl_sampler, **kw), sdl_sampler),
        "sdl+sluice": (StatefulDataLoader(ds, sampler=sampler("sdl"), **kw), None),
    }


PEER = {"sluice": "torch", "sluice+dl": "torch", "sluice+dl/0": "torch", "sdl+sluice": "sdl"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=64_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--step-ms", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workers", default="0,4")
    ap.add_argument("--device", default="cpu", help="where the model step runs: cpu or cuda")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.samples, a.runs, a.workers, a.step_ms = 2000, 1, "0", 0.2
    torch.manual_seed(0)
    step = Step(a.step_ms, a.device)
    ds = Tensors(a.samples)
    print("N=%d batch=%d step %.1f ms on %s (MLP of %d layers), %d runs, torch %s"
          % (a.samples, a.batch, a.step_ms, a.device, getattr(step, "depth", 0), a.runs,
             torch.__version__))
    with Daemon(args=["--log-level", "warn"]) as d:
        for workers in [int(w) for w in a.workers.split(",")]:
            rows = loaders(ds, d, workers, a.batch)
            times = {k: [] for k in rows}
            steps = {}
            for r in range(a.runs):
                for name, (loader, peer_sampler) in rows.items():  # interleaved: same state
                    if peer_sampler is not None:
                        peer_sampler.set_epoch(r)
                    secs, steps[name] = epoch_seconds(loader, step)
                    times[name].append(secs)
            for name in rows:
                m = statistics.median(times[name])
                peer = PEER.get(name)
                ratio = ("  ratio to %s %.3f" % (peer, m / statistics.median(times[peer]))
                         if peer else "")
                print("workers=%d %-12s epoch %.3f s  %7.1f us/step%s"
                      % (workers, name, m, m / max(steps[name], 1) * 1e6, ratio))


if __name__ == "__main__":
    main()
