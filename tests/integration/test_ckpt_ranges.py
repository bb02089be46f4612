"""DownloadShard from an offset and of a range (issue 25): the real daemon over real gRPC checks
every block it serves against the SHA-256 recorded at upload before sending any of its bytes.
Runs with the directory store and, with SL_TEST_STORE=s3, with object storage (the altered
object is written anew through the S3 API)."""
import hashlib
import os
import sqlite3
import subprocess
import unittest

import grpc

from sluice.v1 import checkpoint_pb2 as pb
from sluice.v1 import checkpoint_pb2_grpc as pbg
from sltest import CATALOG, SLUICE_CLI, STORE, Daemon

HEADER = 88
MiB = 1 << 20
BLOCK = MiB  # the block size of new shards (SL_SHARD_BLOCK)


def data_of(size, seed=b"ranges"):
    out, i = bytearray(), 0
    while len(out) < size:
        out += hashlib.sha256(seed + b"%d" % i).digest()
        i += 1
    return bytes(out[:size])


class RangeTest(unittest.TestCase):
    def setUp(self):
        self.d = Daemon().start()
        self.channel = grpc.insecure_channel(self.d.addr)
        self.stub = pbg.CheckpointsStub(self.channel)

    def tearDown(self):
        self.channel.close()
        rc = self.d.stop()
        reports = self.d.sanitizer_reports()
        log = self.d.log()
        self.d.cleanup()
        self.assertEqual(rc, 0, "sluiced exit code\n" + log)
        self.assertEqual(reports, [], "sanitizer reports\n" + log)

    def save(self, name, data, resume_at=None):
        """A COMPLETE one-rank checkpoint holding `data`; with resume_at, the upload is cut there
        and resumed from what the daemon holds."""
        self.stub.Begin(pb.BeginRequest(job="rj", name=name, world_size=1), timeout=10)
        tensors = [pb.TensorInfo(name="w", dtype="uint8", shape=[len(data)], offset=0,
                                 size=len(data))]

        def reqs(frm, to):
            yield pb.UploadShardRequest(header=pb.ShardHeader(
                job="rj", checkpoint=name, rank=0, tensors=tensors, data_size=len(data),
                offset=frm))
            for i in range(frm, to, MiB // 2):
                yield pb.UploadShardRequest(chunk=data[i:min(i + MiB // 2, to)])
        frm = 0
        if resume_at is not None:
            with self.assertRaises(grpc.RpcError):
                self.stub.UploadShard(reqs(0, resume_at), timeout=60)
            st = self.stub.UploadStatus(pb.UploadStatusRequest(job="rj", checkpoint=name, rank=0),
                                        timeout=10)
            frm = st.held_bytes
            if STORE == "dir":
                self.assertEqual(frm, resume_at)  # a real resume: the prefix is kept
        r = self.stub.UploadShard(reqs(frm, len(data)), timeout=60)
        self.assertEqual(r.sha256, hashlib.sha256(data).hexdigest())
        ck = self.stub.Commit(pb.CheckpointRef(job="rj", name=name), timeout=10)
        self.assertEqual(ck.state, pb.COMPLETE)

    def download(self, name, offset=0, length=0, got=None):
        """The bytes of [offset, offset + length) (length 0: to the end) and the last message's
        checksum; what arrived before a failure is left in `got`."""
        got = bytearray() if got is None else got
        sha = None
        req = pb.DownloadShardRequest(job="rj", name=name, rank=0, offset=offset, length=length)
        for m in self.stub.DownloadShard(req, timeout=60):
            self.assertEqual(m.offset, offset + len(got))
            got += m.data
            if m.sha256:
                sha = m.sha256
        return bytes(got), sha

    def fails(self, name, offset=0, length=0):
        got = bytearray()
        with self.assertRaises(grpc.RpcError) as e:
            self.download(name, offset, length, got)
        return e.exception.code(), e.exception.details(), bytes(got)

    def damage(self, name, data_off):
        self.d.store_flip("rj", "%s_shard_0.shard" % name, HEADER + data_off)

    def old_format(self, name):
        """Make the shard's row look like one recorded before block digests (migration 9)."""
        sql = ("UPDATE checkpoint_shards SET block_size = 0, blocks = NULL WHERE checkpoint_id = "
               "(SELECT id FROM checkpoints WHERE job = 'rj' AND name = '%s')" % name)
        if CATALOG == "postgresql":
            self.assertEqual(len(self.d.pg.psql(sql + " RETURNING rank", self.d.pg_db)), 1)
            return
        db = sqlite3.connect(os.path.join(self.d.data_dir, "catalog.db"), timeout=10)
        with db:
            n = db.execute(sql).rowcount
        db.close()
        self.assertEqual(n, 1)

    # -- tests --

    def test_ranges_exact(self):
        data = data_of(3 * MiB + 12345)
        self.save("c", data)
        whole = hashlib.sha256(data).hexdigest()
        n = len(data)
        for off, length in [(0, 0), (0, n), (1000, 0), (BLOCK - 10, 20), (2 * BLOCK, BLOCK),
                            (5, n - 5), (n - 1, 1), (n, 0), (BLOCK + 7, 2 * BLOCK + 3),
                            (3 * BLOCK, 0), (0, 1)]:
            got, sha = self.download("c", off, length)
            want = data[off:off + length] if length else data[off:]
            self.assertEqual(got, want, (off, length))
            self.assertEqual(sha, whole, (off, length))
        for off, length in [(n + 1, 0), (n - 10, 11), (1, n)]:
            code, msg, _ = self.fails("c", off, length)
            self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT, (off, length))
            self.assertIn("beyond the data size", msg)

    def test_range_of_a_writing_checkpoint_refused(self):
        # A range is a piece of a committed checkpoint (DCP's load reads ranges): a WRITING
        # checkpoint's recorded shard may still be replaced, so ranges of it are refused; the
        # whole shard still downloads (its checksum comes with it).
        data = data_of(MiB + 5)
        self.stub.Begin(pb.BeginRequest(job="rj", name="w", world_size=2), timeout=10)
        self.stub.UploadShard(iter([
            pb.UploadShardRequest(header=pb.ShardHeader(
                job="rj", checkpoint="w", rank=0, data_size=len(data),
                tensors=[pb.TensorInfo(name="w", dtype="uint8", shape=[len(data)], offset=0,
                                       size=len(data))])),
            pb.UploadShardRequest(chunk=data)]), timeout=60)
        code, msg, got = self.fails("w", 10, 100)
        self.assertEqual(code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("rj/w is WRITING", msg)
        self.assertEqual(got, b"")
        self.assertEqual(self.download("w")[0], data)

    def test_damaged_block(self):
        data = data_of(4 * MiB + 777)
        self.save("d", data)
        self.damage("d", 2 * BLOCK + 4321)
        # Offsets in other blocks: served, exact.
        self.assertEqual(self.download("d", 100, BLOCK)[0], data[100:100 + BLOCK])
        self.assertEqual(self.download("d", 3 * BLOCK + 5)[0], data[3 * BLOCK + 5:])
        self.assertEqual(self.download("d", BLOCK - 3, BLOCK + 3)[0],
                         data[BLOCK - 3:2 * BLOCK])
        # An offset in the damaged block, or a range reaching it: DATA_LOSS naming rank, block
        # and offset, and not one byte of the damaged block sent.
        for off, length in [(2 * BLOCK + 10, 0), (2 * BLOCK, 1), (BLOCK + 5, 0),
                            (2 * BLOCK - 1, 2)]:
            code, msg, got = self.fails("d", off, length)
            self.assertEqual(code, grpc.StatusCode.DATA_LOSS, (off, length, msg))
            self.assertIn("rank 0", msg)
            self.assertIn("block 2 (data offset %d" % (2 * BLOCK), msg)
            self.assertEqual(got, data[off:2 * BLOCK], (off, length))
        # From offset 0 the whole data is hashed, as before: DATA_LOSS at its end.
        code, _, _ = self.fails("d")
        self.assertEqual(code, grpc.StatusCode.DATA_LOSS)

    def test_offset_download_of_altered_shard(self):
        # The plain resume of a download (offset, no length), as clients do after a failover:
        # before block digests it was served OK with the altered byte in it.
        data = data_of(3 * MiB, b"offset")
        self.save("a", data)
        self.damage("a", BLOCK + 9)
        code, msg, got = self.fails("a", 10)
        self.assertEqual(code, grpc.StatusCode.DATA_LOSS, msg)
        self.assertIn("block 1 (data offset %d" % BLOCK, msg)
        self.assertEqual(got, data[10:BLOCK])
        self.assertEqual(self.download("a", 2 * BLOCK)[0], data[2 * BLOCK:])

    def test_resumed_upload_keeps_blocks(self):
        # A resumed upload records the block digests of the prefix it kept too: in a directory
        # the prefix is hashed again; in object storage a prefix this short is not kept (held
        # bytes 0), so the upload starts over and records them as it goes.
        data = data_of(3 * MiB + 99, b"resumed")
        self.save("r", data, resume_at=2 * MiB + MiB // 2)
        self.damage("r", 100)
        self.assertEqual(self.download("r", BLOCK)[0], data[BLOCK:])
        code, msg, _ = self.fails("r", 50)
        self.assertEqual(code, grpc.StatusCode.DATA_LOSS)
        self.assertIn("block 0 (data offset 0", msg)

    def test_old_format_shard(self):
        # A shard recorded before block digests: a ranged download hashes the whole data from
        # byte 0 and holds the message that ends the range back until it matches the catalog.
        data = data_of(3 * MiB + 5, b"old")
        self.save("o", data)
        self.old_format("o")
        self.assertEqual(self.download("o", BLOCK + 1, 1000)[0], data[BLOCK + 1:BLOCK + 1001])
        self.assertEqual(self.download("o", 2 * BLOCK)[0], data[2 * BLOCK:])
        self.assertEqual(self.download("o", len(data))[0], b"")
        self.damage("o", 2 * BLOCK + 50)
        code, msg, got = self.fails("o", 10, 100)
        self.assertEqual(code, grpc.StatusCode.DATA_LOSS)
        self.assertIn("corrupt", msg)
        self.assertEqual(got, b"")  # the range fits one message: held back, never sent
        code, _, _ = self.fails("o", BLOCK)
        self.assertEqual(code, grpc.StatusCode.DATA_LOSS)

    # -- the clients' ranged reads: libsluice's sl_ckpt_read_pieces --

    def cli(self, *args):
        return subprocess.run([SLUICE_CLI, "--addr", self.d.addr] + list(args),
                              capture_output=True, text=True, timeout=60)

    def test_cli_ranges(self):
        # sluice ckpt download --offset/--length: 16 MiB windows straight into one buffer.
        data = data_of(17 * MiB + 333, b"cli")
        self.save("k", data)
        n = len(data)
        out = os.path.join(self.d.data_dir, "..", "range.bin")
        for off, length in [(0, 0), (5, 100), (16 * MiB - 7, 14), (MiB + 1, 0), (n - 1, 1),
                            (n, 0), (3, 16 * MiB)]:
            r = self.cli("ckpt", "download", "rj", "k", "--rank", "0", "-o", out,
                         "--offset", str(off), "--length", str(length), "--no-progress")
            self.assertEqual(r.returncode, 0, r.stderr)
            want = data[off:off + length] if length else data[off:]
            with open(out, "rb") as f:
                self.assertEqual(f.read(), want, (off, length))
            self.assertIn("data bytes [%d, %d)" % (off, off + len(want)), r.stdout)
        r = self.cli("ckpt", "download", "rj", "k", "--rank", "0", "-o", out, "--offset",
                     str(n - 10), "--length", "11")
        self.assertEqual(r.returncode, 1)
        self.assertIn("--offset %d --length 11 is past the %d data bytes" % (n - 10, n),
                      r.stderr)
        r = self.cli("ckpt", "download", "rj", "k", "--dir", out + ".d", "--offset", "5")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--offset and --length go with --rank R -o FILE", r.stderr)
        os.unlink(out)
        self.damage("k", 16 * MiB + 100)
        r = self.cli("ckpt", "download", "rj", "k", "--rank", "0", "-o", out, "--offset",
                     str(MiB), "--no-progress")
        self.assertEqual(r.returncode, 1)
        self.assertIn("DATA_LOSS", r.stderr)
        self.assertIn("block 16 (data offset %d" % (16 * MiB), r.stderr)
        self.assertFalse(os.path.exists(out) or os.path.exists(out + ".part"))

    def test_read_into(self):
        # Checkpoints.read_into: pieces of a range written into memory, each hashed as copied
        # (libsluice in the release build, grpcio and a copy where SLUICE_LIB=none).
        import ctypes
        from sluice.checkpoint import Checkpoints
        data = data_of(3 * MiB + 12345, b"pieces")
        self.save("p", data)
        ck = Checkpoints(self.d.addr, timeout=30)
        try:
            bufs = []

            def piece(o, n):
                b = ctypes.create_string_buffer(max(n, 1))
                bufs.append(b)
                return (o, n, ctypes.addressof(b) if n else 0)
            start, end = 100, 3 * MiB + 5000
            spec = [(100, 0), (100, 10), (200, MiB), (MiB + 200, 0), (MiB + 300, MiB + 7),
                    (3 * MiB, 5000), (end, 0)]
            pieces = [piece(o, n) for o, n in spec]
            sums = ck.read_into("rj", "p", 0, start, end - start, pieces)
            for (o, n), b, got in zip(spec, bufs, sums):
                self.assertEqual(b.raw[:n], data[o:o + n], (o, n))
                self.assertEqual(got, hashlib.sha256(data[o:o + n]).hexdigest(), (o, n))
            for bad in ([(50, 10, 1)], [(200, 10, 1), (205, 10, 1)], [(end - 5, 10, 1)],
                        [(200, 10, 0)]):
                with self.assertRaises(ValueError):
                    ck.read_into("rj", "p", 0, start, end - start, bad)
            self.damage("p", 2 * BLOCK + 1)
            with self.assertRaises(grpc.RpcError) as e:
                ck.read_into("rj", "p", 0, start, end - start, pieces)
            self.assertEqual(e.exception.code(), grpc.StatusCode.DATA_LOSS)
            self.assertIn("block 2 (data offset %d" % (2 * BLOCK), e.exception.details())
            with self.assertRaises(grpc.RpcError) as e:
                ck.read_into("rj", "nope", 0, 0, 10, [piece(0, 10)])
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        finally:
            ck.close()


if __name__ == "__main__":
    unittest.main()
