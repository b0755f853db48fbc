// The router options of docs/spec.md §7 by hand: group-limited selection (a group's score the
// sum of its two largest scores, the K_g best groups, ties to the lower group and expert),
// sigmoid scores, the top-k normalisation and the route scale, in the oracle and the CPU gate;
// and the refusals of bad combinations.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "moe/moe_ops.h"
#include "moe/reference_moe.h"
#include "parm/error.h"

namespace parm {
namespace {

RouterSpec groups(int g, int kg) {
  RouterSpec r;
  r.groups = g;
  r.group_topk = kg;
  return r;
}

// E = 8 in 4 groups of 2, K_g = 2, k = 2. Scores are sums of powers of two, so the group
// scores tie exactly where meant to.
TEST(RouterGroups, OracleKeepsTheBestGroupsTiesToTheLowerOne) {
  MoeShape shape = MoeShape::of(3, 8, 4, 8, 2, "4");
  shape.router = groups(4, 2);
  const std::vector<double> probs = {
      // groups 0.25, 0.375, 0, 0.3125: groups 1 and 3; top-2 of {2, 3, 6, 7}: 6, then 2
      // (2 and 3 tie: the lower expert). Unlimited it would be 6, 0.
      0.25, 0.0, 0.1875, 0.1875, 0.0, 0.0, 0.3125, 0.0,
      // groups 0.375, 0.375, 0.375, 0.125: a three-way tie keeps groups 0 and 1; top-2 of
      // {0..3}: 0, 2. Unlimited: 4, 0.
      0.25, 0.125, 0.1875, 0.1875, 0.375, 0.0, 0.0, 0.125,
      // The groups' best two, not their best one: group 0's 0.5 alone loses to groups 2
      // (0.25 + 0.3125) and 3 (0.375 + 0.25); top-2 of {4..7}: 6, 5. Unlimited: 0, 6.
      0.5, 0.0, 0.0, 0.0, 0.25, 0.3125, 0.375, 0.25};
  const auto r = ref::route(shape, probs);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{6, 2, 0, 2, 6, 5}));
  MoeShape open = shape;
  open.router = {};
  EXPECT_EQ(ref::route(open, probs).expert, (std::vector<int32_t>{6, 0, 4, 0, 0, 6}));
}

// The CPU gate: equal logits tie every group, so groups 0 and 1 and experts 0, 1, 2 win;
// a router bias on group 3 makes it the best group and group 0 (lowest of the tied rest)
// the second.
TEST(RouterGroups, CpuGateTiesAndBias) {
  const int64_t T = 2, E = 8;
  Tensor x({T, E}), wg({E, E}), probs({T, E});
  for (int64_t i = 0; i < E; ++i) wg[i * E + i] = 1.0f;
  std::vector<float> stats(2 * E + 1);
  moe::GateRouting r;
  moe::gate_forward(x, wg, 3, 8, 8, probs, r, stats.data(), nullptr, nullptr, groups(4, 2));
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 1, 2, 0, 1, 2}));
  const std::vector<float> bias = {0, 0, 0, 0, 0, 0, 0.5f, 0.25f};
  moe::gate_forward(x, wg, 3, 8, 8, probs, r, stats.data(), nullptr, bias.data(),
                    groups(4, 2));
  EXPECT_EQ(r.expert, (std::vector<int32_t>{6, 7, 0, 6, 7, 0}));
}

