// The reference MoE layer (see reference_moe.h). Every loop is written out so that each
// line can be checked against docs/spec.md §2; no kernel from src/kernels is used.
#include "moe/reference_moe.h"

#include <algorithm>
#include <cmath>

#include "parm/error.h"
#include "parm/rng.h"

namespace parm::ref {
namespace {

using Size = std::vector<int>::size_type;

// GeLU, tanh form (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <typename S>
S gelu(S x) {
  const S c = static_cast<S>(0.79788456080286535588);  // sqrt(2/pi)
  const S a = static_cast<S>(0.044715);
  const S u = c * (x + a * x * x * x);
  return static_cast<S>(0.5) * x * (static_cast<S>(1) + std::tanh(u));
}

// d gelu / dx.
template <typename S>
S gelu_grad(S x) {
  const S c = static_cast<S>(0.79788456080286535588);
  const S a = static_cast<S>(0.044715);
  const S u = c * (x + a * x * x * x);
  const S th = std::tanh(u);
  const S du = c * (static_cast<S>(1) + static_cast<S>(3) * a * x * x);
  return static_cast<S>(0.5) * (static_cast<S>(1) + th) +
         static_cast<S>(0.5) * x * (static_cast<S>(1) - th * th) * du;
}

// SiLU (swish): x sigmoid(x), and its derivative sigmoid(x) (1 + x (1 - sigmoid(x))).
template <typename S>
S sigmoid(S x) {
  return static_cast<S>(1) / (static_cast<S>(1) + std::exp(-x));
}
template <typename S>
S silu(S x) {
  return x * sigmoid(x);
}
template <typename S>
S silu_grad(S x) {
  const S s = sigmoid(x);
  return s * (static_cast<S>(1) + x * (static_cast<S>(1) - s));
}

void check_size(const char* what, size_t got, int64_t want) {
  PARM_CHECK(static_cast<int64_t>(got) == want, "{} has {} elements, expected {}", what, got,
             want);
}

template <typename S>
std::vector<S> draw_normal(int64_t n, uint64_t seed, uint64_t stream, float stddev) {
  Rng rng(seed, stream);
  std::vector<S> v(static_cast<Size>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float value = stddev * rng.normal();  // in float, so fp32 and fp64 agree
    v[i] = static_cast<S>(value);
  }
  return v;
}

// Offset of row `slot` of expert e in slice s of a (num_slices, E, C, M) buffer.
int64_t buffer_row(const MoeShape& shape, int64_t capacity, int s, int64_t e, int64_t slot) {
  return ((s * shape.experts + e) * capacity + slot) * shape.model_dim;
}

void check_shard(const MoeShape& shape, int64_t e, int shard, int num_shards) {
  PARM_CONFIG_CHECK(e >= 0 && e < shape.experts, "expert {} out of range [0, {})", e,
                    shape.experts);
  PARM_CONFIG_CHECK(num_shards >= 1 && shard >= 0 && shard < num_shards,
                    "expert shard {} of {} is not valid (need 0 <= shard < num_shards)", shard,
                    num_shards);
  PARM_CONFIG_CHECK(shape.hidden % num_shards == 0,
                    "expert hidden dim H = {} is not divisible by the {} ESP shards; choose "
                    "N_ESP dividing H",
                    shape.hidden, num_shards);
}

}  // namespace

// ---- Shape and parameters ----------------------------------------------------------------

template <typename S>
MoeParams<S> MoeParams<S>::zeros(const MoeShape& shape) {
  const int64_t M = shape.model_dim, H = shape.hidden, E = shape.experts;
  MoeParams<S> p;
  p.wg.assign(static_cast<Size>(M * E), S(0));
  const bool biases = has_expert_biases(shape.expert_mlp);
  p.w1.assign(static_cast<Size>(E * M * H), S(0));
  p.b1.assign(static_cast<Size>(biases ? E * H : 0), S(0));
  p.w2.assign(static_cast<Size>(E * H * M), S(0));
  p.b2.assign(static_cast<Size>(biases ? E * M : 0), S(0));
  p.w3.assign(static_cast<Size>(is_gated(shape.expert_mlp) ? E * M * H : 0), S(0));
  const int64_t Ns = shape.shared_experts, Hs = shape.shared_hidden;
  p.sw1.assign(static_cast<Size>(Ns * M * Hs), S(0));
  p.sb1.assign(static_cast<Size>(biases ? Ns * Hs : 0), S(0));
  p.sw2.assign(static_cast<Size>(Ns * Hs * M), S(0));
  p.sb2.assign(static_cast<Size>(biases ? Ns * M : 0), S(0));
  p.sw3.assign(static_cast<Size>(is_gated(shape.expert_mlp) ? Ns * M * Hs : 0), S(0));
  p.swg.assign(static_cast<Size>(shape.shared_gate ? M : 0), S(0));
  return p;
}

template <typename S>
void MoeParams<S>::check(const MoeShape& shape) const {
  const int64_t M = shape.model_dim, H = shape.hidden, E = shape.experts;
  check_size("wg (M, E)", wg.size(), M * E);
  const bool biases = has_expert_biases(shape.expert_mlp);
  check_size("w1 (E, M, H)", w1.size(), E * M * H);
  check_size(biases ? "b1 (E, H)" : "b1 (none: swiglu)", b1.size(), biases ? E * H : 0);
  check_size("w2 (E, H, M)", w2.size(), E * H * M);
  check_size(biases ? "b2 (E, M)" : "b2 (none: swiglu)", b2.size(), biases ? E * M : 0);
  const bool gated = is_gated(shape.expert_mlp);
  check_size(gated ? "w3 (E, M, H)" : "w3 (none: gelu)", w3.size(), gated ? E * M * H : 0);
  const int64_t Ns = shape.shared_experts, Hs = shape.shared_hidden;
  check_size("sw1 (N_s, M, H_s)", sw1.size(), Ns * M * Hs);
  check_size("sb1 (N_s, H_s; gelu)", sb1.size(), biases ? Ns * Hs : 0);
  check_size("sw2 (N_s, H_s, M)", sw2.size(), Ns * Hs * M);
  check_size("sb2 (N_s, M; gelu)", sb2.size(), biases ? Ns * M : 0);
  check_size("sw3 (N_s, M, H_s; swiglu)", sw3.size(), gated ? Ns * M * Hs : 0);
  check_size("swg (M; shared gate)", swg.size(), shape.shared_gate ? M : 0);
}

template <typename S>
MoeParams<S> init_params(const MoeShape& shape, uint64_t seed) {
  shape.validate();
  const int64_t M = shape.model_dim, H = shape.hidden, E = shape.experts;
  const float std_m = 1.0f / std::sqrt(static_cast<float>(M));
  const float std_h = 1.0f / std::sqrt(static_cast<float>(H));
  MoeParams<S> p;
  p.wg = draw_normal<S>(M * E, seed, kStreamWg, std_m);
  p.w1 = draw_normal<S>(E * M * H, seed, kStreamW1, std_m);
  p.w2 = draw_normal<S>(E * H * M, seed, kStreamW2, std_h);
  if (has_expert_biases(shape.expert_mlp)) {
    p.b1 = draw_normal<S>(E * H, seed, kStreamB1, kInitBiasStd);
    p.b2 = draw_normal<S>(E * M, seed, kStreamB2, kInitBiasStd);
  }
  if (is_gated(shape.expert_mlp)) p.w3 = draw_normal<S>(E * M * H, seed, kStreamW3, std_m);
  const int64_t Ns = shape.shared_experts, Hs = shape.shared_hidden;
  if (Ns > 0) {
    const float std_hs = 1.0f / std::sqrt(static_cast<float>(Hs));
    p.sw1 = draw_normal<S>(Ns * M * Hs, seed, kStreamSharedW1, std_m);
    p.sw2 = draw_normal<S>(Ns * Hs * M, seed, kStreamSharedW2, std_hs);
    if (has_expert_biases(shape.expert_mlp)) {
      p.sb1 = draw_normal<S>(Ns * Hs, seed, kStreamSharedB1, kInitBiasStd);
      p.sb2 = draw_normal<S>(Ns * M, seed, kStreamSharedB2, kInitBiasStd);
    }
    if (is_gated(shape.expert_mlp))
      p.sw3 = draw_normal<S>(Ns * M * Hs, seed, kStreamSharedW3, std_m);
    if (shape.shared_gate) p.swg = draw_normal<S>(M, seed, kStreamSharedGate, std_m);
  }
  return p;
}

template <typename S>
std::vector<S> init_input(const MoeShape& shape, uint64_t seed) {
  shape.validate();
  return draw_normal<S>(shape.tokens * shape.model_dim, seed, kStreamInput, 1.0f);
}

Shape param_shape(const MoeShape& s, const std::string& name) {
  const int64_t n = s.shared_experts, hs = s.shared_hidden;
  if (name == "wg") return {s.model_dim, s.experts};
  if (name == "w1" || name == "w3") return {s.experts, s.model_dim, s.hidden};
  if (name == "b1") return {s.experts, s.hidden};
  if (name == "w2") return {s.experts, s.hidden, s.model_dim};
  if (name == "sw1" || name == "sw3") return {n, s.model_dim, hs};
  if (name == "sb1") return {n, hs};
  if (name == "sw2") return {n, hs, s.model_dim};
  if (name == "sb2") return {n, s.model_dim};
  if (name == "swg") return {s.model_dim};
  PARM_CHECK(name == "b2", "no MoE parameter named {}", name);
  return {s.experts, s.model_dim};
}

// ---- Routing -----------------------------------------------------------------------------

template <typename S>
int64_t Routing<S>::num_dropped() const {
  int64_t n = 0;
  for (int64_t s : slot) n += s < 0 ? 1 : 0;
  return n;
}

template <typename S>
Routing<S> route(const MoeShape& shape, const std::vector<S>& probs, int num_slices,
                 const std::vector<S>* bias) {
  shape.validate(num_slices);
  const int64_t T = shape.tokens, E = shape.experts;
  const int k = shape.topk;
  check_size("probs (T, E)", probs.size(), T * E);
  if (bias) check_size("router bias (E)", bias->size(), E);
  // The choice's score: p, plus the router bias when given (the weights stay p's).
  auto score = [&](const S* p, int64_t e) { return bias ? p[e] + (*bias)[e] : p[e]; };
  const RouterSpec& rs = shape.router;
  const int64_t G = rs.groups, per_group = E / G;

  Routing<S> r;
  r.router = rs;
  r.tokens = T;
  r.experts = E;
  r.topk = k;
  r.num_slices = num_slices;
  r.capacity = capacity(k, shape.capacity_factor, T / num_slices, E);
  r.expert.assign(static_cast<Size>(T * k), -1);
  r.prob.assign(static_cast<Size>(T * k), S(0));
  r.weight.assign(static_cast<Size>(T * k), S(0));
  r.slot.assign(static_cast<Size>(T * k), -1);
  r.fill.assign(static_cast<Size>(num_slices * E), 0);

  // Top-k: choice j is the largest p among the experts not chosen yet. Scanning upward
  // with a strict '>' keeps the lower index on a tie.
  for (int64_t t = 0; t < T; ++t) {
    const S* p = &probs[t * E];
    // Group-limited selection (docs/spec.md §7): a group's score is the sum of its two
    // largest scores (its one when E / G = 1); the K_g best groups (ties to the lower
    // group) are open, the experts of the others are out of the top-k.
    std::vector<bool> open(static_cast<Size>(E), true);
    if (G > 1) {
      std::vector<S> gscore(static_cast<Size>(G));
      for (int64_t g = 0; g < G; ++g) {
        S a = S(0), b = S(0);  // largest, second largest
        bool have_a = false, have_b = false;
        for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
          const S v = score(p, e);
          if (!have_a || v > a) {
            b = a;
            have_b = have_a;
            a = v;
            have_a = true;
          } else if (!have_b || v > b) {
            b = v;
            have_b = true;
          }
        }
        gscore[g] = per_group == 1 ? a : a + b;
      }
      std::vector<bool> kept_group(static_cast<Size>(G), false);
      for (int i = 0; i < rs.group_topk; ++i) {
        int64_t best = -1;
        for (int64_t g = 0; g < G; ++g)
          if (!kept_group[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
        kept_group[best] = true;
      }
      for (int64_t e = 0; e < E; ++e) open[e] = kept_group[e / per_group];
    }
    std::vector<bool> taken(static_cast<Size>(E), false);
    for (int j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        if (taken[e] || !open[e]) continue;
        if (best < 0 || score(p, e) > score(p, best)) best = e;
      }
      taken[best] = true;
      r.expert[t * k + j] = static_cast<int32_t>(best);
      r.prob[t * k + j] = p[best];
    }
    // Combine weights, renormalised over all k choices before any drop (k > 1 and the
    // router's top-k normalisation on), times the route scale.
    S denom = S(0);
    for (int j = 0; j < k; ++j) denom += r.prob[t * k + j];
    const bool norm = k > 1 && rs.topk_norm;
    for (int j = 0; j < k; ++j)
      r.weight[t * k + j] =
          static_cast<S>(rs.scale) * (norm ? r.prob[t * k + j] / denom : r.prob[t * k + j]);
  }

  // GShard priority fill, per slice: all 1st choices in token order, then all 2nd
  // choices, ...; a choice whose expert already has C tokens is dropped.
  const int64_t Ts = T / num_slices;
  for (int s = 0; s < num_slices; ++s) {
    int64_t* fill = &r.fill[s * E];
    for (int j = 0; j < k; ++j) {
      for (int64_t t = s * Ts; t < (s + 1) * Ts; ++t) {
        const int32_t e = r.expert[t * k + j];
        if (fill[e] < r.capacity) r.slot[t * k + j] = fill[e]++;
      }
    }
  }
  return r;
}

// ---- 1. Gate -----------------------------------------------------------------------------

template <typename S>
void gate_forward(const MoeShape& shape, const std::vector<S>& wg, const std::vector<S>& x,
                  std::vector<S>& logits, std::vector<S>& probs) {
  const int64_t M = shape.model_dim, E = shape.experts;
  check_size("wg (M, E)", wg.size(), M * E);
  PARM_CHECK(static_cast<int64_t>(x.size()) % M == 0, "x has {} elements, not rows of M = {}",
             x.size(), M);
  const int64_t rows = static_cast<int64_t>(x.size()) / M;
  logits.assign(static_cast<Size>(rows * E), S(0));
  probs.assign(static_cast<Size>(rows * E), S(0));
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      S acc = S(0);
      for (int64_t m = 0; m < M; ++m) acc += x[t * M + m] * wg[m * E + e];
      logits[t * E + e] = acc;
    }
    if (shape.router.score == RouterScore::kSigmoid) {
      for (int64_t e = 0; e < E; ++e)
        probs[t * E + e] = S(1) / (S(1) + std::exp(-logits[t * E + e]));
      continue;
    }
    // Softmax, shifted by the row max so exp cannot overflow.
    S mx = logits[t * E];
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, logits[t * E + e]);
    S sum = S(0);
    for (int64_t e = 0; e < E; ++e) {
      probs[t * E + e] = std::exp(logits[t * E + e] - mx);
      sum += probs[t * E + e];
    }
    for (int64_t e = 0; e < E; ++e) probs[t * E + e] /= sum;
  }
}

