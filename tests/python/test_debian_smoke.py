"""Debian's own python3 stack (python3-grpcio, python3-protobuf, no torch): the torch-free client
still works there. The rest of the suite runs in the test venv (tests/requirements.txt); this is
the one smoke test kept on the older stack (ctest debian_python_smoke).

It checks the interpreter it runs on is Debian's, so that a misconfigured build cannot turn it
into a second venv test.
"""
import sys
import unittest

import grpc
import google.protobuf

from sltest import Daemon

import sluice
from sluice.checkpoint import Checkpoints
from sluice.client import Client


class DebianStackTest(unittest.TestCase):
    def test_interpreter_is_debians(self):
        self.assertEqual(sys.prefix, "/usr", sys.executable)
        print("python %d.%d, grpcio %s, protobuf %s" %
              (sys.version_info[0], sys.version_info[1], grpc.__version__,
               google.protobuf.__version__))

    def test_feed_and_checkpoint_without_torch(self):
        self.assertNotIn("torch", sys.modules)
        with Daemon() as d, Client(d.addr) as c, Checkpoints(d.addr) as ck:
            c.create_dataset("ds", 100)
            c.create_job("j", "ds", world_size=2, shuffle="feistel", seed=3)
            got = []
            for rank in range(2):
                for chunk in c.stream_indices("j", rank):
                    got.extend(chunk.indices)
            self.assertEqual(sorted(got), list(range(100)))
            ck.begin("j", "step-1", step=1, world_size=1, no_feed=True)
            ck.upload("j", "step-1", 0, b"state bytes" * 1000)
            ck.commit("j", "step-1")
            self.assertEqual(ck.download("j", "step-1", 0), b"state bytes" * 1000)
        self.assertNotIn("torch", sys.modules)
        self.assertTrue(sluice.__name__)


if __name__ == "__main__":
    unittest.main()
