// The distributed optimizer (train/optimizer.h, --optimizer-sharding dp): steps with the
// AdamW state sharded over dp and edp give the unsharded steps' gradient norms, parameters
// and moments bit for bit on layouts of this world size with dp or edp above 1 (the
// reductions sum in group-rank order both ways), and each rank holds 1/dp of the dense
// moments and 1/edp of its experts', to the flat buffer's padding.
#include <gtest/gtest.h>

#include <cstring>

#include "model_test_util.h"
#include "mpi_test_util.h"
#include "train/optimizer.h"

namespace parm::train {
namespace {

using model::test_util::count_targets;
using model::test_util::make_batch;
using model::test_util::tiny_config;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.bytes())) == 0;
}

struct Trained {
  std::unique_ptr<model::Model> model;
  std::unique_ptr<AdamW> opt;
  std::vector<double> norms;
};

// `steps` optimizer steps of the tiny model (this rank's dp replica's micro-batch), clipped.
Trained train(Topology& topo, model::Arch arch, OptimizerSharding sharding, int steps) {
  Trained r;
  r.model = model::make_model(topo, tiny_config(arch), {}, model::test_util::kMicroBatch);
  r.opt = std::make_unique<AdamW>(topo, r.model->params(), sharding);
  const int dp_rank = topo.host_comm(Group::kDp).rank();
  OptimConfig c;
  for (int s = 0; s < steps; ++s) {
    for (auto* p : r.model->params()) p->grad.zero();
    const model::Batch b = make_batch(arch, 7 * s + dp_rank);
    double denom = static_cast<double>(count_targets(b));
    topo.host_comm(Group::kDp).allreduce(&denom, 1);
    r.model->forward_backward(b, {denom, static_cast<double>(topo.layout().dp)}, 1.0f);
    r.opt->reduce_gradients();
    const double norm = r.opt->grad_norm();
    r.norms.push_back(norm);
    // A clip that bites on some steps: the scale must be the same both ways.
    const double clip = norm > 0.5 ? 0.5 / norm : 1.0;
    r.opt->step(c, 1e-2, clip);
    r.opt->gather_parameters();
  }
  return r;
}

TEST(OptimizerSharding, StepsEqualTheUnshardedOnesBitForBit) {
  if (test::world_size() < 2) GTEST_SKIP() << "needs 2 or more ranks (one has nothing to shard)";
  int checked = 0;
  for (const TopologyOptions& o : test::all_layouts(120.0))
    for (model::Arch arch : {model::Arch::kGpt2, model::Arch::kBert}) {
      const model::ModelConfig cfg = tiny_config(arch);
      if (cfg.num_heads % o.mp != 0 || cfg.experts % o.ep != 0 || cfg.expert_hidden % o.esp != 0)
        continue;
      // Three layouts of the sweep (8 ranks run every step's collectives on 2 cores here):
      // dp = the world; dense dp with experts over ep; mp, esp and ep all 2.
      const bool pick = (o.mp == 1 && o.ep == 1 && o.esp == 1) ||
                        (o.mp == 1 && o.ep == 2 && o.esp == 1) ||
                        (o.mp == 2 && o.ep == 2 && o.esp == 2);
      if (!pick) continue;
      auto topo = Topology::create(o);
      if (topo->layout().dp == 1 && topo->layout().edp == 1) continue;  // nothing to shard
      const std::string where = fmt::format("mp={} ep={} esp={} dp={} edp={} {}", o.mp, o.ep,
                                            o.esp, topo->layout().dp, topo->layout().edp,
                                            arch == model::Arch::kGpt2 ? "gpt2" : "bert");
      const Trained a = train(*topo, arch, OptimizerSharding::kNone, 2);
      const Trained b = train(*topo, arch, OptimizerSharding::kDp, 2);
      for (size_t s = 0; s < a.norms.size(); ++s)
        EXPECT_EQ(a.norms[s], b.norms[s]) << where << " step " << s;
      const auto pa = a.model->params(), pb = b.model->params();
      ASSERT_EQ(pa.size(), pb.size());
      const Moments ma = a.opt->gather_moments(), mb = b.opt->gather_moments();
      for (size_t i = 0; i < pa.size(); ++i) {
        EXPECT_TRUE(same_bits(pa[i]->value, pb[i]->value)) << where << " " << pa[i]->name;
        EXPECT_TRUE(same_bits(ma.m[i], mb.m[i])) << where << " m of " << pa[i]->name;
        EXPECT_TRUE(same_bits(ma.v[i], mb.v[i])) << where << " v of " << pa[i]->name;
      }
      ++checked;
    }
  EXPECT_GT(checked, 0);
}

