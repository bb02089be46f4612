"""`sluice batch` end to end: output format, per-rank slices, determinism, formats and errors.

Runs the real binary named by $SLUICE_CLI on small length files.
"""
import json
import os
import struct
import subprocess
import tempfile
import unittest

CLI = os.environ.get("SLUICE_CLI", "sluice")


def run(*args, stdin=None):
    return subprocess.run([CLI, "batch", *args], input=stdin, capture_output=True, timeout=60)


def lines(p):
    return [json.loads(x) for x in p.stdout.decode().splitlines()]


class BatchCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        import random
        rng = random.Random(4)
        cls.lengths = [max(1, min(4096, int(rng.lognormvariate(5.5, 1)))) for _ in range(3000)]
        cls.text = os.path.join(cls.tmp.name, "lengths.txt")
        with open(cls.text, "w") as f:
            f.write("\n".join(str(x) for x in cls.lengths) + "\n")
        cls.u32 = os.path.join(cls.tmp.name, "lengths.u32")
        with open(cls.u32, "wb") as f:
            f.write(struct.pack("<%dI" % len(cls.lengths), *cls.lengths))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def write(self, name, data):
        path = os.path.join(self.tmp.name, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def plan(self, *extra, path=None):
        p = run("--lengths", path or self.text, "--max-batch-size", "256", "--max-seq-len", "4096",
                "--max-tokens", "16384", *extra)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        out = lines(p)
        self.assertIn("summary", out[-1])
        return out[:-1], out[-1]["summary"]

    def test_every_strategy_stays_in_budget_and_covers_the_epoch(self):
        for strategy in ["pad", "bucket", "dynamic", "packed"]:
            for cost in (["sum"] if strategy == "packed" else ["padded", "sum"]):
                with self.subTest(strategy=strategy, cost=cost):
                    batches, s = self.plan("--strategy", strategy, "--cost", cost,
                                           "--window", "500")
                    seen = []
                    for b in batches:
                        for k in ("indices", "max_len", "tokens", "padded_tokens"):
                            self.assertIn(k, b)
                        lens = [self.lengths[i] for i in b["indices"]]
                        self.assertEqual(b["max_len"], max(lens))
                        self.assertEqual(b["tokens"], sum(lens))
                        self.assertEqual(b["padded_tokens"], len(lens) * max(lens))
                        cost_v = b["padded_tokens"] if cost == "padded" else b["tokens"]
                        self.assertLessEqual(cost_v, 16384)
                        self.assertLessEqual(len(lens), 256)
                        seen += b["indices"]
                    self.assertEqual(sorted(seen), list(range(len(self.lengths))))
                    self.assertEqual(s["batches"], len(batches))
                    self.assertEqual(s["strategy"], strategy)
                    for k in ("padding_fraction", "fill", "truncated", "skipped"):
                        self.assertIn(k, s)

    def test_ranks_get_equal_counts_and_their_own_slice(self):
        allb, s = self.plan("--replicas", "3", "--seed", "9", "--epoch", "2")
        per = s["batches_per_rank"]
        self.assertEqual(s["batches"], 3 * per)
        self.assertEqual(s["dropped"] + sum(len(b["indices"]) for b in allb), len(self.lengths))
        for r in range(3):
            mine, rs = self.plan("--replicas", "3", "--rank", str(r), "--seed", "9",
                                 "--epoch", "2")
            self.assertEqual(len(mine), per)
            self.assertEqual(rs["rank"], r)
            self.assertEqual(mine, [b for b in allb if b["rank"] == r])
            self.assertEqual([b["step"] for b in mine], list(range(per)))
        padded, ps = self.plan("--replicas", "7", "--remainder", "pad")
        self.assertEqual(ps["dropped"], 0)
        self.assertEqual(len(padded), 7 * ps["batches_per_rank"])
        self.assertEqual(len({i for b in padded for i in b["indices"]}), len(self.lengths))

    def test_deterministic_and_epoch_dependent(self):
        a = run("--lengths", self.text, "--max-batch-size", "64", "--max-seq-len", "4096",
                "--seed", "5", "--epoch", "1", "--window", "300")
        b = run("--lengths", self.text, "--max-batch-size", "64", "--max-seq-len", "4096",
                "--seed", "5", "--epoch", "1", "--window", "300")
        c = run("--lengths", self.text, "--max-batch-size", "64", "--max-seq-len", "4096",
                "--seed", "5", "--epoch", "2", "--window", "300")
        self.assertEqual(a.returncode, 0)
        self.assertEqual(a.stdout, b.stdout)
        self.assertNotEqual(a.stdout, c.stdout)
        for shuffle in ("none", "torch", "feistel"):
            x = run("--lengths", self.text, "--max-batch-size", "64", "--max-seq-len", "4096",
                    "--shuffle", shuffle, "--stats")
            self.assertEqual(x.returncode, 0, x.stderr)
            self.assertEqual(lines(x)[0]["summary"]["shuffle"], shuffle)

    def test_u32_equals_text_and_stats_only(self):
        _, s1 = self.plan("--strategy", "packed")
        _, s2 = self.plan("--strategy", "packed", "--lengths-format", "u32", path=self.u32)
        self.assertEqual(s1, s2)
        p = run("--lengths", self.text, "--max-batch-size", "8", "--max-seq-len", "512",
                "--stats")
        out = lines(p)
        self.assertEqual(len(out), 1)
        self.assertGreater(out[0]["summary"]["truncated"], 0)
        p = run("--lengths", "-", "--max-batch-size", "8", "--max-seq-len", "512", "--stats",
                "--skip-long", stdin=b"3\n700\n5\n")
        self.assertEqual(p.returncode, 0, p.stderr)
        s = lines(p)[0]["summary"]
        self.assertEqual((s["skipped"], s["sequences"]), (1, 2))

    def test_seed_003_padded_cost(self):
        # Summing lengths would put [100, 100, 500] in one batch of max_tokens 1000 (700 tokens)
        # but a padding trainer computes 3 x 500 = 1500. sluice splits it.
        path = self.write("seed.txt", b"100\n100\n500\n")
        batches, s = self.plan("--max-tokens", "1000", "--max-seq-len", "512", "--keep-order",
                               "--shuffle", "none", path=path)
        self.assertEqual([b["indices"] for b in batches], [[0, 1], [2]])
        batches, s = self.plan("--max-tokens", "1000", "--max-seq-len", "512", "--cost", "sum",
                               "--shuffle", "none", path=path)
        self.assertEqual(len(batches), 1)

    def sample(self, n, *args):
        p = subprocess.run([CLI, "sample", "--samples", str(n), *args], capture_output=True,
                           timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        return [int(x) for x in p.stdout.split()]

    def test_partition_interleaved_is_the_samplers_padded_or_cut_order(self):
        # 1000 samples over 3 ranks: torch's layout pads the order to 1002 by wrap-around, or
        # cuts it to 999 with --drop-last; the plan covers exactly what the sampler hands out.
        path = self.write("l1000.txt", "\n".join(str(x) for x in self.lengths[:1000]).encode())
        opts = ["--replicas", "3", "--seed", "4", "--epoch", "1", "--remainder", "pad"]
        for drop in (False, True):
            with self.subTest(drop_last=drop):
                extra = ["--drop-last"] if drop else ["--partition", "interleaved"]
                batches, s = self.plan(*opts, *extra, path=path)
                self.assertEqual(s["partition"], "interleaved")
                self.assertEqual(s["order"], 999 if drop else 1002)
                self.assertEqual(s["sequences"] - s["repeated"], s["order"])
                share = set()
                for r in range(3):
                    share |= set(self.sample(1000, "--replicas", "3", "--rank", str(r), "--seed",
                                             "4", "--epoch", "1", *(["--drop-last"] if drop
                                                                    else [])))
                self.assertEqual({i for b in batches for i in b["indices"]}, share)
        # Without --partition the order is every sample once.
        _, s = self.plan(*opts, path=path)
        self.assertEqual((s["partition"], s["order"]), ("none", 1000))

    def test_partition_chunked_and_contiguous_keep_their_units_together(self):
        # With a window of one chunk (or one block), packing never mixes two of them, and the
        # plan still covers every sample.
        n = len(self.lengths)
        for part, unit, extra in (("chunked", 100, ["--chunk-size", "100"]),
                                  ("contiguous", n // 4, [])):
            with self.subTest(partition=part):
                batches, s = self.plan("--partition", part, *extra, "--replicas", "4",
                                       "--strategy", "packed", "--window", str(unit),
                                       "--remainder", "pad", "--shuffle", "torch", "--seed", "3")
                self.assertEqual(s["partition"], part)
                for b in batches:
                    self.assertEqual(len({i // unit for i in b["indices"]}), 1, b["indices"])
                self.assertEqual({i for b in batches for i in b["indices"]}, set(range(n)))

    def test_mesh_ranks_read_their_dp_ranks_batches(self):
        # 8 ranks as dp 2 x tp 2 x cp 2 (default order pp,dp,cp,tp): global rank g has dp rank
        # (g // 4) % 2 and reads what --replicas 2 --rank dp gives.
        ref = [self.plan("--replicas", "2", "--rank", str(d), "--seed", "6")[0] for d in (0, 1)]
        for g in range(8):
            mine, s = self.plan("--replicas", "8", "--mesh", "2,2,2,1", "--rank", str(g),
                                "--seed", "6")
            self.assertEqual(mine, ref[(g // 4) % 2])
            self.assertEqual(s["replicas"], 2)
        mine, _ = self.plan("--replicas", "8", "--mesh", "2,2,2,1", "--mesh-order",
                            "dp,pp,cp,tp", "--rank", "5", "--seed", "6")
        self.assertEqual(mine, ref[1])

    def test_json_flag_changes_nothing(self):
        a = run("--lengths", self.text, "--max-batch-size", "64", "--max-seq-len", "4096")
        b = run("--lengths", self.text, "--max-batch-size", "64", "--max-seq-len", "4096",
                "--json")
        self.assertEqual(a.returncode, 0)
        self.assertEqual(a.stdout, b.stdout)

    def test_rank_weights_lockstep_and_budgets(self):
        batches, s = self.plan("--replicas", "3", "--rank-weights", "1,0.5,0.25")
        self.assertEqual(s["rank_weights"], [1, 0.5, 0.25])
        self.assertEqual(s["rank_max_tokens"], [16384, 8192, 4096])
        self.assertEqual(s["rank_max_batch_size"], [256, 128, 64])
        per = [[b for b in batches if b["rank"] == r] for r in range(3)]
        self.assertEqual(len({len(p) for p in per}), 1)
        for r, budget in enumerate(s["rank_max_tokens"]):
            for b in per[r]:
                self.assertLessEqual(b["padded_tokens"], budget)
        seen = [i for b in batches for i in b["indices"]]
        self.assertEqual(len(seen), len(set(seen)))
        self.assertEqual(len(seen) + s["dropped"], len(self.lengths))
        for bad, what in (("1,0,1", "rank weight 1 is 0"), ("1,-1,1", "rank weight 1 is -1"),
                          ("1,nan,1", "rank weight 1 is nan"), ("1,1", "2 rank weights for 3"),
                          ("1,1,0.0001", "below max_seq_len")):
            p = run("--lengths", self.text, "--max-batch-size", "256", "--max-seq-len", "4096",
                    "--max-tokens", "16384", "--replicas", "3", "--rank-weights", bad)
            self.assertNotEqual(p.returncode, 0, bad)
            self.assertIn(what, p.stderr.decode())

    def test_errors(self):
        def err(*args, path=None, code=1, needle=""):
            p = run("--lengths", path or self.text, *args)
            self.assertEqual(p.returncode, code, (args, p.stderr))
            self.assertIn(needle, p.stderr.decode())

        base = ["--max-batch-size", "8", "--max-seq-len", "512"]
        err(*base, path=self.write("empty.txt", b""), needle="empty")
        err(*base, path=self.write("zero.txt", b"5\n0\n7\n"), needle="zero.txt:2: length 0")
        err(*base, path=self.write("word.txt", b"5\n6\nseven\n8\n"), needle="word.txt:3:")
        err(*base, path=self.write("neg.txt", b"5\n-6\n"), needle="neg.txt:2:")
        err(*base, path=self.write("blank.txt", b"5\n\n6\n"), needle="blank.txt:2:")
        err(*base, path=self.write("big.txt", b"99999999999\n"), needle="big.txt:1:")
        err(*base, "--lengths-format", "u32", path=self.write("odd.u32", b"\x01\x00\x00"),
            needle="multiple of 4")
        err(*base, "--lengths-format", "u32", path=self.write("z.u32", b"\x00\x00\x00\x00"),
            needle="length 0")
        err(*base, path=os.path.join(self.tmp.name, "missing.txt"), needle="cannot open")
        err("--max-batch-size", "8", "--max-seq-len", "512", "--max-tokens", "100",
            needle="max_tokens 100 is smaller than max_seq_len 512")
        err("--max-batch-size", "8", "--max-seq-len", "512", "--batch-size-multiple", "16",
            needle="batch_size_multiple 16 is larger than max_batch_size 8")
        err("--max-batch-size", "4294967295", "--max-seq-len", "4096", needle="set max_tokens")
        err("--max-batch-size", "8", "--max-seq-len", "512", "--strategy", "packed", "--cost",
            "padded", needle="packed")
        err(*base, "--strategy", "fast", code=2, needle="--strategy 'fast'")
        err(*base, "--cost", "free", code=2, needle="--cost 'free'")
        err(*base, "--replicas", "0", code=2, needle="--replicas '0'")
        err(*base, "--replicas", "4", "--rank", "4", code=2, needle="--rank 4 out of range [0, 4)")
        err(*base, "--max-tokens", "x", code=2, needle="--max-tokens 'x'")
        err("--max-batch-size", "0", "--max-seq-len", "512", code=2, needle="--max-batch-size '0'")
        err("--max-seq-len", "512", code=2, needle="required")
        err(*base, "--frobnicate", code=2, needle="unknown option")
        err(*base, "--partition", "striped", code=2, needle="--partition 'striped'")
        err(*base, "--chunk-size", "10", code=2, needle="--partition chunked only")
        err(*base, "--partition", "chunked", code=2, needle="needs --chunk-size")
        err(*base, "--partition", "chunked", "--chunk-size", "0", code=2,
            needle="--chunk-size '0'")
        err(*base, "--mesh", "2,2", code=2, needle="--mesh '2,2'")
        err(*base, "--mesh-order", "dp,tp,cp,pp", code=2, needle="needs --mesh")
        err(*base, "--replicas", "8", "--mesh", "2,2,3,1",
            needle="does not match world size 8")
        p = subprocess.run([CLI, "batch", "--help"], capture_output=True)
        self.assertEqual(p.returncode, 0)
        self.assertIn(b"--max-tokens", p.stdout)

    # ---- classes and resizes (issue 17), against the daemon's batch jobs ----

    def class_files(self):
        """4,000 samples at 90:10 with lengths 1-100, as files and lists."""
        import random
        rng = random.Random(8)
        labels = [1] * 400 + [0] * 3600
        rng.shuffle(labels)
        lengths = [rng.randint(1, 100) for _ in labels]
        lab = self.write("labels90.txt", ("\n".join(map(str, labels)) + "\n").encode())
        ln = self.write("lengths90.txt", ("\n".join(map(str, lengths)) + "\n").encode())
        return labels, lengths, lab, ln

    def cli_batches(self, ln, world, *extra):
        p = run("--lengths", ln, "--max-batch-size", "20", "--max-seq-len", "128",
                "--strategy", "pad", *extra)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        out = lines(p)
        per = [[b["indices"] for b in out[:-1] if b["rank"] == r] for r in range(world)]
        return per, out[-1]["summary"]

    def test_classes_stratified_and_balanced(self):
        labels, _, lab, ln = self.class_files()
        per, s = self.cli_batches(ln, 4, "--replicas", "4", "--seed", "3", "--labels-file", lab,
                                  "--stratify")
        self.assertEqual((s["classes"], s["order"], s["batches_per_rank"]), ("stratify", 4000, 50))
        self.assertEqual(sorted(i for x in per for b in x for i in b), list(range(4000)))
        for x in per:
            for b in x:  # every batch is a window of the stratified order: 2 +- 1 of class 1
                self.assertIn(sum(labels[i] for i in b), (1, 2, 3))
        per, s = self.cli_batches(ln, 2, "--replicas", "2", "--labels-file", lab,
                                  "--class-weights", "1,3", "--epoch-length", "3000")
        self.assertEqual((s["classes"], s["order"]), ("balance", 3000))
        flat = [i for x in per for b in x for i in b]
        self.assertEqual(len(flat), 3000)
        self.assertLess(abs(sum(labels[i] for i in flat) - 2250), 1)
        # Plain batches stray further from the proportions: the options are not ignored.
        per, _ = self.cli_batches(ln, 4, "--replicas", "4", "--seed", "3")
        self.assertTrue(any(abs(sum(labels[i] for i in b) - 2) >= 2 for x in per for b in x))

    def test_classes_and_resizes_match_the_daemon(self):
        from sltest import Daemon
        from sluice.client import Client
        labels, lengths, lab, ln = self.class_files()
        d = Daemon().start()
        c = Client(d.addr)
        try:
            c.create_dataset("ds", len(labels))
            c.upload_labels("ds", labels)
            c.upload_lengths("ds", lengths)
            bc = dict(strategy="pad", max_batch_size=20, max_seq_len=128)

            def served(job, world):
                return [[list(b.indices) for ch in c.stream_batches(job, r, step=0)
                         for b in ch.batches] for r in range(world)]

            cases = (("s", ["--stratify"], dict(stratify=True), []),
                     ("b", ["--class-weights", "1,3", "--epoch-length", "3000"],
                      dict(class_weights=[1, 3], epoch_length=3000), []),
                     ("w", ["--stratify", "--rank-weights", "1,0.5,0.5,1"], dict(stratify=True),
                      [1, 0.5, 0.5, 1]))
            for job, flags, kw, rw in cases:
                c.create_job(job, "ds", 4, seed=5, batching=bc, rank_weights=rw or None, **kw)
                base = ["--replicas", "4", "--seed", "5", "--labels-file", lab] + flags
                per, _ = self.cli_batches(ln, 4, *base)
                self.assertEqual(per, served(job, 4), job)
                # Two resizes mid-epoch: 4 -> 3 -> 2 ranks.
                first = [3, 1, 4, 2]
                for r, k in enumerate(first):
                    c.report_progress(job, r, 0, k)
                c.resize_job(job, 3)
                second = [2, 0, 1]
                for r, k in enumerate(second):
                    c.report_progress(job, r, 0, k)
                c.resize_job(job, 2)
                per, s = self.cli_batches(ln, 2, *base, "--consumed", "3,1,4,2",
                                          "--new-replicas", "3", "--resize", "2,0,1:2")
                self.assertEqual(s["resizes"], 2)
                self.assertEqual(s["replicas"], 2)
                self.assertEqual(per, served(job, 2), job)
                self.assertEqual(s["batches_per_rank"], c.get_epoch(job).ranks[0].count)
        finally:
            c.close()
            rc = d.stop()
            log = d.log()
            d.cleanup()
        self.assertEqual(rc, 0, log)

    def test_class_and_resize_errors(self):
        _, _, lab, ln = self.class_files()
        bad_lab = self.write("bad_labels.txt", b"0\n1\nx\n")
        short = self.write("short_labels.txt", b"0\n1\n")

        def err(*args, code=1, needle=""):
            p = run("--lengths", ln, "--max-batch-size", "20", "--max-seq-len", "128", *args)
            self.assertEqual(p.returncode, code, (args, p.stderr))
            self.assertIn(needle, p.stderr.decode())

        err("--stratify", needle="stratify needs labels")
        err("--labels-file", lab, needle="need --stratify, --balance-classes or --class-weights")
        err("--labels-file", bad_lab, "--stratify", needle="bad_labels.txt:3: 'x' is not a class id")
        err("--labels-file", short, "--stratify", needle="labels count 2 does not match")
        err("--labels-file", lab, "--class-weights", "1,0", code=2, needle="class weight 1 is 0")
        err("--labels-file", lab, "--class-weights", "1,1,1", needle="3 class weights for 2")
        err("--labels-file", lab, "--stratify", "--epoch-length", "10",
            needle="epoch length need class-balanced epochs")
        err("--labels-file", lab, "--stratify", "--balance-classes", code=2,
            needle="exclude each other")
        err("--labels-file", lab, "--stratify", "--shuffle", "torch", needle="torch")
        err("--labels-file", lab, "--stratify", "--partition", "interleaved", code=2,
            needle="--partition and --drop-last do not apply")
        err("--replicas", "4", "--consumed", "1,1,1,1", code=2, needle="go together")
        err("--replicas", "4", "--resize", "1,1:2", code=2, needle="--resize follows")
        err("--replicas", "4", "--consumed", "1,x", "--new-replicas", "2", code=2,
            needle="--consumed '1,x'")
        err("--replicas", "4", "--consumed", "1,1,1,1", "--new-replicas", "2", "--resize",
            "1,1", code=2, needle="--resize '1,1' is not C0,C1,...:R2")
        err("--replicas", "4", "--consumed", "1,1,1", "--new-replicas", "2",
            needle="3 consumed counts for a world of 4 ranks")
        err("--replicas", "4", "--consumed", "1,1,99,1", "--new-replicas", "2",
            needle="rank 2 consumed 99 batches, more than the 50")
        err("--replicas", "4", "--consumed", "1,1,1,1", "--new-replicas", "2", "--resize",
            "1,9999:3", needle="rank 1 consumed 9999 batches")
        err("--replicas", "4", "--consumed", "1,1,1,1", "--new-replicas", "2", "--rank", "2",
            code=2, needle="--rank 2 out of range [0, 2) of the world after the resizes")
        err("--replicas", "4", "--mesh", "4,1,1,1", "--consumed", "1,1,1,1", "--new-replicas",
            "2", code=2, needle="--consumed does not take --mesh")
        p = subprocess.run([CLI, "batch", "--help"], capture_output=True)
        for opt in (b"--labels-file", b"--stratify", b"--balance-classes", b"--class-weights",
                    b"--epoch-length", b"--consumed", b"--new-replicas", b"--resize"):
            self.assertIn(opt, p.stdout)


if __name__ == "__main__":
    unittest.main()
