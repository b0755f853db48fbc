// The load imbalance of an MoE layer's last forward pass, over the ranks that run it: how much more
// the busiest expert and the busiest rank took than the average. A dropless exchange waits
// for its busiest rank, so these ratios are what dropless routing costs over even routing.
#pragma once

#include <string>
#include <vector>

#include "moe/moe_layer.h"
#include "parm/stats.h"

namespace parm {

struct LoadImbalance {
  double expert_max_over_mean = 0.0;  // routed choices per expert, over all gate calls
  double rank_max_over_mean = 0.0;    // rows the experts of each rank computed
  std::string str() const;            // "max/mean per expert 1.23, per rank 1.10"
};

// max_over_mean (parm/stats.h) is every ratio below.

// Collective over the ranks of the layer's pipeline stage (host; its esp, ep and edp
// groups): each calls it after the same forward pass. The ranks of an MP group that gate
// the same tokens (baseline, S2) count them once.
LoadImbalance load_imbalance(Topology& topo, MoeLayer& layer);
// The same from `loads`, expert_loads of the same forward pass (computed once and shared
// with the router-bias update); collective over the same ranks.
LoadImbalance load_imbalance(Topology& topo, MoeLayer& layer, const std::vector<double>& loads);

// Routed choices per expert (E) of the layer's last forward pass, summed over its pipeline
// stage as load_imbalance does (collective over the same ranks; the same on each).
std::vector<double> expert_loads(Topology& topo, MoeLayer& layer);

// DeepSeek-V3's auxiliary-loss-free balancing step: bias_e += rate * sign(mean load -
// load_e) (0 where equal). bias and load have E elements.
void router_bias_step(const std::vector<double>& load, float rate, std::vector<float>& bias);

// router_bias_step on the layer's router bias from `loads` (expert_loads of its last forward
// pass).
void update_router_bias(MoeLayer& layer, const std::vector<double>& loads, float rate);

}  // namespace parm
