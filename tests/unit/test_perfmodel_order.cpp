// The cost model follows --order: a group's link depends on which ranks it holds.
#include <gtest/gtest.h>

#include "parm/error.h"
#include "perfmodel/model.h"

namespace parm::perfmodel {
namespace {

TEST(PerfmodelOrder, GroupLinksFollowTheOrder) {
  // 2 nodes x 2 ranks, mp 2, ep 2, esp 1.
  const Target def = make_target(4, 2, 2, 1, 2);
  EXPECT_EQ(group_link(def, Group::kMp), Link::kIntra);
  EXPECT_EQ(group_link(def, Group::kEp), Link::kIntra);  // the EP groups are the MP groups
  EXPECT_EQ(group_link(def, Group::kEdp), Link::kInter);
  const Target apart = make_target(4, 2, 2, 1, 2, "mp-dp-ep");
  EXPECT_EQ(apart.layout.order_name(), "mp-dp-ep-esp-pp");
  EXPECT_EQ(group_link(apart, Group::kMp), Link::kIntra);
  EXPECT_EQ(group_link(apart, Group::kEp), Link::kInter);
  EXPECT_EQ(group_link(apart, Group::kEdp), Link::kIntra);
  EXPECT_THROW(make_target(4, 2, 2, 1, 2, "mp-dp"), InvalidConfig);
}

}  // namespace
}  // namespace parm::perfmodel
