// gelu_avx512.h: gelu.cpp's loops, 16 lanes at a time, with their bits.
#include "kernels/cpu/gelu_avx512.h"

#include "kernels/math/gelu_math.h"

// The whole file is compiled for AVX-512F (vec_math_avx512.h).
#pragma GCC push_options
#pragma GCC target("avx512f")
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps and warn about it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "kernels/cpu/vec_math_avx512.h"

namespace parm::cpu::detail {
namespace {

using namespace avx512;

// gelu::minus_2u: (-2 sqrt(2/pi)) (x + ((c x) x) x).
inline __m512 minus_2u(__m512 x) {
  const __m512 cubic = mul(mul(mul(splat(gelu::kCubic), x), x), x);
  return mul(splat(-2.0f * gelu::kSqrt2OverPi), add(x, cubic));
}

// gelu.cpp's gelu_value.
inline __m512 value(__m512 v) {
  const __mmask16 nan = nan_lanes(v);
  const __m512 xc = clamp(v, gelu::kValueClamp, __builtin_inff(), nan);
  const __m512 e = exp_nc(minus_2u(xc));
  return nan_where(_mm512_div_ps(xc, add(splat(1.0f), e)), nan);  // gelu::value
}

// gelu.cpp's gelu_grad (gelu::grad: s + (((2 xc) s) (1 - s)) du).
inline __m512 grad(__m512 v) {
  const __mmask16 nan = nan_lanes(v);
  const __m512 xc = clamp(v, -gelu::kGradClamp, gelu::kGradClamp, nan);
  const __m512 e = exp_nc(minus_2u(xc));
  const __m512 s = _mm512_div_ps(splat(1.0f), add(splat(1.0f), e));
  const __m512 one_minus_s = mul(e, s);
  const __m512 du = mul(splat(gelu::kSqrt2OverPi),
                        add(splat(1.0f), mul(mul(splat(3.0f * gelu::kCubic), xc), xc)));
  const __m512 t = mul(mul(mul(mul(splat(2.0f), xc), s), one_minus_s), du);
  return nan_where(add(s, t), nan);
}

}  // namespace

void gelu_forward_avx512(const float* x, float* y, int64_t n) {
  columns(n, [&](int64_t c, __mmask16 m) { store(y + c, m, value(load(x + c, m))); });
}

void gelu_backward_avx512(const float* x, const float* dy, float* dx, int64_t n) {
  columns(n, [&](int64_t c, __mmask16 m) {
    store(dx + c, m, mul(grad(load(x + c, m)), load(dy + c, m)));
  });
}

void bias_gelu_forward_avx512(float* pre, const float* bias, float* act, int64_t rows,
                              int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* pr = pre + r * cols;
    float* ar = act + r * cols;
    columns(cols, [&](int64_t c, __mmask16 m) {
      const __m512 v = add(load(pr + c, m), load(bias + c, m));
      store(pr + c, m, v);
      store(ar + c, m, value(v));
    });
  }
}

void bias_gelu_avx512(const float* x, const float* bias, float* act, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* ar = act + r * cols;
    columns(cols, [&](int64_t c, __mmask16 m) {
      store(ar + c, m, value(add(load(xr + c, m), load(bias + c, m))));
    });
  }
}

void bias_gelu_backward_avx512(const float* x, const float* bias, const float* dact, float* dx,
                               float* dbias, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    const float* ar = dact + r * cols;
    float* dr = dx + r * cols;
    columns(cols, [&](int64_t c, __mmask16 m) {
      const __m512 d = mul(grad(add(load(xr + c, m), load(bias + c, m))), load(ar + c, m));
      store(dr + c, m, d);
      store(dbias + c, m, add(load(dbias + c, m), d));
    });
  }
}

void bias_gelu_grad_avx512(const float* x, const float* bias, float* g, int64_t rows,
                           int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* gr = g + r * cols;
    columns(cols, [&](int64_t c, __mmask16 m) {
      store(gr + c, m, grad(add(load(xr + c, m), load(bias + c, m))));
    });
  }
}

}  // namespace parm::cpu::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options
