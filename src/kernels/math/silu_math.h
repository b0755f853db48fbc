// SiLU (swish), the gated experts' activation: silu(x) = x s, s = sigmoid(x) = 1 / (1 + e),
// e = exp(-x); silu'(x) = s (1 + x (1 - s)), 1 - s = e s. One definition of its clamps and
// formulas for the CPU kernels (kernels/cpu/swiglu.cpp); PARM_HD, includes no CUDA header.
// Each side brings its own exp and NaN handling.
#pragma once

#include "parm/host_device.h"

namespace parm::silu {

// The exp is taken at x clamped to +-80, where e = exp(-x) stays inside the fp32 range (e s
// would otherwise be inf * 0): beyond it silu(x) = x / (1 + e) is x to fp32 precision for
// x > 80, and below 1e-33 in magnitude for x < -80 (the numerator clamped there too, so that
// -inf gives -0, not -inf / inf); silu'(x) is 1, or below 1e-33.
constexpr float kClamp = 80.0f;

// silu(xv) from e = exp(-xc); xv is x clamped below at -kClamp, xc x clamped to +-kClamp.
PARM_HD inline float value(float xv, float e) { return xv / (1.0f + e); }

// silu'(xc) from e = exp(-xc).
PARM_HD inline float grad(float xc, float e) {
  const float s = 1.0f / (1.0f + e);
  return s * (1.0f + xc * (e * s));
}

}  // namespace parm::silu
