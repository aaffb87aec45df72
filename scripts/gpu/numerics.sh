#!/usr/bin/env bash
# Usage: scripts/gpu.sh numerics [--dry-run]
# Summary: fast and plain against reference on the full-size synthetic Flash: mean |Δ logprob| of reference's top-20 tokens over a greedy continuation
# Environment: PROMPTS ("122 3000"), REPEATS (1), STEPS (24), PRESET (flash-q2), FAST_SKIPS, FAST_ATTN_TERMS
#
# Issue #37's accuracy check of `--numerics fast` (docs/design-notes/fast-numerics.md) on the GPU machine.
# For each prompt length L of $PROMPTS, $REPEATS prompts (random token ids from [1000, 120000), the first
# seeded by L, the others by 1000 L + r):
#   1. `dsv4 logits --numerics reference --greedy $STEPS --tokens-out` continues each greedily;
#   2. reference, plain and fast each compute the logits at the $STEPS positions that predict that
#      continuation (teacher-forced: the same tokens for all three; `--positions`);
#   3. per position, the mean over reference's 20 most likely tokens of |logprob - reference's logprob|,
#      averaged over the positions, and how often the top-1 token differs from reference's; with
#      REPEATS > 1 also per length the mean and range over its prompts, and on how many fast <= plain.
# Each step is one process over every prompt (`--tokens-file` repeated: one model load, a session each).
# FAST_SKIPS="none;attn-in,q": more columns, fast with those inputs left unquantised (`--fast-skip`; the
# `fast` column is the default set, attn-in unquantised; `none` quantises every input).
# FAST_ATTN_TERMS="3;2": more columns, fast with q and P in the attention as that many bf16 terms
# (`--fast-attention-terms`; the `fast` column takes the default, 1).
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
REPEATS=${REPEATS:-1}
PRESET=${PRESET:-flash-q2}
gpu_need_uint STEPS REPEATS
[ "$REPEATS" -ge 1 ] || gpu_die "REPEATS=$REPEATS: want at least one prompt per length"
for l in $PROMPTS; do [[ $l =~ ^[1-9][0-9]*$ ]] || gpu_die "PROMPTS: $l is not a token count"; done
[[ $PRESET =~ ^[A-Za-z0-9_.-]+$ ]] || gpu_die "PRESET=$PRESET is not a preset name"
IFS=';' read -ra attn_terms <<<"${FAST_ATTN_TERMS:-}"
for at in "${attn_terms[@]}"; do
  [[ ${at// /} =~ ^[123]?$ ]] || gpu_die "FAST_ATTN_TERMS: $at is not 1, 2 or 3"
done
gpu_probe
gpu_use_run_libs
gpu_binaries dsv4
DSV4=$GPU_RUN/bin/dsv4
gpu_out_flat
rc=0
# The prompts: REPEATS of each length, the first seeded by L (the prompt of the measurements before REPEATS),
# the others by 1000 L + r. One process per numerics runs them all (a session each, one model load).
names=() prompt_args=() seq_in=() seq_out=()
for L in $PROMPTS; do
  for ((r = 0; r < REPEATS; r++)); do
    name=$L seed=$L
    [ "$r" -gt 0 ] && name=$L-$r seed=$((1000 * L + r))
    names+=("$name")
    gpu_run --out "$LOG/prompt-$name.txt" python3 -c \
      "import random; r = random.Random($seed); print(','.join(str(r.randrange(1000, 120000)) for _ in range($L)))"
    prompt_args+=(--tokens-file "$LOG/prompt-$name.txt")
    seq_out+=(--tokens-out "$LOG/seq-$name.txt")
    seq_in+=(--tokens-file "$LOG/seq-$name.txt")
  done
done
# 1. reference continues each prompt greedily; 2. each numerics, teacher-forced on those tokens, at the
# STEPS positions that predict the continuation (from the end: -(STEPS + 1) .. -2).
gpu_run --log "$LOG/greedy.log" "$DSV4" logits --synthetic "$PRESET" --backend cuda --numerics reference \
  "${prompt_args[@]}" --positions -1 --greedy "$STEPS" "${seq_out[@]}" -o "$LOG/greedy.f32" || rc=1
positions=$(seq -s, -$((STEPS + 1)) -2)
columns=(plain fast)
for num in reference plain fast; do
  gpu_run --log "$LOG/$num.log" "$DSV4" logits --synthetic "$PRESET" --backend cuda --numerics "$num" \
    "${seq_in[@]}" --positions "$positions" -o "$LOG/$num.f32" || rc=1
done
IFS=';' read -ra skips <<<"${FAST_SKIPS:-}"
for skip in "${skips[@]}"; do
  skip=${skip// /}
  [ -n "$skip" ] || continue
  columns+=("fast-$skip")
  gpu_run --log "$LOG/fast-$skip.log" "$DSV4" logits --synthetic "$PRESET" --backend cuda --numerics fast \
    --fast-skip "$skip" "${seq_in[@]}" --positions "$positions" -o "$LOG/fast-$skip.f32" || rc=1
done
for at in "${attn_terms[@]}"; do
  at=${at// /}
  [ -n "$at" ] || continue
  columns+=("fast-attn$at")
  gpu_run --log "$LOG/fast-attn$at.log" "$DSV4" logits --synthetic "$PRESET" --backend cuda --numerics fast \
    --fast-attention-terms "$at" "${seq_in[@]}" --positions "$positions" -o "$LOG/fast-attn$at.f32" || rc=1
done
gpu_dry_run && exit 0
python3 - "$LOG" "$STEPS" "${columns[*]}" "${names[@]}" >"$LOG/numerics.txt" <<'PY'
import array, math, statistics, sys
log, steps, columns, names = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]


def logprob_rows(num):
    a = array.array("f")
    with open(f"{log}/{num}.f32", "rb") as f:
        a.frombytes(f.read())
    rows = len(names) * steps
    V = len(a) // rows
    out = []
    for s in range(rows):
        row = a[s * V:(s + 1) * V]
        m = max(row)
        lse = m + math.log(math.fsum(math.exp(v - m) for v in row))
        out.append([v - lse for v in row])
    return out


ref = logprob_rows("reference")
tops = [sorted(range(len(r)), key=lambda v: -r[v])[:20] for r in ref]
dist, flips = {}, {}
for num in columns:
    x = logprob_rows(num)
    for i, name in enumerate(names):
        rs = range(i * steps, (i + 1) * steps)
        dist[num, name] = sum(abs(x[s][v] - ref[s][v]) for s in rs for v in tops[s]) / (20 * steps)
        flips[num, name] = sum(max(range(len(x[s])), key=lambda v: x[s][v]) != tops[s][0] for s in rs)
print(f"against reference over {steps} greedy steps (teacher-forced): mean |d logprob| of reference's top-20 tokens,")
print(f"and at how many steps the top-1 token differs (columns: numerics, fast-SITES: fast with --fast-skip SITES)")
print(f"{'prompt':>8}" + "".join(f" {c:>16} {'top-1':>5}" for c in columns))
for name in names:
    print(f"{name:>8}" + "".join(f" {dist[c, name]:>16.4f} {flips[c, name]:>5}" for c in columns))
lengths = list(dict.fromkeys(n.split("-")[0] for n in names))
if len(lengths) < len(names):  # REPEATS > 1: per length, the mean over its prompts and the wins against plain
    print("per length over its prompts: mean (min .. max), and on how many it is <= plain")
    for L in lengths:
        mine = [n for n in names if n.split("-")[0] == L]
        p = [dist["plain", n] for n in mine]
        for c in columns:
            d = [dist[c, n] for n in mine]
            wins = sum(b <= a for a, b in zip(p, d))
            print(f"{L:>8} {c:>16} {statistics.mean(d):.4f} ({min(d):.4f} .. {max(d):.4f})"
                  + ("" if c == "plain" else f"  <= plain on {wins} of {len(mine)}"))
PY
cat "$LOG/numerics.txt"
exit $rc
