#!/usr/bin/env bash
# Usage: scripts/gpu.sh check [--quick] [--rebuild] [--sanitize] [--flash | --flash-only] [--dry-run]
# Summary: every CUDA test (CUDA vs CPU) and a CLI smoke, summary table last; --flash: + the full-size check
# Environment: with --flash or --flash-only: N (2000), POSITIONS, SEED (7), NUMERICS (plain), GPU_FLAGS, CPU_LOGITS, TAG, KEEP=1, CPU_TIMEOUT (540), PRESET (flash-q2), TOKEN_MAX, GPU_BACKEND, DSV4
#
# Runs dsv4's CUDA checks on a GPU machine and prints a short summary table last.
#
# How the lead runs it (device tool, kind nvidia-h200):
#   1. here:  scripts/gpu-build-carry.sh          (builds build-device/, about 12 MiB)
#   2. there: command "scripts/gpu.sh check", carry ["build-device"]
#
# What it runs (logs: probe.txt, one <step>.log per step, summary.txt — in ./out, or
# with the device tool (OUT set) packed into $OUT/check-logs.tgz with a copy of
# summary.txt as $OUT/check-summary.txt: scripts/gpu/lib.sh):
#   test_cuda_decode  device weight decoders and roundings run on the host vs the CPU code (exact)
#   test_cuda_ops     every op, CUDA vs CPU, tiny + Flash shapes (thresholds in tests/cuda/ops_harness.h)
#   test_cuda_ops_ffma  the same on tiny shapes with --no-tensor-cores (FFMA tiles: batched == one-token, bitwise)
#   test_cuda_ops_tile  the same on tiny shapes with --no-cublas (batches of >= 128 tokens on the tensor-core
#                     tile, as on a machine without libcublas)
#   test_cuda_ops_eg  the MoE cases with --expert-gemm on (every prefill expert on the grouped wgmma GEMM of
#                     cuda_expert_wgmma.cu) and off (every one on the tile of cuda_mma.cuh); the default
#                     (auto) picks per expert by its assignments in the batch (both kernels in one batch)
#   test_cuda_ops_eg_split  the same on the grouped GEMM with IQ2_XXS weights as f16 hi/lo splits
#                     (--no-expert-gemm-codes) instead of integer codes
#   test_cuda_ops_attn2, _attn1  the attention cases with `fast` ops' q and P as 2 or 1 bf16 terms
#                     (--fast-attention-terms; 1 is dsv4's default; the test's default 3 is bitwise the
#                     reference kernel)
#   test_cuda_ops_nogather  the MoE cases with experts in host memory read in place (--no-expert-gather)
#   test_cuda_ops_cpuexp  the MoE cases with half of a decode batch's host experts computed by the CPU
#                     (--cpu-experts 0.5: 8-bit activations, tolerance k_thr_host_experts)
#   test_cuda_ops_nogc  the matmul cases with --no-gemm-cache (the cuBLAS path splitting its weights every
#                     call; the default keeps them: GemmWeightCache)
#   test_cuda_ops_f16tile  tiny shapes with --no-cublas --no-int8-tiles (tiles of int8-quantised x, `fast`
#                     numerics, on the f16 tile instead of the int8 one of cuda_mma_i8.cuh)
#   test_cuda_model   tiny synthetic model, CUDA vs CPU logits at every position of a 700-token prompt,
#                     reference, plain and fast numerics, tensor cores and FFMA tiles; chunked/decode vs whole prefill on CUDA
#                     (bitwise on FFMA tiles)
#   test_cuda_model_mxfp4  the same checks on tiny-mxfp4 (MXFP4 routed experts), 300 tokens
#   test_cuda_pipeline  tiny model as a layer pipeline over 2 and 3 CUDA backends (one GPU; two when present)
#                     vs one backend, bitwise, both numerics
#   test_cuda_offload  tiny model with experts in host memory (gathered, prefetched beside the attention, streamed
#                     from the file: bitwise; a CPU share: NMSE and greedy tokens) vs every expert resident
#   test_cuda_engine  Engine/Session on CUDA: --backend cuda/auto, decode == prefill, snapshots, rewind
#   test_cuda_memory  out of device memory while the split-weight cache holds some: it is released and the
#                     allocation succeeds; the matmuls keep their bits
#   test_cuda_golden  the Hugging Face golden fixture (f32, q8, q2 conversions, plain numerics): CUDA vs CPU
#                     at every position, and vs transformers' logits
#   cli smoke         dsv4 synth + dsv4 logits --backend cuda vs cpu (python3 + numpy compare), and
#                     --backend auto picks CUDA
#   memcheck          (--sanitize) compute-sanitizer memcheck of test_cuda_ops --no-flash
# These are the CTest label `cuda` tests of a DSV4_CUDA=ON build, run directly because a
# carried CTest tree holds this machine's paths.
#
# Binaries: build-device/dsv4-device.tar.xz (made by scripts/gpu-build-carry.sh
# on the dev machine), unpacked afresh into build-device-run/ with its lib/ on
# LD_LIBRARY_PATH, when they start here; otherwise
# the script builds test_cuda_decode, test_cuda_ops and test_cuda_model here from
# tests/cuda/standalone (needs only CMake, a C++20 compiler and nvcc — none of
# the Debian dev packages), and skips test_cuda_engine and the CLI smoke.
#
# Options: --quick (skip Flash shapes in test_cuda_ops), --rebuild (ignore
# build-device/ and build here), --sanitize (add the memcheck step), --flash (then
# the full-size check below, after the table), --flash-only (only the full-size check;
# it unpacks build-device/ itself when build-device-run/ has no dsv4), --dry-run (print
# the commands, run nothing).
# Exit code: 0 when every step passed (with --flash: and the full-size check), 2 on a usage error.
GPU_NAME=check
# shellcheck source=scripts/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
set -uo pipefail
GPU_HELP_ALSO=(scripts/gpu/flash.sh)
gpu_args "--quick --rebuild --sanitize --flash --flash-only" "$@"
flash_args=()
gpu_dry_run && flash_args=(--dry-run)
if gpu_flag --flash-only; then
  for f in --quick --rebuild --sanitize --flash; do
    gpu_flag $f && gpu_die "--flash-only runs only the full-size check: $f does not apply"
  done
  exec bash scripts/gpu/flash.sh "${flash_args[@]}"
