"""`sluice sample`: output formats, positions, partitions, mesh, elastic remainder, and the
usage (exit 2) and configuration (exit 1) errors. Run by ctest as sample_cli."""
import json
import os
import subprocess
import unittest

CLI = os.environ.get("SLUICE_CLI", "sluice")


def run(*args):
    return subprocess.run([CLI, "sample", *map(str, args)], capture_output=True, text=True)


def ints(*args):
    p = run(*args)
    if p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}: {p.stderr}")
    return [int(x) for x in p.stdout.split()]


class Cli(unittest.TestCase):
    def test_defaults_are_feistel_seed0_epoch0(self):
        a = ints("--samples", 1000)
        self.assertEqual(sorted(a), list(range(1000)))
        self.assertNotEqual(a, list(range(1000)))
        self.assertEqual(a, ints("--samples", 1000, "--shuffle", "feistel", "--seed", 0,
                                 "--epoch", 0))
        self.assertNotEqual(a, ints("--samples", 1000, "--epoch", 1))

    def test_json_and_windows(self):
        full = ints("--samples", 50, "--replicas", 3, "--rank", 2)
        p = run("--samples", 50, "--replicas", 3, "--rank", 2, "--json")
        self.assertEqual(p.returncode, 0)
        self.assertEqual(json.loads(p.stdout), full)
        for k in (0, 1, 9, 17):
            self.assertEqual(ints("--samples", 50, "--replicas", 3, "--rank", 2, "--start", k),
                             full[k:])
        self.assertEqual(ints("--samples", 50, "--replicas", 3, "--rank", 2, "--start", 3,
                              "--count", 4), full[3:7])
        p = run("--samples", 50, "--replicas", 3, "--rank", 2, "--start", 17, "--json")
        self.assertEqual(json.loads(p.stdout), [])

    def test_partitions(self):
        self.assertEqual(ints("--samples", 10, "--replicas", 4, "--rank", 3, "--partition",
                              "contiguous", "--shuffle", "none"), [6, 7, 8, 9])
        self.assertEqual(ints("--samples", 10, "--replicas", 2, "--rank", 1, "--partition",
                              "chunked", "--chunk-size", 3, "--shuffle", "none"), [3, 4, 5, 9])
        seen = []
        for r in range(3):
            seen += ints("--samples", 100, "--replicas", 3, "--rank", r, "--partition",
                         "chunked", "--chunk-size", 7)
        self.assertEqual(sorted(seen), list(range(100)))

    def test_mesh_seed_001(self):
        # 8 ranks, DP=2 TP=2 CP=2: dp 0 reads 0,2,4,...; dp 1 reads 1,3,5,...
        for rank in range(8):
            got = ints("--samples", 16, "--replicas", 8, "--rank", rank, "--mesh", "2,2,2,1",
                       "--shuffle", "none")
            self.assertEqual(got, list(range(rank // 4, 16, 2)))
        got = ints("--samples", 16, "--replicas", 8, "--rank", 1, "--mesh", "2,2,2,1",
                   "--mesh-order", "pp,tp,cp,dp", "--shuffle", "none")
        self.assertEqual(got, list(range(1, 16, 2)))

    def test_elastic(self):
        n, R, consumed = 103, 4, [10, 12, 9, 11]
        old = [ints("--samples", n, "--replicas", R, "--rank", r, "--drop-last",
                    "--seed", 5) for r in range(R)]
        read = [i for r in range(R) for i in old[r][:consumed[r]]]
        rest, shares = [], []
        args = ("--samples", n, "--replicas", R, "--drop-last", "--seed", 5, "--consumed",
                ",".join(map(str, consumed)), "--new-replicas", 3)
        for r in range(3):
            shares.append(ints(*args, "--rank", r))
            rest += shares[-1]
        # Equal counts, so DDP ranks take the same steps: the rest of 58 is cut to 3 x 19 and
        # its last index is left out, stated by --left-out.
        self.assertEqual([len(s) for s in shares], [19, 19, 19])
        out = ints(*args, "--left-out")
        self.assertEqual(len(out), 1)
        self.assertEqual(sorted(read + rest + out), sorted(i for s in old for i in s))
        self.assertEqual(json.loads(run(*args, "--left-out", "--json").stdout), out)
        # Without drop_last the rest is padded to equal counts and nothing is left out.
        pad = [ints("--samples", n, "--replicas", R, "--seed", 5, "--consumed",
                    ",".join(map(str, consumed)), "--new-replicas", 3, "--rank", r)
               for r in range(3)]
        self.assertEqual({len(s) for s in pad}, {-(-(26 * 4 - 42) // 3)})
        self.assertEqual(ints("--samples", n, "--replicas", R, "--seed", 5, "--consumed",
                              ",".join(map(str, consumed)), "--new-replicas", 3, "--left-out"),
                         [])
        p = run("--samples", n, "--left-out")
        self.assertEqual(p.returncode, 2, p.stderr)

    def _labels(self, labels):
        import tempfile
        f = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
        f.write("".join(f"{x}\n" for x in labels))
        f.close()
        self.addCleanup(os.unlink, f.name)
        return f.name

    def test_stratify_balance_weights(self):
        labels = [0] * 90 + [1] * 9 + [2]
        lf = self._labels(labels)
        seen = []
        for r in range(4):
            share = ints("--samples", 100, "--replicas", 4, "--rank", r, "--labels-file", lf,
                         "--stratify", "--drop-last")
            counts = [sum(1 for i in share if labels[i] == c) for c in range(3)]
            self.assertIn(counts[1], (2, 3))
            self.assertIn(counts[2], (0, 1))
            seen += share
        self.assertEqual(len(seen), len(set(seen)))
        self.assertEqual(len(seen), 100)
        drawn = []
        for r in range(2):
            drawn += ints("--samples", 100, "--replicas", 2, "--rank", r, "--labels-file", lf,
                          "--balance-classes", "--epoch-length", 60)
        self.assertEqual([sum(1 for i in drawn if labels[i] == c) for c in range(3)],
                         [20, 20, 20])
        a = ints("--samples", 10, "--replicas", 2, "--rank", 0, "--rank-weights", "3,1")
        b = ints("--samples", 10, "--replicas", 2, "--rank", 1, "--rank-weights", "3,1")
        self.assertEqual((len(a), len(b)), (8, 2))
        self.assertEqual(sorted(a + b), list(range(10)))

    def test_chained_resizes(self):
        base = [ints("--samples", 40, "--replicas", 2, "--rank", r) for r in range(2)]
        mid = [ints("--samples", 40, "--replicas", 2, "--consumed", "5,7", "--new-replicas", 3,
                    "--rank", r) for r in range(3)]
        last = [ints("--samples", 40, "--replicas", 2, "--consumed", "5,7", "--new-replicas", 3,
                     "--resize", "2,0,4:2", "--rank", r) for r in range(2)]
        read = base[0][:5] + base[1][:7] + mid[0][:2] + mid[2][:4] + last[0] + last[1]
        self.assertEqual(sorted(read), list(range(40)))

    def test_weighted_resizes(self):
        """Each resize may weight its new world (--new-rank-weights for the first, ":W0,..."
        after a --resize's world size): the rest is split in proportion to them, every index of
        the epoch read exactly once."""
        n, args = 200, ("--samples", 200, "--replicas", 2, "--seed", 3, "--drop-last")
        base = [ints(*args, "--rank", r) for r in range(2)]
        step1 = ("--consumed", "10,30", "--new-replicas", 3, "--new-rank-weights", "1,2,1")
        mid = [ints(*args, *step1, "--rank", r) for r in range(3)]
        self.assertEqual([len(s) for s in mid], [40, 80, 40])  # 160 left, 1:2:1
        step2 = ("--resize", "5,20,0:2:3,1")
        last = [ints(*args, *step1, *step2, "--rank", r) for r in range(2)]
        self.assertEqual([len(s) for s in last], [101, 34])  # 135 left, 3:1 by largest remainder
        step3 = ("--resize", "1,4:4:1,1,1,2")
        tail = [ints(*args, *step1, *step2, *step3, "--rank", r) for r in range(4)]
        self.assertEqual([len(s) for s in tail], [26, 26, 26, 52])  # 130 left, 1:1:1:2
        read = (base[0][:10] + base[1][:30] + mid[0][:5] + mid[1][:20] + last[0][:1] +
                last[1][:4] + [i for s in tail for i in s])
        self.assertEqual(sorted(read), list(range(n)))
        # Unweighted steps between weighted ones give equal counts (135 left: one left out).
        plain = [ints(*args, *step1, "--resize", "5,20,0:2", "--rank", r) for r in range(2)]
        self.assertEqual([len(s) for s in plain], [67, 67])
        self.assertEqual(len(ints(*args, *step1, "--resize", "5,20,0:2", "--left-out")), 1)
        # Bad weights name the value; a weight count other than the new world's is refused.
        p = run(*args, *step1, "--resize", "5,20,0:2:3,0")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("rank weight 1 is 0", p.stderr)
        p = run(*args, *step1, "--resize", "5,20,0:2:3,x")
        self.assertEqual(p.returncode, 2, p.stderr)
        p = run(*args, *step1, "--resize", "5,20,0:2:1,1,1")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("3 rank weights for a new dp world of 2 ranks", p.stderr)
        p = run(*args, "--consumed", "10,30", "--new-replicas", 3, "--new-rank-weights", "1,2")
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("2 rank weights for a new dp world of 3 ranks", p.stderr)
        p = run(*args, "--new-rank-weights", "1,2")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--new-rank-weights goes with --consumed", p.stderr)
        for bad in ("5,20,0", "5,20,0:", "5,20,0:0", "5,20,0:x:1"):
            p = run(*args, *step1, "--resize", bad)
            self.assertEqual(p.returncode, 2, (bad, p.stderr))

    def test_class_errors_exit_1(self):
        lf = self._labels([0, 1, 1])
        for args, needle in (
                (("--samples", 4, "--labels-file", lf, "--stratify"),
                 "labels count 3 does not match samples 4"),
                (("--samples", 3, "--stratify"), "stratify needs labels"),
                (("--samples", 3, "--labels-file", lf, "--class-weights", "1,1,1"),
                 "3 class weights for 2 class ids"),
                (("--samples", 3, "--replicas", 2, "--rank-weights", "1"),
                 "1 rank weights for a dp world of 2 ranks")):
            p = run(*args)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn(needle, p.stderr)
        for w in ("1,0", "1,-1", "1,nan", "1,inf"):
            p = run("--samples", 3, "--replicas", 2, "--rank-weights", w)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn("rank weight 1 is", p.stderr)

    def test_config_errors_exit_1(self):
        for args, msg in [
            (("--samples", 10, "--replicas", 8, "--rank", 9), "rank 9 out of range [0, 8)"),
            (("--samples", 0), "samples 0"),
            (("--samples", 10, "--replicas", 0), "replicas 0"),
            (("--samples", 10, "--partition", "chunked", "--chunk-size", 0), "chunk size 0"),
            (("--samples", 10, "--replicas", 6, "--mesh", "2,2,2,1"), "world size 6"),
            (("--samples", 10, "--epoch", 2**63), "epoch 9223372036854775808 out of range"),
            (("--samples", 300000000, "--shuffle", "torch"), "too many for shuffle torch"),
            (("--samples", 10, "--start", 11), "start 11 past the end"),
            (("--samples", 10, "--replicas", 2, "--consumed", "6,0", "--new-replicas", 3),
             "consumed 6 for old rank 0 exceeds its share of 5"),
        ]:
            p = run(*args)
            self.assertEqual(p.returncode, 1, (args, p.stderr))
            self.assertIn(msg, p.stderr)
            self.assertEqual(p.stdout, "")

    def test_usage_errors_exit_2(self):
        for args in [(), ("--samples", "-1"), ("--samples", "ten"), ("--samples", 5, "extra"),
                     ("--samples", 5, "--shuffle", "random"), ("--samples", 5, "--bogus"),
                     ("--samples", 5, "--partition", "blocks"), ("--samples",),
                     ("--samples", 5, "--mesh", "2,2"), ("--samples", 5, "--mesh-order", "dp"),
                     ("--samples", 5, "--consumed", "1,2")]:
            p = run(*args)
            self.assertEqual(p.returncode, 2, (args, p.stdout, p.stderr))

    def test_help(self):
        p = run("--help")
        self.assertEqual(p.returncode, 0)
        self.assertIn("--partition", p.stdout)
        self.assertIn("--drop-last", p.stdout)
        self.assertIn("--resize C0,..:R2[:W0,..]", p.stdout)
        self.assertIn("--new-rank-weights", p.stdout)
        # A long option spec never runs into its description.
        self.assertNotIn("...target", p.stdout)
        self.assertIn("--class-weights W0,W1,...\n", p.stdout)


if __name__ == "__main__":
    unittest.main()
