#!/usr/bin/env bash
# Install the Debian bookworm packages sluice needs. Usage: deps.sh [--test]
# --test adds what the test suite needs (PyTorch for the peer comparisons, numpy; PyYAML and
# systemd-analyze for the deployment checks; clang and its libFuzzer runtime for tests/fuzz/run.sh;
# valgrind for the memcheck run; python3-h2 (with python3-hpack) for the raw HTTP/2 attacks of
# test_attacks.py); python3-sklearn for the StratifiedKFold comparison of test_sampling2.py;
# python3-boto3 and npm (s3rver) for the S3 store's tests; postgresql-15 for the PostgreSQL
# catalog's tests, which start their own server; faketime for the replica whose clock runs
# ahead in test_fencing.py).
set -euo pipefail

pkgs=(build-essential cmake pkg-config
      libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler protobuf-compiler-grpc
      grpc-proto libuv1-dev libssl-dev libcurl4-openssl-dev libsqlite3-dev libpq-dev libmicrohttpd-dev libinih-dev libsystemd-dev
      python3 python3-grpcio python3-protobuf)
if [[ "${1:-}" == "--test" ]]; then
  pkgs+=(clang-format openssl prometheus python3-torch python3-numpy python3-yaml systemd
         clang-14 libclang-rt-14-dev valgrind python3-h2 python3-sklearn python3-boto3
         postgresql-15 faketime)
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
