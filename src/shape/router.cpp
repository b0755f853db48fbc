#include "shape/router.h"

#include <cmath>

#include "parm/error.h"

namespace parm {

const char* router_score_name(RouterScore s) {
  return s == RouterScore::kSigmoid ? "sigmoid" : "softmax";
}

RouterScore parse_router_score(const std::string& text) {
  if (text == "softmax") return RouterScore::kSoftmax;
  if (text == "sigmoid") return RouterScore::kSigmoid;
  throw InvalidConfig(fmt::format(
      "--router-score (model.router_score) '{}' is not valid; use softmax or sigmoid", text));
}

void RouterSpec::validate(int64_t experts, int topk) const {
  PARM_CONFIG_CHECK(std::isfinite(scale) && scale > 0.0f,
                    "--router-scale (model.router_scale) must be a positive number, got {}",
                    scale);
  PARM_CONFIG_CHECK(groups >= 1 && groups <= kMaxRouterGroups && experts % groups == 0,
                    "--router-groups (model.router_groups) {} must divide the {} experts "
                    "(valid: a divisor of {} up to {}; 1 for no group limit)",
                    groups, experts, experts, kMaxRouterGroups);
  PARM_CONFIG_CHECK(group_topk >= 1 && group_topk <= groups,
                    "--router-group-topk (model.router_group_topk) {} must be in [1, "
                    "--router-groups = {}]",
                    group_topk, groups);
  const int64_t reachable = group_topk * (experts / groups);
  PARM_CONFIG_CHECK(topk <= reachable,
                    "top-k {} exceeds the {} experts of the {} chosen groups "
                    "(--router-group-topk {} x E / --router-groups = {} / {}); use "
                    "--router-group-topk >= {}",
                    topk, reachable, group_topk, group_topk, experts, groups,
                    (topk + experts / groups - 1) / (experts / groups));
}

std::string RouterSpec::str() const {
  if (is_default()) return "";
  std::string s = fmt::format(" router={}", router_score_name(score));
  if (!topk_norm) s += ",norm=off";
  if (scale != 1.0f) s += fmt::format(",scale={}", scale);
  if (groups > 1) s += fmt::format(",groups={}/{}", groups, group_topk);
  return s;
}

}  // namespace parm
