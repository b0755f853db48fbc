// The transformer (model/model.h's Model) as the files of src/model build it: the class and its
// block, activation and pass types. Internal to src/model; users go through make_model.
//
// transformer.cpp         wiring: the constructor, buffers, the whole-model passes, tied grads
// transformer_params.cpp  which parameters the model has (names, shapes, splits, init)
// block_forward.cpp       a block's forward: attention, dense FFN / MoE, residual
// block_backward.cpp      a block's backward
// lm_head.cpp             the final LN's output to the loss and back (GPT-2 LM, BERT MLM)
// stage_pass.cpp          a pipeline stage's passes, whole or stopped at MoE AllToAlls
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/bf16_weights.h"
#include "model/dense_ops.h"
#include "model/model.h"
#include "model/param_registry.h"
#include "model/phase_clock.h"
#include "model/tp.h"
#include "model/vocab_parallel.h"
#include "moe/moe_layer.h"
#include "parm/error.h"

namespace parm::model {

inline constexpr float kLnEps = 1e-5f;

// The activations one micro-batch leaves in a block for its backward pass. A pipeline stage
// keeps one set per micro-batch in flight (activation slot); every other stage buffer is
// scratch shared by the slots.
struct BlockActs {
  MoeLayer* moe = nullptr;         // the slot's MoE layer (it keeps its own step buffers)
  Tensor ln1, ln1_mean, ln1_rstd;  // (T, M), (T), (T)
  Tensor qkv;                      // (3, T, Ml): q, k, v of the local heads
  Tensor probs;                    // (B, Hl, L, L)
  Tensor att;                      // (T, Ml)
  Tensor res_mid;                  // (T, M) x + attention
  Tensor ln2, ln2_mean, ln2_rstd;  // (T, M), (T), (T)
  Tensor fc_pre, fc_act;           // (T, Fl) dense blocks only

  int64_t bytes() const {
    int64_t n = 0;
    for (const Tensor* t : {&ln1, &ln1_mean, &ln1_rstd, &qkv, &probs, &att,
                            &res_mid, &ln2, &ln2_mean, &ln2_rstd, &fc_pre, &fc_act})
      n += t->bytes();
    return n;
  }
};

struct Block {
  bool is_moe = false;
  // parameters (owned by the model's registry; MoE ones alias the MoeLayer's tensors)
  Param* ln1_w = nullptr;   // (M)
  Param* ln1_b = nullptr;   // (M)
  Param* qkv_w = nullptr;   // local (3, M, Ml) of whole (3, M, M)
  Param* qkv_b = nullptr;   // local (3, Ml) of whole (3, M)
  Param* proj_w = nullptr;  // local (Ml, M) of whole (M, M)
  Param* proj_b = nullptr;  // (M), replicated
  Param* ln2_w = nullptr;   // (M)
  Param* ln2_b = nullptr;   // (M)
  Param* fc1_w = nullptr;   // local (M, Fl) of whole (M, F)
  Param* fc1_b = nullptr;   // local (Fl) of whole (F)
  Param* fc2_w = nullptr;   // local (Fl, M) of whole (F, M)
  Param* fc2_b = nullptr;   // (M), replicated
  // One MoE layer per activation slot; slots 1.. share slot 0's parameter and gradient
  // tensors (a Tensor copy shares storage), so they differ only in their step buffers.
  std::vector<std::unique_ptr<MoeLayer>> moes;
  LayerSchedule sched;
  std::vector<BlockActs> slots;  // by activation slot
  BlockActs a;                   // the selected slot's (handles sharing its storage)
};

class Transformer final : public Model {
 public:
  Transformer(Topology& topo, const ModelConfig& c, const std::vector<LayerSchedule>& scheds,
              int64_t micro_batch, Precision precision, const StageBlocks& stage, int slots,
              Recompute recompute = Recompute::kNone, int lanes = 1);

