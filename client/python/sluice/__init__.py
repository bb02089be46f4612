"""sluice: Python client of the sluice coordinator daemon.

The generated gRPC stubs live in ``sluice.v1`` (sluice's own contract) and ``sluice._health``
(grpc.health.v1 from the system's health.proto); the build assembles them next to this file.
"""

__version__ = "0.1.0"