template <typename S>
void row_logsumexp(int64_t experts, const std::vector<S>& logits, std::vector<S>& lse) {
  const int64_t E = experts, rows = static_cast<int64_t>(logits.size()) / E;
  lse.assign(static_cast<Size>(rows), S(0));
  for (int64_t t = 0; t < rows; ++t) {
    S mx = logits[t * E];
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, logits[t * E + e]);
    S sum = S(0);
    for (int64_t e = 0; e < E; ++e) sum += std::exp(logits[t * E + e] - mx);
    lse[t] = mx + std::log(sum);
  }
}

template <typename S>
void gate_backward(const MoeShape& shape, const std::vector<S>& wg, const std::vector<S>& x,
                   const std::vector<S>& probs, const std::vector<S>& dprobs,
                   std::vector<S>& dx, std::vector<S>& dwg, const std::vector<S>* dlse,
                   const std::vector<S>* softmax_probs) {
  const int64_t M = shape.model_dim, E = shape.experts;
  const int64_t rows = static_cast<int64_t>(x.size()) / M;
  check_size("probs (rows, E)", probs.size(), rows * E);
  check_size("dprobs (rows, E)", dprobs.size(), rows * E);
  check_size("dx (rows, M)", dx.size(), rows * M);
  check_size("dwg (M, E)", dwg.size(), M * E);
  std::vector<S> dlogits(static_cast<Size>(E));
  for (int64_t t = 0; t < rows; ++t) {
    if (shape.router.score == RouterScore::kSigmoid) {
      // Sigmoid adjoint: dlogit_e = ds_e s_e (1 - s_e).
      for (int64_t e = 0; e < E; ++e) {
        const S sv = probs[t * E + e];
        dlogits[e] = dprobs[t * E + e] * sv * (S(1) - sv);
      }
    } else {
      // Softmax adjoint: dlogit_e = p_e * (dp_e - sum_i dp_i p_i).
      S dot = S(0);
      for (int64_t e = 0; e < E; ++e) dot += dprobs[t * E + e] * probs[t * E + e];
      for (int64_t e = 0; e < E; ++e) dlogits[e] = probs[t * E + e] * (dprobs[t * E + e] - dot);
    }
    if (dlse) {
      const std::vector<S>& sp = softmax_probs ? *softmax_probs : probs;
      for (int64_t e = 0; e < E; ++e) dlogits[e] += (*dlse)[t] * sp[t * E + e];
    }
    for (int64_t m = 0; m < M; ++m) {
      S acc = S(0);
      for (int64_t e = 0; e < E; ++e) {
        dwg[m * E + e] += x[t * M + m] * dlogits[e];
        acc += dlogits[e] * wg[m * E + e];
      }
      dx[t * M + m] += acc;
    }
  }
}

