// cpu::sum_of_squares (the gradient norm's local sum; AVX-512 where the CPU has it): the same
// bits as its scalar loop over lengths that leave every tail, and within double rounding of
// the sum in long double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "parm/rng.h"

namespace parm::cpu {
namespace {

std::vector<float> normal(int64_t n, uint64_t stream) {
  Rng rng(11, stream);
  std::vector<float> v(static_cast<size_t>(n));
  // Magnitudes over six decades, as a model's gradients have.
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = rng.normal() * std::ldexp(1.0f, static_cast<int>(i % 20) - 16);
  return v;
}

TEST(SumOfSquares, VectorAndScalarGiveTheSameBits) {
  for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{31}, int64_t{32}, int64_t{33},
                          int64_t{95}, int64_t{1000}, int64_t{65537}}) {
    const auto x = normal(n, static_cast<uint64_t>(n) + 1);
    const double a = sum_of_squares(x.data(), n), b = sum_of_squares_reference(x.data(), n);
    EXPECT_EQ(0, std::memcmp(&a, &b, sizeof a)) << n << ": " << a << " vs " << b;
  }
}

TEST(SumOfSquares, MatchesLongDouble) {
  for (const int64_t n : {int64_t{1}, int64_t{45}, int64_t{100003}}) {
    const auto x = normal(n, 7);
    long double want = 0.0L;
    for (float v : x) want += static_cast<long double>(v) * v;
    const double got = sum_of_squares(x.data(), n);
    // n adds of positive terms: within n ulp of double, relative.
    EXPECT_NEAR(got, static_cast<double>(want),
                static_cast<double>(want) * 1e-16 * static_cast<double>(n) + 1e-300)
        << n;
  }
}

}  // namespace
}  // namespace parm::cpu
