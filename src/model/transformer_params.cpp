// Which parameters the transformer has: names, whole shapes, how each is split and replicated,
// and its initial values, registered in the checkpoint's order (wte, wpe, the blocks, the
// final LN, the BERT head). Every stage registers them all, holding its own part.
#include <cmath>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "parm/memory.h"

namespace parm::model {
namespace {

const std::vector<Group> kRep = {Group::kDp, Group::kMp};  // replicated dense
const std::vector<Group> kMpSplit = {Group::kDp};          // split over mp

std::string block_prefix(int64_t i) { return "blocks." + std::to_string(i) + "."; }

// A residual projection's init is scaled down by the number of residual additions (GPT-2).
float proj_std(const ModelConfig& c) {
  return c.init_std / std::sqrt(2.0f * static_cast<float>(c.num_layers));
}

}  // namespace

void Transformer::register_embeddings(bool wte_held, bool wpe_held) {
  // The tied word embedding's two copies (first and last stage): the first owns it.
  // Vocabulary-parallel: MP rank r holds rows vshard_ of the whole (V, M) table.
  std::vector<Group> rep_tied = kMpSplit;
  if (stage_.num_stages > 1) rep_tied.push_back(Group::kPp);
  const Split rows = vocab_split(topo_.layout().mp, topo_.host_comm(Group::kMp).rank());
  wte_ = registry_.add(wte_held, "wte.weight", {V_, M_}, {rows}, rep_tied, Group::kDp, true);
  wpe_ = registry_.add(wpe_held, "wpe.weight", {L_, M_}, {}, kRep, Group::kDp, true);
  registry_.init_weight(wte_, c_.init_std);
  registry_.init_weight(wpe_, c_.init_std);
}

void Transformer::register_attention(Block& b, int64_t i, bool held) {
  const int mp = topo_.layout().mp, mpr = topo_.host_comm(Group::kMp).rank();
  const std::string pre = block_prefix(i);
  ParamRegistry& r = registry_;
  b.ln1_w = r.add(held, pre + "ln1.weight", {M_}, {}, kRep, Group::kDp, false);
  b.ln1_b = r.add(held, pre + "ln1.bias", {M_}, {}, kRep, Group::kDp, false);
  b.qkv_w = r.add(held, pre + "attn.qkv.weight", {3, M_, M_}, {{2, mp, mpr}}, kMpSplit,
                  Group::kDp, true);
  b.qkv_b = r.add(held, pre + "attn.qkv.bias", {3, M_}, {{1, mp, mpr}}, kMpSplit, Group::kDp,
                  false);
  b.proj_w = r.add(held, pre + "attn.proj.weight", {M_, M_}, {{0, mp, mpr}}, kMpSplit,
                   Group::kDp, true);
  b.proj_b = r.add(held, pre + "attn.proj.bias", {M_}, {}, kRep, Group::kDp, false);
  b.ln2_w = r.add(held, pre + "ln2.weight", {M_}, {}, kRep, Group::kDp, false);
  b.ln2_b = r.add(held, pre + "ln2.bias", {M_}, {}, kRep, Group::kDp, false);
  r.init_gain(b.ln1_w);
  r.init_bias(b.ln1_b);
  r.init_weight(b.qkv_w, c_.init_std);
  r.init_bias(b.qkv_b);
  r.init_weight(b.proj_w, proj_std(c_));
  r.init_bias(b.proj_b);
  r.init_gain(b.ln2_w);
  r.init_bias(b.ln2_b);
}

void Transformer::register_dense_mlp(Block& b, int64_t i, bool held) {
  const int mp = topo_.layout().mp, mpr = topo_.host_comm(Group::kMp).rank();
  const std::string pre = block_prefix(i);
  const int64_t F = c_.ffn_hidden;
  ParamRegistry& r = registry_;
  b.fc1_w = r.add(held, pre + "mlp.fc1.weight", {M_, F}, {{1, mp, mpr}}, kMpSplit, Group::kDp,
                  true);
  b.fc1_b = r.add(held, pre + "mlp.fc1.bias", {F}, {{0, mp, mpr}}, kMpSplit, Group::kDp, false);
  b.fc2_w = r.add(held, pre + "mlp.fc2.weight", {F, M_}, {{0, mp, mpr}}, kMpSplit, Group::kDp,
                  true);
  b.fc2_b = r.add(held, pre + "mlp.fc2.bias", {M_}, {}, kRep, Group::kDp, false);
  r.init_weight(b.fc1_w, c_.init_std);
  r.init_bias(b.fc1_b);
  r.init_weight(b.fc2_w, proj_std(c_));
  r.init_bias(b.fc2_b);
}

void Transformer::build_moe(Block& b, int64_t micro_batch, Precision precision) {
  // Its step buffers and backend's are activations (its parameters and gradients the
  // layer counts as such). kBlock: one layer per lane serves every slot (each backward
  // recomputes it).
  MemoryKindScope kind(MemoryKind::kActivations);
  const int layers = recompute_ == Recompute::kBlock ? lanes_ : slots_;
  for (int k = 0; k < layers; ++k)
    b.moes.push_back(std::make_unique<MoeLayer>(
        topo_, layer_shape(c_, micro_batch, b.sched), b.sched.kind, b.sched.fuse, b.sched.chunks,
        precision, c_.router_z_loss > 0.0f, c_.aux_scope, k > 0 ? b.moes[0].get() : nullptr,
        acts_pool_.get(), recompute_ == Recompute::kMoe));
}

// The MoE layer owns its tensors; the registry's parameters alias them.
void Transformer::register_moe(Block& b, int64_t i, bool held, int64_t micro_batch,
                               Precision precision) {
  const std::string pre = block_prefix(i);
  const int64_t E = c_.experts, H = c_.expert_hidden;
  const int ep = topo_.layout().ep, esp = topo_.layout().esp;
  int epr = 0, espr = 0;
  if (held) {
    build_moe(b, micro_batch, precision);
    const MoeLayer& m = *b.moes[0];
    PARM_CHECK(m.device() == ops_.device, "MoE layer on {}, the model on {}",
               device_name(m.device()), device_name(ops_.device));
    epr = static_cast<int>(m.first_expert() / (E / ep));
    espr = m.esp_rank();
  }
  MoeLayerParams none;  // another stage's layer: names and shapes only
  const MoeLayerParams& value = held ? b.moes[0]->params() : none;
  const MoeLayerParams& grad = held ? b.moes[0]->grads() : none;
  const std::vector<Group> edp = {Group::kEdp};
  ParamRegistry& r = registry_;
  Param* wg = r.add_alias(held, pre + "moe.gate.weight", {M_, E}, {}, kRep, Group::kDp, true,
                          value.wg, grad.wg);
  // gelu: W1, b1, W2, b2 (in this order, as before swiglu existed); swiglu: W1, W2, W3 (split
  // like W1), no biases.
  const bool biases = has_expert_biases(c_.expert_mlp);
  Param* w1 = r.add_alias(held, pre + "moe.experts.w1", {E, M_, H}, {{0, ep, epr}, {2, esp, espr}},
                          edp, Group::kEdp, true, value.experts.w1, grad.experts.w1);
  Param* b1 = biases ? r.add_alias(held, pre + "moe.experts.b1", {E, H},
                                   {{0, ep, epr}, {1, esp, espr}}, edp, Group::kEdp, false,
                                   value.experts.b1, grad.experts.b1)
                     : nullptr;
  Param* w2 = r.add_alias(held, pre + "moe.experts.w2", {E, H, M_}, {{0, ep, epr}, {1, esp, espr}},
                          edp, Group::kEdp, true, value.experts.w2, grad.experts.w2);
  Param* b2 = biases ? r.add_alias(held, pre + "moe.experts.b2", {E, M_}, {{0, ep, epr}},
                                   {Group::kEdp, Group::kEsp}, Group::kEdp, false,
                                   value.experts.b2, grad.experts.b2)
                     : nullptr;
  Param* w3 = is_gated(c_.expert_mlp)
                  ? r.add_alias(held, pre + "moe.experts.w3", {E, M_, H},
                                {{0, ep, epr}, {2, esp, espr}}, edp, Group::kEdp, true,
                                value.experts.w3, grad.experts.w3)
                  : nullptr;
  r.init_weight(wg, c_.init_std);
  r.init_weight(w1, c_.init_std);
  r.init_bias(b1);  // init(nullptr) does nothing
  r.init_weight(w2, proj_std(c_));
  r.init_bias(b2);
  r.init_weight(w3, c_.init_std);
  if (c_.shared_experts > 0) register_shared_experts(pre, held, value, grad);
  if (held) b.moes[0]->zero_grad();
}

// The shared experts (docs/spec.md §9): split over mp like the dense FFN, b2 and the shared
// gate replicated (every MP rank holds their complete gradient).
void Transformer::register_shared_experts(const std::string& pre, bool held,
                                          const MoeLayerParams& value,
                                          const MoeLayerParams& grad) {
  const int mp = topo_.layout().mp, mpr = held ? topo_.host_comm(Group::kMp).rank() : 0;
  const int64_t N = c_.shared_experts, H = shared_width(c_);
  ParamRegistry& r = registry_;
  const bool biases = has_expert_biases(c_.expert_mlp);
  const auto& v = value.shared;
  const auto& g = grad.shared;
  Param* w1 = r.add_alias(held, pre + "moe.shared.w1", {N, M_, H}, {{2, mp, mpr}}, kMpSplit,
                          Group::kDp, true, v.w1, g.w1);
  Param* b1 = biases ? r.add_alias(held, pre + "moe.shared.b1", {N, H}, {{1, mp, mpr}},
                                   kMpSplit, Group::kDp, false, v.b1, g.b1)
                     : nullptr;
  Param* w2 = r.add_alias(held, pre + "moe.shared.w2", {N, H, M_}, {{1, mp, mpr}}, kMpSplit,
                          Group::kDp, true, v.w2, g.w2);
  Param* b2 = biases ? r.add_alias(held, pre + "moe.shared.b2", {N, M_}, {}, kRep, Group::kDp,
                                   false, v.b2, g.b2)
                     : nullptr;
  Param* w3 = is_gated(c_.expert_mlp)
                  ? r.add_alias(held, pre + "moe.shared.w3", {N, M_, H}, {{2, mp, mpr}},
                                kMpSplit, Group::kDp, true, v.w3, g.w3)
                  : nullptr;
  Param* gate = c_.shared_gate ? r.add_alias(held, pre + "moe.shared.gate", {M_}, {}, kRep,
                                             Group::kDp, false, value.shared_gate,
                                             grad.shared_gate)
                               : nullptr;
  r.init_weight(w1, c_.init_std);
  r.init_bias(b1);
  r.init_weight(w2, proj_std(c_));
  r.init_bias(b2);
  r.init_weight(w3, c_.init_std);
  r.init_weight(gate, c_.init_std);
}

void Transformer::register_head(bool held) {
  ParamRegistry& r = registry_;
  lnf_w_ = r.add(held, "lnf.weight", {M_}, {}, kRep, Group::kDp, false);
  lnf_b_ = r.add(held, "lnf.bias", {M_}, {}, kRep, Group::kDp, false);
  r.init_gain(lnf_w_);
  r.init_bias(lnf_b_);
  if (c_.arch != Arch::kBert) return;
  hd_w_ = r.add(held, "mlm.dense.weight", {M_, M_}, {}, kRep, Group::kDp, true);
  hd_b_ = r.add(held, "mlm.dense.bias", {M_}, {}, kRep, Group::kDp, false);
  hln_w_ = r.add(held, "mlm.ln.weight", {M_}, {}, kRep, Group::kDp, false);
  hln_b_ = r.add(held, "mlm.ln.bias", {M_}, {}, kRep, Group::kDp, false);
  dec_b_ = r.add(held, "mlm.decoder.bias", {V_},
                 {vocab_split(topo_.layout().mp, topo_.host_comm(Group::kMp).rank())},
                 kMpSplit, Group::kDp, false);
  r.init_weight(hd_w_, c_.init_std);
  r.init_bias(hd_b_);
  r.init_gain(hln_w_);
  r.init_bias(hln_b_);
  r.init_bias(dec_b_);
}

}  // namespace parm::model
