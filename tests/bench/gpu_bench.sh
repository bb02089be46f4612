#!/usr/bin/env bash
# Issue 27's figures on a machine with CUDA, side by side in one run: the DCP benchmark with the
# state on the GPU (CheckpointManager and sluice's DCP storage against dcp.save / async_save /
# load with FileSystemWriter/Reader) and the loader benchmark with the model step on the GPU
# (sluice.torch.DataLoader and sluice's sampler against torch's DataLoader + DistributedSampler
# and torchdata's StatefulDataLoader). Logs go to $OUT (default ./gpu-bench-out).
#
#   SLUICED=build/release/server/sluiced PYTHONPATH=build/release/python:tests/python \
#       bash tests/bench/gpu_bench.sh [MIB]      # MIB of state per rank, default 4608
#
# Needs torch with CUDA, torchdata, grpcio in the python found first on PATH (or $PYTHON);
# SLUICE_LIB may name libsluice.so.1 (sluice._native) if it is not installed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${PYTHON:-python3}"
out="${OUT:-./gpu-bench-out}"
mib="${1:-4608}"
mkdir -p "$out"
"$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device")'
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
echo "== dcp_bench.py --device cuda --mib $mib" | tee "$out/dcp_bench.txt"
"$py" "$here/dcp_bench.py" --device cuda --mib "$mib" --tensors 64 --runs 3 \
    --dir "${TMPDIR:-/tmp}" 2>&1 | tee -a "$out/dcp_bench.txt"
echo "== torch_loader_bench.py --device cuda" | tee "$out/loader_bench.txt"
"$py" -W ignore "$here/torch_loader_bench.py" --device cuda --runs 5 --workers 0,4 2>&1 |
    tee -a "$out/loader_bench.txt"
