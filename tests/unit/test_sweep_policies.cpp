// The sweep's policy view (perfmodel/sweep_policies.h) on hand-made measurements.
#include <gtest/gtest.h>

#include "parm/error.h"
#include "perfmodel/sweep_policies.h"

namespace parm::perfmodel {
namespace {

TEST(SweepPolicies, AutoAgainstTheFastestAndEveryFixedRule) {
  // Three configurations; s1+fused exists in the last two only.
  const std::vector<PolicyConfig> configs = {
      {{{"baseline", 10.0}, {"s1", 8.0}, {"s2", 9.0}}, "s1"},               // auto fastest
      {{{"s1", 6.0}, {"s1+fused", 4.0}, {"s2", 5.0}}, "s1"},                // fused fastest
      {{{"s1", 3.0}, {"s1+fused", 2.0}, {"s2", 2.5}}, "s2"}};
  const PolicyView v = policy_view(configs);
  EXPECT_EQ(v.configs, 3);
  EXPECT_DOUBLE_EQ(v.auto_total_ms, 8.0 + 6.0 + 2.5);
  EXPECT_DOUBLE_EQ(v.fastest_total_ms, 8.0 + 4.0 + 2.0);
  EXPECT_DOUBLE_EQ(v.auto_over_fastest(), 16.5 / 14.0);
  ASSERT_EQ(v.fixed.size(), 4u);  // baseline, s1, s1+fused, s2 (name order)
  EXPECT_EQ(v.fixed[0].schedule, "baseline");
  EXPECT_EQ(v.fixed[0].configs, 1);
  EXPECT_DOUBLE_EQ(v.fixed[0].over_auto(), 10.0 / 8.0);
  EXPECT_EQ(v.fixed[2].schedule, "s1+fused");
  EXPECT_EQ(v.fixed[2].configs, 2);
  EXPECT_DOUBLE_EQ(v.fixed[2].total_ms, 6.0);
  EXPECT_DOUBLE_EQ(v.fixed[2].auto_total_ms, 8.5);  // auto on the same two
  EXPECT_DOUBLE_EQ(v.fixed[3].over_auto(), 16.5 / 16.5);
  ASSERT_NE(v.best_fixed(), nullptr);
  EXPECT_EQ(v.best_fixed()->schedule, "s1+fused");
  EXPECT_NE(policy_table(v).find("s1+fused"), std::string::npos);
}

TEST(SweepPolicies, TheHalvesJudgeTheNoise) {
  // Two configurations, auto always s1. Even rounds: s2 fastest in both; odd rounds: s1 in
  // the first, s2 in the second.
  std::vector<PolicyConfig> configs = {
      {{{"s1", 10.0}, {"s2", 10.0}}, "s1", {{{{"s1", 11.0}, {"s2", 9.0}}, {{"s1", 9.0}, {"s2", 12.0}}}}},
      {{{"s1", 20.0}, {"s2", 19.0}}, "s1", {{{{"s1", 21.0}, {"s2", 18.0}}, {{"s1", 19.0}, {"s2", 18.5}}}}}};
  const PolicyHalves h = policy_halves(configs);
  ASSERT_EQ(h.configs, 2);
  EXPECT_DOUBLE_EQ(h.auto_total_ms, 11.0 + 21.0 + 9.0 + 19.0);
  // Config 1: even's fastest s2 timed by odd 12; odd's fastest s1 timed by even 11.
  // Config 2: even's fastest s2 timed by odd 18.5; odd's fastest s2 timed by even 18.
  EXPECT_DOUBLE_EQ(h.cross_fastest_total_ms, 12.0 + 11.0 + 18.5 + 18.0);
  EXPECT_DOUBLE_EQ(h.auto_over_cross_fastest(), 60.0 / 59.5);
  EXPECT_DOUBLE_EQ(h.even.fixed[1].over_auto(), 27.0 / 32.0);  // s2 in the even rounds
  EXPECT_DOUBLE_EQ(h.odd.fixed[1].over_auto(), 30.5 / 28.0);
  EXPECT_EQ(h.verdicts.at("s2"), Verdict::kHalvesDisagree);
  EXPECT_EQ(h.verdicts.at("s1"), Verdict::kDoesNotBeatAuto);  // auto itself: ratio 1
  // s2 faster in both halves: confirmed.
  configs[0].half_ms[1]["s2"] = 8.0;
  EXPECT_EQ(policy_halves(configs).verdicts.at("s2"), Verdict::kBeatsAuto);
  EXPECT_NE(halves_table(policy_halves(configs)).find("beats auto"), std::string::npos);
  // A configuration measured in one round: no halves at all.
  configs[1].half_ms[1].clear();
  EXPECT_EQ(policy_halves(configs).configs, 0);
  EXPECT_EQ(halves_table(policy_halves(configs)), "");
}

TEST(SweepPolicies, AnUnmeasuredChoiceIsRefused) {
  EXPECT_THROW(policy_view({{{{"s1", 1.0}}, "s2"}}), Error);
  EXPECT_EQ(policy_view({}).best_fixed(), nullptr);
}

}  // namespace
}  // namespace parm::perfmodel
