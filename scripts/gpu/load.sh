#!/usr/bin/env bash
# Usage: scripts/gpu.sh load [--dry-run]
# Summary: dsv4 serve --parallel on the full-size synthetic Flash under HTTP load (scripts/load_test.py), table last
# Environment: PARALLEL (64), CLIENTS ("1 4 16 64"), GEN (128), CTX (32768), LONG_WORDS (17000; 0: no long, mixed, short runs), STEP_TOKENS, PREFILL_CHUNK, PRESET (flash-q2), KEEP=1
#
# Continuous batching measured through the server (issue #34): a synth file of
# the preset in /dev/shm (skipped if present), `dsv4 serve --backend cuda
# --parallel $PARALLEL --ctx $CTX`, then scripts/load_test.py against it:
#   streams   for each N in $CLIENTS: N clients, N requests of $GEN tokens
#             (greedy, ignore_eos, thinking off): TTFT and inter-token p50/p99,
#             aggregate and per-stream decode tokens/s
#   long      one prompt of $LONG_WORDS words alone (its prefill rate)
#   mixed     the same long prompt, and 15 streams of $GEN tokens arriving
#             0.5 s into its prefill (its prefill rate beside them, their TTFT)
#   short     the long prompt and one 64-token request arriving during its
#             prefill (that request's time to first token)
# Logs in ./out (OUT set: packed into $OUT/load-logs.tgz, with load.jsonl and
# load-summary.txt beside it).
GPU_NAME=load
# shellcheck source=scripts/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
set -uo pipefail
gpu_args "" "$@"
PARALLEL=${PARALLEL:-64}
CLIENTS=${CLIENTS:-"1 4 16 64"}
GEN=${GEN:-128}
CTX=${CTX:-32768}
LONG_WORDS=${LONG_WORDS:-17000}
STEP_TOKENS=${STEP_TOKENS:-0}
PREFILL_CHUNK=${PREFILL_CHUNK:-0}
PRESET=${PRESET:-flash-q2}
KEEP=${KEEP:-0}
gpu_need_uint PARALLEL GEN CTX LONG_WORDS STEP_TOKENS PREFILL_CHUNK KEEP
[[ $PRESET =~ ^[A-Za-z0-9_.-]+$ ]] || gpu_die "PRESET=$PRESET is not a preset name"
gpu_probe
gpu_use_run_libs
gpu_binaries dsv4
DSV4=$GPU_RUN/bin/dsv4
gpu_out_begin load
gpu_out_keep load.jsonl load.jsonl
gpu_out_keep summary.txt load-summary.txt
MODEL=/dev/shm/$PRESET.gguf
if [ ! -f "$MODEL" ]; then
  gpu_run --log "$LOG/synth.log" "$DSV4" synth --preset "$PRESET" -o "$MODEL" || gpu_die "synth failed (synth.log)"
fi
if gpu_dry_run; then
  gpu_show "$DSV4" serve -m "$MODEL" --backend cuda --ctx "$CTX" --parallel "$PARALLEL" --step-tokens "$STEP_TOKENS" --prefill-chunk "$PREFILL_CHUNK" --port 0
  gpu_show python3 scripts/load_test.py --url URL --clients N --requests N --max-tokens "$GEN"
  exit 0
fi
"$DSV4" serve -m "$MODEL" --backend cuda --ctx "$CTX" --parallel "$PARALLEL" --step-tokens "$STEP_TOKENS" --prefill-chunk "$PREFILL_CHUNK" --port 0 \
  --queue 256 >"$LOG/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; gpu_exit' EXIT
port=""
for _ in $(seq 1 600); do
  port=$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$LOG/serve.log" | head -1)
  [ -n "$port" ] && break
  kill -0 $SERVER 2>/dev/null || break
  sleep 1
done
[ -n "$port" ] || { tail -20 "$LOG/serve.log"; gpu_die "dsv4 serve did not start (serve.log)"; }
URL=http://127.0.0.1:$port
load() {  # name, load_test.py flags...
  local name=$1
  shift
  python3 scripts/load_test.py --url "$URL" --json "$LOG/load.jsonl" "$@" >"$LOG/load-$name.log" 2>&1 ||
    echo "gpu.sh load: $name failed (load-$name.log)" >&2
  echo "$name $(tail -1 "$LOG/load-$name.log")" >>"$LOG/results.txt"
}
for n in $CLIENTS; do load "streams-$n" --clients "$n" --requests "$n" --max-tokens "$GEN" --prompt-words 16; done
if [ "$LONG_WORDS" -gt 0 ]; then
  load long --clients 0 --long-words "$LONG_WORDS"
  load mixed --clients 15 --requests 15 --max-tokens "$GEN" --prompt-words 16 --long-words "$LONG_WORDS"
  load short --clients 1 --requests 1 --max-tokens 64 --prompt-words 16 --long-words "$LONG_WORDS"
fi
curl -s "$URL/metrics" >"$LOG/metrics.txt" 2>/dev/null || true
kill $SERVER 2>/dev/null
wait $SERVER 2>/dev/null
[ "$KEEP" -ne 1 ] && rm -f "$MODEL"
{
  gpu_heading load "$(gpu_device_name)"
  grep -m3 "dsv4 serve: model\|sessions\|batched" "$LOG/serve.log"
  python3 - "$LOG/results.txt" <<'PY'
import json, sys
print("%-11s %7s %9s %9s %8s %8s %9s %9s %8s" % ("run", "clients", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99",
                                               "agg_t/s", "stream_t/s", "long_t/s"))
for line in open(sys.argv[1]):
    name, _, js = line.partition(" ")
    try:
        r = json.loads(js)
    except ValueError:
        print("%-11s failed" % name)
        continue
    print("%-11s %7d %8.0fms %8.0fms %6.1fms %6.1fms %9.1f %9.1f %8s" % (
        name, r["clients"], r["ttft_p50_ms"], r["ttft_p99_ms"], r["itl_p50_ms"], r["itl_p99_ms"],
        r["aggregate_tps"], r["stream_decode_tps_mean"], r.get("long_prefill_tps", "")))
PY
} | tee "$LOG/summary.txt"
exit 0
