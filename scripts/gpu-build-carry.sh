#!/usr/bin/env bash
# Builds, on this machine (no GPU needed: nvcc compiles for the target
# architecture), everything the GPU machine needs to run the CUDA checks, and
# packs it into build-device/, the folder the device tool carries there:
#
#   build-device/dsv4-device.tar.xz   bin/ and lib/ (about 12 MiB packed):
#       bin/  test_cuda_decode, test_cuda_ops, test_cuda_model, test_cuda_engine, test_cuda_memory, test_cuda_golden,
#             test_cuda_offload, test_cuda_pipeline,
#             bench_cuda_ops (op timings at Flash shapes), and dsv4
#             (plus the GPU micro-benchmarks mma_sync_rate, wgmma_f16, decode_sync, host_read and host_contention of bench/micro/
#             and the CPU's host_experts_bench,
#             optional like dsv4; scripts/gpu.sh micro runs them)
#             (stripped; CUDA runtime linked statically, compressed fatbins). dsv4 is
#             optional: if it does not build, the payload goes without it (warning)
#             and scripts/gpu.sh check skips its CLI smoke step.
#       lib/  the shared libraries they load that a stock CUDA image may lack
#             (ICU 72, OpenSSL 3, cpp-httplib, ...): every library ldd resolves
#             except glibc, libstdc++/libgcc (the GPU machine's are newer and
#             backward compatible) and the CUDA driver
#   build-device/BUILD-INFO           commit, date, architecture, file sizes, ldd output
#
# scripts/gpu.sh unpacks the archive there (tar/xz, or python3's
# tarfile) and puts lib/ on LD_LIBRARY_PATH.
#
# The CMake tree is build-device-tree/ (not carried; BUILD_DIR=... picks another,
# e.g. an existing DSV4_CUDA=ON tree of the same architecture, to save compile
# time). The script fails if build-device/ exceeds 40 MiB (the device tool
# carries at most 64 MiB, source tree included).
#
# AB_BASELINE=FILE also packs FILE (a bench_cuda_ops built from the code before
# the change under test; copy it aside before rebuilding) as build-device/a-bench.xz,
# stripped, for the interleaved A/B of scripts/gpu.sh ops-bench
# (AB=build-device/a-bench.xz there).
#
# Usage: scripts/gpu-build-carry.sh [CUDA_ARCH]   (default 90 = H100/H200)
# Then, with the device tool: command "scripts/gpu.sh check", carry ["build-device"]
# (scripts/gpu.sh --help lists what else runs there).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h | --help)
    sed -n '2,/^[^#]/{/^#/!q;s/^# \{0,1\}//;p;}' "$0"
    exit 0
    ;;
