"""Helpers for tests that run the real sluiced and the real clients.

Environment (set by ctest through SL_TEST_ENV): SLUICED, SLUICE_CLI, and PYTHONPATH including the
build's python dir (generated stubs + the sluice package).
"""
import os
import re
import signal
import subprocess
import tempfile
import time

SLUICED = os.environ.get("SLUICED", "sluiced")
SLUICE_CLI = os.environ.get("SLUICE_CLI", "sluice")

# Reports from the sanitizers in a sanitized build: any of these in a daemon's stderr is a failure.
SANITIZER_RE = re.compile(r"ERROR: (Address|Leak|Thread)Sanitizer|runtime error:|SUMMARY: \w+Sanitizer")


class Daemon:
    """A sluiced on 127.0.0.1 with port 0 and a temporary data dir (or a given one)."""

    def __init__(self, data_dir=None, args=(), env=None, grace=2.0):
        self._tmp = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="sluice-test-")
            data_dir = os.path.join(self._tmp.name, "data")
        self.data_dir = data_dir
        self.port_file = os.path.join(os.path.dirname(os.path.abspath(data_dir)),
                                      "port-%d" % os.getpid())
        self.args = list(args)
        self.env = dict(os.environ, **(env or {}))
        self.grace = grace
        self.proc = None
        self.signalled = False
        self.port = None
        self.stderr_path = os.path.join(os.path.dirname(os.path.abspath(data_dir)),
                                        "sluiced-%d.log" % os.getpid())

    @property
    def addr(self):
        return "127.0.0.1:%d" % self.port

    def start(self, timeout=20.0):
        if os.path.exists(self.port_file):
            os.unlink(self.port_file)
        self.signalled = False
        self._err = open(self.stderr_path, "ab")
        cmd = [SLUICED, "--listen", "127.0.0.1:0", "--data-dir", self.data_dir,
               "--port-file", self.port_file, "--grace-period", str(self.grace)] + self.args
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._err,
                                     env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("sluiced exited with %d:\n%s" % (self.proc.returncode, self.log()))
            try:
                with open(self.port_file) as f:
                    text = f.read()
                if text.endswith("\n"):
                    self.port = int(text)
                    return self
            except FileNotFoundError:
                pass
            time.sleep(0.02)
        raise RuntimeError("sluiced did not start:\n" + self.log())

    def log(self):
        try:
            with open(self.stderr_path, "r", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def stop(self, sig=signal.SIGTERM, timeout=30.0):
        """Signal the daemon and wait; returns its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None and not self.signalled:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._err.close()
        self.proc = None
        return rc

    def signal(self, sig=signal.SIGTERM):
        """Send a signal now; a later stop() only waits."""
        self.proc.send_signal(sig)
        self.signalled = True

    def sanitizer_reports(self):
        return SANITIZER_RE.findall(self.log())

    def cleanup(self):
        if self.proc is not None:
            self.stop(signal.SIGKILL)
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()


def cli(*args, addr=None, env=None, timeout=60):
    """Run the sluice CLI; returns CompletedProcess with text stdout/stderr."""
    cmd = [SLUICE_CLI]
    if addr:
        cmd += ["--addr", addr]
    cmd += list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))
