// GPT-2-style and BERT-style transformers with MoE blocks, Megatron tensor-parallel over `mp`.
//
// Pre-LN blocks:  h = x + Attn(LN1(x));  y = h + FFN(LN2(h)),  FFN = dense MLP or MoE.
// GPT-2: causal attention, final LN, logits = LNf(y) Wte^T (tied).
// BERT:  bidirectional attention, final LN, MLM head: LN(gelu(z Wd + bd)) Wte^T + b_dec.
//
// Where the MP communication sits (T = B*L rows, identical on the MP group between layers):
//   LN1 -> [f] -> QKV column-parallel (local heads) -> attention -> proj row-parallel -> [g]
//   LN2 -> [f] -> fc1 column-parallel -> GeLU -> fc2 row-parallel -> [g]
//   LN2 -> MoE layer (its schedule does its own mp/ep/esp communication)
// f = identity forward / all-reduce backward, g = all-reduce forward / identity backward
// (model/tp.h). Everything else (embeddings, LNs, residuals, row-parallel biases, the head)
// runs duplicated on every MP rank with complete inputs and complete gradients, so the
// replicated parameters get identical, complete gradients on every MP rank.
//
// Activations and gradient scratch are allocated once, in the constructor (llm.c style).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/cpu/kernels.h"
#include "model/bf16_weights.h"
#include "model/blocks.h"
#include "model/dense_ops.h"
#include "model/init.h"
#include "model/model.h"
#include "model/pp_split.h"
#include "model/tp.h"
#include "moe/moe_layer.h"
#include "moe/phase_times.h"
#include "parm/error.h"
#include "parm/timer.h"

namespace parm::model {
namespace {

constexpr float kLnEps = 1e-5f;
// The tag of the tied-embedding gradient exchange on the pp group (the activations travel
// with their own tags: train/pipeline.h).
constexpr int kTiedGradTag = 7;

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
  // parameters (owned by the model's param list; MoE ones alias the MoeLayer's tensors)
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
              int64_t micro_batch, Precision precision, const StageBlocks& stage, int slots);

