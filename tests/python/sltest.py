"""Helpers for tests that run the real sluiced and the real clients.

Environment (set by ctest through SL_TEST_ENV): SLUICED, SLUICE_CLI, and PYTHONPATH including the
build's python dir (generated stubs + the sluice package). SL_TEST_STORE=s3 makes every Daemon
store its checkpoint shards in object storage (one s3rver per test process, s3fixture.py) instead
of the data dir; the store-view methods of Daemon (store_files, store_read, ...) read and damage
what the daemon stored on either store, so one test runs against both. SL_TEST_CATALOG=postgresql
does the same for the catalog: every Daemon keeps it in a database of its own (named after its
data dir, so a restart finds it) on one PostgreSQL server per test process (pgfixture.py).
SL_TEST_REPLICAS=N (with postgresql) makes every Daemon N sluiced replicas on that database and
one data dir, and spreads the test's calls over them: each read of Daemon.addr names the next
replica, Daemon.addrs lists them all (for clients that fail over), and start, stop, signal, log
and the sanitizer check cover every replica.
"""
import atexit
import hashlib
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import unittest

SLUICED = os.environ.get("SLUICED", "sluiced")
SLUICE_CLI = os.environ.get("SLUICE_CLI", "sluice")

# Reports from the sanitizers in a sanitized build: any of these in a daemon's stderr is a failure.
# So is a catalog statement that waited on the loop thread outside the catalog lane (PostgreSQL:
# server/catalog/lane.h), in any build.
SANITIZER_RE = re.compile(r"ERROR: (Address|Leak|Thread)Sanitizer|runtime error:|SUMMARY: \w+Sanitizer"
                          r"|catalog_blocking")


# The shard store the Daemons of this process use unless told: "dir" (the data dir) or "s3".
STORE = os.environ.get("SL_TEST_STORE", "dir")
if STORE not in ("dir", "s3"):
    raise RuntimeError("SL_TEST_STORE=%r: want dir or s3" % STORE)

# The catalog the Daemons of this process use unless told: "sqlite" or "postgresql".
CATALOG = os.environ.get("SL_TEST_CATALOG", "sqlite")
if CATALOG not in ("sqlite", "postgresql"):
    raise RuntimeError("SL_TEST_CATALOG=%r: want sqlite or postgresql" % CATALOG)

# How many replicas a Daemon of this process is unless told (more than 1 needs postgresql).
REPLICAS = int(os.environ.get("SL_TEST_REPLICAS", "1"))
if REPLICAS < 1 or (REPLICAS > 1 and CATALOG != "postgresql"):
    raise RuntimeError("SL_TEST_REPLICAS=%d: want 1, or more with SL_TEST_CATALOG=postgresql"
                       % REPLICAS)

_pg_lock = threading.Lock()
_pg_server = None


def shared_pg():
    """The PostgreSQL server of this test process: started on first use, stopped at exit."""
    global _pg_server
    from pgfixture import PgServer
    with _pg_lock:
        if _pg_server is None:
            _pg_server = PgServer().start()
            atexit.register(_pg_server.destroy)
        elif not _pg_server.alive():
            _pg_server.start()
        return _pg_server


_s3_lock = threading.Lock()
_s3_server = None
_s3_proxy = None


def shared_s3():
    """The s3rver of this test process, behind a FaultProxy that answers NoSuchUpload where S3
    would (s3fixture.FaultProxy._unknown_upload): started on first use (bounded by S3Server's
    start timeout), started again if it died, stopped at exit. Returns (server, proxy)."""
    global _s3_server, _s3_proxy
    from s3fixture import FaultProxy, S3Server
    with _s3_lock:
        if _s3_server is None or not _s3_server.alive():
            if _s3_server is not None:
                _s3_proxy.stop()
                _s3_server.stop()
            else:
                atexit.register(_stop_shared_s3)
            _s3_server = S3Server().start()
            _s3_proxy = FaultProxy(_s3_server.port, s3rver=_s3_server).start()
        return _s3_server, _s3_proxy


