"""Deployment files: the systemd unit and its example config, the Kubernetes manifests, the
Dockerfile, and what `cmake --install` puts where. The files are checked against each other and
against the real daemon: the configs pass `sluiced --check-config`, the unit passes
`systemd-analyze verify` and `security`, the manifests' paths, ports and probes agree with the
config they mount, and the TLS probe command works against a real TLS sluiced. The scale-out
manifests (deploy/k8s/replicas) run as two replicas against a real PostgreSQL when its server
binaries are installed.

Environment (from ctest): SLUICED, SLUICE_CLI, SLUICE_BUILD_DIR (the build tree to install from).
"""
import contextlib
import filecmp
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

from pgfixture import PG_BIN
from sltest import SANITIZER_RE, SLUICE_CLI, SLUICED, Daemon

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEPLOY = os.path.join(ROOT, "deploy")
UNIT_IN = os.path.join(DEPLOY, "systemd", "sluiced.service.in")
EXAMPLE_CONF = os.path.join(DEPLOY, "systemd", "sluiced.conf")
SYSUSERS = os.path.join(DEPLOY, "systemd", "sysusers-sluice.conf")
K8S = os.path.join(DEPLOY, "k8s")
DOCKERFILE = os.path.join(DEPLOY, "docker", "Dockerfile")
BUILD_DIR = os.environ.get("SLUICE_BUILD_DIR", "")

# Environment without SLUICE_* variables, so only the files under test configure the daemon.
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}


def read(path):
    with open(path) as f:
        return f.read()


def parse_unit(text):
    """A systemd unit as {section: [(key, value), ...]}, keeping repeated keys in order."""
    sections, cur, pending = {}, None, ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            cur = sections.setdefault(line.strip("[]"), [])
            continue
        key, sep, value = line.partition("=")
        if cur is None or not sep:
            raise ValueError("not a unit line: %r" % raw)
        cur.append((key.strip(), value.strip()))
    return sections


def last(entries, key):
    """The effective value of a single-valued key (the last assignment), or None."""
    values = [v for k, v in entries if k == key]
    return values[-1] if values else None


def words(entries, key):
    """The effective words of a list-valued key: an empty assignment resets the list."""
    out = []
    for k, v in entries:
        if k == key:
            out = [] if not v else out + v.split()
    return out


def seconds(span):
    """A systemd time span ("20s", "1min 30s", "500ms", "30") in seconds."""
    units = {"ms": 0.001, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "": 1}
    total = 0.0
    for num, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span):
        total += float(num) * units[unit]
    return total


