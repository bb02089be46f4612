"""A real PostgreSQL for the tests: Debian's postgresql (15 on Debian 12, 17 on 13), initdb in a
temporary directory, listening on 127.0.0.1 at a free port, with password (SCRAM)
authentication over TCP.

initdb and postgres refuse to run as root: as root the server runs as `nobody` (its directory
is handed over to it); otherwise as the current user. The password of the `sluice` role is in
`password_file` (mode 0600, owned by whoever runs the tests), which is what sluiced reads with
--catalog-password-file; psql() uses it through PGPASSWORD in its environment only.

fsync is off unless durable=True (tests restart PostgreSQL cleanly, they do not crash the
machine); the benchmark runs it durable.
"""
import glob
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest



def _pg_bin():
    """Debian's PostgreSQL server binaries: $SL_PG_BIN, else the newest major version installed
    (15 on Debian 12, 17 on Debian 13)."""
    if os.environ.get("SL_PG_BIN"):
        return os.environ["SL_PG_BIN"]
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    found.sort(key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return os.path.dirname(found[-1]) if found else "/usr/lib/postgresql/15/bin"


PG_BIN = _pg_bin()
PSQL = os.path.join(PG_BIN, "psql")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """start() / stop() / restart(); conninfo(db) for sluiced; psql(sql, db) for checks and
    faults (terminate(), create_db())."""

    def __init__(self, durable=False, max_connections=200):
        self.durable = durable
        self.max_connections = max_connections
        self.tmp = None
        self.port = None
        self.password = secrets.token_hex(16)
        self.as_nobody = os.geteuid() == 0
        self.user = "sluice"

    # ---- running commands as the server's owner ----

    def _as_owner(self, cmd):
        if self.as_nobody:
            return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"] + cmd
        return cmd

    def _run(self, cmd, timeout=60):
        p = subprocess.run(self._as_owner(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, cwd=self.tmp)
        if p.returncode != 0:
            raise RuntimeError("%s failed (%d):\n%s\n%s" % (
                " ".join(cmd), p.returncode, p.stdout.decode(errors="replace"), self.log()))
        return p.stdout.decode(errors="replace")

    def _give(self, path):
        if self.as_nobody:
            shutil.chown(path, "nobody", "nogroup")

    # ---- life ----

    @property
    def data(self):
        return os.path.join(self.tmp, "data")

    @property
    def logfile(self):
        return os.path.join(self.tmp, "pg.log")

    @property
    def password_file(self):
        return os.path.join(self.tmp, "catalog-password")

    def log(self):
        try:
            with open(self.logfile, errors="replace") as f:
                return f.read()[-6000:]
        except (OSError, TypeError):
            return ""

    def start(self, timeout=60):
        if self.tmp is None:
            self.tmp = tempfile.mkdtemp(prefix="sluice-pg-")
            os.chmod(self.tmp, 0o755)
            os.mkdir(self.data, 0o700)
            self._give(self.data)
            sock = os.path.join(self.tmp, "sock")
            os.mkdir(sock, 0o755)
            self._give(sock)
            initpw = os.path.join(self.tmp, "initdb-password")
            with open(initpw, "w") as f:
                f.write(self.password + "\n")
            os.chmod(initpw, 0o600)
            self._give(initpw)
            self._run([os.path.join(PG_BIN, "initdb"), "-D", self.data, "-U", self.user,
                       "--pwfile", initpw, "--auth-local=trust", "--auth-host=scram-sha-256",
                       "-E", "UTF8", "--no-locale", "--no-sync"], timeout=timeout)
            os.unlink(initpw)
            with open(self.password_file, "w") as f:
                f.write(self.password + "\n")
            os.chmod(self.password_file, 0o600)
            with open(self.logfile, "w"):
                pass
            self._give(self.logfile)
            self.port = free_port()
        opts = ["-c listen_addresses=127.0.0.1", "-c port=%d" % self.port,
                "-c unix_socket_directories=%s" % os.path.join(self.tmp, "sock"),
                "-c max_connections=%d" % self.max_connections]
        if not self.durable:
            opts += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        self._run([os.path.join(PG_BIN, "pg_ctl"), "-D", self.data, "-l", self.logfile, "-w",
                   "-t", str(int(timeout)), "-o", " ".join(opts), "start"], timeout=timeout + 5)
        return self

    def stop(self, mode="fast"):
        if self.tmp is None:
            return
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            try:
                self._run([os.path.join(PG_BIN, "pg_ctl"), "-D", self.data, "-m", mode, "-w",
                           "-t", "30", "stop"], timeout=40)
            except (RuntimeError, subprocess.TimeoutExpired):
                pass

    def restart(self, down=0.0):
        """Stop (fast: connections are ended), stay down `down` seconds, start again."""
        self.stop()
        time.sleep(down)
        self.start()

    def destroy(self):
        self.stop("immediate")
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def _pids(self):
        """The postmaster's pid and its children's (the backends and helpers)."""
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            master = int(f.readline())
        kids = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open("/proc/%s/stat" % d) as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == master:
                            kids.append(int(d))
                except (OSError, IndexError, ValueError):
                    pass
        return master, kids

    def freeze(self):
        """Stop every process of the server (SIGSTOP): connections stay open and nothing
        answers, as when its host hangs or the network drops packets without resets."""
        master = self._pids()[0]
        os.kill(master, signal.SIGSTOP)  # first: it forks no new backend meanwhile
        for pid in self._pids()[1]:
            os.kill(pid, signal.SIGSTOP)

    def thaw(self):
        master, kids = self._pids()
        for pid in kids:
            os.kill(pid, signal.SIGCONT)
        os.kill(master, signal.SIGCONT)

    def alive(self):
        return self.tmp is not None and os.path.exists(os.path.join(self.data, "postmaster.pid"))

    # ---- clients ----

    def conninfo(self, db="postgres"):
        return "postgresql://%s@127.0.0.1:%d/%s" % (self.user, self.port, db)

    def psql(self, sql, db="postgres", timeout=30):
        """Run sql; the rows as lists of strings."""
        env = dict(os.environ, PGPASSWORD=self.password, PGCONNECT_TIMEOUT="5")
        p = subprocess.run([PSQL, "-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1",
                            "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "-d", db,
                            "-c", sql], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout, env=env)
        if p.returncode != 0:
            raise RuntimeError("psql %r: %s" % (sql, p.stderr.decode(errors="replace")))
        out = p.stdout.decode()
        return [line.split("\t") for line in out.splitlines() if line]

    def create_db(self, name):
        if not self.psql("SELECT 1 FROM pg_database WHERE datname = '%s'" % name):
            self.psql('CREATE DATABASE "%s"' % name)
        return name

    def terminate(self, db):
        """pg_terminate_backend every connection of sluiced to database `db`; how many."""
        rows = self.psql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                         "WHERE datname = '%s' AND application_name LIKE 'sluiced %%'" % db)
        return int(rows[0][0])


class PgTestCase(unittest.TestCase):
    """A test case with one PostgreSQL server for its class (cls.pg), removed after it."""

    @classmethod
    def setUpClass(cls):
        cls.pg = PgServer().start()

    @classmethod
    def tearDownClass(cls):
        cls.pg.destroy()
