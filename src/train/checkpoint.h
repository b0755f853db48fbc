// Layout-independent checkpoints: a manifest plus whole (unsharded) tensors — parameters and
// AdamW moments — with names, shapes and checksums, plus the step, the optimizer's step count
// and the data position. Written so that a crash never leaves a checkpoint that looks
// complete: every file goes into `step-NNNNNNNN.tmp/`, the manifest last, then the folder is
// renamed to `step-NNNNNNNN/` and the `latest` file (written atomically) names it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/param.h"
#include "train/optimizer.h"

namespace parm::train {

struct CheckpointState {
  int64_t step = 0;            // optimizer steps done
  int64_t data_position = 0;   // training sequences consumed
  nlohmann::json model_config; // must match on load
};

// Collective over the world. Returns the checkpoint's folder.
std::string save_checkpoint(Topology& topo, const std::string& save_dir,
                            const std::vector<model::Param*>& params, AdamW& optimizer,
                            const CheckpointState& state);

// `path` is a checkpoint folder, or a save dir (then its `latest` checkpoint). Collective.
// Validates everything before touching the model: format and version, the model config,
// every tensor's presence, shape, size and checksum. Throws InvalidConfig with a message
// naming the file and the problem, identically on every rank.
CheckpointState load_checkpoint(Topology& topo, const std::string& path,
                                const std::vector<model::Param*>& params, AdamW& optimizer,
                                const nlohmann::json& model_config);

// For tests: stop the save after `n` tensor files (simulates a crash mid-save) by throwing.
void set_checkpoint_crash_after_files(int n);

}  // namespace parm::train
