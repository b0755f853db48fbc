// Register-level pieces of the bf16 packing (bf16_detail.h's layouts) shared by the packers
// (bf16_pack.cpp) and the GeLU steps that pack their output from registers (gelu_bf16.cpp).
// Private to the CPU kernels; callers are compiled with PARM_AVX512_BF16.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/avx512.h"

namespace parm::cpu::detail {

// 16 lanes of fp32 from p (the first `count`, the rest zero).
PARM_AVX512_BF16 inline __m512 load16(const float* p, int64_t count) {
  return _mm512_maskz_loadu_ps(first_lanes(count), p);
}

// bf16 pairs (lo[i], hi[i]) as 16 dwords: lane i = lo[i] | hi[i] << 16. One 64-byte row of a
// packed B panel (rows 2p and 2p + 1 of 16 columns), or one input row of transpose16.
PARM_AVX512_BF16 inline __m512i pairs16(__m512 lo, __m512 hi) {
  // cvtne2ps: words 0..15 = lo, 16..31 = hi; interleave them.
  const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                       8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, both);
}

// r[i] lane j becomes r[j] lane i (16 x 16 dwords: unpacks within 128-bit lanes, then lane
// shuffles). GCC 12's unpack intrinsics start from _mm512_undefined and warn about it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
PARM_AVX512_BF16 inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + j + 4], 0x88);
      t[8 * i + j + 4] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + j + 4], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
  }
}
#pragma GCC diagnostic pop

}  // namespace parm::cpu::detail
