"""torch.distributed.checkpoint into sluiced against DCP's own FileSystemWriter/FileSystemReader,
side by side on the same state: --mib MiB per rank of float32 tensors (--tensors of them, plus a
few small ones and a BytesIO item, as an optimizer's step counters are), a real sluiced on
loopback with its data dir under --dir, DCP's files under --dir too.

  save        dcp.save, until durable (FileSystemWriter fsyncs its files; sluiced makes every
              shard durable before it commits)
  async       dcp.async_save (thread checkpointer): the training loop's stall (until it returns)
              and the whole save (until its future is done)
  load        dcp.load into a state of the same layout (page cache warm for both)
  manager     sluice.torch.CheckpointManager (each rank's shard with its part of the
              metadata, no collectives): save()'s stall (the first on its own row: its buffers
              were allocated by restore(state_dict=...) at the start, as a training script
              restores first), until its shard is durable, and restore(state_dict=...) into a
              state of the same layout; against the FileSystem async_save stall, its whole save,
              and its load

--device cuda puts the state on the GPU (each rank's own under torchrun): saves copy from it,
loads go into GPU templates (sluice's reader through pinned buffers), every figure waits for
the GPU (tests/bench/gpu_bench.sh runs this and the loader benchmark on a CUDA machine).

Single process by default; under torchrun (RANK set) every rank holds --mib of its own and rank
0 prints. It prints medians of --runs and the ratios sluice / filesystem (below 1: sluice faster).

    dcp_bench.py [--mib M] [--tensors N] [--runs R] [--dir DIR] [--device cpu|cuda] [--smoke]
    torchrun --standalone --nproc_per_node 4 tests/bench/dcp_bench.py --mib 256

Needs SLUICED and PYTHONPATH (build/python and tests/python), as ctest sets them; under torchrun,
SLUICE_ADDR of a running sluiced instead.
"""
import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

import sluice.torch.dcp as sdcp
from sluice.checkpoint import COMPLETE

