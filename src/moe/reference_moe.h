// The single-process MoE layer of docs/spec.md §2: the oracle every distributed schedule is
// compared against. Plain loops over std::vector<S> (S = float or double; both are
// instantiated), no optimized kernels, one function per step of the spec, so that it can
// be read as the spec. It is not fast: it is meant for tests and small golden runs.
//
// Layout: every tensor is row-major in a std::vector<S>; the shape comment beside it is
// (rows, ..., cols). Functions that fill an output vector resize it; each says whether it
// overwrites or accumulates (+=).
//
// Slices (`num_slices`): the oracle for schedule S1. The T tokens are cut into num_slices
// contiguous equal slices (slice s = tokens [s*T/n, (s+1)*T/n)); top-k, capacity (from
// the slice's token count), slot filling and drops happen per slice, each slice with its
// own [E, C, M] dispatch buffer; l_aux is formed from the statistics summed over all
// slices, divided by the total T, which is what S1 computes after its all-reduce.
// num_slices = 1 is exactly docs/spec.md §2.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shape/shape.h"
#include "parm/tensor.h"

namespace parm::ref {

// ---- Parameters ------------------------------------------------------------------------

template <typename S>
struct MoeParams {
  std::vector<S> wg;  // (M, E)    gate, no bias
  std::vector<S> w1;  // (E, M, H)
  std::vector<S> b1;  // (E, H)     gelu only (swiglu: empty)
  std::vector<S> w2;  // (E, H, M)
  std::vector<S> b2;  // (E, M)     gelu only (swiglu: empty)
  std::vector<S> w3;  // (E, M, H)  swiglu only (gelu: empty): the gate projection
  // Shared experts (docs/spec.md §9; empty without): N_s FFNs of the routed kind, width H_s.
  std::vector<S> sw1;  // (N_s, M, H_s)
  std::vector<S> sb1;  // (N_s, H_s)     gelu
  std::vector<S> sw2;  // (N_s, H_s, M)
  std::vector<S> sb2;  // (N_s, M)       gelu
  std::vector<S> sw3;  // (N_s, M, H_s)  swiglu
  std::vector<S> swg;  // (M)            the shared gate (shape.shared_gate)

  // Every tensor by name, in a fixed order (wg, w1, b1, w2, b2, w3, sw1, sb1, sw2, sb2, sw3,
  // swg), empty ones included.
  std::vector<std::pair<const char*, std::vector<S>*>> named() {
    return {{"wg", &wg},   {"w1", &w1},   {"b1", &b1},   {"w2", &w2},
            {"b2", &b2},   {"w3", &w3},   {"sw1", &sw1}, {"sb1", &sb1},
            {"sw2", &sw2}, {"sb2", &sb2}, {"sw3", &sw3}, {"swg", &swg}};
  }
  std::vector<std::pair<const char*, const std::vector<S>*>> named() const {
    auto all = const_cast<MoeParams*>(this)->named();
    return {all.begin(), all.end()};
  }
  // All zeros with the sizes of `shape` (also the layout of the gradients).
  static MoeParams zeros(const MoeShape& shape);
  // Throws parm::Error naming the tensor when a size does not match `shape`.
  void check(const MoeShape& shape) const;
};

// The whole shape of the tensor of MoeParams named `name` (MoeParams::named()) for `shape`.
Shape param_shape(const MoeShape& shape, const std::string& name);

// Streams of parm::Rng(seed, stream) used by init_params / init_input. Element i of each
// whole (unsharded) row-major tensor is normal draw i of its stream; shards are sliced
// from the whole tensors, so every rank sees the same values.
inline constexpr uint64_t kStreamWg = 1;     // wg ~ N(0, 1/M)
inline constexpr uint64_t kStreamW1 = 2;     // w1 ~ N(0, 1/M)
inline constexpr uint64_t kStreamB1 = 3;     // b1 ~ N(0, 0.1^2)  (small, nonzero: bias bugs show)
inline constexpr uint64_t kStreamW2 = 4;     // w2 ~ N(0, 1/H)
inline constexpr uint64_t kStreamB2 = 5;     // b2 ~ N(0, 0.1^2)
inline constexpr uint64_t kStreamInput = 6;  // x  ~ N(0, 1)
inline constexpr uint64_t kStreamW3 = 7;     // w3 ~ N(0, 1/M)  (swiglu)
inline constexpr uint64_t kStreamSharedW1 = 8;   // sw1 ~ N(0, 1/M)
inline constexpr uint64_t kStreamSharedB1 = 9;   // sb1 ~ N(0, 0.1^2)
inline constexpr uint64_t kStreamSharedW2 = 10;  // sw2 ~ N(0, 1/H_s)
inline constexpr uint64_t kStreamSharedB2 = 11;  // sb2 ~ N(0, 0.1^2)
inline constexpr uint64_t kStreamSharedW3 = 12;  // sw3 ~ N(0, 1/M)
inline constexpr uint64_t kStreamSharedGate = 13;  // swg ~ N(0, 1/M)
inline constexpr float kInitBiasStd = 0.1f;

// Deterministic parameters / input. The values are drawn and scaled in float and then
// converted, so MoeParams<float> and MoeParams<double> hold the same numbers.
template <typename S>
MoeParams<S> init_params(const MoeShape& shape, uint64_t seed);
template <typename S>
std::vector<S> init_input(const MoeShape& shape, uint64_t seed);  // (T, M)

// ---- Routing (docs/spec.md §2 items 2-3) -------------------------------------------------------

template <typename S>
struct Routing {
  int64_t tokens = 0;    // T
  int64_t experts = 0;   // E
  int topk = 1;          // k
  int num_slices = 1;    // gate calls; see the top of this file
  int64_t capacity = 0;  // C per expert per slice, from the slice's token count T / num_slices
  std::vector<int32_t> expert;  // (T, k) choice j of token t; j = 0 has the largest p
  std::vector<S> prob;          // (T, k) p[t, expert] as the gate gave it
  std::vector<S> weight;        // (T, k) combine weight: prob / (sum of the token's k probs)
                                //        when k > 1, prob when k == 1; set for dropped
                                //        choices too (the combine does not use those)
  std::vector<int64_t> slot;    // (T, k) row of the expert's buffer of the token's slice,
                                //        -1 when the choice was dropped
  std::vector<int64_t> fill;    // (num_slices, E) slots taken per expert in each slice
  RouterSpec router;            // the shape's: the weights' rule, l_aux's p under sigmoid

