// The training configuration: a JSON file (configs/NAME.json) with sections "model",
// "optim", "data", "train" and "parallel". Unknown keys, wrong types and out-of-range values
// are refused with a message naming the key and what is valid.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "parm/topology.h"
#include "train/optimizer.h"

namespace parm::train {

// What the run reads (train/data_setup.h has the rules).
struct DataConfig {
  std::string corpus = "kjv";  // "kjv" or "file:PATH"
  double val_fraction = 0.05;
  // data.tokenizer: "byte" (or "": bytes, or the prepared dataset's), a SentencePiece .model
  // file, or {"kind": "bpe" | "unigram", "vocab": N} (then tokenizer is the kind and
  // tokenizer_vocab N: trained on the corpus into the cache).
  std::string tokenizer;
  int32_t tokenizer_vocab = 0;
  std::string prepared;  // data.prepared: a prepared dataset folder (parm prepare-data)
  std::string cache;     // data.cache: the cache's folder ("" = <parm binary's folder>/data-cache)
  bool vocab_in_config = false;  // model.vocab was written in the config
};

struct LoopConfig {
  int64_t steps = 100;
  int64_t micro_batch = 8;   // sequences per micro-batch per DP replica
  int64_t grad_accum = 1;    // micro-batches per optimizer step per DP replica
  int64_t eval_every = 50;   // 0: only at the end
  int64_t eval_batches = 4;  // validation micro-batches per DP replica
  int64_t log_every = 1;
  int64_t save_every = 0;    // 0: only at the end when save_dir is set
  std::string save_dir;
  std::string resume;        // checkpoint folder or save dir ("" = start fresh)
  std::string metrics;       // JSON-lines file ("" = none)
  std::string chart;         // SVG loss curve ("" = <metrics>.svg when metrics is set)
  std::string profile;       // cost-model profile for --schedule auto
  // Time the step's phases (attention, dense MLP, MoE, embeddings + head, optimizer, gradient
  // reduction), waiting for the device at each boundary: slower, so off by default.
  bool phase_times = false;
  // What a forward pass keeps for its backward: none | moe-act | block (model/model.h's
  // Recompute; docs/memory.md).
  std::string recompute = "none";
  // Refuse the run before any work when the predicted per-rank memory (model/memory_plan.h)
  // exceeds this many bytes (0: no limit).
  int64_t memory_limit = 0;
};

struct ParallelConfig {
  int mp = 1, ep = 1, esp = 1, pp = 1;
  std::string order = kDefaultOrder;  // the nesting of the groups (docs/layout.md)
  std::string pp_split;  // blocks per stage, "3,3,3,3" ("" = balanced; model/pp_split.h)
  std::string pp_overlap = "off";  // on | off: two micro-batches' passes interleaved at their
                                   // MoE AllToAlls (train/pipeline.h)
  std::string schedule = "s1";  // baseline | s1 | s2 | auto
  std::string fuse = "on";      // on | off | auto
  // The shared experts computed while the dispatch AllToAll is in flight (S1, S2; docs/spec.md
  // §9): how the layers run, not what they compute, so not in a checkpoint's model section.
  bool shared_overlap = false;
  // With a capacity factor: the exchanges move whole capacity buffers (true, the default) or
  // the kept rows only (MoeShape::pad_to_capacity); how the layers run, not in a checkpoint.
  bool pad_to_capacity = true;
  int chunks = fused_plan::kDefaultChunks;
  int ranks_per_node = 0;
  double timeout_s = 300.0;
  std::string device = "cpu";      // where the MoE layers compute: cpu | cuda
  std::string precision = "fp32";  // expert products: fp32 | bf16 (cuda)
  std::string comm = "auto";       // what moves device buffers: auto | mpi | nccl
};

struct TrainConfig {
  std::string name;
  model::ModelConfig model;
  OptimConfig optim;
  DataConfig data;
  LoopConfig loop;
  ParallelConfig parallel;
};

// Parses and validates; `origin` names the file in messages.
TrainConfig parse_train_config(const nlohmann::json& j, const std::string& origin);
TrainConfig load_train_config(const std::string& path);
// The model section as JSON (what checkpoints compare).
nlohmann::json model_config_json(const model::ModelConfig& m);
// The keys model_config_json writes only where they differ from their defaults (so that
// earlier checkpoints, which have none, still match): a checkpoint that has one the model's
// JSON lacks was saved with another value than this model's default.
const std::vector<std::string>& model_keys_omitted_at_default();
// Checks the values (also after command-line overrides).
void validate(const TrainConfig& c);

}  // namespace parm::train
