"""libsluice (the C client) from Python, for the bulk bytes of checkpoint reads: a range of a
shard's data streamed straight into the caller's memory (tensors), each piece hashed as it is
copied, with the GIL released (ctypes drops it for the call). grpcio's Python path copies every
byte three times more and holds the GIL between messages; docs/checkpoints.md has the figures.

The library is found by SLUICE_LIB (a path; "none" turns the native path off), else by the
system's loader (`cmake --install` puts libsluice.so.1 in <prefix>/lib and runs ldconfig). Where
it is missing, or older than this package, or built with a sanitizer, available() is False and
callers take the grpcio path: same bytes, same checks.
"""
import ctypes
import ctypes.util
import os
import threading

import grpc

_SL_OPTS_VERSION = 1


class _Opts(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("timeout_ms", ctypes.c_int64),
                ("tls", ctypes.c_int), ("tls_ca", ctypes.c_char_p),
                ("tls_cert", ctypes.c_char_p), ("tls_key", ctypes.c_char_p),
                ("token", ctypes.c_char_p), ("own_connection", ctypes.c_int)]


class Piece(ctypes.Structure):
    """sl_ckpt_piece: `size` bytes of the shard's data from `offset`, written to address `dst`;
    `sha256` (hex) filled by the read."""
    _fields_ = [("offset", ctypes.c_uint64), ("size", ctypes.c_uint64),
                ("dst", ctypes.c_void_p), ("sha256", ctypes.c_char * 65)]


class NativeError(grpc.RpcError):
    """A failed libsluice call, shaped as grpcio's errors are: code() (a grpc.StatusCode when the
    daemon answered with one, else UNKNOWN) and details() (libsluice's message)."""

    def __init__(self, code, details):
        super().__init__("%s: %s" % (code, details))  # "StatusCode.DATA_LOSS: ...", as grpcio
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


_lock = threading.Lock()
_lib = None          # the CDLL, False once looked for in vain
_clients = {}        # (pid, settings) -> sl_client *


def _load():
    global _lib
    if _lib is not None:
        return _lib
    path = os.environ.get("SLUICE_LIB", "")
    if path.lower() in ("none", "0", "off"):
        _lib = False
        return _lib
    path = path or ctypes.util.find_library("sluice")
    try:
        lib = ctypes.CDLL(path) if path else None
    except OSError:
        lib = None
    if lib is None or not hasattr(lib, "sl_ckpt_read_pieces"):
        _lib = False
        return _lib
    lib.sl_client_connect.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
                                      ctypes.POINTER(_Opts)]
    lib.sl_client_connect.restype = ctypes.c_int
    lib.sl_client_close.argtypes = [ctypes.c_void_p]
    lib.sl_client_close.restype = None
    lib.sl_client_error.argtypes = []
    lib.sl_client_error.restype = ctypes.c_char_p
    lib.sl_strerror.argtypes = [ctypes.c_int]
    lib.sl_strerror.restype = ctypes.c_char_p
    lib.sl_ckpt_read_pieces.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                        ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64,
                                        ctypes.POINTER(Piece), ctypes.c_size_t]
    lib.sl_ckpt_read_pieces.restype = ctypes.c_int
    _lib = lib
    return _lib


def available():
    """Whether libsluice is there to read with."""
    with _lock:
        return bool(_load())


def _error(lib, err):
    """NativeError for libsluice's error `err`; the message it recorded on this thread starts
    with the daemon's status name when the daemon answered ("DATA_LOSS: ...")."""
    msg = (lib.sl_client_error() or b"").decode("utf-8", "replace") or \
        lib.sl_strerror(err).decode()
    name, sep, rest = msg.partition(": ")
    code = getattr(grpc.StatusCode, name, None) if sep and name.isupper() else None
    if isinstance(code, grpc.StatusCode):
        return NativeError(code, rest)
    return NativeError(grpc.StatusCode.UNKNOWN, msg)


def _client(settings):
    """The process's libsluice client for `settings` (address, tls, tls_ca, tls_cert, tls_key,
    token), made on first use: one per process (a client made before a fork is not used after
    it, gRPC does not survive one)."""
    key = (os.getpid(),) + tuple(settings)
    with _lock:
        lib = _load()
        c = _clients.get(key)
        if c is not None:
            return lib, c
        address, tls, ca, cert, key_file, token = settings
        enc = (lambda s: s.encode() if s else None)
        opts = _Opts(version=_SL_OPTS_VERSION, timeout_ms=-1, tls=1 if tls else 0,
                     tls_ca=enc(ca), tls_cert=enc(cert), tls_key=enc(key_file),
                     token=enc(token), own_connection=0)
        c = ctypes.c_void_p()
        err = lib.sl_client_connect(ctypes.byref(c), address.encode(), ctypes.byref(opts))
        if err:
            raise _error(lib, err)
        _clients[key] = c
        return lib, c


def read_pieces(settings, job, name, rank, offset, length, pieces):
    """Data bytes [offset, offset + length) of rank's shard into `pieces` (a ctypes array of
    Piece, sorted by offset, inside the range, none overlapping); returns their hex SHA-256s.
    Raises NativeError as grpcio would (DATA_LOSS for a damaged block, NOT_FOUND, ...)."""
    lib, c = _client(settings)
    err = lib.sl_ckpt_read_pieces(c, job.encode(), name.encode(), rank, offset, length,
                                  pieces, len(pieces))
    if err:
        raise _error(lib, err)
    return [p.sha256.decode() for p in pieces]
