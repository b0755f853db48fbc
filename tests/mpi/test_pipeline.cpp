// Pipeline-parallel training steps: for layouts with pp = 2 and 4 (some with mp, ep, esp > 1),
// one 1F1B step over m micro-batches per DP replica gives the single-process model's loss,
// l_aux and every gradient (the single process accumulating all N_DP x m micro-batches);
// the tied embedding's two copies get the same, complete gradient; the owners' shards
// assemble every whole tensor exactly once; and the checkpoint's parameter list is the
// single-process model's, in the same order.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "model_test_util.h"
#include "mpi_test_util.h"
#include "train/pipeline.h"

namespace parm::train {
namespace {

using model::Arch;
using model::Param;
using namespace model::test_util;

struct PipeCase {
  int mp, ep, esp, pp;
  int micro;                   // micro-batches per replica (--grad-accum)
  std::vector<int64_t> split;  // blocks per stage; empty: balanced
};

std::vector<PipeCase> pipe_cases() {
  switch (parm::test::world_size()) {
    case 1: return {{1, 1, 1, 1, 3, {}}};
    case 2: return {{1, 1, 1, 2, 3, {}}, {1, 1, 1, 2, 2, {1, 3}}};
    case 3: return {{1, 1, 1, 3, 4, {}}};
    case 4:
      return {{2, 1, 2, 2, 3, {}}, {1, 2, 1, 2, 2, {3, 1}}, {1, 1, 1, 4, 2, {}},
              {1, 1, 1, 4, 5, {}}};
    case 8: return {{2, 2, 2, 2, 3, {}}, {1, 2, 1, 4, 3, {}}, {2, 1, 2, 4, 2, {}}};
    default: return {};
  }
}

TEST(Pipeline, OneStepEqualsTheSingleProcessModel) {
  int64_t num_checked = 0;
  double worst = 0.0;
  for (const PipeCase& pc : pipe_cases()) {
    auto topo = pipe_topology(pc.mp, pc.ep, pc.esp, pc.pp);
    const int n_dp = topo->layout().dp, r = topo->comm(Group::kDp).rank();
    const int stage = topo->comm(Group::kPp).rank();
    for (Arch arch : {Arch::kGpt2, Arch::kBert}) {
      const std::string what = fmt::format(
          "{} mp={} ep={} esp={} pp={} m={} split {} rank {} stage {}",
          arch == Arch::kGpt2 ? "gpt2" : "bert", pc.mp, pc.ep, pc.esp, pc.pp, pc.micro,
          fmt::join(pc.split, ","), parm::test::world_rank(), stage);
      const int num_batches = n_dp * pc.micro;
      const Reference& ref = reference(arch, num_batches);
      int64_t denom = 0;
      for (int i = 0; i < num_batches; ++i) denom += count_targets(make_batch(arch, i));
      std::vector<model::Batch> batches;
      for (int a = 0; a < pc.micro; ++a) batches.push_back(make_batch(arch, a * n_dp + r));

      model::PipelineOptions pipe;
      pipe.split = pc.split;
      pipe.slots = pipeline_slots(stage, pc.pp, pc.micro);
      // S1 fused on the first MoE block, S2 on the second: both schedules in every pipeline.
      auto m = model::make_model(*topo, tiny_config(arch),
                                 {{schedule::Kind::kS1, true, 2}, {schedule::Kind::kS2, false, 1}},
                                 kMicroBatch, Precision::kFp32, pipe);
      PipelineRunner runner(*topo, *m, pc.micro);
      const model::LossParts lp = runner.run(
          batches, {static_cast<double>(denom), static_cast<double>(num_batches)}, 1.0f);
      m->sum_tied_grads();

      double sums[2] = {lp.lm_loss_sum, lp.aux_loss};
      topo->comm(Group::kPp).allreduce(sums, 2);
      topo->comm(Group::kDp).allreduce(sums, 2);
      EXPECT_NEAR(sums[0], ref.lm_loss_sum, kLossTol * std::fabs(ref.lm_loss_sum)) << what;
      EXPECT_NEAR(sums[1], ref.aux_sum, kLossTol * std::fabs(ref.aux_sum) + 1e-7) << what;

      // The checkpoint's list: the single-process model's parameters, in its order.
      auto single = model::make_model(self_topology(), tiny_config(arch), {}, kMicroBatch);
      const auto specs = m->all_param_specs();
      const auto whole_params = single->params();
      ASSERT_EQ(specs.size(), whole_params.size()) << what;
      for (size_t i = 0; i < specs.size(); ++i) {
        EXPECT_EQ(specs[i].name, whole_params[i]->name) << what;
        EXPECT_EQ(specs[i].whole_shape, whole_params[i]->whole_shape) << what;
      }

      for (Param* p : m->params()) {
        Tensor g = p->grad.clone();
        topo->comm(p->grad_reduce).allreduce(g.data(), static_cast<size_t>(g.numel()));
        const Tensor& gref_whole = ref.grad.at(p->name);
        Tensor gref(p->grad.shape());
        model::copy_shard_from_whole(gref_whole, p->splits, gref);
        double err = 0.0;
        for (int64_t i = 0; i < g.numel(); ++i)
          err = std::max(err, std::fabs(static_cast<double>(g[i]) - gref[i]));
        const double scale = std::max(max_abs(gref_whole), 1e-6);
        worst = std::max(worst, err / scale);
        EXPECT_LE(err / scale, kGradTol) << what << ": gradient of " << p->name << " max error "
                                         << err << " vs largest entry " << scale;
        ++num_checked;
      }
      // Every whole tensor is assembled exactly once from the owners' shards (the tied wte's
      // owner is stage 0), over the whole world: each stage contributes its own parameters.
      std::map<std::string, Param*> held;
      for (Param* p : m->params()) held[p->name] = p;
      for (const model::ParamSpec& ps : specs) {
        Tensor whole(ps.whole_shape);
        auto it = held.find(ps.name);
        if (it != held.end() && model::owns_copy(*it->second, *topo))
          model::copy_shard_to_whole(it->second->value, it->second->splits, whole);
        topo->comm(Group::kWorld).allreduce(whole.data(), static_cast<size_t>(whole.numel()));
        const Tensor& vref = ref.value.at(ps.name);
        int64_t bad = 0;
        for (int64_t i = 0; i < whole.numel(); ++i) bad += whole[i] != vref[i];
        EXPECT_EQ(bad, 0) << what << ": owners' shards of " << ps.name;
      }
    }
  }
  EXPECT_GT(num_checked, 0) << "no pipeline layouts for world size " << parm::test::world_size();
  double w = worst;
  MPI_Allreduce(MPI_IN_PLACE, &w, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (parm::test::world_rank() == 0)
    std::printf("pipeline equivalence: %ld gradient shards checked per rank, largest relative "
                "error %.2e (tolerance %.0e)\n",
                static_cast<long>(num_checked), w, kGradTol);
}

// Under pp > 1 the stages run through the runner: a whole-model pass is refused, as is a
// model built for fewer activation slots than the schedule keeps in flight.
TEST(Pipeline, WholeModelPassesAndTooFewSlotsAreRefused) {
  const int p = parm::test::world_size();
  if (p < 2) GTEST_SKIP() << "needs 2 or more ranks";
  TopologyOptions o;
  o.pp = p % 2 == 0 ? 2 : p;
  o.timeout_s = 60.0;
  auto topo = Topology::create(o);
  auto m = model::make_model(*topo, tiny_config(Arch::kGpt2), {}, kMicroBatch);  // 1 slot
  const model::Batch b = make_batch(Arch::kGpt2, 0);
  EXPECT_THROW(m->forward_backward(b, {100.0, 1.0}, 1.0f), Error);
  EXPECT_THROW(m->forward(b), Error);
  // Stage 0 keeps 2 micro-batches in flight when there are 2 or more; the last stage 1.
  if (topo->comm(Group::kPp).rank() < o.pp - 1) {
    EXPECT_THROW(PipelineRunner(*topo, *m, 2), Error);
  } else {
    EXPECT_NO_THROW(PipelineRunner(*topo, *m, 2));
  }
}

// A stage that never runs its part: its neighbour's wait ends with a Timeout naming the rank
// and stage it waited for, instead of hanging.
TEST(Pipeline, AMissingStageIsNamedNotWaitedForever) {
  if (parm::test::world_size() != 2) GTEST_SKIP() << "runs at 2 ranks";
  TopologyOptions o;
  o.pp = 2;
  o.timeout_s = 1.0;
  auto topo = Topology::create(o);
  auto m = model::make_model(*topo, tiny_config(Arch::kGpt2), {}, kMicroBatch,
                             Precision::kFp32, {{}, 1});
  PipelineRunner runner(*topo, *m, 1);
  const model::Batch b = make_batch(Arch::kGpt2, 0);
  if (topo->comm(Group::kPp).rank() == 0) {
    // Forward sent (a small message: it completes without the receiver); the gradient never
    // comes.
    try {
      runner.run({b}, {100.0, 1.0}, 1.0f);
      ADD_FAILURE() << "stage 0 finished without stage 1";
    } catch (const Timeout& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0 (pp stage 0 of 2): the activation gradient "
                                           "of micro-batch 0 from rank 1 (pp stage 1 of 2) did "
                                           "not arrive"),
                std::string::npos)
          << e.what();
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // Stage 1 takes the activation stage 0 sent, so that nothing is left in flight.
  if (topo->comm(Group::kPp).rank() == 1) runner.forward(b);
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace parm::train
