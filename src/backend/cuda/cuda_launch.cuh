// Kernel launches with programmatic dependent launch (PDL, sm_90+).
//
// A decode step is ~1,700 short kernels in one stream, each of which used to
// start only after its predecessor had finished and its blocks had drained.
// With PDL every kernel is launched with the programmatic-serialization
// attribute (recorded into the decode graph as programmatic edges), so the
// next kernel's blocks can be resident before this one ends:
//
//   kernel body:  [work that reads no predecessor output: constant weights,
//                  the IQ2_XXS grid]  pdl_enter()  [everything else]
//
// pdl_enter() = griddepcontrol.wait (returns once every prerequisite grid has
// completed and its memory is visible), then griddepcontrol.launch_dependents
// (the successor may now launch: its blocks run their pre-wait part while this
// grid finishes). Invariants:
//   * every kernel calls pdl_enter() on every thread path before it reads or
//     writes any activation, state or scratch memory (a block that returns
//     early calls it first). A grid therefore completes only after its
//     predecessor did, so ordering is transitive along the stream.
//   * only constant data (weights, tables uploaded at load) is read before it.
// Without the attribute (PDL off, pre-Hopper GPUs) both instructions are
// no-ops and launches behave as plain stream order. CudaBackendOptions::pdl =
// false (--no-pdl) turns PDL off (A/B measurements).
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace dsv4::cuda {

// Process-wide switch, set by the backend from the device's compute capability
// (>= 9.0) and CudaBackendOptions::pdl; false until then.
bool pdl_enabled();
void set_pdl_enabled(bool on);

__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

[[noreturn]] void cuda_fatal(cudaError_t err, const char* stmt, const char* file, int line);

// kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute when enabled.
// Arguments are converted to the kernel's parameter types (as with <<<>>>).
template <class... P, class... A>
void launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if (pdl_enabled()) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
  if (err != cudaSuccess) cuda_fatal(err, "cudaLaunchKernelEx", __FILE__, __LINE__);
}

}  // namespace dsv4::cuda
