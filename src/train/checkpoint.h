// Layout-independent checkpoints: a manifest plus whole (unsharded) tensors — parameters and
// AdamW moments — with names, shapes and checksums, plus the step, the optimizer's step count
// and the data position (the format: train/checkpoint_manifest.h). All traffic goes over the
// world group's host communicator (counted, and bounded by its deadline). Written so that a
// crash never leaves a checkpoint that looks complete: every file goes into
// `step-NNNNNNNN.tmp/`, the manifest last, then the folder is renamed to `step-NNNNNNNN/` and
// the `latest` file (written atomically) names it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "train/optimizer.h"

namespace parm::train {

struct CheckpointState {
  int64_t step = 0;            // optimizer steps done
  int64_t data_position = 0;   // training sequences consumed
  nlohmann::json model_config; // must match on load
  nlohmann::json router_bias;  // per MoE layer of the whole model, E numbers; null: none
  // The tokenizer: its identity (data/tokenizer.h) and the bytes of its model file ("" for
  // bytes), saved as tokenizer.model beside the manifest. Loaded: the checkpoint's record
  // (the byte tokenizer's for a checkpoint that has none); tokenizer_bytes stays empty.
  nlohmann::json tokenizer;
  std::string tokenizer_bytes;
};

// `all`: every parameter of the whole model (Model::all_param_specs), the checkpoint's tensor
// list in the same order on every layout; `params`: those this rank holds (its pipeline
// stage's), with `optimizer` over them.
// Collective over the world. Returns the checkpoint's folder.
std::string save_checkpoint(Topology& topo, const std::string& save_dir,
                            const std::vector<model::ParamSpec>& all,
                            const std::vector<model::Param*>& params, AdamW& optimizer,
                            const CheckpointState& state);

// `path` is a checkpoint folder, or a save dir (then its `latest` checkpoint). Collective.
// World rank 0 validates every manifest field (validate_manifest) before reading a byte of
// tensor data, then reads, checks (size, checksum) and broadcasts one tensor at a time; the
// model and optimizer are overwritten only when all of them passed. Throws InvalidConfig
// naming the file, the tensor and the field, identically on every rank. A checkpoint saved
// with another tokenizer than `tokenizer` (an identity; null: the byte tokenizer) is refused
// naming both.
CheckpointState load_checkpoint(Topology& topo, const std::string& path,
                                const std::vector<model::ParamSpec>& all,
                                const std::vector<model::Param*>& params, AdamW& optimizer,
                                const nlohmann::json& model_config,
                                const nlohmann::json& tokenizer = nullptr);

}  // namespace parm::train
