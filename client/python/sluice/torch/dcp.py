"""torch.distributed.checkpoint (DCP) storage in sluiced: ``dcp.save``, ``dcp.async_save`` and
``dcp.load`` with checkpoint ids ``sluice://JOB/STEP``::

    import torch.distributed.checkpoint as dcp
    import sluice.torch.dcp                      # makes sluice:// ids known to DCP

    state = {"model": model, "optim": optim, "dataloader": loader}   # Stateful values
    dcp.save(state, checkpoint_id="sluice://run1/100")
    dcp.load(state, checkpoint_id="sluice://run1/100")               # any world size

or with an explicit writer and reader (their address, token and options)::

    dcp.save(state, storage_writer=sluice.torch.dcp.Writer("sluice://run1/100", address=addr))
    dcp.load(state, storage_reader=sluice.torch.dcp.Reader("sluice://run1/100", address=addr))

One DCP checkpoint is one sluice checkpoint ``JOB/step_STEP`` (``sluice://JOB/NAME`` for a name
that is not a number) of N + 1 shards: shard r holds what DCP's plan gives rank r to write, each
item's bytes one after the other (a tensor as its raw contiguous bytes, a non-tensor value in
sluice's JSON value encoding, or torch.save's pickle when that encoding cannot hold it); shard N
holds DCP's metadata (the state dict's layout, where each item lies, its SHA-256), as JSON, never
pickled. Loading never unpickles what torch's weights_only unpickler refuses unless the Reader
has ``allow_pickle=True``.
The coordinator begins the checkpoint in its global plan (refused if that step is COMPLETE
already); each rank streams its shard to sluiced, which hashes it on arrival and stores it
durably; ``finish()`` writes the metadata shard and commits: the checkpoint is COMPLETE only when
every rank's data and the metadata are durable, and a save cut short (a rank killed) leaves it
WRITING, never COMPLETE, while the previous step stays loadable.

Loading reads the metadata shard, then every item a rank needs as a byte range of its shard
(neighbouring items of one shard in one read); sluiced checks the blocks a range comes from
against the digests recorded at upload, and each item's bytes are checked against the SHA-256
in the metadata before they are used. DCP's planner reshards: what N ranks saved (FSDP2,
DTensor) loads into any number of ranks, or into one process. The loader's position goes into
the same checkpoint as a Stateful value (``{"dataloader": loader}``, sluice.torch.DataLoader's
state_dict), so it commits with the model.
"""
import base64
import concurrent.futures
import ctypes
import dataclasses
import hashlib
import io
import json
import re
import struct
import threading
import uuid
import grpc
import torch
from torch.distributed.checkpoint import metadata as dmeta
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult

from sluice._state import VALUE_MAGIC, decode_value, encode_value
from sluice.checkpoint import COMPLETE, ChecksumError, Checkpoints
from sluice.v1 import checkpoint_pb2 as pb

__all__ = ["Writer", "Reader", "parse_checkpoint_id", "SCHEME", "LocalShard", "NotDcp"]

SCHEME = "sluice://"
FORMAT = "sluice-dcp 1"
# Items of one shard closer than this are read in one range.
COALESCE_GAP = 1 << 20
# A range read at once at most (several when items are larger).
RANGE_MAX = 64 << 20
# Ranges read at once by one rank's load.
READ_THREADS = 4
# A shard written without collectives (LocalShard, CheckpointManager) ends in its own rank's DCP
# metadata: the JSON, its length (u64, little-endian) and this magic.
FOOTER_MAGIC = b"SLDCPFT1"
FOOTER_TAIL = 16
# The tail of a shard read at once for its footer (a larger footer takes a second read).
FOOTER_PROBE = 64 << 10


def parse_checkpoint_id(checkpoint_id):
    """(job, name, step) of ``sluice://JOB/STEP`` (name ``step_STEP``) or ``sluice://JOB/NAME``
    (step 0). Anything else raises ValueError naming it."""
    s = str(checkpoint_id)
    if not s.startswith(SCHEME):
        raise ValueError("checkpoint id %r: want %sJOB/STEP" % (s, SCHEME))
    rest = s[len(SCHEME):]
    job, sep, last = rest.partition("/")
    if not sep or not job or not last or "/" in last:
        raise ValueError("checkpoint id %r: want %sJOB/STEP (one job, one step)" % (s, SCHEME))
    if re.fullmatch(r"[0-9]+", last):
        step = int(last)
        if step >= 1 << 63:
            raise ValueError("checkpoint id %r: step %d out of range" % (s, step))
        return job, "step_%d" % step, step
    return job, last, 0


# ---- the metadata shard: DCP's Metadata as JSON ----

def _dtype(name):
    v = getattr(torch, name.rpartition(".")[2], None) if isinstance(name, str) else None
    if not isinstance(v, torch.dtype):
        raise ValueError("unknown dtype %r in the checkpoint's metadata" % (name,))
    return v


def _torch_attr(name, kind):
    v = getattr(torch, name.rpartition(".")[2], None) if isinstance(name, str) else None
    if not isinstance(v, kind):
        raise ValueError("unknown %s %r in the checkpoint's metadata" % (kind.__name__, name))
    return v


