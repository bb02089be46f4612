"""The caps on a state skeleton (issue 25 item 13, docs/hardening.md "Hardening III"): a shard
written by save_state_dict is read by load_state_dict through sluice._state; a hostile shard must
cost the loading rank a bounded amount of memory and be refused with ValueError, never another
exception. No daemon: the shard is read from DownloadShard-like messages made here, through the
same reader (sluice.checkpoint._Download) that load_state_dict uses."""
import hashlib
import json
import struct
import tracemalloc
import types
import unittest

import torch

from sluice import _state
from sluice.checkpoint import SKELETON_MAGIC, _Download

MiB = 1 << 20


def messages(data, announced=None, chunk=1 << 20):
    """DownloadShard responses carrying `data` (announcing `announced` bytes, default its
    length), as the daemon sends them."""
    size = len(data) if announced is None else announced
    sha = hashlib.sha256(data).hexdigest()
    out = []
    for off in range(0, max(len(data), 1), chunk):
        part = data[off:off + chunk]
        out.append(types.SimpleNamespace(offset=off, data=part, data_size=size,
                                         sha256=sha if off + chunk >= len(data) else ""))
    return out


def shard(doc=None, data=b"", raw=None):
    text = raw if raw is not None else json.dumps(doc, separators=(",", ":")).encode()
    head = SKELETON_MAGIC + struct.pack("<Q", len(text)) + text
    return head + bytes(-len(head) % 64) + data


def load(data, announced=None):
    return _state._read_skeleton_shard(_Download(messages(data, announced)), torch, None)


def doc(tensors, root):
    return {"format": "sluice.state_dict", "version": 1, "tensors": tensors, "root": root}


class SkeletonCapsTest(unittest.TestCase):
    def assertRefused(self, data, msg, announced=None):
        with self.assertRaisesRegex(ValueError, msg):
            load(data, announced)

    def test_many_tensors_cost_little(self):
        # The skeleton: 300,000 zero-size tensors in 8 MiB. Loading it built 300,000
        # tensors (239 MiB); now its values are counted before it is parsed.
        n = 300000
        table = [["float32", [0], 0]] * n
        root = ["l"] + [["T", i] for i in range(n)]
        data = shard(doc(table, root))
        self.assertGreater(len(data), 7 * MiB)
        tracemalloc.start()
        try:
            self.assertRefused(data, "JSON values: a skeleton holds at most 1048576")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # The text and the reader's copy of it, nothing per tensor.
        self.assertLess(peak, 3 * len(data) + 4 * MiB, "peak %.1f MiB" % (peak / MiB))

    def test_tensor_count_cap(self):
        # Under the value cap but over a shard's tensor count: refused before any tensor is made.
        n = 70000
        data = shard(doc([["bool", [], 0]] * n, ["l"]))
        self.assertRefused(data, "lists 70000 tensors: a shard holds at most 65535")

    def test_skeleton_size_cap(self):
        # A skeleton that claims 40 MiB in a shard that announces 41 MiB: refused before its
        # text is read (only the first 16 bytes were sent).
        head = SKELETON_MAGIC + struct.pack("<Q", 40 * MiB)
        self.assertRefused(head, "claims 41943040 bytes: a skeleton holds at most 33554432",
                           announced=41 * MiB)

    def test_zero_dimension_next_to_a_huge_one(self):
        # torch.empty([0, 2**70]) raises TypeError, numpy's reshape ValueError or OverflowError:
        # each is refused as a bad shape first.
        for shape in ([0, 1 << 70], [0, 1 << 63], [0, 1 << 62, 1 << 62], [1 << 61, 0, 16]):
            with self.subTest(shape=shape):
                self.assertRefused(shard(doc([["float32", shape, 0]], ["l", ["T", 0]])),
                                   "tensor 0: its shape")
        self.assertRefused(shard(doc([], ["na", "<f4", [0, 1 << 70], ""])),
                           "numpy array's shape")
        self.assertRefused(shard(doc([], ["na", "<f4", [0, 1 << 40, 1 << 40], ""])),
                           "numpy array's shape")
        self.assertRefused(shard(doc([], ["sz", 0, 1 << 70])), "bad node")
        # What may exist still loads: an empty tensor with a large dimension, a torch.Size.
        got = load(shard(doc([["float32", [0, 1 << 40], 0]], ["l", ["T", 0], ["sz", 0, 1 << 40]])))
        self.assertEqual(list(got[0].shape), [0, 1 << 40])
        self.assertEqual(got[1], torch.Size([0, 1 << 40]))

    def test_save_refuses_what_load_would(self):
        # A list of 2^20 ints is over the value cap: saving says so before anything is sent.
        root, tensors = _state.encode_state(torch, {"history": list(range(1 << 20))})
        with self.assertRaisesRegex(ValueError, "store large arrays and lists as tensors"):
            _state._StateShard(torch, root, tensors)
        root, tensors = _state.encode_state(torch, {"blob": b"x" * (33 * MiB)})
        with self.assertRaisesRegex(ValueError, "at most 33554432 bytes"):
            _state._StateShard(torch, root, tensors)

    def test_largest_legitimate_state_round_trips(self):
        # 65,535 tensors (a shard's most) under long key paths: within every cap, read back.
        state = {"model.layers.%05d.self_attn.q_proj.weight" % i: torch.full([2], float(i))
                 for i in range(65535)}
        sh = _state._StateShard(torch, *_state.encode_state(torch, state))
        self.assertLess(_state._skeleton_values(sh.skeleton), _state._MAX_SKELETON_VALUES)
        data = b"".join(bytes(p) for p in sh.parts())
        got = load(data)
        self.assertEqual(len(got), 65535)
        self.assertEqual(got["model.layers.65534.self_attn.q_proj.weight"].tolist(),
                         [65534.0, 65534.0])


if __name__ == "__main__":
    unittest.main()
