// Compact KV rows (core/kv_rows.h): the codecs against the scalar
// conversions and the quantisation simulations they must reproduce; the whole
// model with compact rows against the same model with f32 rows (bitwise equal
// logits: the compact state loses nothing); the state size at 1M tokens.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/float_conv.h"
#include "core/kv_rows.h"
#include "model/forward.h"
#include "model/model_file.h"
#include "synth/synth.h"

using namespace dsv4;

namespace {

bool same_bits(float a, float b) { return f32_bits(a) == f32_bits(b); }

// Rows that stress the block scales: mixed magnitudes per block, exact zeros
// and negative zeros, a lone outlier, values near the FP8/FP4 saturation and
// rounding ties after scaling.
std::vector<std::vector<float>> test_rows(int64_t d, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::vector<float>> rows;
  for (float mag : {1e-9f, 1e-5f, 3e-3f, 0.7f, 1.0f, 13.0f, 5e3f, 3e7f}) {
    std::vector<float> r(static_cast<size_t>(d));
    for (auto& v : r) v = nd(g) * mag;
    rows.push_back(r);
  }
  std::vector<float> r(static_cast<size_t>(d), 0.0f);
  rows.push_back(r);  // all zero
  for (int64_t i = 0; i < d; i += 3) r[static_cast<size_t>(i)] = -0.0f;
  r[5] = 1e6f;  // outlier in block 0
  r[static_cast<size_t>(d - 1)] = -2.5f;
  rows.push_back(r);
  std::vector<float> ties(static_cast<size_t>(d));
  for (int64_t i = 0; i < d; ++i)
    ties[static_cast<size_t>(i)] = (static_cast<float>(i % 17) + 0.5f) * (i % 2 ? -1.0f : 1.0f);
  rows.push_back(ties);
  return rows;
}

}  // namespace

TEST(KvRows, E4m3CodesMatchTheScalarConversion) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN codes are never stored
    const float v = fp8_e4m3_decode(static_cast<uint8_t>(c));
    EXPECT_TRUE(same_bits(kv_e4m3_value(static_cast<uint8_t>(c)), v)) << c;
    EXPECT_EQ(kv_e4m3_code(v), c) << c;
  }
  std::mt19937 g(3);
  std::uniform_real_distribution<float> u(-500.0f, 500.0f);
  for (int i = 0; i < 200000; ++i) {
    float v = u(g) * std::ldexp(1.0f, static_cast<int>(g() % 20) - 16);
    EXPECT_TRUE(same_bits(kv_e4m3_value(kv_e4m3_code(v)), fp8_e4m3_round(std::clamp(v, -448.0f, 448.0f)))) << v;
  }
  // Ties round to the even code, in the normal and the subnormal range.
  EXPECT_EQ(kv_e4m3_value(kv_e4m3_code(1.0625f)), 1.0f);
  EXPECT_EQ(kv_e4m3_value(kv_e4m3_code(1.1875f)), 1.25f);
  EXPECT_EQ(kv_e4m3_value(kv_e4m3_code(1.5f * 0x1p-9f)), 2.0f * 0x1p-9f);
  EXPECT_EQ(kv_e4m3_value(kv_e4m3_code(7.5f * 0x1p-9f)), 0x1p-6f);
}

TEST(KvRows, E2m1CodesMatchTheScalarConversion) {
  for (int c = 0; c < 16; ++c) {
    const float v = fp4_e2m1_decode(static_cast<uint8_t>(c));
    EXPECT_TRUE(same_bits(kv_e2m1_value(static_cast<uint8_t>(c)), v)) << c;
    EXPECT_EQ(kv_e2m1_code(v), c) << c;
  }
  for (float v = -7.0f; v <= 7.0f; v += 0.03125f)
    EXPECT_TRUE(same_bits(kv_e2m1_value(kv_e2m1_code(v)), fp4_e2m1_round(std::clamp(v, -6.0f, 6.0f)))) << v;
}

TEST(KvRows, Fp8RowsStoreTheSimulationExactly) {
  for (int64_t d : {128, 512}) {
    EXPECT_EQ(kv_fp8_row_bytes(d), d == 512 ? 592 : 208);
    const int n_quant = static_cast<int>(d - 64);
    for (const auto& x : test_rows(d, static_cast<uint32_t>(d))) {
      std::vector<float> sim = x, back(static_cast<size_t>(d));
      cpu::quant_sim_row(sim.data(), d, KvQuantSim::FP8_BF16, n_quant);
      std::vector<uint8_t> row(static_cast<size_t>(kv_fp8_row_bytes(d)), 0xee);
      // Packing a raw row stores its simulation ...
      kv_fp8_pack_row(row.data(), x.data(), d);
      kv_fp8_unpack_row(back.data(), row.data(), d);
      for (int64_t i = 0; i < d; ++i)
        ASSERT_TRUE(same_bits(back[i], sim[i])) << "raw, d=" << d << " i=" << i << " x=" << x[i];
      // ... and a simulated row unchanged (the simulation is idempotent).
      const std::vector<uint8_t> once = row;
      kv_fp8_pack_row(row.data(), sim.data(), d);
      kv_fp8_unpack_row(back.data(), row.data(), d);
      for (int64_t i = 0; i < d; ++i) ASSERT_TRUE(same_bits(back[i], sim[i])) << "sim, d=" << d << " i=" << i;
      for (int64_t i = kv_fp8_scale_offset(d) + (d - 64) / 64; i < kv_fp8_row_bytes(d); ++i)
        EXPECT_EQ(row[i], 0) << "padding";
    }
  }
  std::vector<uint8_t> zero(592, 0);
  std::vector<float> back(512, 1.0f);
  kv_fp8_unpack_row(back.data(), zero.data(), 512);
  for (float v : back) EXPECT_EQ(v, 0.0f);
}

