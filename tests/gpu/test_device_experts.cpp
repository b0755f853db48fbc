// The MoE experts on the GPU against the CPU oracle: cuBLAS GEMMs (kernels/cuda/gemm.h)
// against parm::cpu::gemm, the expert kernels against the CPU kernels, and DeviceExperts
// forward/backward against moe::experts_forward/backward. Skips without a GPU.
//
// Tolerances, as max |gpu - cpu| <= tol * max |cpu| over a whole tensor:
// - fp32 (no TF32: CUBLAS_COMPUTE_32F): 1e-5. Both sides compute the same fp32 products and
//   differ in summation order (and GeLU by a few ulp of exp): the error of a k-term sum is
//   about sqrt(k) u |terms| (u = 2^-24 = 6e-8), i.e. ~1e-6 here; 1e-5 leaves a 10x margin,
//   while a wrong row, transpose or missing term is off by O(1).
// - bf16 GEMM of bf16-rounded inputs against the CPU GEMM of the same rounded values: 1e-4.
//   bf16 x bf16 products are exact in fp32, so only the accumulation differs (the tensor
//   cores may add with a little less than fp32 rounding).
// - bf16 layer against the fp32 CPU layer: 2e-2. Each GEMM operand is rounded to bf16
//   (relative error <= 2^-9), so a product term is off by <= 2^-8 relative, with random sign:
//   a k-term sum of random-sign terms is off by ~2^-8 / sqrt(3) ~ 2.3e-3 of its rms, ~1e-2
//   of its rms at the extreme of a few thousand elements, ~3e-3 of the tensor's max |value|
//   (the max is ~3-4 rms). The deepest chain (din: dy and W2 -> dact -> dpre rounded -> W1)
//   stacks three such GEMM roundings, ~sqrt(3) x that: ~5e-3. A CPU emulation of this bf16
//   pipeline (operands rounded as here, fp32 GEMMs) on these cases and at M = Hl = 1024 gave
//   1.9e-3 to 5.3e-3 on every tensor. 2e-2 leaves about 4x margin, and a wrong row or
//   operand is still off by O(1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/expert_kernels.h"
#include "kernels/cuda/expert_math.h"
#include "kernels/cuda/gemm.h"
#include "moe/cuda/device_experts.h"
#include "moe/moe_ops.h"
#include "parm/device.h"
#include "parm/error.h"
#include "parm/rng.h"
#include "parm/tensor.h"

namespace parm::moe::cuda {
namespace {

using parm::cuda::GemmProblem;
using parm::cuda::GemmType;
using parm::cuda::GroupedGemm;

constexpr uint64_t kSeed = 20240611;
constexpr double kF32Tol = 1e-5;
constexpr double kBf16GemmTol = 1e-4;
constexpr double kBf16LayerTol = 2e-2;

#define PARM_SKIP_WITHOUT_GPU()                                                \
  do {                                                                         \
    if (parm::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU visible"; \
  } while (0)

Tensor host_normal(Shape shape, uint64_t stream, float stddev) {
  Tensor t(std::move(shape));
  fill_normal(t, kSeed, stream, 0.0f, stddev);
  return t;
}

Tensor gpu(const Tensor& host) { return host.to(Device::kCuda); }
Tensor host(const Tensor& t) { return t.to(Device::kCpu); }

// A device tensor whose every element is `value` (to see that a kernel writes them all).
Tensor gpu_filled(Shape shape, float value) {
  Tensor t(std::move(shape));
  t.fill(value);
  return gpu(t);
}

double max_abs(const float* x, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(x[i])));
  return m;
}

// max |got - want| <= tol * max |want| (and no NaN in got where want has none).
void expect_close(const float* got, const float* want, int64_t n, double tol,
                  const std::string& what) {
  double err = 0.0;
  int64_t worst = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= err)) {  // also catches NaN
      err = std::isnan(d) ? INFINITY : d;
      worst = i;
    }
  }
  const double scale = max_abs(want, n);
  EXPECT_LE(err, tol * scale) << what << ": max |gpu - cpu| = " << err << " at element " << worst
                              << " (gpu " << (worst >= 0 ? got[worst] : 0.0f) << ", cpu "
                              << (worst >= 0 ? want[worst] : 0.0f) << "), max |cpu| = " << scale
                              << ", tolerance " << tol << " x max |cpu|";
}