// Sigmoid scores, the normalisation off and a scale: the weights are scale * s, l_aux's
// probability sums the per-token normalised scores.
TEST(RouterScores, SigmoidWeightsAndAuxStatistics) {
  const int64_t T = 1, E = 3;
  Tensor x({T, E}), wg({E, E}), probs({T, E});
  for (int64_t i = 0; i < E; ++i) wg[i * E + i] = 1.0f;
  const float logit[] = {1.0f, 0.0f, -2.0f};
  for (int64_t e = 0; e < E; ++e) x[e] = logit[e];
  RouterSpec rs;
  rs.score = RouterScore::kSigmoid;
  rs.topk_norm = false;
  rs.scale = 2.0f;
  std::vector<float> stats(2 * E + 1);
  moe::GateRouting r;
  moe::gate_forward(x, wg, 2, 4, 4, probs, r, stats.data(), nullptr, nullptr, rs);
  auto sig = [](double l) { return 1.0 / (1.0 + std::exp(-l)); };
  EXPECT_EQ(r.expert, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(r.weight[0], 2.0 * sig(1.0), 1e-6);
  EXPECT_NEAR(r.weight[1], 2.0 * sig(0.0), 1e-6);
  const double z = sig(1.0) + sig(0.0) + sig(-2.0);
  for (int64_t e = 0; e < E; ++e) EXPECT_NEAR(stats[E + e], sig(logit[e]) / z, 1e-6) << e;
  EXPECT_EQ(stats[0], 1.0f);  // the 1st choice's count
  // Normalised (the default) with the scale: 2 s_j / (s_0 + s_1).
  rs.topk_norm = true;
  moe::gate_forward(x, wg, 2, 4, 4, probs, r, stats.data(), nullptr, nullptr, rs);
  EXPECT_NEAR(r.weight[0], 2.0 * sig(1.0) / (sig(1.0) + sig(0.0)), 1e-6);
}

TEST(RouterSpecValidate, RefusesBadCombinationsNamingTheValidValues) {
  auto refused = [](RouterSpec r, int64_t E, int k, const char* text) {
    try {
      r.validate(E, k);
    } catch (const InvalidConfig& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << text;
  };
  refused(groups(3, 1), 8, 2, "must divide the 8 experts");
  refused(groups(4, 5), 8, 2, "must be in [1, --router-groups = 4]");
  refused(groups(4, 1), 8, 3, "top-k 3 exceeds the 2 experts of the 1 chosen groups");
  refused(groups(1, 2), 8, 2, "must be in [1, --router-groups = 1]");
  RouterSpec s;
  s.scale = -1.0f;
  refused(s, 8, 2, "--router-scale (model.router_scale) must be a positive number");
  EXPECT_THROW(parse_router_score("relu"), InvalidConfig);
  groups(4, 2).validate(8, 4);  // k = K_g x E / G: the limit itself is fine
}

// The gate without the z-loss skips the log-sum-exps: the same scores, routing and statistics
// but a zero z-loss sum, under softmax and sigmoid; its backward equals the z-loss gate's at a
// zero z-loss gradient and refuses a nonzero one (it has no log-sum-exps to use).
TEST(RouterZLoss, GateWithoutTheZLossSkipsOnlyItsSum) {
  const int64_t T = 6, M = 5, E = 8;
  Tensor x({T, M}), wg({M, E});
  for (int64_t i = 0; i < x.numel(); ++i) x[i] = std::sin(0.7f * static_cast<float>(i));
  for (int64_t i = 0; i < wg.numel(); ++i) wg[i] = std::cos(0.3f * static_cast<float>(i));
  for (const RouterScore score : {RouterScore::kSoftmax, RouterScore::kSigmoid}) {
    RouterSpec rs;
    rs.score = score;
    Tensor p_on({T, E}), p_off({T, E});
    std::vector<float> s_on(2 * E + 1), s_off(2 * E + 1, 7.0f);
    moe::GateRouting r_on, r_off;
    moe::gate_forward(x, wg, 2, 4, 4, p_on, r_on, s_on.data(), nullptr, nullptr, rs);
    moe::gate_forward(x, wg, 2, 4, 4, p_off, r_off, s_off.data(), nullptr, nullptr, rs, {}, 1,
                      false);
    EXPECT_NE(s_on[2 * E], 0.0f);
    EXPECT_EQ(s_off[2 * E], 0.0f);
    s_on[2 * E] = 0.0f;
    EXPECT_EQ(s_on, s_off);
    EXPECT_EQ(r_on.expert, r_off.expert);
    EXPECT_EQ(r_on.weight, r_off.weight);
    for (int64_t i = 0; i < p_on.numel(); ++i) ASSERT_EQ(p_on[i], p_off[i]) << i;

    const std::vector<float> dweight(static_cast<size_t>(T * 2), 0.5f);
    std::vector<float> dstats(2 * E + 1, 0.25f);
    dstats[2 * E] = 0.0f;
    Tensor dp_on({T, E}), dp_off({T, E}), dwg_on({M, E}), dwg_off({M, E}), dx_on({T, M}),
        dx_off({T, M});
    moe::gate_backward(x, wg, p_on, r_on, dweight, dstats.data(), dp_on, dwg_on, dx_on);
    moe::gate_backward(x, wg, p_off, r_off, dweight, dstats.data(), dp_off, dwg_off, dx_off);
    for (int64_t i = 0; i < dwg_on.numel(); ++i) ASSERT_EQ(dwg_on[i], dwg_off[i]) << i;
    for (int64_t i = 0; i < dx_on.numel(); ++i) ASSERT_EQ(dx_on[i], dx_off[i]) << i;
    dstats[2 * E] = 1.0f;
    EXPECT_THROW(
        moe::gate_backward(x, wg, p_off, r_off, dweight, dstats.data(), dp_off, dwg_off, dx_off),
        Error);
  }
}

}  // namespace
}  // namespace parm
