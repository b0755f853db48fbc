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
