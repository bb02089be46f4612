"""Checkpoint shards from Python: upload, download and verify through sluice.v1.Checkpoints.

    from sluice.checkpoint import Checkpoints
    with Checkpoints("127.0.0.1:7700") as ck:
        ck.begin("myjob", step=100, world_size=8)
        ck.upload("myjob", "step_100", rank, "shard.bin")       # a path, a binary file or bytes
        ck.commit("myjob", "step_100")
        assert ck.verify("myjob", "step_100", deep=True).ok
        data = ck.download("myjob", "step_100", rank)           # bytes (or pass dest=path)

With torch, a whole training state is one call each way, no template needed:

    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 100}
    ck.save_state_dict("myjob", "step_100", rank, state)
    state = ck.load_state_dict("myjob", "step_100", rank)   # same types, keys, bytes

A checkpoint can carry the data position of a feed job: begin(..., feed_job=, auto_commit=True),
each rank's upload/save_state_dict(..., data_position={"epoch", "position", "world_size"}), and
restore(job, name) rewinds the feed job to it (sluice.torch.CheckpointManager does all of it).

Such a shard holds a skeleton (the structure and the non-tensor values, as JSON; format below,
above SKELETON_NAME) followed by the tensors, each described by its flattened key path
(``optimizer.state.0.exp_avg``) in the catalog and metadata.json. Loading executes nothing from
the shard: no pickle.

Uploads stream in chunks (never the whole file in memory unless you pass bytes), hash the data
locally while sending and compare with the daemon's receipt; downloads check the SHA-256 the
daemon sends. Failures raise ``grpc.RpcError`` (the daemon's status) or ``ChecksumError``; bad
state data raises ``ValueError``, unsavable values ``TypeError``. Only Debian's python3-grpcio and
python3-protobuf are needed (and torch for the state dict methods).
"""
import ctypes
import hashlib
import io
import os

import grpc

from sluice import _native
from sluice._channel import (bearer_metadata, bearer_token, default_address, make_channel,
                             tls_settings)
from sluice.v1 import checkpoint_pb2 as pb
from sluice.v1 import checkpoint_pb2_grpc as pbg
from sluice.v1 import feed_pb2
from sluice._state import (CHUNK, SKELETON_MAGIC, SKELETON_NAME, ChecksumError,  # noqa: F401
                           _read_flat_shard, _read_skeleton_shard, _StateShard, encode_state)
WRITING, COMPLETE, INCOMPLETE = pb.WRITING, pb.COMPLETE, pb.INCOMPLETE


_POSITION_KEYS = ("job", "epoch", "position", "world_size")


def to_data_position(value):
    """A DataPosition message from a DataPosition or a dict with the keys job (the feed job;
    "" for the checkpoint's), epoch, position (in the job's unit: indices or batches, counted in
    the rank's share of that epoch) and world_size (the world the rank ran in). None stays None.
    Unknown keys, missing numbers and values out of range raise ValueError naming them."""
    if value is None or isinstance(value, pb.DataPosition):
        return value
    if not isinstance(value, dict):
        raise TypeError("data_position must be a dict or a DataPosition, not %s"
                        % type(value).__name__)
    unknown = sorted(set(value) - set(_POSITION_KEYS))
    if unknown:
        raise ValueError("data_position: unknown key(s) %s (keys: %s)"
                         % (", ".join(map(repr, unknown)), ", ".join(_POSITION_KEYS)))
    job = value.get("job") or ""
    if not isinstance(job, str):
        raise ValueError("data_position: job must be a string, not %r" % (job,))
    nums = {}
    for key, top in (("epoch", 1 << 64), ("position", 1 << 64), ("world_size", 65537)):
        v = value.get(key)
        if key != "world_size" and v is None:
            raise ValueError("data_position: %s is required" % key)
        v = 0 if v is None else v
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < top:
            raise ValueError("data_position: %s %r out of range [0, %d)" % (key, v, top))
        nums[key] = v
    return pb.DataPosition(job=job, **nums)


def _tensor(t):
    if isinstance(t, pb.TensorInfo):
        return t
    return pb.TensorInfo(name=t["name"], dtype=t["dtype"], shape=list(t["shape"]),
                         offset=t["offset"], size=t["size"])


