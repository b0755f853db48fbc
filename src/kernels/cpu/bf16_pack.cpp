// fp32 operands rounded to bf16 into the packed layouts of the bf16 GEMM (bf16_detail.h).
// With AVX512-BF16 the rounding is VCVTNE2PS2BF16 and transposed operands go through
// 16 x 16 transposes of bf16 pairs in registers; without it, scalar loops do the same
// (f32_to_bf16, kernels/math/bf16_round.h: the same rounding, except that the instruction treats fp32 denormals as zero).
#include <immintrin.h>

#include <algorithm>
#include <cpuid.h>

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/bf16_avx512.h"
#include "kernels/cpu/bf16_detail.h"
#include "kernels/cpu/kernels.h"
#include "parm/error.h"


namespace parm::cpu {

using detail::kTileK;
using detail::kTileRows;
using detail::round_up;
using detail::load16;
using detail::pairs16;
using detail::transpose16;

bool detail::have_avx512_bf16() {
  static const bool have = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    const bool avx512bw = (ebx >> 30) & 1u, avx512f = (ebx >> 16) & 1u;
    if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) == 0) return false;
    return avx512f && avx512bw && ((eax >> 5) & 1u) != 0;
  }();
  return have;
}

using detail::have_avx512_bf16;

namespace {

// ---- AVX512-BF16 --------------------------------------------------------------------------

PARM_AVX512_BF16 void pack_at_avx512(int64_t j0, int64_t j1, int64_t m, int64_t k,
                                     const float* a, int64_t lda, uint16_t* packed);

PARM_AVX512_BF16 void pack_a_avx512(bool trans, int64_t m, int64_t k, const float* a, int64_t lda,
                                    uint16_t* packed) {
  const int64_t kp = round_up(k, kTileK);
  if (!trans) {
    for (int64_t i = 0; i < m; ++i) {
      const float* src = a + i * lda;
      uint16_t* row = packed + detail::packed_a_offset(i, 0, kp);
      for (int64_t j = 0; j < kp; j += 32) {
        const __m512 lo = load16(src + j, k - j), hi = load16(src + j + 16, k - j - 16);
        _mm512_storeu_si512(row + j * kTileRows,
                            reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
      }
    }
    return;
  }
  pack_at_avx512(0, kp, m, k, a, lda, packed);
}

// Columns [j0, j1) (multiples of 32, j1 <= round_up(k, 32)) of op(A) = A^T, A stored (k, m)
// with a pointing at stored row j0, into packed A; the padding rows up to round_up(m, 16)
// of those columns are written as zeros.
// op(A)[i][j] = a[j * lda + i]: stored rows j, j + 1 give the pairs (i, j..j+1) of 16 i;
// 16 such pairs of rows, transposed, are 16 rows of 32 packed values.
PARM_AVX512_BF16 void pack_at_avx512(int64_t j0, int64_t j1, int64_t m, int64_t k,
                                     const float* a, int64_t lda, uint16_t* packed) {
  const int64_t kp = round_up(k, kTileK);
  for (int64_t i0 = 0; i0 < m; i0 += 16) {
    const int64_t rows = std::min<int64_t>(16, m - i0);
    for (int64_t jb = j0; jb < j1; jb += 32) {
      __m512i v[16];
      for (int64_t q = 0; q < 16; ++q) {
        const int64_t j = jb + 2 * q;
        const float* src = a + (j - j0) * lda + i0;
        const __m512 lo = j < k ? load16(src, rows) : _mm512_setzero_ps();
        const __m512 hi = j + 1 < k ? load16(src + lda, rows) : _mm512_setzero_ps();
        v[q] = pairs16(lo, hi);
      }
      transpose16(v);
      // Lanes past `rows` were loaded as zeros: rows past m come out as the padding.
      uint16_t* tile = packed + detail::packed_a_offset(i0, jb, kp);
      for (int64_t i = 0; i < 16; ++i) _mm512_storeu_si512(tile + i * kTileK, v[i]);
    }
  }
}

// Pairs [p0, p1) of op(B) (k, n) not transposed into packed B; b points at stored row 2 p0.
PARM_AVX512_BF16 void pack_b_pairs_avx512(int64_t p0, int64_t p1, int64_t k, int64_t n,
                                          const float* b, int64_t ldb, uint16_t* packed) {
  const int64_t panels = round_up(n, kTileRows) / kTileRows, pairs = round_up(k, kTileK) / 2;
  // Stored rows 2p and 2p + 1, columns j0..j0+15: one 64-byte row of panel j0 / 16. Panels
  // in groups of kGroup, pairs inside a group: each pair reads 512 contiguous bytes of two
  // rows and writes kGroup streams. Pairs outermost over all panels wrote up to n / 16
  // streams pairs * 64 bytes apart (16 KiB at k = 512), which share a few L1 sets and
  // evicted each other: a (512, 2048) weight packed 1.5-2x slower that way.
  constexpr int64_t kGroup = 8;
  for (int64_t g0 = 0; g0 < panels; g0 += kGroup) {
    const int64_t g1 = std::min(panels, g0 + kGroup);
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t jp = g0; jp < g1; ++jp) {
        const int64_t j0 = jp * kTileRows, width = std::min<int64_t>(kTileRows, n - j0);
        const float* row = b + 2 * (p - p0) * ldb + j0;
        const __m512 lo = 2 * p < k ? load16(row, width) : _mm512_setzero_ps();
        const __m512 hi = 2 * p + 1 < k ? load16(row + ldb, width) : _mm512_setzero_ps();
        _mm512_storeu_si512(packed + (jp * pairs + p) * 2 * kTileRows, pairs16(lo, hi));
      }
  }
}

PARM_AVX512_BF16 void pack_b_avx512(bool trans, int64_t k, int64_t n, const float* b, int64_t ldb,
                                    uint16_t* packed) {
  const int64_t np = round_up(n, kTileRows), kp = round_up(k, kTileK), pairs = kp / 2;
  if (!trans) {
    pack_b_pairs_avx512(0, pairs, k, n, b, ldb, packed);
    return;
  }
  for (int64_t jp = 0; jp < np / kTileRows; ++jp) {
    uint16_t* panel = packed + jp * pairs * 2 * kTileRows;
    const int64_t j0 = jp * kTileRows, width = std::min<int64_t>(kTileRows, n - j0);
    // op(B)[kk][j] = b[j * ldb + kk]: stored row j gives column j's pairs p0..p0+15; the 16
    // columns' pairs, transposed, are 16 panel rows.
    for (int64_t kk = 0; kk < kp; kk += 32) {
      __m512i v[16];
      for (int64_t jj = 0; jj < 16; ++jj) {
        const float* src = b + (j0 + jj) * ldb;
        v[jj] = jj < width ? reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(
                                 load16(src + kk + 16, k - kk - 16), load16(src + kk, k - kk)))
                           : _mm512_setzero_si512();
      }
      transpose16(v);
      for (int64_t q = 0; q < 16; ++q)
        _mm512_storeu_si512(panel + (kk / 2 + q) * 2 * kTileRows, v[q]);
    }
  }
}

