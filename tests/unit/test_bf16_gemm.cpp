// The bf16 GEMM (kernels.h): every kernel this CPU has (AMX, AVX512-BF16, the fp32 GEMM over
// widened operands, the portable loop)
// against an fp64 sum over the bf16-rounded operands, over shapes that leave every kind of
// partial tile, all four transpositions and both accumulate modes; and checks that the
// operands really are rounded to bf16 (the result differs from fp32 by the rounding, and
// by no more).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "parm/error.h"
#include "parm/rng.h"

namespace parm::cpu {
namespace {

float round_bf16(float f) {
  // Round to nearest even at 16 bits (the operands here are finite).
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<float> normal(int64_t n, uint64_t stream) {
  Rng rng(777, stream);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = rng.normal();
  return v;
}

// Forces one kernel for a scope.
struct KernelScope {
  explicit KernelScope(Bf16Kernel k) { set_bf16_kernel(k); }
  ~KernelScope() { set_bf16_kernel(Bf16Kernel::kAuto); }
};

std::vector<Bf16Kernel> kernels() {
  std::vector<Bf16Kernel> out = {Bf16Kernel::kPortable, Bf16Kernel::kFp32};
  try {
    set_bf16_kernel(Bf16Kernel::kAmx);
    out.push_back(Bf16Kernel::kAmx);
  } catch (const InvalidConfig&) {
  }
  try {
    set_bf16_kernel(Bf16Kernel::kAvx512);
    out.push_back(Bf16Kernel::kAvx512);
  } catch (const InvalidConfig&) {
  }
  set_bf16_kernel(Bf16Kernel::kAuto);
  return out;
}

// Stored operand layout for gemm(): A (m, k) or (k, m), B (k, n) or (n, k); lda/ldb with a
// gap of 3 so the packing honours the leading dimension. Checks C against an fp64 sum over
// the rounded operands, for all four transpositions and both accumulate modes.
void expect_matches_fp64(int64_t m, int64_t n, int64_t k) {
  for (int t = 0; t < 8; ++t) {
    const bool ta = t & 1, tb = t & 2, acc = t & 4;
    const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 3, ldc = n + 2;
    const auto a = normal((ta ? k : m) * lda, 1), b = normal((tb ? n : k) * ldb, 2);
    const auto c0 = normal(m * ldc, 3);
    std::vector<float> c = c0;
    gemm_bf16(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc, acc);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double want = acc ? c0[i * ldc + j] : 0.0, mag = std::fabs(want);
        for (int64_t p = 0; p < k; ++p) {
          const double x = round_bf16(ta ? a[p * lda + i] : a[i * lda + p]);
          const double y = round_bf16(tb ? b[j * ldb + p] : b[p * ldb + j]);
          want += x * y;
          mag += std::fabs(x * y);
        }
        // fp32 accumulation of k exact products: (k + 1) u |terms|, doubled.
        const double bound = 2.0 * (k + 1) * 0x1p-24 * mag + 1e-30;
        ASSERT_NEAR(c[i * ldc + j], want, bound)
            << bf16_kernel_name() << " m=" << m << " n=" << n << " k=" << k << " ta=" << ta
            << " tb=" << tb << " acc=" << acc << " at " << i << "," << j;
      }
    // Padding columns of C are never written.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = n; j < ldc; ++j) ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j]);
  }
}

TEST(GemmBf16, MatchesFp64OverRoundedOperandsForEveryTileEdge) {
  const int64_t ms[] = {1, 16, 17, 33, 64};
  const int64_t ns[] = {1, 15, 16, 33, 48};
  const int64_t ks[] = {1, 31, 32, 70};
  for (Bf16Kernel kernel : kernels()) {
    KernelScope scope(kernel);
    for (int64_t m : ms)
      for (int64_t n : ns)
        for (int64_t k : ks) ASSERT_NO_FATAL_FAILURE(expect_matches_fp64(m, n, k));
  }
}

// Shapes past the kernels' cache blocks (AMX: k in blocks of 1024, columns in passes of
// 512; AVX512-BF16: k in blocks of 256, rows in blocks of 512; fp32: k in blocks of 256,
// columns in blocks of 512): several k blocks with a
// partial last one (C carried from one block to the next, edge tiles included), several
// column passes and row blocks with a partial last one, rows not a multiple of 16 or 32.
TEST(GemmBf16, MatchesFp64AcrossCacheBlocks) {
  for (Bf16Kernel kernel : kernels()) {
    KernelScope scope(kernel);
    ASSERT_NO_FATAL_FAILURE(expect_matches_fp64(47, 530, 1100));
    ASSERT_NO_FATAL_FAILURE(expect_matches_fp64(33, 1040, 40));
    ASSERT_NO_FATAL_FAILURE(expect_matches_fp64(17, 20, 2090));
    ASSERT_NO_FATAL_FAILURE(expect_matches_fp64(1041, 50, 300));
  }
}

// A partial tile (m or n not a multiple of 16, or a block of one tile row or column) gives
// each element the bits the same element gets inside full tiles: the (m, n) product over the
// first m rows of A and n columns of B against the (round_up(m, 32) + 32, round_up(n, 32) +
// 32) one, both accumulate modes, transposed A, k past one cache block; and nothing is
// written past C's m rows or n columns (guard values after them stay). With exact == false
// (kFp32: oneDNN's fp32 GEMM picks its kernels, so its order of summation, by shape, as
// gemm() does at fp32) the two differ by no more than two fp32 sums of the same k exact
// products can: 2 (k + 1) u sum |terms|.
void expect_edges_match_full_tiles(int64_t m, int64_t n, int64_t k, bool exact) {
  const int64_t mb = (m + 31) / 32 * 32 + 32, nb = (n + 31) / 32 * 32 + 32;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, acc = t & 2;
    const int64_t lda = ta ? mb : k;  // A stored (mb, k) or, transposed, (k, mb)
    const auto a = normal(mb * k, 6), b = normal(k * nb, 7), c0 = normal(mb * nb, 8);
    std::vector<float> big = c0;
    gemm_bf16(ta, false, mb, nb, k, a.data(), lda, b.data(), nb, big.data(), nb, acc);
    // C (m, n) with ldc nb, inside a buffer of mb rows: guards after row m and column n.
    std::vector<float> small = c0;
    gemm_bf16(ta, false, m, n, k, a.data(), lda, b.data(), nb, small.data(), nb, acc);
    for (int64_t i = 0; i < mb; ++i)
      for (int64_t j = 0; j < nb; ++j) {
        const size_t at = static_cast<size_t>(i * nb + j);
        const bool inside = i < m && j < n;
        const float want = inside ? big[at] : c0[at];
        double bound = 0.0;
        if (inside && !exact) {
          double mag = acc ? std::fabs(c0[at]) : 0.0;
          for (int64_t p = 0; p < k; ++p)
            mag += std::fabs(static_cast<double>(ta ? a[p * lda + i] : a[i * lda + p]) *
                             b[p * nb + j]);
          bound = 2.0 * (k + 1) * 0x1p-24 * 1.01 * mag;  // 1.01: |bf16(x)| <= 1.004 |x|
        }
        ASSERT_NEAR(small[at], want, bound)
            << bf16_kernel_name() << " m=" << m << " n=" << n << " k=" << k << " ta=" << ta
            << " acc=" << acc << " at " << i << "," << j << (inside ? "" : " (guard)");
      }
  }
}

TEST(GemmBf16, EdgeTilesGiveTheBitsOfFullTiles) {
  for (Bf16Kernel kernel : kernels()) {
    KernelScope scope(kernel);
    const bool exact = kernel != Bf16Kernel::kFp32;
    for (int64_t m : {1, 5, 16, 17, 31, 33, 513})
      for (int64_t n : {1, 7, 16, 17, 47})
        ASSERT_NO_FATAL_FAILURE(expect_edges_match_full_tiles(m, n, m == 513 ? 40 : 70, exact));
    ASSERT_NO_FATAL_FAILURE(expect_edges_match_full_tiles(19, 530, 1100, exact));
  }
}

// A row of 1 + 2^-9 (not a bf16 value: it rounds to 1) against a column of ones: fp32 gives
// k (1 + 2^-9) exactly, bf16 gives exactly k.
TEST(GemmBf16, RoundsOperandsToBf16) {
  for (Bf16Kernel kernel : kernels()) {
    KernelScope scope(kernel);
    const int64_t k = 64;
    std::vector<float> a(k, 1.0f + 0x1p-9f), b(k, 1.0f), c(1, -1.0f), c32(1, -1.0f);
    gemm_bf16(false, false, 1, 1, k, a.data(), b.data(), c.data(), false);
    gemm(false, false, 1, 1, k, a.data(), b.data(), c32.data(), false);
    EXPECT_EQ(c[0], static_cast<float>(k)) << bf16_kernel_name();
    EXPECT_EQ(c32[0], static_cast<float>(k) * (1.0f + 0x1p-9f));
  }
}

// Random operands: bf16 differs from fp32 by about the operands' rounding (2^-9 relative
// each, so a few 2^-9 of sum |a b| in the worst case), and more than fp32's own error.
TEST(GemmBf16, DiffersFromFp32ByTheOperandRoundingOnly) {
  const int64_t m = 40, n = 48, k = 256;
  const auto a = normal(m * k, 4), b = normal(k * n, 5);
  std::vector<float> c(m * n), c32(m * n);
  gemm_bf16(false, false, m, n, k, a.data(), b.data(), c.data(), false);
  gemm(false, false, m, n, k, a.data(), b.data(), c32.data(), false);
  double max_rel = 0.0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double mag = 0.0;
      for (int64_t p = 0; p < k; ++p) mag += std::fabs(a[i * k + p] * b[p * n + j]);
      const double rel = std::fabs(c[i * n + j] - c32[i * n + j]) / mag;
      EXPECT_LE(rel, 2.0 * 0x1p-8) << "at " << i << "," << j;
      max_rel = std::max(max_rel, rel);
    }
  EXPECT_GT(max_rel, 64 * 0x1p-24) << "no bf16 rounding seen: are the operands fp32?";
}

