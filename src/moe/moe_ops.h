// The compute steps of the distributed MoE layer (docs/spec.md §2), over parm::Tensor and the CPU
// kernels: gate (softmax, top-k, capacity and GShard slot filling, l_aux statistics),
// dispatch, experts (ESP shards), combine, and their adjoints. The plain-loop oracle in
// moe/reference_moe.h computes the same maths independently.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/activation_pool.h"
#include "moe/expert_products.h"
#include "moe/phase_times.h"
#include "parm/device.h"
#include "parm/tensor.h"
#include "shape/expert_mlp.h"
#include "shape/router.h"

namespace parm::moe {

// Routing of one gate call over `tokens` rows.
// Where a gate call's rows fall among the sequences of the sequence-wise l_aux
// (MoeShape::aux_seq_len): row t of the call is row first + t of the MP group's T, in sequence
// (first + t) / seq_len. seq_len 0: one set of statistics for all the rows.
struct AuxRows {
  int64_t first = 0;
  int64_t seq_len = 0;
  bool is_default() const { return first == 0 && seq_len == 0; }
  // The statistics set of the call's row t.
  int64_t set_of(int64_t t) const { return seq_len == 0 ? 0 : (first + t) / seq_len; }
};

struct GateRouting {
  int64_t tokens = 0;
  int64_t experts = 0;
  int topk = 1;
  int64_t capacity = 0;  // C: slots that may be filled per expert (drops are decided here)
  int64_t slots = 0;     // rows per expert in the dispatch buffer (>= C; S2 pads to Cp)
  std::vector<int32_t> expert;  // (tokens, k) choice j of token t, j = 0 the largest p
  std::vector<float> prob;      // (tokens, k) its probability
  std::vector<float> weight;    // (tokens, k) combine weight (renormalised when k > 1)
  std::vector<int64_t> row;     // (tokens, k) row start(e) + slot of the dispatch buffer;
                                //            -1 when dropped
  std::vector<int64_t> fill;    // (E) slots taken
  // (E) the packed layout (pack_routing): expert e's rows start at first[e], the rows
  // routed to the experts before it; empty: at e * slots.
  std::vector<int64_t> first;
  std::vector<float> lse;       // (tokens) log-sum-exp of the logits (the z-loss)
  std::vector<float> scores;    // (tokens, E) selection scores: probs + router bias, -inf
                                //            out of the chosen groups (biased or limited)
  RouterSpec router;            // the call's router (the backward's weights and scores)
  std::vector<float> logits;    // (tokens, E) sigmoid scores only: the logits (z-loss)
  std::vector<float> score_sum; // (tokens) sigmoid scores only: sum_e s (l_aux's p = s / it)
  AuxRows aux_rows;             // the call's statistics sets
  int64_t aux_sets = 1;         // how many (the stats' 2E blocks)

