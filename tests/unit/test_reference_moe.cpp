// The reference MoE layer (the oracle): gradients against finite differences in fp64,
// hand-made routing cases whose results are exactly predictable, fp32 vs fp64, per-slice
// gating (S1's oracle) and ESP expert shards.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "moe/reference_moe.h"
#include "parm/error.h"
#include "parm/rng.h"

namespace parm::ref {
namespace {

MoeShape make_shape(int64_t T, int64_t M, int64_t H, int64_t E, int k, const char* f) {
  return MoeShape::of(T, M, H, E, k, f);
}

template <typename S>
std::vector<std::pair<std::string, std::vector<S>*>> tensors_of(MoeParams<S>& p) {
  return {{"wg", &p.wg},   {"w1", &p.w1},   {"b1", &p.b1},   {"w2", &p.w2},
          {"b2", &p.b2},   {"w3", &p.w3},   {"sw1", &p.sw1}, {"sb1", &p.sb1},
          {"sw2", &p.sw2}, {"sb2", &p.sb2}, {"sw3", &p.sw3}, {"swg", &p.swg}};
}

std::vector<double> uniform_vector(int64_t n, uint64_t seed, uint64_t stream) {
  Rng rng(seed, stream);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = 2.0 * rng.uniform() - 1.0;
  return v;
}

// Every element: |got - want| <= atol + rtol * |want|. Reports the worst element.
template <typename A, typename B>
void expect_close(const std::vector<A>& got, const std::vector<B>& want, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0.0;
  size_t worst_i = 0;
  bool ok = true;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    const double excess = std::abs(g - w) - (atol + rtol * std::abs(w));
    if (excess > 0 && (ok || excess > worst)) {
      ok = false;
      worst = excess;
      worst_i = i;
    }
  }
  EXPECT_TRUE(ok) << what << ": element " << worst_i << " is " << got[worst_i] << ", expected "
                  << want[worst_i] << " (of " << got.size() << ")";
}

// Identity gate (M = E): a token's logits are its x row, so the routing is set by hand.
// With one-hot experts (W1 = 0, b1 = 0, W2 = 0, b2_e = unit vector e) expert e outputs
// exactly e_e whatever its input (gelu(0) = 0), so out_t[e] is the combine weight of
// expert e for token t when that choice was kept and 0 otherwise.
MoeParams<double> identity_gate_params(const MoeShape& shape, bool one_hot_experts) {
  MoeParams<double> p = one_hot_experts ? MoeParams<double>::zeros(shape)
                                        : init_params<double>(shape, 5);
  const int64_t E = shape.experts, M = shape.model_dim;
  std::fill(p.wg.begin(), p.wg.end(), 0.0);
  for (int64_t e = 0; e < E; ++e) p.wg[e * E + e] = 1.0;
  if (one_hot_experts) {
    for (int64_t e = 0; e < E; ++e) p.b2[e * M + e] = 1.0;
  }
  return p;
}

std::vector<double> flat(const std::vector<std::vector<double>>& rows) {
  std::vector<double> v;
  for (const auto& r : rows) v.insert(v.end(), r.begin(), r.end());
  return v;
}

// expert e's whole output (rows, M) on x (rows, M), b2 included.
std::vector<double> whole_expert(const MoeShape& shape, const MoeParams<double>& p, int64_t e,
                                 const std::vector<double>& x) {
  ExpertActs<double> acts;
  std::vector<double> y;
  expert_shard_forward(slice_expert(shape, p, e, 0, 1), x, acts, y);
  add_expert_bias(shape, p, e, y);
  return y;
}

// ---- Finite differences ------------------------------------------------------------------

struct FdCase {
  int64_t tokens;
  int topk;
  const char* factor;
  int num_slices;
  bool drops;  // whether this case is meant to drop choices (checked)
  const char* tag = "";  // names the router below ("" at §2's)
  RouterSpec router{};   // docs/spec.md §7's options
  ExpertMlp mlp = ExpertMlp::kGelu;  // docs/spec.md §8's expert kinds
  int shared = 0;             // shared experts (docs/spec.md §9), of width 4
  bool shared_gate = false;
  int64_t aux_seq_len = 0;    // the sequence-wise l_aux (docs/spec.md §7)
};

std::string fd_name(const ::testing::TestParamInfo<FdCase>& info) {
  std::string f = info.param.factor;
  std::replace(f.begin(), f.end(), '.', 'p');
  return "T" + std::to_string(info.param.tokens) + "_k" + std::to_string(info.param.topk) + "_f" +
         f + "_slices" + std::to_string(info.param.num_slices) + info.param.tag;
}

class ReferenceMoeGradient : public ::testing::TestWithParam<FdCase> {};

// L = sum(out * R) + c * l_aux + c_z * l_z (the router z-loss); every gradient against central differences in fp64, with
// the routing (experts and slots) checked unchanged under every perturbation.
TEST_P(ReferenceMoeGradient, MatchesCentralDifferences) {
  const FdCase c = GetParam();
  MoeShape shape = make_shape(c.tokens, 4, 6, 4, c.topk, c.factor);
  shape.router = c.router;
  shape.expert_mlp = c.mlp;
  shape.shared_experts = c.shared;
  shape.shared_hidden = c.shared > 0 ? 4 : 0;
  shape.shared_gate = c.shared_gate;
  shape.aux_seq_len = c.aux_seq_len;
  MoeParams<double> params = init_params<double>(shape, 1234);
  std::vector<double> x = init_input<double>(shape, 4321);
  const std::vector<double> R = uniform_vector(shape.tokens * shape.model_dim, 77, 1);
  const double c_aux = 0.7, c_z = 0.3;

  const MoeForward<double> fwd = moe_forward(shape, params, x, c.num_slices);
  if (c.drops) {
    ASSERT_GT(fwd.routing.num_dropped(), 0) << "case meant to drop does not";
  } else {
    ASSERT_EQ(fwd.routing.num_dropped(), 0) << "case meant not to drop does";
  }
  const MoeGrads<double> g = moe_backward(params, fwd, R, c_aux, c_z);

  int routing_changes = 0;
  auto loss = [&]() {
    const MoeForward<double> f = moe_forward(shape, params, x, c.num_slices);
    if (!same_assignment(f.routing, fwd.routing)) ++routing_changes;
    double l = c_aux * f.l_aux + c_z * f.l_z;
    for (size_t i = 0; i < R.size(); ++i) l += f.out[i] * R[i];
    return l;
  };
  const double eps = 1e-6, rtol = 1e-6, atol = 1e-9;
  double worst_rel = 0.0;
  auto check = [&](const std::string& name, std::vector<double>& v, const std::vector<double>& grad) {
    ASSERT_EQ(v.size(), grad.size()) << name;
    std::vector<double> fd(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const double saved = v[i];
      v[i] = saved + eps;
      const double lp = loss();
      v[i] = saved - eps;
      const double lm = loss();
      v[i] = saved;
      fd[i] = (lp - lm) / (2 * eps);
      worst_rel = std::max(worst_rel, std::abs(fd[i] - grad[i]) / std::max(std::abs(fd[i]), 1e-3));
    }
    expect_close(grad, fd, rtol, atol, "d" + name);
  };
  check("x", x, g.dx);
  MoeParams<double> grads = g.dparams;
  auto p_list = tensors_of(params);
  auto g_list = tensors_of(grads);
  for (size_t i = 0; i < p_list.size(); ++i) check(p_list[i].first, *p_list[i].second, *g_list[i].second);
  EXPECT_EQ(routing_changes, 0) << "a perturbation changed the routing; choose other inputs";
  RecordProperty("worst_relative_error", fmt::format("{:.2e}", worst_rel));
}

INSTANTIATE_TEST_SUITE_P(
    Fp64, ReferenceMoeGradient,
    ::testing::Values(FdCase{8, 1, "4", 1, false}, FdCase{8, 1, "0.5", 1, true},
                      FdCase{8, 2, "4", 1, false}, FdCase{8, 2, "0.5", 1, true},
                      FdCase{12, 3, "4", 1, false}, FdCase{12, 3, "0.5", 1, true},
                      FdCase{6, 2, "1.25", 1, true}, FdCase{12, 2, "0.5", 2, true},
                      FdCase{12, 3, "0.75", 3, true}, FdCase{12, 1, "4", 2, false},
                      // Sigmoid scores (l_aux through the per-token normalisation), the
                      // top-k normalisation off, a route scale, group-limited selection.
                      FdCase{8, 2, "4", 1, false, "_sigmoid", {RouterScore::kSigmoid}},
                      FdCase{12, 3, "0.75", 3, true, "_sigmoid_nonorm_scale",
                             {RouterScore::kSigmoid, false, 2.5f}},
                      FdCase{8, 1, "4", 1, false, "_sigmoid_k1", {RouterScore::kSigmoid}},
                      FdCase{12, 2, "0.5", 2, true, "_softmax_nonorm_groups2of1",
                             {RouterScore::kSoftmax, false, 1.0f, 2, 1}},
                      FdCase{12, 2, "4", 1, false, "_sigmoid_scale_groups4of2",
                             {RouterScore::kSigmoid, true, 1.5f, 4, 2}},
                      // SwiGLU experts (W3, no biases), with and without drops, sliced,
                      // and under DeepSeek-V3's router.
                      FdCase{8, 2, "4", 1, false, "_swiglu", {}, ExpertMlp::kSwiglu},
                      FdCase{12, 3, "0.75", 3, true, "_swiglu", {}, ExpertMlp::kSwiglu},
                      FdCase{12, 2, "4", 1, false, "_swiglu_sigmoid_groups4of2",
                             {RouterScore::kSigmoid, true, 1.5f, 4, 2}, ExpertMlp::kSwiglu},
                      // Shared experts, gated and not, of either kind, with drops.
                      FdCase{8, 2, "4", 1, false, "_shared2", {}, ExpertMlp::kGelu, 2},
                      FdCase{12, 2, "0.5", 2, true, "_shared1_gate", {}, ExpertMlp::kGelu, 1,
                             true},
                      FdCase{12, 3, "0.75", 3, true, "_swiglu_shared2_gate", {},
                             ExpertMlp::kSwiglu, 2, true},
                      // The sequence-wise l_aux: sequences within and across the slices,
                      // under softmax and sigmoid scores.
                      FdCase{12, 2, "4", 1, false, "_seq3", {}, ExpertMlp::kGelu, 0, false, 3},
                      FdCase{12, 2, "0.5", 2, true, "_seq4", {}, ExpertMlp::kGelu, 0, false, 4},
                      FdCase{12, 3, "0.75", 3, true, "_sigmoid_seq6", {RouterScore::kSigmoid},
                             ExpertMlp::kGelu, 0, false, 6}),
    fd_name);

// The router z-loss by hand: identity gate, so a token's logits are its x row.
TEST(ReferenceMoeZLoss, MeanOfSquaredLogSumExp) {
  const MoeShape shape = make_shape(2, 2, 4, 2, 1, "4");
  const MoeParams<double> p = identity_gate_params(shape, true);
  const std::vector<double> x = {0.0, 0.0, std::log(3.0), 0.0};
  const MoeForward<double> f = moe_forward(shape, p, x);
  const double lse0 = std::log(2.0), lse1 = std::log(4.0);
  EXPECT_NEAR(f.l_z, (lse0 * lse0 + lse1 * lse1) / 2, 1e-12);
  // Without dl_z the gradient is that of the rest alone.
  const std::vector<double> dout(4, 0.0);
  const MoeGrads<double> g0 = moe_backward(p, f, dout, 0.0);
  const MoeGrads<double> g1 = moe_backward(p, f, dout, 0.0, 1.0);
  for (double v : g0.dx) EXPECT_EQ(v, 0.0);
  // dl_z / dx_t = 2 lse_t p_t / T (through the identity gate).
  EXPECT_NEAR(g1.dx[2], 2 * lse1 * 0.75 / 2, 1e-12);
  EXPECT_NEAR(g1.dx[3], 2 * lse1 * 0.25 / 2, 1e-12);
}

// ---- Hand-made routing -------------------------------------------------------------------

TEST(ReferenceMoeRouting, TiesGoToTheLowerExpert) {
  // route() on probabilities given directly.
  const MoeShape shape = make_shape(4, 4, 2, 4, 3, "4");
  const std::vector<double> probs = {0.1, 0.4, 0.4, 0.1,      // 1, 2, then 0 (tie with 3)
                                     0.25, 0.25, 0.25, 0.25,  // 0, 1, 2
                                     0.3, 0.1, 0.3, 0.3,      // 0, 2, 3
                                     0.0, 0.5, 0.0, 0.5};     // 1, 3, 0
  const Routing<double> r = route(shape, probs);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{1, 2, 0, 0, 1, 2, 0, 2, 3, 1, 3, 0}));

  // Through the softmax: equal logits give bitwise-equal probabilities.
  const MoeShape s1 = make_shape(2, 4, 2, 4, 1, "4");
  const MoeParams<double> p = identity_gate_params(s1, true);
  const MoeForward<double> f = moe_forward(s1, p, flat({{0, 0, 0, 0}, {-1, 2, 1, 2}}));
  EXPECT_EQ(f.routing.expert, (std::vector<int32_t>{0, 1}));
}