void expect_close(const Tensor& got_device, const Tensor& want, double tol,
                  const std::string& what) {
  const Tensor got = host(got_device);
  ASSERT_EQ(got.numel(), want.numel()) << what;
  expect_close(got.data(), want.data(), want.numel(), tol, what);
}

// bf16 values on the device.
struct DeviceBf16 {
  std::shared_ptr<void> mem;
  const uint16_t* data() const { return static_cast<const uint16_t*>(mem.get()); }
};

// Rounds a host tensor to bf16: the bf16 bits on the device, and their fp32 values on the host.
DeviceBf16 upload_bf16(const Tensor& t, Tensor* rounded) {
  std::vector<uint16_t> h(static_cast<size_t>(t.numel()));
  *rounded = Tensor(t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) {
    h[static_cast<size_t>(i)] = parm::cuda::expert_math::f32_to_bf16(t[i]);
    (*rounded)[i] = parm::cuda::expert_math::bf16_to_f32(h[static_cast<size_t>(i)]);
  }
  const size_t bytes = std::max<size_t>(1, h.size() * sizeof(uint16_t));
  DeviceBf16 d{std::shared_ptr<void>(device_alloc(bytes), device_free)};
  if (!h.empty()) device_copy(d.mem.get(), h.data(), h.size() * sizeof(uint16_t));
  return d;
}

std::vector<uint16_t> download_bf16(const uint16_t* device, int64_t n) {
  std::vector<uint16_t> h(static_cast<size_t>(n));
  if (n > 0) device_copy(h.data(), device, h.size() * sizeof(uint16_t));
  return h;
}

// ---- GEMM -------------------------------------------------------------------------------

struct GemmSize {
  int64_t m, n, k;
};
constexpr GemmSize kGemmSizes[] = {{37, 29, 53}, {1, 64, 7}, {64, 1, 130}, {16, 24, 8},
                                   {5, 3, 0},    {0, 4, 3},  {4, 0, 3}};

TEST(CudaGemm, MatchesCpuGemmForAllTransposes) {
  PARM_SKIP_WITHOUT_GPU();
  uint64_t stream = 100;
  int cases = 0;
  for (const GemmSize& s : kGemmSizes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int acc = 0; acc < 2; ++acc)
          for (GemmType type : {GemmType::kF32, GemmType::kBf16}) {
            SCOPED_TRACE(testing::Message()
                         << "m=" << s.m << " n=" << s.n << " k=" << s.k << " trans_a=" << ta
                         << " trans_b=" << tb << " accumulate=" << acc
                         << (type == GemmType::kBf16 ? " bf16" : " fp32"));
            const Tensor a = host_normal({std::max<int64_t>(1, s.m * s.k)}, stream++, 1.0f);
            const Tensor b = host_normal({std::max<int64_t>(1, s.k * s.n)}, stream++, 1.0f);
            const Tensor c0 = host_normal({std::max<int64_t>(1, s.m * s.n)}, stream++, 1.0f);
            Tensor want = c0.clone();
            Tensor c = gpu(c0);
            if (type == GemmType::kF32) {
              const Tensor da = gpu(a), db = gpu(b);
              parm::cuda::gemm(ta != 0, tb != 0, s.m, s.n, s.k, da.data(), db.data(), c.data(),
                               acc != 0, type);
              cpu::gemm(ta != 0, tb != 0, s.m, s.n, s.k, a.data(), b.data(), want.data(), acc != 0);
            } else {
              Tensor ar, br;
              const DeviceBf16 da = upload_bf16(a, &ar), db = upload_bf16(b, &br);
              parm::cuda::gemm(ta != 0, tb != 0, s.m, s.n, s.k, da.data(), db.data(), c.data(),
                               acc != 0, type);
              cpu::gemm(ta != 0, tb != 0, s.m, s.n, s.k, ar.data(), br.data(), want.data(),
                        acc != 0);
            }
            expect_close(c, want, type == GemmType::kF32 ? kF32Tol : kBf16GemmTol, "C");
            ++cases;
          }
  EXPECT_EQ(cases, 7 * 16);
}

