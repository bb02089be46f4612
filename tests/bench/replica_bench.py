"""Replicas on PostgreSQL against the SQLite single node, side by side in one run (issue 15,
"Benchmark"):

  (a) sqlite  one sluiced with its SQLite catalog (WAL, synchronous=FULL) in its data dir
  (b) pg x1   one replica with the catalog in PostgreSQL 15
  (c) pg x3   three replicas of one catalog (one database, one data dir), the clients spread
              over them (rank r, caller r through replica r % 3)

The load generator (this process) has three client channels in each configuration, rank or
caller r on channel r % 3, so that its side is the same in all three; on one daemon they share a
connection.

PostgreSQL runs durable (fsync=on, synchronous_commit=on: checked, printed) on the same disk as
SQLite's data dir, so each group commit of reports costs an fsync on both sides. Each round
(--runs, the configurations interleaved in each) measures on fresh jobs, every phase within
epoch 0 of its job (the datasets are large enough that no rank reaches its share's end, checked):

  reports   --ranks ranks (default 64), each keeping one ReportProgress in flight with an
            increasing position for --seconds: reports/s (the daemon group-commits them)
  unary     --callers callers (default 16), each keeping one GetEpoch or GetJob in flight
            (alternating) for --seconds: calls/s
  latency   one client, one call at a time: p50/p99 of --lat-calls reports and of --lat-calls
            GetEpochs, (a) and (b) only
  one share rank 0's share of --share-samples (default 10M) over 8 ranks streamed from replica
            0 (max_chunk 65536), --share-repeats times (default 5): the median's seconds
  256       --streams streams (default 256: one per rank of a job over --stream-samples)
            at once, one thread each, through the rank's replica: aggregate indices/s

and the CPU seconds per unit of work of the daemons (utime + stime from /proc/PID/stat before
and after each phase, summed over a configuration's replicas), of PostgreSQL (its postmaster,
found through postmaster.pid, its exited children's time and its living children) and of this
process (the load generator, sharing the machine), so the gain with replicas on separate
machines can be read off. For PostgreSQL also its write transactions (commits) and WAL bytes
per report; the time of one 4 KiB write + fdatasync on the disk is printed first. The table
gives the medians over the rounds and the ratios (b)/(a) and (c)/(b) of the figures as printed
(on a rate > 1 is better, on a time or CPU < 1 is), then the goals: (b) within 2x of (a) on
every rate, time and latency; (c) at least (b) on the aggregate rates (reports/s, calls/s,
256-stream indices/s). The machine's cores are shared by the daemons, PostgreSQL and this
Python process, so a rate here is bounded by the CPU they take together. No figure is asserted;
it fails only when something does not work (a call, a short stream, an epoch that completed).

    replica_bench.py [--runs R] [--seconds S] [--ranks N] [--callers N] [--lat-calls N]
                     [--share-samples N] [--share-repeats N] [--streams N]
                     [--stream-samples N] [--dir DIR] [--smoke]

--dir holds the data dirs and PostgreSQL's (default the temp dir, a disk: fsync must cost what
it costs). Needs SLUICED and PYTHONPATH (build/python and tests/python) as ctest sets them, and
Debian's postgresql-15 (pgfixture.py).
"""
import argparse
import functools
import os
import queue
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time

from pgfixture import PgServer
from sltest import Daemon
from sluice.client import Client
from sluice.v1 import feed_pb2

TICK = os.sysconf("SC_CLK_TCK")
SHARE_RANKS = 8
REPORT_SAMPLES = 1 << 30  # the reports' dataset: no rank gets near its share's end


# ---- CPU of processes ----

def stat_fields(pid):
    """The fields of /proc/PID/stat after the command (state is [0], ppid [1], utime [11])."""
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_of(pid):
    """utime + stime of a process, seconds."""
    f = stat_fields(pid)
    return (int(f[11]) + int(f[12])) / TICK


def pg_cpu(pg):
    """PostgreSQL's CPU seconds so far: the postmaster's own and its reaped children's (cutime +
    cstime: backends that ended), plus every living child's."""
    with open(os.path.join(pg.data, "postmaster.pid")) as f:
        pm = int(f.readline())
    f = stat_fields(pm)
    total = sum(int(x) for x in f[11:15])
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            c = stat_fields(int(name))
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(c[1]) == pm:
            total += int(c[11]) + int(c[12])
    return total / TICK


