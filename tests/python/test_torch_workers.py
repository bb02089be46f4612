"""The rough edges a torch user meets first:
- sluice.torch.DataLoader with workers wherever torch's own DataLoader runs: a script piped to
  `python -`, and `python -c` (no script file the fork server could run again: the workers are
  forked there, as torch forks them). Every sample of the epoch arrives once.
- invalid sampler settings raise ValueError at construction, naming the value;
- a sampler waiting for an unreachable daemon warns, naming the address, within seconds;
- a sluice sampler inside torch's own DataLoader with workers warns once that it counts what
  the workers prefetched;
- a script without the `if __name__ == "__main__":` guard gets a clear error, not dead workers
  (nor workers that consume the epoch themselves);
- a rank SIGKILLed with its workers prefetching: the workers and the fork server end too."""
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import warnings

import torch

import sluice.torch as st
from sltest import Daemon


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return i * i

PRELUDE = r"""
import os, sys, time
import torch
import sluice.torch as st

class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return N
    def __getitem__(self, i):
        return i * i
"""

SCRIPT = PRELUDE.replace("N", "40") + r"""
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


KILLED = PRELUDE.replace("N", "4000") + r"""
def stat(pid):
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rpartition(")")[2].split()

if __name__ == "__main__":
    s = st.DistributedSampler(num_replicas=1, rank=0, address=ADDR, job=JOB, dataset_name=JOB,
                              num_samples=4000, seed=1)
    loader = st.DataLoader(Squares(), sampler=s, batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    procs = [int(x) for x in os.listdir("/proc") if x.isdigit()]
    def kids(ppid):
        out = []
        for x in procs:
            try:
                if int(stat(x)[1]) == ppid:
                    out.append(x)
            except OSError:
                pass
        return out
    server = [x for x in kids(os.getpid())
              if b"forkserver" in open("/proc/%d/cmdline" % x, "rb").read()]
    print(" ".join(map(str, kids(server[0]) + server)), flush=True)
    time.sleep(600)
"""


def _gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except OSError:
        return True


class RankKilled(unittest.TestCase):
    def test_workers_end_with_the_rank(self):
        # A rank SIGKILLed while its loader's workers (fork server) prefetch: the workers end
        # within seconds, and the fork server with them; torch's own watchdog watches the
        # workers' parent, the server, and never fired.
        with Daemon() as d, tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "train.py")
            with open(path, "w") as f:
                f.write(KILLED.replace("ADDR", repr(d.addr)).replace("JOB", repr("killed")))
            p = subprocess.Popen([sys.executable, path], stdout=subprocess.PIPE, text=True)
            try:
                line = p.stdout.readline()
                pids = [int(x) for x in line.split()]
                self.assertEqual(len(pids), 3, line)    # 2 workers, then their server
                p.kill()
                p.wait(timeout=30)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and not all(map(_gone, pids)):
                    time.sleep(0.1)
                self.assertEqual([x for x in pids if not _gone(x)], [])
            finally:
                p.kill()
                p.wait()
                p.stdout.close()


class RoughEdges(unittest.TestCase):
    def test_script_without_main_guard_fails_clearly(self):
        # Its workers (fork server) run the script's top level again: the sampler made there is
        # refused (it would consume the epoch a second time), and the loop's error says why.
        with Daemon() as d, tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "train.py")
            with open(path, "w") as f:
                f.write(SCRIPT.replace("ADDR", repr(d.addr)).replace("JOB", repr("noguard")))
            r = subprocess.run([sys.executable, path], capture_output=True, text=True,
                               timeout=120)
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertIn("exited before the first batch", r.stderr)
            self.assertIn("re-ran the training script", r.stderr)
            self.assertEqual(r.stdout, "")

    def test_invalid_settings_raise_value_error(self):
        with Daemon() as d:
            with self.assertRaises(ValueError) as e:
                st.DistributedSampler(num_replicas=2, rank=0, address=d.addr, job="strat",
                                      num_samples=8, stratify=True, shuffle_mode="torch",
                                      labels=[0, 1] * 4)
            self.assertIn("torch", str(e.exception))
            self.assertNotIsInstance(e.exception, __import__("grpc").RpcError)

    def test_unreachable_daemon_warns_naming_the_address(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            addr = "127.0.0.1:%d" % s.getsockname()[1]  # nothing listens there
        t0 = time.monotonic()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with self.assertRaises(Exception):
                st.DistributedSampler(num_replicas=1, rank=0, address=addr, job="gone",
                                      num_samples=8, retry_seconds=7)
        took = time.monotonic() - t0
        said = [str(w.message) for w in seen if addr in str(w.message)]
        self.assertEqual(len(said), 1, [str(w.message) for w in seen])
        self.assertIn("has not answered", said[0])
        self.assertLess(took, 30)

    def test_torch_loader_with_workers_warns_once(self):
        with Daemon() as d:
            s = st.DistributedSampler(num_replicas=1, rank=0, address=d.addr, job="pf",
                                      num_samples=64, seed=2)
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                for _ in range(2):
                    loader = torch.utils.data.DataLoader(Squares(), sampler=s, batch_size=4,
                                                         num_workers=2,
                                                         multiprocessing_context="forkserver")
                    self.assertEqual(sum(len(b) for b in loader), 64)
            said = [str(w.message) for w in seen if "prefetched" in str(w.message)]
            self.assertEqual(len(said), 1, [str(w.message) for w in seen])
            self.assertIn("sluice.torch.DataLoader", said[0])
            # sluice's own loader counts exactly: no warning from it.
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                loader = st.DataLoader(Squares(), sampler=s, batch_size=4, num_workers=2)
                self.assertEqual(sum(len(b) for b in loader), 64)
            self.assertEqual([w for w in seen if "prefetched" in str(w.message)], [])


if __name__ == "__main__":
    unittest.main()
