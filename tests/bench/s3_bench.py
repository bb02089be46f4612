"""Checkpoint shards in object storage, side by side in one run (issue 16, "Benchmark"): the same
--size-mib bytes (random, one file) each repetition

  (a) local    `sluice ckpt upload` into a sluiced with the default store (its data dir)
  (b) s3       `sluice ckpt upload` into a sluiced with --store s3://BUCKET/PREFIX on s3rver
  (c) boto3    boto3 upload_file of the file straight to the same s3rver (default TransferConfig:
               8 MiB parts, 10 threads)
  (d) verify   `sluice ckpt verify --deep` of (b)'s checkpoint from the bucket, against boto3
               download_file of the same shard object + `sha256sum` of the downloaded file

and prints the medians of --runs: wall time and GiB/s, the ratios (b)/(c) and (d) against
download + sha256sum, the CPU seconds per GiB of the daemon (utime + stime from /proc/PID/stat
before and after), of the client (the CLI's rusage, this process's for boto3) and of s3rver (node;
its CPU share = its CPU seconds / the wall time: near 1.0 it is the bottleneck, its JavaScript
runs on one thread). The CLI hashes the file locally (its default, the receipt check). Then,
unless --no-tune, (b) again with each --s3-parts-in-flight x --s3-part-size of --tune-inflight
and --tune-part-mib (--tune-runs rounds, the settings interleaved in each, with one boto3
upload_file per round as the reference of the same moment), and the best.

    s3_bench.py [--size-mib N] [--runs R] [--dir DIR] [--store-dir DIR] [--no-tune]
                [--tune-inflight 1,4,8] [--tune-part-mib 8,16,32] [--tune-runs R] [--smoke]

--dir holds the data file and the download (default /dev/shm when it has room, else the temp
dir); --store-dir the local store's data dir and s3rver's directory (default the temp dir, a
disk). Needs SLUICED, SLUICE_CLI and PYTHONPATH (tests/python), as ctest sets them, s3rver
(tests/s3/install.sh, run on demand) and python3-boto3. No timing is asserted; it fails only when
something does not work (an upload, a verify, a checksum).
"""
import argparse
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from s3fixture import S3Server
from sltest import SLUICE_CLI, Daemon

MIB = 1 << 20
GIB = 1 << 30
TICK = os.sysconf("SC_CLK_TCK")
BUCKET = "sluice"
PREFIX = "bench"
JOB = "s3bench"


def cpu_of(pid):
    """utime + stime of a process, seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def self_cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Measure:
    """Wall time and the CPU seconds of the given processes over a block."""

    def __init__(self, **pids):
        self.pids = {k: v for k, v in pids.items() if v}

    def __enter__(self):
        self.cpu0 = {k: cpu_of(p) for k, p in self.pids.items()}
        self.self0 = self_cpu()
        self.t0 = time.perf_counter()
        self.client = 0.0  # CPU of child processes, added by run_cli
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        self.cpu = {k: cpu_of(p) - self.cpu0[k] for k, p in self.pids.items()}
        self.cpu["self"] = self_cpu() - self.self0


def run_cli(d, *args, m=None, timeout=900):
    """Run the CLI against daemon d; returns its stdout. Its CPU (rusage) goes to m.client."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen([SLUICE_CLI, "--addr", d.addr, "--timeout", str(timeout)] +
                             list(args), stdout=out, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        if m is not None:
            m.client += ru.ru_utime + ru.ru_stime
        out.seek(0)
        err.seek(0)
        text = out.read().decode(errors="replace")
        if p.returncode != 0:
            raise RuntimeError("sluice %s: exit %d\n%s%s" % (" ".join(args), p.returncode, text,
                                                              err.read().decode(errors="replace")))
        return text


def make_data(path, nbytes):
    h = hashlib.sha256()
    with open(path, "wb") as f:
        left = nbytes
        while left:
            b = os.urandom(min(left, 16 * MIB))
            h.update(b)
            f.write(b)
            left -= len(b)
    return h.hexdigest()


