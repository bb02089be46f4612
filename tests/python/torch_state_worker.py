"""One rank of test_torch_state's torchrun test: the torchtitan pattern. The loader itself is in
the state dict that torch.distributed.checkpoint saves every --every steps into sluiced
(sluice.torch.dcp, checkpoint ids sluice://JOB-ckpt/STEP), with the model and the step; a
restarted group loads the newest COMPLETE checkpoint (dcp.load calls the loader's
load_state_dict) and trains on. Ranks step in lockstep (an allreduce of the update per step, as
DDP's).

Each trained batch is appended to OUT/rank-R.log as "restart step epoch i,j,...", and the
model's weight at the end to OUT/final-R.txt (float.hex). With --kill "RANK:STEP", that rank
SIGKILLs itself right after training that step in the first run (before the step's checkpoint,
if one was due). --loader stateful: torchdata's StatefulDataLoader with 2 workers and sluice's
sampler in place of sluice.torch.DataLoader. --stop-after STEP: every rank leaves after the
checkpoint of that step (a job stopped, to be restarted in another world).
"""
import argparse
import os
import signal
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import grpc

import sluice.torch as st
import sluice.torch.dcp  # noqa: F401 - sluice:// ids for dcp.save and dcp.load
from sluice.checkpoint import Checkpoints
from torchrun_group import init_gloo


class Items(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def newest(addr, job):
    """The step of the newest COMPLETE checkpoint of job, or None."""
    with Checkpoints(addr) as ck:
        try:
            return ck.latest(job).step
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise
            return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--addr", required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--samples", type=int, default=101)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--kill", default="")
    p.add_argument("--loader", choices=("sluice", "stateful"), default="sluice")
    p.add_argument("--stop-after", type=int, default=0)
    a = p.parse_args()
    init_gloo(timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    os.environ["SLUICE_ADDR"] = a.addr
    ckpts = a.job + "-ckpt"

    sampler = st.DistributedSampler(num_replicas=world, rank=rank, address=a.addr, job=a.job,
                                    dataset_name=a.job, num_samples=a.samples, seed=3,
                                    drop_last=True)
    if a.loader == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader
        loader = StatefulDataLoader(Items(a.samples), sampler=sampler, batch_size=a.batch,
                                    num_workers=2, multiprocessing_context="forkserver")
    else:
        loader = st.DataLoader(Items(a.samples), sampler=sampler, batch_size=a.batch)
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    step = 0
    last = newest(a.addr, ckpts)
    if last is not None:
        state = {"dataloader": loader, "model": model.state_dict(), "step": torch.tensor(0)}
        dcp.load(state, checkpoint_id="sluice://%s/%d" % (ckpts, last))
        model.load_state_dict(state["model"])
        step = int(state["step"])
    kill_rank, kill_step = (int(x) for x in a.kill.split(":")) if a.kill else (-1, -1)
    with open(os.path.join(a.out, "rank-%d.log" % rank), "a") as log:
        for epoch in range(sampler.epoch, a.epochs):
            sampler.set_epoch(epoch)
            for batch in loader:
                # As DDP: every rank applies the group's update, so the model is the same on
                # all ranks (DCP keeps one copy of a plain tensor).
                g = batch.float().sum().reshape(1)
                dist.all_reduce(g)
                model.weight.data += g * 1e-6
                step += 1
                log.write("%d %d %d %s\n" % (restart, step, epoch,
                                             ",".join(str(int(i)) for i in batch)))
                log.flush()
                if restart == 0 and rank == kill_rank and step == kill_step:
                    os.kill(os.getpid(), signal.SIGKILL)
                if step % a.every == 0:
                    dcp.save({"dataloader": loader, "model": model.state_dict(),
                              "step": torch.tensor(step)},
                             checkpoint_id="sluice://%s/%d" % (ckpts, step))
                if step == a.stop_after:
                    break
            if step == a.stop_after:
                break
    with open(os.path.join(a.out, "final-%d.txt" % rank), "w") as f:
        f.write(float(model.weight.data.item()).hex())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
