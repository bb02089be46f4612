"""Feeding benchmark, Python side: one rank's share of N samples over 8 ranks delivered to the
Python client (sluice.client over grpcio) from a real sluiced on loopback, side by side with
torch's DistributedSampler listing the same share locally (python3-torch).

    feed_bench.py [--samples N] [--runs R] [--no-torch] [--smoke]

Needs SLUICED and PYTHONPATH as ctest sets them (build/python and tests/python).
"""
import argparse
import statistics
import time

from sluice.client import Client
from sltest import Daemon


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=100_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.samples, a.runs = 1_000_000, 1
    with Daemon(args=["--log-level", "warn"]) as d:
        c = Client(d.addr, timeout=60)
        c.create_dataset("big", a.samples)
        c.create_job("share", "big", 8, shuffle="feistel")
        secs, first, got = [], [], 0
        for _ in range(a.runs):
            t0 = time.perf_counter()
            got, t1 = 0, None
            for ch in c.stream_indices("share", 0, position=0, max_chunk=65536):
                if t1 is None:
                    t1 = time.perf_counter() - t0
                got += len(ch.indices)
            secs.append(time.perf_counter() - t0)
            first.append(t1)
        s = statistics.median(secs)
        print("python client  N=%d ranks=8 indices=%d  median %.3f s  %.1f M indices/s  "
              "first index %.2f ms" % (a.samples, got, s, got / s / 1e6,
                                        statistics.median(first) * 1e3))
        c.close()
    if not a.no_torch:
        import torch
        from torch.utils.data import DistributedSampler
        t0 = time.perf_counter()
        ts = DistributedSampler(range(a.samples), num_replicas=8, rank=0, shuffle=True, seed=0)
        it = iter(ts)
        next(it)
        t1 = time.perf_counter() - t0
        n = 1 + sum(1 for _ in it)
        s = time.perf_counter() - t0
        print("torch local    N=%d ranks=8 indices=%d  %.3f s  %.1f M indices/s  "
              "first index %.0f ms" % (a.samples, n, s, n / s / 1e6, t1 * 1e3))


if __name__ == "__main__":
    main()
