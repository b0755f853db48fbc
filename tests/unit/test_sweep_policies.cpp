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

TEST(SweepPolicies, AnUnmeasuredChoiceIsRefused) {
  EXPECT_THROW(policy_view({{{{"s1", 1.0}}, "s2"}}), Error);
  EXPECT_EQ(policy_view({}).best_fixed(), nullptr);
}

}  // namespace
}  // namespace parm::perfmodel
