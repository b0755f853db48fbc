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
// (model/tp.h). The word embedding, the LM head and its loss are vocabulary-parallel
// (model/vocab_parallel.h: each MP rank holds V / N_MP rows of the tied wte). Everything
// else (position embedding, LNs, residuals, row-parallel biases, BERT's MLM transform) runs
// duplicated on every MP rank with complete inputs and complete gradients, so the
// replicated parameters get identical, complete gradients on every MP rank.
//
// Activations and gradient scratch are allocated once, in the constructor (llm.c style).
// This file wires the parts together (model/transformer.h lists the others).
#include "model/transformer.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "model/pp_split.h"
#include "parm/memory.h"

namespace parm::model {
namespace {

// The tag of the tied-embedding gradient exchange on the pp group (the activations travel
// with their own tags: train/pipeline.h).
constexpr int kTiedGradTag = 7;

}  // namespace

Transformer::Transformer(Topology& topo, const ModelConfig& c,
                         const std::vector<LayerSchedule>& scheds, int64_t micro_batch,
                         Precision precision, const StageBlocks& stage, int slots,
                         Recompute recompute, int lanes)
    : topo_(topo),
      stage_(stage),
      slots_(slots),
      recompute_(recompute),
      lanes_(recompute_lanes(recompute, lanes, slots)),
      c_(c),
      ops_(dense_ops(topo.device())),
      tp_(topo.comm(Group::kMp)),
      dense_(precision),
      wpack_(ops_),
      registry_(ops_.device, c.seed, c.init_bias_std),
      phases_(ops_.device) {
  pack_dense_ = dense_ == Precision::kBf16 && wpack_.available();
  PARM_CHECK(slots >= 1, "a stage needs at least one activation slot, got {}", slots);
  PARM_CHECK(lanes >= 1, "a stage needs at least one lane for its passes, got {}", lanes);
  if (recompute_ == Recompute::kMoeAct || recompute_ == Recompute::kMoe)
    acts_pool_ = std::make_unique<moe::ActivationPool>(lanes_);
  const int mp = topo.layout().mp;
  B_ = micro_batch;
  L_ = c.seq_len;
  T_ = B_ * L_;
  M_ = c.model_dim;
  V_ = c.vocab;
  Ml_ = M_ / mp;
  Hl_ = c.num_heads / mp;
  Fl_ = c.ffn_hidden / mp;
  D_ = M_ / c.num_heads;
  vshard_ = vocab_shard(V_, mp, topo.host_comm(Group::kMp).rank());

  // The tied word embedding: one copy on the first stage, one on the last.
  register_embeddings(stage.first() || stage.last(), stage.first());
  int moe_index = 0;
  blocks_.resize(static_cast<size_t>(stage.end - stage.begin));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const bool held = i >= stage.begin && i < stage.end;
    Block scratch;  // a block of another stage: its parameters are registered, not built
    Block& b = held ? blocks_[static_cast<size_t>(i - stage.begin)] : scratch;
    b.is_moe = is_moe_block(c, i);
    register_attention(b, i, held);
    if (!b.is_moe) {
      register_dense_mlp(b, i, held);
      continue;
    }
    b.sched = scheds.empty()       ? LayerSchedule{}
              : scheds.size() == 1 ? scheds[0]
                                   : scheds[static_cast<size_t>(moe_index)];
    ++moe_index;
    register_moe(b, i, held, micro_batch, precision);
  }
  register_head(stage.last());
  registry_.zero_grads();
  allocate_buffers();
  select_slot(0);
  passes_.resize(static_cast<size_t>(slots_));
}

BlockActs Transformer::block_acts(bool dense_mlp) const {
  BlockActs a;
  a.ln1 = device_tensor({T_, M_});
  a.ln1_mean = device_tensor({T_});
  a.ln1_rstd = device_tensor({T_});
  a.qkv = device_tensor({3, T_, Ml_});
  a.probs = device_tensor({B_, Hl_, L_, L_});
  a.att = device_tensor({T_, Ml_});
  a.res_mid = device_tensor({T_, M_});
  a.ln2 = device_tensor({T_, M_});
  a.ln2_mean = device_tensor({T_});
  a.ln2_rstd = device_tensor({T_});
  if (dense_mlp) {
    a.fc_pre = device_tensor({T_, Fl_});
    a.fc_act = device_tensor({T_, Fl_});
  }
  return a;
}