def self_cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Measure:
    """Wall time and CPU seconds of a configuration's daemons, PostgreSQL and this process over a
    block; with PostgreSQL also its write transactions and WAL bytes over the block."""

    def __init__(self, cfg):
        self.cfg = cfg

    def __enter__(self):
        pg = self.cfg.pg
        self.wal0 = wal_stats(pg) if pg else None
        self.d0 = sum(cpu_of(d.proc.pid) for d in self.cfg.daemons)
        self.pg0 = pg_cpu(pg) if pg else 0.0
        self.s0 = self_cpu()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        pg = self.cfg.pg
        self.wall = time.perf_counter() - self.t0
        self.daemon = sum(cpu_of(d.proc.pid) for d in self.cfg.daemons) - self.d0
        self.pg = pg_cpu(pg) - self.pg0 if pg else 0.0
        self.client = self_cpu() - self.s0
        if pg:
            w = wal_stats(pg)
            self.xacts, self.wal_bytes = w[0] - self.wal0[0], w[1] - self.wal0[1]
        else:
            self.xacts = self.wal_bytes = 0


def wal_stats(pg):
    """(the next transaction id, the WAL insert position in bytes): exact at once, unlike the
    cumulative statistics views (pg_stat_wal, pg_stat_database), which backends update at most
    once a second and up to 10 s late. Only a transaction that writes takes an id, so the
    difference counts the write transactions (commits) in between; this query takes none."""
    row = pg.psql("SELECT pg_snapshot_xmax(pg_current_snapshot()), "
                  "pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')")[0]
    return int(row[0]), int(float(row[1]))


def disk_fsync_ms(where, n=100):
    """Median time of writing 4 KiB to a file and fdatasync'ing it, in `where`: the floor of
    one durable commit on this disk."""
    path = os.path.join(where, "fsync-probe")
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for i in range(n):
            os.pwrite(fd, os.urandom(4096), (i % 16) * 4096)
            t0 = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    return statistics.median(times) * 1e3


# ---- configurations ----

# The load generator's clients in every configuration: SLOTS Clients, slot s on replica
# s % replicas, so that this process runs the same gRPC threads (one per channel) whatever the
# configuration and only the daemons' side differs. On one daemon the slots share a connection
# (grpcio's global subchannel pool).
SLOTS = 3


class Config:
    """One configuration's daemons (started), the clients and its PostgreSQL (or None)."""

    def __init__(self, key, label, daemons, pg):
        self.key, self.label, self.daemons, self.pg = key, label, daemons, pg
        self.slots = [Client(daemons[s % len(daemons)].addr, timeout=60) for s in range(SLOTS)]
        self.clients = self.slots[:len(daemons)]  # one on each replica

    def client(self, i):
        """The client of rank or caller i: slot i % SLOTS, so on replica i % replicas."""
        return self.slots[i % SLOTS]

    def close(self):
        for c in self.slots:
            c.close()
        for d in self.daemons:
            rc = d.stop()
            if rc != 0:
                print("%s: sluiced %s exited with %s:\n%s" % (self.label, d.addr, rc,
                                                            d.log()[-3000:]), file=sys.stderr)


def start_configs(root, pg):
    base = ["--log-level", "warn"]
    a = [Daemon(data_dir=os.path.join(root, "a", "data"), catalog="sqlite", args=base)]
    b = [Daemon(data_dir=os.path.join(root, "b", "data"), catalog="postgresql", pg=pg,
                args=base + ["--replica-id", "solo"])]
    c = [Daemon(data_dir=os.path.join(root, "c", "data"), catalog="postgresql", pg=pg,
                args=base + ["--replica-id", "r%d" % i]) for i in range(3)]
    for group in (a, b, c):
        os.makedirs(os.path.dirname(group[0].data_dir), exist_ok=True)
        for d in group:
            d.start()
    return [Config("a", "(a) sqlite", a, None), Config("b", "(b) pg x1", b, pg),
            Config("c", "(c) pg x3", c, pg)]


def make_datasets(cfg, a):
    c = cfg.clients[0]
    c.create_dataset("reports", REPORT_SAMPLES)
    c.create_dataset("share", a.share_samples)
    c.create_dataset("streams", a.stream_samples)


