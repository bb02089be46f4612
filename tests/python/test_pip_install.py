"""`pip install ./client/python` into a fresh venv, as a torch user would: the wheel carries stubs
generated from proto/ at build time, imports without torch, `python -m sluice --version` works,
and sluice.torch's sampler serves a real daemon.

The package is built from a copy of client/python and proto/ (so nothing lands in the source
tree), without build isolation and with the test venv's packages visible through a .pth file: the
test needs no network and installs no second torch. The new venv's own site-packages is searched
first, so the sluice imported is the one pip installed (the test checks where it came from)."""
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import unittest

from sltest import Daemon

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

SAMPLER = r"""
import sys
import sluice, sluice.torch
print(sluice.__file__)
s = sluice.torch.DistributedSampler(num_replicas=2, rank=int(sys.argv[2]), address=sys.argv[1],
                                    job="pip", dataset_name="pip", num_samples=50, seed=1)
s.set_epoch(0)
print(" ".join(str(i) for i in s))
"""


class PipInstallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="sluice-pip-")
        src = os.path.join(cls.tmp, "src")
        shutil.copytree(os.path.join(ROOT, "client", "python"), os.path.join(src, "client", "python"),
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        shutil.copytree(os.path.join(ROOT, "proto"), os.path.join(src, "proto"))
        cls.venv = os.path.join(cls.tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", cls.venv], check=True, timeout=120)
        cls.py = os.path.join(cls.venv, "bin", "python")
        site = subprocess.run([cls.py, "-c", "import sysconfig; print(sysconfig.get_paths()"
                               "['purelib'])"], capture_output=True, text=True, check=True,
                              timeout=60).stdout.strip()
        cls.site = site
        # Its own old setuptools (without bdist_wheel) would shadow the test venv's.
        subprocess.run([cls.py, "-m", "pip", "uninstall", "-q", "-y", "setuptools"],
                       capture_output=True, timeout=120)
        # The test venv's packages (torch, grpcio, grpcio-tools, protobuf, setuptools), after
        # the new venv's own.
        with open(os.path.join(site, "zz_test_venv.pth"), "w") as f:
            f.write(sysconfig.get_paths()["purelib"] + "\n")
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        cls.pip = subprocess.run([cls.py, "-m", "pip", "install", "--no-build-isolation",
                                  "--no-index", "--disable-pip-version-check",
                                  os.path.join(src, "client", "python")],
                                 capture_output=True, text=True, timeout=300, env=env)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_py(self, *args):
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        return subprocess.run([self.py, "-I", *args], capture_output=True, text=True,
                              timeout=120, env=env, cwd=self.tmp)

    def test_installed(self):
        self.assertEqual(self.pip.returncode, 0, self.pip.stdout + self.pip.stderr)
        self.assertTrue(os.path.isfile(os.path.join(self.site, "sluice", "v1",
                                                    "checkpoint_pb2_grpc.py")))
        r = self.run_py("-m", "sluice", "--version")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"^sluice 0\.1\.0 \(grpcio [0-9.]+, protobuf [0-9.]+, torch 2\.")

    def test_every_module_imports_first(self):
        # No import cycle: each module imports on its own in a fresh interpreter.
        self.assertEqual(self.pip.returncode, 0, self.pip.stderr)
        for mod in ("sluice", "sluice._channel", "sluice._retry", "sluice.client",
                    "sluice.checkpoint", "sluice._state", "sluice.torch", "sluice.torch.sampler",
                    "sluice.torch.loader", "sluice.torch.checkpoint", "sluice.__main__"):
            r = self.run_py("-c", "import %s" % mod)
            self.assertEqual(r.returncode, 0, mod + ": " + r.stderr)

    def test_imports_without_torch(self):
        self.assertEqual(self.pip.returncode, 0, self.pip.stderr)
        # torch hidden: the torch-free client still imports; sluice.torch says what is missing.
        code = ("import sys; sys.modules['torch'] = None\n"
                "import sluice.client, sluice.checkpoint\n"
                "try:\n    import sluice.torch\nexcept ImportError as e:\n    print('no', e)\n")
        r = self.run_py("-c", code)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("no ", r.stdout)

    def test_sampler_from_the_installed_package(self):
        self.assertEqual(self.pip.returncode, 0, self.pip.stderr)
        with Daemon() as d:
            seen = []
            for rank in range(2):
                r = self.run_py("-c", SAMPLER, d.addr, str(rank))
                self.assertEqual(r.returncode, 0, r.stderr)
                where, line = r.stdout.splitlines()[:2]
                self.assertTrue(where.startswith(self.site), where)
                seen.extend(int(x) for x in line.split())
            self.assertEqual(sorted(seen), list(range(50)))


if __name__ == "__main__":
    unittest.main()
