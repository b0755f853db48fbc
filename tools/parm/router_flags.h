// The router flags of the layer commands and of train (docs/spec.md §7): --router-score,
// --router-topk-norm, --router-scale, --router-groups, --router-group-topk. Each changes the
// RouterSpec it is applied to only when given, so train's flags override its config's keys.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "shape/router.h"

namespace parm::cli {

struct RouterFlags {
  std::string score, topk_norm;
  float scale = 1.0f;
  int groups = 1, group_topk = 1;
  CLI::Option *score_opt = nullptr, *norm_opt = nullptr, *scale_opt = nullptr,
              *groups_opt = nullptr, *group_topk_opt = nullptr;

  void add_to(CLI::App* app);
  // The given flags written into r; throws InvalidConfig naming a bad value.
  void apply(RouterSpec& r) const;
};

// "on" / "off" -> bool; throws InvalidConfig naming `what` and the valid values.
bool parse_on_off(const std::string& text, const char* what);

}  // namespace parm::cli
