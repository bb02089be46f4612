#!/usr/bin/env bash
# The build README command 1 installs (deploy/scripts/build.sh: RelWithDebInfo, which
# CMakeLists.txt makes -O3 -g) against a Release build (-O3), side by side in one run: both
# sample_bench binaries list the feistel epoch of N = 1e8 alternately, and the medians and their
# ratio are printed.
# Usage: tests/bench/build_type_bench.sh [runs]   (default 5; builds in build/bench-default and
# build/bench-release)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
runs="${1:-5}"
"$root/deploy/scripts/build.sh" "$root/build/bench-default" >/dev/null
cmake -S "$root" -B "$root/build/bench-release" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build/bench-release" -j"$(nproc)" --target sample_bench >/dev/null
rate() { # the feistel 1e8 epoch row's rate (M indices/s) of one sample_bench run
  "$1" --shuffle feistel --runs 1 |
    awk '$1 == "epoch" && $3 == "N=1e+08" {for (i = 1; i < NF; i++) if ($i == "rate=") print $(i + 1)}'
}
declare -a d r
for ((i = 0; i < runs; i++)); do
  d+=("$(rate "$root/build/bench-default/tests/sample_bench")")
  r+=("$(rate "$root/build/bench-release/tests/sample_bench")")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
md=$(median "${d[@]}"); mr=$(median "${r[@]}")
echo "feistel epoch N=1e8, M indices/s per run: default build: ${d[*]}; Release: ${r[*]}"
echo "median: default (README) build $md, Release $mr, ratio default/Release $(awk -v a="$md" -v b="$mr" 'BEGIN {printf "%.3f", a / b}')"
