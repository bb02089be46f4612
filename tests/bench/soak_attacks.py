#!/usr/bin/env python3
"""The soak with attacks mixed in (issue 13, docs/hardening.md "Hardening II").

Starts one sluiced on 127.0.0.1 (port 0, a temporary data dir, default flags), runs the load and
soak benchmark (tests/bench/soak.c: index, batch and upload streams plus unary calls, all from
127.0.0.1) against it for --duration seconds, and meanwhile attacks it in phases of --phase
seconds, one attack after the other in a loop, each from its own source address in 127/8:

  reset     HTTP/2 rapid reset (HEADERS + RST_STREAM) on UploadShard from 3 connections
  bomb      gzip bombs (512 MiB of zeros in 0.5 MiB) to Check, GetInfo and UploadShard
  watch     grpc.health.v1 Watch streams opened by the thousand and held
  paths     calls to 3,000 distinct unknown method paths holding '"' and a newline, reset
  conns     idle TCP connections by the hundred, held
  unread    never-read StreamIndices with max_chunk 65536 (a reader that never grants window)
  parked    StreamIndices parked on epoch current+1 of a job by the thousand, while a trainer of
            that job uploads and commits checkpoints (the trainer's calls count as legitimate)
  verify    deep Verify calls of a 64 MiB checkpoint, reset after 50 ms, 50 at a time
  none      no attack: the load alone, as a control
  disk      UploadShard headers announcing the disk's free space minus 64 KiB, then only empty
            chunks

Attacks stop --tail seconds (15) before the end, so that the load runs alone for a while and the
daemon's descriptors can be compared before and after. A phase never waits past its end for a
connection (the daemon filters a flooding address for 10 s). --small shrinks the attacks for a
short run (the sizes are in SMALL below).

Legitimate calls are the soak's (its own error count), a grpcio client calling Health.Check every
0.2 s with a 1 s deadline, and the trainer of the parked phase (at least one save). The daemon's
RSS is sampled every 0.5 s. Prints per-phase figures and a summary; exits 1 on any error of a
legitimate call, a Check that failed or took 1 s or more, RSS at the end more than --rss-drift MiB
above its level after the first round of phases (or above --rss-max), a daemon that did not exit
0 on SIGTERM, or an attack of --attacks that never ran a phase to its end (the first round did
not complete).

    SLUICED=build/rel/server/sluiced SOAK=build/rel/tests/soak \\
    PYTHONPATH=build/rel/python:tests/python build/venv/bin/python tests/bench/soak_attacks.py \\
        --duration 600 --phase 20 --streams 256

The ctest smoke (tests/cmake/soak.cmake) is --duration 60 --phase 4 --tail 8 --small.
"""
import argparse
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import grpc  # noqa: E402
import test_attacks as ta  # noqa: E402  (the raw HTTP/2 client and the rapid-reset attacker)
from sltest import Daemon  # noqa: E402

from sluice._health import health_pb2 as hp  # noqa: E402
from sluice.checkpoint import Checkpoints  # noqa: E402
from sluice.client import Client  # noqa: E402
from sluice.v1 import checkpoint_pb2 as cp  # noqa: E402
from sluice.v1 import feed_pb2 as fp  # noqa: E402

CHECK = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"
INFO = "/sluice.v1.Admin/GetInfo"
STREAM = "/sluice.v1.Feed/StreamIndices"
VERIFY = "/sluice.v1.Checkpoints/Verify"
ATTACK_JOB = "atk"  # the attackers' own feed and checkpoint job
SAMPLES = 1 << 20


def grpc_frame(body):
    return struct.pack(">BI", 0, len(body)) + body


class Unread(ta.H2):
    """An HTTP/2 client that never grants the daemon flow-control window for data: what a reader
    that never reads looks like from the server."""

    def _frame(self, ftype, flags, sid, p):
        if ftype == ta.DATA:
            with self.cv:
                st = self.streams.get(sid)
                if st is not None:
                    st["data_bytes"] = st.get("data_bytes", 0) + len(p)
                    if flags & ta.END_STREAM:
                        st["ended"] = True
                    self.cv.notify_all()
            return
        super()._frame(ftype, flags, sid, p)


def reset(conn, sid):
    try:
        conn.send(ta.frame(ta.RST_STREAM, 0, sid, struct.pack(">I", ta.CANCEL)))
    except OSError:
        pass


