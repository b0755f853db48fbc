// model/dense_ops.h on the CPU: the table is today's kernels (the same bits as calling them
// directly), the host-side token check names the position, and a build without CUDA refuses
// the cuda table.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "model/dense_ops.h"
#include "normal_values.h"
#include "parm/error.h"
#include "parm/rng.h"

namespace parm::model {
namespace {

std::vector<float> random_values(int64_t n, uint64_t stream) {
  return test::normal_values(n, 7, stream);
}

TEST(DenseOps, TheCpuTableIsTheCpuKernels) {
  const DenseOps& ops = dense_ops(Device::kCpu);
  EXPECT_EQ(ops.device, Device::kCpu);
  const int64_t rows = 5, cols = 19;
  const auto x = random_values(rows * cols, 1), g = random_values(cols, 2),
             b = random_values(cols, 3);
  std::vector<float> y1(x.size()), y2(x.size()), m1(rows), m2(rows), r1(rows), r2(rows);
  ops.layernorm_forward(x.data(), g.data(), b.data(), y1.data(), m1.data(), r1.data(), rows, cols,
                        1e-5f);
  cpu::layernorm_forward(x.data(), g.data(), b.data(), y2.data(), m2.data(), r2.data(), rows,
                         cols, 1e-5f);
  EXPECT_EQ(y1, y2);
  // add: out = a + b in fp32, out aliasing a.
  std::vector<float> a = x, sum(x.size());
  for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + y2[i];
  ops.add(a.data(), y2.data(), a.data(), rows * cols);
  EXPECT_EQ(a, sum);
  // sum_of_squares: acc plus each buffer's cpu::sum_of_squares, buffers in order.
  const float* bufs[2] = {x.data(), g.data()};
  const int64_t sizes[2] = {rows * cols, cols};
  double want = 0.5;
  want += cpu::sum_of_squares_reference(x.data(), rows * cols);
  want += cpu::sum_of_squares_reference(g.data(), cols);
  EXPECT_EQ(ops.sum_of_squares(bufs, sizes, 2, 0.5), want);
}

TEST(DenseOps, AdamWFollowsItsFormula) {
  AdamWStep s;
  s.lr = 0.01;
  s.weight_decay = 0.1;
  s.step = 3;
  s.grad_scale = 0.5;
  std::vector<float> w = {1.0f, -2.0f}, g = {0.4f, -0.2f}, m = {0.1f, 0.0f}, v = {0.01f, 0.0f};
  for (bool decay : {true, false}) {
    s.decay = decay;
    std::vector<float> w1 = w, m1 = m, v1 = v;
    dense_ops(Device::kCpu).adamw(s, w1.data(), g.data(), m1.data(), v1.data(), 2);
    for (size_t j = 0; j < 2; ++j) {
      const double gj = 0.5 * g[j];
      const double mj = 0.9 * m[j] + 0.1 * gj, vj = 0.95 * v[j] + 0.05 * gj * gj;
      const double bc1 = 1 - 0.9 * 0.9 * 0.9, bc2 = 1 - 0.95 * 0.95 * 0.95;
      const double wj = w[j] * (decay ? 1 - 0.01 * 0.1 : 1.0) -
                        0.01 / bc1 * mj / (std::sqrt(vj / bc2) + 1e-8);
      EXPECT_NEAR(m1[j], mj, 1e-7);
      EXPECT_NEAR(v1[j], vj, 1e-8);
      EXPECT_NEAR(w1[j], wj, 1e-6) << "decay " << decay << " element " << j;
    }
  }
}

TEST(DenseOps, TheTokenCheckNamesThePosition) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 256, 5};
  EXPECT_NO_THROW(check_token_range(tokens.data(), 2, 2, 256));  // the first 4 only
  try {
    check_token_range(tokens.data(), 2, 3, 256);
    FAIL() << "token 256 of a 256-token vocabulary passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "token 256 at (sequence 1, position 1) is outside the vocabulary [0, 256)"),
              std::string::npos)
        << e.what();
  }
}

#ifndef PARM_HAVE_CUDA
TEST(DenseOps, ABuildWithoutCudaRefusesTheCudaTable) {
  try {
    dense_ops(Device::kCuda);
    FAIL() << "a cuda table in a build without CUDA";
  } catch (const InvalidConfig& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA backend"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("valid here: cpu"), std::string::npos) << e.what();
  }
}
#endif

TEST(DenseOps, DeviceArrayHoldsWhatWasUploaded) {
  DeviceArray<int64_t> a(dense_ops(Device::kCpu), 4);
  const std::vector<int64_t> v = {7, -1, 3};
  EXPECT_EQ(a.upload(v.data(), 3)[2], 3);
  EXPECT_EQ(a.data()[0], 7);
  EXPECT_THROW(a.upload(v.data(), 5), Error);
}

}  // namespace
}  // namespace parm::model
