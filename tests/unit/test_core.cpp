#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/float_conv.h"
#include "core/ggml_type.h"
#include "core/hash.h"
#include "core/host_memory.h"
#include "core/numerics.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "core/utf8.h"

using namespace dsv4;

TEST(Float16, ExhaustiveRoundTrip) {
  // Every finite binary16 value converts to f32 and back to the same bits.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint16_t b = static_cast<uint16_t>(h);
    if ((b & 0x7c00) == 0x7c00 && (b & 0x3ff)) continue;  // nan payloads
    EXPECT_EQ(f32_to_f16(f16_to_f32(b)), b) << std::hex << h;
  }
}

TEST(Float16, RoundsToNearestEven) {
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 0x1p-11f)), 1.0f);                // tie -> even (down)
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 3 * 0x1p-11f)), 1.0f + 0x1p-9f);  // tie -> even (up)
  EXPECT_EQ(f16_to_f32(f32_to_f16(65520.0f)), INFINITY);                   // rounds past max
  EXPECT_EQ(f16_to_f32(f32_to_f16(65519.0f)), 65504.0f);
  EXPECT_EQ(f16_to_f32(f32_to_f16(0x1p-24f)), 0x1p-24f);  // smallest subnormal
  EXPECT_EQ(f16_to_f32(f32_to_f16(0x1p-25f)), 0.0f);      // tie to even zero
  EXPECT_EQ(f16_to_f32(f32_to_f16(0x1.8p-25f)), 0x1p-24f);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
}

TEST(BFloat16, RoundTripAndRounding) {
  EXPECT_EQ(bf16_round(1.0f), 1.0f);
  EXPECT_EQ(bf16_round(1.0f + 0x1p-8f), 1.0f);  // tie -> even
  EXPECT_EQ(bf16_round(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);
  EXPECT_TRUE(std::isnan(bf16_round(NAN)));
}

TEST(Fp8E4M3, GridValuesAreFixedPoints) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;  // nan
    float v = fp8_e4m3_decode(static_cast<uint8_t>(b));
    EXPECT_EQ(fp8_e4m3_round(v), v) << b;
    EXPECT_EQ(fp8_e4m3_decode(fp8_e4m3_encode(v)), v) << b;
  }
  EXPECT_EQ(fp8_e4m3_decode(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_round(1000.0f), 448.0f);
  EXPECT_EQ(fp8_e4m3_round(0x1p-10f), 0.0f);  // half the smallest subnormal: tie to 0
  EXPECT_EQ(fp8_e4m3_round(1.0625f), 1.0f);   // tie between 1 and 1.125 -> even
  EXPECT_EQ(fp8_e4m3_round(1.1875f), 1.25f);  // tie between 1.125 and 1.25 -> even
}

TEST(Fp4E2M1, Rounding) {
  const float grid[] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (float g : grid) {
    EXPECT_EQ(fp4_e2m1_round(g), g);
    EXPECT_EQ(fp4_e2m1_round(-g), -g);
  }
  EXPECT_EQ(fp4_e2m1_round(0.25f), 0.0f);
  EXPECT_EQ(fp4_e2m1_round(0.75f), 1.0f);
  EXPECT_EQ(fp4_e2m1_round(2.5f), 2.0f);
  EXPECT_EQ(fp4_e2m1_round(5.0f), 4.0f);
  EXPECT_EQ(fp4_e2m1_round(100.0f), 6.0f);
  for (int n = 0; n < 16; ++n)
    EXPECT_EQ(fp4_e2m1_round(fp4_e2m1_decode(static_cast<uint8_t>(n))), fp4_e2m1_decode(static_cast<uint8_t>(n)));
}

TEST(Pow2Ceil, Exact) {
  EXPECT_EQ(pow2_ceil(1.0f), 1.0f);
  EXPECT_EQ(pow2_ceil(1.0001f), 2.0f);
  EXPECT_EQ(pow2_ceil(0.75f), 1.0f);
  EXPECT_EQ(pow2_ceil(0x1p-100f), 0x1p-100f);
  EXPECT_EQ(pow2_ceil(3.0f), 4.0f);
}

