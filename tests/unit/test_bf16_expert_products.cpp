// Bf16ExpertProducts (moe/expert_products.h): the fused steps (bias + GeLU with the packing of
// act and act^T, GeLU + bias backward with the packing of dpre, weights packed in one pass for
// both layouts, x^T and act^T kept from the forward pass) give bit for bit what the separate
// steps give, for row counts that leave partial 16- and 32-row blocks, a single row and an
// empty expert, on both bf16 kernels; x and dy read from runs of rows in a layout as from
// contiguous rows. Also the bf16 GeLU against the fp32 one, and
// bf16_pack_b_rows / bf16_pack_at_rows block by block against the whole operand. The swiglu
// experts' steps likewise. And the CPU backend's packed weights kept per weight version
// (Bf16WeightCopies).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "moe/backend.h"
#include "moe/expert_products.h"
#include "moe/moe_ops.h"
#include "moe/phase_times.h"
#include "parm/error.h"
#include "parm/rng.h"

namespace parm::moe {
namespace {

std::vector<float> normal(int64_t n, uint64_t stream, float scale = 1.0f) {
  Rng rng(4242, stream);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = scale * rng.normal();
  return v;
}

std::vector<cpu::Bf16Kernel> kernels() {
  std::vector<cpu::Bf16Kernel> out = {cpu::Bf16Kernel::kPortable, cpu::Bf16Kernel::kFp32};
  try {
    cpu::set_bf16_kernel(cpu::Bf16Kernel::kAmx);
    out.push_back(cpu::Bf16Kernel::kAmx);
  } catch (const InvalidConfig&) {
  }
  try {
    cpu::set_bf16_kernel(cpu::Bf16Kernel::kAvx512);
    out.push_back(cpu::Bf16Kernel::kAvx512);
  } catch (const InvalidConfig&) {
  }
  cpu::set_bf16_kernel(cpu::Bf16Kernel::kAuto);
  return out;
}

// The reference: each step on its own, the products through cpu::gemm_bf16 (fp32 operands
// packed per call: the same rounding and the same kernel as the packed layouts).
TEST(Bf16ExpertProducts, FusedStepsMatchTheSeparateStepsBitForBit) {
  const int64_t experts = 2, max_rows = 70, M = 40, hl = 72;
  const auto w1 = normal(experts * M * hl, 1, 0.2f), w2 = normal(experts * hl * M, 2, 0.2f);
  const auto b1 = normal(experts * hl, 3), x = normal(max_rows * M, 4);
  const auto pre_in = normal(max_rows * hl, 5), dy = normal(max_rows * M, 6);
  for (cpu::Bf16Kernel kernel : kernels()) {
    cpu::set_bf16_kernel(kernel);
    Bf16ExpertProducts fused;
    fused.reserve(experts, max_rows, M, hl);
    fused.pack_weights(w1.data(), w2.data());
    for (int64_t rows : {0, 1, 16, 17, 31, 32, 33, 64, 70}) {
      const int64_t e = rows % 2;
      const float* bias = b1.data() + e * hl;
      const float* w1e = w1.data() + e * M * hl;
      const float* w2e = w2.data() + e * hl * M;
      const std::string at = std::string(cpu::bf16_kernel_name()) + ", rows " +
                             std::to_string(rows);
      // Forward: pre, then out from a given pre. Outputs start as sentinels: rows past
      // `rows` stay untouched.
      std::vector<float> pre_f(max_rows * hl, 7.0f), pre_s = pre_f;
      fused.fc1_forward(e, rows, RowRuns::contiguous(x.data(), rows, M), pre_f.data());
      cpu::gemm_bf16(false, false, rows, hl, M, x.data(), w1e, pre_s.data(), false);
      EXPECT_EQ(pre_f, pre_s) << at;
      std::vector<float> act(max_rows * hl, 7.0f);
      std::vector<float> out_f(max_rows * M, 7.0f), out_s = out_f;
      std::vector<float> grad = pre_in, grad_s = pre_in;  // pre, overwritten with gelu'
      fused.bias_gelu_fc2_forward(e, rows, grad.data(), bias, out_f.data());
      cpu::bias_gelu_grad_bf16(pre_in.data(), bias, grad_s.data(), rows, hl);
      EXPECT_EQ(grad, grad_s) << at;
      cpu::bias_gelu_bf16(pre_in.data(), bias, act.data(), rows, hl);
      cpu::gemm_bf16(false, false, rows, M, hl, act.data(), w2e, out_s.data(), false);
      EXPECT_EQ(out_f, out_s) << at;
      // Backward from the kept x^T and act^T: dW2 and dW1 accumulated onto start values.
      std::vector<float> dact_f(max_rows * hl, 7.0f), dact_s = dact_f;
      std::vector<float> dw2_f = normal(hl * M, 10), dw2_s = dw2_f;
      std::vector<float> db2_f = normal(M, 14), db2_s = db2_f;
      fused.fc2_backward(e, rows, RowRuns::contiguous(dy.data(), rows, M), db2_f.data(),
                         dw2_f.data(), dact_f.data());
      cpu::bias_backward(dy.data(), db2_s.data(), rows, M);
      cpu::gemm_bf16(true, false, hl, M, rows, act.data(), dy.data(), dw2_s.data(), true);
      cpu::gemm_bf16(false, true, rows, hl, M, dy.data(), w2e, dact_s.data(), false);
      EXPECT_EQ(db2_f, db2_s) << at;
      EXPECT_EQ(dw2_f, dw2_s) << at;
      EXPECT_EQ(dact_f, dact_s) << at;
      std::vector<float> dx_f(max_rows * M, 7.0f), dx_s = dx_f;
      std::vector<float> dw1_f = normal(M * hl, 8), dw1_s = dw1_f;
      std::vector<float> db1_f = normal(hl, 9), db1_s = db1_f;
      const std::vector<float> dact_before = dact_f;
      fused.gelu_backward_fc1_backward(e, rows, grad.data(), dact_f.data(), db1_f.data(),
                                       dw1_f.data(), dx_f.data());
      EXPECT_EQ(dact_f, dact_before) << at << ": dact is read only";
      std::vector<float> dpre(max_rows * hl);
      cpu::bias_gelu_backward_bf16(pre_in.data(), bias, dact_s.data(), dpre.data(), db1_s.data(),
                                   rows, hl);
      cpu::gemm_bf16(true, false, M, hl, rows, x.data(), dpre.data(), dw1_s.data(), true);
      cpu::gemm_bf16(false, true, rows, M, hl, dpre.data(), w1e, dx_s.data(), false);
      EXPECT_EQ(db1_f, db1_s) << at;
      EXPECT_EQ(dw1_f, dw1_s) << at;
      EXPECT_EQ(dx_f, dx_s) << at;
      if (rows == 0) EXPECT_EQ(dw1_f, normal(M * hl, 8)) << "an empty expert adds nothing";
    }
  }
  cpu::set_bf16_kernel(cpu::Bf16Kernel::kAuto);
}

// Swiglu experts' bf16 steps (the gate projection x W3 from the x that fc1_forward packed,
// SiLU(pre) * gate packed as act and act^T, dpre and dgate each packed twice, dx from both
// products) give bit for bit what the separate steps give: fp32 SwiGLU, the products through
// cpu::gemm_bf16, on every bf16 kernel of this CPU.
TEST(Bf16ExpertProducts, SwigluStepsMatchTheSeparateStepsBitForBit) {
  const int64_t experts = 2, max_rows = 70, M = 40, hl = 72;
  const auto w1 = normal(experts * M * hl, 1, 0.2f), w2 = normal(experts * hl * M, 2, 0.2f);
  const auto w3 = normal(experts * M * hl, 3, 0.2f), x = normal(max_rows * M, 4);
  const auto dy = normal(max_rows * M, 6);
  for (cpu::Bf16Kernel kernel : kernels()) {
    cpu::set_bf16_kernel(kernel);
    Bf16ExpertProducts fused;
    fused.reserve(experts, max_rows, M, hl, true);
    EXPECT_THROW(fused.pack_weights(w1.data(), w2.data()), Error) << "swiglu needs W3";
    EXPECT_TRUE(fused.pack_weights(w1.data(), w2.data(), w3.data()));
    for (int64_t rows : {0, 1, 16, 17, 31, 32, 33, 64, 70}) {
      const int64_t e = rows % 2;
      const float* w1e = w1.data() + e * M * hl;
      const float* w2e = w2.data() + e * hl * M;
      const float* w3e = w3.data() + e * M * hl;
      const std::string at = std::string(cpu::bf16_kernel_name()) + ", rows " +
                             std::to_string(rows);
      const auto n = static_cast<size_t>(max_rows);
      std::vector<float> pre_f(n * hl, 7.0f), pre_s = pre_f, gate_f = pre_f, gate_s = pre_f;
      fused.fc1_forward(e, rows, RowRuns::contiguous(x.data(), rows, M), pre_f.data());
      fused.gate_forward(e, rows, gate_f.data());
      cpu::gemm_bf16(false, false, rows, hl, M, x.data(), w1e, pre_s.data(), false);
      cpu::gemm_bf16(false, false, rows, hl, M, x.data(), w3e, gate_s.data(), false);
      EXPECT_EQ(pre_f, pre_s) << at;
      EXPECT_EQ(gate_f, gate_s) << at;
      std::vector<float> out_f(n * M, 7.0f), out_s = out_f, act(n * hl, 0.0f);
      const std::vector<float> pre_before = pre_f, gate_before = gate_f;
      fused.swiglu_fc2_forward(e, rows, pre_f.data(), gate_f.data(), out_f.data());
      EXPECT_EQ(pre_f, pre_before) << at << ": pre is kept";
      EXPECT_EQ(gate_f, gate_before) << at << ": gate is kept";
      cpu::swiglu_forward(pre_s.data(), gate_s.data(), act.data(), rows * hl);
      cpu::gemm_bf16(false, false, rows, M, hl, act.data(), w2e, out_s.data(), false);
      EXPECT_EQ(out_f, out_s) << at;
      // accumulate: out += act W2
      fused.swiglu_fc2_forward(e, rows, pre_f.data(), gate_f.data(), out_f.data(), nullptr, true);
      cpu::gemm_bf16(false, false, rows, M, hl, act.data(), w2e, out_s.data(), true);
      EXPECT_EQ(out_f, out_s) << at << " (accumulated)";
      // Backward: dW2, dW1, dW3 accumulated onto start values; no db2 for swiglu.
      std::vector<float> dact_f(n * hl, 7.0f), dact_s = dact_f;
      std::vector<float> dw2_f = normal(hl * M, 10), dw2_s = dw2_f;
      fused.fc2_backward(e, rows, RowRuns::contiguous(dy.data(), rows, M), nullptr,
                         dw2_f.data(), dact_f.data());
      cpu::gemm_bf16(true, false, hl, M, rows, act.data(), dy.data(), dw2_s.data(), true);
      cpu::gemm_bf16(false, true, rows, hl, M, dy.data(), w2e, dact_s.data(), false);
      EXPECT_EQ(dw2_f, dw2_s) << at;
      EXPECT_EQ(dact_f, dact_s) << at;
      std::vector<float> dx_f(n * M, 7.0f), dx_s = dx_f, dgate_f(n * hl, 7.0f), dgate_s = dgate_f;
      std::vector<float> dw1_f = normal(M * hl, 8), dw1_s = dw1_f;
      std::vector<float> dw3_f = normal(M * hl, 9), dw3_s = dw3_f;
      fused.swiglu_backward_fc1_backward(e, rows, pre_f.data(), gate_f.data(), dact_f.data(),
                                         dgate_f.data(), dw1_f.data(), dw3_f.data(), dx_f.data());
      cpu::swiglu_backward(pre_s.data(), gate_s.data(), dact_s.data(), dact_s.data(),
                           dgate_s.data(), rows * hl);
      cpu::gemm_bf16(true, false, M, hl, rows, x.data(), dact_s.data(), dw1_s.data(), true);
      cpu::gemm_bf16(false, true, rows, M, hl, dact_s.data(), w1e, dx_s.data(), false);
      cpu::gemm_bf16(true, false, M, hl, rows, x.data(), dgate_s.data(), dw3_s.data(), true);
      cpu::gemm_bf16(false, true, rows, M, hl, dgate_s.data(), w3e, dx_s.data(), true);
      EXPECT_EQ(dact_f, dact_s) << at << ": dpre over dact";
      EXPECT_EQ(dgate_f, dgate_s) << at;
      EXPECT_EQ(dw1_f, dw1_s) << at;
      EXPECT_EQ(dw3_f, dw3_s) << at;
      EXPECT_EQ(dx_f, dx_s) << at;
      if (rows == 0) EXPECT_EQ(dw3_f, normal(M * hl, 9)) << "an empty expert adds nothing";
    }
  }
  cpu::set_bf16_kernel(cpu::Bf16Kernel::kAuto);
}

// x and dy read where the exchange layout holds them (runs of rows with gaps between them,
// runs of 0, 1 and more than a 32-row block, a run boundary inside a block) give bit for bit
// what the same rows give when contiguous: the products, the packed x^T and act^T they leave
// for the backward pass, and db2.
TEST(Bf16ExpertProducts, RowsReadFromRunsMatchContiguousRows) {
  const int64_t M = 40, hl = 72, slots = 50;
  const int32_t counts[] = {17, 0, 50, 1, 33};  // 101 rows; count_stride 2 (E_loc 2, e 0)
  const int32_t fills[] = {17, 9, 0, 9, 50, 9, 1, 9, 33, 9};
  const int64_t runs = 5, rows = 101, stride = 2 * slots * M;
  const auto layout = normal(runs * stride, 15), dlayout = normal(runs * stride, 16);
  std::vector<float> x(rows * M), dy(rows * M);
  int64_t r = 0;
  for (int64_t s = 0; s < runs; ++s)
    for (int64_t i = 0; i < counts[s]; ++i, ++r)
      for (int64_t c = 0; c < M; ++c) {
        x[static_cast<size_t>(r * M + c)] = layout[static_cast<size_t>(s * stride + i * M + c)];
        dy[static_cast<size_t>(r * M + c)] = dlayout[static_cast<size_t>(s * stride + i * M + c)];
      }
  const auto w1 = normal(M * hl, 1, 0.2f), w2 = normal(hl * M, 2, 0.2f), b1 = normal(hl, 3);
  struct Out {
    std::vector<float> pre, out, db2, dw2, dact, db1, dw1, dx;
  };
  const auto run = [&](const RowRuns& xr, const RowRuns& dyr) {
    Bf16ExpertProducts p;
    p.reserve(1, rows, M, hl);
    p.pack_weights(w1.data(), w2.data());
    Out o{std::vector<float>(rows * hl), std::vector<float>(rows * M), normal(M, 4),
          normal(hl * M, 5), std::vector<float>(rows * hl), normal(hl, 6), normal(M * hl, 7),
          std::vector<float>(rows * M)};
    p.fc1_forward(0, rows, xr, o.pre.data());
    p.bias_gelu_fc2_forward(0, rows, o.pre.data(), b1.data(), o.out.data());
    p.fc2_backward(0, rows, dyr, o.db2.data(), o.dw2.data(), o.dact.data());
    p.gelu_backward_fc1_backward(0, rows, o.pre.data(), o.dact.data(), o.db1.data(),
                                 o.dw1.data(), o.dx.data());
    return o;
  };
  for (cpu::Bf16Kernel kernel : kernels()) {
    cpu::set_bf16_kernel(kernel);
    const Out whole = run(RowRuns::contiguous(x.data(), rows, M),
                          RowRuns::contiguous(dy.data(), rows, M));
    const Out from_runs = run({layout.data(), M, runs, stride, fills, 2},
                              {dlayout.data(), M, runs, stride, fills, 2});
    const std::string at = cpu::bf16_kernel_name();
    EXPECT_EQ(from_runs.pre, whole.pre) << at;
    EXPECT_EQ(from_runs.out, whole.out) << at;
    EXPECT_EQ(from_runs.db2, whole.db2) << at;
    EXPECT_EQ(from_runs.dw2, whole.dw2) << at;
    EXPECT_EQ(from_runs.dact, whole.dact) << at;
    EXPECT_EQ(from_runs.dw1, whole.dw1) << at;
    EXPECT_EQ(from_runs.dx, whole.dx) << at;
  }
  cpu::set_bf16_kernel(cpu::Bf16Kernel::kAuto);
  // Asking past the rows the runs hold is refused.
  std::vector<float> block(2 * M);
  const RowRuns short_runs{layout.data(), M, runs, stride, fills, 2};
  EXPECT_THROW(short_runs.copy(100, 2, block.data()), Error);
}

std::vector<std::string> phase_names(const PhaseTimes& t) {
  return {t.names, t.names + t.num};
}

// bench-layer --breakdown: each step of Bf16ExpertProducts laps the clock after its
// elementwise work and after its products, so "expert products" is the GEMMs alone (as at
// fp32), the row packing "rows in/out" and the GeLU steps with their packing under the fp32
// path's names. Seen failing: the lap after the forward GeLU left out (act's packing then
// counted as products: forward phases rows in/out, expert products only).
TEST(Bf16ExpertProducts, EachStepLapsItsElementwiseWorkApartFromItsProducts) {
  const int64_t rows = 37, M = 40, hl = 72;
  const auto w1 = normal(M * hl, 1, 0.2f), w2 = normal(hl * M, 2, 0.2f), b1 = normal(hl, 3);
  const auto x = normal(rows * M, 4), dy = normal(rows * M, 5);
  std::vector<float> pre(rows * hl), out(rows * M), dact(rows * hl), dx(rows * M);
  std::vector<float> db1(hl), db2(M), dw1(M * hl), dw2(hl * M);
  Bf16ExpertProducts p;
  p.reserve(1, rows, M, hl);
  p.pack_weights(w1.data(), w2.data());
  PhaseTimes fwd, bwd;
  PhaseClock f(&fwd);
  p.fc1_forward(0, rows, RowRuns::contiguous(x.data(), rows, M), pre.data(), &f);
  EXPECT_EQ(phase_names(fwd), (std::vector<std::string>{"rows in/out", "expert products"}));
  p.bias_gelu_fc2_forward(0, rows, pre.data(), b1.data(), out.data(), &f);
  EXPECT_EQ(phase_names(fwd),
            (std::vector<std::string>{"rows in/out", "expert products", "bias + GeLU"}));
  PhaseClock b(&bwd);
  p.fc2_backward(0, rows, RowRuns::contiguous(dy.data(), rows, M), db2.data(), dw2.data(),
                 dact.data(), &b);
  EXPECT_EQ(phase_names(bwd), (std::vector<std::string>{"rows in/out", "expert products"}));
  p.gelu_backward_fc1_backward(0, rows, pre.data(), dact.data(), db1.data(), dw1.data(),
                               dx.data(), &b);
  EXPECT_EQ(phase_names(bwd), (std::vector<std::string>{"rows in/out", "expert products",
                                                        "GeLU + bias backward"}));
}

// The same through experts_forward / experts_backward: a bf16 pass (after the one that packs
// the weights) reports the phases of an fp32 pass, the forward ones in the same order. Seen
// failing: experts_backward not handing its clock to the GeLU step (no "GeLU + bias backward").
TEST(Bf16ExpertProducts, LayerPassReportsThePhasesOfTheFp32Pass) {
  const int64_t e_loc = 2, blocks = 2, slots = 20, M = 40, hl = 72;
  const int32_t fills[] = {7, 20, 0, 13};
  const auto fill = [](Tensor t, uint64_t stream, float scale) {
    const auto v = normal(t.numel(), stream, scale);
    std::copy(v.begin(), v.end(), t.data());
    return t;
  };
  const ExpertShards w{fill(Tensor({e_loc, M, hl}), 31, 0.2f), fill(Tensor({e_loc, hl}), 32, 0.1f),
                       fill(Tensor({e_loc, hl, M}), 33, 0.2f), fill(Tensor({e_loc, M}), 34, 0.1f)};
  const Tensor in = fill(Tensor({blocks, e_loc, slots, M}), 35, 1.0f);
  const Tensor dout = fill(Tensor({blocks, e_loc, slots, M}), 36, 1.0f);
  const auto phases = [&](Precision precision) {
    ExpertWorkspace ws;
    ws.reserve(e_loc, blocks * slots, M, hl, precision);
    ws.bf16.set_weights_version(1);
    ExpertShards dw{Tensor({e_loc, M, hl}), Tensor({e_loc, hl}), Tensor({e_loc, hl, M}),
                    Tensor({e_loc, M})};
    Tensor out({blocks, e_loc, slots, M}), din({blocks, e_loc, slots, M});
    PhaseTimes fwd, bwd;
    experts_forward(in, w, blocks, slots, fills, true, ws, out);  // packs the bf16 weights
    experts_forward(in, w, blocks, slots, fills, true, ws, out, &fwd);
    experts_backward(dout, w, blocks, slots, fills, ws, dw, din, &bwd);
    const auto b = phase_names(bwd);
    return std::make_pair(phase_names(fwd), std::set<std::string>(b.begin(), b.end()));
  };
  const auto fp32 = phases(Precision::kFp32), bf16 = phases(Precision::kBf16);
  EXPECT_EQ(bf16.first, fp32.first);
  EXPECT_EQ(bf16.second, fp32.second);
}

// The CPU backend at bf16 packs W1 and W2 once per weight version: passes at an unchanged
// version reuse the packed copies (counted; they read the old weights even after an in-place
// write, which is why writers change the version), a pass after a version change reads the new
// weights, and without a version every forward pass packs. Each pass is compared bit for bit
// with a fresh backend's pass (no version) over the same weights, forward and backward.
TEST(Bf16ExpertProducts, CpuBackendPacksWeightsOncePerVersion) {
  const int64_t e_loc = 2, slots = 40, M = 32, hl = 64;
  BackendSizes sizes;
  sizes.gate_rows = 8;
  sizes.experts = e_loc;
  sizes.model_dim = M;
  sizes.local_experts = e_loc;
  sizes.hidden_shard = hl;
  sizes.max_expert_rows = slots;
  const auto fill = [](Tensor t, uint64_t stream, float scale) {
    const auto v = normal(t.numel(), stream, scale);
    std::copy(v.begin(), v.end(), t.data());
    return t;
  };
  ExpertShards w{fill(Tensor({e_loc, M, hl}), 21, 0.2f), fill(Tensor({e_loc, hl}), 22, 0.1f),
                 fill(Tensor({e_loc, hl, M}), 23, 0.2f), fill(Tensor({e_loc, M}), 24, 0.1f)};
  const Tensor in = fill(Tensor({1, e_loc, slots, M}), 25, 1.0f);
  const Tensor dout = fill(Tensor({1, e_loc, slots, M}), 26, 1.0f);
  const int32_t fills[] = {33, 17};
  struct Pass {
    std::vector<float> out, din, dw1;
  };
  const auto pass = [&](LayerBackend& b) {
    Tensor out({1, e_loc, slots, M}), din({1, e_loc, slots, M});
    ExpertShards dw{Tensor({e_loc, M, hl}), Tensor({e_loc, hl}), Tensor({e_loc, hl, M}),
                    Tensor({e_loc, M})};
    b.experts_forward(in, w, 1, slots, fills, nullptr, true, out, nullptr);
    b.experts_backward(dout, w, 1, slots, fills, nullptr, dw, din, nullptr);
    return Pass{{out.data(), out.data() + out.numel()}, {din.data(), din.data() + din.numel()},
                {dw.w1.data(), dw.w1.data() + dw.w1.numel()}};
  };
  const auto fresh = [&] {  // the same weights packed by a backend that never saw them
    auto b = make_cpu_backend(sizes, Precision::kBf16);
    return pass(*b);
  };
  const auto expect_same = [](const Pass& a, const Pass& b, const char* what) {
    EXPECT_EQ(a.out, b.out) << what;
    EXPECT_EQ(a.din, b.din) << what;
    EXPECT_EQ(a.dw1, b.dw1) << what;
  };
  auto b = make_cpu_backend(sizes, Precision::kBf16);
  EXPECT_EQ(b->weight_copies().made, 0);
  b->set_weights_version(1);
  const Pass first = pass(*b);
  EXPECT_EQ(b->weight_copies().made, 1);
  expect_same(first, fresh(), "version 1, first pass");
  expect_same(pass(*b), first, "version 1, second pass");
  EXPECT_EQ(b->weight_copies().made, 1) << "an unchanged version repacked";

  // W1 and W2 written in place (same addresses): the copies are those of version 1 until the
  // version changes.
  for (Tensor* t : {&w.w1, &w.w2})
    for (int64_t i = 0; i < t->numel(); ++i) (*t)[i] = -0.5f * (*t)[i] + 0.01f;
  expect_same(pass(*b), first, "version 1 after an unannounced write");
  EXPECT_EQ(b->weight_copies().made, 1);
  b->set_weights_version(2);
  const Pass second = pass(*b);
  EXPECT_EQ(b->weight_copies().made, 2);
  expect_same(second, fresh(), "version 2");
  EXPECT_NE(second.out, first.out) << "the new weights were not read";
  pass(*b);
  EXPECT_EQ(b->weight_copies().made, 2);

  // No version: every forward pass packs.
  b->set_weights_version(Bf16WeightCopies::kUnknownVersion);
  pass(*b);
  pass(*b);
  EXPECT_EQ(b->weight_copies().made, 4);
  // The fp32 backend packs nothing.
  auto f32 = make_cpu_backend(sizes, Precision::kFp32);
  f32->set_weights_version(1);
  pass(*f32);
  EXPECT_EQ(f32->weight_copies().made, 0);
}

// A transposed A packed in blocks of stored rows (k0 multiples of 32, a partial last block)
// equals it packed at once, padding rows and columns included; bad blocks are refused.
TEST(Bf16PackAtRows, BlocksMatchTheWholeOperand) {
  for (bool portable : {true, false}) {
    cpu::set_bf16_kernel(portable ? cpu::Bf16Kernel::kPortable : cpu::Bf16Kernel::kAuto);
    for (int64_t k : {1, 31, 32, 33, 70, 96}) {
      for (int64_t m : {5, 16, 37}) {
        const auto a = normal(k * (m + 3), 12);
        const auto size = static_cast<size_t>(cpu::bf16_packed_a_size(m, k));
        std::vector<uint16_t> whole(size, 0xdead), blocks(size, 0xbeef);
        cpu::bf16_pack_a(true, m, k, a.data(), m + 3, whole.data());
        for (int64_t k0 = 0; k0 < k; k0 += 32)
          cpu::bf16_pack_at_rows(k0, std::min<int64_t>(32, k - k0), m, k,
                                 a.data() + k0 * (m + 3), m + 3, blocks.data());
        EXPECT_EQ(blocks, whole) << "m = " << m << ", k = " << k << (portable ? " (portable)" : "");
      }
    }
  }
  cpu::set_bf16_kernel(cpu::Bf16Kernel::kAuto);
  std::vector<float> a(64 * 4);
  std::vector<uint16_t> packed(static_cast<size_t>(cpu::bf16_packed_a_size(4, 64)));
  EXPECT_THROW(cpu::bf16_pack_at_rows(16, 16, 4, 64, a.data(), 4, packed.data()), Error);
  EXPECT_THROW(cpu::bf16_pack_at_rows(0, 16, 4, 64, a.data(), 4, packed.data()), Error);
  EXPECT_THROW(cpu::bf16_pack_at_rows(32, 40, 4, 64, a.data(), 4, packed.data()), Error);
}

// The bf16 GeLU against the fp32 one over [-20, 20] (bias added, partial vectors): values
// within kGeluBf16Error relative, gradients within kGeluBf16Error absolute, db1 summed to
// the same tolerance; NaN propagates and +-inf give gelu's limits.
TEST(GeluBf16, WithinItsErrorOfTheFp32GeLU) {
  const int64_t rows = 301, cols = 37;
  std::vector<float> x(rows * cols), bias(cols), dact = normal(rows * cols, 13);
  for (int64_t i = 0; i < rows * cols; ++i)
    x[static_cast<size_t>(i)] = -20.0f + 40.0f * static_cast<float>(i) / (rows * cols - 1);
  for (int64_t c = 0; c < cols; ++c) bias[static_cast<size_t>(c)] = 0.01f * static_cast<float>(c);
  std::vector<float> act(x.size()), act_b(x.size()), dx(x.size()), dx_b(x.size());
  std::vector<float> db(cols, 0.5f), db_b = db;
  cpu::bias_gelu(x.data(), bias.data(), act.data(), rows, cols);
  cpu::bias_gelu_bf16(x.data(), bias.data(), act_b.data(), rows, cols);
  cpu::bias_gelu_backward(x.data(), bias.data(), dact.data(), dx.data(), db.data(), rows, cols);
  cpu::bias_gelu_backward_bf16(x.data(), bias.data(), dact.data(), dx_b.data(), db_b.data(), rows,
                               cols);
  const double tol = cpu::kGeluBf16Error;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(act_b[i], act[i], tol * std::fabs(act[i]) + 1e-30) << "gelu at x = " << x[i];
    ASSERT_NEAR(dx_b[i], dx[i], tol * std::fabs(dact[i])) << "gelu' at x = " << x[i];
  }
  for (int64_t c = 0; c < cols; ++c)
    EXPECT_NEAR(db_b[static_cast<size_t>(c)], db[static_cast<size_t>(c)], tol * rows) << c;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {std::nanf(""), inf, -inf, 0.0f}, zero(4, 0.0f), one(4, 1.0f);
  std::vector<float> v(4), g(4), dbs(4, 0.0f);
  cpu::bias_gelu_bf16(special.data(), zero.data(), v.data(), 1, 4);
  cpu::bias_gelu_backward_bf16(special.data(), zero.data(), one.data(), g.data(), dbs.data(), 1, 4);
  EXPECT_TRUE(std::isnan(v[0]) && std::isnan(g[0]));
  EXPECT_EQ(v[1], inf);
  EXPECT_EQ(g[1], 1.0f);
  EXPECT_NEAR(v[2], 0.0f, 1e-30);
  EXPECT_NEAR(g[2], 0.0f, 1e-30);
  EXPECT_EQ(v[3], 0.0f);
  EXPECT_NEAR(g[3], 0.5f, tol);
}

// B packed in blocks of rows (k0 multiples of 32, a partial last block) equals B packed at
// once, padding included; bad blocks are refused.
// The GeLU steps that also pack their output as A give the bits of the GeLU step followed by
// bf16_pack_a (padding rows and columns included: the packed buffer starts full of 0xffff),
// and the same dbias, with AVX512-BF16 and with the portable packing.
TEST(GeluBf16, PackedAsAMatchesGeluThenPack) {
  for (cpu::Bf16Kernel kernel : kernels()) {
    cpu::set_bf16_kernel(kernel);
    for (int64_t rows : {1, 15, 16, 17, 32}) {
      for (int64_t cols : {37, 40, 72, 2048}) {
        const auto x = normal(rows * cols, 21, 3.0f), bias = normal(cols, 22);
        const auto dact = normal(rows * cols, 23);
        const auto packed_size = static_cast<size_t>(cpu::bf16_packed_a_size(rows, cols));
        const std::string at = std::string(cpu::bf16_kernel_name()) + ", rows " +
                               std::to_string(rows) + ", cols " + std::to_string(cols);
        std::vector<float> want(x.size()), got(x.size());
        std::vector<uint16_t> want_p(packed_size, 0xffff), got_p(packed_size, 0xffff);
        cpu::bias_gelu_bf16(x.data(), bias.data(), want.data(), rows, cols);
        cpu::bf16_pack_a(false, rows, cols, want.data(), cols, want_p.data());
        cpu::bias_gelu_pack_a_bf16(x.data(), bias.data(), got.data(), rows, cols, got_p.data());
        EXPECT_EQ(want, got) << at;
        EXPECT_EQ(want_p, got_p) << at;
        std::vector<float> db_want(static_cast<size_t>(cols), 0.25f), db_got = db_want;
        std::fill(want_p.begin(), want_p.end(), uint16_t{0xffff});
        std::fill(got_p.begin(), got_p.end(), uint16_t{0xffff});
        cpu::bias_gelu_backward_bf16(x.data(), bias.data(), dact.data(), want.data(),
                                     db_want.data(), rows, cols);
        cpu::bf16_pack_a(false, rows, cols, want.data(), cols, want_p.data());
        cpu::bias_gelu_backward_pack_a_bf16(x.data(), bias.data(), dact.data(), got.data(),
                                            db_got.data(), rows, cols, got_p.data());
        EXPECT_EQ(want, got) << at;
        EXPECT_EQ(want_p, got_p) << at;
        EXPECT_EQ(db_want, db_got) << at;
      }
    }
  }
  cpu::set_bf16_kernel(cpu::Bf16Kernel::kAuto);
}

// The experts' one-pass GeLU steps, block by block over k rows (partial 16- and 32-row blocks,
// cols that leave partial 16- and 32-column pieces and a partial 128-column group), on both
// packings, bit for bit against the separate steps (the packed buffers start full of 0xffff,
// so padding is checked too):
// - forward: act as packed A and act^T as packed A equal bias_gelu_bf16 followed by
//   bf16_pack_a of act and of act^T, and x is left holding bias_gelu_grad_bf16;
// - backward, from the gelu' the forward kept: dpre as packed A and as packed B, and dbias,
//   equal bias_gelu_backward_bf16 (dpre and dbias) followed by bf16_pack_a and bf16_pack_b of
//   the whole operand.
// Inputs cover +-inf, +-kGradClamp and beyond (the gradient clamped there). Seen failing:
// act^T's pairs staged the wrong way round (row 2q + 1 first), the gradient below
// -kGradClamp taken as 0 (x's gelu' and the backward's outputs off), and the second row of a
// pair added to dbias before the first (dbias off in the last bits; also in
// Bf16ExpertProducts.FusedStepsMatchTheSeparateStepsBitForBit's db1).
TEST(GeluBf16, PackBothStepsMatchTheSeparateSteps) {
  const float inf = std::numeric_limits<float>::infinity();
  for (cpu::Bf16Kernel kernel : kernels()) {
    cpu::set_bf16_kernel(kernel);
    for (int64_t k : {1, 2, 15, 17, 32, 33, 70}) {
      for (int64_t cols : {37, 40, 48, 72, 200, 2048}) {
        auto x = normal(k * cols, 31, 4.0f);
        const auto bias = normal(cols, 32), dact = normal(k * cols, 34, 2.0f);
        const float special[] = {inf, -inf, 9.5f, -9.5f, 9.75f, -9.75f, -15.0f, 30.0f, 0.0f};
        for (size_t i = 0; i < std::size(special) && i < x.size(); ++i) {
          const size_t at = i * 7 % x.size();
          x[at] = special[i] - bias[at % static_cast<size_t>(cols)];
        }
        const std::string at = std::string(cpu::bf16_kernel_name()) + ", k " +
                               std::to_string(k) + ", cols " + std::to_string(cols);
        // The separate steps.
        std::vector<float> act(x.size()), d(x.size());
        std::vector<float> db_want = normal(cols, 35), db_got = db_want;
        cpu::bias_gelu_bf16(x.data(), bias.data(), act.data(), k, cols);
        cpu::bias_gelu_backward_bf16(x.data(), bias.data(), dact.data(), d.data(), db_want.data(),
                                     k, cols);
        const auto a_size = static_cast<size_t>(cpu::bf16_packed_a_size(k, cols));
        const auto at_size = static_cast<size_t>(cpu::bf16_packed_a_size(cols, k));
        const auto b_size = static_cast<size_t>(cpu::bf16_packed_b_size(k, cols));
        std::vector<uint16_t> want_a(a_size, 0xffff), want_at(at_size, 0xffff);
        std::vector<uint16_t> want_da(a_size, 0xffff), want_db(b_size, 0xffff);
        cpu::bf16_pack_a(false, k, cols, act.data(), cols, want_a.data());
        cpu::bf16_pack_a(true, cols, k, act.data(), cols, want_at.data());
        cpu::bf16_pack_a(false, k, cols, d.data(), cols, want_da.data());
        cpu::bf16_pack_b(false, k, cols, d.data(), cols, want_db.data());
        // The one-pass steps, 32 rows at a time.
        std::vector<uint16_t> got_a(a_size, 0xffff), got_at(at_size, 0xffff);
        std::vector<uint16_t> got_da(a_size, 0xffff), got_db(b_size, 0xffff);
        std::vector<float> grad = x, want_grad(x.size());  // x, overwritten with gelu'
        cpu::bias_gelu_grad_bf16(x.data(), bias.data(), want_grad.data(), k, cols);
        std::vector<float> scratch(static_cast<size_t>(cpu::gelu_pack_scratch_size(cols)));
        for (int64_t k0 = 0; k0 < k; k0 += 32)
          cpu::bias_gelu_pack_both_bf16(grad.data() + k0 * cols, bias.data(), k0,
                                        std::min<int64_t>(32, k - k0), k, cols,
                                        got_a.data() + cpu::bf16_packed_a_size(k0, cols),
                                        got_at.data(), scratch.data());
        EXPECT_EQ(got_a, want_a) << at;
        EXPECT_EQ(got_at, want_at) << at;
        EXPECT_EQ(grad, want_grad) << at;
        for (int64_t k0 = 0; k0 < k; k0 += 32)
          cpu::gelu_grad_pack_both_bf16(grad.data() + k0 * cols,
                                        dact.data() + k0 * cols, db_got.data(), k0,
                                        std::min<int64_t>(32, k - k0), k, cols,
                                        got_da.data() + cpu::bf16_packed_a_size(k0, cols),
                                        got_db.data(), scratch.data());
        EXPECT_EQ(got_da, want_da) << at;
        EXPECT_EQ(got_db, want_db) << at;
        EXPECT_EQ(db_got, db_want) << at;
      }
    }
  }
  cpu::set_bf16_kernel(cpu::Bf16Kernel::kAuto);
}

// NaN in: NaN act and NaN gradient, in that column only; and blocks are checked. Seen
// failing: NaN lanes given the gradient below the clamp (an unordered compare).
TEST(GeluBf16, PackBothStepsPropagateNaNAndRefuseBadBlocks) {
  const int64_t k = 3, cols = 40;
  for (cpu::Bf16Kernel kernel : kernels()) {
    cpu::set_bf16_kernel(kernel);
    auto x = normal(k * cols, 36);
    x[cols + 5] = std::nanf("");
    const std::vector<float> bias(cols, 0.0f), dact(k * cols, 1.0f);
    std::vector<uint16_t> a(static_cast<size_t>(cpu::bf16_packed_a_size(k, cols)));
    std::vector<uint16_t> at(static_cast<size_t>(cpu::bf16_packed_a_size(cols, k)));
    std::vector<uint16_t> b(static_cast<size_t>(cpu::bf16_packed_b_size(k, cols)));
    std::vector<float> scratch(static_cast<size_t>(cpu::gelu_pack_scratch_size(cols)));
    std::vector<float> db(cols, 0.0f);
    cpu::bias_gelu_pack_both_bf16(x.data(), bias.data(), 0, k, k, cols, a.data(), at.data(),
                                  scratch.data());
    cpu::gelu_grad_pack_both_bf16(x.data(), dact.data(), db.data(), 0, k, k, cols, a.data(),
                                  b.data(), scratch.data());
    const auto unpack = [](uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); };
    EXPECT_TRUE(std::isnan(unpack(at[static_cast<size_t>(5 * 32 + 1)])))
        << cpu::bf16_kernel_name() << ": act^T (5, 1)";
    for (int64_t c = 0; c < cols; ++c)
      EXPECT_EQ(std::isnan(db[static_cast<size_t>(c)]), c == 5)
          << cpu::bf16_kernel_name() << ", " << c;
  }
  cpu::set_bf16_kernel(cpu::Bf16Kernel::kAuto);
  std::vector<float> x(64 * 8), scratch(static_cast<size_t>(cpu::gelu_pack_scratch_size(8)));
  std::vector<uint16_t> a(static_cast<size_t>(cpu::bf16_packed_a_size(64, 8))), at = a;
  // A block must start at a multiple of 32 and hold 32 rows unless it ends at k.
  EXPECT_THROW(cpu::bias_gelu_pack_both_bf16(x.data(), x.data(), 16, 16, 64, 8, a.data(),
                                             at.data(), scratch.data()),
               Error);
  EXPECT_THROW(cpu::bias_gelu_pack_both_bf16(x.data(), x.data(), 0, 16, 64, 8, a.data(),
                                             at.data(), scratch.data()),
               Error);
  EXPECT_THROW(cpu::gelu_grad_pack_both_bf16(x.data(), x.data(), x.data(), 32, 40, 64, 8,
                                             a.data(), at.data(), scratch.data()),
               Error);
}

