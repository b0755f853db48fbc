// A run's predicted memory (model/memory_plan.h) from its configuration and layout, before
// any work: `parm train --dry-run-memory` prints it, `--memory-limit` (train.memory_limit)
// refuses a run whose largest rank would exceed it.
#pragma once

#include <string>
#include <vector>

#include "model/memory_plan.h"
#include "train/train_config.h"

namespace parm::train {

// One plan per pipeline stage. Under --schedule auto the cost model's choice is not made yet:
// each MoE layer is taken at whichever of baseline, S1 and S2 (those the layout allows) holds
// the most. The optimizer state follows c.optim.sharding: under dp each rank keeps 1/dp of
// the dense parameters' and 1/edp of its expert shards' (train/optimizer.h).
std::vector<model::MemoryPlan> predict_run_memory(const TrainConfig& c, const Layout& layout);
// The plan as a table, one line per stage (MiB and bytes).
std::string memory_plan_text(const TrainConfig& c, const Layout& layout,
                             const std::vector<model::MemoryPlan>& plans);
// Throws InvalidConfig naming the predicted bytes of the largest stage, the limit and the
// largest kinds when c.loop.memory_limit > 0 and the prediction exceeds it.
void check_memory_limit(const TrainConfig& c, const Layout& layout);

}  // namespace parm::train
