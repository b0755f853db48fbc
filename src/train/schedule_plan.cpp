#include "train/schedule_plan.h"

#include <algorithm>
#include <cstdio>

#include "moe/load_balance.h"
#include "parm/error.h"
#include "perfmodel/model.h"

namespace parm::train {

bool plans_schedules(const TrainConfig& c) {
  return c.parallel.schedule == "auto" || c.parallel.fuse == "auto";
}

std::vector<model::LayerSchedule> choose_schedules(const TrainConfig& c, Topology& topo,
                                                   const std::vector<double>& load_max_over_mean,
                                                   const std::string& prefix, bool print,
                                                   std::optional<perfmodel::Profile>& profile) {
  const auto& p = c.parallel;
  const bool auto_kind = p.schedule == "auto", auto_fuse = p.fuse == "auto";
  model::LayerSchedule fixed;
  fixed.chunks = p.chunks;
  fixed.fuse = p.fuse == "on";
  fixed.shared_overlap = p.shared_overlap;
  fixed.pad_to_capacity = p.pad_to_capacity;
  if (!auto_kind) fixed.kind = schedule::parse_kind(p.schedule);
  if (!auto_kind && !auto_fuse) return {fixed};
  PARM_CONFIG_CHECK(!c.loop.profile.empty(),
                    "--schedule auto / --fuse auto need a cost profile: run `scripts/parmrun -n 4 "
                    "-- calibrate --out profile.json` once on this machine, then pass --profile "
                    "profile.json");
  const int64_t layers = model::num_moe_blocks(c.model);
  PARM_CHECK(load_max_over_mean.empty() ||
                 static_cast<int64_t>(load_max_over_mean.size()) == layers,
             "{} routing imbalances for {} MoE layers", load_max_over_mean.size(), layers);
  if (!profile) {
    profile = perfmodel::read_profile(c.loop.profile);
    perfmodel::check_profile_device(*profile, topo.device(), c.loop.profile);
  }
  const MoeShape shape = model::layer_shape(c.model, c.loop.micro_batch, fixed);
  const std::vector<schedule::Kind> kinds =
      auto_kind ? std::vector<schedule::Kind>{schedule::Kind::kBaseline, schedule::Kind::kS1,
                                              schedule::Kind::kS2}
                : std::vector<schedule::Kind>{fixed.kind};
  const std::vector<bool> fuse_modes =
      auto_fuse ? std::vector<bool>{false, true} : std::vector<bool>{fixed.fuse};
  perfmodel::Target target = perfmodel::target_of(topo);
  std::vector<model::LayerSchedule> out;
  for (int64_t layer = 0; layer < layers; ++layer) {
    // Every MoE layer of these models has the same shape; they differ by their routing.
    target.load_max_over_mean =
        load_max_over_mean.empty() ? 1.0 : load_max_over_mean[static_cast<size_t>(layer)];
    const auto cands =
        perfmodel::predict_candidates(*profile, shape, target, p.chunks, kinds, fuse_modes);
    const size_t best = perfmodel::choose(cands);
    model::LayerSchedule s = fixed;
    s.kind = cands[best].kind;
    s.fuse = cands[best].fuse;
    out.push_back(s);
    if (print && topo.world_rank() == 0) {
      std::printf("%sMoE layer %lld (%s, load max/mean %.3f): predicted fwd+bwd ms by %s:",
                  prefix.c_str(), static_cast<long long>(layer), shape.str().c_str(),
                  target.load_max_over_mean, c.loop.profile.c_str());
      for (size_t i = 0; i < cands.size(); ++i)
        std::printf("  %s %.3f%s", cands[i].pred.name().c_str(), cands[i].pred.total_us() / 1e3,
                    i == best ? " (chosen)" : "");
      std::printf("\n");
    }
  }
  return out;
}

std::vector<std::string> schedule_names(const std::vector<model::LayerSchedule>& schedules,
                                        const TrainConfig& c, const Layout& layout) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < model::num_moe_blocks(c.model); ++i) {
    const auto& s = schedules[schedules.size() == 1 ? 0 : static_cast<size_t>(i)];
    out.push_back(schedule::build({model::layer_shape(c.model, c.loop.micro_batch, s),
                                   layout, 0, s.fuse, s.chunks},
                                  s.kind)
                      .name());
  }
  return out;
}

double routed_load_max_over_mean(const std::vector<double>& loads, int n_ep) {
  return max_over_mean(loads, n_ep, 1.0);
}

}  // namespace parm::train
