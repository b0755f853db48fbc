#include "moe/shared_experts.h"

#include <cmath>

#include "kernels/cpu/kernels.h"
#include "moe/expert_products.h"
#include "parm/error.h"

namespace parm::moe {

void SharedWorkspace::reserve(int64_t experts, int64_t rows, int64_t M, int64_t hl,
                              ExpertMlp mlp_, bool gate_on, Precision p) {
  mlp = mlp_;
  precision = p;
  gated = gate_on;
  const bool bf16_path = p == Precision::kBf16;
  bf16 = Bf16ExpertProducts();
  if (bf16_path) bf16.reserve(experts, rows, M, hl, is_gated(mlp));
  pre.clear();
  gate.clear();
  act.clear();
  for (int64_t s = 0; s < experts; ++s) {
    pre.emplace_back(Shape{rows, hl});
    if (!bf16_path) act.emplace_back(Shape{rows, hl});
    if (is_gated(mlp)) gate.emplace_back(Shape{rows, hl});
  }
  sum = gated ? Tensor({rows, M}) : Tensor();
  g = gated ? Tensor({rows}) : Tensor();
  dz = gated ? Tensor({rows}) : Tensor();
  dsum = gated ? Tensor({rows, M}) : Tensor();
  d_act = Tensor({rows, hl});
  d_gate = is_gated(mlp) ? Tensor({rows, hl}) : Tensor();
  dx = Tensor({rows, M});
}

int64_t SharedWorkspace::held_bytes() const {
  int64_t b = sum.bytes() + g.bytes() + dz.bytes() + dsum.bytes() + d_act.bytes() +
              d_gate.bytes() + dx.bytes();
  for (const auto* list : {&pre, &gate, &act})
    for (const Tensor& t : *list) b += t.bytes();
  return b + (precision == Precision::kBf16 ? bf16.held_bytes() : 0);
}

namespace {

void check_shared(const Tensor& x, const ExpertShards& w, const SharedWorkspace& ws) {
  const int64_t n = w.w1.dim(0), M = w.w1.dim(1), hl = w.w1.dim(2);
  PARM_CHECK(static_cast<int64_t>(ws.pre.size()) == n && x.ndim() == 2 && x.cols() == M &&
                 ws.pre[0].rows() == x.rows() && ws.pre[0].cols() == hl &&
                 w.gated() == is_gated(ws.mlp),
             "shared experts: x {} and weights W1 {} for a workspace of {} experts x {} rows "
             "({} experts)",
             shape_str(x.shape()), shape_str(w.w1.shape()), ws.pre.size(),
             ws.pre.empty() ? 0 : ws.pre[0].rows(), expert_mlp_name(ws.mlp));
}

}  // namespace

void shared_forward(const Tensor& x, const ExpertShards& w, const Tensor& gate_w, bool add_b2,
                    SharedWorkspace& ws, Tensor& out, PhaseTimes* times) {
  check_shared(x, w, ws);
  const int64_t n = w.w1.dim(0), M = w.w1.dim(1), hl = w.w1.dim(2), rows = x.rows();
  PARM_CHECK(out.numel() == rows * M && gate_w.empty() != ws.gated,
             "shared experts: output {} for {} rows; gate weight {} for a {} workspace",
             shape_str(out.shape()), rows, shape_str(gate_w.shape()),
             ws.gated ? "gated" : "ungated");
  PhaseClock clock(times);
  float* p = ws.gated ? ws.sum.data() : out.data();  // the partial sum P
  const bool bf16 = ws.precision == Precision::kBf16;
  if (bf16 && ws.bf16.pack_weights(w.w1.data(), w.w2.data(), w.gated() ? w.w3.data() : nullptr))
    clock.lap("bf16 weight packing");
  for (int64_t s = 0; s < n; ++s) {
    // One FFN over every row, its output added into P (the first overwrites it).
    float* pre = ws.pre[static_cast<size_t>(s)].data();
    float* gate = ws.gate.empty() ? nullptr : ws.gate[static_cast<size_t>(s)].data();
    if (bf16) {
      ws.bf16.fc1_forward(s, rows, RowRuns::contiguous(x.data(), rows, M), pre, &clock);
      if (w.gated()) {
        ws.bf16.gate_forward(s, rows, gate, &clock);
        ws.bf16.swiglu_fc2_forward(s, rows, pre, gate, p, &clock, s > 0);
      } else {
        ws.bf16.bias_gelu_fc2_forward(s, rows, pre, w.b1.data() + s * hl, p, &clock, s > 0);
      }
    } else {
      ffn_forward(rows, M, hl, x.data(), w, s, pre, gate, ws.act[static_cast<size_t>(s)].data(),
                  p, s > 0, clock);
    }
    if (add_b2 && !w.gated()) cpu::add_bias(p, w.b2.data() + s * M, rows, M);
  }
  if (!ws.gated) return;
  // g = sigmoid(x w_sg); out = g P.
  cpu::gemm(false, false, rows, 1, M, x.data(), gate_w.data(), ws.g.data(), false,
            kLayerGemm);
  for (int64_t t = 0; t < rows; ++t) {
    const float gt = 1.0f / (1.0f + std::exp(-ws.g[t]));
    ws.g[t] = gt;
    for (int64_t m = 0; m < M; ++m) out[t * M + m] = gt * p[t * M + m];
  }
  clock.lap("shared gate");
}

void shared_backward(const Tensor& x, const Tensor& dout, const ExpertShards& w,
                     const Tensor& gate_w, SharedWorkspace& ws, ExpertShards& dw,
                     float* dgate_w, Tensor& dx, PhaseTimes* times) {
  check_shared(x, w, ws);
  const int64_t n = w.w1.dim(0), M = w.w1.dim(1), hl = w.w1.dim(2), rows = x.rows();
  PARM_CHECK(dout.numel() == rows * M && dx.numel() == rows * M,
             "shared experts: gradients {} / {} for {} rows of {}", shape_str(dout.shape()),
             shape_str(dx.shape()), rows, M);
  PhaseClock clock(times);
  const float* dp = dout.data();
  if (ws.gated) {
    // dP = g dout; dg_t = <dout_t, P_t>, dz = dg g (1 - g): dw_sg += x^T dz, dx += dz w_sg^T
    // (this rank's part: P is its partial sum).
    float* dz = ws.dz.data();
    for (int64_t t = 0; t < rows; ++t) {
      const float gt = ws.g[t];
      float dg = 0.0f;
      for (int64_t m = 0; m < M; ++m) {
        ws.dsum[t * M + m] = gt * dout[t * M + m];
        dg += dout[t * M + m] * ws.sum[t * M + m];
      }
      dz[t] = dg * gt * (1.0f - gt);
    }
    cpu::gemm(true, false, M, 1, rows, x.data(), dz, dgate_w, true, kLayerGemm);
    cpu::gemm(false, false, rows, M, 1, dz, gate_w.data(), dx.data(), true, kLayerGemm);
    dp = ws.dsum.data();
    clock.lap("shared gate");
  }
  const bool bf16 = ws.precision == Precision::kBf16;
  for (int64_t s = 0; s < n; ++s) {
    const float* pre = ws.pre[static_cast<size_t>(s)].data();
    const float* gate = ws.gate.empty() ? nullptr : ws.gate[static_cast<size_t>(s)].data();
    float* db2 = w.gated() ? nullptr : dw.b2.data() + s * M;
    if (bf16) {  // the routed experts' bf16 steps, dy (= dP) read in place; db2 among them
      ws.bf16.fc2_backward(s, rows, RowRuns::contiguous(dp, rows, M), db2,
                           dw.w2.data() + s * hl * M, ws.d_act.data(), &clock);
      if (w.gated())
        ws.bf16.swiglu_backward_fc1_backward(s, rows, pre, gate, ws.d_act.data(),
                                             ws.d_gate.data(), dw.w1.data() + s * M * hl,
                                             dw.w3.data() + s * M * hl, ws.dx.data(), &clock);
      else
        ws.bf16.gelu_backward_fc1_backward(s, rows, pre, ws.d_act.data(),
                                           dw.b1.data() + s * hl, dw.w1.data() + s * M * hl,
                                           ws.dx.data(), &clock);
    } else {
      if (db2 != nullptr) cpu::bias_backward(dp, db2, rows, M);
      ffn_backward(rows, M, hl, x.data(), dp, w, s, pre, gate,
                   ws.act[static_cast<size_t>(s)].data(), dw, ws.d_act.data(),
                   ws.d_gate.empty() ? nullptr : ws.d_gate.data(), ws.dx.data(), clock);
    }
    for (int64_t i = 0; i < rows * M; ++i) dx[i] += ws.dx[i];
  }
}

}  // namespace parm::moe
