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
//   1.9e-3 to 5.3e-3 on every tensor. The layer also keeps pre, out, dact and dx as bf16
//   (each rounded once from its fp32 sum: <= 2^-9 of the element, so <= 2e-3 of the tensor's
//   max added on the tensors they reach). 2e-2 still leaves about 2x margin, and a wrong row
//   or operand is still off by O(1).
// - bf16 C of a bf16 GEMM: 4e-3 (one rounding of the fp32 sum, 2^-9 relative, over the GEMM's
//   own 1e-4).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu_compare.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/expert_kernels.h"
#include "kernels/cuda/expert_math.h"
#include "kernels/cuda/gemm.h"
#include "shape/packed_rows.h"
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


using gpu_test::expect_close;
using gpu_test::gpu;
using gpu_test::host;
using gpu_test::max_abs;

// A device tensor whose every element is `value` (to see that a kernel writes them all).
Tensor gpu_filled(Shape shape, float value) {
  Tensor t(std::move(shape));
  t.fill(value);
  return gpu(t);
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

const char* type_name(GemmType t) {
  return t == GemmType::kF32 ? "fp32" : t == GemmType::kBf16 ? "bf16 -> fp32" : "bf16 -> bf16";
}

// bf16 C rounded once from the fp32 sum: within half a bf16 ulp (2^-9 relative) of the CPU
// product of the same rounded operands, plus the accumulation's own error.
constexpr double kBf16OutTol = 4e-3;

// A (m, k) x B (k, n) (+ C) at kBf16ToBf16 against cpu::gemm on the rounded operands (and the
// rounded C when accumulating), each element within kBf16OutTol of max |want|.
void check_bf16_output_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, bool acc,
                            uint64_t stream) {
  const Tensor a = host_normal({std::max<int64_t>(1, m * k)}, stream, 1.0f);
  const Tensor b = host_normal({std::max<int64_t>(1, k * n)}, stream + 1, 1.0f);
  const Tensor c0 = host_normal({std::max<int64_t>(1, m * n)}, stream + 2, 1.0f);
  Tensor ar, br, cr;
  const DeviceBf16 da = upload_bf16(a, &ar), db = upload_bf16(b, &br), dc = upload_bf16(c0, &cr);
  Tensor want = cr.clone();
  cpu::gemm(ta, tb, m, n, k, ar.data(), br.data(), want.data(), acc);
  parm::cuda::gemm(ta, tb, m, n, k, da.data(), db.data(), const_cast<uint16_t*>(dc.data()), acc,
                   GemmType::kBf16ToBf16);
  const std::vector<uint16_t> got_bits = download_bf16(dc.data(), std::max<int64_t>(1, m * n));
  Tensor got({std::max<int64_t>(1, m * n)});
  for (int64_t i = 0; i < got.numel(); ++i)
    got[i] = parm::cuda::expert_math::bf16_to_f32(got_bits[static_cast<size_t>(i)]);
  if (m * n > 0) expect_close(got.data(), want.data(), m * n, kBf16OutTol, "bf16 C");
}

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
          for (GemmType type : {GemmType::kF32, GemmType::kBf16, GemmType::kBf16ToBf16}) {
            SCOPED_TRACE(testing::Message()
                         << "m=" << s.m << " n=" << s.n << " k=" << s.k << " trans_a=" << ta
                         << " trans_b=" << tb << " accumulate=" << acc << " " << type_name(type));
            if (type == GemmType::kBf16ToBf16) {
              check_bf16_output_gemm(ta != 0, tb != 0, s.m, s.n, s.k, acc != 0, stream);
              stream += 3;
              ++cases;
              continue;
            }
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
  EXPECT_EQ(cases, 7 * 24);
}

