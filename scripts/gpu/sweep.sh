#!/usr/bin/env bash
# Usage: SWEEP='NAME: [VAR=VALUE ...] [--FLAG[=VALUE] ...] [@BINARY]; ...' scripts/gpu.sh sweep [--dry-run]
# Summary: several configurations of dsv4 bench round-robin in one call: medians per frontier, change vs the first
# Environment: SWEEP (required), ROUNDS (2), CTX_START (2048), CTX_MAX (4096), GEN (64), PRESET (flash-q2), BENCH_FLAGS, DSV4
#
# Model-level comparison of several configurations on the GPU machine:
# `dsv4 bench --synthetic flash-q2` run for each configuration in turn, ROUNDS
# times round-robin in one call, so host-to-host variance (up to +-4% between
# the machines the device tool hands out) and drift within the call cancel;
# prints the median decode and prefill rate of each configuration per frontier
# and its change against the first. It uses build-device-run/bin/dsv4 (unpacked
# from build-device/ when missing); run it after scripts/gpu.sh check in the same call:
#
#   device tool: command "scripts/gpu.sh check --quick; SWEEP='off: --no-cuda-branches
#                on:' scripts/gpu.sh sweep", carry ["build-device"]
#
# SWEEP: one configuration per line (or separated by ';'), "NAME: [VAR=VALUE ...] [--FLAG[=VALUE] ...] [@BINARY]":
#   NAME      letters, digits, '-', '_' (the first line is the baseline)
#   VAR=VALUE environment for that configuration's runs (an experiment's temporary knob)
#   --FLAG[=VALUE]  more `dsv4 bench` flags for that configuration only (e.g. --batch=2048,
#             --no-tensor-cores, --no-int-dot, --cublas=off); BENCH_FLAGS applies to every configuration
#   @BINARY   another dsv4 (plain or .xz, e.g. @build-device/a-dsv4.xz carried beside
#             the payload, whose lib/ it loads: carry build-device with it); default: this
#             payload's dsv4 (DSV4 picks another). A dsv4 stripped and xz -9'd is ~10 MiB.
# Variables: ROUNDS (default 2), CTX_START (2048), CTX_MAX (4096), GEN (64 decoded
#          tokens per frontier), PRESET (flash-q2), BENCH_FLAGS.
# Output: <name>-<round>.csv/.log and sweep.txt (printed last) in ./out; with the device tool (OUT set)
# packed into $OUT/sweep-logs.tgz, sweep.txt copied to $OUT/sweep.txt (scripts/gpu/lib.sh).
# Each run loads the model (~30-40 s for flash-q2 at 2K..4K): budget configurations x rounds runs.
# scripts/gpu.sh ab is the two-configuration front end (AB_FLAG / AB_ENV / AB_BIN).
# --dry-run checks SWEEP and prints each run's command.
GPU_NAME=${GPU_SWEEP_AS:-sweep}  # scripts/gpu/ab.sh runs it as "ab"
# shellcheck source=scripts/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
set -uo pipefail
gpu_args "" "$@"
ROUNDS=${ROUNDS:-2}
CTX_START=${CTX_START:-2048}
CTX_MAX=${CTX_MAX:-4096}
GEN=${GEN:-64}
PRESET=${PRESET:-flash-q2}
DSV4=${DSV4:-$GPU_RUN/bin/dsv4}
[ -n "${SWEEP:-}" ] || gpu_die "set SWEEP to one configuration per line, 'NAME: [VAR=VALUE ...] [--FLAG[=VALUE] ...] [@BINARY]'"
gpu_need_pos ROUNDS
gpu_need_uint CTX_START CTX_MAX GEN