def make_job(cfg, name, dataset, world, **kw):
    """Create the job through replica 0 and read it through every replica (which loads it)."""
    cfg.clients[0].create_job(name, dataset, world, **kw)
    for c in cfg.clients:
        if c.get_job(name).world_size != world:
            raise RuntimeError("%s: job %s not seen by %s" % (cfg.label, name, c.address))


def check_epoch0(cfg, job):
    for c in cfg.clients:
        e = c.get_epoch(job).epoch
        if e != 0:
            raise RuntimeError("%s: job %s reached epoch %d through %s: a phase must stay in "
                               "epoch 0" % (cfg.label, job, e, c.address))


# ---- phases ----

def closed_loop(n, issue, seconds):
    """n callers, each keeping one call in flight (issue(i, seq) starts caller i's seq-th call,
    seq from 1, and returns its grpc future) until `seconds` have passed; the answers are
    handled here, on this thread (the futures' callbacks only queue them). Returns the calls
    answered; raises the first failure."""
    done = queue.SimpleQueue()
    seq = [0] * n
    deadline = time.perf_counter() + seconds

    def go(i):
        seq[i] += 1
        issue(i, seq[i]).add_done_callback(functools.partial(lambda i, f: done.put((i, f)), i))

    for i in range(n):
        go(i)
    inflight, answered, failure = n, 0, None
    while inflight:
        i, f = done.get()
        inflight -= 1
        if f.exception() is not None:
            failure = failure or f.exception()
            continue
        answered += 1
        if failure is None and time.perf_counter() < deadline:
            go(i)
            inflight += 1
    if failure is not None:
        raise failure
    return answered


def phase_reports(cfg, a, run):
    job = "rep%d" % run
    make_job(cfg, job, "reports", a.ranks)

    def issue(rank, pos):
        return cfg.client(rank).report_progress_future(job, rank, 0, pos)

    with Measure(cfg) as m:
        m.n = closed_loop(a.ranks, issue, a.seconds)
    check_epoch0(cfg, job)
    return m


def phase_unary(cfg, a, run):
    job = "rep%d" % run  # the reports phase's job, in epoch 0 with progress

    def issue(i, seq):
        c = cfg.client(i)
        if seq % 2:
            return c.epochs.Get.future(feed_pb2.GetEpochRequest(job=job), timeout=c.timeout)
        return c.jobs.Get.future(feed_pb2.GetJobRequest(name=job), timeout=c.timeout)

    with Measure(cfg) as m:
        m.n = closed_loop(a.callers, issue, a.seconds)
    return m


def phase_latency(cfg, a, run):
    """Per-call seconds of sequential reports and GetEpochs through replica 0."""
    job = "lat%d" % run
    make_job(cfg, job, "reports", SHARE_RANKS)
    c = cfg.clients[0]
    rep, get = [], []
    for pos in range(1, a.lat_calls + 1):
        t0 = time.perf_counter()
        c.report_progress(job, 0, 0, pos)
        rep.append(time.perf_counter() - t0)
    for _ in range(a.lat_calls):
        t0 = time.perf_counter()
        c.get_epoch(job)
        get.append(time.perf_counter() - t0)
    check_epoch0(cfg, job)
    return rep, get


def stream_share(c, job, rank):
    """Indices of rank's share streamed (its whole share, checked)."""
    got, want = 0, None
    for ch in c.stream_indices(job, rank, epoch=0, position=0, max_chunk=65536):
        got += len(ch.indices)
        want = ch.share_count
    if got != want:
        raise RuntimeError("rank %d of %s: %s indices of a share of %s" % (rank, job, got, want))
    return got


def phase_share(cfg, a, run):
    """--share-repeats times the same share: the Measure of the median time, with the mean
    CPU seconds."""
    job = "share%d" % run
    make_job(cfg, job, "share", SHARE_RANKS, shuffle="feistel")
    ms = []
    for _ in range(a.share_repeats):
        with Measure(cfg) as m:
            m.n = stream_share(cfg.clients[0], job, 0)
        ms.append(m)
    # The CPU of one is a few clock ticks: the mean over all of them.
    mid = sorted(ms, key=lambda m: m.wall)[len(ms) // 2]
    for who in ("daemon", "pg", "client"):
        setattr(mid, who, statistics.mean(getattr(m, who) for m in ms))
    return mid


def phase_streams(cfg, a, run):
    job = "str%d" % run
    make_job(cfg, job, "streams", a.streams, shuffle="feistel")
    got = [0] * a.streams
    errors = []
    go = threading.Event()

    def one(rank):
        go.wait()
        try:
            got[rank] = stream_share(cfg.client(rank), job, rank)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(a.streams)]
    for t in threads:
        t.start()
    with Measure(cfg) as m:
        go.set()
        for t in threads:
            t.join()
        m.n = sum(got)
    if errors:
        raise errors[0]
    return m


