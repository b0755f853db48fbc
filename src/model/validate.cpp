// Configuration checks of the model against the layout: everything make_model refuses is
// refused here, before any memory is allocated or any collective is issued, with a message
// that says what is wrong and what would be valid.
#include <cmath>
#include <string>
#include <vector>

#include "shape/shape.h"
#include "model/model.h"
#include "parm/error.h"

namespace parm::model {
namespace {

bool has_dense_block(const ModelConfig& c) {
  for (int64_t i = 0; i < c.num_layers; ++i)
    if (!is_moe_block(c, i)) return true;
  return false;
}

}  // namespace

int64_t shared_width(const ModelConfig& c) {
  return parm::shared_width(c.shared_experts, c.shared_hidden, c.expert_hidden);
}

int64_t num_moe_blocks(const ModelConfig& c) {
  int64_t n = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) n += is_moe_block(c, i) ? 1 : 0;
  return n;
}

MoeShape moe_shape(const ModelConfig& c, int64_t micro_batch) {
  MoeShape shape;
  shape.tokens = micro_batch * c.seq_len;
  shape.model_dim = c.model_dim;
  shape.hidden = c.expert_hidden;
  shape.experts = c.experts;
  shape.topk = c.topk;
  shape.capacity_factor = CapacityFactor::parse(c.capacity_factor);
  shape.router = c.router;
  shape.expert_mlp = c.expert_mlp;
  shape.shared_experts = c.shared_experts;
  shape.shared_hidden = shared_width(c);
  shape.shared_gate = c.shared_gate;
  // The sequence-wise l_aux: the rows of a micro-batch are its sequences, L tokens each.
  shape.aux_seq_len = c.aux_scope == AuxScope::kSequence ? c.seq_len : 0;
  return shape;
}

MoeShape layer_shape(const ModelConfig& c, int64_t micro_batch, const LayerSchedule& s) {
  MoeShape shape = moe_shape(c, micro_batch);
  shape.shared_overlap = s.shared_overlap;
  shape.pad_to_capacity = s.pad_to_capacity;
  return shape;
}