TEST(ReferenceMoeRouting, GShardPriorityOrder) {
  // k = 2, T = 3, E = 4, f = 0.5: C = ceil(2 * 0.5 * 3 / 4) = 1.
  const MoeShape shape = make_shape(3, 4, 2, 4, 2, "0.5");
  const MoeParams<double> p = identity_gate_params(shape, true);
  const std::vector<double> x = flat({{3, 2, 0, 0},    // t0: e0, then e1
                                      {0, 3, 2, 0},    // t1: e1, then e2
                                      {2, 0, 0, 3}});  // t2: e3, then e0
  const MoeForward<double> f = moe_forward(shape, p, x);
  const Routing<double>& r = f.routing;
  EXPECT_EQ(r.capacity, 1);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 1, 1, 2, 3, 0}));
  // Pass 1 gives every 1st choice a slot; in pass 2 t0's 2nd choice (e1) has lost its
  // slot to t1's 1st choice although t0 comes first, t1's 2nd choice (e2) gets one and
  // t2's (e0) is dropped. Filling in token order instead would keep t0 -> e1.
  EXPECT_EQ(r.slot, (std::vector<int64_t>{0, -1, 0, 0, 0, -1}));
  EXPECT_EQ(r.fill, (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(r.num_dropped(), 2);

  const double w_top = 1.0 / (1.0 + std::exp(-1.0));  // e^3 / (e^3 + e^2)
  EXPECT_NEAR(r.weight[0], w_top, 1e-14);
  const std::vector<double> want = flat({{r.weight[0], 0, 0, 0},
                                         {0, r.weight[2], r.weight[3], 0},
                                         {0, 0, 0, r.weight[4]}});
  EXPECT_EQ(f.out, want);
  EXPECT_NEAR(f.out[4 + 1] + f.out[4 + 2], 1.0, 1e-14);  // t1 kept both: weights sum to 1
}

TEST(ReferenceMoeRouting, ExpertWithoutTokensAndOneThatOverflows) {
  // k = 1, T = 4, E = 4, f = 1: C = 1. Every token picks e1; only t0 gets the slot.
  const MoeShape shape = make_shape(4, 4, 6, 4, 1, "1");
  const MoeParams<double> p = identity_gate_params(shape, false);
  const std::vector<double> x = flat({{0, 2, 0, 0}, {0, 3, 0, 1}, {1, 2, 0, 0}, {0, 1, 0, -1}});
  const MoeForward<double> f = moe_forward(shape, p, x);
  const Routing<double>& r = f.routing;
  EXPECT_EQ(r.capacity, 1);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{1, 1, 1, 1}));
  EXPECT_EQ(r.slot, (std::vector<int64_t>{0, -1, -1, -1}));
  EXPECT_EQ(r.fill, (std::vector<int64_t>{0, 1, 0, 0}));

  // t0's output is p(t0, e1) * y_1(x_0); the dropped tokens' outputs are zero (their
  // residual path is outside this layer).
  const std::vector<double> x0(x.begin(), x.begin() + 4);
  const std::vector<double> y0 = whole_expert(shape, p, 1, x0);
  for (int64_t m = 0; m < 4; ++m) EXPECT_NEAR(f.out[m], f.probs[1] * y0[m], 1e-14);
  for (int64_t i = 4; i < 16; ++i) EXPECT_EQ(f.out[i], 0.0);
  // l_aux: frac = (0, 1, 0, 0) counted before drops, so l_aux = E * meanp_1.
  const double meanp1 = (f.probs[1] + f.probs[5] + f.probs[9] + f.probs[13]) / 4;
  EXPECT_NEAR(f.l_aux, 4 * meanp1, 1e-14);

  const std::vector<double> dout = uniform_vector(16, 3, 1);
  const MoeGrads<double> g = moe_backward(p, f, dout, 0.0);
  // With dl_aux = 0 a dropped token gets no gradient at all.
  for (int64_t i = 4; i < 16; ++i) EXPECT_EQ(g.dx[i], 0.0) << i;
  for (int64_t i = 0; i < 4; ++i) EXPECT_NE(g.dx[i], 0.0) << i;
  // Experts 0, 2, 3 saw no token: their gradients are exactly zero.
  for (int64_t e : {0, 2, 3}) {
    const ExpertWeights<double> ge = slice_expert(shape, g.dparams, e, 0, 1);
    for (double v : ge.w1) EXPECT_EQ(v, 0.0);
    for (double v : ge.b1) EXPECT_EQ(v, 0.0);
    for (double v : ge.w2) EXPECT_EQ(v, 0.0);
    for (int64_t m = 0; m < 4; ++m) EXPECT_EQ(g.dparams.b2[e * 4 + m], 0.0);
  }
  for (int64_t m = 0; m < 4; ++m) EXPECT_NEAR(g.dparams.b2[4 + m], f.probs[1] * dout[m], 1e-14);

  // With dl_aux != 0 the dropped tokens get gradient through the gate (l_aux's meanp).
  const MoeGrads<double> g_aux = moe_backward(p, f, dout, 1.0);
  for (int64_t t = 1; t < 4; ++t) {
    double n = 0;
    for (int64_t m = 0; m < 4; ++m) n += std::abs(g_aux.dx[t * 4 + m]);
    EXPECT_GT(n, 0.0) << "token " << t;
  }
}