// ---- 2. Combine weights ------------------------------------------------------------------

template <typename S>
void weight_backward(const Routing<S>& r, const std::vector<S>& dweight,
                     std::vector<S>& dprobs) {
  const int64_t T = r.tokens, E = r.experts;
  const int k = r.topk;
  check_size("dweight (T, k)", dweight.size(), T * k);
  check_size("dprobs (T, E)", dprobs.size(), T * E);
  const S scale = static_cast<S>(r.router.scale);
  for (int64_t t = 0; t < T; ++t) {
    if (k == 1 || !r.router.topk_norm) {  // weight = scale p: straight through, scaled
      for (int j = 0; j < k; ++j)
        dprobs[t * E + r.expert[t * k + j]] += scale * dweight[t * k + j];
      continue;
    }
    // w_j = a p_j / Z, Z = sum_i p_i  =>  dp_i = (a dw_i - sum_j dw_j w_j) / Z.
    S denom = S(0), dot = S(0);
    for (int j = 0; j < k; ++j) {
      denom += r.prob[t * k + j];
      dot += dweight[t * k + j] * r.weight[t * k + j];
    }
    for (int j = 0; j < k; ++j)
      dprobs[t * E + r.expert[t * k + j]] += (scale * dweight[t * k + j] - dot) / denom;
  }
}

// ---- 4. Dispatch -------------------------------------------------------------------------

template <typename S>
void dispatch_forward(const MoeShape& shape, const Routing<S>& r, const std::vector<S>& x,
                      std::vector<S>& dispatched) {
  const int64_t T = shape.tokens, M = shape.model_dim, E = shape.experts, C = r.capacity;
  const int k = r.topk;
  check_size("x (T, M)", x.size(), T * M);
  dispatched.assign(static_cast<Size>(r.num_slices * E * C * M), S(0));
  for (int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < k; ++j) {
      if (!r.kept(t, j)) continue;
      const int64_t row = buffer_row(shape, C, r.slice_of(t), r.expert[t * k + j], r.slot[t * k + j]);
      for (int64_t m = 0; m < M; ++m) dispatched[row + m] = x[t * M + m];
    }
  }
}

template <typename S>
void dispatch_backward(const MoeShape& shape, const Routing<S>& r,
                       const std::vector<S>& ddispatched, std::vector<S>& dx) {
  const int64_t T = shape.tokens, M = shape.model_dim, E = shape.experts, C = r.capacity;
  const int k = r.topk;
  check_size("ddispatched (num_slices, E, C, M)", ddispatched.size(), r.num_slices * E * C * M);
  check_size("dx (T, M)", dx.size(), T * M);
  for (int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < k; ++j) {
      if (!r.kept(t, j)) continue;
      const int64_t row = buffer_row(shape, C, r.slice_of(t), r.expert[t * k + j], r.slot[t * k + j]);
      for (int64_t m = 0; m < M; ++m) dx[t * M + m] += ddispatched[row + m];
    }
  }
}