def _ints(v, what):
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                          and x >= 0 for x in v):
        raise ValueError("%s %r in the checkpoint's metadata is not a list of sizes" % (what, v))
    return torch.Size(v)


def _index_key(index):
    return [index.fqn, None if index.offset is None else list(index.offset), index.index]


def _index_of(v):
    if not isinstance(v, list) or len(v) != 3 or not isinstance(v[0], str):
        raise ValueError("bad item index %r in the checkpoint's metadata" % (v,))
    return dmeta.MetadataIndex(v[0], None if v[1] is None else _ints(v[1], "offset"), v[2])


def _plain(v):
    """planner_data as JSON: DCP's default planner keeps {fqn: (key, key, ...)}."""
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    if isinstance(v, (list, tuple)):
        return {"__t": [_plain(x) for x in v]} if isinstance(v, tuple) else [_plain(x) for x in v]
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {"__d": {k: _plain(x) for k, x in v.items()}}
    raise TypeError("planner_data holds a %s, which the JSON metadata cannot hold (a custom "
                    "planner: pass allow_pickle=True to the writer and the reader)"
                    % type(v).__name__)


def _unplain(v):
    if isinstance(v, list):
        return [_unplain(x) for x in v]
    if isinstance(v, dict):
        if set(v) == {"__t"} and isinstance(v["__t"], list):
            return tuple(_unplain(x) for x in v["__t"])
        if set(v) == {"__d"} and isinstance(v["__d"], dict):
            return {k: _unplain(x) for k, x in v["__d"].items()}
        raise ValueError("bad planner_data in the checkpoint's metadata")
    return v


def encode_metadata(md, allow_pickle=False, key_types=None, empty_dicts=None):
    """DCP's Metadata (its storage_data: {MetadataIndex: item}) as JSON bytes; ``key_types``:
    {fqn: the key path with the state's own key types} where DCP's str() changed one;
    ``empty_dicts``: the key paths of empty dicts (DCP's flattening drops them)."""
    sdm = {}
    for fqn, m in md.state_dict_metadata.items():
        if isinstance(m, dmeta.BytesStorageMetadata):
            sdm[fqn] = {"kind": "bytes"}
            continue
        p = m.properties
        sdm[fqn] = {"kind": "tensor", "dtype": str(p.dtype), "layout": str(p.layout),
                    "requires_grad": bool(p.requires_grad),
                    "memory_format": str(p.memory_format), "pin_memory": bool(p.pin_memory),
                    "size": list(m.size),
                    "chunks": [[list(c.offsets), list(c.sizes)] for c in m.chunks]}
    try:
        planner = {"json": _plain(md.planner_data)}
    except TypeError:
        if not allow_pickle:
            raise
        import pickle
        planner = {"pickle": base64.b64encode(pickle.dumps(md.planner_data)).decode()}
    sm = md.storage_meta
    doc = {
        "format": FORMAT,
        "version": md.version,
        "state_dict_metadata": sdm,
        "planner_data": planner,
        "storage_data": [_index_key(k) + [v] for k, v in md.storage_data.items()],
        "storage_meta": None if sm is None else {
            "checkpoint_id": None if sm.checkpoint_id is None else str(sm.checkpoint_id),
            "save_id": sm.save_id, "load_id": sm.load_id, "modules": list(sm.modules)},
    }
    if key_types:
        doc["key_types"] = key_types
    if empty_dicts:
        doc["empty_dicts"] = empty_dicts
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_metadata(blob, allow_pickle=False, key_types=None, empty_dicts=None):
    """The Metadata that encode_metadata wrote; anything else raises ValueError. Its key types
    go into the dict ``key_types`` (fqns already there are kept), its empty dicts' paths into
    the list ``empty_dicts``."""
    try:
        doc = json.loads(blob)
    except ValueError as e:
        raise ValueError("the checkpoint's DCP metadata is not JSON: %s" % e) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError("the checkpoint's DCP metadata is not %r" % FORMAT)
    sdm = {}
    for fqn, m in doc["state_dict_metadata"].items():
        if m.get("kind") == "bytes":
            sdm[fqn] = dmeta.BytesStorageMetadata()
            continue
        props = dmeta.TensorProperties(
            dtype=_dtype(m["dtype"]), layout=_torch_attr(m["layout"], torch.layout),
            requires_grad=bool(m["requires_grad"]),
            memory_format=_torch_attr(m["memory_format"], torch.memory_format),
            pin_memory=bool(m["pin_memory"]))
        chunks = [dmeta.ChunkStorageMetadata(offsets=_ints(o, "offsets"), sizes=_ints(s, "sizes"))
                  for o, s in m["chunks"]]
        sdm[fqn] = dmeta.TensorStorageMetadata(properties=props, size=_ints(m["size"], "size"),
                                               chunks=chunks)
    planner = doc["planner_data"]
    if "pickle" in planner:
        if not allow_pickle:
            raise ValueError("the checkpoint's planner_data was pickled (a custom planner); "
                             "loading it runs code: pass allow_pickle=True to the Reader")
        import pickle
        planner_data = pickle.loads(base64.b64decode(planner["pickle"]))
    else:
        planner_data = _unplain(planner["json"])
    storage = {}
    for row in doc["storage_data"]:
        storage[_index_of(row[:3])] = _Item.check(row[3])
    kt = doc.get("key_types") or {}
    if key_types is not None and isinstance(kt, dict):
        for fqn, path in kt.items():
            if isinstance(path, list) and all(type(k) in (str, int) for k in path):
                key_types.setdefault(fqn, path)
    ed = doc.get("empty_dicts") or []
    if empty_dicts is not None and isinstance(ed, list):
        for path in ed:
            if isinstance(path, list) and path and all(type(k) in (str, int) for k in path) \
                    and path not in empty_dicts:
                empty_dicts.append(path)
    sm = doc.get("storage_meta")
    return dmeta.Metadata(
        state_dict_metadata=sdm, planner_data=planner_data, storage_data=storage,
        storage_meta=None if sm is None else dmeta.StorageMeta(
            checkpoint_id=sm["checkpoint_id"], save_id=sm["save_id"], load_id=sm["load_id"],
            modules=list(sm["modules"])),
        version=doc.get("version"))