  std::vector<Param*> params() override {
    std::vector<Param*> out;
    for (auto& p : params_) out.push_back(p.get());
    return out;
  }
  LossParts forward_backward(const Batch& batch, double lm_denominator,
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
  void time_phases(moe::PhaseTimes* out) override { phases_ = out; }

  const StageBlocks& stage() const override { return stage_; }
  std::vector<ParamSpec> all_param_specs() const override { return specs_; }
  Tensor& stage_input(int slot) override { return res_slots_[checked(slot)].front(); }
  LossParts stage_forward(int slot, const Batch& batch, double lm_denominator, float loss_scale,
                          bool with_grad) override;
  const Tensor& stage_output(int slot) const override {
    return res_slots_[checked(slot)].back();
  }
  const Tensor& stage_backward(int slot, const Batch& batch, const Tensor& dy,
                               float loss_scale) override;
  bool start_stage_forward(int slot, const Batch& batch, double lm_denominator,
                           float loss_scale, bool with_grad) override {
    return start_forward(slot, batch, lm_denominator, loss_scale, with_grad, true);
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
    double lm_denominator = 0.0;
    float loss_scale = 0.0f, dl_aux = 0.0f, dl_z = 0.0f;
    bool with_grad = false;
    size_t done = 0;      // blocks done, in the pass's order
    bool in_moe = false;  // the next block's MoE layer has an AllToAll in flight
    LossParts out;        // forward: the pass's loss parts, once it has ended
  };
  bool start_forward(int slot, const Batch& batch, double lm_denominator, float loss_scale,
                     bool with_grad, bool split);
  bool start_backward(int slot, const Batch& batch, const Tensor& dy, float loss_scale,
                      bool split);
  // Runs slot's pass on (its slot selected) until an MoE AllToAll is in flight (true) or the
  // pass has ended (false).
  bool forward_piece(int slot);
  bool backward_piece(int slot);
  // The MoE pass of block b for the selected slot: in one piece, or started split. Null while
  // the split pass has its AllToAll in flight; else the FFN output (input gradient).
  const float* moe_forward(Block& b, bool split);
  const float* moe_backward(Block& b, float dl_aux, float dl_z, bool split);
  // Registers a parameter of the whole model; allocates it only when this stage holds the
  // part being built (holding_), else returns null.
  Param* add(const std::string& name, Shape whole, std::vector<Split> splits,
             std::vector<Group> replicated, Group reduce, bool decay);
  Param* add_alias(const std::string& name, Shape whole, std::vector<Split> splits,
                   std::vector<Group> replicated, Group reduce, bool decay, Tensor value,
                   Tensor grad);
  // Drawn on the host (the same numbers on every device), then copied to the device.
  void init(Param* p, float mean, float stddev) {
    if (p == nullptr) return;
    if (p->value.on_host()) return init_param_normal(*p, c_.seed, mean, stddev);
    Param host = *p;
    host.value = Tensor(p->value.shape());
    init_param_normal(host, c_.seed, mean, stddev);
    p->value.copy_from(host.value);
  }
  // A zero-filled tensor in the model's memory space.
  Tensor here(Shape shape) const { return Tensor(std::move(shape), ops_.device); }
  void init_weight(Param* p, float stddev) { init(p, 0.0f, stddev); }
  void init_bias(Param* p) { init(p, 0.0f, c_.init_bias_std); }
  void init_gain(Param* p) { init(p, 1.0f, c_.init_bias_std); }
  void build_moe(Block& b, int64_t micro_batch, Precision precision);

  // The rows with a target, in this device's memory.
  const int64_t* sel_rows() const {
    return ops_.device == Device::kCpu ? sel_.data() : sel_here_.data();
  }
  // Slot's batch tokens in this device's memory: on a device, checked and copied there by
  // the slot's forward (`upload`), read again by its backward.
  const int32_t* slot_tokens(int slot, const Batch& batch, bool upload) {
    if (ops_.device == Device::kCpu) return batch.tokens.data();
    DeviceArray<int32_t>& here = tokens_here_[checked(slot)];
    if (!upload) return here.data();
    check_token_range(batch.tokens.data(), B_, L_, V_);
    return here.upload(batch.tokens.data(), T_);
  }
  size_t checked(int slot) const {
    PARM_CHECK(slot >= 0 && slot < slots_, "activation slot {} of a stage with {} slots", slot,
               slots_);
    return static_cast<size_t>(slot);
  }
  void select_slot(int slot);
  void check_batch(const Batch& batch) const;
  double head_forward(const Batch& batch, float grad_scale, bool with_grad);
  void head_backward();
  // A block's forward in three parts: attention and LN2 (b.a.ln2 ready), the dense FFN
  // (its output), and the residual sum out = res_mid + ffn.
  void block_attention(Block& b, const Tensor& in);
  const float* dense_ffn_forward(Block& b);
  void block_output(Block& b, const float* ffn, Tensor& out);
  // A block's backward (dres_: d(out) in, d(in) out) in two parts: the dense FFN's (the
  // gradient at LN2's output), and the rest from dffn_in, that gradient.
  const float* dense_ffn_backward(Block& b);
  void block_backward_rest(Block& b, const float* dffn_in);
  // dres_ (T, M) += the input gradient of a block's LayerNorm (weight w, bias `bias`) at
  // input x from dy (not dres_); accumulates w's and bias's gradients.
  void ln_backward_add(const float* dy, const float* x, Param* w, Param* bias, const float* mean,
                       const float* rstd);
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

  Topology& topo_;
  StageBlocks stage_;
  int slots_ = 1;
  bool holding_ = true;          // the parameters being registered live on this stage
  std::vector<ParamSpec> specs_; // every parameter of the whole model, in order
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
  std::vector<std::unique_ptr<Param>> params_;
  Param* wte_ = nullptr;  // (V, M)
  Param* wpe_ = nullptr;  // (L, M)
  std::vector<Block> blocks_;
  Param* lnf_w_ = nullptr;
  Param* lnf_b_ = nullptr;
  // BERT MLM head (replicated)
  Param* hd_w_ = nullptr;     // (M, M)
  Param* hd_b_ = nullptr;     // (M)
  Param* hln_w_ = nullptr;    // (M)
  Param* hln_b_ = nullptr;    // (M)
  Param* dec_b_ = nullptr;    // (V)

  // activations
  std::vector<std::vector<Tensor>> res_slots_;  // by slot: the residual stream at the stage's
                                                // block boundaries, blocks + 1 of (T, M)
  std::vector<Tensor> res_;       // the selected slot's (handles sharing its storage)
  Tensor lnf_, lnf_mean_, lnf_rstd_;  // (T, M), (T), (T)
  std::vector<int64_t> sel_;      // (Tc) rows with a target
  std::vector<int32_t> sel_tgt_;  // (Tc) their targets
  // Off the CPU: the index arrays in the device's memory (sel_, sel_tgt_, and each slot's
  // batch tokens, which its backward reads again).
  DeviceArray<int64_t> sel_here_;
  DeviceArray<int32_t> tgt_here_;
  std::vector<DeviceArray<int32_t>> tokens_here_;  // by slot
  Tensor hsel_;                   // (T, M) first Tc rows used: LNf output at the counted rows
  Tensor hd_pre_, hd_act_, hd_ln_, hd_mean_, hd_rstd_;  // BERT head (T, M) / (T)
  Tensor logits_;                 // (T, V); holds dlogits after the loss
  // gradient scratch
  Tensor dres_;     // (T, M) gradient of the residual stream
  Tensor dtmp_;     // (T, M) row-parallel partial sums (forward) / LN input gradient
  Tensor dln_;      // (T, M) gradient of an LN output
  Tensor dqkv_;     // (3, T, Ml)
  Tensor datt_;     // (T, Ml)
  Tensor dfc_;      // (T, Fl)
  Tensor dscores_;  // (L, L)
  Tensor dh1_, dh2_;  // (T, M) head scratch

  double last_comm_us_ = 0.0, last_compute_us_ = 0.0;
  std::vector<StagePass> passes_;  // by slot
  // time_phases: where the times go (null: off) and the last boundary's time.
  moe::PhaseTimes* phases_ = nullptr;
  double phase_t_ = 0.0;
  // The time since the last boundary (the device's queued work done) goes to `name`;
  // lap(nullptr) only marks a boundary.
  void lap(const char* name) {
    if (phases_ == nullptr) return;
    if (ops_.device != Device::kCpu) device_sync();
    const double t = now_us();
    if (name != nullptr) phases_->add(name, t - phase_t_);
    phase_t_ = t;
  }
};

Param* Transformer::add(const std::string& name, Shape whole, std::vector<Split> splits,
                        std::vector<Group> replicated, Group reduce, bool decay) {
  const Shape local = holding_ ? local_shape(whole, splits) : Shape{0};
  return add_alias(name, std::move(whole), std::move(splits), std::move(replicated), reduce,
                   decay, here(local), here(local));
}

Param* Transformer::add_alias(const std::string& name, Shape whole, std::vector<Split> splits,
                              std::vector<Group> replicated, Group reduce, bool decay,
                              Tensor value, Tensor grad) {
  specs_.push_back({name, whole});
  if (!holding_) return nullptr;
  auto p = std::make_unique<Param>();
  p->name = name;
  p->whole_shape = std::move(whole);
  p->splits = std::move(splits);
  PARM_CHECK(value.shape() == local_shape(p->whole_shape, p->splits),
             "param {}: local tensor {} is not the shard {} of {}", name,
             shape_str(value.shape()), shape_str(local_shape(p->whole_shape, p->splits)),
             shape_str(p->whole_shape));
  p->value = std::move(value);
  p->grad = std::move(grad);
  p->replicated_over = std::move(replicated);
  p->grad_reduce = reduce;
  p->weight_decay = decay;
  params_.push_back(std::move(p));
  return params_.back().get();
}

// One MoE layer per activation slot, slots 1.. sharing slot 0's parameters and gradients.
void Transformer::build_moe(Block& b, int64_t micro_batch, Precision precision) {
  for (int k = 0; k < slots_; ++k) {
    b.moes.push_back(std::make_unique<MoeLayer>(topo_, moe_shape(c_, micro_batch), b.sched.kind,
                                                b.sched.fuse, b.sched.chunks, precision,
                                                c_.router_z_loss > 0.0f));
    if (k > 0) {
      b.moes[static_cast<size_t>(k)]->params() = b.moes[0]->params();
      b.moes[static_cast<size_t>(k)]->grads() = b.moes[0]->grads();
      b.moes[static_cast<size_t>(k)]->share_router_bias(*b.moes[0]);
    }
    b.slots[static_cast<size_t>(k)].moe = b.moes.back().get();
  }
}

Transformer::Transformer(Topology& topo, const ModelConfig& c,
                         const std::vector<LayerSchedule>& scheds, int64_t micro_batch,
                         Precision precision, const StageBlocks& stage, int slots)
    : topo_(topo),
      stage_(stage),
      slots_(slots),
      c_(c),
      ops_(dense_ops(topo.device())),
      tp_(topo.comm(Group::kMp)),
      dense_(precision),
      wpack_(ops_) {
  pack_dense_ = dense_ == Precision::kBf16 && wpack_.available();
  PARM_CHECK(slots >= 1, "a stage needs at least one activation slot, got {}", slots);
  const Layout& lay = topo.layout();
  const int mp = lay.mp, mpr = topo.host_comm(Group::kMp).rank();
  B_ = micro_batch;
  L_ = c.seq_len;
  T_ = B_ * L_;
  M_ = c.model_dim;
  V_ = c.vocab;
  Ml_ = M_ / mp;
  Hl_ = c.num_heads / mp;
  Fl_ = c.ffn_hidden / mp;
  D_ = M_ / c.num_heads;
  const std::vector<Group> kRep = {Group::kDp, Group::kMp};  // replicated dense
  const std::vector<Group> kMpSplit = {Group::kDp};          // split over mp
  // The tied word embedding: one copy on the first stage, one on the last; the first owns it.
  std::vector<Group> kRepTied = kRep;
  if (stage.num_stages > 1) kRepTied.push_back(Group::kPp);
  // A residual projection's init is scaled down by the number of residual additions (GPT-2).
  const float proj_std = c.init_std / std::sqrt(2.0f * static_cast<float>(c.num_layers));
  auto make_acts = [&](auto&& fill) {
    for (int k = 0; k < slots_; ++k) fill(k);
  };

  holding_ = stage.first() || stage.last();
  wte_ = add("wte.weight", {V_, M_}, {}, kRepTied, Group::kDp, true);
  holding_ = stage.first();
  wpe_ = add("wpe.weight", {L_, M_}, {}, kRep, Group::kDp, true);
  init_weight(wte_, c.init_std);
  init_weight(wpe_, c.init_std);

  int moe_index = 0;
  blocks_.resize(static_cast<size_t>(stage.end - stage.begin));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    holding_ = i >= stage.begin && i < stage.end;
    Block scratch;  // a block of another stage: its parameters are registered, not built
    Block& b = holding_ ? blocks_[static_cast<size_t>(i - stage.begin)] : scratch;
    const std::string pre = "blocks." + std::to_string(i) + ".";
    b.is_moe = is_moe_block(c, i);
    b.ln1_w = add(pre + "ln1.weight", {M_}, {}, kRep, Group::kDp, false);
    b.ln1_b = add(pre + "ln1.bias", {M_}, {}, kRep, Group::kDp, false);
    b.qkv_w = add(pre + "attn.qkv.weight", {3, M_, M_}, {{2, mp, mpr}}, kMpSplit, Group::kDp, true);
    b.qkv_b = add(pre + "attn.qkv.bias", {3, M_}, {{1, mp, mpr}}, kMpSplit, Group::kDp, false);
    b.proj_w = add(pre + "attn.proj.weight", {M_, M_}, {{0, mp, mpr}}, kMpSplit, Group::kDp, true);
    b.proj_b = add(pre + "attn.proj.bias", {M_}, {}, kRep, Group::kDp, false);
    b.ln2_w = add(pre + "ln2.weight", {M_}, {}, kRep, Group::kDp, false);
    b.ln2_b = add(pre + "ln2.bias", {M_}, {}, kRep, Group::kDp, false);
    init_gain(b.ln1_w);
    init_bias(b.ln1_b);
    init_weight(b.qkv_w, c.init_std);
    init_bias(b.qkv_b);
    init_weight(b.proj_w, proj_std);
    init_bias(b.proj_b);
    init_gain(b.ln2_w);
    init_bias(b.ln2_b);

    if (holding_) {
      b.slots.resize(static_cast<size_t>(slots_));
      make_acts([&](int k) {
        BlockActs& a = b.slots[static_cast<size_t>(k)];
        a.ln1 = here({T_, M_});
        a.ln1_mean = here({T_});
        a.ln1_rstd = here({T_});
        a.qkv = here({3, T_, Ml_});
        a.probs = here({B_, Hl_, L_, L_});
        a.att = here({T_, Ml_});
        a.res_mid = here({T_, M_});
        a.ln2 = here({T_, M_});
        a.ln2_mean = here({T_});
        a.ln2_rstd = here({T_});
      });
    }

    if (!b.is_moe) {
      const int64_t F = c.ffn_hidden;
      b.fc1_w = add(pre + "mlp.fc1.weight", {M_, F}, {{1, mp, mpr}}, kMpSplit, Group::kDp, true);
      b.fc1_b = add(pre + "mlp.fc1.bias", {F}, {{0, mp, mpr}}, kMpSplit, Group::kDp, false);
      b.fc2_w = add(pre + "mlp.fc2.weight", {F, M_}, {{0, mp, mpr}}, kMpSplit, Group::kDp, true);
      b.fc2_b = add(pre + "mlp.fc2.bias", {M_}, {}, kRep, Group::kDp, false);
      init_weight(b.fc1_w, c.init_std);
      init_bias(b.fc1_b);
      init_weight(b.fc2_w, proj_std);
      init_bias(b.fc2_b);
      if (holding_)
        make_acts([&](int k) {
          b.slots[static_cast<size_t>(k)].fc_pre = here({T_, Fl_});
          b.slots[static_cast<size_t>(k)].fc_act = here({T_, Fl_});
        });
      continue;
    }

    b.sched = scheds.empty()       ? LayerSchedule{}
              : scheds.size() == 1 ? scheds[0]
                                   : scheds[static_cast<size_t>(moe_index)];
    ++moe_index;
    const int64_t E = c.experts, H = c.expert_hidden;
    const int ep = lay.ep, esp = lay.esp;
    MoeLayerParams none;  // another stage's layer: names and shapes only
    MoeLayerParams* values = &none;
    MoeLayerParams* grads = &none;
    int epr = 0, espr = 0;
    if (holding_) {
      build_moe(b, micro_batch, precision);
      MoeLayer& m = *b.moes[0];
      PARM_CHECK(m.device() == ops_.device, "MoE layer on {}, the model on {}",
                 device_name(m.device()), device_name(ops_.device));
      values = &m.params();
      grads = &m.grads();
      epr = static_cast<int>(m.first_expert() / (E / ep));
      espr = m.esp_rank();
    }
    auto& mp_ = *values;
    auto& mg = *grads;
    Param* wg = add_alias(pre + "moe.gate.weight", {M_, E}, {}, kRep, Group::kDp, true, mp_.wg,
                          mg.wg);
    const std::vector<Group> kEdp = {Group::kEdp};
    Param* w1 = add_alias(pre + "moe.experts.w1", {E, M_, H}, {{0, ep, epr}, {2, esp, espr}},
                          kEdp, Group::kEdp, true, mp_.experts.w1, mg.experts.w1);
    Param* b1 = add_alias(pre + "moe.experts.b1", {E, H}, {{0, ep, epr}, {1, esp, espr}}, kEdp,
                          Group::kEdp, false, mp_.experts.b1, mg.experts.b1);
    Param* w2 = add_alias(pre + "moe.experts.w2", {E, H, M_}, {{0, ep, epr}, {1, esp, espr}},
                          kEdp, Group::kEdp, true, mp_.experts.w2, mg.experts.w2);
    Param* b2 = add_alias(pre + "moe.experts.b2", {E, M_}, {{0, ep, epr}},
                          {Group::kEdp, Group::kEsp}, Group::kEdp, false, mp_.experts.b2,
                          mg.experts.b2);
    init_weight(wg, c.init_std);
    init_weight(w1, c.init_std);
    init_bias(b1);
    init_weight(w2, proj_std);
    init_bias(b2);
    if (holding_) b.moes[0]->zero_grad();
  }

