#!/usr/bin/env bash
# Usage: scripts/gpu.sh offload [--dry-run]
# Summary: dsv4 bench of the full-size synthetic Flash with routed experts in host memory (--gpu-memory budgets, uniform and skewed routing), table last
# Environment: BUDGETS ("24G 48G 80G"), CPU_EXPERTS ("off"), ROUNDS (1), STREAM_BUDGETS ("24G"), NOPREFETCH_BUDGETS (""), SKEW (1; 0: no skewed runs), SKEW_BUDGETS ("24G 48G 80G"), SKEW_CPU_EXPERTS ("off"), CTX (4096), GEN (32), PRESET (flash-q2), KEEP=1
#
# Issue #35 measured: how fast a GPU smaller than the model runs it, mimicked
# on the H200 with --gpu-memory budgets (`dsv4 bench --ctx-start $CTX
# --gen-tokens $GEN --no-gemm-weight-cache`: prefill of $CTX tokens in one
# batch, then greedy decode; the cuBLAS split-weight cache off, as a smaller
# GPU would not have room for it):
#   full         the whole model on the GPU (the reference)
#   uniform-B-C  a synth file of the preset in /dev/shm (skipped if present; the
#                synthetic router spreads tokens evenly, the worst case for
#                placement), each budget B of $BUDGETS (a size, or auto: the
#                GPU's free memory, which on a GPU smaller than the file leaves
#                some experts in host memory) with each --cpu-experts C of
#                $CPU_EXPERTS (off, the default: every host expert gathered
#                over the bus; auto or a SHARE such as 0.15: the CPU computes
#                a share of each decode step's host experts; the CSV lists the
#                share it took, from the runner's exit log); all of them
#                $ROUNDS times in turn (runs -r2, -r3 ...: an A/B in one call)
#   uniform-B-noprefetch  each budget B of $NOPREFETCH_BUDGETS with
#                --no-expert-prefetch (prefill gathers each layer's host experts
#                after its router instead of copying them in beside the
#                attention: the A/B of the prefetch)
#   uniform-B-stream  each budget B of $STREAM_BUDGETS with --stream-experts on:
#                no host expert pinned, the host copies each step's from the
#                file's mapping (here the page cache: /dev/shm) through pinned
#                slots; and the disk's direct read rate (dd, 4 GiB under $OUT's
#                disk, removed), which bounds streaming from a file not in RAM
#   skew-B-even  with SKEW > 0: `--synthetic --router-skew $SKEW` (generated in
#                memory after the file is removed: RAM holds one copy), each
#                budget of $SKEW_BUDGETS with the experts spread evenly, while
#                --expert-stats counts the routing into stats.txt (--cpu-experts
#                $SKEW_CPU_EXPERTS)
#   skew-B-used  the same with the most-used experts placed first (stats.txt)
# Logs in ./out (OUT set: packed into $OUT/offload-logs.tgz, with offload.csv and
# offload-summary.txt beside it).
GPU_NAME=offload
# shellcheck source=scripts/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
set -uo pipefail
gpu_args "" "$@"
BUDGETS=${BUDGETS:-"24G 48G 80G"}
SKEW=${SKEW:-1}
SKEW_BUDGETS=${SKEW_BUDGETS:-"24G 48G 80G"}
CPU_EXPERTS=${CPU_EXPERTS:-off}
ROUNDS=${ROUNDS:-1}
STREAM_BUDGETS=${STREAM_BUDGETS-24G}
NOPREFETCH_BUDGETS=${NOPREFETCH_BUDGETS-}
SKEW_CPU_EXPERTS=${SKEW_CPU_EXPERTS:-off}
CTX=${CTX:-4096}
GEN=${GEN:-32}
PRESET=${PRESET:-flash-q2}
KEEP=${KEEP:-0}
gpu_need_uint CTX GEN KEEP ROUNDS
[[ $SKEW =~ ^[0-9]+(\.[0-9]+)?$ ]] || gpu_die "SKEW=$SKEW is not a number"
[[ $PRESET =~ ^[A-Za-z0-9_.-]+$ ]] || gpu_die "PRESET=$PRESET is not a preset name"
for b in $BUDGETS; do [[ $b =~ ^([0-9]+[GM]|auto)$ ]] || gpu_die "budget $b: want a size such as 24G, or auto"; done
for b in $SKEW_BUDGETS $STREAM_BUDGETS $NOPREFETCH_BUDGETS; do [[ $b =~ ^[0-9]+[GM]$ ]] || gpu_die "budget $b: want a size such as 24G"; done
for c in $CPU_EXPERTS $SKEW_CPU_EXPERTS; do
  [[ $c =~ ^(off|auto|0(\.[0-9]+)?|1(\.0+)?)$ ]] || gpu_die "--cpu-experts $c: want off, auto or a share from 0 to 1"
