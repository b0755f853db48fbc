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

// The grouped call (gemm_args.h: plan_grouped_gemm): a host emulation of
// cublasGemmGroupedBatchedEx that reads exactly the arrays the plan gives cuBLAS (group g's
// sizes and flags, its products' pointers at offset[g] ...) must reproduce every product's
// row-major result; equal-shaped products share a group, groups keep first-appearance order,
// products keep request order inside a group, and empty products are left out untouched.
struct Expert {
  int64_t m, n, k;  // the row-major request's sizes
};

void check_grouped(bool trans_a, bool trans_b, bool accumulate, const std::vector<Expert>& experts,
                   int64_t want_groups) {
  const size_t num = experts.size();
  std::vector<std::vector<float>> A(num), B(num), C(num), want(num);
  std::vector<GemmProblem> problems(num);
  uint64_t stream = 100;
  for (size_t i = 0; i < num; ++i) {
    const Expert& x = experts[i];
    A[i] = quarter_ints(x.m * x.k, stream++);
    B[i] = quarter_ints(x.k * x.n, stream++);
    C[i] = quarter_ints(x.m * x.n, stream++);
    want[i] = C[i];
    if (x.k > 0) row_major_reference(trans_a, trans_b, x.m, x.n, x.k, A[i], B[i], want[i], accumulate);
    problems[i] = GemmProblem{x.m, x.n, x.k, &A[i], &B[i], &C[i]};  // host "pointers"
  }
  GroupedGemmArgs args;
  args.reserve(num);
  plan_grouped_gemm(trans_a, trans_b, problems.data(), static_cast<int64_t>(num), args);
  ASSERT_EQ(args.num_groups(), want_groups);
  ASSERT_EQ(args.group_size.size(), args.groups.size());
  ASSERT_EQ(args.offset.size(), args.groups.size());
  int64_t at = 0;
  for (int64_t g = 0; g < args.num_groups(); ++g) {
    const size_t first = static_cast<size_t>(args.offset[static_cast<size_t>(g)]);
    EXPECT_EQ(static_cast<int64_t>(first), at) << "group " << g;
    at += args.group_size[static_cast<size_t>(g)];
    // Inside a group, the request's order; between groups, first appearance.
    for (size_t j = first + 1; j < static_cast<size_t>(at); ++j)
      EXPECT_LT(args.order[j - 1], args.order[j]) << "group " << g;
    if (g > 0)
      EXPECT_LT(args.order[static_cast<size_t>(args.offset[static_cast<size_t>(g - 1)])],
                args.order[first]);
  }
  int64_t kept = 0;
  for (const Expert& x : experts) kept += x.m > 0 && x.n > 0 && x.k > 0;
  ASSERT_EQ(at, kept);
  ASSERT_EQ(args.num_products(), kept);

  // cuBLAS's grouped call, as its documentation defines it, on these arrays.
  for (int64_t g = 0; g < args.num_groups(); ++g) {
    const ColumnMajorGemm& c = args.groups[static_cast<size_t>(g)];
    for (int64_t j = 0; j < args.group_size[static_cast<size_t>(g)]; ++j) {
      const size_t idx = static_cast<size_t>(args.offset[static_cast<size_t>(g)] + j);
      const auto& first = *static_cast<const std::vector<float>*>(args.first[idx]);
      const auto& second = *static_cast<const std::vector<float>*>(args.second[idx]);
      auto& out = *static_cast<std::vector<float>*>(args.c[idx]);
      EXPECT_EQ(&out, &C[static_cast<size_t>(args.order[idx])]);
      cublas_gemm_reference(c.trans_first, c.trans_second, c.m, c.n, c.k, 1.0f, first, c.ld_first,
                            second, c.ld_second, accumulate ? 1.0f : 0.0f, out, c.ldc);
    }
  }
  for (size_t i = 0; i < num; ++i) {
    const Expert& x = experts[i];
    if (x.k == 0) continue;  // the caller's (gemm.cpp zeroes C or leaves it)
    EXPECT_EQ(C[i], want[i]) << "product " << i << " (" << x.m << ", " << x.n << ", " << x.k << ")";
  }
}

TEST(CudaGemmArgs, GroupedCallReproducesEveryProduct) {
  // The six expert products' flags over experts with rows R_e (M = 12, Hl = 20): the row
  // products (R_e, ., .) differ in m by expert, the weight gradients in k. Row counts: ties
  // (3 experts of 5 rows), an empty expert, a one-row expert, rows not a multiple of 8 or 16.
  const int64_t M = 12, H = 20;
  const std::vector<int64_t> rows = {5, 0, 1, 5, 17, 5, 33};
  const int64_t distinct = 4;  // 5, 1, 17, 33
  for (int product = 0; product < 6; ++product) {
    std::vector<Expert> experts;
    bool ta = false, tb = false, acc = false;
    for (int64_t r : rows) {
      switch (product) {
        case 0: experts.push_back({r, H, M}); break;                              // pre
        case 1: experts.push_back({r, M, H}); break;                              // out
        case 2: experts.push_back({H, M, r}), ta = true, acc = true; break;       // dW2
        case 3: experts.push_back({r, H, M}), tb = true; break;                   // dact
        case 4: experts.push_back({M, H, r}), ta = true, acc = true; break;       // dW1
        default: experts.push_back({r, M, H}), tb = true; break;                  // dx
      }
    }
    SCOPED_TRACE(testing::Message() << "product " << product);
    check_grouped(ta, tb, acc, experts, distinct);
  }
}

TEST(CudaGemmArgs, GroupedCallOfEqualExpertsIsOneGroup) {
  check_grouped(false, false, false, {{4, 6, 3}, {4, 6, 3}, {4, 6, 3}}, 1);
  check_grouped(true, true, true, {{7, 2, 9}, {7, 2, 9}}, 1);
  // All empty: nothing for cuBLAS.
  check_grouped(false, true, false, {{0, 6, 3}, {4, 0, 3}, {4, 6, 0}}, 0);
  // One product alone, and sizes that share m and n but not k.
  check_grouped(false, false, true, {{3, 3, 3}}, 1);
  check_grouped(false, false, false, {{3, 3, 1}, {3, 3, 2}, {3, 3, 1}}, 2);
}

TEST(CudaGemmArgs, GroupedPlanIsOverwrittenByTheNextCall) {
  std::vector<float> a(64), b(64), c(64);
  GemmProblem big[] = {{2, 2, 2, a.data(), b.data(), c.data()},
                       {3, 2, 2, a.data(), b.data(), c.data()}};
  GemmProblem small[] = {{2, 2, 2, a.data(), b.data(), c.data()}};
  GroupedGemmArgs args;
  args.reserve(2);
  plan_grouped_gemm(false, false, big, 2, args);
  EXPECT_EQ(args.num_groups(), 2);
  plan_grouped_gemm(false, false, small, 1, args);
  EXPECT_EQ(args.num_groups(), 1);
  EXPECT_EQ(args.num_products(), 1);
  EXPECT_EQ(args.group_size[0], 1);
  EXPECT_EQ(args.offset[0], 0);
}

}  // namespace
}  // namespace parm::cuda