class _Download:
    """Pulls a shard's data from a DownloadShard stream: exact reads, reads into buffers, and
    the SHA-256 check at the end. A stream that ends early or continues past the data is a
    ValueError."""

    def __init__(self, call):
        self._call = call
        self._it = iter(call)
        self._buf = memoryview(b"")
        self._h = hashlib.sha256()
        self._want = None
        self.received = 0          # bytes received so far
        self.pos = 0               # bytes consumed so far
        self.size = None           # the data size the daemon announced

    def _more(self):
        m = next(self._it, None)
        if m is None:
            if self.size is None:
                self.size = 0
            return False
        if m.offset != self.received:
            raise ValueError("the download stream is out of order (offset %d, expected %d)"
                             % (m.offset, self.received))
        if self.size is not None and m.data_size != self.size:
            raise ValueError("the download stream changed the data size from %d to %d"
                             % (self.size, m.data_size))
        self.size = m.data_size
        self.received += len(m.data)
        if self.received > self.size:
            raise ValueError("the daemon sent more than the %d bytes it announced" % self.size)
        self._h.update(m.data)
        if m.sha256:
            self._want = m.sha256
        self._buf = memoryview(m.data)
        return True

    def _ended(self, want):
        return ValueError("the shard ends after %d bytes, %d needed (truncated data?)"
                          % (self.pos, want))

    def peek(self, n):
        """Up to n bytes from the current position, not consumed."""
        while len(self._buf) < n:
            before = bytes(self._buf)
            if not self._more():
                self._buf = memoryview(before)
                break
            self._buf = memoryview(before + bytes(self._buf))
        return bytes(self._buf[:n])

    def announced(self):
        """The data size the daemon announced (waits for its first message)."""
        if self.size is None and not self._buf:
            self._more()
        return self.size

    def readinto(self, dst):
        """Fill the memoryview `dst` (a uint8 view) from the stream."""
        got, n = 0, len(dst)
        while got < n:
            if not self._buf and not self._more():
                raise self._ended(self.pos + n - got)
            k = min(n - got, len(self._buf))
            dst[got:got + k] = self._buf[:k]
            self._buf = self._buf[k:]
            got += k
            self.pos += k

    def read(self, n):
        out = bytearray(0)
        while len(out) < n:        # grows with what arrives, not with what is announced
            if not self._buf and not self._more():
                raise self._ended(self.pos + n - len(out))
            k = min(n - len(out), len(self._buf))
            out += self._buf[:k]
            self._buf = self._buf[k:]
            self.pos += k
        return bytes(out)

    def skip(self, n):
        while n:
            if not self._buf and not self._more():
                raise self._ended(self.pos + n)
            k = min(n, len(self._buf))
            self._buf = self._buf[k:]
            self.pos += k
            n -= k

    def finish(self):
        """Check that everything was consumed and the data hashes to the daemon's SHA-256."""
        if self._buf or self._more():
            raise ValueError("the shard holds %d bytes, its content ends at %d"
                             % (self.size, self.pos))
        if self._want != self._h.hexdigest():
            raise ChecksumError("received data hashes to %s, daemon says %s"
                                % (self._h.hexdigest(), self._want))

    def cancel(self):
        cancel = getattr(self._call, "cancel", None)
        (cancel or self._call.close)()


