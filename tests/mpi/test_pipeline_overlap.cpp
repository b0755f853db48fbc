// The pipeline's overlap (--pp-overlap on, train/pipeline.h): two micro-batches' passes
// interleaved at their MoE AllToAlls give bit-for-bit the loss parts and every gradient of
// the run without overlap, and on layouts with an EP AllToAll the passes really interleave.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "model_test_util.h"
#include "mpi_test_util.h"
#include "train/pipeline.h"

namespace parm::train {
namespace {

using model::Arch;
using model::Param;
using namespace model::test_util;

struct OverlapCase {
  int mp, ep, esp, pp;
  int micro;
  std::vector<int64_t> split;
};

std::vector<OverlapCase> overlap_cases() {
  switch (parm::test::world_size()) {
    case 2: return {{1, 1, 1, 2, 3, {}}};
    case 4: return {{1, 2, 1, 2, 4, {}}, {1, 2, 1, 2, 3, {3, 1}}, {1, 1, 1, 4, 5, {}}};
    case 8: return {{1, 2, 2, 2, 4, {}}, {2, 2, 1, 2, 3, {}}, {1, 2, 1, 4, 5, {}}};
    default: return {};
  }
}

struct RunResult {
  model::LossParts loss;
  std::map<std::string, Tensor> grads;
  int overlapped = 0;
  bool has_alltoall = false;  // one of the stage's MoE layers has an AllToAll step
};

RunResult run_once(Topology& topo, Arch arch, const OverlapCase& oc,
                   const std::vector<model::LayerSchedule>& scheds, bool dropless,
                   bool overlap) {
  model::ModelConfig config = tiny_config(arch);
  if (dropless) config.capacity_factor = "none";
  const int n_dp = topo.layout().dp, r = topo.comm(Group::kDp).rank();
  const int stage = topo.comm(Group::kPp).rank();
  std::vector<model::Batch> batches;
  for (int a = 0; a < oc.micro; ++a) batches.push_back(make_batch(arch, a * n_dp + r));
  model::PipelineOptions pipe;
  pipe.split = oc.split;
  pipe.slots = pipeline_slots(stage, oc.pp, oc.micro);
  auto m = model::make_model(topo, config, scheds, kMicroBatch, Precision::kFp32, pipe);
  PipelineRunner runner(topo, *m, oc.micro, overlap);
  RunResult out;
  // Two steps: the second starts from the first's slot state (a stale pass would show).
  for (int step = 0; step < 2; ++step) out.loss = runner.run(batches, {1000.0, static_cast<double>(n_dp * oc.micro)}, 1.0f);
  out.overlapped = runner.last_overlapped_pieces();
  // Blocks 1 and 3 are the MoE blocks; the fused steps replace the AllToAll when esp > 1.
  int moe_index = 0;
  for (int64_t i = 0; i < m->stage().end; ++i) {
    if (!model::is_moe_block(tiny_config(arch), i)) continue;
    const model::LayerSchedule& ls = scheds[static_cast<size_t>(moe_index++)];
    // Dropless exchanges (alltoallv of the routed rows) run in one piece.
    if (i >= m->stage().begin && oc.ep > 1 && (!ls.fuse || oc.esp == 1) && !dropless)
      out.has_alltoall = true;
  }
  for (Param* p : m->params()) out.grads[p->name] = p->grad.clone();
  return out;
}

TEST(PipelineOverlap, BitIdenticalToTheRunWithout) {
  const auto cases = overlap_cases();
  if (cases.empty()) GTEST_SKIP() << "runs at 2, 4 and 8 ranks";
  // Unfused S1 and S2 (EP AllToAlls to split at), and fused S1 (no AllToAll step when
  // esp > 1: run in one piece inside a split pass).
  const std::vector<std::vector<model::LayerSchedule>> schedule_sets = {
      {{schedule::Kind::kS1, false, 1}, {schedule::Kind::kS2, false, 1}},
      {{schedule::Kind::kS1, true, 2}, {schedule::Kind::kS1, false, 1}}};
  for (const OverlapCase& oc : cases) {
    auto topo = pipe_topology(oc.mp, oc.ep, oc.esp, oc.pp);
    const int stage = topo->comm(Group::kPp).rank();
    for (Arch arch : {Arch::kGpt2, Arch::kBert})
      for (size_t si = 0; si <= schedule_sets.size(); ++si) {
        // The last round: the first set, dropless.
        const bool dropless = si == schedule_sets.size();
        const auto& scheds = schedule_sets[dropless ? 0 : si];
        const std::string what = fmt::format(
            "{} mp={} ep={} esp={} pp={} m={} split {} schedules {}{} rank {} stage {}",
            arch == Arch::kGpt2 ? "gpt2" : "bert", oc.mp, oc.ep, oc.esp, oc.pp, oc.micro,
            fmt::join(oc.split, ","), dropless ? 0 : si, dropless ? " dropless" : "",
            parm::test::world_rank(), stage);
        const RunResult plain = run_once(*topo, arch, oc, scheds, dropless, false);
        const RunResult over = run_once(*topo, arch, oc, scheds, dropless, true);
        EXPECT_EQ(plain.overlapped, 0) << what;
        // Stages with an EP AllToAll and pairs of passes (every stage but the last, whose
        // F(i) B(i) are one micro-batch) interleave them; no other stage can.
        if (over.has_alltoall && stage < oc.pp - 1)
          EXPECT_GT(over.overlapped, 0) << what;
        else
          EXPECT_EQ(over.overlapped, 0) << what;
        EXPECT_EQ(over.loss.lm_loss_sum, plain.loss.lm_loss_sum) << what;
        EXPECT_EQ(over.loss.aux_loss, plain.loss.aux_loss) << what;
        EXPECT_EQ(over.loss.num_targets, plain.loss.num_targets) << what;
        ASSERT_EQ(over.grads.size(), plain.grads.size()) << what;
        for (const auto& [name, g] : plain.grads) {
          const Tensor& h = over.grads.at(name);
          ASSERT_EQ(h.numel(), g.numel()) << what << " " << name;
          EXPECT_EQ(std::memcmp(h.data(), g.data(), static_cast<size_t>(g.bytes())), 0)
              << what << ": gradient of " << name << " differs with overlap";
        }
      }
  }
}

}  // namespace
}  // namespace parm::train
