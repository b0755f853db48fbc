// GeLU, tanh form (as GPT-2): gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
// Computed through the identity 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)) =: s, which needs a
// single exp and does not cancel where tanh(u) is near -1:
//   gelu(x) = x s,   gelu'(x) = s + 2 x s (1 - s) u'(x),   1 - s = exp(-2u) s.
#include <limits>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vec_math.h"
#include "parm/error.h"

namespace parm::cpu {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
// Beyond |x| = 9.5, gelu'(x) is 1 to fp32 precision (x > 0) or below 2e-31 (x < 0), and
// exp(-2u) would leave the fp32 range, making s (1 - s) an inf * 0. The gradient is taken at
// the clamped x there, which is exact for x > 0 and off by < 2e-31 for x < 0.
constexpr float kGradClamp = 9.5f;

inline float minus_2u(float x) { return -2.0f * kSqrt2OverPi * (x + kCubic * x * x * x); }

// gelu(x) rounds to -0 for every x below -10.6 (exp(-2u) overflows to inf, x / inf = -0);
// clamping there keeps -inf from making -inf / inf. exp(-2u) = 0 for large x gives x.
constexpr float kValueClamp = -20.0f;

inline float gelu_value(float x) {
  const float xc = detail::clamp_f32(x, kValueClamp, std::numeric_limits<float>::infinity());
  return detail::nan_if_nan(xc / (1.0f + detail::exp_f32(minus_2u(xc))), x);
}

inline float gelu_grad(float x) {
  const float xc = detail::clamp_f32(x, -kGradClamp, kGradClamp);
  const float e = detail::exp_f32(minus_2u(xc));
  const float s = 1.0f / (1.0f + e);
  const float one_minus_s = e * s;
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * xc * xc);
  const float g = s + 2.0f * xc * s * one_minus_s * du;
  return detail::nan_if_nan(g, x);  // the clamp alone would turn NaN into a number
}

}  // namespace

PARM_SIMD_CLONES
void gelu_forward(const float* x, float* y, int64_t n) {
  PARM_CHECK(n >= 0, "gelu_forward: n = {}", n);
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_value(x[i]);
}

PARM_SIMD_CLONES
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) {
  PARM_CHECK(n >= 0, "gelu_backward: n = {}", n);
  for (int64_t i = 0; i < n; ++i) dx[i] = gelu_grad(x[i]) * dy[i];
}

PARM_SIMD_CLONES
void bias_gelu_forward(float* pre, const float* bias, float* act, int64_t rows, int64_t cols) {
  PARM_CHECK(rows >= 0 && cols >= 0, "bias_gelu_forward: bad shape ({}, {})", rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    float* pr = pre + r * cols;
    float* ar = act + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const float v = pr[c] + bias[c];
      pr[c] = v;
      ar[c] = gelu_value(v);
    }
  }
}

PARM_SIMD_CLONES
void bias_gelu(const float* x, const float* bias, float* act, int64_t rows, int64_t cols) {
  PARM_CHECK(rows >= 0 && cols >= 0, "bias_gelu: bad shape ({}, {})", rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* ar = act + r * cols;
#pragma GCC ivdep
    for (int64_t c = 0; c < cols; ++c) ar[c] = gelu_value(xr[c] + bias[c]);
  }
}

PARM_SIMD_CLONES
void bias_gelu_backward(const float* x, const float* bias, const float* dact, float* dx,
                        float* dbias, int64_t rows, int64_t cols) {
  PARM_CHECK(rows >= 0 && cols >= 0, "bias_gelu_backward: bad shape ({}, {})", rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    const float* ar = dact + r * cols;
    float* dr = dx + r * cols;
    // dx is dact or apart from it, dbias apart from both: no element is read after another
    // iteration wrote it, which GCC cannot see without being told (and would then run the
    // in-place call unvectorised).
#pragma GCC ivdep
    for (int64_t c = 0; c < cols; ++c) {
      const float d = gelu_grad(xr[c] + bias[c]) * ar[c];
      dr[c] = d;
      dbias[c] += d;
    }
  }
}

PARM_SIMD_CLONES
void bias_gelu_grad(const float* x, const float* bias, float* g, int64_t rows, int64_t cols) {
  PARM_CHECK(rows >= 0 && cols >= 0, "bias_gelu_grad: bad shape ({}, {})", rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* gr = g + r * cols;
#pragma GCC ivdep
    for (int64_t c = 0; c < cols; ++c) gr[c] = gelu_grad(xr[c] + bias[c]);
  }
}

}  // namespace parm::cpu
