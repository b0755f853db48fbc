#include "train/memory_check.h"

#include <algorithm>

#include <fmt/format.h>

#include "model/pp_split.h"
#include "parm/error.h"
#include "train/optimizer.h"
#include "train/pipeline_schedule.h"

namespace parm::train {

std::vector<model::MemoryPlan> predict_run_memory(const TrainConfig& c, const Layout& layout) {
  const auto& p = c.parallel;
  model::MemoryPlanInput in;
  in.model = c.model;
  in.layout = layout;
  in.micro_batch = c.loop.micro_batch;
  in.precision = parse_precision(p.precision);
  in.split = model::parse_pp_split(p.pp_split, layout.pp, c.model.num_layers);
  for (int k = 0; k < layout.pp; ++k)
    in.slots.push_back(pipeline_slots(k, layout.pp, static_cast<int>(c.loop.grad_accum)));
  in.recompute = model::parse_recompute(c.loop.recompute);
  in.lanes = pipeline_lanes(layout.pp, p.pp_overlap);
  const bool sharded = parse_optimizer_sharding(c.optim.sharding) == OptimizerSharding::kDp;
  in.dense_optimizer_divisor = sharded ? layout.dp : 1.0;
  in.expert_optimizer_divisor = sharded ? layout.edp : 1.0;
  model::LayerSchedule fixed;
  fixed.chunks = p.chunks;
  fixed.fuse = p.fuse != "off";
  fixed.shared_overlap = p.shared_overlap;
  fixed.pad_to_capacity = p.pad_to_capacity;
  std::vector<schedule::Kind> kinds;
  if (p.schedule == "auto")
    kinds = {schedule::Kind::kBaseline, schedule::Kind::kS1, schedule::Kind::kS2};
  else
    kinds = {schedule::parse_kind(p.schedule)};
  std::vector<model::MemoryPlan> worst;
  for (schedule::Kind k : kinds) {
    fixed.kind = k;
    in.schedules = {fixed};
    std::vector<model::MemoryPlan> plans;
    try {
      plans = model::plan_memory(in);
    } catch (const InvalidConfig&) {
      if (kinds.size() == 1) throw;
      continue;  // a kind this layout refuses (the baseline's) is never chosen
    }
    if (worst.empty()) worst = plans;
    for (size_t s = 0; s < plans.size(); ++s)
      if (plans[s].total() > worst[s].total()) worst[s] = plans[s];
  }
  PARM_CONFIG_CHECK(!worst.empty(), "no MoE schedule is valid for this layout");
  return worst;
}

std::string memory_plan_text(const TrainConfig& c, const Layout& layout,
                             const std::vector<model::MemoryPlan>& plans) {
  const double mib = 1024.0 * 1024.0;
  std::string out = fmt::format(
      "predicted memory per rank ({} ranks: pp={} x (dp={} mp={} | edp={} ep={} esp={}); "
      "recompute {}; MiB):\n",
      layout.world, layout.pp, layout.dp, layout.mp, layout.edp, layout.ep, layout.esp,
      c.loop.recompute);
  for (const auto& p : plans)
    out += fmt::format(
        "  stage {}: params {:.2f} grads {:.2f} optim {:.2f} acts {:.2f} other {:.2f} total "
        "{:.2f} ({} bytes: parameters {} gradients {} optimizer {} activations {} other {})\n",
        p.stage, p.parameters / mib, p.gradients / mib, p.optimizer / mib, p.activations / mib,
        p.other / mib, p.total() / mib, p.total(), p.parameters, p.gradients, p.optimizer,
        p.activations, p.other);
  return out;
}

void check_memory_limit(const TrainConfig& c, const Layout& layout) {
  if (c.loop.memory_limit <= 0) return;
  const auto plans = predict_run_memory(c, layout);
  const auto worst = std::max_element(plans.begin(), plans.end(), [](const auto& a, const auto& b) {
    return a.total() < b.total();
  });
  const double gib = 1024.0 * 1024.0 * 1024.0;
  PARM_CONFIG_CHECK(worst->total() <= c.loop.memory_limit,
                    "the run will not fit --memory-limit (train.memory_limit) {} bytes ({:.3f} "
                    "GiB): a rank of pipeline stage {} is predicted to hold {} bytes ({:.3f} GiB: "
                    "parameters {}, gradients {}, optimizer {}, activations {}, other {}); use "
                    "--recompute, more ranks (mp, ep, esp, pp), a smaller --micro-batch, or a "
                    "larger limit (`parm train --dry-run-memory` prints the prediction)",
                    c.loop.memory_limit, c.loop.memory_limit / gib, worst->stage, worst->total(),
                    worst->total() / gib, worst->parameters, worst->gradients, worst->optimizer,
                    worst->activations, worst->other);
}

}  // namespace parm::train
