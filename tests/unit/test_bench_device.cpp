// The CPU BenchDevice that calibrate measures on (perfmodel/bench_device.h): its products,
// row copies and bias + GeLU are the layer's CPU kernels' (same results), its buffers are
// zero-filled, and a device this build cannot run is refused before any work.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "parm/error.h"
#include "perfmodel/bench_device.h"
#include "perfmodel/calibrate.h"

namespace parm::perfmodel {
namespace {

std::vector<float> pattern(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 37) % 101) - 1.0f;
  return v;
}

TEST(BenchDevice, CpuRunsTheLayersKernels) {
  auto dev = make_bench_device(Device::kCpu);
  ASSERT_EQ(dev->device(), Device::kCpu);
  const int64_t m = 5, n = 7, k = 3;
  const auto a = pattern(m * k, 0.03f), b = pattern(k * n, 0.02f);
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    BenchBuffer da(*dev, a.size() * 4), db(*dev, b.size() * 4), dc(*dev, m * n * 4);
    dev->upload(da.get(), a.data(), a.size(), p);
    dev->upload(db.get(), b.data(), b.size(), p);
    dev->gemm(false, false, m, n, k, da.get(), db.get(), dc.f(), false, p);
    dev->sync();
    std::vector<float> want(m * n);
    if (p == Precision::kBf16)
      cpu::gemm_bf16(false, false, m, n, k, a.data(), b.data(), want.data(), false);
    else
      cpu::gemm(false, false, m, n, k, a.data(), b.data(), want.data(), false);
    for (int64_t i = 0; i < m * n; ++i) EXPECT_EQ(dc.f()[i], want[i]) << precision_name(p) << i;
  }
  // Row copies: every row once, in a scattered order.
  const int64_t rows = 8, cols = 3;
  const auto src = pattern(rows * cols, 0.01f);
  BenchBuffer s(*dev, src.size() * 4), d(*dev, src.size() * 4);
  for (int64_t i = 0; i < rows * cols; ++i) EXPECT_EQ(d.f()[i], 0.0f);  // zero-filled
  dev->upload(s.get(), src.data(), src.size(), Precision::kFp32);
  dev->copy_rows(s.f(), d.f(), rows, cols);
  std::vector<int64_t> seen;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t q = 0; q < rows; ++q)
      if (std::equal(d.f() + r * cols, d.f() + (r + 1) * cols, src.data() + q * cols))
        seen.push_back(q);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_FALSE(std::equal(d.f(), d.f() + rows * cols, src.data()));  // not in order
  // bias + GeLU as the layer's CPU kernel.
  const std::vector<float> bias = {0.1f, -0.2f, 0.3f};
  std::vector<float> want(src.size());
  cpu::bias_gelu(src.data(), bias.data(), want.data(), rows, cols);
  BenchBuffer bb(*dev, 3 * 4);
  dev->upload(bb.get(), bias.data(), 3, Precision::kFp32);
  dev->bias_gelu(s.f(), bb.f(), d.f(), rows, cols);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(d.f()[i], want[i]) << i;
}

TEST(BenchDevice, CudaIsRefusedWhereThisBuildOrMachineHasNone) {
  if (cuda_built() && cuda_device_count() > 0) GTEST_SKIP() << "a GPU is here";
  for (auto attempt : {+[] { make_bench_device(Device::kCuda); },
                       +[] {
                         CalibrateOptions o;
                         o.device = Device::kCuda;
                         check_calibrate_options(o);
                       }}) {
    try {
      attempt();
      ADD_FAILURE() << "not refused";
    } catch (const InvalidConfig& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("--device cuda"), std::string::npos) << msg;
      EXPECT_NE(msg.find("use --device cpu"), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace parm::perfmodel