TEST(ReferenceMoeRouting, TopThreeRenormalisesBeforeTheDrop) {
  // k = 3, T = 2, E = 4, f = 0.5: C = ceil(3 * 0.5 * 2 / 4) = 1.
  const MoeShape shape = make_shape(2, 4, 2, 4, 3, "0.5");
  const MoeParams<double> p = identity_gate_params(shape, true);
  const std::vector<double> x = flat({{3, 2, 1, 0}, {0, 3, 2, 1}});
  const MoeForward<double> f = moe_forward(shape, p, x);
  const Routing<double>& r = f.routing;
  EXPECT_EQ(r.capacity, 1);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 1, 2, 1, 2, 3}));
  // t0 keeps only e0: its 2nd and 3rd choices find e1 and e2 taken by t1.
  EXPECT_EQ(r.slot, (std::vector<int64_t>{0, -1, -1, 0, 0, 0}));

  const double e1 = std::exp(1.0), e2 = std::exp(2.0), e3 = std::exp(3.0);
  const double z = e3 + e2 + e1;  // the 4th expert's e^0 is not among the top 3
  // The dropped choices stay in t0's denominator: its one kept weight is not 1.
  EXPECT_NEAR(f.out[0], e3 / z, 1e-14);
  EXPECT_EQ(f.out[1], 0.0);
  EXPECT_NEAR(f.out[4 + 1], e3 / z, 1e-14);
  EXPECT_NEAR(f.out[4 + 2], e2 / z, 1e-14);
  EXPECT_NEAR(f.out[4 + 3], e1 / z, 1e-14);

  // The dropped choices' probabilities still get gradient, through the normaliser:
  // dp_i = (dw_i - sum_j dw_j w_j) / Z with dw = (g, 0, 0) for t0.
  std::vector<double> dweight = {2.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  std::vector<double> dprobs(8, 0.0);
  weight_backward(r, dweight, dprobs);
  const double zp = r.prob[0] + r.prob[1] + r.prob[2];
  const double dot = 2.0 * r.weight[0];
  EXPECT_NEAR(dprobs[0], (2.0 - dot) / zp, 1e-12);
  EXPECT_NEAR(dprobs[1], -dot / zp, 1e-12);
  EXPECT_NEAR(dprobs[2], -dot / zp, 1e-12);
  EXPECT_EQ(dprobs[3], 0.0);  // not among the top 3

  // And the combine gives a dropped choice's weight no direct gradient.
  std::vector<double> dexp, dw;
  combine_backward(shape, r, f.expert_out, uniform_vector(8, 1, 2), dexp, dw);
  EXPECT_EQ(dw[1], 0.0);
  EXPECT_EQ(dw[2], 0.0);
  EXPECT_NE(dw[0], 0.0);
}

