// IQ2_XXS lookup tables (formats.md §2.4), generated at compile time from the
// format's compact code list.
//
//  * kgrid[i] (u16) packs eight 2-bit codes c_j = (kgrid[i] >> 2j) & 3, each in {0,1,2}.
//  * grid[i] (u64): byte j = magnitude of weight j = {8, 25, 43}[c_j]
//    (little-endian, so byte j is bits 8j..8j+7). SHA-256 of the 2048 bytes is
//    05826b5d3e472a3a78f196be62ac78acf81df0f909626e12ab9fa2a5d490dd54.
//  * signs[s] (s = 0..127): bits 0..6 = s, bit 7 = parity of popcount(s), so
//    every 8-weight sub-group carries an even number of negative signs.
#include <array>
#include <bit>
#include <cstdint>

#include "quant/iq2_tables.h"
#include "quant/quant.h"

namespace dsv4::quant {

namespace {

// The 256 grid codes of IQ2_XXS, in grid-index order (a format constant:
// ggml's kgrid_2bit_256; docs/formats.md §2.4).
constexpr std::array<uint16_t, 256> k_kgrid = {
    0,     2,     5,     8,     10,    17,    20,    32,    34,    40,    42,    65,    68,    80,    88,    97,
    100,   128,   130,   138,   162,   257,   260,   272,   277,   320,   388,   408,   512,   514,   546,   642,
    1025,  1028,  1040,  1057,  1060,  1088,  1090,  1096,  1120,  1153,  1156,  1168,  1188,  1280,  1282,  1288,
    1312,  1350,  1385,  1408,  1425,  1545,  1552,  1600,  1668,  1700,  2048,  2053,  2056,  2068,  2088,  2113,
    2116,  2128,  2130,  2184,  2308,  2368,  2562,  2580,  4097,  4100,  4112,  4129,  4160,  4192,  4228,  4240,
    4245,  4352,  4360,  4384,  4432,  4442,  4480,  4644,  4677,  5120,  5128,  5152,  5157,  5193,  5248,  5400,
    5474,  5632,  5654,  6145,  6148,  6160,  6208,  6273,  6400,  6405,  6560,  6737,  8192,  8194,  8202,  8260,
    8289,  8320,  8322,  8489,  8520,  8704,  8706,  9217,  9220,  9232,  9280,  9302,  9472,  9537,  9572,  9872,
    10248, 10272, 10388, 10820, 16385, 16388, 16400, 16408, 16417, 16420, 16448, 16456, 16470, 16480, 16513, 16516,
    16528, 16640, 16672, 16737, 16768, 16773, 16897, 16912, 16968, 16982, 17000, 17408, 17416, 17440, 17536, 17561,
    17682, 17700, 17920, 18433, 18436, 18448, 18496, 18501, 18688, 18776, 18785, 18818, 19013, 19088, 20480, 20488,
    20497, 20505, 20512, 20608, 20616, 20740, 20802, 20900, 21137, 21648, 21650, 21770, 22017, 22100, 22528, 22545,
    22553, 22628, 22848, 23048, 24580, 24592, 24640, 24680, 24832, 24917, 25112, 25184, 25600, 25605, 25872, 25874,
    25988, 26690, 32768, 32770, 32778, 32833, 32898, 33028, 33048, 33088, 33297, 33793, 33796, 33808, 33813, 33856,
    33888, 34048, 34118, 34196, 34313, 34368, 34400, 34818, 35076, 35345, 36868, 36880, 36900, 36928, 37025, 37142,
    37248, 37445, 37888, 37922, 37956, 38225, 39041, 39200, 40962, 41040, 41093, 41225, 41472, 42008, 43088, 43268,
};

constexpr uint8_t k_grid_magnitudes[3] = {8, 25, 43};

constexpr std::array<uint64_t, 256> make_grid() {
  std::array<uint64_t, 256> g{};
  for (int i = 0; i < 256; ++i) {
    uint64_t e = 0;
    for (int j = 0; j < 8; ++j) {
      const int c = (k_kgrid[i] >> (2 * j)) & 3;  // 3 never occurs (checked below); it would give 0
      e |= static_cast<uint64_t>(c < 3 ? k_grid_magnitudes[c] : 0) << (8 * j);
    }
    g[i] = e;
  }
  return g;
}

constexpr std::array<uint8_t, 128> make_signs() {
  std::array<uint8_t, 128> s{};
  for (unsigned i = 0; i < 128; ++i) s[i] = static_cast<uint8_t>(i | ((std::popcount(i) & 1) ? 0x80u : 0u));
  return s;
}

constexpr std::array<uint64_t, 256> k_grid = make_grid();
constexpr std::array<uint8_t, 128> k_signs = make_signs();

// Every code is 0..2, so every grid byte is one of the three magnitudes.
constexpr bool all_codes_valid() {
  for (uint16_t k : k_kgrid)
    for (int j = 0; j < 8; ++j)
      if (((k >> (2 * j)) & 3) == 3) return false;
  return true;
}
static_assert(all_codes_valid());
// Spot checks of the generation rule: kgrid 0 = all codes 0; kgrid 2 = code 2 at weight 0.
static_assert(k_grid[0] == 0x0808080808080808ull);
static_assert(k_grid[1] == 0x080808080808082Bull);
static_assert(k_signs[1] == 0x81 && k_signs[3] == 0x03 && k_signs[127] == 0xFF);

// Lane-per-weight copies for the decoders (iq2_tables.h).
constexpr std::array<float, 256 * 8> make_grid_f32() {
  std::array<float, 256 * 8> g{};
  for (int i = 0; i < 256; ++i)
    for (int j = 0; j < 8; ++j) g[8 * i + j] = static_cast<float>((k_grid[i] >> (8 * j)) & 0xFF);
  return g;
}
// neg_value: the lane value of a negative weight; positive lanes get pos_value.
template <class T>
constexpr std::array<T, 128 * 8> make_sign_lanes(T neg_value, T pos_value) {
  std::array<T, 128 * 8> s{};
  for (int i = 0; i < 128; ++i)
    for (int j = 0; j < 8; ++j) s[8 * i + j] = ((k_signs[i] >> j) & 1) ? neg_value : pos_value;
  return s;
}

constexpr std::array<float, 256 * 8> k_grid_f32 = make_grid_f32();
constexpr std::array<float, 128 * 8> k_sign_f32 = make_sign_lanes<float>(-1.0f, 1.0f);
constexpr std::array<int8_t, 128 * 8> k_sign_mask = make_sign_lanes<int8_t>(-1, 0);

}  // namespace

const float* detail::iq2xxs_grid_f32() { return k_grid_f32.data(); }
const float* detail::iq2xxs_sign_f32() { return k_sign_f32.data(); }
const int8_t* detail::iq2xxs_sign_mask() { return k_sign_mask.data(); }

const uint64_t* iq2xxs_grid() { return k_grid.data(); }
const uint8_t* iq2xxs_signs() { return k_signs.data(); }
const uint16_t* iq2xxs_kgrid() { return k_kgrid.data(); }

}  // namespace dsv4::quant
