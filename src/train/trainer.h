// The training loop: data-parallel micro-batches, gradient reduction over dp/edp, global-norm
// clipping, AdamW with warmup + cosine, validation, metrics, checkpoints.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/train_config.h"

namespace parm::train {

struct StepMetrics {
  int64_t step = 0;        // 1-based: optimizer steps done
  double loss = 0.0;       // mean cross-entropy over the global batch (nats per target)
  double aux_loss = 0.0;   // mean over micro-batches of the summed l_aux of the MoE layers
  double z_loss = 0.0;     // the same of the router z-loss
  double val_loss = -1.0;  // < 0: not evaluated at this step
  double lr = 0.0;
  double grad_norm = 0.0;
  double step_ms = 0.0;
  double comm_ms = 0.0;    // max over ranks of the time in collectives
  double compute_ms = 0.0;
  double tokens_per_s = 0.0;
  double mfu = 0.0;        // model FLOPs / (step time x ranks x measured GEMM rate)
  double bubble = 0.0;     // pp > 1: mean over ranks of the share of the step spent waiting
                           // on pp.recv
  double moe_comm_ms = 0.0;  // pp > 1: mean over ranks of the time the MoE layers spent in
                             // their collectives (a split AllToAll: its post and its wait)
};

struct TrainResult {
  std::vector<StepMetrics> history;  // on world rank 0
  double final_val_loss = -1.0;
  double gemm_gflops = 0.0;          // per rank, used for MFU
  std::vector<std::string> schedules;  // per MoE layer, e.g. "s1+fused"
};

// Collective over the world. Prints progress on rank 0 when `verbose`. The tests' faults (a
// rank that dies, a save that crashes) come from PARM_FAULT (core/fault.h).
TrainResult run_training(const TrainConfig& config, bool verbose);

}  // namespace parm::train
