"""One trainer of test_torch_ddp: torch.distributed (gloo, CPU) with sluice's sampler.

Environment: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (torch's), SLUICE_ADDR.
usage: torch_ddp_worker.py JOB OUT {indices|batches} EPOCHS [--drop-last] [--seed S]
       [--batch-size B] [--stop-after K] [--timeout S]

Trains a tiny linear model for EPOCHS epochs and writes one JSON line per epoch:
{"rank", "epoch", "indices" (in order) or "batches" (lists), "budget" info}. --stop-after K
ends the run after K steps of its first epoch (reported, as a group that is then resized);
--timeout is gloo's, in seconds (a collective that waits longer fails the rank).
"""
from datetime import timedelta
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

import sluice.torch as st
from sltest import rank_address
from torchrun_group import init_gloo


class Indexed(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x.sum(dim=1, keepdim=True)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def main():
    job, out, mode, epochs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    drop_last = "--drop-last" in sys.argv
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 0

    def opt(name, default):
        return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default
    batch_size, stop_after = opt("--batch-size", 4), opt("--stop-after", 0)
    timeout = timedelta(seconds=opt("--timeout", 1800))
    n = int(os.environ.get("N_SAMPLES", "103"))
    # The replicas (a comma-separated SLUICE_ADDR), spread over the ranks.
    os.environ["SLUICE_ADDR"] = rank_address(os.environ["SLUICE_ADDR"], int(os.environ["RANK"]))
    init_gloo(timeout)
    ds = Indexed(n)
    if mode == "indices":
        sampler = st.DistributedSampler(ds, shuffle=True, seed=seed, drop_last=drop_last, job=job)
        loader = DataLoader(ds, batch_size=batch_size, sampler=sampler)
    else:
        sampler = st.BatchSampler(job=job)
        loader = DataLoader(ds, batch_sampler=sampler)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with open(out, "w") as f:
        for e in range(epochs):
            sampler.set_epoch(e)  # harmless: the coordinator decides
            seen, batches = [], []
            for x, y, idx in loader:
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                seen.extend(int(i) for i in idx)
                batches.append([int(i) for i in idx])
                # Progress counts what the optimizer really consumed.
                sampler.report(sampler.position)
                if stop_after and len(batches) == stop_after:
                    break
            rec = {"rank": dist.get_rank(), "epoch": sampler.epoch, "indices": seen,
                   "batches": batches, "start": sampler.start_position}
            if mode == "batches":
                rec["budget"] = sampler.last_batches
            f.write(json.dumps(rec) + "\n")
            f.flush()
            if stop_after:
                break
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