// Grouped products of different sizes (one empty, one with k = 0, one of one row, ties that
// share a group, sizes not a multiple of 8 or 16), in the grouped call and in the loop,
// against one cpu::gemm per product: fp32, bf16 -> fp32 (both shapes) and bf16 -> bf16 (the
// row products only: the layer's weight gradients are fp32).
TEST(CudaGemm, GroupedMatchesCpuInBothModes) {
  PARM_SKIP_WITHOUT_GPU();
  const int64_t sizes[] = {17, 0, 33, 5, 1, 17, 17};
  const int64_t num = 7, N = 24, K = 40;
  uint64_t stream = 300;
  for (GemmType type : {GemmType::kF32, GemmType::kBf16, GemmType::kBf16ToBf16})
    for (GroupedGemm::Mode mode : {GroupedGemm::Mode::kAuto, GroupedGemm::Mode::kLoop})
      for (int shape = 0; shape < 2; ++shape) {
        // shape 0: C (r, N) = A (r, K) B (K, N), overwrite (like kPre; r = 0: nothing).
        // shape 1: C (K, N) += A^T B with A (r, K), B (r, N) (like kDW1; r = 0: k = 0).
        const bool dw = shape == 1;
        const bool bf16_in = type != GemmType::kF32, bf16_out = type == GemmType::kBf16ToBf16;
        if (dw && bf16_out) continue;
        SCOPED_TRACE(testing::Message() << type_name(type)
                                        << (mode == GroupedGemm::Mode::kLoop ? " loop" : " auto")
                                        << (dw ? " dW-like" : " forward-like"));
        GroupedGemm gg(num);
        gg.set_mode(mode);
        std::vector<Tensor> want, a_dev, b_dev, c_dev;
        std::vector<DeviceBf16> a_bf, b_bf, c_bf;
        std::vector<GemmProblem> problems;
        for (int64_t i = 0; i < num; ++i) {
          const int64_t r = sizes[i];
          Tensor a = host_normal({std::max<int64_t>(1, r * K)}, stream++, 1.0f);
          Tensor b = host_normal({std::max<int64_t>(1, dw ? r * N : K * N)}, stream++, 1.0f);
          Tensor c0 = host_normal({dw ? K * N : std::max<int64_t>(1, r * N)}, stream++, 1.0f);
          if (bf16_in) {
            Tensor ar, br;
            a_bf.push_back(upload_bf16(a, &ar));
            b_bf.push_back(upload_bf16(b, &br));
            a = ar;
            b = br;
          } else {
            a_dev.push_back(gpu(a));
            b_dev.push_back(gpu(b));
          }
          GemmProblem p;
          if (bf16_out) {
            Tensor cr;
            c_bf.push_back(upload_bf16(c0, &cr));
            c0 = cr;
            p.c = const_cast<uint16_t*>(c_bf.back().data());
          } else {
            c_dev.push_back(gpu(c0));
            p.c = c_dev.back().data();
          }
          Tensor w = c0.clone();
          if (dw) {
            cpu::gemm(true, false, K, N, r, a.data(), b.data(), w.data(), true);
            p.m = K, p.n = N, p.k = r;
          } else {
            cpu::gemm(false, false, r, N, K, a.data(), b.data(), w.data(), false);
            p.m = r, p.n = N, p.k = K;
          }
          want.push_back(w);
          p.a = bf16_in ? static_cast<const void*>(a_bf.back().data()) : a_dev.back().data();
          p.b = bf16_in ? static_cast<const void*>(b_bf.back().data()) : b_dev.back().data();
          problems.push_back(p);
        }
        gg.run(dw, false, dw, type, problems.data(), num);
        for (int64_t i = 0; i < num; ++i) {
          const std::string what = "product " + std::to_string(i);
          const Tensor& w = want[static_cast<size_t>(i)];
          if (bf16_out) {
            const std::vector<uint16_t> bits = download_bf16(c_bf[static_cast<size_t>(i)].data(), w.numel());
            Tensor got(w.shape());
            for (int64_t j = 0; j < w.numel(); ++j)
              got[j] = parm::cuda::expert_math::bf16_to_f32(bits[static_cast<size_t>(j)]);
            if (sizes[i] > 0) expect_close(got.data(), w.data(), w.numel(), kBf16OutTol, what);
          } else {
            expect_close(c_dev[static_cast<size_t>(i)], w,
                         type == GemmType::kF32 ? kF32Tol : kBf16GemmTol, what);
          }
        }
        if (mode == GroupedGemm::Mode::kAuto) {
          // The documented types must run grouped; bf16 -> fp32 is reported either way.
          if (type != GemmType::kBf16)
            EXPECT_TRUE(gg.grouped_supported(type))
                << "cuBLAS refused cublasGemmGroupedBatchedEx (the loop ran instead)";
          else
            std::printf("[ info ] grouped bf16 -> fp32 C (the weight gradients): %s\n",
                        gg.grouped_supported(type) ? "one grouped call" : "refused, loop");
          if (gg.grouped_supported(type))
            EXPECT_EQ(gg.last_groups(), 4) << "17 x3, 33, 5, 1 (and 0 left out)";
        }
      }
}

// ---- expert kernels ---------------------------------------------------------------------