class _Item:
    """Where an item lies: [shard rank, offset, length, sha256, dtype or None, sizes or None]."""

    @staticmethod
    def check(v):
        if not (isinstance(v, list) and len(v) == 6 and all(isinstance(x, int) and x >= 0
                                                             for x in v[:3])
                and isinstance(v[3], str) and re.fullmatch(r"[0-9a-f]{64}", v[3])):
            raise ValueError("bad item %r in the checkpoint's metadata" % (v,))
        return v


# ---- the client ----

class _Conn:
    """A Checkpoints client made on first use, or the one given (never pickled: DCP's
    process-based async_save sends the writer to another process)."""

    def __init__(self, address, token, ck=None):
        if ck is not None and address is None:
            address = ck.address
        self.address, self.token, self._ck = address, token, ck

    def get(self):
        if self._ck is None:
            self._ck = Checkpoints(self.address, token=self.token, timeout=60.0)
        return self._ck

    def __getstate__(self):
        return {"address": self.address, "token": self.token, "_ck": None}


def _tensor_bytes(t):
    """The raw bytes of tensor t (its values in row-major order) as a memoryview, on the CPU."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.view(torch.uint8).numpy())


class _Concat(io.RawIOBase):
    """A read-only stream over a list of buffers, one after the other (no copy until read)."""

    def __init__(self, bufs):
        self._bufs, self._i, self._off = bufs, 0, 0

    def readable(self):
        return True

    def readinto(self, dst):
        n = 0
        dst = memoryview(dst).cast("B")
        while n < len(dst) and self._i < len(self._bufs):
            b = self._bufs[self._i]
            k = min(len(dst) - n, len(b) - self._off)
            dst[n:n + k] = b[self._off:self._off + k]
            n += k
            self._off += k
            if self._off == len(b):
                self._i, self._off = self._i + 1, 0
        return n


def _value_bytes(planner, item):
    """A non-tensor item's bytes: the value in sluice's JSON encoding (loads without unpickling)
    when it has one and the planner transforms objects as DCP's default does, else what the
    planner made of it (torch.save's pickle)."""
    lookup = getattr(planner, "lookup_object", None)
    if lookup is not None and getattr(type(planner), "transform_object", None) is \
            DefaultSavePlanner.transform_object:
        blob = encode_value(torch, lookup(item.index))
        if blob is not None:
            return memoryview(blob)
    data = planner.resolve_data(item)
    return memoryview(data.getbuffer() if isinstance(data, io.BytesIO) else bytes(data))


def _load_value(planner, req, b, allow_pickle, where):
    """Hand a non-tensor item to the planner: a sluice value decoded (nothing executed), a
    pickle only if torch's weights_only unpickler takes it or with allow_pickle."""
    if bytes(b[:len(VALUE_MAGIC)]) == VALUE_MAGIC:
        buf = io.BytesIO()
        torch.save(decode_value(torch, b), buf)   # the planner reads torch.save's bytes
        buf.seek(0)
        planner.load_bytes(req, buf)
        return
    if not allow_pickle:
        try:
            torch.load(io.BytesIO(b.tobytes()), weights_only=True)
        except Exception as e:
            raise ValueError("item %s of %s is a pickle of more than plain values: loading it "
                             "runs code, so only with allow_pickle=True on the Reader (a "
                             "checkpoint you trust): %s"
                             % (req.storage_index.fqn, where,
                                str(e).strip().splitlines()[-1][:300] if str(e).strip()
                                else type(e).__name__)) from None
    planner.load_bytes(req, io.BytesIO(b.tobytes()))


def _tensor_name(index):
    name = index.fqn if index.offset is None or not len(index.offset) else "%s@%s" % (
        index.fqn, ",".join(map(str, index.offset)))
    name = "".join(c if " " <= c <= "~" else "?" for c in name)
    return name[:1000] or "?"


def _need_id(storage, call):
    if storage.checkpoint_id is None:
        raise ValueError("no checkpoint id: pass checkpoint_id=\"%sJOB/STEP\" to %s or to the "
                         "%s" % (SCHEME, call, type(storage).__name__))


# ---- one rank's shard without collectives (CheckpointManager) ----

def _host_copies(tensors):
    return [t.detach().to("cpu", copy=True).contiguous() for t in tensors]


class LocalShard:
    """One rank's part of a checkpoint that the ranks save without collectives, as
    CheckpointManager does: DCP's default planner run over this rank's state alone (Stateful
    values through their state_dict(), nested dicts flattened to DCP's keys, a DTensor as its
    local chunk), every tensor it plans copied to host memory at construction by ``stage``
    (a list of tensors -> their copies; the training loop's stall), every other value encoded
    then too. ``build()`` (on a background thread) hashes the items and adds the footer.

    The shard is the items' bytes one after the other, then this rank's DCP metadata (JSON, as
    in the metadata shard of dcp.save, the items' SHA-256 included), its length and
    FOOTER_MAGIC. A Reader merges the footers of all shards: a sharded tensor (FSDP2, DTensor)
    from the chunks of every rank, so that it reshards as with dcp.save; a key that several
    ranks hold whole (DDP's replicated state, a per-rank RNG state) from the loading rank's
    own shard (``prefer_rank``, default its rank modulo the saved world), else the lowest."""

    def __init__(self, state_dict, rank, stage=None, allow_pickle=False):
        if not isinstance(state_dict, dict):
            raise TypeError("a state dict is a dict, not %s" % type(state_dict).__name__)
        sd = {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state_dict.items()}
        planner = DefaultSavePlanner()
        planner.set_up_planner(sd, storage_meta=None, is_coordinator=True)
        plans, self.metadata = planner.create_global_plan([planner.create_local_plan()])
        plan = planner.finish_plan(plans[0])
        self.key_types = _key_types(sd, getattr(planner, "mappings", {}))
        self.empty_dicts = _empty_dicts(sd)
        self.rank = rank
        self.items, tensors, slots = [], [], []
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:
                self.items.append([item.index, _local_value(planner, item, allow_pickle),
                                   None, None])
                continue
            t = planner.resolve_data(item)
            slots.append(len(self.items))
            tensors.append(t)
            self.items.append([item.index, None, str(t.dtype), list(t.shape)])
        self.key = [(t.dtype, tuple(t.shape)) for t in tensors]
        for i, c in zip(slots, (stage or _host_copies)(tensors)):
            self.items[i][1] = c
        self.size = self.layout = self._built = None

    def build(self):
        """(buffers, layout, size): the shard's bytes as buffers in order, the TensorInfo list
        the daemon records (None past its 65536 entries), the total size."""
        bufs, layout, storage, off = [], [], {}, 0
        for index, data, dtype, sizes in self.items:
            b = memoryview(data) if isinstance(data, bytes) else _tensor_bytes(data)
            storage[index] = [self.rank, off, len(b), hashlib.sha256(b).hexdigest(), dtype,
                              sizes]
            bufs.append(b)
            layout.append(pb.TensorInfo(name=_tensor_name(index), dtype="bytes",
                                        shape=[len(b)], offset=off, size=len(b)))
            off += len(b)
        self.metadata.storage_data = storage
        blob = encode_metadata(self.metadata, key_types=self.key_types,
                               empty_dicts=self.empty_dicts)
        footer = blob + struct.pack("<Q", len(blob)) + FOOTER_MAGIC
        layout.append(pb.TensorInfo(name="dcp_metadata", dtype="bytes", shape=[len(footer)],
                                    offset=off, size=len(footer)))
        bufs.append(memoryview(footer))
        self.size = off + len(footer)
        self.layout = layout if len(layout) <= 65536 else None
        self._built = bufs
        return bufs, self.layout, self.size

    def reader(self):
        """A fresh stream over the built shard."""
        return _Concat(self._built)

    def sha256(self):
        h = hashlib.sha256()
        for b in self._built:
            h.update(b)
        return h.hexdigest()


def _key_types(sd, mappings):
    """{fqn: key path} for the fqns whose path in ``sd`` has a key that is not a str (an
    optimizer's int parameter ids): DCP's flattening str()s every dict key."""
    out = {}
    for fqn, path in mappings.items():
        node, typed = sd, []
        for part in path:
            if isinstance(node, dict) and part not in node:
                part = next((k for k in node if str(k) == part), part)
            typed.append(part)
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                break
        if typed != list(path) and all(type(k) in (str, int) for k in typed):
            out[fqn] = typed
    return out


def _empty_dicts(sd, limit=100000):
    """The key paths of the empty dicts in ``sd`` (those of str and int keys)."""
    out, todo = [], [((), sd)]
    while todo and len(out) < limit:
        path, node = todo.pop()
        if isinstance(node, dict):
            if not node and path:
                out.append(list(path))
            todo.extend((path + (k,), v) for k, v in node.items() if type(k) in (str, int))
        elif isinstance(node, list):
            todo.extend((path + (i,), v) for i, v in enumerate(node))
    return out


def retype(state, key_types, empty_dicts=()):
    """``state`` as DCP loaded it without a template (every dict key a str, no empty dict) with
    the saved key types and empty dicts put back (LocalShard's key_types, empty_dicts)."""
    state = _retyped(state, key_types)
    for path in empty_dicts:
        node = state
        for k in path[:-1]:
            if isinstance(node, dict):
                node = node.setdefault(k, {})
            elif isinstance(node, list) and isinstance(k, int) and 0 <= k < len(node):
                node = node[k]
            else:
                break
        else:
            if isinstance(node, dict):
                node.setdefault(path[-1], {})
    return state


def _retyped(state, key_types):
    rename = {}
    for path in key_types.values():
        for i in range(len(path)):
            rename[tuple(str(k) for k in path[:i + 1])] = path[i]
    if not rename:
        return state

    def walk(node, at):
        if isinstance(node, dict):
            return {rename.get(at + (str(k),), k): walk(v, at + (str(k),))
                    for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, at + (str(i),)) for i, v in enumerate(node)]
        return node
    return walk(state, ())


