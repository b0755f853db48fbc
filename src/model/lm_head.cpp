// The head of the last stage: the final LN's output (lnf_) at the rows with a target, to the
// logits (tied Wte; BERT first through its MLM transform) and the cross-entropy loss, and back
// to dres_. Vocabulary-parallel over mp (model/vocab_parallel.h): this rank's logits are the
// columns of its rows of Wte, vshard_.
#include "model/transformer.h"

namespace parm::model {

// Runs the LM head on the rows that have a target and returns the sum of their losses; with
// with_grad, leaves dlogits = grad_scale * (softmax - onehot) in logits_ (this rank's
// columns).
double Transformer::head_forward(const Batch& batch, float grad_scale, bool with_grad) {
  counted_rows_.clear();
  counted_targets_.clear();
  for (int64_t t = 0; t < T_; ++t)
    if (batch.targets[static_cast<size_t>(t)] >= 0) {
      counted_rows_.push_back(t);
      counted_targets_.push_back(batch.targets[static_cast<size_t>(t)]);
    }
  const int64_t n = static_cast<int64_t>(counted_rows_.size());
  if (n == 0) return 0.0;
  if (ops_.device != Device::kCpu) counted_rows_dev_.upload(counted_rows_.data(), n);
  ops_.gather_rows(lnf_.data(), M_, device_counted_rows(), n, head_in_.data());  // (n, M)
  const float* z = head_in_.data();
  if (c_.arch == Arch::kBert) {
    lin_forward(head_in_.data(), hd_w_->value.data(), nullptr, hd_pre_.data(), n, M_, M_);
    ops_.bias_gelu_forward(hd_pre_.data(), hd_b_->value.data(), hd_act_.data(), n, M_);
    ops_.layernorm_forward(hd_act_.data(), hln_w_->value.data(), hln_b_->value.data(),
                           hd_ln_.data(), hd_mean_.data(), hd_rstd_.data(), n, M_, kLnEps);
    z = hd_ln_.data();
  }
  // logits (n, Vl) = z (n, M) Wte_shard^T (+ b_dec's shard)
  const int64_t Vl = vshard_.size();
  if (pack_dense_)  // B = Wte^T: the transposed pack of Wte's shard (Vl, M)
    ops_.gemm_bf16_packed_b(false, n, Vl, M_, z, wpack_.get(wte_->value.data(), Vl, M_).wt,
                            logits_.data(), false);
  else
    ops_.gemm(dense_, false, true, n, Vl, M_, z, wte_->value.data(), logits_.data(), false);
  if (c_.arch == Arch::kBert) ops_.add_bias(logits_.data(), dec_b_->value.data(), n, Vl);
  return vloss_.forward(tp_, logits_.data(), counted_targets_.data(),
                        with_grad ? logits_.data() : nullptr, n, grad_scale);
}

// From dlogits (in logits_) to dres_ = d loss / d res_[num_layers]; accumulates head grads.
void Transformer::head_backward() {
  const int64_t n = static_cast<int64_t>(counted_rows_.size());
  if (n > 0) {
    const float* z = c_.arch == Arch::kBert ? hd_ln_.data() : head_in_.data();
    float* dz = c_.arch == Arch::kBert ? dhd_ln_.data() : dhead_in_.data();
    // dz (n, M) = the sum over mp of dlogits Wte_shard; dWte_shard += dlogits^T z
    const int64_t Vl = vshard_.size();
    if (pack_dense_)
      ops_.gemm_bf16_packed_b(false, n, M_, Vl, logits_.data(),
                              wpack_.get(wte_->value.data(), Vl, M_).w, dz, false);
    else
      ops_.gemm(dense_, false, false, n, M_, Vl, logits_.data(), wte_->value.data(), dz, false);
    tp_.f_backward(dz, n * M_);
    ops_.gemm(dense_, true, false, Vl, M_, n, logits_.data(), z, wte_->grad.data(), true);
    if (c_.arch == Arch::kBert) {
      ops_.bias_backward(logits_.data(), dec_b_->grad.data(), n, Vl);
      Tensor& dact = dln_;
      ops_.layernorm_backward(dz, hd_act_.data(), hln_w_->value.data(), hd_mean_.data(),
                              hd_rstd_.data(), dact.data(), hln_w_->grad.data(),
                              hln_b_->grad.data(), n, M_);
      ops_.gelu_backward(hd_pre_.data(), dact.data(), dact.data(), n * M_);
      lin_backward(dact.data(), head_in_.data(), hd_w_->value.data(), dhead_in_.data(),
                   hd_w_->grad.data(), hd_b_->grad.data(), n, M_, M_, false);
    }
  }
  Tensor& dlnf = dln_;  // (T, M): zero at rows without a target
  dlnf.zero();
  ops_.scatter_add_rows(dhead_in_.data(), M_, device_counted_rows(), nullptr, n, dlnf.data());
  ops_.layernorm_backward(dlnf.data(), res_.back().data(), lnf_w_->value.data(),
                          lnf_mean_.data(), lnf_rstd_.data(), dres_.data(), lnf_w_->grad.data(),
                          lnf_b_->grad.data(), T_, M_);
}

}  // namespace parm::model
