#!/usr/bin/env bash
# The whole test suite: installs the Debian packages it needs, then builds and runs every test
# twice: a release build with -Werror, and an ASan+UBSan build (any leak or error report fails);
# then a TSan run of the RPC bridge unit test and a valgrind memcheck run of the daemon
# integration test (docs/hardening.md).
# Usage: test.sh [ctest args...]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
"$root/deploy/scripts/deps.sh" --test
# Every Python and torchrun test runs in this venv (tests/requirements.txt: torch 2.13 CPU,
# grpcio, protobuf, ...); Debian's python3 runs one smoke test (debian_python_smoke).
"$root/deploy/scripts/venv.sh" "$root/build/venv"
py="$root/build/venv/bin/python"

jobs="$(nproc)"
start=$(date +%s)

echo "== release build (-Werror)"
"$root/deploy/scripts/build.sh" "$root/build/ci-release" -DSLUICE_WERROR=ON -DSL_PYTHON="$py"
(cd "$root/build/ci-release" && ctest --output-on-failure -j"$jobs" "$@")

echo "== ASan+UBSan build"
"$root/deploy/scripts/build.sh" "$root/build/ci-asan" -DSLUICE_WERROR=ON -DSLUICE_SANITIZE=address \
  -DSL_PYTHON="$py"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export LSAN_OPTIONS="suppressions=$root/tests/lsan.supp:print_suppressions=0"
(cd "$root/build/ci-asan" && ctest --output-on-failure -j"$jobs" -LE no_asan "$@")

echo "== TSan: the RPC bridge unit test"
# Only rpc_test: it is the code where several threads meet (completion-queue threads, the loop,
# client callers). gRPC and its libraries are not TSan-instrumented: tests/tsan.supp says which
# reports that causes and why each suppression is safe.
cmake -S "$root" -B "$root/build/ci-tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSLUICE_WERROR=ON \
  -DSLUICE_SANITIZE=thread >/dev/null
cmake --build "$root/build/ci-tsan" -j"$jobs" --target rpc_test
TSAN_OPTIONS="suppressions=$root/tests/tsan.supp:ignore_noninstrumented_modules=1:halt_on_error=1:second_deadlock_stack=1" \
  "$root/build/ci-tsan/tests/rpc_test"

echo "== valgrind memcheck: the daemon integration test and index streams (release build)"
# Every sluiced the test starts runs under memcheck: a memory error or a definite leak makes it
# exit 1, which the test's exit-code check reports.
vgdir="$root/build/ci-valgrind"
rm -rf "$vgdir" && mkdir -p "$vgdir"
printf '#!/bin/sh\nexec valgrind --quiet --error-exitcode=1 --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite --log-file=%s/memcheck-%%p.log %s "$@"\n' \
  "$vgdir" "$root/build/ci-release/server/sluiced" >"$vgdir/sluiced"
chmod +x "$vgdir/sluiced"
if ! (cd "$root/tests/integration" &&
      SLUICED="$vgdir/sluiced" SLUICE_SLOWDOWN=10 SLUICE_CLI="$root/build/ci-release/client/cli/sluice" \
      PYTHONPATH="$root/build/ci-release/python:$root/tests/python" PYTHONDONTWRITEBYTECODE=1 \
      "$py" -m unittest test_daemon.DaemonTest test_limits.MaxCallsTest \
        test_limits.MaxJobStreamsTest); then
  cat "$vgdir"/memcheck-*.log
  exit 1
fi

echo "== all tests passed in $(( $(date +%s) - start )) s"