TEST(KvRows, Fp4RowsStoreTheSimulationExactly) {
  for (int64_t d : {32, 128}) {
    EXPECT_EQ(kv_fp4_row_bytes(d), d / 2 + d / 32);
    for (const auto& x : test_rows(d, 7)) {
      std::vector<float> sim = x, back(static_cast<size_t>(d));
      cpu::quant_sim_row(sim.data(), d, KvQuantSim::HADAMARD_FP4, 0);
      std::vector<uint8_t> row(static_cast<size_t>(kv_fp4_row_bytes(d)));
      kv_fp4_pack_row(row.data(), sim.data(), d);
      kv_fp4_unpack_row(back.data(), row.data(), d);
      for (int64_t i = 0; i < d; ++i)
        ASSERT_TRUE(same_bits(back[i], sim[i])) << "d=" << d << " i=" << i << " v=" << sim[i];
    }
  }
}

TEST(KvRows, InternalTypesAreNeverReadFromFiles) {
  EXPECT_FALSE(ggml_type_info(static_cast<uint32_t>(GgmlType::KV_FP8)).has_value());
  EXPECT_FALSE(ggml_type_info(static_cast<uint32_t>(GgmlType::KV_FP4)).has_value());
  EXPECT_FALSE(ggml_type_from_name("KV_FP8").has_value());
  EXPECT_EQ(ggml_row_bytes(GgmlType::KV_FP8, 512), 592u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::KV_FP4, 128), 68u);
}

TEST(KvRows, FlashStateAtOneMillionTokensFitsFourGiB) {
  const ModelSpec flash = find_preset("flash-q2")->spec;
  ModelOptions ref;
  const uint32_t ctx = 1u << 20;
  const uint64_t bytes = kv_state_bytes(flash, ref, true, ctx);
  EXPECT_LE(bytes, 4ull << 30) << bytes;
  // What grows with the context: per token 21 ratio-4 layers x (592/4 + 68/4) + 20 ratio-128 layers x 592/128.
  const uint64_t growth = kv_state_bytes(flash, ref, true, ctx) - kv_state_bytes(flash, ref, true, ctx - 1024);
  EXPECT_NEAR(static_cast<double>(growth) / 1024.0, 21 * (148 + 17) + 20 * 4.625, 1.0);
  ModelOptions f32 = ref;
  f32.compact_kv = false;
  EXPECT_GT(kv_state_bytes(flash, f32, true, ctx), 3 * bytes);  // f32 rows: 13.8 KB/token
  ModelOptions plain = ref;
  plain.numerics = Numerics::PLAIN;
  EXPECT_EQ(kv_state_bytes(flash, plain, true, ctx), kv_state_bytes(flash, f32, true, ctx));
}

TEST(KvRows, CompactStateGivesBitwiseTheLogitsOfF32Rows) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("dsv4_test_kv_rows_" + std::to_string(::getpid()) + ".gguf")).string();
  ASSERT_TRUE(synth_write(synth_plan(*find_preset("tiny"), 21), path, 2).has_value());
  auto mf = open_model(path);
  ASSERT_TRUE(mf.has_value()) << mf.error().message;
  auto be = make_cpu_backend(2);
  ModelOptions compact, f32;
  compact.max_batch = f32.max_batch = 128;
  f32.compact_kv = false;
  auto mc = Model::create(*be, (*mf)->weights, nullptr, compact);
  auto mp = Model::create(*be, (*mf)->weights, nullptr, f32);
  ASSERT_TRUE(mc.has_value() && mp.has_value());
  Model& a = **mc;
  Model& b = **mp;
  const int64_t V = a.spec().n_vocab;
  std::mt19937 g(9);
  std::vector<int32_t> t(420);
  for (auto& v : t) v = static_cast<int32_t>(3 + g() % (V - 3));
  KvState sa = a.new_state(1024), sb = b.new_state(1024);
  EXPECT_EQ(sa.layers[2].comp.type, GgmlType::KV_FP8);
  EXPECT_EQ(sa.layers[2].idx.type, GgmlType::KV_FP4);
  EXPECT_EQ(sb.layers[2].comp.type, GgmlType::F32);
  // A 400-token prefill in batches of 128 (the indexer selects 16 of up to 100 rows),
  // then 20 decode steps; logits at every position.
  std::vector<float> la(400 * V), lb(400 * V);
  ASSERT_TRUE(a.forward(sa, t.data(), 400, 0, la.data(), true).has_value());
  ASSERT_TRUE(b.forward(sb, t.data(), 400, 0, lb.data(), true).has_value());
  ASSERT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)));
  for (int64_t p = 400; p < 420; ++p) {
    ASSERT_TRUE(a.forward(sa, t.data() + p, 1, p, la.data(), false).has_value());
    ASSERT_TRUE(b.forward(sb, t.data() + p, 1, p, lb.data(), false).has_value());
    ASSERT_EQ(0, std::memcmp(la.data(), lb.data(), V * sizeof(float))) << "position " << p;
  }
  EXPECT_LT(a.state_bytes(1024) * 2, b.state_bytes(1024));
  a.free_state(sa);
  b.free_state(sb);
  mc->reset();
  mp->reset();
  std::filesystem::remove(path);
}
