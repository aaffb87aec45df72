// Model's scratch buffers of one forward batch (model-internal: forward.cpp and the drafters'
// files share them; one batch computes at a time). Rows are batch rows, up to max_batch.
#pragma once

#include <vector>

#include "model/forward.h"

namespace dsv4 {

struct Model::Scratch {
  Tensor pos, ids;                  // [n] i32
  Tensor state;                     // [n, hc, D]
  Tensor u, xn, y, ys;              // [n, D]
  Tensor post, comb;                // [n, hc], [n, hc, hc]
  Tensor qa, q, kv, o, la;          // [n, q_lora], [n, H*hd], [n, hd], [n, H*hd], [n, G*o_lora]
  Tensor ckv, cgate;                // [n, 2*hd]
  Tensor iq, iw, ikv, igate;        // [n, H_I*d_I], [n, H_I], [n, 2*d_I] x2
  Tensor scores;                    // [n, rows] (grown on demand)
  Tensor sel;                       // [n, K_I] i32
  Tensor router, experts, weights;  // [n, E] f32, [n, k] i32, [n, k] f32
  Tensor sh_g, sh_u, sh_h;          // [n, F*shared]
  Tensor sh_y;                      // [1, D]: the shared expert's output when it runs as a branch
  Tensor xq;                        // [n, D] fast numerics: xn quantised, the linear layers' input (else empty)
  Tensor h, hn, logits;             // [n, D], [n, D], [n, V]
  Tensor mtp_e, mtp_y;              // MTP: [1, D], [1, hc, D]
  // ModelOptions::count_routing: each layer's expert choices of a batch of n rows, rows [il * n, (il + 1) * n)
  // of [L * n, k] i32 (room for n = max_batch).
  Tensor route_log;
  int64_t score_rows = 0;
  std::vector<Tensor*> all() {
    return {&pos,     &ids,  &state, &u,     &xn,   &y,  &ys,  &post,  &comb,   &qa,    &q,      &kv,
            &o,       &la,   &ckv,   &cgate, &iq,   &iw, &ikv, &igate, &scores, &sel,   &router, &experts,
            &weights, &sh_g, &sh_u,  &sh_h,  &sh_y, &xq, &h,   &hn,    &logits, &mtp_e, &mtp_y,  &route_log};
  }
};

}  // namespace dsv4