// ---- 6. Combine --------------------------------------------------------------------------

template <typename S>
void combine_forward(const MoeShape& shape, const Routing<S>& r, const std::vector<S>& expert_out,
                     std::vector<S>& out) {
  const int64_t T = shape.tokens, M = shape.model_dim, E = shape.experts, C = r.capacity;
  const int k = r.topk;
  check_size("expert_out (num_slices, E, C, M)", expert_out.size(), r.num_slices * E * C * M);
  out.assign(static_cast<Size>(T * M), S(0));
  for (int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < k; ++j) {
      if (!r.kept(t, j)) continue;  // a dropped choice adds nothing
      const int64_t row = buffer_row(shape, C, r.slice_of(t), r.expert[t * k + j], r.slot[t * k + j]);
      const S w = r.weight[t * k + j];
      for (int64_t m = 0; m < M; ++m) out[t * M + m] += w * expert_out[row + m];
    }
  }
}

template <typename S>
void combine_backward(const MoeShape& shape, const Routing<S>& r,
                      const std::vector<S>& expert_out, const std::vector<S>& dout,
                      std::vector<S>& dexpert_out, std::vector<S>& dweight) {
  const int64_t T = shape.tokens, M = shape.model_dim, E = shape.experts, C = r.capacity;
  const int k = r.topk;
  check_size("expert_out (num_slices, E, C, M)", expert_out.size(), r.num_slices * E * C * M);
  check_size("dout (T, M)", dout.size(), T * M);
  dexpert_out.assign(static_cast<Size>(r.num_slices * E * C * M), S(0));
  dweight.assign(static_cast<Size>(T * k), S(0));
  for (int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < k; ++j) {
      if (!r.kept(t, j)) continue;  // dropped: no gradient to its weight or its expert
      const int64_t row = buffer_row(shape, C, r.slice_of(t), r.expert[t * k + j], r.slot[t * k + j]);
      const S w = r.weight[t * k + j];
      S dot = S(0);
      for (int64_t m = 0; m < M; ++m) {
        dot += dout[t * M + m] * expert_out[row + m];
        dexpert_out[row + m] = w * dout[t * M + m];  // each slot holds exactly one token
      }
      dweight[t * k + j] = dot;
    }
  }
}

// ---- 7. Auxiliary loss -------------------------------------------------------------------

template <typename S>
AuxStats<S> aux_stats(const Routing<S>& r, const std::vector<S>& probs, int64_t begin,
                      int64_t end) {
  const int64_t E = r.experts;
  check_size("probs (T, E)", probs.size(), r.tokens * E);
  PARM_CHECK(0 <= begin && begin <= end && end <= r.tokens, "aux_stats rows [{}, {}) of {}",
             begin, end, r.tokens);
  AuxStats<S> st;
  st.first_count.assign(static_cast<Size>(E), S(0));
  st.prob_sum.assign(static_cast<Size>(E), S(0));
  const bool sigmoid = r.router.score == RouterScore::kSigmoid;
  for (int64_t t = begin; t < end; ++t) {
    st.first_count[r.expert[t * r.topk]] += S(1);  // the 1st choice, kept or not
    // Under sigmoid scores, l_aux's p is the token's scores normalised to sum 1.
    S z = S(1);
    if (sigmoid) {
      z = S(0);
      for (int64_t e = 0; e < E; ++e) z += probs[t * E + e];
    }
    for (int64_t e = 0; e < E; ++e) st.prob_sum[e] += probs[t * E + e] / z;
  }
  return st;
}

template <typename S>
S aux_loss(const AuxStats<S>& st, int64_t tokens) {
  const int64_t E = static_cast<int64_t>(st.first_count.size());
  check_size("prob_sum (E)", st.prob_sum.size(), E);
  PARM_CHECK_GE(tokens, 1);
  const S T = static_cast<S>(tokens);
  S acc = S(0);
  for (int64_t e = 0; e < E; ++e) acc += (st.first_count[e] / T) * (st.prob_sum[e] / T);
  return static_cast<S>(E) * acc;
}

template <typename S>
void aux_loss_backward(const AuxStats<S>& st, int64_t tokens, S dl_aux, std::vector<S>& dprobs) {
  const int64_t E = static_cast<int64_t>(st.first_count.size());
  PARM_CHECK_GE(tokens, 1);
  PARM_CHECK(static_cast<int64_t>(dprobs.size()) % E == 0, "dprobs has {} elements, not rows of E = {}",
             dprobs.size(), E);
  const int64_t rows = static_cast<int64_t>(dprobs.size()) / E;
  const S T = static_cast<S>(tokens);
  // d l_aux / d p[t, e] = E * frac_e * (1 / T), frac_e = first_count_e / T held constant.
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t e = 0; e < E; ++e)
      dprobs[t * E + e] += dl_aux * static_cast<S>(E) * (st.first_count[e] / T) / T;
}

// ---- 5. Experts --------------------------------------------------------------------------

namespace {

// The whole tensors of a set of FFNs (the routed experts, or the shared ones): w1, w3 (n, M,
// H), b1 (n, H), w2 (n, H, M); w3 / b1 empty where the kind has none.
template <typename V>
struct FfnSet {
  V* w1;
  V* b1;
  V* w2;
  V* w3;
  int64_t hidden;
};

template <typename S>
FfnSet<const std::vector<S>> routed_set(const MoeShape& sh, const MoeParams<S>& p) {
  return {&p.w1, &p.b1, &p.w2, &p.w3, sh.hidden};
}
template <typename S>
FfnSet<std::vector<S>> routed_set(const MoeShape& sh, MoeParams<S>& p) {
  return {&p.w1, &p.b1, &p.w2, &p.w3, sh.hidden};
}
template <typename S>
FfnSet<const std::vector<S>> shared_set(const MoeShape& sh, const MoeParams<S>& p) {
  return {&p.sw1, &p.sb1, &p.sw2, &p.sw3, sh.shared_hidden};
}
template <typename S>
FfnSet<std::vector<S>> shared_set(const MoeShape& sh, MoeParams<S>& p) {
  return {&p.sw1, &p.sb1, &p.sw2, &p.sw3, sh.shared_hidden};
}

void check_ffn_shard(int64_t hidden, int shard, int num_shards, const char* what) {
  PARM_CONFIG_CHECK(num_shards >= 1 && shard >= 0 && shard < num_shards,
                    "{} shard {} of {} is not valid (need 0 <= shard < num_shards)", what, shard,
                    num_shards);
  PARM_CONFIG_CHECK(hidden % num_shards == 0,
                    "{} hidden dim {} is not divisible by its {} shards", what, hidden,
                    num_shards);
}

// FFN e of the set, shard j of n: columns [j H/n, (j+1) H/n) of W1 (W3) and b1, rows of W2.
template <typename S>
ExpertWeights<S> slice_ffn(ExpertMlp mlp, int64_t M, const FfnSet<const std::vector<S>>& set,
                           int64_t e, int shard, int num_shards) {
  const int64_t H = set.hidden, Hs = H / num_shards, h0 = shard * Hs;
  const bool biases = has_expert_biases(mlp), gated = is_gated(mlp);
  ExpertWeights<S> w;
  w.mlp = mlp;
  w.model_dim = M;
  w.hidden = Hs;
  w.w1.resize(static_cast<Size>(M * Hs));
  w.b1.resize(static_cast<Size>(biases ? Hs : 0));
  w.w2.resize(static_cast<Size>(Hs * M));
  w.w3.resize(static_cast<Size>(gated ? M * Hs : 0));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < Hs; ++h) w.w1[m * Hs + h] = (*set.w1)[(e * M + m) * H + h0 + h];
  if (gated)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t h = 0; h < Hs; ++h) w.w3[m * Hs + h] = (*set.w3)[(e * M + m) * H + h0 + h];
  if (biases)
    for (int64_t h = 0; h < Hs; ++h) w.b1[h] = (*set.b1)[e * H + h0 + h];
  for (int64_t h = 0; h < Hs; ++h)
    for (int64_t m = 0; m < M; ++m) w.w2[h * M + m] = (*set.w2)[(e * H + h0 + h) * M + m];
  return w;
}

