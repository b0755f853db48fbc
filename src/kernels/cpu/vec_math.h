// Scalar helpers written in plain arithmetic so that loops calling them vectorise at -O3
// without -ffast-math (libm's expf/tanhf calls do not). Private to the CPU kernels.
#pragma once

#include <cstdint>
#include <limits>

#include "kernels/math/exp_math.h"

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
// For loops that have their own AVX-512 copy (called whenever detail::have_avx512f()): the
// AVX2 clone and the baseline only, with no AVX-512 clone that nothing would call.
#define PARM_SIMD_CLONES_BELOW_AVX512 \
  __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define PARM_SIMD_CLONES
#define PARM_SIMD_CLONES_BELOW_AVX512
#endif

namespace parm::cpu::detail {

// The exp and its helpers: one definition for both backends (kernels/math/exp_math.h).
using math::clamp_f32;
using math::exp_f32;
using math::nan_if_nan;
namespace exp_f32_constants = math::exp_f32_constants;

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
