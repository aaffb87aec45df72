#!/usr/bin/env bash
# Runs the GPU micro-benchmarks of bench/micro/ on the GPU machine (seconds):
#   mma_sync_rate  mma.sync m16n8k16 f16->f32 issue rate vs warps per SM and accumulators per warp
#   wgmma_f16      wgmma (sm_90a) from shared memory: which core-matrix layout / descriptor reading is right
#                  (checked against the CPU), then m64n64 / m64n128 rates with 1 and 3 products per k-step
#   decode_sync    one op-to-op hand-off: graph kernel boundaries (plain, PDL) vs grid barriers in a
#                  persistent kernel (cooperative groups, a flag barrier), with and without a 16 KB dependency
#
#   device tool: command "scripts/device-micro.sh", carry ["build-device"]
#   (or after scripts/gpu.sh check in the same call: it reuses build-device-run/)
# Output: micro.txt in ./out ($OUT with the device tool), also printed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
O=${OUT:-$PWD/out}
mkdir -p "$O"
RUN=build-device-run
if [ ! -d "$RUN/bin" ]; then
  [ -f build-device/dsv4-device.tar.xz ] || { echo "device-micro: no build-device/dsv4-device.tar.xz (run scripts/device-build-carry.sh here first)" >&2; exit 2; }
  mkdir -p "$RUN"
  tar -C "$RUN" -xJf build-device/dsv4-device.tar.xz ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' build-device/dsv4-device.tar.xz "$RUN" || exit 2
fi
export LD_LIBRARY_PATH=$PWD/$RUN/lib:${LD_LIBRARY_PATH:-}
rc=0
: >"$O/micro.txt"
for b in mma_sync_rate wgmma_f16 decode_sync; do
  echo "== $b" >>"$O/micro.txt"
  if [ -x "$RUN/bin/$b" ]; then
    timeout 120 "$RUN/bin/$b" >>"$O/micro.txt" 2>&1 || { echo "device-micro: $b failed (rc $?)" >>"$O/micro.txt"; rc=1; }
  else
    echo "device-micro: $RUN/bin/$b missing (the payload was built without the micro-benchmarks)" >>"$O/micro.txt"
    rc=1
  fi
done
cat "$O/micro.txt"
exit $rc
