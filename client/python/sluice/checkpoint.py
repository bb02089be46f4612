"""Checkpoint shards from Python: upload, download and verify through sluice.v1.Checkpoints.

    from sluice.checkpoint import Checkpoints
    with Checkpoints("127.0.0.1:7700") as ck:
        ck.begin("myjob", step=100, world_size=8)
        ck.upload("myjob", "step_100", rank, "shard.bin")       # a path, a binary file or bytes
        ck.commit("myjob", "step_100")
        assert ck.verify("myjob", "step_100", deep=True).ok
        data = ck.download("myjob", "step_100", rank)           # bytes (or pass dest=path)

Uploads stream in chunks (never the whole file in memory unless you pass bytes), hash the data
locally while sending and compare with the daemon's receipt; downloads check the SHA-256 the
daemon sends. Failures raise ``grpc.RpcError`` (the daemon's status) or ``ChecksumError``.
Only Debian's python3-grpcio and python3-protobuf are needed.
"""
import hashlib
import io
import os


from sluice._channel import bearer_metadata, default_address, make_channel
from sluice.v1 import checkpoint_pb2 as pb
from sluice.v1 import checkpoint_pb2_grpc as pbg
CHUNK = 1 << 20
WRITING, COMPLETE, INCOMPLETE = pb.WRITING, pb.COMPLETE, pb.INCOMPLETE


class _Chain(io.RawIOBase):
    """A read-only stream over byte strings produced one at a time (one tensor at a time)."""

    def __init__(self, parts):
        self._parts = iter(parts)
        self._cur = memoryview(b"")

    def readable(self):
        return True

    def readinto(self, b):
        while not self._cur:
            nxt = next(self._parts, None)
            if nxt is None:
                return 0
            self._cur = memoryview(nxt)
        n = min(len(b), len(self._cur))
        b[:n] = self._cur[:n]
        self._cur = self._cur[n:]
        return n


class ChecksumError(Exception):
    """The data does not hash to what the other side says."""


def _tensor(t):
    if isinstance(t, pb.TensorInfo):
        return t
    return pb.TensorInfo(name=t["name"], dtype=t["dtype"], shape=list(t["shape"]),
                         offset=t["offset"], size=t["size"])


