// Per-element maths of the CUDA expert kernels, as __host__ __device__ inline functions: the
// kernels call them on the GPU, and g++ compiles the same code for the CPU unit tests, which
// check them against the CPU kernels (tests/unit/test_cuda_math.cpp). No CUDA headers.
//
// GeLU is kernels/math/gelu_math.h, as the CPU's gelu.cpp computes it, so that both give the same
// values up to the rounding of exp (CUDA's expf and the CPU's exp_f32 are both within 2 ulp).
// fp32 <-> bf16 is kernels/math/bf16_round.h, the CPU's rounding.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/math/bf16_round.h"
#include "kernels/math/float_bits.h"
#include "kernels/math/gelu_math.h"
#include "parm/host_device.h"

namespace parm::cuda::expert_math {

using parm::bf16_to_f32;
using parm::f32_to_bf16;

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

PARM_HD inline float gelu(float x) {
  if (is_nan(x)) return x;
  constexpr float lo = parm::gelu::kValueClamp;
  const float xc = x < lo ? lo : x;
  return parm::gelu::value(xc, exp_f32(parm::gelu::minus_2u(xc)));
}

PARM_HD inline float gelu_grad(float x) {
  if (is_nan(x)) return x;
  constexpr float lim = parm::gelu::kGradClamp;
  const float xc = x < -lim ? -lim : (x > lim ? lim : x);
  return parm::gelu::grad(xc, exp_f32(parm::gelu::minus_2u(xc)));
}

}  // namespace parm::cuda::expert_math