// The kernels over all experts at once against the CPU kernels expert by expert: row counts
// with an empty expert, a one-row expert, ties, counts not a multiple of 8 or 16 and one over
// two column-sum chunks; 45 columns (a partial column tile); blocks with room to spare, whose
// rows past the expert's count must stay untouched. fp32 and bf16 inputs; the bf16 outputs
// must be the rounding of the fp32 values the kernel computed.
TEST(CudaExpertKernels, MatchCpuKernelsOverAllExperts) {
  PARM_SKIP_WITHOUT_GPU();
  const std::vector<int64_t> rows = {700, 0, 1, 13, 13, 256, 37};
  const int64_t E = static_cast<int64_t>(rows.size()), cols = 45;
  const int64_t stride = 700 * cols + 90;  // not tight: blocks end in untouched rows
  parm::cuda::ExpertRows r;
  r.rows = rows.data();
  r.experts = E;
  r.stride = stride;
  r.cols = cols;
  const Tensor pre = host_normal({E * stride}, 1, 2.0f), bias = host_normal({E, cols}, 2, 0.5f),
               dact = host_normal({E * stride}, 3, 1.0f), db0 = host_normal({E, cols}, 4, 1.0f);
  constexpr float kUntouched = 7.0f;
  Tensor scratch({parm::cuda::column_sum_scratch_floats(r)}, Device::kCuda);
  const Tensor d_bias = gpu(bias);
  for (bool bf16_in : {false, true}) {
    SCOPED_TRACE(bf16_in ? "bf16 pre and dact" : "fp32 pre and dact");
    // The inputs as the kernel reads them (rounded to bf16 when bf16_in).
    Tensor pre_in = pre.clone(), dact_in = dact.clone();
    DeviceBf16 pre_bf, dact_bf;
    if (bf16_in) {
      pre_bf = upload_bf16(pre, &pre_in);
      dact_bf = upload_bf16(dact, &dact_in);
    }
    const Tensor d_pre = gpu(pre);
    const parm::cuda::Values pre_v = bf16_in ? parm::cuda::bf16_values(pre_bf.data())
                                             : parm::cuda::f32_values(d_pre.data());

    // bias_gelu, and its bf16 copy.
    Tensor d_act = gpu_filled({E * stride}, kUntouched);
    DeviceBf16 act_bf{std::shared_ptr<void>(device_alloc(E * stride * 2), device_free)};
    parm::cuda::bias_gelu(pre_v, d_bias.data(), d_act.data(),
                          static_cast<uint16_t*>(act_bf.mem.get()), r);
    const Tensor act = host(d_act);
    const std::vector<uint16_t> act_b = download_bf16(act_bf.data(), E * stride);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = rows[static_cast<size_t>(e)] * cols, at = e * stride;
      Tensor want({std::max<int64_t>(1, n)});
      cpu::bias_gelu(pre_in.data() + at, bias.data() + e * cols, want.data(),
                     rows[static_cast<size_t>(e)], cols);
      expect_close(act.data() + at, want.data(), n, kF32Tol, "bias_gelu e=" + std::to_string(e));
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(act_b[static_cast<size_t>(at + i)], parm::cuda::expert_math::f32_to_bf16(act[at + i]));
      for (int64_t i = n; i < stride; ++i)
        ASSERT_EQ(act[at + i], kUntouched) << "bias_gelu wrote past expert " << e << "'s rows";
    }

    // bias_gelu_backward in place (dpre over an fp32 dact, as the fp32 layer calls it; the
    // bf16 layer writes only the bf16 dpre), db accumulated.
    Tensor d_dpre = bf16_in ? gpu_filled({E * stride}, kUntouched) : gpu(dact);
    if (!bf16_in)  // rows past the counts get the sentinel, to see they stay
      for (int64_t e = 0; e < E; ++e) {
        Tensor fill({stride - rows[static_cast<size_t>(e)] * cols});
        fill.fill(kUntouched);
        device_copy(d_dpre.data() + e * stride + rows[static_cast<size_t>(e)] * cols, fill.data(),
                    static_cast<size_t>(fill.bytes()));
      }
    const parm::cuda::Values dact_v = bf16_in ? parm::cuda::bf16_values(dact_bf.data())
                                              : parm::cuda::f32_values(d_dpre.data());
    Tensor d_db = gpu(db0);
    DeviceBf16 dpre_bf{std::shared_ptr<void>(device_alloc(E * stride * 2), device_free)};
    parm::cuda::bias_gelu_backward(pre_v, d_bias.data(), dact_v, bf16_in ? nullptr : d_dpre.data(),
                                   static_cast<uint16_t*>(dpre_bf.mem.get()), d_db.data(),
                                   scratch.data(), r);
    const Tensor dpre = host(d_dpre), db = host(d_db);
    const std::vector<uint16_t> dpre_b = download_bf16(dpre_bf.data(), E * stride);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t re = rows[static_cast<size_t>(e)], n = re * cols, at = e * stride;
      Tensor want({std::max<int64_t>(1, n)});
      Tensor db_want({cols});
      for (int64_t c = 0; c < cols; ++c) db_want[c] = db0[e * cols + c];
      cpu::bias_gelu_backward(pre_in.data() + at, bias.data() + e * cols, dact_in.data() + at,
                              want.data(), db_want.data(), re, cols);
      const std::string what = " e=" + std::to_string(e);
      expect_close(db.data() + e * cols, db_want.data(), cols, kF32Tol, "dbias" + what);
      for (int64_t i = 0; i < n; ++i) {
        // The bf16 dpre is the rounding of the fp32 dpre (compared with the CPU's to fp32
        // tolerance first, through the bf16 values, within one bf16 rounding).
        const float got = parm::cuda::expert_math::bf16_to_f32(dpre_b[static_cast<size_t>(at + i)]);
        ASSERT_LE(std::fabs(got - want[i]), 4e-3 * std::fabs(want[i]) + 1e-6) << what << " i=" << i;
        if (!bf16_in)
          ASSERT_EQ(dpre_b[static_cast<size_t>(at + i)],
                    parm::cuda::expert_math::f32_to_bf16(dpre[at + i]));
      }
      if (!bf16_in) {
        expect_close(dpre.data() + at, want.data(), n, kF32Tol, "dpre" + what);
        for (int64_t i = n; i < stride; ++i)
          ASSERT_EQ(dpre[at + i], kUntouched) << "dpre written past expert " << e << "'s rows";
      }
    }
  }

  // bias_backward: accumulates, the same bits on a second run (fixed order), and the same bits
  // as one expert at a time (the layer's numbers do not depend on how experts are batched).
  const Tensor d_dact = gpu(dact);
  Tensor d_db2 = gpu(db0), d_db2_again = gpu(db0), d_db2_single = gpu(db0);
  parm::cuda::bias_backward(d_dact.data(), d_db2.data(), scratch.data(), r);
  parm::cuda::bias_backward(d_dact.data(), d_db2_again.data(), scratch.data(), r);
  for (int64_t e = 0; e < E; ++e)
    parm::cuda::bias_backward(d_dact.data() + e * stride, d_db2_single.data() + e * cols,
                              scratch.data(), parm::cuda::one_expert(&rows[static_cast<size_t>(e)], cols));
  const Tensor db2 = host(d_db2), again = host(d_db2_again), single = host(d_db2_single);
  for (int64_t e = 0; e < E; ++e) {
    Tensor want({cols});
    for (int64_t c = 0; c < cols; ++c) want[c] = db0[e * cols + c];
    cpu::bias_backward(dact.data() + e * stride, want.data(), rows[static_cast<size_t>(e)], cols);
    expect_close(db2.data() + e * cols, want.data(), cols, kF32Tol, "bias_backward");
  }
  for (int64_t i = 0; i < E * cols; ++i) {
    ASSERT_EQ(db2[i], again[i]) << "column sums not deterministic";
    ASSERT_EQ(db2[i], single[i]) << "column sums depend on the batching of experts";
  }
}

