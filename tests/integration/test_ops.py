"""Operations, end to end: TLS and mTLS (CA made by the openssl CLI here), bearer tokens with
roles (and their reload on SIGHUP), Prometheus metrics checked by promtool, the config file and
its precedence, --check-config and JSON logs. Real sluiced, real CLI, Python grpcio."""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.request

import grpc

from sluice._health import health_pb2, health_pb2_grpc
from sluice.v1 import admin_pb2, admin_pb2_grpc
from sltest import SLUICED, Daemon, cli

SERVING = health_pb2.HealthCheckResponse.SERVING


def make_certs(d):
    def run(*args):
        subprocess.run(args, cwd=d, check=True, capture_output=True)

    for ca in ("ca", "other"):
        run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca + ".key",
            "-out", ca + ".pem", "-days", "2", "-subj", "/CN=" + ca + "-test-ca")
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, ca, ext in (("server", "ca", True), ("client", "ca", False), ("rogue", "other", False)):
        run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key",
            "-out", name + ".csr", "-subj", "/CN=" + name)
        cmd = ["openssl", "x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey",
               ca + ".key", "-CAcreateserial", "-out", name + ".pem", "-days", "2"]
        if ext:
            cmd += ["-extfile", "san.ext"]
        run(*cmd)
    return {n: os.path.join(d, n) for n in os.listdir(d)}


def read(path):
    with open(path, "rb") as f:
        return f.read()


def health(channel):
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)


class TlsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="sluice-tls-")
        cls.p = make_certs(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def creds(self, ca="ca.pem", cert=None, key=None):
        return grpc.ssl_channel_credentials(
            root_certificates=read(self.p[ca]),
            private_key=read(self.p[key]) if key else None,
            certificate_chain=read(self.p[cert]) if cert else None)

    def test_tls(self):
        with Daemon(args=["--tls-cert", self.p["server.pem"], "--tls-key", self.p["server.key"]]) as d:
            with grpc.secure_channel(d.addr, self.creds()) as ch:
                self.assertEqual(health(ch).status, SERVING)
            with grpc.insecure_channel(d.addr) as ch:
                with self.assertRaises(grpc.RpcError) as e:
                    health(ch)
                self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
            with grpc.secure_channel(d.addr, self.creds(ca="other.pem")) as ch:
                with self.assertRaises(grpc.RpcError):
                    health(ch)
            r = cli("health", "--tls-ca", self.p["ca.pem"], addr=d.addr)
            self.assertEqual((r.returncode, r.stdout.strip()), (0, "SERVING"), r.stderr)
            r = cli("--timeout", "3", "health", addr=d.addr)
            self.assertEqual(r.returncode, 1)
            r = cli("health", "--tls-ca", "/nonexistent.pem", addr=d.addr)
            self.assertEqual(r.returncode, 1)
            self.assertIn("/nonexistent.pem", r.stderr + d.log())
            self.assertEqual(d.stop(), 0, d.log())
            self.assertEqual(d.sanitizer_reports(), [], d.log())

    def test_mtls(self):
        args = ["--tls-cert", self.p["server.pem"], "--tls-key", self.p["server.key"],
                "--tls-client-ca", self.p["ca.pem"]]
        with Daemon(args=args) as d:
            with grpc.secure_channel(d.addr, self.creds(cert="client.pem", key="client.key")) as ch:
                self.assertEqual(health(ch).status, SERVING)
            for creds in (self.creds(), self.creds(cert="rogue.pem", key="rogue.key")):
                with grpc.secure_channel(d.addr, creds) as ch:
                    with self.assertRaises(grpc.RpcError):
                        health(ch)
            r = cli("health", "--tls-ca", self.p["ca.pem"], "--tls-cert", self.p["client.pem"],
                    "--tls-key", self.p["client.key"], addr=d.addr)
            self.assertEqual(r.returncode, 0, r.stderr)
            r = cli("--timeout", "3", "health", "--tls-ca", self.p["ca.pem"], addr=d.addr)
            self.assertEqual(r.returncode, 1)
            self.assertEqual(d.stop(), 0, d.log())

    def test_python_package_tls_and_token(self):
        from sluice.checkpoint import Checkpoints
        from sluice.client import Client
        tmp = tempfile.mkdtemp(prefix="sluice-pytls-")
        tokens = os.path.join(tmp, "tokens")
        with open(tokens, "w") as f:
            f.write("reader %s\n" % ("p" * 20))
        args = ["--tls-cert", self.p["server.pem"], "--tls-key", self.p["server.key"],
                "--tls-client-ca", self.p["ca.pem"], "--token-file", tokens]
        try:
            with Daemon(args=args) as d:
                with Client(d.addr, tls_ca=self.p["ca.pem"], tls_cert=self.p["client.pem"],
                            tls_key=self.p["client.key"], token="p" * 20) as c:
                    self.assertEqual(list(c.list_datasets()), [])
                with Client(d.addr, tls_ca=self.p["ca.pem"], tls_cert=self.p["client.pem"],
                            tls_key=self.p["client.key"]) as c:
                    with self.assertRaises(grpc.RpcError) as e:
                        c.list_datasets()
                    self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
                # The same settings from the environment, as the CLI reads them.
                env = {"SLUICE_TLS_CA": self.p["ca.pem"], "SLUICE_TLS_CERT": self.p["client.pem"],
                       "SLUICE_TLS_KEY": self.p["client.key"], "SLUICE_TOKEN": "p" * 20}
                old = {k: os.environ.get(k) for k in env}
                os.environ.update(env)
                try:
                    with Checkpoints(d.addr) as ck:
                        self.assertEqual(ck.list(), [])
                finally:
                    for k, v in old.items():
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v
                self.assertEqual(d.stop(), 0, d.log())
        finally:
            shutil.rmtree(tmp)

    def test_bad_tls_config(self):
        r = subprocess.run([SLUICED, "--tls-cert", self.p["server.pem"]], capture_output=True,
                           text=True, timeout=10)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--tls-key", r.stderr)
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run([SLUICED, "--listen", "127.0.0.1:0", "--data-dir", tmp,
                                "--tls-cert", self.p["server.pem"], "--tls-key", "/etc/hostname"],
                               capture_output=True, text=True, timeout=10)
            self.assertEqual(r.returncode, 1)
            self.assertIn("not a PEM file", r.stderr)


TOKENS = {"reader": "r" * 24, "trainer": "t" * 24, "admin": "a" * 24}


class AuthTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="sluice-auth-")
        self.token_file = os.path.join(self.tmp, "tokens")
        with open(self.token_file, "w") as f:
            f.write("# role token\n\n")
            for role, tok in TOKENS.items():
                f.write("%s %s\n" % (role, tok))
        self.d = Daemon(args=["--token-file", self.token_file]).start()
        self.ch = grpc.insecure_channel(self.d.addr)

    def tearDown(self):
        self.ch.close()
        rc = self.d.stop()
        log = self.d.log()
        self.d.cleanup()
        shutil.rmtree(self.tmp)
        self.assertEqual(rc, 0, log)
        for tok in TOKENS.values():
            self.assertNotIn(tok, log, "a token was logged")

    def info(self, token):
        md = [("authorization", "Bearer " + token)] if token else None
        return admin_pb2_grpc.AdminStub(self.ch).GetInfo(admin_pb2.GetInfoRequest(), timeout=5,
                                                          metadata=md)

    def code(self, fn):
        try:
            fn()
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()

    def test_roles(self):
        # Health stays open for probes.
        self.assertEqual(health(self.ch).status, SERVING)
        self.assertEqual(self.code(lambda: self.info(None)), grpc.StatusCode.UNAUTHENTICATED)
        self.assertEqual(self.code(lambda: self.info("x" * 24)), grpc.StatusCode.UNAUTHENTICATED)
        for role in ("reader", "trainer", "admin"):
            self.assertEqual(self.code(lambda: self.info(TOKENS[role])), grpc.StatusCode.OK, role)
        # An admin-only method (access level left at its fail-closed default).
        call = self.ch.unary_unary("/sluice.v1.Checkpoints/Delete",
                                   request_serializer=lambda b: b,
                                   response_deserializer=lambda b: b)
        for role, want in (("reader", grpc.StatusCode.PERMISSION_DENIED),
                           ("trainer", grpc.StatusCode.PERMISSION_DENIED)):
            got = self.code(lambda: call(b"", timeout=5,
                                         metadata=[("authorization", "Bearer " + TOKENS[role])]))
            self.assertEqual(got, want, role)
        got = self.code(lambda: call(b"", timeout=5,
                                     metadata=[("authorization", "Bearer " + TOKENS["admin"])]))
        self.assertNotIn(got, (grpc.StatusCode.PERMISSION_DENIED,
                               grpc.StatusCode.UNAUTHENTICATED))

    def test_roles_table(self):
        """Every RPC against every role: allowed ones get past authorization (their answer to an
        empty request is whatever it is), refused ones get PERMISSION_DENIED."""
        U, SS, CS = "unary", "server_stream", "client_stream"
        table = [
            ("/sluice.v1.Admin/GetInfo", U, "reader"),
            ("/sluice.v1.Datasets/Create", U, "admin"),
            ("/sluice.v1.Datasets/UploadLengths", CS, "admin"),
            ("/sluice.v1.Datasets/Get", U, "reader"),
            ("/sluice.v1.Datasets/List", U, "reader"),
            ("/sluice.v1.Datasets/Delete", U, "admin"),
            ("/sluice.v1.Jobs/Create", U, "admin"),
            ("/sluice.v1.Jobs/Get", U, "reader"),
            ("/sluice.v1.Jobs/List", U, "reader"),
            ("/sluice.v1.Jobs/Delete", U, "admin"),
            ("/sluice.v1.Jobs/Resize", U, "admin"),
            ("/sluice.v1.Epochs/Get", U, "reader"),
            ("/sluice.v1.Epochs/ReportProgress", U, "trainer"),
            ("/sluice.v1.Epochs/Next", U, "admin"),
            ("/sluice.v1.Epochs/Rewind", U, "trainer"),
            ("/sluice.v1.Feed/StreamIndices", SS, "reader"),
            ("/sluice.v1.Feed/StreamBatches", SS, "reader"),
            ("/sluice.v1.Checkpoints/Begin", U, "trainer"),
            ("/sluice.v1.Checkpoints/UploadShard", CS, "trainer"),
            ("/sluice.v1.Checkpoints/UploadStatus", U, "reader"),
            ("/sluice.v1.Checkpoints/Commit", U, "trainer"),
            ("/sluice.v1.Checkpoints/Abort", U, "trainer"),
            ("/sluice.v1.Checkpoints/Get", U, "reader"),
            ("/sluice.v1.Checkpoints/List", U, "reader"),
            ("/sluice.v1.Checkpoints/Latest", U, "reader"),
            ("/sluice.v1.Checkpoints/Verify", U, "reader"),
            ("/sluice.v1.Checkpoints/DownloadShard", SS, "reader"),
            ("/sluice.v1.Checkpoints/Delete", U, "admin"),
            ("/sluice.v1.Checkpoints/SetRetention", U, "admin"),
        ]
        rank = {"reader": 1, "trainer": 2, "admin": 3}
        ident = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)

        def call(path, kind, md):
            if kind == U:
                self.ch.unary_unary(path, **ident)(b"", timeout=5, metadata=md)
            elif kind == SS:
                for _ in self.ch.unary_stream(path, **ident)(b"", timeout=5, metadata=md):
                    break
            else:
                self.ch.stream_unary(path, **ident)(iter(()), timeout=5, metadata=md)

        for path, kind, need in table:
            for role, tok in TOKENS.items():
                md = [("authorization", "Bearer " + tok)]
                got = self.code(lambda: call(path, kind, md))
                if rank[role] >= rank[need]:
                    self.assertNotIn(got, (grpc.StatusCode.PERMISSION_DENIED,
                                           grpc.StatusCode.UNAUTHENTICATED), (path, role))
                else:
                    self.assertEqual(got, grpc.StatusCode.PERMISSION_DENIED, (path, role))
            self.assertEqual(self.code(lambda: call(path, kind, None)),
                             grpc.StatusCode.UNAUTHENTICATED, path)

    def test_cli_token(self):
        tf = os.path.join(self.tmp, "my-token")
        with open(tf, "w") as f:
            f.write(TOKENS["reader"] + "\n")
        r = cli("info", "--token-file", tf, addr=self.d.addr)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = cli("info", addr=self.d.addr, env={"SLUICE_TOKEN": TOKENS["admin"]})
        self.assertEqual(r.returncode, 0, r.stderr)
        r = cli("info", addr=self.d.addr)
        self.assertEqual(r.returncode, 1)
        self.assertIn("UNAUTHENTICATED", r.stderr)

    def test_sighup_reloads_tokens(self):
        new = "n" * 32
        with open(self.token_file, "w") as f:
            f.write("reader %s\n" % new)
        self.d.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "event=reloaded" not in self.d.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertIn("tokens=1", self.d.log())
        self.assertEqual(self.code(lambda: self.info(new)), grpc.StatusCode.OK)
        self.assertEqual(self.code(lambda: self.info(TOKENS["admin"])),
                         grpc.StatusCode.UNAUTHENTICATED)
        # A broken file changes nothing.
        with open(self.token_file, "w") as f:
            f.write("superuser %s\n" % ("z" * 20))
        self.d.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "event=reload_failed" not in self.d.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertIn("line 1", self.d.log())
        self.assertEqual(self.code(lambda: self.info(new)), grpc.StatusCode.OK)

    def test_bad_token_files(self):
        cases = [("reader short\n", "line 1"), ("boss %s\n" % ("b" * 20), "unknown role"),
                 ("reader %s\nadmin %s\n" % ("d" * 20, "d" * 20), "duplicate"),
                 ("reader %s extra\n" % ("e" * 20), "line 1")]
        for text, msg in cases:
            path = os.path.join(self.tmp, "bad")
            with open(path, "w") as f:
                f.write(text)
            r = subprocess.run([SLUICED, "--check-config", "--token-file", path],
                               capture_output=True, text=True, timeout=10)
            self.assertEqual(r.returncode, 1, text)
            self.assertIn(msg, r.stderr, text)


