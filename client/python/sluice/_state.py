"""Training state in a shard (private to the sluice package): the skeleton format of
save_state_dict/load_state_dict, encoding a state dict into a shard's parts and reading one back
from a download stream. sluice.checkpoint is the API; this module has no gRPC.
"""
import base64
import binascii
import hashlib
import io
import json
import math
import pickle
import re
import struct
from collections import OrderedDict

from sluice.v1 import checkpoint_pb2 as pb

CHUNK = 1 << 20


class ChecksumError(Exception):
    """The data does not hash to what the other side says."""


class _Chain(io.RawIOBase):
    """A read-only stream over byte strings (or memoryviews) produced one at a time: one
    tensor's chunks at a time, never the whole shard."""

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


# ---- state dicts: the skeleton ----
#
# save_state_dict writes a shard whose data section is
#
#     [skeleton entry][tensor 0][tensor 1]...      each non-empty tensor at a multiple of 64
#                                                  bytes (zeros between), in the order of
#                                                  the table below
#
# The skeleton entry (TensorInfo name SKELETON_NAME, dtype "bytes", offset 0) is SKELETON_MAGIC,
# the length of a JSON text as a little-endian u64, the JSON text (ASCII) and zero bytes up to a
# multiple of 64. The JSON is {"format": "sluice.state_dict", "version": 1, "tensors": [[dtype,
# shape, offset], ...], "root": node}, tensor offsets counting from the end of the skeleton entry,
# and a node is one of
#
#     null, true, false, a string, an integer, a finite float (written so that it reads back
#     bit for bit)                                        the value itself
#     ["l", node...]  ["t", node...]                      list, tuple
#     ["d", key, node, key, node...]  ["o", ...]          dict, OrderedDict (keys are nodes of
#                                                         None/bool/int/float/str/tuple)
#     ["T", i]                                            the tensor tensors[i]
#     ["f", "nan"|"inf"|"-inf"]  ["i", "0x..."]           other floats, integers beyond 63 bits
#     ["b", base64]  ["ba", base64]                       bytes, bytearray
#     ["dt", "float32"]  ["sz", 2, 3]  ["dev", "cuda:0"]  torch.dtype, torch.Size, torch.device
#     ["s", node...]  ["fs", node...]                     set, frozenset
#     ["c", float-node, float-node]                       complex (real, imaginary)
#     ["na", "<u4", [624], base64]                        numpy.ndarray (dtype.str, shape, bytes
#                                                         in C order; not object or structured)
#     ["ns", "<f8", base64]                               a numpy scalar (numpy.float64(0.5))
#     ["P", "module.qualname", base64]                    any other object, pickled; only with
#                                                         allow_pickle (saving and loading)
#
# Loading parses this with json and builds only these types: nothing in a shard is executed,
# unless the caller passes allow_pickle=True and the shard holds "P" nodes.
# Every tensor is referenced exactly once; tensors sharing storage are stored as separate copies.
# The TensorInfo of a tensor (its key path, escaped to printable ASCII and cut to 1024
# characters; dtype "bytes" for dtypes the daemon does not know) is for people and tools only:
# loading reads the skeleton. A shard without SKELETON_MAGIC at offset 0 is of the earlier flat
# format (a flat dict's tensors back to back, no skeleton) and needs a template to be read.

SKELETON_NAME = "__sluice_skeleton__"
SKELETON_MAGIC = b"SLUICESD"
_FORMAT, _VERSION = "sluice.state_dict", 1
_ALIGN = 64
# The dtypes the daemon knows (server/ckpt/validate.c); other dtypes are described as "bytes".
_DAEMON_DTYPES = frozenset(
    "float64 float32 float16 bfloat16 float8_e4m3fn float8_e5m2 complex128 complex64 int64 int32 "
    "int16 int8 uint64 uint32 uint16 uint8 bool".split())
