"""Sampling II through the daemon (issue 17): dataset labels (upload, checksums, crash recovery,
bad input) and jobs with stratified shares, class-balanced epochs and rank weights, streamed from
the real sluiced on 127.0.0.1 (port 0, temporary data dir) with the Python client; per-rank class
proportions compared with scikit-learn's StratifiedKFold on the same labels."""
import collections
import hashlib
import os
import random
import struct
import unittest

import grpc

from sluice.client import Client
from sltest import DaemonClientTest, cli

C = grpc.StatusCode


def imbalanced(n, weights, seed=1):
    """n labels drawn with the given class weights, every class present."""
    rng = random.Random(seed)
    labels = rng.choices(range(len(weights)), weights=weights, k=n)
    for c in range(len(weights)):
        labels[c] = c
    return labels


class Sampling2Test(DaemonClientTest):

    def shares(self, job, world, epoch=None):
        out = []
        for r in range(world):
            idx = []
            for ch in self.c.stream_indices(job, r, epoch=epoch):
                idx.extend(ch.indices)
            out.append(idx)
        return out

    def dataset(self, name, labels):
        self.c.create_dataset(name, len(labels))
        return self.c.upload_labels(name, labels)

    # ---- labels ----

    def test_labels_upload_and_bad_input(self):
        d = self.dataset("ds", [2, 0, 1, 1, 0])
        self.assertTrue(d.has_labels)
        self.assertEqual(d.classes, 3)
        self.assertEqual(d.labels_sha256,
                         hashlib.sha256(struct.pack("<5I", 2, 0, 1, 1, 0)).hexdigest())
        with open(os.path.join(self.d.data_dir, "datasets", "ds.labels"), "rb") as f:
            self.assertEqual(struct.unpack("<5I", f.read()), (2, 0, 1, 1, 0))
        code, msg = self.code(self.c.upload_labels, "ds", [0, 1, 2])
        self.assertEqual(code, C.INVALID_ARGUMENT)
        self.assertIn("got 3 labels", msg)
        self.assertIn("5 samples", msg)
        code, msg = self.code(self.c.upload_labels, "ds", [0, 1, 1 << 20, 0, 0])
        self.assertEqual(code, C.INVALID_ARGUMENT)
        self.assertIn("label 1048576 of sample 2", msg)
        code, _ = self.code(self.c.upload_labels, "nope", [0])
        self.assertEqual(code, C.NOT_FOUND)
        # Refused uploads left the stored labels and no temporary file.
        d = self.c.get_dataset("ds")
        self.assertEqual((d.classes, d.labels_sha256[:8]),
                         (3, hashlib.sha256(struct.pack("<5I", 2, 0, 1, 1, 0)).hexdigest()[:8]))
        self.assertEqual(sorted(os.listdir(os.path.join(self.d.data_dir, "datasets"))),
                         ["ds.labels"])
        # While a job uses them, the labels cannot change.
        self.c.create_job("j", "ds", 1, stratify=True)
        code, msg = self.code(self.c.upload_labels, "ds", [0] * 5)
        self.assertEqual(code, C.FAILED_PRECONDITION)
        self.assertIn("already has labels", msg)
        self.c.delete_job("j")
        self.assertEqual(self.c.upload_labels("ds", [0] * 5).classes, 1)
        self.c.delete_dataset("ds")
        self.assertEqual(os.listdir(os.path.join(self.d.data_dir, "datasets")), [])

    def test_labels_crash_recovery(self):
        self.dataset("ds", [1, 0, 1])
        sha = self.c.get_dataset("ds").labels_sha256
        ddir = os.path.join(self.d.data_dir, "datasets")
        self.c.close()
        self.d.stop()
        # A crash mid-upload (a .tmp), one after the catalog write (a staged file the catalog
        # has), and a labels file of a dataset the catalog does not know.
        good = os.path.join(ddir, "ds.labels")
        with open(good, "rb") as f:
            data = f.read()
        os.rename(good, os.path.join(ddir, ".ds.labels.%s.new" % sha))
        with open(os.path.join(ddir, ".ds.labels.7.tmp"), "wb") as f:
            f.write(b"\0" * 4)
        with open(os.path.join(ddir, "ghost.labels"), "wb") as f:
            f.write(b"\0" * 4)
        self.d.start()
        self.c = Client(self.d.addr)
        self.assertEqual(sorted(os.listdir(ddir)), ["ds.labels"])
        with open(good, "rb") as f:
            self.assertEqual(f.read(), data)
        self.assertTrue(any("ghost.labels" in n for _, _, fs in
                            os.walk(os.path.join(self.d.data_dir, "quarantine")) for n in fs))
        # The recovered labels serve a stratified job.
        self.c.create_job("j", "ds", 1, stratify=True)
        self.assertEqual(sorted(self.shares("j", 1)[0]), [0, 1, 2])

    def test_job_option_errors(self):
        self.c.create_dataset("plain", 10)
        code, msg = self.code(self.c.create_job, "j", "plain", 2, stratify=True)
        self.assertEqual(code, C.FAILED_PRECONDITION)
        self.assertIn("has none", msg)
        self.dataset("ds", [0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
        cases = [
            (dict(rank_weights=[1, 0]), "rank"),
            (dict(rank_weights=[1, -2]), "-2"),
            (dict(rank_weights=[1, float("nan")]), "nan"),
            (dict(rank_weights=[1, float("inf")]), "inf"),
            (dict(rank_weights=[1, 1, 1]), "3 rank weights"),
            (dict(class_weights=[1, 1]), "2 class weights"),
            (dict(class_weights=[1, 0, 1]), "class"),
            (dict(stratify=True, balance_classes=True), "exclude"),
            (dict(epoch_length=5), "epoch_length 5"),
            (dict(stratify=True, partition="contiguous"), "interleaved"),
        ]
        for kw, needle in cases:
            with self.subTest(kw=kw):
                code, msg = self.code(self.c.create_job, "j", "ds", 2, **kw)
                self.assertEqual(code, C.INVALID_ARGUMENT, msg)
                self.assertIn(needle, msg.lower() if needle.islower() else msg)
        self.assertEqual(self.c.list_jobs(), [])

    def test_cli(self):
        import json
        import tempfile
        labels = [0, 1, 1, 2, 0, 1, 1, 1]
        with tempfile.TemporaryDirectory() as tmp:
            u32 = os.path.join(tmp, "labels.u32")
            with open(u32, "wb") as f:
                f.write(struct.pack("<8I", *labels))
            bad = os.path.join(tmp, "bad.u32")
            with open(bad, "wb") as f:
                f.write(struct.pack("<8I", *labels[:7], 1 << 20))
            r = cli("--json", "dataset", "create", "ds", "--samples", "8", addr=self.d.addr)
            self.assertEqual(r.returncode, 0, r.stderr)
            r = cli("--json", "dataset", "labels", "ds", "--file", bad, "--format", "u32",
                    addr=self.d.addr)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("label 1048576 of sample 7", r.stderr)
            r = cli("--json", "dataset", "labels", "ds", "--file", u32, "--format", "u32",
                    addr=self.d.addr)
            self.assertEqual(r.returncode, 0, r.stderr)
            d = json.loads(r.stdout)
            self.assertEqual((d["has_labels"], d["classes"]), (True, 3))
            self.assertEqual(d["labels_sha256"],
                             hashlib.sha256(struct.pack("<8I", *labels)).hexdigest())
        r = cli("--json", "job", "create", "j", "--dataset", "ds", "--world-size", "2",
                "--stratify", addr=self.d.addr)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(json.loads(r.stdout)["stratify"])
        r = cli("--json", "job", "create", "k", "--dataset", "ds", "--world-size", "2",
                "--class-weights", "1,1", addr=self.d.addr)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("2 class weights for 3 class ids", r.stderr)
        r = cli("--json", "job", "create", "k", "--dataset", "ds", "--world-size", "2",
                "--rank-weights", "1,0", addr=self.d.addr)
        self.assertNotEqual(r.returncode, 0)
        r = cli("--json", "job", "create", "k", "--dataset", "ds", "--world-size", "2",
                "--class-weights", "1,1,2", "--epoch-length", "16", "--rank-weights", "3,1",
                addr=self.d.addr)
        self.assertEqual(r.returncode, 0, r.stderr)
        j = json.loads(r.stdout)
        self.assertEqual((j["n_class_weights"], j["epoch_length"], j["n_rank_weights"]),
                         (3, 16, 2))
        # The weights themselves, through libsluice (sl_job_get / sl_job_list) and the CLI.
        self.assertEqual((j["class_weights"], j["rank_weights"]), ([1, 1, 2], [3, 1]))
        self.assertEqual(sorted(len(s) for s in self.shares("k", 2)), [4, 12])
        r = cli("--json", "job", "show", "k", addr=self.d.addr)
        self.assertEqual(json.loads(r.stdout)["rank_weights"], [3, 1], r.stderr)
        r = cli("job", "show", "k", addr=self.d.addr)
        self.assertIn("rank weights: 3,1", r.stdout)
        self.assertIn("class weights: 1,1,2", r.stdout)
        r = cli("--json", "job", "ls", addr=self.d.addr)
        ks = [x for x in json.loads(r.stdout) if x["name"] == "k"]
        self.assertEqual([x.get("rank_weights") for x in ks], [[3, 1]], r.stdout)
        # A resize carries new weights (between epochs here: the shares of the next epoch).
        r = cli("--json", "job", "resize", "k", "--world-size", "2", "--rank-weights", "1,0.25",
                addr=self.d.addr)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["rank_weights"], [1, 0.25])
        self.assertEqual([len(s) for s in self.shares("k", 2)], [13, 3])

    # ---- jobs ----

    def check_stratified(self, labels, shares, drop_last=False):
        n, world = len(labels), len(shares)
        counts = collections.Counter(labels)
        flat = [i for s in shares for i in s]
        if drop_last:
            self.assertEqual(len(flat), len(set(flat)))
        else:
            self.assertEqual(set(flat), set(range(n)))
        for s in shares:
            got = collections.Counter(labels[i] for i in s)
            for c, nc in counts.items():
                self.assertIn(got[c], (nc // world, -(-nc // world)), (c, nc, got[c]))

    def big_labels(self, name, n):
        """A dataset of n samples with 10 classes, its labels uploaded from a u32 file by the
        CLI (fast at tens of millions)."""
        import tempfile
        import numpy as np
        labels = np.random.default_rng(1).integers(0, 10, n, dtype=np.uint32).astype("<u4")
        self.c.create_dataset(name, n)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "labels.u32")
            labels.tofile(path)
            del labels
            r = cli("dataset", "labels", name, "--file", path, "--format", "u32",
                    addr=self.d.addr, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)

    def probe_while(self, busy, other):
        """Health checks and other's calls (a Client) in turn while busy() runs in a thread:
        returns (busy's duration, the probes' largest latency, how many probes ran)."""
        import threading
        import time
        from sluice._health import health_pb2 as hp
        check = other.channel.unary_unary("/grpc.health.v1.Health/Check")
        done, took = threading.Event(), []

        def run():
            t0 = time.monotonic()
            try:
                busy()
            finally:
                took.append(time.monotonic() - t0)
                done.set()

        t = threading.Thread(target=run)
        t.start()
        worst, probes = 0.0, 0
        while not done.is_set():
            t0 = time.monotonic()
            r = hp.HealthCheckResponse.FromString(
                check(hp.HealthCheckRequest().SerializeToString(), timeout=30))
            self.assertEqual(r.status, hp.HealthCheckResponse.SERVING)
            self.assertEqual(other.get_dataset("small").name, "small")
            other.list_jobs()
            worst = max(worst, time.monotonic() - t0)
            probes += 1
            time.sleep(0.005)
        t.join(timeout=300)
        return took[0], worst, probes

    def test_damaged_labels_at_create(self):
        """A labels file that is not the catalog's (damaged on disk): the CreateJob that waited
        for its read fails DATA_LOSS naming the dataset, every time (the failure is not kept),
        and the daemon serves on; with the file repaired the job is created."""
        self.dataset("ds", [0, 1, 1, 0, 2])
        path = os.path.join(self.d.data_dir, "datasets", "ds.labels")
        with open(path, "rb") as f:
            good = f.read()
        with open(path, "wb") as f:
            f.write(struct.pack("<5I", 0, 0, 0, 0, 0))
        for _ in range(2):
            code, msg = self.code(self.c.create_job, "j", "ds", 2, stratify=True)
            self.assertEqual(code, C.DATA_LOSS, msg)
            self.assertIn("dataset 'ds'", msg)
            self.assertIn("checksum differs", msg)
        os.unlink(path)
        code, msg = self.code(self.c.create_job, "j", "ds", 2, stratify=True)
        self.assertIn("cannot open the labels of dataset 'ds'", msg)
        self.assertEqual(self.c.get_dataset("ds").name, "ds")
        with open(path, "wb") as f:
            f.write(good)
        self.assertTrue(self.c.create_job("j", "ds", 2, stratify=True).stratify)

    def test_large_labels_read_off_the_loop(self):
        """Reading a large labels file (O(N): hashed, then grouped by class) runs on the worker
        pool: while a job over it is created the daemon answers health checks and another
        client's calls promptly; after a restart, a stream of that job waits for its load."""
        n = int(os.environ.get("SL_TEST_BIG_LABELS", 30_000_000))
        self.big_labels("big", n)
        self.dataset("small", [0, 1, 0])
        other, slow = Client(self.d.addr), Client(self.d.addr, timeout=300)
        try:
            took, worst, probes = self.probe_while(
                lambda: slow.create_job("j", "big", 4, stratify=True, seed=3), other)
        finally:
            other.close()
            slow.close()
        print(f"\nlabels n={n}: create {took:.3f} s, probes {probes}, max latency "
              f"{worst * 1000:.1f} ms")
        self.assertGreater(probes, 0)
        self.assertLess(worst, took / 4, (took, worst, probes))
        self.assertTrue(self.c.get_job("j").stratify)
        # A second job over the same labels shares the copy in memory: no second read.
        self.c.create_job("j2", "big", 2, stratify=True)
        import re
        reads = re.findall(r"labels_read\b.*big", self.d.log())
        self.assertLessEqual(len(reads), len(self.d.replicas), self.d.log())
        first = next(iter(self.c.stream_indices("j", 1))).indices[:8]
        # Restarted, the jobs load while their labels are read off the loop; calls made
        # meanwhile wait for them: a checkpoint begun then is bound to its namesake feed job (not
        # begun without it), and a stream is the same stream.
        from sluice.checkpoint import Checkpoints
        self.restart()
        ck = Checkpoints(self.d.addr)
        try:
            self.assertEqual(ck.begin("j", "c1", world_size=4).feed_job, "j")
        finally:
            ck.close()
        self.assertEqual(list(next(iter(self.c.stream_indices("j", 1))).indices[:8]), list(first))
        # Damaged while the daemon was down: a call that waited for the job's load gets the
        # labels' error naming the job (DATA_LOSS), not NOT_FOUND.
        self.c.close()
        self.assertEqual(self.d.stop(), 0, self.d.log())
        with open(os.path.join(self.d.data_dir, "datasets", "big.labels"), "r+b") as f:
            f.seek(-4, os.SEEK_END)
            last = f.read(4)
            f.seek(-4, os.SEEK_END)
            f.write(b"\x07\x00\x00\x00" if last[0] != 7 else b"\x03\x00\x00\x00")
        self.d.start()
        self.c = Client(self.d.addr)
        code, details = self.code(self.c.get_job, "j")
        self.assertEqual(code, grpc.StatusCode.DATA_LOSS, details + self.d.log()[-3000:])
        self.assertIn("job 'j' cannot be loaded", details)
        self.assertIn("big", details)

    def test_stratified_job_and_restart(self):
        labels = imbalanced(3000, [1000, 100, 10, 1])
        self.dataset("ds", labels)
        job = self.c.create_job("j", "ds", 4, stratify=True, seed=7, drop_last=True)
        self.assertTrue(job.stratify)
        self.assertTrue(self.c.get_job("j").stratify)
        shares = self.shares("j", 4)
        self.check_stratified(labels, shares, drop_last=True)
        self.assertEqual(len(set(i for s in shares for i in s)), sum(len(s) for s in shares))
        # Mid-epoch restart: positions reported, the rest of every share is the same stream.
        for r in range(4):
            self.c.report_progress("j", r, 0, 100)
        self.restart()
        for r in range(4):
            rest = []
            for ch in self.c.stream_indices("j", r, epoch=0, position=100):
                rest.extend(ch.indices)
            self.assertEqual(rest, shares[r][100:])
        # Epoch 1 differs and is stratified too.
        for r in range(4):
            self.c.report_progress("j", r, 0, len(shares[r]))
        e1 = self.shares("j", 4, epoch=1)
        self.assertNotEqual(e1, shares)
        self.check_stratified(labels, e1, drop_last=True)

    def test_class_balanced_job(self):
        labels = imbalanced(2000, [50, 5, 1])
        self.dataset("ds", labels)
        job = self.c.create_job("j", "ds", 2, class_weights=[1, 1, 2], epoch_length=4000,
                                drop_last=True)
        self.assertEqual(list(job.class_weights), [1, 1, 2])
        self.assertEqual(job.epoch_length, 4000)
        shares = self.shares("j", 2)
        flat = [i for s in shares for i in s]
        self.assertEqual(len(flat), 4000)
        got = collections.Counter(labels[i] for i in flat)
        for c, w in enumerate([0.25, 0.25, 0.5]):
            self.assertAlmostEqual(got[c] / 4000, w, delta=0.01)
        # No sample of a class repeats before the class's samples ran out, in the epoch's order
        # (the shares deal it round-robin).
        order = [s[k] for k in range(len(shares[0])) for s in shares]
        for c in range(3):
            nc = labels.count(c)
            seq = [i for i in order if labels[i] == c]
            first = seq[:nc]
            self.assertEqual(len(first), len(set(first)))
        job = self.c.create_job("b", "ds", 2, balance_classes=True)
        self.assertTrue(job.balance_classes)
        flat = [i for s in self.shares("b", 2) for i in s]
        got = collections.Counter(labels[i] for i in flat)
        for c in range(3):
            self.assertAlmostEqual(got[c] / len(flat), 1 / 3, delta=0.01)

    def test_torch_sampler_settings(self):
        import sluice.torch as st
        labels = imbalanced(300, [10, 1])
        s = st.DistributedSampler(num_samples=300, num_replicas=2, rank=1, job="t",
                                  address=self.d.addr, stratify=True, labels=labels,
                                  drop_last=True, rank_weights=[1, 1])
        self.assertEqual(s.shuffle_mode, "feistel")
        self.assertTrue(self.c.get_dataset("t-data").has_labels)
        idx = list(iter(s))
        got = collections.Counter(labels[i] for i in idx)
        for c, nc in collections.Counter(labels).items():
            self.assertIn(got[c], (nc // 2, -(-nc // 2)))
        for kw, key in [(dict(stratify=False), "stratify"),
                        (dict(stratify=True, rank_weights=[2, 1]), "rank_weights")]:
            with self.subTest(kw=kw):
                with self.assertRaises(st.JobMismatchError) as e:
                    st.DistributedSampler(num_samples=300, num_replicas=2, rank=0, job="t",
                                          address=self.d.addr, drop_last=True,
                                          shuffle_mode="feistel", labels=labels, **kw)
                self.assertIn(key, str(e.exception))

    def test_weighted_shares(self):
        self.c.create_dataset("ds", 1000)
        job = self.c.create_job("j", "ds", 3, rank_weights=[2, 1, 1], drop_last=True)
        self.assertEqual(list(job.rank_weights), [2, 1, 1])
        shares = self.shares("j", 3)
        self.assertEqual([len(s) for s in shares], [500, 250, 250])
        flat = [i for s in shares for i in s]
        self.assertEqual(sorted(flat), list(range(1000)))

    def test_against_sklearn_stratified_kfold(self):
        try:
            from sklearn.model_selection import StratifiedKFold
        except ImportError:
            self.skipTest("scikit-learn is not installed (deps.sh --test installs it)")
        labels = imbalanced(5003, [500, 50, 5, 1], seed=3)
        world = 5
        self.dataset("ds", labels)
        self.c.create_job("j", "ds", world, stratify=True, seed=11, drop_last=True)
        ours = sorted(sorted(collections.Counter(labels[i] for i in s).items())
                      for s in self.shares("j", world))
        skf = StratifiedKFold(n_splits=world, shuffle=True, random_state=11)
        theirs = sorted(sorted(collections.Counter(labels[i] for i in test).items())
                        for _, test in skf.split([[0]] * len(labels), labels))
        # StratifiedKFold's folds hold each class in floor or ceil of n_c / k, as ours do: the
        # per-class counts of every share match one of its folds' within one sample.
        for a, b in zip(ours, theirs):
            da, db = dict(a), dict(b)
            for c in set(da) | set(db):
                self.assertLessEqual(abs(da.get(c, 0) - db.get(c, 0)), 1, (c, a, b))


if __name__ == "__main__":
    unittest.main()
