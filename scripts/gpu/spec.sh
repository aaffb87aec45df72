#!/usr/bin/env bash
# Usage: scripts/gpu.sh spec [--dry-run]
# Summary: speculative decoding: verify-pass cost vs a decode step (k = 1..5), replayed proposals, greedy identity
# Environment: CTX (2048), GEN (64), K (5), TINY_GEN (512), MODEL (a flash-q2 file instead of generating it)
#
# The numbers issue #36 asks for, on the GPU machine (docs/SPECULATIVE.md, PERFORMANCE.md):
#   1. flash-q2 (generated in memory): dsv4 bench --verify K at CTX — a verify pass of 1 + k tokens against
#      a decode step for k = 1..K (GEN passes each), proposals that replay the greedy continuation (tokens per
#      pass, and whether the output stays the plain one), the projection at published acceptance rates;
#   2. tiny with TINY_GEN tokens: the same, where "same_output" says from which token a batched verify pass
#      first resolves a near-tie differently from single-token decode (CUDA is not bitwise across batch sizes),
#      and the teacher-forced table counts the rows whose argmax differs from decode's;
#   3. both again with --no-tensor-cores (FFMA tiles: a verify pass sums as decode does, so no row may differ
#      and replayed proposals give k + 1 tokens a pass on CUDA too);
#   4. flash-q2 again with --no-token-matvec (passes of 2-4 rows on the tensor-core tile: the A/B of the token
#      matvec, which gives those rows decode's dense sums);
#   5. flash-q2 with --no-cuda-graphs: verify passes (k <= 3) against decode steps, and batched steps of 2 and
#      3 streams, all launched op by op — what a pass costs beyond a batched step of as many rows (its
#      snapshots, logits read back and commit).
#
#   device tool: command "scripts/gpu.sh spec", carry ["build-device"]
# Output: spec-flash-q2.csv, spec-tiny.csv, spec-*-ffma.csv, spec-flash-q2-tile.csv, spec-flash-q2-eager.csv,
# spec-flash-q2-c2-eager.csv, spec-flash-q2-c3-eager.csv in ./out ($OUT with the device tool), also printed.
GPU_NAME=spec
# shellcheck source=scripts/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
set -uo pipefail
gpu_args "" "$@"
CTX=${CTX:-2048}
GEN=${GEN:-64}
K=${K:-5}
TINY_GEN=${TINY_GEN:-512}
gpu_probe
gpu_binaries dsv4
gpu_use_run_libs
gpu_out_flat
rc=0
flash=(--synthetic flash-q2)
[ -n "${MODEL:-}" ] && flash=(-m "$MODEL")
gpu_run timeout 900 "$GPU_RUN/bin/dsv4" bench "${flash[@]}" --ctx-start "$CTX" --gen-tokens "$GEN" \
  --verify "$K" --csv "$LOG/spec-flash-q2.csv" || rc=1
gpu_run timeout 300 "$GPU_RUN/bin/dsv4" bench --synthetic tiny --ctx-start "$CTX" --gen-tokens "$TINY_GEN" \
  --verify "$K" --csv "$LOG/spec-tiny.csv" || rc=1
gpu_run timeout 300 "$GPU_RUN/bin/dsv4" bench --synthetic tiny --ctx-start "$CTX" --gen-tokens "$TINY_GEN" \
  --verify "$K" --no-tensor-cores --csv "$LOG/spec-tiny-ffma.csv" || rc=1
gpu_run timeout 900 "$GPU_RUN/bin/dsv4" bench "${flash[@]}" --ctx-start "$CTX" --gen-tokens "$GEN" \
  --verify "$K" --no-tensor-cores --csv "$LOG/spec-flash-q2-ffma.csv" || rc=1
gpu_run timeout 900 "$GPU_RUN/bin/dsv4" bench "${flash[@]}" --ctx-start "$CTX" --gen-tokens "$GEN" \
  --verify "$K" --no-token-matvec --csv "$LOG/spec-flash-q2-tile.csv" || rc=1
gpu_run timeout 900 "$GPU_RUN/bin/dsv4" bench "${flash[@]}" --ctx-start "$CTX" --gen-tokens "$GEN" \
  --verify 3 --no-cuda-graphs --csv "$LOG/spec-flash-q2-eager.csv" || rc=1
for c in 2 3; do
  gpu_run timeout 900 "$GPU_RUN/bin/dsv4" bench "${flash[@]}" --ctx-start "$CTX" --gen-tokens "$GEN" \
    --concurrency "$c" --no-cuda-graphs --csv "$LOG/spec-flash-q2-c$c-eager.csv" || rc=1
done
gpu_dry_run && exit 0
exit $rc