  holding_ = stage.last();
  lnf_w_ = add("lnf.weight", {M_}, {}, kRep, Group::kDp, false);
  lnf_b_ = add("lnf.bias", {M_}, {}, kRep, Group::kDp, false);
  init_gain(lnf_w_);
  init_bias(lnf_b_);
  if (c.arch == Arch::kBert) {
    hd_w_ = add("mlm.dense.weight", {M_, M_}, {}, kRep, Group::kDp, true);
    hd_b_ = add("mlm.dense.bias", {M_}, {}, kRep, Group::kDp, false);
    hln_w_ = add("mlm.ln.weight", {M_}, {}, kRep, Group::kDp, false);
    hln_b_ = add("mlm.ln.bias", {M_}, {}, kRep, Group::kDp, false);
    dec_b_ = add("mlm.decoder.bias", {V_}, {}, kRep, Group::kDp, false);
    init_weight(hd_w_, c.init_std);
    init_bias(hd_b_);
    init_gain(hln_w_);
    init_bias(hln_b_);
    init_bias(dec_b_);
    if (holding_) {
      hd_pre_ = here({T_, M_});
      hd_act_ = here({T_, M_});
      hd_ln_ = here({T_, M_});
      hd_mean_ = here({T_});
      hd_rstd_ = here({T_});
    }
  }
  holding_ = true;
  for (auto& p : params_) p->grad.zero();

