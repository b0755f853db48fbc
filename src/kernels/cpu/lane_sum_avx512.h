// The 16 lanes of an AVX-512 register added in lane order (0 + lane 0 + lane 1 + ... + lane
// 15): the order in which the scalar kernels add their kLanes partial sums (vec_math.h) and
// the CUDA kernels reproduce, straight from the register (a 64-byte store read back as 4-byte
// loads stalls). The lane extractions do not depend on the running sum: only the adds are
// serial. Private to the CPU kernels; callers are compiled for AVX-512 (target attribute).
#pragma once

#include <immintrin.h>

namespace parm::cpu::detail {

__attribute__((target("avx512f"))) inline float lane_sum_avx512(__m512 v) {
  __m128 s = _mm_setzero_ps();
  const __m128 q[4] = {_mm512_castps512_ps128(v), _mm512_extractf32x4_ps(v, 1),
                       _mm512_extractf32x4_ps(v, 2), _mm512_extractf32x4_ps(v, 3)};
  for (const __m128 x : q) {
    s = _mm_add_ss(s, x);
    s = _mm_add_ss(s, _mm_movehdup_ps(x));
    s = _mm_add_ss(s, _mm_movehl_ps(x, x));
    s = _mm_add_ss(s, _mm_shuffle_ps(x, x, 3));
  }
  return _mm_cvtss_f32(s);
}

}  // namespace parm::cpu::detail
