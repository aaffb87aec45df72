// Speculative verification: feed a run of proposed tokens as one batch, then keep only a prefix of
// them (Model::verify / Model::commit; forward.h states the contract).
//
// What a dropped row leaves behind, and why only the compressor frontiers need undoing:
//   - window ring: row p goes to slot p % cap_w, cap_w = window + max_batch. A dropped position p'
//     < p0 + k_max_verify overwrote the slot of p' - cap_w, which is more than a window behind every
//     position still to come; and attention at q reads rows q - window + 1 .. q, each (re)written
//     before q's attention.
//   - compressed rows and indexer rows: row k is visible from position (k + 1) * m - 1 on and is
//     written by the step of that position, so a dropped row is rewritten before it is read.
//   - frontiers ([R, w] per compressor): a state machine over positions (each position writes its
//     slot; a window's last position pools and shifts), so a dropped row may have shifted out values
//     a kept prefix still needs. commit() restores the snapshot taken before the rows and runs the
//     compressor step again over the kept rows' logged projections: the same op on the same inputs,
//     so the frontier (and the pooled rows it emits again) are what feeding the kept rows alone gives.
//   - last_hidden: the last kept row's final state, logged by the verify pass.
#include <algorithm>
#include <numeric>
#include <vector>

#include "model/forward.h"

namespace dsv4 {

void Model::alloc_spec(KvState& s) {
  if (s.spec.hidden) return;
  using G = GgmlType;
  const int64_t D = spec_.n_embd, hc = spec_.hc_count, hd = spec_.head_dim, dI = spec_.indexer_head_dim;
  const int64_t k = k_max_verify;
  s.spec.layers.resize(s.layers.size());
  for (size_t il = 0; il < s.layers.size(); ++il) {
    const LayerState& L = s.layers[il];
    SpecLayer& l = s.spec.layers[il];
    if (!L.comp_a) continue;
    l.snap_a = backend_.alloc(G::F32, L.comp_a.ne[0], L.comp_a.ne[1]);
    l.snap_g = backend_.alloc(G::F32, L.comp_g.ne[0], L.comp_g.ne[1]);
    const int64_t w = L.comp_a.ne[0];  // c * hd
    DSV4_ASSERT(w == hd || w == 2 * hd, "alloc_spec: frontier width");
    l.kv = backend_.alloc(G::F32, w, k);
    l.gate = backend_.alloc(G::F32, w, k);
    if (L.idx_a) {
      l.snap_ia = backend_.alloc(G::F32, L.idx_a.ne[0], L.idx_a.ne[1]);
      l.snap_ig = backend_.alloc(G::F32, L.idx_g.ne[0], L.idx_g.ne[1]);
      l.ikv = backend_.alloc(G::F32, 2 * dI, k);
      l.igate = backend_.alloc(G::F32, 2 * dI, k);
    }
  }
  s.spec.snap_hidden = backend_.alloc(G::F32, D, hc);
  s.spec.hidden = backend_.alloc(G::F32, D, hc, k);
  s.spec.pos = backend_.alloc(G::I32, k);
  if (s.dspark_feat) {
    s.spec.snap_feat = backend_.alloc(G::F32, s.dspark_feat.ne[0], s.dspark_feat.ne[1]);
    s.spec.feat = backend_.alloc(G::F32, s.dspark_feat.ne[0], s.dspark_feat.ne[1] * k);
  }
}

void Model::copy_frontiers(KvState& s, size_t il, bool to_snapshot) {
  LayerState& L = s.layers[il];
  SpecLayer& l = s.spec.layers[il];
  auto copy = [&](Tensor& live, Tensor& snap) {
    if (to_snapshot)
      backend_.copy(snap, live);
    else
      backend_.copy(live, snap);
  };
  if (!L.comp_a) return;
  copy(L.comp_a, l.snap_a);
  copy(L.comp_g, l.snap_g);
  if (!L.idx_a) return;
  copy(L.idx_a, l.snap_ia);
  copy(L.idx_g, l.snap_ig);
}

Status Model::begin_verify(KvState& s, int64_t n) {
  if (first_ > 0 || !has_head())
    return make_error("verify: not on a pipeline stage (layers %u .. %u); speculation needs the whole model", first_,
                      end_ - 1);
  if (s.spec.p0 >= 0) return make_error("verify: the previous verify was not committed");
  if (n < 1 || n > std::min<int64_t>(k_max_verify, options_.max_batch))
    return make_error("verify: %lld tokens; 1 to %lld at once", static_cast<long long>(n),
                      static_cast<long long>(std::min<int64_t>(k_max_verify, options_.max_batch)));
  alloc_spec(s);
  // The frontiers and last_hidden as they are before the rows (commit's starting point).
  for (size_t il = 0; il < s.layers.size(); ++il) copy_frontiers(s, il, /*to_snapshot=*/true);
  backend_.copy(s.spec.snap_hidden, s.last_hidden);
  if (s.dspark_feat) backend_.copy(s.spec.snap_feat, s.dspark_feat);
  return {};
}

Status Model::verify(KvState& s, const int32_t* ids, int64_t n, int64_t p0, float* all_logits) {
  DSV4_TRY(begin_verify(s, n));
  s.spec.logging = true;
  Status st = forward(s, ids, n, p0, all_logits, /*all_logits=*/true);
  s.spec.logging = false;
  if (!st) return st;  // forward() checks before it runs anything: the state is unchanged
  s.spec.p0 = p0;
  s.spec.n = n;
  return {};
}

Status Model::commit(KvState& s, int64_t a) {
  if (s.spec.p0 < 0) return make_error("commit: no verify to commit");
  const int64_t p0 = s.spec.p0, n = s.spec.n;
  if (a < 0 || a > n)
    return make_error("commit: %lld of %lld verified rows", static_cast<long long>(a), static_cast<long long>(n));
  s.spec.p0 = -1;
  s.spec.n = 0;
  if (a == n) return {};  // the verify pass's state is the state after all n rows (and its last_hidden)
  const int64_t D = spec_.n_embd, hc = spec_.hc_count;
  if (a > 0) {
    std::vector<int32_t> pos(static_cast<size_t>(a));
    std::iota(pos.begin(), pos.end(), static_cast<int32_t>(p0));
    backend_.write(s.spec.pos, pos.data(), pos.size() * sizeof(int32_t));
  }
  const Tensor pos = s.spec.pos.head(a);
  for (size_t il = 0; il < s.layers.size(); ++il) {
    LayerState& L = s.layers[il];
    const SpecLayer& l = s.spec.layers[il];
    if (!L.comp_a) continue;
    copy_frontiers(s, il, /*to_snapshot=*/false);
    if (a == 0) continue;
    const uint32_t ratio = spec_.ratio(static_cast<uint32_t>(il));
    backend_.compress(main_compress(layers_[il], L, ratio, l.kv.rows(0, a), l.gate.rows(0, a), pos));
    if (L.idx_a) backend_.compress(indexer_compress(layers_[il], L, l.ikv.rows(0, a), l.igate.rows(0, a), pos));
  }
  if (a == 0)
    backend_.copy(s.last_hidden, s.spec.snap_hidden);
  else
    backend_.copy(s.last_hidden, s.spec.hidden.reshape(D * hc, k_max_verify).rows(a - 1, 1).reshape(D, hc));
  if (s.dspark_feat) {
    const int64_t T = s.dspark_feat.ne[1];
    if (a == 0)
      backend_.copy(s.dspark_feat, s.spec.snap_feat);
    else
      backend_.copy(s.dspark_feat, s.spec.feat.rows((a - 1) * T, T));
  }
  return {};
}

}  // namespace dsv4