// Grouped products of different sizes (one empty, one with k = 0), in the grouped call and
// in the loop, against one cpu::gemm per product.
TEST(CudaGemm, GroupedMatchesCpuInBothModes) {
  PARM_SKIP_WITHOUT_GPU();
  const int64_t sizes[] = {17, 0, 33, 5, 1};
  const int64_t num = 5, N = 24, K = 40;
  uint64_t stream = 300;
  for (GemmType type : {GemmType::kF32, GemmType::kBf16})
    for (GroupedGemm::Mode mode : {GroupedGemm::Mode::kAuto, GroupedGemm::Mode::kLoop})
      for (int shape = 0; shape < 2; ++shape) {
        // shape 0: C (r, N) = A (r, K) B (K, N), overwrite (like kPre; r = 0: nothing).
        // shape 1: C (K, N) += A^T B with A (r, K), B (r, N) (like kDW1; r = 0: k = 0).
        const bool dw = shape == 1;
        SCOPED_TRACE(testing::Message() << (type == GemmType::kBf16 ? "bf16" : "fp32")
                                        << (mode == GroupedGemm::Mode::kLoop ? " loop" : " auto")
                                        << (dw ? " dW-like" : " forward-like"));
        GroupedGemm gg(num);
        gg.set_mode(mode);
        std::vector<Tensor> a_host, b_host, want;
        std::vector<Tensor> a_dev, b_dev, c_dev;
        std::vector<DeviceBf16> a_bf, b_bf;
        std::vector<GemmProblem> problems;
        for (int64_t i = 0; i < num; ++i) {
          const int64_t r = sizes[i];
          Tensor a = host_normal({std::max<int64_t>(1, r * K)}, stream++, 1.0f);
          Tensor b = host_normal({std::max<int64_t>(1, dw ? r * N : K * N)}, stream++, 1.0f);
          const Tensor c0 = host_normal({dw ? K * N : std::max<int64_t>(1, r * N)}, stream++, 1.0f);
          if (type == GemmType::kBf16) {
            Tensor ar, br;
            a_bf.push_back(upload_bf16(a, &ar));
            b_bf.push_back(upload_bf16(b, &br));
            a = ar;
            b = br;
          } else {
            a_dev.push_back(gpu(a));
            b_dev.push_back(gpu(b));
          }
          Tensor w = c0.clone();
          GemmProblem p;
          if (dw) {
            cpu::gemm(true, false, K, N, r, a.data(), b.data(), w.data(), true);
            p.m = K, p.n = N, p.k = r;
          } else {
            cpu::gemm(false, false, r, N, K, a.data(), b.data(), w.data(), false);
            p.m = r, p.n = N, p.k = K;
          }
          want.push_back(w);
          c_dev.push_back(gpu(c0));
          p.a = type == GemmType::kBf16 ? static_cast<const void*>(a_bf.back().data())
                                        : a_dev.back().data();
          p.b = type == GemmType::kBf16 ? static_cast<const void*>(b_bf.back().data())
                                        : b_dev.back().data();
          p.c = c_dev.back().data();
          problems.push_back(p);
        }
        gg.run(dw, false, dw, type, problems.data(), num);
        for (int64_t i = 0; i < num; ++i)
          expect_close(c_dev[static_cast<size_t>(i)], want[static_cast<size_t>(i)],
                       type == GemmType::kF32 ? kF32Tol : kBf16GemmTol,
                       "product " + std::to_string(i));
        if (type == GemmType::kF32 && mode == GroupedGemm::Mode::kAuto) {
          EXPECT_TRUE(gg.grouped_supported())
              << "cuBLAS refused cublasGemmGroupedBatchedEx for fp32 (the loop ran instead)";
        }
      }
}

// ---- expert kernels ---------------------------------------------------------------------