void Transformer::allocate_buffers() {
  // What the passes keep for the backward (and kBlock's recompute scratch) are activations;
  // the gradient scratch below is "other" (parm/memory.h).
  std::optional<MemoryKindScope> kind(std::in_place, MemoryKind::kActivations);
  // kBlock: one set for every block and slot per lane (a Tensor copy shares storage); a
  // slot's pass takes a lane's when it starts (take_lane).
  const bool shared = recompute_ == Recompute::kBlock;
  const bool any_dense = std::any_of(blocks_.begin(), blocks_.end(),
                                     [](const Block& b) { return !b.is_moe; });
  if (shared)
    for (int l = 0; l < lanes_; ++l) lane_acts_.push_back(block_acts(any_dense));
  slot_lane_.assign(static_cast<size_t>(slots_), 0);
  for (Block& b : blocks_) {
    b.slots.resize(static_cast<size_t>(slots_));
    for (size_t k = 0; k < b.slots.size(); ++k) {
      BlockActs& a = b.slots[k];
      a = shared ? lane_acts_[0] : block_acts(!b.is_moe);
      a.moe = b.is_moe ? b.moes[shared ? 0 : k].get() : nullptr;
    }
  }
  for (int k = 0; k < slots_; ++k) {
    res_slots_.emplace_back();
    for (int64_t i = stage_.begin; i <= stage_.end; ++i)
      res_slots_.back().push_back(device_tensor({T_, M_}));
  }
  if (stage_.last()) {
    if (c_.arch == Arch::kBert) {
      hd_pre_ = device_tensor({T_, M_});
      hd_act_ = device_tensor({T_, M_});
      hd_ln_ = device_tensor({T_, M_});
      hd_mean_ = device_tensor({T_});
      hd_rstd_ = device_tensor({T_});
    }
    lnf_ = device_tensor({T_, M_});
    lnf_mean_ = device_tensor({T_});
    lnf_rstd_ = device_tensor({T_});
    counted_rows_.reserve(static_cast<size_t>(T_));
    counted_targets_.reserve(static_cast<size_t>(T_));
    head_in_ = device_tensor({T_, M_});
    logits_ = device_tensor({T_, vshard_.size()});
    vloss_ = VocabParallelLoss(ops_, vshard_, T_);
  }
  kind.emplace(MemoryKind::kOther);
  if (stage_.last()) {
    dhead_in_ = device_tensor({T_, M_});
    dhd_ln_ = device_tensor({T_, M_});
  }
  dres_ = device_tensor({T_, M_});
  dtmp_ = device_tensor({T_, M_});
  dln_ = device_tensor({T_, M_});
  dqkv_ = device_tensor({3, T_, Ml_});
  if (pack_dense_) {
    ln1_packed_.resize(static_cast<size_t>(ops_.bf16_packed_a_size(T_, M_)));
    ln1t_packed_.resize(static_cast<size_t>(ops_.bf16_packed_a_size(M_, T_)));
    dqkv_packed_.resize(static_cast<size_t>(ops_.bf16_packed_b_size(T_, Ml_)));
    const bool dense_mlp = std::any_of(blocks_.begin(), blocks_.end(),
                                       [](const Block& b) { return !b.is_moe; });
    if (dense_mlp && gelu_packs())
      ffn_packed_.resize(static_cast<size_t>(ops_.bf16_packed_a_size(T_, Fl_)));
  }
  datt_ = device_tensor({T_, Ml_});
  dfc_ = device_tensor({T_, std::max<int64_t>(Fl_, 1)});
  dscores_ = device_tensor({ops_.attention_scratch(
      AttentionShape{B_, L_, Hl_, D_, c_.arch == Arch::kGpt2, dense_})});
  if (ops_.device != Device::kCpu) {
    if (stage_.first())
      for (int k = 0; k < slots_; ++k) tokens_dev_.emplace_back(ops_, T_);
    if (stage_.last()) {
      counted_rows_dev_ = DeviceArray<int64_t>(ops_, T_);
    }
  }
}

void Transformer::take_lane(int slot) {
  if (recompute_ != Recompute::kBlock && recompute_ != Recompute::kMoe) return;
  const size_t k = checked(slot);
  std::vector<bool> held(static_cast<size_t>(lanes_), false);
  for (size_t s = 0; s < passes_.size(); ++s)
    if (s != k && passes_[s].active) held[static_cast<size_t>(slot_lane_[s])] = true;
  const auto free = std::find(held.begin(), held.end(), false);
  PARM_CHECK(free != held.end(),
             "stage {}: a pass of slot {} starts while {} passes are in flight, but "
             "--recompute {} keeps {} set(s) of activations (PipelineOptions::lanes)",
             stage_.stage, slot, lanes_, recompute_name(recompute_), lanes_);
  const int lane = static_cast<int>(free - held.begin());
  slot_lane_[k] = lane;
  if (recompute_ == Recompute::kMoe) return;  // select_slot points the pool at the lane
  for (Block& b : blocks_) {
    BlockActs& a = b.slots[k];
    a = lane_acts_[static_cast<size_t>(lane)];
    a.moe = b.is_moe ? b.moes[static_cast<size_t>(lane)].get() : nullptr;
  }
}

