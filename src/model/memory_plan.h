// The memory one rank of a training run will hold, predicted from the configuration and the
// layout before anything is built (`parm train --dry-run-memory`, `--memory-limit`): the
// tensors of model/transformer.cpp and the MoE layers (moe/layer_memory.h) by kind, as the
// allocator's counters (parm/memory.h) count them once the run is built. docs/memory.md
// states what is not predicted and the tolerance the tests hold the prediction to.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

namespace parm::model {

struct MemoryPlanInput {
  ModelConfig model;
  Layout layout;
  std::vector<LayerSchedule> schedules;  // one per MoE block, or one for all
  int64_t micro_batch = 1;
  Precision precision = Precision::kFp32;
  std::vector<int64_t> split;            // blocks per stage (model/pp_split.h), whole list
  std::vector<int> slots;                // activation slots per stage
  Recompute recompute = Recompute::kNone;
  int lanes = 1;  // passes of a stage in flight together (PipelineOptions::lanes)
  // What each rank keeps of the AdamW moments: 1 / divisor of them. 1 and 1 without
  // optimizer sharding; with it (--optimizer-sharding dp) N_DP for the dense parameters and
  // N_EDP for the experts'.
  double dense_optimizer_divisor = 1.0;
  double expert_optimizer_divisor = 1.0;
};

// One rank of a pipeline stage (every rank of a stage holds the same sizes).
struct MemoryPlan {
  int stage = 0;
  int64_t parameters = 0, gradients = 0, optimizer = 0, activations = 0;
  int64_t other = 0;  // the model's gradient scratch only (not the communication buffers)
  int64_t total() const { return parameters + gradients + optimizer + activations + other; }
};

// One entry per pipeline stage. Throws InvalidConfig as validate_model does.
std::vector<MemoryPlan> plan_memory(const MemoryPlanInput& in);

// "123456789", "8GiB", "1.5 GB": bytes, with an optional suffix: B; KiB, MiB, GiB, TiB
// (powers of 1024); KB, MB, GB, TB (powers of 1000). Throws InvalidConfig naming `what` and
// the valid forms.
int64_t parse_bytes(const std::string& text, const std::string& what);

}  // namespace parm::model
