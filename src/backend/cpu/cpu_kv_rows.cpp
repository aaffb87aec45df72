// CPU access to KV state rows in their storage format (core/kv_rows.h).
#include "backend/cpu/cpu_backend.h"
#include "core/kv_rows.h"
#include "core/thread_pool.h"

namespace dsv4::cpu {

void kv_row_store(const Tensor& t, int64_t r, const float* x) {
  const int64_t d = t.ne[0];
  switch (t.type) {
    case GgmlType::F32: std::copy(x, x + d, t.f32() + r * d); return;
    case GgmlType::KV_FP8: kv_fp8_pack_row(t.row(r), x, d); return;
    case GgmlType::KV_FP4: kv_fp4_pack_row(t.row(r), x, d); return;
    default: DSV4_ASSERT(false, "KV rows of type %s", ggml_type_name(t.type));
  }
}

void kv_row_load(const Tensor& t, int64_t r, float* x) {
  const int64_t d = t.ne[0];
  switch (t.type) {
    case GgmlType::F32: std::copy(t.f32() + r * d, t.f32() + (r + 1) * d, x); return;
    case GgmlType::KV_FP8: kv_fp8_unpack_row(x, t.row(r), d); return;
    case GgmlType::KV_FP4: kv_fp4_unpack_row(x, t.row(r), d); return;
    default: DSV4_ASSERT(false, "KV rows of type %s", ggml_type_name(t.type));
  }
}

KvRowView::KvRowView(const Tensor& t, int64_t n_first, const int32_t* listed, int64_t n_listed) : t_(t) {
  if (!t || t.type == GgmlType::F32) return;
  const int64_t rows = t.n_rows(), d = t.ne[0];
  slot_.assign(static_cast<size_t>(rows), -1);
  std::vector<int32_t> order;
  auto want = [&](int64_t r) {
    if (r < 0 || r >= rows || slot_[static_cast<size_t>(r)] >= 0) return;
    slot_[static_cast<size_t>(r)] = static_cast<int32_t>(order.size());
    order.push_back(static_cast<int32_t>(r));
  };
  for (int64_t r = 0; r < std::min(n_first, rows); ++r) want(r);
  for (int64_t i = 0; i < n_listed; ++i) want(listed[i]);
  buf_.resize(order.size() * static_cast<size_t>(d));
  pool().parallel_for(
      order.size(),
      [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) kv_row_load(t_, order[i], buf_.data() + i * static_cast<size_t>(d));
      },
      16);
}

const float* KvRowView::row(int64_t r) const {
  if (t_.type == GgmlType::F32) return t_.f32() + r * t_.ne[0];
  const int32_t s = slot_[static_cast<size_t>(r)];
  DSV4_ASSERT(s >= 0, "KV row %lld was not unpacked", static_cast<long long>(r));
  return buf_.data() + static_cast<size_t>(s) * static_cast<size_t>(t_.ne[0]);
}

}  // namespace dsv4::cpu
