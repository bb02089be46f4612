"""A real S3 server for the tests, and a fault-injecting proxy to put in front of it.

S3Server starts s3rver (tests/s3/package.json pins the version; tests/s3/install.sh installs it
into tests/s3/node_modules with the system's npm) on 127.0.0.1 at a free port with a temporary
directory and one bucket, waits until it answers, and stops it (bounded: killed if it does not
exit). s3rver's credentials are its fixed defaults, S3RVER / S3RVER. s3rver 3.7.1 does not
implement ListMultipartUploads, ListParts or AbortMultipartUpload (405), does not check payload
hashes, nor the ETags named by CompleteMultipartUpload, and it does not verify SigV4 signatures
(only that the access key exists): FaultProxy(verify=...) does, independently of the client.

FaultProxy is an HTTP/1.1 proxy (one upstream connection per client connection, the bytes passed
through unchanged, so SigV4 signatures stay valid) whose faults are switched at run time: answer
503 SlowDown to the next N requests, reset the next N connections (RST after reading the request),
answer 200 with an InternalError body (as S3 may for CompleteMultipartUpload), forward a request
but lose its answer (reset), answer 404 NoSuchUpload (as S3 does to a Complete retried after it
succeeded), answer 400 BadDigest (a body the store rejects as received, not forwarded), rewrite
the ETag of the next N answers, delay every answer by X ms, send the next N answers at 2 bytes a
second (slow_body: the head at once, then the body, or the head of an answer without one, as a
store that never quite stalls; cleared, the rest goes at once), answer the next N listings
(ListObjectsV2, ListMultipartUploads) with one entry and a new marker each, truncated forever
(endless_pages), answer the next N with a 500 whose error body never ends (endless_error). With s3rver=S3Server and
multipart=True it also answers ListMultipartUploads and AbortMultipartUpload from s3rver's
directory, which s3rver 3.7.1 does not implement. It logs (method, path?query) of every request.
With verify=(access_key, secret_key[, session_token]) it checks every request as S3 does: the SigV4
signature (recomputed here from the request as received, every x-amz-* header signed), that
x-amz-content-sha256 is the SHA-256 of the body and that Content-MD5 is its MD5; a request that
fails gets S3's answer (403 SignatureDoesNotMatch, 400 XAmzContentSHA256Mismatch, 400 BadDigest)
and is not forwarded.

Both are context managers:

    with S3Server() as s3, FaultProxy(s3.port) as proxy:
        proxy.set(slowdown=2)
        ... point the client at proxy.endpoint ...
        assert ("DELETE", "/bucket/key?uploadId=...") in proxy.requests
"""
import hashlib
import hmac
import os
import re
import select
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
S3_DIR = os.path.join(ROOT, "tests", "s3")
S3RVER_JS = os.path.join(S3_DIR, "node_modules", "s3rver", "bin", "s3rver.js")

_install_lock = threading.Lock()
_install_error = None  # why the install failed, so that it is tried once per process


