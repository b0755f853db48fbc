// Flags shared by the layer commands (bench-layer, check-layer): the layout and the MoE
// layer's shape, and the schedules to run.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "router_flags.h"
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
  std::string schedule = "all";  // baseline | s1 | s2 | all (| auto where a profile is taken)
  std::string fuse = "on";  // on | off (| both | auto for bench-layer)
  std::string profile;      // cost profile for auto (parm calibrate --out FILE)
  int chunks = fused_plan::kDefaultChunks;
  uint64_t seed = 1;
  float router_z_loss = 0.0f;     // z-loss coefficient: dl_z of the backward passes
  RouterFlags router;             // score function, weights, group limit
  std::string expert_mlp = "gelu";  // gelu | swiglu (docs/spec.md §8)
  int shared_experts = 0;           // docs/spec.md §9
  int64_t shared_hidden = 0;        // 0: the routed experts' H
  std::string shared_gate = "off";  // on | off
  std::string shared_overlap = "off";  // on | off
  std::string pad_to_capacity = "on";  // on | off
  std::string device = "cpu";     // cpu | cuda
  std::string precision = "fp32"; // fp32 | bf16
  std::string comm = "auto";      // auto | mpi | nccl: what moves device buffers

  void add_to(CLI::App* app);
  // --profile: for the commands that can choose by the cost model (bench-layer, plan).
  void add_profile_to(CLI::App* app);
  // --schedule auto or --fuse auto: the cost model picks (needs --profile).
  bool wants_auto() const { return schedule == "auto" || fuse == "auto"; }
  MoeShape shape() const;  // validated
  // The layout, device and communicator choice; refuses a device / precision / comm that
  // cannot run here.
  TopologyOptions topology() const;
  Precision precision_kind() const { return parse_precision(precision); }
  // "all" (and "auto": the candidates): those valid for the layout.
  std::vector<schedule::Kind> schedules(const Layout& layout) const;
  // The fuse settings to run: {true}, {false} or {false, true} ("both" when allowed; "auto":
  // the candidates, when allowed).
  std::vector<bool> fuse_modes(bool allow_both) const;
  // With both fuse modes, the fused run of `kind` would repeat the unfused one (the baseline
  // is never fused; a layout without a pair to fuse gets the unfused list): skip it.
  bool fused_run_repeats(schedule::Kind kind, bool fuse, const std::vector<bool>& modes,
                         const Layout& layout) const;
  nlohmann::json config_json() const;
};

}  // namespace parm::cli