esac
[ $# -le 1 ] || { echo "gpu-build-carry: one argument at most, the CUDA architecture (see --help)" >&2; exit 2; }
ARCH=${1:-90}
TREE=${BUILD_DIR:-build-device-tree}
PAYLOAD=build-device
export PATH="$PATH:/usr/local/cuda/bin"

echo "gpu-build-carry: configuring $TREE (Release, CUDA arch $ARCH)"
cmake -S . -B "$TREE" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV4_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
  -DDSV4_BUILD_TESTS=ON >/dev/null
ninja -C "$TREE" -j"$(nproc)" dsv4_cuda_tests  # every target of tests/cuda (tests/cuda/CMakeLists.txt)
# The CLI is optional: a build break elsewhere in the tree must not block the kernel tests.
with_cli=1
ninja -C "$TREE" -j"$(nproc)" dsv4 || {
  with_cli=0
  echo "gpu-build-carry: WARNING: dsv4 did not build; the payload has no CLI (scripts/gpu.sh check skips the CLI smoke)" >&2
}

# The GPU micro-benchmarks (bench/micro/) are optional too.
with_micro=1
ninja -C "$TREE" -j"$(nproc)" dsv4_cuda_micro host_experts_bench || {
  with_micro=0
  echo "gpu-build-carry: WARNING: the micro-benchmarks did not build; the payload goes without them" >&2
}

STAGE="$TREE/device-payload"
rm -rf "$STAGE" "$PAYLOAD"
mkdir -p "$STAGE/bin" "$STAGE/lib" "$PAYLOAD"
# Every executable tests/cuda built (the dsv4_cuda_tests target), whatever their number.
find "$TREE/tests/cuda" -maxdepth 1 -type f -perm -u+x -exec cp {} "$STAGE/bin/" \;
[ "$with_cli" -eq 1 ] && cp "$TREE/tools/dsv4" "$STAGE/bin/"
[ "$with_micro" -eq 1 ] && cp "$TREE/bench/mma_sync_rate" "$TREE/bench/wgmma_f16" "$TREE/bench/decode_sync" "$TREE/bench/host_read" "$TREE/bench/host_contention" "$TREE/bench/host_experts_bench" "$STAGE/bin/"
strip "$STAGE"/bin/*

for b in "$STAGE"/bin/*; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  while read -r lib; do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | libstdc++.so* | libgcc_s.so* | libcuda.so*) ;;
      *) cp -L "$lib" "$STAGE/lib/" ;;
    esac
  done
# Every binary must resolve with only lib/ added (nothing "not found").
for b in "$STAGE"/bin/*; do
  if LD_LIBRARY_PATH="$STAGE/lib" ldd "$b" | grep -q "not found"; then
    echo "gpu-build-carry: ERROR: $b has unresolved libraries" >&2
    exit 1
  fi
done

# One xz stream (-T1): the binaries share most of their bytes (static CUDA runtime, kernels), which a
# multi-threaded xz, compressing blocks apart, cannot exploit (-T2 -6: 39.5 MB, -T1 -9: 18.9 MB).
tar -C "$STAGE" -cf - bin lib | xz -T1 -9 >"$PAYLOAD/dsv4-device.tar.xz"
if [ -n "${AB_BASELINE:-}" ]; then
  strip -o "$STAGE/a-bench" "$AB_BASELINE"
  xz -T"$(nproc)" -6 -c "$STAGE/a-bench" >"$PAYLOAD/a-bench.xz"
  echo "gpu-build-carry: baseline $AB_BASELINE packed as $PAYLOAD/a-bench.xz"
fi
{
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ uncommitted changes)')"
  # shellcheck source=/dev/null # /etc/os-release: this machine's
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "cuda arch: $ARCH; nvcc: $(nvcc --version | tail -1)"
  echo "files (unpacked):"
  (cd "$STAGE" && ls -l bin lib)
  echo "ldd (with lib/ on LD_LIBRARY_PATH):"
  for b in "$STAGE"/bin/*; do
    echo "$(basename "$b"):"
    LD_LIBRARY_PATH="$STAGE/lib" ldd "$b" | sed 's/ (0x[0-9a-f]*)//'
  done
} >"$PAYLOAD/BUILD-INFO"

bytes=$(du -sb "$PAYLOAD" | cut -f1)
echo "gpu-build-carry: $PAYLOAD is $((bytes / 1048576)) MiB ($(du -sh "$STAGE" | cut -f1) unpacked):"
# shellcheck disable=SC2012 # a listing for people to read
ls -l "$PAYLOAD" | sed 's/^/  /'
if [ "$bytes" -gt $((40 * 1048576)) ]; then
  echo "gpu-build-carry: ERROR: $PAYLOAD is over 40 MiB; the device tool carries at most 64 MiB with the source tree" >&2
  exit 1
fi
echo "gpu-build-carry: done. Next, on the GPU machine: device tool, command \"scripts/gpu.sh check\", carry [\"build-device\"]"
[ -n "${AB_BASELINE:-}" ] &&
  echo "gpu-build-carry: the kernel A/B: command \"AB=build-device/a-bench.xz scripts/gpu.sh ops-bench\", carry [\"build-device\"]"
exit 0
