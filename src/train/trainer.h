// The training loop: data-parallel micro-batches, gradient reduction over dp/edp, global-norm
// clipping, AdamW with warmup + cosine, validation, metrics, checkpoints.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/batches.h"
#include "model/model.h"
#include "moe/phase_times.h"
#include "parm/topology.h"
#include "perfmodel/profile.h"
#include "train/gemm_rate.h"
#include "train/memory_report.h"
#include "train/optimizer.h"
#include "train/pipeline.h"
#include "train/step_metrics.h"
#include "train/data_setup.h"
#include "train/train_config.h"

namespace parm::train {

struct TrainResult {
  std::vector<StepMetrics> history;  // on world rank 0
  double final_val_loss = -1.0;
  double gemm_gflops = 0.0;          // per rank, used for MFU
  std::vector<std::string> schedules;  // per MoE layer, e.g. "s1+fused"
  std::vector<MemoryPeaks> rank_memory;  // by world rank: its peaks over the run
};

// One training run. The constructor and run() are collective over the world; world rank 0
// prints (when `verbose`) and writes the metrics file.
class Trainer {
 public:
  // The setup: refuses a bad configuration before any work (InvalidConfig, alike on every
  // rank), then builds the topology, plans the schedules, loads the corpus, builds the model,
  // its pipeline runner (pp > 1) and optimizer, measures the GEMM rate for MFU, resumes from
  // cfg.loop.resume, and prints the run's header and stages.
  Trainer(const TrainConfig& cfg, bool verbose);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Steps up to cfg.loop.steps: each step, its report, the re-plan (once, after the first
  // report step, when the schedules are the cost model's) and the checkpoints; then the
  // summary and the loss chart.
  TrainResult run();

 private:
  // One optimizer step and its metrics (max over ranks; val_loss where evaluated); counts it
  // in step_.
  StepMetrics step();
  struct Passes {
    double sums[3] = {0.0, 0.0, 0.0};  // lm loss sum, aux loss sum, z-loss sum
    double comm_us = 0.0, compute_us = 0.0;
    double bubble_us = 0.0;  // pp > 1: waiting on pp.recv (also in comm_us)
  };
  // Forward and backward of this rank's micro-batches of the step, accumulating (+=) the
  // gradients (lm_targets: the global batch's counted positions; Model::forward_backward).
  // The sums are this rank's (pp > 1: summed over its pp group).
  Passes forward_backward(double lm_targets);
  // Mean validation loss over cfg.loop.eval_batches micro-batches per dp replica.
  double evaluate();
  // Whether the step that makes `steps_done` reports: every cfg.loop.log_every, and the last.
  bool report_step(int64_t steps_done) const;
  // World rank 0: the history, the progress line (report steps and evaluations) and the
  // metrics line.
  void report(const StepMetrics& m, bool report_step);
  // Re-prices the schedules with the routing just measured (layer_loads_) and rebuilds the
  // model where they changed: the step lists change, no number does.
  void replan();
  void resume();  // from cfg.loop.resume: parameters, moments, step, data position, bias
  void save();    // a checkpoint of the steps done
  void finish();  // the summary and the loss chart

  const TrainConfig cfg_;
  const bool verbose_;
  std::unique_ptr<Topology> topo_;
  Communicator& world_;
  const bool root_;
  const int64_t accum_, micro_;
  std::optional<perfmodel::Profile> cost_profile_;  // read once, by the first plan
  std::vector<model::LayerSchedule> schedules_;
  const TrainingData data_;  // the corpus's tokens and their tokenizer
  const data::BatchSource source_;
  const model::PipelineOptions pipe_;
  std::unique_ptr<model::Model> model_;
  std::vector<model::Param*> params_;  // this stage's
  const std::vector<model::ParamSpec> all_params_;
  std::unique_ptr<PipelineRunner> pipeline_;  // pp > 1
  AdamW opt_;
  OptimConfig optim_;
  const nlohmann::json model_json_;
  const int64_t global_batch_, tokens_per_step_;
  TrainResult result_;
  std::string schedules_line_;  // result_.schedules joined by ','
  ReportFields fields_;
  std::FILE* metrics_ = nullptr;  // --metrics, on world rank 0
  moe::PhaseTimes phases_;        // --phase-times: the model's phases and the step's tail
  bool replan_pending_ = false;
  double total_flops_ = 0.0;  // model FLOPs of one step summed over the ranks
  int64_t step_ = 0;           // optimizer steps done
  int64_t data_position_ = 0;  // training sequences consumed
  // The expert weights change only at the optimizer step: a GPU layer at bf16 rounds them
  // once per step, not once per micro-batch. The model hands it to the dense weights' packs
  // and its MoE experts, at every step's start (a re-plan may have built a new model) and
  // right after the optimizer step, so that an evaluation between steps reads the new weights.
  uint64_t weights_version_ = 1;
  std::vector<std::vector<double>> layer_loads_;  // expert_loads per MoE layer, of this step
  double run_t0_us_ = 0.0;
};

// Trainer(config, verbose).run(). The tests' faults (a rank that dies, a save that crashes)
// come from PARM_FAULT (core/fault.h).
TrainResult run_training(const TrainConfig& config, bool verbose);

}  // namespace parm::train