fi
gpu_probe

checks() {  # in a subshell of its own: its logs are packed when it ends, before the full-size check
  gpu_out_begin check
  gpu_out_keep summary.txt check-summary.txt
  gpu_tmpdir WORK

  echo "== device"
  if gpu_dry_run; then
    gpu_show nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem --format=csv
  else
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem --format=csv 2>&1 |
      tee "$LOG/probe.txt"
  fi
  GPU=$(gpu_device_name)

  # ---- binaries
  BIN=""
  if ! gpu_flag --rebuild && [ -f "$GPU_PAYLOAD" ] && gpu_dry_run; then
    gpu_unpack
    echo "(dry run: then each binary's --help and dsv4 --version; if one does not start, the standalone build)"
    BIN=$GPU_RUN/bin
  elif ! gpu_flag --rebuild && [ -f "$GPU_PAYLOAD" ]; then
    if gpu_unpack; then
      gpu_use_run_libs
      ok=1
      for b in test_cuda_decode test_cuda_ops test_cuda_model test_cuda_engine; do
        echo "-- $b --help" >>"$LOG/probe.txt"
        "$GPU_RUN/bin/$b" --help >/dev/null 2>>"$LOG/probe.txt" || ok=0
      done
      # The CLI is optional (its smoke step is skipped when it is missing or does not start).
      if [ -f "$GPU_RUN/bin/dsv4" ] && ! "$GPU_RUN/bin/dsv4" --version >/dev/null 2>>"$LOG/probe.txt"; then
        echo "carried dsv4 does not start here: no CLI smoke"
        rm -f "$GPU_RUN/bin/dsv4"
      fi
      if [ "$ok" -eq 1 ]; then
        BIN=$GPU_RUN/bin
        echo "using carried binaries: $(head -1 build-device/BUILD-INFO 2>/dev/null)"
        gpu_row binaries ok 0 "carried build-device/ (commit $(sed -n 1p build-device/BUILD-INFO 2>/dev/null |
          cut -d' ' -f2- | cut -c1-12)$(grep -q uncommitted build-device/BUILD-INFO 2>/dev/null &&
          echo ' + local changes'))"
      else
        echo "carried binaries do not start here:"
        tail -8 "$LOG/probe.txt"
      fi
    else
      echo "cannot unpack $GPU_PAYLOAD"
    fi
  fi
  if [ -z "$BIN" ]; then
    gpu_dry_run && ! gpu_flag --rebuild &&
      gpu_note "dry run: no $GPU_PAYLOAD here, so the standalone build (with it: the carried binaries)"
    echo "== building the CUDA tests here (tests/cuda/standalone)"
    local gen="Unix Makefiles" t0
    command -v ninja >/dev/null && gen=Ninja
    t0=$(date +%s)
    if gpu_run --log "$LOG/build.log" cmake -S tests/cuda/standalone -B build-device-local -G "$gen" \
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 &&
      gpu_run --append "$LOG/build.log" cmake --build build-device-local -j"$(nproc)"; then
      BIN=build-device-local
      gpu_row build ok $(($(date +%s) - t0)) "standalone build here (no test_cuda_engine, no CLI smoke)"
    else
      tail -40 "$LOG/build.log"
      gpu_row build FAIL $(($(date +%s) - t0)) "see build.log"
      gpu_table "$(gpu_heading "check summary" "logs in $LOG")"
      exit 1
    fi
  fi

  # ---- tests
  run_step() {  # name, command...: the command's SUMMARY line becomes the detail
    local name=$1 summary res
    shift
    echo "== $name: $*"
    gpu_run --log "$LOG/$name.log" "$@"
    gpu_dry_run && return 0
    summary=$(grep -E '^SUMMARY' "$LOG/$name.log" | tail -1 | sed 's/^SUMMARY [^:]*: //')
    case $GPU_RC in
      0) res=ok ;;
      77) res=SKIP ;;
      *) res=FAIL ;;
    esac
    [ "$GPU_RC" -eq 0 ] || grep -E 'FAIL|fatal|error|invariant' "$LOG/$name.log" | head -25
    tail -3 "$LOG/$name.log"
    gpu_row "$name" "$res" "$GPU_SECS" "${summary:-exit code $GPU_RC}"
  }

  local ops_args=()
  gpu_flag --quick && ops_args+=(--no-flash)
  run_step test_cuda_decode "$BIN/test_cuda_decode"
  run_step test_cuda_ops "$BIN/test_cuda_ops" "${ops_args[@]}"
  run_step test_cuda_ops_ffma "$BIN/test_cuda_ops" --no-flash --no-tensor-cores
  run_step test_cuda_ops_tile "$BIN/test_cuda_ops" --no-flash --no-cublas
  run_step test_cuda_ops_eg "$BIN/test_cuda_ops" --filter moe --expert-gemm on  # Flash shapes too (also with --quick)
  run_step test_cuda_ops_eg_split "$BIN/test_cuda_ops" --filter moe --expert-gemm on --no-expert-gemm-codes
  run_step test_cuda_ops_attn2 "$BIN/test_cuda_ops" --filter attention --fast-attention-terms 2
  run_step test_cuda_ops_attn1 "$BIN/test_cuda_ops" --filter attention --fast-attention-terms 1
  run_step test_cuda_ops_noeg "$BIN/test_cuda_ops" --filter moe --expert-gemm off
  run_step test_cuda_ops_nogather "$BIN/test_cuda_ops" --filter moe_experts --no-flash --no-expert-gather
  run_step test_cuda_ops_cpuexp "$BIN/test_cuda_ops" --filter moe_experts --no-flash --cpu-experts 0.5
  run_step test_cuda_ops_nogc "$BIN/test_cuda_ops" --filter matmul --no-gemm-cache
  run_step test_cuda_ops_f16tile "$BIN/test_cuda_ops" --no-flash --no-cublas --no-int8-tiles
  run_step test_cuda_model "$BIN/test_cuda_model"
  run_step test_cuda_model_mxfp4 "$BIN/test_cuda_model" --preset tiny-mxfp4 --tokens 300
  gpu_exists "$BIN/test_cuda_offload" && run_step test_cuda_offload "$BIN/test_cuda_offload"
  gpu_exists "$BIN/test_cuda_pipeline" && run_step test_cuda_pipeline "$BIN/test_cuda_pipeline"
  gpu_exists "$BIN/test_cuda_engine" && run_step test_cuda_engine "$BIN/test_cuda_engine"
  gpu_exists "$BIN/test_cuda_memory" && run_step test_cuda_memory "$BIN/test_cuda_memory"
  gpu_exists "$BIN/test_cuda_golden" && run_step test_cuda_golden "$BIN/test_cuda_golden" --data tests/fixtures/golden/flash_tiny

  # shellcheck disable=SC2317 # cli_smoke: called by run_step
  cli_smoke() {  # dsv4 synth (tiny) and logits on cpu, cuda and auto; python3 + numpy compare
    local dsv4=$BIN/dsv4 m=$WORK/tiny.gguf toks
    "$dsv4" --version || return 1
    "$dsv4" synth --preset tiny --seed 7 -o "$m" || return 1
    toks=$(python3 -c 'import random; r = random.Random(5); print(",".join(str(r.randrange(3, 512)) for _ in range(600)))')
    "$dsv4" logits -m "$m" --tokens "$toks" --backend cpu -o "$WORK/cpu.bin" || return 1
    "$dsv4" logits -m "$m" --tokens "$toks" --backend cuda -o "$WORK/cuda.bin" || return 1
    "$dsv4" logits -m "$m" --tokens "$toks" --backend auto -o "$WORK/auto.bin" 2>"$WORK/auto.err" || return 1
    cat "$WORK/auto.err"
    grep -q "cuda:" "$WORK/auto.err" || { echo "--backend auto did not pick CUDA"; return 1; }
    cmp -s "$WORK/cuda.bin" "$WORK/auto.bin" || { echo "--backend auto and cuda logits differ"; return 1; }
    python3 - "$WORK/cpu.bin" "$WORK/cuda.bin" <<'EOF'
import sys
import numpy as np
c = np.fromfile(sys.argv[1], dtype=np.float32).reshape(-1, 512).astype(np.float64)
g = np.fromfile(sys.argv[2], dtype=np.float32).reshape(-1, 512).astype(np.float64)
nmse = ((g - c) ** 2).sum(1) / (c ** 2).sum(1)
top = (g.argmax(1) == c.argmax(1)).mean()
# Reference numerics (dsv4 logits' default): bf16 mHC state makes CUDA-vs-CPU differences saturate at the
# bf16 quantum (NMSE ~1e-4, see tests/cuda/test_cuda_model.cpp); a kernel bug gives NMSE ~1.
med, frac = np.median(nmse), (nmse <= 1e-2).mean()
ok = np.isfinite(g).all() and med <= 1e-3 and frac >= 0.95 and top >= 0.9
print(f"SUMMARY cli: {len(c)} positions, NMSE median {med:.2e} max {nmse.max():.2e}, {frac:.1%} <= 1e-2, top-1 same {top:.1%}")
sys.exit(0 if ok else 1)
EOF
  }
  if gpu_exists "$BIN/dsv4"; then
    run_step cli-smoke cli_smoke
  else
    gpu_row cli-smoke n/a 0 "no dsv4 binary here (not carried, or the standalone build)"
  fi

  if gpu_flag --sanitize; then
    if gpu_dry_run || command -v compute-sanitizer >/dev/null; then
      gpu_run --log "$LOG/memcheck.log" compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/test_cuda_ops" --no-flash
      gpu_row memcheck "$([ "$GPU_RC" -eq 0 ] && echo ok || echo FAIL)" "$GPU_SECS" \
        "$(grep -E 'ERROR SUMMARY' "$LOG/memcheck.log" 2>/dev/null | tail -1)"
    else
      gpu_row memcheck FAIL 0 "compute-sanitizer not found"
    fi
  fi
  gpu_dry_run && exit 0

  echo
  echo "== failing checks (first 40; full logs in $LOG)"
  grep -h -E ' FAIL$|^FAILED' "$LOG"/*.log 2>/dev/null | head -40
  {
    gpu_table "$(gpu_heading "check summary" "logs in $LOG")"
    echo "gpu: ${GPU:-unknown}"
  } | tee "$LOG/summary.txt"
  # A skipped step (no CUDA device) counts as a failure: this script runs on GPU machines.
  local r
  for r in "${GPU_ROWS[@]}"; do
    case "$r" in *"|FAIL|"* | *"|SKIP|"*) exit 1 ;; esac
  done
  exit 0
}

(checks)
rc=$?
if gpu_flag --flash; then
  gpu_dry_run && ! gpu_flag --rebuild && [ -f "$GPU_PAYLOAD" ] && export GPU_DRY_UNPACKED=1
  bash scripts/gpu/flash.sh "${flash_args[@]}"
  frc=$?
  [ "$rc" -eq 0 ] && rc=$frc
fi
exit "$rc"