// Packed operands live in Bf16Buffer so that every tile row is one cache line: its data is
// 64-byte aligned at every size, small ones (malloc's arena) and large ones (mmap'd chunks,
// where std::vector<uint16_t>'s data starts 16 bytes past a page), and after growing.
TEST(Bf16Buffer, DataIsCacheLineAligned) {
  for (size_t n : {size_t{1}, size_t{33}, size_t{4096}, size_t{1} << 20, size_t{3} << 20}) {
    Bf16Buffer buf(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.data()) % 64, 0u) << n << " values";
    buf.resize(2 * n + 1);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.data()) % 64, 0u) << 2 * n + 1 << " values";
  }
}

TEST(GemmBf16, EmptySumsAndNames) {
  std::vector<float> c(6, 5.0f);
  gemm_bf16(false, false, 2, 3, 0, nullptr, nullptr, c.data(), true);
  EXPECT_EQ(c[0], 5.0f);
  gemm_bf16(false, false, 2, 3, 0, nullptr, nullptr, c.data(), false);
  EXPECT_EQ(c[5], 0.0f);
  EXPECT_NE(std::string(cpu_bf16_capability()).find("amx_bf16"), std::string::npos);
  EXPECT_FALSE(onednn_bf16_matmul_impl().empty());
}

// Auto picks the fastest kernel the CPU has: AMX where its tiles are granted, else
// AVX512-BF16's vdpbf16ps where the CPU has it, else the fp32 GEMM over widened operands
// (never the portable loop, ~20x slower than fp32); forcing one the CPU lacks is refused.
// (Seen failing with auto falling to the portable loop on a CPU with avx512_bf16 and no AMX,
// the state before the AVX512-BF16 kernel.)
TEST(GemmBf16, AutoPicksTheFastestKernelTheCpuHas) {
  const std::string cap = cpu_bf16_capability();
  const bool amx = cap.find("(tiles granted)") != std::string::npos;
  const bool avx512 = cap.find("avx512_bf16 yes") != std::string::npos;
  set_bf16_kernel(Bf16Kernel::kAuto);
  const std::string name = bf16_kernel_name();
  const char* want = amx ? "AMX" : avx512 ? "vdpbf16ps" : "fp32 GEMM over widened bf16";
  EXPECT_NE(name.find(want), std::string::npos) << name << " on a CPU with " << cap;
  if (!amx) EXPECT_THROW(set_bf16_kernel(Bf16Kernel::kAmx), InvalidConfig) << cap;
  if (!avx512) EXPECT_THROW(set_bf16_kernel(Bf16Kernel::kAvx512), InvalidConfig) << cap;
  set_bf16_kernel(Bf16Kernel::kAuto);
}

}  // namespace
}  // namespace parm::cpu