  for (int k = 0; k < slots_; ++k) {
    res_slots_.emplace_back();
    for (int64_t i = stage.begin; i <= stage.end; ++i) res_slots_.back().push_back(here({T_, M_}));
  }
  select_slot(0);
  if (stage.last()) {
    lnf_ = here({T_, M_});
    lnf_mean_ = here({T_});
    lnf_rstd_ = here({T_});
    sel_.reserve(static_cast<size_t>(T_));
    sel_tgt_.reserve(static_cast<size_t>(T_));
    hsel_ = here({T_, M_});
    logits_ = here({T_, V_});
    dh1_ = here({T_, M_});
    dh2_ = here({T_, M_});
  }
  dres_ = here({T_, M_});
  dtmp_ = here({T_, M_});
  dln_ = here({T_, M_});
  dqkv_ = here({3, T_, Ml_});
  if (pack_dense_) {
    ln1_packed_.resize(static_cast<size_t>(ops_.bf16_packed_a_size(T_, M_)));
    ln1t_packed_.resize(static_cast<size_t>(ops_.bf16_packed_a_size(M_, T_)));
    dqkv_packed_.resize(static_cast<size_t>(ops_.bf16_packed_b_size(T_, Ml_)));
    const bool dense_mlp = std::any_of(blocks_.begin(), blocks_.end(),
                                       [](const Block& b) { return !b.is_moe; });
    if (dense_mlp && gelu_packs())
      ffn_packed_.resize(static_cast<size_t>(ops_.bf16_packed_a_size(T_, Fl_)));
  }
  datt_ = here({T_, Ml_});
  dfc_ = here({T_, std::max<int64_t>(Fl_, 1)});
  dscores_ = here({ops_.attention_scratch(
      AttentionShape{B_, L_, Hl_, D_, c.arch == Arch::kGpt2, dense_})});
  if (ops_.device != Device::kCpu) {
    if (stage.first())
      for (int k = 0; k < slots_; ++k) tokens_here_.emplace_back(ops_, T_);
    if (stage.last()) {
      sel_here_ = DeviceArray<int64_t>(ops_, T_);
      tgt_here_ = DeviceArray<int32_t>(ops_, T_);
    }
  }
  passes_.resize(static_cast<size_t>(slots_));
}

void Transformer::select_slot(int slot) {
  const size_t k = checked(slot);
  for (Block& b : blocks_) b.a = b.slots[k];
  res_ = res_slots_[k];
}

void Transformer::check_batch(const Batch& batch) const {
  PARM_CHECK(batch.batch == B_ && batch.seq_len == L_,
             "batch of {} x {} tokens, but the model was built for micro_batch {} x seq_len {}",
             batch.batch, batch.seq_len, B_, L_);
  PARM_CHECK(static_cast<int64_t>(batch.tokens.size()) == T_ &&
                 static_cast<int64_t>(batch.targets.size()) == T_,
             "batch holds {} tokens and {} targets, expected {} each", batch.tokens.size(),
             batch.targets.size(), T_);
}

// ---- forward ------------------------------------------------------------------------------

void Transformer::lin_forward(const float* x, const float* w, const float* b, float* y,
                              int64_t rows, int64_t in, int64_t out) {
  if (pack_dense_)
    linear_forward_packed(ops_, x, wpack_.get(w, in, out), b, y, rows, in, out);
  else
    ops_.linear_forward(x, w, b, y, rows, in, out, dense_);
}

void Transformer::lin_backward(const float* dy, const float* x, const float* w, float* dx,
                               float* dw, float* db, int64_t rows, int64_t in, int64_t out,
                               bool accumulate_dx) {
  if (pack_dense_)
    linear_backward_packed(ops_, dy, x, wpack_.get(w, in, out), dx, dw, db, rows, in, out,
                           accumulate_dx);
  else
    ops_.linear_backward(dy, x, w, dx, dw, db, rows, in, out, accumulate_dx, dense_);
}

