#!/usr/bin/env bash
# The whole test suite: installs the Debian packages it needs, then builds and runs every test
# twice: a release build with -Werror, and an ASan+UBSan build (any leak or error report fails).
# Usage: test.sh [ctest args...]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
"$root/deploy/scripts/deps.sh" --test

jobs="$(nproc)"
start=$(date +%s)

echo "== release build (-Werror)"
"$root/deploy/scripts/build.sh" "$root/build/ci-release" -DSLUICE_WERROR=ON
(cd "$root/build/ci-release" && ctest --output-on-failure -j"$jobs" "$@")

echo "== ASan+UBSan build"
"$root/deploy/scripts/build.sh" "$root/build/ci-asan" -DSLUICE_WERROR=ON -DSLUICE_SANITIZE=address
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export LSAN_OPTIONS="suppressions=$root/tests/lsan.supp:print_suppressions=0"
(cd "$root/build/ci-asan" && ctest --output-on-failure -j"$jobs" -LE no_asan "$@")

echo "== all tests passed in $(( $(date +%s) - start )) s"
