// What the CPU kernels' AVX-512 paths share: the target attributes they are compiled with,
// the run-time check that picks them (else their scalar loops), the mask of a row's tail
// lanes and a lane-ordered sum.
// Private to the CPU kernels.
#pragma once

#include <immintrin.h>

#include <cstdint>

#define PARM_AVX512 __attribute__((target("avx512f")))
// The bf16 conversions (vcvtne2ps2bf16); picked after detail::have_avx512_bf16().
#define PARM_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace parm::cpu::detail {

// Whether this CPU runs AVX-512F (asked once).
inline bool have_avx512f() {
  static const bool have = __builtin_cpu_supports("avx512f");
  return have;
}

// Lanes [0, n) of a block of 16: all 16 from n >= 16, none at n <= 0.
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? __mmask16{0xffff} : n <= 0 ? __mmask16{0} : static_cast<__mmask16>((1u << n) - 1u);
}

// q 2^n for integral n in [-150, 128] (exp_f32's range): 2^n as two factors whose exponents
// are both normal, so that the last product rounds once into the denormals, or overflows,
// where exp does. exp_f32's last step, shared by its AVX-512 forms (vec_math_avx512.h,
// softmax_attention.cpp).
PARM_AVX512 inline __m512 times_pow2_avx512(__m512 q, __m512 n) {
  const __m512i ni = _mm512_cvttps_epi32(n);
  const __m512i n1 = _mm512_srai_epi32(ni, 1);
  const __m512i n2 = _mm512_sub_epi32(ni, n1);
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23));
  const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23));
  return _mm512_mul_ps(_mm512_mul_ps(q, s1), s2);
}

// The 16 lanes of an AVX-512 register added in lane order (0 + lane 0 + lane 1 + ... + lane
// 15): the order in which the scalar kernels add their kLanes partial sums (vec_math.h) and
// the CUDA kernels reproduce, straight from the register (a 64-byte store read back as 4-byte
// loads stalls). The lane extractions do not depend on the running sum: only the adds are
// serial. Callers are compiled for AVX-512 (PARM_AVX512).
PARM_AVX512 inline float lane_sum_avx512(__m512 v) {
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
