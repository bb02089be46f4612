"""libsluice as a program outside this tree sees it.

`cmake --install` of the build into a temporary prefix; then, using only that prefix (pkg-config
with the installed sluice.pc, no path into the source or build tree):

- consumer.c compiles with strict warnings and links against the installed libsluice.so, and runs
  against a real sluiced on 127.0.0.1 port 0 (error codes, option _INIT initialisers and their
  version check, a dataset, a job, two index streams, a checkpoint, a NOT_FOUND);
- `nm -D --defined-only` of the installed library lists exactly the functions the installed
  headers declare with SL_API, every function they declare is marked SL_API, and each has a
  contract comment right above it.

Environment (from ctest): SLUICED, SLUICE_BUILD_DIR (the build tree to install from), SLUICE_CC
(the C compiler), SLUICE_CONSUMER_FLAGS (extra compile and link flags: the sanitizers of a
sanitized build, whose libsluice.so needs their runtime).
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import unittest

from sltest import Daemon

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_DIR = os.environ.get("SLUICE_BUILD_DIR")
CC = os.environ.get("SLUICE_CC", "cc")
EXTRA_FLAGS = shlex.split(os.environ.get("SLUICE_CONSUMER_FLAGS", ""))
STRICT = ["-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Wshadow", "-Wstrict-prototypes",
          "-Wmissing-prototypes", "-Werror"]


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def strip_comments(text):
    return re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)


def declarations(text):
    """(name, exported, line) of each top-level function declaration of a header's text."""
    code = strip_comments(text)
    code = re.sub(r"^[ \t]*#.*$", "", code, flags=re.M)
    code = re.sub(r'extern\s+"C"\s*\{', "", code)
    out, depth, start = [], 0, 0
    for i, ch in enumerate(code):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth = max(depth - 1, 0)
        elif ch == ";" and depth == 0:
            stmt = code[start:i]
            first = start + len(stmt) - len(stmt.lstrip())
            start = i + 1
            flat = " ".join(stmt.split())
            m = re.match(r"(SL_API\s+)?(?!typedef\b)[\w\s\*]*?\b(\w+)\s*\(", flat)
            if m:
                out.append((m.group(2), bool(m.group(1)), code.count("\n", 0, first) + 1))
        if ch == "}" and depth == 0:
            start = i + 1
    return out


@unittest.skipUnless(BUILD_DIR, "SLUICE_BUILD_DIR not set")
class ConsumerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="sluice-consumer-")
        cls.prefix = os.path.join(cls.tmp, "prefix")
        r = run(["cmake", "--install", BUILD_DIR, "--prefix", cls.prefix])
        if r.returncode != 0:
            raise AssertionError("cmake --install failed:\n" + r.stdout + r.stderr)
        pcs = glob.glob(os.path.join(cls.prefix, "**", "pkgconfig", "sluice.pc"), recursive=True)
        if len(pcs) != 1:
            raise AssertionError("no single installed sluice.pc: %r" % pcs)
        # Only the prefix: PKG_CONFIG_LIBDIR replaces the system search path.
        cls.pc_env = dict(os.environ, PKG_CONFIG_LIBDIR=os.path.dirname(pcs[0]))
        cls.pc_env.pop("PKG_CONFIG_PATH", None)
        r = run(["pkg-config", "--cflags", "--libs", "sluice"], env=cls.pc_env)
        if r.returncode != 0:
            raise AssertionError("pkg-config sluice failed: " + r.stderr)
        cls.pc_flags = shlex.split(r.stdout)
        r = run(["pkg-config", "--variable=libdir", "sluice"], env=cls.pc_env)
        cls.libdir = os.path.realpath(r.stdout.strip())
        r = run(["pkg-config", "--variable=includedir", "sluice"], env=cls.pc_env)
        cls.includedir = os.path.realpath(r.stdout.strip())

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def headers(self):
        return sorted(glob.glob(os.path.join(self.includedir, "sluice*.h")))

    def documented(self):
        """Every function the installed headers declare: {name: (exported, header, line)}."""
        decls = {}
        for h in self.headers():
            with open(h) as f:
                for name, exported, line in declarations(f.read()):
                    decls[name] = (exported, os.path.basename(h), line)
        return decls

    def test_pkg_config_points_into_the_prefix(self):
        prefix = os.path.realpath(self.prefix)
        self.assertTrue(self.libdir.startswith(prefix + os.sep), self.libdir)
        self.assertTrue(self.includedir.startswith(prefix + os.sep), self.includedir)
        self.assertTrue(os.path.isfile(os.path.join(self.libdir, "libsluice.so")))
        names = [os.path.basename(h) for h in self.headers()]
        self.assertEqual(names, ["sluice.h", "sluice_ckpt.h", "sluice_err.h", "sluice_export.h",
                                 "sluice_feed.h"])

    def test_exports_are_the_documented_api(self):
        decls = self.documented()
        unmarked = sorted("%s (%s:%d)" % (n, h, ln) for n, (e, h, ln) in decls.items() if not e)
        self.assertEqual(unmarked, [], "declared in an installed header without SL_API")
        r = run(["nm", "-D", "--defined-only", os.path.join(self.libdir, "libsluice.so")])
        self.assertEqual(r.returncode, 0, r.stderr)
        exported = {line.split()[-1] for line in r.stdout.splitlines() if line.strip()}
        exported = {s.split("@")[0] for s in exported}
        self.assertEqual(sorted(exported - set(decls)), [], "exported but not documented")
        self.assertEqual(sorted(set(decls) - exported), [], "documented but not exported")
        print("libsluice.so exports %d functions, all declared with SL_API" % len(exported))

    def test_every_function_has_a_contract_comment(self):
        for h in self.headers():
            with open(h) as f:
                lines = f.read().split("\n")
            for name, _, line in declarations("\n".join(lines)):
                above = lines[line - 2].strip() if line >= 2 else ""
                self.assertTrue(above.endswith("*/"),
                                "%s:%d: %s has no contract comment right above it"
                                % (os.path.basename(h), line, name))

    def test_consumer_against_a_daemon(self):
        exe = os.path.join(self.tmp, "consumer")
        # Compiled from a scratch copy, so no header beside the source can be picked up.
        src = os.path.join(self.tmp, "consumer.c")
        shutil.copy(os.path.join(HERE, "consumer.c"), src)
        cmd = ([CC] + STRICT + EXTRA_FLAGS + [src, "-o", exe] + self.pc_flags
               + ["-Wl,-rpath," + self.libdir])
        r = run(cmd, cwd=self.tmp)
        self.assertEqual(r.returncode, 0, " ".join(cmd) + "\n" + r.stderr)
        r = run(["ldd", exe])
        self.assertIn(os.path.join(self.libdir, "libsluice.so.1"), r.stdout)

        d = Daemon().start()
        try:
            r = run([exe, d.addr, os.path.join(self.tmp, "shard.bin")], cwd=self.tmp)
            print(r.stdout, end="")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("missing job: SL_ENOTFOUND (not found): NOT_FOUND:", r.stdout)
            self.assertIn("sl_client_opts version 2 is unknown", r.stdout)
            self.assertEqual(re.findall(r"ERROR: \w+Sanitizer|runtime error:", r.stderr), [])
        finally:
            rc = d.stop()
            reports = d.sanitizer_reports()
            d.cleanup()
        self.assertEqual(rc, 0)
        self.assertEqual(reports, [])


if __name__ == "__main__":
    unittest.main()
