// A transformer language model with MoE layers under hybrid parallelism, as one rank runs it.
// GPT-2-style (decoder, causal, tied LM head) or BERT-style (encoder, masked LM head).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/batch.h"
#include "shape/shape.h"
#include "model/param.h"
#include "parm/topology.h"
#include "schedule/schedule.h"

namespace parm {
class MoeLayer;
namespace moe {
struct PhaseTimes;
}  // namespace moe
}  // namespace parm

namespace parm::model {

enum class Arch { kGpt2, kBert };

// The model reads the batches and the token ids of src/data.
using data::Batch;
using data::kBertMaskToken;
using data::kBertVocab;

struct ModelConfig;
// The shared experts' width H_s of a model (shape.h's shared_width rule over its expert_hidden).
int64_t shared_width(const ModelConfig& c);

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
  AuxScope aux_scope = AuxScope::kMicroBatch;  // --aux-loss: what each l_aux is over
  RouterSpec router;  // score function, weights, group limit (docs/spec.md §7)
  ExpertMlp expert_mlp = ExpertMlp::kGelu;  // the experts' FFN (docs/spec.md §8)
  int shared_experts = 0;       // docs/spec.md §9: FFNs every token passes through
  int64_t shared_hidden = 0;    // their width H_s (0: the routed experts' H; shared_width)
  bool shared_gate = false;     // their output times sigmoid(x w_sg)
  float router_z_loss = 0.0f;  // ST-MoE's z-loss coefficient (0: off)
  float router_bias_update = 0.0f;  // DeepSeek-V3's router bias update rate (0: off)
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

// What one step's loss is the mean over (docs/spec.md §6): each micro-batch's pass divides
// its terms by these, so that summing the gradients over the micro-batches and the DP
// replicas gives the gradient of the step's mean loss.
struct LossDenominators {
  double lm_targets = 0.0;  // counted positions of the whole global batch
  double gate_calls = 0.0;  // gate calls per MoE layer in the step: N_DP x micro-batches
};

struct LossParts {
  double lm_loss_sum = 0.0;   // sum over this batch's counted positions of -log p(target)
  int64_t num_targets = 0;    // counted positions
  double aux_loss = 0.0;      // sum over MoE layers of l_aux
  double z_loss = 0.0;        // sum over MoE layers of the router z-loss
};

// ---- Pipeline stages ---------------------------------------------------------------------
// Under --pp N the blocks are split into N stages of consecutive blocks; the first stage also
// holds the embeddings, the last the final LN, the head and the loss. The tied word embedding
// (wte) lives on both the first and the last stage (Megatron's embedding group): its two
// copies get the sum of both stages' gradients (Model::sum_tied_grads) and stay equal.

// The part of the model one stage holds: blocks [begin, end).
struct StageBlocks {
  int stage = 0, num_stages = 1;
  int64_t begin = 0, end = 0;
  bool first() const { return stage == 0; }
  bool last() const { return stage == num_stages - 1; }
};
StageBlocks stage_blocks(const std::vector<int64_t>& split, int stage);

// What a forward pass keeps for its backward (--recompute, train.recompute; docs/memory.md).
// The backward recomputes what was dropped, to the same bits (the gradients equal kNone's):
//   kNone    everything is kept, per block and per activation slot;
//   kMoeAct  the routed experts' activation rows (their input rows, x W1 and the GeLU/SwiGLU
//            output; swiglu's x W3) are kept by no layer: one set (moe/activation_pool.h)
//            serves every MoE layer and slot, and each layer's backward runs its experts'
//            forward again from the experts' input buffer (no collective is repeated);
//   kMoe     kMoeAct, and also the MoE layers' step buffers that only their compute steps
//            write (gate statistics, dispatch, expert and combine outputs) and every step
//            buffer's gradient: one set serves every layer and slot; each layer's backward
//            first replays its forward's compute steps from the buffers its collectives wrote
//            (kept), repeating no collective;
//   kBlock   only each block's input (the residual stream) is kept per slot: one set of block
//            activations and one MoE layer per block serve every slot, and the backward of a
//            block runs its forward again first (an MoE block's collectives included).
enum class Recompute { kNone, kMoeAct, kMoe, kBlock };
// "none", "moe-act", "moe", "block"; parse_recompute throws InvalidConfig listing them.
const char* recompute_name(Recompute r);
Recompute parse_recompute(const std::string& name);
// The sets of dropped-and-remade activations a stage keeps, one per pass that may be in flight
// (`lanes`: PipelineOptions::lanes) but no more than its `slots`: kBlock's block activations
// and MoE layers, kMoe's activation pool; 1 for the other modes (nothing shared, or nothing
// read across a pass's pause).
int recompute_lanes(Recompute r, int lanes, int slots);

struct PipelineOptions {
  // Blocks per stage, first to last (empty: balanced); model/pp_split.h checks it.
  std::vector<int64_t> split;
  int slots = 1;               // activation slots: micro-batches in flight on this stage
  Recompute recompute = Recompute::kNone;  // what the forward keeps
  // Passes of the stage in flight together (--pp-overlap on: 2, else 1). kBlock keeps one set
  // of block activations and one MoE layer per block for each, kMoe one set of its activation
  // pool (at most one per slot).
  int lanes = 1;
};

// A parameter of the whole model as checkpoints name it, held on this stage or not.
struct ParamSpec {
  std::string name;
  Shape whole_shape;
};

// Per-MoE-layer schedule choice (the training run may pick one per layer): how the layer
// runs, never what it computes, so none of it is in a checkpoint.
struct LayerSchedule {
  schedule::Kind kind = schedule::Kind::kS1;
  bool fuse = true;
  int chunks = fused_plan::kDefaultChunks;
  // The shared experts computed while the dispatch AllToAll is in flight
  // (MoeShape::shared_overlap; --shared-overlap, parallel.shared_overlap).
  bool shared_overlap = false;
  // With a capacity factor, the exchanges move whole capacity buffers (on) or the kept rows
  // only (MoeShape::pad_to_capacity; --pad-to-capacity, parallel.pad_to_capacity).
  bool pad_to_capacity = true;
};
// The shape of an MoE layer run under `s`: moe_shape(c, micro_batch) with s's execution
// choices (shared_overlap, pad_to_capacity).
MoeShape layer_shape(const ModelConfig& c, int64_t micro_batch, const LayerSchedule& s);

class Model {
 public:
  virtual ~Model() = default;
  // The MoE layers, in block order (their routing: the load imbalance the trainer reports).
  virtual std::vector<MoeLayer*> moe_layers() { return {}; }
  // The version of the parameters' values: a number that whoever writes them (the trainer's
  // optimizer step) changes with every write, so that copies derived from them (the dense
  // weights packed at bf16, the MoE experts' bf16 copies) are made once per version, not once
  // per pass. Never called (or 0): the copies are made again at every forward pass.
  virtual void set_weights_version(uint64_t version) {}
  // All trainable parameters of this rank, in a fixed order (the same names on every layout).
  virtual std::vector<Param*> params() = 0;
  // Forward and backward of one micro-batch: the loss being differentiated is
  //   loss_scale * (lm_loss_sum / d.lm_targets
  //                 + (aux_loss_coeff * aux_loss + router_z_loss * z_loss) / d.gate_calls)
  // (d: LossDenominators), so that summing the gradients over the micro-batches and the DP
  // replicas gives the gradient of the step's mean LM loss plus each coefficient times the
  // mean over the step's gate calls of l_aux (z-loss); under AuxScope::kGlobal the N_DP
  // replicas of a micro-step share one l_aux, and it divides by d.gate_calls / N_DP.
  // Accumulates (+=) every Param::grad; does not reduce over dp/edp.
  // forward_backward and forward need the whole model (pp = 1); a pipeline stage runs
  // stage_forward / stage_backward (train/pipeline.h) and refuses them.
  virtual LossParts forward_backward(const Batch& batch, const LossDenominators& d,
                                     float loss_scale) = 0;
  // Forward only (evaluation).
  virtual LossParts forward(const Batch& batch) = 0;

