#!/usr/bin/env bash
# Install s3rver (pinned in package.json) into tests/s3/node_modules with the system's npm, for the
# S3 tests (tests/python/s3fixture.py). Does nothing when it is already installed. Usage: install.sh
# Exits non-zero, saying why, when it cannot install (no npm, no network): the S3 tests then fail
# with that message instead of skipping.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
want="$(sed -n 's/.*"s3rver": *"\([^"]*\)".*/\1/p' "$here/package.json")"
have=""
if [[ -f "$here/node_modules/s3rver/package.json" ]]; then
  have="$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$here/node_modules/s3rver/package.json" | head -1)"
fi
if [[ "$have" == "$want" ]]; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "install.sh: npm not found: run deploy/scripts/deps.sh --test" >&2
  exit 1
fi
cd "$here"
# One install at a time (tests running in parallel); few, short retries so that an offline
# machine fails in seconds, not minutes.
exec 9>"$here/.install.lock"
flock -w 300 9
if [[ -f "$here/node_modules/s3rver/bin/s3rver.js" ]] && grep -q "\"version\": *\"$want\"" \
     "$here/node_modules/s3rver/package.json"; then
  exit 0
fi
if ! npm install --no-audit --no-fund --no-package-lock --loglevel=error --fetch-retries=1 \
     --fetch-retry-mintimeout=1000 --fetch-retry-maxtimeout=5000 >&2; then
  echo "install.sh: npm install of s3rver $want failed (offline? registry unreachable?)" >&2
  exit 1
fi
test -f "$here/node_modules/s3rver/bin/s3rver.js" || {
  echo "install.sh: s3rver $want installed but bin/s3rver.js is missing" >&2
  exit 1
}