class BoundTokenTest(unittest.TestCase):
    """Trainer tokens bound to jobs (issue 25, docs/operations.md "Tokens"): a bound token
    reports progress only to its jobs, a job that tokens are bound to takes reports only from
    them (and admin tokens); unbound tokens and jobs behave as before."""
    BOUND_A, BOUND_B = "A" * 24, "B" * 24

    def setUp(self):
        from sluice.client import Client
        self.tmp = tempfile.mkdtemp(prefix="sluice-bound-")
        self.token_file = os.path.join(self.tmp, "tokens")
        with open(self.token_file, "w") as f:
            for role, tok in TOKENS.items():
                f.write("%s %s\n" % (role, tok))
            f.write("trainer %s jobs=ja\n" % self.BOUND_A)
            f.write("trainer\t%s\tjobs=jb,jc\n" % self.BOUND_B)
        self.d = Daemon(args=["--token-file", self.token_file]).start()
        self.clients = []

        def client(tok):
            c = Client(self.d.addr, token=tok)
            self.clients.append(c)
            return c
        self.admin = client(TOKENS["admin"])
        self.a, self.b = client(self.BOUND_A), client(self.BOUND_B)
        self.trainer, self.reader = client(TOKENS["trainer"]), client(TOKENS["reader"])
        self.admin.create_dataset("ds", 100)
        for job in ("ja", "jb", "free"):
            self.admin.create_job(job, "ds", world_size=2)

    def tearDown(self):
        for c in self.clients:
            c.close()
        rc = self.d.stop()
        log = self.d.log()
        self.d.cleanup()
        shutil.rmtree(self.tmp)
        self.assertEqual(rc, 0, log)
        for tok in list(TOKENS.values()) + [self.BOUND_A, self.BOUND_B]:
            self.assertNotIn(tok, log, "a token was logged")

    def report(self, client, job, position):
        try:
            client.report_progress(job, 0, 0, position)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details()

    def position(self, job):
        return self.admin.get_epoch(job).ranks[0].position

    def test_reports_only_to_the_bound_jobs(self):
        denied = grpc.StatusCode.PERMISSION_DENIED
        self.assertEqual(self.report(self.a, "ja", 5)[0], grpc.StatusCode.OK)
        code, msg = self.report(self.a, "jb", 7)                 # another job's token
        self.assertEqual(code, denied)
        self.assertIn("bound to other jobs than 'jb'", msg)
        self.assertEqual(self.report(self.a, "free", 7)[0], denied)
        self.assertEqual(self.report(self.b, "jb", 6)[0], grpc.StatusCode.OK)
        self.assertEqual(self.report(self.b, "ja", 9)[0], denied)
        # jc has a bound token but no job: past authorization, the job is not found.
        self.assertEqual(self.report(self.b, "jc", 1)[0], grpc.StatusCode.NOT_FOUND)
        # An unbound trainer token: jobs without bound tokens only.
        code, msg = self.report(self.trainer, "ja", 9)
        self.assertEqual(code, denied)
        self.assertIn("job 'ja' takes", msg)
        self.assertIn("only from the trainer tokens bound to it", msg)
        self.assertEqual(self.report(self.trainer, "free", 3)[0], grpc.StatusCode.OK)
        self.assertEqual(self.report(self.reader, "ja", 9)[0], denied)   # the role, as before
        self.assertEqual(self.report(self.admin, "ja", 8)[0], grpc.StatusCode.OK)
        # The refused reports changed nothing.
        self.assertEqual([self.position(j) for j in ("ja", "jb", "free")], [8, 6, 3])
        # Reading is not bound: a bound token streams any job, as its reader role allows.
        got = next(iter(self.a.stream_indices("jb", 0, epoch=0)))
        self.assertGreater(len(got.indices), 0)
        self.assertIn("rpc_refused", self.d.log())

    def test_bad_bindings(self):
        cases = [("reader %s jobs=ja\n" % ("r" * 20), "only a trainer token can be bound"),
                 ("admin %s jobs=ja\n" % ("a" * 20), "only a trainer token can be bound"),
                 ("trainer %s jobs=a/b\n" % ("t" * 20), "job name 'a/b'"),
                 ("trainer %s jobs=\n" % ("t" * 20), "job name ''"),
                 ("trainer %s jobs=a,,b\n" % ("t" * 20), "job name ''"),
                 ("trainer %s jobs=x,y,x\n" % ("t" * 20), "job 'x' named twice"),
                 ("trainer %s jobs=%s\n" % ("t" * 20, ",".join("j%d" % i for i in range(65))),
                  "at most 64 jobs"),
                 ("trainer %s jobs=a extra\n" % ("t" * 20), "line 1"),
                 ("trainer jobs=a\n", "line 1")]
        for text, msg in cases:
            path = os.path.join(self.tmp, "bad")
            with open(path, "w") as f:
                f.write(text)
            r = subprocess.run([SLUICED, "--check-config", "--token-file", path],
                               capture_output=True, text=True, timeout=10)
            self.assertEqual(r.returncode, 1, text)
            self.assertIn(msg, r.stderr, text)
        path = os.path.join(self.tmp, "good")
        with open(path, "w") as f:
            f.write("trainer %s jobs=%s\n" % ("t" * 20, ",".join("j%d" % i for i in range(64))))
        r = subprocess.run([SLUICED, "--check-config", "--token-file", path],
                           capture_output=True, text=True, timeout=10)
        self.assertEqual(r.returncode, 0, r.stderr)


