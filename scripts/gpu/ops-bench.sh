#!/usr/bin/env bash
# Usage: scripts/gpu.sh ops-bench [--dry-run]
# Summary: bench_cuda_ops: the weight-streaming CUDA ops at Flash shapes (seconds, no model load); A/B; ncu detail
# Environment: NS ("1"), FILTER, FLAGS, AB (baseline bench_cuda_ops[.xz]), AB_RUNS (3), NCU, NCU_N (1)
#
# Times the weight-streaming CUDA ops at DeepSeek V4 Flash shapes on the GPU
# machine (tests/cuda/bench_cuda_ops.cpp: decode matvecs, routed experts, and
# with NS="1 512" the prefill tiles), optionally with Nsight Compute detail for
# a few kernels, and prints a short table last. Seconds, not an 80 GiB load:
#
#   device tool: command "scripts/gpu.sh ops-bench", carry ["build-device"]
#   (or after scripts/gpu.sh check in the same call: it reuses build-device-run/)
#
# Variables:
#   NS        token counts to time (default "1": decode)
#   FLAGS     more bench_cuda_ops flags (e.g. "--no-tensor-cores")
#   NCU       "case filter=kernel regex;..." pairs: for each, an Nsight Compute pass
#             (speed of light, memory, warp states, occupancy, scheduler) over the
#             first kernel matching the regex while bench_cuda_ops runs that case,
#             e.g. NCU="Q8_0 4096x8192=matvec;moe=expert_matvec;moe=expert_matvec@3"
#             (@N: skip N matching launches first, default 2: the warm-up runs)
#   NCU_N     tokens per op in the Nsight Compute passes (default 1), e.g. 2048 for
#             NCU="attention ratio 4=attention_mma"
#   AB        a baseline bench_cuda_ops (plain or .xz; usually build-device/a-bench.xz,
#             packed by `AB_BASELINE=<the old binary> scripts/gpu-build-carry.sh`,
#             copying build-cuda/tests/cuda/bench_cuda_ops aside before changing the
#             code): for each N, the
#             baseline (A) and this payload's binary (B) run alternately AB_RUNS times
#             (default 3) in this one call, and ab-n<N>.txt lists per case the median
#             of each and the change. Model-level rates differ by up to +-4% between
#             the GPU hosts the device tool hands out (PERFORMANCE.md); this
#             interleaved A/B is stable to ~0.5%.
#   FILTER    only the bench cases whose name contains it, or one of its '|'-separated parts ("x-int8|act_quant"),
#             in the timing and the A/B runs (a baseline binary older than the '|' form takes the whole string
#             as one substring: its side of the A/B stays empty)
# Output: ops-bench-n<N>.txt, ab-n<N>.txt, ncu-<i>.txt, summary.txt in ./out; with the device tool (OUT set)
# packed into $OUT/ops-bench-logs.tgz, summary.txt copied to $OUT/ops-bench-summary.txt (scripts/gpu/lib.sh).
GPU_NAME=ops-bench
# shellcheck source=scripts/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
set -uo pipefail
gpu_args "" "$@"
NS=${NS:-1}
AB_RUNS=${AB_RUNS:-3}
NCU_N=${NCU_N:-1}
for n in $NS; do [[ $n =~ ^[1-9][0-9]*$ ]] || gpu_die "NS=$NS: '$n' is not a token count"; done
[ -n "${NS// /}" ] || gpu_die "NS is empty"
gpu_need_pos AB_RUNS NCU_N
[ -z "${AB:-}" ] || [ -f "$AB" ] || gpu_dry_run || gpu_die "AB=$AB: the baseline bench_cuda_ops is not here"
[ -z "${NCU:-}" ] || gpu_need_tool ncu "Nsight Compute, for NCU="
gpu_probe
gpu_binaries bench_cuda_ops
gpu_use_run_libs
BENCH=$GPU_RUN/bin/bench_cuda_ops
gpu_out_begin ops-bench
gpu_out_keep summary.txt ops-bench-summary.txt

rc=0
case_sel=()
[ -n "${FILTER:-}" ] && case_sel=(--filter "$FILTER")
for n in $NS; do
  # shellcheck disable=SC2086 # FLAGS: extra flags, word-split on purpose
  gpu_run --log "$LOG/ops-bench-n$n.txt" "$BENCH" --n "$n" "${case_sel[@]}" ${FLAGS:-} || rc=1
done
if [ -n "${AB:-}" ]; then
  A_BIN=$LOG/a-bench
  case "$AB" in
    *.xz) gpu_run --out "$A_BIN" xz -dc "$AB" ;;
    *) gpu_run cp "$AB" "$A_BIN" ;;
  esac
  gpu_run chmod +x "$A_BIN" || gpu_die "cannot use the baseline $AB"
  for n in $NS; do
    for r in $(seq 1 "$AB_RUNS"); do
      # shellcheck disable=SC2086 # FLAGS: extra flags, word-split on purpose
      gpu_run --log "$LOG/ab-a-n$n-$r.txt" "$A_BIN" --n "$n" "${case_sel[@]}" ${FLAGS:-} || rc=1
      # shellcheck disable=SC2086
      gpu_run --log "$LOG/ab-b-n$n-$r.txt" "$BENCH" --n "$n" "${case_sel[@]}" ${FLAGS:-} || rc=1
    done
    gpu_dry_run && continue
    python3 - "$LOG" "$n" >"$LOG/ab-n$n.txt" <<'PY'
import glob, re, statistics, sys
log, n = sys.argv[1], sys.argv[2]
def times(side):
    t = {}
    for f in sorted(glob.glob(f"{log}/ab-{side}-n{n}-*.txt")):
        for line in open(f):
            m = re.match(r"(.*?)\s+([0-9.]+) us", line)
            if m:
                t.setdefault(m.group(1).strip(), []).append(float(m.group(2)))
    return t
a, b = times("a"), times("b")
print(f"# A/B, n={n}: median us of each side's runs (A = baseline, B = this payload)")
print(f"{'case':52s} {'A us':>10s} {'B us':>10s} {'change':>8s}")
for case in a:
    if case in b:
        ma, mb = statistics.median(a[case]), statistics.median(b[case])
        print(f"{case:52s} {ma:10.2f} {mb:10.2f} {100 * (mb - ma) / ma:+7.1f}%")
PY
  done
fi
i=0
IFS=';' read -ra pairs <<<"${NCU:-}"
for p in "${pairs[@]}"; do
  [ -n "$p" ] || continue
  i=$((i + 1))
  filter=${p%%=*}
  kernel=${p#*=}
  skip=2
  if [[ $kernel == *@* ]]; then skip=${kernel##*@}; kernel=${kernel%@*}; fi
  gpu_run --log "$LOG/ncu-$i.txt" ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis \
    -k "regex:$kernel" --launch-skip "$skip" --launch-count 1 \
    "$BENCH" --filter "$filter" --reps 4 --n "$NCU_N" || rc=1
done
gpu_dry_run && exit 0
{
  gpu_heading "ops bench" "$(gpu_device_name)"
  for n in $NS; do cat "$LOG/ops-bench-n$n.txt"; done
  if [ -n "${AB:-}" ]; then for n in $NS; do cat "$LOG/ab-n$n.txt"; done; fi
  for f in "$LOG"/ncu-*.txt; do
    [ -f "$f" ] || continue
    echo "-- $(basename "$f"): $(grep -m1 -o '[a-z_]*kernel[^ (]*' "$f")"
    grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" "$f" | head -12
  done
} | tee "$LOG/summary.txt"
exit $rc
