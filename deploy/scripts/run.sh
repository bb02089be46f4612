#!/usr/bin/env bash
# Build sluice, install it (binaries to $PREFIX/bin, default /usr/local) and run sluiced in the
# foreground with its embedded defaults: gRPC on 127.0.0.1:7700, catalog and shard store in
# ./sluice-data. Extra arguments go to sluiced (see sluiced --help).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
prefix="${PREFIX:-/usr/local}"
"$root/deploy/scripts/deps.sh"
"$root/deploy/scripts/build.sh" "$root/build/release"
cmake --install "$root/build/release" --prefix "$prefix" >/dev/null
command -v ldconfig >/dev/null && ldconfig || true
echo "sluiced: starting; in another terminal: sluice --addr 127.0.0.1:7700 health" >&2
exec "$prefix/bin/sluiced" "$@"
