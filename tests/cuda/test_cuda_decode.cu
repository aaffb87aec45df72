// test_cuda_decode: the CUDA backend's weight decoders (cuda_quant.cuh) and
// scalar conversions (cuda_common.cuh) are __host__ __device__; this program
// runs them on the host — no GPU needed — and checks them bit for bit against
// the CPU code: every unit of random rows of every weight type against
// quant::dequantize_row (directly and through the staged-chunk path of the
// decode matvec; the f16 and int8 tensor-core tiles' code decoders), f16 decoding of all 65536 codes, and the bf16 /
// FP8 e4m3 / FP4 e2m1 / power-of-two roundings and the top-k float keys on many values. Everything here must be exact
// (0 differences). It also checks the CUDA sources for programmatic dependent launch's rule (check_kernel_sources).
//
//   test_cuda_decode [--seed N]
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_mma_i8.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "cuda_test_util.h"

using namespace dsv4;
using namespace dsv4::cuda;
using namespace dsv4::cudatest;

namespace {

bool same_bits(float a, float b) { return bits_of(a) == bits_of(b) || (a != a && b != b); }

// MXFP4 rows whose blocks take every scale byte e in [e_lo, e_hi] (e = 0: the subnormal 2^-127; 255:
// inf) with random codes.
template <int e_lo, int e_hi>
std::vector<uint8_t> mxfp4_any_scale(Rng& r, GgmlType t, int64_t cols, int64_t rows) {
  std::vector<uint8_t> b = random_weight(r, t, cols, rows);
  auto* p = reinterpret_cast<quant::BlockMXFP4*>(b.data());
  for (size_t i = 0; i < b.size() / sizeof(quant::BlockMXFP4); ++i)
    p[i].e = static_cast<uint8_t>(e_lo + i % (e_hi - e_lo + 1));
  return b;
}

// Decodes every unit of `rows` random rows of type T; compares with dequantize_row.
template <GgmlType T>
void check_type(Rng& r, Report& rep, int64_t cols, int64_t rows,
                std::vector<uint8_t> (*make)(Rng&, GgmlType, int64_t, int64_t) = random_weight) {
  constexpr int U = WeightUnit<T>::U;
  const QuantTables tab{quant::iq2xxs_grid(), quant::iq2xxs_signs()};
  const std::vector<uint8_t> bytes = make(r, T, cols, rows);
  const size_t rb = static_cast<size_t>(ggml_row_bytes(T, static_cast<uint64_t>(cols)));
  // 16-byte aligned copy (cudaMalloc alignment), as the kernels see it.
  std::vector<uint4> aligned((bytes.size() + 15) / 16 + 1);
  std::memcpy(aligned.data(), bytes.data(), bytes.size());
  const auto* base = reinterpret_cast<const uint8_t*>(aligned.data());
  std::vector<float> ref(static_cast<size_t>(cols)), got(static_cast<size_t>(cols)), staged(static_cast<size_t>(cols));
  Diff d, ds;
  const bool stage = can_stage<T>(base, rb);
  for (int64_t row = 0; row < rows; ++row) {
    const uint8_t* p = base + row * rb;
    quant::dequantize_row(T, p, ref.data(), cols);
    for (int64_t u = 0; u < cols / U; ++u) WeightUnit<T>::decode(p, u, got.data() + u * U, tab);
    const Diff dr = diff_f32(got, ref);
    d.n += dr.n;
    d.n_diff += dr.n_diff;
    if constexpr (UnitStaging<T>::chunk_bytes > 0) {
      if (stage) {
        // The staged matvec: chunk c0 (k units) copied to a shared-memory-like buffer, lane l decodes unit l of it.
        using Vec = typename UnitStaging<T>::Vec;
        constexpr int CB = UnitStaging<T>::chunk_bytes;
        std::vector<Vec> buf(static_cast<size_t>(stage_vecs<T>()));
        const int64_t n_units = cols / U;
        for (int64_t c0 = 0; c0 < n_units; c0 += 32) {
          const int k = static_cast<int>(std::min<int64_t>(32, n_units - c0));
          const int nv = k * CB / 32 / static_cast<int>(sizeof(Vec));
          std::memcpy(buf.data(), p + (c0 / 32) * CB, static_cast<size_t>(nv) * sizeof(Vec));
          // (Q8_0: the kernel decodes staged units from aligned 4-byte words, decode_words.)
          for (int lane = 0; lane < k; ++lane) {
            const auto* sb = reinterpret_cast<const uint8_t*>(buf.data());
            if constexpr (T == GgmlType::Q8_0)
              WeightUnit<T>::decode_words(sb, lane, staged.data() + (c0 + lane) * U);
            else
              WeightUnit<T>::decode(sb, lane, staged.data() + (c0 + lane) * U, tab);
          }
        }
        const Diff dz = diff_f32(staged, ref);
        ds.n += dz.n;
        ds.n_diff += dz.n_diff;
      }
    }
  }
  rep.exact("decode", strfmt("%s [%lld,%lld]", ggml_type_name(T), (long long)rows, (long long)cols), d);
  if (stage)
    rep.exact("decode staged", strfmt("%s [%lld,%lld]", ggml_type_name(T), (long long)rows, (long long)cols), ds);
}

// The tensor-core tiles' weight codes, f16 (cuda_mma.cuh, MmaCodes) or int8
// (I8: cuda_mma_i8.cuh, MmaCodesI8): for every unit and quad lane t, scale *
// code - min at each fragment position must rebuild dequantize_row's weight of
// the element that position maps to, bit for bit, and the positions must cover
// every element of the unit exactly once. (MXFP4: its code 8 is -0 there, +0
// in the reference; the MMA's sums do not see the difference, so zeros of
// either sign count as equal. Q2_K's int8 codes carry the sub-block scale,
// d (q s) instead of (d s) q: within two roundings.)
template <GgmlType T, bool I8 = false>
void check_mma_codes(Rng& r, Report& rep, int64_t cols, int64_t rows,
                     std::vector<uint8_t> (*make)(Rng&, GgmlType, int64_t, int64_t) = random_weight) {
  std::vector<uint2> grid(256);  // the IQ2_XXS grid as the tiles' shared table holds it
  for (int i = 0; i < 256; ++i)
    grid[static_cast<size_t>(i)] = make_uint2(static_cast<uint32_t>(quant::iq2xxs_grid()[i]),
                                              static_cast<uint32_t>(quant::iq2xxs_grid()[i] >> 32));
  const MmaTables tab{grid.data()};
  const std::vector<uint8_t> bytes = make(r, T, cols, rows);
  const size_t rb = static_cast<size_t>(ggml_row_bytes(T, static_cast<uint64_t>(cols)));
  std::vector<uint4> aligned((bytes.size() + 15) / 16 + 1);
  std::memcpy(aligned.data(), bytes.data(), bytes.size());
  const auto* base = reinterpret_cast<const uint8_t*>(aligned.data());
  std::vector<float> ref(static_cast<size_t>(cols));
  Diff d;
  int64_t coverage_errors = 0;
  for (int64_t row = 0; row < rows; ++row) {
    const uint8_t* p = base + row * rb;
    quant::dequantize_row(T, p, ref.data(), cols);
    typename MmaCodes<T>::Raw raw[4];  // per lane, loaded for u = 0, 1, 2, ... in order (as the tile does)
    for (int64_t u = 0; u < cols / 32; ++u) {
      int seen[32] = {};
      for (int t = 0; t < 4; ++t) {
        MmaCodes<T>::load(p, u, t, raw[t]);
        float w[8], tol[8] = {};  // the weights at positions 8t .. 8t + 7; Q2_K int8: their tolerance
        if constexpr (I8) {
          using C = MmaCodesI8<T>;
          uint32_t a[2];
          float sc = 0.0f, mn[2] = {0.0f, 0.0f};
          C::decode(raw[t], u, t, a, sc, mn, tab);
          for (int k = 0; k < 8; ++k) {
            const auto code = static_cast<float>(static_cast<int8_t>(a[k / 4] >> (8 * (k % 4))));
            const float m = C::kMins == 2 ? mn[k / 4] : mn[0];
            w[k] = C::kMins > 0 ? sub_rn(mul_rn(sc, code), m) : mul_rn(sc, code);
            if (T == GgmlType::Q2_K) tol[k] = 0x1p-22f * (std::fabs(mul_rn(sc, code)) + std::fabs(m));
          }
        } else {
          constexpr int NS = MmaCodes<T>::NS;
          uint32_t h[4];
          float sc[NS], mn[NS];
          for (int s = 0; s < NS; ++s) mn[s] = 0.0f;
          MmaCodes<T>::decode(raw[t], u, t, h, sc, mn, tab);
          for (int k = 0; k < 8; ++k) {
            const float code = f16_bits_to_f32(static_cast<uint16_t>(k % 2 ? h[k / 2] >> 16 : h[k / 2] & 0xffffu));
            const float sv = sc[NS == 2 ? k / 4 : 0], mv = mn[NS == 2 ? k / 4 : 0];
            w[k] = MmaCodes<T>::kMin ? sub_rn(mul_rn(sv, code), mv) : mul_rn(sv, code);
          }
        }
        for (int k = 0; k < 8; ++k) {
          const int pos = 8 * t + k;
          const int e = mma_elem_of_pos<T>(pos);
          if (e < 0 || e >= 32 || mma_pos_of_elem<T>(e) != pos) {
            ++coverage_errors;
            continue;
          }
          ++seen[e];
          ++d.n;
          const float want = ref[static_cast<size_t>(u * 32 + e)];
          const bool zeros = T == GgmlType::MXFP4 && w[k] == 0.0f && want == 0.0f;
          d.n_diff += tol[k] > 0.0f ? !(std::fabs(w[k] - want) <= tol[k]) : !same_bits(w[k], want) && !zeros;
        }
      }
      for (int e = 0; e < 32; ++e) coverage_errors += seen[e] != 1;
    }
  }
  const char* kind = I8 ? "mma codes i8" : "mma codes";
  rep.exact(kind, strfmt("%s [%lld,%lld]", ggml_type_name(T), (long long)rows, (long long)cols), d);
  rep.check(I8 ? "mma positions i8" : "mma positions", strfmt("%s: every element once", ggml_type_name(T)),
            coverage_errors == 0, strfmt("%lld coverage errors", static_cast<long long>(coverage_errors)));
}

// A float with a random sign, exponent in [lo, hi] and random mantissa.
float random_float(Rng& r, int lo, int hi) {
  const float m = 1.0f + r.uniform();
  const float v = std::ldexp(m, lo + static_cast<int>(r.below(hi - lo + 1)));
  return r.below(2) ? v : -v;
}

}  // namespace

