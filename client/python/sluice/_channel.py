"""Channels and credentials shared by every sluice client class.

Settings come from arguments first, then the same environment variables as the ``sluice`` CLI:
SLUICE_ADDR, SLUICE_TLS_CA, SLUICE_TLS_CERT, SLUICE_TLS_KEY, SLUICE_TOKEN, SLUICE_TOKEN_FILE.
"""
import os

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


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def make_channel(address, tls=None, tls_ca=None, tls_cert=None, tls_key=None):
    """A channel to ``address``: TLS if ``tls`` is true or any TLS file is given (``tls_ca``
    verifies the daemon, default the system roots; ``tls_cert``/``tls_key`` for mTLS)."""
    tls_ca = tls_ca or os.environ.get("SLUICE_TLS_CA")
    tls_cert = tls_cert or os.environ.get("SLUICE_TLS_CERT")
    tls_key = tls_key or os.environ.get("SLUICE_TLS_KEY")
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("tls_cert and tls_key go together")
    if not (tls or tls_ca or tls_cert):
        return grpc.insecure_channel(address, options=OPTIONS)
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read(tls_ca) if tls_ca else None,
        private_key=_read(tls_key) if tls_key else None,
        certificate_chain=_read(tls_cert) if tls_cert else None)
    return grpc.secure_channel(address, creds, options=OPTIONS)


def bearer_metadata(token=None):
    """Call metadata carrying the bearer token (argument, SLUICE_TOKEN, or the first line of
    SLUICE_TOKEN_FILE), or None."""
    if not token:
        token = os.environ.get("SLUICE_TOKEN")
    if not token and os.environ.get("SLUICE_TOKEN_FILE"):
        with open(os.environ["SLUICE_TOKEN_FILE"]) as f:
            token = f.readline().strip()
    return (("authorization", "Bearer " + token),) if token else None
