#!/usr/bin/env bash
# Usage: scripts/gpu.sh numerics [--dry-run]
# Summary: fast and plain against reference on the full-size synthetic Flash: mean |Δ logprob| of reference's top-20 tokens over a greedy continuation
# Environment: PROMPTS ("122 3000"), STEPS (24), PRESET (flash-q2)
#
# Issue #37's accuracy check of `--numerics fast` (docs/design-notes/fast-numerics.md) on the GPU machine.
# For each prompt length L of $PROMPTS (random token ids from [1000, 120000), seeded by L):
#   1. `dsv4 logits --numerics reference --greedy $STEPS --tokens-out` continues it greedily;
#   2. reference, plain and fast each compute the logits at the $STEPS positions that predict that
#      continuation (teacher-forced: the same tokens for all three; `--positions`);
#   3. per position, the mean over reference's 20 most likely tokens of |logprob - reference's logprob|,
#      averaged over the positions, and how often the top-1 token differs from reference's.
# The bar: fast's distance no larger than plain's (reference vs plain: measured 0.20 on the 122-token
# prompt; random weights amplify rounding differences, so both are large).
# The model: `--synthetic $PRESET` (generated in memory by each run: no 80 GiB file in /dev/shm, which a host
# with 128 GiB of RAM may not hold; an H100 keeps the experts that do not fit in host memory).
# Output: numerics.txt (the table, printed last) and the logs in ./out ($OUT with the device tool).
GPU_NAME=numerics
# shellcheck source=scripts/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
set -uo pipefail
gpu_args "" "$@"
PROMPTS=${PROMPTS:-"122 3000"}
STEPS=${STEPS:-24}
PRESET=${PRESET:-flash-q2}
gpu_need_uint STEPS
for l in $PROMPTS; do [[ $l =~ ^[1-9][0-9]*$ ]] || gpu_die "PROMPTS: $l is not a token count"; done
[[ $PRESET =~ ^[A-Za-z0-9_.-]+$ ]] || gpu_die "PRESET=$PRESET is not a preset name"
gpu_probe
gpu_use_run_libs
gpu_binaries dsv4
DSV4=$GPU_RUN/bin/dsv4
gpu_out_flat
rc=0
for L in $PROMPTS; do
  prompt=$LOG/prompt-$L.txt seq=$LOG/seq-$L.txt
  gpu_run --out "$prompt" python3 -c \
    "import random; r = random.Random($L); print(','.join(str(r.randrange(1000, 120000)) for _ in range($L)))"
  gpu_run --log "$LOG/greedy-$L.log" "$DSV4" logits --synthetic "$PRESET" --backend cuda --numerics reference \
    --tokens-file "$prompt" --positions $((L - 1)) --greedy "$STEPS" --tokens-out "$seq" -o "$LOG/greedy-$L.f32" || rc=1
  positions=$(seq -s, $((L - 1)) $((L + STEPS - 2)))
  for num in reference plain fast; do
    gpu_run --log "$LOG/$num-$L.log" "$DSV4" logits --synthetic "$PRESET" --backend cuda --numerics "$num" \
      --tokens-file "$seq" --positions "$positions" -o "$LOG/$num-$L.f32" || rc=1
  done
done
gpu_dry_run && exit 0
read -ra lens <<<"$PROMPTS"
python3 - "$LOG" "$STEPS" "${lens[@]}" >"$LOG/numerics.txt" <<'PY'
import array, math, sys
log, steps, prompts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]


def logprob_rows(num, L):
    a = array.array("f")
    with open(f"{log}/{num}-{L}.f32", "rb") as f:
        a.frombytes(f.read())
    V = len(a) // steps
    out = []
    for s in range(steps):
        row = a[s * V:(s + 1) * V]
        m = max(row)
        lse = m + math.log(math.fsum(math.exp(v - m) for v in row))
        out.append([v - lse for v in row])
    return out


print(f"mean |d logprob| of reference's top-20 tokens over {steps} greedy steps (teacher-forced), top-1 changes")
print(f"{'prompt':>7} {'numerics':>9} {'vs reference':>13} {'top-1 differs':>14}")
for L in prompts:
    ref = logprob_rows("reference", L)
    tops = [sorted(range(len(r)), key=lambda v: -r[v])[:20] for r in ref]
    for num in ("plain", "fast"):
        x = logprob_rows(num, L)
        d = sum(abs(x[s][v] - ref[s][v]) for s in range(steps) for v in tops[s]) / (20 * steps)
        flips = sum(max(range(len(x[s])), key=lambda v: x[s][v]) != tops[s][0] for s in range(steps))
        print(f"{L:>7} {num:>9} {d:>13.4f} {flips:>9} / {steps}")
PY
cat "$LOG/numerics.txt"
exit $rc
