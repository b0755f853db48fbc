// A transformer language model with MoE layers under hybrid parallelism, as one rank runs it.
// GPT-2-style (decoder, causal, tied LM head) or BERT-style (encoder, masked LM head).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/batch.h"
#include "layer/shape.h"
#include "model/param.h"
#include "parm/topology.h"
#include "schedule/schedule.h"

namespace parm {
class MoeLayer;
}  // namespace parm

namespace parm::model {

enum class Arch { kGpt2, kBert };

// The model reads the batches and the token ids of src/data.
using data::Batch;
using data::kBertMaskToken;
using data::kBertVocab;

struct ModelConfig {
  Arch arch = Arch::kGpt2;
  int64_t vocab = 256;      // byte-level tokenizer (BERT adds [MASK] etc. on top: see data/)
  int64_t seq_len = 64;     // L
  int64_t model_dim = 128;  // M
  int64_t num_heads = 4;
  int64_t num_layers = 4;
  int64_t ffn_hidden = 512;     // dense MLP hidden
  int moe_every = 2;            // block i has an MoE FFN when i % moe_every == moe_every - 1
  int64_t experts = 4;          // E
  int64_t expert_hidden = 512;  // H
  int topk = 2;
  std::string capacity_factor = "1.25";
  float aux_loss_coeff = 0.01f;
  float init_std = 0.02f;
  uint64_t seed = 1;
  // Biases and layernorm shifts start at N(0, init_bias_std^2), layernorm gains at
  // 1 + N(0, init_bias_std^2). 0 (the default, as GPT-2): zeros and ones. Tests set it
  // nonzero so that a bias applied twice or never shows in the outputs.
  float init_bias_std = 0.0f;
};

// Block i has an MoE FFN (moe_every > 0; moe_every == 0: a dense model).
inline bool is_moe_block(const ModelConfig& c, int64_t i) {
  return c.moe_every > 0 && i % c.moe_every == c.moe_every - 1;
}
int64_t num_moe_blocks(const ModelConfig& c);
// The shape of the model's MoE layers for micro-batches of `micro_batch` sequences
// (T = micro_batch x seq_len tokens per MP group).
MoeShape moe_shape(const ModelConfig& c, int64_t micro_batch);

struct LossParts {
  double lm_loss_sum = 0.0;   // sum over this batch's counted positions of -log p(target)
  int64_t num_targets = 0;    // counted positions
  double aux_loss = 0.0;      // sum over MoE layers of l_aux
};

// Per-MoE-layer schedule choice (the training run may pick one per layer).
struct LayerSchedule {
  schedule::Kind kind = schedule::Kind::kS1;
  bool fuse = true;
  int chunks = 4;
};

class Model {
 public:
  virtual ~Model() = default;
  // The MoE layers, in block order (their routing: the load imbalance the trainer reports).
  virtual std::vector<MoeLayer*> moe_layers() { return {}; }
  // All trainable parameters of this rank, in a fixed order (the same names on every layout).
  virtual std::vector<Param*> params() = 0;
  // Forward and backward of one micro-batch: the loss being differentiated is
  //   loss_scale * (lm_loss_sum / lm_denominator + aux_loss_coeff * aux_loss)
  // where lm_denominator is the number of counted positions of the whole global batch
  // (so that summing the gradients over micro-batches and DP replicas gives the gradient of
  // the global mean). Accumulates (+=) every Param::grad; does not reduce over dp/edp.
  virtual LossParts forward_backward(const Batch& batch, double lm_denominator,
                                     float loss_scale) = 0;
  // Forward only (evaluation).
  virtual LossParts forward(const Batch& batch) = 0;
  // The MoE layers' schedules, in block order.
  virtual std::vector<LayerSchedule> schedules() const = 0;
  // Per-step time split of the last forward_backward (microseconds): compute vs communication.
  virtual double last_comm_us() const = 0;
  virtual double last_compute_us() const = 0;
  // FLOPs of one forward+backward of a batch of `tokens` tokens on this rank (for MFU).
  // `tokens` counts the MP group's tokens (B*L of a micro-batch); the result is this rank's
  // share of the model FLOPs (useful work / N_MP; see transformer.cpp for what is counted).
  virtual double flops_per_step(int64_t tokens) const = 0;
};

// Builds the model for this rank's place in `topo`, parameters initialised from config.seed
// identically to the single-process model (each rank takes its shards of the whole tensors).
// `moe_schedules` has one entry per MoE block (or one entry used for all).
// Throws InvalidConfig for shapes that the layout cannot split (heads % N_MP, ffn_hidden % N_MP,
// experts % N_EP, expert_hidden % N_ESP, (B*L) % N_MP for the MoE layers, ...).
// The checks make_model runs before building anything, for a CLI that wants to refuse a bad
// configuration early: throws InvalidConfig naming the broken constraint and what would be valid.
void validate_model(const ModelConfig& config, const Layout& layout,
                    const std::vector<LayerSchedule>& moe_schedules, int64_t micro_batch);

// The MoE layers compute on topo.device() with expert products at `precision`; the dense
// part, the optimizer and checkpoints stay on the host.
std::unique_ptr<Model> make_model(Topology& topo, const ModelConfig& config,
                                  const std::vector<LayerSchedule>& moe_schedules,
                                  int64_t micro_batch, Precision precision = Precision::kFp32);

}  // namespace parm::model
