// Counter-based generators of random, well-scaled weight blocks.
//
// Every value depends only on (seed, tensor stream, block or row index), never
// on evaluation order, so the same bytes come out of `dsv4 synth` (CPU
// threads) and of a GPU fill (bench --synthetic). All arithmetic is integer or
// single IEEE multiplies/adds written out explicitly, so host and device agree
// bit for bit.
//
// Scaling: a matrix with input width n gets element RMS ≈ 1/sqrt(n), so unit
// activations stay unit through each projection; quantised blocks are filled
// with random codes and a super-scale d chosen to give that RMS (derivations
// next to each generator).
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "core/rng.h"

namespace dsv4::synth {

struct BlockRng {
  uint64_t s;
  DSV4_HD explicit BlockRng(uint64_t seed, uint64_t stream, uint64_t index) : s(hash_u64(seed, stream, index)) {}
  DSV4_HD uint64_t next() {
    s += 0x9e3779b97f4a7c15ull;
    return splitmix64(s);
  }
  DSV4_HD uint32_t below(uint32_t n) { return static_cast<uint32_t>((next() >> 32) % n); }
  // Approximately standard normal: Irwin-Hall sum of four 16-bit uniforms,
  // centred and scaled by a constant (one exact int->float, one multiply).
  DSV4_HD float normal() {
    uint64_t r = next();
    int32_t sum = static_cast<int32_t>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48));
    return static_cast<float>(sum - 131070) * (1.0f / 37837.23f);
  }
};

// FNV-1a of a tensor name: the stream id of that tensor's generator.
DSV4_HD uint64_t name_stream(const char* name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *name; ++name) h = (h ^ static_cast<uint8_t>(*name)) * 0x100000001b3ull;
  return h;
}

// Q8_0: qs uniform in [-127, 127] has RMS 127/sqrt(3); d = rms * sqrt(3) / 127.
// d_bits is the binary16 of that scale (computed once per tensor on the host).
DSV4_HD void gen_q8_0(BlockRng& r, uint16_t d_bits, uint8_t* out /*34 bytes*/) {
  out[0] = static_cast<uint8_t>(d_bits);
  out[1] = static_cast<uint8_t>(d_bits >> 8);
  for (int i = 0; i < 32; i += 8) {
    uint64_t x = r.next();
    for (int j = 0; j < 8; ++j)
      out[2 + i + j] = static_cast<uint8_t>(static_cast<int8_t>(((x >> (8 * j)) & 0xff) % 255 - 127));
  }
}

// MXFP4: the scale byte e (2^(e-127)) as given, 32 uniform random E2M1 codes. The 16 codes' squared
// magnitudes {0, .25, 1, 2.25, 4, 9, 16, 36} (twice) average 8.5625, so RMS = 2.926 * 2^(e-127).
DSV4_HD void gen_mxfp4(BlockRng& r, uint8_t e, uint8_t* out /*17 bytes*/) {
  out[0] = e;
  const uint64_t a = r.next(), b = r.next();
  for (int j = 0; j < 8; ++j) {
    out[1 + j] = static_cast<uint8_t>(a >> (8 * j));
    out[9 + j] = static_cast<uint8_t>(b >> (8 * j));
  }
}

// Q2_K: per 16-sub-block scale code sc in [4, 10] and min code m = round(1.5 sc)
// with dmin = d, so w = d*sc*(q - 1.5) (+/- rounding): zero mean, RMS ≈ d*sc*1.118;
// E[sc^2] = 53 gives RMS ≈ 8.14 d, so d = rms / 8.14.
DSV4_HD void gen_q2_k(BlockRng& r, uint16_t d_bits, uint8_t* out /*84 bytes*/) {
  for (int g = 0; g < 16; ++g) {
    uint32_t sc = 4 + r.below(7);
    uint32_t m = (3 * sc + 1) / 2;
    out[g] = static_cast<uint8_t>(sc | (m << 4));
  }
  for (int i = 0; i < 64; i += 8) {
    uint64_t x = r.next();
    for (int j = 0; j < 8; ++j) out[16 + i + j] = static_cast<uint8_t>(x >> (8 * j));
  }
  out[80] = static_cast<uint8_t>(d_bits);
  out[81] = static_cast<uint8_t>(d_bits >> 8);
  out[82] = static_cast<uint8_t>(d_bits);  // dmin = d
  out[83] = static_cast<uint8_t>(d_bits >> 8);
}

// Q4_K: 6-bit scale codes sc in [20, 40], mins m = round(7.5 sc / 8) with
// dmin = 8 d, so w ≈ d*sc*(q - 7.5): RMS ≈ 4.61 d sc, E[sc^2] ≈ 937 -> RMS ≈ 141 d.
// dmin_bits is the binary16 of 8 d.
DSV4_HD void gen_q4_k(BlockRng& r, uint16_t d_bits, uint16_t dmin_bits, uint8_t* out /*144 bytes*/) {
  out[0] = static_cast<uint8_t>(d_bits);
  out[1] = static_cast<uint8_t>(d_bits >> 8);
  out[2] = static_cast<uint8_t>(dmin_bits);
  out[3] = static_cast<uint8_t>(dmin_bits >> 8);
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(20 + r.below(21));
    mn[j] = static_cast<uint8_t>((15 * sc[j] + 8) / 16);
  }
  uint8_t* s = out + 4;  // 12 packed bytes (formats.md §2.3)
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  for (int i = 0; i < 128; i += 8) {
    uint64_t x = r.next();
    for (int j = 0; j < 8; ++j) out[16 + i + j] = static_cast<uint8_t>(x >> (8 * j));
  }
}

// IQ2_XXS: random grid indices (0..255), sign indices (0..127) and group scales
// ls in [4, 11]; w = d (0.5 + ls)/4 * grid * sign with grid in {8, 25, 43}
// (RMS ≈ 29) and E[(0.5+ls)^2] ≈ 69 gives RMS ≈ 60 d.
DSV4_HD void gen_iq2_xxs(BlockRng& r, uint16_t d_bits, uint8_t* out /*66 bytes*/) {
  out[0] = static_cast<uint8_t>(d_bits);
  out[1] = static_cast<uint8_t>(d_bits >> 8);
  for (int ib = 0; ib < 8; ++ib) {
    uint64_t x = r.next();
    uint32_t a = static_cast<uint32_t>(x);  // four grid indices
    uint32_t b = 0;
    for (int t = 0; t < 4; ++t) b |= static_cast<uint32_t>((x >> (32 + 7 * t)) & 127) << (7 * t);
    b |= (4 + r.below(8)) << 28;
    uint8_t* q = out + 2 + 8 * ib;
    for (int j = 0; j < 4; ++j) {
      q[j] = static_cast<uint8_t>(a >> (8 * j));
      q[4 + j] = static_cast<uint8_t>(b >> (8 * j));
    }
  }
}

// Target RMS -> the binary16 super-scale each generator needs (host side).
constexpr float k_q8_0_rms_per_d = 73.3235f;  // 127 / sqrt(3)
constexpr float k_q2_k_rms_per_d = 8.14f;
constexpr float k_q4_k_rms_per_d = 141.0f;
constexpr float k_iq2_xxs_rms_per_d = 60.3f;
constexpr float k_mxfp4_rms_per_scale = 2.926f;  // RMS / 2^(e-127)

}  // namespace dsv4::synth