  std::vector<Param*> params() override { return registry_.params(); }
  LossParts forward_backward(const Batch& batch, const LossDenominators& d,
                             float loss_scale) override;
  LossParts forward(const Batch& batch) override;
  std::vector<MoeLayer*> moe_layers() override {
    std::vector<MoeLayer*> out;
    for (Block& b : blocks_)
      if (b.is_moe) out.push_back(b.a.moe != nullptr ? b.a.moe : b.moes.front().get());
    return out;
  }
  std::vector<LayerSchedule> schedules() const override {
    std::vector<LayerSchedule> out;
    for (const Block& b : blocks_)
      if (b.is_moe) out.push_back(b.sched);
    return out;
  }
  double last_comm_us() const override { return last_comm_us_; }
  double last_compute_us() const override { return last_compute_us_; }
  void set_weights_version(uint64_t version) override {
    wpack_.set_version(version);
    for (MoeLayer* layer : moe_layers()) layer->backend().set_weights_version(version);
  }
  double flops_per_step(int64_t tokens) const override;
  void time_phases(moe::PhaseTimes* out) override { phases_.set_output(out); }

  const StageBlocks& stage() const override { return stage_; }
  std::vector<ParamSpec> all_param_specs() const override { return registry_.specs(); }
  Tensor& stage_input(int slot) override { return res_slots_[checked(slot)].front(); }
  LossParts stage_forward(int slot, const Batch& batch, const LossDenominators& d,
                          float loss_scale, bool with_grad) override;
  const Tensor& stage_output(int slot) const override {
    return res_slots_[checked(slot)].back();
  }
  const Tensor& stage_backward(int slot, const Batch& batch, const Tensor& dy,
                               float loss_scale) override;
  bool start_stage_forward(int slot, const Batch& batch, const LossDenominators& d,
                           float loss_scale, bool with_grad) override {
    return start_forward(slot, batch, d, loss_scale, with_grad, true);
  }
  bool start_stage_backward(int slot, const Batch& batch, const Tensor& dy,
                            float loss_scale) override {
    return start_backward(slot, batch, dy, loss_scale, true);
  }
  bool resume_stage(int slot) override;
  LossParts stage_loss(int slot) const override;
  const Tensor& stage_input_grad() const override { return dres_; }
  double stage_moe_comm_us(int slot, bool backward) const override;
  void sum_tied_grads() override;
  int64_t activation_bytes() const override;

 private:
  // A slot's stage pass, stopped while one of its MoE layers has an AllToAll in flight
  // (split passes) or run in one piece.
  struct StagePass {
    bool active = false, backward = false, split = false;
    const Batch* batch = nullptr;
    LossDenominators denominators;  // the forward's (its backward reads them)
    float loss_scale = 0.0f, dl_aux = 0.0f, dl_z = 0.0f;
    bool with_grad = false;
    size_t done = 0;      // blocks done, in the pass's order
    bool in_moe = false;  // the next block's MoE layer has an AllToAll in flight
    LossParts out;        // forward: the pass's loss parts, once it has ended
  };

  // ---- Parameters (transformer_params.cpp). `held`: this stage holds the part (its
  // parameters are allocated, initialised and set in the model's pointers); else only their
  // specs are registered. Called in the order of the checkpoint's tensor list.
  void register_embeddings(bool wte_held, bool wpe_held);
  // Block i's LNs and attention, then its dense MLP or (with its MoE layers, built when held)
  // its MoE FFN; b is the block's place in blocks_ when held, else scratch.
  void register_attention(Block& b, int64_t i, bool held);
  void register_dense_mlp(Block& b, int64_t i, bool held);
  void register_moe(Block& b, int64_t i, bool held, int64_t micro_batch, Precision precision);
  void register_shared_experts(const std::string& prefix, bool held, const MoeLayerParams& value,
                               const MoeLayerParams& grad);
  void register_head(bool held);
  // One MoE layer per activation slot, slots 1.. sharing slot 0's parameters and gradients.
  void build_moe(Block& b, int64_t micro_batch, Precision precision);

