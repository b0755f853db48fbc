// Per-element maths of the CUDA expert kernels, as __host__ __device__ inline functions: the
// kernels call them on the GPU, and g++ compiles the same code for the CPU unit tests, which
// check them against the CPU kernels (tests/unit/test_cuda_math.cpp). No CUDA headers.
//
// GeLU is the tanh form of src/kernels/cpu/gelu.cpp, through the same identity
// 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)) =: s and the same clamps, so that both give the same
// values up to the rounding of exp (CUDA's expf and the CPU's exp_f32 are both within 2 ulp):
//   gelu(x) = x s,   gelu'(x) = s + 2 x s (1 - s) u'(x),   1 - s = exp(-2u) s.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/host_device.h"

namespace parm::cuda::expert_math {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
// gelu(x) is -0 to fp32 precision below here; clamping keeps -inf from making -inf / inf.
constexpr float kValueClamp = -20.0f;
// Beyond |x| = 9.5 gelu'(x) is 1 (x > 0) or below 2e-31 (x < 0) in fp32, and exp(-2u) would
// leave the fp32 range (s (1 - s) = inf * 0); the gradient is taken at the clamped x.
constexpr float kGradClamp = 9.5f;

PARM_HD inline uint32_t float_bits(float x) { return float_to_bits(x); }
PARM_HD inline float bits_float(uint32_t u) { return bits_to_float(u); }

PARM_HD inline bool is_nan(float x) { return (float_bits(x) & 0x7fffffffu) > 0x7f800000u; }

PARM_HD inline float exp_f32(float x) {
#ifdef __CUDA_ARCH__
  return expf(x);  // full-precision expf (the build does not use --use_fast_math)
#else
  return std::exp(x);
#endif
}

// fp32 -> bf16 (the upper 16 bits of an fp32), rounded to nearest, ties to even. Values
// beyond the largest bf16 (plus half an ulp) become +-inf; NaN stays NaN (quiet, same sign);
// +-0, +-inf and denormals round like any other value.
PARM_HD inline uint16_t f32_to_bf16(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t lsb = (u >> 16) & 1u;  // ties go to the even upper half
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

PARM_HD inline float bf16_to_f32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

PARM_HD inline float minus_2u(float x) { return -2.0f * kSqrt2OverPi * (x + kCubic * x * x * x); }

PARM_HD inline float gelu(float x) {
  if (is_nan(x)) return x;
  const float xc = x < kValueClamp ? kValueClamp : x;
  return xc / (1.0f + exp_f32(minus_2u(xc)));
}

PARM_HD inline float gelu_grad(float x) {
  if (is_nan(x)) return x;
  const float xc = x < -kGradClamp ? -kGradClamp : (x > kGradClamp ? kGradClamp : x);
  const float e = exp_f32(minus_2u(xc));
  const float s = 1.0f / (1.0f + e);
  const float one_minus_s = e * s;
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * xc * xc);
  return s + 2.0f * xc * s * one_minus_s * du;
}

}  // namespace parm::cuda::expert_math
