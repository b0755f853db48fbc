// Rank-layout maths of SPEC §1, without MPI.
#include <gtest/gtest.h>

#include "parm/error.h"
#include "parm/topology.h"

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

TEST(Layout, ParseGroup) {
  EXPECT_EQ(parse_group("esp"), Group::kEsp);
  EXPECT_THROW(parse_group("tp"), InvalidConfig);
}

}  // namespace
}  // namespace parm
