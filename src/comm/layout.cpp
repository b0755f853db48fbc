// Pure rank-layout maths of docs/spec.md §1.
#include <algorithm>
#include <array>
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
    case Group::kPp: return "pp";
    case Group::kNumGroups: break;
  }
  return "?";
}

Group parse_group(const std::string& name) {
  for (int i = 0; i < kNumGroups; ++i)
    if (name == group_name(static_cast<Group>(i))) return static_cast<Group>(i);
  throw InvalidConfig(
      fmt::format("unknown group '{}'; valid groups: world, dp, mp, ep, esp, edp, pp", name));
}

int Layout::group_size(Group g) const {
  switch (g) {
    case Group::kWorld: return world;
    case Group::kDp: return dp;
    case Group::kMp: return mp;
    case Group::kEp: return ep;
    case Group::kEsp: return esp;
    case Group::kEdp: return edp;
    case Group::kPp: return pp;
    case Group::kNumGroups: break;
  }
  return 0;
}

namespace {

// One dimension of a decomposition of the world: the group it spans and its size.
struct Dim {
  Group group;
  int size;
};
// At most four dimensions (the MoE part's); a fixed array keeps group_coord free of
// allocations (group_members calls it for every rank).
struct Dims {
  std::array<Dim, 4> d{};
  size_t n = 0;
  void push_back(Dim x) { d[n++] = x; }
  size_t size() const { return n; }
  const Dim& operator[](size_t i) const { return d[i]; }
  const Dim* begin() const { return d.data(); }
  const Dim* end() const { return d.data() + n; }
};

bool in_dense(Group g) { return g == Group::kMp || g == Group::kDp || g == Group::kPp; }

// The dense (mp, dp, pp) or MoE (esp, ep, edp, pp) decomposition, innermost first, nested as
// the order names them; the order's "dp" is the MoE part's edp.
Dims decomposition(const Layout& l, const std::array<Group, kOrderLength>& order, bool dense) {
  Dims d;
  for (Group g : order) {
    if (dense && in_dense(g)) d.push_back({g, l.group_size(g)});
    if (!dense && g != Group::kMp)
      d.push_back({g == Group::kDp ? Group::kEdp : g, l.group_size(g == Group::kDp ? Group::kEdp : g)});
  }
  return d;
}

// The stride of group g in d: the product of the sizes nested inside it.
int stride(const Dims& d, Group g) {
  int n = 1;
  for (const Dim& x : d) {
    if (x.group == g) break;
    n *= x.size;
  }
  return n;
}

// Both decompositions must give every rank the same stage and the same pp group: the ranks
// nested inside pp are as many in the dense part as in the MoE part.
bool stages_agree(const Layout& l, const std::array<Group, kOrderLength>& order) {
  return l.pp == 1 || stride(decomposition(l, order, true), Group::kPp) ==
                          stride(decomposition(l, order, false), Group::kPp);
}

constexpr std::array<Group, kOrderLength> kOrderNames{Group::kMp, Group::kEsp, Group::kEp,
                                                      Group::kDp, Group::kPp};

// Size of an order name: "dp" spans dp in the dense part and edp in the MoE part.
int order_size(const Layout& l, Group g) {
  return g == Group::kDp ? std::max(l.dp, l.edp) : l.group_size(g);
}

template <typename Groups>
std::string join_order(const Groups& order) {
  std::vector<std::string> names;
  for (Group g : order) names.emplace_back(group_name(g));
  return fmt::format("{}", fmt::join(names, "-"));
}

// The orders of the names of size > 1 that keep the stages agreed (the others may be left
// out), as the user would write them.
std::vector<std::string> valid_orders(const Layout& l) {
  std::vector<Group> names;
  for (Group g : kOrderNames)
    if (order_size(l, g) > 1) names.push_back(g);
  if (names.empty()) return {kDefaultOrder};
  std::sort(names.begin(), names.end());
  std::vector<std::string> out;
  do {
    std::array<Group, kOrderLength> full{};
    std::copy(names.begin(), names.end(), full.begin());
    size_t n = names.size();
    for (Group g : kOrderNames)
      if (std::find(names.begin(), names.end(), g) == names.end()) full[n++] = g;
    if (stages_agree(l, full)) out.push_back(join_order(names));
  } while (std::next_permutation(names.begin(), names.end()));
  std::sort(out.begin(), out.end());
  return out;
}

std::string list_orders(const std::vector<std::string>& orders) {
  constexpr size_t kShown = 24;
  if (orders.size() <= kShown) return fmt::format("{}", fmt::join(orders, ", "));
  return fmt::format("{}, ... ({} in all)",
                     fmt::join(orders.begin(), orders.begin() + kShown, ", "), orders.size());
}

// Parses "mp-esp-ep-dp-pp" style text into a full order: names of size 1 may be left out
// (they are appended, outermost, where they change nothing).
std::array<Group, kOrderLength> parse_order(const Layout& l, const std::string& text) {
  std::vector<Group> given;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t dash = std::min(text.find('-', pos), text.size());
    const std::string name = text.substr(pos, dash - pos);
    const auto it = std::find_if(kOrderNames.begin(), kOrderNames.end(),
                                 [&](Group g) { return name == group_name(g); });
    PARM_CONFIG_CHECK(it != kOrderNames.end(),
                      "--order '{}': unknown name '{}'; an order names mp, esp, ep, dp, pp "
                      "innermost first, joined by '-' (default {}); valid orders for this "
                      "layout: {}",
                      text, name, kDefaultOrder, list_orders(valid_orders(l)));
    PARM_CONFIG_CHECK(std::find(given.begin(), given.end(), *it) == given.end(),
                      "--order '{}' names '{}' twice; valid orders for this layout: {}", text,
                      name, list_orders(valid_orders(l)));
    given.push_back(*it);
    pos = dash + 1;
  }
  std::array<Group, kOrderLength> full{};
  std::copy(given.begin(), given.end(), full.begin());
  size_t n = given.size();
  for (Group g : kOrderNames) {
    if (std::find(given.begin(), given.end(), g) != given.end()) continue;
    PARM_CONFIG_CHECK(order_size(l, g) == 1,
                      "--order '{}' leaves out '{}' whose size is {} (only names of size 1 may "
                      "be left out); valid orders for this layout: {}",
                      text, group_name(g), order_size(l, g), list_orders(valid_orders(l)));
    full[n++] = g;
  }
  return full;
}


}  // namespace

