// The trainer's re-plan input: the routing imbalance from an MoE layer's expert loads.
#include <gtest/gtest.h>

#include "moe/load_balance.h"
#include "parm/error.h"
#include "train/schedule_plan.h"

namespace parm::train {
namespace {

TEST(SchedulePlan, RoutedLoadMaxOverMean) {
  // 8 experts on 4 EP ranks: rank loads 3, 7, 5, 1 (mean 4): the busiest over the mean.
  EXPECT_DOUBLE_EQ(routed_load_max_over_mean({1, 2, 3, 4, 5, 0, 1, 0}, 4), 7.0 / 4.0);
  // The same loads on 2 EP ranks: 10 and 6 (mean 8).
  EXPECT_DOUBLE_EQ(routed_load_max_over_mean({1, 2, 3, 4, 5, 0, 1, 0}, 2), 10.0 / 8.0);
  // One EP rank holds every expert: balanced whatever the experts' loads.
  EXPECT_DOUBLE_EQ(routed_load_max_over_mean({9, 0, 0, 1}, 1), 1.0);
  EXPECT_DOUBLE_EQ(routed_load_max_over_mean({2, 2, 2, 2}, 4), 1.0);
  EXPECT_DOUBLE_EQ(routed_load_max_over_mean({0, 0, 0, 0}, 2), 1.0);  // nothing routed
}

TEST(SchedulePlan, RoutedLoadRefusesBadInput) {
  EXPECT_THROW(routed_load_max_over_mean({1, 2, 3}, 2), Error);
  EXPECT_THROW(routed_load_max_over_mean({}, 1), Error);
  EXPECT_THROW(routed_load_max_over_mean({1, -2}, 1), Error);
}

// The one imbalance ratio behind the plan's, LoadImbalance's and the cost model's.
TEST(SchedulePlan, MaxOverMeanIsTheOneRatio) {
  EXPECT_DOUBLE_EQ(max_over_mean(6.0, 16.0, 4.0, 1.0), 1.5);  // busiest 6 of 4 shares, mean 4
  EXPECT_DOUBLE_EQ(max_over_mean(0.0, 0.0, 4.0, 1.0), 1.0);   // nothing: the caller's value
  EXPECT_DOUBLE_EQ(max_over_mean(0.0, 0.0, 4.0, 0.0), 0.0);
  // Per expert (every expert its own group), as LoadImbalance::expert_max_over_mean.
  EXPECT_DOUBLE_EQ(max_over_mean({1, 2, 3, 6}, 4, 0.0), 2.0);
  EXPECT_DOUBLE_EQ(max_over_mean({0, 0}, 2, 0.0), 0.0);
  EXPECT_THROW(max_over_mean(-1.0, 4.0, 2.0, 1.0), Error);
}

}  // namespace
}  // namespace parm::train
