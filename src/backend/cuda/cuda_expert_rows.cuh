// Where a routed expert's rows are (MoeExpertsOp::slots): the expert kernels
// address expert e through ExpertRows::at(e) — its slot of the device stack
// when resident; else, when the op gathered it into GPU memory first
// (cuda_moe.cu, CudaContext::expert_gather), its place in the gather stage;
// else its place in the host stack, registered host memory that the kernel
// reads in place over the bus (Backend::map_host_weight).
// Without slots every expert is in the device stack at its own index.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace dsv4::cuda {

struct ExpertRows {
  const uint8_t* dev = nullptr;   // [E_dev] experts of `bytes` each (resident ones)
  const uint8_t* host = nullptr;  // [E] experts (device-usable pointer of registered host memory)
  // [E]: s >= 0: slot s of dev; -1: in host; s <= -2: slot -2 - s of stage. null: expert e at dev slot e.
  const int32_t* slot = nullptr;
  int64_t bytes = 0;               // one expert: its rows x row bytes
  const uint8_t* stage = nullptr;  // experts gathered from host memory for this op
  __device__ __forceinline__ const uint8_t* at(int32_t e) const {
    if (slot == nullptr) return dev + static_cast<int64_t>(e) * bytes;
    const int32_t s = slot[e];
    if (s >= 0) return dev + static_cast<int64_t>(s) * bytes;
    return s == -1 ? host + static_cast<int64_t>(e) * bytes : stage + static_cast<int64_t>(-2 - s) * bytes;
  }
};

// The rows of one expert matrix of `op`: shape = the tensor that carries the shape and type (the host
// stack when the op has slots), dev = the resident stack.
inline ExpertRows expert_rows(const Tensor& dev, const Tensor& host, const Tensor& slots) {
  const Tensor& shape = slots ? host : dev;
  return {static_cast<const uint8_t*>(dev.data), slots ? static_cast<const uint8_t*>(host.data) : nullptr,
          slots ? slots.i32() : nullptr, static_cast<int64_t>(shape.ne[1] * shape.row_bytes())};
}

}  // namespace dsv4::cuda
