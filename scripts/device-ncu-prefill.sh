#!/usr/bin/env bash
# What limits the prefill kernels, on the GPU machine: Nsight Compute sections
# (speed of light, occupancy, warp stall reasons, pipe utilisation) for the
# first $COUNT launches of the tensor-core matmul / grouped-expert kernels and
# the attention kernels in one 512-token prefill batch of the full-size
# synthetic Flash (`dsv4 bench --synthetic flash-q2`, weights generated in
# memory). Run after scripts/device-check.sh in the same call (it unpacks the
# carried binaries into build-device-run/):
#
#   device tool: command "scripts/device-check.sh --quick; scripts/device-ncu-prefill.sh", carry ["build-device"]
#
# Options: env COUNT (16), KERNELS (ncu --kernel-name, default regex:mma_kernel|attention), PRESET (flash-q2).
# Output under $OUT (else ./out): ncu-prefill.txt (ncu's report), ncu-prefill.err.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-$PWD/out}
mkdir -p "$LOG"
COUNT=${COUNT:-16}
KERNELS=${KERNELS:-regex:mma_kernel|attention}
PRESET=${PRESET:-flash-q2}
DSV4=build-device-run/bin/dsv4
export LD_LIBRARY_PATH="$PWD/build-device-run/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ ! -x "$DSV4" ]; then
  echo "device-ncu-prefill: $DSV4 missing: run scripts/device-check.sh first (it unpacks build-device/)" >&2
  exit 2
fi
if ! command -v ncu >/dev/null; then
  echo "device-ncu-prefill: ncu (Nsight Compute) is not on PATH" >&2
  exit 2
fi
ncu --clock-control none --kernel-name "$KERNELS" --launch-count "$COUNT" \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
  --section LaunchStats \
  "$DSV4" bench --synthetic "$PRESET" --backend cuda --ctx-start 512 --ctx-max 512 --gen-tokens 1 \
  >"$LOG/ncu-prefill.txt" 2>"$LOG/ncu-prefill.err"
rc=$?
[ $rc -eq 0 ] || { echo "device-ncu-prefill: ncu exited with $rc (see $LOG/ncu-prefill.err)" >&2; tail -5 "$LOG/ncu-prefill.err" >&2; }
grep -E '^  [a-z_:<>, 0-9A-Za-z]+\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Executed Ipc Active|Stall' "$LOG/ncu-prefill.txt" | head -200
exit $rc