done
gpu_probe
gpu_use_run_libs
gpu_binaries dsv4
DSV4=$GPU_RUN/bin/dsv4
gpu_out_begin offload
gpu_out_keep offload.csv offload.csv
gpu_out_keep summary.txt offload-summary.txt
MODEL=/dev/shm/$PRESET.gguf
common=(--backend cuda --ctx-start "$CTX" --gen-tokens "$GEN" --no-gemm-weight-cache)
# One bench run: name, budget ("" = none), routing, placement, --cpu-experts, then the model and extra flags.
# Appends a row to offload.csv: the placement line of the log, the CPU's share and the bench CSV's row.
run_one() {
  local name=$1 budget=$2 routing=$3 placement=$4 cpu=$5
  shift 5
  local args=("$@" "${common[@]}" --csv "$LOG/$name.csv")
  [ -n "$budget" ] && args+=(--gpu-memory "$budget" --cpu-experts "$cpu")
  gpu_run --log "$LOG/$name.log" "$DSV4" bench "${args[@]}"
  gpu_dry_run && return 0
  if [ "$GPU_RC" -ne 0 ]; then
    echo "gpu.sh offload: $name failed ($name.log)" >&2
    return 0
  fi
  local resident host row share
  resident=$(sed -n 's/.*routed experts (\([0-9]*-[0-9]*\) of 256 per layer.*/\1/p' "$LOG/$name.log" | head -1)
  share=$(sed -n 's/.*the CPU took \([0-9.]*%\) of the host experts.*/\1/p' "$LOG/$name.log" | head -1)
  [ -z "$share" ] && [ -n "$budget" ] && [ "$cpu" != off ] && share=$cpu
  [ -z "$budget" ] || [ "$cpu" = off ] && share=0
  host=$(sed -n 's/.*; \([0-9.]*\) GiB of routed experts read from host memory.*/\1/p' "$LOG/$name.log" | head -1)
  row=$(tail -1 "$LOG/$name.csv" | cut -d, -f3,5)
  echo "${budget:-none},$routing,$placement,${resident:-256-256},${host:-0},${share:-0},$row" >>"$LOG/offload.csv"
}
echo "gpu_memory,routing,placement,experts_resident_per_layer,host_gib,cpu_share,prefill_tps,decode_tps" >"$LOG/offload.csv"
if [ ! -f "$MODEL" ]; then
  gpu_run --log "$LOG/synth.log" "$DSV4" synth --preset "$PRESET" -o "$MODEL" || gpu_die "synth failed (synth.log)"
fi
run_one full "" uniform all off -m "$MODEL"
for ((r = 1; r <= ROUNDS; r++)); do
  round=$([ "$r" -gt 1 ] && echo "-r$r")
  for b in $BUDGETS; do
    for c in $CPU_EXPERTS; do run_one "uniform-$b-$c$round" "$b" uniform even "$c" -m "$MODEL"; done
  done
done
for b in $NOPREFETCH_BUDGETS; do
  run_one "uniform-$b-noprefetch" "$b" uniform even-noprefetch off -m "$MODEL" --no-expert-prefetch
done
for b in $STREAM_BUDGETS; do run_one "uniform-$b-stream" "$b" uniform even-streamed off -m "$MODEL" --stream-experts on; done
[ "$KEEP" -ne 1 ] && ! gpu_dry_run && rm -f "$MODEL"
if [ -n "$STREAM_BUDGETS" ] && ! gpu_dry_run; then
  # The disk's direct read rate (no page cache), which bounds streaming experts from a file that is not in RAM.
  ddf=$LOG/dd-probe.bin
  if dd if=/dev/zero of="$ddf" bs=16M count=256 oflag=direct status=none 2>"$LOG/dd.log"; then
    dd if="$ddf" of=/dev/null bs=16M iflag=direct 2>&1 | tail -1 | sed 's/^/disk direct read: /' >"$LOG/disk.txt"
  else
    echo "disk direct read: not measured (dd.log)" >"$LOG/disk.txt"
  fi
  rm -f "$ddf"
fi
if [ "$SKEW" != 0 ]; then
  for b in $SKEW_BUDGETS; do
    rm -f "$LOG/stats.txt"
    skew=(--synthetic "$PRESET" --router-skew "$SKEW" --expert-stats "$LOG/stats.txt")
    run_one "skew-$b-even" "$b" "skew $SKEW" even "$SKEW_CPU_EXPERTS" "${skew[@]}"
    run_one "skew-$b-used" "$b" "skew $SKEW" most-used "$SKEW_CPU_EXPERTS" "${skew[@]}"
  done
fi
gpu_dry_run && exit 0
{
  gpu_heading offload "$(gpu_device_name)"
  grep -m1 "routing statistics" "$LOG"/skew-*-even.log 2>/dev/null | sed 's/.*(the most-used/skewed routing: the most-used/; s/)$//' | head -1
  cat "$LOG/disk.txt" 2>/dev/null
  awk -F, '{printf "%-10s %-9s %-9s %-16s %-8s %-9s %-11s %s\n", $1, $2, $3, $4, $5, $6, $7, $8}' "$LOG/offload.csv"
  # The CPU's share of host experts, per run that had one: the worker's totals and, under auto, its last fit.
  for f in "$LOG"/*.log; do
    grep -h "host experts: " "$f" 2>/dev/null | sed "s|^|$(basename "$f" .log): |"
  done
} | tee "$LOG/summary.txt"
exit 0