def s3_daemon(store_dir, s3, inflight=None, part_mib=None):
    args = ["--log-level", "warn", "--store", "s3://%s/%s" % (BUCKET, PREFIX),
            "--s3-endpoint", s3.endpoint]
    if inflight:
        args += ["--s3-parts-in-flight", str(inflight)]
    if part_mib:
        args += ["--s3-part-size", str(part_mib * MIB)]
    env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
    os.makedirs(os.path.join(store_dir, "s3d"), exist_ok=True)
    return Daemon(data_dir=os.path.join(store_dir, "s3d", "data"), args=args, env=env).start()


def ckpt_upload(d, name, path, s3pid):
    """begin, the timed upload, commit. Returns the Measure of the upload."""
    run_cli(d, "ckpt", "begin", JOB, name, "--world", "1", "--no-feed")
    with Measure(daemon=d.proc.pid, s3rver=s3pid) as m:
        run_cli(d, "ckpt", "upload", JOB, name, path, "--rank", "0", "--no-progress", m=m)
    run_cli(d, "ckpt", "commit", JOB, name)
    return m


def median_of(ms, what):
    return statistics.median(what(m) for m in ms)


def parse_list(s):
    return [int(x) for x in s.split(",") if x]


def default_dir(nbytes):
    shm = "/dev/shm"
    try:
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize > 3 * nbytes + GIB:
            return shm
    except OSError:
        pass
    return tempfile.gettempdir()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--store-dir", default=tempfile.gettempdir())
    ap.add_argument("--no-tune", action="store_true")
    ap.add_argument("--tune-inflight", default="1,4,8")
    ap.add_argument("--tune-part-mib", default="8,16,32")
    ap.add_argument("--tune-runs", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.size_mib, a.runs, a.tune_runs = 16, 1, 1
        a.tune_inflight, a.tune_part_mib = "1,4", "8"
    nbytes = a.size_mib * MIB
    gib = nbytes / GIB
    if a.dir is None:
        a.dir = default_dir(nbytes)
    work = tempfile.mkdtemp(prefix="s3-bench-", dir=a.dir)
    store = tempfile.mkdtemp(prefix="s3-bench-store-", dir=a.store_dir)
    import boto3
    from boto3.s3.transfer import TransferConfig
    tc = TransferConfig()
    try:
        data = os.path.join(work, "shard_0.bin")
        want = make_data(data, nbytes)
        print("data: %d MiB of random bytes in %s; local store and s3rver under %s; "
              "load average %.2f %.2f %.2f" % (a.size_mib, work, store, *os.getloadavg()),
              flush=True)
        print("boto3 %s: default TransferConfig: multipart threshold %d MiB, part %d MiB, "
              "max_concurrency %d threads" % (boto3.__version__, tc.multipart_threshold // MIB,
                                               tc.multipart_chunksize // MIB,
                                               tc.max_request_concurrency), flush=True)
        old_tmp = tempfile.tempdir
        tempfile.tempdir = store  # S3Server's directory
        try:
            s3 = S3Server(bucket=BUCKET).start()
        finally:
            tempfile.tempdir = old_tmp
        try:
            s3pid = s3.proc.pid
            client = s3.boto3_client()
            os.makedirs(os.path.join(store, "local"))
            local = Daemon(data_dir=os.path.join(store, "local", "data"),
                           args=["--log-level", "warn"]).start()
            sd = s3_daemon(store, s3)
            try:
                res = main_runs(a, local, sd, s3, s3pid, client, data, work, want, gib)
            finally:
                local.stop()
                sd.stop()
            report(a, res, gib)
            if not a.no_tune:
                tune(a, store, s3, s3pid, client, data, gib)
        finally:
            s3.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)
    return 0


