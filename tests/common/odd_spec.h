// A model shape transformers' DeepseekV4 accepts that fits neither `reference`
// numerics nor the CUDA kernels: 32 non-RoPE dims per head (head_dim 96), 3
// heads in 4 output groups (a group cuts a head: 3 x 96 = 4 x 72), indexer
// heads of 80 dims, an embedding width of 200, expert width 120. The rest is
// the tiny synthetic model's.
#pragma once

#include "synth/synth.h"

namespace dsv4::test {

inline ModelSpec odd_spec() {
  ModelSpec s = tiny_spec();
  s.name = "dsv4 odd";
  s.n_embd = 200;
  s.n_head = 3;
  s.head_dim = 96;
  s.o_groups = 4;
  s.q_lora_rank = 48;
  s.o_lora_rank = 40;
  s.indexer_head_dim = 80;
  s.expert_ff = 120;
  return s;
}

}  // namespace dsv4::test
