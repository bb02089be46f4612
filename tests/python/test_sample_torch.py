"""`sluice sample` (interleaved partition, shuffle none/torch) against the real peer:
torch.utils.data.distributed.DistributedSampler from Debian's python3-torch.

The grid covers N = 1, N < R, N divisible and not divisible by R, R in 1..8, every rank,
drop_last on and off, shuffle off and on with several seeds (including one above 2^32, whose low
32 bits torch's MT19937 uses) and epochs. Run by ctest as sample_torch."""
import os
import subprocess
import unittest

import torch
from torch.utils.data.distributed import DistributedSampler

CLI = os.environ.get("SLUICE_CLI", "sluice")

SIZES = [1, 2, 3, 5, 8, 10, 17, 101]
SEEDS_EPOCHS = [(0, 0), (7, 3), (2**33 + 5, 1)]


def sluice(n, R, r, shuffle, drop, seed=0, epoch=0, extra=()):
    args = [CLI, "sample", "--samples", str(n), "--replicas", str(R), "--rank", str(r),
            "--shuffle", shuffle, "--seed", str(seed), "--epoch", str(epoch), *extra]
    if drop:
        args.append("--drop-last")
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def torch_share(n, R, r, shuffle, drop, seed=0, epoch=0):
    s = DistributedSampler(range(n), num_replicas=R, rank=r, shuffle=shuffle, seed=seed,
                           drop_last=drop)
    s.set_epoch(epoch)
    return list(s)


class TorchGrid(unittest.TestCase):
    def test_grid(self):
        cases = 0
        for n in SIZES:
            for R in range(1, 9):
                for drop in (False, True):
                    for r in range(R):
                        want = torch_share(n, R, r, False, drop)
                        self.assertEqual(sluice(n, R, r, "none", drop), want,
                                         f"none N={n} R={R} r={r} drop={drop}")
                        for seed, epoch in SEEDS_EPOCHS:
                            want = torch_share(n, R, r, True, drop, seed, epoch)
                            got = sluice(n, R, r, "torch", drop, seed, epoch)
                            self.assertEqual(got, want, f"torch N={n} R={R} r={r} drop={drop} "
                                                        f"seed={seed} epoch={epoch}")
                        cases += 1 + len(SEEDS_EPOCHS)
        self.assertGreater(cases, 2000)

    def test_larger_n_and_positions(self):
        # A size past MT19937's 624-word state many times over, and start/count windows.
        n, R = 100003, 3
        for r in range(R):
            want = torch_share(n, R, r, True, False, 42, 9)
            self.assertEqual(sluice(n, R, r, "torch", False, 42, 9), want)
            self.assertEqual(sluice(n, R, r, "torch", False, 42, 9,
                                    ("--start", "1000", "--count", "77")), want[1000:1077])

    def test_randperm_is_the_epoch_order(self):
        # With one replica the share is the epoch order itself.
        for n, seed, epoch in [(1000, 3, 0), (4096, 0, 12), (999, 2**40, 2)]:
            want = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
            self.assertEqual(sluice(n, 1, 0, "torch", False, seed, epoch), want.tolist())


if __name__ == "__main__":
    unittest.main()
