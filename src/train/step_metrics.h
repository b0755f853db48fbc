// What one training step reports, and the two lines that print it: the progress line (stdout)
// and the metrics JSON line (--metrics). Both read every number from one StepMetrics.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "moe/phase_times.h"
#include "train/memory_report.h"

namespace parm::train {

// Times are the max over the ranks (each rank's own step time split into its parts) unless
// said otherwise; the parts do not sum to step_ms (the batches' assembly, the loss reduction
// and, at report steps, the load imbalance are in no part).
struct StepMetrics {
  int64_t step = 0;        // 1-based: optimizer steps done
  double loss = 0.0;       // mean cross-entropy over the global batch (nats per target)
  double aux_loss = 0.0;   // mean over micro-batches of the summed l_aux of the MoE layers
  double z_loss = 0.0;     // the same of the router z-loss
  double val_loss = -1.0;  // < 0: not evaluated at this step
  double lr = 0.0;
  double grad_norm = 0.0;
  double step_ms = 0.0;
  double comm_ms = 0.0;       // time in collectives: the MoE layers', the gradient reduction's,
                              // the expert loads' of --router-bias-update; pp > 1: the waits
                              // on pp.recv
  double compute_ms = 0.0;    // the forward and backward passes' compute
  double grad_norm_ms = 0.0;  // the global gradient norm (sum of squares and its all-reduce)
  double optimizer_ms = 0.0;  // the AdamW update
  double tokens_per_s = 0.0;
  double mfu = 0.0;        // model FLOPs / (step time x ranks x measured GEMM rate)
  double bubble = 0.0;     // pp > 1: mean over ranks of the share of the step spent waiting
                           // on pp.recv
  double bubble_1f1b = 0.0;  // pp > 1: 1F1B's share, (p - 1) / (m + p - 1)
  double moe_comm_ms = 0.0;  // pp > 1: mean over ranks of the time the MoE layers spent in
                             // their collectives (a split AllToAll: its post and its wait)
  // Report steps (--log-every, the last): the routing imbalance of the step's last
  // micro-batch, the worst MoE layer's (moe/load_balance.h); 0 elsewhere.
  double load_expert_max_over_mean = 0.0;
  double load_rank_max_over_mean = 0.0;
  moe::PhaseTimes phases;  // --phase-times: world rank 0's split of the step (us)
  // Peak bytes held so far by parameters, gradients, optimizer state, activations and
  // other tensors, then by all together: each the max over ranks (train/memory_report.h).
  MemoryPeaks mem_peak_bytes{};
};

// What a run's lines hold beyond the numbers of every step; the same for each step of a run.
struct ReportFields {
  int64_t total_steps = 0;   // "step n/total"
  bool z_loss = false;       // --router-z-loss > 0: z, z_loss
  bool pipeline = false;     // pp > 1: bubble, bubble_1f1b, moe-comm / moe_comm_ms
  bool phase_times = false;  // --phase-times: the phases line, phase_ms
};

// The progress line, and with phase_times the phases line below it, each ending in '\n'.
// `schedules`: the MoE layers' schedules the step ran, e.g. "s1,s1+fused".
std::string progress_text(const StepMetrics& m, const ReportFields& f,
                          const std::string& schedules);

// The metrics line's object (keys: step, loss, aux_loss, lr, grad_norm, step_ms, comm_ms,
// compute_ms, grad_norm_ms, optimizer_ms, tokens_per_s, mfu; val_loss where evaluated;
// z_loss, bubble, bubble_1f1b, moe_comm_ms, phase_ms as `f` says; load_expert_max_over_mean
// and load_rank_max_over_mean where measured).
nlohmann::json metrics_json(const StepMetrics& m, const ReportFields& f);

}  // namespace parm::train