def main_runs(a, local, sd, s3, s3pid, client, data, work, want, gib):
    res = {k: [] for k in ("local", "s3", "boto3", "verify", "download", "sha256sum")}
    for run in range(a.runs):
        name = "r%d" % run
        # (a) the local store
        res["local"].append(ckpt_upload(local, name, data, None))
        # (b) through sluiced into s3rver
        res["s3"].append(ckpt_upload(sd, name, data, s3pid))
        # (c) boto3 straight to s3rver
        direct = "direct/%s.bin" % name
        with Measure(s3rver=s3pid) as m:
            client.upload_file(data, BUCKET, direct)
        res["boto3"].append(m)
        size = client.head_object(Bucket=BUCKET, Key=direct)["ContentLength"]
        if size != os.path.getsize(data):
            raise RuntimeError("boto3 stored %d bytes, not %d" % (size, os.path.getsize(data)))
        client.delete_object(Bucket=BUCKET, Key=direct)
        # (d) deep verify from the bucket against download + sha256sum of the same object
        with Measure(daemon=sd.proc.pid, s3rver=s3pid) as m:
            run_cli(sd, "ckpt", "verify", JOB, name, "--deep", m=m)
        res["verify"].append(m)
        key = "%s/%s/%s_shard_0.shard" % (PREFIX, JOB, name)
        dst = os.path.join(work, "download.shard")
        with Measure(s3rver=s3pid) as m:
            client.download_file(BUCKET, key, dst)
        res["download"].append(m)
        with Measure() as m:
            r = subprocess.run(["sha256sum", dst], capture_output=True, text=True, check=True)
        res["sha256sum"].append(m)
        with open(dst, "rb") as f:
            head = f.read(88)
        if head[12:76].decode() != want or os.path.getsize(dst) != os.path.getsize(data) + 88:
            raise RuntimeError("the shard object in the bucket is not the data file (header %r)"
                               % head[:76])
        os.unlink(dst)
        for d in (local, sd):
            run_cli(d, "ckpt", "rm", JOB, name)
        print("run %d: local %.2f s, s3 %.2f s, boto3 %.2f s, verify --deep %.2f s, download "
              "%.2f s + sha256sum %.2f s (%s)"
              % (run + 1, res["local"][-1].wall, res["s3"][-1].wall, res["boto3"][-1].wall,
                 res["verify"][-1].wall, res["download"][-1].wall, res["sha256sum"][-1].wall,
                 r.stdout.split()[0][:12]), flush=True)
    return res


def report(a, res, gib):
    w = {k: median_of(v, lambda m: m.wall) for k, v in res.items()}
    w["dl_sum"] = statistics.median(d.wall + s.wall
                                    for d, s in zip(res["download"], res["sha256sum"]))

    def cpu(k, who):
        return median_of(res[k], lambda m: m.cpu.get(who, 0.0)) / gib

    def client(k):
        return median_of(res[k], lambda m: m.client) / gib

    def share(k):
        return median_of(res[k], lambda m: m.cpu.get("s3rver", 0.0) / m.wall)

    print("\nmedians of %d runs, %.3f GiB each (CPU in seconds per GiB; s3rver's share: its CPU "
          "seconds / wall seconds):" % (a.runs, gib))
    rows = [("(a) sluice ckpt upload, local store", "local",
             "daemon %.2f, client %.2f" % (cpu("local", "daemon"), client("local"))),
            ("(b) sluice ckpt upload, s3rver", "s3",
             "daemon %.2f, client %.2f, s3rver %.2f (share %.2f)"
             % (cpu("s3", "daemon"), client("s3"), cpu("s3", "s3rver"), share("s3"))),
            ("(c) boto3 upload_file, s3rver", "boto3",
             "boto3 %.2f, s3rver %.2f (share %.2f)"
             % (cpu("boto3", "self"), cpu("boto3", "s3rver"), share("boto3"))),
            ("(d) sluice ckpt verify --deep, s3rver", "verify",
             "daemon %.2f, client %.2f, s3rver %.2f (share %.2f)"
             % (cpu("verify", "daemon"), client("verify"), cpu("verify", "s3rver"),
                share("verify"))),
            ("    boto3 download_file, s3rver", "download",
             "boto3 %.2f, s3rver %.2f (share %.2f)"
             % (cpu("download", "self"), cpu("download", "s3rver"), share("download"))),
            ("    sha256sum of the download", "sha256sum", ""),
            ("    download + sha256sum", "dl_sum", "")]
    for label, k, extra in rows:
        print("  %-40s %7.2f s %6.3f GiB/s  %s" % (label, w[k], gib / w[k], extra))
    print("\nratios:")
    print("  (b) s3 through sluiced vs (c) boto3 direct: %.2fx boto3's rate (time %.2f / %.2f s)"
          % (w["boto3"] / w["s3"], w["s3"], w["boto3"]))
    print("  (a) local store vs (b) s3 through sluiced: %.2fx" % (w["s3"] / w["local"]))
    print("  (d) verify --deep vs download + sha256sum: %.2fx faster" % (w["dl_sum"] / w["verify"]))
    for k, label in (("s3", "(b)"), ("boto3", "(c)"), ("verify", "(d)")):
        if share(k) >= 0.85:
            print("  %s: s3rver used %.0f%% of a core: s3rver (node, one JavaScript thread) is "
                  "the bottleneck" % (label, 100 * share(k)))
    print("goal (through sluiced at least as fast as boto3; deep verify faster than download + "
          "sha256sum): %s" % ("met" if w["s3"] <= w["boto3"] and w["verify"] < w["dl_sum"]
                               else "NOT met"))