void Transformer::select_slot(int slot) {
  const size_t k = checked(slot);
  for (Block& b : blocks_) b.a = b.slots[k];
  res_ = res_slots_[k];
  // kMoe: the pool's lane of the slot's pass (its layers re-bind their views when it differs
  // from the one they point at: at the pass's start).
  if (recompute_ == Recompute::kMoe) acts_pool_->set_lane(slot_lane_[k]);
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

const int32_t* Transformer::slot_tokens(int slot, const Batch& batch, bool upload) {
  if (ops_.device == Device::kCpu) return batch.tokens.data();
  DeviceArray<int32_t>& tokens = tokens_dev_[checked(slot)];
  if (!upload) return tokens.data();
  check_token_range(batch.tokens.data(), B_, L_, V_);
  return tokens.upload(batch.tokens.data(), T_);
}

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

LossParts Transformer::forward_backward(const Batch& batch, const LossDenominators& d,
                                        float loss_scale) {
  PARM_CHECK(stage_.num_stages == 1,
             "forward_backward runs a whole model; stage {} of {} runs stage_forward and "
             "stage_backward",
             stage_.stage, stage_.num_stages);
  const double t0 = now_us();
  tp_.comm_us = 0.0;
  const LossParts out = stage_forward(0, batch, d, loss_scale, true);
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
  return stage_forward(0, batch, {}, 0.0f, false);
}

void Transformer::sum_tied_grads() {
  const int p = stage_.num_stages;
  if (p == 1 || !(stage_.first() || stage_.last())) return;
  // Both copies end with mine + theirs; a + b == b + a in fp32, so they stay equal.
  Communicator& pp = topo_.comm(Group::kPp);
  const int peer = stage_.first() ? p - 1 : 0;
  Tensor theirs = device_tensor(wte_->grad.shape());
  const auto n = static_cast<size_t>(wte_->grad.numel());
  // The first stage sends first, the last receives first: a device communicator that runs
  // each message in issue order on one stream (NCCL) matches them without a group.
  std::vector<RequestPtr> reqs;
  float* mine = wte_->grad.data();
  if (stage_.first()) reqs.push_back(pp.isend(mine, n, DType::kF32, peer, kTiedGradTag));
  reqs.push_back(pp.irecv(theirs.data(), n, DType::kF32, peer, kTiedGradTag));
  if (stage_.last()) reqs.push_back(pp.isend(mine, n, DType::kF32, peer, kTiedGradTag));
  wait_all(reqs);
  ops_.add(wte_->grad.data(), theirs.data(), wte_->grad.data(), wte_->grad.numel());
}

int64_t Transformer::activation_bytes() const {
  int64_t n = 0;
  for (const auto& res : res_slots_)
    for (const Tensor& t : res) n += t.bytes();
  // kBlock: every block and slot has one lane's tensors (each lane counted once).
  if (recompute_ == Recompute::kBlock && !blocks_.empty())
    for (const BlockActs& a : lane_acts_) n += a.bytes();
  for (const Block& b : blocks_) {
    if (recompute_ != Recompute::kBlock)
      for (const BlockActs& a : b.slots) n += a.bytes();
    // A slot's MoE layer holds its step buffers; parameters and gradients are slot 0's.
    for (const auto& m : b.moes) {
      const MoeLayerParams& p = b.moes[0]->params();
      n += m->held_bytes() - 2 * p.bytes();
    }
  }
  for (const Tensor* t : {&lnf_, &lnf_mean_, &lnf_rstd_, &head_in_, &hd_pre_, &hd_act_, &hd_ln_,
                          &hd_mean_, &hd_rstd_, &logits_})
    n += t->bytes();
  if (acts_pool_) n += acts_pool_->bytes();
  return n;
}

// Model FLOPs of this rank (MFU convention: useful work only, no duplicated or padded work):
// 3 x the forward GEMM FLOPs of this stage's part of the model (its blocks; the head on the
// last stage) for `tokens` tokens of the MP group (backward = 2 x forward), divided by the
// N_MP ranks that share those tokens. Forward per token:
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
                                       stage, pipeline.slots, pipeline.recompute,
                                       pipeline.lanes);
}

}  // namespace parm::model