void Transformer::block_attention(Block& b, const Tensor& in) {
  const int64_t T = T_, M = M_, Ml = Ml_;
  // attention: LN1 -> [f] -> QKV (column-parallel) -> core -> proj (row-parallel) -> [g]
  ops_.layernorm_forward(in.data(), b.ln1_w->value.data(), b.ln1_b->value.data(), b.a.ln1.data(),
                         b.a.ln1_mean.data(), b.a.ln1_rstd.data(), T, M, kLnEps);
  if (pack_dense_) {
    ops_.bf16_pack_a(false, T, M, b.a.ln1.data(), ln1_packed_.data());
    for (int64_t c = 0; c < 3; ++c) {
      const float* w = b.qkv_w->value.data() + c * M * Ml;
      linear_forward_packed_x(ops_, ln1_packed_.data(), wpack_.get(w, M, Ml),
                              b.qkv_b->value.data() + c * Ml, b.a.qkv.data() + c * T * Ml, T, M,
                              Ml);
    }
  } else {
    for (int64_t c = 0; c < 3; ++c)
      lin_forward(b.a.ln1.data(), b.qkv_w->value.data() + c * M * Ml,
                  b.qkv_b->value.data() + c * Ml, b.a.qkv.data() + c * T * Ml, T, M, Ml);
  }
  const AttentionShape as{B_, L_, Hl_, D_, c_.arch == Arch::kGpt2, dense_};
  ops_.attention_forward(as, b.a.qkv.data(), b.a.qkv.data() + T * Ml, b.a.qkv.data() + 2 * T * Ml,
                    b.a.probs.data(), b.a.att.data());
  Tensor& partial = dtmp_;  // (T, M)
  lin_forward(b.a.att.data(), b.proj_w->value.data(), nullptr, partial.data(), T, Ml, M);
  tp_.g_forward(partial.data(), T * M);
  // res_mid = (x + partial) + bias, rounded in that order.
  ops_.add(in.data(), partial.data(), b.a.res_mid.data(), T * M);
  ops_.add_bias(b.a.res_mid.data(), b.proj_b->value.data(), T, M);
  // FFN: LN2 -> dense MLP (fc1 column-parallel, fc2 row-parallel) or MoE
  ops_.layernorm_forward(b.a.res_mid.data(), b.ln2_w->value.data(), b.ln2_b->value.data(),
                         b.a.ln2.data(), b.a.ln2_mean.data(), b.a.ln2_rstd.data(), T, M, kLnEps);
}

const float* Transformer::moe_forward(Block& b, bool split) {
  if (!split) return b.a.moe->forward(b.a.ln2).data();
  if (b.a.moe->start_forward(b.a.ln2)) return nullptr;
  return b.a.moe->pass_result().data();
}

const float* Transformer::dense_ffn_forward(Block& b) {
  const int64_t T = T_, M = M_;
  Tensor& partial = dtmp_;  // (T, M)
  lin_forward(b.a.ln2.data(), b.fc1_w->value.data(), nullptr, b.a.fc_pre.data(), T, M, Fl_);
  // fp32: fc_pre becomes x W1 + b1 in place; bf16: it stays x W1 (the backward adds b1).
  if (gelu_packs()) {  // act also rounded into packed A, as A of act W2
    ops_.bias_gelu_pack_a_bf16(b.a.fc_pre.data(), b.fc1_b->value.data(), b.a.fc_act.data(), T,
                               Fl_, ffn_packed_.data());
    linear_forward_packed_x(ops_, ffn_packed_.data(),
                            wpack_.get(b.fc2_w->value.data(), Fl_, M), nullptr, partial.data(),
                            T, Fl_, M);
  } else {
    if (gelu_bf16())
      ops_.bias_gelu_bf16(b.a.fc_pre.data(), b.fc1_b->value.data(), b.a.fc_act.data(), T, Fl_);
    else
      ops_.bias_gelu_forward(b.a.fc_pre.data(), b.fc1_b->value.data(), b.a.fc_act.data(), T,
                             Fl_);
    lin_forward(b.a.fc_act.data(), b.fc2_w->value.data(), nullptr, partial.data(), T, Fl_, M);
  }
  tp_.g_forward(partial.data(), T * M);
  ops_.add_bias(partial.data(), b.fc2_b->value.data(), T, M);  // once, after the sum
  return partial.data();
}

void Transformer::block_output(Block& b, const float* ffn, Tensor& out) {
  ops_.add(b.a.res_mid.data(), ffn, out.data(), T_ * M_);
}

// Runs the LM head on the rows that have a target and returns the sum of their losses; with
// with_grad, leaves dlogits = grad_scale * (softmax - onehot) in logits_.
double Transformer::head_forward(const Batch& batch, float grad_scale, bool with_grad) {
  sel_.clear();
  sel_tgt_.clear();
  for (int64_t t = 0; t < T_; ++t)
    if (batch.targets[static_cast<size_t>(t)] >= 0) {
      sel_.push_back(t);
      sel_tgt_.push_back(batch.targets[static_cast<size_t>(t)]);
    }
  const int64_t n = static_cast<int64_t>(sel_.size());
  if (n == 0) return 0.0;
  if (ops_.device != Device::kCpu) sel_here_.upload(sel_.data(), n);
  ops_.gather_rows(lnf_.data(), M_, sel_rows(), n, hsel_.data());  // (n, M)
  const float* z = hsel_.data();
  if (c_.arch == Arch::kBert) {
    lin_forward(hsel_.data(), hd_w_->value.data(), nullptr, hd_pre_.data(), n, M_, M_);
    ops_.bias_gelu_forward(hd_pre_.data(), hd_b_->value.data(), hd_act_.data(), n, M_);
    ops_.layernorm_forward(hd_act_.data(), hln_w_->value.data(), hln_b_->value.data(),
                           hd_ln_.data(), hd_mean_.data(), hd_rstd_.data(), n, M_, kLnEps);
    z = hd_ln_.data();
  }
  // logits (n, V) = z (n, M) Wte^T (+ b_dec)
  if (pack_dense_)  // B = Wte^T: the transposed pack of Wte (V, M)
    ops_.gemm_bf16_packed_b(false, n, V_, M_, z, wpack_.get(wte_->value.data(), V_, M_).wt,
                            logits_.data(), false);
  else
    ops_.gemm(dense_, false, true, n, V_, M_, z, wte_->value.data(), logits_.data(), false);
  if (c_.arch == Arch::kBert) ops_.add_bias(logits_.data(), dec_b_->value.data(), n, V_);
  const int32_t* targets =
      ops_.device == Device::kCpu ? sel_tgt_.data() : tgt_here_.upload(sel_tgt_.data(), n);
  return ops_.cross_entropy(logits_.data(), targets, with_grad ? logits_.data() : nullptr, n,
                       V_, grad_scale);
}

