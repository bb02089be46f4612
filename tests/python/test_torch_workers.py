"""sluice.torch.DataLoader with workers wherever torch's own DataLoader runs: a script piped to
`python -`, and `python -c` (no script file the fork server could run again: the workers are
forked there, as torch forks them). Every sample of the epoch arrives once."""
import os
import subprocess
import sys
import unittest

from sltest import Daemon

SCRIPT = r"""
import sys
import torch
import sluice.torch as st

class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 40
    def __getitem__(self, i):
        return i * i

s = st.DistributedSampler(num_replicas=1, rank=0, address=ADDR, job=JOB, dataset_name=JOB,
                          num_samples=40, seed=1)
loader = st.DataLoader(Squares(), sampler=s, batch_size=4, num_workers=2)
got = sorted(int(x) for b in loader for x in b)
print(" ".join(map(str, got)))
"""


class WorkersWithoutScriptFile(unittest.TestCase):
    def run_script(self, args, stdin, addr, job):
        src = SCRIPT.replace("ADDR", repr(addr)).replace("JOB", repr(job))
        r = subprocess.run([sys.executable] + args(src), input=stdin(src), capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertEqual(r.stdout.split(), [str(i * i) for i in range(40)])

    def test_stdin_and_dash_c(self):
        with Daemon() as d:
            with self.subTest("python -"):
                self.run_script(lambda src: ["-"], lambda src: src, d.addr, "stdin")
            with self.subTest("python -c"):
                self.run_script(lambda src: ["-c", src], lambda src: None, d.addr, "dashc")


if __name__ == "__main__":
    unittest.main()
