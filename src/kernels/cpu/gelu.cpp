// GeLU, tanh form (as GPT-2), fp32: kernels/math/gelu_math.h's formulas with the CPU's exp_f32.
// These loops are the bits' definition; on a CPU with AVX-512 each call runs
// gelu_avx512.cpp's copy of its loop instead, which gives the same bits faster.
#include <limits>

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/gelu_avx512.h"
#include "kernels/cpu/kernels.h"
#include "kernels/math/gelu_math.h"
#include "kernels/cpu/vec_math.h"
#include "parm/error.h"

namespace parm::cpu {
namespace {

inline float gelu_value(float x) {
  const float xc =
      detail::clamp_f32(x, gelu::kValueClamp, std::numeric_limits<float>::infinity());
  return detail::nan_if_nan(gelu::value(xc, detail::exp_f32(gelu::minus_2u(xc))), x);
}

inline float gelu_grad(float x) {
  const float xc = detail::clamp_f32(x, -gelu::kGradClamp, gelu::kGradClamp);
  const float g = gelu::grad(xc, detail::exp_f32(gelu::minus_2u(xc)));
  return detail::nan_if_nan(g, x);  // the clamp alone would turn NaN into a number
}

}  // namespace

PARM_SIMD_CLONES_BELOW_AVX512
void gelu_forward(const float* x, float* y, int64_t n) {
  PARM_CHECK(n >= 0, "gelu_forward: n = {}", n);
  if (detail::have_avx512f()) return detail::gelu_forward_avx512(x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_value(x[i]);
}

PARM_SIMD_CLONES_BELOW_AVX512
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) {
  PARM_CHECK(n >= 0, "gelu_backward: n = {}", n);
  if (detail::have_avx512f()) return detail::gelu_backward_avx512(x, dy, dx, n);
  for (int64_t i = 0; i < n; ++i) dx[i] = gelu_grad(x[i]) * dy[i];
}

PARM_SIMD_CLONES_BELOW_AVX512
void bias_gelu_forward(float* pre, const float* bias, float* act, int64_t rows, int64_t cols) {
  PARM_CHECK(rows >= 0 && cols >= 0, "bias_gelu_forward: bad shape ({}, {})", rows, cols);
  if (detail::have_avx512f()) return detail::bias_gelu_forward_avx512(pre, bias, act, rows, cols);
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

PARM_SIMD_CLONES_BELOW_AVX512
void bias_gelu(const float* x, const float* bias, float* act, int64_t rows, int64_t cols) {
  PARM_CHECK(rows >= 0 && cols >= 0, "bias_gelu: bad shape ({}, {})", rows, cols);
  if (detail::have_avx512f()) return detail::bias_gelu_avx512(x, bias, act, rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* ar = act + r * cols;
#pragma GCC ivdep
    for (int64_t c = 0; c < cols; ++c) ar[c] = gelu_value(xr[c] + bias[c]);
  }
}

PARM_SIMD_CLONES_BELOW_AVX512
void bias_gelu_backward(const float* x, const float* bias, const float* dact, float* dx,
                        float* dbias, int64_t rows, int64_t cols) {
  PARM_CHECK(rows >= 0 && cols >= 0, "bias_gelu_backward: bad shape ({}, {})", rows, cols);
  if (detail::have_avx512f())
    return detail::bias_gelu_backward_avx512(x, bias, dact, dx, dbias, rows, cols);
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

PARM_SIMD_CLONES_BELOW_AVX512
void bias_gelu_grad(const float* x, const float* bias, float* g, int64_t rows, int64_t cols) {
  PARM_CHECK(rows >= 0 && cols >= 0, "bias_gelu_grad: bad shape ({}, {})", rows, cols);
  if (detail::have_avx512f()) return detail::bias_gelu_grad_avx512(x, bias, g, rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* gr = g + r * cols;
#pragma GCC ivdep
    for (int64_t c = 0; c < cols; ++c) gr[c] = gelu_grad(xr[c] + bias[c]);
  }
}

}  // namespace parm::cpu