_MAX_DIMS, _MAX_TENSORS, _MAX_NAME = 32, 65536, 1024
# A skeleton's caps, checked by saving and loading alike, so that a hostile shard costs the
# loading rank a bounded amount of memory before it is refused: its JSON text, and its JSON
# values (counted before parsing, from its ',', '[' and '{': each value but the first of a list
# or object follows one of them). A legitimate skeleton of 65,535 tensors holds about 700,000
# values; large arrays and lists belong in tensors.
_MAX_SKELETON, _MAX_SKELETON_VALUES = 32 << 20, 1 << 20
_MAX_BYTES = (1 << 63) - 1
_FLOAT_WORDS = {"nan", "inf", "-inf"}
_INT_HEX = re.compile(r"-?0x[0-9a-f]{1,100000}\Z")
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]")


def _skeleton_values(text):
    """An upper bound on the JSON values in `text` (bytes), without parsing it."""
    return text.count(b",") + text.count(b"[") + text.count(b"{") + 1


def _shape_problem(shape, itemsize=1):
    """Why `shape` (a list) is no shape of an array that can exist, or None: at most 64
    dimensions, each an int in [0, 2^63), and at most 2^63 - 1 bytes counting every dimension
    as at least 1 (a zero next to a huge dimension is refused as well: the array libraries fail
    on it with TypeError or OverflowError instead of making an empty array)."""
    if type(shape) is not list or len(shape) > 64:
        return "is not a list of at most 64 dimensions"
    n = itemsize
    for d in shape:
        if type(d) is not int or not 0 <= d <= _MAX_BYTES:
            return "has a dimension that is not an integer in [0, 2^63)"
        n *= max(d, 1)
        if n > _MAX_BYTES:
            return "%s of %d-byte items would be over 2^63 bytes" % (shape[:8], itemsize)
    return None