// More experts than one launch covers (kMaxExpertsPerLaunch): every launch's experts get
// their own rows and bias.
TEST(CudaExpertKernels, MoreExpertsThanOneLaunch) {
  PARM_SKIP_WITHOUT_GPU();
  const int64_t E = parm::cuda::kMaxExpertsPerLaunch + 3, cols = 8, stride = 3 * cols;
  std::vector<int64_t> rows(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) rows[static_cast<size_t>(e)] = e % 4;  // 0 to 3 rows
  parm::cuda::ExpertRows r{rows.data(), E, stride, cols};
  const Tensor pre = host_normal({E * stride}, 11, 1.0f), bias = host_normal({E, cols}, 12, 1.0f);
  const Tensor d_pre = gpu(pre), d_bias = gpu(bias);
  Tensor d_act = gpu_filled({E * stride}, 7.0f);
  parm::cuda::bias_gelu(parm::cuda::f32_values(d_pre.data()), d_bias.data(), d_act.data(), nullptr, r);
  Tensor d_db = gpu_filled({E, cols}, 0.0f);
  Tensor scratch({parm::cuda::column_sum_scratch_floats(r)}, Device::kCuda);
  parm::cuda::bias_backward(d_pre.data(), d_db.data(), scratch.data(), r);
  const Tensor act = host(d_act), db = host(d_db);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t re = rows[static_cast<size_t>(e)];
    Tensor want({stride}), db_want({cols});
    want.fill(7.0f);
    db_want.fill(0.0f);
    cpu::bias_gelu(pre.data() + e * stride, bias.data() + e * cols, want.data(), re, cols);
    cpu::bias_backward(pre.data() + e * stride, db_want.data(), re, cols);
    expect_close(act.data() + e * stride, want.data(), stride, kF32Tol, "act e=" + std::to_string(e));
    expect_close(db.data() + e * cols, db_want.data(), cols, kF32Tol, "db e=" + std::to_string(e));
  }
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
  std::vector<LayerCase> cases = {
      {1, 1, 6, 16, 12, {4}, true},
      {1, 1, 6, 16, 12, {6}, false},
      {2, 3, 5, 24, 20, {5, 0, 2, 3, 0, 5}, false},   // expert 1 gets no rows at all
      {2, 2, 7, 13, 9, {0, 7, 3, 1}, true},           // odd M: the scalar copy path
      {1, 3, 4, 32, 8, {0, 0, 0}, true},              // nothing to compute
      {2, 2, 300, 64, 96, {300, 123, 0, 299}, true},  // > 256 rows: several column chunks
      // Ties (two experts of 17 rows share a grouped-GEMM group), a one-row expert, an
      // empty one; 17 and 1 are no multiple of 8 or 16.
      {1, 4, 17, 16, 24, {17, 1, 17, 0}, true},
  };
  // 2 blocks x 30 experts: more segments than one copy launch takes (kMaxSegmentsPerLaunch).
  LayerCase many{2, 30, 3, 16, 8, {}, true};
  for (int i = 0; i < 60; ++i) many.fills.push_back(i % 4 == 3 ? 0 : (i * 7) % 4);
  cases.push_back(many);
  return cases;
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
  dev.forward(in_gpu, w_gpu, c.blocks, c.slots, c.fills.data(), nullptr, c.add_b2, out_gpu,
              &gpu_fwd);
  dev.backward(dout_gpu, w_gpu, c.blocks, c.slots, c.fills.data(), nullptr, dw_gpu, din_gpu,
               &gpu_bwd);
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

