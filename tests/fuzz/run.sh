#!/usr/bin/env bash
# Build one fuzz target with clang libFuzzer + ASan + UBSan and run it for N minutes.
#
# Usage: tests/fuzz/run.sh <target> <minutes> [libFuzzer flags...]
#   targets: fuzz_shard fuzz_lengths fuzz_config fuzz_feed_rpc fuzz_ckpt_rpc fuzz_read_lengths
#            fuzz_read_labels fuzz_flags
#
# Builds into build/fuzz (its own build dir; FUZZ_BUILD=<dir> picks another), starts from a copy
# of the committed seeds in build/fuzz/corpus/<target> (new inputs stay there, not in the
# repository) and writes crashing inputs to build/fuzz/artifacts/<target>/. It runs at the
# lowest CPU priority (nice 19): this is a shared machine. After fixing a crash, copy its input
# into tests/fuzz/corpus/<target>/ so ctest replays it from then on. Environment: CC (default
# clang, Debian's: 14 on Debian 12, 19 on 13), JOBS (default 1), FUZZ_BUILD (default build/fuzz).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [[ $# -lt 2 ]]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
target="$1"; minutes="$2"; shift 2
[[ -f "$root/tests/fuzz/$target.c" ]] || { echo "run.sh: no target $target" >&2; exit 2; }
dir="${FUZZ_BUILD:-$root/build/fuzz}"
cc="${CC:-clang}"

nice -n 19 cmake -S "$root" -B "$dir" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSLUICE_SANITIZE=address -DSLUICE_FUZZ=ON -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link" >/dev/null
nice -n 19 cmake --build "$dir" -j"${JOBS:-1}" --target "$target"

corpus="$dir/corpus/$target"
artifacts="$dir/artifacts/$target"
mkdir -p "$corpus" "$artifacts"
cp -n "$root/tests/fuzz/corpus/$target/"* "$corpus/" 2>/dev/null || true

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:halt_on_error=1:symbolize=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
exec nice -n 19 "$dir/tests/$target" -max_total_time=$((minutes * 60)) -print_final_stats=1 \
  -rss_limit_mb=2048 -timeout=10 -artifact_prefix="$artifacts/" "$@" "$corpus"
