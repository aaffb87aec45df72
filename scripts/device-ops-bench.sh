#!/usr/bin/env bash
# Times the weight-streaming CUDA ops at DeepSeek V4 Flash shapes on the GPU
# machine (tests/cuda/bench_cuda_ops.cpp: decode matvecs, routed experts, and
# with NS="1 512" the prefill tiles), optionally with Nsight Compute detail for
# a few kernels, and prints a short table last. Seconds, not an 80 GiB load:
#
#   device tool: command "scripts/device-ops-bench.sh", carry ["build-device"]
#   (or after scripts/device-check.sh in the same call: it reuses build-device-run/)
#
# Options (env):
#   NS        token counts to time (default "1": decode)
#   FLAGS     more bench_cuda_ops flags (e.g. "--no-tensor-cores")
#   NCU       "case filter=kernel regex;..." pairs: for each, an Nsight Compute pass
#             (speed of light, memory, warp states, occupancy, scheduler) over the
#             first kernel matching the regex while bench_cuda_ops runs that case,
#             e.g. NCU="Q8_0 4096x8192=matvec;moe=expert_matvec;moe=expert_matvec@3"
#             (@N: skip N matching launches first, default 2: the warm-up runs)
#   NCU_N     tokens per op in the Nsight Compute passes (default 1), e.g. 2048 for
#             NCU="attention ratio 4=attention_mma"
# Output under $OUT (else ./out): ops-bench-n<N>.txt, ncu-<i>.txt, summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-$PWD/out}
mkdir -p "$LOG"
export PATH="$PATH:/usr/local/cuda/bin"
RUN=build-device-run
if [ ! -x "$RUN/bin/bench_cuda_ops" ]; then
  [ -f build-device/dsv4-device.tar.xz ] || { echo "device-ops-bench: build-device/ missing (scripts/device-build-carry.sh)" >&2; exit 2; }
  rm -rf "$RUN" && mkdir -p "$RUN"
  tar -C "$RUN" -xJf build-device/dsv4-device.tar.xz || { echo "device-ops-bench: cannot unpack the payload" >&2; exit 2; }
fi
export LD_LIBRARY_PATH="$PWD/$RUN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BENCH=$RUN/bin/bench_cuda_ops
[ -x "$BENCH" ] || { echo "device-ops-bench: $BENCH missing (older payload?)" >&2; exit 2; }

rc=0
for n in ${NS:-1}; do
  # shellcheck disable=SC2086 # FLAGS: extra flags, word-split on purpose
  "$BENCH" --n "$n" ${FLAGS:-} >"$LOG/ops-bench-n$n.txt" 2>&1 || rc=1
done
i=0
IFS=';' read -ra pairs <<<"${NCU:-}"
for p in "${pairs[@]}"; do
  [ -n "$p" ] || continue
  i=$((i + 1))
  filter=${p%%=*}
  kernel=${p#*=}
  skip=2
  if [[ $kernel == *@* ]]; then skip=${kernel##*@}; kernel=${kernel%@*}; fi
  ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis \
    -k "regex:$kernel" --launch-skip "$skip" --launch-count 1 \
    "$BENCH" --filter "$filter" --reps 4 --n "${NCU_N:-1}" >"$LOG/ncu-$i.txt" 2>&1 || rc=1
done
{
  echo "== dsv4 ops bench ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
  for n in ${NS:-1}; do cat "$LOG/ops-bench-n$n.txt"; done
  for f in "$LOG"/ncu-*.txt; do
    [ -f "$f" ] || continue
    echo "-- $(basename "$f"): $(grep -m1 -o '[a-z_]*kernel[^ (]*' "$f")"
    grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" "$f" | head -12
  done
} | tee "$LOG/summary.txt"
exit $rc