// From dlogits (in logits_) to dres_ = d loss / d res_[num_layers]; accumulates head grads.
void Transformer::head_backward() {
  const int64_t n = static_cast<int64_t>(sel_.size());
  Tensor& dsel = dh1_;  // (n, M) gradient at the head's input rows
  if (n > 0) {
    const float* z = c_.arch == Arch::kBert ? hd_ln_.data() : hsel_.data();
    float* dz = c_.arch == Arch::kBert ? dh2_.data() : dsel.data();
    // dz (n, M) = dlogits Wte; dWte += dlogits^T z
    if (pack_dense_)
      ops_.gemm_bf16_packed_b(false, n, M_, V_, logits_.data(),
                              wpack_.get(wte_->value.data(), V_, M_).w, dz, false);
    else
      ops_.gemm(dense_, false, false, n, M_, V_, logits_.data(), wte_->value.data(), dz, false);
    ops_.gemm(dense_, true, false, V_, M_, n, logits_.data(), z, wte_->grad.data(), true);
    if (c_.arch == Arch::kBert) {
      ops_.bias_backward(logits_.data(), dec_b_->grad.data(), n, V_);
      Tensor& dact = dln_;
      ops_.layernorm_backward(dz, hd_act_.data(), hln_w_->value.data(), hd_mean_.data(),
                              hd_rstd_.data(), dact.data(), hln_w_->grad.data(),
                              hln_b_->grad.data(), n, M_);
      ops_.gelu_backward(hd_pre_.data(), dact.data(), dact.data(), n * M_);
      lin_backward(dact.data(), hsel_.data(), hd_w_->value.data(), dsel.data(),
                   hd_w_->grad.data(), hd_b_->grad.data(), n, M_, M_, false);
    }
  }
  Tensor& dlnf = dln_;  // (T, M): zero at rows without a target
  dlnf.zero();
  ops_.scatter_add_rows(dsel.data(), M_, sel_rows(), nullptr, n, dlnf.data());
  ops_.layernorm_backward(dlnf.data(), res_.back().data(), lnf_w_->value.data(),
                          lnf_mean_.data(), lnf_rstd_.data(), dres_.data(), lnf_w_->grad.data(),
                          lnf_b_->grad.data(), T_, M_);
}

// ---- backward -----------------------------------------------------------------------------

// The FFN's gradient at LN2's output (T, M), complete on the MP group, from dres_ = d out =
// d (res_mid + ffn).
const float* Transformer::moe_backward(Block& b, float dl_aux, float dl_z, bool split) {
  if (!split) return b.a.moe->backward(dres_, dl_aux, dl_z).data();
  if (b.a.moe->start_backward(dres_, dl_aux, dl_z)) return nullptr;
  return b.a.moe->pass_result().data();
}

const float* Transformer::dense_ffn_backward(Block& b) {
  const int64_t T = T_, M = M_;
  // [g] backward is the identity: dres_ is complete, so is the bias gradient.
  lin_backward(dres_.data(), b.a.fc_act.data(), b.fc2_w->value.data(), dfc_.data(),
               b.fc2_w->grad.data(), b.fc2_b->grad.data(), T, Fl_, M, false);
  // bf16: the GeLU's backward also sums db1 (fc_pre holds x W1 without b1).
  float* db1 = b.fc1_b->grad.data();
  if (gelu_packs()) {
    // dpre also rounded into packed A, as A of dx = dpre W1^T; dW1 += ln2^T dpre reads it
    // in fp32 (its own layout).
    ops_.bias_gelu_backward_pack_a_bf16(b.a.fc_pre.data(), b.fc1_b->value.data(), dfc_.data(),
                                        dfc_.data(), db1, T, Fl_, ffn_packed_.data());
    ops_.gemm(Precision::kBf16, true, false, M, Fl_, T, b.a.ln2.data(), dfc_.data(),
              b.fc1_w->grad.data(), /*accumulate=*/true);
    ops_.gemm_bf16_packed(T, M, Fl_, ffn_packed_.data(),
                          wpack_.get(b.fc1_w->value.data(), M, Fl_).wt, dln_.data(), false);
    tp_.f_backward(dln_.data(), T * M);  // [f] backward: sum the partial input gradients
    return dln_.data();
  }
  if (gelu_bf16()) {
    ops_.bias_gelu_backward_bf16(b.a.fc_pre.data(), b.fc1_b->value.data(), dfc_.data(),
                                 dfc_.data(), db1, T, Fl_);
    db1 = nullptr;
  } else {
    ops_.gelu_backward(b.a.fc_pre.data(), dfc_.data(), dfc_.data(), T * Fl_);
  }
  lin_backward(dfc_.data(), b.a.ln2.data(), b.fc1_w->value.data(), dln_.data(),
               b.fc1_w->grad.data(), db1, T, M, Fl_, false);
  tp_.f_backward(dln_.data(), T * M);  // [f] backward: sum the partial input gradients
  return dln_.data();
}

void Transformer::ln_backward_add(const float* dy, const float* x, Param* w, Param* bias,
                                  const float* mean, const float* rstd) {
  if (ops_.layernorm_backward_add != nullptr) {
    ops_.layernorm_backward_add(dy, x, w->value.data(), mean, rstd, dres_.data(), w->grad.data(),
                                bias->grad.data(), T_, M_);
    return;
  }
  ops_.layernorm_backward(dy, x, w->value.data(), mean, rstd, dtmp_.data(), w->grad.data(),
                          bias->grad.data(), T_, M_);
  ops_.add(dres_.data(), dtmp_.data(), dres_.data(), T_ * M_);
}

void Transformer::block_backward_rest(Block& b, const float* dffn_in) {
  const int64_t T = T_, M = M_, Ml = Ml_;
  const Tensor& in = res_[static_cast<size_t>(&b - blocks_.data())];
  ln_backward_add(dffn_in, b.a.res_mid.data(), b.ln2_w, b.ln2_b, b.a.ln2_mean.data(),
                  b.a.ln2_rstd.data());
  // Attention. dres_ = d res_mid.
  lin_backward(dres_.data(), b.a.att.data(), b.proj_w->value.data(), datt_.data(),
               b.proj_w->grad.data(), b.proj_b->grad.data(), T, Ml, M, false);
  const AttentionShape as{B_, L_, Hl_, D_, c_.arch == Arch::kGpt2, dense_};
  ops_.attention_backward(as, b.a.qkv.data(), b.a.qkv.data() + T * Ml, b.a.qkv.data() + 2 * T * Ml,
                     b.a.probs.data(), datt_.data(), dqkv_.data(), dqkv_.data() + T * Ml,
                     dqkv_.data() + 2 * T * Ml, dscores_.data());
  if (pack_dense_) {
    ops_.bf16_pack_a(true, M, T, b.a.ln1.data(), ln1t_packed_.data());
    for (int64_t c = 0; c < 3; ++c) {
      const float* w = b.qkv_w->value.data() + c * M * Ml;
      linear_backward_packed_x(ops_, dqkv_.data() + c * T * Ml, ln1t_packed_.data(),
                               wpack_.get(w, M, Ml), dqkv_packed_.data(), dln_.data(),
                               b.qkv_w->grad.data() + c * M * Ml, b.qkv_b->grad.data() + c * Ml,
                               T, M, Ml, /*accumulate_dx=*/c > 0);
    }
  } else {
    for (int64_t c = 0; c < 3; ++c)
      lin_backward(dqkv_.data() + c * T * Ml, b.a.ln1.data(), b.qkv_w->value.data() + c * M * Ml,
                   dln_.data(), b.qkv_w->grad.data() + c * M * Ml, b.qkv_b->grad.data() + c * Ml,
                   T, M, Ml, /*accumulate_dx=*/c > 0);
  }
  tp_.f_backward(dln_.data(), T * M);
  ln_backward_add(dln_.data(), in.data(), b.ln1_w, b.ln1_b, b.a.ln1_mean.data(),
                  b.a.ln1_rstd.data());
}

