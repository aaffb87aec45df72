// Where a routed expert's rows are (MoeExpertsOp::slots): the expert kernels
// address expert e through ExpertRows::at(e) — its slot of the device stack
// when resident, else its place in the host stack, registered host memory
// that the kernel reads in place over the bus (Backend::map_host_weight).
// Without slots every expert is in the device stack at its own index.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace dsv4::cuda {

struct ExpertRows {
  const uint8_t* dev = nullptr;   // [E_dev] experts of `bytes` each (resident ones)
  const uint8_t* host = nullptr;  // [E] experts (device-usable pointer of registered host memory)
  const int32_t* slot = nullptr;  // [E]: slot in dev, or -1 (host); null: expert e at dev slot e
  int64_t bytes = 0;              // one expert: its rows x row bytes
  __device__ __forceinline__ const uint8_t* at(int32_t e) const {
    if (slot == nullptr) return dev + static_cast<int64_t>(e) * bytes;
    const int32_t s = slot[e];
    return s >= 0 ? dev + static_cast<int64_t>(s) * bytes : host + static_cast<int64_t>(e) * bytes;
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