// The free functions reduce whole gradients and measure the norm as AdamW does.
TEST(OptimizerSharding, FreeReductionAndNormEqualTheOptimizers) {
  const int p = test::world_size();
  auto topo = test::make_topology(1, p % 2 == 0 ? 2 : 1, 1);
  const model::Arch arch = model::Arch::kGpt2;
  auto m = model::make_model(*topo, tiny_config(arch), {}, model::test_util::kMicroBatch);
  const model::Batch b = make_batch(arch, topo->host_comm(Group::kDp).rank());
  m->forward_backward(b, {100.0, static_cast<double>(topo->layout().dp)}, 1.0f);
  const auto params = m->params();
  std::vector<Tensor> grads;
  for (auto* q : params) grads.push_back(q->grad.clone());
  AdamW opt(*topo, params, OptimizerSharding::kNone);
  opt.reduce_gradients();
  const double norm = opt.grad_norm();
  std::vector<Tensor> reduced;
  for (auto* q : params) reduced.push_back(q->grad.clone());
  for (size_t i = 0; i < params.size(); ++i) params[i]->grad.copy_from(grads[i]);
  reduce_gradients(*topo, params);
  EXPECT_EQ(global_grad_norm(*topo, params), norm);
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(same_bits(params[i]->grad, reduced[i])) << params[i]->name;
}

// Measured, not computed from the config: the bytes each optimizer holds.
TEST(OptimizerSharding, StateBytesPerRankAreOneShardOfTheUnshardedOnes) {
  const int p = test::world_size();
  // dp = p (mp 1) and edp = p / ep, both above 1 from 2 ranks (edp from 4) on.
  auto topo = test::make_topology(1, p % 2 == 0 && p > 2 ? 2 : 1, 1);
  auto m = model::make_model(*topo, tiny_config(model::Arch::kGpt2), {},
                             model::test_util::kMicroBatch);
  const OptimizerMemory none = AdamW(*topo, m->params(), OptimizerSharding::kNone).memory();
  const OptimizerMemory dp = AdamW(*topo, m->params(), OptimizerSharding::kDp).memory();
  int64_t value_bytes = 0;
  for (const auto* q : m->params()) value_bytes += q->value.bytes();
  EXPECT_EQ(none.moment_bytes, 2 * value_bytes);
  EXPECT_EQ(none.master_bytes, 0);
  EXPECT_EQ(dp.master_bytes, 0);
  EXPECT_EQ(none.grad_bytes, value_bytes);
  EXPECT_EQ(dp.grad_bytes, value_bytes);
  for (Group g : {Group::kDp, Group::kEdp}) {
    const int64_t n = topo->layout().group_size(g);
    const int64_t whole = none.moment_bytes_of(g), mine = dp.moment_bytes_of(g);
    EXPECT_GT(whole, 0) << group_name(g);
    // m and v, fp32: under 2 x 4 bytes of padding per rank of the group.
    EXPECT_GE(mine * n, whole) << group_name(g);
    EXPECT_LT(mine * n, whole + 8 * n) << group_name(g);
    if (n > 1) EXPECT_LT(mine, whole) << group_name(g);
  }
  EXPECT_EQ(dp.moment_bytes, dp.moment_bytes_of(Group::kDp) + dp.moment_bytes_of(Group::kEdp));
}

}  // namespace
}  // namespace parm::train
