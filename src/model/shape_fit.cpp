#include "model/shape_fit.h"

#include <algorithm>
#include <string>

#include "model/tensor_table.h"

namespace dsv4 {

namespace {

bool has_sparse_layer(const ModelSpec& s) {
  for (uint32_t il = 0; il < s.n_layer; ++il)
    if (s.layer_kind(il) == LayerKind::SPARSE) return true;
  return false;
}

// Values per decode unit of a matrix row in the CUDA kernels (WeightUnit in
// cuda_quant.cuh); 1 for quantised types, whose rows are whole blocks already.
uint64_t cuda_row_unit(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 4;
    case GgmlType::F16:
    case GgmlType::BF16: return 8;
    default: return 1;
  }
}

// The bound tensor a table entry names (null when an optional one is absent).
const TensorRef* find_ref(const TensorSpec& t, const ModelWeights& w, const MtpWeights* mtp) {
  switch (t.scope) {
    case TensorScope::GLOBAL: return &w.global[static_cast<size_t>(t.slot)];
    case TensorScope::LAYER: return &w.layers[static_cast<size_t>(t.layer)].t[static_cast<size_t>(t.slot)];
    case TensorScope::MTP_HEAD: return mtp ? &mtp->head[static_cast<size_t>(t.slot)] : nullptr;
    case TensorScope::MTP_LAYER: return mtp ? &mtp->block.t[static_cast<size_t>(t.slot)] : nullptr;
    case TensorScope::DSPARK_HEAD: return nullptr;  // not in the main or MTP tables
  }
  return nullptr;
}

Status check_cuda_rows(const std::vector<TensorSpec>& table, const ModelWeights& w, const MtpWeights* mtp) {
  for (const TensorSpec& t : table) {
    if (t.cls == TypeClass::F32_VEC || t.cls == TypeClass::I32_TABLE) continue;
    const TensorRef* r = find_ref(t, w, mtp);
    if (!r || !*r) continue;
    const uint64_t unit = cuda_row_unit(r->type);
    if (r->ne[0] % unit)
      return make_error("%s: %s rows of %llu values, and the CUDA kernels read %s rows in units of %llu values",
                        t.name.c_str(), ggml_type_name(r->type), static_cast<unsigned long long>(r->ne[0]),
                        ggml_type_name(r->type), static_cast<unsigned long long>(unit));
  }
  return {};
}

}  // namespace

Status check_numerics_fit(const ModelSpec& s, Numerics numerics) {
  if (!simulates_storage(numerics)) return {};
  const char* name = numerics_name(numerics);
  if (s.nope_dim() % 64)
    return make_error(
        "this model's attention has %u non-RoPE dims per head (key_length %u - %u RoPE dims), not a "
        "multiple of 64, so `--numerics %s` (FP8 KV rows in 64-value blocks) cannot run it; use "
        "--numerics plain",
        s.nope_dim(), s.head_dim, s.rope_dim, name);
  const uint32_t dI = s.indexer_head_dim;
  if (has_sparse_layer(s) && (dI < 32 || (dI & (dI - 1))))
    return make_error(
        "this model's indexer heads have %u dims, not a power of two >= 32, so `--numerics %s` "
        "(Hadamard rotation and FP4 blocks of 32 on indexer queries and keys) cannot run it; use "
        "--numerics plain",
        dI, name);
  return {};
}

Status check_cuda_fit(const ModelWeights& weights, const MtpWeights* mtp, Numerics numerics) {
  const ModelSpec& s = weights.spec;
  auto refuse = [](const std::string& why) {
    return make_error("the CUDA backend cannot run this model: %s; use --backend cpu", why.c_str());
  };
  const uint64_t d = s.head_dim;
  uint64_t g = 8;
  while (s.n_head % g) g /= 2;
  const uint64_t w = 8 / g;
  const bool split_kernel = d % 128 == 0 && d % (32 * w) == 0 && d / w <= 1024;
  const bool mma_kernel = simulates_storage(numerics) && (d == 128 || d == 256 || d == 512);
  if (!split_kernel && !mma_kernel)
    return refuse(strfmt(
        "its attention heads have %llu dims and %u heads; the attention kernel takes a multiple of "
        "%llu up to %llu for this head count%s",
        static_cast<unsigned long long>(d), s.n_head, static_cast<unsigned long long>(std::max<uint64_t>(128, 32 * w)),
        static_cast<unsigned long long>(1024 * w), simulates_storage(numerics) ? ", or 128, 256 or 512" : ""));
  if (s.rope_dim > 128)
    return refuse(strfmt("its heads rotate %u RoPE dims; the RoPE tables hold at most 128", s.rope_dim));
  if (has_sparse_layer(s)) {
    const uint64_t HI = s.indexer_heads, dI = s.indexer_head_dim;
    const uint64_t smem = ((HI * (dI + 4) + HI + 3) / 4 * 4 + 8 * dI) * 4;
    if (dI % 4)
      return refuse(strfmt("its indexer heads have %llu dims; the indexer kernel takes multiples of 4",
                           static_cast<unsigned long long>(dI)));
    if (smem > 200 * 1024)
      return refuse(
          strfmt("its %llu indexer heads of %llu dims need %llu bytes of shared memory; the indexer kernel "
                 "has 200 KiB",
                 static_cast<unsigned long long>(HI), static_cast<unsigned long long>(dI),
                 static_cast<unsigned long long>(smem)));
  }
  if (s.hc_count > 8 || (uint64_t{s.hc_count} * s.n_embd) % 8)
    return refuse(
        strfmt("its mHC state is %u streams of %u values; the mHC kernels take at most 8 streams and a state "
               "width (streams x values) that is a multiple of 8",
               s.hc_count, s.n_embd));
  if (s.n_expert > 1024 || s.n_expert_used > 64)
    return refuse(strfmt("it routes each token to %u of %u experts; the routing kernels take at most 64 of 1024",
                         s.n_expert_used, s.n_expert));
  if (auto st = check_cuda_rows(main_tensor_table(s), weights, nullptr); !st) return refuse(st.error().message);
  if (mtp)
    if (auto st = check_cuda_rows(mtp_tensor_table(s), weights, mtp); !st) return refuse(st.error().message);
  return {};
}

}  // namespace dsv4