  // Expert e's first row in the dispatch buffer.
  int64_t start(int64_t e) const {
    return first.empty() ? e * slots : first[static_cast<size_t>(e)];
  }
  // Choice i's slot in its expert (GShard order), -1 when dropped.
  int64_t slot(size_t i) const { return row[i] < 0 ? -1 : row[i] - start(expert[i]); }
};

// Dropless: renumbers the last gate call's rows into the packed layout (shape/packed_rows.h):
// expert e's slots follow the rows routed to experts 0..e-1, so the dispatch buffer (and the
// combine's, which mirrors it) holds the routed rows back to back. Sets routing.first.
void pack_routing(GateRouting& routing);

// logits/probs (rows, E) = softmax(x (rows, M) wg (M, E)); top-k; combine weights; slots
// in GShard order with `capacity`; stats (2E x sets + 1) = for each set [1st-choice counts
// (E), probability sums (E)] of its rows of this call (zeros for a set without any), then the
// sum of the rows' log-sum-exp of the logits squared. The sets: one, or under the
// sequence-wise l_aux (aux_rows.seq_len > 0) the `sets` sequences of the MP group's T.
// Overwrites probs, routing and stats. `times` (may be null) gets the phases
// "gate products", "softmax", "top-k", "slots + statistics".
// bias (E, may be null): DeepSeek-V3's router bias, added to the probabilities for the
// top-k choice only; the combine weights are made of the unbiased probabilities.
// router: the score function, the weights' normalisation and scale, the group limit
// (docs/spec.md §7); probs then holds the scores.
// z_loss false (the router z-loss is off): the log-sum-exps are not computed, their sum in
// stats is 0, and gate_backward must not be given a z-loss gradient.
void gate_forward(const Tensor& x, const Tensor& wg, int topk, int64_t capacity, int64_t slots,
                  Tensor& probs, GateRouting& routing, float* stats, PhaseTimes* times = nullptr,
                  const float* bias = nullptr, const RouterSpec& router = {},
                  const AuxRows& aux_rows = {}, int64_t sets = 1, bool z_loss = true);

// Adjoint of the gate: dweight (rows, k) from the combine, dstats (2E x sets + 1, the
// forward's layout) from l_aux and the z-loss.
// dprobs is scratch (rows, E). Accumulates dwg (M, E) += x^T dlogits and
// dx (rows, M) += dlogits wg^T. `times` (may be null): "top-k + weights backward",
// "softmax backward", "gate products".
void gate_backward(const Tensor& x, const Tensor& wg, const Tensor& probs,
                   const GateRouting& routing, const std::vector<float>& dweight,
                   const float* dstats, Tensor& dprobs, Tensor& dwg, Tensor& dx,
                   PhaseTimes* times = nullptr);

// l_aux = (1 / S) sum_s E * sum_e (count_se / L) (psum_se / L), L = T / S: the mean over the
// S sets (sequences) of docs/spec.md §2.7's l_aux; stats = S x [count (E), psum (E)] (+ the
// z-loss sum). S = 1: §2.7 over the T tokens.
float aux_loss(const float* stats, int64_t experts, int64_t total_tokens, int64_t sets = 1);
// ST-MoE's z-loss = mean over the T tokens of lse^2 = stats[2 E S] / T.
float z_loss(const float* stats, int64_t experts, int64_t total_tokens, int64_t sets = 1);
// dstats (2E x S + 1): no gradient for the counts, dpsum_se = dl_aux * E * count_se / (S L^2),
// and the last dl_z / T. Overwrites.
void aux_loss_backward(const float* stats, int64_t experts, int64_t total_tokens, float dl_aux,
                       float dl_z, float* dstats, int64_t sets = 1);

// buf (E * slots, M), or (at least the routed rows, M) when packed: kept choices' rows hold
// their token's x row, the rest zero. Overwrites.
// Expert e's kept rows are its first routing.fill[e] slots (GShard order), so only the rows
// after them are zeroed; with zero_unrouted false they are left as they are (dropless: only
// routed rows are ever read or sent).
void dispatch_forward(const Tensor& x, const GateRouting& routing, Tensor& buf,
                      bool zero_unrouted = true);
// dx (rows, M) += dbuf rows of the kept choices. Accumulates.
void dispatch_backward(const Tensor& dbuf, const GateRouting& routing, Tensor& dx);

// out (rows, M) = sum over kept choices of weight * buf row. Overwrites.
void combine_forward(const Tensor& buf, const GateRouting& routing, Tensor& out);
// dbuf (E * slots, M) = weight * dout at kept rows, zero elsewhere; dweight (rows, k) =
// <dout_t, buf row> for kept choices, 0 for dropped. Overwrites both (unfilled rows of dbuf
// are zeroed, filled ones written; with zero_unrouted false the unfilled rows are left).
void combine_backward(const Tensor& buf, const Tensor& dout, const GateRouting& routing,
                      Tensor& dbuf, std::vector<float>& dweight, bool zero_unrouted = true);

// The expert shards this rank holds: E_loc experts, each the columns [j*H/n, (j+1)*H/n) of
// W1/b1 (swiglu: of W1 and W3) and rows of W2 (Hl = H/n), and the whole b2. The tensors an
// expert kind does not have are empty ((E_loc, 0)): b1 and b2 under swiglu, w3 under gelu.
struct ExpertShards {
  Tensor w1;  // (E_loc, M, Hl)
  Tensor b1;  // (E_loc, Hl)      gelu
  Tensor w2;  // (E_loc, Hl, M)
  Tensor b2;  // (E_loc, M)       gelu
  Tensor w3;  // (E_loc, M, Hl)   swiglu: the gate projection

