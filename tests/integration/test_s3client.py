"""The S3 client (server/store/s3.h) against a real S3 server: s3rver, started by the test, with
a fault-injecting proxy in front of it for the fault cases; boto3 reads back what the client
wrote. The C side is tests/unit/s3_test.c (its path in SL_S3_TEST, set by ctest).

If s3rver cannot be installed (no network for npm), these tests fail saying so: they never skip.
"""
import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from s3fixture import FaultProxy, S3Server  # noqa: E402
from sltest import SANITIZER_RE  # noqa: E402

S3_TEST = os.environ.get("SL_S3_TEST", "s3_test")
MiB = 1 << 20


def run(args, endpoint, timeout=60, **env):
    """Run s3_test with the store in its environment; returns (exit code, stdout)."""
    e = dict(os.environ, SL_S3_ENDPOINT=endpoint, SL_S3_BUCKET="sluice",
             AWS_ACCESS_KEY_ID=S3Server.access_key, AWS_SECRET_ACCESS_KEY=S3Server.secret_key,
             SL_S3_DEADLINE_MS="10000", SL_S3_TIMEOUT_MS="10000")
    e.pop("AWS_SESSION_TOKEN", None)
    e.update({k: str(v) for k, v in env.items()})
    r = subprocess.run([S3_TEST] + [str(a) for a in args], env=e, capture_output=True, text=True,
                       timeout=timeout)
    if SANITIZER_RE.search(r.stderr):
        raise AssertionError("sanitizer report from s3_test %s:\n%s" % (args, r.stderr))
    return r.returncode, r.stdout + r.stderr


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


VERIFY = (S3Server.access_key, S3Server.secret_key)


