"""One trainer of CheckpointDDPTest: torch.distributed (gloo, CPU) that saves its rank's
state_dict through sluice.checkpoint, commits (rank 0), loads it back and compares.

Environment: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (torch's), SLUICE_ADDR.
usage: ckpt_ddp_worker.py JOB NAME OUT
Writes one JSON object to OUT: {"rank", "sha256", "same", "verify_ok" (rank 0)}.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from sluice.checkpoint import Checkpoints


def main():
    job, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 1)))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    torch.manual_seed(100 + rank)  # each rank sees its own data
    for _ in range(3):
        x = torch.randn(32, 8)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        opt.step()
    # The rank's shard: the model, its optimizer state and its own RNG state.
    state = {"model." + k: v for k, v in model.module.state_dict().items()}
    for pid, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            state["optim.%d.%s" % (pid, k)] = v if torch.is_tensor(v) else torch.tensor(v)
    state["rng"] = torch.get_rng_state()
    result = {"rank": rank}
    with Checkpoints(os.environ["SLUICE_ADDR"]) as ck:
        if rank == 0:
            ck.begin(job, name, world_size=world)
        dist.barrier()
        result["sha256"] = ck.save_state_dict(job, name, rank, state).sha256
        dist.barrier()
        if rank == 0:
            ck.commit(job, name)
            result["verify_ok"] = ck.verify(job, name, deep=True).ok
        dist.barrier()
        loaded = ck.load_state_dict(job, name, rank, state)
        result["same"] = list(loaded) == list(state) and all(
            loaded[k].dtype == state[k].dtype and torch.equal(loaded[k], state[k]) for k in state)
    with open(out, "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
