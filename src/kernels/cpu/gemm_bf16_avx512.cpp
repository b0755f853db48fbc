// The bf16 GEMM on AVX512-BF16 (VDPBF16PS), for CPUs that have it but no AMX (AMD Zen 4 and
// 5, Intel Cooper Lake): the same packed operands as the AMX kernel (bf16_detail.h), read as
// they lie. A 16-column panel of packed B holds, for each k pair, 16 columns x 2 bf16 = one
// 64-byte register; a row of packed A holds the same k pair as one 32-bit value, broadcast to
// every lane. One VDPBF16PS then adds a0 b0 + a1 b1 to 16 fp32 accumulators of C's row.
// A register block is kRows rows x kPanels panels of C (24 accumulators, 3 B registers, one
// broadcast); over each k pair it issues 3 loads of B, 8 broadcasts of A and 24 products.
// Cache blocking: k in blocks of kBlockPairs pairs (a group's three B panels, 24 KiB, stay in
// L1 while the register blocks of A's rows stream past from L2), rows in blocks of
// kBlockRows (their k block of A, 256 KiB, stays in L2 while every panel group passes it: a
// (2048, 512) x (512, 512) product measured 1.07x faster at the median than without); C is
// loaded and stored once per k block. Each element of C is the same sum in the same order
// wherever its block lies (k pairs in order, C carried exactly between k blocks), so partial
// blocks give the bits of full ones.
// Rows of C past m and columns past n are never read or written (masked stores); the rows
// and columns of padding in the packed operands are zeros, so the products over them are
// computed and dropped.
//
// Only the functions marked PARM_AVX512_BF16 are compiled for it; they run after
// have_avx512_bf16().
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/bf16_detail.h"

#define PARM_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

namespace parm::cpu::detail {
namespace {

constexpr int kRows = 8;     // rows of C in a register block (half a 16-row block of A)
constexpr int kPanels = 3;   // 16-column panels of C in a register block
constexpr int64_t kBlockPairs = 128;  // k pairs per cache block (k 256)
constexpr int64_t kBlockRows = 512;   // rows of A per cache block (256 KiB of a k block)

// C rows [0, R) x panels [0, P) of a register block over k pairs [p0, p1). `a` points at the
// block's first row inside its packed 16-row block (row r is 32 values further), `b` at its
// first panel (panel j is `panel` values further), c at C's block; masks[j]: panel j's
// columns inside C.
template <int R, int P>
PARM_AVX512_BF16 void block(const uint16_t* a, const uint16_t* b, int64_t panel, int64_t p0,
                            int64_t p1, float* c, int64_t ldc, const __mmask16* masks,
                            bool load) {
  __m512 acc[R][P];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int j = 0; j < P; ++j)
      acc[r][j] = load ? _mm512_maskz_loadu_ps(masks[j], c + r * ldc + j * kTileRows)
                       : _mm512_setzero_ps();
  for (int64_t p = p0; p < p1; ++p) {
    // Pair p of a packed A row: its 32-k tile (16 x 32 values), then 2 values a pair.
    const uint16_t* ak = a + (p >> 4) * (kTileRows * kTileK) + (p & 15) * 2;
    __m512bh bv[P];
#pragma GCC unroll 3
    for (int j = 0; j < P; ++j)
      bv[j] = (__m512bh)_mm512_loadu_si512(b + j * panel + p * 2 * kTileRows);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, ak + r * kTileK, sizeof pair);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 3
      for (int j = 0; j < P; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], av, bv[j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int j = 0; j < P; ++j)
      _mm512_mask_storeu_ps(c + r * ldc + j * kTileRows, masks[j], acc[r][j]);
}

using BlockFn = void (*)(const uint16_t*, const uint16_t*, int64_t, int64_t, int64_t, float*,
                         int64_t, const __mmask16*, bool);

template <int R>
constexpr BlockFn block_for_panels(int panels) {
  return panels == 3 ? &block<R, 3> : panels == 2 ? &block<R, 2> : &block<R, 1>;
}

// The register block for r rows (1..kRows) and p panels (1..kPanels).
BlockFn block_for(int rows, int panels) {
  switch (rows) {
    case 1: return block_for_panels<1>(panels);
    case 2: return block_for_panels<2>(panels);
    case 3: return block_for_panels<3>(panels);
    case 4: return block_for_panels<4>(panels);
    case 5: return block_for_panels<5>(panels);
    case 6: return block_for_panels<6>(panels);
    case 7: return block_for_panels<7>(panels);
    default: return block_for_panels<8>(panels);
  }
}

}  // namespace

void gemm_bf16_avx512(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b,
                      float* c, int64_t ldc, bool accumulate) {
  const int64_t kp = round_up(k, kTileK), pairs = kp / 2;
  const int64_t panel = kp * kTileRows;  // values per B panel
  const int64_t panels = round_up(n, kTileRows) / kTileRows;
  const BlockFn full = block_for(kRows, kPanels);
  for (int64_t q0 = 0; q0 < pairs; q0 += kBlockPairs) {
    const int64_t q1 = std::min(pairs, q0 + kBlockPairs);
    const bool load = accumulate || q0 > 0;
    for (int64_t i0 = 0; i0 < m; i0 += kBlockRows) {
      const int64_t i1 = std::min(m, i0 + kBlockRows);
      for (int64_t jp = 0; jp < panels; jp += kPanels) {
        const int np = static_cast<int>(std::min<int64_t>(kPanels, panels - jp));
        __mmask16 masks[kPanels];
        for (int j = 0; j < np; ++j) {
          const int64_t width = std::min<int64_t>(kTileRows, n - (jp + j) * kTileRows);
          masks[j] = static_cast<__mmask16>((1u << width) - 1u);
        }
        const uint16_t* bj = b + jp * panel;
        for (int64_t i = i0; i < i1; i += kRows) {
          const int rows = static_cast<int>(std::min<int64_t>(kRows, i1 - i));
          const uint16_t* ai = a + packed_a_offset(i, 0, kp);
          const BlockFn fn = rows == kRows && np == kPanels ? full : block_for(rows, np);
          fn(ai, bj, panel, q0, q1, c + i * ldc + jp * kTileRows, ldc, masks, load);
        }
      }
    }
  }
}

}  // namespace parm::cpu::detail
