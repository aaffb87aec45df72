#!/usr/bin/env bash
# Usage: AB_FLAG=--FLAG[=VALUE] | AB_ENV=NAME | AB_BIN=FILE scripts/gpu.sh ab [--dry-run]
# Summary: model-level A/B of one switch, knob or binary (sweep's two-configuration front end)
# Environment: one of AB_FLAG, AB_ENV, AB_BIN; then sweep's ROUNDS (2), CTX_START, CTX_MAX, GEN (64), PRESET, BENCH_FLAGS
#
# Model-level A/B on the GPU machine: the two-configuration front end of
# scripts/gpu.sh sweep (`dsv4 bench --synthetic flash-q2` run alternately as
# A and B in one call, so host-to-host variance cancels; medians per frontier
# and the change). Run it after scripts/gpu.sh check in the same call:
#
#   device tool: command "scripts/gpu.sh check --quick; AB_FLAG=--no-cuda-branches scripts/gpu.sh ab",
#                carry ["build-device"]
#
# The two sides (one of):
#   AB_FLAG=FLAG  the same binary with the dsv4 bench switch FLAG[=VALUE] (A) and
#                 without (B), e.g. --no-cuda-branches, --no-int-dot, --no-pdl, --cublas=off
#   AB_ENV=NAME   the same binary with NAME=0 (A) and NAME=1 (B) (an experiment's
#                 temporary environment knob)
#   AB_BIN=FILE   FILE (A: another dsv4, plain or .xz, e.g. build-device/a-dsv4.xz
#                 carried beside the payload) against this payload's dsv4 (B)
# Variables (sweep's): ROUNDS (default 2: A B A B), CTX_START (2048),
#          CTX_MAX (4096), GEN (64 decoded tokens per frontier), PRESET (flash-q2), BENCH_FLAGS.
# Output: sweep's (a-<r>.csv/.log, b-<r>.csv/.log, sweep.txt = the A/B table, printed last;
# with the device tool: $OUT/sweep.txt and $OUT/sweep-logs.tgz); in ./out also the copy ab.txt.
# Each run loads the model (~30 s for flash-q2); 2 rounds at 2K..4K take ~2.5 min.
# More than two configurations (several knobs or binaries in one call): scripts/gpu.sh sweep.
GPU_NAME=ab
# shellcheck source=scripts/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
set -uo pipefail
gpu_args "" "$@"
set_count=0
for v in "${AB_FLAG:-}" "${AB_ENV:-}" "${AB_BIN:-}"; do [ -n "$v" ] && set_count=$((set_count + 1)); done
[ "$set_count" -le 1 ] || gpu_die "set one of AB_FLAG, AB_ENV and AB_BIN"
if [ -n "${AB_FLAG:-}" ]; then
  [[ $AB_FLAG =~ ^--[a-z0-9-]+(=[^[:space:]]+)?$ ]] || gpu_die "AB_FLAG=$AB_FLAG is not --FLAG[=VALUE]"
  SWEEP="a: $AB_FLAG
b:"
elif [ -n "${AB_ENV:-}" ]; then
  [[ $AB_ENV =~ ^[A-Z_][A-Z0-9_]*$ ]] || gpu_die "AB_ENV=$AB_ENV is not a variable name"
  SWEEP="a: $AB_ENV=0
b: $AB_ENV=1"
elif [ -n "${AB_BIN:-}" ]; then
  [[ $AB_BIN != *[[:space:]]* ]] || gpu_die "AB_BIN=$AB_BIN contains spaces"
  SWEEP="a: @$AB_BIN
b:"
else
  gpu_die "set AB_FLAG=--FLAG (same binary with vs without), AB_ENV=NAME (same binary, NAME=0 vs 1)" \
    "or AB_BIN=FILE (another dsv4 vs this one)"
fi
export SWEEP
sweep_args=()
gpu_dry_run && sweep_args=(--dry-run)
GPU_SWEEP_AS=ab bash scripts/gpu/sweep.sh "${sweep_args[@]}"
rc=$?
gpu_dry_run || { [ -z "${OUT:-}" ] && [ -f out/sweep.txt ] && cp out/sweep.txt out/ab.txt; }
exit $rc
