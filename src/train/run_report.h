// What a training run prints besides its steps' lines (train/step_metrics.h): the header that
// names the model, the layout, the data and the MFU's GEMM rate; the pipeline's stages; the
// summary table at the end. On stdout; the caller decides which rank prints.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/corpus.h"
#include "model/model.h"
#include "parm/topology.h"
#include "train/gemm_rate.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace parm::train {

// Two lines: the model (`schedules`: per MoE layer) and the layout, batch, corpus and GEMM rate.
void print_run_header(const TrainConfig& cfg, const Layout& lay,
                      const std::vector<std::string>& schedules, const data::Corpus& corpus,
                      const std::string& tokenizer,
                      int64_t global_batch, const GemmRate& rate);

// One line per pipeline stage (collective over the world; printed when `print`): the world
// ranks it runs on (so that a rank named by a failure maps to its stage), its blocks, its
// activation slots and the memory it holds for them, and its parameters with their gradients
// and AdamW state (`opt`: this rank's optimizer).
void print_stages(Topology& topo, model::Model& model, const std::vector<model::Param*>& params,
                  const OptimizerMemory& opt, int num_micro, bool print);

// The summary table: first and last loss, final validation loss, mean tokens/s, the last
// step's time, MFU, the schedules and the wall time.
void print_summary(const std::string& name, const TrainResult& result, double wall_s);

}  // namespace parm::train