// ---- scalar ------------------------------------------------------------------------------

// Columns [j0, j1) of op(A) (multiples of 32, j1 <= round_up(k, 32)) into packed A, padding
// rows up to round_up(m, 16) and columns from k on as zeros; a points at op(A) column j0
// (stored row j0 when trans, else column j0 of row 0).
void pack_a_scalar(bool trans, int64_t j0, int64_t j1, int64_t m, int64_t k, const float* a,
                   int64_t lda, uint16_t* packed) {
  const int64_t kp = round_up(k, kTileK), mp = round_up(m, kTileRows);
  if (!trans) {  // row i's 32 values of each tile are contiguous in a and in the tile
    for (int64_t i = 0; i < mp; ++i)
      for (int64_t jb = j0; jb < j1; jb += kTileK) {
        uint16_t* dst = packed + detail::packed_a_offset(i, jb, kp);
        const int64_t width = i < m ? std::clamp<int64_t>(k - jb, 0, kTileK) : 0;
        const float* src = a + i * lda + (jb - j0);
        for (int64_t q = 0; q < width; ++q) dst[q] = f32_to_bf16(src[q]);
        std::fill(dst + width, dst + kTileK, uint16_t{0});
      }
    return;
  }
  constexpr int64_t kB = 32;  // transposed reads in 32 x 32 blocks
  for (int64_t i0 = 0; i0 < mp; i0 += kB)
    for (int64_t jb = j0; jb < j1; jb += kB) {
      const int64_t i1 = std::min(mp, i0 + kB), jb1 = std::min(j1, jb + kB);
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = jb; j < jb1; ++j) {
          const int64_t q = j - j0;
          packed[detail::packed_a_offset(i, j, kp)] =
              i < m && j < k ? f32_to_bf16(trans ? a[q * lda + i] : a[i * lda + q]) : uint16_t{0};
        }
    }
}

