"""Side-by-side benchmark: sluice's sampler (tests/bench/sample_bench.c) and torch's
DistributedSampler listing one rank's share, in the same run.

    build/venv/bin/python tests/bench/sample_bench.py BUILD_DIR/tests/sample_bench [--runs K]

For torch, each run is a fresh process (so peak RSS is its own): time to the first index of
rank 0 of R=8 and time to list the whole share, at N = 1e7 and 1e8. Medians of K runs."""
import statistics
import subprocess
import sys

TORCH_RUN = r"""
import resource, sys, time
import torch
from torch.utils.data.distributed import DistributedSampler
n, R = int(sys.argv[1]), int(sys.argv[2])
s = DistributedSampler(range(n), num_replicas=R, rank=0, shuffle=True, seed=1)
s.set_epoch(2)
t0 = time.perf_counter()
it = iter(s)
first = next(it)
t1 = time.perf_counter()
k = 1 + sum(1 for _ in it)
t2 = time.perf_counter()
print(t1 - t0, t2 - t0, k / (t2 - t1 if t2 > t1 else 1e-9),
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def torch_row(n, R, runs):
    first, total, rate, rss = [], [], [], []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", TORCH_RUN, str(n), str(R)], check=True,
                             capture_output=True, text=True).stdout.split()
        first.append(float(out[0]))
        total.append(float(out[1]))
        rate.append(float(out[2]))
        rss.append(float(out[3]))
    med = statistics.median
    print(f"{'torch-DS':<10} {'randperm':<8} N={n:<11.0e} R={R:<3} first={med(first) * 1e3:10.3f} ms"
          f"  total={med(total):8.3f} s  rate={med(rate) / 1e6:8.1f} M idx/s"
          f"  peak RSS={med(rss) / 1024:8.1f} MB", flush=True)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: sample_bench.py PATH/TO/sample_bench [--runs K]")
    runs = 5
    if "--runs" in sys.argv:
        runs = int(sys.argv[sys.argv.index("--runs") + 1])
    subprocess.run([sys.argv[1], "--runs", str(runs)], check=True)
    for n in (10**7, 10**8):
        torch_row(n, 8, runs)


if __name__ == "__main__":
    main()
