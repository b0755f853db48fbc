// The AdamW update over fp32 arrays: AVX-512, 16 elements at a time, where the CPU has it,
// else the scalar loop. Both round every step in the same order (this file is compiled with
// -ffp-contract=off, so neither fuses a multiply into an add; sqrt and division are
// correctly rounded in both), so they give the same bits: the scalar loop is the oracle.
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/kernels.h"


namespace parm::cpu {
namespace {

void adamw_scalar(const AdamWScalars& s, float* w, const float* g, float* m, float* v,
                  int64_t begin, int64_t end) {
  for (int64_t j = begin; j < end; ++j) {
    const float gj = g[j] * s.grad_scale;
    m[j] = s.beta1 * m[j] + (1.0f - s.beta1) * gj;
    v[j] = s.beta2 * v[j] + (1.0f - s.beta2) * gj * gj;
    w[j] = w[j] * s.decay - s.step_size * m[j] / (std::sqrt(v[j]) * s.inv_sqrt_bc2 + s.eps);
  }
}

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps and warn about it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
PARM_AVX512 int64_t adamw_avx512(const AdamWScalars& s, float* w, const float* g, float* m,
                                 float* v, int64_t n) {
  const __m512 scale = _mm512_set1_ps(s.grad_scale), b1 = _mm512_set1_ps(s.beta1),
               b2 = _mm512_set1_ps(s.beta2), c1 = _mm512_set1_ps(1.0f - s.beta1),
               c2 = _mm512_set1_ps(1.0f - s.beta2), step = _mm512_set1_ps(s.step_size),
               ibc2 = _mm512_set1_ps(s.inv_sqrt_bc2), eps = _mm512_set1_ps(s.eps),
               decay = _mm512_set1_ps(s.decay);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 gj = _mm512_mul_ps(_mm512_loadu_ps(g + j), scale);
    const __m512 mj = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + j)), _mm512_mul_ps(c1, gj));
    const __m512 vj = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + j)),
                                    _mm512_mul_ps(_mm512_mul_ps(c2, gj), gj));
    const __m512 den = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(vj), ibc2), eps);
    const __m512 wj = _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(w + j), decay),
                                    _mm512_div_ps(_mm512_mul_ps(step, mj), den));
    _mm512_storeu_ps(m + j, mj);
    _mm512_storeu_ps(v + j, vj);
    _mm512_storeu_ps(w + j, wj);
  }
  return j;
}
#pragma GCC diagnostic pop


}  // namespace

void adamw(const AdamWScalars& s, float* w, const float* g, float* m, float* v, int64_t n) {
  const int64_t done = detail::have_avx512f() ? adamw_avx512(s, w, g, m, v, n) : 0;
  adamw_scalar(s, w, g, m, v, done, n);
}

void adamw_reference(const AdamWScalars& s, float* w, const float* g, float* m, float* v,
                     int64_t n) {
  adamw_scalar(s, w, g, m, v, 0, n);
}

}  // namespace parm::cpu
