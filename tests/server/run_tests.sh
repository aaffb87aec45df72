#!/usr/bin/env bash
# Integration tests of `dsv4 serve` with the official SDKs, and its load test.
#
#   run_tests.sh setup          npm ci: install the pinned SDKs (package-lock.json)
#   run_tests.sh sdk  DSV4_BIN  the SDK tests (sdk.test.mjs, scripted.test.mjs, cache.test.mjs, help.test.mjs)
#                               and the hostile-client tests (hostile.test.mjs)
#   run_tests.sh load DSV4_BIN  the load test (load.mjs)
#
# The tests synthesize the tiny model into a temporary folder and start
# servers on free loopback ports. CTest runs all three (tests/server/CMakeLists.txt).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
what=${1:?usage: run_tests.sh setup|sdk|load [DSV4_BIN]}

if [ "$what" = setup ]; then
  cd "$here"
  # Reinstall only when the lockfile changed since the last install.
  if [ -f node_modules/.package-lock.json ] && [ node_modules/.package-lock.json -nt package-lock.json ]; then
    echo "node_modules is up to date with package-lock.json"
  else
    npm ci --no-audit --no-fund
  fi
  exit 0
fi

bin=$(realpath "${2:?the dsv4 binary}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" synth --preset tiny -o "$tmp/tiny.gguf" >/dev/null
export DSV4_BIN="$bin" DSV4_MODEL="$tmp/tiny.gguf"
case "$what" in
  sdk) exec node --test --test-concurrency=1 "$here/sdk.test.mjs" "$here/scripted.test.mjs" "$here/cache.test.mjs" \
         "$here/help.test.mjs" "$here/hostile.test.mjs" ;;
  load) exec node "$here/load.mjs" ;;
  *) echo "unknown mode $what" >&2; exit 2 ;;
esac