template <typename S>
void unslice_ffn(ExpertMlp mlp, int64_t M, const ExpertWeights<S>& part, int64_t e, int shard,
                 int num_shards, const FfnSet<std::vector<S>>& set) {
  const int64_t H = set.hidden, Hs = H / num_shards, h0 = shard * Hs;
  PARM_CHECK_EQ(part.model_dim, M);
  PARM_CHECK_EQ(part.hidden, Hs);
  PARM_CHECK(part.mlp == mlp, "a {} expert shard into {} experts", expert_mlp_name(part.mlp),
             expert_mlp_name(mlp));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t h = 0; h < Hs; ++h) (*set.w1)[(e * M + m) * H + h0 + h] = part.w1[m * Hs + h];
  if (is_gated(mlp))
    for (int64_t m = 0; m < M; ++m)
      for (int64_t h = 0; h < Hs; ++h) (*set.w3)[(e * M + m) * H + h0 + h] = part.w3[m * Hs + h];
  if (has_expert_biases(mlp))
    for (int64_t h = 0; h < Hs; ++h) (*set.b1)[e * H + h0 + h] = part.b1[h];
  for (int64_t h = 0; h < Hs; ++h)
    for (int64_t m = 0; m < M; ++m) (*set.w2)[(e * H + h0 + h) * M + m] = part.w2[h * M + m];
}

}  // namespace

template <typename S>
ExpertWeights<S> slice_expert(const MoeShape& shape, const MoeParams<S>& whole, int64_t e,
                              int shard, int num_shards) {
  check_shard(shape, e, shard, num_shards);
  whole.check(shape);
  return slice_ffn<S>(shape.expert_mlp, shape.model_dim, routed_set(shape, whole), e, shard,
                      num_shards);
}

template <typename S>
void unslice_expert(const MoeShape& shape, const ExpertWeights<S>& part, int64_t e, int shard,
                    int num_shards, MoeParams<S>& whole) {
  check_shard(shape, e, shard, num_shards);
  whole.check(shape);
  unslice_ffn<S>(shape.expert_mlp, shape.model_dim, part, e, shard, num_shards,
                 routed_set(shape, whole));
}

template <typename S>
ExpertWeights<S> slice_shared(const MoeShape& shape, const MoeParams<S>& whole, int64_t s,
                              int shard, int num_shards) {
  PARM_CONFIG_CHECK(s >= 0 && s < shape.shared_experts, "shared expert {} out of range [0, {})",
                    s, shape.shared_experts);
  check_ffn_shard(shape.shared_hidden, shard, num_shards, "shared expert");
  whole.check(shape);
  return slice_ffn<S>(shape.expert_mlp, shape.model_dim, shared_set(shape, whole), s, shard,
                      num_shards);
}

template <typename S>
void unslice_shared(const MoeShape& shape, const ExpertWeights<S>& part, int64_t s, int shard,
                    int num_shards, MoeParams<S>& whole) {
  PARM_CONFIG_CHECK(s >= 0 && s < shape.shared_experts, "shared expert {} out of range [0, {})",
                    s, shape.shared_experts);
  check_ffn_shard(shape.shared_hidden, shard, num_shards, "shared expert");
  whole.check(shape);
  unslice_ffn<S>(shape.expert_mlp, shape.model_dim, part, s, shard, num_shards,
                 shared_set(shape, whole));
}

template <typename S>
void expert_shard_forward(const ExpertWeights<S>& w, const std::vector<S>& x, ExpertActs<S>& acts,
                          std::vector<S>& partial) {
  const int64_t M = w.model_dim, Hs = w.hidden;
  PARM_CHECK(static_cast<int64_t>(x.size()) % M == 0, "x has {} elements, not rows of M = {}",
             x.size(), M);
  const int64_t rows = static_cast<int64_t>(x.size()) / M;
  const bool gated = is_gated(w.mlp);
  acts.pre.assign(static_cast<Size>(rows * Hs), S(0));
  acts.gate.assign(static_cast<Size>(gated ? rows * Hs : 0), S(0));
  acts.act.assign(static_cast<Size>(rows * Hs), S(0));
  partial.assign(static_cast<Size>(rows * M), S(0));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < Hs; ++h) {
      S acc = gated ? S(0) : w.b1[h];
      for (int64_t m = 0; m < M; ++m) acc += x[r * M + m] * w.w1[m * Hs + h];
      acts.pre[r * Hs + h] = acc;
      if (gated) {  // swiglu: act = silu(x W1) * (x W3)
        S g = S(0);
        for (int64_t m = 0; m < M; ++m) g += x[r * M + m] * w.w3[m * Hs + h];
        acts.gate[r * Hs + h] = g;
        acts.act[r * Hs + h] = silu(acc) * g;
      } else {
        acts.act[r * Hs + h] = gelu(acc);
      }
    }
    for (int64_t m = 0; m < M; ++m) {
      S acc = S(0);
      for (int64_t h = 0; h < Hs; ++h) acc += acts.act[r * Hs + h] * w.w2[h * M + m];
      partial[r * M + m] = acc;
    }
  }
}