def open_conn(addr, source, until, cls=ta.H2):
    """A connection from `source`, or None once `until` passed: the daemon filters an address
    that flooded it for 10 s (its SYNs go unanswered), and a phase must not wait that out past its
    end."""
    while time.monotonic() < until:
        try:
            return cls(addr, source=source,
                       connect_timeout=max(0.2, min(10.0, until - time.monotonic())))
        except OSError:
            time.sleep(0.2)  # filtered by the daemon for a while: try again
    return None


# How much of each attack a phase does: the full sizes are issue 13's; --small ones let a short
# run (the ctest smoke) go through every attack in a few seconds each. With --small the smoke
# lowers --max-job-streams so that 2,000 parked streams still use up the job's reader budget.
FULL = {"watch": 4000, "paths": 3000, "conns": 600, "unread": 400, "parked": 9000, "disk": 64}
SMALL = {"watch": 1000, "paths": 500, "conns": 200, "unread": 100, "parked": 2000, "disk": 16}


class Attacks:
    """Each attack runs until `until` (time.monotonic()) and returns a dict of counts."""

    SIZES = FULL

    def __init__(self, addr):
        self.addr = addr

    def none(self, until, src):
        """A control phase: the load alone."""
        while time.monotonic() < until:
            time.sleep(0.2)
        return {}

    def reset(self, until, src):
        me = os.path.join(HERE, "..", "integration", "test_attacks.py")
        secs = max(1.0, until - time.monotonic())
        procs = [subprocess.Popen([sys.executable, me, "rapid-reset", self.addr, "%.1f" % secs,
                                   ta.UPLOAD, src], stdout=subprocess.PIPE, text=True)
                 for _ in range(3)]
        pairs = conns = 0
        for p in procs:
            out = p.communicate(timeout=secs + 60)[0].split()
            if len(out) >= 2:
                pairs, conns = pairs + int(out[0]), conns + int(out[1])
        return {"pairs": pairs, "connections": conns}

    def bomb(self, until, src):
        z = __import__("zlib").compressobj(9, 8, 31)
        zeros = b"\0" * (1 << 20)
        bomb = z.compress(b"\x0a\x80\x80\x80\x80\x02") + b"".join(
            z.compress(zeros) for _ in range(512)) + z.flush()
        sent = refused = 0
        while time.monotonic() < until:
            c = open_conn(self.addr, src, until)
            if c is None:
                break
            try:
                for path in (CHECK, INFO, ta.UPLOAD):
                    sid = c.call(path, message=bomb, compressed=True)
                    st = c.status(sid, timeout=10)
                    sent += 1
                    refused += st is not None and st[0] != 0
            finally:
                c.close()
            time.sleep(0.2)
        return {"bombs": sent, "refused": refused}

    def watch(self, until, src):
        opened = refused = 0
        conns = []
        while time.monotonic() < until and opened < self.SIZES["watch"]:
            c = open_conn(self.addr, src, until)
            if c is None:
                break
            conns.append(c)
            sids = [c.call(WATCH, message=hp.HealthCheckRequest().SerializeToString())
                    for _ in range(500)]
            opened += len(sids)
            time.sleep(0.5)
            with c.cv:
                refused += sum(1 for s in sids if c.streams[s]["ended"])
        while time.monotonic() < until:
            time.sleep(0.2)
        for c in conns:
            c.close()
        return {"watch_streams": opened, "refused": refused}

    def paths(self, until, src):
        n = 0
        while time.monotonic() < until:
            c = open_conn(self.addr, src, until)
            if c is None:
                break
            try:
                for i in range(self.SIZES["paths"]):
                    if time.monotonic() >= until:
                        break
                    c.call('/x.Y/m%d"}\nsluice_fake_total{a="%d' % (n, n), reset=True)
                    n += 1
            except OSError:
                pass
            c.close()
            time.sleep(0.5)
        return {"paths": n}

    def conns(self, until, src):
        host, port = self.addr.rsplit(":", 1)
        held, failed = [], 0
        while time.monotonic() < until and len(held) < self.SIZES["conns"]:
            try:
                s = socket.create_connection((host, int(port)), timeout=2,
                                             source_address=(src, 0))
                s.sendall(ta.PREFACE + ta.frame(ta.SETTINGS, 0, 0))
                held.append(s)
            except OSError:
                failed += 1
                time.sleep(0.05)
        while time.monotonic() < until:
            time.sleep(0.2)
        closed = 0
        for s in held:
            s.setblocking(False)
            try:
                closed += s.recv(65536) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
            s.close()
        return {"connections": len(held), "refused": failed, "closed_by_daemon": closed}

    def unread(self, until, src):
        conns, opened = [], 0
        req = fp.StreamIndicesRequest(job=ATTACK_JOB, rank=0, max_chunk=65536).SerializeToString()
        while time.monotonic() < until and opened < self.SIZES["unread"]:
            c = open_conn(self.addr, src, until, Unread)
            if c is None:
                break
            conns.append(c)
            for _ in range(100):
                c.call(STREAM, message=req)
                opened += 1
            time.sleep(0.2)
        while time.monotonic() < until:
            time.sleep(0.2)
        for c in conns:
            c.close()
        return {"unread_streams": opened}

    def parked(self, until, src, legit):
        conns, opened = [], 0
        ep = legit.feed.get_epoch(ATTACK_JOB).epoch
        req = fp.StreamIndicesRequest(job=ATTACK_JOB, rank=1, epoch=ep + 1, epoch_set=True)
        body = req.SerializeToString()
        while time.monotonic() < until and opened < self.SIZES["parked"]:
            c = open_conn(self.addr, src, until)
            if c is None:
                break
            conns.append(c)
            for _ in range(1000):
                c.call(STREAM, message=body)
                opened += 1
            time.sleep(0.3)
        # The job's trainer checkpoints while its readers' budget is taken.
        # At least one save, even if opening the streams took the whole phase.
        saves = tries = 0
        while time.monotonic() < until or tries == 0:
            tries += 1
            name = "p%d" % time.monotonic_ns()
            try:
                legit.ckpt.begin(ATTACK_JOB, name, world_size=1)
                legit.ckpt.upload(ATTACK_JOB, name, 0, os.urandom(1 << 20))
                legit.ckpt.commit(ATTACK_JOB, name)
                legit.ckpt.delete(ATTACK_JOB, name)
                saves += 1
            except grpc.RpcError as e:
                legit.errors.append("parked-phase trainer: %s %s" % (e.code(), e.details()))
            time.sleep(0.5)
        for c in conns:
            c.close()
        return {"parked_streams": opened, "trainer_saves": saves}

    def verify(self, until, src):
        body = cp.VerifyRequest(job=ATTACK_JOB, name="big", mode=cp.DEEP).SerializeToString()
        n = 0
        while time.monotonic() < until:
            c = open_conn(self.addr, src, until)
            if c is None:
                break
            try:
                sids = [c.call(VERIFY, message=body) for _ in range(50)]
                time.sleep(0.05)
                for s in sids:
                    reset(c, s)
                n += len(sids)
            except OSError:
                pass
            c.close()
            time.sleep(0.2)
        return {"verifies_cancelled": n}

    def disk(self, until, src, legit, data_dir):
        st = os.statvfs(data_dir)
        size = st.f_bavail * st.f_frsize - (64 << 10)
        conns, held = [], 0
        name = "disk%d" % time.monotonic_ns()
        ranks = self.SIZES["disk"]
        legit.ckpt.begin(ATTACK_JOB, name, world_size=ranks)
        c = open_conn(self.addr, src, until)
        if c is None:
            raise RuntimeError("no connection before the phase's end")
        sids = []
        for rank in range(ranks):
            hdr = cp.UploadShardRequest(header=cp.ShardHeader(
                job=ATTACK_JOB, checkpoint=name, rank=rank, data_size=size,
                tensors=[cp.TensorInfo(name="t", dtype="u8", shape=[size], offset=0, size=size)]))
            sid = c.call(ta.UPLOAD, open_stream=True)
            c.send(ta.frame(ta.DATA, 0, sid, grpc_frame(hdr.SerializeToString())))
            sids.append(sid)
            held += 1
        conns.append(c)
        empty = grpc_frame(cp.UploadShardRequest(chunk=b"").SerializeToString())
        n = 0
        while time.monotonic() < until:
            for sid in sids:
                try:
                    c.send(ta.frame(ta.DATA, 0, sid, empty))
                    n += 1
                except OSError:
                    break
            time.sleep(0.5)
        ended = 0
        with c.cv:
            ended = sum(1 for s in sids if c.streams[s]["ended"])
        c.close()
        try:
            legit.ckpt.abort(ATTACK_JOB, name)
        except grpc.RpcError:
            pass
        return {"huge_headers": held, "empty_chunks": n, "ended_by_daemon": ended}