def _stop_shared_s3():
    global _s3_server, _s3_proxy
    with _s3_lock:
        if _s3_proxy is not None:
            _s3_proxy.stop()
            _s3_proxy = None
        if _s3_server is not None:
            _s3_server.stop()
            _s3_server = None


_daemons = 0  # Daemons made by this process


def _low_port():
    """A port that is free now, in [10000, 20000): below the kernel's ephemeral range (which
    port 0 draws from) and away from torchrun's fixed ports (29400 for --standalone, 29500)."""
    import random
    import socket
    while True:
        port = random.randrange(10000, 20000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue


class Daemon:
    """A sluiced on 127.0.0.1 with port 0 and a temporary data dir (or a given one).

    store: "dir" or "s3" (default SL_TEST_STORE). With s3 the shards go to the bucket of `s3` (an
    S3Server; default the process's shared one) under a prefix derived from the data dir, so a
    restart on the same data dir finds the same objects; `s3_endpoint` (e.g. a FaultProxy's)
    replaces the server's own endpoint.

    catalog: "sqlite" or "postgresql" (default SL_TEST_CATALOG). With postgresql the catalog is the
    database pg_db on `pg` (a PgServer; default the process's shared one), named after the data
    dir.

    replicas: how many sluiced share that database and the data dir (default SL_TEST_REPLICAS when
    the catalog is postgresql, else 1). The first is this object's own process (proc, port, log
    of one); the others are `siblings`, Daemons started, signalled and stopped with it. addr
    names the replicas in turn, so calls spread over them."""

    def __init__(self, data_dir=None, args=(), env=None, grace=2.0, store=None, s3=None,
                 s3_endpoint=None, catalog=None, pg=None, replicas=None, stable_port=False,
                 _replica=0):
        self._tmp = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="sluice-test-")
            data_dir = os.path.join(self._tmp.name, "data")
        self.data_dir = data_dir
        self.store = store or STORE
        self.s3 = None
        self.s3_prefix = None
        self._boto = None
        store_args, store_env = [], {}
        if self.store == "s3":
            if s3 is None:
                s3, proxy = shared_s3()
                s3_endpoint = s3_endpoint or proxy.endpoint
            self.s3 = s3
            self.s3_prefix = "t" + hashlib.sha256(
                os.path.abspath(data_dir).encode()).hexdigest()[:16]
            self.s3_endpoint = s3_endpoint or self.s3.endpoint
            store_args = ["--store", "s3://%s/%s" % (self.s3.bucket, self.s3_prefix),
                          "--s3-endpoint", self.s3_endpoint]
            store_env = {"AWS_ACCESS_KEY_ID": self.s3.access_key,
                         "AWS_SECRET_ACCESS_KEY": self.s3.secret_key}
        elif self.store != "dir":
            raise ValueError("store %r: want dir or s3" % self.store)
        self.catalog = catalog or CATALOG
        self.pg = self.pg_db = None
        if self.catalog == "postgresql":
            self.pg = pg or shared_pg()
            self.pg_db = self.pg.create_db("t" + hashlib.sha256(
                os.path.abspath(data_dir).encode()).hexdigest()[:16])
            # A restart on another port keeps its identity (and so its upload leases), as a
            # replica with a fixed address does.
            replica_id = self.pg_db if _replica == 0 else "%s-r%d" % (self.pg_db, _replica)
            store_args += ["--catalog", self.pg.conninfo(self.pg_db),
                           "--catalog-password-file", self.pg.password_file,
                           "--replica-id", replica_id]
        elif self.catalog != "sqlite":
            raise ValueError("catalog %r: want sqlite or postgresql" % self.catalog)
        if replicas is None:
            replicas = REPLICAS if self.catalog == "postgresql" else 1
        if replicas > 1 and self.catalog != "postgresql":
            raise ValueError("%d replicas need the postgresql catalog" % replicas)
        self.siblings = [Daemon(data_dir, args, env, grace, store, s3, s3_endpoint, catalog,
                                self.pg, 1, stable_port, k) for k in range(1, replicas)]
        self._turn = 0
        self._pinned = None
        self.stable_port = stable_port
        # Replicas share a data dir: each Daemon its own port file and log.
        global _daemons
        _daemons += 1
        tag = "%d" % os.getpid() if _daemons == 1 else "%d-%d" % (os.getpid(), _daemons)
        self.port_file = os.path.join(os.path.dirname(os.path.abspath(data_dir)),
                                      "port-%s" % tag)
        # Where the state lives stays when a test replaces self.args for a restart.
        self.fixed_args = store_args
        self.args = list(args)
        self.env = dict(os.environ, **store_env)
        self.env.update(env or {})
        self.grace = grace
        self.proc = None
        self.signalled = False
        self.port = None
        self.stderr_path = os.path.join(os.path.dirname(os.path.abspath(data_dir)),
                                        "sluiced-%s.log" % tag)

    @property
    def args(self):
        """The flags of the next start (after the fixed ones); set on every replica."""
        return self._args

    @args.setter
    def args(self, value):
        self._args = list(value)
        for d in getattr(self, "siblings", []):
            d.args = value

    @property
    def replicas(self):
        return [self] + self.siblings

    @property
    def addr(self):
        """This replica's address, or with siblings the next replica's (in turn, so that the
        test's clients spread over them)."""
        if not self.siblings:
            return "127.0.0.1:%d" % self.port
        d = self.replicas[self._turn % len(self.replicas)]
        self._turn += 1
        return "127.0.0.1:%d" % d.port

    @property
    def addrs(self):
        """Every replica's address, comma-separated, starting with the next in turn."""
        reps = self.replicas
        k = self._turn % len(reps)
        self._turn += 1
        return ",".join("127.0.0.1:%d" % d.port for d in reps[k:] + reps[:k])

    def pin_ports(self):
        """The next start listens on the ports of now (every replica on its own), as a daemon
        restarted at a fixed address does. Give such a Daemon stable_port=True: its first port
        is then one the kernel never hands out for port 0, so that while it is down no other
        process (torchrun picks its store's port by binding port 0) can take it."""
        for d in self.replicas:
            d._pinned = d.port

    def start(self, timeout=20.0):
        """Start every replica that is not running."""
        for d in self.replicas:
            if d.proc is None:
                d._start(timeout)
        return self

    @staticmethod
    def start_together(daemons, timeout=20.0):
        """Start the processes of `daemons` (one replica each) at once, as a StatefulSet with
        parallel pod management does, then wait until each listens; the first failure raises
        after every process was started."""
        for d in daemons:
            d._launch()
        errors = []
        for d in daemons:
            try:
                d._await(timeout)
            except RuntimeError as e:
                errors.append(str(e))
        if errors:
            raise RuntimeError("\n".join(errors))

    def _start(self, timeout):
        if self.stable_port and self.port is None and not self._pinned:
            # Below the kernel's ephemeral range; another test may take the port first: retry.
            for _ in range(20):
                self._pinned = _low_port()
                try:
                    return self._start_once(timeout)
                except RuntimeError as e:
                    if "in use" not in str(e):
                        raise
            raise RuntimeError("no free port below the ephemeral range")
        return self._start_once(timeout)

    def _start_once(self, timeout):
        self._launch()
        return self._await(timeout)

    def _launch(self):
        """Start the process; _await waits until it listens."""
        if os.path.exists(self.port_file):
            os.unlink(self.port_file)
        self.signalled = False
        self._err = open(self.stderr_path, "ab")
        cmd = [SLUICED, "--listen", "127.0.0.1:0", "--data-dir", self.data_dir,
               "--port-file", self.port_file, "--grace-period", str(self.grace)]
        cmd += self.fixed_args + self.args
        if self._pinned:
            cmd += ["--listen", "127.0.0.1:%d" % self._pinned]
            self._pinned = None
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._err,
                                     env=self.env)

    def _await(self, timeout):
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
        """What the daemon wrote to stderr (every replica's, one after the other)."""
        text = ""
        for d in self.replicas:
            try:
                with open(d.stderr_path, "r", errors="replace") as f:
                    part = f.read()
            except FileNotFoundError:
                part = ""
            text += part if not self.siblings else "--- %s\n%s" % (d.stderr_path, part)
        return text

    def stop(self, sig=signal.SIGTERM, timeout=30.0):
        """Signal the daemon (every replica) and wait; returns its exit code (the first replica
        whose code differs from the first's, if any does)."""
        for d in self.siblings:
            if d.proc is not None and d.proc.poll() is None and not d.signalled:
                d.signal(sig)
        rcs = [self._stop(sig, timeout)] + [d._stop(sig, timeout) for d in self.siblings]
        return next((rc for rc in rcs if rc != rcs[0]), rcs[0])

    def _stop(self, sig, timeout):
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
        if self.s3 is not None and rc is not None and rc < 0 and self.s3.alive():
            # Killed: a PUT it had on its way is torn, which S3 never shows (s3rver does).
            self.s3.drop_torn_objects(self.s3_prefix)
        return rc

    def signal(self, sig=signal.SIGTERM):
        """Send a signal now (to every replica); a later stop() only waits."""
        for d in self.replicas:
            if d.proc is not None:
                d.proc.send_signal(sig)
                d.signalled = True

    # -- the store as the daemon left it: files of a job, on either store --

    @property
    def boto(self):
        """A boto3 client of the s3 store (None with a directory)."""
        if self._boto is None and self.s3 is not None:
            self._boto = self.s3.boto3_client()
        return self._boto

    def store_key(self, job, name):
        """The object key (s3) or the path (dir) of file `name` of `job`."""
        if self.store == "s3":
            return "%s/%s/%s" % (self.s3_prefix, job, name)
        return os.path.join(self.data_dir, "checkpoints", job, name)

    def _list_keys(self, prefix):
        keys, token = [], None
        while True:
            kw = dict(Bucket=self.s3.bucket, Prefix=prefix)
            if token:
                kw["ContinuationToken"] = token
            r = self.boto.list_objects_v2(**kw)
            keys += [o["Key"] for o in r.get("Contents", [])]
            if not r.get("IsTruncated"):
                return keys
            token = r["NextContinuationToken"]

    def store_jobs(self):
        """The jobs that have a directory (dir) or any object (s3), sorted."""
        if self.store == "s3":
            return sorted({k.split("/")[1] for k in self._list_keys(self.s3_prefix + "/")
                           if k.count("/") == 2})
        root = os.path.join(self.data_dir, "checkpoints")
        return sorted(os.listdir(root)) if os.path.isdir(root) else []

    def store_files(self, job):
        """The names of the files of `job` (dot files included), sorted; [] if none."""
        if self.store == "s3":
            pre = "%s/%s/" % (self.s3_prefix, job)
            return sorted(k[len(pre):] for k in self._list_keys(pre) if "/" not in k[len(pre):])
        d = os.path.join(self.data_dir, "checkpoints", job)
        return sorted(os.listdir(d)) if os.path.isdir(d) else []

    def store_exists(self, job, name):
        return name in self.store_files(job)

    def store_read(self, job, name):
        if self.store == "s3":
            r = self.boto.get_object(Bucket=self.s3.bucket, Key=self.store_key(job, name))
            with r["Body"] as body:
                return body.read()
        with open(self.store_key(job, name), "rb") as f:
            return f.read()

    def store_write(self, job, name, data):
        """Write (replace) a file behind the daemon's back."""
        if self.store == "s3":
            self.boto.put_object(Bucket=self.s3.bucket, Key=self.store_key(job, name), Body=data)
            return
        os.makedirs(os.path.dirname(self.store_key(job, name)), exist_ok=True)
        with open(self.store_key(job, name), "wb") as f:
            f.write(data)

    def store_remove(self, job, name):
        if self.store == "s3":
            self.boto.delete_object(Bucket=self.s3.bucket, Key=self.store_key(job, name))
        else:
            os.unlink(self.store_key(job, name))

    def store_patch(self, job, name, offset, data):
        """Overwrite bytes at `offset` (in place on a directory, a new object on s3)."""
        if self.store == "s3":
            raw = bytearray(self.store_read(job, name))
            raw[offset:offset + len(data)] = data
            self.store_write(job, name, bytes(raw))
            return
        with open(self.store_key(job, name), "r+b") as f:
            f.seek(offset)
            f.write(data)

    def store_flip(self, job, name, offset, mask=0x55):
        """Flip bits of the byte at `offset`."""
        b = self.store_read(job, name)[offset]
        self.store_patch(job, name, offset, bytes([b ^ mask]))

    def store_truncate(self, job, name, size):
        if self.store == "s3":
            self.store_write(job, name, self.store_read(job, name)[:size])
            return
        with open(self.store_key(job, name), "r+b") as f:
            f.truncate(size)

    def store_set_mtime(self, job, name, when):
        """Make a file look last changed at `when` (seconds since the epoch), as the sweeps see
        it (a file's mtime; an object's Last-Modified)."""
        if self.store == "s3":
            self.s3.set_mtime(self.store_key(job, name), when)
        else:
            os.utime(self.store_key(job, name), (when, when))

    def store_append(self, job, name, data):
        self.store_write(job, name, self.store_read(job, name) + data)

    def sanitizer_reports(self):
        return SANITIZER_RE.findall(self.log())

    def cleanup(self):
        for d in self.siblings:
            d.cleanup()
        if self.proc is not None:
            self.stop(signal.SIGKILL)
        if self._boto is not None:
            self._boto.close()
            self._boto = None
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()