template <typename S>
void expert_shard_backward(const ExpertWeights<S>& w, const std::vector<S>& x,
                           const ExpertActs<S>& acts, const std::vector<S>& dy,
                           std::vector<S>& dx, ExpertWeights<S>& grad) {
  const int64_t M = w.model_dim, Hs = w.hidden;
  const int64_t rows = static_cast<int64_t>(x.size()) / M;
  check_size("x (rows, M)", x.size(), rows * M);
  check_size("dy (rows, M)", dy.size(), rows * M);
  check_size("acts.pre (rows, hidden)", acts.pre.size(), rows * Hs);
  check_size("acts.act (rows, hidden)", acts.act.size(), rows * Hs);
  const bool gated = is_gated(w.mlp);
  if (gated) check_size("acts.gate (rows, hidden)", acts.gate.size(), rows * Hs);
  grad.mlp = w.mlp;
  grad.model_dim = M;
  grad.hidden = Hs;
  grad.w1.assign(static_cast<Size>(M * Hs), S(0));
  grad.b1.assign(static_cast<Size>(gated ? 0 : Hs), S(0));
  grad.w2.assign(static_cast<Size>(Hs * M), S(0));
  grad.w3.assign(static_cast<Size>(gated ? M * Hs : 0), S(0));
  dx.assign(static_cast<Size>(rows * M), S(0));
  std::vector<S> dpre(static_cast<Size>(Hs)), dgate(static_cast<Size>(gated ? Hs : 0));
  for (int64_t r = 0; r < rows; ++r) {
    // y = act W2: dW2 += act^T dy, dact = dy W2^T; then through gelu, or through
    // act = silu(pre) * gate: dpre = dact * gate * silu'(pre), dgate = dact * silu(pre).
    for (int64_t h = 0; h < Hs; ++h) {
      S dact = S(0);
      for (int64_t m = 0; m < M; ++m) {
        grad.w2[h * M + m] += acts.act[r * Hs + h] * dy[r * M + m];
        dact += dy[r * M + m] * w.w2[h * M + m];
      }
      const S pre = acts.pre[r * Hs + h];
      if (gated) {
        dpre[h] = dact * acts.gate[r * Hs + h] * silu_grad(pre);
        dgate[h] = dact * silu(pre);
      } else {
        dpre[h] = dact * gelu_grad(pre);
      }
    }
    // pre = x W1 + b1: dW1 += x^T dpre, db1 += dpre, dx = dpre W1^T (swiglu: gate = x W3
    // too: dW3 += x^T dgate, dx += dgate W3^T).
    if (!gated)
      for (int64_t h = 0; h < Hs; ++h) grad.b1[h] += dpre[h];
    for (int64_t m = 0; m < M; ++m) {
      S acc = S(0);
      for (int64_t h = 0; h < Hs; ++h) {
        grad.w1[m * Hs + h] += x[r * M + m] * dpre[h];
        acc += dpre[h] * w.w1[m * Hs + h];
        if (gated) {
          grad.w3[m * Hs + h] += x[r * M + m] * dgate[h];
          acc += dgate[h] * w.w3[m * Hs + h];
        }
      }
      dx[r * M + m] = acc;
    }
  }
}

template <typename S>
void add_expert_bias(const MoeShape& shape, const MoeParams<S>& params, int64_t e, std::vector<S>& y) {
  const int64_t M = shape.model_dim;
  if (!has_expert_biases(shape.expert_mlp)) return;
  check_size("b2 (E, M)", params.b2.size(), shape.experts * M);
  PARM_CHECK(static_cast<int64_t>(y.size()) % M == 0, "y has {} elements, not rows of M = {}",
             y.size(), M);
  const int64_t rows = static_cast<int64_t>(y.size()) / M;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t m = 0; m < M; ++m) y[r * M + m] += params.b2[e * M + m];
}

template <typename S>
void expert_bias_backward(int64_t model_dim, const std::vector<S>& dy, std::vector<S>& db2) {
  const int64_t M = model_dim;
  PARM_CHECK(static_cast<int64_t>(dy.size()) % M == 0, "dy has {} elements, not rows of M = {}",
             dy.size(), M);
  const int64_t rows = static_cast<int64_t>(dy.size()) / M;
  db2.assign(static_cast<Size>(M), S(0));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t m = 0; m < M; ++m) db2[m] += dy[r * M + m];
}

// ---- The layer ---------------------------------------------------------------------------

template <typename S>
MoeForward<S> moe_forward(const MoeShape& shape, const MoeParams<S>& params,
                          const std::vector<S>& x, int num_slices,
                          const std::vector<S>* router_bias) {
  shape.validate(num_slices);
  params.check(shape);
  const int64_t T = shape.tokens, M = shape.model_dim, E = shape.experts;
  check_size("x (T, M)", x.size(), T * M);

  MoeForward<S> f;
  f.shape = shape;
  f.num_slices = num_slices;
  f.x = x;

  // 1. Gate.
  gate_forward(shape, params.wg, x, f.logits, f.probs);
  // 2-3. Top-k, combine weights, capacity and slots, each slice on its own.
  f.routing = route(shape, f.probs, num_slices, router_bias);
  const int64_t C = f.routing.capacity, Ts = T / num_slices;

  // 7. l_aux from the statistics summed over the slices, divided by the total T.
  f.aux.first_count.assign(static_cast<Size>(E), S(0));
  f.aux.prob_sum.assign(static_cast<Size>(E), S(0));
  for (int s = 0; s < num_slices; ++s) {
    const AuxStats<S> st = aux_stats(f.routing, f.probs, s * Ts, (s + 1) * Ts);
    for (int64_t e = 0; e < E; ++e) {
      f.aux.first_count[e] += st.first_count[e];
      f.aux.prob_sum[e] += st.prob_sum[e];
    }
  }
  f.l_aux = aux_loss(f.aux, T);
  if (shape.aux_seq_len > 0) {  // the mean over the sequences of each one's l_aux
    const int64_t L = shape.aux_seq_len, nseq = T / L;
    S sum = S(0);
    for (int64_t q = 0; q < nseq; ++q) {
      f.seq_aux.push_back(aux_stats(f.routing, f.probs, q * L, (q + 1) * L));
      sum += aux_loss(f.seq_aux.back(), L);
    }
    f.l_aux = sum / static_cast<S>(nseq);
  }
  // Router z-loss over all T tokens (the slices' sums add up to it).
  row_logsumexp(E, f.logits, f.lse);
  f.l_z = S(0);
  for (int64_t t = 0; t < T; ++t) f.l_z += f.lse[t] * f.lse[t];
  f.l_z /= static_cast<S>(T);

  // 4. Dispatch into (num_slices, E, C, M).
  dispatch_forward(shape, f.routing, x, f.dispatched);

  // 5. Experts, on every slot (unused ones hold zeros; the combine never reads them).
  f.expert_out.assign(static_cast<Size>(num_slices * E * C * M), S(0));
  f.acts.resize(static_cast<Size>(num_slices * E));
  for (int s = 0; s < num_slices; ++s) {
    for (int64_t e = 0; e < E; ++e) {
      const int64_t begin = buffer_row(shape, C, s, e, 0), end = begin + C * M;
      const std::vector<S> xe(f.dispatched.begin() + begin, f.dispatched.begin() + end);
      const ExpertWeights<S> w = slice_expert(shape, params, e, 0, 1);
      std::vector<S> ye;
      expert_shard_forward(w, xe, f.acts[s * E + e], ye);
      add_expert_bias(shape, params, e, ye);
      std::copy(ye.begin(), ye.end(), f.expert_out.begin() + begin);
    }
  }

  // 6. Combine.
  combine_forward(shape, f.routing, f.expert_out, f.out);

  // Shared experts (docs/spec.md §9): P = sum_s FFN_s(x) (+ b2_s), out += g P, g = sigmoid(x
  // w_sg) with the shared gate, else 1.
  const int64_t Ns = shape.shared_experts;
  f.shared_acts.resize(static_cast<Size>(Ns));
  f.shared_sum.assign(static_cast<Size>(Ns > 0 ? T * M : 0), S(0));
  f.shared_gate.assign(static_cast<Size>(Ns > 0 ? T : 0), S(1));
  for (int64_t s = 0; s < Ns; ++s) {
    std::vector<S> ys;
    expert_shard_forward(slice_shared(shape, params, s, 0, 1), x, f.shared_acts[s], ys);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t m = 0; m < M; ++m)
        f.shared_sum[t * M + m] +=
            ys[t * M + m] + (params.sb2.empty() ? S(0) : params.sb2[s * M + m]);
  }
  if (Ns > 0) {
    if (shape.shared_gate)
      for (int64_t t = 0; t < T; ++t) {
        S z = S(0);
        for (int64_t m = 0; m < M; ++m) z += x[t * M + m] * params.swg[m];
        f.shared_gate[t] = sigmoid(z);
      }
    for (int64_t t = 0; t < T; ++t)
      for (int64_t m = 0; m < M; ++m)
        f.out[t * M + m] += f.shared_gate[t] * f.shared_sum[t * M + m];
  }
  return f;
}

