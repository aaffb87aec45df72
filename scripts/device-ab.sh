#!/usr/bin/env bash
# Model-level A/B on the GPU machine: `dsv4 bench --synthetic flash-q2` run
# alternately as A and B in one call, so host-to-host variance (up to +-4%
# between the machines the device tool hands out) cancels; prints the median
# decode and prefill rate of each side per frontier and the change. Run after
# scripts/device-check.sh in the same call (it unpacks build-device/):
#
#   device tool: command "scripts/device-check.sh --quick; AB_ENV=DSV4_CUDA_BRANCH scripts/device-ab.sh",
#                carry ["build-device"]
#
# The two sides (one of):
#   AB_ENV=NAME   the same binary with NAME=0 (A) and NAME=1 (B): the env toggles
#                 DSV4_CUDA_BRANCH, DSV4_CUDA_IDOT, DSV4_CUDA_PDL
#   AB_BIN=FILE   FILE (A: another dsv4, plain or .xz, e.g. build-device/a-dsv4.xz
#                 carried beside the payload) against this payload's dsv4 (B)
# Options: env ROUNDS (default 2: A B A B), CTX_START (2048), CTX_MAX (4096),
#          GEN (64 decoded tokens per frontier), PRESET (flash-q2), BENCH_FLAGS.
# Output under $OUT (else ./out): a-<r>.csv/.log, b-<r>.csv/.log, ab.txt (printed last).
# Each run loads the model (~30 s for flash-q2); 2 rounds at 2K..4K take ~2.5 min.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
LOG=${OUT:-$PWD/out}
mkdir -p "$LOG"
ROUNDS=${ROUNDS:-2}
CTX_START=${CTX_START:-2048}
CTX_MAX=${CTX_MAX:-4096}
GEN=${GEN:-64}
PRESET=${PRESET:-flash-q2}
DSV4=${DSV4:-build-device-run/bin/dsv4}
export LD_LIBRARY_PATH="$PWD/build-device-run/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -x "$DSV4" ] || { echo "device-ab: $DSV4 missing: run scripts/device-check.sh first (it unpacks build-device/)" >&2; exit 2; }
if [ -n "${AB_ENV:-}" ] && [ -n "${AB_BIN:-}" ]; then
  echo "device-ab: set AB_ENV or AB_BIN, not both" >&2; exit 2
fi
A_BIN=$DSV4
A_DESC="" B_DESC=""
if [ -n "${AB_ENV:-}" ]; then
  [[ $AB_ENV =~ ^[A-Z_][A-Z0-9_]*$ ]] || { echo "device-ab: AB_ENV=$AB_ENV is not a variable name" >&2; exit 2; }
  A_DESC="$AB_ENV=0" B_DESC="$AB_ENV=1"
elif [ -n "${AB_BIN:-}" ]; then
  A_BIN=$LOG/a-dsv4
  case "$AB_BIN" in
    *.xz) xz -dc "$AB_BIN" >"$A_BIN" || { echo "device-ab: cannot unpack $AB_BIN" >&2; exit 2; } ;;
    *) cp "$AB_BIN" "$A_BIN" || { echo "device-ab: cannot copy $AB_BIN" >&2; exit 2; } ;;
  esac
  chmod +x "$A_BIN"
  A_DESC="$(basename "$AB_BIN")" B_DESC="$DSV4"
else
  echo "device-ab: set AB_ENV=NAME (same binary, NAME=0 vs 1) or AB_BIN=FILE (another dsv4 vs this one)" >&2
  exit 2
fi

# shellcheck disable=SC2206 # BENCH_FLAGS: extra dsv4 bench flags, word-split on purpose
args=(bench --synthetic "$PRESET" --backend cuda --ctx-start "$CTX_START" --ctx-max "$CTX_MAX" --gen-tokens "$GEN"
  ${BENCH_FLAGS:-})
run_side() {  # side round
  local side=$1 r=$2 bin=$DSV4
  [ "$side" = a ] && bin=$A_BIN
  if [ -n "${AB_ENV:-}" ]; then
    local v=1
    [ "$side" = a ] && v=0
    env "$AB_ENV=$v" "$bin" "${args[@]}" --csv "$LOG/$side-$r.csv" >"$LOG/$side-$r.log" 2>&1
  else
    "$bin" "${args[@]}" --csv "$LOG/$side-$r.csv" >"$LOG/$side-$r.log" 2>&1
  fi || { echo "device-ab: side $side round $r failed (see $LOG/$side-$r.log)" >&2; return 1; }
}
rc=0
for r in $(seq 1 "$ROUNDS"); do
  run_side a "$r" || rc=1
  run_side b "$r" || rc=1
done
[ -n "${AB_BIN:-}" ] && rm -f "$A_BIN"
python3 - "$LOG" "$A_DESC" "$B_DESC" >"$LOG/ab.txt" <<'PY'
import csv, glob, statistics, sys
log, a_desc, b_desc = sys.argv[1:4]
def rates(side):
    out = {}  # ctx -> {"gen": [...], "prefill": [...]}
    for f in sorted(glob.glob(f"{log}/{side}-*.csv")):
        rows = [l for l in open(f) if not l.startswith("#")]
        for row in csv.DictReader(rows):
            d = out.setdefault(int(row["ctx"]), {"gen": [], "prefill": []})
            d["gen"].append(float(row["gen_tps"]))
            d["prefill"].append(float(row["prefill_tps"]))
    return out
a, b = rates("a"), rates("b")
print(f"# A = {a_desc}, B = {b_desc}: medians of {len(glob.glob(log + '/a-*.csv'))} / {len(glob.glob(log + '/b-*.csv'))} runs (t/s)")
print(f"{'ctx':>7} {'decode A':>9} {'decode B':>9} {'change':>8} {'prefill A':>10} {'prefill B':>10} {'change':>8}")
for ctx in sorted(set(a) & set(b)):
    ga, gb = statistics.median(a[ctx]["gen"]), statistics.median(b[ctx]["gen"])
    pa, pb = statistics.median(a[ctx]["prefill"]), statistics.median(b[ctx]["prefill"])
    print(f"{ctx:>7} {ga:9.2f} {gb:9.2f} {100 * (gb - ga) / ga:+7.1f}% {pa:10.1f} {pb:10.1f} {100 * (pb - pa) / pa:+7.1f}%")
PY
[ -s "$LOG/ab.txt" ] || rc=1
cat "$LOG/ab.txt"
exit $rc
