#!/usr/bin/env bash
# Model-level A/B on the GPU machine: the two-configuration front end of
# scripts/device-sweep.sh (`dsv4 bench --synthetic flash-q2` run alternately as
# A and B in one call, so host-to-host variance cancels; medians per frontier
# and the change). Run after scripts/gpu.sh check in the same call (it
# unpacks build-device/):
#
#   device tool: command "scripts/gpu.sh check --quick; AB_FLAG=--no-cuda-branches scripts/device-ab.sh",
#                carry ["build-device"]
#
# The two sides (one of):
#   AB_FLAG=FLAG  the same binary with the dsv4 bench switch FLAG[=VALUE] (A) and
#                 without (B), e.g. --no-cuda-branches, --no-int-dot, --no-pdl, --cublas=off
#   AB_ENV=NAME   the same binary with NAME=0 (A) and NAME=1 (B) (an experiment's
#                 temporary environment knob)
#   AB_BIN=FILE   FILE (A: another dsv4, plain or .xz, e.g. build-device/a-dsv4.xz
#                 carried beside the payload) against this payload's dsv4 (B)
# Options (device-sweep.sh's): env ROUNDS (default 2: A B A B), CTX_START (2048),
#          CTX_MAX (4096), GEN (64 decoded tokens per frontier), PRESET (flash-q2), BENCH_FLAGS.
# Output: device-sweep.sh's (a-<r>.csv/.log, b-<r>.csv/.log, sweep.txt = the A/B table, printed last;
# with the device tool: $OUT/sweep.txt and $OUT/sweep-logs.tgz); in ./out also the copy ab.txt.
# Each run loads the model (~30 s for flash-q2); 2 rounds at 2K..4K take ~2.5 min.
# More than two configurations (several knobs or binaries in one call): scripts/device-sweep.sh.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
set_count=0
for v in "${AB_FLAG:-}" "${AB_ENV:-}" "${AB_BIN:-}"; do [ -n "$v" ] && set_count=$((set_count + 1)); done
if [ "$set_count" -gt 1 ]; then
  echo "device-ab: set one of AB_FLAG, AB_ENV and AB_BIN" >&2; exit 2
fi
if [ -n "${AB_FLAG:-}" ]; then
  [[ $AB_FLAG =~ ^--[a-z0-9-]+(=[^[:space:]]+)?$ ]] || { echo "device-ab: AB_FLAG=$AB_FLAG is not --FLAG[=VALUE]" >&2; exit 2; }
  SWEEP="a: $AB_FLAG
b:"
elif [ -n "${AB_ENV:-}" ]; then
  [[ $AB_ENV =~ ^[A-Z_][A-Z0-9_]*$ ]] || { echo "device-ab: AB_ENV=$AB_ENV is not a variable name" >&2; exit 2; }
  SWEEP="a: $AB_ENV=0
b: $AB_ENV=1"
elif [ -n "${AB_BIN:-}" ]; then
  [[ $AB_BIN != *[[:space:]]* ]] || { echo "device-ab: AB_BIN=$AB_BIN contains spaces" >&2; exit 2; }
  SWEEP="a: @$AB_BIN
b:"
else
  echo "device-ab: set AB_FLAG=--FLAG (same binary with vs without), AB_ENV=NAME (same binary, NAME=0 vs 1) or AB_BIN=FILE (another dsv4 vs this one)" >&2
  exit 2
fi
export SWEEP
scripts/device-sweep.sh
rc=$?
[ -z "${OUT:-}" ] && [ -f out/sweep.txt ] && cp out/sweep.txt out/ab.txt
exit $rc