def one_round(cfg, a, run):
    r = {"reports": phase_reports(cfg, a, run), "unary": phase_unary(cfg, a, run)}
    if cfg.key in ("a", "b"):
        r["lat_report"], r["lat_get"] = phase_latency(cfg, a, run)
    r["share"] = phase_share(cfg, a, run)
    r["streams"] = phase_streams(cfg, a, run)
    return r


# ---- report ----

def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def figures(rounds):
    """The table's rows for one configuration: {row: median over the rounds} (None: not
    measured)."""
    def med(fn):
        vals = [fn(r) for r in rounds]
        return None if any(v is None for v in vals) else statistics.median(vals)

    def lat(key, p):
        return med(lambda r: pct(r[key], p) * 1e3 if key in r else None)

    def per(key, who, unit):
        return med(lambda r: getattr(r[key], who) / r[key].n * unit)

    def pg_only(key, fn):
        return med(lambda r: fn(r[key]) if r[key].cfg.pg else None)

    return {
        "reports/s": med(lambda r: r["reports"].n / r["reports"].wall),
        "unary calls/s": med(lambda r: r["unary"].n / r["unary"].wall),
        "one-share stream, s": med(lambda r: r["share"].wall),
        "256-stream, M indices/s": med(lambda r: r["streams"].n / r["streams"].wall / 1e6),
        "report latency p50, ms": lat("lat_report", 50),
        "report latency p99, ms": lat("lat_report", 99),
        "GetEpoch latency p50, ms": lat("lat_get", 50),
        "GetEpoch latency p99, ms": lat("lat_get", 99),
        "daemons CPU s / 1000 reports": per("reports", "daemon", 1e3),
        "PostgreSQL CPU s / 1000 reports": pg_only("reports", lambda m: m.pg / m.n * 1e3),
        "client CPU s / 1000 reports": per("reports", "client", 1e3),
        "reports per PostgreSQL commit": pg_only("reports", lambda m: m.n / max(m.xacts, 1)),
        "PostgreSQL commits/s": pg_only("reports", lambda m: m.xacts / m.wall),
        "WAL bytes / report": pg_only("reports", lambda m: m.wal_bytes / m.n),
        "daemons CPU s / 1000 unary": per("unary", "daemon", 1e3),
        "PostgreSQL CPU s / 1000 unary": pg_only("unary", lambda m: m.pg / m.n * 1e3),
        "client CPU s / 1000 unary": per("unary", "client", 1e3),
        "daemons CPU s / 1M indices, 1 stream": per("share", "daemon", 1e6),
        "daemons CPU s / 1M indices, 256": per("streams", "daemon", 1e6),
        "PostgreSQL CPU s / 1M indices, 256": pg_only("streams", lambda m: m.pg / m.n * 1e6),
        "client CPU s / 1M indices, 256": per("streams", "client", 1e6),
    }


# Rows the goals apply to: higher is better (True) or lower (False); aggregate: (c) >= (b).
GOAL_ROWS = {"reports/s": (True, True), "unary calls/s": (True, True),
             "one-share stream, s": (False, False), "256-stream, M indices/s": (True, True),
             "report latency p50, ms": (False, False), "report latency p99, ms": (False, False),
             "GetEpoch latency p50, ms": (False, False),
             "GetEpoch latency p99, ms": (False, False)}


def fmt(v):
    if v is None:
        return "-"
    if v >= 1000:
        return "%.0f" % v
    if v >= 10:
        return "%.1f" % v
    if v >= 0.1:
        return "%.3f" % v
    return "%.4f" % v


def ratio(x, y):
    return None if x is None or y is None or y == 0 else x / y