TEST(ReferenceMoeRouting, TopOneWeightIsTheProbability) {
  const MoeShape shape = make_shape(3, 4, 6, 4, 1, "4");
  const MoeParams<double> p = init_params<double>(shape, 8);
  const MoeForward<double> f = moe_forward(shape, p, init_input<double>(shape, 9));
  for (int64_t t = 0; t < 3; ++t) {
    EXPECT_EQ(f.routing.weight[t], f.routing.prob[t]);
    EXPECT_EQ(f.routing.prob[t], f.probs[t * 4 + f.routing.expert[t]]);
  }
}

TEST(ReferenceMoeAux, LossByHand) {
  // E = 2 (M = 2, identity gate), k = 1, T = 4. Logits (ln 3, 0) give p = (3/4, 1/4).
  const double l3 = std::log(3.0);
  const MoeShape shape = make_shape(4, 2, 2, 2, 1, "4");
  const MoeParams<double> p = identity_gate_params(shape, true);
  const std::vector<double> x = flat({{l3, 0}, {l3, 0}, {0, l3}, {l3, 0}});
  // frac = (3/4, 1/4); meanp = ((3*0.75 + 0.25) / 4, (3*0.25 + 0.75) / 4) = (0.625, 0.375);
  // l_aux = 2 * (0.75 * 0.625 + 0.25 * 0.375) = 1.125.
  for (int slices : {1, 2, 4}) {
    SCOPED_TRACE(slices);
    const MoeForward<double> f = moe_forward(shape, p, x, slices);
    EXPECT_EQ(f.aux.first_count, (std::vector<double>{3, 1}));
    EXPECT_NEAR(f.aux.prob_sum[0], 2.5, 1e-14);
    EXPECT_NEAR(f.aux.prob_sum[1], 1.5, 1e-14);
    EXPECT_NEAR(f.l_aux, 1.125, 1e-14);
  }
  // d l_aux / d p[t, e] = E * frac_e / T for every token.
  const MoeForward<double> f = moe_forward(shape, p, x);
  std::vector<double> dprobs(8, 0.0);
  aux_loss_backward(f.aux, 4, 1.0, dprobs);
  for (int64_t t = 0; t < 4; ++t) {
    EXPECT_NEAR(dprobs[t * 2 + 0], 2 * 0.75 / 4, 1e-14);
    EXPECT_NEAR(dprobs[t * 2 + 1], 2 * 0.25 / 4, 1e-14);
  }
  // A uniform gate (Wg = 0): all ties go to e0, frac = (1, 0, ...), meanp = 1/E: l_aux = 1.
  const MoeShape s4 = make_shape(6, 4, 2, 4, 2, "1");
  const MoeParams<double> p0 = MoeParams<double>::zeros(s4);
  EXPECT_NEAR(moe_forward(s4, p0, init_input<double>(s4, 1)).l_aux, 1.0, 1e-14);
}

