// The fp32 exp that the CPU kernels (kernels/cpu/vec_math.h: softmax, GeLU, attention) and the
// gate's rows on both backends (kernels/math/moe_math.h) compute, with its integer-bit clamp
// and NaN helpers. PARM_HD; includes no CUDA header.
//
// exp(x) is within about 2 ulp of the correctly rounded result (denormal results to denormal
// precision); exp(-inf) = 0, exp(+inf) = +inf, NaN stays NaN. exp(x) = 2^n e^r with
// n = round(x / ln 2), |r| <= ln2 / 2; e^r by its degree-7 Taylor polynomial, whose truncation
// error (< 1e-8 relative) is far below an fp32 ulp.
// Branch-free on purpose: under the default -ftrapping-math GCC will not vectorise a loop in
// which an fp operation depends on a float comparison (it threads the branch and then may not
// speculate the fp op), so the clamp and the NaN check work on integer bits.
// Every product is rounded on its own (mul_nc): the CPU library is built with
// -ffp-contract=off, and nvcc, which contracts by default, is kept from fusing one.
#pragma once

#include <cstdint>

#include "kernels/math/float_bits.h"
#include "parm/host_device.h"

namespace parm::math {

PARM_HD inline int32_t float_bits(float x) { return static_cast<int32_t>(float_to_bits(x)); }
PARM_HD inline float bits_float(int32_t i) { return bits_to_float(static_cast<uint32_t>(i)); }

// a * b rounded on its own: never fused into a following add.
PARM_HD inline float mul_nc(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

PARM_HD inline bool is_nan(float x) { return x != x; }

// Maps a float's bits to an int32 that orders like the float (negative floats have their
// magnitude bits flipped), so that clamping can use integer min/max. Its own inverse.
PARM_HD inline int32_t ordered_bits(int32_t bits) { return bits ^ ((bits >> 31) & 0x7fffffff); }

// min(max(x, lo), hi) for lo <= hi, through the ordered bits: GCC vectorises this where a
// float select feeding fp arithmetic would not be. NaN maps to lo or hi.
PARM_HD inline float clamp_f32(float x, float lo, float hi) {
  int32_t key = ordered_bits(float_bits(x));
  const int32_t lo_key = ordered_bits(float_bits(lo));
  const int32_t hi_key = ordered_bits(float_bits(hi));
  key = key < lo_key ? lo_key : key;
  key = key > hi_key ? hi_key : key;
  return bits_float(ordered_bits(key));
}

// y, or a NaN when x is NaN (OR-ing in an all-ones exponent and the quiet bit makes a NaN of
// any y). For functions that clamp their input, which would otherwise turn NaN into a number.
PARM_HD inline float nan_if_nan(float y, float x) {
  const bool nan = (float_bits(x) & 0x7fffffff) > 0x7f800000;
  return bits_float(float_bits(y) | (nan ? 0x7fc00000 : 0));
}

// exp_f32's constants, shared with the AVX-512 copy (kernels/cpu/softmax_attention.cpp).
namespace exp_f32_constants {
inline constexpr float kLo = -104.0f;  // exp(-104) < FLT_TRUE_MIN / 2: rounds to 0
inline constexpr float kHi = 89.0f;    // exp(89) > FLT_MAX: overflows to +inf
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;  // 9 significant bits: n * kLn2Hi is exact
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
}  // namespace exp_f32_constants

PARM_HD inline float exp_f32(float x) {
  using namespace exp_f32_constants;
  const float xc = clamp_f32(x, kLo, kHi);  // +NaN lands on kHi, -NaN on kLo: fixed below
  const float n = (mul_nc(xc, kLog2e) + kRound) - kRound;  // in [-150, 128]
  float r = xc - mul_nc(n, kLn2Hi);
  r = r - mul_nc(n, kLn2Lo);
  float p = 1.0f / 5040.0f + mul_nc(r, 1.0f / 40320.0f);
  p = 1.0f / 720.0f + mul_nc(r, p);
  p = 1.0f / 120.0f + mul_nc(r, p);
  p = 1.0f / 24.0f + mul_nc(r, p);
  p = 1.0f / 6.0f + mul_nc(r, p);
  p = 0.5f + mul_nc(r, p);
  p = 1.0f + mul_nc(r, p);
  p = 1.0f + mul_nc(r, p);
  // 2^n as two factors whose exponents (in [-75, 64]) are both normal floats; the second
  // product rounds once into the denormal range or overflows to inf where exp does.
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1;
  const int32_t n2 = ni - n1;
  const float s1 = bits_float((n1 + 127) << 23);
  const float s2 = bits_float((n2 + 127) << 23);
  return nan_if_nan(mul_nc(mul_nc(p, s1), s2), x);
}

}  // namespace parm::math