class MetricsTest(unittest.TestCase):
    def test_scrape_and_promtool(self):
        with Daemon(args=["--metrics-listen", "127.0.0.1:0"]) as d:
            m = None
            deadline = time.monotonic() + 10
            while not m and time.monotonic() < deadline:
                m = re.search(r"event=metrics_listening addr=\S+ port=(\d+)", d.log())
                time.sleep(0.02)
            self.assertTrue(m, d.log())
            url = "http://127.0.0.1:%s/metrics" % m.group(1)
            for _ in range(5):
                self.assertEqual(cli("health", addr=d.addr).returncode, 0)
            cli("--timeout", "2", "info", addr=d.addr)
            # A feeding and checkpoint workload, so their series have values.
            from sluice.checkpoint import Checkpoints
            from sluice.client import Client
            with Client(d.addr) as c:
                c.create_dataset("ds", 1000)
                c.create_job("j", "ds", 2)
                served = sum(len(ch.indices) for ch in c.stream_indices("j", 0))
                self.assertEqual(served, 500)
            with Checkpoints(d.addr) as ck:
                ck.begin("j", name="c1", world_size=1)
                ck.upload("j", "c1", 0, b"x" * 4096)
                ck.commit("j", "c1")
                self.assertTrue(ck.verify("j", "c1", deep=True).ok)
            # The checkpoint gauge refreshes every 5 s: poll for it (a slow machine may need more).
            deadline = time.time() + 60
            while True:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    self.assertEqual(resp.status, 200)
                    self.assertIn("text/plain", resp.headers["Content-Type"])
                    text = resp.read().decode()
                if ('sluice_checkpoints{state="COMPLETE"} 1' in text
                        and "sluice_rpc_active_streams 0" in text) or time.time() > deadline:
                    break
                time.sleep(0.5)
            self.assertRegex(text, r'sluice_rpc_requests_total\{method="/grpc.health.v1.Health/Check",code="OK"\} 5')
            self.assertIn('sluice_rpc_duration_seconds_bucket{method="/sluice.v1.Admin/GetInfo",le="+Inf"} 1', text)
            self.assertRegex(text, r"sluice_process_resident_memory_bytes \d+")
            self.assertRegex(text, r"sluice_process_open_fds \d+")
            self.assertIn("sluice_rpc_active_streams 0", text)
            self.assertIn("sluice_indices_served_total 500", text)
            self.assertIn('sluice_checkpoints{state="COMPLETE"} 1', text)
            self.assertIn('sluice_verify_verdicts_total{mode="deep",verdict="OK"} 2', text)
            self.assertIn("sluice_catalog_errors_total 0", text)
            self.assertRegex(text, r'sluice_rpc_received_bytes_total\{method="/sluice.v1.Checkpoints/UploadShard"\} \d{4,}')
            self.assertRegex(text, r'sluice_rpc_sent_bytes_total\{method="/grpc.health.v1.Health/Check"\} 10')
            promtool = shutil.which("promtool")
            self.assertIsNotNone(promtool, "promtool (Debian prometheus) is not installed")
            r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                               text=True, timeout=30)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with self.assertRaises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(url.replace("/metrics", "/nope"), timeout=5)
            self.assertEqual(e.exception.code, 404)
            self.assertEqual(d.stop(), 0, d.log())
            self.assertEqual(d.sanitizer_reports(), [], d.log())