// The sequence-wise l_aux (docs/spec.md §7) by hand: LossByHand's four tokens as two
// sequences of two. Sequence 0: both 1st choices e0, p = (3/4, 1/4) twice: frac (1, 0),
// meanp (3/4, 1/4), l_aux 2 * 3/4 = 1.5. Sequence 1: one e1 (p (1/4, 3/4)), one e0
// (3/4, 1/4): frac (1/2, 1/2), meanp (1/2, 1/2), l_aux 2 * 1/2 = 1. Mean 1.25, where the
// micro-batch l_aux is 1.125. L = T gives the micro-batch's.
TEST(ReferenceMoeAux, SequenceLossByHand) {
  const double l3 = std::log(3.0);
  MoeShape shape = make_shape(4, 2, 2, 2, 1, "4");
  const MoeParams<double> p = identity_gate_params(shape, true);
  const std::vector<double> x = flat({{l3, 0}, {l3, 0}, {0, l3}, {l3, 0}});
  shape.aux_seq_len = 2;
  for (int slices : {1, 2, 4}) {
    SCOPED_TRACE(slices);
    const MoeForward<double> f = moe_forward(shape, p, x, slices);
    ASSERT_EQ(f.seq_aux.size(), 2u);
    EXPECT_EQ(f.seq_aux[1].first_count, (std::vector<double>{1, 1}));
    EXPECT_NEAR(f.l_aux, 1.25, 1e-14);
  }
  shape.aux_seq_len = 4;
  EXPECT_NEAR(moe_forward(shape, p, x).l_aux, 1.125, 1e-14);
  shape.aux_seq_len = 3;
  EXPECT_THROW(moe_forward(shape, p, x), InvalidConfig);
}

// ---- Precision, slices, ESP --------------------------------------------------------------

TEST(ReferenceMoe, FloatAgreesWithDouble) {
  const MoeShape shape = make_shape(16, 8, 12, 4, 2, "1");
  const MoeParams<float> pf = init_params<float>(shape, 21);
  const MoeParams<double> pd = init_params<double>(shape, 21);
  const std::vector<float> xf = init_input<float>(shape, 22);
  const std::vector<double> xd = init_input<double>(shape, 22);
  // Same draws in both precisions.
  for (size_t i = 0; i < xf.size(); ++i) ASSERT_EQ(static_cast<double>(xf[i]), xd[i]);
  for (size_t i = 0; i < pf.w1.size(); ++i) ASSERT_EQ(static_cast<double>(pf.w1[i]), pd.w1[i]);

  const std::vector<double> dd = uniform_vector(16 * 8, 2, 3);
  const std::vector<float> df(dd.begin(), dd.end());
  const MoeForward<float> ff = moe_forward(shape, pf, xf);
  const MoeForward<double> fd = moe_forward(shape, pd, xd);
  ASSERT_TRUE(same_assignment(ff.routing, fd.routing));
  EXPECT_GT(fd.routing.num_dropped(), 0);
  const MoeGrads<float> gf = moe_backward(pf, ff, df, 0.5f);
  const MoeGrads<double> gd = moe_backward(pd, fd, dd, 0.5);

  const double rtol = 1e-4, atol = 1e-5;
  expect_close(ff.out, fd.out, rtol, atol, "out");
  EXPECT_NEAR(ff.l_aux, fd.l_aux, 1e-5);
  expect_close(gf.dx, gd.dx, rtol, atol, "dx");
  MoeParams<float> gpf = gf.dparams;
  MoeParams<double> gpd = gd.dparams;
  auto lf = tensors_of(gpf);
  auto ld = tensors_of(gpd);
  for (size_t i = 0; i < lf.size(); ++i)
    expect_close(*lf[i].second, *ld[i].second, rtol, atol, "d" + lf[i].first);
}