TEST(CudaExpertKernels, MatchCpuKernels) {
  PARM_SKIP_WITHOUT_GPU();
  // 700 rows: three chunks of the column sums; 45 columns: a partial column tile.
  const int64_t rows = 700, cols = 45;
  const Tensor pre = host_normal({rows, cols}, 1, 2.0f), bias = host_normal({cols}, 2, 0.5f),
               dact = host_normal({rows, cols}, 3, 1.0f), db0 = host_normal({cols}, 4, 1.0f);
  const Tensor d_pre = gpu(pre), d_bias = gpu(bias);

  // bias_gelu (+ its bf16 copy, which must be the rounding of the fp32 result).
  Tensor act_want({rows, cols});
  cpu::bias_gelu(pre.data(), bias.data(), act_want.data(), rows, cols);
  Tensor d_act = gpu_filled({rows, cols}, 7.0f);
  DeviceBf16 act_bf{std::shared_ptr<void>(device_alloc(rows * cols * 2), device_free)};
  parm::cuda::bias_gelu(d_pre.data(), d_bias.data(), d_act.data(),
                        static_cast<uint16_t*>(act_bf.mem.get()), rows, cols);
  expect_close(d_act, act_want, kF32Tol, "bias_gelu");
  {
    const Tensor act = host(d_act);
    const std::vector<uint16_t> bf = download_bf16(act_bf.data(), rows * cols);
    for (int64_t i = 0; i < rows * cols; ++i)
      ASSERT_EQ(bf[static_cast<size_t>(i)], parm::cuda::expert_math::f32_to_bf16(act[i])) << i;
  }

  // bias_gelu_backward in place (dpre over dact, as the layer calls it), db accumulated.
  Tensor dpre_want({rows, cols});
  Tensor db_want = db0.clone();
  cpu::bias_gelu_backward(pre.data(), bias.data(), dact.data(), dpre_want.data(), db_want.data(),
                          rows, cols);
  Tensor d_dpre = gpu(dact);
  Tensor d_db = gpu(db0);
  Tensor scratch({parm::cuda::column_sum_scratch_floats(rows, cols)}, Device::kCuda);
  DeviceBf16 dpre_bf{std::shared_ptr<void>(device_alloc(rows * cols * 2), device_free)};
  parm::cuda::bias_gelu_backward(d_pre.data(), d_bias.data(), d_dpre.data(), d_dpre.data(),
                                 static_cast<uint16_t*>(dpre_bf.mem.get()), d_db.data(),
                                 scratch.data(), rows, cols);
  expect_close(d_dpre, dpre_want, kF32Tol, "bias_gelu_backward dpre");
  expect_close(d_db, db_want, kF32Tol, "bias_gelu_backward dbias");
  {
    const Tensor dp = host(d_dpre);
    const std::vector<uint16_t> bf = download_bf16(dpre_bf.data(), rows * cols);
    for (int64_t i = 0; i < rows * cols; ++i)
      ASSERT_EQ(bf[static_cast<size_t>(i)], parm::cuda::expert_math::f32_to_bf16(dp[i])) << i;
  }

  // bias_backward: accumulates, and the same bits on a second run (fixed order).
  Tensor db2_want = db0.clone();
  cpu::bias_backward(dact.data(), db2_want.data(), rows, cols);
  const Tensor d_dact = gpu(dact);
  Tensor d_db2 = gpu(db0), d_db2_again = gpu(db0);
  parm::cuda::bias_backward(d_dact.data(), d_db2.data(), scratch.data(), rows, cols);
  parm::cuda::bias_backward(d_dact.data(), d_db2_again.data(), scratch.data(), rows, cols);
  expect_close(d_db2, db2_want, kF32Tol, "bias_backward");
  {
    const Tensor x = host(d_db2), y = host(d_db2_again);
    for (int64_t i = 0; i < cols; ++i) ASSERT_EQ(x[i], y[i]) << "column sums not deterministic";
  }

  // add_bias.
  Tensor y_want = dact.clone();
  cpu::add_bias(y_want.data(), bias.data(), rows, cols);
  Tensor d_y = gpu(dact);
  parm::cuda::add_bias(d_y.data(), d_bias.data(), rows, cols);
  expect_close(d_y, y_want, 0.0, "add_bias");  // one fp32 add: exact
}