// Pairs [p0, p1) of op(B); b points at op(B) row 2 p0 (stored row, or column when trans).
void pack_b_scalar(bool trans, int64_t p0, int64_t p1, int64_t k, int64_t n, const float* b,
                   int64_t ldb, uint16_t* packed) {
  const int64_t np = round_up(n, kTileRows), pairs = round_up(k, kTileK) / 2;
  // Panel jp, pair p, column jj, half t: op(B)[2p + t][16 jp + jj].
  for (int64_t jp = 0; jp < np / kTileRows; ++jp) {
    uint16_t* panel = packed + jp * pairs * 2 * kTileRows;
    const int64_t j0 = jp * kTileRows, width = std::min<int64_t>(kTileRows, n - j0);
    std::fill(panel + p0 * 2 * kTileRows, panel + p1 * 2 * kTileRows, uint16_t{0});
    for (int64_t kk = 2 * p0; kk < std::min(k, 2 * p1); ++kk) {
      uint16_t* row = panel + (kk / 2) * 2 * kTileRows + (kk & 1);
      const int64_t q = kk - 2 * p0;
      for (int64_t jj = 0; jj < width; ++jj)
        row[jj * 2] = f32_to_bf16(trans ? b[(j0 + jj) * ldb + q] : b[q * ldb + j0 + jj]);
    }
  }
}

// The row-block packers' arguments: rows k0 .. k0 + rows - 1 of an operand stored (k, width)
// with leading dimension ld; k0 a multiple of 32, rows a multiple of `step` unless the block
// ends at k.
void check_row_block(const char* op, int64_t k0, int64_t rows, int64_t k, int64_t width,
                     int64_t ld, int64_t step) {
  PARM_CHECK(k0 >= 0 && k0 % kTileK == 0 && rows >= 0 && k0 + rows <= k && width >= 0 &&
                 ld >= std::max<int64_t>(1, width),
             "{}: k0 = {} (a multiple of {}), rows = {}, k = {}, row width = {}, ld = {}", op, k0,
             kTileK, rows, k, width, ld);
  PARM_CHECK(k0 + rows == k || rows % step == 0,
             "{}: rows = {} must be a multiple of {} unless the block ends at k = {}", op, rows,
             step, k);
}

}  // namespace

int64_t bf16_packed_a_size(int64_t m, int64_t k) {
  return round_up(m, kTileRows) * round_up(k, kTileK);
}

int64_t bf16_packed_b_size(int64_t k, int64_t n) {
  return round_up(n, kTileRows) * round_up(k, kTileK);
}

