"""The training loop's stall for one checkpoint save, side by side: a state of --gib GiB per rank
(float32 tensors of 64 MiB: half "model", half "optimizer" momentum), world 1, a real sluiced on
loopback with its data dir under --dir.

  copy        the host-memory copy itself: every tensor copied into buffers allocated before
              (what a save must at least do to let training go on), and into fresh buffers
  async       sluice.torch.CheckpointManager.save(): returns once the state is copied and the
              upload started in the background; the first save allocates its buffers (unless
              mgr.reserve() did before the loop), later ones reuse them (steady)
  sync        sluice.checkpoint.Checkpoints: begin + save_state_dict + commit, the loop waiting
  torch.save  torch.save to a file under --dir, then fsync (durable, like the others); also
              without the fsync (page cache only)

It prints medians of --runs, the async stall per GiB, and the ratios. The goal: the async stall
at most the host-memory copy (<= 0.3 s/GiB here) and at least 5x below torch.save to local disk.
It also times a small training step (a 512x512 matmul chain) while the async upload runs and
while nothing does: on a machine whose cores also run the daemon, the upload slows the loop down
even though save() returned.

    ckpt_save_bench.py [--gib G] [--runs R] [--dir DIR] [--smoke]

Needs SLUICED and PYTHONPATH (build/python and tests/python), as ctest sets them.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

import sluice.torch as st
from sluice.checkpoint import Checkpoints
from sltest import Daemon

TENSOR = 64 << 20


def make_state(nbytes):
    n = max(2, nbytes // TENSOR)
    per = nbytes // n // 4
    g = torch.Generator().manual_seed(0)
    tensors = [torch.rand(per, generator=g) for _ in range(n)]
    half = n // 2
    return {"model": {"layer%d.weight" % i: t for i, t in enumerate(tensors[:half])},
            "optimizer": {"state": {i: {"momentum_buffer": t}
                                    for i, t in enumerate(tensors[half:])},
                          "param_groups": [{"lr": 0.1, "momentum": 0.9,
                                            "params": list(range(n - half))}]},
            "step": 0}


def flat(state):
    return list(state["model"].values()) + [v["momentum_buffer"]
                                            for v in state["optimizer"]["state"].values()]


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def loop_steps(n=20):
    """Seconds per step of a small CPU training-like step."""
    a = torch.rand(512, 512)
    t0 = time.perf_counter()
    for _ in range(n):
        b = a @ a
        a = b / b.norm()
    return (time.perf_counter() - t0) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.gib, a.runs = 1 / 64, 1
    nbytes = int(a.gib * (1 << 30))
    gib = nbytes / (1 << 30)
    state = make_state(nbytes)
    tensors = flat(state)
    work = tempfile.mkdtemp(prefix="ckpt-save-bench-", dir=a.dir)
    res = {k: [] for k in ("copy", "copy_fresh", "async_first", "reserve", "async_reserved",
                           "async", "async_upload", "sync", "torch_save", "torch_save_nosync",
                           "loop_idle", "loop_upload")}
    print("state: %.2f GiB in %d tensors; torch %s, %d threads; data dir and torch.save file "
          "under %s" % (gib, len(tensors), torch.__version__, torch.get_num_threads(), work),
          flush=True)
    with Daemon(data_dir=os.path.join(work, "data"), args=["--log-level", "warn"]) as d:
        mgr = st.CheckpointManager("bench-async", address=d.addr, rank=0, world_size=1,
                                   keep_last=1)
        ck = Checkpoints(d.addr)
        ck.set_retention("bench-sync", 1)
        bufs = [torch.empty_like(t) for t in tensors]
        for b, t in zip(bufs, tensors):
            b.copy_(t)
        path = os.path.join(work, "state.pt")
        step = 1
        # A manager whose buffers were reserved before the loop: its first save (measured
        # first, on a quiet machine: fresh memory costs the most while the kernel still writes
        # back or frees what the other saves left).
        with st.CheckpointManager("bench-reserved", address=d.addr, rank=0, world_size=1,
                                  keep_last=1) as m2:
            res["reserve"].append(timed(lambda: m2.reserve(state)))
            m2.save(step, state)
            res["async_reserved"].append(m2.last_stall)
        for run in range(a.runs):
            res["copy"].append(timed(lambda: [b.copy_(t) for b, t in zip(bufs, tensors)]))
            res["copy_fresh"].append(timed(lambda: [t.clone() for t in tensors]))

            step += 1
            if run == 0:
                mgr.save(step, state)
                res["async_first"].append(mgr.last_stall)
                mgr.wait()
                step += 1
            mgr.save(step, state)
            res["async"].append(mgr.last_stall)
            res["loop_upload"].append(loop_steps())
            mgr.wait()
            res["async_upload"].append(mgr.last_upload)
            res["loop_idle"].append(loop_steps())

            step += 1

            def sync():
                name = "step_%d" % step
                ck.begin("bench-sync", name, step=step, world_size=1, no_feed=True)
                ck.save_state_dict("bench-sync", name, 0, state)
                ck.commit("bench-sync", name)
            res["sync"].append(timed(sync))

            def tsave(do_sync):
                with open(path, "wb") as f:
                    torch.save(state, f)
                    f.flush()
                    if do_sync:
                        os.fsync(f.fileno())
            res["torch_save"].append(timed(lambda: tsave(True)))
            os.unlink(path)
            res["torch_save_nosync"].append(timed(lambda: tsave(False)))
            os.unlink(path)
            print("run %d: copy %.3f s, async %.3f s, sync %.3f s, torch.save+fsync %.3f s"
                  % (run + 1, res["copy"][-1], res["async"][-1], res["sync"][-1],
                     res["torch_save"][-1]), flush=True)
        mgr.close()
        ck.close()
    med = {k: statistics.median(v) for k, v in res.items() if v}
    print("\nmedians of %d runs, %.2f GiB per rank:" % (a.runs, gib))
    rows = [("host copy into allocated buffers", "copy"),
            ("host copy into fresh buffers (clone)", "copy_fresh"),
            ("async mgr.save, first (allocates)", "async_first"),
            ("mgr.reserve() before the loop", "reserve"),
            ("async mgr.save, first after reserve()", "async_reserved"),
            ("async mgr.save, steady (reuses buffers)", "async"),
            ("  ... its upload, until durable", "async_upload"),
            ("sync begin + save_state_dict + commit", "sync"),
            ("torch.save to a local file + fsync", "torch_save"),
            ("torch.save to a local file, no fsync", "torch_save_nosync")]
    for label, k in rows:
        print("  %-42s %8.3f s  %6.3f s/GiB" % (label, med[k], med[k] / gib))
    print("  %-42s %8.2f ms idle, %.2f ms during the upload"
          % ("training step (512x512 matmul)", med["loop_idle"] * 1e3,
             med["loop_upload"] * 1e3))
    print("\nratios (stall of the training loop):")
    print("  async / host copy            %6.2fx" % (med["async"] / med["copy"]))
    print("  torch.save+fsync / async     %6.1fx" % (med["torch_save"] / med["async"]))
    print("  torch.save (no fsync) / async %5.1fx" % (med["torch_save_nosync"] / med["async"]))
    print("  sync / async                 %6.1fx" % (med["sync"] / med["async"]))
    ok = med["async"] / gib <= 0.3 and med["torch_save"] / med["async"] >= 5
    print("goal (async <= 0.3 s/GiB and >= 5x below torch.save+fsync): %s"
          % ("met" if ok else "NOT met"))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
