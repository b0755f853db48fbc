// A pipeline stage's passes over one activation slot: the embeddings (first stage), the
// blocks, the head (last stage), run whole or stopped wherever an MoE layer's AllToAll is in
// flight (Model::start_stage_forward). A one-stage model's forward and backward are these.
#include <algorithm>

#include "model/transformer.h"

namespace parm::model {

LossParts Transformer::stage_forward(int slot, const Batch& batch, const LossDenominators& d,
                                     float loss_scale, bool with_grad) {
  start_forward(slot, batch, d, loss_scale, with_grad, false);
  return stage_loss(slot);
}

bool Transformer::start_forward(int slot, const Batch& batch, const LossDenominators& d,
                                float loss_scale, bool with_grad, bool split) {
  check_batch(batch);
  StagePass& p = passes_[checked(slot)];
  PARM_CHECK(!p.active, "stage {}: a pass of slot {} starts while its {} is in flight",
             stage_.stage, slot, p.backward ? "backward" : "forward");
  const int64_t counted =
      static_cast<int64_t>(std::count_if(batch.targets.begin(), batch.targets.end(),
                                         [](int32_t y) { return y >= 0; }));
  PARM_CHECK(!stage_.last() || !with_grad || counted == 0 || d.lm_targets > 0.0,
             "lm_targets {} must be positive when the batch has {} targets", d.lm_targets,
             counted);
  PARM_CHECK(!with_grad || d.gate_calls >= 1.0,
             "gate_calls {} must be at least 1 (this pass is one of them)", d.gate_calls);
  p = StagePass{};
  if (pack_dense_) wpack_.begin_pass();  // packs again if the weights may have changed
  p.active = true;
  p.split = split;
  p.batch = &batch;
  p.denominators = d;
  p.loss_scale = loss_scale;
  p.with_grad = with_grad;
  take_lane(slot);
  select_slot(slot);
  phases_.start_phase();
  if (stage_.first()) {  // vocabulary-parallel: each MP rank's rows, summed over mp
    ops_.embedding_forward(slot_tokens(slot, batch, true), wte_->value.data(),
                           wpe_->value.data(), res_[0].data(), B_, L_, M_, V_, vshard_.begin,
                           vshard_.end);
    tp_.g_forward(res_[0].data(), T_ * M_);
  }
  phases_.end_phase("embed+head");
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
      phases_.end_phase("attention");
      ffn = b.is_moe ? moe_forward(b, p.split) : dense_ffn_forward(b);
    }
    p.in_moe = ffn == nullptr;
    if (p.in_moe) return true;
    block_output(b, ffn, res_[p.done + 1]);
    phases_.end_phase(b.is_moe ? "moe" : "dense");
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
          : static_cast<float>(static_cast<double>(p.loss_scale) / p.denominators.lm_targets);
  p.out.lm_loss_sum = head_forward(batch, grad_scale, p.with_grad);
  p.out.num_targets = counted;
  phases_.end_phase("embed+head");
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
  take_lane(slot);
  select_slot(slot);
  phases_.start_phase();
  if (stage_.last()) {
    // The head's activations and dlogits are kept for one slot: 1F1B's last stage runs each
    // micro-batch's backward right after its forward.
    PARM_CHECK(head_slot_ == slot,
               "stage {}: backward of slot {}, but the loss gradient held is slot {}'s",
               stage_.stage, slot, head_slot_);
    head_backward();
    head_slot_ = -1;
    phases_.end_phase("embed+head");
  } else {
    PARM_CHECK(dy.numel() == T_ * M_, "stage {}: output gradient of {} values, expected {}",
               stage_.stage, dy.numel(), T_ * M_);
    dres_.copy_from(dy);
  }
  // Each MoE layer's l_aux enters the loss as loss_scale * aux_loss_coeff * l_aux /
  // gate_calls (the forward's: the step's mean over its gate calls, docs/spec.md §6); every MP
  // rank computed the same l_aux and passes the same complete gradient (docs/spec.md §3
  // contract). The router z-loss enters the same way with router_z_loss.
  // Under AuxScope::kGlobal the N_DP replicas of a micro-step share one l_aux (each
  // differentiates it for its own tokens, and the sum over dp is its whole gradient): the
  // step has gate_calls / N_DP of them.
  const double aux_calls = c_.aux_scope == AuxScope::kGlobal
                               ? p.denominators.gate_calls / topo_.layout().dp
                               : p.denominators.gate_calls;
  const double calls = std::max(1.0, aux_calls);
  p = StagePass{};
  p.active = true;
  p.backward = true;
  p.split = split;
  p.batch = &batch;
  p.dl_aux = static_cast<float>(static_cast<double>(loss_scale) * c_.aux_loss_coeff / calls);
  p.dl_z = static_cast<float>(static_cast<double>(loss_scale) * c_.router_z_loss / calls);
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
      if (recompute_ == Recompute::kBlock) {
        recompute_block(b, res_[blocks_.size() - 1 - p.done]);
        phases_.end_phase(b.is_moe ? "moe" : "dense");
      }
      dffn_in = b.is_moe ? moe_backward(b, p.dl_aux, p.dl_z, p.split) : dense_ffn_backward(b);
    }
    p.in_moe = dffn_in == nullptr;
    if (p.in_moe) return true;
    phases_.end_phase(b.is_moe ? "moe" : "dense");
    block_backward_rest(b, dffn_in);
    phases_.end_phase("attention");
    ++p.done;
  }
  p.active = false;
  if (stage_.first())
    ops_.embedding_backward(slot_tokens(slot, *p.batch, false), dres_.data(),
                            wte_->grad.data(), wpe_->grad.data(), B_, L_, M_, vshard_.begin,
                            vshard_.end);
  phases_.end_phase("embed+head");
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

}  // namespace parm::model
