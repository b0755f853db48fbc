// The load statistics of a layer's last forward pass (src/moe/load_balance.h): the imbalance
// from expert loads computed once equals the one that computes them itself, and uses the
// loads it is given instead of gathering them again.
#include <gtest/gtest.h>

#include <vector>

#include "moe/layer_check.h"
#include "moe/load_balance.h"
#include "moe/reference_moe.h"
#include "mpi_test_util.h"

namespace parm {
namespace {

// AllReduce calls made on the host communicators of the layer's stage groups.
int64_t stage_allreduces(Topology& topo) {
  int64_t calls = 0;
  for (Group g : {Group::kEsp, Group::kEp, Group::kEdp})
    calls += topo.host_comm(g).stats().op(CommOp::kAllReduce).calls;
  return calls;
}

TEST(LoadBalance, ImbalanceFromSharedLoadsGathersThemOnce) {
  const int n = test::world_size();
  auto topo = test::make_topology(1, n, 1);
  auto s = MoeShape::of(48, 8, 16, 24, 2, "none");  // E: divisible by CTest's world sizes
  MoeLayer layer(*topo, s, schedule::Kind::kS1, false, 3);
  layer.load_whole(ref::init_params<float>(s, 3));
  auto x = check_input(s, 3, topo->world_rank());
  layer.forward(Tensor::view(x.data(), {s.tokens, s.model_dim}));

  topo->reset_stats();
  const LoadImbalance own = load_imbalance(*topo, layer);
  const int64_t own_calls = stage_allreduces(*topo);
  topo->reset_stats();
  const std::vector<double> loads = expert_loads(*topo, layer);
  const int64_t load_calls = stage_allreduces(*topo);
  topo->reset_stats();
  const LoadImbalance shared = load_imbalance(*topo, layer, loads);
  EXPECT_EQ(stage_allreduces(*topo), own_calls - load_calls) << "the loads were gathered again";
  EXPECT_GT(load_calls, 0);
  EXPECT_EQ(shared.expert_max_over_mean, own.expert_max_over_mean);
  EXPECT_EQ(shared.rank_max_over_mean, own.rank_max_over_mean);

  // Given loads are the ones used: all on one expert is E times the mean.
  std::vector<double> one_hot(static_cast<size_t>(s.experts), 0.0);
  one_hot[3] = 5.0;
  EXPECT_EQ(load_imbalance(*topo, layer, one_hot).expert_max_over_mean,
            static_cast<double>(s.experts));
}

}  // namespace
}  // namespace parm
