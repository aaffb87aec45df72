#!/usr/bin/env bash
# Where one decode step's time goes, kernel by kernel, on the GPU machine:
# Nsight Compute times ~one decode step of the full-size synthetic Flash
# (`dsv4 bench --synthetic flash-q2`, weights generated in memory) and
# scripts/ncu-kernel-table.py sums it per kernel (launches, µs, DRAM bytes and
# rate). Run after scripts/gpu.sh check in the same call (it unpacks the
# carried binaries into build-device-run/):
#
#   device tool: command "scripts/gpu.sh check --quick; scripts/device-ncu-decode.sh", carry ["build-device"]
#
# The bench prefills 16 tokens and decodes 6; ncu skips the first $SKIP kernel
# launches (the prefill and the first decode steps: the step is recorded as a
# CUDA graph on its second run) and profiles the next $COUNT (about one decode
# step, ~1,800 kernels; graph nodes are profiled one by one). ncu replays each
# kernel alone with flushed caches, so small kernels read slower than in the
# graph; in one measured run the kernel times summed to 20.3 ms against
# 18.8 ms per graph replay. Takes ~3 minutes (25 s of weight generation).
# Options: env SKIP (3200), COUNT (1900), PRESET (flash-q2). Output under $OUT (else ./out):
# ncu-decode.csv, ncu-decode.err, ncu-decode-table.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-$PWD/out}
mkdir -p "$LOG"
SKIP=${SKIP:-3200}
COUNT=${COUNT:-1900}
PRESET=${PRESET:-flash-q2}
DSV4=build-device-run/bin/dsv4
export LD_LIBRARY_PATH="$PWD/build-device-run/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ ! -x "$DSV4" ]; then
  echo "device-ncu-decode: $DSV4 missing: run scripts/gpu.sh check first (it unpacks build-device/)" >&2
  exit 2
fi
if ! command -v ncu >/dev/null; then
  echo "device-ncu-decode: ncu (Nsight Compute) is not on PATH" >&2
  exit 2
fi
ncu --clock-control none \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__registers_per_thread \
  --csv --launch-skip "$SKIP" --launch-count "$COUNT" \
  "$DSV4" bench --synthetic "$PRESET" --backend cuda --ctx-start 16 --ctx-max 16 --gen-tokens 6 \
  >"$LOG/ncu-decode.csv" 2>"$LOG/ncu-decode.err"
rc=$?
if [ $rc -ne 0 ]; then
  echo "device-ncu-decode: ncu exited with $rc (see $LOG/ncu-decode.err)" >&2
  tail -5 "$LOG/ncu-decode.err" >&2
  exit $rc
fi
python3 scripts/ncu-kernel-table.py "$LOG/ncu-decode.csv" | tee "$LOG/ncu-decode-table.txt"
