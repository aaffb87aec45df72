#!/usr/bin/env bash
# Usage: scripts/gpu.sh bench [--dry-run]
# Summary: dsv4 bench of the full-size synthetic Flash: prefill/decode t/s per frontier, per-op profile, table last
# Environment: CTX_START (2048), CTX_MAX (4096), GEN (16), PRESET (flash-q2), BENCH_FLAGS, SYNTH_FILE=1, KEEP=1, KV_TOKENS
#
# Benchmarks dsv4 on the GPU machine with a full-size synthetic DeepSeek V4
# Flash (q2 preset, 80.76 GiB: generated in memory by `dsv4 bench --synthetic`,
# or, if that fails or SYNTH_FILE=1, a synth file in /dev/shm: the machine's
# disk is 64 GiB) and prints a short table last. It uses build-device-run/bin/dsv4 (unpacked from
# build-device/ when missing); run it after scripts/gpu.sh check in the same call:
#
#   device tool: command "scripts/gpu.sh check --quick; scripts/gpu.sh bench", carry ["build-device"]
#
# Steps (logs and CSVs in ./out; with the device tool (OUT set) packed into $OUT/bench-logs.tgz, the CSVs and
# the printed summary copied beside it as $OUT/bench-<preset>-cuda.csv, bench-kv-cache.csv, bench-summary.txt:
# scripts/gpu/lib.sh):
#   synth     (file mode only) dsv4 synth --preset flash-q2 -o /dev/shm/flash-q2.gguf (skipped if present)
#   bench     dsv4 bench --backend cuda, frontiers $CTX_START .. $CTX_MAX doubling
#             (default 2048 .. 4096; one process, each frontier prefills only
#             the tokens after the last), $GEN greedy tokens each (default 16):
#             prefill and decode tokens/s
#             with --profile: per-op tables of the decode steps and of one prefill batch at
#             every frontier, timed in extra passes (the CSV rates stay untimed)
#   kv-cache  (KV_TOKENS=N, file mode) scripts/bench-kv-cache.py --tokens N on the synth file with
#             --backend cuda: time to first token of an N-token prompt cold vs after a server
#             restart, snapshot size and store/restore times (issue #7)
# Variables: CTX_START, CTX_MAX, GEN, PRESET (flash-q2), SYNTH_FILE=1, KEEP=1 (keep the /dev/shm file),
#          BENCH_FLAGS (more dsv4 bench flags, e.g. "--batch 2048" or "--no-tensor-cores"),
#          KV_TOKENS (implies SYNTH_FILE=1).
GPU_NAME=bench
# shellcheck source=scripts/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
set -uo pipefail
gpu_args "" "$@"
CTX_START=${CTX_START:-2048}
CTX_MAX=${CTX_MAX:-4096}
GEN=${GEN:-16}
PRESET=${PRESET:-flash-q2}
KV_TOKENS=${KV_TOKENS:-0}
SYNTH_FILE=${SYNTH_FILE:-0}
KEEP=${KEEP:-0}
gpu_need_uint CTX_START CTX_MAX GEN KV_TOKENS SYNTH_FILE KEEP
[[ $PRESET =~ ^[A-Za-z0-9_.-]+$ ]] || gpu_die "PRESET=$PRESET is not a preset name"
[ "$KV_TOKENS" -gt 0 ] && SYNTH_FILE=1
gpu_probe
gpu_use_run_libs
gpu_binaries dsv4
DSV4=$GPU_RUN/bin/dsv4
gpu_out_begin bench
gpu_out_keep "bench-$PRESET-cuda.csv" "bench-$PRESET-cuda.csv"
gpu_out_keep kv-cache.csv bench-kv-cache.csv
gpu_out_keep summary.txt bench-summary.txt
ROWS=()
t0=$(date +%s)
CSV="$LOG/bench-$PRESET-cuda.csv"
# --profile: per-op decode and prefill tables in the same run (stderr, into bench.log); the CSV's
# rates come from the untimed passes, so one load serves both.
common=(--backend cuda --gen-tokens "$GEN" --ctx-start "$CTX_START" --profile)
# shellcheck disable=SC2206 # BENCH_FLAGS: extra dsv4 bench flags, word-split on purpose
common+=(${BENCH_FLAGS:-})
# Preferred: --synthetic (weights generated in memory, no file). If that fails,
# fall back to a synth file in /dev/shm (the path every earlier run used).
MODEL=""
if [ "$SYNTH_FILE" -eq 0 ] &&
  gpu_run --log "$LOG/bench.log" "$DSV4" bench --synthetic "$PRESET" "${common[@]}" --ctx-max "$CTX_MAX" --csv "$CSV"; then
  ROWS+=("bench --synthetic $PRESET: $(($(date +%s) - t0)) s ($(grep -so 'generated in memory in [0-9.]* s' "$LOG/bench.log"))")
else
  [ "$SYNTH_FILE" -eq 0 ] && { echo "gpu.sh bench: --synthetic failed; using a synth file:" >&2; tail -3 "$LOG/bench.log" >&2; }
  MODEL=/dev/shm/$PRESET.gguf
  if [ ! -f "$MODEL" ]; then
    gpu_run --log "$LOG/bench-synth.log" "$DSV4" synth --preset "$PRESET" -o "$MODEL" || {
      echo "gpu.sh bench: synth failed (see bench-synth.log)" >&2; tail -5 "$LOG/bench-synth.log"; exit 1; }
  fi
  ROWS+=("synth $PRESET: $(($(date +%s) - t0)) s")
  gpu_run --log "$LOG/bench.log" "$DSV4" bench -m "$MODEL" "${common[@]}" --ctx-max "$CTX_MAX" --csv "$CSV" || {
    echo "gpu.sh bench: bench failed" >&2; tail -5 "$LOG/bench.log"; }
  ROWS+=("bench: $(($(date +%s) - t0)) s since start")
fi
if [ "$KV_TOKENS" -gt 0 ]; then
  t1=$(date +%s)
  gpu_run --log "$LOG/kv-cache.log" python3 scripts/bench-kv-cache.py --bin "$DSV4" -m "$MODEL" --tokens "$KV_TOKENS" \
    --csv "$LOG/kv-cache.csv" --keep-dir -- --backend cuda || echo "gpu.sh bench: kv-cache bench failed (see kv-cache.log)" >&2
  kept=$(sed -n 's/^kept //p' "$LOG/kv-cache.log" 2>/dev/null)
  [ -n "$kept" ] && { cat "$kept"/serve1.log "$kept"/serve2.log >"$LOG/kv-cache-serve.log" 2>/dev/null; rm -rf "$kept"; }
  ROWS+=("kv-cache $KV_TOKENS tokens: $(($(date +%s) - t1)) s")
fi
if gpu_dry_run; then
  [ -n "$MODEL" ] && [ "$KEEP" -ne 1 ] && gpu_show rm -f "$MODEL"
  exit 0
fi
[ -n "$MODEL" ] && [ "$KEEP" -ne 1 ] && rm -f "$MODEL"
echo
{
  gpu_heading bench "$(gpu_device_name)"
  grep -h "uploaded" "$LOG"/bench*.log | head -1
  printf '%s\n' "${ROWS[@]}"
  grep -v "^#" "$CSV" 2>/dev/null
  grep -m1 -A12 "^op " "$LOG/bench.log" 2>/dev/null
  grep "^total" "$LOG/bench.log" 2>/dev/null
  [ "$KV_TOKENS" -gt 0 ] && tail -12 "$LOG/kv-cache.log"
} | tee "$LOG/summary.txt"
exit 0
