// fp32 operands rounded to bf16 into the packed layouts of the bf16 GEMM (bf16_detail.h).
// Memory-bound: the loops are blocked so a transposed read touches each cache line once.
#include <algorithm>

#include "kernels/cpu/bf16_detail.h"
#include "kernels/cpu/kernels.h"
#include "parm/error.h"

namespace parm::cpu {

using detail::kTileK;
using detail::kTileRows;
using detail::round_up;
using detail::to_bf16;

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
  if (!trans) {
    for (int64_t i = 0; i < m; ++i) {
      uint16_t* row = packed + i * kp;
      const float* src = a + i * lda;
      for (int64_t j = 0; j < k; ++j) row[j] = to_bf16(src[j]);
      std::fill(row + k, row + kp, uint16_t{0});
    }
  } else {
    // op(A)[i][j] = a[j * lda + i]: 32 x 32 blocks.
    constexpr int64_t kB = 32;
    for (int64_t i0 = 0; i0 < m; i0 += kB)
      for (int64_t j0 = 0; j0 < k; j0 += kB) {
        const int64_t i1 = std::min(m, i0 + kB), j1 = std::min(k, j0 + kB);
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t j = j0; j < j1; ++j) packed[i * kp + j] = to_bf16(a[j * lda + i]);
      }
    for (int64_t i = 0; i < m; ++i) std::fill(packed + i * kp + k, packed + (i + 1) * kp, uint16_t{0});
  }
  std::fill(packed + m * kp, packed + mp * kp, uint16_t{0});
}

void bf16_pack_b(bool trans, int64_t k, int64_t n, const float* b, int64_t ldb,
                 uint16_t* packed) {
  PARM_CHECK(k >= 0 && n >= 0 && ldb >= std::max<int64_t>(1, trans ? k : n),
             "bf16_pack_b: k = {}, n = {}, trans = {}, ldb = {}", k, n, trans, ldb);
  const int64_t np = round_up(n, kTileRows), kp = round_up(k, kTileK);
  const int64_t pairs = kp / 2;
  // Panel jp, pair p, column jj, half t: op(B)[2p + t][16 jp + jj].
  for (int64_t jp = 0; jp < np / kTileRows; ++jp) {
    uint16_t* panel = packed + jp * pairs * 2 * kTileRows;
    const int64_t j0 = jp * kTileRows, width = std::min<int64_t>(kTileRows, n - j0);
    if (width < kTileRows) std::fill(panel, panel + pairs * 2 * kTileRows, uint16_t{0});
    for (int64_t p = 0; p < pairs; ++p) {
      uint16_t* row = panel + p * 2 * kTileRows;
      for (int t = 0; t < 2; ++t) {
        const int64_t kk = 2 * p + t;
        if (kk >= k) {
          for (int64_t jj = 0; jj < width; ++jj) row[jj * 2 + t] = 0;
          continue;
        }
        if (!trans) {
          const float* src = b + kk * ldb + j0;
          for (int64_t jj = 0; jj < width; ++jj) row[jj * 2 + t] = to_bf16(src[jj]);
        } else {
          const float* src = b + j0 * ldb + kk;
          for (int64_t jj = 0; jj < width; ++jj) row[jj * 2 + t] = to_bf16(src[jj * ldb]);
        }
      }
    }
  }
}

}  // namespace parm::cpu
