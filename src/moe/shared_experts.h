// The shared experts of an MoE layer (docs/spec.md §9): N_s FFNs of the routed experts' kind
// that every token passes through, this rank's shard of H_s (under MP the shard is the MP
// rank's, split like the dense FFN), their partial sum times the shared gate. CPU, at fp32
// or with the routed experts' bf16 products (Bf16ExpertProducts: bf16 operands, fp32
// accumulation); the shared gate's (rows, 1) product and sigmoid stay fp32 at either, as the
// router's.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/expert_products.h"
#include "moe/moe_ops.h"
#include "moe/phase_times.h"
#include "parm/device.h"
#include "parm/tensor.h"
#include "shape/expert_mlp.h"

namespace parm::moe {

// The activations of one pass over `rows` tokens, sized once (reserve).
struct SharedWorkspace {
  void reserve(int64_t experts, int64_t rows, int64_t model_dim, int64_t hidden_shard,
               ExpertMlp mlp, bool gate, Precision precision = Precision::kFp32);
  int64_t held_bytes() const;  // bf16's packed operands included
  ExpertMlp mlp = ExpertMlp::kGelu;
  Precision precision = Precision::kFp32;
  bool gated = false;                // the shared gate is on
  // Per shared expert (rows, Hl); gate: swiglu. At bf16 act is empty (kept packed by bf16)
  // and a gelu expert's pre holds gelu'(pre + b1) after the forward pass.
  std::vector<Tensor> pre, gate, act;
  Bf16ExpertProducts bf16;  // reserved at kBf16 only: N_s experts of `rows` rows
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
// or "SwiGLU", "shared gate" (bf16: also "rows in/out" and "bf16 weight packing").
void shared_forward(const Tensor& x, const ExpertShards& w, const Tensor& gate_w, bool add_b2,
                    SharedWorkspace& ws, Tensor& out, PhaseTimes* times = nullptr);
// dout (rows, M): the gradient of out. Accumulates dw (this shard's dW1, db1, dW2, dW3; db2
// whole: every rank holds the complete dout), dgate_w (M; this shard's part: dg comes from the
// partial sum) and dx (rows, M; this shard's part of the input gradient).
void shared_backward(const Tensor& x, const Tensor& dout, const ExpertShards& w,
                     const Tensor& gate_w, SharedWorkspace& ws, ExpertShards& dw,
                     float* dgate_w, Tensor& dx, PhaseTimes* times = nullptr);

}  // namespace parm::moe
