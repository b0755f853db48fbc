// cpu::attention_softmax_forward / backward (AVX-512 where the CPU has it) against their
// _reference form (per row: scale, softmax_forward / softmax_backward, zero the masked keys):
// within a few ulp of the row's terms, masked entries exactly 0, for lengths around the
// 16-lane blocks, causal or not.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "parm/error.h"
#include "normal_values.h"

namespace parm::cpu {
namespace {

// N(0, scale^2) values (normal_values.h).
std::vector<float> normal(int64_t n, uint64_t stream, float scale) {
  std::vector<float> v = test::normal_values(n, 11, stream);
  for (float& x : v) x *= scale;
  return v;
}

// 8 ulp of `size` (the row's largest term).
::testing::AssertionResult close(float got, float want, double size) {
  const double tol = 8.0 * 0x1p-24 * std::fmax(size, std::fabs(double(want))) + 1e-44;
  if (std::fabs(double(got) - want) <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << got << " vs " << want << " (tolerance " << tol << ")";
}

TEST(AttentionSoftmax, VectorMatchesTheRowKernels) {
  const float scale = 0.17677669f;  // 1 / sqrt(32)
  for (const int64_t L : {1, 2, 15, 16, 17, 33, 37, 64}) {
    for (const bool causal : {true, false}) {
      const auto scores = normal(L * L, 1 + L, 6.0f);
      auto p = scores, p_ref = scores;
      // Poison the masked entries: they must come back 0.
      for (int64_t i = 0; causal && i < L; ++i)
        for (int64_t j = i + 1; j < L; ++j) p[i * L + j] = p_ref[i * L + j] = NAN;
      attention_softmax_forward(p.data(), L, scale, causal);
      attention_softmax_forward_reference(p_ref.data(), L, scale, causal);
      for (int64_t i = 0; i < L; ++i) {
        const int64_t n = causal ? i + 1 : L;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) mx = std::fmax(mx, scores[i * L + j] * scale);
        for (int64_t j = 0; j < L; ++j) {
          const int64_t e = i * L + j;
          if (j >= n) {
            ASSERT_EQ(p[e], 0.0f) << "L " << L << " masked (" << i << ", " << j << ")";
            continue;
          }
          // Both exponentials are within a few ulp of exp; the argument's own rounding
          // (|scale x - max| ulp) moves each by that many ulp of the result.
          const double arg = std::fabs(double(scores[e]) * scale - mx);
          ASSERT_TRUE(close(p[e], p_ref[e], std::fabs(p_ref[e]) * (1.0 + arg)))
              << "L " << L << " causal " << causal << " (" << i << ", " << j << ")";
        }
      }
      const auto dp = normal(L * L, 100 + L, 1.0f);
      auto ds = dp, ds_ref = dp;
      attention_softmax_backward(p_ref.data(), ds.data(), L, scale, causal);
      attention_softmax_backward_reference(p_ref.data(), ds_ref.data(), L, scale, causal);
      for (int64_t i = 0; i < L; ++i) {
        double dot = 0.0;
        for (int64_t j = 0; j < L; ++j) dot += std::fabs(p_ref[i * L + j] * dp[i * L + j]);
        for (int64_t j = 0; j < L; ++j) {
          const int64_t e = i * L + j;
          if (causal && j > i) {
            ASSERT_EQ(ds[e], 0.0f) << "L " << L << " masked (" << i << ", " << j << ")";
          } else {
            const double size = scale * p_ref[e] * (std::fabs(dp[e]) + dot);
            ASSERT_TRUE(close(ds[e], ds_ref[e], size)) << "L " << L << " causal " << causal << " (" << i << ", " << j << ")";
          }
        }
      }
    }
  }
}

// Rows taken in groups (the production path) give the bits of one row at a time, the form
// before them, in both passes: the training runs' losses do not move.
TEST(AttentionSoftmax, RowGroupsGiveTheOneRowBits) {
  const float scale = 0.17677669f;
  for (const int64_t L : {1, 2, 3, 4, 5, 7, 15, 16, 17, 33, 37, 63, 64, 65}) {
    for (const bool causal : {true, false}) {
      auto p = normal(L * L, 300 + L, 6.0f);
      for (int64_t i = 0; causal && i < L; ++i)
        for (int64_t j = i + 1; j < L; ++j) p[i * L + j] = NAN;
      auto p_one = p;
      attention_softmax_forward(p.data(), L, scale, causal);
      attention_softmax_forward_one_row_at_a_time(p_one.data(), L, scale, causal);
      ASSERT_EQ(0, std::memcmp(p.data(), p_one.data(), p.size() * sizeof(float)))
          << "forward, L " << L << " causal " << causal;
      auto ds = normal(L * L, 400 + L, 1.0f), ds_one = ds;
      attention_softmax_backward(p.data(), ds.data(), L, scale, causal);
      attention_softmax_backward_one_row_at_a_time(p.data(), ds_one.data(), L, scale, causal);
      ASSERT_EQ(0, std::memcmp(ds.data(), ds_one.data(), ds.size() * sizeof(float)))
          << "backward, L " << L << " causal " << causal;
    }
  }
}

TEST(AttentionSoftmax, RefusesAnEmptyBlock) {
  float x = 0.0f;
  EXPECT_THROW(attention_softmax_forward(&x, 0, 1.0f, true), Error);
  EXPECT_THROW(attention_softmax_backward(&x, &x, 0, 1.0f, true), Error);
}

}  // namespace
}  // namespace parm::cpu
