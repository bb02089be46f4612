"""A torchrun worker of test_torch_dcp.py: a small transformer sharded with FSDP2 (fully_shard,
gloo, CPU) whose model and optimizer state go through torch.distributed.checkpoint into sluiced.

    save  --steps N --ckpt STEP[:sync|thread|process|manager] ...   train N steps, save each
                              step given (dcp.save, async_save with either checkpointer, or
                              sluice.torch.CheckpointManager), and the full state of each to --out
    load  --ckpt STEP[:how] ...  build the model afresh (another seed), load each step (dcp.load;
                              CheckpointManager.restore into the template for :manager), compare
                              its full state with what the save wrote: bit-identical or exit 1
    kill  --steps N --ckpt STEP --kill-rank R   async_save with rank R SIGKILLed in its write

Without torchrun (no RANK): one process, no process group, no FSDP: load only.
"""
import argparse
import datetime
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,  # noqa: E402
                                                     set_state_dict)

import sluice.torch.dcp as sdcp  # noqa: E402
from sluice.checkpoint import COMPLETE, Checkpoints  # noqa: E402
from sluice.torch import CheckpointManager  # noqa: E402

DIST = "RANK" in os.environ


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(d, 2, batch_first=True)
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Tiny(torch.nn.Module):
    """A 2-layer transformer over a 64-token vocabulary."""

    def __init__(self, d=32, vocab=64, layers=2):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(layers))
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, tok):
        x = self.emb(tok)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def build(seed):
    torch.manual_seed(seed)
    model = Tiny()
    if DIST:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def train(model, opt, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        tok = torch.randint(0, 64, (4, 8), generator=g)
        loss = torch.nn.functional.cross_entropy(model(tok).reshape(-1, 64), tok.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()


def full_state(model, opt):
    """The whole model and optimizer state, gathered (rank 0 keeps it)."""
    return get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True,
                                                               cpu_offload=True))


def same(a, b, path=""):
    """Where a and b differ (tensors bit for bit), or None."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return path + ": tensor vs not"
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            return path + ": tensors differ"
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return path + ": keys %s vs %s" % (sorted(map(str, a)), sorted(map(str, b)))
        for k in a:
            d = same(a[k], b[k], "%s.%s" % (path, k))
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            d = same(x, y, "%s[%d]" % (path, i))
            if d:
                return d
        return None
    return None if a == b else "%s: %r vs %r" % (path, a, b)


def wait_complete(job, name, timeout=30.0):
    import time
    deadline = time.monotonic() + timeout
    ck = Checkpoints()
    try:
        while ck.get(job, name).state != COMPLETE:
            if time.monotonic() > deadline:
                raise SystemExit("%s/%s did not become COMPLETE" % (job, name))
            time.sleep(0.05)
    finally:
        ck.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["save", "load", "kill"])
    ap.add_argument("--job", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--ckpt", action="append", default=[])
    ap.add_argument("--kill-rank", type=int, default=-1)
    a = ap.parse_args()
    if DIST:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank() if DIST else 0
    world = dist.get_world_size() if DIST else 1

    if a.mode in ("save", "kill"):
        model, opt = build(0)
        todo = dict(c.split(":") if ":" in c else (c, "sync") for c in a.ckpt)
        for step in range(1, a.steps + 1):
            train(model, opt, 1, seed=step)
            if str(step) not in todo:
                continue
            how = todo[str(step)]
            msd, osd = get_state_dict(model, opt)
            state = {"model": msd, "optim": osd, "meta": {"step": step, "world": world}}
            cid = "sluice://%s/%d" % (a.job, step)
            if a.mode == "kill":
                killer = a.kill_rank

                class KillingWriter(sdcp.Writer):
                    def write_data(self, plan, planner):
                        if rank == killer:
                            os.kill(os.getpid(), signal.SIGKILL)
                        return super().write_data(plan, planner)
                dcp.async_save(state, checkpoint_id=cid, storage_writer=KillingWriter()).result()
                print("rank %d: the save went through" % rank, flush=True)
                return 1
            if how == "manager":
                # Each rank writes its shard by itself; the daemon commits once all are durable.
                with CheckpointManager(job=a.job) as mgr:
                    mgr.save(step, state)
                dist.barrier()
                if rank == 0:
                    wait_complete(a.job, "step_%d" % step)
            elif how == "sync":
                dcp.save(state, checkpoint_id=cid)
            elif how == "thread":
                dcp.async_save(state, checkpoint_id=cid).result()
            else:
                from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
                dcp.async_save(state, checkpoint_id=cid,
                               async_checkpointer_type=AsyncCheckpointerType.PROCESS).result()
            full = full_state(model, opt)
            if rank == 0:
                torch.save(full, os.path.join(a.out, "full-%d.pt" % step))
        if DIST:
            # Without it, gloo's threads still hold work at interpreter teardown, and a rank
            # now and then aborts there ("terminate called without an active exception").
            dist.barrier()
            dist.destroy_process_group()
        return 0

    # load: a model built with another seed and trained one step (so that the optimizer has
    # state to load into), then each checkpoint loaded and compared with the saved full state.
    model, opt = build(1)
    train(model, opt, 1, seed=99)
    bad = 0
    for c in a.ckpt:
        step, _, how = c.partition(":")
        step = int(step)
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "meta": {"step": 0, "world": 0}}
        if how == "manager":
            with CheckpointManager(job=a.job) as mgr:
                if mgr.restore(step=step, state_dict=state) is not state:
                    print("step %d: restore() did not return the template" % step, flush=True)
                    bad += 1
        else:
            dcp.load(state, checkpoint_id="sluice://%s/%d" % (a.job, step))
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        full = full_state(model, opt)
        if rank == 0:
            want = torch.load(os.path.join(a.out, "full-%d.pt" % step), weights_only=True)
            d = same(want, full)
            print("step %d into %d rank(s): %s" % (step, world, d or "bit-identical"),
                  flush=True)
            bad += d is not None
            if state["meta"]["step"] != step:
                print("step %d: meta %r" % (step, state["meta"]), flush=True)
                bad += 1
    if DIST:
        dist.barrier()
        dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