def _local_value(planner, item, allow_pickle):
    """A value's bytes for a LocalShard: sluice's value encoding, else torch.save's pickle if
    torch's weights_only unpickler takes it back (plain tensors in a tuple) or with
    allow_pickle; anything else is a TypeError naming its key."""
    obj = planner.lookup_object(item.index)
    blob = encode_value(torch, obj)
    if blob is not None:
        return blob
    buf = io.BytesIO()
    try:
        torch.save(obj, buf)
    except Exception as e:
        raise TypeError("%s: a %s cannot be saved: %s" % (item.index.fqn, type(obj).__name__,
                                                          e)) from None
    if not allow_pickle:
        try:
            torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
        except Exception:
            raise TypeError("%s: a %s, which loads back only by unpickling it (running code): "
                            "pass allow_pickle=True to save it, and again to restore it"
                            % (item.index.fqn, type(obj).__name__)) from None
    return buf.getvalue()


class NotDcp(ValueError):
    """A COMPLETE checkpoint that is no DCP checkpoint: neither dcp.save's metadata shard nor
    LocalShard footers (the state format of Checkpoints.save_state_dict)."""


def read_footer(ck, job, name, rank, size):
    """The DCP metadata footer of shard ``rank`` (``size`` bytes) of a COMPLETE checkpoint, or
    None if the shard has none (a state-format shard of Checkpoints.save_state_dict)."""
    if size < FOOTER_TAIL:
        return None
    n = min(size, FOOTER_PROBE)
    tail = ck.read_range(job, name, rank, size - n, n)
    if tail[-8:] != FOOTER_MAGIC:
        return None
    (m,) = struct.unpack("<Q", tail[-FOOTER_TAIL:-8])
    if m > size - FOOTER_TAIL:
        raise ValueError("the DCP metadata footer of %s/%s shard %d claims %d bytes, the shard "
                         "has %d" % (job, name, rank, m, size))
    if m + FOOTER_TAIL <= n:
        return tail[n - FOOTER_TAIL - m:n - FOOTER_TAIL]
    return ck.read_range(job, name, rank, size - FOOTER_TAIL - m, m)


