#!/usr/bin/env bash
# Usage: scripts/gpu.sh pipeline [--dry-run]
# Summary: layer pipeline over several GPUs (--gpus): q4 decode/prefill, q2 one GPU vs two, logits vs one GPU
# Environment: GPUS (0,1), CTX_START (2048), CTX_MAX (16384), GEN (64)
#
# The runs issue #38 asks for in "layers" mode, on the two-GPU machine kind (nvidia-h200-x2):
#   1. tiny: dsv4 logits over GPUS vs one GPU (the same kernels on the same inputs: bitwise equal expected);
#   2. flash-q2 (generated in memory): dsv4 bench on one GPU, then over GPUS, at CTX_START .. CTX_MAX;
#   3. flash-q4 (165 GB: fits no single H200): dsv4 bench over GPUS at CTX_START .. CTX_MAX.
# The hidden state crosses each boundary by a device-to-device copy (DirectTransport: Backend::copy_to);
# the "experts" mode and overlap between the stages are the next steps (docs/design-notes/multi-gpu.md).
#
#   device tool: command "scripts/gpu.sh pipeline", carry ["build-device"], kind nvidia-h200-x2
# Output: pipeline-q2-1gpu.csv, pipeline-q2.csv, pipeline-q4.csv in ./out ($OUT with the device tool).
GPU_NAME=pipeline
# shellcheck source=scripts/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
set -uo pipefail
gpu_args "" "$@"
GPUS=${GPUS:-0,1}
CTX_START=${CTX_START:-2048}
CTX_MAX=${CTX_MAX:-16384}
GEN=${GEN:-64}
gpu_probe
gpu_binaries dsv4
gpu_use_run_libs
gpu_out_flat
rc=0
dsv4=$GPU_RUN/bin/dsv4
toks=$(seq -s, 3 402)
gpu_run "$dsv4" synth --preset tiny --seed 7 -o "$LOG/tiny.gguf" || rc=1
gpu_run "$dsv4" logits -m "$LOG/tiny.gguf" --tokens "$toks" --backend cuda -o "$LOG/one.bin" || rc=1
gpu_run "$dsv4" logits -m "$LOG/tiny.gguf" --tokens "$toks" --backend cuda --gpus "$GPUS" -o "$LOG/split.bin" || rc=1
gpu_run cmp "$LOG/one.bin" "$LOG/split.bin" || rc=1
for run in "q2-1gpu flash-q2 0" "q2 flash-q2 $GPUS" "q4 flash-q4 $GPUS"; do
  read -r name preset gpus <<<"$run"
  gpu_run timeout 1500 "$dsv4" bench --synthetic "$preset" --backend cuda --gpus "$gpus" --ctx-start "$CTX_START" \
    --ctx-max "$CTX_MAX" --gen-tokens "$GEN" --csv "$LOG/pipeline-$name.csv" || rc=1
done
gpu_dry_run && exit 0
exit $rc
