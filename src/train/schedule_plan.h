// The trainer's planning (docs/spec.md §5): each MoE layer's schedule, configured or, with --schedule
// auto / --fuse auto, the cost model's fastest candidate; and the re-plan once the routing
// has been measured (docs/perfmodel.md, "train --schedule auto").
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/model.h"
#include "parm/topology.h"
#include "perfmodel/profile.h"
#include "train/train_config.h"

namespace parm::train {

// Whether the schedules are the cost model's choice (--schedule auto or --fuse auto).
bool plans_schedules(const TrainConfig& c);

// One schedule per MoE layer of the whole model (or one entry for all when nothing is
// chosen). load_max_over_mean: per MoE layer the routing imbalance to price with
// (perfmodel::Target::load_max_over_mean); empty: 1 for every layer (a balanced router).
// With `print` the candidates' prices are printed, each line after `prefix`. `profile`: the
// cost profile read by an earlier call (read from --profile here when empty), so that a
// re-plan reads no file: every rank has the numbers it planned with at the start.
// Throws InvalidConfig for auto without a profile, or a profile of another device.
std::vector<model::LayerSchedule> choose_schedules(const TrainConfig& c, Topology& topo,
                                                   const std::vector<double>& load_max_over_mean,
                                                   const std::string& prefix, bool print,
                                                   std::optional<perfmodel::Profile>& profile);

// Per MoE layer of the whole model, "s2+fused" when the layer really runs a fused
// collective (not when the layout leaves nothing to fuse), "+shared-overlap" after it when
// the shared experts really run while the dispatch AllToAll is in flight (not where it is
// fused or absent: docs/spec.md §9). `schedules`: one per MoE layer or
// one for all, as choose_schedules returns them.
std::vector<std::string> schedule_names(const std::vector<model::LayerSchedule>& schedules,
                                        const TrainConfig& c, const Layout& layout);

// The busiest EP rank's routed choices over the mean per EP rank, from an MoE layer's
// expert loads (moe/load_balance.h: routed choices per expert, E of them, before any drop;
// EP rank j holds experts [j E / n_ep, (j + 1) E / n_ep)). 1 when nothing was routed.
// Throws for E not a multiple of n_ep or a negative load.
double routed_load_max_over_mean(const std::vector<double>& loads, int n_ep);

}  // namespace parm::train