TEST(ReferenceMoeSlices, WithoutDropsTwoSlicesEqualTheWholeGate) {
  // f = E: C = k * T_slice, so nothing can be dropped, in the full gate or in a slice.
  const MoeShape shape = make_shape(12, 4, 6, 4, 2, "4");
  const MoeParams<double> p = init_params<double>(shape, 31);
  const std::vector<double> x = init_input<double>(shape, 32);
  const std::vector<double> dout = uniform_vector(12 * 4, 33, 1);
  const MoeForward<double> f1 = moe_forward(shape, p, x, 1);
  const MoeForward<double> f2 = moe_forward(shape, p, x, 2);
  ASSERT_EQ(f1.routing.num_dropped(), 0);
  ASSERT_EQ(f2.routing.num_dropped(), 0);
  EXPECT_EQ(f1.routing.expert, f2.routing.expert);
  EXPECT_EQ(f2.routing.capacity, 2 * 6);
  EXPECT_EQ(f2.routing.fill.size(), 2u * 4);

  const MoeGrads<double> g1 = moe_backward(p, f1, dout, 0.3);
  const MoeGrads<double> g2 = moe_backward(p, f2, dout, 0.3);
  const double rtol = 1e-12, atol = 1e-14;
  expect_close(f2.out, f1.out, rtol, atol, "out");
  EXPECT_NEAR(f2.l_aux, f1.l_aux, 1e-14);
  expect_close(g2.dx, g1.dx, rtol, atol, "dx");
  MoeParams<double> a = g2.dparams, b = g1.dparams;
  auto la = tensors_of(a);
  auto lb = tensors_of(b);
  for (size_t i = 0; i < la.size(); ++i)
    expect_close(*la[i].second, *lb[i].second, rtol, atol, "d" + la[i].first);
}

TEST(ReferenceMoeSlices, WithDropsEachSliceIsGatedAlone) {
  const MoeShape shape = make_shape(12, 4, 6, 4, 2, "0.75");
  const int n = 2;
  const int64_t Ts = 6, M = 4, E = 4, k = 2;
  const MoeParams<double> p = init_params<double>(shape, 41);
  const std::vector<double> x = init_input<double>(shape, 42);
  const std::vector<double> dout = uniform_vector(12 * M, 43, 1);
  const MoeForward<double> f = moe_forward(shape, p, x, n);
  const MoeGrads<double> g = moe_backward(p, f, dout, 0.0);  // dl_aux = 0: see below
  ASSERT_GT(f.routing.num_dropped(), 0);
  // The slice capacity comes from the slice's tokens: ceil(2 * 0.75 * 6 / 4) = 3, not the
  // full gate's ceil(2 * 0.75 * 12 / 4) = 5 split in two.
  EXPECT_EQ(f.routing.capacity, 3);

  // l_aux uses the global statistics and is counted before drops: the same as unsliced.
  const MoeForward<double> whole = moe_forward(shape, p, x, 1);
  EXPECT_NEAR(f.l_aux, whole.l_aux, 1e-14);

  MoeParams<double> dsum = MoeParams<double>::zeros(shape);
  MoeShape slice_shape = shape;
  slice_shape.tokens = Ts;
  for (int s = 0; s < n; ++s) {
    SCOPED_TRACE("slice " + std::to_string(s));
    const std::vector<double> xs(x.begin() + s * Ts * M, x.begin() + (s + 1) * Ts * M);
    const std::vector<double> ds(dout.begin() + s * Ts * M, dout.begin() + (s + 1) * Ts * M);
    const MoeForward<double> fs = moe_forward(slice_shape, p, xs, 1);
    EXPECT_EQ(fs.routing.capacity, f.routing.capacity);
    EXPECT_EQ(std::vector<int32_t>(f.routing.expert.begin() + s * Ts * k,
                                   f.routing.expert.begin() + (s + 1) * Ts * k),
              fs.routing.expert);
    EXPECT_EQ(std::vector<int64_t>(f.routing.slot.begin() + s * Ts * k,
                                   f.routing.slot.begin() + (s + 1) * Ts * k),
              fs.routing.slot);
    EXPECT_EQ(std::vector<int64_t>(f.routing.fill.begin() + s * E,
                                   f.routing.fill.begin() + (s + 1) * E),
              fs.routing.fill);
    expect_close(std::vector<double>(f.out.begin() + s * Ts * M, f.out.begin() + (s + 1) * Ts * M),
                 fs.out, 1e-14, 1e-15, "out");
    // With dl_aux = 0 the gradients do not see the (global vs slice) l_aux statistics:
    // dx per slice equals, and the weight gradients are the sums over the slices.
    const MoeGrads<double> gs = moe_backward(p, fs, ds, 0.0);
    expect_close(std::vector<double>(g.dx.begin() + s * Ts * M, g.dx.begin() + (s + 1) * Ts * M),
                 gs.dx, 1e-14, 1e-15, "dx");
    MoeParams<double> gp = gs.dparams;
    auto src = tensors_of(gp);
    auto dst = tensors_of(dsum);
    for (size_t i = 0; i < src.size(); ++i)
      for (size_t j = 0; j < src[i].second->size(); ++j) (*dst[i].second)[j] += (*src[i].second)[j];
  }
  MoeParams<double> gp = g.dparams;
  auto a = tensors_of(gp);
  auto b = tensors_of(dsum);
  for (size_t i = 0; i < a.size(); ++i)
    expect_close(*a[i].second, *b[i].second, 1e-12, 1e-14, "d" + a[i].first);
}

