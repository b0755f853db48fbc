// GeLU, tanh form (as GPT-2): gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
// one definition of its constants, clamps and formulas for the CPU kernels (gelu.cpp,
// gelu_bf16.cpp) and the CUDA ones (cuda/expert_math.h). PARM_HD; includes no CUDA header.
// Computed through the identity 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)) =: s, which needs a
// single exp and does not cancel where tanh(u) is near -1:
//   gelu(x) = x s,   gelu'(x) = s + 2 x s (1 - s) u'(x),   1 - s = exp(-2u) s.
// Each side brings its own exp and its own NaN handling (the clamps alone would turn NaN into
// a number).
#pragma once

#include "parm/host_device.h"

namespace parm::gelu {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
// gelu(x) rounds to -0 for every x below -10.6 (exp(-2u) overflows to inf, x / inf = -0);
// clamping there keeps -inf from making -inf / inf. exp(-2u) = 0 for large x gives x.
constexpr float kValueClamp = -20.0f;
// Beyond |x| = 9.5, gelu'(x) is 1 to fp32 precision (x > 0) or below 2e-31 (x < 0), and
// exp(-2u) would leave the fp32 range, making s (1 - s) an inf * 0. The gradient is taken at
// the clamped x there, which is exact for x > 0 and off by < 2e-31 for x < 0.
constexpr float kGradClamp = 9.5f;

// -2u(x), the argument of the exp.
PARM_HD inline float minus_2u(float x) { return -2.0f * kSqrt2OverPi * (x + kCubic * x * x * x); }

// gelu(xc) from e = exp(-2u(xc)); xc is x clamped below at kValueClamp.
PARM_HD inline float value(float xc, float e) { return xc / (1.0f + e); }

// gelu'(xc) from e = exp(-2u(xc)); xc is x clamped to +-kGradClamp.
PARM_HD inline float grad(float xc, float e) {
  const float s = 1.0f / (1.0f + e);
  const float one_minus_s = e * s;
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * xc * xc);
  return s + 2.0f * xc * s * one_minus_s * du;
}

}  // namespace parm::gelu
