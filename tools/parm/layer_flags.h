// Flags shared by the layer commands (bench-layer, check-layer): the layout and the MoE
// layer's shape, and the schedules to run.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "moe/reference_moe.h"
#include "schedule/schedule.h"

namespace parm::cli {

struct LayerFlags {
  LayoutFlags layout;
  int64_t tokens = 2048;  // per MP group
  int64_t model_dim = 512;
  int64_t hidden = 1024;
  int64_t experts = 8;
  int topk = 2;
  std::string capacity_factor = "1.2";
  std::string schedule = "all";
  uint64_t seed = 1;

  void add_to(CLI::App* app);
  ref::MoeShape shape() const;  // validated
  std::vector<schedule::Kind> schedules() const;  // "all": those valid for the layout
  nlohmann::json config_json() const;
};

}  // namespace parm::cli
