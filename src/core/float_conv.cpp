#include "core/float_conv.h"

namespace dsv4 {

float fp8_e4m3_decode(uint8_t b) {
  int sign = b >> 7;
  int exp = (b >> 3) & 0xf;
  int man = b & 7;
  float v;
  if (exp == 0xf && man == 7)
    v = NAN;
  else if (exp == 0)
    v = std::ldexp(static_cast<float>(man), -9);
  else
    v = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  return sign ? -v : v;
}

uint8_t fp8_e4m3_encode(float v) {
  float r = fp8_e4m3_round(v);
  uint8_t sign = std::signbit(r) ? 0x80 : 0;
  float a = std::fabs(r);
  if (a == 0.0f) return sign;
  int e;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  int exp = e - 1 + 7;
  if (exp <= 0) return static_cast<uint8_t>(sign | static_cast<int>(a * 512.0f));  // subnormal: man * 2^-9
  int man = static_cast<int>(std::ldexp(a, -(e - 1)) * 8.0f) - 8;
  return static_cast<uint8_t>(sign | (exp << 3) | man);
}

}  // namespace dsv4