def _whole(m):
    if not isinstance(m, dmeta.TensorStorageMetadata) or len(m.chunks) != 1:
        return False
    c = m.chunks[0]
    return not any(c.offsets) and list(c.sizes) == list(m.size)


def merge_metadata(mds, prefer):
    """One Metadata of the footers [(rank, Metadata)] of a checkpoint's shards (LocalShard)."""
    order = sorted(mds, key=lambda x: (x[0] != prefer, x[0]))
    sdm, storage, planner = {}, {}, {}
    for rank, md in order:
        by_fqn = {}
        for idx, info in md.storage_data.items():
            by_fqn.setdefault(idx.fqn, []).append((idx, info))
        for fqn, m in md.state_dict_metadata.items():
            have = sdm.get(fqn)
            if have is None:
                if isinstance(m, dmeta.TensorStorageMetadata):
                    m = dmeta.TensorStorageMetadata(properties=m.properties, size=m.size,
                                                    chunks=list(m.chunks))
                sdm[fqn] = m
                for idx, info in by_fqn.get(fqn, ()):
                    storage[idx] = info
                if md.planner_data and fqn in md.planner_data:
                    planner[fqn] = md.planner_data[fqn]
                continue
            if (not isinstance(have, dmeta.TensorStorageMetadata)
                    or not isinstance(m, dmeta.TensorStorageMetadata) or _whole(have)
                    or _whole(m) or list(have.size) != list(m.size)
                    or have.properties.dtype != m.properties.dtype):
                continue     # held whole by a rank before: that rank's copy
            seen = {tuple(c.offsets) for c in have.chunks}
            for c in m.chunks:
                if tuple(c.offsets) in seen:
                    continue
                seen.add(tuple(c.offsets))
                have.chunks.append(c)
                for idx, info in by_fqn.get(fqn, ()):
                    if idx.offset is not None and tuple(idx.offset) == tuple(c.offsets):
                        storage[idx] = info
    first = order[0][1]
    return dmeta.Metadata(state_dict_metadata=sdm, planner_data=planner, storage_data=storage,
                          storage_meta=first.storage_meta, version=first.version)