def parse_conf(text):
    """sluiced's INI config as {key: value} (only the keys set, '_' spelled '-')."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;[":
            continue
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip().replace("_", "-")] = value.strip()
    return out


def check_config(conf_path, env=None):
    """Run sluiced --check-config; returns (returncode, effective settings, stderr)."""
    r = subprocess.run([SLUICED, "--check-config", "--config", conf_path], capture_output=True,
                       text=True, timeout=20, env=dict(CLEAN_ENV, **(env or {})))
    return r.returncode, parse_conf(r.stdout), r.stderr


def host_port(addr):
    host, _, port = addr.rpartition(":")
    return host, int(port)


class SystemdUnitTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.unit = parse_unit(read(UNIT_IN))
        cls.svc = cls.unit["Service"]
        cls.conf = parse_conf(read(EXAMPLE_CONF))

    def test_service_keys(self):
        want = {
            "Type": "notify", "NotifyAccess": "main", "Restart": "on-failure",
            "KillSignal": "SIGTERM", "ExecReload": "/bin/kill -HUP $MAINPID",
            "StateDirectory": "sluice", "ConfigurationDirectory": "sluice", "UMask": "0027",
            "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
            "PrivateDevices": "yes", "NoNewPrivileges": "yes", "ProtectKernelTunables": "yes",
            "ProtectKernelModules": "yes", "ProtectKernelLogs": "yes",
            "ProtectControlGroups": "yes", "RestrictNamespaces": "yes", "LockPersonality": "yes",
            "MemoryDenyWriteExecute": "yes", "SystemCallArchitectures": "native",
            "CapabilityBoundingSet": "",
        }
        for key, value in want.items():
            self.assertEqual(last(self.svc, key), value, key)
        self.assertEqual(seconds(last(self.svc, "WatchdogSec")), 30)
        self.assertGreaterEqual(int(last(self.svc, "LimitNOFILE").split(":")[-1]), 4096)
        self.assertEqual(set(words(self.svc, "RestrictAddressFamilies")),
                         {"AF_INET", "AF_INET6", "AF_UNIX"})
        self.assertIn("@system-service", words(self.svc, "SystemCallFilter"))
        self.assertIn("/var/lib/sluice", words(self.svc, "ReadWritePaths"))
        self.assertEqual(self.unit["Install"], [("WantedBy", "multi-user.target")])

    def test_exec_start(self):
        exe, *args = last(self.svc, "ExecStart").split()
        self.assertEqual(exe, "@SLUICE_BINDIR@/sluiced")
        self.assertEqual(args, ["--config", "/etc/sluice/sluiced.conf"])
        # The --config file lives in the ConfigurationDirectory.
        self.assertEqual(os.path.dirname(args[1]), "/etc/" + last(self.svc, "ConfigurationDirectory"))

    def test_dedicated_user(self):
        if last(self.svc, "DynamicUser") == "yes":
            return
        user = last(self.svc, "User")
        self.assertNotIn(user, (None, "root", "0"))
        entries = [l.split() for l in read(SYSUSERS).splitlines() if l and l[0] != "#"]
        self.assertIn(("u", user), [tuple(e[:2]) for e in entries])

    @unittest.skipUnless(shutil.which("systemd-sysusers"), "systemd-sysusers not installed")
    def test_sysusers_creates_user(self):
        with tempfile.TemporaryDirectory() as root:
            os.mkdir(os.path.join(root, "etc"))
            r = subprocess.run(["systemd-sysusers", "--root=" + root, "--dry-run", SYSUSERS],
                               capture_output=True, text=True, timeout=20)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("Creating user '%s'" % last(self.svc, "User"), r.stdout + r.stderr)

    def test_example_config_matches_unit(self):
        # The example's data dir is the StateDirectory, and systemd waits longer than the grace
        # period before it kills a stopping daemon.
        self.assertEqual(self.conf["data-dir"], "/var/lib/" + last(self.svc, "StateDirectory"))
        self.assertGreater(seconds(last(self.svc, "TimeoutStopSec")),
                           float(self.conf["grace-period"]) + 2)

    def test_example_config_validates(self):
        rc, eff, err = check_config(EXAMPLE_CONF)
        self.assertEqual(rc, 0, err)
        self.assertEqual(eff["data-dir"], "/var/lib/sluice")
        self.assertEqual(eff["listen"], self.conf["listen"])
        # Every key sluiced knows is documented in the example (set or commented out).
        text = read(EXAMPLE_CONF)
        for key in eff:
            self.assertRegex(text, r"(?m)^#?%s = " % re.escape(key), key)

    def test_check_config_rejects_broken_example(self):
        # The check above can fail: a typo in a key is refused.
        with tempfile.NamedTemporaryFile("w", suffix=".conf") as f:
            f.write(read(EXAMPLE_CONF).replace("grace-period", "grace-perod"))
            f.flush()
            rc, _, err = check_config(f.name)
        self.assertNotEqual(rc, 0)
        self.assertIn("unknown key 'grace-perod'", err)


@unittest.skipUnless(BUILD_DIR, "SLUICE_BUILD_DIR not set")
class InstallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="sluice-install-")
        cls.prefix = os.path.join(cls.tmp, "prefix")
        r = subprocess.run(["cmake", "--install", BUILD_DIR, "--prefix", cls.prefix],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise AssertionError("cmake --install failed:\n" + r.stdout + r.stderr)
        cls.unit_path = os.path.join(cls.prefix, "lib", "systemd", "system", "sluiced.service")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_binaries(self):
        for name in ("sluiced", "sluice"):
            path = os.path.join(self.prefix, "bin", name)
            r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.startswith(name + " "), r.stdout)

    def test_python_package(self):
        # The package and its generated stubs land in lib/python3.X/dist-packages (X: Debian's
        # python3, which CMake found), which a fresh /usr/bin/python3 searches for the /usr/local
        # prefix. From this prefix, with that directory first on the path (README command 1 may
        # have installed another copy in /usr/local, which must not be the one imported), and -I
        # (no PYTHONPATH, no user site):
        # - Debian's python3 imports the torch-free client (python3-grpcio, python3-protobuf);
        # - the test venv's python imports sluice.torch (torch 2.x).
        found = glob.glob(os.path.join(self.prefix, "lib", "python3*", "dist-packages"))
        self.assertEqual(len(found), 1, found)
        pkg = found[0]
        rel = os.path.relpath(pkg, self.prefix)
        self.assertTrue(os.path.isfile(os.path.join(pkg, "sluice", "v1", "feed_pb2_grpc.py")))
        r = subprocess.run(["/usr/bin/python3", "-I", "-c", "import sys; print(sys.path)"],
                           capture_output=True, text=True, timeout=20)
        self.assertIn("'/usr/local/%s'" % rel, r.stdout)
        for python, modules in (("/usr/bin/python3", "sluice.checkpoint, sluice.client"),
                                (sys.executable, "sluice.torch, sluice.checkpoint, sluice.client")):
            code = ("import sys; sys.path.insert(0, %r); import %s; print(sluice.__file__)" %
                    (pkg, modules))
            r = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True,
                               timeout=60, cwd=self.tmp)
            self.assertEqual(r.returncode, 0, python + ": " + r.stderr)
            self.assertTrue(r.stdout.startswith(pkg), python + ": " + r.stdout)

    def test_service_files(self):
        self.assertEqual(read(self.unit_path),
                         read(UNIT_IN).replace("@SLUICE_BINDIR@", self.prefix + "/bin"))
        example = os.path.join(self.prefix, "etc", "sluice", "sluiced.conf.example")
        self.assertTrue(filecmp.cmp(example, EXAMPLE_CONF, shallow=False))
        sysusers = os.path.join(self.prefix, "lib", "sysusers.d", "sluice.conf")
        self.assertTrue(filecmp.cmp(sysusers, SYSUSERS, shallow=False))

    @unittest.skipUnless(shutil.which("systemd-analyze"), "systemd-analyze not installed")
    def test_systemd_analyze_verify(self):
        # The installed unit names the installed sluiced, so verify can check ExecStart too. It
        # exits 0 on unknown keys and bad values, so any complaint about our unit fails the test.
        r = subprocess.run(["systemd-analyze", "verify", self.unit_path], capture_output=True,
                           text=True, timeout=20)
        ours = [l for l in (r.stdout + r.stderr).splitlines() if "sluiced.service" in l]
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(ours, [])

    @unittest.skipUnless(shutil.which("systemd-analyze"), "systemd-analyze not installed")
    def test_systemd_analyze_verify_can_fail(self):
        bad = os.path.join(self.tmp, "sluiced.service")
        with open(bad, "w") as f:
            f.write(read(self.unit_path).replace("ProtectSystem=", "ProtectSystm="))
        r = subprocess.run(["systemd-analyze", "verify", bad], capture_output=True, text=True,
                           timeout=20)
        self.assertIn("ProtectSystm", r.stdout + r.stderr)

    @unittest.skipUnless(shutil.which("systemd-analyze"), "systemd-analyze not installed")
    def test_systemd_analyze_security(self):
        # Exposure 2.0 or less ("OK"); it is 1.4 with the hardening of the unit.
        r = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--threshold=20",
                            self.unit_path], capture_output=True, text=True, timeout=20)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr)


def load_k8s():
    """Every YAML document under deploy/k8s as (relative path, document)."""
    docs = []
    for d, _, files in os.walk(K8S):
        for name in sorted(files):
            if name.endswith((".yaml", ".yml")):
                path = os.path.join(d, name)
                with open(path) as f:
                    for doc in yaml.safe_load_all(f):
                        docs.append((os.path.relpath(path, K8S), doc))
    return docs


class KubernetesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.docs = load_k8s()
        base = [(p, d) for p, d in cls.docs if os.sep not in p and p != "kustomization.yaml"]
        cls.by_kind = {}
        for _, d in base:
            cls.by_kind.setdefault(d["kind"], []).append(d)
        (cls.sts,) = cls.by_kind["StatefulSet"]
        (cls.cm,) = cls.by_kind["ConfigMap"]
        cls.pod = cls.sts["spec"]["template"]["spec"]
        (cls.ctr,) = cls.pod["containers"]
        cls.ports = {p["name"]: p["containerPort"] for p in cls.ctr["ports"]}
        cls.mounts = {m["name"]: m["mountPath"] for m in cls.ctr["volumeMounts"]}
        cls.volumes = {v["name"]: v for v in cls.pod["volumes"]}
        args = cls.ctr["args"]
        cls.config_path = args[args.index("--config") + 1]
        key = os.path.basename(cls.config_path)
        cls.conf_text = cls.cm["data"][key]
        cls.conf = parse_conf(cls.conf_text)

    def test_documents_parse(self):
        self.assertGreaterEqual(len(self.docs), 6)
        for path, doc in self.docs:
            self.assertIsInstance(doc, dict, path)
            self.assertIn("apiVersion", doc, path)
            self.assertIn("kind", doc, path)

    def test_kustomization_lists_every_manifest(self):
        kust = yaml.safe_load(read(os.path.join(K8S, "kustomization.yaml")))
        listed = set(kust["resources"])
        present = {n for n in os.listdir(K8S) if n.endswith(".yaml") and n != "kustomization.yaml"}
        self.assertEqual(listed, present)
        comp = yaml.safe_load(read(os.path.join(K8S, "tls", "kustomization.yaml")))
        self.assertEqual(comp["kind"], "Component")
        for patch in comp["patches"]:
            self.assertTrue(os.path.exists(os.path.join(K8S, "tls", patch["path"])))

    def test_statefulset(self):
        spec = self.sts["spec"]
        self.assertEqual(spec["replicas"], 1)
        labels = self.sts["spec"]["template"]["metadata"]["labels"]
        self.assertLessEqual(spec["selector"]["matchLabels"].items(), labels.items())
        self.assertEqual(self.ports, {"grpc": 7700, "metrics": 9090})
        self.assertFalse(self.pod["enableServiceLinks"])
        self.assertEqual(self.ctr["image"].split(":")[0].rsplit("/", 1)[-1], "sluiced")

    def test_probes_are_native_grpc(self):
        for probe in ("livenessProbe", "readinessProbe"):
            self.assertEqual(self.ctr[probe]["grpc"], {"port": 7700}, probe)
        if "startupProbe" in self.ctr:
            self.assertEqual(self.ctr["startupProbe"]["grpc"], {"port": 7700})

    def test_resources(self):
        for kind in ("requests", "limits"):
            for res in ("cpu", "memory"):
                self.assertIn(res, self.ctr["resources"][kind], (kind, res))

    def test_security_context(self):
        pod_sc, sc = self.pod["securityContext"], self.ctr["securityContext"]
        self.assertTrue(pod_sc["runAsNonRoot"])
        self.assertEqual(pod_sc["runAsUser"], 10001)
        self.assertEqual(pod_sc["seccompProfile"], {"type": "RuntimeDefault"})
        self.assertTrue(sc["runAsNonRoot"])
        self.assertEqual(sc["runAsUser"], 10001)
        self.assertTrue(sc["readOnlyRootFilesystem"])
        self.assertFalse(sc["allowPrivilegeEscalation"])
        self.assertEqual(sc["capabilities"]["drop"], ["ALL"])
        self.assertEqual(sc["seccompProfile"], {"type": "RuntimeDefault"})

    def test_volumes(self):
        (claim,) = self.sts["spec"]["volumeClaimTemplates"]
        name = claim["metadata"]["name"]
        self.assertEqual(self.mounts[name], "/var/lib/sluice")
        self.assertNotIn(name, self.volumes)
        self.assertIn("storage", claim["spec"]["resources"]["requests"])
        tls = self.volumes["tls"]["secret"]
        self.assertEqual({i["key"] for i in tls["items"]}, {"tls.crt", "tls.key", "ca.crt"})
        self.assertIn("secretName", self.volumes["tokens"]["secret"])
        cfg = self.volumes["config"]["configMap"]
        self.assertEqual(cfg["name"], self.cm["metadata"]["name"])
        self.assertEqual(os.path.dirname(self.config_path), self.mounts["config"])
        # Every mount of a read-only root filesystem is a volume or the claim.
        for vol in self.mounts:
            self.assertTrue(vol in self.volumes or vol == name, vol)

    def test_config_agrees_with_pod(self):
        host, port = host_port(self.conf["listen"])
        self.assertEqual((host, port), ("0.0.0.0", self.ports["grpc"]))
        self.assertEqual(host_port(self.conf["metrics-listen"]), ("0.0.0.0", self.ports["metrics"]))
        self.assertEqual(self.conf["data-dir"], "/var/lib/sluice")
        token_dir, token_key = os.path.split(self.conf["token-file"])
        self.assertEqual(token_dir, self.mounts["tokens"])
        self.assertEqual(token_key, "tokens")
        self.assertGreater(self.pod["terminationGracePeriodSeconds"],
                           float(self.conf["grace-period"]) + 2)

    def test_services(self):
        services = {s["metadata"]["name"]: s for s in self.by_kind["Service"]}
        headless = services[self.sts["spec"]["serviceName"]]
        self.assertEqual(headless["spec"]["clusterIP"], "None")
        regular = [s for s in services.values() if s["spec"].get("clusterIP") != "None"]
        self.assertEqual(len(regular), 1)
        svc = regular[0]
        labels = self.sts["spec"]["template"]["metadata"]["labels"]
        for s in services.values():
            self.assertLessEqual(s["spec"]["selector"].items(), labels.items())
        ports = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
        self.assertEqual(ports, {"grpc": (7700, "grpc"), "metrics": (9090, "metrics")})
        ann = svc["metadata"]["annotations"]
        self.assertEqual(ann["prometheus.io/scrape"], "true")
        self.assertEqual(int(ann["prometheus.io/port"]), self.ports["metrics"])
        self.assertEqual(ann["prometheus.io/path"], "/metrics")

    def test_configmap_validates(self):
        with tempfile.TemporaryDirectory() as tmp:
            conf = os.path.join(tmp, "sluiced.conf")
            tokens = os.path.join(tmp, "tokens")
            with open(conf, "w") as f:
                f.write(self.conf_text)
            with open(tokens, "w") as f:
                f.write("admin 0123456789abcdef0123456789abcdef\n")
            # The token file of the pod does not exist here; the environment outranks the file.
            rc, _, err = check_config(conf)
            self.assertNotEqual(rc, 0)
            self.assertIn(self.conf["token-file"], err)
            rc, eff, err = check_config(conf, {"SLUICE_TOKEN_FILE": tokens})
            self.assertEqual(rc, 0, err)
            self.assertEqual(eff["listen"], "0.0.0.0:7700")
            self.assertEqual(eff["log-format"], "json")

    def test_tls_component(self):
        comp = yaml.safe_load(read(os.path.join(K8S, "tls", "statefulset-tls.yaml")))
        (ctr,) = comp["spec"]["template"]["spec"]["containers"]
        self.assertEqual(ctr["name"], self.ctr["name"])
        env = {e["name"]: e["value"] for e in ctr["env"]}
        self.assertEqual(env, {"SLUICE_TLS_CERT": self.mounts["tls"] + "/tls.crt",
                               "SLUICE_TLS_KEY": self.mounts["tls"] + "/tls.key"})
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            self.assertIsNone(ctr[probe]["grpc"], probe)
            cmd = ctr[probe]["exec"]["command"]
            self.assertEqual(cmd[0], "sluice")
            self.assertEqual(cmd[-1], "health")
            self.assertEqual(cmd[cmd.index("--addr") + 1], "localhost:7700")
            self.assertEqual(cmd[cmd.index("--tls-ca") + 1], self.mounts["tls"] + "/ca.crt")
        (vol,) = comp["spec"]["template"]["spec"]["volumes"]
        self.assertFalse(vol["secret"]["optional"])

    def test_probes_against_daemon(self):
        """The pod's config with the TLS component's environment, on a free port: the exec probe
        command of the component answers SERVING, a plaintext probe (the kubelet's native one)
        does not; without TLS a plaintext probe without a token is SERVING."""
        comp = yaml.safe_load(read(os.path.join(K8S, "tls", "statefulset-tls.yaml")))
        probe = comp["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]
        with tempfile.TemporaryDirectory() as tmp:
            def run(*args):
                subprocess.run(args, cwd=tmp, check=True, capture_output=True, timeout=20)

            run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=ca")
            run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=sluice")
            with open(os.path.join(tmp, "san.ext"), "w") as f:
                f.write("subjectAltName=DNS:localhost\n")
            run("openssl", "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", "tls.crt", "-days", "2", "-extfile", "san.ext")
            conf = os.path.join(tmp, "sluiced.conf")
            with open(conf, "w") as f:
                f.write(self.conf_text)
            tokens = os.path.join(tmp, "tokens")
            with open(tokens, "w") as f:
                f.write("admin 0123456789abcdef0123456789abcdef\n")
            # In an ASan build, c-ares (resolving "localhost" for the CLI) leaks 10 bytes; that
            # third-party leak is suppressed for these CLI runs only.
            supp = os.path.join(tmp, "lsan.supp")
            with open(supp, "w") as f:
                f.write("leak:libcares.so\n")
            cli_env = dict(CLEAN_ENV, LSAN_OPTIONS="suppressions=%s:print_suppressions=0" % supp)

            def health(*args):
                return subprocess.run([SLUICE_CLI] + list(args), capture_output=True, text=True,
                                      timeout=20, env=cli_env)

            # The Daemon's flags (which outrank the file) put it on 127.0.0.1:0 with a temporary
            # data dir; metrics off.
            env = {"SLUICE_TOKEN_FILE": tokens}
            with self.daemon(["--config", conf, "--metrics-listen", ""], env) as d:
                r = health("--addr", d.addr, "--timeout", "5", "health")
                self.assertEqual((r.returncode, r.stdout.strip()), (0, "SERVING"), r.stderr)
            env.update(SLUICE_TLS_CERT=os.path.join(tmp, "tls.crt"),
                       SLUICE_TLS_KEY=os.path.join(tmp, "tls.key"))
            with self.daemon(["--config", conf, "--metrics-listen", ""], env) as d:
                cmd = [c.replace("/etc/sluice/tls", tmp) for c in probe["command"]]
                self.assertEqual(cmd[0], "sluice")
                cmd[cmd.index("--addr") + 1] = "localhost:%d" % d.port
                r = health(*cmd[1:])
                self.assertEqual((r.returncode, r.stdout.strip()), (0, "SERVING"), r.stderr)
                r = health("--addr", "localhost:%d" % d.port, "--timeout", "2", "health")
                self.assertNotEqual(r.returncode, 0)

    @contextlib.contextmanager
    def daemon(self, args, env):
        """A Daemon configured only by `args` and `env`; it must stop cleanly (exit 0, no
        sanitizer report)."""
        d = Daemon(args=args)
        d.env = dict(CLEAN_ENV, **env)
        d.start()
        try:
            yield d
        finally:
            rc = d.stop()
            log = d.log()
            d.cleanup()
        self.assertEqual(rc, 0, log)
        self.assertEqual(SANITIZER_RE.findall(log), [], log)

    @unittest.skipUnless(shutil.which("kubectl"), "kubectl not installed")
    def test_kustomize_builds(self):
        def build(path):
            r = subprocess.run(["kubectl", "kustomize", path], capture_output=True, text=True,
                               timeout=30)
            self.assertEqual(r.returncode, 0, r.stderr)
            docs = list(yaml.safe_load_all(r.stdout))
            (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
            return sts["spec"]["template"]["spec"]["containers"][0]

        ctr = build(K8S)
        self.assertEqual(ctr["readinessProbe"]["grpc"], {"port": 7700})
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, "k8s")
            shutil.copytree(K8S, copy)
            kust = os.path.join(copy, "kustomization.yaml")
            text = read(kust).replace("# components:\n#   - tls", "components:\n  - tls")
            self.assertIn("\n  - tls", text)
            with open(kust, "w") as f:
                f.write(text)
            ctr = build(copy)
        self.assertNotIn("grpc", ctr["readinessProbe"])
        self.assertEqual(ctr["readinessProbe"]["exec"]["command"][-1], "health")
        self.assertIn("SLUICE_TLS_CERT", {e["name"] for e in ctr["env"]})



REPLICAS = os.path.join(K8S, "replicas")


def sluiced_help():
    r = subprocess.run([SLUICED, "--help"], capture_output=True, text=True, timeout=20,
                       env=CLEAN_ENV)
    return r.stdout


def pod_containers(pod):
    return pod.get("initContainers", []) + pod["containers"]


class ReplicasTest(unittest.TestCase):
    """deploy/k8s/replicas: N peers of one PostgreSQL catalog sharing one ReadWriteMany data dir,
    the password a file copied from a Secret (never in the environment or the arguments), the
    replica id from the pod's name."""

    @classmethod
    def setUpClass(cls):
        cls.docs = [(p, d) for p, d in load_k8s() if p.startswith("replicas" + os.sep)]
        cls.by_kind = {}
        for _, d in cls.docs:
            cls.by_kind.setdefault(d["kind"], []).append(d)
        (cls.sts,) = cls.by_kind["StatefulSet"]
        (cls.cm,) = cls.by_kind["ConfigMap"]
        (cls.pvc,) = cls.by_kind["PersistentVolumeClaim"]
        (cls.pdb,) = cls.by_kind["PodDisruptionBudget"]
        cls.pod = cls.sts["spec"]["template"]["spec"]
        cls.labels = cls.sts["spec"]["template"]["metadata"]["labels"]
        (cls.ctr,) = cls.pod["containers"]
        (cls.init,) = cls.pod["initContainers"]
        cls.ports = {p["name"]: p["containerPort"] for p in cls.ctr["ports"]}
        cls.mounts = {m["name"]: m["mountPath"] for m in cls.ctr["volumeMounts"]}
        cls.init_mounts = {m["name"]: m["mountPath"] for m in cls.init["volumeMounts"]}
        cls.volumes = {v["name"]: v for v in cls.pod["volumes"]}
        cls.env = {e["name"]: e for e in cls.ctr["env"]}
        cls.conf_text = cls.cm["data"]["sluiced.conf"]
        cls.conf = parse_conf(cls.conf_text)
        cls.base_sts = next(d for p, d in load_k8s()
                            if p == "statefulset.yaml" and d["kind"] == "StatefulSet")

    def test_kustomization_lists_every_manifest(self):
        kust = yaml.safe_load(read(os.path.join(REPLICAS, "kustomization.yaml")))
        present = {n for n in os.listdir(REPLICAS)
                   if n.endswith(".yaml") and n != "kustomization.yaml"}
        self.assertEqual(set(kust["resources"]), present)
        self.assertEqual(kust["images"][0]["name"], "sluiced")
        # The commented-out TLS component is the base's, which patches this StatefulSet too.
        text = read(os.path.join(REPLICAS, "kustomization.yaml"))
        self.assertIn("# components:\n#   - ../tls", text)
        patch = yaml.safe_load(read(os.path.join(K8S, "tls", "statefulset-tls.yaml")))
        self.assertEqual(patch["metadata"]["name"], self.sts["metadata"]["name"])
        self.assertEqual(patch["spec"]["template"]["spec"]["containers"][0]["name"],
                         self.ctr["name"])

    def test_statefulset(self):
        spec = self.sts["spec"]
        self.assertGreater(spec["replicas"], 1)
        self.assertEqual(spec["podManagementPolicy"], "Parallel")
        self.assertNotIn("volumeClaimTemplates", spec)
        self.assertLessEqual(spec["selector"]["matchLabels"].items(), self.labels.items())
        self.assertEqual(self.ports, {"grpc": 7700, "metrics": 9090})
        self.assertFalse(self.pod["enableServiceLinks"])
        self.assertFalse(self.pod["automountServiceAccountToken"])
        for c in pod_containers(self.pod):
            self.assertEqual(c["image"].split(":")[0].rsplit("/", 1)[-1], "sluiced", c["name"])
            for kind in ("requests", "limits"):
                for res in ("cpu", "memory"):
                    self.assertIn(res, c["resources"][kind], (c["name"], kind, res))

    def test_flags_and_environment_known_to_daemon(self):
        help_text = sluiced_help()
        self.assertIn("--replica-id", help_text)
        args = self.ctr["args"]
        self.assertEqual(args[:2], ["--config", "/etc/sluice/config/sluiced.conf"])
        for a in args:
            if a.startswith("--"):
                self.assertRegex(help_text, r"(?m)^\s+%s\b" % re.escape(a.split("=")[0]), a)
        for name in self.env:
            self.assertIn("[%s]" % name, help_text, name)

    def test_probes_as_base(self):
        base = self.base_sts["spec"]["template"]["spec"]["containers"][0]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            self.assertEqual(self.ctr[probe], base[probe], probe)
        self.assertEqual(self.ctr["readinessProbe"]["grpc"], {"port": 7700})
        self.assertGreater(self.pod["terminationGracePeriodSeconds"],
                           float(self.conf["grace-period"]) + 2)

    def test_security_context(self):
        pod_sc = self.pod["securityContext"]
        self.assertEqual(pod_sc, self.base_sts["spec"]["template"]["spec"]["securityContext"])
        for c in pod_containers(self.pod):
            sc = c["securityContext"]
            self.assertTrue(sc["runAsNonRoot"], c["name"])
            self.assertEqual(sc["runAsUser"], 10001)
            self.assertTrue(sc["readOnlyRootFilesystem"])
            self.assertFalse(sc["allowPrivilegeEscalation"])
            self.assertEqual(sc["capabilities"]["drop"], ["ALL"])
            self.assertEqual(sc["seccompProfile"], {"type": "RuntimeDefault"})

    def test_shared_data_volume(self):
        # One ReadWriteMany claim, the same volume in every pod, mounted at the config's data dir.
        self.assertEqual(self.pvc["spec"]["accessModes"], ["ReadWriteMany"])
        self.assertIn("storage", self.pvc["spec"]["resources"]["requests"])
        claim = self.volumes["data"]["persistentVolumeClaim"]
        self.assertEqual(claim["claimName"], self.pvc["metadata"]["name"])
        self.assertNotIn("readOnly", claim)
        self.assertEqual(self.mounts["data"], self.conf["data-dir"])
        # Every mount of a read-only root filesystem is a volume.
        for c in pod_containers(self.pod):
            for m in c["volumeMounts"]:
                self.assertIn(m["name"], self.volumes, (c["name"], m["name"]))

    def test_catalog_from_secret(self):
        # The conninfo (no password) is SLUICE_CATALOG from the Secret's "conninfo" key.
        ref = self.env["SLUICE_CATALOG"]["valueFrom"]["secretKeyRef"]
        self.assertEqual(ref["key"], "conninfo")
        secret = ref["name"]
        # The password is only a file: the Secret volume holds only the key "password" and is
        # mounted only into the init container, which copies it (mode 0600) to an in-memory
        # emptyDir that the daemon mounts read-only and names in catalog-password-file.
        vols = [n for n, v in self.volumes.items()
                if v.get("secret", {}).get("secretName") == secret]
        self.assertEqual(len(vols), 1)
        sec = self.volumes[vols[0]]["secret"]
        self.assertEqual([i["key"] for i in sec["items"]], ["password"])
        self.assertNotIn(vols[0], self.mounts)
        self.assertIn(vols[0], self.init_mounts)
        cmd = self.init["command"]
        self.assertEqual(cmd[:3], ["install", "-m", "0600"])
        src, dst = cmd[3:]
        self.assertEqual(src, self.init_mounts[vols[0]] + "/" + sec["items"][0]["path"])
        copy_vol = next(n for n, p in self.init_mounts.items() if p == os.path.dirname(dst))
        self.assertEqual(self.volumes[copy_vol]["emptyDir"]["medium"], "Memory")
        self.assertEqual(self.conf["catalog-password-file"],
                         self.mounts[copy_vol] + "/" + os.path.basename(dst))
        ro = {m["name"]: m.get("readOnly", False) for m in self.ctr["volumeMounts"]}
        self.assertTrue(ro[copy_vol])
        self.assertNotIn("catalog", self.conf)

    def test_no_password_in_args_or_env(self):
        for c in pod_containers(self.pod):
            self.assertNotIn("envFrom", c, c["name"])
            words = c.get("command", []) + c.get("args", [])
            for e in c.get("env", []):
                self.assertNotIn("PASSWORD", e["name"].upper(), e["name"])
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    self.assertNotIn("password", ref["key"].lower(), e["name"])
                words.append(e.get("value", ""))
            for w in words:
                self.assertNotRegex(w, r"(?i)password\s*=|postgres(ql)?://[^/@]*:[^/@]*@", w)

    def test_replica_id_from_pod_name(self):
        ref = self.env["SLUICE_REPLICA_ID"]["valueFrom"]["fieldRef"]
        self.assertEqual(ref["fieldPath"], "metadata.name")

    def test_pod_disruption_budget_and_anti_affinity(self):
        spec = self.pdb["spec"]
        self.assertLessEqual(spec["selector"]["matchLabels"].items(), self.labels.items())
        if "maxUnavailable" in spec:
            self.assertLess(spec["maxUnavailable"], self.sts["spec"]["replicas"])
            self.assertGreaterEqual(spec["maxUnavailable"], 1)
        else:
            self.assertLess(spec["minAvailable"], self.sts["spec"]["replicas"])
        anti = self.pod["affinity"]["podAntiAffinity"]
        terms = anti.get("requiredDuringSchedulingIgnoredDuringExecution", []) + [
            t["podAffinityTerm"]
            for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])]
        self.assertTrue(any(t["topologyKey"] == "kubernetes.io/hostname" and
                            t["labelSelector"]["matchLabels"].items() <= self.labels.items()
                            for t in terms), terms)

    def test_services(self):
        services = {s["metadata"]["name"]: s for s in self.by_kind["Service"]}
        headless = services[self.sts["spec"]["serviceName"]]
        self.assertEqual(headless["spec"]["clusterIP"], "None")
        # Clients resolving it get the ready replicas only.
        self.assertFalse(headless["spec"].get("publishNotReadyAddresses", False))
        self.assertEqual([p["port"] for p in headless["spec"]["ports"]], [self.ports["grpc"]])
        regular = [s for s in services.values() if s["spec"].get("clusterIP") != "None"]
        self.assertEqual(len(regular), 1)
        svc = regular[0]
        for s in services.values():
            self.assertLessEqual(s["spec"]["selector"].items(), self.labels.items())
        ports = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
        self.assertEqual(ports, {"grpc": (7700, "grpc"), "metrics": (9090, "metrics")})
        ann = svc["metadata"]["annotations"]
        self.assertEqual(ann["prometheus.io/scrape"], "true")
        self.assertEqual(int(ann["prometheus.io/port"]), self.ports["metrics"])

    def test_config_agrees_with_pod(self):
        self.assertEqual(host_port(self.conf["listen"]), ("0.0.0.0", self.ports["grpc"]))
        self.assertEqual(host_port(self.conf["metrics-listen"]), ("0.0.0.0", self.ports["metrics"]))
        self.assertEqual(os.path.dirname(self.conf["token-file"]), self.mounts["tokens"])
        self.assertEqual(self.volumes["config"]["configMap"]["name"], self.cm["metadata"]["name"])
        self.assertEqual(os.path.dirname(self.ctr["args"][1]), self.mounts["config"])

    def test_configmap_validates(self):
        with tempfile.TemporaryDirectory() as tmp:
            conf = os.path.join(tmp, "sluiced.conf")
            tokens = os.path.join(tmp, "tokens")
            with open(conf, "w") as f:
                f.write(self.conf_text)
            with open(tokens, "w") as f:
                f.write("admin 0123456789abcdef0123456789abcdef\n")
            rc, eff, err = check_config(conf, {
                "SLUICE_TOKEN_FILE": tokens, "SLUICE_REPLICA_ID": "sluice-0",
                "SLUICE_CATALOG": "postgresql://sluice@pg:5432/sluice?sslmode=verify-full"})
            self.assertEqual(rc, 0, err)
            self.assertEqual(eff["replica-id"], "sluice-0")
            self.assertEqual(eff["catalog-password-file"], "/run/sluice/catalog/password")
            self.assertTrue(eff["catalog"].startswith("postgresql://"))

    @unittest.skipUnless(shutil.which("kubectl"), "kubectl not installed")
    def test_kustomize_builds(self):
        def build(path):
            r = subprocess.run(["kubectl", "kustomize", path], capture_output=True, text=True,
                               timeout=30)
            self.assertEqual(r.returncode, 0, r.stderr)
            return {d["kind"]: d for d in yaml.safe_load_all(r.stdout)
                    if d["kind"] != "Service"}

        docs = build(REPLICAS)
        self.assertEqual(set(docs), {"ConfigMap", "StatefulSet", "PersistentVolumeClaim",
                                     "PodDisruptionBudget"})
        ctr = docs["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(ctr["readinessProbe"]["grpc"], {"port": 7700})
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, "k8s")
            shutil.copytree(K8S, copy)
            kust = os.path.join(copy, "replicas", "kustomization.yaml")
            text = read(kust).replace("# components:\n#   - ../tls", "components:\n  - ../tls")
            self.assertIn("\n  - ../tls", text)
            with open(kust, "w") as f:
                f.write(text)
            docs = build(os.path.join(copy, "replicas"))
        pod = docs["StatefulSet"]["spec"]["template"]["spec"]
        ctr = pod["containers"][0]
        self.assertNotIn("grpc", ctr["readinessProbe"])
        self.assertEqual(ctr["readinessProbe"]["exec"]["command"][-1], "health")
        env = {e["name"] for e in ctr["env"]}
        self.assertLessEqual({"SLUICE_TLS_CERT", "SLUICE_REPLICA_ID", "SLUICE_CATALOG"}, env)
        self.assertEqual(len(pod["volumes"]), len(self.volumes))

    @unittest.skipUnless(os.path.exists(os.path.join(PG_BIN, "initdb")),
                         "PostgreSQL server binaries not installed")
    def test_replicas_against_postgresql(self):
        """Two sluiced configured as two pods are (the ConfigMap, the container's environment with
        the Secret's conninfo and the pod names, the password as the init container's command
        copies it) against a real PostgreSQL, sharing one data dir: both serve; the first wrote
        CATALOG-ID; each logs its replica id; the password is in no log, environment or argument.
        The Secret's file as the kubelet makes it with fsGroup (0440) is refused, which is why
        the init container copies it. The conninfo names a dead host first and carries
        target_session_attrs=read-write, as operations.md's highly available one does."""
        from pgfixture import PgServer, free_port
        pg = PgServer().start()
        try:
            pg.create_db("sluice")
            self._run_replicas(pg, free_port)
        finally:
            pg.destroy()

    def _run_replicas(self, pg, free_port):
        with open(pg.password_file) as f:
            password = f.readline().strip()
        conninfo = ("postgresql://%s@127.0.0.1:%d,127.0.0.1:%d/sluice"
                    "?target_session_attrs=read-write&sslmode=disable"
                    % (pg.user, free_port(), pg.port))
        with tempfile.TemporaryDirectory() as tmp:
            def local(path):
                # A mount of the pod -> the same file under tmp.
                for name, mount in list(self.mounts.items()) + list(self.init_mounts.items()):
                    if path == mount or path.startswith(mount + "/"):
                        return os.path.join(tmp, name) + path[len(mount):]
                return path

            for name in set(self.mounts) | set(self.init_mounts):
                os.mkdir(os.path.join(tmp, name), 0o700)
            src = local(self.init["command"][3])
            with open(src, "w") as f:
                f.write(password + "\n")
            os.chmod(src, 0o440)
            with open(local(self.conf["token-file"]), "w") as f:
                f.write("admin 0123456789abcdef0123456789abcdef\n")
            conf = local(self.ctr["args"][1])
            text = self.conf_text
            for key in ("token-file", "catalog-password-file"):
                text = text.replace(self.conf[key], local(self.conf[key]))
            with open(conf, "w") as f:
                f.write(text)
            data = local(self.mounts["data"])

            def env_of(pod_name):
                out = {}
                for name, e in self.env.items():
                    if "value" in e:
                        out[name] = e["value"]
                    elif "fieldRef" in e["valueFrom"]:
                        self.assertEqual(e["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name")
                        out[name] = pod_name
                    else:
                        self.assertEqual(e["valueFrom"]["secretKeyRef"]["key"], "conninfo")
                        out[name] = conninfo
                return out

            def replica(pod_name):
                d = Daemon(data_dir=data, args=["--config", conf, "--metrics-listen", ""],
                           store="dir", catalog="sqlite")
                d.env = dict(CLEAN_ENV, **env_of(pod_name))
                d.port_file = os.path.join(tmp, "port-" + pod_name)
                d.stderr_path = os.path.join(tmp, pod_name + ".log")
                return d

            # The Secret's file itself (root's or group-readable) is refused.
            d = replica("sluice-0")
            d.env["SLUICE_CATALOG_PASSWORD_FILE"] = src
            with self.assertRaises(RuntimeError) as cm:
                d.start()
            d.stop()
            self.assertIn("catalog-password-file", str(cm.exception))
            self.assertIn("chmod 600", str(cm.exception))
            os.unlink(d.stderr_path)

            # The init container's command, as is but for the mount paths.
            cmd = [local(w) for w in self.init["command"]]
            subprocess.run(cmd, check=True, timeout=20)
            dst = local(self.conf["catalog-password-file"])
            self.assertEqual(os.stat(dst).st_mode & 0o777, 0o600)

            daemons = [replica("sluice-0"), replica("sluice-1")]
            try:
                for d in daemons:
                    d.start()
                    r = subprocess.run([SLUICE_CLI, "--addr", d.addr, "--timeout", "5", "health"],
                                       capture_output=True, text=True, timeout=20)
                    self.assertEqual((r.returncode, r.stdout.strip()), (0, "SERVING"), r.stderr)
                    for what in ("cmdline", "environ"):
                        with open("/proc/%d/%s" % (d.proc.pid, what), "rb") as f:
                            self.assertNotIn(password.encode(), f.read(), what)
                self.assertTrue(os.path.isfile(os.path.join(data, "CATALOG-ID")))
            finally:
                rcs = [d.stop() for d in daemons]
            for d, rc in zip(daemons, rcs):
                log = d.log()
                self.assertEqual(rc, 0, log)
                self.assertEqual(SANITIZER_RE.findall(log), [], log)
                self.assertNotIn(password, log)
                lines = [l for l in log.splitlines() if l.startswith("{")]
                self.assertTrue(lines, log)
                name = os.path.basename(d.stderr_path)[:-4]
                for line in lines:
                    self.assertIn('"replica":"%s"' % name, line)
                # libpq went on past the dead host to the live one.
                self.assertIn('"event":"catalog_connected"', log)
                self.assertIn('"port":"%d"' % pg.port, log)


def dockerfile_stages():
    """The Dockerfile as a list of stages: (FROM line, [(instruction, arguments), ...])."""
    stages, lines, pending = [], [], ""
    for raw in read(DOCKERFILE).splitlines():
        if raw.lstrip().startswith("#") and not pending:
            continue
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line:
            lines.append(line)
    for line in lines:
        inst, _, rest = line.partition(" ")
        if inst.upper() == "FROM":
            stages.append((rest, []))
        else:
            stages[-1][1].append((inst.upper(), rest))
    return stages


def existing_packages(names):
    """The subset of `names` that apt-cache knows (one apt-cache call)."""
    r = subprocess.run(["apt-cache", "show", "--no-all-versions"] + list(names),
                       capture_output=True, text=True, timeout=30)
    return set(re.findall(r"(?m)^Package: (\S+)$", r.stdout))


def lib_packages(*binaries):
    """{library path: Debian package or None} for the shared libraries the binaries load."""
    paths = set()
    for binary in binaries:
        r = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=20,
                           check=True)
        for line in r.stdout.splitlines():
            parts = line.split()
            path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
            if path.startswith("/"):
                paths.add(path)
    # With merged /usr, dpkg may know a library under /lib or /usr/lib: ask for both spellings.
    candidates = {}
    for path in paths:
        names = {path, os.path.realpath(path)}
        names |= {n[4:] for n in names if n.startswith("/usr/")} | {"/usr" + n for n in names}
        candidates[path] = names
    r = subprocess.run(["dpkg", "-S"] + sorted(set().union(*candidates.values())),
                       capture_output=True, text=True, timeout=30)
    owner = {}
    for line in r.stdout.splitlines():
        pkg, _, path = line.partition(": ")
        owner[path] = pkg.split(":")[0]
    return {p: next((owner[n] for n in names if n in owner), None)
            for p, names in candidates.items()}