# Parse SWEEP into names[], envs[] (space-separated VAR=VALUE words), flags[] (--FLAG words) and srcs[] (@BINARY
# or empty: DSV4).
names=() envs=() flags=() srcs=()
while IFS= read -r line; do
  line=${line#"${line%%[![:space:]]*}"}
  [ -z "$line" ] && continue
  [[ $line == *:* ]] || gpu_die "configuration '$line' has no 'NAME:'"
  name=${line%%:*} rest=${line#*:}
  [[ $name =~ ^[A-Za-z0-9_-]+$ ]] || gpu_die "configuration name '$name' (letters, digits, - and _ only)"
  for n in "${names[@]}"; do [ "$n" = "$name" ] && gpu_die "configuration name '$name' given twice"; done
  env_words="" flag_words="" src=""
  for word in $rest; do
    if [[ $word == @* ]]; then
      src=${word#@}
      [ -f "$src" ] || gpu_dry_run || gpu_die "$name: binary $src not found"
    elif [[ $word =~ ^[A-Za-z_][A-Za-z0-9_]*=.*$ ]]; then
      env_words+="$word "
    elif [[ $word == --?* ]]; then
      flag_words+="$word "
    else
      gpu_die "$name: '$word' is neither VAR=VALUE, --FLAG[=VALUE] nor @BINARY"
    fi
  done
  names+=("$name") envs+=("$env_words") flags+=("$flag_words") srcs+=("$src")
  [ -n "$src" ] && any_binary=1
done <<<"${SWEEP//;/$'\n'}"
[ "${#names[@]}" -ge 2 ] || gpu_die "SWEEP needs at least two configurations"

gpu_probe
gpu_use_run_libs
for src in "${srcs[@]}"; do
  if [ -z "$src" ]; then  # a configuration on this payload's dsv4
    [ "$DSV4" = "$GPU_RUN/bin/dsv4" ] && gpu_binaries dsv4 && unpacked=1
    gpu_exists "$DSV4" || gpu_die "DSV4=$DSV4 is not an executable"
    break
  fi
done
# @BINARY builds load the shared libraries the payload bundles in its lib/ (ICU, OpenSSL, httplib, ...).
[ -z "${any_binary:-}" ] || [ -n "${unpacked:-}" ] || [ -d "$GPU_RUN/lib" ] || [ ! -f "$GPU_PAYLOAD" ] || gpu_unpack ||
  gpu_die "cannot unpack $GPU_PAYLOAD"
gpu_out_begin sweep
gpu_out_keep sweep.txt sweep.txt

bins=()
for i in "${!names[@]}"; do
  src=${srcs[$i]} bin=$DSV4
  if [ -n "$src" ]; then
    bin=$LOG/bin-${names[$i]}
    case "$src" in
      *.xz) gpu_run --out "$bin" xz -dc "$src" || gpu_die "${names[$i]}: cannot unpack $src" ;;
      *) gpu_run cp "$src" "$bin" || gpu_die "${names[$i]}: cannot copy $src" ;;
    esac
    gpu_run chmod +x "$bin"
  fi
  bins+=("$bin")
done

# Every binary must load before the first run (a missing library would fail each run alike).
if ! gpu_dry_run; then
  for bin in $(printf '%s\n' "${bins[@]}" | sort -u); do
    missing=$(ldd "$bin" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' ')
    [ -z "$missing" ] || gpu_die "$bin cannot load ${missing% }: carry build-device too (its lib/ bundles them;" \
      "unpacked into $GPU_RUN/lib)"
  done
fi

# shellcheck disable=SC2206 # BENCH_FLAGS: extra dsv4 bench flags, word-split on purpose
args=(bench --synthetic "$PRESET" --backend cuda --ctx-start "$CTX_START" --ctx-max "$CTX_MAX" --gen-tokens "$GEN"
  ${BENCH_FLAGS:-})
rc=0
for r in $(seq 1 "$ROUNDS"); do
  for i in "${!names[@]}"; do
    # shellcheck disable=SC2086 # envs[i] / flags[i]: VAR=VALUE and --FLAG words, split on purpose
    gpu_run --log "$LOG/${names[$i]}-$r.log" env ${envs[$i]} "${bins[$i]}" "${args[@]}" ${flags[$i]} \
      --csv "$LOG/${names[$i]}-$r.csv" ||
      { echo "gpu.sh $GPU_NAME: ${names[$i]} round $r failed (see $LOG/${names[$i]}-$r.log)" >&2; rc=1; }
  done
done
gpu_dry_run && exit 0
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
    sys.exit("gpu.sh sweep: no frontier measured by every configuration")
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