def _dcp_format(user_metadata):
    """The dcp.save record in a checkpoint's user_metadata, or None."""
    try:
        doc = json.loads(user_metadata) if user_metadata else None
    except ValueError:
        return None
    if isinstance(doc, dict) and doc.get("format") == FORMAT and isinstance(doc.get("ranks"),
                                                                            int):
        return doc
    return None


class _Target:
    """What the Writer and the Reader share: the checkpoint id, the connection, allow_pickle."""

    def __init__(self, checkpoint_id, address, token, allow_pickle, checkpoints=None):
        self._conn = _Conn(address, token, checkpoints)
        self.allow_pickle = allow_pickle
        self.checkpoint_id = None
        if checkpoint_id is not None:
            self.reset(checkpoint_id)

    def _reset_id(self, checkpoint_id, call):
        if checkpoint_id is not None:
            self.job, self.name, self.step = parse_checkpoint_id(checkpoint_id)
            self.checkpoint_id = str(checkpoint_id)
        else:
            _need_id(self, call)


class Writer(_Target, StorageWriter):
    """DCP StorageWriter into sluiced. ``checkpoint_id``: ``sluice://JOB/STEP`` (or given to
    dcp.save); ``address``: sluiced's (default $SLUICE_ADDR, several comma-separated for
    replicas); ``token``: a bearer token with the trainer role. ``allow_pickle``: store a
    custom planner's planner_data pickled (loading it then needs allow_pickle too)."""

    def __init__(self, checkpoint_id=None, address=None, token=None, allow_pickle=False):
        self.is_coordinator = False
        self.save_id = None
        _Target.__init__(self, checkpoint_id, address, token, allow_pickle)

    def reset(self, checkpoint_id=None):
        self._reset_id(checkpoint_id, "dcp.save")
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        if kwargs.get("use_collectives", True) is False:
            raise ValueError("sluice.torch.dcp needs DCP's collectives (one plan, one commit "
                             "for all ranks): use_collectives=False is not supported")
        self.is_coordinator = is_coordinator

    def storage_meta(self):
        return dmeta.StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        try:
            parse_checkpoint_id(checkpoint_id)
            return True
        except ValueError:
            return False

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        """The coordinator begins the checkpoint: one shard per rank and one for the metadata.
        A step that is COMPLETE already is refused; one left WRITING by a save that was cut
        short is written again."""
        _need_id(self, "dcp.save")
        world = len(plans) + 1
        ck = self._conn.get()
        try:
            got = ck.get(self.job, self.name)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise
            got = None
        if got is not None and got.state == COMPLETE:
            raise ValueError("checkpoint %s/%s (%s) is COMPLETE already: a step is saved once"
                             % (self.job, self.name, self.checkpoint_id))
        if got is not None and got.world_size != world:
            raise ValueError("checkpoint %s/%s is WRITING with %d shards, this save needs %d: "
                             "abort it (sluice ckpt abort) or save another step"
                             % (self.job, self.name, got.world_size, world))
        ck.begin(self.job, self.name, step=self.step, world_size=world, no_feed=True,
                 user_metadata=json.dumps({"format": FORMAT, "ranks": len(plans)}))
        return [dataclasses.replace(p, storage_data=i) for i, p in enumerate(plans)]

    def write_data(self, plan, planner):
        rank = plan.storage_data
        bufs, results, tensors, off = [], [], [], 0
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:
                b = _value_bytes(planner, item)
                dtype = sizes = None
            else:
                data = planner.resolve_data(item)
                b = _tensor_bytes(data)
                dtype, sizes = str(data.dtype), list(data.shape)
            sha = hashlib.sha256(b).hexdigest()
            bufs.append(b)
            tensors.append(pb.TensorInfo(name=_tensor_name(item.index), dtype="bytes",
                                         shape=[len(b)], offset=off, size=len(b)))
            results.append(WriteResult(index=item.index, size_in_bytes=len(b),
                                       storage_data=[rank, off, len(b), sha, dtype, sizes]))
            off += len(b)
        if len(tensors) > 65536:
            tensors = None  # one "data" entry: the daemon lists at most 65536 per shard
        self._conn.get().upload(self.job, self.name, rank, _Concat(bufs), tensors=tensors,
                                size=off)
        fut = torch.futures.Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata, results):
        """Coordinator: the metadata shard, then the commit (COMPLETE once every shard is
        durable)."""
        metadata.storage_data = {wr.index: wr.storage_data for rs in results for wr in rs}
        metadata.storage_meta = self.storage_meta()
        blob = encode_metadata(metadata, self.allow_pickle)
        ck = self._conn.get()
        ck.upload(self.job, self.name, len(results), blob)
        done = ck.commit(self.job, self.name)
        if done.state != COMPLETE:
            raise RuntimeError("checkpoint %s/%s not committed (state %d)"
                               % (self.job, self.name, done.state))