  int64_t slice_tokens() const { return tokens / num_slices; }
  int slice_of(int64_t t) const { return static_cast<int>(t / slice_tokens()); }
  bool kept(int64_t t, int j) const { return slot[t * topk + j] >= 0; }
  int64_t num_dropped() const;
};

// True when both route the same tokens to the same experts and slots (sizes, C, expert,
// slot, fill); the floating-point fields are not compared, so A and B may differ (an fp32
// run against the fp64 oracle).
template <typename A, typename B>
bool same_assignment(const Routing<A>& a, const Routing<B>& b) {
  return a.tokens == b.tokens && a.experts == b.experts && a.topk == b.topk &&
         a.num_slices == b.num_slices && a.capacity == b.capacity && a.expert == b.expert &&
         a.slot == b.slot && a.fill == b.fill;
}

// Top-k (ties to the lower expert index; under shape.router's group limit only over the
// experts of the K_g best groups, docs/spec.md §7), combine weights (renormalised when k > 1
// and the router's top-k normalisation is on, before any drop; times the route scale),
// capacity and GShard slot filling (all 1st choices in token order, then all 2nd choices,
// ...) per slice. probs (T, E): the scores. router_bias (E, may be null): added to them for
// the choice (groups and top-k) only (DeepSeek-V3).
template <typename S>
Routing<S> route(const MoeShape& shape, const std::vector<S>& probs, int num_slices = 1,
                 const std::vector<S>* router_bias = nullptr);

// ---- The layer -------------------------------------------------------------------------

// The l_aux statistics: the 2E numbers S1 all-reduces over `mp`.
template <typename S>
struct AuxStats {
  std::vector<S> first_count;  // (E) tokens whose 1st choice is e (counted before drops)
  std::vector<S> prob_sum;     // (E) sum over tokens of p[t, e] (sigmoid: s / sum_e s)
};

// One expert's activations on `rows` tokens, kept for the backward pass.
template <typename S>
struct ExpertActs {
  std::vector<S> pre;   // (rows, hidden) x W1 + b1 (swiglu: x W1)
  std::vector<S> gate;  // (rows, hidden) swiglu: x W3 (gelu: empty)
  std::vector<S> act;   // (rows, hidden) gelu(pre) (swiglu: silu(pre) * gate)
};

// Everything forward computes; backward reads it. Owns all its memory.
template <typename S>
struct MoeForward {
  MoeShape shape;
  int num_slices = 1;
  std::vector<S> x;           // (T, M) copy of the input
  std::vector<S> logits;      // (T, E)
  std::vector<S> probs;       // (T, E)
  Routing<S> routing;
  AuxStats<S> aux;            // summed over the slices
  // The sequence-wise l_aux (shape.aux_seq_len = L > 0): each sequence's statistics, T / L of
  // them; l_aux is the mean of their l_aux (docs/spec.md §7). Empty otherwise.
  std::vector<AuxStats<S>> seq_aux;
  S l_aux = 0;
  std::vector<S> lse;         // (T) log-sum-exp of each token's logits
  S l_z = 0;                  // router z-loss: mean over the T tokens of lse^2
  std::vector<S> dispatched;  // (num_slices, E, C, M) expert inputs; unused slots zero
  std::vector<ExpertActs<S>> acts;  // [s * E + e]: expert e on slice s's C slots
  std::vector<S> expert_out;  // (num_slices, E, C, M) y_e, b2_e included, on every slot
  std::vector<S> out;         // (T, M)
  // Shared experts (docs/spec.md §9): each one's activations, their sum P (T, M), b2 included,
  // and the shared gate g (T; all ones without it); out holds the routed output + g P.
  std::vector<ExpertActs<S>> shared_acts;
  std::vector<S> shared_sum;
  std::vector<S> shared_gate;
};

template <typename S>
struct MoeGrads {
  std::vector<S> dx;     // (T, M)
  MoeParams<S> dparams;  // the shapes of MoeParams
};

// out = fwd.out (T, M) and l_aux = fwd.l_aux for x (T, M).
template <typename S>
MoeForward<S> moe_forward(const MoeShape& shape, const MoeParams<S>& params,
                          const std::vector<S>& x, int num_slices = 1,
                          const std::vector<S>* router_bias = nullptr);

// The exact adjoint of moe_forward for the loss gradient dout (T, M), dl_aux and dl_z.
// Returns fresh gradients (i.e. overwrites; nothing accumulates across calls).
template <typename S>
MoeGrads<S> moe_backward(const MoeParams<S>& params, const MoeForward<S>& fwd,
                         const std::vector<S>& dout, S dl_aux, S dl_z = S(0));

// ---- The steps, one per item of docs/spec.md §2 (moe_forward/backward are made of these) -------

// 1. logits (rows, E) = x (rows, M) wg (M, E); probs (rows, E) = softmax(logits) per row
//    (sigmoid(logits) elementwise under shape.router's sigmoid scores).
//    Overwrites logits and probs.
template <typename S>
void gate_forward(const MoeShape& shape, const std::vector<S>& wg, const std::vector<S>& x,
                  std::vector<S>& logits, std::vector<S>& probs);
//    dlogits = softmax (or, under sigmoid scores, sigmoid) adjoint of dprobs (rows, E),
//    plus dlse_t * p[t, e] when dlse (rows) is given (d lse / d logit = p, the softmax of
//    the logits: probs, or softmax_probs under sigmoid scores); dwg (M, E) += x^T dlogits;
//    dx (rows, M) += dlogits wg^T. Accumulates dx and dwg.
template <typename S>
void gate_backward(const MoeShape& shape, const std::vector<S>& wg, const std::vector<S>& x,
                   const std::vector<S>& probs, const std::vector<S>& dprobs,
                   std::vector<S>& dx, std::vector<S>& dwg, const std::vector<S>* dlse = nullptr,
                   const std::vector<S>* softmax_probs = nullptr);
//    lse (rows) = log-sum-exp of each row of logits (rows, E). Overwrites.
template <typename S>
void row_logsumexp(int64_t experts, const std::vector<S>& logits, std::vector<S>& lse);

// 2. Adjoint of the combine weights: dprobs (T, E) += d weight / d p applied to
//    dweight (T, k). With k > 1 and the router's top-k normalisation on, the gradient flows
//    through the normaliser, so every one of the token's k probabilities (dropped choices
//    too) gets gradient; else dp = scale x dweight (docs/spec.md §7). Accumulates.
template <typename S>
void weight_backward(const Routing<S>& routing, const std::vector<S>& dweight,
                     std::vector<S>& dprobs);

// 4. dispatched (num_slices, E, C, M): the slot of each kept choice holds x_t (T, M);
//    unused slots are zero. Overwrites.
template <typename S>
void dispatch_forward(const MoeShape& shape, const Routing<S>& routing, const std::vector<S>& x,
                      std::vector<S>& dispatched);
//    dx (T, M) += the rows of ddispatched at the token's kept slots. Accumulates.
template <typename S>
void dispatch_backward(const MoeShape& shape, const Routing<S>& routing,
                       const std::vector<S>& ddispatched, std::vector<S>& dx);

// 6. out_t (T, M) = sum over kept choices of weight * expert_out[slice, e, slot].
//    Overwrites.
template <typename S>
void combine_forward(const MoeShape& shape, const Routing<S>& routing,
                     const std::vector<S>& expert_out, std::vector<S>& out);
//    dexpert_out (num_slices, E, C, M) = weight * dout_t at each kept slot, zero elsewhere;
//    dweight (T, k) = <dout_t, expert_out row> for kept choices, 0 for dropped ones.
//    Overwrites both.
template <typename S>
void combine_backward(const MoeShape& shape, const Routing<S>& routing,
                      const std::vector<S>& expert_out, const std::vector<S>& dout,
                      std::vector<S>& dexpert_out, std::vector<S>& dweight);

// 7. Statistics of tokens [begin, end) of the routing / probs (T, E).
template <typename S>
AuxStats<S> aux_stats(const Routing<S>& routing, const std::vector<S>& probs, int64_t begin,
                      int64_t end);
//    l_aux = E * sum_e (first_count_e / T) * (prob_sum_e / T), with T the tokens the
//    stats were summed over.
template <typename S>
S aux_loss(const AuxStats<S>& stats, int64_t tokens);
//    dprobs (rows, E) += dl_aux * E * first_count_e / T^2 for every row: no gradient
//    through the counts. `stats` and `tokens` are the global ones (S1: after the
//    all-reduce), dprobs may be any slice. Accumulates.
template <typename S>
void aux_loss_backward(const AuxStats<S>& stats, int64_t tokens, S dl_aux,
                       std::vector<S>& dprobs);

// ---- 5. Experts, whole or ESP-sharded --------------------------------------------------

// The FFN weights of expert e, or of its shard j of n: columns [j*H/n, (j+1)*H/n) of W1_e
// and b1_e (swiglu: of W1_e and W3_e) and the same rows of W2_e. b2_e is not part of a
// shard: every ESP rank holds all of it and adds it once, after the partial outputs are
// summed.
template <typename S>
struct ExpertWeights {
  ExpertMlp mlp = ExpertMlp::kGelu;
  int64_t model_dim = 0;  // M
  int64_t hidden = 0;     // H / n
  std::vector<S> w1;      // (M, hidden)
  std::vector<S> b1;      // (hidden)     gelu only
  std::vector<S> w2;      // (hidden, M)
  std::vector<S> w3;      // (M, hidden)  swiglu only
};

// Copies shard j of n of expert e out of the whole parameters (or gradients). n = 1 is
// the whole expert. Throws InvalidConfig unless 0 <= j < n and H % n == 0.
template <typename S>
ExpertWeights<S> slice_expert(const MoeShape& shape, const MoeParams<S>& whole, int64_t e,
                              int shard, int num_shards);
// The inverse: writes the shard into its place in `whole` (overwrites that part only).
template <typename S>
void unslice_expert(const MoeShape& shape, const ExpertWeights<S>& part, int64_t e, int shard,
                    int num_shards, MoeParams<S>& whole);
// The same for shared expert s (docs/spec.md §9): columns of sw1 (sw3) and sb1, rows of sw2,
// shard j of n of H_s (under MP, n = N_MP). Throws InvalidConfig unless H_s % n == 0.
template <typename S>
ExpertWeights<S> slice_shared(const MoeShape& shape, const MoeParams<S>& whole, int64_t s,
                              int shard, int num_shards);
template <typename S>
void unslice_shared(const MoeShape& shape, const ExpertWeights<S>& part, int64_t s, int shard,
                    int num_shards, MoeParams<S>& whole);

// partial (rows, M) = gelu(x W1 + b1) W2 (swiglu: (silu(x W1) * (x W3)) W2) for x (rows, M),
// without b2; acts are kept for backward. Summed over the n shards and plus b2 (gelu) it is
// the expert's output. Overwrites.
template <typename S>
void expert_shard_forward(const ExpertWeights<S>& w, const std::vector<S>& x,
                          ExpertActs<S>& acts, std::vector<S>& partial);
// dy (rows, M) is the gradient of the summed expert output. Writes dx (rows, M), this
// shard's part of the input gradient (the n shards' dx sum to the whole expert's), and
// grad = the shard's dW1, db1, dW2 (swiglu: dW1, dW3, dW2). Overwrites dx and grad.
template <typename S>
void expert_shard_backward(const ExpertWeights<S>& w, const std::vector<S>& x,
                           const ExpertActs<S>& acts, const std::vector<S>& dy,
                           std::vector<S>& dx, ExpertWeights<S>& grad);
// y (rows, M) += b2_e (gelu; swiglu has no b2: y is left). Accumulates into y.
template <typename S>
void add_expert_bias(const MoeShape& shape, const MoeParams<S>& params, int64_t e,
                     std::vector<S>& y);
// db2 (M) = column sums of dy (rows, M): every ESP rank forms the whole db2_e from the
// output gradient it holds. Overwrites.
template <typename S>
void expert_bias_backward(int64_t model_dim, const std::vector<S>& dy, std::vector<S>& db2);

// ---- Conversions -----------------------------------------------------------------------

// fp32 copies for comparing with parm::Tensor results (numel must equal v.size()).
template <typename S>
Tensor to_tensor(const std::vector<S>& v, const Shape& shape);
template <typename S>
std::vector<S> from_tensor(const Tensor& t);

}  // namespace parm::ref