template <typename S>
MoeGrads<S> moe_backward(const MoeParams<S>& params, const MoeForward<S>& fwd,
                         const std::vector<S>& dout, S dl_aux, S dl_z) {
  const MoeShape& shape = fwd.shape;
  const Routing<S>& r = fwd.routing;
  params.check(shape);
  const int64_t T = shape.tokens, M = shape.model_dim, E = shape.experts, H = shape.hidden;
  const int64_t C = r.capacity;
  const int num_slices = fwd.num_slices;
  check_size("dout (T, M)", dout.size(), T * M);

  MoeGrads<S> g;
  g.dx.assign(static_cast<Size>(T * M), S(0));
  g.dparams = MoeParams<S>::zeros(shape);

  // 6. Combine: gradients of the expert outputs and of the kept combine weights.
  std::vector<S> dexpert_out, dweight;
  combine_backward(shape, r, fwd.expert_out, dout, dexpert_out, dweight);

  // 5. Experts: weight gradients summed over the slices.
  std::vector<S> ddispatched(static_cast<Size>(num_slices * E * C * M), S(0));
  for (int s = 0; s < num_slices; ++s) {
    for (int64_t e = 0; e < E; ++e) {
      const int64_t begin = buffer_row(shape, C, s, e, 0), end = begin + C * M;
      const std::vector<S> xe(fwd.dispatched.begin() + begin, fwd.dispatched.begin() + end);
      const std::vector<S> dye(dexpert_out.begin() + begin, dexpert_out.begin() + end);
      const ExpertWeights<S> w = slice_expert(shape, params, e, 0, 1);
      ExpertWeights<S> gw;
      std::vector<S> dxe, db2e;
      expert_shard_backward(w, xe, fwd.acts[s * E + e], dye, dxe, gw);
      std::copy(dxe.begin(), dxe.end(), ddispatched.begin() + begin);
      // Whole expert (one shard of one): its w1/b1/w2/w3 are contiguous blocks of dparams.
      for (int64_t i = 0; i < M * H; ++i) g.dparams.w1[e * M * H + i] += gw.w1[i];
      for (int64_t i = 0; i < H * M; ++i) g.dparams.w2[e * H * M + i] += gw.w2[i];
      if (is_gated(shape.expert_mlp))
        for (int64_t i = 0; i < M * H; ++i) g.dparams.w3[e * M * H + i] += gw.w3[i];
      if (has_expert_biases(shape.expert_mlp)) {
        expert_bias_backward(M, dye, db2e);
        for (int64_t i = 0; i < H; ++i) g.dparams.b1[e * H + i] += gw.b1[i];
        for (int64_t i = 0; i < M; ++i) g.dparams.b2[e * M + i] += db2e[i];
      }
    }
  }

  // 4. Dispatch: each kept slot's input gradient goes back to its token.
  dispatch_backward(shape, r, ddispatched, g.dx);

  // Shared experts: dP = g dout; with the gate dg_t = <dout_t, P_t>, dz = dg g (1 - g),
  // dw_sg += x^T dz, dx += dz w_sg^T; then each FFN's adjoint on dP (db2_s = column sums).
  const int64_t Ns = shape.shared_experts;
  if (Ns > 0) {
    std::vector<S> dp(static_cast<Size>(T * M));
    for (int64_t t = 0; t < T; ++t) {
      const S gt = fwd.shared_gate[t];
      S dg = S(0);
      for (int64_t m = 0; m < M; ++m) {
        dp[t * M + m] = gt * dout[t * M + m];
        dg += dout[t * M + m] * fwd.shared_sum[t * M + m];
      }
      if (!shape.shared_gate) continue;
      const S dz = dg * gt * (S(1) - gt);
      for (int64_t m = 0; m < M; ++m) {
        g.dparams.swg[m] += fwd.x[t * M + m] * dz;
        g.dx[t * M + m] += dz * params.swg[m];
      }
    }
    for (int64_t s = 0; s < Ns; ++s) {
      const ExpertWeights<S> w = slice_shared(shape, params, s, 0, 1);
      ExpertWeights<S> gw;
      std::vector<S> dxs;
      expert_shard_backward(w, fwd.x, fwd.shared_acts[s], dp, dxs, gw);
      for (int64_t i = 0; i < T * M; ++i) g.dx[i] += dxs[i];
      unslice_shared(shape, gw, s, 0, 1, g.dparams);
      if (!g.dparams.sb2.empty()) {
        std::vector<S> db2;
        expert_bias_backward(M, dp, db2);
        for (int64_t m = 0; m < M; ++m) g.dparams.sb2[s * M + m] = db2[m];
      }
    }
  }

  // 2. Combine weights -> probabilities (through the renormalisation when k > 1).
  std::vector<S> dprobs(static_cast<Size>(T * E), S(0));
  weight_backward(r, dweight, dprobs);
  // 7. l_aux -> probabilities (the counts carry no gradient); under sigmoid scores through
  // l_aux's normalisation p_e = s_e / Z: ds_e = (dp_e - sum_i dp_i p_i) / Z.
  // d l_aux / d p into d (T, E): over all T tokens, or each sequence's rows from its own
  // statistics with dl_aux / (T / L) (the mean over the sequences).
  auto aux_backward = [&](std::vector<S>& d) {
    if (fwd.seq_aux.empty()) {
      aux_loss_backward(fwd.aux, T, dl_aux, d);
      return;
    }
    const int64_t L = shape.aux_seq_len, nseq = static_cast<int64_t>(fwd.seq_aux.size());
    std::vector<S> part(static_cast<Size>(L * E));
    for (int64_t q = 0; q < nseq; ++q) {
      std::fill(part.begin(), part.end(), S(0));
      aux_loss_backward(fwd.seq_aux[q], L, dl_aux / static_cast<S>(nseq), part);
      for (int64_t i = 0; i < L * E; ++i) d[q * L * E + i] += part[i];
    }
  };
  if (shape.router.score == RouterScore::kSigmoid) {
    std::vector<S> dbal(static_cast<Size>(T * E), S(0));
    aux_backward(dbal);
    for (int64_t t = 0; t < T; ++t) {
      S z = S(0), dot = S(0);
      for (int64_t e = 0; e < E; ++e) z += fwd.probs[t * E + e];
      for (int64_t e = 0; e < E; ++e) dot += dbal[t * E + e] * fwd.probs[t * E + e] / z;
      for (int64_t e = 0; e < E; ++e) dprobs[t * E + e] += (dbal[t * E + e] - dot) / z;
    }
  } else {
    aux_backward(dprobs);
  }

  // z-loss: d l_z / d lse_t = 2 lse_t / T.
  std::vector<S> dlse(static_cast<Size>(T));
  for (int64_t t = 0; t < T; ++t) dlse[t] = dl_z * S(2) * fwd.lse[t] / static_cast<S>(T);

  // 1. Gate: through the softmax or sigmoid (and the log-sum-exp, whose d lse / d logit is
  // the softmax of the logits) into wg and x.
  std::vector<S> soft;
  if (shape.router.score == RouterScore::kSigmoid) {
    soft.resize(static_cast<Size>(T * E));
    for (int64_t i = 0; i < T * E; ++i) soft[i] = std::exp(fwd.logits[i] - fwd.lse[i / E]);
  }
  gate_backward(shape, params.wg, fwd.x, fwd.probs, dprobs, g.dx, g.dparams.wg, &dlse,
                soft.empty() ? nullptr : &soft);
  return g;
}