std::string Layout::order_name() const { return join_order(order); }

Layout make_layout(int world, int mp, int ep, int esp, int pp, const std::string& order) {
  PARM_CONFIG_CHECK(world >= 1, "world size {} must be at least 1", world);
  PARM_CONFIG_CHECK(pp >= 1, "--pp {} must be at least 1; valid --pp values for world size {}: {}",
                    pp, world, divisors_of(world));
  PARM_CONFIG_CHECK(world % pp == 0,
                    "world size {} is not divisible by --pp {} (the world splits into N_PP stages "
                    "of equal size); valid --pp values: {}",
                    world, pp, divisors_of(world));
  const int stage = world / pp;
  // pp = 1 keeps the wording of a layout without stages.
  const std::string ranks =
      pp == 1 ? fmt::format("world size {}", world)
              : fmt::format("stage size {} (world size {} / --pp {})", stage, world, pp);
  const char* dense = pp == 1 ? "P = N_DP x N_MP" : "P = N_DP x N_MP x N_PP";
  const char* moe = pp == 1 ? "P = N_EDP x N_EP x N_ESP" : "P = N_EDP x N_EP x N_ESP x N_PP";
  PARM_CONFIG_CHECK(mp >= 1, "--mp {} must be at least 1; valid --mp values for {}: {}", mp,
                    ranks, divisors_of(stage));
  PARM_CONFIG_CHECK(ep >= 1, "--ep {} must be at least 1", ep);
  PARM_CONFIG_CHECK(esp >= 1, "--esp {} must be at least 1", esp);
  PARM_CONFIG_CHECK(stage % mp == 0,
                    "{} is not divisible by --mp {} ({}); valid --mp values: {}", ranks, mp,
                    dense, divisors_of(stage));
  PARM_CONFIG_CHECK(stage % (ep * esp) == 0,
                    "{} is not divisible by --ep {} x --esp {} = {} ({}); valid products --ep x "
                    "--esp: {}",
                    ranks, ep, esp, ep * esp, moe, divisors_of(stage));
  Layout l;
  l.world = world;
  l.mp = mp;
  l.ep = ep;
  l.esp = esp;
  l.pp = pp;
  l.dp = stage / mp;
  l.edp = stage / (ep * esp);
  l.order = parse_order(l, order);
  PARM_CONFIG_CHECK(stages_agree(l, l.order),
                    "--order '{}' gives a rank different pipeline stages in the dense part "
                    "(mp, dp, pp) and the MoE part (esp, ep, edp, pp): inside pp it nests {} "
                    "dense ranks but {} MoE ranks; valid orders for this layout: {}",
                    order, stride(decomposition(l, l.order, true), Group::kPp),
                    stride(decomposition(l, l.order, false), Group::kPp), list_orders(valid_orders(l)));
  return l;
}

GroupCoord group_coord(const Layout& l, Group g, int r) {
  PARM_CHECK(r >= 0 && r < l.world, "world rank {} outside [0, {})", r, l.world);
  PARM_CHECK(g != Group::kNumGroups, "bad group {}", static_cast<int>(g));
  if (g == Group::kWorld) return {0, r};
  // pp is in both decompositions, and they agree on it (make_layout).
  // A rank's coordinate in each dimension (innermost first) is a mixed-radix digit of r.
  GroupCoord out;
  int radix = 1;
  for (const Dim& x : decomposition(l, l.order, in_dense(g))) {
    const int digit = r % x.size;
    r /= x.size;
    if (x.group == g) {
      out.rank = digit;
    } else {
      out.index += digit * radix;
      radix *= x.size;
    }
  }
  return out;
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

int stage_of(const Layout& l, int world_rank) {
  return group_coord(l, Group::kPp, world_rank).rank;
}

// Two groups of one size are the same groups (members in the same positions) exactly when
// they have the same stride: a rank's coordinate in each is then the same digit.
bool esp_groups_are_mp_groups(const Layout& l) {
  if (l.esp != l.mp) return false;
  return l.mp == 1 || stride(decomposition(l, l.order, true), Group::kMp) ==
                          stride(decomposition(l, l.order, false), Group::kEsp);
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