TEST(CudaExpertKernels, Bf16ConversionIsTheHostRounding) {
  PARM_SKIP_WITHOUT_GPU();
  Tensor x = host_normal({1000}, 9, 3.0f);
  // 1.00390625 = 1 + 2^-8 is a tie that rounds down (even), 1.01171875 one that rounds up.
  const float special[] = {0.0f,          -0.0f,  INFINITY,    -INFINITY,  NAN,
                           3.4028235e38f, 1e-40f, 1.00390625f, 1.01171875f};
  for (int i = 0; i < 9; ++i) x[i] = special[i];
  const Tensor d = gpu(x);
  DeviceBf16 y{std::shared_ptr<void>(device_alloc(2000), device_free)};
  parm::cuda::to_bf16(d.data(), static_cast<uint16_t*>(y.mem.get()), 1000);
  const std::vector<uint16_t> h = download_bf16(y.data(), 1000);
  for (int64_t i = 0; i < 1000; ++i)
    ASSERT_EQ(h[static_cast<size_t>(i)], parm::cuda::expert_math::f32_to_bf16(x[i]))
        << "element " << i << " = " << x[i];
}

// ---- DeviceExperts ----------------------------------------------------------------------

struct LayerCase {
  int64_t blocks, e_loc, slots, M, hl;
  std::vector<int32_t> fills;  // (blocks, E_loc)
  bool add_b2;
};

std::string describe(const LayerCase& c) {
  std::string f;
  for (int32_t x : c.fills) f += std::to_string(x) + " ";
  return "blocks=" + std::to_string(c.blocks) + " E_loc=" + std::to_string(c.e_loc) +
         " slots=" + std::to_string(c.slots) + " M=" + std::to_string(c.M) +
         " Hl=" + std::to_string(c.hl) + " fills=[ " + f + "] add_b2=" + (c.add_b2 ? "1" : "0");
}

std::vector<LayerCase> layer_cases() {
  return {
      {1, 1, 6, 16, 12, {4}, true},
      {1, 1, 6, 16, 12, {6}, false},
      {2, 3, 5, 24, 20, {5, 0, 2, 3, 0, 5}, false},   // expert 1 gets no rows at all
      {2, 2, 7, 13, 9, {0, 7, 3, 1}, true},           // odd M: the scalar copy path
      {1, 3, 4, 32, 8, {0, 0, 0}, true},              // nothing to compute
      {2, 2, 300, 64, 96, {300, 123, 0, 299}, true},  // > 256 rows: several column chunks
  };
}