// ---- Conversions -------------------------------------------------------------------------

template <typename S>
Tensor to_tensor(const std::vector<S>& v, const Shape& shape) {
  Tensor t(shape);
  check_size("to_tensor source", v.size(), t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<float>(v[i]);
  return t;
}

template <typename S>
std::vector<S> from_tensor(const Tensor& t) {
  std::vector<S> v(static_cast<Size>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = static_cast<S>(t[i]);
  return v;
}

// ---- Instantiations ----------------------------------------------------------------------

#define PARM_REF_INSTANTIATE(S)                                                               \
  template struct MoeParams<S>;                                                               \
  template struct Routing<S>;                                                                 \
  template MoeParams<S> init_params<S>(const MoeShape&, uint64_t);                            \
  template std::vector<S> init_input<S>(const MoeShape&, uint64_t);                           \
  template Routing<S> route<S>(const MoeShape&, const std::vector<S>&, int,                   \
                              const std::vector<S>*);                                         \
  template MoeForward<S> moe_forward<S>(const MoeShape&, const MoeParams<S>&,                 \
                                        const std::vector<S>&, int, const std::vector<S>*);   \
  template MoeGrads<S> moe_backward<S>(const MoeParams<S>&, const MoeForward<S>&,             \
                                       const std::vector<S>&, S, S);                          \
  template void gate_forward<S>(const MoeShape&, const std::vector<S>&, const std::vector<S>&, \
                                std::vector<S>&, std::vector<S>&);                            \
  template void gate_backward<S>(const MoeShape&, const std::vector<S>&,                      \
                                 const std::vector<S>&, const std::vector<S>&,                \
                                 const std::vector<S>&, std::vector<S>&, std::vector<S>&,     \
                                 const std::vector<S>*, const std::vector<S>*);               \
  template void row_logsumexp<S>(int64_t, const std::vector<S>&, std::vector<S>&);            \
  template void weight_backward<S>(const Routing<S>&, const std::vector<S>&, std::vector<S>&); \
  template void dispatch_forward<S>(const MoeShape&, const Routing<S>&, const std::vector<S>&, \
                                    std::vector<S>&);                                         \
  template void dispatch_backward<S>(const MoeShape&, const Routing<S>&,                      \
                                     const std::vector<S>&, std::vector<S>&);                 \
  template void combine_forward<S>(const MoeShape&, const Routing<S>&, const std::vector<S>&, \
                                   std::vector<S>&);                                          \
  template void combine_backward<S>(const MoeShape&, const Routing<S>&,                       \
                                    const std::vector<S>&, const std::vector<S>&,             \
                                    std::vector<S>&, std::vector<S>&);                        \
  template AuxStats<S> aux_stats<S>(const Routing<S>&, const std::vector<S>&, int64_t,        \
                                    int64_t);                                                 \
  template S aux_loss<S>(const AuxStats<S>&, int64_t);                                        \
  template void aux_loss_backward<S>(const AuxStats<S>&, int64_t, S, std::vector<S>&);        \
  template ExpertWeights<S> slice_expert<S>(const MoeShape&, const MoeParams<S>&, int64_t,    \
                                            int, int);                                        \
  template void unslice_expert<S>(const MoeShape&, const ExpertWeights<S>&, int64_t, int,     \
                                  int, MoeParams<S>&);                                        \
  template ExpertWeights<S> slice_shared<S>(const MoeShape&, const MoeParams<S>&, int64_t,    \
                                            int, int);                                        \
  template void unslice_shared<S>(const MoeShape&, const ExpertWeights<S>&, int64_t, int,     \
                                  int, MoeParams<S>&);                                        \
  template void expert_shard_forward<S>(const ExpertWeights<S>&, const std::vector<S>&,       \
                                        ExpertActs<S>&, std::vector<S>&);                     \
  template void expert_shard_backward<S>(const ExpertWeights<S>&, const std::vector<S>&,      \
                                         const ExpertActs<S>&, const std::vector<S>&,         \
                                         std::vector<S>&, ExpertWeights<S>&);                 \
  template void add_expert_bias<S>(const MoeShape&, const MoeParams<S>&, int64_t,             \
                                   std::vector<S>&);                                          \
  template void expert_bias_backward<S>(int64_t, const std::vector<S>&, std::vector<S>&);     \
  template Tensor to_tensor<S>(const std::vector<S>&, const Shape&);                          \
  template std::vector<S> from_tensor<S>(const Tensor&);

PARM_REF_INSTANTIATE(float)
PARM_REF_INSTANTIATE(double)
#undef PARM_REF_INSTANTIATE

}  // namespace parm::ref
