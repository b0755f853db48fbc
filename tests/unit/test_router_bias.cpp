// DeepSeek-V3's router bias: it moves the top-k choice and nothing else, and its update rule.
#include <gtest/gtest.h>

#include <vector>

#include "moe/load_balance.h"
#include "moe/moe_ops.h"
#include "moe/reference_moe.h"

namespace parm {
namespace {

// Two tokens, three experts, identity gate (M = E): a token's logits are its x row.
void gate(const std::vector<float>* bias, moe::GateRouting& r, Tensor& probs) {
  Tensor x({2, 3}), wg({3, 3});
  const float xs[] = {1.0f, 0.5f, 0.0f, 0.0f, 0.2f, 1.0f};
  for (int i = 0; i < 6; ++i) x[i] = xs[i];
  for (int i = 0; i < 3; ++i) wg[i * 3 + i] = 1.0f;
  std::vector<float> stats(7);
  moe::gate_forward(x, wg, 2, 4, 4, probs, r, stats.data(), nullptr,
                    bias ? bias->data() : nullptr);
}

TEST(RouterBias, MovesTheChoiceNotTheWeights) {
  moe::GateRouting plain, biased;
  Tensor p0({2, 3}), p1({2, 3});
  gate(nullptr, plain, p0);
  EXPECT_EQ(plain.expert, (std::vector<int32_t>{0, 1, 2, 1}));
  // Expert 2 gets +1: it becomes token 0's first choice, and token 1's stays.
  const std::vector<float> bias = {0.0f, 0.0f, 1.0f};
  gate(&bias, biased, p1);
  EXPECT_EQ(biased.expert, (std::vector<int32_t>{2, 0, 2, 1}));
  for (size_t i = 0; i < biased.expert.size(); ++i) {
    const int64_t t = static_cast<int64_t>(i) / 2;
    // The probability and the weight are the unbiased ones of the chosen expert.
    EXPECT_EQ(biased.prob[i], p1.row(t)[biased.expert[i]]) << i;
    const float other = biased.prob[i ^ 1u];
    EXPECT_FLOAT_EQ(biased.weight[i], biased.prob[i] / (biased.prob[i] + other)) << i;
  }
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(p0[i], p1[i]);
}

TEST(RouterBias, OracleChoiceUsesTheBias) {
  const MoeShape shape = MoeShape::of(2, 3, 4, 3, 2, "4");
  const std::vector<double> probs = {0.5, 0.3, 0.2, 0.2, 0.3, 0.5};
  const std::vector<double> bias = {0.0, 0.0, 1.0};
  const auto r = ref::route(shape, probs, 1, &bias);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{2, 0, 2, 1}));
  EXPECT_DOUBLE_EQ(r.weight[0], 0.2 / 0.7);
}

TEST(RouterBias, UpdateRuleStepsTowardTheMeanLoad) {
  std::vector<float> bias = {0.5f, 0.0f, -0.25f, 0.0f};
  // Mean load 10: expert 0 above, 1 at the mean, 2 and 3 below.
  router_bias_step({16.0, 10.0, 4.0, 10.0 - 0.0}, 0.125f, bias);
  EXPECT_EQ(bias, (std::vector<float>{0.375f, 0.0f, -0.125f, 0.0f}));
  router_bias_step({0.0, 30.0, 5.0, 5.0}, 0.125f, bias);  // mean 10
  EXPECT_EQ(bias, (std::vector<float>{0.5f, -0.125f, 0.0f, 0.125f}));
}

}  // namespace
}  // namespace parm