// Runs the case through the CPU experts and a DeviceExperts (fresh or reused) and compares
// out, din, dW1, db1, dW2, db2 and the phase names.
void check_layer(DeviceExperts& dev, const LayerCase& c, double tol, uint64_t seed_stream) {
  SCOPED_TRACE(describe(c) + (dev.precision() == Precision::kBf16 ? " bf16" : " fp32"));
  const int64_t E = c.e_loc, M = c.M, hl = c.hl;
  ASSERT_EQ(static_cast<int64_t>(c.fills.size()), c.blocks * E);
  uint64_t s = seed_stream;
  ExpertShards w;
  w.w1 = host_normal({E, M, hl}, s++, 1.0f / std::sqrt(static_cast<float>(M)));
  w.b1 = host_normal({E, hl}, s++, 0.1f);
  w.w2 = host_normal({E, hl, M}, s++, 1.0f / std::sqrt(static_cast<float>(hl)));
  w.b2 = host_normal({E, M}, s++, 0.1f);
  ExpertShards dw0;  // non-zero starting gradients: the pass must accumulate into them
  dw0.w1 = host_normal({E, M, hl}, s++, 0.01f);
  dw0.b1 = host_normal({E, hl}, s++, 0.01f);
  dw0.w2 = host_normal({E, hl, M}, s++, 0.01f);
  dw0.b2 = host_normal({E, M}, s++, 0.01f);
  const Shape layout = {c.blocks, E, c.slots, M};
  Tensor in = host_normal(layout, s++, 1.0f);
  const Tensor dout = host_normal(layout, s++, 1.0f);
  // Empty slots hold large values: they must be neither read nor passed on.
  for (int64_t b = 0; b < c.blocks; ++b)
    for (int64_t e = 0; e < E; ++e)
      for (int64_t slot = c.fills[static_cast<size_t>(b * E + e)]; slot < c.slots; ++slot)
        for (int64_t j = 0; j < M; ++j) in[((b * E + e) * c.slots + slot) * M + j] = 1e4f;

  // CPU oracle.
  ExpertWorkspace ws;
  ws.reserve(E, c.blocks * c.slots, M, hl);
  Tensor out_want(layout), din_want(layout);
  ExpertShards dw_want{dw0.w1.clone(), dw0.b1.clone(), dw0.w2.clone(), dw0.b2.clone()};
  PhaseTimes cpu_fwd, cpu_bwd;
  experts_forward(in, w, c.blocks, c.slots, c.fills.data(), c.add_b2, ws, out_want, &cpu_fwd);
  experts_backward(dout, w, c.blocks, c.slots, c.fills.data(), ws, dw_want, din_want, &cpu_bwd);

  // GPU.
  ExpertShards dw_gpu{gpu(dw0.w1), gpu(dw0.b1), gpu(dw0.w2), gpu(dw0.b2)};
  const ExpertShards w_gpu{gpu(w.w1), gpu(w.b1), gpu(w.w2), gpu(w.b2)};
  const Tensor in_gpu = gpu(in), dout_gpu = gpu(dout);
  Tensor out_gpu = gpu_filled(layout, 7.0f), din_gpu = gpu_filled(layout, 7.0f);
  PhaseTimes gpu_fwd, gpu_bwd;
  dev.forward(in_gpu, w_gpu, c.blocks, c.slots, c.fills.data(), c.add_b2, out_gpu, &gpu_fwd);
  dev.backward(dout_gpu, w_gpu, c.blocks, c.slots, c.fills.data(), dw_gpu, din_gpu, &gpu_bwd);
  device_sync();

  for (int64_t e = 0; e < E; ++e)
    EXPECT_EQ(dev.rows()[static_cast<size_t>(e)], ws.rows[static_cast<size_t>(e)]) << "e=" << e;
  expect_close(out_gpu, out_want, tol, "out");
  expect_close(din_gpu, din_want, tol, "din");
  expect_close(dw_gpu.w1, dw_want.w1, tol, "dW1");
  expect_close(dw_gpu.b1, dw_want.b1, tol, "db1");
  expect_close(dw_gpu.w2, dw_want.w2, tol, "dW2");
  expect_close(dw_gpu.b2, dw_want.b2, tol, "db2");
  // Empty slots must be exactly zero (not merely small).
  const Tensor out_h = host(out_gpu), din_h = host(din_gpu);
  for (int64_t b = 0; b < c.blocks; ++b)
    for (int64_t e = 0; e < E; ++e)
      for (int64_t slot = c.fills[static_cast<size_t>(b * E + e)]; slot < c.slots; ++slot)
        for (int64_t j = 0; j < M; ++j) {
          const int64_t i = ((b * E + e) * c.slots + slot) * M + j;
          ASSERT_EQ(out_h[i], 0.0f) << "out at empty slot " << slot << " b=" << b << " e=" << e;
          ASSERT_EQ(din_h[i], 0.0f) << "din at empty slot " << slot << " b=" << b << " e=" << e;
        }
  // The same phases, in the same order, as the CPU path.
  auto names = [](const PhaseTimes& t) {
    std::vector<std::string> v;
    for (int i = 0; i < t.num; ++i) v.emplace_back(t.names[i]);
    return v;
  };
  EXPECT_EQ(names(gpu_fwd), names(cpu_fwd));
  EXPECT_EQ(names(gpu_bwd), names(cpu_bwd));
}

void check_all_cases(Precision p, GroupedGemm::Mode mode, double tol) {
  uint64_t stream = 1000;
  for (const LayerCase& c : layer_cases()) {
    DeviceExperts dev(c.e_loc, c.blocks * c.slots, c.M, c.hl, p);
    dev.grouped_gemm().set_mode(mode);
    EXPECT_GT(dev.held_bytes(), 0);
    check_layer(dev, c, tol, stream);
    stream += 100;
  }
}

