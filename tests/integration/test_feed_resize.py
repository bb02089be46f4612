"""Sampling II in the daemon (issue 17): weighted batch shares and resizes that chain (index and
batch jobs, any number of mid-epoch resizes at random progress, a daemon restart between them).
The real sluiced on 127.0.0.1 and the Python client over grpcio; jobs are built as protos."""
import os
import random
import threading
import time
import unittest

import grpc

from sluice.v1 import feed_pb2
from sltest import DaemonClientTest

C = grpc.StatusCode

# A sanitized daemon runs several times slower: the chain test scales its job down there.
SANITIZED = os.environ.get("SLUICE_SANITIZE", "") != "" or "asan" in os.environ.get("SLUICED", "")


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


class FeedResizeTest(DaemonClientTest):

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
                        ((1, 1), "2 rank weights for a dp world of 3")):
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

    def consume(self, job, world, rnd, batch, consumed):
        """Every dp rank of the current world takes a random prefix of its share and reports it."""
        for r in range(world):
            got = batches(self.c, job, r) if batch else indices(self.c, job, r)
            k = rnd.choice((0, len(got), rnd.randint(0, len(got))))
            if r == 0 and got:
                k = min(k, len(got) - 1)  # the epoch must not end here
            consumed += [tuple(b) for b in got[:k]] if batch else got[:k]
            if k:
                self.c.report_progress(job, r, 0, k)

    def test_chained_resizes_index_jobs(self):
        c = self.c
        rnd = random.Random(17)
        n = 5000
        c.create_dataset("ds", n)
        for t in range(8):
            drop = t % 2 == 0
            kw = dict(shuffle=("feistel", "torch", "none")[t % 3],
                      partition=("interleaved", "contiguous")[t // 2 % 2], seed=t,
                      drop_last=drop)
            world = rnd.randint(1, 9)
            create(c, "twin", "ds", world, **kw)
            epoch = sorted(i for r in range(world) for i in indices(c, "twin", r))
            c.delete_job("twin")
            job = "j%d" % t
            create(c, job, "ds", world, **kw)
            consumed, worlds = [], 0
            for step in range(rnd.randint(2, 5)):
                self.consume(job, world, rnd, False, consumed)
                world = rnd.randint(1, 9)
                worlds += world
                self.assertTrue(c.resize_job(job, world).resized_in_epoch or not consumed)
                if not consumed:
                    # Nobody read anything yet: a plain change, the epoch is the new world's
                    # (drop_last drops another N mod world).
                    epoch = sorted(i for r in range(world) for i in indices(c, job, r))
                if step == 1:
                    self.restart()
                    c = self.c
            rest = [i for r in range(world) for i in indices(c, job, r)]
            ep = c.get_epoch(job)
            counts = [ep.ranks[r].count for r in range(world)]
            got = sorted(consumed + rest)
            # Equal counts per rank, so DDP ranks take the same steps whatever the batch size.
            self.assertEqual(len(set(counts)), 1, (kw, counts))
            if drop:
                # Never twice; all but what the resizes left out to keep the counts equal,
                # fewer than each new world's size, and exactly as many as Epochs.Get states.
                self.assertEqual(len(got), len(set(got)), kw)
                self.assertLessEqual(set(got), set(epoch), kw)
                self.assertEqual(len(epoch) - len(got), ep.left_out, kw)
                self.assertLess(ep.left_out, worlds + 1, kw)
            else:
                # Padding repeats only (the torch rule): every index at least once.
                self.assertEqual(set(got), set(range(n)), kw)
                self.assertLess(len(got) - len(epoch), worlds + 1)
                self.assertEqual(ep.left_out, 0, kw)
            self.assertEqual(sum(counts), len(rest))
            for r in range(world):
                c.report_progress(job, r, 0, counts[r])
            self.assertEqual(c.get_job(job).epoch, 1)

    def test_chained_resizes_batch_jobs(self):
        c = self.c
        rnd = random.Random(5)
        lengths = [rnd.randint(1, 120) for _ in range(3000)]
        c.create_dataset("tok", len(lengths))
        c.upload_lengths("tok", lengths)
        for t in range(6):
            pad = t % 2 == 1
            bc = dict(strategy=("dynamic", "packed", "pad")[t % 3], max_batch_size=16,
                      max_seq_len=128, max_tokens=512, pad_remainder=pad)
            world = rnd.randint(1, 6)
            job = "b%d" % t
            create(c, job, "tok", world, batching=bc, seed=t, shuffle="feistel")
            plan = [tuple(b) for r in range(world) for b in batches(c, job, r)]
            consumed, worlds = [], 0
            for step in range(rnd.randint(2, 5)):
                self.consume(job, world, rnd, True, consumed)
                world = rnd.randint(1, 6)
                worlds += world
                c.resize_job(job, world)
                if step == 1:
                    self.restart()
                    c = self.c
            rest = [[tuple(b) for b in batches(c, job, r)] for r in range(world)]
            self.assertEqual(len({len(x) for x in rest}), 1, bc)  # lockstep
            ep = c.get_epoch(job)
            self.assertEqual(ep.ranks[world - 1].count, len(rest[0]))
            served = consumed + [b for x in rest for b in x]
            self.assertTrue(set(served) <= set(plan), bc)
            if pad:
                self.assertEqual(set(served), set(plan), bc)  # repeats only pad
                self.assertLess(len(served) - len(plan), worlds + 1)
            else:
                self.assertEqual(len(served), len(set(served)), bc)  # never twice
                self.assertLess(len(plan) - len(served), worlds + 1)
            for r in range(world):
                c.report_progress(job, r, 0, len(rest[r]))
            self.assertEqual(c.get_job(job).epoch, 1)
            # The next epoch is planned for the new world, whole.
            self.assertEqual(c.get_epoch(job).dp_size, world)

    def test_resize_carries_rank_weights(self):
        """Index jobs: a resize with new weights shares exactly what is left in proportion to
        them, chained; bad weights leave the job as it was."""
        c = self.c
        rnd = random.Random(29)
        n = 6000
        c.create_dataset("ds", n)
        for t, (w0, steps) in enumerate((((), [(2, 1, 1, 0.5), (1, 3)]),
                                         ((1, 2, 1), [(1, 1, 1, 1, 1), (3, 1, 2)]))):
            job = "iw%d" % t
            kw = dict(shuffle="feistel", seed=t, drop_last=True)
            world = max(len(w0), 3)
            create(c, job, "ds", world, rank_weights=w0, **kw)
            epoch = sorted(i for r in range(world) for i in indices(c, job, r))
            consumed = []
            for w in steps:
                self.consume(job, world, rnd, False, consumed)
                for bad, what in (((1,) * (len(w) + 1), "rank weights for a dp world of %d"
                                   % len(w)),
                                  ((1, 0) + (1,) * (len(w) - 2), "rank weight 1 is 0")):
                    code, msg = self.code(c.resize_job, job, len(w), rank_weights=bad)
                    self.assertEqual(code, C.INVALID_ARGUMENT, msg)
                    self.assertIn(what, msg)
                    self.assertEqual(c.get_job(job).world_size, world)
                world = len(w)
                got = c.resize_job(job, world, rank_weights=w)
                self.assertEqual(list(got.rank_weights), list(w))
            rest = [indices(c, job, r) for r in range(world)]
            self.assertEqual(sorted(consumed + [i for x in rest for i in x]), epoch)  # once
            left = sum(len(x) for x in rest)
            for r in range(world):
                want = left * w[r] / sum(w)
                self.assertLess(abs(len(rest[r]) - want), 1, (rest, w))
            self.restart()  # the weights of the chain survive a restart
            c = self.c
            self.assertEqual([indices(c, job, r) for r in range(world)], rest)

    def test_weighted_batch_job_resizes_mid_epoch(self):
        """Weighted batch jobs re-plan the rest of the epoch at each mid-epoch resize: equal
        counts per rank, token budgets of the new weights, no sample served twice."""
        c = self.c
        rnd = random.Random(8)
        lengths = [rnd.randint(1, 200) for _ in range(4000)]
        c.create_dataset("tok", len(lengths))
        c.upload_lengths("tok", lengths)
        bc = dict(strategy="dynamic", max_batch_size=64, max_seq_len=256, max_tokens=4096)
        # Before anyone progressed: a plain change of world and weights.
        create(c, "w", "tok", 2, batching=bc, seed=3)
        self.assertEqual(list(c.resize_job("w", 3, rank_weights=(1, 0.5, 0.5)).rank_weights),
                         [1, 0.5, 0.5])
        plan = [tuple(b) for r in range(3) for b in batches(c, "w", r)]
        consumed = []
        for step, (world, w) in enumerate(((3, None), (2, (1, 2)), (4, (1, 1, 0.5, 0.25)),
                                           (3, None))):
            per = [batches(c, "w", r) for r in range(world)]
            self.assertEqual(len({len(p) for p in per}), 1, w)  # lockstep
            weights = list(c.get_job("w").rank_weights) or [1] * world
            toks = [sum(lengths[i] for b in p for i in b) for p in per]
            for r in range(world):
                budget = 4096 * weights[r] / max(weights)
                for b in per[r]:
                    self.assertLessEqual(len(b) * max(lengths[i] for i in b), budget + 1e-9)
                if len(per[0]) >= 8:  # tokens follow the weights (the rest is not tiny)
                    self.assertAlmostEqual(toks[r] / toks[0], weights[r] / weights[0],
                                           delta=0.15 * weights[r] / weights[0], msg=(w, toks))
            if step == 3:
                break
            self.consume("w", world, rnd, True, consumed)
            nworld, nw = ((2, (1, 2)), (4, (1, 1, 0.5, 0.25)), (3, None))[step]
            got = c.resize_job("w", nworld, rank_weights=nw)
            self.assertEqual(list(got.rank_weights), list(nw or ()))
            if step == 1:
                self.restart()  # the re-plans are recomputed from the stored chain
                c = self.c
        rest = [tuple(b) for p in per for b in p]
        served = [i for b in consumed + rest for i in b]
        self.assertEqual(len(served), len(set(served)))  # never twice
        # Each re-plan drops fewer than a world's batches (the plan's remainder rule).
        self.assertGreater(len(served), 0.9 * sum(len(b) for b in plan))
        self.assertTrue(set(served) <= {i for b in plan for i in b})
        for r in range(world):
            c.report_progress("w", r, 0, len(per[r]))
        self.assertEqual(c.get_job("w").epoch, 1)
        self.assertEqual(c.get_epoch("w").dp_size, 3)
        # Everything consumed (manual advance keeps the epoch open): the rest plans into none.
        create(c, "m", "tok", 2, rank_weights=(1, 0.5), batching=bc, manual_advance=True)
        for r in range(2):
            c.report_progress("m", r, 0, len(batches(c, "m", r)))
        c.resize_job("m", 3, rank_weights=(1, 1, 1))
        self.assertEqual([batches(c, "m", r) for r in range(3)], [[], [], []])
        self.assertEqual([x.count for x in c.get_epoch("m").ranks], [0, 0, 0])
        # An epoch whose batches were dealt out as they are (unweighted resize) does not switch
        # to re-planning halfway: weights then wait for the next epoch, the job as it was.
        create(c, "u", "tok", 2, batching=bc)
        self.consume("u", 2, rnd, True, [])
        c.report_progress("u", 0, 0, 1)
        c.resize_job("u", 3)
        c.report_progress("u", 1, 0, 1)
        code, msg = self.code(c.resize_job, "u", 2, rank_weights=(1, 2))
        self.assertEqual(code, C.FAILED_PRECONDITION)
        self.assertIn("new rank weights apply from the next epoch", msg)
        self.assertEqual(c.get_job("u").world_size, 3)
        c.resize_job("u", 2)


if __name__ == "__main__":
    unittest.main()


class ResizeChainTest(DaemonClientTest):
    """Issue 25, item 8: a Resize that chains builds its chain, index plan and elastic blob on
    the worker pool; the loop only commits. The 83rd resize of a 65,536-rank job used to hold the
    loop for about a second (rebuilding every step, and SQLite rewriting a blob of 512 KiB per
    step), so every other call of the daemon waited as long."""

    WORLD, RESIZES = (8192, 30) if SANITIZED else (65536, 82)
    LIMIT = 0.2  # seconds: the longest a health check or another job's GetJob may take

    def test_resize_chain_leaves_the_loop_free(self):
        c = self.c
        c.create_dataset("big", self.WORLD * 64)
        c.create_dataset("small", 100)
        create(c, "other", "small", 2)
        create(c, "chain", "big", self.WORLD, seed=1)
        for k in range(self.RESIZES):
            c.report_progress("chain", k % 7, 0, 1)  # a new step, not a re-plan of the last
            self.assertTrue(c.resize_job("chain", self.WORLD).resized_in_epoch)
        # One more, while a thread calls Health.Check and another job's GetJob back to back.
        from sluice._health import health_pb2 as hp
        ch = grpc.insecure_channel(self.d.addr)
        check = ch.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=hp.HealthCheckRequest.SerializeToString,
                               response_deserializer=hp.HealthCheckResponse.FromString)
        check(hp.HealthCheckRequest(), timeout=30)
        calls, stop = [], threading.Event()

        def probe():
            while not stop.is_set():
                for fn in (lambda: check(hp.HealthCheckRequest(), timeout=30),
                           lambda: c.get_job("other")):
                    t0 = time.monotonic()
                    fn()
                    calls.append((t0, time.monotonic()))
                time.sleep(0.002)

        t = threading.Thread(target=probe)
        t.start()
        try:
            time.sleep(0.1)
            c.report_progress("chain", 1, 0, 2)
            t0 = time.monotonic()
            job = c.resize_job("chain", self.WORLD)
            t1 = time.monotonic()
            time.sleep(0.1)
        finally:
            stop.set()
            t.join()
            ch.close()
        during = [e - s for s, e in calls if e > t0 and s < t1]
        self.assertTrue(job.resized_in_epoch)
        self.assertGreater(len(during), 0)
        self.assertLess(max(during), self.LIMIT,
                        "resize %d took %.3f s; calls meanwhile took up to %.3f s"
                        % (self.RESIZES + 1, t1 - t0, max(during)))
        # The chain is whole: every step's shares, equal counts over the world.
        ep = c.get_epoch("chain")
        self.assertEqual(ep.dp_size, self.WORLD)
        self.assertEqual(len({r.count for r in ep.ranks}), 1)
        self.assertEqual(ep.ranks[0].position, 0)
        # And survives a restart (the blob of runs is read back).
        self.restart()
        ep2 = self.c.get_epoch("chain")
        self.assertEqual([r.count for r in ep2.ranks], [r.count for r in ep.ranks])
        self.assertEqual((ep2.left_out, ep2.padded), (ep.left_out, ep.padded))
