// The cost model follows --order: a group's link depends on which ranks it holds.
#include <gtest/gtest.h>

#include <string>

#include "parm/error.h"
#include "perfmodel/model.h"
#include "perfmodel/simulate.h"

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

// parm simulate: a grid's "order" decides the links of every configuration.
TEST(PerfmodelOrder, SimulateFollowsTheGridOrder) {
  const ClusterSpec cluster = read_cluster(PARM_SOURCE_DIR "/configs/clusters/cluster-32gpu.json");
  auto grid_json = nlohmann::json::parse(R"({"B": [2], "L": [64], "M": [64], "H": [128],
      "E": [8], "k": [1], "f": ["1.0"], "N_MP": [2], "N_ESP": [1], "N_EP": [2]})");
  const Grid def = grid_from_json(grid_json, "grid");
  EXPECT_EQ(def.order, "mp-esp-ep-dp-pp");
  const auto rows = simulate(cluster, def);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].ep_link, Link::kIntra);  // the EP groups are the MP groups
  grid_json["order"] = "mp-dp-ep";
  const auto apart = simulate(cluster, grid_from_json(grid_json, "grid"));
  ASSERT_TRUE(apart[0].evaluated) << apart[0].note;
  EXPECT_EQ(apart[0].mp_link, Link::kIntra);
  EXPECT_EQ(apart[0].ep_link, Link::kInter);
  EXPECT_NE(apart[0].s1_ms, rows[0].s1_ms);
  grid_json["order"] = "mp-tp";
  try {
    grid_from_json(grid_json, "grid");
    FAIL() << "order mp-tp accepted";
  } catch (const InvalidConfig& e) {
    EXPECT_NE(std::string(e.what()).find("unknown name 'tp'"), std::string::npos) << e.what();
  }
}

// The shipped emulated-cluster files carry the terms `parm calibrate` writes: no fixed cost
// per collective step (the rendezvous is per us of compute only: the 2 x 2 files predate its
// measurement and price 0, the 2 x 4 ones carry their calibration's value) and the fused
// overlap 1, so `parm simulate` prices what `parm plan` does with a profile from that cluster.
TEST(PerfmodelOrder, EmulatedClusterFilesPriceTheRendezvousPerCompute) {
  for (const char* name :
       {"emulated-2x2-1g", "emulated-2x2-10g", "emulated-2x4-1g", "emulated-2x4-10g"}) {
    SCOPED_TRACE(name);
    const ClusterSpec c =
        read_cluster(std::string(PARM_SOURCE_DIR "/configs/clusters/") + name + ".json");
    EXPECT_EQ(c.profile.step_sync.us, 0.0);
    EXPECT_EQ(c.profile.step_sync_world.us, 0.0);
    EXPECT_GE(c.profile.step_sync.per_compute, 0.0);
    EXPECT_EQ(c.profile.step_sync_world.per_compute, c.profile.step_sync.per_compute);
    EXPECT_EQ(c.profile.fused.overlap, 1.0);
    // Made from calibrations that fitted the handshake above the eager limit (model.h).
    EXPECT_GE(c.profile.collective(Link::kInter, CommOp::kAllToAll).handshake_us, 0.0);
    EXPECT_GT(c.profile.fused.eager_limit_bytes, 0.0);
  }
}

}  // namespace
}  // namespace parm::perfmodel