// bias_gelu_grad_bf16 / bias_gelu_grad are the factors the GeLU backward steps multiply dact
// by (the same bits), so the forward step may keep them for the backward one. Seen failing:
// bias_gelu_grad_bf16 clamping x + b at -9 (gelu' off below -9).
TEST(GeluBf16, GradientIsTheBackwardStepsFactor) {
  const int64_t rows = 7, cols = 1000;
  auto xs = normal(rows * cols, 37, 5.0f);
  for (int64_t i = 0; i < cols; ++i)  // row 0 over [-20, 20]
    xs[static_cast<size_t>(i)] = -20.0f + 40.0f * static_cast<float>(i) / (cols - 1);
  const auto bias = normal(cols, 38), dy = normal(rows * cols, 39);
  for (bool bf16 : {false, true}) {
    std::vector<float> gg(xs.size()), want(xs.size()), dbias(cols, 0.0f);
    (bf16 ? cpu::bias_gelu_grad_bf16 : cpu::bias_gelu_grad)(xs.data(), bias.data(), gg.data(),
                                                            rows, cols);
    (bf16 ? cpu::bias_gelu_backward_bf16 : cpu::bias_gelu_backward)(
        xs.data(), bias.data(), dy.data(), want.data(), dbias.data(), rows, cols);
    for (size_t i = 0; i < xs.size(); ++i)
      ASSERT_EQ(gg[i] * dy[i], want[i]) << (bf16 ? "bf16" : "fp32") << ", value " << i;
  }
}

