// The bf16 GEMM where the CPU has no bf16 units (no AMX, no AVX512-BF16): the packed bf16
// operands widened back to fp32 and multiplied by the fp32 GEMM (gemm.cpp: oneDNN), which
// accumulates in fp32. Widening is exact (a bf16 value is the upper half of an fp32) and so
// is every product of two bf16 values in fp32: the result is the other kernels' sum in
// another order, at the fp32 GEMM's rate less the widening (one pass over each operand).
// Blocks: k in blocks of kBlockK, columns in blocks of kBlockN. Within a k block the widened
// A (m, kBlockK) serves every column block, and each widened B block (kBlockK, kBlockN;
// 512 KiB) is multiplied while it is still in L2. The widening runs on the calling thread;
// the fp32 GEMM on the GEMM's threads (gemm_threads.h).
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/bf16_detail.h"
#include "kernels/cpu/kernels.h"

namespace parm::cpu::detail {
namespace {

constexpr int64_t kBlockK = 256;  // a multiple of kTileK
constexpr int64_t kBlockN = 512;  // a multiple of kTileRows

// Per thread, grown to the largest blocks seen (the steady state allocates nothing).
struct WideScratch {
  std::vector<float> a, b;
};

WideScratch& wide_scratch() {
  thread_local WideScratch scratch;
  return scratch;
}

// Columns [k0, k0 + kb) of packed A (m rows, kp = round_up(k, 32) columns) into a (m, kb)
// fp32 row-major; k0 a multiple of 32.
void widen_a(int64_t m, int64_t kp, int64_t k0, int64_t kb, const uint16_t* packed, float* a) {
  for (int64_t i = 0; i < m; ++i) {
    float* row = a + i * kb;
    int64_t kk = 0;
    for (; kk + kTileK <= kb; kk += kTileK) {  // whole tile rows: 32 values, vectorised
      const uint16_t* src = packed + packed_a_offset(i, k0 + kk, kp);
      for (int64_t q = 0; q < kTileK; ++q) row[kk + q] = bf16_to_f32(src[q]);
    }
    if (kk < kb) {
      const uint16_t* src = packed + packed_a_offset(i, k0 + kk, kp);
      for (int64_t q = 0; q < kb - kk; ++q) row[kk + q] = bf16_to_f32(src[q]);
    }
  }
}

// Rows [k0, k0 + kb) and columns [j0, j0 + nb) of packed B (kp = round_up(k, 32) rows) into
// b (kb, nb) fp32 row-major; k0 even, j0 a multiple of 16. A panel's pair p holds 16 columns
// as 32-bit words, row 2p in the low half and row 2p + 1 in the high half of each: shifted
// up and masked they are the two rows' fp32 values.
void widen_b(int64_t kp, int64_t k0, int64_t kb, int64_t j0, int64_t nb, const uint16_t* packed,
             float* b) {
  const int64_t pairs = kp / 2;
  for (int64_t r = 0; r < kb; r += 2) {
    float* lo = b + r * nb;
    float* hi = lo + nb;  // row r + 1, written while r + 1 < kb
    const bool has_hi = r + 1 < kb;
    for (int64_t jj = 0; jj < nb; jj += kTileRows) {
      const int64_t jp = (j0 + jj) / kTileRows, width = std::min(kTileRows, nb - jj);
      uint32_t w[kTileRows];
      std::memcpy(w, packed + (jp * pairs + (k0 + r) / 2) * 2 * kTileRows, sizeof(w));
      if (width == kTileRows) {
        for (int64_t q = 0; q < kTileRows; ++q) lo[jj + q] = bits_to_float(w[q] << 16);
        if (has_hi)
          for (int64_t q = 0; q < kTileRows; ++q) hi[jj + q] = bits_to_float(w[q] & 0xffff0000u);
      } else {
        for (int64_t q = 0; q < width; ++q) lo[jj + q] = bits_to_float(w[q] << 16);
        if (has_hi)
          for (int64_t q = 0; q < width; ++q) hi[jj + q] = bits_to_float(w[q] & 0xffff0000u);
      }
    }
  }
}

}  // namespace

void gemm_bf16_fp32(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b,
                    float* c, int64_t ldc, bool accumulate) {
  const int64_t kp = round_up(k, kTileK);
  const int64_t kb_max = std::min(k, kBlockK), nb_max = std::min(n, kBlockN);
  WideScratch& s = wide_scratch();
  if (s.a.size() < static_cast<size_t>(m * kb_max)) s.a.resize(static_cast<size_t>(m * kb_max));
  if (s.b.size() < static_cast<size_t>(kb_max * nb_max))
    s.b.resize(static_cast<size_t>(kb_max * nb_max));
  for (int64_t k0 = 0; k0 < k; k0 += kBlockK) {
    const int64_t kb = std::min(kBlockK, k - k0);
    widen_a(m, kp, k0, kb, a, s.a.data());
    for (int64_t j0 = 0; j0 < n; j0 += kBlockN) {
      const int64_t nb = std::min(kBlockN, n - j0);
      widen_b(kp, k0, kb, j0, nb, b, s.b.data());
      // C (m, nb) (+)= A (m, kb) B (kb, nb); the k blocks after the first accumulate.
      gemm(false, false, m, nb, kb, s.a.data(), kb, s.b.data(), nb, c + j0, ldc,
           accumulate || k0 > 0);
    }
  }
}

}  // namespace parm::cpu::detail
