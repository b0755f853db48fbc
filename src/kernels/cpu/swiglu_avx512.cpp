// swiglu_avx512.h: swiglu.cpp's loops, 16 lanes at a time, with their bits.
#include "kernels/cpu/swiglu_avx512.h"

#include "kernels/math/silu_math.h"

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

// swiglu.cpp's operands of silu at a: xc (a clamped to +-kClamp, the exp's), xv (clamped
// below only, the numerator's) and e = exp(-xc); `nan` is a's NaN lanes.
struct Silu {
  __mmask16 nan;
  __m512 xc, xv, e;
};

inline Silu silu_of(__m512 a) {
  Silu s;
  s.nan = nan_lanes(a);
  s.xc = clamp(a, -silu::kClamp, silu::kClamp, s.nan);
  s.xv = clamp(a, -silu::kClamp, __builtin_inff(), s.nan);
  s.e = exp_nc(_mm512_sub_ps(_mm512_setzero_ps(), s.xc));  // -xc: exact
  return s;
}

// silu::value: xv / (1 + e).
inline __m512 value(const Silu& s) {
  return nan_where(_mm512_div_ps(s.xv, add(splat(1.0f), s.e)), s.nan);
}

// silu::grad: s (1 + xc (e s)), s = 1 / (1 + e).
inline __m512 grad(const Silu& s) {
  const __m512 sg = _mm512_div_ps(splat(1.0f), add(splat(1.0f), s.e));
  return nan_where(mul(sg, add(splat(1.0f), mul(s.xc, mul(s.e, sg)))), s.nan);
}

}  // namespace

void swiglu_forward_avx512(const float* a, const float* g, float* act, int64_t n) {
  columns(n, [&](int64_t c, __mmask16 m) {
    store(act + c, m, mul(value(silu_of(load(a + c, m))), load(g + c, m)));
  });
}

void swiglu_backward_avx512(const float* a, const float* g, const float* dact, float* da,
                            float* dg, int64_t n) {
  columns(n, [&](int64_t c, __mmask16 m) {
    const Silu s = silu_of(load(a + c, m));
    const __m512 d = load(dact + c, m);
    const __m512 gv = load(g + c, m);
    // Both loads come before either store: da may alias dact.
    const __m512 v = value(s), ds = grad(s);
    store(da + c, m, mul(mul(d, gv), ds));
    store(dg + c, m, mul(d, v));
  });
}

}  // namespace parm::cpu::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options
