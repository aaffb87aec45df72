#!/usr/bin/env bash
# Model-level comparison of several configurations on the GPU machine:
# `dsv4 bench --synthetic flash-q2` run for each configuration in turn, ROUNDS
# times round-robin in one call, so host-to-host variance (up to +-4% between
# the machines the device tool hands out) and drift within the call cancel;
# prints the median decode and prefill rate of each configuration per frontier
# and its change against the first. Run after scripts/gpu.sh check in the
# same call (it unpacks build-device/):
#
#   device tool: command "scripts/gpu.sh check --quick; SWEEP='off: --no-cuda-branches
#                on:' scripts/device-sweep.sh", carry ["build-device"]
#
# SWEEP: one configuration per line (or separated by ';'), "NAME: [VAR=VALUE ...] [--FLAG[=VALUE] ...] [@BINARY]":
#   NAME      letters, digits, '-', '_' (the first line is the baseline)
#   VAR=VALUE environment for that configuration's runs (an experiment's temporary knob)
#   --FLAG[=VALUE]  more `dsv4 bench` flags for that configuration only (e.g. --batch=2048,
#             --no-tensor-cores, --no-int-dot, --cublas=off); BENCH_FLAGS applies to every configuration
#   @BINARY   another dsv4 (plain or .xz, e.g. @build-device/a-dsv4.xz carried beside
#             the payload); default: this payload's dsv4
# Options: env ROUNDS (default 2), CTX_START (2048), CTX_MAX (4096), GEN (64 decoded
#          tokens per frontier), PRESET (flash-q2), BENCH_FLAGS.
# Output: <name>-<round>.csv/.log and sweep.txt (printed last) in ./out; with the device tool (OUT set)
# packed into $OUT/sweep-logs.tgz, sweep.txt copied to $OUT/sweep.txt (scripts/device-out.sh).
# Each run loads the model (~30-40 s for flash-q2 at 2K..4K): budget configurations x rounds runs.
# scripts/device-ab.sh is the two-configuration front end (AB_FLAG / AB_ENV / AB_BIN).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
# shellcheck source=scripts/device-out.sh
. scripts/device-out.sh
device_out_begin sweep
device_out_keep sweep.txt sweep.txt
ROUNDS=${ROUNDS:-2}
CTX_START=${CTX_START:-2048}
CTX_MAX=${CTX_MAX:-4096}
GEN=${GEN:-64}
PRESET=${PRESET:-flash-q2}
DSV4=${DSV4:-build-device-run/bin/dsv4}
export LD_LIBRARY_PATH="$PWD/build-device-run/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
die() { echo "device-sweep: $*" >&2; exit 2; }
[ -n "${SWEEP:-}" ] || die "set SWEEP to one configuration per line, 'NAME: [VAR=VALUE ...] [@BINARY]'"
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS=$ROUNDS is not a positive number"

# Parse SWEEP into names[], envs[] (space-separated VAR=VALUE words), flags[] (--FLAG words) and bins[].
names=() envs=() flags=() bins=()
while IFS= read -r line; do
  line=${line#"${line%%[![:space:]]*}"}
  [ -z "$line" ] && continue
  [[ $line == *:* ]] || die "configuration '$line' has no 'NAME:'"
  name=${line%%:*} rest=${line#*:}
  [[ $name =~ ^[A-Za-z0-9_-]+$ ]] || die "configuration name '$name' (letters, digits, - and _ only)"
  for n in "${names[@]}"; do [ "$n" = "$name" ] && die "configuration name '$name' given twice"; done
  env_words="" flag_words="" bin=$DSV4
  for word in $rest; do
    if [[ $word == @* ]]; then
      src=${word#@}
      [ -f "$src" ] || die "$name: binary $src not found"
      bin=$LOG/bin-$name
      case "$src" in
        *.xz) xz -dc "$src" >"$bin" || die "$name: cannot unpack $src" ;;
        *) cp "$src" "$bin" || die "$name: cannot copy $src" ;;
      esac
      chmod +x "$bin"
    elif [[ $word =~ ^[A-Za-z_][A-Za-z0-9_]*=.*$ ]]; then
      env_words+="$word "
    elif [[ $word == --?* ]]; then
      flag_words+="$word "
    else
      die "$name: '$word' is neither VAR=VALUE, --FLAG[=VALUE] nor @BINARY"
    fi
  done
  [ -x "$bin" ] || die "$bin missing: run scripts/gpu.sh check first (it unpacks build-device/)"
  names+=("$name") envs+=("$env_words") flags+=("$flag_words") bins+=("$bin")
done <<<"${SWEEP//;/$'\n'}"
[ "${#names[@]}" -ge 2 ] || die "SWEEP needs at least two configurations"

# shellcheck disable=SC2206 # BENCH_FLAGS: extra dsv4 bench flags, word-split on purpose
args=(bench --synthetic "$PRESET" --backend cuda --ctx-start "$CTX_START" --ctx-max "$CTX_MAX" --gen-tokens "$GEN"
  ${BENCH_FLAGS:-})
rc=0
for r in $(seq 1 "$ROUNDS"); do
  for i in "${!names[@]}"; do
    # shellcheck disable=SC2086 # envs[i] / flags[i]: VAR=VALUE and --FLAG words, split on purpose
    env ${envs[$i]} "${bins[$i]}" "${args[@]}" ${flags[$i]} --csv "$LOG/${names[$i]}-$r.csv" >"$LOG/${names[$i]}-$r.log" 2>&1 ||
      { echo "device-sweep: ${names[$i]} round $r failed (see $LOG/${names[$i]}-$r.log)" >&2; rc=1; }
  done
done
rm -f "$LOG"/bin-*
{
  for i in "${!names[@]}"; do echo "# ${names[$i]}: ${envs[$i]:-(no env)} ${flags[$i]}${bins[$i]##*/}"; done
} >"$LOG/sweep.txt"
python3 - "$LOG" "$ROUNDS" "${names[@]}" >>"$LOG/sweep.txt" <<'PY' || rc=1
import csv, statistics, sys
log, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def rates(name):
    out = {}  # ctx -> {"gen": [...], "prefill": [...]}
    for r in range(1, rounds + 1):
        try:
            rows = [l for l in open(f"{log}/{name}-{r}.csv") if not l.startswith("#")]
        except OSError:
            continue
        for row in csv.DictReader(rows):
            d = out.setdefault(int(row["ctx"]), {"gen": [], "prefill": []})
            d["gen"].append(float(row["gen_tps"]))
            d["prefill"].append(float(row["prefill_tps"]))
    return out
data = {n: rates(n) for n in names}
ctxs = sorted(set.intersection(*(set(d) for d in data.values())))
if not ctxs:
    sys.exit("device-sweep: no frontier measured by every configuration")
print(f"# medians of up to {rounds} runs per configuration (t/s); change against {names[0]}")
for metric, label in (("gen", "decode"), ("prefill", "prefill")):
    head = f"{'ctx':>7}" + "".join(f" {label + ' ' + n:>18}" for n in names) + "".join(f" {'chg ' + n:>10}" for n in names[1:])
    print(head)
    for ctx in ctxs:
        med = [statistics.median(data[n][ctx][metric]) for n in names]
        line = f"{ctx:>7}" + "".join(f" {m:18.2f}" for m in med)
        line += "".join(f" {100 * (m - med[0]) / med[0]:+9.1f}%" for m in med[1:])
        print(line)
PY
cat "$LOG/sweep.txt"
exit $rc