TEST(CudaDeviceExperts, Bf16LoopOfGemmsMatchesCpuExperts) {
  PARM_SKIP_WITHOUT_GPU();
  check_all_cases(Precision::kBf16, GroupedGemm::Mode::kLoop, kBf16LayerTol);
}

// Dropless, packed layout: the same pass over the segments' filled rows back to back (at
// parm::packed_starts of the fills, the CPU's numbering) gives the bits of the (blocks,
// E_loc, slots) layout at every filled row and every weight gradient, writes no row past the
// routed ones, and is captured and replayed from CUDA graphs like the unpacked pass (its key
// holds the starts). The same with the workspace pooled (max_total_rows: expert e's rows
// after the experts before it, each start as aligned as a block's, so cuBLAS runs the same
// kernels), in both layouts; a pool too small for the fills is refused before any work.
TEST(CudaDeviceExperts, PackedLayoutGivesTheUnpackedBits) {
  PARM_SKIP_WITHOUT_GPU();
  uint64_t stream = 7000;
  for (const LayerCase& c : layer_cases()) {
    SCOPED_TRACE(describe(c));
    const int64_t E = c.e_loc, M = c.M, hl = c.hl, segments = c.blocks * E;
    std::vector<int64_t> first(static_cast<size_t>(segments));
    const int64_t routed = packed_starts(c.fills.data(), segments, first.data());
    const Shape layout = {c.blocks, E, c.slots, M};
    const Shape packed = {routed + 1, M};  // one spare row: never written
    uint64_t s = stream;
    stream += 100;
    ExpertShards w{host_normal({E, M, hl}, s++, 0.2f), host_normal({E, hl}, s++, 0.1f),
                   host_normal({E, hl, M}, s++, 0.2f), host_normal({E, M}, s++, 0.1f)};
    const Tensor in = host_normal(layout, s++, 1.0f), dout = host_normal(layout, s++, 1.0f);
    // The filled rows of `t` (layout) back to back.
    auto pack = [&](const Tensor& t) {
      Tensor p(packed);
      p.fill(7.0f);
      for (int64_t i = 0; i < segments; ++i)
        std::copy(t.data() + i * c.slots * M, t.data() + (i * c.slots + c.fills[i]) * M,
                  p.data() + first[static_cast<size_t>(i)] * M);
      return p;
    };
    const ExpertShards w_gpu{gpu(w.w1), gpu(w.b1), gpu(w.w2), gpu(w.b2)};
    auto zero_grads = [&] {
      return ExpertShards{gpu_filled(w.w1.shape(), 0.0f), gpu_filled(w.b1.shape(), 0.0f),
                          gpu_filled(w.w2.shape(), 0.0f), gpu_filled(w.b2.shape(), 0.0f)};
    };
    // Unpacked reference.
    DeviceExperts plain(E, c.blocks * c.slots, M, hl, Precision::kFp32);
    ExpertShards dw_plain = zero_grads();
    Tensor out_plain = gpu_filled(layout, 7.0f), din_plain = gpu_filled(layout, 7.0f);
    const Tensor in_plain = gpu(in), dout_plain = gpu(dout);
    plain.forward(in_plain, w_gpu, c.blocks, c.slots, c.fills.data(), nullptr, c.add_b2,
                  out_plain);
    plain.backward(dout_plain, w_gpu, c.blocks, c.slots, c.fills.data(), nullptr, dw_plain,
                   din_plain);
    const Tensor out_want = pack(host(out_plain)), din_want = pack(host(din_plain));
    auto expect_plain_grads = [&](const ExpertShards& dw, const std::string& what,
                                  double tol = 0.0) {
      expect_close(dw.w1, host(dw_plain.w1), tol, what + " dW1");
      expect_close(dw.b1, host(dw_plain.b1), tol, what + " db1");
      expect_close(dw.w2, host(dw_plain.w2), tol, what + " dW2");
      expect_close(dw.b2, host(dw_plain.b2), tol, what + " db2");
    };
    // The pool: the routed rows, and at least one expert's most (the constructor's floor).
    const int64_t pool_rows = std::max<int64_t>(routed, c.blocks * c.slots);
    for (int64_t max_total_rows : {int64_t{0}, pool_rows}) {
      const std::string ws = max_total_rows > 0 ? "pooled" : "blocks";
      SCOPED_TRACE(ws + " workspace");
      // Packed, three passes with graphs on: eager, captured, replayed. The same tensors in
      // every pass (the graph key holds their addresses; new ones could land elsewhere and
      // make every pass eager), reset to 7s and zero gradients before each.
      DeviceExperts dev(E, c.blocks * c.slots, M, hl, Precision::kFp32, max_total_rows);
      EXPECT_EQ(dev.pooled(), max_total_rows > 0);
      dev.set_graphs(true);
      const Tensor in_p = gpu(pack(in)), dout_p = gpu(pack(dout));
      const Tensor sevens = gpu_filled(packed, 7.0f);
      ExpertShards dw = zero_grads();
      Tensor out = gpu_filled(packed, 7.0f), din = gpu_filled(packed, 7.0f);
      for (int pass = 0; pass < 3; ++pass) {
        for (Tensor* t : {&dw.w1, &dw.b1, &dw.w2, &dw.b2}) device_zero(t->data(), t->bytes());
        for (Tensor* t : {&out, &din}) device_copy(t->data(), sevens.data(), sevens.bytes());
        dev.forward(in_p, w_gpu, c.blocks, c.slots, c.fills.data(), first.data(), c.add_b2, out);
        dev.backward(dout_p, w_gpu, c.blocks, c.slots, c.fills.data(), first.data(), dw, din);
        device_sync();
        // Spare rows keep their 7s in both (pack() put 7s there too). The eager pass gives the
        // plain bits; the captured and replayed ones within kF32Tol, as in
        // GraphsReplayTheEagerPass (cuBLAS may pick another algorithm under capture).
        const double tol = pass == 0 ? 0.0 : kF32Tol;
        const std::string at = ws + " packed, pass " + std::to_string(pass);
        expect_close(out, out_want, tol, at + ": out");
        expect_close(din, din_want, tol, at + ": din");
        expect_plain_grads(dw, at, tol);
      }
      if (routed > 0) {
        EXPECT_EQ(dev.forward_graphs().replays(), 1) << dev.graph_failures();
        EXPECT_EQ(dev.backward_graphs().replays(), 1) << dev.graph_failures();
      }
      // Starts that leave the buffer are refused.
      std::vector<int64_t> bad = first;
      bad.back() = routed + 1;
      if (c.fills.back() > 0)
        EXPECT_THROW(dev.forward(in_p, w_gpu, c.blocks, c.slots, c.fills.data(), bad.data(),
                                 c.add_b2, out),
                     parm::Error);
      if (max_total_rows == 0) continue;
      // The pooled workspace under the (blocks, E_loc, slots) layout: the plain bits.
      ExpertShards dw_l = zero_grads();
      Tensor out_l = gpu_filled(layout, 7.0f), din_l = gpu_filled(layout, 7.0f);
      dev.forward(in_plain, w_gpu, c.blocks, c.slots, c.fills.data(), nullptr, c.add_b2, out_l);
      dev.backward(dout_plain, w_gpu, c.blocks, c.slots, c.fills.data(), nullptr, dw_l, din_l);
      device_sync();
      expect_close(out_l, host(out_plain), 0.0, "pooled, unpacked layout: out");
      expect_close(din_l, host(din_plain), 0.0, "pooled, unpacked layout: din");
      expect_plain_grads(dw_l, "pooled, unpacked layout");
      // Fills past the pool (each expert within its own max_rows) are refused.
      const std::vector<int32_t> full(static_cast<size_t>(segments), static_cast<int32_t>(c.slots));
      if (c.blocks * c.slots * E > max_total_rows)
        EXPECT_THROW(dev.forward(in_plain, w_gpu, c.blocks, c.slots, full.data(), nullptr,
                                 c.add_b2, out_l),
                     parm::Error);
    }
  }
  // A pool smaller than one expert's most rows is refused.
  EXPECT_THROW(DeviceExperts(2, 10, 8, 4, Precision::kFp32, 9), parm::Error);
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

// CUDA graphs: the same tensors and fills pass after pass (eager, captured, replayed twice)
// give the eager pass's results, fp32 and bf16; other fills run eagerly and are still right;
// the counts say what ran.
TEST(CudaDeviceExperts, GraphsReplayTheEagerPass) {
  PARM_SKIP_WITHOUT_GPU();
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(precision_name(p));
    const int64_t blocks = 2, E = 3, slots = 7, M = 24, hl = 20;
    DeviceExperts dev(E, blocks * slots, M, hl, p);
    dev.set_graphs(true);
    uint64_t st = 7000;
    const ExpertShards w{gpu(host_normal({E, M, hl}, st++, 0.2f)), gpu(host_normal({E, hl}, st++, 0.1f)),
                         gpu(host_normal({E, hl, M}, st++, 0.2f)), gpu(host_normal({E, M}, st++, 0.1f))};
    const Shape layout = {blocks, E, slots, M};
    const Tensor in = gpu(host_normal(layout, st++, 1.0f)), dout = gpu(host_normal(layout, st++, 1.0f));
    Tensor out(layout, Device::kCuda), din(layout, Device::kCuda);
    ExpertShards dw{Tensor({E, M, hl}, Device::kCuda), Tensor({E, hl}, Device::kCuda),
                    Tensor({E, hl, M}, Device::kCuda), Tensor({E, M}, Device::kCuda)};
    const std::vector<int32_t> fills = {7, 0, 3, 1, 5, 7}, other = {2, 7, 0, 0, 1, 6};
    // One pass from zero gradients; returns out, din, dW1, db1, dW2, db2 on the host.
    auto pass = [&](const std::vector<int32_t>& f) {
      for (Tensor* t : {&dw.w1, &dw.b1, &dw.w2, &dw.b2}) device_zero(t->data(), t->bytes());
      dev.forward(in, w, blocks, slots, f.data(), nullptr, true, out);
      dev.backward(dout, w, blocks, slots, f.data(), nullptr, dw, din);
      return std::vector<Tensor>{host(out), host(din), host(dw.w1), host(dw.b1), host(dw.w2), host(dw.b2)};
    };
    // The same launches, so the same numbers; a tolerance (not memcmp) in case cuBLAS picks
    // another algorithm under capture. A wrong pointer baked into a graph is off by O(1).
    const double tol = p == Precision::kFp32 ? kF32Tol : kBf16OutTol;
    auto same = [tol](const std::vector<Tensor>& a, const std::vector<Tensor>& b, const char* what) {
      for (size_t i = 0; i < a.size(); ++i)
        expect_close(a[i].data(), b[i].data(), a[i].numel(), tol,
                     std::string(what) + ": tensor " + std::to_string(i));
    };
    const std::vector<Tensor> eager = pass(fills);  // eager (first of its key)
    same(pass(fills), eager, "captured pass");
    same(pass(fills), eager, "replay 1");
    same(pass(fills), eager, "replay 2");
    EXPECT_FALSE(dev.forward_graphs().capture_failed()) << dev.graph_failures();
    EXPECT_FALSE(dev.backward_graphs().capture_failed()) << dev.graph_failures();
    EXPECT_EQ(dev.forward_graphs().eager(), 1);
    EXPECT_EQ(dev.forward_graphs().captures(), 1);
    EXPECT_EQ(dev.forward_graphs().replays(), 2);
    EXPECT_EQ(dev.backward_graphs().replays(), 2);
    // Other fills: eager, and the same as a DeviceExperts without graphs.
    DeviceExperts plain(E, blocks * slots, M, hl, p);
    const std::vector<Tensor> got = pass(other);
    for (Tensor* t : {&dw.w1, &dw.b1, &dw.w2, &dw.b2}) device_zero(t->data(), t->bytes());
    plain.forward(in, w, blocks, slots, other.data(), nullptr, true, out);
    plain.backward(dout, w, blocks, slots, other.data(), nullptr, dw, din);
    same(got, {host(out), host(din), host(dw.w1), host(dw.b1), host(dw.w2), host(dw.b2)},
         "other fills");
    EXPECT_EQ(dev.forward_graphs().eager(), 2);
  }
}

