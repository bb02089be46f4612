#!/usr/bin/env python3
"""Stratified and class-balanced shares (tests/bench/strat_bench.c) side by side with torch's
WeightedRandomSampler in one run: indices per second on one core and bytes per sample.

strat_bench measures rank 0's share of R = 8 (plain feistel, stratify, balance) at N = 1e6 and 1e8
with 10 and 10,000 classes. Here torch.utils.data.WeightedRandomSampler (one process, the usual
way to balance classes in PyTorch, not distributed) draws the same number of indices (N / 8) with
per-sample weights 1 / (its class's size), over labels with the same skew (class c about twice
the size of class c + 1 for the first classes). Its rate is the time to iterate the sampler;
its memory is the weight tensor it must be given (8 bytes per sample as float64). Medians of
--runs; ratios are sluice's rate over torch's. At N = 1e8 torch cannot run at all
(torch.multinomial takes at most 2^24 categories): the row says so.

    STRAT_BENCH=build/tests/strat_bench build/venv/bin/python tests/bench/strat_bench.py --runs 3
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
from torch.utils.data import WeightedRandomSampler


def labels_for(n, classes):
    """Skewed labels: a hash of i picks a class with geometric weights (halving) over the first
    classes and uniform over the rest."""
    rng = np.random.default_rng(12345)
    head = min(classes, 12)
    w = np.concatenate([0.5 ** np.arange(head), np.full(classes - head, 0.5 ** head)])
    w /= w.sum()
    return rng.choice(classes, size=n, p=w).astype(np.int64)


def torch_rate(n, classes, runs):
    lab = labels_for(n, classes)
    counts = np.bincount(lab, minlength=classes).astype(np.float64)
    weights = torch.from_numpy(1.0 / counts[lab])
    draw = n // 8
    rates = []
    for r in range(runs):
        s = WeightedRandomSampler(weights, draw, replacement=True,
                                  generator=torch.Generator().manual_seed(r))
        t0 = time.perf_counter()
        got = 0
        for _ in s:
            got += 1
        rates.append(got / (time.perf_counter() - t0))
    return statistics.median(rates), weights.element_size()


def ratio(x, torch_rate):
    return "-" if torch_rate != torch_rate else "%.1fx" % (x / torch_rate)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-n", type=float, default=1e8)
    ap.add_argument("--bench", default=os.environ.get("STRAT_BENCH", "strat_bench"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = subprocess.run([a.bench, "--runs", str(a.runs), "--max-n", "%d" % a.max_n],
                         check=True, capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        m = re.match(r"(\w+)\s+N=([\d.e+]+)\s+classes=(\d+)\s+rate\s+([\d.]+) M idx/s/core\s+"
                     r"memory beyond labels\s+([\d.]+) B/sample", line)
        if m:
            rows[(m.group(1), int(float(m.group(2))), int(m.group(3)))] = (float(m.group(4)),
                                                                           float(m.group(5)))
    print("%-28s %10s %8s %14s %12s %10s" % ("sampler", "N", "classes", "M idx/s/core",
                                             "B/sample", "vs torch"))
    ns = sorted({k[1] for k in rows})
    for n in ns:
        feistel = rows.get(("feistel", n, 0))
        for classes in (10, 10000):
            try:
                trate, tbytes = torch_rate(n, classes, a.runs)
                tm, why = trate / 1e6, None
            except RuntimeError as e:  # torch.multinomial takes at most 2^24 categories
                tm, tbytes, why = float("nan"), float("nan"), str(e).split("\n")[0]
            if feistel:
                print("%-28s %10.0e %8s %14.2f %12.2f %10s" % (
                    "sluice plain feistel", n, "-", feistel[0], feistel[1], ratio(feistel[0], tm)))
            for kind in ("stratify", "balance"):
                r = rows.get((kind, n, classes))
                if r:
                    print("%-28s %10.0e %8d %14.2f %12.2f %10s" % (
                        "sluice " + kind, n, classes, r[0], r[1], ratio(r[0], tm)))
            if why:
                print("%-28s %10.0e %8d  cannot run: %s" % ("torch WeightedRandomSampler", n,
                                                            classes, why))
            else:
                print("%-28s %10.0e %8d %14.2f %12.2f %10s" % (
                    "torch WeightedRandomSampler", n, classes, tm, tbytes, "1x"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
