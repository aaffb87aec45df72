#!/usr/bin/env bash
# Configures and builds dsv4 (CPU, Release) into ./build. Extra arguments go to CMake,
# e.g. scripts/build.sh -DDSV4_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
ninja -C "$BUILD_DIR" -j"$(nproc)"
