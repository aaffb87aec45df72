// Tensor: a typed, contiguous, row-major view of backend memory (host memory
// for the CPU backend, device memory for CUDA). ne[0] is the innermost
// (fastest) dimension, as in GGUF. Weights keep their file type (Q8_0, IQ2_XXS,
// ...); activations are F32 (I32 for ids, positions and selections).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/assert.h"
#include "core/ggml_type.h"

namespace dsv4 {

struct Tensor {
  void* data = nullptr;
  GgmlType type = GgmlType::F32;
  int64_t ne[4] = {1, 1, 1, 1};

  explicit operator bool() const { return data != nullptr; }
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  size_t row_bytes() const { return static_cast<size_t>(ggml_row_bytes(type, static_cast<uint64_t>(ne[0]))); }
  size_t n_bytes() const { return row_bytes() * static_cast<size_t>(n_rows()); }

  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
  float* f32() const {
    DSV4_ASSERT(type == GgmlType::F32, "tensor is %s, not F32", ggml_type_name(type));
    return static_cast<float*>(data);
  }
  int32_t* i32() const {
    DSV4_ASSERT(type == GgmlType::I32, "tensor is %s, not I32", ggml_type_name(type));
    return static_cast<int32_t*>(data);
  }
  uint8_t* row(int64_t r) const { return static_cast<uint8_t*>(data) + static_cast<size_t>(r) * row_bytes(); }

  // Rows [r0, r0 + n) viewed as a 2-D tensor [n][ne0].
  Tensor rows(int64_t r0, int64_t n) const {
    DSV4_ASSERT(r0 >= 0 && r0 + n <= n_rows(), "rows(%lld, %lld) of %lld", static_cast<long long>(r0),
                static_cast<long long>(n), static_cast<long long>(n_rows()));
    Tensor t = *this;
    t.data = row(r0);
    t.ne[1] = n;
    t.ne[2] = t.ne[3] = 1;
    return t;
  }
  // The first n elements of a 1-D tensor.
  Tensor head(int64_t n) const {
    DSV4_ASSERT(ne[1] == 1 && ne[2] == 1 && ne[3] == 1 && n <= ne[0], "head(%lld) of a non-vector",
                static_cast<long long>(n));
    Tensor t = *this;
    t.ne[0] = n;
    return t;
  }
  // Same bytes with another shape (element count must match).
  Tensor reshape(int64_t n0, int64_t n1 = 1, int64_t n2 = 1, int64_t n3 = 1) const {
    DSV4_ASSERT(n0 * n1 * n2 * n3 == n_elements(), "reshape changes the element count");
    Tensor t = *this;
    t.ne[0] = n0;
    t.ne[1] = n1;
    t.ne[2] = n2;
    t.ne[3] = n3;
    return t;
  }
};

inline Tensor make_tensor(void* data, GgmlType type, int64_t n0, int64_t n1 = 1, int64_t n2 = 1, int64_t n3 = 1) {
  Tensor t;
  t.data = data;
  t.type = type;
  t.ne[0] = n0;
  t.ne[1] = n1;
  t.ne[2] = n2;
  t.ne[3] = n3;
  return t;
}

}  // namespace dsv4