void bf16_pack_a(bool trans, int64_t m, int64_t k, const float* a, int64_t lda,
                 uint16_t* packed) {
  PARM_CHECK(m >= 0 && k >= 0 && lda >= std::max<int64_t>(1, trans ? m : k),
             "bf16_pack_a: m = {}, k = {}, trans = {}, lda = {}", m, k, trans, lda);
  const int64_t mp = round_up(m, kTileRows), kp = round_up(k, kTileK);
  if (have_avx512_bf16() && !detail::bf16_portable_forced())
    pack_a_avx512(trans, m, k, a, lda, packed);
  else
    pack_a_scalar(trans, 0, kp, m, k, a, lda, packed);
  // Padding rows m..mp of the last 16-row block: 64 bytes in each of its tiles.
  for (int64_t i = m; i < mp; ++i)
    for (int64_t j = 0; j < kp; j += kTileK) {
      uint16_t* row = packed + detail::packed_a_offset(i, j, kp);
      std::fill(row, row + kTileK, uint16_t{0});
    }
}

void bf16_pack_at_rows(int64_t k0, int64_t rows, int64_t m, int64_t k, const float* a,
                       int64_t lda, uint16_t* packed) {
  check_row_block("bf16_pack_at_rows", k0, rows, k, m, lda, kTileK);
  // The last block also zeroes the padding columns up to round_up(k, 32).
  const int64_t j1 = k0 + rows == k ? round_up(k, kTileK) : k0 + rows;
  if (have_avx512_bf16() && !detail::bf16_portable_forced())
    pack_at_avx512(k0, j1, m, k, a, lda, packed);
  else
    pack_a_scalar(true, k0, j1, m, k, a, lda, packed);
}

void bf16_pack_b(bool trans, int64_t k, int64_t n, const float* b, int64_t ldb,
                 uint16_t* packed) {
  PARM_CHECK(k >= 0 && n >= 0 && ldb >= std::max<int64_t>(1, trans ? k : n),
             "bf16_pack_b: k = {}, n = {}, trans = {}, ldb = {}", k, n, trans, ldb);
  if (have_avx512_bf16() && !detail::bf16_portable_forced())
    pack_b_avx512(trans, k, n, b, ldb, packed);
  else
    pack_b_scalar(trans, 0, round_up(k, kTileK) / 2, k, n, b, ldb, packed);
}

void bf16_pack_b_rows(int64_t k0, int64_t rows, int64_t k, int64_t n, const float* b,
                      int64_t ldb, uint16_t* packed) {
  check_row_block("bf16_pack_b_rows", k0, rows, k, n, ldb, 2);
  // The last block also zeroes the padding pairs up to round_up(k, 32).
  const int64_t p0 = k0 / 2, p1 = k0 + rows == k ? round_up(k, kTileK) / 2 : (k0 + rows + 1) / 2;
  if (have_avx512_bf16() && !detail::bf16_portable_forced())
    pack_b_pairs_avx512(p0, p1, k, n, b, ldb, packed);
  else
    pack_b_scalar(false, p0, p1, k, n, b, ldb, packed);
}

void bf16_pack_b_both(int64_t rows, int64_t cols, const float* w, uint16_t* packed,
                      uint16_t* packed_t) {
  // 32 rows of w: a multiple of B's pair blocks and of w^T's 16-column panels.
  constexpr int64_t kBlock = 32;
  const int64_t panel_t = bf16_packed_b_size(cols, kTileRows);  // values per panel of w^T
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    const int64_t nr = std::min(kBlock, rows - r0);
    bf16_pack_b_rows(r0, nr, rows, cols, w + r0 * cols, cols, packed);
    // w^T (cols, rows) as B: its columns r0 .. r0 + nr are rows of w, panels r0 / 16 on.
    bf16_pack_b(true, cols, nr, w + r0 * cols, cols, packed_t + (r0 / kTileRows) * panel_t);
  }
}

}  // namespace parm::cpu
