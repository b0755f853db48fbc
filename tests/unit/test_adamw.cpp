// cpu::adamw (AVX-512 where the CPU has it) against the scalar loop, bit for bit, over lengths
// that leave every tail; and the scalar loop against the update written out in double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "parm/rng.h"

namespace parm::cpu {
namespace {

std::vector<float> normal(int64_t n, uint64_t stream, float scale, float shift) {
  Rng rng(5, stream);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = rng.normal() * scale + shift;
  return v;
}

AdamWScalars scalars() {
  AdamWScalars s;
  s.beta1 = 0.9f, s.beta2 = 0.95f, s.grad_scale = 0.37f, s.step_size = 3e-3f / 0.19f;
  s.inv_sqrt_bc2 = 1.0f / std::sqrt(0.0975f), s.eps = 1e-8f, s.decay = 1.0f - 3e-4f;
  return s;
}

TEST(AdamW, VectorAndScalarGiveTheSameBits) {
  const AdamWScalars s = scalars();
  for (const int64_t n : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{33}, int64_t{1000}}) {
    auto w1 = normal(n, 1, 0.1f, 0.0f), g = normal(n, 2, 1.0f, 0.0f);
    auto m1 = normal(n, 3, 0.01f, 0.0f), v1 = normal(n, 4, 0.001f, 0.002f);
    for (float& x : v1) x = std::fabs(x);
    auto w2 = w1, m2 = m1, v2 = v1;
    for (int step = 0; step < 3; ++step) {
      adamw(s, w1.data(), g.data(), m1.data(), v1.data(), n);
      adamw_reference(s, w2.data(), g.data(), m2.data(), v2.data(), n);
    }
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    EXPECT_EQ(0, std::memcmp(w1.data(), w2.data(), bytes)) << n;
    EXPECT_EQ(0, std::memcmp(m1.data(), m2.data(), bytes)) << n;
    EXPECT_EQ(0, std::memcmp(v1.data(), v2.data(), bytes)) << n;
  }
}

TEST(AdamW, MatchesTheUpdateInDouble) {
  const AdamWScalars s = scalars();
  const int64_t n = 100;
  auto w = normal(n, 5, 0.1f, 0.0f), g = normal(n, 6, 1.0f, 0.0f);
  std::vector<float> m(static_cast<size_t>(n), 0.01f), v(static_cast<size_t>(n), 0.003f);
  const auto w0 = w;
  adamw(s, w.data(), g.data(), m.data(), v.data(), n);
  for (int64_t j = 0; j < n; ++j) {
    const double gj = static_cast<double>(g[j]) * s.grad_scale;
    const double mj = s.beta1 * 0.01 + (1.0 - s.beta1) * gj;
    const double vj = s.beta2 * 0.003 + (1.0 - s.beta2) * gj * gj;
    const double wj = w0[j] * static_cast<double>(s.decay) -
                      s.step_size * mj / (std::sqrt(vj) * s.inv_sqrt_bc2 + s.eps);
    EXPECT_NEAR(m[j], mj, 1e-6 * std::fabs(mj) + 1e-9);
    EXPECT_NEAR(v[j], vj, 1e-6 * vj);
    EXPECT_NEAR(w[j], wj, 1e-5 * std::fabs(wj) + 1e-7);
  }
}

}  // namespace
}  // namespace parm::cpu