// Programmatic dependent launch (cuda_launch.cuh) is only safe when every
// kernel waits for its predecessor before touching activations, and every
// launch goes through launch_kernel. Source check over src/backend/cuda:
// each __global__ body calls pdl_enter() (matvec kernels: through
// matvec_block_prologue, which calls it after the first weight loads), and no
// file launches with <<<...>>> outside comments.
void check_kernel_sources(Report& rep) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(DSV4_SOURCE_DIR) / "src" / "backend" / "cuda";
  int kernels = 0;
  std::vector<std::string> bad;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cu" && ext != ".cuh") continue;
    std::ifstream in(entry.path());
    std::string src((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string name = entry.path().filename().string();
    // Launch syntax outside comments: strip // comments line by line.
    std::istringstream lines(src);
    std::string line;
    int line_no = 0;
    while (std::getline(lines, line)) {
      ++line_no;
      const size_t c = line.find("//");
      if (line.substr(0, c).find("<<<") != std::string::npos)
        bad.push_back(strfmt("%s:%d: <<<>>> launch", name.c_str(), line_no));
    }
    for (size_t at = src.find("__global__"); at != std::string::npos; at = src.find("__global__", at + 1)) {
      // The body: the first '{' after the parameter list, to its matching '}'.
      size_t open = src.find('{', at);
      if (open == std::string::npos) break;
      int depth = 0;
      size_t end = open;
      for (; end < src.size(); ++end) {
        if (src[end] == '{')
          ++depth;
        else if (src[end] == '}' && --depth == 0)
          break;
      }
      const std::string body = src.substr(open, end - open);
      ++kernels;
      if (body.find("pdl_enter()") == std::string::npos && body.find("matvec_block_prologue") == std::string::npos) {
        const size_t paren = src.find('(', at);
        bad.push_back(strfmt("%s: kernel without pdl_enter: %s", name.c_str(), src.substr(at, paren - at).c_str()));
      }
    }
  }
  for (const auto& b : bad) std::printf("  %s\n", b.c_str());
  rep.check("kernel sources", strfmt("%d kernels in src/backend/cuda", kernels), kernels > 20 && bad.empty(),
            bad.empty() ? "every kernel calls pdl_enter, launches via launch_kernel" : "see the lines above");
}