// bf16 weight copies (moe/bf16_weight_copies.h): with a version given, W1 and W2 are rounded
// once per version, not once per forward; new weights under a new version are used (also
// by a replayed graph, whose key does not see the weights' values); without graphs and with
// them, the results equal a DeviceExperts that rounds at every forward.
TEST(CudaDeviceExperts, Bf16WeightsRoundedOncePerVersion) {
  PARM_SKIP_WITHOUT_GPU();
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "graphs" : "no graphs");
    const int64_t blocks = 1, E = 3, slots = 6, M = 16, hl = 24;
    DeviceExperts dev(E, blocks * slots, M, hl, Precision::kBf16);
    DeviceExperts fresh(E, blocks * slots, M, hl, Precision::kBf16);  // no version: every time
    dev.set_graphs(graphs);
    uint64_t st = 9000;
    ExpertShards w{gpu(host_normal({E, M, hl}, st++, 0.2f)), gpu(host_normal({E, hl}, st++, 0.1f)),
                   gpu(host_normal({E, hl, M}, st++, 0.2f)), gpu(host_normal({E, M}, st++, 0.1f))};
    const Shape layout = {blocks, E, slots, M};
    const Tensor in = gpu(host_normal(layout, st++, 1.0f));
    const std::vector<int32_t> fills = {6, 1, 3};
    Tensor out(layout, Device::kCuda);
    auto run = [&](DeviceExperts& d) {
      d.forward(in, w, blocks, slots, fills.data(), nullptr, true, out);
      return host(out);
    };
    dev.set_weights_version(1);
    const Tensor first = run(dev);
    for (int i = 0; i < 3; ++i) run(dev);  // eager, captured, replayed with graphs
    EXPECT_EQ(dev.weight_copies_made(), 1);
    // An optimizer step: new values in the same tensors, a new version.
    const Tensor w1_new = host_normal({E, M, hl}, st++, 0.2f), w2_new = host_normal({E, hl, M}, st++, 0.2f);
    device_copy(w.w1.data(), w1_new.data(), w1_new.bytes());
    device_copy(w.w2.data(), w2_new.data(), w2_new.bytes());
    dev.set_weights_version(2);
    const Tensor second = run(dev);
    EXPECT_EQ(dev.weight_copies_made(), 2);
    const Tensor want = run(fresh);
    EXPECT_EQ(fresh.weight_copies_made(), 1);
    expect_close(second.data(), want.data(), want.numel(), kBf16OutTol, "after the new version");
    double moved = 0.0;
    for (int64_t i = 0; i < first.numel(); ++i) moved = std::max(moved, double(std::abs(first[i] - second[i])));
    EXPECT_GT(moved, 1e-2) << "the new weights did not change the output";
  }
}