def _align(n):
    return -(-n // _ALIGN) * _ALIGN


def _dtypes(torch):
    """name -> torch.dtype for every dtype of this torch, e.g. "float32"."""
    return {str(d)[len("torch."):]: d for d in vars(torch).values() if isinstance(d, torch.dtype)}


def _data_dtypes(torch):
    """name -> torch.dtype for the dtypes a tensor's bytes fully describe (all but the quantized
    ones, whose scale and zero point live outside the data)."""
    return {k: d for k, d in _dtypes(torch).items() if not k.startswith("q")}


def _path_str(path):
    return ".".join(path) if path else "<root>"


def _info_name(path):
    """A TensorInfo name for a key path: printable ASCII (other characters escaped), at most
    1024 characters. Only for display: loading uses the skeleton."""
    s = _path_str(path).encode("ascii", "backslashreplace").decode("ascii")
    s = _UNPRINTABLE.sub(lambda m: "\\x%02x" % ord(m.group()), s)
    return s if len(s) <= _MAX_NAME else s[:_MAX_NAME - 3] + "..."


def _key_part(k):
    return k if type(k) is str else repr(k)


def _numpy():
    import numpy
    return numpy


def _numpy_plain(v):
    """True for a numpy array or scalar whose bytes describe it fully (not object, structured
    or void dtypes, which go through pickle). Never imports numpy for other values."""
    mod = type(v).__module__
    if mod != "numpy" and not mod.startswith("numpy."):
        return False
    np = _numpy()
    if not isinstance(v, (np.ndarray, np.generic)) or type(v) is np.matrix:
        return False
    if isinstance(v, np.ndarray) and type(v) is not np.ndarray:
        return False                      # subclasses (masked arrays, ...) keep more than bytes
    return not (v.dtype.hasobject or v.dtype.fields is not None or v.dtype.kind == "V")


def _numpy_scalar(v):
    return _numpy_plain(v) and not isinstance(v, _numpy().ndarray)


class _Encoder:
    """Turns a state dict into a skeleton node and the list of its tensors (in order)."""

    def __init__(self, torch, allow_pickle=False):
        self.torch = torch
        self.allow_pickle = allow_pickle
        self.tensors = []      # (path, tensor)
        self._open = set()     # ids of the containers being encoded (cycle check)

    def key(self, k, path):
        t = type(k)
        if k is None or t is bool or t is str or t is int or t is float or t is complex:
            return self.node(k, path)
        if t is tuple or t is frozenset:
            return ["t" if t is tuple else "fs"] + [self.key(x, path) for x in k]
        if _numpy_scalar(k):
            return self.node(k, path)
        raise TypeError("%s: cannot save a dict key or set item of type %s (they may be str, "
                        "int, float, complex, bool, None, numpy scalars or tuples and frozensets "
                        "of those)"
                        % (_path_str(path), t.__name__))

    @staticmethod
    def _float(v):
        return v if math.isfinite(v) else ["f", repr(v)]

    def node(self, v, path):
        torch, t = self.torch, type(v)
        if v is None or t is bool or t is str:
            return v
        if t is int:
            return v if v.bit_length() <= 63 else ["i", hex(v)]
        if t is float:
            return self._float(v)
        if t is complex:
            return ["c", self._float(v.real), self._float(v.imag)]
        if isinstance(v, torch.Tensor):
            self.tensor(v, path)
            return ["T", len(self.tensors) - 1]
        if t is dict or t is OrderedDict or t is list or t is tuple:
            if id(v) in self._open:
                raise ValueError("%s: the state refers to itself" % _path_str(path))
            self._open.add(id(v))
            try:
                if t is list or t is tuple:
                    return ["l" if t is list else "t"] + [self.node(x, path + [str(i)])
                                                          for i, x in enumerate(v)]
                out = ["d" if t is dict else "o"]
                for k, x in v.items():
                    out.append(self.key(k, path))
                    out.append(self.node(x, path + [_key_part(k)]))
                return out
            finally:
                self._open.discard(id(v))
        if t is bytes or t is bytearray:
            return ["b" if t is bytes else "ba", base64.b64encode(v).decode("ascii")]
        if t is torch.dtype:
            return ["dt", str(v)[len("torch."):]]
        if t is torch.Size:
            return ["sz"] + list(v)
        if t is torch.device:
            return ["dev", str(v)]
        if t is set or t is frozenset:
            return ["s" if t is set else "fs"] + [self.key(x, path) for x in v]
        if _numpy_plain(v):
            data = base64.b64encode(v.tobytes(order="C")).decode("ascii")
            if isinstance(v, _numpy().ndarray):
                return ["na", v.dtype.str, list(v.shape), data]
            return ["ns", v.dtype.str, data]
        if self.allow_pickle:
            try:
                data = pickle.dumps(v, protocol=4)
            except Exception as e:
                raise TypeError("%s: cannot pickle a value of type %s.%s: %s"
                                % (_path_str(path), t.__module__, t.__qualname__, e)) from None
            return ["P", "%s.%s" % (t.__module__, t.__qualname__),
                    base64.b64encode(data).decode("ascii")]
        raise TypeError("%s: cannot save a value of type %s.%s (supported: tensors, dict, "
                        "OrderedDict, list, tuple, set, frozenset, str, int, float, complex, "
                        "bool, None, bytes, bytearray, numpy arrays and scalars, torch.dtype, "
                        "torch.Size, torch.device; anything else torch.save takes with "
                        "allow_pickle=True)" % (_path_str(path), t.__module__, t.__qualname__))

    def tensor(self, v, path):
        torch = self.torch
        if v.layout != torch.strided:
            raise TypeError("%s: cannot save a tensor with layout %s (only dense tensors)"
                            % (_path_str(path), v.layout))
        if v.is_quantized:
            raise TypeError("%s: cannot save a quantized tensor" % _path_str(path))
        if v.device.type == "meta":
            raise TypeError("%s: a tensor on the meta device has no data" % _path_str(path))
        self.tensors.append((path, v))


class _Decoder:
    """Builds the state from a skeleton node; every malformed node is a ValueError."""

    def __init__(self, torch, tensors, allow_pickle=False):
        self.torch = torch
        self.tensors = tensors
        self.allow_pickle = allow_pickle
        self.used = set()
        self.dtypes = _dtypes(torch)

    def _bad(self, path, what):
        return ValueError("bad state skeleton at %s: %s" % (_path_str(path), what))

    def key(self, n, path):
        if n is None or type(n) in (bool, str, int, float):
            return n
        if type(n) is list and n and n[0] in ("t", "fs", "f", "i", "c", "ns"):
            if n[0] in ("t", "fs"):
                return (tuple if n[0] == "t" else frozenset)(self.key(x, path) for x in n[1:])
            return self.node(n, path)
        raise self._bad(path, "a dict key or set item must be a scalar, a tuple or a frozenset")

    def _float(self, n, path):
        if type(n) is float or type(n) is int:
            return float(n)
        if type(n) is list and len(n) == 2 and n[0] == "f" and n[1] in _FLOAT_WORDS:
            return float(n[1])
        raise self._bad(path, "a complex number's parts must be floats")

    def _numpy_dtype(self, code, path):
        np = _numpy()
        try:
            dt = np.dtype(code) if type(code) is str and len(code) <= 32 else None
        except TypeError:
            dt = None
        if dt is None or dt.hasobject or dt.fields is not None or dt.kind == "V":
            raise self._bad(path, "bad numpy dtype %r" % (str(code)[:32],))
        return dt

    def _b64(self, one, path):
        try:
            return base64.b64decode(one.encode("ascii"), validate=True)
        except (ValueError, binascii.Error, AttributeError):
            raise self._bad(path, "bad base64") from None

    def node(self, n, path):
        t = type(n)
        if n is None or t is bool or t is str or t is int or t is float:
            return n
        if t is not list or not n or type(n[0]) is not str:
            raise self._bad(path, "unexpected %s" % t.__name__)
        tag, a = n[0], n[1:]
        if tag == "l":
            return [self.node(x, path + [str(i)]) for i, x in enumerate(a)]
        if tag == "t":
            return tuple(self.node(x, path + [str(i)]) for i, x in enumerate(a))
        if tag in ("d", "o"):
            if len(a) % 2:
                raise self._bad(path, "a dict with an odd number of items")
            out = {} if tag == "d" else OrderedDict()
            for i in range(0, len(a), 2):
                k = self.key(a[i], path)
                if k in out:
                    raise self._bad(path, "duplicate key %r" % (k,))
                out[k] = self.node(a[i + 1], path + [_key_part(k)])
            return out
        one = a[0] if len(a) == 1 else None
        if tag == "T" and type(one) is int:
            if not 0 <= one < len(self.tensors) or one in self.used:
                raise self._bad(path, "tensor reference %d (the shard has %d tensors)"
                                % (one, len(self.tensors)))
            self.used.add(one)
            return self.tensors[one]
        if tag == "f" and one in _FLOAT_WORDS:
            return float(one)
        if tag == "i" and type(one) is str and _INT_HEX.match(one):
            return int(one, 16)
        if tag in ("b", "ba") and type(one) is str:
            b = self._b64(one, path)
            return b if tag == "b" else bytearray(b)
        if tag in ("s", "fs"):
            try:
                return (set if tag == "s" else frozenset)(self.key(x, path) for x in a)
            except TypeError:
                raise self._bad(path, "a set item that cannot be hashed") from None
        if tag == "c" and len(a) == 2:
            return complex(self._float(a[0], path), self._float(a[1], path))
        if tag == "ns" and len(a) == 2 and type(a[1]) is str:
            dt, b = self._numpy_dtype(a[0], path), self._b64(a[1], path)
            if len(b) != dt.itemsize:
                raise self._bad(path, "a numpy %s scalar of %d bytes" % (dt, len(b)))
            return _numpy().frombuffer(b, dtype=dt)[0]
        if (tag == "na" and len(a) == 3 and type(a[1]) is list and len(a[1]) <= 64
                and all(type(x) is int and x >= 0 for x in a[1]) and type(a[2]) is str):
            dt = self._numpy_dtype(a[0], path)
            why = _shape_problem(a[1], dt.itemsize)
            if why:
                raise self._bad(path, "a numpy array's shape " + why)
            b = self._b64(a[2], path)
            if len(b) != math.prod(a[1]) * dt.itemsize:
                raise self._bad(path, "a numpy array of shape %s and dtype %s in %d bytes"
                                % (a[1], dt, len(b)))
            try:
                return _numpy().frombuffer(bytearray(b), dtype=dt).reshape(a[1])
            except (ValueError, TypeError, OverflowError) as e:
                raise self._bad(path, "a numpy array of shape %s: %s" % (a[1][:8], e)) from None
        if tag == "P" and len(a) == 2 and type(a[0]) is str and type(a[1]) is str:
            if not self.allow_pickle:
                raise ValueError("%s: the state holds a pickled %s, which only "
                                 "allow_pickle=True loads (unpickling runs code from the "
                                 "checkpoint: only for checkpoints you trust)"
                                 % (_path_str(path), a[0][:200]))
            try:
                return pickle.loads(self._b64(a[1], path))
            except Exception as e:
                raise ValueError("%s: unpickling a %s failed: %s: %s"
                                 % (_path_str(path), a[0][:200], type(e).__name__, e)) from None
        if tag == "dt" and type(one) is str and one in self.dtypes:
            return self.dtypes[one]
        if tag == "sz" and _shape_problem(a) is None:
            return self.torch.Size(a)
        if tag == "dev" and type(one) is str:
            try:
                return self.torch.device(one)
            except (RuntimeError, ValueError):
                raise self._bad(path, "bad device %r" % one[:64]) from None
        raise self._bad(path, "bad node %r" % (json.dumps(n)[:80],))


def _check_template(got, want, path, torch):
    """ValueError unless `got` has `want`'s structure: container types (dict and OrderedDict
    count as one), keys, and the dtype and shape of each tensor of `want`. Other values are not
    compared."""
    where = _path_str(path)
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            raise ValueError("%s: the template has a tensor, the shard a %s"
                             % (where, type(got).__name__))
        if got.dtype != want.dtype or got.shape != want.shape:
            raise ValueError("%s: the shard has %s %s, the template %s %s" % (
                where, got.dtype, list(got.shape), want.dtype, list(want.shape)))
        return
    if type(want) in (dict, OrderedDict, list, tuple) or type(got) in (dict, OrderedDict, list,
                                                                          tuple):
        kind = {OrderedDict: dict}
        if kind.get(type(got), type(got)) is not kind.get(type(want), type(want)):
            raise ValueError("%s: the shard has a %s, the template a %s"
                             % (where, type(got).__name__, type(want).__name__))
        if type(want) in (list, tuple):
            if len(got) != len(want):
                raise ValueError("%s: the shard has %d items, the template %d"
                                 % (where, len(got), len(want)))
            for i, (g, w) in enumerate(zip(got, want)):
                _check_template(g, w, path + [str(i)], torch)
            return
        if set(got) != set(want):
            extra, missing = set(got) - set(want), set(want) - set(got)
            raise ValueError("%s: keys differ from the template (only in the shard: %s; only in "
                             "the template: %s)" % (where, sorted(map(repr, extra))[:5],
                                                    sorted(map(repr, missing))[:5]))
        for k, w in want.items():
            _check_template(got[k], w, path + [_key_part(k)], torch)


def encode_state(torch, state_dict, allow_pickle=False):
    """(skeleton root, [(key path, tensor)]) of a state dict: the structure and its non-tensor
    values (copied: JSON-ready nodes; objects of other types pickled with allow_pickle) and the
    tensors themselves (not copied). TypeError names the key path of a value that cannot be
    saved; ValueError for too many tensors or nesting."""
    enc = _Encoder(torch, allow_pickle)
    try:
        root = enc.node(state_dict, [])
    except RecursionError:
        raise ValueError("the state is nested too deeply to save") from None
    if len(enc.tensors) + 1 > _MAX_TENSORS:
        raise ValueError("%d tensors: a shard holds at most %d (one is the skeleton)"
                         % (len(enc.tensors), _MAX_TENSORS - 1))
    return root, enc.tensors


# ---- one value without tensors: sluice.torch.dcp's items of non-tensor values ----
#
# VALUE_MAGIC, then the JSON text (ASCII) {"format": "sluice.value", "version": 1, "root": node}
# with the skeleton's nodes, never "T" (a value holding tensors stays torch.save's) nor "P"; or,
# for an io.BytesIO (DCP's raw bytes), {"format": ..., "version": 1, "bytesio": base64}.

VALUE_MAGIC = b"SLUICEV1"
_VALUE_FORMAT = "sluice.value"


def encode_value(torch, obj):
    """obj as VALUE_MAGIC + JSON, or None when the skeleton cannot hold it without pickle or
    tensors (the caller then keeps torch.save's bytes). An io.BytesIO (DCP's raw-bytes value)
    is {"bytesio": base64} in place of a root."""
    if type(obj) is io.BytesIO:
        data = obj.getvalue()
        if len(data) > _MAX_SKELETON // 2:
            return None
        return VALUE_MAGIC + json.dumps({"format": _VALUE_FORMAT, "version": _VERSION,
                                         "bytesio": base64.b64encode(data).decode()},
                                        separators=(",", ":")).encode("ascii")
    enc = _Encoder(torch, False)
    try:
        root = enc.node(obj, [])
    except (TypeError, ValueError, RecursionError):
        return None
    if enc.tensors:
        return None
    text = json.dumps({"format": _VALUE_FORMAT, "version": _VERSION, "root": root},
                      separators=(",", ":"), ensure_ascii=True).encode("ascii")
    if len(text) > _MAX_SKELETON:
        return None
    return VALUE_MAGIC + text


def decode_value(torch, blob):
    """The value encode_value wrote; ValueError for anything else (nothing is executed)."""
    blob = bytes(blob)
    if not blob.startswith(VALUE_MAGIC):
        raise ValueError("not a sluice value")
    text = blob[len(VALUE_MAGIC):]
    if len(text) > _MAX_SKELETON or _skeleton_values(text) > _MAX_SKELETON_VALUES:
        raise ValueError("a sluice value of %d bytes is over the caps" % len(text))
    try:
        doc = json.loads(text.decode("ascii"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError("a sluice value is not valid JSON: %s" % e) from None
    if type(doc) is not dict or doc.get("format") != _VALUE_FORMAT or \
            doc.get("version") != _VERSION or ("root" in doc) == ("bytesio" in doc):
        raise ValueError("not a %s document of version %d" % (_VALUE_FORMAT, _VERSION))
    if "bytesio" in doc:
        try:
            return io.BytesIO(base64.b64decode(doc["bytesio"], validate=True))
        except (TypeError, binascii.Error) as e:
            raise ValueError("a sluice value's bytes are not base64: %s" % e) from None
    try:
        return _Decoder(torch, [], False).node(doc["root"], [])
    except RecursionError:
        raise ValueError("a sluice value is nested too deeply") from None


class _StateShard:
    """The data section of a save_state_dict shard laid out from an encoded state: the
    skeleton entry, each tensor's offset, the TensorInfo list (``layout``), the total ``size``,
    and the bytes, produced a chunk at a time straight from the tensors' memory."""

    def __init__(self, torch, root, tensors, chunk_size=CHUNK):
        self.torch = torch
        self.chunk_size = chunk_size
        self.entries, table, rel = [], [], 0   # (path, tensor, offset after skeleton, size)
        for path, t in tensors:
            size = t.numel() * t.element_size()
            if size:
                rel = _align(rel)
            table.append([str(t.dtype)[len("torch."):], list(t.shape), rel])
            self.entries.append((path, t, rel, size))
            rel += size
        doc = {"format": _FORMAT, "version": _VERSION, "tensors": table, "root": root}
        try:
            text = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode("ascii")
        except RecursionError:
            raise ValueError("the state is nested too deeply to save") from None
        if len(text) > _MAX_SKELETON or _skeleton_values(text) > _MAX_SKELETON_VALUES:
            raise ValueError(
                "the state's skeleton (its structure and non-tensor values) is %d bytes with "
                "about %d values: a shard's holds at most %d bytes and %d values (loading refuses "
                "more); store large arrays and lists as tensors"
                % (len(text), _skeleton_values(text), _MAX_SKELETON, _MAX_SKELETON_VALUES))
        head = SKELETON_MAGIC + struct.pack("<Q", len(text))
        skel_size = _align(len(head) + len(text))
        self.skeleton = head + text + bytes(skel_size - len(head) - len(text))
        self.layout = [pb.TensorInfo(name=SKELETON_NAME, dtype="bytes", shape=[skel_size],
                                     offset=0, size=skel_size)]
        for (path, t, off, size), (dtype, shape, _) in zip(self.entries, table):
            if dtype not in _DAEMON_DTYPES or len(shape) > _MAX_DIMS:
                dtype, shape = "bytes", [size]
            self.layout.append(pb.TensorInfo(name=_info_name(path), dtype=dtype, shape=shape,
                                             offset=skel_size + off, size=size))
        self.size = skel_size + rel

    def parts(self):
        """The data section's bytes in order (bytes and memoryviews of at most chunk_size)."""
        torch, chunk = self.torch, self.chunk_size
        yield self.skeleton
        pos = 0
        for path, t, off, size in self.entries:
            if off > pos:
                yield bytes(off - pos)
            pos = off + size
            if not size:
                continue
            c = t.detach()
            if c.device.type != "cpu":
                c = c.to("cpu")
            c = c.resolve_conj().resolve_neg().contiguous()
            view = _byte_view(torch, c)
            if len(view) != size:
                raise ValueError("%s changed size while it was saved" % _path_str(path))
            for i in range(0, size, chunk):
                yield view[i:i + chunk]

    def sha256(self):
        sha = hashlib.sha256()
        for p in self.parts():
            sha.update(p)
        return sha.hexdigest()

    def reader(self):
        """A binary file object reading the data section from its start."""
        return io.BufferedReader(_Chain(self.parts()), self.chunk_size)


def _byte_view(torch, t):
    """A uint8 memoryview over a contiguous CPU tensor's bytes (no copy)."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def _read_skeleton_shard(s, torch, template, allow_pickle=False):
    """The state of a save_state_dict shard from the stream `s` (positioned at its start)."""
    size = s.announced()
    head = s.read(len(SKELETON_MAGIC) + 8)
    (n,) = struct.unpack("<Q", head[len(SKELETON_MAGIC):])
    skel_size = _align(len(head) + n)
    if skel_size > size:
        raise ValueError("the state skeleton claims %d bytes, the shard holds %d" % (n, size))
    if n > _MAX_SKELETON:
        raise ValueError("the state skeleton claims %d bytes: a skeleton holds at most %d"
                         % (n, _MAX_SKELETON))
    text = s.read(n)
    values = _skeleton_values(text)
    if values > _MAX_SKELETON_VALUES:
        raise ValueError("the state skeleton holds up to %d JSON values: a skeleton holds at "
                         "most %d" % (values, _MAX_SKELETON_VALUES))
    try:
        doc = json.loads(text.decode("ascii"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError("the state skeleton is not valid JSON: %s" % e) from None
    except RecursionError:
        raise ValueError("the state skeleton is nested too deeply") from None
    if type(doc) is not dict or doc.get("format") != _FORMAT:
        raise ValueError("the state skeleton is not a %s document" % _FORMAT)
    if doc.get("version") != _VERSION:
        raise ValueError("state skeleton version %r: this client reads version %d"
                         % (doc.get("version"), _VERSION))
    table = doc.get("tensors")
    if type(table) is not list or "root" not in doc:
        raise ValueError("the state skeleton has no tensor table or no root")
    if len(table) > _MAX_TENSORS - 1:
        raise ValueError("the state skeleton lists %d tensors: a shard holds at most %d"
                         % (len(table), _MAX_TENSORS - 1))
    dtypes, itemsizes = _data_dtypes(torch), {}
    tensors, spans, end = [], [], skel_size
    for i, e in enumerate(table):
        if not (type(e) is list and len(e) == 3 and type(e[0]) is str and type(e[1]) is list
                and len(e[1]) <= 64 and all(type(d) is int and d >= 0 for d in e[1])
                and type(e[2]) is int and e[2] >= 0):
            raise ValueError("state skeleton: tensor %d is not [dtype, shape, offset]" % i)
        if e[0] not in dtypes:
            raise ValueError("state skeleton: tensor %d has an unknown dtype %r" % (i, e[0][:32]))
        dtype = dtypes[e[0]]
        if dtype not in itemsizes:
            itemsizes[dtype] = torch.empty(0, dtype=dtype).element_size()
        nbytes = math.prod(e[1]) * itemsizes[dtype]
        off = skel_size + e[2]
        if off + nbytes > size:
            raise ValueError("state skeleton: tensor %d (bytes %d..%d) lies beyond the shard's "
                             "%d bytes" % (i, off, off + nbytes, size))
        if nbytes and off < end:
            raise ValueError("state skeleton: tensor %d overlaps the data before it" % i)
        why = _shape_problem(e[1], itemsizes[dtype])
        if why:
            raise ValueError("state skeleton: tensor %d: its shape %s" % (i, why))
        try:
            tensors.append(torch.empty(e[1], dtype=dtype))
        except (RuntimeError, TypeError, ValueError, OverflowError) as x:
            raise ValueError("state skeleton: tensor %d: %s" % (i, x)) from None
        if nbytes:
            spans.append((off, nbytes, tensors[-1]))
            end = off + nbytes
    dec = _Decoder(torch, tensors, allow_pickle)
    try:
        state = dec.node(doc["root"], [])
    except RecursionError:
        raise ValueError("the state skeleton is nested too deeply") from None
    if len(dec.used) != len(tensors):
        raise ValueError("state skeleton: %d of its %d tensors are not referenced"
                         % (len(tensors) - len(dec.used), len(tensors)))
    if template is not None:
        _check_template(state, template, [], torch)
    s.skip(skel_size - s.pos)
    for off, nbytes, t in spans:
        s.skip(off - s.pos)
        s.readinto(_byte_view(torch, t))
    return state


def _read_flat_shard(s, torch, template):
    """A shard of the earlier flat format: the template's tensors back to back."""
    size = s.announced()
    out, need = {}, 0
    for key, t in template.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError("%s: a flat shard's template holds only tensors, not %s"
                             % (key, type(t).__name__))
        need += t.numel() * t.element_size()
    if need != size:
        raise ValueError("the shard holds %d bytes, the template %d" % (size, need))
    for key, t in template.items():
        out[key] = torch.empty(t.shape, dtype=t.dtype)
        if t.numel():
            s.readinto(_byte_view(torch, out[key]))
    return out