def sanitized_build():
    """Whether SLUICE_BUILD_DIR was configured with SLUICE_SANITIZE."""
    try:
        cache = read(os.path.join(BUILD_DIR, "CMakeCache.txt"))
    except OSError:
        return False
    m = re.search(r"(?m)^SLUICE_SANITIZE:\w+=(.*)$", cache)
    return bool(m and m.group(1).strip())


class DockerfileTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stages = dockerfile_stages()
        cls.runtime = cls.stages[-1][1]
        cls.packages = []
        for inst, args in cls.runtime:
            m = re.search(r"apt-get install ([^&]*)", args) if inst == "RUN" else None
            if m:
                cls.packages += [w for w in m.group(1).split() if not w.startswith("-")]

    def test_stages(self):
        self.assertGreaterEqual(len(self.stages), 2)
        for base, _ in self.stages:
            self.assertRegex(base, r"^debian:bookworm(-slim)?( AS \w+)?$")
        build_runs = " ".join(a for i, a in self.stages[0][1] if i == "RUN")
        for step in ("deploy/scripts/deps.sh", "deploy/scripts/build.sh", "cmake --install"):
            self.assertIn(step, build_runs)
        runtime = dict(self.runtime)
        self.assertIn("--from=build", " ".join(a for i, a in self.runtime if i == "COPY"))
        self.assertEqual(runtime["USER"].split(":")[0], "10001")
        self.assertEqual(runtime["ENTRYPOINT"], '["sluiced"]')
        self.assertEqual(set(runtime["EXPOSE"].split()), {"7700", "9090"})
        self.assertNotIn("-dev", " ".join(self.packages))

    def test_runtime_packages_exist(self):
        want = {"libgrpc29", "libprotobuf-c1", "libuv1", "libssl3", "libsqlite3-0",
                "libmicrohttpd12", "libinih1", "libsystemd0", "ca-certificates"}
        self.assertLessEqual(want, set(self.packages))
        known = existing_packages(self.packages + ["libgrpc-no-such-package"])
        self.assertEqual(set(self.packages) - known, set())
        self.assertNotIn("libgrpc-no-such-package", known)

    def test_runtime_packages_cover_binaries(self):
        # Every shared library of the built sluiced and sluice comes from a runtime package or
        # one of their dependencies. Sanitized builds bring their own runtimes: not checked.
        if sanitized_build():
            self.skipTest("sanitizer build (SLUICE_SANITIZE set): its runtime libraries differ")
        r = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends",
                            "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces",
                            "--no-enhances", "--no-pre-depends"] + self.packages,
                           capture_output=True, text=True, timeout=30, check=True)
        closure = set(self.packages)
        for line in r.stdout.splitlines():
            if line and not line[0].isspace():
                closure.add(line.strip())
            elif "Depends:" in line:
                closure.add(line.split(":", 1)[1].strip().strip("<>").split(":")[0])
        libs = lib_packages(SLUICED, SLUICE_CLI)
        self.assertGreater(len(libs), 5)
        for path, pkg in libs.items():
            self.assertIsNotNone(pkg, "no Debian package owns %s" % path)
            self.assertIn(pkg, closure, "sluiced or sluice needs %s from %s" % (path, pkg))


if __name__ == "__main__":
    unittest.main()
