// The kind of an MoE layer's experts (docs/spec.md §8): GPT-2's `gelu` FFN with biases, or the
// gated `swiglu` FFN of Mixtral, DeepSeek and Qwen-MoE, without biases.
#pragma once

#include <string>

namespace parm {

enum class ExpertMlp {
  kGelu,    // y = gelu(x W1 + b1) W2 + b2
  kSwiglu,  // y = (silu(x W1) * (x W3)) W2, no biases
};

// "gelu", "swiglu" and back; parse throws InvalidConfig naming the flag, the config key and the
// valid values.
const char* expert_mlp_name(ExpertMlp m);
ExpertMlp parse_expert_mlp(const std::string& text);

// Whether the experts have biases (b1, b2) and a third weight (W3, the gate projection).
inline bool has_expert_biases(ExpertMlp m) { return m == ExpertMlp::kGelu; }
inline bool is_gated(ExpertMlp m) { return m == ExpertMlp::kSwiglu; }

}  // namespace parm
