#!/usr/bin/env bash
# Usage: scripts/gpu.sh micro [--dry-run]
# Summary: the GPU micro-benchmarks of bench/micro/ (mma.sync / wgmma rates, op-to-op hand-off costs; seconds)
# Environment: none of its own
#
# Runs the GPU micro-benchmarks of bench/micro/ on the GPU machine (seconds):
#   mma_sync_rate  mma.sync m16n8k16 f16->f32 issue rate vs warps per SM and accumulators per warp
#   wgmma_f16      wgmma (sm_90a) from shared memory: which core-matrix layout / descriptor reading is right
#                  (checked against the CPU), then m64n64 / m64n128 rates with 1 and 3 products per k-step
#   decode_sync    one op-to-op hand-off: graph kernel boundaries (plain, PDL) vs grid barriers in a
#                  persistent kernel (cooperative groups, a flag barrier), with and without a 16 KB dependency
#   host_read      weights left in host memory (a /dev/shm file mapped and registered, cudaMallocHost): copy
#                  rates over PCIe (whole, 7 MiB expert-sized pieces) and a kernel reading them in place
#   host_contention  the CPU computing q2 experts (backend/host) while a kernel reads other host memory in
#                  place: each rate alone and together
#   host_experts_bench  the CPU alone: ms per call for 1, 2, 6 q2 experts with all cores but one, with the
#                  widest dots the CPU has (AVX-512 where it has BW, VBMI and VNNI), then with AVX2 ones
#
#   device tool: command "scripts/gpu.sh micro", carry ["build-device"]
#   (or after scripts/gpu.sh check in the same call: it reuses build-device-run/)
# Output: micro.txt in ./out ($OUT with the device tool), also printed.
GPU_NAME=micro
# shellcheck source=scripts/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
set -uo pipefail
gpu_args "" "$@"
gpu_probe
# shellcheck disable=SC2119 # no names: the micro-benchmarks are optional in the payload (a missing one is
gpu_binaries                # reported in micro.txt); it is unpacked if build-device-run/bin is missing
gpu_use_run_libs
gpu_out_flat
rc=0
: >"$LOG/micro.txt"
for b in mma_sync_rate wgmma_f16 decode_sync host_read host_contention host_experts_bench; do
  echo "== $b" >>"$LOG/micro.txt"
  if gpu_exists "$GPU_RUN/bin/$b"; then
    gpu_run --append "$LOG/micro.txt" timeout 120 "$GPU_RUN/bin/$b" ||
      { echo "gpu.sh micro: $b failed (rc $GPU_RC)" >>"$LOG/micro.txt"; rc=1; }
  else
    echo "gpu.sh micro: $GPU_RUN/bin/$b missing (the payload was built without the micro-benchmarks)" >>"$LOG/micro.txt"
    rc=1
  fi
done
if gpu_exists "$GPU_RUN/bin/host_experts_bench"; then
  echo "== host_experts_bench (no kernel wider than AVX2)" >>"$LOG/micro.txt"
  gpu_run --append "$LOG/micro.txt" timeout 120 "$GPU_RUN/bin/host_experts_bench" 0 q2 avx2 ||
    { echo "gpu.sh micro: host_experts_bench avx2 failed (rc $GPU_RC)" >>"$LOG/micro.txt"; rc=1; }
fi
gpu_dry_run && exit 0
cat "$LOG/micro.txt"
exit $rc