class Reader(_Target, StorageReader):
    """DCP StorageReader from sluiced (the Writer's arguments). The checkpoint must be
    COMPLETE; every item is checked against its SHA-256 before it is used (ChecksumError).
    ``allow_pickle``: also load items pickled with more than plain values (objects of your own
    classes: unpickling them runs code) and a custom planner's pickled planner_data.

    It also reads what the ranks saved without collectives (CheckpointManager: each shard ends
    in its rank's metadata); a key several ranks hold whole comes from shard ``prefer_rank``
    modulo their number (default this process's torch.distributed rank, else 0) if that shard
    has it. ``checkpoints``: an open sluice.checkpoint.Checkpoints to read through."""

    def __init__(self, checkpoint_id=None, address=None, token=None, allow_pickle=False,
                 prefer_rank=None, checkpoints=None):
        self.storage_data = None
        self.load_id = None
        self._preloaded = None
        self.prefer_rank = prefer_rank
        # A LocalShard checkpoint's key paths with their own key types, and its empty dicts.
        self.key_types, self.empty_dicts = {}, []
        _Target.__init__(self, checkpoint_id, address, token, allow_pickle, checkpoints)

    def reset(self, checkpoint_id=None):
        self._reset_id(checkpoint_id, "dcp.load")
        self.storage_data = self._preloaded = None
        self.load_id = uuid.uuid4().hex

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return Writer.validate_checkpoint_id(checkpoint_id)

    def preload(self):
        """Read the metadata now, its errors raised as they are (dcp.load wraps them in a
        CheckpointException); the next read_metadata() returns it."""
        self._preloaded = None
        self._preloaded = self.read_metadata()
        return self._preloaded

    def read_metadata(self, *args, **kwargs):
        md, self._preloaded = self._preloaded, None
        if md is not None:
            return md
        _need_id(self, "dcp.load")
        ck = self._conn.get()
        got = ck.get(self.job, self.name)
        if got.state != COMPLETE:
            raise ValueError("checkpoint %s/%s is %s, not COMPLETE: only committed steps load"
                             % (self.job, self.name, pb.CheckpointState.Name(got.state)))
        if _dcp_format(got.user_metadata) is None:
            md = self._merged_footers(ck, got)
            md.storage_meta = dmeta.StorageMeta(checkpoint_id=self.checkpoint_id,
                                                load_id=self.load_id)
            return md
        meta_rank = got.world_size - 1
        shard = next((s for s in got.shards if s.rank == meta_rank), None)
        size = shard.data_size if shard is not None else None
        if size is None:
            blob = ck.download(self.job, self.name, meta_rank)
        else:
            # A range, so that the daemon checks every block before it sends one (DATA_LOSS).
            blob = ck.read_range(self.job, self.name, meta_rank, 0, size)
            if hashlib.sha256(blob).hexdigest() != shard.sha256:
                raise ChecksumError("the DCP metadata of %s/%s hashes to %s, its record says %s"
                                    % (self.job, self.name, hashlib.sha256(blob).hexdigest(),
                                       shard.sha256))
        md = decode_metadata(blob, self.allow_pickle)
        if md.storage_meta is None:
            md.storage_meta = dmeta.StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md

    def _merged_footers(self, ck, got):
        shards = {s.rank: s for s in got.shards}
        mds = []
        for r in range(got.world_size):
            if r not in shards:
                raise ValueError("checkpoint %s/%s has no shard %d" % (self.job, self.name, r))
            blob = read_footer(ck, self.job, self.name, r, shards[r].data_size)
            if blob is None:
                raise NotDcp("checkpoint %s/%s is not a DCP checkpoint: shard %d has no DCP "
                                 "metadata (saved with Checkpoints.save_state_dict or by an "
                                 "older CheckpointManager: load it with "
                                 "Checkpoints.load_state_dict)" % (self.job, self.name, r))
            mds.append((r, blob))
        prefer = self.prefer_rank
        if prefer is None:
            import torch.distributed as dist
            prefer = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        prefer %= got.world_size
        self.key_types, self.empty_dicts = {}, []
        mds = [(r, decode_metadata(b, self.allow_pickle, self.key_types, self.empty_dicts))
               for r, b in sorted(mds, key=lambda x: (x[0] != prefer, x[0]))]
        return merge_metadata(mds, prefer)

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def _ranges(self, reqs):
        """Items of one shard sorted by offset, grouped into ranges to read at once."""
        items = sorted(((self.storage_data[r.storage_index], r) for r in reqs),
                       key=lambda x: x[0][1])
        group, start, end = [], None, None
        for info, req in items:
            o, n = info[1], info[2]
            if group and (o - end > COALESCE_GAP or o + n - start > RANGE_MAX):
                yield start, end, group
                group = []
            if not group:
                start, end = o, o
            group.append((info, req))
            end = max(end, o + n)
        if group:
            yield start, end, group

    def read_data(self, plan, planner):
        """Every item of the plan, read as ranges of its shard on READ_THREADS threads at once
        (sluiced serves each range on its worker pool; the hashing and copies here release the
        GIL), each item checked against its SHA-256 before its bytes are used. The planner is
        called under one lock."""
        per_rank = {}
        for req in plan.items:
            info = self.storage_data.get(req.storage_index)
            if info is None:
                raise ValueError("the checkpoint has no item %s" % (req.storage_index,))
            per_rank.setdefault(info[0], []).append(req)
        ranges = [(rank,) + r for rank in sorted(per_rank) for r in self._ranges(per_rank[rank])]
        lock = threading.Lock()
        if len(ranges) <= 1 or READ_THREADS <= 1:
            for r in ranges:
                self._read_group(planner, lock, *r)
        else:
            with concurrent.futures.ThreadPoolExecutor(min(READ_THREADS, len(ranges)),
                                                       thread_name_prefix="sluice-dcp-read") as ex:
                for f in [ex.submit(self._read_group, planner, lock, *r) for r in ranges]:
                    f.result()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the copies from pinned buffers are done
        fut = torch.futures.Future()
        fut.set_result(None)
        return fut

    def _read_group(self, planner, lock, rank, start, end, group):
        """One range of rank's shard: each item's bytes go straight into its target tensor when
        that is a whole, contiguous CPU tensor of the stored dtype and shape (DCP's usual load
        without resharding), else into a buffer of their own (pinned for a CUDA target, copied
        without blocking) that is narrowed and copied; values into a bytearray. Each item is
        checked against its SHA-256 before it is committed (a mismatch raises ChecksumError;
        its target then holds the bad bytes, as a failed dcp.load leaves part of a state)."""
        from torch.distributed._shard._utils import narrow_tensor_by_index
        todo, pieces = [], []
        for info, req in group:
            n = info[2]
            if req.type == LoadItemType.BYTE_IO:
                buf = bytearray(n)
                todo.append((info, req, buf, None))
                pieces.append((info[1], n, _address(buf)))
                continue
            with lock:
                target = planner.resolve_tensor(req).detach()
            shape, dtype = tuple(info[5]), _dtype(info[4])
            whole = (list(req.storage_offsets) == [0] * len(shape) and
                     tuple(req.lengths) == shape)
            if (whole and target.device.type == "cpu" and target.dtype == dtype and
                    tuple(target.size()) == shape and target.is_contiguous() and
                    target.numel() * target.element_size() == n):
                todo.append((info, req, None, target))
                pieces.append((info[1], n, target.data_ptr() if n else 0))
                continue
            buf = torch.empty(n, dtype=torch.uint8,
                              pin_memory=target.device.type == "cuda")
            todo.append((info, req, buf, target))
            pieces.append((info[1], n, buf.data_ptr() if n else 0))
        sums = self._conn.get().read_into(self.job, self.name, rank, start, end - start, pieces)
        for (info, req, buf, target), got in zip(todo, sums):
            if got != info[3]:
                raise ChecksumError("item %s of %s/%s rank %d hashes to %s, the metadata says %s"
                                    % (req.storage_index.fqn, self.job, self.name, rank, got,
                                       info[3]))
            if req.type == LoadItemType.BYTE_IO:
                with lock:
                    _load_value(planner, req, memoryview(buf), self.allow_pickle,
                                "%s/%s" % (self.job, self.name))
                continue
            if buf is not None:
                t = buf.view(_dtype(info[4])).reshape(info[5])
                t = narrow_tensor_by_index(t, req.storage_offsets, req.lengths)
                if target.size() != t.size():
                    raise ValueError("item %s: stored %s, the state wants %s"
                                     % (req.storage_index.fqn, tuple(t.size()),
                                        tuple(target.size())))
                target.copy_(t, non_blocking=buf.is_pinned())
            with lock:
                planner.commit_tensor(req, target)


def _address(buf):
    """The address of a bytearray's bytes (0 for an empty one)."""
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)) if len(buf) else 0


# ---- sluice:// ids without an explicit writer or reader ----

def _install():
    """Have dcp.save/async_save/load take sluice:// ids without a storage_writer or
    storage_reader: DCP picks its storage from the id among the ones it knows, so its picker
    learns this one too (on import of this module)."""
    import torch.distributed.checkpoint._storage_utils as su
    import torch.distributed.checkpoint.state_dict_loader as sl
    import torch.distributed.checkpoint.state_dict_saver as ss
    orig = su._storage_setup
    if getattr(orig, "_sluice", False):
        return

    def setup(storage, checkpoint_id, reader=False):
        if not storage and checkpoint_id is not None and str(checkpoint_id).startswith(SCHEME):
            storage = Reader() if reader else Writer()
        return orig(storage, checkpoint_id, reader)
    setup._sluice = True
    for mod in (su, sl, ss):
        if getattr(mod, "_storage_setup", None) is orig:
            mod._storage_setup = setup


_install()