  // ---- One pipeline stage (forward_backward and forward are both passes of a one-stage
  // model). A micro-batch's forward and backward use the same activation slot, in
  // [0, PipelineOptions::slots); its activations stay there until that slot's next forward.
  virtual const StageBlocks& stage() const = 0;
  // Every parameter of the whole model in the fixed order of params() on one stage (the same
  // on every layout): the checkpoint's tensor list.
  virtual std::vector<ParamSpec> all_param_specs() const = 0;
  // Where a non-first stage's incoming activation (T, M) goes before stage_forward(slot).
  virtual Tensor& stage_input(int slot) = 0;
  // Forward of one micro-batch through this stage's blocks (the first stage embeds
  // batch.tokens; the others read stage_input(slot)). The last stage runs the head: the lm
  // loss, and with `with_grad` the loss gradient for stage_backward (d and loss_scale as
  // forward_backward; stage_backward divides the l_aux and z-loss terms by the d of the
  // slot's forward). Returns the lm loss (last stage; 0 elsewhere) and the
  // l_aux of this stage's MoE layers.
  virtual LossParts stage_forward(int slot, const Batch& batch, const LossDenominators& d,
                                  float loss_scale, bool with_grad) = 0;
  // The outgoing activation (T, M) of slot's last forward (non-last stages).
  virtual const Tensor& stage_output(int slot) const = 0;
  // Backward of slot's micro-batch from dy (T, M), the gradient at stage_output (ignored on
  // the last stage, which starts from its loss). Accumulates (+=) every Param::grad; returns
  // the gradient at the stage input (non-first stages), valid until the next call.
  virtual const Tensor& stage_backward(int slot, const Batch& batch, const Tensor& dy,
                                       float loss_scale) = 0;
  // The same passes in pieces (train/pipeline.h's overlap): stopped wherever one of the
  // stage's MoE layers has an AllToAll in flight (MoeLayer::start_forward), so that the
  // caller runs another slot's pass meanwhile. start_stage_forward / start_stage_backward
  // run slot's pass up to that point, resume_stage(slot) on to the next; each returns true
  // while the pass is stopped, false once it has ended. Two slots' passes may be in flight
  // together, a forward with a forward or with a backward (never two backwards: they share
  // the gradient scratch). Every rank of the stage's MP / EP / ESP groups must run the same
  // calls in the same order (the collectives are matched in that order). Bit-identical to
  // stage_forward / stage_backward.
  virtual bool start_stage_forward(int slot, const Batch& batch, const LossDenominators& d,
                                   float loss_scale, bool with_grad) = 0;
  virtual bool start_stage_backward(int slot, const Batch& batch, const Tensor& dy,
                                    float loss_scale) = 0;
  virtual bool resume_stage(int slot) = 0;
  // Loss parts of slot's last ended forward (as stage_forward returns them).
  virtual LossParts stage_loss(int slot) const = 0;
  // The gradient at the stage input of the last ended backward (as stage_backward returns
  // it), valid until the next backward starts.
  virtual const Tensor& stage_input_grad() const = 0;
  // Time slot's MoE layers spent in their collectives in their last forward (backward) pass
  // (microseconds; a split AllToAll: its post and its wait).
  virtual double stage_moe_comm_us(int slot, bool backward) const = 0;
  // Sums the tied wte gradient of the first and last stage into both copies (point-to-point
  // over pp). Nothing to do on other stages or under one stage.
  virtual void sum_tied_grads() = 0;
  // Bytes of activations this stage keeps for backward passes, all slots together.
  virtual int64_t activation_bytes() const = 0;
  // The MoE layers' schedules, in block order.
  virtual std::vector<LayerSchedule> schedules() const = 0;
  // Per-step time split of the last forward_backward (microseconds): compute vs communication.
  virtual double last_comm_us() const = 0;
  virtual double last_compute_us() const = 0;
  // Adds (+=) the wall time of each phase of the following passes to `out` ("attention",
  // "dense", "moe", "embed+head"; each MoE layer's and each TP all-reduce's collectives in
  // its phase), waiting for the device at every boundary; null (the default): not timed.
  virtual void time_phases(moe::PhaseTimes* out) = 0;
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

// Every parameter, gradient, activation and scratch tensor lives on topo.device() (the dense
// ops: model/dense_ops.h's table for it); every product runs at `precision`.
// Under pp > 1 the model is this rank's stage (topo's pp rank) of `pipeline.split`.
std::unique_ptr<Model> make_model(Topology& topo, const ModelConfig& config,
                                  const std::vector<LayerSchedule>& moe_schedules,
                                  int64_t micro_batch, Precision precision = Precision::kFp32,
                                  const PipelineOptions& pipeline = {});

}  // namespace parm::model