class Checkpoints:
    """One channel to a sluiced. ``timeout`` (seconds) applies to unary calls except deep
    verification; streams have none."""

    def __init__(self, address=None, timeout=10.0, token=None, channel=None, tls=None,
                 tls_ca=None, tls_cert=None, tls_key=None):
        self.address = default_address(address)
        self.timeout = timeout
        self._metadata = bearer_metadata(token)
        self._own = channel is None
        self.channel = channel or make_channel(self.address, tls, tls_ca, tls_cert, tls_key)
        self.stub = pbg.CheckpointsStub(self.channel)

    def close(self):
        if self._own:
            self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _kw(self, timeout=True):
        kw = {"timeout": self.timeout} if timeout else {}
        if self._metadata:
            kw["metadata"] = self._metadata
        return kw

    # ---- lifecycle ----

    def begin(self, job, name="", step=0, world_size=1, user_metadata=""):
        return self.stub.Begin(pb.BeginRequest(job=job, name=name, step=step,
                                               world_size=world_size,
                                               user_metadata=user_metadata), **self._kw())

    def commit(self, job, name):
        return self.stub.Commit(pb.CheckpointRef(job=job, name=name), **self._kw())

    def abort(self, job, name):
        return self.stub.Abort(pb.CheckpointRef(job=job, name=name), **self._kw())

    def get(self, job, name):
        return self.stub.Get(pb.CheckpointRef(job=job, name=name), **self._kw())

    def list(self, job="", state=0):
        return list(self.stub.List(pb.ListRequest(job=job, state=state),
                                   **self._kw()).checkpoints)

    def latest(self, job):
        return self.stub.Latest(pb.LatestRequest(job=job), **self._kw())

    def delete(self, job, name):
        self.stub.Delete(pb.CheckpointRef(job=job, name=name), **self._kw())

    def set_retention(self, job, keep_last):
        return list(self.stub.SetRetention(pb.SetRetentionRequest(job=job, keep_last=keep_last),
                                           **self._kw()).deleted)

    def verify(self, job, name, deep=False):
        """The VerifyResponse: ``.ok``, ``.shards`` (rank, verdict, detail), ``.metadata``."""
        return self.stub.Verify(pb.VerifyRequest(job=job, name=name,
                                                 mode=pb.DEEP if deep else pb.QUICK),
                                **self._kw(timeout=not deep))

    def upload_status(self, job, name, rank):
        return self.stub.UploadStatus(pb.UploadStatusRequest(job=job, checkpoint=name,
                                                             rank=rank), **self._kw())

    # ---- data ----

    def upload(self, job, name, rank, source, tensors=None, chunk_size=CHUNK, resume=False,
               size=None):
        """Upload `source` (bytes-like, a path, or a binary file opened for reading, from its
        current position; pass `size` for a stream that cannot seek) as rank's shard data.
        `tensors`: TensorInfo messages or dicts (name, dtype, shape, offset, size); default one
        "bytes" tensor over everything. With `resume`, continue from what the daemon holds of an
        interrupted upload. Returns the UploadShardResponse (sha256, sizes, path)."""
        close = None
        if isinstance(source, (bytes, bytearray, memoryview)):
            f, size = io.BytesIO(bytes(source)), len(source)
        elif isinstance(source, (str, os.PathLike)):
            f = close = open(source, "rb")
            size = os.fstat(f.fileno()).st_size
        else:
            f = source
            if size is None:
                pos = f.tell()
                f.seek(0, io.SEEK_END)
                size = f.tell() - pos
                f.seek(pos)
        try:
            offset = 0
            if resume:
                st = self.upload_status(job, name, rank)
                offset = st.held_bytes if st.held_bytes <= size and not st.in_progress else 0
            if tensors is None:
                tensors = [pb.TensorInfo(name="data", dtype="bytes", shape=[size], offset=0,
                                         size=size)]
            h = hashlib.sha256()
            # The resumed prefix is hashed locally too: the receipt check covers every byte.
            left = offset
            while left:
                b = f.read(min(left, chunk_size))
                if not b:
                    break
                h.update(b)
                left -= len(b)

            def requests():
                yield pb.UploadShardRequest(header=pb.ShardHeader(
                    job=job, checkpoint=name, rank=rank, tensors=[_tensor(t) for t in tensors],
                    data_size=size, offset=offset))
                while True:
                    b = f.read(chunk_size)
                    if not b:
                        return
                    h.update(b)
                    yield pb.UploadShardRequest(chunk=b)
            receipt = self.stub.UploadShard(requests(), **self._kw(timeout=False))
            if receipt.sha256 != h.hexdigest():
                raise ChecksumError("daemon stored sha256 %s, local data hashes to %s"
                                    % (receipt.sha256, h.hexdigest()))
            return receipt
        finally:
            if close:
                close.close()

    # ---- torch ----

    def save_state_dict(self, job, name, rank, state_dict, chunk_size=CHUNK):
        """Upload a torch state_dict as rank's shard: the tensors' bytes back to back, each
        described (name, dtype, shape, offset, size) in the catalog and metadata.json. Tensors
        are copied to CPU one at a time."""
        import torch
        layout, off = [], 0
        for key, t in state_dict.items():
            if not isinstance(t, torch.Tensor):
                raise TypeError("%s: only tensors can be saved, not %s" % (key, type(t)))
            size = t.numel() * t.element_size()
            layout.append(pb.TensorInfo(name=key, dtype=str(t.dtype).replace("torch.", ""),
                                        shape=list(t.shape), offset=off, size=size))
            off += size

        def parts():
            for t in state_dict.values():
                t = t.detach().to("cpu").contiguous().reshape(-1)
                if t.numel():
                    yield t.view(torch.uint8).numpy().tobytes()
        sha = hashlib.sha256()
        for p in parts():
            sha.update(p)
        receipt = self.upload(job, name, rank, io.BufferedReader(_Chain(parts()), CHUNK),
                              tensors=layout, chunk_size=chunk_size, size=off)
        if receipt.sha256 != sha.hexdigest():
            raise ChecksumError("state_dict changed while it was saved")
        return receipt

    def load_state_dict(self, job, name, rank, template):
        """Download rank's shard into tensors shaped like `template` (a state_dict with the same
        keys, dtypes and shapes, e.g. a freshly built model's). Returns a new state_dict."""
        import torch
        data = self.download(job, name, rank)
        out, off = {}, 0
        for key, t in template.items():
            size = t.numel() * t.element_size()
            if off + size > len(data):
                raise ValueError("%s: the shard holds %d bytes, the template needs more"
                                 % (key, len(data)))
            flat = torch.frombuffer(bytearray(data[off:off + size]), dtype=torch.uint8) \
                if size else torch.empty(0, dtype=torch.uint8)
            out[key] = flat.view(t.dtype).reshape(t.shape)
            off += size
        if off != len(data):
            raise ValueError("the shard holds %d bytes, the template %d" % (len(data), off))
        return out

    def download(self, job, name, rank, dest=None):
        """Download rank's shard data: returns bytes when `dest` is None, else writes it to
        `dest` (a path, written to a temp file and renamed, or a binary file) and returns the
        SHA-256. Raises ChecksumError if the data does not match the daemon's checksum."""
        h = hashlib.sha256()
        want = None
        buf = io.BytesIO() if dest is None else None
        tmp = None
        if isinstance(dest, (str, os.PathLike)):
            tmp = str(dest) + ".part"
            out = open(tmp, "wb")
        else:
            out = buf if dest is None else dest
        try:
            for m in self.stub.DownloadShard(pb.DownloadShardRequest(job=job, name=name,
                                                                     rank=rank),
                                             **self._kw(timeout=False)):
                h.update(m.data)
                out.write(m.data)
                if m.sha256:
                    want = m.sha256
            if want != h.hexdigest():
                raise ChecksumError("received data hashes to %s, daemon says %s"
                                    % (h.hexdigest(), want))
        except BaseException:
            if tmp:
                out.close()
                os.unlink(tmp)
            raise
        if tmp:
            out.close()
            os.replace(tmp, dest)
        return buf.getvalue() if dest is None else want
