// cpu::layernorm_forward / layernorm_backward (AVX-512 where the CPU has it) against the
// scalar loops, bit for bit, over widths that leave every tail, dx aliasing dy included; and
// the backward pass at a width past one vector against its formula in double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "normal_values.h"
#include "parm/error.h"

namespace parm::cpu {
namespace {

// N(shift, scale^2) values (normal_values.h).
std::vector<float> normal(int64_t n, uint64_t stream, float scale, float shift) {
  std::vector<float> v = test::normal_values(n, 7, stream);
  for (float& x : v) x = x * scale + shift;
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Widths that leave every tail of a 16-lane vector, over 5 rows.
constexpr int64_t kRows = 5;
constexpr int64_t kWidths[] = {1, 7, 16, 31, 37, 128, 130};

// A LayerNorm's inputs (rows, cols): x, dy (rows, cols), gamma, beta (cols), from streams
// stream .. stream + 3.
struct LnInputs {
  std::vector<float> x, dy, gamma, beta;
};
LnInputs ln_inputs(int64_t rows, int64_t cols, uint64_t stream) {
  return {normal(rows * cols, stream, 1.5f, 3.0f), normal(rows * cols, stream + 1, 1.0f, 0.0f),
          normal(cols, stream + 2, 0.5f, 1.0f), normal(cols, stream + 3, 0.1f, 0.0f)};
}

TEST(LayerNormVector, VectorAndScalarGiveTheSameBits) {
  const int64_t rows = kRows;
  for (const int64_t cols : kWidths) {
    const int64_t n = rows * cols;
    const auto [x, dy, gamma, beta] = ln_inputs(rows, cols, 1);
    std::vector<float> y1(n), m1(rows), r1(rows), y2(n), m2(rows), r2(rows);
    layernorm_forward(x.data(), gamma.data(), beta.data(), y1.data(), m1.data(), r1.data(), rows,
                      cols, 1e-5f);
    layernorm_forward_reference(x.data(), gamma.data(), beta.data(), y2.data(), m2.data(),
                                r2.data(), rows, cols, 1e-5f);
    EXPECT_TRUE(same_bits(y1, y2)) << cols;
    EXPECT_TRUE(same_bits(m1, m2)) << cols;
    EXPECT_TRUE(same_bits(r1, r2)) << cols;
    // dgamma, dbeta accumulate onto nonzero values; the second pair's dx overwrites dy.
    auto dg1 = normal(cols, 5, 1.0f, 0.0f), db1 = normal(cols, 6, 1.0f, 0.0f);
    auto dg2 = dg1, db2 = db1;
    std::vector<float> dx1(n);
    auto dx2 = dy;
    layernorm_backward(dy.data(), x.data(), gamma.data(), m1.data(), r1.data(), dx1.data(),
                       dg1.data(), db1.data(), rows, cols);
    layernorm_backward_reference(dx2.data(), x.data(), gamma.data(), m1.data(), r1.data(),
                                 dx2.data(), dg2.data(), db2.data(), rows, cols);
    EXPECT_TRUE(same_bits(dx1, dx2)) << cols;
    EXPECT_TRUE(same_bits(dg1, dg2)) << cols;
    EXPECT_TRUE(same_bits(db1, db2)) << cols;
  }
}

// layernorm_backward_add: dx += the input gradient, the bits of layernorm_backward into a
// scratch and then add (x + g in fp32), vector and scalar alike, every tail width.
TEST(LayerNormVector, BackwardAddIsBackwardThenAdd) {
  const int64_t rows = kRows;
  for (const int64_t cols : kWidths) {
    const int64_t n = rows * cols;
    const auto [x, dy, gamma, beta] = ln_inputs(rows, cols, 21);
    const auto res = normal(n, 25, 1.0f, 0.5f);  // the residual gradient dx starts from
    std::vector<float> y(n), mean(rows), rstd(rows);
    layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(),
                      rows, cols, 1e-5f);
    std::vector<float> g(n), want(n), dg1(cols, 0.0f), db1(cols, 0.0f);
    layernorm_backward(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), g.data(),
                       dg1.data(), db1.data(), rows, cols);
    add(res.data(), g.data(), want.data(), n);
    for (const bool vector : {true, false}) {
      std::vector<float> dx = res, dg(cols, 0.0f), db(cols, 0.0f);
      (vector ? layernorm_backward_add : layernorm_backward_add_reference)(
          dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(), dg.data(),
          db.data(), rows, cols);
      EXPECT_TRUE(same_bits(dx, want)) << cols << (vector ? " vector" : " scalar");
      EXPECT_TRUE(same_bits(dg, dg1)) << cols;
      EXPECT_TRUE(same_bits(db, db1)) << cols;
    }
  }
  std::vector<float> v(8, 1.0f), s(2, 1.0f), d(8, 0.0f);  // dx aliasing dy: refused
  EXPECT_THROW(layernorm_backward_add(v.data(), v.data(), s.data(), s.data(), s.data(), v.data(),
                                      d.data(), d.data(), 2, 4),
               Error);
}

TEST(LayerNormVector, BackwardMatchesItsFormulaInDouble) {
  const int64_t rows = 3, cols = 37;
  const int64_t n = rows * cols;
  const auto x = normal(n, 11, 2.0f, -1.0f), dy = normal(n, 12, 1.0f, 0.0f);
  const auto gamma = normal(cols, 13, 0.5f, 1.0f), beta = normal(cols, 14, 0.1f, 0.0f);
  std::vector<float> y(n), mean(rows), rstd(rows), dx(n), dgamma(cols, 0.0f), dbeta(cols, 0.0f);
  layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), rows,
                    cols, 1e-5f);
  layernorm_backward(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(),
                     dgamma.data(), dbeta.data(), rows, cols);
  std::vector<double> dgamma_ref(cols, 0.0), dbeta_ref(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0.0, var = 0.0;
    for (int64_t c = 0; c < cols; ++c) mu += x[r * cols + c];
    mu /= cols;
    for (int64_t c = 0; c < cols; ++c) var += (x[r * cols + c] - mu) * (x[r * cols + c] - mu);
    const double rs = 1.0 / std::sqrt(var / cols + 1e-5);
    double mg = 0.0, mgx = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double g = double(dy[r * cols + c]) * gamma[c];
      mg += g / cols;
      mgx += g * (x[r * cols + c] - mu) * rs / cols;
    }
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const double xhat = (x[i] - mu) * rs;
      EXPECT_NEAR(dx[i], rs * (double(dy[i]) * gamma[c] - mg - xhat * mgx), 1e-4 * rs) << i;
      dgamma_ref[c] += dy[i] * xhat;
      dbeta_ref[c] += dy[i];
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    EXPECT_NEAR(dgamma[c], dgamma_ref[c], 1e-4) << c;
    EXPECT_NEAR(dbeta[c], dbeta_ref[c], 1e-5) << c;
  }
}

}  // namespace
}  // namespace parm::cpu
