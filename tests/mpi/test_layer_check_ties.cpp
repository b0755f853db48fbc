// check-layer's tie rule and routing dump: with force_ties (gate columns of experts 0 and E-1
// zero, so their probabilities are bitwise equal for every token) every schedule on every
// layout routes exactly as the oracle, ties to the lower expert index; the routing each
// source dumps for MP group 0 is the oracle's, and every MP group's input is dumped.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <string>

#include "moe/layer_check.h"
#include "mpi_test_util.h"
#include "parm/fileio.h"

namespace parm {
namespace {

using schedule::Kind;

MoeShape tie_shape() {
  // T per MP group divisible by N_MP in {1, 2, 3, 4, 8}; H by N_ESP in the same.
  return MoeShape::of(24, 8, 24, test::world_size() == 3 ? 6 : 8, 2, "1.0");
}

LayerCheckOptions options(const test::LayerCase& c, bool force_ties) {
  LayerCheckOptions o;
  o.shape = tie_shape();
  o.kind = c.kind;
  o.fuse = c.fuse;
  o.chunks = 3;
  o.seed = 5;
  o.force_ties = force_ties;
  return o;
}

TEST(LayerCheckTies, EveryScheduleBreaksForcedTiesAsTheOracle) {
  const auto cases = test::layer_cases(tie_shape());
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    auto topo = test::make_topology(c.layout.mp, c.layout.ep, c.layout.esp);
    const LayerCheckResult r = check_layer(*topo, options(c, true));
    EXPECT_TRUE(r.routing_matches) << c.where;
    EXPECT_TRUE(r.passed) << c.where;
    EXPECT_GT(r.tie_decided_tokens, 0) << c.where << ": force_ties made no tie decide a routing";
  }
}

TEST(LayerCheckTies, WithoutForceTiesRandomWeightsMakeNoTies) {
  const auto c = test::layer_cases(tie_shape()).front();
  auto topo = test::make_topology(c.layout.mp, c.layout.ep, c.layout.esp);
  const LayerCheckResult r = check_layer(*topo, options(c, false));
  EXPECT_TRUE(r.passed) << c.where;
  EXPECT_EQ(r.tie_decided_tokens, 0) << c.where;
}

// The dumped routing of each schedule is byte for byte the oracle's (the routing matched),
// and the manifest lists the input and output gradient of every MP group.
TEST(LayerCheckTies, DumpHoldsEveryGroupsInputAndEachSourcesRouting) {
  const std::string dir =
      ::testing::TempDir() + "parm_tie_dump_np" + std::to_string(test::world_size());
  for (const auto& c : test::layer_cases(tie_shape())) {
    auto topo = test::make_topology(c.layout.mp, c.layout.ep, c.layout.esp);
    const std::string d = dir + "_" + std::to_string(c.layout.mp) + std::to_string(c.layout.ep) +
                          std::to_string(c.layout.esp);
    LayerCheckOptions o = options(c, true);
    o.dump_dir = d;
    const LayerCheckResult r = check_layer(*topo, o);
    ASSERT_TRUE(test::all_ranks(r.passed)) << c.where;
    if (topo->world_rank() != 0) continue;
    EXPECT_EQ(r.oracle_source,
              c.kind == Kind::kS1 && c.layout.mp > 1 ? "oracle_sliced" : "oracle");
    for (const char* part : {".expert.npy", ".slot.npy", ".kept.npy"})
      EXPECT_EQ(read_file(d + "/" + r.source + part), read_file(d + "/" + r.oracle_source + part))
          << c.where << " " << part;
    const std::string manifest = read_file(d + "/manifest.json");
    const int groups = test::world_size() / c.layout.mp;
    for (int g = 1; g < groups; ++g)
      for (const char* what : {"x", "dout"}) {
        const std::string name = "input." + std::string(what) + ".g" + std::to_string(g) + ".npy";
        struct stat st {};
        EXPECT_EQ(::stat((d + "/" + name).c_str(), &st), 0) << c.where << ": " << name;
        EXPECT_NE(manifest.find("\"" + name + "\""), std::string::npos) << c.where << ": " << name;
      }
    EXPECT_EQ(manifest.find("input.x.g" + std::to_string(groups) + ".npy"), std::string::npos)
        << c.where << ": a group past the last";
  }
}

}  // namespace
}  // namespace parm
