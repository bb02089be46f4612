"""torch.distributed.checkpoint into sluiced (sluice.torch.dcp, issue 26 item 5), as a torch 2.x
user runs it: torchrun, 4 ranks, gloo on CPU, a small transformer sharded with FSDP2
(fully_shard, DTensor parameters and optimizer state), checkpoint ids sluice://JOB/STEP.

- dcp.save, dcp.async_save with the thread and with the process checkpointer, loaded into 4, 3
  and 2 ranks and into one process without a process group: the gathered model and optimizer
  state bit-identical to what was saved (DCP's planner reshards);
- a rank SIGKILLed inside async_save: nothing COMPLETE, the previous step loads;
- bad input: a range past the data, a range of a WRITING checkpoint, a damaged shard, tampered
  metadata, a step that is COMPLETE already.

Every run is bounded (RUN_TIMEOUT); a hang fails the test."""
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import unittest

import grpc
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import sluice.torch.dcp as sdcp
from sluice.checkpoint import COMPLETE, WRITING, ChecksumError, Checkpoints
from sltest import Daemon

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torch_dcp_worker.py")
RUN_TIMEOUT = 240
# What dcp.save and dcp.load raise: a rank's own error, or DCP's CheckpointException (a
# BaseException) carrying each rank's error and traceback in its text.
DCP_ERRORS = (Exception, CheckpointException)


# The steps the save run writes and how: SL_DCP_SAVES (the S3 and replica variants of ctest
# leave out the process checkpointer, which costs a process start of its own).
SAVES = os.environ.get("SL_DCP_SAVES", "2:sync,3:thread,4:process,5:manager").split(",")
STEPS = [int(x.split(":")[0]) for x in SAVES]


class DcpTorchrunTest(unittest.TestCase):
    """One daemon; the save run writes steps 2 (dcp.save), 3 (async_save, thread), 4
    (async_save, process) and 5 (sluice.torch.CheckpointManager: each rank's shard with its
    part of the metadata, no collectives) of one training run, which the load runs check
    (step 5 through CheckpointManager.restore into the template too)."""

    @classmethod
    def setUpClass(cls):
        cls.d = Daemon().start()
        cls.tmp = tempfile.TemporaryDirectory(prefix="sluice-dcp-")
        cls.out = cls.tmp.name
        cls.ck = Checkpoints(cls.d.addrs)
        cls.run_workers(4, "save", "--job", "fsdp", "--steps", str(max(STEPS)),
                        *[x for s in SAVES for x in ("--ckpt", s)])

    @classmethod
    def tearDownClass(cls):
        cls.ck.close()
        cls.d.stop()
        cls.tmp.cleanup()

    @classmethod
    def run_workers(cls, n, *args, expect=0):
        """torchrun with n ranks (0: one plain process) of the worker; its output, after
        checking the exit status."""
        cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                "--nproc_per_node", str(n), "--monitor_interval", "0.5"] if n else
               [sys.executable]) + [WORKER, args[0], "--out", cls.out] + list(args[1:])
        env = dict(os.environ, SLUICE_ADDR=cls.d.addrs, OMP_NUM_THREADS="1")
        log = os.path.join(cls.out, "run-%s-%d.log" % (args[0], n))
        with open(log, "wb") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)
        try:
            rc = p.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = "timeout"
        with open(log, errors="replace") as f:
            text = f.read()
        if (rc == 0) != (expect == 0) or rc == "timeout":
            raise AssertionError("%s exited %s:\n%s" % (" ".join(args), rc, text[-12000:]))
        return text

    def loaded(self, n, steps):
        hows = dict(x.split(":") for x in SAVES)
        specs = ["%d:%s" % (s, hows[str(s)]) for s in steps]
        text = self.run_workers(n, "load", "--job", "fsdp", *[x for s in specs
                                                              for x in ("--ckpt", s)])
        for s in steps:
            self.assertIn("step %d into %d rank(s): bit-identical" % (s, max(n, 1)), text)

    def test_saved_checkpoints_are_complete(self):
        for x in SAVES:
            step, how = int(x.split(":")[0]), x.split(":")[1]
            c = self.ck.get("fsdp", "step_%d" % step)
            self.assertEqual(c.state, COMPLETE)
            # 4 ranks' items and the metadata; the manager's: 4 shards with a metadata footer
            self.assertEqual(c.world_size, 4 if how == "manager" else 5)
            self.assertEqual(c.step, step)
            self.assertTrue(self.ck.verify("fsdp", "step_%d" % step, deep=True).ok)

    def test_load_into_four_ranks(self):
        self.loaded(4, STEPS[:1])

    def test_load_into_two_ranks(self):
        self.loaded(2, STEPS)

    def test_load_into_three_ranks(self):
        self.loaded(3, STEPS[-1:])

    def test_load_into_one_process(self):
        self.loaded(0, STEPS[-1:])

    def test_rank_killed_in_async_save(self):
        # The next step's async_save with rank 2 SIGKILLed in its write: the run fails, that
        # step is not COMPLETE, and the one before still loads.
        last, step = max(STEPS), max(STEPS) + 1
        self.run_workers(4, "kill", "--job", "fsdp", "--steps", str(step), "--ckpt", str(step),
                         "--kill-rank", "2", expect=1)
        c = self.ck.get("fsdp", "step_%d" % step)
        self.assertEqual(c.state, WRITING)
        self.assertEqual(self.ck.latest("fsdp").name, "step_%d" % last)
        with self.assertRaises(DCP_ERRORS) as cm:
            dcp.load({"x": torch.zeros(1)},
                     storage_reader=sdcp.Reader("sluice://fsdp/%d" % step, address=self.d.addrs))
        self.assertIn("WRITING, not COMPLETE", str(cm.exception))
        self.loaded(0, [last])