TEST(Bf16PackBRows, BlocksMatchTheWholeOperand) {
  for (bool portable : {true, false}) {
    cpu::set_bf16_kernel(portable ? cpu::Bf16Kernel::kPortable : cpu::Bf16Kernel::kAuto);
    for (int64_t k : {1, 31, 32, 33, 70, 96}) {
      const int64_t n = 37;
      const auto b = normal(k * (n + 3), 11);
      const auto size = static_cast<size_t>(cpu::bf16_packed_b_size(k, n));
      std::vector<uint16_t> whole(size, 0xdead), blocks(size, 0xbeef);
      cpu::bf16_pack_b(false, k, n, b.data(), n + 3, whole.data());
      for (int64_t k0 = 0; k0 < k; k0 += 32)
        cpu::bf16_pack_b_rows(k0, std::min<int64_t>(32, k - k0), k, n, b.data() + k0 * (n + 3),
                              n + 3, blocks.data());
      EXPECT_EQ(blocks, whole) << "k = " << k << (portable ? " (portable)" : "");
    }
  }
  cpu::set_bf16_kernel(cpu::Bf16Kernel::kAuto);
  std::vector<float> b(64 * 4);
  std::vector<uint16_t> packed(static_cast<size_t>(cpu::bf16_packed_b_size(64, 4)));
  EXPECT_THROW(cpu::bf16_pack_b_rows(16, 16, 64, 4, b.data(), 4, packed.data()), Error);
  EXPECT_THROW(cpu::bf16_pack_b_rows(0, 15, 64, 4, b.data(), 4, packed.data()), Error);
  EXPECT_THROW(cpu::bf16_pack_b_rows(32, 40, 64, 4, b.data(), 4, packed.data()), Error);
}

}  // namespace
}  // namespace parm::moe