TEST(CudaDeviceExperts, Fp32MatchesCpuExperts) {
  PARM_SKIP_WITHOUT_GPU();
  check_all_cases(Precision::kFp32, GroupedGemm::Mode::kAuto, kF32Tol);
}

TEST(CudaDeviceExperts, Fp32LoopOfGemmsMatchesCpuExperts) {
  PARM_SKIP_WITHOUT_GPU();
  check_all_cases(Precision::kFp32, GroupedGemm::Mode::kLoop, kF32Tol);
}

TEST(CudaDeviceExperts, Bf16MatchesCpuExpertsWithinBf16Rounding) {
  PARM_SKIP_WITHOUT_GPU();
  check_all_cases(Precision::kBf16, GroupedGemm::Mode::kAuto, kBf16LayerTol);
}

// One DeviceExperts through several steps with different fills (a larger workspace than
// needed), as the layer uses it: nothing may leak from one step into the next.
TEST(CudaDeviceExperts, ReusedAcrossStepsWithDifferentFills) {
  PARM_SKIP_WITHOUT_GPU();
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    DeviceExperts dev(3, 2 * 8, 24, 20, p);
    const double tol = p == Precision::kFp32 ? kF32Tol : kBf16LayerTol;
    check_layer(dev, {2, 3, 5, 24, 20, {5, 0, 2, 3, 0, 5}, true}, tol, 5000);
    check_layer(dev, {2, 3, 5, 24, 20, {1, 5, 0, 0, 4, 5}, false}, tol, 5100);
    check_layer(dev, {1, 3, 8, 24, 20, {8, 3, 0}, true}, tol, 5200);
  }
}

TEST(CudaDeviceExperts, RefusesBadCalls) {
  PARM_SKIP_WITHOUT_GPU();
  DeviceExperts dev(2, 10, 8, 4, Precision::kFp32);
  const ExpertShards w{Tensor({2, 8, 4}, Device::kCuda), Tensor({2, 4}, Device::kCuda),
                       Tensor({2, 4, 8}, Device::kCuda), Tensor({2, 8}, Device::kCuda)};
  Tensor in({2, 2, 5, 8}, Device::kCuda), out({2, 2, 5, 8}, Device::kCuda);
  const std::vector<int32_t> too_full = {6, 0, 0, 0};
  EXPECT_THROW(dev.forward(in, w, 2, 5, too_full.data(), true, out), parm::Error);
  const std::vector<int32_t> ok = {5, 0, 1, 2};
  Tensor big({3, 2, 5, 8}, Device::kCuda);  // 3 x 5 rows > the 10 reserved
  EXPECT_THROW(dev.forward(big, w, 3, 5, std::vector<int32_t>(6, 0).data(), true, big),
               parm::Error);
  Tensor host_in({2, 2, 5, 8});
  EXPECT_THROW(dev.forward(host_in, w, 2, 5, ok.data(), true, out), parm::Error);
  EXPECT_NO_THROW(dev.forward(in, w, 2, 5, ok.data(), true, out));
  const std::vector<int32_t> other = {4, 0, 1, 2};  // backward with other fills
  ExpertShards dw{Tensor({2, 8, 4}, Device::kCuda), Tensor({2, 4}, Device::kCuda),
                  Tensor({2, 4, 8}, Device::kCuda), Tensor({2, 8}, Device::kCuda)};
  EXPECT_THROW(dev.backward(in, w, 2, 5, other.data(), dw, out), parm::Error);
}

TEST(CudaDeviceExperts, ProductFloorIsTimed) {
  PARM_SKIP_WITHOUT_GPU();
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    const double us = time_expert_products_us({37, 0, 64}, 64, 96, 3, p);
    EXPECT_GT(us, 0.0) << precision_name(p);
    EXPECT_LT(us, 1e6) << precision_name(p);  // a second for six small GEMMs: broken
  }
}

}  // namespace
}  // namespace parm::moe::cuda