class Checkpoints:
    """One channel to a sluiced. ``timeout`` (seconds) applies to unary calls except deep
    verification; streams have none. ``address`` as for sluice.client.Client, also a list of
    replicas: unary calls and downloads go on on the next replica when one is UNAVAILABLE; an
    upload raises, and upload(..., resume=True) continues it on the next replica from what the
    store holds (CheckpointManager does that itself)."""

    def __init__(self, address=None, timeout=10.0, token=None, channel=None, tls=None,
                 tls_ca=None, tls_cert=None, tls_key=None):
        self.address = default_address(address)
        self.timeout = timeout
        self._metadata = bearer_metadata(token)
        self._own = channel is None
        self.channel = channel or make_channel(self.address, tls, tls_ca, tls_cert, tls_key)
        self.stub = pbg.CheckpointsStub(self.channel)
        # What libsluice needs to reach the same daemon the same way (read_into); None for a
        # channel given by the caller, whose settings are not known here.
        self._native = None if channel is not None else \
            (self.address,) + tls_settings(tls, tls_ca, tls_cert, tls_key) + (bearer_token(token),)

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

    def begin(self, job, name="", step=0, world_size=1, user_metadata="", feed_job="",
              no_feed=False, auto_commit=False):
        """Create checkpoint (job, name) in WRITING, or return the existing one (idempotent).

        ``feed_job``: the feed job whose data position the checkpoint carries (every rank's
        upload then gives its ``data_position``); empty: the feed job named ``job`` if there is
        one, unless ``no_feed``. ``auto_commit``: the daemon commits by itself once every rank's
        shard is durable, so the ranks need no barrier before a commit. A daemon that predates
        these fields would ignore them: asking for either and getting a checkpoint without it
        raises RuntimeError."""
        if feed_job and no_feed:
            raise ValueError("feed_job=%r and no_feed=True contradict each other" % feed_job)
        ck = self.stub.Begin(pb.BeginRequest(job=job, name=name, step=step,
                                             world_size=world_size, user_metadata=user_metadata,
                                             feed_job=feed_job, no_feed=no_feed,
                                             auto_commit=auto_commit), **self._kw())
        if auto_commit and not ck.auto_commit and ck.state == WRITING:
            raise RuntimeError("sluiced at %s did not take auto_commit for %s/%s (a daemon older "
                               "than checkpoints with data positions?)"
                               % (self.address, job, ck.name))
        if feed_job and ck.feed_job != feed_job and ck.state == WRITING:
            raise RuntimeError("checkpoint %s/%s is bound to feed job %r, not %r (it existed "
                               "before, or the daemon predates feed jobs on checkpoints)"
                               % (job, ck.name, ck.feed_job, feed_job))
        return ck

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
        """The job's newest COMPLETE checkpoint (NOT_FOUND if none). Like get(), its
        ``feed_state`` holds the data position it was taken at, when it carries one."""
        return self.stub.Latest(pb.LatestRequest(job=job), **self._kw())

    def feed_state(self, job, name):
        """The FeedState checkpoint (job, name) was taken at (epoch, world_size, mesh, unit,
        per-dp-rank positions, samples, lengths_sha256, labels_sha256, elastic), or None if it carries none
        (not COMPLETE, or saved without a feed job)."""
        ck = self.get(job, name)
        return ck.feed_state if ck.HasField("feed_state") else None

    def restore(self, job, name, world_size=0, mesh=None):
        """Rewind the checkpoint's feed job to the data position the COMPLETE checkpoint (job,
        name) was taken at: its epoch and every dp rank's position; progress reported since is
        discarded and open streams of the job end with ABORTED. ``world_size`` (0: the
        checkpoint's) restores into another world, redistributing the rest of the epoch (no
        sample twice, equal counts per dp rank: cut to a multiple of the world with drop_last,
        else padded; docs/feeding.md); ``mesh`` (a dict of dp, tp, cp, pp, order, or a Mesh) goes with it for jobs with a
        mesh. Call it from one rank before the ranks open their streams. Returns the
        RestoreResponse (restored FeedState, feed_job, the job's epoch and world now).

        Raises grpc.RpcError with the daemon's status: NOT_FOUND, FAILED_PRECONDITION (not
        COMPLETE, no feed state, the dataset's samples, lengths or labels
        changed, the job's settings changed), INVALID_ARGUMENT (bad world or mesh);
        NotImplementedError if the daemon has no Restore."""
        if not isinstance(world_size, int) or not 0 <= world_size <= 65536:
            raise ValueError("world_size %r out of range [0, 65536]" % (world_size,))
        req = pb.RestoreRequest(job=job, name=name, world_size=world_size)
        if mesh is not None:
            if not world_size:
                raise ValueError("a mesh goes with a world_size")
            req.mesh.CopyFrom(mesh if isinstance(mesh, feed_pb2.Mesh) else feed_pb2.Mesh(**mesh))
        try:
            return self.stub.Restore(req, **self._kw())
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise NotImplementedError("sluiced at %s does not implement Checkpoints.Restore "
                                          "(%s)" % (self.address, e.details())) from e
            raise

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
               size=None, sha256=None, data_position=None):
        """Upload `source` (bytes-like, a path, or a binary file opened for reading, from its
        current position; pass `size` for a stream that cannot seek) as rank's shard data.
        `tensors`: TensorInfo messages or dicts (name, dtype, shape, offset, size); default one
        "bytes" tensor over everything. With `resume`, continue from what the daemon holds of an
        interrupted upload. `sha256`: the whole data's lowercase hex SHA-256 if known; the daemon
        then refuses (DATA_LOSS) data that hashes to anything else and stores nothing. Returns
        the UploadShardResponse (sha256, sizes, path).

        ``data_position`` (a dict or DataPosition, see to_data_position()): where this rank was in
        the checkpoint's feed job when the data was taken; required of every rank of a
        checkpoint bound to a feed job, refused otherwise."""
        position = to_data_position(data_position)
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
                    data_size=size, offset=offset, sha256=sha256 or "",
                    data_position=position))
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

    def save_state_dict(self, job, name, rank, state_dict, chunk_size=CHUNK, data_position=None,
                        allow_pickle=False):
        """Upload a state dict as rank's shard: anything torch.save takes that is built from
        dict, OrderedDict, list, tuple, set, frozenset, tensors, str, int, float, complex, bool,
        None, bytes, bytearray, numpy arrays and scalars (numeric, bool, string and datetime
        dtypes: e.g. ``numpy.random.get_state()``), torch.dtype, torch.Size and torch.device
        (dict keys: scalars, tuples and frozensets), e.g. ``{"model": model.state_dict(),
        "optimizer": opt.state_dict(), "step": 5}``. With ``allow_pickle=True`` any other
        object torch.save takes is pickled into the skeleton (loading it then needs
        allow_pickle=True too, since unpickling runs code: the trust torch.load asks for).

        The data section is a skeleton entry (the structure and the non-tensor values, JSON; see
        the comment above SKELETON_NAME) followed by the tensors' bytes, each at a multiple of
        64 bytes and described in the catalog and metadata.json by its flattened key path
        (``model.fc.weight``, ``optimizer.state.0.exp_avg``). Tensors are streamed: copied to
        CPU one at a time and sent in chunks, never the whole shard in memory. Tensors that share
        storage (views of one another) are saved as separate copies; so are containers that
        appear twice. Tensor subclasses (nn.Parameter) are saved as plain tensors, without
        requires_grad.

        A value of another type (without allow_pickle) raises TypeError naming its key path
        before anything is sent.
        The data is hashed first and the daemon checks that hash, so a state that changes while
        it is sent is refused (ChecksumError) and nothing is stored. ``data_position``: as for
        upload(), where this rank was in the feed when the state was taken."""
        import torch
        position = to_data_position(data_position)   # checked before anything is hashed
        shard = _StateShard(torch, *encode_state(torch, state_dict, allow_pickle),
                            chunk_size=chunk_size)
        try:
            return self.upload(job, name, rank, shard.reader(), tensors=shard.layout,
                               chunk_size=chunk_size, size=shard.size, sha256=shard.sha256(),
                               data_position=position)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DATA_LOSS:
                raise ChecksumError("the state changed while it was saved (%s)"
                                    % e.details()) from e
            raise

    def load_state_dict(self, job, name, rank, template=None, allow_pickle=False):
        """Download rank's shard written by save_state_dict and rebuild the state: the same
        container types and keys, the non-tensor values, and tensors with the saved dtype, shape
        and bytes (contiguous, on CPU). Tensors are filled as the data arrives; the shard is
        never held in memory twice. Nothing in the shard is executed: the skeleton is JSON read
        into the types listed in save_state_dict. A state saved with allow_pickle holding
        pickled objects loads only with ``allow_pickle=True`` (ValueError naming the key path
        and type otherwise): only for checkpoints you trust.

        ``template`` is optional. With a shard of this format, the loaded state must have the
        template's structure (container types, dict and OrderedDict counting as one; keys; dtype
        and shape of the template's tensors; other values are not compared), else ValueError;
        the state returned is still the one loaded. A shard of the earlier flat
        format (tensors back to back, no skeleton) holds no layout the client can read, so it
        needs the template it was written from: a flat dict of tensors with the same keys, in
        order, dtypes and shapes; it returns a dict.

        Bad data (a truncated shard, a malformed skeleton, an unknown dtype, references beyond
        the data) raises ValueError; data that does not hash to the daemon's SHA-256 raises
        ChecksumError."""
        import torch
        s = _Download(self._download_messages(job, name, rank))
        try:
            head = s.peek(len(SKELETON_MAGIC) + 8)
            if len(head) == len(SKELETON_MAGIC) + 8 and head.startswith(SKELETON_MAGIC):
                state = _read_skeleton_shard(s, torch, template, allow_pickle)
            elif template is None:
                raise ValueError("rank %d of %s/%s has no state skeleton (a shard of the earlier "
                                 "flat format, or not written by save_state_dict): pass the "
                                 "template it was saved from" % (rank, job, name))
            else:
                state = _read_flat_shard(s, torch, template)
            s.finish()
            return state
        finally:
            s.cancel()

    def _download_messages(self, job, name, rank, offset=0, length=0):
        """The DownloadShard messages of rank's shard (of [offset, offset + length) with a
        length). With several replicas (a Replicas channel), a stream that ends UNAVAILABLE is
        reopened on the next one at the offset reached, each replica at most once since the last
        message."""
        tries, end = 0, offset + length
        count = getattr(self.channel, "count", 1)
        while True:
            call = self.stub.DownloadShard(pb.DownloadShardRequest(
                job=job, name=name, rank=rank, offset=offset,
                length=end - offset if length else 0), **self._kw(timeout=False))
            try:
                for m in call:
                    if m.offset != offset:
                        raise ValueError("the download stream is out of order (offset %d, "
                                         "expected %d)" % (m.offset, offset))
                    offset += len(m.data)
                    tries = 0
                    yield m
                return
            except grpc.RpcError as e:
                tries += 1
                if e.code() != grpc.StatusCode.UNAVAILABLE or tries >= count:
                    raise
            finally:
                call.cancel()

    def read_range(self, job, name, rank, offset, length):
        """Bytes [offset, offset + length) of rank's shard data, from a COMPLETE checkpoint. The
        daemon checks every block they come from against the digests recorded at upload before
        it sends any (DATA_LOSS otherwise); a range past the data is INVALID_ARGUMENT, one of a
        checkpoint still WRITING FAILED_PRECONDITION."""
        return bytes(self._read_range(job, name, rank, offset, length))

    def _read_range(self, job, name, rank, offset, length):
        """read_range into a bytearray of its own."""
        if length < 0 or offset < 0:
            raise ValueError("range of %r bytes at offset %r" % (length, offset))
        out = bytearray(length)
        if length == 0:
            return out
        n = 0
        for m in self._download_messages(job, name, rank, offset, length):
            if n + len(m.data) > length:
                raise ValueError("the daemon sent more than the %d bytes asked for" % length)
            out[n:n + len(m.data)] = m.data
            n += len(m.data)
        if n != length:
            raise ValueError("the daemon sent %d bytes of a %d-byte range" % (n, length))
        return out

    def read_into(self, job, name, rank, offset, length, pieces):
        """Data bytes [offset, offset + length) of rank's shard (a COMPLETE checkpoint) written
        into `pieces`: (offset, size, address) triples, sorted by offset, inside the range, none
        overlapping, each `address` the start of `size` writable bytes (a tensor's data_ptr(),
        a buffer's); bytes between them are dropped. Returns each piece's hex SHA-256, computed
        as its bytes were copied (the caller checks them). Through libsluice when it is there
        (sluice._native: the bytes go straight from gRPC into the pieces, the GIL released),
        else read_range and a copy. Errors as read_range's; on one, the pieces may hold part
        of the data. ValueError for pieces that break those rules."""
        at = offset
        for o, n, a in pieces:
            if not (at <= o and n >= 0 and o + n <= offset + length and (a or not n)):
                raise ValueError("piece of %r bytes at offset %r (address %r) is not inside "
                                 "[%d, %d) after the one before it"
                                 % (n, o, a, at, offset + length))
            at = o + n
        if self._native is not None and length and _native.available():
            arr = (_native.Piece * len(pieces))()
            for p, (o, n, a) in zip(arr, pieces):
                p.offset, p.size, p.dst = o, n, a
            return _native.read_pieces(self._native, job, name, rank, offset, length, arr)
        raw = self._read_range(job, name, rank, offset, length)
        base = ctypes.addressof((ctypes.c_char * len(raw)).from_buffer(raw)) if raw else 0
        out, view = [], memoryview(raw)
        for o, n, a in pieces:
            if n:
                ctypes.memmove(a, base + o - offset, n)
            out.append(hashlib.sha256(view[o - offset:o - offset + n]).hexdigest())
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
            for m in self._download_messages(job, name, rank):
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

