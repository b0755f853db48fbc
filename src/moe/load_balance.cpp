#include "moe/load_balance.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "parm/error.h"

namespace parm {
namespace {

// A sum (or max) over the layer's pipeline stage: its esp, ep and edp groups in turn.
void over_stage(Topology& topo, double* v, size_t n, ReduceOp op) {
  for (Group g : {Group::kEsp, Group::kEp, Group::kEdp}) topo.host_comm(g).allreduce(v, n, op);
}

}  // namespace

std::string LoadImbalance::str() const {
  return fmt::format("max/mean per expert {:.3f}, per rank {:.3f}", expert_max_over_mean,
                     rank_max_over_mean);
}

std::vector<double> expert_loads(Topology& topo, MoeLayer& layer) {
  // The ranks that run this layer (one pipeline stage) are exactly the product of its
  // esp, ep and edp groups: a sum (or max) over the three in turn covers the stage and
  // nothing else, so stages with other MoE layers never take part.
  const auto& sc = layer.schedule();
  const auto E = static_cast<size_t>(layer.shape().experts);
  // Routed choices per expert of this rank's gate call, unless an MP peer gates the same
  // tokens (every schedule but S1 gates the MP group's T tokens on each of its ranks).
  std::vector<double> per_expert(E, 0.0);
  const bool counts = sc.gate_tokens != sc.total_tokens || topo.comm(Group::kMp).rank() == 0;
  if (counts) {
    const auto& fill = layer.backend().fill();
    for (size_t e = 0; e < per_expert.size(); ++e) per_expert[e] = static_cast<double>(fill[e]);
  }
  over_stage(topo, per_expert.data(), per_expert.size(), ReduceOp::kSum);
  return per_expert;
}

void router_bias_step(const std::vector<double>& load, float rate, std::vector<float>& bias) {
  PARM_CHECK_EQ(load.size(), bias.size());
  double mean = 0.0;
  for (double x : load) mean += x;
  mean /= static_cast<double>(std::max<size_t>(load.size(), 1));
  for (size_t e = 0; e < load.size(); ++e)
    bias[e] += load[e] < mean ? rate : load[e] > mean ? -rate : 0.0f;
}

void update_router_bias(MoeLayer& layer, const std::vector<double>& loads, float rate) {
  router_bias_step(loads, rate, layer.router_bias());
}

LoadImbalance load_imbalance(Topology& topo, MoeLayer& layer) {
  return load_imbalance(topo, layer, expert_loads(topo, layer));
}

LoadImbalance load_imbalance(Topology& topo, MoeLayer& layer, const std::vector<double>& loads) {
  PARM_CHECK_EQ(static_cast<int64_t>(loads.size()), layer.shape().experts);
  double mine = 0.0;
  for (int64_t r : layer.expert_rows()) mine += static_cast<double>(r);
  double rows[2] = {mine, mine};  // sum, max
  over_stage(topo, &rows[0], 1, ReduceOp::kSum);
  over_stage(topo, &rows[1], 1, ReduceOp::kMax);
  const Layout& lay = topo.layout();
  const double stage_ranks = static_cast<double>(lay.edp) * lay.ep * lay.esp;
  return {max_over_mean(loads, static_cast<int>(loads.size()), 0.0),
          max_over_mean(rows[1], rows[0], stage_ranks, 0.0)};
}

}  // namespace parm
