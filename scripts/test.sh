#!/usr/bin/env bash
# Builds everything and runs all CPU tests (CTest/GoogleTest). This is the
# README's test command and the first step of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
scripts/build.sh "$@"
ctest --test-dir "$BUILD_DIR" -L cpu -j"$(nproc)" --output-on-failure