void validate_model(const ModelConfig& c, const Layout& l,
                    const std::vector<LayerSchedule>& moe_schedules, int64_t micro_batch) {
  PARM_CONFIG_CHECK(c.arch == Arch::kGpt2 || c.arch == Arch::kBert, "unknown model arch {}",
                    static_cast<int>(c.arch));
  PARM_CONFIG_CHECK(c.vocab >= 1, "vocab {} must be at least 1", c.vocab);
  // The embedding and the head are vocabulary-parallel (model/vocab_parallel.h): any V
  // splits over mp (shards differ by at most a row), as long as every MP rank gets one.
  PARM_CONFIG_CHECK(c.vocab >= l.mp,
                    "vocab {} is smaller than mp {}: the vocabulary-parallel embedding and LM "
                    "head give every MP rank at least one row; valid mp: at most {}",
                    c.vocab, l.mp, c.vocab);
  PARM_CONFIG_CHECK(c.seq_len >= 1, "seq_len {} must be at least 1", c.seq_len);
  PARM_CONFIG_CHECK(c.model_dim >= 1, "model_dim {} must be at least 1", c.model_dim);
  PARM_CONFIG_CHECK(c.num_heads >= 1, "num_heads {} must be at least 1", c.num_heads);
  PARM_CONFIG_CHECK(c.num_layers >= 1, "num_layers {} must be at least 1", c.num_layers);
  PARM_CONFIG_CHECK(c.moe_every >= 0, "moe_every {} must be >= 0 (0: no MoE blocks)",
                    c.moe_every);
  PARM_CONFIG_CHECK(micro_batch >= 1, "micro_batch {} must be at least 1", micro_batch);
  PARM_CONFIG_CHECK(c.model_dim % c.num_heads == 0,
                    "model_dim {} is not divisible by num_heads {}; valid num_heads for M={}: {}",
                    c.model_dim, c.num_heads, c.model_dim, divisors_of(c.model_dim));
  PARM_CONFIG_CHECK(std::isfinite(c.init_std) && c.init_std > 0.0f,
                    "init_std {} must be positive", c.init_std);
  PARM_CONFIG_CHECK(std::isfinite(c.init_bias_std) && c.init_bias_std >= 0.0f,
                    "init_bias_std {} must be >= 0", c.init_bias_std);

  // Megatron: heads and the dense MLP's hidden columns are split over mp.
  PARM_CONFIG_CHECK(c.num_heads % l.mp == 0,
                    "num_heads {} is not divisible by --mp {} (attention heads are split over the "
                    "MP group); valid --mp values for {} heads: {}",
                    c.num_heads, l.mp, c.num_heads, divisors_of(c.num_heads));
  if (has_dense_block(c)) {
    PARM_CONFIG_CHECK(c.ffn_hidden >= 1, "ffn_hidden {} must be at least 1", c.ffn_hidden);
    PARM_CONFIG_CHECK(c.ffn_hidden % l.mp == 0,
                      "ffn_hidden {} is not divisible by --mp {} (the dense MLP's hidden columns "
                      "are split over the MP group); valid --mp values: {}",
                      c.ffn_hidden, l.mp, divisors_of(c.ffn_hidden));
  }

  const int64_t num_moe = num_moe_blocks(c);
  if (num_moe == 0) return;
  PARM_CONFIG_CHECK(c.experts >= 1, "experts {} must be at least 1", c.experts);
  PARM_CONFIG_CHECK(c.expert_hidden >= 1, "expert_hidden {} must be at least 1", c.expert_hidden);
  PARM_CONFIG_CHECK(c.topk >= 1 && c.topk <= c.experts, "topk {} must be in [1, experts = {}]",
                    c.topk, c.experts);
  const CapacityFactor f = CapacityFactor::parse(c.capacity_factor);
  PARM_CONFIG_CHECK(f.dropless || f.num > 0,
                    "capacity_factor {} must be positive, or none (dropless)", c.capacity_factor);
  PARM_CONFIG_CHECK(std::isfinite(c.aux_loss_coeff) && c.aux_loss_coeff >= 0.0f,
                    "aux_loss_coeff {} must be >= 0", c.aux_loss_coeff);
  PARM_CONFIG_CHECK(std::isfinite(c.router_z_loss) && c.router_z_loss >= 0.0f,
                    "router_z_loss {} must be >= 0 (0: off)", c.router_z_loss);
  PARM_CONFIG_CHECK(std::isfinite(c.router_bias_update) && c.router_bias_update >= 0.0f,
                    "router_bias_update {} must be >= 0 (0: off)", c.router_bias_update);
  PARM_CONFIG_CHECK(moe_schedules.size() <= 1 ||
                        static_cast<int64_t>(moe_schedules.size()) == num_moe,
                    "{} MoE schedules given for {} MoE blocks: give one for all or one per block",
                    moe_schedules.size(), num_moe);
  // The MoE layer's own checks (E % N_EP, H % N_ESP, T % N_MP, the baseline's layouts).
  const schedule::SizeNames names{"experts", "expert_hidden", "micro_batch x seq_len"};
  schedule::LayerSpec spec{moe_shape(c, micro_batch), l};
  spec.aux_scope = c.aux_scope;
  if (moe_schedules.empty()) schedule::validate(spec, schedule::Kind::kS1, names);
  for (size_t i = 0; i < moe_schedules.size(); ++i) {
    const LayerSchedule& s = moe_schedules[i];
    PARM_CONFIG_CHECK(s.chunks >= 1, "MoE schedule {}: chunks {} must be at least 1", i,
                      s.chunks);
    spec.shape = layer_shape(c, micro_batch, s);
    schedule::validate(spec, s.kind, names);
  }
}

}  // namespace parm::model