def install_s3rver(timeout=300):
    """Install s3rver if it is missing. Raises RuntimeError saying why it could not (the S3 tests
    then fail: they never skip silently)."""
    global _install_error
    with _install_lock:
        if os.path.exists(S3RVER_JS):
            return
        if _install_error:
            raise RuntimeError(_install_error)
        try:
            r = subprocess.run(["bash", os.path.join(S3_DIR, "install.sh")], capture_output=True,
                               text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            _install_error = ("s3rver is not installed and tests/s3/install.sh did not finish in "
                              "%d s (npm registry unreachable?)" % timeout)
            raise RuntimeError(_install_error)
        if r.returncode != 0 or not os.path.exists(S3RVER_JS):
            _install_error = ("s3rver is not installed and tests/s3/install.sh failed (exit %d): "
                              "%s" % (r.returncode, (r.stderr or r.stdout).strip()[-2000:]))
            raise RuntimeError(_install_error)


class S3Server:
    """s3rver on 127.0.0.1, a free port, a temporary directory and one bucket."""

    access_key = "S3RVER"
    secret_key = "S3RVER"
    region = "us-east-1"

    def __init__(self, bucket="sluice", start_timeout=30.0, tls=False):
        self.bucket = bucket
        self.tls = tls
        self.cert = None  # with tls: a self-signed certificate for 127.0.0.1 and localhost
        self.start_timeout = start_timeout
        self.proc = None
        self.port = None
        self._tmp = None

    @property
    def endpoint(self):
        return "%s://127.0.0.1:%d" % ("https" if self.tls else "http", self.port)

    @property
    def directory(self):
        return os.path.join(self._tmp, "data")

    def start(self):
        install_s3rver()
        node = shutil.which("node") or shutil.which("nodejs")
        if not node:
            raise RuntimeError("node not found: run deploy/scripts/deps.sh --test")
        again = self._tmp is not None  # restart(): the same directory and port
        if not again:
            self._tmp = tempfile.mkdtemp(prefix="sluice-s3-")
        self.log_path = os.path.join(self._tmp, "s3rver.log")
        log = open(self.log_path, "ab")
        # --service-endpoint localhost: <bucket>.localhost:<port> reaches the bucket (virtual
        # hosts; curl resolves *.localhost to the loopback address itself).
        # --openssl-legacy-provider: s3rver's ListObjectsV2 continuation tokens use DES, which
        # the OpenSSL 3 in node >= 17 provides only there.
        cmd = [node, "--openssl-legacy-provider", S3RVER_JS, "-d", self.directory, "-a", "127.0.0.1",
               "-p", str(self.port if again else 0), "--silent",
               "--service-endpoint", "localhost", "--configure-bucket", self.bucket]
        if self.tls:
            self.cert = os.path.join(self._tmp, "cert.pem")
            key = os.path.join(self._tmp, "key.pem")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                            "2", "-subj", "/CN=localhost", "-keyout", key, "-out", self.cert,
                            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                           check=True, capture_output=True, timeout=60)
            cmd += ["--key", key, "--cert", self.cert]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + self.start_timeout
        out = b""
        port = None
        try:
            while port is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError("s3rver did not say where it listens in %.0f s:\n%s"
                                       % (self.start_timeout, self.log()))
                ready, _, _ = select.select([self.proc.stdout], [], [], left)
                if not ready:
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    raise RuntimeError("s3rver exited with %s:\n%s"
                                       % (self.proc.wait(5), self.log()))
                out += chunk
                m = re.search(rb"listening on [\d.]+:(\d+)", out)
                if m:
                    port = self.port = int(m.group(1))
            self._wait_answers(deadline)
        except BaseException:
            if again:  # keep the directory for another try
                self.kill()
                self.proc.stdout.close()
                self.proc = None
            else:
                self.stop()
            raise
        return self

    def _wait_answers(self, deadline):
        while True:
            try:
                # Any answer (403 without a signature) means it serves requests.
                ctx = None
                if self.tls:
                    import ssl
                    ctx = ssl.create_default_context(cafile=self.cert)
                urllib.request.urlopen(self.endpoint + "/", timeout=2, context=ctx).close()
                return
            except urllib.error.HTTPError as e:
                e.close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("s3rver does not answer on %s:\n%s"
                                       % (self.endpoint, self.log()))
                time.sleep(0.05)

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-4000:].decode(errors="replace")
        except OSError:
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        """Kill s3rver at once (SIGKILL), keeping its directory (a crash of the store)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self, timeout=10.0):
        """Kill s3rver (a crash) and start it again on the same directory and port, its objects
        kept (those of PUTs it was receiving dropped, as S3 never shows them). The port may be
        taken meanwhile by another process: then it fails (rare with a kernel's ephemeral
        ports)."""
        self.kill()
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()
        self.proc = None
        self.drop_torn_objects(settle=0)
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.start()
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self, timeout=5.0):
        if self.proc:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout)
            if self.proc.stdout:
                self.proc.stdout.close()
            self.proc = None
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def set_mtime(self, key, when):
        """Make an object look last modified at `when` (seconds since the epoch): s3rver answers
        an object's Last-Modified (HEAD, GET, listings) from its data file's mtime."""
        path = os.path.join(self.directory, self.bucket, key + "._S3rver_object")
        os.utime(path, (when, when))

    def drop_torn_objects(self, prefix="", settle=0.3):
        """Remove the objects of PUTs that never completed (their client died mid-body), as S3
        would never have made them visible. s3rver 3.7.1 writes a PUT's bytes in place under the
        object's name and its metadata file only when the body is complete; an aborted request
        leaves the partial bytes there, listed and readable (and its CopyObject answers 500).
        Call it once the writers are dead (sluiced killed, or s3rver killed and restarted); waits
        `settle` s for s3rver to notice the aborted requests. Returns the keys removed."""
        time.sleep(settle)
        root = os.path.join(self.directory, self.bucket)
        suffix = "._S3rver_object"
        dropped = []
        for dirpath, _, names in os.walk(os.path.join(root, prefix) if prefix else root):
            for n in names:
                if not n.endswith(suffix):
                    continue
                base = os.path.join(dirpath, n[:-len(suffix)])
                if os.path.exists(base + "._S3rver_metadata.json"):
                    continue
                for tail in (suffix, suffix + ".md5"):
                    try:
                        os.unlink(base + tail)
                    except FileNotFoundError:
                        pass
                dropped.append(os.path.relpath(base, root))
        return dropped

    def boto3_client(self, endpoint=None):
        """A boto3 S3 client for this server (the independent reader of what sluice wrote)."""
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=endpoint or self.endpoint,
                            aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=self.region,
                            config=Config(s3={"addressing_style": "path"},
                                          retries={"max_attempts": 2}))

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _read_head(f):
    """Read an HTTP message's start line and headers; None at a clean end of stream."""
    lines = []
    while True:
        line = f.readline(65536)
        if not line:
            if lines:
                raise ConnectionError("connection closed inside a message head")
            return None
        if line in (b"\r\n", b"\n"):
            if not lines:
                continue
            return lines
        lines.append(line)