def report(a, res):
    fig = {k: figures(v) for k, v in res.items()}
    print("\nmedians of %d round%s; (b)/(a) and (c)/(b) are ratios of the figures as printed "
          "(a rate: > 1 is better; a time or CPU: < 1 is better):"
          % (a.runs, "s" if a.runs > 1 else ""))
    head = "  %-38s %10s %10s %10s %8s %8s" % ("", "(a) sqlite", "(b) pg x1", "(c) pg x3",
                                                 "(b)/(a)", "(c)/(b)")
    print(head)
    missed = []
    for row in fig["a"]:
        va, vb, vc = fig["a"][row], fig["b"][row], fig["c"][row]
        ba, cb = ratio(vb, va), ratio(vc, vb)
        mark = ""
        if row in GOAL_ROWS:
            higher, aggregate = GOAL_ROWS[row]
            if ba is not None and (ba < 0.5 if higher else ba > 2.0):
                missed.append("(b) %s: %s vs (a) %s = %.2fx" % (row, fmt(vb), fmt(va), ba))
                mark += " b!"
            if aggregate and cb is not None and cb < 1.0:
                missed.append("(c) %s: %s vs (b) %s = %.2fx" % (row, fmt(vc), fmt(vb), cb))
                mark += " c!"
        print("  %-38s %10s %10s %10s %8s %8s%s" % (row, fmt(va), fmt(vb), fmt(vc),
                                                   fmt(ba), fmt(cb), mark))
    print("\ngoals: (b) within 2x of (a) on every rate, time and latency; (c) at least (b) on "
          "reports/s, unary calls/s and 256-stream indices/s (CPU rows: information)")
    if missed:
        print("goals NOT met (marked b! / c!):")
        for m in missed:
            print("  " + m)
    else:
        print("goals met")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--callers", type=int, default=16)
    ap.add_argument("--lat-calls", type=int, default=1000)
    ap.add_argument("--share-samples", type=int, default=10_000_000)
    ap.add_argument("--share-repeats", type=int, default=5)
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--stream-samples", type=int, default=25_600_000)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.runs, a.seconds, a.lat_calls, a.share_repeats = 1, 0.5, 30, 1
        a.share_samples, a.stream_samples = 200_000, 512_000
    root = tempfile.mkdtemp(prefix="replica-bench-", dir=a.dir)
    os.chmod(root, 0o755)  # PostgreSQL may run as nobody (pgfixture.py)
    pg = PgServer(durable=True)
    cfgs = []
    try:
        old_tmp = tempfile.tempdir
        tempfile.tempdir = root  # PgServer's directory: the same disk as the data dirs
        try:
            pg.start()
        finally:
            tempfile.tempdir = old_tmp
        show = {k: pg.psql("SHOW %s" % k)[0][0] for k in ("fsync", "synchronous_commit",
                                                          "wal_sync_method")}
        if show["fsync"] != "on" or show["synchronous_commit"] != "on":
            raise RuntimeError("PostgreSQL is not durable: %r" % show)
        print("PostgreSQL %s: %s; data under %s; 4 KiB write + fdatasync there: %.2f ms "
              "(median); %d cores, load average %.2f %.2f %.2f"
              % (pg.psql("SHOW server_version")[0][0],
                 ", ".join("%s=%s" % kv for kv in show.items()), root, disk_fsync_ms(root),
                 os.cpu_count(), *os.getloadavg()), flush=True)
        print("sizes: %d reporting ranks and %d unary callers for %.1f s each; latency %d calls; "
              "one share of %d samples over %d ranks (x%d); %d streams over %d samples"
              % (a.ranks, a.callers, a.seconds, a.lat_calls, a.share_samples, SHARE_RANKS,
                 a.share_repeats, a.streams, a.stream_samples), flush=True)
        cfgs = start_configs(root, pg)
        for cfg in cfgs:
            make_datasets(cfg, a)
        res = {cfg.key: [] for cfg in cfgs}
        for run in range(a.runs):
            for cfg in cfgs:
                r = one_round(cfg, a, run)
                res[cfg.key].append(r)
                print("run %d %-10s reports %6.0f/s, unary %6.0f/s, one share %.3f s, "
                      "%d streams %.2f M indices/s"
                      % (run + 1, cfg.label, r["reports"].n / r["reports"].wall,
                         r["unary"].n / r["unary"].wall, r["share"].wall, a.streams,
                         r["streams"].n / r["streams"].wall / 1e6), flush=True)
        report(a, res)
    finally:
        for cfg in cfgs:
            cfg.close()
        pg.destroy()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
