// The shared experts of an MoE layer (docs/spec.md §9): N_s FFNs of the routed experts' kind
// that every token passes through, this rank's shard of H_s (under MP the shard is the MP
// rank's, split like the dense FFN), their partial sum times the shared gate. fp32, CPU.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/moe_ops.h"
#include "moe/phase_times.h"
#include "parm/tensor.h"
#include "shape/expert_mlp.h"

namespace parm::moe {

// The activations of one pass over `rows` tokens, sized once (reserve).
struct SharedWorkspace {
  void reserve(int64_t experts, int64_t rows, int64_t model_dim, int64_t hidden_shard,
               ExpertMlp mlp, bool gate);
  int64_t held_bytes() const;
  ExpertMlp mlp = ExpertMlp::kGelu;
  bool gated = false;                // the shared gate is on
  std::vector<Tensor> pre, gate, act;  // per shared expert (rows, Hl); gate: swiglu
  Tensor sum;     // (rows, M) the partial sum P (gated only: the gate's backward reads it)
  Tensor g;       // (rows) the shared gate sigmoid(x w_sg) (gated)
  Tensor dz;      // (rows) its pre-activation's gradient (gated); g stays for another pass
  Tensor dsum;    // (rows, M) dP (gated)
  Tensor d_act;   // (rows, Hl)
  Tensor d_gate;  // (rows, Hl) swiglu
  Tensor dx;      // (rows, M) one expert's input gradient
};

// out (rows, M) = g * sum_s FFN_s(x) over this rank's shards w (w.w1: (N_s, M, Hl), ...),
// b2_s added when add_b2 (exactly one rank of the MP group), g = sigmoid(x gate_w) (gate_w
// (M); empty: g = 1). Overwrites out. `times` (may be null): "expert products", "bias + GeLU"
// or "SwiGLU", "shared gate".
void shared_forward(const Tensor& x, const ExpertShards& w, const Tensor& gate_w, bool add_b2,
                    SharedWorkspace& ws, Tensor& out, PhaseTimes* times = nullptr);
// dout (rows, M): the gradient of out. Accumulates dw (this shard's dW1, db1, dW2, dW3; db2
// whole: every rank holds the complete dout), dgate_w (M; this shard's part: dg comes from the
// partial sum) and dx (rows, M; this shard's part of the input gradient).
void shared_backward(const Tensor& x, const Tensor& dout, const ExpertShards& w,
                     const Tensor& gate_w, SharedWorkspace& ws, ExpertShards& dw,
                     float* dgate_w, Tensor& dx, PhaseTimes* times = nullptr);

}  // namespace parm::moe