void shards_sum_to_the_whole_expert(ExpertMlp mlp) {
  MoeShape shape = make_shape(4, 4, 6, 3, 1, "1");
  shape.expert_mlp = mlp;
  const int64_t M = 4, rows = 5;
  const MoeParams<double> p = init_params<double>(shape, 51);
  const std::vector<double> x = uniform_vector(rows * M, 52, 1);
  const std::vector<double> dy = uniform_vector(rows * M, 52, 2);
  for (int64_t e = 0; e < shape.experts; ++e) {
    // The whole expert, and its gradients placed in a whole-parameter structure.
    const ExpertWeights<double> w = slice_expert(shape, p, e, 0, 1);
    ExpertActs<double> acts;
    std::vector<double> y, dx;
    expert_shard_forward(w, x, acts, y);
    add_expert_bias(shape, p, e, y);
    ExpertWeights<double> gw;
    expert_shard_backward(w, x, acts, dy, dx, gw);
    std::vector<double> db2;
    expert_bias_backward(M, dy, db2);
    MoeParams<double> gwhole = MoeParams<double>::zeros(shape);
    unslice_expert(shape, gw, e, 0, 1, gwhole);

    for (int n : {1, 2, 3}) {
      SCOPED_TRACE("expert " + std::to_string(e) + ", " + std::to_string(n) + " shards");
      std::vector<double> ysum(rows * M, 0.0), dxsum(rows * M, 0.0);
      MoeParams<double> rebuilt = MoeParams<double>::zeros(shape);
      for (int j = 0; j < n; ++j) {
        const ExpertWeights<double> ws = slice_expert(shape, p, e, j, n);
        EXPECT_EQ(ws.hidden, 6 / n);
        unslice_expert(shape, ws, e, j, n, rebuilt);
        ExpertActs<double> as;
        std::vector<double> part, dxs, db2s;
        expert_shard_forward(ws, x, as, part);
        ExpertWeights<double> gs;
        expert_shard_backward(ws, x, as, dy, dxs, gs);
        for (size_t i = 0; i < part.size(); ++i) {
          ysum[i] += part[i];
          dxsum[i] += dxs[i];
        }
        // The shard's gradients are the slices of the whole expert's.
        const ExpertWeights<double> want = slice_expert(shape, gwhole, e, j, n);
        expect_close(gs.w1, want.w1, 1e-13, 1e-15, "dw1 shard");
        expect_close(gs.b1, want.b1, 1e-13, 1e-15, "db1 shard");
        expect_close(gs.w2, want.w2, 1e-13, 1e-15, "dw2 shard");
        expect_close(gs.w3, want.w3, 1e-13, 1e-15, "dw3 shard");
        EXPECT_EQ(gs.w3.size(), is_gated(mlp) ? 4u * 6 / n : 0u);
        // Every shard forms the whole db2 from the output gradient it holds.
        expert_bias_backward(M, dy, db2s);
        EXPECT_EQ(db2s, db2);
      }
      add_expert_bias(shape, p, e, ysum);  // b2 once, after the sum
      expect_close(ysum, y, 1e-13, 1e-15, "sum of partial outputs + b2");
      expect_close(dxsum, dx, 1e-13, 1e-15, "sum of shard dx");
      // slice then unslice puts every element back.
      const ExpertWeights<double> back = slice_expert(shape, rebuilt, e, 0, 1);
      EXPECT_EQ(back.w1, w.w1);
      EXPECT_EQ(back.b1, w.b1);
      EXPECT_EQ(back.w2, w.w2);
      EXPECT_EQ(back.w3, w.w3);
    }
  }
  EXPECT_THROW(slice_expert(shape, p, 0, 0, 4), InvalidConfig);  // 6 % 4 != 0
  EXPECT_THROW(slice_expert(shape, p, 0, 2, 2), InvalidConfig);
  EXPECT_THROW(slice_expert(shape, p, 3, 0, 1), InvalidConfig);
}

TEST(ReferenceMoeExpertShards, ShardsSumToTheWholeExpert) {
  shards_sum_to_the_whole_expert(ExpertMlp::kGelu);
}

// SwiGLU: W1 and W3 split along H like W1, W2 along H; no b2 (add_expert_bias adds nothing).
TEST(ReferenceMoeExpertShards, SwigluShardsSumToTheWholeExpert) {
  shards_sum_to_the_whole_expert(ExpertMlp::kSwiglu);
}

