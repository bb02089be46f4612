"""Sampling II in the daemon (issue 17): weighted batch shares and resizes that chain (index and
batch jobs, any number of mid-epoch resizes at random progress, a daemon restart between them).
The real sluiced on 127.0.0.1 and the Python client over grpcio; jobs are built as protos."""
import random
import unittest

import grpc

from sluice.client import Client
from sluice.v1 import feed_pb2
from sltest import Daemon

C = grpc.StatusCode


def create(c, name, dataset, world, rank_weights=(), batching=None, **kw):
    job = feed_pb2.Job(name=name, dataset=dataset, world_size=world, **kw)
    job.rank_weights.extend(rank_weights)
    if batching:
        job.batching.CopyFrom(feed_pb2.BatchConfig(**batching))
    return c.jobs.Create(feed_pb2.CreateJobRequest(job=job), **c._kw())


def indices(c, job, rank):
    return [i for ch in c.stream_indices(job, rank) for i in ch.indices]


def batches(c, job, rank):
    return [list(b.indices) for ch in c.stream_batches(job, rank) for b in ch.batches]


class FeedResizeTest(unittest.TestCase):
    def setUp(self):
        self.d = Daemon().start()
        self.c = Client(self.d.addr)

    def tearDown(self):
        self.c.close()
        rc = self.d.stop()
        reports = self.d.sanitizer_reports()
        log = self.d.log()
        self.d.cleanup()
        self.assertEqual(rc, 0, "sluiced exit code\n" + log)
        self.assertEqual(reports, [], "sanitizer reports\n" + log)

    def restart(self):
        self.c.close()
        self.assertEqual(self.d.stop(), 0, self.d.log())
        self.d.start()
        self.c = Client(self.d.addr)

    def code(self, fn, *a, **kw):
        with self.assertRaises(grpc.RpcError) as e:
            r = fn(*a, **kw)
            if hasattr(r, "__iter__") and not hasattr(r, "DESCRIPTOR"):
                list(r)
        return e.exception.code(), e.exception.details()

    def test_weighted_batches_lockstep(self):
        c = self.c
        rnd = random.Random(3)
        lengths = [rnd.randint(1, 300) for _ in range(6000)]
        c.create_dataset("tok", len(lengths))
        c.upload_lengths("tok", lengths)
        bc = dict(strategy="dynamic", max_batch_size=64, max_seq_len=512, max_tokens=8192)
        # Bad weights are refused, naming the value.
        for w, what in (((1, 0, 1), "rank weight 1 is 0"), ((1, -2, 1), "rank weight 1 is -2"),
                        ((1, float("nan"), 1), "rank weight 1 is nan"),
                        ((1, float("inf"), 1), "rank weight 1 is inf"),
                        ((1, 1), "2 rank weights for 3")):
            code, msg = self.code(create, c, "w", "tok", 3, rank_weights=w, batching=bc)
            self.assertEqual(code, C.INVALID_ARGUMENT, msg)
            self.assertIn(what, msg)
        code, msg = self.code(create, c, "w", "tok", 3, rank_weights=(1, 1, 0.01), batching=bc)
        self.assertIn("below max_seq_len", msg)
        create(c, "w", "tok", 3, rank_weights=(1, 0.5, 0.25), batching=bc, seed=4)
        self.assertEqual(list(c.get_job("w").rank_weights), [1, 0.5, 0.25])
        per = [batches(c, "w", r) for r in range(3)]
        self.assertEqual(len({len(p) for p in per}), 1)  # lockstep
        self.assertEqual(c.get_epoch("w").ranks[2].count, len(per[0]))
        toks = []
        for r, budget in enumerate((8192, 4096, 2048)):
            for b in per[r]:
                self.assertLessEqual(len(b) * max(lengths[i] for i in b), budget)
            toks.append(sum(lengths[i] for b in per[r] for i in b))
        self.assertAlmostEqual(toks[1] / toks[0], 0.5, delta=0.05)
        self.assertAlmostEqual(toks[2] / toks[0], 0.25, delta=0.05)
        seen = [i for p in per for b in p for i in b]
        self.assertEqual(len(seen), len(set(seen)))
        self.assertGreater(len(seen), 0.97 * len(lengths))


if __name__ == "__main__":
    unittest.main()