  bool gated() const { return !w3.empty(); }
  // The tensors in a fixed order (w1, b1, w2, b2, w3), empty ones included.
  std::vector<Tensor*> all() { return {&w1, &b1, &w2, &b2, &w3}; }
  std::vector<const Tensor*> all() const { return {&w1, &b1, &w2, &b2, &w3}; }
};

// Per expert: its rows gathered out of the exchange layout, and the activations kept for
// the backward pass. Sized once for the most rows an expert can get (reserve); the layer's
// steady state then allocates nothing. At Precision::kBf16 the six products run on bf16
// operands (Bf16ExpertProducts), which packs x and dy straight from the exchange layout and
// keeps x and act packed for the backward pass: `in`, `act` and `d_out` are then empty; pre
// stays fp32 and holds gelu'(pre + b1) after the forward GeLU step. Gated (swiglu, at either
// precision): `gate` holds x W3 beside pre (pre then keeps x W1), and d_gate its gradient.
//
// Packed (max_total_rows > 0, dropless): in, pre and act are one pool each, of
// max_total_rows rows, the bound on the rows all local experts get together in one pass;
// expert e's rows start at row first[e] = rows[0] + ... + rows[e - 1] of each pool. Under
// a capacity factor every expert has its own max_rows rows, as the bound on the total is
// then E_loc x max_rows anyway.
struct ExpertWorkspace {
  // pool (--recompute moe-act; null: none): in, pre, act and gate are then views of the
  // pool's rows (shared with every other layer that uses it), bound at the first pass
  // (bind()), and experts_backward expects them recomputed (moe::experts_forward again on the
  // same input) before it runs.
  void reserve(int64_t experts, int64_t max_rows, int64_t model_dim, int64_t hidden,
               Precision precision = Precision::kFp32, int64_t max_total_rows = 0,
               ExpertMlp mlp = ExpertMlp::kGelu, ActivationPool* pool = nullptr);
  // Points in, pre, act and gate at the pool's rows in its current lane (a no-op without a
  // pool or where they already point there).
  void bind();
  // Expert e's rows in the pools (its first rows[e] rows are used).
  float* in_rows(int64_t e);
  float* pre_rows(int64_t e);
  float* act_rows(int64_t e);
  float* gate_rows(int64_t e);  // swiglu
  // Checks that rows n for expert e fit (packed: after experts 0..e-1) and places them.
  void place(int64_t e, int64_t n);
  int64_t held_bytes() const;  // in, pre, act and the scratch below (not bf16's buffers)
  Precision precision = Precision::kFp32;
  ExpertMlp mlp = ExpertMlp::kGelu;
  Bf16ExpertProducts bf16;    // reserved at kBf16 only
  bool packed = false;
  int64_t max_rows = 0;       // the most rows one expert can get
  int64_t total_rows = 0;     // rows the pools hold per expert (unpacked) or together
  std::vector<int64_t> rows;  // (E_loc) filled rows of each expert in the last forward
  std::vector<int64_t> first; // (E_loc) packed: expert e's first row in the pools
  // Per expert (unpacked) or one pool (packed) of total_rows rows; read through in_rows()...
  std::vector<Tensor> in;     // (total_rows, M) the experts' filled rows
  std::vector<Tensor> pre;    // (total_rows, Hl) x W1 (b1 is added on the fly)
  std::vector<Tensor> act;    // (total_rows, Hl) gelu(pre) (swiglu: silu(pre) * gate)
  std::vector<Tensor> gate;   // (total_rows, Hl) swiglu: x W3
  Tensor out_rows;            // (max_rows, M) scratch
  Tensor d_out;               // (max_rows, M) scratch: an expert's output gradient rows (fp32)
  Tensor d_act;               // (max_rows, Hl) scratch
  Tensor d_gate;              // (max_rows, Hl) scratch, swiglu
  ActivationPool* pool = nullptr;  // reserve's
  int bound_lane = -1;             // the pool's lane bind() pointed the lists at (-1: none)
  int64_t model_dim = 0, hidden = 0;
};

// One FFN (expert or shared expert e of w, fp32) over n contiguous rows x (n, M): pre = x W1
// (and gate = x W3 for swiglu), act = gelu(pre + b1) or silu(pre) * gate, out (n, M) = act W2,
// added into out when `accumulate`; no b2. pre, gate, act (n, Hl) are kept for ffn_backward
// (gate null for gelu). The clock laps "expert products", "bias + GeLU" or "SwiGLU".
void ffn_forward(int64_t n, int64_t model_dim, int64_t hidden, const float* x,
                 const ExpertShards& w, int64_t e, float* pre, float* gate, float* act,
                 float* out, bool accumulate, PhaseClock& clock);
// Its adjoint for dy (n, M): accumulates dW1, dW2 (db1 for gelu, dW3 for swiglu) of FFN e into
// dw, overwrites dx (n, M); dact and dgate (n, Hl) are scratch (dgate null for gelu). No db2.
// Laps "expert products", "GeLU + bias backward" or "SwiGLU backward".
void ffn_backward(int64_t n, int64_t model_dim, int64_t hidden, const float* x, const float* dy,
                  const ExpertShards& w, int64_t e, const float* pre, const float* gate,
                  const float* act, ExpertShards& dw, float* dact, float* dgate, float* dx,
                  PhaseClock& clock);

// The exchange layout: in/out are (blocks, E_loc, slots, M); expert e's rows in block b are
// the first fills[b * E_loc + e] of the `slots` rows at [b, e] (the rest are empty slots and
// are not computed). With `first` (dropless, packed): segment [b, e] starts at row
// first[b * E_loc + e] instead (shape/packed_rows.h), and in/out hold at least the routed
// rows. out = gelu(x W1 + b1) W2 (+ b2 when add_b2: exactly one shard of an ESP group adds it,
// so that the sum over the group holds it once; w.gated(): (silu(x W1) * (x W3)) W2, no b2) at
// filled rows, zero at empty ones. Overwrites out. `times` (may be null): "rows in/out",
// "expert products", "bias + GeLU" (swiglu: "SwiGLU"), and at bf16 "bf16 weight packing" in a
// pass that packs W1 and W2 (at either precision "expert products" is the GEMMs alone; at bf16
// packing x is "rows in/out" and packing act "bias + GeLU").
void experts_forward(const Tensor& in, const ExpertShards& w, int64_t blocks, int64_t slots,
                     const int32_t* fills, bool add_b2, ExpertWorkspace& ws, Tensor& out,
                     PhaseTimes* times = nullptr, const int64_t* first = nullptr);
// dout: gradient of the summed expert output, same layout; `fills` as in the forward pass
// (rows of empty slots carry no gradient). Accumulates dw (dW1, db1, dW2 from this shard;
// db2 whole, from dout: every ESP rank holds the complete dout of its rows). Overwrites din
// (this shard's part of the input gradient; zero at empty slots). `times`: "rows in/out",
// "expert products", "GeLU + bias backward" (swiglu: "SwiGLU backward").
void experts_backward(const Tensor& dout, const ExpertShards& w, int64_t blocks, int64_t slots,
                      const int32_t* fills, ExpertWorkspace& ws, ExpertShards& dw, Tensor& din,
                      PhaseTimes* times = nullptr, const int64_t* first = nullptr);

}  // namespace parm::moe
