#!/usr/bin/env bash
# The test suite's Python: a venv (Python 3.11) with tests/requirements.txt installed, at
# build/venv unless a directory is given. Usage: venv.sh [dir]
# Done again only when the requirements change (a copy of them is kept in the venv). The
# interpreter: $SLUICE_PYTHON if set, else python3.11, else a python3 that is 3.11; PyTorch's
# CPU wheel for 3.11 is what these machines keep on disk (another Python would download a CUDA
# build of several GB).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dir="${1:-$root/build/venv}"
req="$root/tests/requirements.txt"

if [[ -x "$dir/bin/python" ]] && cmp -s "$req" "$dir/requirements.txt"; then
  exit 0
fi

py="${SLUICE_PYTHON:-}"
if [[ -z "$py" ]]; then
  for c in python3.11 python3; do
    if command -v "$c" >/dev/null &&
       [[ "$("$c" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" == "3.11" ]]; then
      py="$(command -v "$c")"
      break
    fi
  done
fi
if [[ -z "$py" ]]; then
  echo "venv.sh: no Python 3.11 found (set SLUICE_PYTHON to one)" >&2
  exit 1
fi

rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
"$py" -m venv "$dir"
if ! "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" \
     >"$dir/pip.log" 2>&1; then
  # (without its warnings about the machine's optional local indexes)
  grep -v "^WARNING: Location 'file:" "$dir/pip.log" >&2 || true
  echo "venv.sh: pip install -r $req failed" >&2
  exit 1
fi
"$dir/bin/python" -c 'import torch, grpc, google.protobuf, numpy, boto3' # fails loudly if incomplete
cp "$req" "$dir/requirements.txt"
echo "venv.sh: $("$dir/bin/python" -c 'import sys, torch, grpc, google.protobuf as p; print("Python %d.%d.%d" % sys.version_info[:3], "torch", torch.__version__, "grpcio", grpc.__version__, "protobuf", p.__version__)') in $dir"