DIST = "RANK" in os.environ
warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def make_state(nbytes, ntensors, rank, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed + rank)
    per = max(1, nbytes // ntensors // 4)
    state = {"r%d.w%d" % (rank, i): torch.rand(per, generator=g).to(device)
             for i in range(ntensors)}
    state.update({"r%d.step%d" % (rank, i): torch.tensor(float(i)).to(device)
                  for i in range(8)})
    state["r%d.meta" % rank] = io.BytesIO(b"x" * 4096)
    return state


def empty_like(state):
    return {k: (torch.empty_like(v) if isinstance(v, torch.Tensor) else io.BytesIO())
            for k, v in state.items()}


def barrier():
    if DIST:
        dist.barrier()


def sync():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(fn):
    sync()
    barrier()
    t0 = time.perf_counter()
    out = fn()
    sync()
    barrier()
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, default=512)
    ap.add_argument("--tensors", type=int, default=32)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--device", default="cpu",
                    help="where the state lives: cpu, or cuda (cuda:N under torchrun: the "
                         "rank's local GPU)")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.mib, a.tensors, a.runs = 4, 4, 1
    if a.device == "cuda" and DIST:
        a.device = "cuda:%d" % int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(a.device)
    if DIST:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if DIST else 0
    world = dist.get_world_size() if DIST else 1
    nbytes = int(a.mib * (1 << 20))
    state = make_state(nbytes, a.tensors, rank, device=a.device)
    work = tempfile.mkdtemp(prefix="dcp-bench-", dir=a.dir) if rank == 0 else None
    if DIST:
        box = [work]
        dist.broadcast_object_list(box)
        work = box[0]
    daemon = None
    addr = os.environ.get("SLUICE_ADDR")
    if not DIST:
        from sltest import Daemon
        daemon = Daemon(data_dir=os.path.join(work, "data"), args=["--log-level", "warn"]).start()
        addr = daemon.addr
    res = {k: [] for k in ("fs_save", "sl_save", "fs_stall", "fs_async", "sl_stall", "sl_async",
                           "fs_load", "sl_load", "mg_stall", "mg_async", "mg_load")}
    from sluice.torch import CheckpointManager
    mgr = CheckpointManager(job="dcpbench-mgr%d" % os.getpid() if not DIST else "dcpbench-mgr",
                            address=addr, rank=rank, world_size=world)
    # As a training script starts: restore() (a fresh job: nothing to load) with the state as
    # its template, which allocates the first save's buffers in the background.
    mgr.restore(state_dict=empty_like(state))
    mib = nbytes * world / (1 << 20)
    if rank == 0:
        print("state: %.0f MiB per rank in %d tensors on %s, %d rank(s), torch %s; under %s"
              % (nbytes / (1 << 20), a.tensors, a.device, world, torch.__version__, work),
              flush=True)
    job = "dcpbench%d" % os.getpid() if not DIST else "dcpbench"
    try:
        for run in range(a.runs):
            def fs_dir(tag):
                return os.path.join(work, "fs-%s-%d" % (tag, run))

            def sl_id(k):
                return "sluice://%s/%d" % (job, 10 * run + k)
            t, _ = timed(lambda: dcp.save(state, storage_writer=FileSystemWriter(fs_dir("s"))))
            res["fs_save"].append(t)
            t, _ = timed(lambda: dcp.save(state, storage_writer=sdcp.Writer(sl_id(1), addr)))
            res["sl_save"].append(t)
            for tag, mk in (("fs", lambda: FileSystemWriter(fs_dir("a"))),
                            ("sl", lambda: sdcp.Writer(sl_id(2), addr))):
                barrier()
                t0 = time.perf_counter()
                fut = dcp.async_save(state, storage_writer=mk())
                stall = time.perf_counter() - t0
                fut.result()
                barrier()
                res[tag + "_stall"].append(stall)
                res[tag + "_async"].append(time.perf_counter() - t0)
            loaded = empty_like(state)
            t, _ = timed(lambda: dcp.load(loaded, storage_reader=FileSystemReader(fs_dir("s"))))
            res["fs_load"].append(t)
            loaded2 = empty_like(state)
            t, _ = timed(lambda: dcp.load(loaded2, storage_reader=sdcp.Reader(sl_id(1), addr)))
            res["sl_load"].append(t)
            barrier()
            t0 = time.perf_counter()
            mgr.save(run + 1, state)
            res["mg_stall"].append(time.perf_counter() - t0)
            mgr.wait()
            while mgr.ck.get(mgr.job, "step_%d" % (run + 1)).state != COMPLETE:
                time.sleep(0.001)          # the daemon commits once every shard is durable
            barrier()
            res["mg_async"].append(time.perf_counter() - t0)
            loaded3 = empty_like(state)
            t, _ = timed(lambda: mgr.restore(step=run + 1, state_dict=loaded3))
            res["mg_load"].append(t)
            for k, v in state.items():
                if isinstance(v, torch.Tensor) and not (torch.equal(v, loaded2[k])
                                                        and torch.equal(v, loaded3[k])):
                    raise SystemExit("sluice's load differs at %s" % k)
            if rank == 0:
                print("run %d: save fs %.3f s sluice %.3f s; async stall fs %.3f s sluice %.3f s;"
                      " load fs %.3f s sluice %.3f s"
                      % (run + 1, res["fs_save"][-1], res["sl_save"][-1], res["fs_stall"][-1],
                         res["sl_stall"][-1], res["fs_load"][-1], res["sl_load"][-1]),
                      flush=True)
            if rank == 0:
                for tag in ("s", "a"):
                    shutil.rmtree(fs_dir(tag), ignore_errors=True)
    finally:
        mgr.close()
        if daemon:
            daemon.stop()
        if rank == 0:
            shutil.rmtree(work, ignore_errors=True)
    if rank == 0:
        med = {k: statistics.median(v) for k, v in res.items()}
        print("\nmedians of %d runs, %.0f MiB in all:" % (a.runs, mib))
        print("  %-34s %9s %9s %8s" % ("", "FileSys.", "sluice", "sl/fs"))
        for label, k in (("dcp.save (durable)", "save"), ("dcp.async_save: loop stall", "stall"),
                         ("dcp.async_save: until done", "async"), ("dcp.load", "load")):
            fs, sl = med["fs_" + k], med["sl_" + k]
            print("  %-34s %8.3fs %8.3fs %7.2fx" % (label, fs, sl, sl / fs if fs else 0))
        fs, sl = res["fs_stall"][0], res["mg_stall"][0]
        print("  %-34s %8.3fs %8.3fs %7.2fx" % ("first save: loop stall (run 1)*", fs, sl,
                                               sl / fs if fs else 0))
        for label, k, fk in (("CheckpointManager.save: loop stall", "stall", "fs_stall"),
                             ("CheckpointManager: until durable", "async", "fs_async"),
                             ("CheckpointManager.restore", "load", "fs_load")):
            fs, sl = med[fk], med["mg_" + k]
            print("  %-34s %8.3fs %8.3fs %7.2fx" % (label, fs, sl, sl / fs if fs else 0))
        print("  * the manager's first save after restore(state_dict=...) at the start")
        print("  %-34s %7.0f/s %7.0f/s" % ("save MiB/s", mib / med["fs_save"],
                                            mib / med["sl_save"]))
        print("  %-34s %7.0f/s %7.0f/s" % ("load MiB/s", mib / med["fs_load"],
                                            mib / med["sl_load"]))
    if DIST:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
