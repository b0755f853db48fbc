// Scalar helpers written in plain arithmetic so that loops calling them vectorise at -O3
// without -ffast-math (libm's expf/tanhf calls do not). Private to the CPU kernels.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

// The build targets baseline x86-64 (SSE2), where the exp-based loops run 4 lanes wide
// and emulate every select and min/max. PARM_SIMD_CLONES compiles a function also for
// x86-64-v3 (AVX2, FMA) and x86-64-v4 (AVX-512) and picks one when the program loads (GCC
// target_clones): GeLU runs about 4x faster on an AVX-512 machine, and the binary still runs
// everywhere. The library is built with -ffp-contract=off, so no clone fuses a multiply
// into an add and every clone gives the SSE2 code's bits (oneDNN's GEMM kernels still round
// differently between instruction sets).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define PARM_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PARM_SIMD_CLONES
#endif

namespace parm::cpu::detail {

// Maps a float's bits to an int32 that orders like the float (negative floats have their
// magnitude bits flipped), so that clamping can use integer min/max. Its own inverse.
inline int32_t ordered_bits(int32_t bits) { return bits ^ ((bits >> 31) & 0x7fffffff); }

// min(max(x, lo), hi) for lo <= hi, through the ordered bits: GCC vectorises this where a
// float select feeding fp arithmetic would not be (see exp_f32). NaN maps to lo or hi.
inline float clamp_f32(float x, float lo, float hi) {
  int32_t key = ordered_bits(std::bit_cast<int32_t>(x));
  const int32_t lo_key = ordered_bits(std::bit_cast<int32_t>(lo));
  const int32_t hi_key = ordered_bits(std::bit_cast<int32_t>(hi));
  key = key < lo_key ? lo_key : key;
  key = key > hi_key ? hi_key : key;
  return std::bit_cast<float>(ordered_bits(key));
}

// y, or a NaN when x is NaN (OR-ing in an all-ones exponent and the quiet bit makes a NaN of
// any y). For functions that clamp their input, which would otherwise turn NaN into a number.
inline float nan_if_nan(float y, float x) {
  const bool is_nan = (std::bit_cast<int32_t>(x) & 0x7fffffff) > 0x7f800000;
  const int32_t nan_mask = is_nan ? 0x7fc00000 : 0;
  return std::bit_cast<float>(std::bit_cast<int32_t>(y) | nan_mask);
}

// exp(x) for fp32, within about 2 ulp of the correctly rounded result (denormal results to
// denormal precision); exp(-inf) = 0, exp(+inf) = +inf, NaN stays NaN.
// exp(x) = 2^n * e^r with n = round(x / ln 2), |r| <= ln2 / 2; e^r by its degree-7 Taylor
// polynomial, whose truncation error (< 1e-8 relative) is far below an fp32 ulp.
// Branch-free on purpose: under the default -ftrapping-math GCC will not vectorise a loop
// in which an fp operation depends on a float comparison (it threads the branch and then
// may not speculate the fp op), so the clamp and the NaN check work on integer bits.
// Its constants, shared with the AVX-512 copy (softmax_attention.cpp).
namespace exp_f32_constants {
inline constexpr float kLo = -104.0f;  // exp(-104) < FLT_TRUE_MIN / 2: rounds to 0
inline constexpr float kHi = 89.0f;    // exp(89) > FLT_MAX: overflows to +inf
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;  // 9 significant bits: n * kLn2Hi is exact
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
}  // namespace exp_f32_constants
inline float exp_f32(float x) {
  using namespace exp_f32_constants;
  const float xc = clamp_f32(x, kLo, kHi);          // +NaN lands on kHi, -NaN on kLo: fixed below
  const float n = (xc * kLog2e + kRound) - kRound;  // in [-150, 128]
  float r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = 1.0f / 5040.0f + r * (1.0f / 40320.0f);
  p = 1.0f / 720.0f + r * p;
  p = 1.0f / 120.0f + r * p;
  p = 1.0f / 24.0f + r * p;
  p = 1.0f / 6.0f + r * p;
  p = 0.5f + r * p;
  p = 1.0f + r * p;
  p = 1.0f + r * p;
  // 2^n as two factors whose exponents (in [-75, 64]) are both normal floats; the second
  // product rounds once into the denormal range or overflows to inf where exp does.
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1;
  const int32_t n2 = ni - n1;
  const float s1 = std::bit_cast<float>((n1 + 127) << 23);
  const float s2 = std::bit_cast<float>((n2 + 127) << 23);
  return nan_if_nan(p * s1 * s2, x);
}

// Partial sums and maxima over kLanes independent lanes: the compiler may vectorise a
// reduction only when it need not reorder fp adds, so the lanes make the order explicit
// (and fixed, so results do not depend on the instruction set).
inline constexpr int kLanes = 16;

inline float sum_f32(const float* x, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j];
  float s = 0.0f;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  for (; i < n; ++i) s += x[i];
  return s;
}

// Largest element, ignoring NaN (-inf for n == 0 or an all-NaN row).
inline float max_f32(const float* x, int64_t n) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = kNegInf;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
  float m = kNegInf;
  for (int j = 0; j < kLanes; ++j) m = acc[j] > m ? acc[j] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

}  // namespace parm::cpu::detail
