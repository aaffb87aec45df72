#!/usr/bin/env bash
# Builds everything and runs all tests: the CPU tests (CTest label `cpu`:
# unit, invariants, golden, CLI, fuzz corpora) and the `dsv4 serve` SDK and
# load tests (label `server`: node >= 20 + npm; `npm ci` fetches the pinned
# SDKs once). This is the README's test command and the first step of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
scripts/build.sh "$@"
ctest --test-dir "$BUILD_DIR" -L cpu -j"$(nproc)" --output-on-failure
ctest --test-dir "$BUILD_DIR" -L server --output-on-failure --no-tests=error