int main(int argc, char** argv) {
  const uint64_t seed = seed_arg("test_cuda_decode (host)", argc, argv);
  Rng r(seed);
  Report rep;
  check_kernel_sources(rep);
  using G = GgmlType;
  for (int64_t cols : {int64_t{256}, int64_t{768}, int64_t{1024}, int64_t{4096}}) {
    check_type<G::F32>(r, rep, cols, 5);
    check_type<G::F16>(r, rep, cols, 5);
    check_type<G::BF16>(r, rep, cols, 5);
    check_type<G::Q8_0>(r, rep, cols, 7);
    check_type<G::Q2_K>(r, rep, cols, 7);
    check_type<G::Q4_K>(r, rep, cols, 7);
    check_type<G::IQ2_XXS>(r, rep, cols, 7);
    check_type<G::MXFP4>(r, rep, cols, 7);
  }
  check_type<G::MXFP4>(r, rep, 512, 5, mxfp4_any_scale<0, 255>);       // every scale byte, 4 byte phases
  check_type<G::MXFP4>(r, rep, 96, 9);                                 // 3 units: rows at every byte phase, unstaged
  check_mma_codes<G::MXFP4>(r, rep, 512, 5, mxfp4_any_scale<0, 240>);  // scales up to 2^113 (see MmaCodes)
  check_mma_codes<G::MXFP4>(r, rep, 96, 9);
  for (int64_t cols : {int64_t{256}, int64_t{1024}}) {
    check_mma_codes<G::Q8_0>(r, rep, cols, 6);
    check_mma_codes<G::Q2_K>(r, rep, cols, 6);
    check_mma_codes<G::Q4_K>(r, rep, cols, 6);
    check_mma_codes<G::IQ2_XXS>(r, rep, cols, 6);
    check_mma_codes<G::F16>(r, rep, cols, 6);
    check_mma_codes<G::MXFP4>(r, rep, cols, 6);
    check_mma_codes<G::Q8_0, true>(r, rep, cols, 6);
    check_mma_codes<G::Q2_K, true>(r, rep, cols, 6);
    check_mma_codes<G::Q4_K, true>(r, rep, cols, 6);
    check_mma_codes<G::IQ2_XXS, true>(r, rep, cols, 6);
    check_mma_codes<G::MXFP4, true>(r, rep, cols, 6);
  }
  check_mma_codes<G::MXFP4, true>(r, rep, 512, 5, mxfp4_any_scale<0, 255>);  // every scale byte, inf included
  check_mma_codes<G::MXFP4, true>(r, rep, 96, 9);                            // rows at every byte phase
  check_mma_codes<G::Q8_0, true>(r, rep, 96, 6);                             // both 4-byte phases of a row's start
  check_mma_codes<G::Q8_0>(r, rep, 96, 6);  // 3 blocks per row: rows start at both 4-byte phases
  check_type<G::Q8_0>(r, rep, 64, 9);       // 2 units: no staging
  check_type<G::Q8_0>(r, rep, 2080, 3);     // 65 units: a partial last chunk... (not stageable: 65 % 8 != 0)
  check_type<G::Q8_0>(r, rep, 2304, 3);     // 72 units: staged with a partial chunk of 8

  {  // IQ2_XXS sign bytes: computed (iq2_sign_bits) == the table
    Diff d;
    for (uint32_t i = 0; i < 128; ++i) {
      ++d.n;
      d.n_diff += iq2_sign_bits(i) != quant::iq2xxs_signs()[i];
    }
    rep.exact("iq2 sign bits", "all 128 indices", d);
  }
  {  // f16 codes
    Diff d;
    for (uint32_t h = 0; h < 65536; ++h) {
      ++d.n;
      d.n_diff += !same_bits(f16_bits_to_f32(static_cast<uint16_t>(h)), f16_to_f32(static_cast<uint16_t>(h)));
    }
    rep.exact("f16 decode", "all 65536 codes", d);
  }
  // Roundings on values across the whole range, plus special values.
  std::vector<float> vals = {0.0f,    -0.0f,    1.0f,      -1.0f, 448.0f, 449.0f,  464.0f,   480.0f,          -480.0f,
                             6.0f,    5.0f,     0.25f,     0.75f, 1e-30f, 0x1p-9f, 0x1p-10f, 3.0f * 0x1p-11f, 1.0625f,
                             1.1875f, INFINITY, -INFINITY, NAN};
  for (int i = 0; i < 400000; ++i) vals.push_back(random_float(r, -20, 12));
  for (int i = 0; i < 100000; ++i)
    vals.push_back(static_cast<float>(r.below(1 << 12)) / 64.0f * (r.below(2) ? 1.0f : -1.0f));
  {
    Diff bf, f8, f4, p2, cl;
    for (float v : vals) {
      ++bf.n, ++f8.n, ++f4.n, ++cl.n;
      bf.n_diff += !same_bits(bf16_round_dev(v), bf16_round(v));
      f8.n_diff += !same_bits(fp8_e4m3_round_dev(v), fp8_e4m3_round(v));
      f4.n_diff += !same_bits(fp4_e2m1_round_dev(v), fp4_e2m1_round(v));
      cl.n_diff += !same_bits(clamp_dev(v, -448.0f, 448.0f), std::clamp(v, -448.0f, 448.0f));
      const float a = std::fabs(v);
      if (std::isfinite(a) && a > 0x1p-120f) {
        ++p2.n;
        p2.n_diff += !same_bits(pow2_ceil_dev(a), pow2_ceil(a));
      }
    }
    rep.exact("bf16 round", strfmt("%zu values", vals.size()), bf);
    rep.exact("fp8 e4m3 round", strfmt("%zu values", vals.size()), f8);
    rep.exact("fp4 e2m1 round", strfmt("%zu values", vals.size()), f4);
    rep.exact("pow2_ceil", strfmt("%lld values", (long long)p2.n), p2);
    rep.exact("clamp", strfmt("%zu values", vals.size()), cl);
  }
  {  // top-k keys preserve the float order (NaN excluded), -0 == +0
    Diff d;
    for (size_t i = 0; i + 1 < vals.size(); ++i) {
      const float a = vals[i], b = vals[(i * 7919 + 13) % vals.size()];
      if (a != a || b != b) continue;
      ++d.n;
      d.n_diff += ((a > b) != (float_key(a) > float_key(b))) || ((a == b) != (float_key(a) == float_key(b)));
    }
    d.n_diff += float_key(0.0f) != float_key(-0.0f);
    rep.exact("topk float_key", strfmt("%lld pairs", (long long)d.n), d);
  }
  for (const auto& f : rep.failures()) std::printf("FAILED: %s\n", f.c_str());
  std::printf("SUMMARY test_cuda_decode: %d passed, %d failed (seed %llu)\n", rep.passed(), rep.failed(),
              static_cast<unsigned long long>(seed));
  return rep.failed() == 0 ? 0 : 1;
}
