#include "model/kv_decoder.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cpu/kernels.h"
#include "model/blocks.h"
#include "moe/reference_moe.h"
#include "parm/error.h"

namespace parm::model {
namespace {

constexpr float kEps = 1e-5f;  // the model's LayerNorm epsilon (model/transformer.h)

std::string block_name(size_t i, const char* rest) {
  return "blocks." + std::to_string(i) + "." + rest;
}

}  // namespace

KvDecoder::KvDecoder(const ModelConfig& c, const std::map<std::string, Tensor>& weights,
                     const std::vector<std::vector<float>>& router_bias)
    : c_(c), weights_(weights), router_bias_(router_bias) {
  PARM_CHECK(router_bias.empty() ||
                 static_cast<int64_t>(router_bias.size()) == num_moe_blocks(c),
             "router bias for {} MoE blocks, the model has {}", router_bias.size(),
             num_moe_blocks(c));
  for (const auto& b : router_bias)
    PARM_CHECK(static_cast<int64_t>(b.size()) == c.experts, "router bias of {} values for {} "
               "experts", b.size(), c.experts);
  const int64_t M = c.model_dim, L = c.seq_len;
  keys_.assign(static_cast<size_t>(c.num_layers), std::vector<float>(static_cast<size_t>(L * M)));
  values_ = keys_;
  // Every tensor the passes read, checked once here.
  w("wte.weight", {c.vocab, M});
  w("wpe.weight", {L, M});
  w("lnf.weight", {M});
  w("lnf.bias", {M});
  for (size_t i = 0; i < static_cast<size_t>(c.num_layers); ++i) {
    w(block_name(i, "attn.qkv.weight"), {3, M, M});
    w(block_name(i, "attn.qkv.bias"), {3, M});
    w(block_name(i, "attn.proj.weight"), {M, M});
    if (!is_moe_block(c, static_cast<int64_t>(i))) {
      w(block_name(i, "mlp.fc1.weight"), {M, c.ffn_hidden});
      w(block_name(i, "mlp.fc2.weight"), {c.ffn_hidden, M});
    }
  }
  if (c.arch == Arch::kBert) w("mlm.decoder.bias", {c.vocab});
}

const float* KvDecoder::w(const std::string& name, const Shape& shape) const {
  const auto it = weights_.find(name);
  PARM_CHECK(it != weights_.end(), "the model has no tensor {}", name);
  PARM_CHECK(shape.empty() || it->second.shape() == shape, "tensor {} is {}, expected {}", name,
             shape_str(it->second.shape()), shape_str(shape));
  return it->second.data();
}

std::vector<float> KvDecoder::append(const std::vector<int32_t>& tokens) {
  PARM_CHECK(c_.arch == Arch::kGpt2, "append runs a GPT-2 model (BERT: forward)");
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t M = c_.model_dim;
  PARM_CHECK(len_ + n <= c_.seq_len, "{} positions after {} cached: the model has {}", n, len_,
             c_.seq_len);
  // The unsplit embedding: wte[token] + wpe[position].
  std::vector<float> x(static_cast<size_t>(n * M));
  embedding_forward(tokens.data(), w("wte.weight", {}), w("wpe.weight", {}) + len_ * M, x.data(),
                    1, n, M, c_.vocab, 0, c_.vocab);
  for (size_t i = 0; i < static_cast<size_t>(c_.num_layers); ++i) block(i, x, n, true);
  len_ += n;
  return head(x, n);
}

std::vector<float> KvDecoder::forward(const std::vector<int32_t>& tokens) {
  reset();
  if (c_.arch == Arch::kGpt2) return append(tokens);
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t M = c_.model_dim;
  PARM_CHECK(n <= c_.seq_len, "{} positions: the model has {}", n, c_.seq_len);
  std::vector<float> x(static_cast<size_t>(n * M));
  embedding_forward(tokens.data(), w("wte.weight", {}), w("wpe.weight", {}), x.data(), 1, n, M,
                    c_.vocab, 0, c_.vocab);
  for (size_t i = 0; i < static_cast<size_t>(c_.num_layers); ++i) block(i, x, n, false);
  return head(x, n);
}

void KvDecoder::block(size_t i, std::vector<float>& x, int64_t n, bool causal) {
  const int64_t M = c_.model_dim, H = c_.num_heads, D = M / H, p0 = len_;
  const auto sz = [](int64_t v) { return static_cast<size_t>(v); };
  std::vector<float> ln(sz(n * M)), mean(sz(n)), rstd(sz(n));
  cpu::layernorm_forward(x.data(), w(block_name(i, "ln1.weight"), {M}),
                         w(block_name(i, "ln1.bias"), {M}), ln.data(), mean.data(), rstd.data(), n,
                         M, kEps);
  // q (n, M); k and v straight into the cache at rows [p0, p0 + n).
  const float* qkv_w = w(block_name(i, "attn.qkv.weight"), {});
  const float* qkv_b = w(block_name(i, "attn.qkv.bias"), {});
  std::vector<float> q(sz(n * M));
  float* k = keys_[i].data();
  float* v = values_[i].data();
  linear_forward(ln.data(), qkv_w, qkv_b, q.data(), n, M, M);
  linear_forward(ln.data(), qkv_w + M * M, qkv_b + M, k + p0 * M, n, M, M);
  linear_forward(ln.data(), qkv_w + 2 * M * M, qkv_b + 2 * M, v + p0 * M, n, M, M);
  // Each query row r (position p0 + r) over the keys [0, p0 + r] (causal) or all n.
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> att(sz(n * M)), s(sz(p0 + n));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t keys = causal ? p0 + r + 1 : p0 + n;
      const float* qr = q.data() + r * M + h * D;
      float mx = -INFINITY;
      for (int64_t j = 0; j < keys; ++j) {
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += qr[d] * k[j * M + h * D + d];
        s[sz(j)] = dot * scale;
        mx = std::max(mx, s[sz(j)]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < keys; ++j) {
        s[sz(j)] = std::exp(s[sz(j)] - mx);
        sum += s[sz(j)];
      }
      float* o = att.data() + r * M + h * D;
      for (int64_t j = 0; j < keys; ++j) {
        const float p = static_cast<float>(s[sz(j)] / sum);
        for (int64_t d = 0; d < D; ++d) o[d] += p * v[j * M + h * D + d];
      }
    }
  // res_mid = (x + att W_proj) + b_proj, in the training model's order.
  std::vector<float> tmp(sz(n * M));
  linear_forward(att.data(), w(block_name(i, "attn.proj.weight"), {}), nullptr, tmp.data(), n, M,
                 M);
  cpu::add(x.data(), tmp.data(), x.data(), n * M);
  cpu::add_bias(x.data(), w(block_name(i, "attn.proj.bias"), {M}), n, M);
  cpu::layernorm_forward(x.data(), w(block_name(i, "ln2.weight"), {M}),
                         w(block_name(i, "ln2.bias"), {M}), ln.data(), mean.data(), rstd.data(), n,
                         M, kEps);
  if (!is_moe_block(c_, static_cast<int64_t>(i))) {
    const int64_t F = c_.ffn_hidden;
    std::vector<float> pre(sz(n * F)), act(sz(n * F));
    linear_forward(ln.data(), w(block_name(i, "mlp.fc1.weight"), {}), nullptr, pre.data(), n, M, F);
    cpu::bias_gelu_forward(pre.data(), w(block_name(i, "mlp.fc1.bias"), {F}), act.data(), n, F);
    linear_forward(act.data(), w(block_name(i, "mlp.fc2.weight"), {}), nullptr, tmp.data(), n, F,
                   M);
    cpu::add_bias(tmp.data(), w(block_name(i, "mlp.fc2.bias"), {M}), n, M);
    cpu::add(x.data(), tmp.data(), x.data(), n * M);
    return;
  }
  // MoE: the reference layer on these n tokens, dropless.
  MoeShape shape = moe_shape(c_, 1);
  shape.tokens = n;
  shape.capacity_factor = CapacityFactor::none();
  ref::MoeParams<float> p;
  const std::string pre = block_name(i, "");
  const std::map<std::string, std::string> names = {
      {"wg", "moe.gate.weight"},  {"w1", "moe.experts.w1"}, {"b1", "moe.experts.b1"},
      {"w2", "moe.experts.w2"},   {"b2", "moe.experts.b2"}, {"w3", "moe.experts.w3"},
      {"sw1", "moe.shared.w1"},   {"sb1", "moe.shared.b1"}, {"sw2", "moe.shared.w2"},
      {"sb2", "moe.shared.b2"},   {"sw3", "moe.shared.w3"}, {"swg", "moe.shared.gate"}};
  for (auto& [key, vec] : p.named()) {
    const auto it = weights_.find(pre + names.at(key));
    if (it == weights_.end()) continue;  // a tensor this kind of layer does not have
    vec->assign(it->second.data(), it->second.data() + it->second.numel());
  }
  p.check(shape);
  int64_t moe_index = 0;
  for (int64_t b = 0; b < static_cast<int64_t>(i); ++b) moe_index += is_moe_block(c_, b) ? 1 : 0;
  const std::vector<float>* bias =
      router_bias_.empty() ? nullptr : &router_bias_[static_cast<size_t>(moe_index)];
  const std::vector<float> in(ln.begin(), ln.end());
  const ref::MoeForward<float> f = ref::moe_forward(shape, p, in, 1, bias);
  cpu::add(x.data(), f.out.data(), x.data(), n * M);
}

std::vector<float> KvDecoder::head(const std::vector<float>& x, int64_t n) const {
  const int64_t M = c_.model_dim, V = c_.vocab;
  const auto sz = [](int64_t v) { return static_cast<size_t>(v); };
  std::vector<float> z(sz(n * M)), mean(sz(n)), rstd(sz(n));
  cpu::layernorm_forward(x.data(), w("lnf.weight", {}), w("lnf.bias", {}), z.data(), mean.data(),
                         rstd.data(), n, M, kEps);
  if (c_.arch == Arch::kBert) {  // the MLM transform: LN(gelu(z Wd + bd))
    std::vector<float> pre(sz(n * M)), act(sz(n * M));
    linear_forward(z.data(), w("mlm.dense.weight", {M, M}), nullptr, pre.data(), n, M, M);
    cpu::bias_gelu_forward(pre.data(), w("mlm.dense.bias", {M}), act.data(), n, M);
    cpu::layernorm_forward(act.data(), w("mlm.ln.weight", {M}), w("mlm.ln.bias", {M}), z.data(),
                           mean.data(), rstd.data(), n, M, kEps);
  }
  std::vector<float> logits(sz(n * V));
  dense_gemm(Precision::kFp32, false, true, n, V, M, z.data(), w("wte.weight", {}),
             logits.data(), false);
  if (c_.arch == Arch::kBert) cpu::add_bias(logits.data(), w("mlm.decoder.bias", {}), n, V);
  return logits;
}

int32_t sample_token(const float* logits, int64_t vocab, double temperature, int64_t top_k,
                     double u) {
  PARM_CHECK(vocab >= 1 && temperature >= 0.0 && top_k >= 0 && u >= 0.0 && u < 1.0,
             "sample_token: vocab {}, temperature {}, top_k {}, u {}", vocab, temperature, top_k,
             u);
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  // Largest first, ties to the lower id: a total order, so the result is deterministic.
  const auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const int64_t k = top_k == 0 || top_k > vocab ? vocab : top_k;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), before);
  if (temperature == 0.0) return ids[0];
  std::vector<double> p(static_cast<size_t>(k));
  const double mx = logits[ids[0]];
  double sum = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    p[static_cast<size_t>(i)] = std::exp((logits[ids[static_cast<size_t>(i)]] - mx) / temperature);
    sum += p[static_cast<size_t>(i)];
  }
  double acc = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    acc += p[static_cast<size_t>(i)] / sum;
    if (u < acc) return ids[static_cast<size_t>(i)];
  }
  return ids[static_cast<size_t>(k - 1)];  // u within rounding of 1
}

}  // namespace parm::model
