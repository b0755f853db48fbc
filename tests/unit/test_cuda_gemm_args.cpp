// The row-major -> cuBLAS column-major GEMM mapping (kernels/cuda/gemm_args.h), on the CPU:
// a naive column-major GEMM that reads exactly the arguments cuBLAS would get (and refuses
// the leading dimensions cuBLAS refuses) must reproduce a naive row-major GEMM. Inputs are
// multiples of 1/4 in [-1, 1], so every sum is exact and the results must be equal.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/gemm_args.h"
#include "parm/rng.h"

namespace parm::cuda {
namespace {

std::vector<float> quarter_ints(int64_t n, uint64_t stream) {
  Rng rng(20240611, stream);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(static_cast<int>(rng.next_u32() % 9) - 4) * 0.25f;
  return v;
}

// cuBLAS's gemm as its documentation defines it: C (m, n) = alpha op(A) op(B) + beta C,
// column-major, element (i, j) of a matrix X with leading dimension ld at X[i + j * ld];
// beta == 0 does not read C. .at() fails the test on any read or write out of bounds.
void cublas_gemm_reference(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                           const std::vector<float>& A, int64_t lda, const std::vector<float>& B,
                           int64_t ldb, float beta, std::vector<float>& C, int64_t ldc) {
  ASSERT_GE(m, 0);
  ASSERT_GE(n, 0);
  ASSERT_GE(k, 0);
  ASSERT_GE(lda, std::max<int64_t>(1, trans_a ? k : m)) << "cuBLAS would refuse lda";
  ASSERT_GE(ldb, std::max<int64_t>(1, trans_b ? n : k)) << "cuBLAS would refuse ldb";
  ASSERT_GE(ldc, std::max<int64_t>(1, m)) << "cuBLAS would refuse ldc";
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      double s = 0.0;
      for (int64_t l = 0; l < k; ++l) {
        const float a = trans_a ? A.at(static_cast<size_t>(l + i * lda))
                                : A.at(static_cast<size_t>(i + l * lda));
        const float b = trans_b ? B.at(static_cast<size_t>(j + l * ldb))
                                : B.at(static_cast<size_t>(l + j * ldb));
        s += static_cast<double>(a) * b;
      }
      float& c = C.at(static_cast<size_t>(i + j * ldc));
      c = static_cast<float>(alpha * s + (beta == 0.0f ? 0.0 : static_cast<double>(beta) * c));
    }
}

// The row-major semantics of parm::cpu::gemm, contiguous operands.
void row_major_reference(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                         const std::vector<float>& A, const std::vector<float>& B,
                         std::vector<float>& C, bool accumulate) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t l = 0; l < k; ++l) {
        const float a =
            trans_a ? A[static_cast<size_t>(l * m + i)] : A[static_cast<size_t>(i * k + l)];
        const float b =
            trans_b ? B[static_cast<size_t>(j * k + l)] : B[static_cast<size_t>(l * n + j)];
        s += static_cast<double>(a) * b;
      }
      float& c = C[static_cast<size_t>(i * n + j)];
      c = static_cast<float>(s + (accumulate ? c : 0.0));
    }
}

struct Size {
  int64_t m, n, k;
};

TEST(CudaGemmArgs, ColumnMajorCallReproducesRowMajorGemm) {
  const Size sizes[] = {{1, 1, 1},   {3, 5, 7}, {7, 3, 5}, {5, 7, 3}, {13, 1, 9}, {1, 11, 6},
                        {17, 19, 2}, {4, 4, 0}, {0, 3, 2}, {3, 0, 2}, {0, 0, 0},  {6, 2, 31}};
  int cases = 0;
  uint64_t stream = 1;
  for (const Size& s : sizes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int acc = 0; acc < 2; ++acc) {
          SCOPED_TRACE(testing::Message()
                       << "m=" << s.m << " n=" << s.n << " k=" << s.k << " trans_a=" << ta
                       << " trans_b=" << tb << " accumulate=" << acc);
          const std::vector<float> A = quarter_ints(s.m * s.k, stream++);
          const std::vector<float> B = quarter_ints(s.k * s.n, stream++);
          const std::vector<float> C0 = quarter_ints(s.m * s.n, stream++);
          std::vector<float> want = C0;
          row_major_reference(ta != 0, tb != 0, s.m, s.n, s.k, A, B, want, acc != 0);

          const ColumnMajorGemm g = column_major_gemm(ta != 0, tb != 0, s.m, s.n, s.k);
          // cuBLAS's first operand is the request's B, its second the request's A.
          std::vector<float> got = C0;
          cublas_gemm_reference(g.trans_first, g.trans_second, g.m, g.n, g.k, 1.0f, B, g.ld_first,
                                A, g.ld_second, acc ? 1.0f : 0.0f, got, g.ldc);
          ASSERT_EQ(got, want);
          ++cases;
        }
  EXPECT_EQ(cases, 12 * 8);
}

TEST(CudaGemmArgs, MapsFlagsAndDimensions) {
  // dW1 (M, Hl) += x^T (M, R) dpre (R, Hl): the request is (trans_a, !trans_b).
  const ColumnMajorGemm g = column_major_gemm(true, false, 8, 5, 3);
  EXPECT_FALSE(g.trans_first);  // B (R, Hl) as is
  EXPECT_TRUE(g.trans_second);  // A = x (R, M), transposed
  EXPECT_EQ(g.m, 5);
  EXPECT_EQ(g.n, 8);
  EXPECT_EQ(g.k, 3);
  EXPECT_EQ(g.ld_first, 5);   // B's stored row length
  EXPECT_EQ(g.ld_second, 8);  // A's stored row length (A stored (k, m))
  EXPECT_EQ(g.ldc, 5);
  // Empty matrices still get leading dimensions of at least 1.
  const ColumnMajorGemm e = column_major_gemm(false, false, 0, 0, 0);
  EXPECT_EQ(e.ld_first, 1);
  EXPECT_EQ(e.ld_second, 1);
  EXPECT_EQ(e.ldc, 1);
}

}  // namespace
}  // namespace parm::cuda