class S3ClientTest(unittest.TestCase):
    """Every function of s3.h, path-style and virtual-host, with and without a prefix. Requests
    go through a proxy that verifies them as S3 does (s3rver does not check signatures)."""

    @classmethod
    def setUpClass(cls):
        cls.s3 = S3Server().start()
        try:
            cls.proxy = FaultProxy(cls.s3.port, verify=VERIFY).start()
        except BaseException:
            cls.s3.stop()
            raise
        cls.endpoint = cls.proxy.endpoint

    @classmethod
    def tearDownClass(cls):
        cls.proxy.stop()
        cls.s3.stop()

    def setUp(self):
        with self.proxy.lock:
            self.proxy.rejected = []

    def assert_none_rejected(self):
        self.assertEqual(self.proxy.rejected, [])

    def test_all_path_style_and_boto3_reads_it_back(self):
        with tempfile.TemporaryDirectory() as out:
            rc, log = run(["all"], self.endpoint, timeout=120, SL_S3_OUT=out)
            self.assertEqual(rc, 0, log)
            self.assert_none_rejected()
            b3 = self.s3.boto3_client()
            for key, name in (("t/one.bin", "one.bin"), ("m/big.shard", "big.shard")):
                with open(os.path.join(out, name), "rb") as f:
                    want = f.read()
                got = b3.get_object(Bucket="sluice", Key=key)["Body"].read()
                self.assertEqual(len(got), len(want), key)
                self.assertEqual(hashlib.sha256(got).hexdigest(),
                                 hashlib.sha256(want).hexdigest(), key)
            # One PutObject's ETag is the MD5 of its bytes, as the client checked.
            head = b3.head_object(Bucket="sluice", Key="t/one.bin")
            with open(os.path.join(out, "one.bin"), "rb") as f:
                self.assertEqual(head["ETag"].strip('"'), hashlib.md5(f.read()).hexdigest())
            self.assertEqual(b3.head_object(Bucket="sluice", Key="m/big.shard")["ContentLength"],
                             6 * MiB + 3)

    def test_all_virtual_host_with_prefix(self):
        # s3rver takes <bucket>.s3.<service endpoint> (localhost) as a virtual host; curl
        # resolves any *.localhost name to the loopback address itself.
        endpoint = "http://s3.localhost:%d" % self.proxy.port
        rc, log = run(["all"], endpoint, timeout=120, SL_S3_PATH_STYLE=0,
                      SL_S3_PREFIX="vh/pre.fix", SL_S3_LIST_MAX_KEYS=2)
        self.assertEqual(rc, 0, log)
        self.assert_none_rejected()
        # The keys were written under the prefix, as boto3 sees them.
        b3 = self.s3.boto3_client()
        keys = [o["Key"] for o in b3.list_objects_v2(Bucket="sluice", Prefix="vh/")["Contents"]]
        self.assertIn("vh/pre.fix/t/one.bin", keys)
        self.assertIn("vh/pre.fix/m/big.shard", keys)

    def test_bytes_written_by_boto3_read_by_the_client(self):
        data = bytes(range(256)) * 4  # what s3_test's `get` compares with is its own fill
        b3 = self.s3.boto3_client()
        rc, log = run(["put", "x/by-c", 4096], self.endpoint)
        self.assertEqual(rc, 0, log)
        body = b3.get_object(Bucket="sluice", Key="x/by-c")["Body"].read()
        b3.put_object(Bucket="sluice", Key="x/by-boto3", Body=body)
        rc, log = run(["get", "x/by-boto3", 4096], self.endpoint)
        self.assertEqual(rc, 0, log)
        b3.put_object(Bucket="sluice", Key="x/other", Body=data)
        rc, log = run(["get", "x/other", 1024], self.endpoint)
        self.assertIn("rc=SL_ECORRUPT", log)  # not the bytes s3_test expects: compared, refused

    def test_unknown_key_is_eauth(self):
        rc, log = run(["check"], self.s3.endpoint, AWS_ACCESS_KEY_ID="NOSUCHKEY")  # s3rver's check
        self.assertEqual(rc, 1, log)
        self.assertIn("rc=SL_EAUTH", log)
        rc, log = run(["put", "t/auth", 100], self.s3.endpoint, AWS_ACCESS_KEY_ID="NOSUCHKEY")
        self.assertIn("rc=SL_EAUTH", log)
        self.assertIn("HTTP 403 InvalidAccessKeyId", log)

    def test_bad_secret_is_eauth_and_never_shown(self):
        secret = "WRONG-secret-0123456789"
        for op in ("check", "put", "get"):
            rc, log = run([op, "t/auth", 100], self.endpoint, AWS_SECRET_ACCESS_KEY=secret)
            self.assertEqual(rc, 1, log)
            self.assertIn("rc=SL_EAUTH", log)
            self.assertNotIn(secret, log)
        self.assertIn("HTTP 403 SignatureDoesNotMatch", log)

    def test_session_token_sent_and_signed(self):
        with FaultProxy(self.s3.port, verify=VERIFY + ("token/with+odd=chars",)) as p:
            rc, log = run(["put", "t/token", 100], p.endpoint,
                          AWS_SESSION_TOKEN="token/with+odd=chars")
            self.assertEqual(rc, 0, log)
            self.assertEqual(p.rejected, [])
            rc, log = run(["put", "t/token", 100], p.endpoint)
            self.assertIn("rc=SL_EAUTH", log)
            self.assertIn("InvalidToken", log)

    def test_missing_bucket_is_enotfound_at_check(self):
        rc, log = run(["check"], self.s3.endpoint, SL_S3_BUCKET="no-such-bucket")
        self.assertEqual(rc, 1, log)
        self.assertIn("rc=SL_ENOTFOUND", log)
        self.assertIn("no-such-bucket", log)
        self.assertIn("404", log)

    def test_nothing_listening_is_eunavailable_within_the_deadline(self):
        t0 = time.monotonic()
        rc, log = run(["check"], "http://127.0.0.1:%d" % closed_port(), SL_S3_DEADLINE_MS=800)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertIn("rc=SL_EUNAVAILABLE", log)
        self.assertIn("connect", log.lower())
        self.assertIn("gave up", log)


class S3TlsTest(unittest.TestCase):
    """TLS to the store: verified by default, against the system's CAs or ca_file."""

    def test_tls(self):
        with S3Server(tls=True) as s3:
            rc, log = run(["put", "tls/k", 100], s3.endpoint, SL_S3_DEADLINE_MS=2000)
            self.assertEqual(rc, 1, log)
            self.assertIn("rc=SL_EAUTH", log)  # not the store it claims to be
            self.assertIn("certificate", log)
            rc, log = run(["put", "tls/k", 100], s3.endpoint, SL_S3_CA_FILE=s3.cert)
            self.assertEqual(rc, 0, log)
            rc, log = run(["get", "tls/k", 100], s3.endpoint, SL_S3_TLS_NO_VERIFY=1)
            self.assertEqual(rc, 0, log)


