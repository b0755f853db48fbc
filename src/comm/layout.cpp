// Pure rank-layout maths of SPEC §1.
#include <set>

#include <fmt/ranges.h>

#include "parm/error.h"
#include "parm/topology.h"

namespace parm {

const char* group_name(Group g) {
  switch (g) {
    case Group::kWorld: return "world";
    case Group::kDp: return "dp";
    case Group::kMp: return "mp";
    case Group::kEp: return "ep";
    case Group::kEsp: return "esp";
    case Group::kEdp: return "edp";
    case Group::kNumGroups: break;
  }
  return "?";
}

Group parse_group(const std::string& name) {
  for (int i = 0; i < kNumGroups; ++i)
    if (name == group_name(static_cast<Group>(i))) return static_cast<Group>(i);
  throw InvalidConfig(
      fmt::format("unknown group '{}'; valid groups: world, dp, mp, ep, esp, edp", name));
}

int Layout::group_size(Group g) const {
  switch (g) {
    case Group::kWorld: return world;
    case Group::kDp: return dp;
    case Group::kMp: return mp;
    case Group::kEp: return ep;
    case Group::kEsp: return esp;
    case Group::kEdp: return edp;
    case Group::kNumGroups: break;
  }
  return 0;
}

Layout make_layout(int world, int mp, int ep, int esp) {
  PARM_CONFIG_CHECK(world >= 1, "world size {} must be at least 1", world);
  PARM_CONFIG_CHECK(mp >= 1, "--mp {} must be at least 1; valid --mp values for world size {}: {}",
                    mp, world, divisors_of(world));
  PARM_CONFIG_CHECK(ep >= 1, "--ep {} must be at least 1", ep);
  PARM_CONFIG_CHECK(esp >= 1, "--esp {} must be at least 1", esp);
  PARM_CONFIG_CHECK(world % mp == 0,
                    "world size {} is not divisible by --mp {} (P = N_DP x N_MP); valid --mp "
                    "values: {}",
                    world, mp, divisors_of(world));
  PARM_CONFIG_CHECK(world % (ep * esp) == 0,
                    "world size {} is not divisible by --ep {} x --esp {} = {} (P = N_EDP x N_EP "
                    "x N_ESP); valid products --ep x --esp: {}",
                    world, ep, esp, ep * esp, divisors_of(world));
  Layout l;
  l.world = world;
  l.mp = mp;
  l.ep = ep;
  l.esp = esp;
  l.dp = world / mp;
  l.edp = world / (ep * esp);
  return l;
}

GroupCoord group_coord(const Layout& l, Group g, int r) {
  PARM_CHECK(r >= 0 && r < l.world, "world rank {} outside [0, {})", r, l.world);
  const int block = l.ep * l.esp;  // one EP x ESP block
  switch (g) {
    case Group::kWorld: return {0, r};
    case Group::kMp: return {r / l.mp, r % l.mp};
    case Group::kDp: return {r % l.mp, r / l.mp};
    case Group::kEsp: return {r / l.esp, r % l.esp};
    case Group::kEp: {
      const int b = r / block, in_block = r % block;
      return {b * l.esp + in_block % l.esp, in_block / l.esp};
    }
    case Group::kEdp: return {r % block, r / block};
    case Group::kNumGroups: break;
  }
  PARM_CHECK(false, "bad group {}", static_cast<int>(g));
}

std::vector<int> group_members(const Layout& l, Group g, int r) {
  const GroupCoord me = group_coord(l, g, r);
  std::vector<int> members(static_cast<size_t>(l.group_size(g)), -1);
  for (int q = 0; q < l.world; ++q) {
    const GroupCoord c = group_coord(l, g, q);
    if (c.index == me.index) members[static_cast<size_t>(c.rank)] = q;
  }
  for (int m : members) PARM_CHECK(m >= 0, "incomplete group {} of rank {}", group_name(g), r);
  return members;
}

std::vector<int> emulated_nodes(int world, int ranks_per_node) {
  PARM_CONFIG_CHECK(ranks_per_node >= 1, "--ranks-per-node {} must be at least 1",
                    ranks_per_node);
  PARM_CONFIG_CHECK(world % ranks_per_node == 0,
                    "world size {} is not a multiple of --ranks-per-node {}; valid values: {}",
                    world, ranks_per_node, divisors_of(world));
  std::vector<int> nodes(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) nodes[static_cast<size_t>(r)] = r / ranks_per_node;
  return nodes;
}

bool group_is_intra_node(const Layout& l, Group g, int r, const std::vector<int>& node_of_rank) {
  std::set<int> nodes;
  for (int m : group_members(l, g, r)) nodes.insert(node_of_rank[static_cast<size_t>(m)]);
  return nodes.size() == 1;
}

}  // namespace parm