def _header(lines, name):
    name = name.lower() + b":"
    for line in lines[1:]:
        if line.lower().startswith(name):
            return line.split(b":", 1)[1].strip()
    return None


def _read_body(f, lines, no_body=False):
    """The body bytes of a message, as sent (chunked framing included)."""
    if no_body:
        return b""
    te = _header(lines, b"Transfer-Encoding")
    if te and b"chunked" in te.lower():
        out = b""
        while True:
            size_line = f.readline(65536)
            out += size_line
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:
                    trailer = f.readline(65536)
                    out += trailer
                    if trailer in (b"\r\n", b"\n", b""):
                        return out
            out += f.read(size + 2)
    length = _header(lines, b"Content-Length")
    if length is not None:
        return f.read(int(length))
    return None  # until the connection closes


def _uri_encode(s, safe):
    return urllib.parse.quote(s, safe=safe)


def _canonical_query(query):
    pairs = []
    for part in query.split("&") if query else []:
        k, _, v = part.partition("=")
        pairs.append((_uri_encode(urllib.parse.unquote(k), "~"),
                      _uri_encode(urllib.parse.unquote(v), "~")))
    return "&".join("%s=%s" % kv for kv in sorted(pairs))


def _hmac(key, text):
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def sigv4_check(method, target, head_lines, body, access_key, secret_key, session_token=None):
    """Check a request as S3 would: None if it is good, else (status, code, message)."""
    headers = {}
    for line in head_lines[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        name = name.strip().lower()
        value = " ".join(value.strip().split())
        headers[name] = headers[name] + "," + value if name in headers else value
    auth = headers.get("authorization", "")
    m = re.match(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/s3/aws4_request, ?"
                 r"SignedHeaders=([^,]+), ?Signature=([0-9a-f]{64})$", auth)
    if not m:
        return 403, "AccessDenied", "no SigV4 Authorization header"
    key, date, region, signed, signature = m.groups()
    if key != access_key:
        return 403, "InvalidAccessKeyId", "unknown access key"
    signed_list = signed.split(";")
    for name in headers:
        if (name.startswith("x-amz-") or name in ("host", "content-md5")) and \
                name not in signed_list:
            return 403, "AccessDenied", "header %s is not signed" % name
    payload = headers.get("x-amz-content-sha256")
    if payload is None:
        return 400, "InvalidRequest", "missing x-amz-content-sha256"
    if payload != "UNSIGNED-PAYLOAD" and payload != hashlib.sha256(body).hexdigest():
        return 400, "XAmzContentSHA256Mismatch", "x-amz-content-sha256 is not the body's"
    if "content-md5" in headers:
        import base64
        if headers["content-md5"] != base64.b64encode(hashlib.md5(body).digest()).decode():
            return 400, "BadDigest", "Content-MD5 is not the body's"
    if session_token is not None and headers.get("x-amz-security-token") != session_token:
        return 403, "InvalidToken", "wrong or missing x-amz-security-token"
    path, _, query = target.partition("?")
    canonical = "\n".join([
        method, _uri_encode(urllib.parse.unquote(path), "/~"), _canonical_query(query),
        "".join("%s:%s\n" % (n, headers.get(n, "")) for n in signed_list), signed, payload])
    amz_date = headers.get("x-amz-date", "")
    scope = "%s/%s/s3/aws4_request" % (date, region)
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    k = _hmac(("AWS4" + secret_key).encode(), date)
    k = _hmac(_hmac(_hmac(k, region), "s3"), "aws4_request")
    if not hmac.compare_digest(hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest(),
                               signature):
        return 403, "SignatureDoesNotMatch", ("The request signature we calculated does not "
                                              "match the signature you provided.")
    return None


class FaultProxy:
    """A fault-injecting HTTP proxy on 127.0.0.1 in front of 127.0.0.1:<upstream_port>."""

    def __init__(self, upstream_port, upstream_host="127.0.0.1", verify=None, s3rver=None,
                 multipart=False):
        self.upstream = (upstream_host, upstream_port)
        self.verify = verify
        # An S3Server: answer as S3 does where s3rver 3.7.1 does not (see _unknown_upload).
        self.s3rver = s3rver
        # With s3rver: also answer ListMultipartUploads and AbortMultipartUpload, which s3rver
        # 3.7.1 does not implement (501, 405), from and on its directory (_multipart).
        self.multipart = multipart and s3rver is not None
        self.rejected = []  # (method, target, code) of requests refused by the verification
        self.lock = threading.Lock()
        self.requests = []
        # name -> [count, match, requests to let by first]
        self.faults = {name: [0, None, 0] for name in self.FAULTS}
        self.delay_ms = 0
        # hold(): the next request matching is kept from the store until release().
        self._hold_match = None
        self.holding = threading.Event()
        self._hold_release = threading.Event()
        self.sock = None
        self.port = None
        self._threads = []
        self._conns = set()
        self._stopping = False

    @property
    def endpoint(self):
        return "http://127.0.0.1:%d" % self.port

    FAULTS = ("slowdown", "reset", "error200", "bad_etag", "drop_answer", "no_such_upload",
              "bad_digest", "slow_body", "endless_pages", "endless_error")
    SLOW_BYTES_PER_S = 2

    def set(self, slowdown=None, reset=None, error200=None, bad_etag=None, delay_ms=None,
            match=None, drop_answer=None, no_such_upload=None, bad_digest=None, slow_body=None,
            endless_pages=None, endless_error=None, after=0):
        """Switch faults: the counts given apply to the next requests (only to those whose
        "METHOD target" contains `match`, e.g. "uploadId=", when given; and only after `after`
        such requests went by); delay_ms to every answer."""
        given = dict(slowdown=slowdown, reset=reset, error200=error200, bad_etag=bad_etag,
                     drop_answer=drop_answer, no_such_upload=no_such_upload,
                     bad_digest=bad_digest, slow_body=slow_body, endless_pages=endless_pages,
                     endless_error=endless_error)
        with self.lock:
            for name, n in given.items():
                if n is not None:
                    self.faults[name] = [n, match, after]
            if delay_ms is not None:
                self.delay_ms = delay_ms

    def hold(self, match):
        """Keep the next request whose "METHOD target" contains `match` from the store until
        release() (a request on the wire while its sender is paused); `holding` is set once
        one is held."""
        with self.lock:
            self._hold_match = match
            self.holding.clear()
            self._hold_release.clear()

    def release(self):
        """Let the held request (if any) go on to the store."""
        with self.lock:
            self._hold_match = None
        self._hold_release.set()

    def passthrough(self):
        self.set(slowdown=0, reset=0, error200=0, bad_etag=0, drop_answer=0, bad_digest=0,
                 slow_body=0, endless_pages=0, endless_error=0, delay_ms=0)

    def clear_log(self):
        with self.lock:
            self.requests = []

    def seen(self, method, contains=""):
        """How many requests with this method and a target containing `contains` were seen."""
        with self.lock:
            return sum(1 for m, t in self.requests if m == method and contains in t)

    def start(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def stop(self):
        self._stopping = True
        if self.sock:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
        with self.lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            t.join(5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _accept(self):
        while not self._stopping:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            with self.lock:
                self._conns.add(conn)
                self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _take(self, what, method, target):
        """Use one count of a fault, if it applies to this request."""
        with self.lock:
            n, match, after = self.faults[what]
            if n <= 0 or (match and match not in "%s %s" % (method, target)):
                return False
            if after > 0:
                self.faults[what][2] = after - 1
                return False
            self.faults[what][0] = n - 1
            return True

    def _unknown_upload(self, method, target):
        """A part or a Complete for an upload s3rver does not have (completed or never made):
        S3 answers 404 NoSuchUpload; s3rver 3.7.1 stores the part anyway and answers the
        Complete 500 (its upload directory is gone), so a client's resume of an upload that
        an earlier life of it completed would be retried as a server error until its deadline."""
        if self.s3rver is None or method not in ("PUT", "POST"):
            return False
        m = re.search(r"[?&]uploadId=([0-9a-fA-F]+)", target)
        if not m:
            return False
        return not os.path.exists(os.path.join(self.s3rver.directory, self.s3rver.bucket,
                                               "._S3rver_uploads", m.group(1), "key"))

    def uploads_dir(self):
        return os.path.join(self.s3rver.directory, self.s3rver.bucket, "._S3rver_uploads")

    def uploads(self):
        """The multipart uploads s3rver holds: [(key, upload id, initiated as a time)], sorted.
        s3rver keeps each in ._S3rver_uploads/<id>/ with a file `key` (made when it was
        initiated: its mtime is the upload's Initiated)."""
        out = []
        root = self.uploads_dir()
        for uid in os.listdir(root) if os.path.isdir(root) else []:
            path = os.path.join(root, uid, "key")
            try:
                with open(path) as f:
                    out.append((f.read(), uid, os.stat(path).st_mtime))
            except OSError:
                continue
        return sorted(out)

    def set_initiated(self, upload_id, when):
        """Make an upload look initiated at `when` (seconds since the epoch)."""
        path = os.path.join(self.uploads_dir(), upload_id, "key")
        os.utime(path, (when, when))

    def _multipart(self, method, target):
        """ListMultipartUploads (GET /bucket?uploads, paged by max-uploads, key-marker and
        upload-id-marker as S3 does) and AbortMultipartUpload (DELETE /bucket/key?uploadId=):
        (status, reason, body), or None for any other request."""
        path, _, query = target.partition("?")
        q = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
        bucket = self.s3rver.bucket
        if method == "GET" and path.strip("/") == bucket and "uploads" in q:
            prefix = q.get("prefix", "")
            km, im = q.get("key-marker", ""), q.get("upload-id-marker", "")
            limit = int(q.get("max-uploads", "1000"))
            todo = [u for u in self.uploads() if u[0].startswith(prefix) and
                    (not km or u[0] > km or (im and u[0] == km and u[1] > im))]
            page, more = todo[:limit], len(todo) > limit
            esc = lambda t: (t.replace("&", "&amp;").replace("<", "&lt;")  # noqa: E731
                             .replace(">", "&gt;"))
            body = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListMultipartUploadsResult>"
                    "<Bucket>%s</Bucket><KeyMarker>%s</KeyMarker><UploadIdMarker>%s"
                    "</UploadIdMarker><Prefix>%s</Prefix><MaxUploads>%d</MaxUploads>"
                    "<IsTruncated>%s</IsTruncated>"
                    % (bucket, esc(km), esc(im), esc(prefix), limit, "true" if more else "false"))
            if more:
                body += ("<NextKeyMarker>%s</NextKeyMarker><NextUploadIdMarker>%s"
                         "</NextUploadIdMarker>" % (esc(page[-1][0]), page[-1][1]))
            for key, uid, when in page:
                body += ("<Upload><Key>%s</Key><UploadId>%s</UploadId><Initiated>%s</Initiated>"
                         "<StorageClass>STANDARD</StorageClass></Upload>"
                         % (esc(key), uid, time.strftime("%Y-%m-%dT%H:%M:%S.000Z",
                                                        time.gmtime(when))))
            return 200, "OK", (body + "</ListMultipartUploadsResult>").encode()
        if method == "DELETE" and path.startswith("/%s/" % bucket) and "uploadId" in q:
            d = os.path.join(self.uploads_dir(), q["uploadId"])
            if not re.fullmatch(r"[0-9a-fA-F]+", q["uploadId"]) or not os.path.isdir(d):
                return 404, "Not Found", (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error>"
                                          b"<Code>NoSuchUpload</Code><Message>The specified upload "
                                          b"does not exist.</Message></Error>")
            shutil.rmtree(d, ignore_errors=True)
            return 204, "No Content", b""
        return None

    @staticmethod
    def _endless_page(target):
        """A listing page of one entry under the asked prefix, truncated, with a new marker
        each time: a store that paginates forever (the markers move, so only a page bound
        ends the listing)."""
        query = target.partition("?")[2]
        q = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
        prefix = q.get("prefix", "")
        if "uploads" in q:
            n = int(q.get("upload-id-marker", "u0")[1:] or 0) + 1
            body = ("<ListMultipartUploadsResult><Bucket>b</Bucket><IsTruncated>true"
                    "</IsTruncated><NextKeyMarker>%sendless-%d</NextKeyMarker>"
                    "<NextUploadIdMarker>u%d</NextUploadIdMarker><Upload><Key>%sendless-%d"
                    "</Key><UploadId>u%d</UploadId><Initiated>2026-01-01T00:00:00.000Z"
                    "</Initiated></Upload></ListMultipartUploadsResult>"
                    % (prefix, n, n, prefix, n, n))
        else:
            n = int(q.get("continuation-token", "t0")[1:] or 0) + 1
            body = ("<ListBucketResult><Name>b</Name><KeyCount>1</KeyCount><IsTruncated>true"
                    "</IsTruncated><NextContinuationToken>t%d</NextContinuationToken><Contents>"
                    "<Key>%sendless-%d</Key><LastModified>2026-01-01T00:00:00.000Z"
                    "</LastModified><Size>1</Size></Contents></ListBucketResult>"
                    % (n, prefix, n))
        return ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + body).encode()

    def _dribble(self, conn, data):
        """Send data SLOW_BYTES_PER_S bytes a second, one byte at a time and evenly, so that
        the rate is the same over any window (until the client hangs up, the proxy stops, or
        all went)."""
        for i in range(len(data)):
            if self._stopping:
                return
            with self.lock:
                cleared = self.faults["slow_body"][0] <= 0
            if cleared:  # passthrough(): the rest at once
                conn.sendall(data[i:])
                return
            conn.sendall(data[i:i + 1])
            time.sleep(1.0 / self.SLOW_BYTES_PER_S)

    @staticmethod
    def _answer(conn, method, status, reason, body):
        head = ("HTTP/1.1 %d %s\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n"
                % (status, reason, len(body)))
        conn.sendall(head.encode() + (b"" if method == "HEAD" else body))

    def _serve(self, conn):
        up = None
        try:
            f = conn.makefile("rb")
            while True:
                head = _read_head(f)
                if head is None:
                    return
                method, target = head[0].split(b" ")[:2]
                method, target = method.decode(), target.decode()
                body = _read_body(f, head) or b""
                with self.lock:
                    self.requests.append((method, target))
                    delay = self.delay_ms
                if self.verify:
                    bad = sigv4_check(method, target, head, body, *self.verify)
                    if bad:
                        with self.lock:
                            self.rejected.append((method, target, bad[1]))
                        self._answer(conn, method, bad[0], "Refused", (
                            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>%s</Code>"
                            "<Message>%s</Message></Error>" % (bad[1], bad[2])).encode())
                        continue
                if self._take("reset", method, target):
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                with self.lock:
                    held = self._hold_match is not None and \
                        self._hold_match in "%s %s" % (method, target)
                    if held:
                        self._hold_match = None
                if held:
                    self.holding.set()
                    self._hold_release.wait(120)
                if delay:
                    time.sleep(delay / 1000.0)
                if self._take("slowdown", method, target):
                    self._answer(conn, method, 503, "Slow Down",
                                 b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown"
                                 b"</Code><Message>Please reduce your request rate.</Message>"
                                 b"</Error>")
                    continue
                if self._take("bad_digest", method, target):
                    self._answer(conn, method, 400, "Bad Request",
                                 b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>"
                                 b"BadDigest</Code><Message>The Content-MD5 you specified did not "
                                 b"match what we received.</Message></Error>")
                    continue
                if self._take("endless_error", method, target):
                    # Delimited by the end of the connection, which never comes: only a
                    # client that stops reading at its bound gets on.
                    conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: "
                                 b"application/xml\r\n\r\n<Error><Code>InternalError</Code>"
                                 b"<Message>We encountered an internal error.</Message>"
                                 b"</Error>")
                    while not self._stopping:
                        conn.sendall(b" " * 65536)
                    return
                if method == "GET" and ("list-type=2" in target or "uploads" in target) and \
                        self._take("endless_pages", method, target):
                    self._answer(conn, method, 200, "OK", self._endless_page(target))
                    continue
                done = self._multipart(method, target) if self.multipart else None
                if done:
                    self._answer(conn, method, *done)
                    continue
                if self._take("no_such_upload", method, target) or \
                        self._unknown_upload(method, target):
                    self._answer(conn, method, 404, "Not Found",
                                 b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>"
                                 b"NoSuchUpload</Code><Message>The specified upload does not "
                                 b"exist.</Message></Error>")
                    continue
                if self._take("error200", method, target):
                    self._answer(conn, method, 200, "OK",
                                 b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>"
                                 b"InternalError</Code><Message>We encountered an internal error. "
                                 b"Please try again.</Message></Error>")
                    continue
                if up is None:
                    up = socket.create_connection(self.upstream, timeout=60)
                    uf = up.makefile("rb")
                up.sendall(b"".join(head) + b"\r\n" + body)
                rhead = _read_head(uf)
                if rhead is None:
                    return
                status = int(rhead[0].split(b" ")[1])
                rbody = _read_body(uf, rhead, method == "HEAD" or status in (204, 304))
                if self._take("drop_answer", method, target):
                    # The store did the request; its answer is lost (a reset instead).
                    if rbody is None:
                        uf.read()
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                if self._take("bad_etag", method, target):
                    rhead = [(b'ETag: "0123456789abcdef0123456789abcdef"\r\n'
                              if line.lower().startswith(b"etag:") else line) for line in rhead]
                if rbody is None:  # delimited by the end of the connection
                    rbody = uf.read()
                    conn.sendall(b"".join(rhead) + b"\r\n" + rbody)
                    return
                if self._take("slow_body", method, target):
                    if rbody:
                        conn.sendall(b"".join(rhead) + b"\r\n")
                        self._dribble(conn, rbody)
                    else:  # nothing to dribble but the head (a 204 to a DELETE)
                        self._dribble(conn, b"".join(rhead) + b"\r\n")
                    continue
                conn.sendall(b"".join(rhead) + b"\r\n" + rbody)
        except (OSError, ValueError, IndexError):
            return
        finally:
            with self.lock:
                self._conns.discard(conn)
            conn.close()
            if up is not None:
                up.close()