LossParts Transformer::stage_forward(int slot, const Batch& batch, double lm_denominator,
                                     float loss_scale, bool with_grad) {
  start_forward(slot, batch, lm_denominator, loss_scale, with_grad, false);
  return stage_loss(slot);
}

bool Transformer::start_forward(int slot, const Batch& batch, double lm_denominator,
                                float loss_scale, bool with_grad, bool split) {
  check_batch(batch);
  StagePass& p = passes_[checked(slot)];
  PARM_CHECK(!p.active, "stage {}: a pass of slot {} starts while its {} is in flight",
             stage_.stage, slot, p.backward ? "backward" : "forward");
  const int64_t counted =
      static_cast<int64_t>(std::count_if(batch.targets.begin(), batch.targets.end(),
                                         [](int32_t y) { return y >= 0; }));
  PARM_CHECK(!stage_.last() || !with_grad || counted == 0 || lm_denominator > 0.0,
             "lm_denominator {} must be positive when the batch has {} targets", lm_denominator,
             counted);
  p = StagePass{};
  if (pack_dense_) wpack_.begin_pass();  // packs again if the weights may have changed
  p.active = true;
  p.split = split;
  p.batch = &batch;
  p.lm_denominator = lm_denominator;
  p.loss_scale = loss_scale;
  p.with_grad = with_grad;
  select_slot(slot);
  lap(nullptr);
  if (stage_.first())
    ops_.embedding_forward(slot_tokens(slot, batch, true), wte_->value.data(), wpe_->value.data(),
                      res_[0].data(), B_, L_, M_, V_);
  lap("embed+head");
  return forward_piece(slot);
}

// The selected slot's forward through this stage: the embeddings (first stage) or the
// stage input already in res_[0], the blocks, and the final LN and the head (last stage).
bool Transformer::forward_piece(int slot) {
  StagePass& p = passes_[checked(slot)];
  select_slot(slot);
  while (p.done < blocks_.size()) {
    Block& b = blocks_[p.done];
    const float* ffn = nullptr;
    if (p.in_moe) {
      if (b.a.moe->resume()) return true;
      ffn = b.a.moe->pass_result().data();
    } else {
      block_attention(b, res_[p.done]);
      lap("attention");
      ffn = b.is_moe ? moe_forward(b, p.split) : dense_ffn_forward(b);
    }
    p.in_moe = ffn == nullptr;
    if (p.in_moe) return true;
    block_output(b, ffn, res_[p.done + 1]);
    lap(b.is_moe ? "moe" : "dense");
    ++p.done;
  }
  p.active = false;
  for (const Block& b : blocks_)
    if (b.is_moe) {
      p.out.aux_loss += static_cast<double>(b.a.moe->l_aux());
      p.out.z_loss += static_cast<double>(b.a.moe->l_z());
    }
  if (!stage_.last()) return false;
  const Batch& batch = *p.batch;
  ops_.layernorm_forward(res_.back().data(), lnf_w_->value.data(), lnf_b_->value.data(),
                         lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), T_, M_, kLnEps);
  const int64_t counted =
      static_cast<int64_t>(std::count_if(batch.targets.begin(), batch.targets.end(),
                                         [](int32_t y) { return y >= 0; }));
  const float grad_scale =
      !p.with_grad || counted == 0
          ? 0.0f
          : static_cast<float>(static_cast<double>(p.loss_scale) / p.lm_denominator);
  p.out.lm_loss_sum = head_forward(batch, grad_scale, p.with_grad);
  p.out.num_targets = counted;
  lap("embed+head");
  head_slot_ = p.with_grad ? slot : -1;
  return false;
}

LossParts Transformer::stage_loss(int slot) const {
  const StagePass& p = passes_[checked(slot)];
  PARM_CHECK(!p.active && !p.backward, "stage {}: loss of slot {} asked before its forward "
             "has ended", stage_.stage, slot);
  return p.out;
}

const Tensor& Transformer::stage_backward(int slot, const Batch& batch, const Tensor& dy,
                                          float loss_scale) {
  start_backward(slot, batch, dy, loss_scale, false);
  return dres_;
}

bool Transformer::start_backward(int slot, const Batch& batch, const Tensor& dy,
                                 float loss_scale, bool split) {
  check_batch(batch);
  StagePass& p = passes_[checked(slot)];
  PARM_CHECK(!p.active, "stage {}: a pass of slot {} starts while its {} is in flight",
             stage_.stage, slot, p.backward ? "backward" : "forward");
  // Every backward uses the one gradient scratch (dres_ ...): two are never in flight.
  for (const StagePass& q : passes_)
    PARM_CHECK(!(q.active && q.backward),
               "stage {}: backward of slot {} while another backward is in flight",
               stage_.stage, slot);
  select_slot(slot);
  lap(nullptr);
  if (stage_.last()) {
    // The head's activations and dlogits are kept for one slot: 1F1B's last stage runs each
    // micro-batch's backward right after its forward.
    PARM_CHECK(head_slot_ == slot,
               "stage {}: backward of slot {}, but the loss gradient held is slot {}'s",
               stage_.stage, slot, head_slot_);
    head_backward();
    head_slot_ = -1;
    lap("embed+head");
  } else {
    PARM_CHECK(dy.numel() == T_ * M_, "stage {}: output gradient of {} values, expected {}",
               stage_.stage, dy.numel(), T_ * M_);
    dres_.copy_from(dy);
  }
  p = StagePass{};
  p.active = true;
  p.backward = true;
  p.split = split;
  p.batch = &batch;
  // Each MoE layer's l_aux enters the loss as loss_scale * aux_loss_coeff * l_aux; every MP
  // rank computed the same l_aux and passes the same complete gradient (docs/spec.md §3 contract).
  // The router z-loss enters the same way with router_z_loss.
  p.dl_aux = loss_scale * c_.aux_loss_coeff;
  p.dl_z = loss_scale * c_.router_z_loss;
  return backward_piece(slot);
}

bool Transformer::backward_piece(int slot) {
  StagePass& p = passes_[checked(slot)];
  select_slot(slot);
  while (p.done < blocks_.size()) {
    Block& b = blocks_[blocks_.size() - 1 - p.done];
    const float* dffn_in = nullptr;
    if (p.in_moe) {
      if (b.a.moe->resume()) return true;
      dffn_in = b.a.moe->pass_result().data();
    } else {
      dffn_in = b.is_moe ? moe_backward(b, p.dl_aux, p.dl_z, p.split) : dense_ffn_backward(b);
    }
    p.in_moe = dffn_in == nullptr;
    if (p.in_moe) return true;
    lap(b.is_moe ? "moe" : "dense");
    block_backward_rest(b, dffn_in);
    lap("attention");
    ++p.done;
  }
  p.active = false;
  if (stage_.first())
    ops_.embedding_backward(slot_tokens(slot, *p.batch, false), dres_.data(), wte_->grad.data(),
                       wpe_->grad.data(), B_, L_, M_);
  lap("embed+head");
  return false;
}

