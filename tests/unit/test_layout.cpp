// Rank-layout maths of docs/spec.md §1, without MPI.
#include <gtest/gtest.h>

#include <functional>

#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "parm/error.h"
#include "parm/topology.h"
#include "schedule/schedule.h"

namespace parm {
namespace {

TEST(Layout, DerivesDpAndEdp) {
  const Layout l = make_layout(16, 2, 4, 2);
  EXPECT_EQ(l.dp, 8);
  EXPECT_EQ(l.edp, 2);
  EXPECT_EQ(l.group_size(Group::kEp), 4);
  EXPECT_EQ(l.group_size(Group::kWorld), 16);
}

TEST(Layout, MpBlocksAndDpStride) {
  const Layout l = make_layout(8, 2, 1, 1);
  EXPECT_EQ(group_members(l, Group::kMp, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(group_members(l, Group::kDp, 5), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(group_coord(l, Group::kDp, 5).rank, 2);
}

TEST(Layout, EspBlocksEpStrideEdpOuter) {
  // 16 ranks, esp=2, ep=4: blocks of 8 ranks; ep stride 2 inside a block; edp stride 8.
  const Layout l = make_layout(16, 2, 4, 2);
  EXPECT_EQ(group_members(l, Group::kEsp, 11), (std::vector<int>{10, 11}));
  EXPECT_EQ(group_members(l, Group::kEp, 11), (std::vector<int>{9, 11, 13, 15}));
  EXPECT_EQ(group_members(l, Group::kEp, 0), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(group_members(l, Group::kEdp, 11), (std::vector<int>{3, 11}));
  EXPECT_EQ(group_coord(l, Group::kEp, 11).rank, 1);
}

TEST(Layout, EveryRankInExactlyOneGroupInstance) {
  for (int world : {1, 2, 4, 6, 8, 12}) {
    for (int mp = 1; mp <= world; ++mp) {
      if (world % mp) continue;
      for (int ep = 1; ep <= world; ++ep)
        for (int esp = 1; esp * ep <= world; ++esp) {
          if (world % (ep * esp)) continue;
          const Layout l = make_layout(world, mp, ep, esp);
          for (int gi = 0; gi < kNumGroups; ++gi) {
            const Group g = static_cast<Group>(gi);
            for (int r = 0; r < world; ++r) {
              const auto m = group_members(l, g, r);
              ASSERT_EQ(static_cast<int>(m.size()), l.group_size(g));
              EXPECT_EQ(m[static_cast<size_t>(group_coord(l, g, r).rank)], r);
            }
          }
        }
    }
  }
}

TEST(Layout, RefusesBadLayoutsWithValidValues) {
  try {
    make_layout(6, 4, 1, 1);
    FAIL() << "mp 4 on 6 ranks accepted";
  } catch (const InvalidConfig& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible by --mp 4"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("1, 2, 3, 6"), std::string::npos) << e.what();
  }
  try {
    make_layout(8, 2, 3, 2);
    FAIL() << "ep 3 x esp 2 on 8 ranks accepted";
  } catch (const InvalidConfig& e) {
    EXPECT_NE(std::string(e.what()).find("--ep 3 x --esp 2 = 6"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_layout(4, 0, 1, 1), InvalidConfig);
  EXPECT_THROW(make_layout(4, 1, -1, 1), InvalidConfig);
}

TEST(Layout, EmulatedNodesMarkGroups) {
  // Usual case: esp = mp = ranks per node, ep across nodes.
  const Layout l = make_layout(8, 2, 4, 2);
  const auto nodes = emulated_nodes(8, 2);
  for (int r = 0; r < 8; ++r) {
    EXPECT_TRUE(group_is_intra_node(l, Group::kMp, r, nodes));
    EXPECT_TRUE(group_is_intra_node(l, Group::kEsp, r, nodes));
    EXPECT_FALSE(group_is_intra_node(l, Group::kEp, r, nodes));
  }
  EXPECT_THROW(emulated_nodes(6, 4), InvalidConfig);
}

std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidConfig& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return "";
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Layout, DefaultOrderNamesSpecOneWithPpOutermost) {
  const Layout l = make_layout(8, 2, 2, 1);
  EXPECT_EQ(l.order_name(), "mp-esp-ep-dp-pp");
  EXPECT_EQ(std::string(kDefaultOrder), "mp-esp-ep-dp-pp");
  EXPECT_EQ(l.pp, 1);
  EXPECT_EQ(group_members(l, Group::kPp, 5), (std::vector<int>{5}));
  EXPECT_EQ(stage_of(l, 5), 0);
}

TEST(Layout, PpStagesAreContiguousBlocksByDefault) {
  // 8 ranks, pp 2: stages {0..3} and {4..7}; inside each, mp 2 / ep 2 / esp 1 as docs/spec.md §1.
  const Layout l = make_layout(8, 2, 2, 1, 2);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.edp, 2);
  EXPECT_EQ(l.group_size(Group::kPp), 2);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(stage_of(l, r), r / 4) << r;
  EXPECT_EQ(group_members(l, Group::kPp, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(group_members(l, Group::kPp, 2), (std::vector<int>{2, 6}));
  EXPECT_EQ(group_coord(l, Group::kPp, 6).rank, 1);
  EXPECT_EQ(group_members(l, Group::kMp, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(group_members(l, Group::kDp, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(group_members(l, Group::kEp, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(group_members(l, Group::kEsp, 5), (std::vector<int>{5}));
  EXPECT_EQ(group_members(l, Group::kEdp, 5), (std::vector<int>{5, 7}));
  // 4 stages of 2 with esp 2: each stage one ESP group.
  const Layout four = make_layout(8, 1, 1, 2, 4);
  EXPECT_EQ(group_members(four, Group::kPp, 3), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(group_members(four, Group::kEsp, 3), (std::vector<int>{2, 3}));
  EXPECT_EQ(group_members(four, Group::kDp, 3), (std::vector<int>{2, 3}));
  EXPECT_EQ(stage_of(four, 3), 1);
}

TEST(Layout, OrderPutsMpInsideANodeAndEpAcrossNodes) {
  // 2 nodes x 2 ranks, mp 2, ep 2, esp 1. Default: the EP groups are the MP groups.
  const auto nodes = emulated_nodes(4, 2);
  const Layout def = make_layout(4, 2, 2, 1);
  EXPECT_EQ(group_members(def, Group::kEp, 0), (std::vector<int>{0, 1}));
  EXPECT_TRUE(group_is_intra_node(def, Group::kEp, 0, nodes));
  // "mp-dp-ep": edp nested inside ep, so EP strides over the nodes.
  const Layout l = make_layout(4, 2, 2, 1, 1, "mp-dp-ep");
  EXPECT_EQ(l.order_name(), "mp-dp-ep-esp-pp");
  EXPECT_EQ(group_members(l, Group::kMp, 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(group_members(l, Group::kDp, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(group_members(l, Group::kEp, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(group_members(l, Group::kEp, 1), (std::vector<int>{1, 3}));
  EXPECT_EQ(group_members(l, Group::kEdp, 3), (std::vector<int>{2, 3}));
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(group_is_intra_node(l, Group::kMp, r, nodes));
    EXPECT_FALSE(group_is_intra_node(l, Group::kEp, r, nodes));
    EXPECT_TRUE(group_is_intra_node(l, Group::kEdp, r, nodes));
  }
}

TEST(Layout, OrderNestsEveryGroupAsWritten) {
  // 16 ranks, mp 2, ep 2, esp 2, pp 2. "ep-pp-mp-esp-dp" nests the dense part as pp
  // (stride 1), mp, dp and the MoE part as ep (stride 1), pp (stride 2), esp, edp: pp would be
  // stride 1 in one part and stride 2 in the other, so it is refused.
  EXPECT_TRUE(has(refusal([] { make_layout(16, 2, 2, 2, 2, "ep-pp-mp-esp-dp"); }),
                  "different pipeline stages"));
  // "ep-mp-pp-esp-dp": dense (mp 1, pp 2, dp 4); MoE (ep 1, pp 2, esp 4, edp 8).
  const Layout l = make_layout(16, 2, 2, 2, 2, "ep-mp-pp-esp-dp");
  EXPECT_EQ(group_members(l, Group::kMp, 13), (std::vector<int>{12, 13}));
  EXPECT_EQ(group_members(l, Group::kPp, 13), (std::vector<int>{13, 15}));
  EXPECT_EQ(group_members(l, Group::kDp, 13), (std::vector<int>{1, 5, 9, 13}));
  EXPECT_EQ(group_members(l, Group::kEp, 13), (std::vector<int>{12, 13}));
  EXPECT_EQ(group_members(l, Group::kEsp, 13), (std::vector<int>{9, 13}));
  EXPECT_EQ(group_members(l, Group::kEdp, 13), (std::vector<int>{5, 13}));
  EXPECT_EQ(stage_of(l, 13), 0);
  EXPECT_EQ(stage_of(l, 15), 1);
  EXPECT_EQ(group_coord(l, Group::kDp, 13).rank, 3);
  EXPECT_EQ(group_coord(l, Group::kEsp, 13).rank, 1);
}

// Every order of every layout up to 16 ranks (the orders of its names of size > 1; the
// others make no difference): each rank in one instance of each group, the groups of a stage
// inside it, a pp group one rank per stage, and (mp, dp, pp) and (esp, ep, edp, pp) each
// naming a rank once.
TEST(Layout, EveryOrderGivesConsistentGroups) {
  int layouts = 0, refused = 0;
  for (int world : {1, 2, 4, 8, 12, 16})
    for (int pp = 1; pp <= world; ++pp)
      for (int mp = 1; mp <= world; ++mp)
        for (int ep = 1; ep <= world; ++ep)
          for (int esp = 1; esp <= world; ++esp) {
            if (world % pp || (world / pp) % mp || (world / pp) % (ep * esp)) continue;
            const int dp = world / pp / mp, edp = world / pp / (ep * esp);
            std::vector<std::string> names;
            for (auto [name, size] : {std::pair{"dp", std::max(dp, edp)}, {"ep", ep},
                                      {"esp", esp}, {"mp", mp}, {"pp", pp}})
              if (size > 1) names.emplace_back(name);
            do {
              const std::string order =
                  names.empty() ? kDefaultOrder : fmt::format("{}", fmt::join(names, "-"));
              Layout l;
              try {
                l = make_layout(world, mp, ep, esp, pp, order);
              } catch (const InvalidConfig& e) {
                ++refused;
                EXPECT_TRUE(has(e.what(), "different pipeline stages")) << e.what();
                continue;
              }
              ++layouts;
              std::set<std::vector<int>> dense, moe;
              for (int r = 0; r < world; ++r) {
                for (int gi = 0; gi < kNumGroups; ++gi) {
                  const Group g = static_cast<Group>(gi);
                  const auto m = group_members(l, g, r);
                  ASSERT_EQ(static_cast<int>(m.size()), l.group_size(g));
                  ASSERT_EQ(m[static_cast<size_t>(group_coord(l, g, r).rank)], r);
                  for (int q : m)
                    if (g == Group::kPp)
                      ASSERT_EQ(stage_of(l, q), group_coord(l, g, q).rank);
                    else if (g != Group::kWorld)
                      ASSERT_EQ(stage_of(l, q), stage_of(l, r)) << order << group_name(g);
                }
                dense.insert({group_coord(l, Group::kMp, r).rank,
                              group_coord(l, Group::kDp, r).rank, stage_of(l, r)});
                moe.insert({group_coord(l, Group::kEsp, r).rank,
                            group_coord(l, Group::kEp, r).rank,
                            group_coord(l, Group::kEdp, r).rank, stage_of(l, r)});
              }
              ASSERT_EQ(static_cast<int>(dense.size()), world) << order;
              ASSERT_EQ(static_cast<int>(moe.size()), world) << order;
            } while (std::next_permutation(names.begin(), names.end()));
          }
  EXPECT_GT(layouts, 500);
  EXPECT_GT(refused, 50);
}

TEST(Layout, RefusesBadOrdersAndPpWithTheValidOnes) {
  // Unknown, repeated, and missing names.
  std::string e = refusal([] { make_layout(4, 2, 2, 1, 1, "tp-dp-ep"); });
  EXPECT_TRUE(has(e, "unknown name 'tp'")) << e;
  EXPECT_TRUE(has(e, "mp-dp-ep")) << e;
  e = refusal([] { make_layout(4, 2, 2, 1, 1, "mp-dp-mp-ep"); });
  EXPECT_TRUE(has(e, "names 'mp' twice")) << e;
  e = refusal([] { make_layout(4, 2, 2, 1, 1, "mp-dp"); });
  EXPECT_TRUE(has(e, "leaves out 'ep' whose size is 2")) << e;
  EXPECT_TRUE(has(e, "valid orders for this layout: dp-ep-mp, dp-mp-ep, ep-dp-mp, ep-mp-dp, "
                     "mp-dp-ep, mp-ep-dp"))
      << e;
  e = refusal([] { make_layout(4, 2, 2, 1, 1, ""); });
  EXPECT_TRUE(has(e, "unknown name ''")) << e;
  // Stages that disagree: 8 ranks, mp 2, ep 2, pp 2.
  e = refusal([] { make_layout(8, 2, 2, 1, 2, "mp-pp-ep-dp"); });
  EXPECT_TRUE(has(e, "inside pp it nests 2 dense ranks but 1 MoE ranks")) << e;
  EXPECT_TRUE(has(e, "mp-ep-dp-pp")) << e;
  EXPECT_TRUE(has(e, "mp-ep-pp-dp")) << e;
  EXPECT_FALSE(has(e, "mp-pp-ep-dp,")) << e;
  // pp must divide the world; mp and ep x esp the stage.
  e = refusal([] { make_layout(8, 1, 1, 1, 3); });
  EXPECT_TRUE(has(e, "world size 8 is not divisible by --pp 3")) << e;
  EXPECT_TRUE(has(e, "valid --pp values: 1, 2, 4, 8")) << e;
  e = refusal([] { make_layout(8, 4, 1, 1, 4); });
  EXPECT_TRUE(has(e, "stage size 2 (world size 8 / --pp 4) is not divisible by --mp 4")) << e;
  EXPECT_TRUE(has(e, "valid --mp values: 1, 2")) << e;
  e = refusal([] { make_layout(8, 1, 4, 1, 4); });
  EXPECT_TRUE(has(e, "--ep 4 x --esp 1 = 4")) << e;
  EXPECT_THROW(make_layout(8, 1, 1, 1, 0), InvalidConfig);
}

TEST(Layout, BaselineNeedsEspGroupsThatAreTheMpGroups) {
  const Layout def = make_layout(8, 2, 2, 2);
  EXPECT_TRUE(esp_groups_are_mp_groups(def));
  EXPECT_TRUE(schedule::supports(schedule::Kind::kBaseline, def));
  // esp nested outside ep: ESP {0, 2}, MP {0, 1}.
  const Layout apart = make_layout(8, 2, 2, 2, 1, "mp-ep-esp-dp");
  EXPECT_EQ(group_members(apart, Group::kEsp, 0), (std::vector<int>{0, 2}));
  EXPECT_FALSE(esp_groups_are_mp_groups(apart));
  EXPECT_FALSE(schedule::supports(schedule::Kind::kBaseline, apart));
  EXPECT_TRUE(schedule::supports(schedule::Kind::kS1, apart));
  EXPECT_FALSE(esp_groups_are_mp_groups(make_layout(8, 2, 2, 1)));
}

TEST(Layout, ParseGroup) {
  EXPECT_EQ(parse_group("esp"), Group::kEsp);
  EXPECT_EQ(parse_group("pp"), Group::kPp);
  EXPECT_THROW(parse_group("tp"), InvalidConfig);
}

}  // namespace
}  // namespace parm
