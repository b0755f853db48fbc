// The router of an MoE layer beyond docs/spec.md §2's softmax top-k (docs/spec.md §7): the
// score function, whether the top-k weights are normalised, a route scale and group-limited
// selection (DeepSeek-V3). Every field at its default is §2 exactly.
#pragma once

#include <string>

namespace parm {

enum class RouterScore { kSoftmax, kSigmoid };

constexpr int kMaxRouterGroups = 64;  // the gates' per-token group arrays

struct RouterSpec {
  RouterScore score = RouterScore::kSoftmax;  // --router-score softmax|sigmoid
  bool topk_norm = true;    // --router-topk-norm: weights / their sum (when k > 1)
  float scale = 1.0f;       // --router-scale: the combine weights times this
  int groups = 1;           // --router-groups G: groups of E / G consecutive experts
  int group_topk = 1;       // --router-group-topk K_g: groups a token may choose from

  bool is_default() const { return *this == RouterSpec{}; }
  bool group_limited() const { return groups > 1; }
  // Throws parm::InvalidConfig naming the flag (and config key) and the valid values unless
  // scale > 0 and finite, 1 <= G <= kMaxRouterGroups, G divides E, 1 <= K_g <= G (so
  // K_g = 1 when G = 1), and the K_g groups hold at least k experts.
  void validate(int64_t experts, int topk) const;
  // "" at the default; else " router=sigmoid,norm=off,scale=2.5,groups=4/2" (what differs).
  std::string str() const;
  bool operator==(const RouterSpec&) const = default;
};

// "softmax", "sigmoid" and back; parse throws InvalidConfig naming the valid ones.
const char* router_score_name(RouterScore s);
RouterScore parse_router_score(const std::string& text);

}  // namespace parm