  // ---- Buffers and slots (transformer.cpp)
  // A zero-filled tensor on the model's device (topo.device(): the CPU or an accelerator).
  Tensor device_tensor(Shape shape) const { return Tensor(std::move(shape), ops_.device); }
  // Every block's activation slots and the stage's activations and gradient scratch.
  void allocate_buffers();
  size_t checked(int slot) const {
    PARM_CHECK(slot >= 0 && slot < slots_, "activation slot {} of a stage with {} slots", slot,
               slots_);
    return static_cast<size_t>(slot);
  }
  void select_slot(int slot);
  // --recompute block, moe: slot's pass (starting) takes a lane no other pass in flight
  // holds; block: the slot's block activations and MoE layers become that lane's; moe: the
  // activation pool's lane (select_slot). Other modes: no-op.
  void take_lane(int slot);
  void check_batch(const Batch& batch) const;
  // Slot's batch tokens in this device's memory: on a device, checked and copied there by
  // the slot's forward (`upload`), read again by its backward.
  const int32_t* slot_tokens(int slot, const Batch& batch, bool upload);
  // The dense products: the table's linear_forward / linear_backward, or at bf16 on a table
  // that packs weights, the same products with w (in, out) packed once per pass (wpack_).
  void lin_forward(const float* x, const float* w, const float* b, float* y, int64_t rows,
                   int64_t in, int64_t out);
  void lin_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                    float* db, int64_t rows, int64_t in, int64_t out, bool accumulate_dx);
  // The bf16 GeLU of the dense MLP (the table has it and the products run at bf16).
  bool gelu_bf16() const {
    return dense_ == Precision::kBf16 && ops_.bias_gelu_bf16 != nullptr;
  }
  // ... and also rounds its output into packed A for the next product (packed weights).
  bool gelu_packs() const {
    return pack_dense_ && gelu_bf16() && ops_.bias_gelu_pack_a_bf16 != nullptr &&
           ops_.bias_gelu_backward_pack_a_bf16 != nullptr;
  }

  // ---- A block's forward (block_forward.cpp), in three parts: attention and LN2 (b.a.ln2
  // ready), the FFN (its output), and the residual sum out = res_mid + ffn.
  void block_attention(Block& b, const Tensor& in);
  const float* dense_ffn_forward(Block& b);
  // The MoE pass of block b for the selected slot: in one piece, or started split. Null while
  // the split pass has its AllToAll in flight; else the FFN output.
  const float* moe_forward(Block& b, bool split);
  void block_output(Block& b, const float* ffn, Tensor& out);
  // --recompute block: block b's forward again from its input `in` (the slot's residual
  // stream), refilling the activations its backward reads (the shared set, and its MoE
  // layer's step buffers, collectives included); the output is not needed.
  void recompute_block(Block& b, const Tensor& in);
  // A block's activation tensors (fc_pre, fc_act when `dense_mlp`), on the model's device.
  BlockActs block_acts(bool dense_mlp) const;

  // ---- A block's backward (block_backward.cpp; dres_: d(out) in, d(in) out) in two parts:
  // the FFN's (the gradient at LN2's output), and the rest from dffn_in, that gradient.
  const float* dense_ffn_backward(Block& b);
  // As moe_forward: null while the split pass has its AllToAll in flight; else the FFN's
  // input gradient.
  const float* moe_backward(Block& b, float dl_aux, float dl_z, bool split);
  void block_backward_rest(Block& b, const float* dffn_in);
  // dres_ (T, M) += the input gradient of a block's LayerNorm (weight w, bias `bias`) at
  // input x from dy (not dres_); accumulates w's and bias's gradients.
  void ln_backward_add(const float* dy, const float* x, Param* w, Param* bias, const float* mean,
                       const float* rstd);

  // ---- The head (lm_head.cpp): lnf_ to the loss and back to dres_.
  double head_forward(const Batch& batch, float grad_scale, bool with_grad);
  void head_backward();
  // The rows with a target, in this device's memory.
  const int64_t* device_counted_rows() const {
    return ops_.device == Device::kCpu ? counted_rows_.data() : counted_rows_dev_.data();
  }

  // ---- A stage's passes (stage_pass.cpp)
  bool start_forward(int slot, const Batch& batch, const LossDenominators& d, float loss_scale,
                     bool with_grad, bool split);
  bool start_backward(int slot, const Batch& batch, const Tensor& dy, float loss_scale,
                      bool split);
  // Runs slot's pass on (its slot selected) until an MoE AllToAll is in flight (true) or the
  // pass has ended (false).
  bool forward_piece(int slot);
  bool backward_piece(int slot);

