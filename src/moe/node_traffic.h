// How far an MoE layer's routed rows travel between nodes in its last forward pass: what
// node-limited routing (--router-groups G = the nodes, docs/spec.md §7) is for.
#pragma once

#include <string>

#include "moe/moe_layer.h"

namespace parm {

struct NodeTraffic {
  // Kept choices per gated token whose expert lives on another node than the rank that
  // gated the token: rows the exchange sends across nodes, one per choice.
  double cross_choices_per_token = 0.0;
  // Other nodes a gated token reaches with its kept choices: the rows an exchange that sent
  // a token once per node (and copied it there) would send across nodes.
  double cross_nodes_per_token = 0.0;
  std::string str() const;  // "1.98 choices to other nodes per token, 0.94 nodes"
};

// Collective over the ranks of the layer's pipeline stage (host; its esp, ep and edp
// groups), after the same forward pass on each. The ranks of an MP group that gate the same
// tokens (baseline, S2) count them once, as expert_loads does (load_balance.h). Expert e is
// on the EP peer e / (E / N_EP) of the gating rank's EP group.
NodeTraffic node_traffic(Topology& topo, MoeLayer& layer);

}  // namespace parm