class SystemdNotifyTest(unittest.TestCase):
    def test_ready_watchdog_stopping(self):
        import socket
        tmp = tempfile.mkdtemp(prefix="sluice-notify-")
        path = os.path.join(tmp, "notify.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(10)
        try:
            env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"}
            with Daemon(env=env) as d:
                msgs = []
                deadline = time.monotonic() + 10
                while sum(m == "WATCHDOG=1" for m in msgs) < 3 and time.monotonic() < deadline:
                    msgs.append(sock.recv(4096).decode())
                ready = [m for m in msgs if m.startswith("READY=1")]
                self.assertTrue(ready, msgs)
                self.assertIn("STATUS=serving on " + d.addr, ready[0])
                self.assertGreaterEqual(sum(m == "WATCHDOG=1" for m in msgs), 3, msgs)
                d.signal(signal.SIGTERM)
                seen = ""
                while "STOPPING=1" not in seen:
                    seen = sock.recv(4096).decode()
                self.assertEqual(d.stop(), 0, d.log())
        finally:
            sock.close()
            shutil.rmtree(tmp)


class ConfigFileTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="sluice-conf-")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def write(self, text):
        path = os.path.join(self.tmp, "sluiced.conf")
        with open(path, "w") as f:
            f.write(text)
        return path

    def check(self, *args, env=None):
        return subprocess.run([SLUICED, "--check-config"] + list(args), capture_output=True,
                              text=True, timeout=10, env=dict(os.environ, **(env or {})))

    def effective(self, r):
        return dict(re.findall(r"^([a-z-]+) = (.*)$", r.stdout, re.M))

    def test_precedence(self):
        path = self.write("[sluiced]\nlog-level = debug\ngrace_period = 3\nrpc-threads = 4\n")
        r = self.check("--config", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        eff = self.effective(r)
        self.assertEqual((eff["log-level"], eff["grace-period"], eff["rpc-threads"]),
                         ("debug", "3", "4"))
        # Environment beats the file, flags beat the environment.
        r = self.check("--config", path, "--rpc-threads", "8",
                       env={"SLUICE_LOG_LEVEL": "warn", "SLUICE_RPC_THREADS": "6"})
        eff = self.effective(r)
        self.assertEqual((eff["log-level"], eff["grace-period"], eff["rpc-threads"]),
                         ("warn", "3", "8"))
        # SLUICE_CONFIG names the file too.
        r = self.check(env={"SLUICE_CONFIG": path})
        self.assertEqual(self.effective(r)["log-level"], "debug")
        # The printed configuration is itself a valid config file.
        again = self.write(r.stdout)
        self.assertEqual(self.check("--config", again).returncode, 0)

    def test_errors(self):
        cases = [("listen = 127.0.0.1:1\nbogus = 1\n", "line 2: unknown key 'bogus'"),
                 ("[other]\nlisten = x\n", "unknown section"),
                 ("rpc-threads = lots\n", "line 1"),
                 ("log-level = loud\n", "'loud'")]
        for text, msg in cases:
            r = self.check("--config", self.write(text))
            self.assertEqual(r.returncode, 2, text)
            self.assertIn(msg, r.stderr, text)
        r = self.check("--config", os.path.join(self.tmp, "missing.conf"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("missing.conf", r.stderr)

    def test_printed_config_parses_back(self):
        # Seconds keep their milliseconds ("%g" printed 2591999 as 2.592e+06, and 1.001 was
        # truncated to 1000 ms), and the printed file gives the same settings (fuzz_flags).
        r = self.check("--grace-period", "1.001", env={"SLUICE_UPLOAD_TIMEOUT": "2591999"})
        self.assertEqual(r.returncode, 0, r.stderr)
        eff = self.effective(r)
        self.assertEqual((eff["grace-period"], eff["upload-timeout"]), ("1.001", "2591999"))
        again = self.check("--config", self.write(r.stdout))
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertEqual(self.effective(again), eff)

    def test_values_a_file_cannot_hold(self):
        # inih read a long line as two: the value was cut and its tail parsed as another key.
        r = self.check("--config", self.write("data-dir = /" + "a" * 185 + "listen = evil\n"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("line 1: more than 198 characters", r.stderr)
        # Values --check-config could not print as a config file are refused everywhere.
        for args, env, msg in [(["--data-dir", "/d\n[sluiced]\nx"], {}, "control character"),
                               (["--listen", "a ;b"], {}, "';'"),
                               ([], {"SLUICE_DATA_DIR": ";x"}, "';'"),
                               (["--token-file", "/t "], {}, "space")]:
            r = self.check(*args, env=env)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn(msg, r.stderr, args)

    def test_daemon_uses_file_and_json_logs(self):
        data = os.path.join(self.tmp, "data")
        path = self.write("data-dir = %s\nlog-format = json\nlog-level = debug\n" % data)
        with Daemon(data_dir=data, args=["--config", path]) as d:
            self.assertEqual(cli("health", addr=d.addr).returncode, 0)
            self.assertEqual(d.stop(), 0)
            lines = [l for l in d.log().splitlines() if l.strip()]
            self.assertTrue(lines)
            events = [json.loads(l) for l in lines]
            self.assertIn("listening", [e["event"] for e in events])
            rpc = [e for e in events if e["event"] == "rpc"]
            self.assertTrue(rpc and rpc[0]["method"] == "/grpc.health.v1.Health/Check", events)
            self.assertTrue(all({"ts", "level", "event"} <= e.keys() for e in events))


if __name__ == "__main__":
    unittest.main(verbosity=2)