_RAN = []


def _mark():
    _RAN.append(1)
    return "ran"


class _Boom:
    """Unpickling it calls _mark: code a checkpoint would run on load."""

    def __reduce__(self):
        return (_mark, ())


class DcpBadInputTest(unittest.TestCase):
    """A one-process DCP checkpoint, damaged and misused."""

    def setUp(self):
        self.d = Daemon().start()
        self.ck = Checkpoints(self.d.addrs)
        self.addr = self.d.addrs
        self.state = {"w": torch.arange(300000, dtype=torch.float32), "b": torch.ones(7),
                      "extra": {"step": 3, "note": "x"}}
        dcp.save(self.state, storage_writer=sdcp.Writer("sluice://bad/3", address=self.addr))

    def tearDown(self):
        self.ck.close()
        self.d.stop()

    def load(self, cid="sluice://bad/3"):
        got = {"w": torch.zeros(300000), "b": torch.zeros(7), "extra": {"step": 0, "note": ""}}
        dcp.load(got, storage_reader=sdcp.Reader(cid, address=self.addr))
        return got

    def rpc_error(self, fn):
        with self.assertRaises(grpc.RpcError) as cm:
            fn()
        return cm.exception.code(), cm.exception.details()

    def test_round_trip(self):
        got = self.load()
        self.assertTrue(torch.equal(got["w"], self.state["w"]))
        self.assertEqual(got["extra"], {"step": 3, "note": "x"})
        meta = json.loads(self.ck.download("bad", "step_3", 1))
        self.assertEqual(meta["format"], sdcp.FORMAT)

    def test_values_load_without_unpickling(self):
        # Non-tensor values go into the checkpoint in sluice's JSON encoding, not as pickles:
        # numpy's and Python's RNG states, nested plain values. A value only a pickle can hold
        # is refused at load (naming it, its code not run) unless the Reader has allow_pickle.
        import random
        import numpy as np
        state = {"np": np.random.RandomState(5).get_state(), "py": random.Random(5).getstate(),
                 "plain": {"lr": 0.5, "tags": ("a", None), "big": 1 << 80}, "boom": _Boom(),
                 "t": torch.ones(3), "raw": io.BytesIO(b"\0raw")}
        dcp.save(state, storage_writer=sdcp.Writer("sluice://vals/1", address=self.addr))
        data = self.ck.download("vals", "step_1", 0)
        self.assertEqual(data.count(b"SLUICEV1"), 6)    # all but the tensor and _Boom
        like = {"np": None, "py": None, "plain": {"lr": 0, "tags": None, "big": 0},
                "t": torch.zeros(3), "raw": io.BytesIO()}
        dcp.load(like, storage_reader=sdcp.Reader("sluice://vals/1", address=self.addr))
        self.assertEqual(like["raw"].getvalue(), b"\0raw")
        self.assertEqual(like["py"], state["py"])
        self.assertEqual(like["plain"], state["plain"])
        self.assertTrue(all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
                            for a, b in zip(like["np"], state["np"])))
        del _RAN[:]
        with self.assertRaises(DCP_ERRORS) as cm:
            dcp.load({"boom": None}, storage_reader=sdcp.Reader("sluice://vals/1",
                                                                address=self.addr))
        self.assertIn("item boom of vals/step_1 is a pickle", str(cm.exception))
        self.assertIn("allow_pickle=True", str(cm.exception))
        self.assertEqual(_RAN, [])
        got = {"boom": None}
        dcp.load(got, storage_reader=sdcp.Reader("sluice://vals/1", address=self.addr,
                                                 allow_pickle=True))
        self.assertEqual((got["boom"], _RAN), ("ran", [1]))

    def test_range_past_the_data(self):
        size = self.ck.get("bad", "step_3").shards[0].data_size
        code, msg = self.rpc_error(lambda: self.ck.read_range("bad", "step_3", 0, size - 3, 4))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("beyond the data size", msg)

    def test_range_of_a_writing_checkpoint(self):
        self.ck.begin("bad", "step_9", step=9, world_size=2, no_feed=True)
        self.ck.upload("bad", "step_9", 0, b"x" * 5000)
        code, msg = self.rpc_error(lambda: self.ck.read_range("bad", "step_9", 0, 0, 10))
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("WRITING", msg)
        with self.assertRaises(DCP_ERRORS) as cm:
            self.load("sluice://bad/9")
        self.assertIn("WRITING, not COMPLETE", str(cm.exception))

    def test_damaged_item(self):
        # A byte of "w" flipped in the store: the daemon refuses the range (DATA_LOSS) before
        # it sends any of it.
        self.d.store_flip("bad", "step_3_shard_0.shard", 88 + 1000)
        with self.assertRaises(DCP_ERRORS) as cm:
            self.load()
        self.assertIn("StatusCode.DATA_LOSS", str(cm.exception))

    def test_tampered_metadata(self):
        # DCP wraps what a rank raised in a CheckpointException: the daemon's DATA_LOSS is in it.
        self.d.store_flip("bad", "step_3_shard_1.shard", 88 + 20)
        with self.assertRaises(DCP_ERRORS) as cm:
            self.load()
        self.assertIn("StatusCode.DATA_LOSS", str(cm.exception))

    def test_metadata_not_ours_is_refused(self):
        # A checkpoint whose last shard is not DCP metadata: a clear error, nothing unpickled;
        # without the record of dcp.save nor the footers of CheckpointManager's shards, it is
        # not a DCP checkpoint at all.
        for step, um in ((8, json.dumps({"format": "sluice-dcp 1", "ranks": 1})), (9, "")):
            self.ck.begin("bad", "step_%d" % step, step=step, world_size=2, no_feed=True,
                          user_metadata=um)
            for r, data in enumerate([b"\0" * 10, b"\x80\x04K\x01."]):  # the second: a pickle
                self.ck.upload("bad", "step_%d" % step, r, data)
            self.ck.commit("bad", "step_%d" % step)
        with self.assertRaises(DCP_ERRORS) as cm:
            self.load("sluice://bad/8")
        self.assertIn("is not JSON", str(cm.exception))
        with self.assertRaises(DCP_ERRORS) as cm:
            self.load("sluice://bad/9")
        self.assertIn("bad/step_9 is not a DCP checkpoint", str(cm.exception))

    def test_item_checksum_checked(self):
        # The metadata names another checksum for an item: ChecksumError before it is used.
        r = sdcp.Reader("sluice://bad/3", address=self.addr)
        md = r.read_metadata()
        for k, v in md.storage_data.items():
            v[3] = hashlib.sha256(b"other").hexdigest()
        r.read_metadata = lambda *a, **k: md
        with self.assertRaises(DCP_ERRORS) as cm:
            dcp.load({"w": torch.zeros(300000), "b": torch.zeros(7)}, storage_reader=r)
        self.assertIn(ChecksumError.__name__, str(cm.exception))

    def test_complete_step_not_saved_again(self):
        with self.assertRaises(DCP_ERRORS) as cm:
            dcp.save(self.state, storage_writer=sdcp.Writer("sluice://bad/3", address=self.addr))
        self.assertIn("COMPLETE already", str(cm.exception))
        self.assertTrue(torch.equal(self.load()["w"], self.state["w"]))

    def test_bad_checkpoint_ids(self):
        for cid in ("file:///x", "sluice://", "sluice://job", "sluice://job/", "sluice://a/b/c",
                    "sluice:///3"):
            self.assertFalse(sdcp.Writer.validate_checkpoint_id(cid), cid)
            with self.assertRaises(ValueError):
                sdcp.parse_checkpoint_id(cid)
        with self.assertRaises(DCP_ERRORS) as cm:
            dcp.save(self.state, storage_writer=sdcp.Writer(address=self.addr))
        self.assertIn("no checkpoint id", str(cm.exception))
        self.assertEqual(sdcp.parse_checkpoint_id("sluice://run/12"), ("run", "step_12", 12))
        self.assertEqual(sdcp.parse_checkpoint_id("sluice://run/best"), ("run", "best", 0))


if __name__ == "__main__":
    unittest.main()
