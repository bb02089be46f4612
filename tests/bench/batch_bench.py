#!/usr/bin/env python3
"""Benchmark driver for common/batch/ (issue 4), side by side with a fairseq-style baseline.

    python3 tests/bench/batch_bench.py --bench build-batch/tests/batch_bench \
        [--sizes 1000000,10000000] [--runs 5] [--baseline-runs 3] [--out results.json]

For each size it draws lognormal(mu 5.5, sigma 1) lengths clipped to [1, 4096] with numpy (seed
2026), writes them as raw u32, and
- runs the C benchmark once per strategy, each in a fresh process (so the peak-RSS figure is
  that configuration's own): median plan time over --runs, padding fraction, fill, batch count,
  the planner's peak allocation and the process's RSS growth, per sequence (the minimum too:
  on a shared machine the fastest run is the least disturbed one, so the table also gives the
  ratio of minimums and of median CPU times (process CPU time leaves out the time other
  processes held the core) next to the ratio of medians);
- runs a fairseq-style batch_by_size on the same lengths with numpy: indices sorted by length
  over the whole epoch, then the greedy cut under the padded cost (batch size x longest <=
  max_tokens), one vectorized step per batch; the time is the median of --baseline-runs. Two
  rows: "fairseq-baseline" sorts the identity order (no shuffle: the cheapest possible input,
  the reference for the "vs baseline" column), "fairseq-shuffled" takes a shuffled order as
  input like sluice does and sorts it as fairseq's ordered_indices(shuffle=True) does
  (perm[argsort(sizes[perm], kind="mergesort")]). Neither shards across ranks.
Both sides use max_tokens 16384, max_seq_len 4096.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

MAX_TOKENS = 16384
MAX_SEQ_LEN = 4096
STRATEGIES = ["pad", "bucket", "bucket-epoch", "dynamic", "dynamic-epoch", "packed",
              "packed-epoch"]


def lengths_for(n):
    rng = np.random.default_rng(2026)
    v = rng.lognormal(5.5, 1.0, n)
    return np.clip(v, 1, 4096).astype(np.uint32)


def fairseq_batch_by_size(lengths, max_tokens, perm=None, max_sentences=1 << 20):
    """Greedy batches over the length-sorted order under the padded cost, as fairseq's
    data_utils.batch_by_size does for ordered indices. With `perm` (a shuffled order), the order
    is fairseq's ordered_indices() with shuffle: perm[argsort(sizes[perm], kind="mergesort")].
    Returns (order, sorted lengths, starts, counts)."""
    if perm is None:
        order = np.argsort(lengths, kind="stable")
    else:
        order = perm[np.argsort(lengths[perm], kind="mergesort")]
    sl = lengths[order].astype(np.int64)
    n = len(sl)
    starts, counts = [], []
    s = 0
    while s < n:
        # Lengths ascend, so the k-th item is the longest of the first k and k <= T // L[s].
        kmax = min(max_sentences, n - s, max_tokens // int(sl[s]))
        seg = sl[s:s + kmax]
        k = int(np.count_nonzero(np.arange(1, kmax + 1, dtype=np.int64) * seg <= max_tokens))
        k = max(k, 1)
        starts.append(s)
        counts.append(k)
        s += k
    return order, sl, np.array(starts), np.array(counts)


def baseline(lengths, runs, shuffled=False):
    times = []
    perm = np.random.default_rng(1).permutation(len(lengths)) if shuffled else None
    cpu = []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        order, sl, starts, counts = fairseq_batch_by_size(lengths, MAX_TOKENS, perm)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    ends = starts + counts - 1
    padded = int(np.sum(counts * sl[ends]))
    real = int(np.sum(sl))
    assert np.all(counts * sl[ends] <= MAX_TOKENS)
    nb = len(counts)
    return {
        "strategy": "fairseq-shuffled" if shuffled else "fairseq-baseline",
        "n": len(lengths),
        "runs": runs,
        "plan_s_median": float(np.median(times)),
        "plan_s_min": float(np.min(times)),
        "cpu_s_median": float(np.median(cpu)),
        "batches": nb,
        "padding_fraction": (padded - real) / padded,
        "fill": real / (nb * MAX_TOKENS),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True, help="path of the batch_bench binary")
    ap.add_argument("--sizes", default="1000000,10000000")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline-runs", type=int, default=3)
    ap.add_argument("--out", help="write all results as JSON here")
    args = ap.parse_args()

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(float(x)) for x in args.sizes.split(",")]:
            lengths = lengths_for(n)
            path = os.path.join(tmp, "lengths.u32")
            lengths.astype("<u4").tofile(path)
            rows = []
            for s in STRATEGIES:
                out = subprocess.run(
                    [args.bench, "--lengths", path, "--runs", str(args.runs), "--strategy", s,
                     "--max-tokens", str(MAX_TOKENS), "--max-seq-len", str(MAX_SEQ_LEN)],
                    check=True, capture_output=True, text=True).stdout
                rows.append(json.loads(out))
            base = baseline(lengths, args.baseline_runs)
            rows.append(base)
            rows.append(baseline(lengths, args.baseline_runs, shuffled=True))
            print(f"\n## n = {n:,}  (mean length {lengths.mean():.1f}, "
                  f"max_tokens {MAX_TOKENS})\n")
            print("| strategy | window | plan s (median) | vs baseline | plan s (min) | "
                  "vs baseline (min) | CPU s (median) | vs baseline (CPU) | batches | padding | "
                  "fill | peak B/seq | RSS growth B/seq |")
            print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            for r in rows:
                speed = base["plan_s_median"] / r["plan_s_median"]
                speed_min = base["plan_s_min"] / r["plan_s_min"]
                speed_cpu = base["cpu_s_median"] / r["cpu_s_median"]
                print(f"| {r['strategy']} | {r.get('window', 'epoch (sorted)')} | "
                      f"{r['plan_s_median']:.3f} | {speed:.1f}x | {r['plan_s_min']:.3f} | "
                      f"{speed_min:.1f}x | {r['cpu_s_median']:.3f} | {speed_cpu:.1f}x | "
                      f"{r['batches']} | "
                      f"{100 * r['padding_fraction']:.2f}% | {100 * r['fill']:.2f}% | "
                      f"{r.get('peak_bytes_per_seq', float('nan')):.2f} | "
                      f"{r.get('rss_growth_bytes_per_seq', float('nan')):.2f} |")
            sys.stdout.flush()
            results.extend(rows)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