def rank_address(address, rank):
    """A comma-separated list of replica addresses starting at element rank % its length, so
    the ranks of a trainer given Daemon.addrs spread over the replicas (and fail over)."""
    parts = address.split(",")
    k = rank % len(parts)
    return ",".join(parts[k:] + parts[:k])


def cli(*args, addr=None, env=None, timeout=60):
    """Run the sluice CLI; returns CompletedProcess with text stdout/stderr."""
    cmd = [SLUICE_CLI]
    if addr:
        cmd += ["--addr", addr]
    cmd += list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


class DaemonClientTest(unittest.TestCase):
    """A test case with a fresh sluiced (self.d) and a sluice.client.Client on it (self.c); the
    daemon must exit 0 without sanitizer reports at the end."""

    def setUp(self):
        from sluice.client import Client
        self.d = Daemon().start()
        self.c = Client(self.d.addr)

    def tearDown(self):
        self.c.close()
        rc = self.d.stop()
        reports = self.d.sanitizer_reports()
        log = self.d.log()
        self.d.cleanup()
        self.assertEqual(rc, 0, "sluiced exit code\n" + log)
        self.assertEqual(reports, [], "sanitizer reports\n" + log)

    def restart(self):
        from sluice.client import Client
        self.c.close()
        self.assertEqual(self.d.stop(), 0, self.d.log())
        self.d.start()
        self.c = Client(self.d.addr)

    def code(self, fn, *a, **kw):
        """The gRPC status code and details of calling fn (a stream is read to its end)."""
        import grpc
        with self.assertRaises(grpc.RpcError) as e:
            r = fn(*a, **kw)
            if hasattr(r, "__iter__") and not hasattr(r, "DESCRIPTOR"):
                list(r)
        return e.exception.code(), e.exception.details()