// --fast-skip's names: each site by name, lists in any order, "none", and unknown names refused naming them.
TEST(FastSites, NamesRoundTrip) {
  for (unsigned sites = 0; sites <= FAST_ALL_SITES; ++sites) {
    auto back = fast_sites_from_names(fast_sites_name(sites));
    ASSERT_TRUE(back.has_value()) << fast_sites_name(sites);
    EXPECT_EQ(*back, sites) << fast_sites_name(sites);
  }
  EXPECT_EQ(fast_sites_name(FAST_ATTN_IN | FAST_Q), "attn-in,q");
  EXPECT_EQ(*fast_sites_from_names("q,attn-in"), FAST_ATTN_IN | FAST_Q);
  EXPECT_EQ(*fast_sites_from_names("none"), 0u);
  auto bad = fast_sites_from_names("attn-in,wo_b");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("\"wo_b\""), std::string::npos) << bad.error().message;
  EXPECT_FALSE(fast_sites_from_names("").has_value());
  EXPECT_FALSE(fast_sites_from_names("q,").has_value());
}

TEST(Utf8, ValidationAndStreaming) {
  EXPECT_TRUE(utf8_valid("hello"));
  EXPECT_TRUE(utf8_valid("\xe4\xb8\xad\xf0\x9f\x98\x80"));
  EXPECT_FALSE(utf8_valid("\xc0\xaf"));          // overlong
  EXPECT_FALSE(utf8_valid("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(utf8_valid("\xf4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(utf8_valid("\xe4\xb8"));          // truncated
  EXPECT_EQ(utf8_incomplete_suffix("ab\xe4\xb8"), 2u);
  EXPECT_EQ(utf8_incomplete_suffix("ab\xf0"), 1u);
  EXPECT_EQ(utf8_incomplete_suffix("ab\xe4\xb8\xad"), 0u);
  EXPECT_EQ(utf8_incomplete_suffix("abc"), 0u);
  std::string s;
  for (uint32_t cp : {0x41u, 0x7ffu, 0x4e2du, 0x1f600u}) utf8_append(s, cp);
  size_t pos = 0;
  EXPECT_EQ(utf8_decode(s, &pos), 0x41u);
  EXPECT_EQ(utf8_decode(s, &pos), 0x7ffu);
  EXPECT_EQ(utf8_decode(s, &pos), 0x4e2du);
  EXPECT_EQ(utf8_decode(s, &pos), 0x1f600u);
  EXPECT_EQ(pos, s.size());
}

TEST(Hash, KnownVectors) {
  EXPECT_EQ(sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha1_hex("abc", 3), "a9993e364706816aba3e25717850c26c9cd0d89d");
  Hasher h(HashKind::SHA256);
  h.update("a", 1);
  h.update("bc", 2);
  EXPECT_EQ(h.hex_digest(), sha256_hex("abc", 3));
}

TEST(ThreadPool, CoversRangeOnce) {
  ThreadPool pool(4);
  for (size_t n : {1u, 7u, 100u, 12345u}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) hits[i]++;
    });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
  }
  // Nested calls run inline instead of deadlocking.
  std::atomic<int> total{0};
  pool.parallel_for(8, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      pool.parallel_for(10, [&](size_t b2, size_t e2) { total += static_cast<int>(e2 - b2); });
  });
  EXPECT_EQ(total.load(), 80);
}

