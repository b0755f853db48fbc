// The gated experts' elementwise steps (SwiGLU), fp32: kernels/math/silu_math.h's formulas
// with the CPU's exp_f32. These loops are the bits' definition; on a CPU with AVX-512 each call
// runs swiglu_avx512.cpp's copy of its loop instead, which gives the same bits faster.
#include <limits>

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/swiglu_avx512.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/math/silu_math.h"
#include "parm/error.h"

namespace parm::cpu {
namespace {
constexpr float kInf = std::numeric_limits<float>::infinity();
}  // namespace

PARM_SIMD_CLONES_BELOW_AVX512
void swiglu_forward(const float* a, const float* g, float* act, int64_t n) {
  PARM_CHECK(n >= 0, "swiglu_forward: n = {}", n);
  if (detail::have_avx512f()) return detail::swiglu_forward_avx512(a, g, act, n);
#pragma GCC ivdep
  for (int64_t i = 0; i < n; ++i) {
    const float xc = detail::clamp_f32(a[i], -silu::kClamp, silu::kClamp);
    const float xv = detail::clamp_f32(a[i], -silu::kClamp, kInf);
    const float s = detail::nan_if_nan(silu::value(xv, detail::exp_f32(-xc)), a[i]);
    act[i] = s * g[i];
  }
}

PARM_SIMD_CLONES_BELOW_AVX512
void swiglu_backward(const float* a, const float* g, const float* dact, float* da, float* dg,
                     int64_t n) {
  PARM_CHECK(n >= 0, "swiglu_backward: n = {}", n);
  if (detail::have_avx512f()) return detail::swiglu_backward_avx512(a, g, dact, da, dg, n);
#pragma GCC ivdep
  for (int64_t i = 0; i < n; ++i) {
    const float xc = detail::clamp_f32(a[i], -silu::kClamp, silu::kClamp);
    const float xv = detail::clamp_f32(a[i], -silu::kClamp, kInf);
    const float e = detail::exp_f32(-xc);
    const float s = detail::nan_if_nan(silu::value(xv, e), a[i]);
    const float ds = detail::nan_if_nan(silu::grad(xc, e), a[i]);
    const float d = dact[i];
    da[i] = d * g[i] * ds;
    dg[i] = d * s;
  }
}

}  // namespace parm::cpu
