// A block's forward for the selected slot: LN1 -> [f] -> QKV (column-parallel) -> attention
// core -> proj (row-parallel) -> [g] -> + residual -> LN2 -> dense MLP (fc1 column-parallel,
// fc2 row-parallel) or MoE -> + residual.
#include "model/transformer.h"

namespace parm::model {

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

void Transformer::recompute_block(Block& b, const Tensor& in) {
  block_attention(b, in);
  if (b.is_moe)
    b.a.moe->forward(b.a.ln2);
  else
    dense_ffn_forward(b);
}

}  // namespace parm::model
