#!/usr/bin/env bash
# Install the Debian packages sluice needs (Debian 12 bookworm or 13 trixie: only names both
# releases have). Usage: deps.sh [--test]
# --test adds what the test suite needs besides its Python venv (deploy/scripts/venv.sh):
# python3-venv for that venv; systemd-analyze for the deployment checks; clang and its
# libFuzzer runtime for tests/fuzz/run.sh; valgrind for the memcheck run; npm (s3rver) for the S3
# store's tests; postgresql for the PostgreSQL catalog's tests, which start their own server;
# faketime for the replica whose clock runs ahead in test_fencing.py. Debian's python3-grpcio
# and python3-protobuf (below) carry the installed client and the debian_python_smoke test.
set -euo pipefail

pkgs=(build-essential cmake pkg-config
      libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler protobuf-compiler-grpc
      grpc-proto libuv1-dev libssl-dev libcurl4-openssl-dev libsqlite3-dev libpq-dev libmicrohttpd-dev libinih-dev libsystemd-dev
      python3 python3-grpcio python3-protobuf)
if [[ "${1:-}" == "--test" ]]; then
  pkgs+=(clang-format openssl prometheus python3-venv systemd clang libclang-rt-dev valgrind
         postgresql faketime)
  # npm installs s3rver for the S3 tests (tests/s3/install.sh). A nodejs from elsewhere (e.g.
  # nodesource) bundles its own npm, which Debian's npm package would conflict with.
  command -v npm >/dev/null || pkgs+=(nodejs npm)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