  Topology& topo_;
  StageBlocks stage_;
  int slots_ = 1;
  Recompute recompute_ = Recompute::kNone;
  // kBlock, kMoe: the passes that may be in flight together (min(PipelineOptions::lanes,
  // slots)); kBlock: each lane's set of block activations (shared by the stage's blocks; moe
  // unset; kMoe: the activation pool's lanes); the lane each slot's pass holds (take_lane).
  int lanes_ = 1;
  std::vector<BlockActs> lane_acts_;
  std::vector<int> slot_lane_;
  // kMoeAct: the experts' activation rows of every MoE layer (outlives blocks_' layers).
  std::unique_ptr<moe::ActivationPool> acts_pool_;
  int head_slot_ = -1;           // the slot whose head activations and dlogits are kept
  ModelConfig c_;
  // The dense ops of the device every tensor of this model lives on (parameters, gradients,
  // activations, scratch): the MoE layers compute there too and take them as they are.
  const DenseOps& ops_;
  TensorParallel tp_;
  // Precision of the dense products (as the experts': bf16 operands at --precision bf16).
  Precision dense_;
  // The dense weights packed at bf16, made again at the start of every forward pass (the
  // weights of a step do not change between its passes; an optimizer step comes between
  // steps). Used when pack_dense_: bf16 products on a table that packs weights.
  Bf16WeightPacks wpack_;
  bool pack_dense_ = false;
  // When pack_dense_: LN1's output packed once for the Q, K and V products, as A of ln1 W
  // (forward) and as A of ln1^T dqkv (backward), and dq / dk / dv packed as B in turn.
  cpu::Bf16Buffer ln1_packed_, ln1t_packed_, dqkv_packed_;  // aligned (bf16_buffer.h)
  // When pack_dense_ in a stage with dense MLPs: the GeLU's output rounded into packed A as it
  // is made, act for fc2 (forward) and dpre for fc1's input gradient (backward), one at a
  // time.
  cpu::Bf16Buffer ffn_packed_;
  int64_t B_, L_, T_, M_, V_, Ml_, Hl_, Fl_, D_;  // Hl_: local heads
  VocabShard vshard_;       // the rows of wte (and BERT's decoder bias) this MP rank holds
  VocabParallelLoss vloss_;  // the head's cross-entropy over the MP group's shards
  ParamRegistry registry_;  // every parameter of the whole model, in order; the held ones
  Param* wte_ = nullptr;  // local (Vl, M) of whole (V, M): rows vshard_ (vocab-parallel)
  Param* wpe_ = nullptr;  // (L, M)
  std::vector<Block> blocks_;
  Param* lnf_w_ = nullptr;
  Param* lnf_b_ = nullptr;
  // BERT MLM head (replicated; the decoder bias split as wte)
  Param* hd_w_ = nullptr;     // (M, M)
  Param* hd_b_ = nullptr;     // (M)
  Param* hln_w_ = nullptr;    // (M)
  Param* hln_b_ = nullptr;    // (M)
  Param* dec_b_ = nullptr;    // local (Vl) of whole (V): rows vshard_

  // activations
  std::vector<std::vector<Tensor>> res_slots_;  // by slot: the residual stream at the stage's
                                                // block boundaries, blocks + 1 of (T, M)
  std::vector<Tensor> res_;       // the selected slot's (handles sharing its storage)
  Tensor lnf_, lnf_mean_, lnf_rstd_;  // (T, M), (T), (T)
  std::vector<int64_t> counted_rows_;     // (Tc) rows with a target
  std::vector<int32_t> counted_targets_;  // (Tc) their targets
  // Off the CPU: the index arrays in the device's memory (counted_rows_, and each slot's
  // batch tokens, which its backward reads again; vloss_ copies the targets it needs).
  DeviceArray<int64_t> counted_rows_dev_;
  std::vector<DeviceArray<int32_t>> tokens_dev_;  // by slot
  Tensor head_in_;  // (T, M) first Tc rows used: LNf output at the counted rows
  Tensor hd_pre_, hd_act_, hd_ln_, hd_mean_, hd_rstd_;  // BERT head (T, M) / (T)
  Tensor logits_;                 // (T, Vl) this rank's columns; holds dlogits after the loss
  // gradient scratch
  Tensor dres_;     // (T, M) gradient of the residual stream
  Tensor dtmp_;     // (T, M) row-parallel partial sums (forward) / LN input gradient
  Tensor dln_;      // (T, M) gradient of an LN output
  Tensor dqkv_;     // (3, T, Ml)
  Tensor datt_;     // (T, Ml)
  Tensor dfc_;      // (T, Fl)
  Tensor dscores_;  // (L, L)
  Tensor dhead_in_;  // (T, M) gradient at head_in_
  Tensor dhd_ln_;    // (T, M) BERT: gradient at the MLM head's LN output (hd_ln_)

  double last_comm_us_ = 0.0, last_compute_us_ = 0.0;
  std::vector<StagePass> passes_;  // by slot
  PhaseClock phases_;              // time_phases
};

}  // namespace parm::model
