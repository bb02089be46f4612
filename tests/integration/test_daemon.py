"""Integration tests of sluiced: the real daemon on 127.0.0.1 (port 0, temporary data dir), the
real `sluice` CLI and a Python grpcio client with stubs generated from the system health.proto."""
import json
import os
import re
import signal
import sqlite3
import subprocess
import tempfile
import threading
import time
import unittest

import grpc

from sluice._health import health_pb2, health_pb2_grpc
from sluice.v1 import admin_pb2, admin_pb2_grpc
from sltest import SLUICED, Daemon, cli

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _newest_migration():
    """The newest migration number ("/* N: ..." entries of the SQLite engine's migrations,
    server/catalog/sqlite/engine.c; the PostgreSQL engine has the same numbers)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "server",
                        "catalog", "sqlite", "engine.c")
    with open(path) as f:
        return max(int(n) for n in re.findall(r"^\s*/\* (\d+): ", f.read(), re.M))


SCHEMA_VERSION = _newest_migration()


class DaemonTest(unittest.TestCase):
    def setUp(self):
        self.d = Daemon().start()
        self.channel = grpc.insecure_channel(self.d.addr)

    def tearDown(self):
        self.channel.close()
        rc = self.d.stop()
        reports = self.d.sanitizer_reports()
        log = self.d.log()
        self.d.cleanup()
        self.assertEqual(rc, 0, "sluiced exit code\n" + log)
        self.assertEqual(reports, [], "sanitizer reports\n" + log)

    def test_cli_health(self):
        r = cli("health", addr=self.d.addr)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "SERVING")
        r = cli("health", "--json", addr=self.d.addr)
        self.assertEqual(json.loads(r.stdout), {"service": "", "status": "SERVING"})
        r = cli("health", "--service", "sluice.v1.Admin", addr=self.d.addr)
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "SERVING"))
        # SLUICE_ADDR is the default address.
        r = cli("health", env={"SLUICE_ADDR": self.d.addr})
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_cli_health_unknown_service(self):
        r = cli("health", "--service", "no.Such", addr=self.d.addr)
        self.assertEqual(r.returncode, 1)
        self.assertIn("NOT_FOUND", r.stderr)
        self.assertIn("no.Such", r.stderr)

    def test_cli_info(self):
        r = cli("info", "--json", addr=self.d.addr)
        self.assertEqual(r.returncode, 0, r.stderr)
        info = json.loads(r.stdout)
        self.assertEqual(info["data_dir"], os.path.realpath(self.d.data_dir))
        self.assertEqual(info["schema_version"], SCHEMA_VERSION)
        self.assertEqual(info["pid"], self.d.proc.pid)
        self.assertEqual(info["listen"], self.d.addr)
        self.assertRegex(info["version"], r"^\d+\.\d+\.\d+$")
        self.assertGreaterEqual(info["uptime_ms"], 0)
        r = cli("info", addr=self.d.addr)
        self.assertIn("schema version:  %d" % SCHEMA_VERSION, r.stdout)

    def test_grpcio_health_check(self):
        stub = health_pb2_grpc.HealthStub(self.channel)
        resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        self.assertEqual(resp.status, SERVING)
        with self.assertRaises(grpc.RpcError) as e:
            stub.Check(health_pb2.HealthCheckRequest(service="nope.Service"), timeout=5)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("nope.Service", e.exception.details())

    def test_grpcio_get_info(self):
        stub = admin_pb2_grpc.AdminStub(self.channel)
        resp = stub.GetInfo(admin_pb2.GetInfoRequest(), timeout=5)
        self.assertEqual(resp.schema_version, SCHEMA_VERSION)
        self.assertEqual(resp.data_dir, os.path.realpath(self.d.data_dir))

    def test_unknown_method_fast(self):
        for path in ("/sluice.v1.Admin/Nope", "/no.such.Service/Call"):
            call = self.channel.unary_unary(path, request_serializer=lambda b: b,
                                            response_deserializer=lambda b: b)
            t0 = time.monotonic()
            with self.assertRaises(grpc.RpcError) as e:
                call(b"", timeout=30)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
            self.assertIn(path, e.exception.details())
            # One second; test.sh's valgrind step sets SLUICE_SLOWDOWN=10, as memcheck slows the
            # daemon by an order of magnitude.
            self.assertLess(time.monotonic() - t0, 1.0 * float(os.environ.get("SLUICE_SLOWDOWN", "1")))

    def test_garbage_request(self):
        call = self.channel.unary_unary("/grpc.health.v1.Health/Check",
                                        request_serializer=lambda b: b,
                                        response_deserializer=lambda b: b)
        for junk in (b"\xff\xff\xff\xff\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\x0b"):
            with self.assertRaises(grpc.RpcError) as e:
                call(junk, timeout=5)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("HealthCheckRequest", e.exception.details())
        # Still serving.
        stub = health_pb2_grpc.HealthStub(self.channel)
        self.assertEqual(stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status, SERVING)

    def test_oversized_message(self):
        call = self.channel.unary_unary("/sluice.v1.Admin/GetInfo",
                                        request_serializer=lambda b: b,
                                        response_deserializer=lambda b: b)
        big = b"\x3a" + b"\x80\x80\x80\x05" + b"x" * (10 << 20)  # field 7, 10 MiB
        with self.assertRaises(grpc.RpcError) as e:
            call(big, timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertEqual(cli("health", addr=self.d.addr).returncode, 0)

    def test_watch(self):
        stub = health_pb2_grpc.HealthStub(self.channel)
        stream = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        self.assertEqual(next(stream).status, SERVING)
        unknown = stub.Watch(health_pb2.HealthCheckRequest(service="x.Y"), timeout=10)
        self.assertEqual(next(unknown).status, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
        unknown.cancel()
        stream.cancel()


class ShutdownTest(unittest.TestCase):
    def test_sigterm_with_open_streams(self):
        """SIGTERM: watchers see NOT_SERVING, streams end, exit 0 within the grace period."""
        with Daemon(grace=5.0) as d:
            ch = grpc.insecure_channel(d.addr)
            stub = health_pb2_grpc.HealthStub(ch)
            streams = [stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
                       for _ in range(3)]
            for s in streams:
                self.assertEqual(next(s).status, SERVING)
            t0 = time.monotonic()
            d.signal(signal.SIGTERM)
            seen = []
            for s in streams:
                statuses = []
                with self.assertRaises(grpc.RpcError) as e:
                    for resp in s:
                        statuses.append(resp.status)
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
                seen.append(statuses)
            rc = d.stop()
            took = time.monotonic() - t0
            ch.close()
            self.assertEqual(seen, [[NOT_SERVING]] * 3)
            self.assertEqual(rc, 0, d.log())
            self.assertLess(took, 5.0)
            self.assertEqual(d.sanitizer_reports(), [], d.log())
            self.assertIn("event=stopped", d.log())

    def test_sigint(self):
        with Daemon() as d:
            self.assertEqual(cli("health", addr=d.addr).returncode, 0)
            self.assertEqual(d.stop(signal.SIGINT), 0, d.log())
            self.assertEqual(d.sanitizer_reports(), [], d.log())

    def test_fatal_signal_leaves_its_name_and_stack(self):
        # A library's abort() (libuv's on a failed epoll_ctl) says nothing by itself: the
        # daemon's handler writes a line and the stack before the default action (sanitizers
        # keep their own handlers for the signals they handle).
        with Daemon() as d:
            self.assertEqual(d.stop(signal.SIGABRT), -signal.SIGABRT)
            log = d.log()
            self.assertIn("event=fatal_signal signal=SIGABRT", log)
            # kill() aims at the process, and the kernel hands the signal to any thread that
            # does not block it (the loop, a gRPC poller, a worker): the stack is that thread's,
            # so look for frames of the daemon's own binary, not for one function.
            stack = log.split("event=fatal_signal", 1)[1]
            self.assertRegex(stack, r"/sluiced\(", log)


class ConfigTest(unittest.TestCase):
    def run_daemon(self, *args, env=None, timeout=10):
        return subprocess.run([SLUICED] + list(args), capture_output=True, text=True,
                              timeout=timeout, env=dict(os.environ, **(env or {})))

    def test_help_and_version(self):
        r = self.run_daemon("--help")
        self.assertEqual(r.returncode, 0)
        for flag in ("--listen", "--data-dir", "--log-level", "--port-file", "SLUICE_LISTEN"):
            self.assertIn(flag, r.stdout)
        r = self.run_daemon("--version")
        self.assertEqual(r.returncode, 0)
        self.assertTrue(r.stdout.startswith("sluiced "))

    def test_bad_flags(self):
        cases = [
            (["--bogus"], "unknown option '--bogus'"),
            (["--log-level", "loud"], "'loud'"),
            (["--grace-period", "-1"], "'-1'"),
            (["--max-message-bytes", "12abc"], "'12abc'"),
            (["--rpc-threads", "1"], "'1'"),
            (["--listen"], "needs a value"),
            (["extra"], "unexpected argument 'extra'"),
        ]
        for args, msg in cases:
            r = self.run_daemon(*args)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(msg, r.stderr, args)

    def test_bad_env(self):
        r = self.run_daemon(env={"SLUICE_LOG_LEVEL": "chatty"})
        self.assertEqual(r.returncode, 2)
        self.assertIn("SLUICE_LOG_LEVEL", r.stderr)
        self.assertIn("chatty", r.stderr)

    def test_env_and_flag_precedence(self):
        with tempfile.TemporaryDirectory() as tmp:
            env_dir = os.path.join(tmp, "from-env")
            flag_dir = os.path.join(tmp, "from-flag")
            # The environment chooses the data dir...
            with Daemon(data_dir=flag_dir, env={"SLUICE_DATA_DIR": env_dir}) as d:
                info = json.loads(cli("info", "--json", addr=d.addr).stdout)
                # ...but the flag (passed by Daemon) wins.
                self.assertEqual(info["data_dir"], os.path.realpath(flag_dir))
            self.assertFalse(os.path.exists(env_dir))

    def test_unbindable_address(self):
        r = self.run_daemon("--listen", "256.1.1.1:1", "--data-dir",
                            tempfile.mkdtemp(prefix="sluice-test-"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("listen_failed", r.stderr)

    def test_data_dir_lock_and_restart(self):
        with tempfile.TemporaryDirectory() as tmp:
            data = os.path.join(tmp, "data")
            with Daemon(data_dir=data) as d1:
                r = self.run_daemon("--listen", "127.0.0.1:0", "--data-dir", data)
                self.assertEqual(r.returncode, 1)
                self.assertIn("data_dir_locked", r.stderr)
                self.assertEqual(d1.stop(), 0)
            db = os.path.join(data, "catalog.db")
            con = sqlite3.connect(db)
            self.assertEqual(con.execute("PRAGMA journal_mode").fetchone()[0], "wal")
            self.assertEqual(con.execute("SELECT version FROM schema_version").fetchall(), [(SCHEMA_VERSION,)])
            self.assertEqual(con.execute("PRAGMA integrity_check").fetchone()[0], "ok")
            con.close()
            # A restart on the same data dir migrates nothing and serves.
            with Daemon(data_dir=data) as d2:
                info = json.loads(cli("info", "--json", addr=d2.addr).stdout)
                self.assertEqual(info["schema_version"], SCHEMA_VERSION)
                self.assertNotIn("catalog_migrated", d2.log().split("event=stopped")[-1])
                self.assertEqual(d2.stop(), 0)

    def test_newer_catalog_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            data = os.path.join(tmp, "data")
            os.makedirs(data)
            con = sqlite3.connect(os.path.join(data, "catalog.db"))
            con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            con.execute("INSERT INTO schema_version VALUES (999)")
            con.commit()
            con.close()
            r = self.run_daemon("--listen", "127.0.0.1:0", "--data-dir", data)
            self.assertEqual(r.returncode, 1)
            self.assertIn("catalog_too_new", r.stderr)


class CliUsageTest(unittest.TestCase):
    def test_usage_errors(self):
        for args in (["bogus"], ["health", "--bogus"], ["--timeout", "0", "health"],
                     ["info", "extra"], []):
            r = cli(*args)
            self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))

    def test_help(self):
        r = cli("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("health", r.stdout)
        for cmd in ("health", "info"):
            r = cli(cmd, "--help")
            self.assertEqual(r.returncode, 0)
            self.assertIn("Usage: sluice " + cmd, r.stdout)

    def test_unreachable_daemon(self):
        t0 = time.monotonic()
        r = cli("--timeout", "2", "health", addr="127.0.0.1:1")
        self.assertEqual(r.returncode, 1)
        self.assertIn("UNAVAILABLE", r.stderr)
        self.assertIn("127.0.0.1:1", r.stderr)
        self.assertLess(time.monotonic() - t0, 10)


if __name__ == "__main__":
    unittest.main(verbosity=2)
