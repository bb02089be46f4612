"""One trainer of test_torch_strat, started by torchrun: DDP (gloo, CPU) on a tiny linear model
over an imbalanced dataset, fed by sluice.torch's DistributedSampler with stratified shares.

usage: torch_strat_worker.py --addr HOST:PORT --job J --out DIR --epochs E --samples N

Every rank writes DIR/rank-<rank>.json: {"epochs": [[index, ...] per epoch]}, the indices it
trained, in order.
"""
import argparse
import json
import os
import random
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset

import sluice.torch as st
from sltest import rank_address
from torchrun_group import init_gloo


def labels_of(n):
    """The test's imbalanced labels: classes 0..3 in proportions 100:10:3:1, each present."""
    rng = random.Random(5)
    v = rng.choices(range(4), weights=[100, 10, 3, 1], k=n)
    v[:4] = [0, 1, 2, 3]
    return v


class Indexed(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((4,), float(i % 7)), torch.tensor([float(i % 3)]), i


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--addr", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=600)
    a = p.parse_args()
    rank = int(os.environ["RANK"])
    a.addr = rank_address(a.addr, rank)  # the replicas, spread over the ranks
    init_gloo(timedelta(seconds=60))
    ds = Indexed(a.samples)
    sampler = st.DistributedSampler(ds, shuffle=True, seed=3, drop_last=True, job=a.job,
                                    address=a.addr, stratify=True, labels=labels_of(a.samples))
    loader = st.DataLoader(ds, batch_size=8, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = []
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        got = []
        for x, y, idx in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            got.extend(int(i) for i in idx)
        seen.append(got)
    with open(os.path.join(a.out, "rank-%d.json" % rank), "w") as f:
        json.dump({"epochs": seen}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
