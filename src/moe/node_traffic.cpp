#include "moe/node_traffic.h"

#include <vector>

#include <fmt/format.h>

namespace parm {

std::string NodeTraffic::str() const {
  return fmt::format("{:.3f} choices to other nodes per token, {:.3f} other nodes",
                     cross_choices_per_token, cross_nodes_per_token);
}

NodeTraffic node_traffic(Topology& topo, MoeLayer& layer) {
  const auto& sc = layer.schedule();
  const moe::GateRouting& r = layer.backend().routing();
  const Layout& l = topo.layout();
  const int me = topo.world_rank();
  const std::vector<int> ep_peers = group_members(l, Group::kEp, me);
  const int64_t per_rank = r.experts / l.ep;
  // Sums of: cross choices, cross (token, node) pairs, gated tokens.
  double v[3] = {0.0, 0.0, 0.0};
  const bool counts = sc.gate_tokens != sc.total_tokens || topo.comm(Group::kMp).rank() == 0;
  if (counts) {
    std::vector<int> reached;  // the other nodes token t reaches
    for (int64_t t = 0; t < r.tokens; ++t) {
      reached.clear();
      for (int j = 0; j < r.topk; ++j) {
        const size_t c = static_cast<size_t>(t * r.topk + j);
        if (r.row[c] < 0) continue;  // dropped: it travels nowhere
        const int node = topo.node_of(ep_peers[static_cast<size_t>(r.expert[c] / per_rank)]);
        if (node == topo.node_of(me)) continue;
        v[0] += 1.0;
        bool seen = false;
        for (int n : reached) seen = seen || n == node;
        if (!seen) reached.push_back(node);
      }
      v[1] += static_cast<double>(reached.size());
    }
    v[2] = static_cast<double>(r.tokens);
  }
  for (Group g : {Group::kEsp, Group::kEp, Group::kEdp}) topo.host_comm(g).allreduce(v, 3);
  if (v[2] == 0.0) return {};
  return {v[0] / v[2], v[1] / v[2]};
}

}  // namespace parm
