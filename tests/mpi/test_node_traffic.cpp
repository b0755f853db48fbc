// The routed rows that cross nodes (src/moe/node_traffic.h) on an emulated two-node cluster:
// counted again here from the fp64 oracle's routing of every rank's tokens, and node-limited
// routing (--router-groups = the nodes, --router-group-topk 1) keeps each token on one node.
#include <gtest/gtest.h>

#include <vector>

#include "moe/layer_check.h"
#include "moe/node_traffic.h"
#include "moe/reference_moe.h"
#include "mpi_test_util.h"

namespace parm {
namespace {

// Every rank's share of the traffic from the oracle: rank r gates check_input(s, seed, r)
// and expert e lives on world rank e / (E / n) (mp 1, ep n: the EP group is the world).
NodeTraffic oracle_traffic(const MoeShape& s, uint64_t seed, int n, int ranks_per_node) {
  const auto params = ref::init_params<double>(s, seed);
  double cross = 0.0, nodes = 0.0;
  for (int r = 0; r < n; ++r) {
    const auto xf = check_input(s, seed, r);
    const std::vector<double> x(xf.begin(), xf.end());
    std::vector<double> logits, probs;
    ref::gate_forward(s, params.wg, x, logits, probs);
    const ref::Routing<double> rt = ref::route(s, probs);
    for (int64_t t = 0; t < s.tokens; ++t) {
      std::vector<bool> reached(static_cast<size_t>(n / ranks_per_node), false);
      for (int j = 0; j < s.topk; ++j) {
        const int64_t e = rt.expert[static_cast<size_t>(t * s.topk + j)];
        const int node = static_cast<int>(e / (s.experts / n)) / ranks_per_node;
        if (node == r / ranks_per_node) continue;
        cross += 1.0;
        reached[static_cast<size_t>(node)] = true;
      }
      for (bool b : reached) nodes += b ? 1.0 : 0.0;
    }
  }
  const double tokens = static_cast<double>(s.tokens) * n;
  return {cross / tokens, nodes / tokens};
}

NodeTraffic layer_traffic(const MoeShape& s, uint64_t seed, int ranks_per_node) {
  TopologyOptions o;
  o.ep = test::world_size();
  o.ranks_per_node = ranks_per_node;
  o.timeout_s = 120.0;
  auto topo = Topology::create(o);
  MoeLayer layer(*topo, s, schedule::Kind::kS2, false, 3);
  layer.load_whole(ref::init_params<float>(s, seed));
  auto x = check_input(s, seed, topo->world_rank());
  layer.forward(Tensor::view(x.data(), {s.tokens, s.model_dim}));
  return node_traffic(*topo, layer);
}

TEST(NodeTraffic, CountsTheOraclesRoutingAndTheGroupLimitKeepsATokenOnOneNode) {
  const int n = test::world_size();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even world size (two emulated nodes)";
  const int rpn = n / 2;
  const uint64_t seed = 5;
  MoeShape s = MoeShape::of(64, 8, 16, 4 * n, 4, "none");  // dropless: every choice travels

  const NodeTraffic free = layer_traffic(s, seed, rpn);
  const NodeTraffic want_free = oracle_traffic(s, seed, n, rpn);
  EXPECT_DOUBLE_EQ(free.cross_choices_per_token, want_free.cross_choices_per_token);
  EXPECT_DOUBLE_EQ(free.cross_nodes_per_token, want_free.cross_nodes_per_token);
  // k 4 over two nodes: some token splits its choices between them.
  EXPECT_LT(free.cross_choices_per_token, 4.0 * free.cross_nodes_per_token);
  EXPECT_GT(free.cross_nodes_per_token, 0.0);

  s.router.groups = 2;  // group g: the experts of node g
  s.router.group_topk = 1;
  const NodeTraffic limited = layer_traffic(s, seed, rpn);
  const NodeTraffic want_limited = oracle_traffic(s, seed, n, rpn);
  EXPECT_DOUBLE_EQ(limited.cross_choices_per_token, want_limited.cross_choices_per_token);
  EXPECT_DOUBLE_EQ(limited.cross_nodes_per_token, want_limited.cross_nodes_per_token);
  // All k choices of a token on one node: to the other node all of them, or none.
  EXPECT_DOUBLE_EQ(limited.cross_choices_per_token, 4.0 * limited.cross_nodes_per_token);
  EXPECT_LE(limited.cross_nodes_per_token, 1.0);
}

}  // namespace
}  // namespace parm