class S3FaultTest(unittest.TestCase):
    """Faults from the proxy: retried until they stop, or until the deadline."""

    @classmethod
    def setUpClass(cls):
        cls.s3 = S3Server().start()
        try:
            cls.proxy = FaultProxy(cls.s3.port, verify=VERIFY).start()
        except BaseException:
            cls.s3.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.proxy.stop()
        cls.s3.stop()

    def setUp(self):
        self.proxy.passthrough()
        self.proxy.clear_log()

    def tearDown(self):
        self.assertEqual(self.proxy.rejected, [])

    def run_c(self, args, **env):
        return run(args, self.proxy.endpoint, **env)

    def test_slowdown_retried(self):
        self.proxy.set(slowdown=3)
        rc, log = self.run_c(["put", "f/slow", 2000])
        self.assertEqual(rc, 0, log)
        self.assertEqual(self.proxy.seen("PUT", "/sluice/f/slow"), 4)
        rc, log = self.run_c(["get", "f/slow", 2000])
        self.assertEqual(rc, 0, log)

    def test_reset_retried(self):
        self.proxy.set(reset=2)
        rc, log = self.run_c(["put", "f/reset", 3000])
        self.assertEqual(rc, 0, log)
        self.assertEqual(self.proxy.seen("PUT", "/sluice/f/reset"), 3)
        self.proxy.set(reset=1)
        rc, log = self.run_c(["get", "f/reset", 3000])
        self.assertEqual(rc, 0, log)
        self.assertEqual(self.proxy.seen("GET", "/sluice/f/reset"), 2)

    def test_deadline_exhausted_is_eunavailable(self):
        self.proxy.set(slowdown=10 ** 9)
        t0 = time.monotonic()
        rc, log = self.run_c(["put", "f/never", 100], SL_S3_DEADLINE_MS=1500)
        took = time.monotonic() - t0
        self.assertEqual(rc, 1, log)
        self.assertIn("rc=SL_EUNAVAILABLE", log)
        self.assertIn("PutObject s3://sluice/f/never", log)
        self.assertIn("gave up after", log)
        self.assertIn("HTTP 503 SlowDown: Please reduce your request rate.", log)
        self.assertLess(took, 6)
        self.assertGreaterEqual(self.proxy.seen("PUT", "/sluice/f/never"), 3)

    def test_slow_answers_are_waited_for_then_time_out(self):
        self.proxy.set(delay_ms=300)
        rc, log = self.run_c(["put", "f/delayed", 1000])
        self.assertEqual(rc, 0, log)
        # An answer later than the per-attempt timeout: each attempt times out, then the deadline.
        self.proxy.set(delay_ms=2500)
        rc, log = self.run_c(["head", "f/delayed"], SL_S3_TIMEOUT_MS=1000,
                             SL_S3_DEADLINE_MS=2500, timeout=30)
        self.assertIn("rc=SL_EUNAVAILABLE", log)
        self.assertIn("Timeout", log)

    def test_slow_body_times_out_per_request(self):
        """Issue 25 item 7: a store that answers 2 bytes a second passes a 1 B/s low-speed
        limit, so only a total timeout per attempt ends it: each attempt ends at
        SL_S3_TIMEOUT_MS (plus 1 ms per KiB asked for), retries end at the deadline, and the
        whole request within deadline + one attempt."""
        rc, log = self.run_c(["put", "f/dribble", 4000])
        self.assertEqual(rc, 0, log)
        for op in (["get", "f/dribble", 4000],):
            self.proxy.set(slow_body=10 ** 6, match="GET /sluice/f/dribble")
            t0 = time.monotonic()
            rc, log = self.run_c(op, SL_S3_TIMEOUT_MS=1500, SL_S3_DEADLINE_MS=1000, timeout=30)
            took = time.monotonic() - t0
            self.proxy.passthrough()
            self.assertEqual(rc, 1, log)
            self.assertIn("rc=SL_EUNAVAILABLE", log)
            self.assertIn("Timeout", log)
            self.assertLess(took, 1.0 + 1.5 + 2.0 + 1.0, log)  # deadline + attempt + slack
        self.assertGreaterEqual(self.proxy.seen("GET", "/sluice/f/dribble"), 1)

    def test_endless_pagination_stops_at_page_bound(self):
        """Issue 25 item 7: a store whose listing pages never end, each with a new marker (so
        the check that markers move does not stop it): the listing stops after
        SL_S3_LIST_MAX_PAGES pages with SL_ELIMIT naming the bound. Both listings."""
        for op, request in (("list", "list-type=2"), ("uploads", "uploads")):
            self.proxy.clear_log()
            self.proxy.set(endless_pages=10 ** 6, match=request)
            rc, log = self.run_c([op, "endless/"], SL_S3_LIST_MAX_PAGES=40, timeout=30)
            self.proxy.passthrough()
            self.assertEqual(rc, 1, log)
            self.assertIn("rc=SL_ELIMIT", log)
            self.assertIn("after 40 pages", log)
            self.assertIn("--s3-list-max-pages", log)
            self.assertEqual(self.proxy.seen("GET", request), 40)

    def test_endless_error_body_is_cut_at_its_bound(self):
        """Issue 25 item 7 (bodies): a 500 whose body never ends, sent as fast as the client
        reads: the client reads 64 KiB of it, judges the answer (retried, then the deadline)
        and does not wait for the request's timeout (60 s here)."""
        self.proxy.set(endless_error=10 ** 6, match="/sluice/f/endless")
        t0 = time.monotonic()
        rc, log = self.run_c(["get", "f/endless", 1000], SL_S3_TIMEOUT_MS=60000,
                             SL_S3_DEADLINE_MS=1000, timeout=30)
        took = time.monotonic() - t0
        self.proxy.passthrough()
        self.assertEqual(rc, 1, log)
        self.assertIn("rc=SL_EUNAVAILABLE", log)
        self.assertIn("HTTP 500 InternalError", log)
        self.assertLess(took, 10, log)

    def test_multipart_with_faults(self):
        # Resets and 503s on the parts, a 200 holding an <Error> on the Complete: all retried.
        self.proxy.set(reset=1, slowdown=1, match="partNumber=")
        self.proxy.set(error200=1, match="POST /sluice/f/mpu?uploadId=")
        rc, log = self.run_c(["mpu", "f/mpu", 5 * MiB], timeout=120)
        self.assertEqual(rc, 0, log)
        self.assertEqual(self.proxy.seen("POST", "/sluice/f/mpu?uploadId="), 2)
        size = self.s3.boto3_client().head_object(Bucket="sluice", Key="f/mpu")["ContentLength"]
        self.assertEqual(size, 5 * MiB + 1000)

    def test_complete_answer_lost(self):
        # The Complete is done by the store but its answer lost: the retry finds no upload (as
        # S3 answers; s3rver would fail with a 500), and the client looks for the object with
        # the multipart ETag of its parts (S3's rule; s3rver gives another ETag, so here the
        # error stands and says what it found).
        self.proxy.set(drop_answer=1, match="POST /sluice/f/lost?uploadId=")
        self.proxy.set(no_such_upload=1, after=1, match="POST /sluice/f/lost?uploadId=")
        rc, log = self.run_c(["mpu", "f/lost", 5 * MiB], timeout=120)
        self.assertEqual(self.proxy.seen("POST", "/sluice/f/lost?uploadId="), 2)
        self.assertEqual(self.proxy.seen("HEAD", "/sluice/f/lost"), 1)
        self.assertIn("rc=SL_ENOTFOUND", log)
        self.assertIn("NoSuchUpload", log)
        self.assertIn("the object exists, not with ETag", log)
        self.assertRegex(log, r'ETag "[0-9a-f]{32}-2"')

    def test_part_etag_checked(self):
        # A wrong ETag once: the part is sent again and the upload completes.
        self.proxy.set(bad_etag=1, match="partNumber=1&")
        rc, log = self.run_c(["mpu", "f/etag", 5 * MiB], timeout=120)
        self.assertEqual(rc, 0, log)
        self.assertEqual(self.proxy.seen("PUT", "partNumber=1&"), 2)
        # Every send (1 + 3 re-sends): SL_ECORRUPT, naming the part's MD5 and what the store
        # answered.
        self.proxy.clear_log()
        self.proxy.set(bad_etag=4, match="partNumber=1&")
        rc, log = self.run_c(["mpu", "f/etag2", 5 * MiB], timeout=120)
        self.assertEqual(rc, 1, log)
        self.assertIn("rc=SL_ECORRUPT", log)
        self.assertIn("0123456789abcdef0123456789abcdef", log)
        self.assertIn("sent 4 times", log)
        self.assertEqual(self.proxy.seen("PUT", "partNumber=1&"), 4)
        # A PutObject's ETag is checked the same way.
        self.proxy.set(bad_etag=4, match="PUT /sluice/f/put-etag")
        rc, log = self.run_c(["put", "f/put-etag", 100])
        self.assertIn("rc=SL_ECORRUPT", log)

    def test_part_rejected_is_sent_again(self):
        # A part the store rejects as received (400 BadDigest: its bytes were damaged on the
        # way) is sent again, and the upload completes with the right bytes.
        self.proxy.set(bad_digest=1, match="partNumber=2&")
        rc, log = self.run_c(["mpu", "f/digest", 5 * MiB], timeout=120)
        self.assertEqual(rc, 0, log)
        self.assertEqual(self.proxy.seen("PUT", "/sluice/f/digest?partNumber=2&"), 2)
        size = self.s3.boto3_client().head_object(Bucket="sluice", Key="f/digest")["ContentLength"]
        self.assertEqual(size, 5 * MiB + 1000)
        # Rejected at every send (1 + 3 re-sends): the store's error, SL_EINVAL, after 4 sends.
        self.proxy.clear_log()
        self.proxy.set(bad_digest=4, match="partNumber=1&")
        rc, log = self.run_c(["mpu", "f/digest2", 5 * MiB], timeout=120)
        self.assertEqual(rc, 1, log)
        self.assertIn("rc=SL_EINVAL", log)
        self.assertIn("HTTP 400 BadDigest", log)
        self.assertIn("sent 4 times", log)
        self.assertEqual(self.proxy.seen("PUT", "/sluice/f/digest2?partNumber=1&"), 4)

    def test_abort_sends_delete_upload_id(self):
        rc, log = self.run_c(["abort", "f/abort"])
        # s3rver 3.7 does not implement AbortMultipartUpload: SL_EUNIMPL, as s3.h says.
        self.assertIn("rc=SL_EUNIMPL", log)
        self.assertIn("AbortMultipartUpload s3://sluice/f/abort", log)
        self.assertEqual(self.proxy.seen("DELETE", "/sluice/f/abort?uploadId="), 1)

    def test_list_multipart_uploads_paged(self):
        # ListMultipartUploads, answered by the proxy (s3rver 3.7.1 answers 501), one upload per
        # page: every upload under the prefix, in order, with its Initiated time; a 503 retried.
        s3 = S3Server().start()
        self.addCleanup(s3.stop)
        px = FaultProxy(s3.port, verify=VERIFY, s3rver=s3, multipart=True).start()
        self.addCleanup(px.stop)
        ids = {}
        for key in ("u/b", "u/a", "u/a", "v/c"):
            rc, log = run(["create", key], px.endpoint)
            self.assertEqual(rc, 0, log)
            ids.setdefault(key, []).append(log.split("upload_id=")[1].split()[0])
        px.set(slowdown=1, match="uploads=")
        rc, log = run(["uploads", "u/"], px.endpoint, SL_S3_LIST_MAX_KEYS=1)
        self.assertEqual(rc, 0, log)
        self.assertIn("uploads=3", log)
        listed = [(line.split("key=")[1].split()[0], line.split("id=")[1].split()[0])
                  for line in log.splitlines() if line.startswith("upload ")]
        self.assertEqual(listed, sorted([("u/a", i) for i in ids["u/a"]] +
                                        [("u/b", ids["u/b"][0])]))
        self.assertEqual(px.seen("GET", "uploads="), 4)  # 3 pages and the 503
        self.assertNotRegex(log, r"initiated_ms=-1")
        # The whole prefix in one page; the signatures were all good.
        rc, log = run(["uploads", ""], px.endpoint)
        self.assertIn("uploads=4", log)
        self.assertEqual(px.rejected, [])
        # Without the proxy's answers: s3rver's 501 is SL_EUNIMPL.
        rc, log = run(["uploads", ""], self.proxy.endpoint)
        self.assertIn("rc=SL_EUNIMPL", log)

    def test_list_and_delete_through_faults(self):
        rc, log = self.run_c(["put", "f/list/a", 10])
        self.assertEqual(rc, 0, log)
        self.proxy.set(slowdown=1, reset=1)
        rc, log = self.run_c(["list", "f/list/"])
        self.assertEqual(rc, 0, log)
        self.assertIn("listed=1", log)
        self.proxy.set(slowdown=1)
        rc, log = self.run_c(["delete", "f/list/a"])
        self.assertEqual(rc, 0, log)
        rc, log = self.run_c(["head", "f/list/a"])
        self.assertIn("rc=SL_ENOTFOUND", log)


if __name__ == "__main__":
    unittest.main()
