// Routed experts computed by the host CPU, for a GPU backend whose experts
// partly live in host memory (docs/design-notes/expert-offload.md): the GPU
// computes the resident and gathered experts, the host computes the rest from
// the same bytes, at the same time.
//
// One call computes, for the assignments a (token t = a / k) that the task marks
// as the host's (experts[a] < 0, expert e = -1 - experts[a]):
//   xq      = Q8_K(x[t])                                   (quant::quantize_act)
//   mid[f]  = silu(min(g_f, c)) * clamp(u_f, -c, c) * weights[a],
//             g_f = gate[e, f] . xq,  u_f = up[e, f] . xq    f < F
//   y[a, d] = down[e, d] . Q8_K(mid)                        d < D
// with the integer dot products of quant::vec_dot_q_fast (the ds4 CPU
// convention: bit-identical to quant::vec_dot_q). Every other row of y is set
// to zero (unless zero_others is off: a caller that reads only the host's rows),
// so the caller can add y to the device's per-assignment rows. The
// results differ from the f32-activation reference (cpu_moe.cpp) by the
// activations' 8-bit quantisation (tested with an NMSE bound).
#pragma once

#include <cstdint>
#include <memory>

#include "core/act_quant.h"
#include "core/ggml_type.h"

namespace dsv4 {

class SpinTeam;

// One stacked expert matrix in host memory: expert e's `rows` rows of `cols`
// elements start at base + e * expert_bytes.
struct HostExpertMatrix {
  GgmlType type = GgmlType::F32;
  const uint8_t* base = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t expert_bytes = 0;
  int64_t count = 0;  // experts in the stack
};

struct HostExpertTask {
  HostExpertMatrix gate, up, down;  // gate/up: F rows of D; down: D rows of F
  int64_t n_tokens = 0, k = 0;
  const float* x = nullptr;          // [n_tokens, D]
  const int32_t* experts = nullptr;  // [n_tokens * k]: < 0 marks the host's assignments (-1 - expert)
  const float* weights = nullptr;    // [n_tokens * k] routing weights
  float clamp = 10.0f;
  ActQuant mid_quant = ActQuant::NONE;  // MoeExpertsOp::mid_quant: applied to mid before its int8 rows
  float* y = nullptr;                   // [n_tokens * k, D] out
  bool zero_others = true;              // set the rows of the other assignments to zero (else left as they are)
};

class HostExperts {
 public:
  // n_threads <= 0: every core but one (the thread that feeds the GPU).
  explicit HostExperts(int n_threads = 0);
  ~HostExperts();
  HostExperts(const HostExperts&) = delete;
  HostExperts& operator=(const HostExperts&) = delete;

  int threads() const;
  // Computes the task (see the top of this file); returns the number of host assignments.
  int64_t run(const HostExpertTask& task);

 private:
  std::unique_ptr<SpinTeam> team_;
  std::unique_ptr<uint8_t[]> act_;  // Q8_K rows of x and of mid
  size_t act_bytes_ = 0;
  std::unique_ptr<float[]> mid_;
  size_t mid_floats_ = 0;
};

}  // namespace dsv4