def tune(a, store, s3, s3pid, client, data, gib):
    """(b) with each setting, --tune-runs rounds, the settings interleaved in each round (a fresh
    daemon for each upload)."""
    configs = [(i, p) for i in parse_list(a.tune_inflight) for p in parse_list(a.tune_part_mib)]
    print("\n(b) with other settings (%d round%s, the settings interleaved; medians):"
          % (a.tune_runs, "s" if a.tune_runs > 1 else ""), flush=True)
    ms = {c: [] for c in configs}
    ref = []  # boto3 upload_file in each round, the reference of the same moment
    n = 0
    for _ in range(a.tune_runs):
        with Measure(s3rver=s3pid) as m:
            client.upload_file(data, BUCKET, "direct/tune.bin")
        ref.append(m)
        client.delete_object(Bucket=BUCKET, Key="direct/tune.bin")
        for c in configs:
            d = s3_daemon(store, s3, *c)
            try:
                name = "t%d" % n
                n += 1
                ms[c].append(ckpt_upload(d, name, data, s3pid))
                run_cli(d, "ckpt", "rm", JOB, name)
            finally:
                d.stop()
    wall = {c: median_of(ms[c], lambda m: m.wall) for c in configs}
    for c in configs:
        print("  --s3-parts-in-flight %d --s3-part-size %2d MiB: %6.2f s %6.3f GiB/s (%.2f-%.2f s),"
              " daemon %.2f CPU-s/GiB, s3rver %.2f (share %.2f)"
              % (c[0], c[1], wall[c], gib / wall[c], min(m.wall for m in ms[c]),
                 max(m.wall for m in ms[c]), median_of(ms[c], lambda m: m.cpu["daemon"]) / gib,
                 median_of(ms[c], lambda m: m.cpu["s3rver"]) / gib,
                 median_of(ms[c], lambda m: m.cpu["s3rver"] / m.wall)))
    rw = median_of(ref, lambda m: m.wall)
    print("  boto3 upload_file in the same rounds:          %6.2f s %6.3f GiB/s (%.2f-%.2f s), "
          "s3rver %.2f CPU-s/GiB (share %.2f)"
          % (rw, gib / rw, min(m.wall for m in ref), max(m.wall for m in ref),
             median_of(ref, lambda m: m.cpu["s3rver"]) / gib,
             median_of(ref, lambda m: m.cpu["s3rver"] / m.wall)))
    best = min(configs, key=lambda c: wall[c])
    line = "best: --s3-parts-in-flight %d --s3-part-size %d MiB (%.3f GiB/s" % (
        best[0], best[1], gib / wall[best])
    if (4, 8) in wall:
        line += ", %.2fx the default 4 x 8 MiB" % (wall[(4, 8)] / wall[best])
    print(line + "; %.2fx boto3's rate)" % (rw / wall[best]))


if __name__ == "__main__":
    sys.exit(main())
