"""Channels and credentials shared by every sluice client class.

Settings come from arguments first, then the same environment variables as the ``sluice`` CLI:
SLUICE_ADDR, SLUICE_TLS_CA, SLUICE_TLS_CERT, SLUICE_TLS_KEY, SLUICE_TOKEN, SLUICE_TOKEN_FILE.

An address is "host:port" or the replicas' addresses comma-separated ("h1:7700,h2:7700"). With
several, the channel is a ``Replicas``: one gRPC channel per address, calls sent to the current
replica, and a call that ends UNAVAILABLE (replica down or killed, or answering that it cannot
reach the catalog) moves the client on to the next replica. Unary calls are then tried there at
once, each replica at most once per call; a stream that breaks raises as before and is reopened
by its caller (the samplers, downloads, CheckpointManager's uploads), which now reach the next
replica. Why not gRPC's own multi-address channel ("ipv4:a:1,b:2" with pick_first or
round_robin): its balancer only sees connections, so a replica that is up but answers
UNAVAILABLE keeps getting new calls (every call with pick_first, every n-th with round_robin);
running calls fail when their replica dies whatever the policy, so the client reopens and
repeats them itself anyway; and that target takes IP literals only. One address that is a DNS
name with several records stays one gRPC channel: its pick_first policy connects to the first
record that accepts and, when that connection breaks, resolves again and tries them in order.
"""
import os
import threading

import grpc

DEFAULT_ADDR = "127.0.0.1:7700"
# Reconnect soon after the daemon comes back: gRPC's default backoff (1 s, growing by 1.6x to
# 120 s) kept trainers waiting 7-9 s after a 1.5 s restart.
OPTIONS = [("grpc.max_receive_message_length", 64 << 20),
           ("grpc.initial_reconnect_backoff_ms", 100),
           ("grpc.min_reconnect_backoff_ms", 100),
           ("grpc.max_reconnect_backoff_ms", 2000)]


def default_address(address=None):
    return address or os.environ.get("SLUICE_ADDR") or DEFAULT_ADDR


_GRPC_SCHEMES = ("ipv4:", "ipv6:", "unix:", "unix-abstract:", "dns:", "vsock:")


def _check_port(element, address):
    port = None
    if element.startswith("["):
        end = element.find("]")
        if end < 0 or element[end + 1:end + 2] not in ("", ":"):
            raise ValueError("address %r of %r is not [IPv6]:PORT" % (element, address))
        port = element[end + 2:] if element[end + 1:] else None
    elif element.count(":") == 1:
        port = element.split(":", 1)[1]
    if port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError("address %r of %r: port %r is not in [1, 65535]"
                         % (element, address, port))


def split_addresses(address):
    """The addresses of ``address``: "h1:p1,h2:p2" split at the commas (blanks around each
    removed); a gRPC URI ("ipv4:a:1,b:2", "dns:///name:7700") is one address. Raises ValueError
    for an empty element or a port outside [1, 65535]."""
    if not address:
        raise ValueError("the daemon's address is empty")
    if address.startswith(_GRPC_SCHEMES):
        return [address]
    parts = [a.strip() for a in address.split(",")]
    for i, a in enumerate(parts):
        if not a:
            raise ValueError("address list %r: element %d of %d is empty"
                             % (address, i + 1, len(parts)))
        _check_port(a, address)
    return parts


class ReplicasUnavailable(grpc.RpcError):
    """Every replica answered UNAVAILABLE to one call: code() is UNAVAILABLE (so retries with
    backoff treat it as the transient failure it is), details() names the replicas tried."""

    def __init__(self, last, tried):
        super().__init__()
        self.last = last
        self.tried = tried

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "%s (tried %s)" % (self.last.details(), ", ".join(self.tried))

    def __str__(self):
        return "UNAVAILABLE: " + self.details()


