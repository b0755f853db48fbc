// A block's backward for the selected slot, from dres_ = d(block output) to dres_ = d(block
// input); accumulates (+=) the block's parameter gradients.
#include "model/transformer.h"

namespace parm::model {

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

}  // namespace parm::model