TEST(CudaDeviceExperts, RefusesBadCalls) {
  PARM_SKIP_WITHOUT_GPU();
  DeviceExperts dev(2, 10, 8, 4, Precision::kFp32);
  const ExpertShards w{Tensor({2, 8, 4}, Device::kCuda), Tensor({2, 4}, Device::kCuda),
                       Tensor({2, 4, 8}, Device::kCuda), Tensor({2, 8}, Device::kCuda)};
  Tensor in({2, 2, 5, 8}, Device::kCuda), out({2, 2, 5, 8}, Device::kCuda);
  const std::vector<int32_t> too_full = {6, 0, 0, 0};
  EXPECT_THROW(dev.forward(in, w, 2, 5, too_full.data(), nullptr, true, out), parm::Error);
  const std::vector<int32_t> ok = {5, 0, 1, 2};
  Tensor big({3, 2, 5, 8}, Device::kCuda);  // 3 x 5 rows > the 10 reserved
  EXPECT_THROW(dev.forward(big, w, 3, 5, std::vector<int32_t>(6, 0).data(), nullptr, true, big),
               parm::Error);
  Tensor host_in({2, 2, 5, 8});
  EXPECT_THROW(dev.forward(host_in, w, 2, 5, ok.data(), nullptr, true, out), parm::Error);
  EXPECT_NO_THROW(dev.forward(in, w, 2, 5, ok.data(), nullptr, true, out));
  const std::vector<int32_t> other = {4, 0, 1, 2};  // backward with other fills
  ExpertShards dw{Tensor({2, 8, 4}, Device::kCuda), Tensor({2, 4}, Device::kCuda),
                  Tensor({2, 4, 8}, Device::kCuda), Tensor({2, 8}, Device::kCuda)};
  EXPECT_THROW(dev.backward(in, w, 2, 5, other.data(), nullptr, dw, out), parm::Error);
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