def first_replica(count):
    """The replica a client of `count` replicas starts on: its rank (SLUICE_RANK, else torchrun's
    RANK) modulo count, so that one replica's death reaches 1/count of the ranks, not all of
    them at once; 0 without a rank."""
    for name in ("SLUICE_RANK", "RANK"):
        v = os.environ.get(name, "")
        if v.isdigit():
            return int(v) % count if count > 1 else 0
    return 0


def _unavailable(e):
    return isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.UNAVAILABLE


class _Stream:
    """A streaming call on one replica, as grpc returns it (iterate, cancel, ...): an UNAVAILABLE
    end moves the client on to the next replica before it is raised."""

    def __init__(self, replicas, i, call):
        self._replicas, self._i, self._call = replicas, i, call

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self._call)
        except grpc.RpcError as e:
            if _unavailable(e):
                self._replicas.failed(self._i)
            raise

    def __getattr__(self, name):
        return getattr(self._call, name)


class _Method:
    """A multi-callable of a Replicas channel: calls go to the current replica."""

    def __init__(self, replicas, kind, args):
        self._replicas, self._kind, self._args = replicas, kind, args
        self._calls = [None] * replicas.count

    def _on(self, i):
        """The method's multi-callable on replica i's channel (made once)."""
        if self._calls[i] is None:
            self._calls[i] = getattr(self._replicas.channel(i), self._kind)(*self._args[0],
                                                                           **self._args[1])
        return self._calls[i]

    def _unary(self, how, request, timeout=None, **kw):
        """A unary-request call tried on each replica at most once, while they answer
        UNAVAILABLE; each try has the whole `timeout` (a replica that does not answer in time
        ends the call: the call may still run there)."""
        r = self._replicas
        first, tried = r.current(), []
        for k in range(r.count):
            i = (first + k) % r.count
            try:
                return getattr(self._on(i), how)(request, timeout=timeout, **kw)
            except grpc.RpcError as e:
                if not _unavailable(e) or r.count == 1:
                    raise
                r.failed(i)
                tried.append(r.addresses[i])
                last = e
        raise ReplicasUnavailable(last, tried)

    def __call__(self, request, timeout=None, **kw):
        if self._kind == "unary_unary":
            return self._unary("__call__", request, timeout, **kw)
        i = self._replicas.current()
        call = self._on(i)(request, timeout=timeout, **kw)
        if self._kind == "unary_stream":
            return _Stream(self._replicas, i, call)
        return call

    def with_call(self, request, timeout=None, **kw):
        return self._unary("with_call", request, timeout, **kw)

    def future(self, request, timeout=None, **kw):
        """Started on the current replica without failover (the caller waits for it and
        retries a transient failure, which then reaches the next replica)."""
        i = self._replicas.current()
        fut = self._on(i).future(request, timeout=timeout, **kw)

        def done(f):
            if f.exception() is not None and _unavailable(f.exception()):
                self._replicas.failed(i)
        fut.add_done_callback(done)
        return fut

    def _client_stream(self, how, request_iterator, timeout=None, **kw):
        """A stream of requests cannot be sent again: an UNAVAILABLE end moves the client on to
        the next replica and is raised (uploads resume from what the store holds)."""
        i = self._replicas.current()
        try:
            return getattr(self._on(i), how)(request_iterator, timeout=timeout, **kw)
        except grpc.RpcError as e:
            if _unavailable(e):
                self._replicas.failed(i)
            raise


class _ClientStreamMethod(_Method):
    def __call__(self, request_iterator, timeout=None, **kw):
        return self._client_stream("__call__", request_iterator, timeout, **kw)

    def with_call(self, request_iterator, timeout=None, **kw):
        return self._client_stream("with_call", request_iterator, timeout, **kw)

    def future(self, request_iterator, timeout=None, **kw):
        return self._on(self._replicas.current()).future(request_iterator, timeout=timeout,
                                                         **kw)


