#!/usr/bin/env bash
# Usage: scripts/gpu.sh ncu-decode [--dry-run]
# Summary: where one decode step's time goes, kernel by kernel (Nsight Compute over the synthetic Flash; ~3 min)
# Environment: SKIP (3200), COUNT (1900), PRESET (flash-q2)
#
# Where one decode step's time goes, kernel by kernel, on the GPU machine:
# Nsight Compute times ~one decode step of the full-size synthetic Flash
# (`dsv4 bench --synthetic flash-q2`, weights generated in memory) and
# scripts/ncu-kernel-table.py sums it per kernel (launches, µs, DRAM bytes and
# rate). It uses build-device-run/bin/dsv4 (unpacked from build-device/ when missing);
# run it after scripts/gpu.sh check in the same call:
#
#   device tool: command "scripts/gpu.sh check --quick; scripts/gpu.sh ncu-decode", carry ["build-device"]
#
# The bench prefills 16 tokens and decodes 6; ncu skips the first $SKIP kernel
# launches (the prefill and the first decode steps: the step is recorded as a
# CUDA graph on its second run) and profiles the next $COUNT (about one decode
# step, ~1,800 kernels; graph nodes are profiled one by one). ncu replays each
# kernel alone with flushed caches, so small kernels read slower than in the
# graph; in one measured run the kernel times summed to 20.3 ms against
# 18.8 ms per graph replay. Takes ~3 minutes (25 s of weight generation).
# Variables: SKIP (3200), COUNT (1900), PRESET (flash-q2). Output under $OUT (else ./out):
# ncu-decode.csv, ncu-decode.err, ncu-decode-table.txt.
GPU_NAME=ncu-decode
# shellcheck source=scripts/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
set -uo pipefail
gpu_args "" "$@"
SKIP=${SKIP:-3200}
COUNT=${COUNT:-1900}
PRESET=${PRESET:-flash-q2}
gpu_need_uint SKIP
gpu_need_pos COUNT
gpu_probe
gpu_need_tool ncu "Nsight Compute"
gpu_use_run_libs
gpu_binaries dsv4
DSV4=$GPU_RUN/bin/dsv4
gpu_out_flat
gpu_run --out "$LOG/ncu-decode.csv" --err "$LOG/ncu-decode.err" ncu --clock-control none \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__registers_per_thread \
  --csv --launch-skip "$SKIP" --launch-count "$COUNT" \
  "$DSV4" bench --synthetic "$PRESET" --backend cuda --ctx-start 16 --ctx-max 16 --gen-tokens 6
rc=$GPU_RC
if [ $rc -ne 0 ]; then
  echo "gpu.sh ncu-decode: ncu exited with $rc (see $LOG/ncu-decode.err)" >&2
  tail -5 "$LOG/ncu-decode.err" >&2
  exit $rc
fi
gpu_run --out "$LOG/ncu-decode-table.txt" python3 scripts/ncu-kernel-table.py "$LOG/ncu-decode.csv"
rc=$GPU_RC
gpu_dry_run && exit 0
cat "$LOG/ncu-decode-table.txt"
exit $rc