bool Transformer::resume_stage(int slot) {
  const StagePass& p = passes_[checked(slot)];
  PARM_CHECK(p.active && p.in_moe, "stage {}: resume of slot {}, which has no pass in flight",
             stage_.stage, slot);
  return p.backward ? backward_piece(slot) : forward_piece(slot);
}

double Transformer::stage_moe_comm_us(int slot, bool backward) const {
  double us = 0.0;
  for (const Block& b : blocks_) {
    if (!b.is_moe) continue;
    const MoeLayer& m = *b.slots[checked(slot)].moe;
    const auto& steps = m.schedule().steps;
    const auto& t = backward ? m.backward_step_us() : m.forward_step_us();
    for (size_t i = 0; i < steps.size(); ++i)
      if (schedule::is_collective(steps[i].kind)) us += t[i];
  }
  return us;
}

LossParts Transformer::forward_backward(const Batch& batch, double lm_denominator,
                                        float loss_scale) {
  PARM_CHECK(stage_.num_stages == 1,
             "forward_backward runs a whole model; stage {} of {} runs stage_forward and "
             "stage_backward",
             stage_.stage, stage_.num_stages);
  const double t0 = now_us();
  tp_.comm_us = 0.0;
  const LossParts out = stage_forward(0, batch, lm_denominator, loss_scale, true);
  stage_backward(0, batch, dres_, loss_scale);
  const double total = now_us() - t0;
  last_comm_us_ = tp_.comm_us + stage_moe_comm_us(0, false) + stage_moe_comm_us(0, true);
  last_compute_us_ = std::max(0.0, total - last_comm_us_);
  return out;
}

LossParts Transformer::forward(const Batch& batch) {
  PARM_CHECK(stage_.num_stages == 1,
             "forward runs a whole model; stage {} of {} runs stage_forward", stage_.stage,
             stage_.num_stages);
  return stage_forward(0, batch, 0.0, 0.0f, false);
}

void Transformer::sum_tied_grads() {
  const int p = stage_.num_stages;
  if (p == 1 || !(stage_.first() || stage_.last())) return;
  // Both copies end with mine + theirs; a + b == b + a in fp32, so they stay equal.
  Communicator& pp = topo_.comm(Group::kPp);
  const int peer = stage_.first() ? p - 1 : 0;
  Tensor theirs = here(wte_->grad.shape());
  const auto n = static_cast<size_t>(wte_->grad.numel());
  // The first stage sends first, the last receives first: a device communicator that runs
  // each message in issue order on one stream (NCCL) matches them without a group.
  std::vector<RequestPtr> reqs;
  if (stage_.first()) reqs.push_back(pp.isend(wte_->grad.data(), n, DType::kF32, peer, kTiedGradTag));
  reqs.push_back(pp.irecv(theirs.data(), n, DType::kF32, peer, kTiedGradTag));
  if (stage_.last()) reqs.push_back(pp.isend(wte_->grad.data(), n, DType::kF32, peer, kTiedGradTag));
  wait_all(reqs);
  ops_.add(wte_->grad.data(), theirs.data(), wte_->grad.data(), wte_->grad.numel());
}

int64_t Transformer::activation_bytes() const {
  int64_t n = 0;
  for (const auto& res : res_slots_)
    for (const Tensor& t : res) n += t.bytes();
  for (const Block& b : blocks_) {
    for (const BlockActs& a : b.slots) n += a.bytes();
    // A slot's MoE layer holds its step buffers; parameters and gradients are slot 0's.
    for (const auto& m : b.moes) {
      const MoeLayerParams& p = b.moes[0]->params();
      n += m->held_bytes() - 2 * (p.wg.bytes() + p.experts.w1.bytes() + p.experts.b1.bytes() +
                                  p.experts.w2.bytes() + p.experts.b2.bytes());
    }
  }
  for (const Tensor* t : {&lnf_, &lnf_mean_, &lnf_rstd_, &hsel_, &hd_pre_, &hd_act_, &hd_ln_,
                          &hd_mean_, &hd_rstd_, &logits_})
    n += t->bytes();
  return n;
}

// Model FLOPs of this rank (MFU convention: useful work only, no duplicated or padded work):
// 3 x the forward GEMM FLOPs of this stage's part of the model (its blocks; the head on the
// last stage) for `tokens` tokens of the MP group (backward
// = 2 x forward), divided by the N_MP ranks that share those tokens. Forward per token:
//   attention   2*M*3M (QKV) + 2*2*L*M (scores and probs*V, full L x L as computed)
//               + 2*M*M (projection)
//   dense MLP   2*2*M*F
//   MoE         2*M*E (gate) + k * 2*2*M*H (the k experts a token is routed to; drops and
//               capacity padding ignored)
//   head        2*M*V (GPT-2: every token; BERT: + 2*M*M dense, every token, an upper bound
//               as only the masked positions run it)
double Transformer::flops_per_step(int64_t tokens) const {
  const double M = static_cast<double>(M_), L = static_cast<double>(L_);
  double per_token = 0.0;
  for (const Block& b : blocks_) {
    per_token += 2 * M * 3 * M + 2 * 2 * L * M + 2 * M * M;
    if (b.is_moe)
      per_token += 2 * M * static_cast<double>(c_.experts) +
                   c_.topk * 4 * M * static_cast<double>(c_.expert_hidden);
    else
      per_token += 4 * M * static_cast<double>(c_.ffn_hidden);
  }
  if (stage_.last()) {
    per_token += 2 * M * static_cast<double>(V_);
    if (c_.arch == Arch::kBert) per_token += 2 * M * M;
  }
  return 3.0 * per_token * static_cast<double>(tokens) / static_cast<double>(tp_.size());
}

}  // namespace

std::unique_ptr<Model> make_model(Topology& topo, const ModelConfig& config,
                                  const std::vector<LayerSchedule>& moe_schedules,
                                  int64_t micro_batch, Precision precision,
                                  const PipelineOptions& pipeline) {
  validate_model(config, topo.layout(), moe_schedules, micro_batch);
  const int pp = topo.layout().pp;
  const std::vector<int64_t> split =
      parse_pp_split(pp_split_text(pipeline.split), pp, config.num_layers);
  const StageBlocks stage = stage_blocks(split, topo.host_comm(Group::kPp).rank());
  return std::make_unique<Transformer>(topo, config, moe_schedules, micro_batch, precision,
                                       stage, pipeline.slots);
}

}  // namespace parm::model