// SwiGLU by hand: one expert, M = H = 1, W1 = 2, W3 = 3, W2 = 5 at x = 0.5: pre = 1, gate =
// 1.5, act = silu(1) * 1.5, y = 5 act, no bias.
TEST(ReferenceMoeExpertShards, SwigluByHand) {
  MoeShape shape = make_shape(1, 1, 1, 1, 1, "1");
  shape.expert_mlp = ExpertMlp::kSwiglu;
  MoeParams<double> p = MoeParams<double>::zeros(shape);
  EXPECT_TRUE(p.b1.empty());
  EXPECT_TRUE(p.b2.empty());
  p.w1 = {2.0};
  p.w3 = {3.0};
  p.w2 = {5.0};
  const ExpertWeights<double> w = slice_expert(shape, p, 0, 0, 1);
  ExpertActs<double> acts;
  std::vector<double> y, dx;
  expert_shard_forward(w, {0.5}, acts, y);
  const double s = 1.0 / (1.0 + std::exp(-1.0)), silu = s;  // silu(1) = 1 * sigmoid(1)
  EXPECT_NEAR(y[0], 5.0 * silu * 1.5, 1e-15);
  add_expert_bias(shape, p, 0, y);
  EXPECT_NEAR(y[0], 5.0 * silu * 1.5, 1e-15);
  ExpertWeights<double> g;
  expert_shard_backward(w, {0.5}, acts, {1.0}, dx, g);
  const double dsilu = s * (1.0 + 1.0 * (1.0 - s));
  // dact = 5; dpre = 5 * 1.5 * silu'(1); dgate = 5 silu(1).
  EXPECT_NEAR(g.w2[0], silu * 1.5, 1e-15);
  EXPECT_NEAR(g.w1[0], 0.5 * 5.0 * 1.5 * dsilu, 1e-14);
  EXPECT_NEAR(g.w3[0], 0.5 * 5.0 * silu, 1e-14);
  EXPECT_NEAR(dx[0], 5.0 * 1.5 * dsilu * 2.0 + 5.0 * silu * 3.0, 1e-14);
  EXPECT_TRUE(g.b1.empty());
}

TEST(ReferenceMoe, LayerUsesTheExpertOnEveryKeptToken) {
  // out_t = sum over kept choices of w * y_e(x_t), written out independently of the
  // dispatch buffer.
  const MoeShape shape = make_shape(10, 4, 6, 4, 2, "0.75");
  const MoeParams<double> p = init_params<double>(shape, 61);
  const std::vector<double> x = init_input<double>(shape, 62);
  const MoeForward<double> f = moe_forward(shape, p, x);
  ASSERT_GT(f.routing.num_dropped(), 0);
  std::vector<double> want(10 * 4, 0.0);
  for (int64_t t = 0; t < 10; ++t) {
    const std::vector<double> xt(x.begin() + t * 4, x.begin() + (t + 1) * 4);
    for (int j = 0; j < 2; ++j) {
      if (!f.routing.kept(t, j)) continue;
      const std::vector<double> y = whole_expert(shape, p, f.routing.expert[t * 2 + j], xt);
      for (int64_t m = 0; m < 4; ++m) want[t * 4 + m] += f.routing.weight[t * 2 + j] * y[m];
    }
  }
  expect_close(f.out, want, 1e-14, 1e-15, "out");
}

TEST(ReferenceMoe, InitIsDeterministic) {
  const MoeShape shape = make_shape(8, 4, 6, 4, 2, "1");
  const MoeParams<double> a = init_params<double>(shape, 1), b = init_params<double>(shape, 1);
  const MoeParams<double> c = init_params<double>(shape, 2);
  EXPECT_EQ(a.w1, b.w1);
  EXPECT_NE(a.w1, c.w1);
  EXPECT_NE(a.wg, std::vector<double>(a.wg.size(), 0.0));
  for (double v : a.b1) EXPECT_NE(v, 0.0);
  for (double v : a.b2) EXPECT_NE(v, 0.0);
  // Element i of a whole tensor is normal draw i of its stream, scaled in float.
  Rng rng(1, kStreamW2);
  for (size_t i = 0; i < a.w2.size(); ++i) {
    const float want = (1.0f / std::sqrt(6.0f)) * rng.normal();
    ASSERT_EQ(a.w2[i], static_cast<double>(want)) << i;
  }
  const Tensor t = to_tensor(a.w1, {4, 4, 6});
  EXPECT_EQ(from_tensor<double>(t), a.w1);  // the values are floats already
}

TEST(ReferenceMoe, RefusesBadShapes) {
  const MoeShape shape = make_shape(12, 4, 6, 4, 2, "1");
  const MoeParams<double> p = init_params<double>(shape, 1);
  const std::vector<double> x = init_input<double>(shape, 1);
  EXPECT_THROW(moe_forward(shape, p, x, 5), InvalidConfig);  // 12 % 5 != 0
  EXPECT_THROW(moe_forward(shape, p, x, 0), InvalidConfig);
  MoeShape bad = shape;
  bad.topk = 5;  // k > E
  EXPECT_THROW(bad.validate(), InvalidConfig);
  bad = shape;
  bad.tokens = 0;
  EXPECT_THROW(bad.validate(), InvalidConfig);
  try {
    moe_forward(shape, p, x, 5);
  } catch (const InvalidConfig& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of num_slices"), std::string::npos) << e.what();
  }
  EXPECT_THROW(moe_forward(shape, p, std::vector<double>(7), 1), Error);  // wrong x size
}

}  // namespace
}  // namespace parm::ref
