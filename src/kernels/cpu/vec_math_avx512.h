// vec_math.h's exp_f32 and clamp/NaN helpers, 16 lanes with AVX-512F, giving the bits of the
// scalar forms (every product rounded on its own, no FMA), and a column loop for the
// elementwise kernels built on them (gelu_avx512.cpp, swiglu_avx512.cpp). Include it inside a
// `#pragma GCC target("avx512f")` region (a target attribute would not reach the lambdas that
// `columns` calls); callers check detail::have_avx512f(). Private to the CPU kernels.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/avx512.h"
#include "kernels/math/exp_math.h"

namespace parm::cpu::detail::avx512 {

inline __m512 splat(float v) { return _mm512_set1_ps(v); }
inline __m512 mul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
inline __m512 add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }

// math::exp_f32, 16 lanes, its bits: the clamp (a float min/max: the same for every number;
// NaN is patched at the end as there), the reduction and the polynomial with each product
// rounded alone, 2^n as two normal factors.
inline __m512 exp_nc(__m512 x) {
  using namespace math::exp_f32_constants;
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, splat(kLo)), splat(kHi));
  const __m512 round = splat(kRound);
  const __m512 n = _mm512_sub_ps(add(mul(xc, splat(kLog2e)), round), round);
  __m512 r = _mm512_sub_ps(xc, mul(n, splat(kLn2Hi)));
  r = _mm512_sub_ps(r, mul(n, splat(kLn2Lo)));
  __m512 p = add(splat(1.0f / 5040.0f), mul(r, splat(1.0f / 40320.0f)));
  p = add(splat(1.0f / 720.0f), mul(r, p));
  p = add(splat(1.0f / 120.0f), mul(r, p));
  p = add(splat(1.0f / 24.0f), mul(r, p));
  p = add(splat(1.0f / 6.0f), mul(r, p));
  p = add(splat(0.5f), mul(r, p));
  p = add(splat(1.0f), mul(r, p));
  p = add(splat(1.0f), mul(r, p));
  const __m512 y = times_pow2_avx512(p, n);
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

// math::clamp_f32(v, lo, hi) with its NaN rule: a NaN lands on lo when its sign bit is set,
// on hi otherwise (the ordered-bits clamp). `nan` is v's NaN lanes.
inline __m512 clamp(__m512 v, float lo, float hi, __mmask16 nan) {
  const __m512 c = _mm512_min_ps(_mm512_max_ps(v, splat(lo)), splat(hi));  // NaN -> lo
  const __mmask16 positive =
      _mm512_cmpge_epi32_mask(_mm512_castps_si512(v), _mm512_setzero_si512());
  return _mm512_mask_mov_ps(c, nan & positive, splat(hi));
}

// math::nan_if_nan(y, v) at v's NaN lanes `nan`: y's bits with the quiet-NaN bits OR-ed in.
inline __m512 nan_where(__m512 y, __mmask16 nan) {
  const __m512i b = _mm512_castps_si512(y);
  return _mm512_castsi512_ps(_mm512_mask_or_epi32(b, nan, b, _mm512_set1_epi32(0x7fc00000)));
}

inline __mmask16 nan_lanes(__m512 v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q); }

// f(c, mask) over columns [0, cols): two independent blocks of 16 per step (their chains
// overlap), then the tail under a mask.
template <typename F>
inline void columns(int64_t cols, F&& f) {
  int64_t c = 0;
  for (; c + 32 <= cols; c += 32) {
    f(c, __mmask16{0xffff});
    f(c + 16, __mmask16{0xffff});
  }
  for (; c < cols; c += 16) f(c, first_lanes(cols - c));
}

inline __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline void store(float* p, __mmask16 m, __m512 v) { _mm512_mask_storeu_ps(p, m, v); }

}  // namespace parm::cpu::detail::avx512