class Legit:
    """The health checker and the RSS sampler (and the stubs of the parked phase's trainer)."""

    def __init__(self, d):
        self.d = d
        self.errors, self.latency, self.rss = [], [], []
        self.stop = threading.Event()
        self.ch = grpc.insecure_channel(d.addr)
        self.check = self.ch.unary_unary(CHECK,
                                         request_serializer=hp.HealthCheckRequest.SerializeToString,
                                         response_deserializer=hp.HealthCheckResponse.FromString)
        self.feed = Client(d.addr)
        self.ckpt = Checkpoints(d.addr, timeout=60)
        self.threads = [threading.Thread(target=self._checker), threading.Thread(target=self._rss)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def _checker(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                r = self.check(hp.HealthCheckRequest(), timeout=1.0)
                if r.status != hp.HealthCheckResponse.SERVING:
                    self.errors.append("Check: status %d" % r.status)
            except grpc.RpcError as e:
                self.errors.append("Check: %s %s" % (e.code(), e.details()))
            self.latency.append(time.monotonic() - t0)
            time.sleep(max(0.0, 0.2 - (time.monotonic() - t0)))

    def _rss(self):
        while not self.stop.is_set():
            try:
                self.rss.append((time.monotonic(), ta.rss_mib(self.d.proc.pid)))
            except OSError:
                pass
            time.sleep(0.5)

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join()
        self.feed.close()
        self.ckpt.close()
        self.ch.close()


def self_check_interval(daemon_args):
    """--self-check-interval among the daemon's extra flags, else its default (10 s)."""
    args = daemon_args.split()
    for i, arg in enumerate(args):
        if arg == "--self-check-interval" and i + 1 < len(args):
            return float(args[i + 1])
        if arg.startswith("--self-check-interval="):
            return float(arg.split("=", 1)[1])
    return 10.0


def fd_kinds(pid):
    """The daemon's open file descriptors by kind (socket, pipe, anon_inode, file)."""
    kinds = {}
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            t = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        k = t.split(":", 1)[0] if ":" in t and not t.startswith("/") else "file"
        kinds[k] = kinds.get(k, 0) + 1
    return kinds


def setup(legit):
    """The attackers' dataset, job and a 64 MiB checkpoint to deep-verify."""
    legit.feed.create_dataset("atk", SAMPLES)
    legit.feed.create_job(ATTACK_JOB, "atk", world_size=4, shuffle="feistel", seed=7)
    legit.ckpt.begin(ATTACK_JOB, "big", world_size=4)
    for r in range(4):
        legit.ckpt.upload(ATTACK_JOB, "big", r, os.urandom(16 << 20))
    legit.ckpt.commit(ATTACK_JOB, "big")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--phase", type=float, default=20, help="seconds per attack phase")
    ap.add_argument("--streams", type=int, default=256, help="the soak's concurrent streams")
    ap.add_argument("--soak", default=os.environ.get("SOAK", "soak"),
                    help="the soak benchmark binary (default $SOAK, else soak on PATH)")
    ap.add_argument("--attacks", default="reset,bomb,watch,paths,conns,unread,parked,verify,disk")
    ap.add_argument("--soak-args", default="", help="extra soak flags, space-separated")
    ap.add_argument("--rss-max", type=float, default=1024)
    ap.add_argument("--rss-drift", type=float, default=64)
    ap.add_argument("--daemon-args", default="", help="extra sluiced flags, space-separated")
    ap.add_argument("--tail", type=float, default=15,
                    help="seconds of the load alone at the end, after the last attack")
    ap.add_argument("--small", action="store_true",
                    help="smaller attacks, for a short run: 1,000 Watch streams, 500 paths, 200 "
                    "idle connections, 100 never-read and 2,000 parked streams, 16 huge headers")
    a = ap.parse_args()
    names = a.attacks.split(",")
    unknown = [n for n in names if not callable(getattr(Attacks, n, None))]
    if unknown:
        ap.error("unknown attacks: %s" % ",".join(unknown))
    if a.small:
        Attacks.SIZES = SMALL
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    d = Daemon(args=["--metrics-listen", "127.0.0.1:0"] + a.daemon_args.split()).start()
    t_start = time.monotonic()
    legit = Legit(d)
    results, ok = [], True
    try:
        setup(legit)
        # The daemon's first self-check (--self-check-interval, 10 s) opens a connection to
        # itself that it keeps (a socket and /dev/null): let it happen before the fds are
        # counted, or the soak's before/after comparison sees it as one more of each.
        time.sleep(max(0.0, self_check_interval(a.daemon_args) + 1.5 -
                       (time.monotonic() - t_start)))
        fds_before = fd_kinds(d.proc.pid)
        legit.start()
        soak = subprocess.Popen([a.soak, "--addr", d.addr, "--streams", str(a.streams),
                                 "--duration", str(a.duration), "--interval", "60", "--json"] + a.soak_args.split(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        atk = Attacks(d.addr)
        t_end = time.monotonic() + a.duration - a.tail
        first_round_end = None
        i = 0
        while time.monotonic() + 5 < t_end:
            name = names[i % len(names)]
            src = "127.0.0.%d" % (2 + i % len(names))
            until = min(t_end, time.monotonic() + a.phase)
            n_err, n_lat, n_rss = len(legit.errors), len(legit.latency), len(legit.rss)
            t0 = time.monotonic()
            fn = getattr(atk, name)
            try:
                if name in ("parked",):
                    r = fn(until, src, legit)
                elif name == "disk":
                    r = fn(until, src, legit, d.data_dir)
                else:
                    r = fn(until, src)
            except Exception as e:  # an attacker's own failure is reported, not fatal
                r = {"attacker_error": repr(e)[:200]}
            lat = sorted(legit.latency[n_lat:])
            rss = [m for _, m in legit.rss[n_rss:]]
            r.update({"phase": name, "seconds": round(time.monotonic() - t0, 1),
                      "legit_errors": len(legit.errors) - n_err,
                      "check_p50_ms": round(1e3 * ta.percentile(lat, 0.5), 1),
                      "check_max_ms": round(1e3 * (lat[-1] if lat else 0), 1),
                      "rss_max_mib": round(max(rss) if rss else 0, 1)})
            results.append(r)
            print(json.dumps(r), flush=True)
            i += 1
            if i == len(names):
                first_round_end = time.monotonic()
        out, err = soak.communicate(timeout=a.duration + 300)
        fds_after = fd_kinds(d.proc.pid)
    finally:
        legit.close()
        rc = d.stop()
        log = d.log()
        d.cleanup()
    summary = json.loads(out) if out.strip().startswith("{") else {}
    lat = sorted(legit.latency)
    rss = legit.rss
    base = [m for t, m in rss if first_round_end and t <= first_round_end] or [m for _, m in rss]
    after_round = base[-1] if base else 0
    end_rss = rss[-1][1] if rss else 0
    soak_errors = summary.get("errors") if summary else None
    soak_ops = sum(v[0] for v in summary.get("ops", {}).values()) if summary else "?"
    print("soak with attacks: %.0f s, %d phases of %.0f s (%s), soak --streams %d"
          % (a.duration, len(results), a.phase, a.attacks, a.streams))
    print("  soak:   exit %d, %s operations, %s errors; soak's RSS series %s MiB"
          % (soak.returncode, soak_ops, soak_errors, summary.get("rss_mib", "?")))
    print("  Check:  %d calls, p50 %.1f ms, p99 %.1f ms, max %.1f ms, %d legitimate errors"
          % (len(lat), 1e3 * ta.percentile(lat, 0.5), 1e3 * ta.percentile(lat, 0.99),
             1e3 * (lat[-1] if lat else 0), len(legit.errors)))
    print("  RSS:    after the first round %.0f MiB, end %.0f MiB, max %.0f MiB"
          % (after_round, end_rss, max(m for _, m in rss) if rss else 0))
    events = {}
    for line in log.splitlines():
        ev = line.split("event=", 1)[1].split(" ", 1)[0] if "event=" in line else None
        if ev and ("level=warn" in line or "level=error" in line):
            events[ev] = events.get(ev, 0) + 1
    legit_cut = [l for l in log.splitlines() if "127.0.0.1:" in l and "event=rpc_flood" in l]
    print("  daemon: exit %s; warnings and errors logged: %s" % (rc, events or "none"))
    print("  fds:    before the load %s, after it %s" % (fds_before, fds_after))
    for l in legit_cut[:5]:
        print("  a legitimate connection was cut: " + l)
    for e in legit.errors[:10]:
        print("  error: " + e)
    if soak.returncode != 0:
        print(err[-3000:])
    # Every attack named must have run a phase to its end at least once: a run that reached only
    # some of them (phases that overran, a duration too short) proves nothing about the others.
    ran = {r["phase"] for r in results if "attacker_error" not in r}
    missing = [n for n in names if n not in ran]
    print("  phases: %d run, %d of the %d attacks named ran at least once%s"
          % (len(results), len(names) - len(missing), len(names),
             "; never: " + ",".join(missing) if missing else ""))
    ok = (rc == 0 and soak.returncode == 0 and soak_errors == 0 and not legit.errors and lat and
          lat[-1] < 1.0 and end_rss < a.rss_max and end_rss - after_round < a.rss_drift and
          not missing and first_round_end is not None)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