class Replicas(grpc.Channel):
    """A channel over several replicas of one sluiced catalog (see the module's docstring).
    ``make(address)`` opens the gRPC channel of one address, when it is first used."""

    def __init__(self, addresses, make):
        self.addresses = list(addresses)
        self.count = len(self.addresses)
        self._make = make
        self._channels = [None] * self.count
        self._cur = first_replica(self.count)
        self._lock = threading.Lock()
        self.failovers = 0      # times the client moved on to the next replica

    def channel(self, i):
        with self._lock:
            if self._channels[i] is None:
                self._channels[i] = self._make(self.addresses[i])
            return self._channels[i]

    def current(self):
        """The replica new calls go to."""
        return self._cur

    def failed(self, i):
        """Replica i answered UNAVAILABLE: new calls go to the next one (unless another call
        moved on already)."""
        with self._lock:
            if self._cur == i:
                self._cur = (i + 1) % self.count
                self.failovers += 1

    def unary_unary(self, *a, **kw):
        return _Method(self, "unary_unary", (a, kw))

    def unary_stream(self, *a, **kw):
        return _Method(self, "unary_stream", (a, kw))

    def stream_unary(self, *a, **kw):
        return _ClientStreamMethod(self, "stream_unary", (a, kw))

    def stream_stream(self, *a, **kw):
        return _ClientStreamMethod(self, "stream_stream", (a, kw))

    def subscribe(self, callback, try_to_connect=False):
        self.channel(self.current()).subscribe(callback, try_to_connect)

    def unsubscribe(self, callback):
        for ch in self._channels:
            if ch is not None:
                ch.unsubscribe(callback)

    def close(self):
        with self._lock:
            channels, self._channels = self._channels, [None] * self.count
        for ch in channels:
            if ch is not None:
                ch.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def make_channel(address, tls=None, tls_ca=None, tls_cert=None, tls_key=None):
    """A channel to ``address``: TLS if ``tls`` is true or any TLS file is given (``tls_ca``
    verifies the daemon, default the system roots; ``tls_cert``/``tls_key`` for mTLS). With
    several comma-separated addresses, a Replicas channel over them."""
    addresses = split_addresses(address)
    if len(addresses) > 1:
        return Replicas(addresses, lambda a: _make_one(a, tls, tls_ca, tls_cert, tls_key))
    return _make_one(address, tls, tls_ca, tls_cert, tls_key)


def tls_settings(tls=None, tls_ca=None, tls_cert=None, tls_key=None):
    """(tls, tls_ca, tls_cert, tls_key) with the SLUICE_TLS_* environment filled in: tls is true
    if it was asked for or any file is given. ValueError for a certificate without its key."""
    tls_ca = tls_ca or os.environ.get("SLUICE_TLS_CA")
    tls_cert = tls_cert or os.environ.get("SLUICE_TLS_CERT")
    tls_key = tls_key or os.environ.get("SLUICE_TLS_KEY")
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("tls_cert and tls_key go together")
    return bool(tls or tls_ca or tls_cert), tls_ca, tls_cert, tls_key


def _make_one(address, tls, tls_ca, tls_cert, tls_key):
    tls, tls_ca, tls_cert, tls_key = tls_settings(tls, tls_ca, tls_cert, tls_key)
    if not tls:
        return grpc.insecure_channel(address, options=OPTIONS)
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read(tls_ca) if tls_ca else None,
        private_key=_read(tls_key) if tls_key else None,
        certificate_chain=_read(tls_cert) if tls_cert else None)
    return grpc.secure_channel(address, creds, options=OPTIONS)


def bearer_metadata(token=None):
    """Call metadata carrying the bearer token (argument, SLUICE_TOKEN, or the first line of
    SLUICE_TOKEN_FILE), or None."""
    token = bearer_token(token)
    return (("authorization", "Bearer " + token),) if token else None


def bearer_token(token=None):
    """The bearer token: the argument, SLUICE_TOKEN, or the first line of SLUICE_TOKEN_FILE;
    None if there is none."""
    if not token:
        token = os.environ.get("SLUICE_TOKEN")
    if not token and os.environ.get("SLUICE_TOKEN_FILE"):
        with open(os.environ["SLUICE_TOKEN_FILE"]) as f:
            token = f.readline().strip()
    return token or None