TEST(ThreadPool, BackToBackLoopsFromTwoCallersAfterSpinningAndSleeping) {
  // The workers poll between loops and sleep after ThreadPool::k_spin: loops that come back to back, after a
  // longer pause, and from two threads at once (serialised) each cover their range exactly once.
  ThreadPool pool(3);
  auto caller = [&pool](uint32_t seed) {
    Rng r(seed);
    std::vector<std::atomic<int>> hits(3000);
    for (int call = 0; call < 400; ++call) {
      const size_t n = 1 + r.below(3000);
      for (size_t i = 0; i < n; ++i) hits[i].store(0);
      pool.parallel_for(n, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "item " << i << " of " << n << ", call " << call;
      if (call % 100 == 99) std::this_thread::sleep_for(ThreadPool::k_spin * 3);
    }
  };
  std::thread other(caller, 2u);
  caller(1u);
  other.join();
}

TEST(Rng, CounterHashIsOrderFree) {
  EXPECT_EQ(hash_u64(1, 2, 3), hash_u64(1, 2, 3));
  EXPECT_NE(hash_u64(1, 2, 3), hash_u64(1, 2, 4));
  EXPECT_NE(hash_u64(1, 2, 3), hash_u64(1, 3, 3));
  Rng r(42);
  double sum = 0, sq = 0;
  for (int i = 0; i < 100000; ++i) {
    float x = r.normal();
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / 1e5, 0.0, 0.02);
  EXPECT_NEAR(sq / 1e5, 1.0, 0.02);
}

static expected<int> parse_positive(int v) {
  if (v <= 0) return make_error("not positive: %d", v);
  return v;
}
static Status chain(int v, int* out) {
  DSV4_TRY_ASSIGN(int x, parse_positive(v));
  *out = x * 2;
  return {};
}

TEST(Expected, ValueAndErrorPropagation) {
  int out = 0;
  EXPECT_TRUE(chain(3, &out).has_value());
  EXPECT_EQ(out, 6);
  Status st = chain(-1, &out);
  ASSERT_FALSE(st.has_value());
  EXPECT_EQ(st.error().message, "not positive: -1");
}

TEST(GgmlType, Table) {
  EXPECT_EQ(ggml_type_info(GgmlType::IQ2_XXS).block_bytes, 66u);
  EXPECT_EQ(ggml_type_info(GgmlType::Q2_K).block_bytes, 84u);
  EXPECT_EQ(ggml_type_info(GgmlType::Q4_K).block_bytes, 144u);
  EXPECT_EQ(ggml_type_info(GgmlType::Q8_0).block_bytes, 34u);
  EXPECT_FALSE(ggml_type_info(4u).has_value());
  EXPECT_EQ(ggml_type_from_name("iq2_xxs"), GgmlType::IQ2_XXS);
  EXPECT_EQ(ggml_row_bytes(GgmlType::IQ2_XXS, 4096), 1056u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q2_K, 2048), 672u);
}

TEST(HostMemory, MemAvailableFromMeminfo) {
  const std::string path = (std::filesystem::temp_directory_path() / "dsv4_test_meminfo").string();
  {
    std::ofstream f(path);
    f << "MemTotal:       131072000 kB\nMemFree:         1000 kB\nMemAvailable:    2048 kB\nBuffers: 0 kB\n";
  }
  auto a = mem_available(path);
  ASSERT_TRUE(a.has_value()) << a.error().message;
  EXPECT_EQ(*a, 2048u * 1024u);
  {
    std::ofstream f(path);
    f << "MemTotal: 1 kB\n";
  }
  EXPECT_FALSE(mem_available(path).has_value());
  std::filesystem::remove(path);
  EXPECT_FALSE(mem_available(path).has_value());
  EXPECT_TRUE(mem_available().has_value());  // this machine's
}

TEST(HostMemory, ResidentBytesAndPinnableChecks) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto* p = static_cast<uint8_t*>(mmap(nullptr, 16 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(resident_bytes(p, 16 * page), 0u);
  for (size_t i : {0, 3, 4, 9, 15}) p[i * page + 7] = 1;  // 5 pages touched
  EXPECT_EQ(resident_bytes(p, 16 * page), 5 * page);
  EXPECT_EQ(resident_bytes(p + page + 5, 3 * page), 2 * page);  // pages 1..4: 3 and 4 resident
  // 11 pages not resident: fits in 12 pages of RAM with a 1-page margin, not in 11.
  EXPECT_TRUE(check_pinnable(p, 16 * page, 12 * page, page, "test experts").has_value());
  Status st = check_pinnable(p, 16 * page, 11 * page, page, "test experts");
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("test experts"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find("--gpu-memory"), std::string::npos) << st.error().message;
  munmap(p, 16 * page);
}
