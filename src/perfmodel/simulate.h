// The cluster simulator: the cost model over a grid of layer configurations on a described
// cluster (`parm simulate`). Pure computation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shape/shape.h"
#include "perfmodel/model.h"
#include "perfmodel/profile.h"

namespace parm::perfmodel {

// A cluster file: nodes, devices per node, the two link classes' (alpha, beta), the device
// GEMM rate and memory bandwidth (configs/clusters/*.json; docs/perfmodel.md). Turned into a
// Profile whose entries are all marked "assumed".
struct ClusterSpec {
  std::string name;
  int nodes = 1;
  int devices_per_node = 1;
  Profile profile;
  int devices() const { return nodes * devices_per_node; }
};
// Refuses (InvalidConfig naming `origin` and the key) missing keys, non-numbers, bad ranges.
ClusterSpec cluster_from_json(const nlohmann::json& j, const std::string& origin);
ClusterSpec read_cluster(const std::string& path);

// One layer configuration: B sequences of L tokens per MP group (T = B * L).
struct GridConfig {
  int64_t B = 1, L = 1, M = 1, H = 1, E = 1;
  int k = 1;
  std::string f = "1.0";  // the capacity factor as the decimal it was written as
  int mp = 1, esp = 1, ep = 1;
  int64_t tokens() const { return B * L; }
  MoeShape shape() const;  // the MoE layer: T = B * L tokens per MP group
};

// A grid file: lists for "B", "L", "M", "H", "E", "k", "f", "N_MP", "N_ESP", "N_EP" and an
// optional "chunks" (default fused_plan::kDefaultChunks) and "order" (the nesting of the groups, docs/layout.md; default
// mp-esp-ep-dp-pp). The configurations are their cartesian product, in that key order with
// N_EP varying fastest.
struct Grid {
  std::string name;
  int chunks = fused_plan::kDefaultChunks;
  std::string order = kDefaultOrder;
  std::vector<GridConfig> configs;
};
Grid grid_from_json(const nlohmann::json& j, const std::string& origin);
Grid read_grid(const std::string& path);

struct SimRow {
  GridConfig config;
  bool evaluated = false;
  std::string note;  // why it was skipped, or remarks ("no baseline for this layout")
  Link mp_link = Link::kIntra, esp_link = Link::kIntra, ep_link = Link::kIntra;
  // Predicted forward+backward ms; NaN where the candidate does not exist (baseline
  // undefined for the layout; "+fused" where the schedule has nothing to fuse).
  double baseline_ms, s1_ms, s1_fused_ms, s2_ms, s2_fused_ms;
  std::string choice;  // "s2+fused", ...
  double auto_ms = 0.0, auto_fwd_ms = 0.0, auto_bwd_ms = 0.0;
  double speedup = 0.0;  // baseline / auto; NaN without a baseline
};

struct SimSummary {
  int64_t configs = 0, evaluated = 0, skipped = 0, with_baseline = 0;
  double speedup_min = 0, speedup_median = 0, speedup_max = 0, speedup_geomean = 0;
  double share_above_1_13 = 0;  // of the configurations with a baseline (the paper's mark)
  int64_t choose_baseline = 0, choose_s1 = 0, choose_s2 = 0, choose_fused = 0,
          choose_unfused = 0;
  nlohmann::json to_json() const;
  std::string str() const;  // a few printable lines
};

std::vector<SimRow> simulate(const ClusterSpec& cluster, const Grid& grid);
// Share of `values` above `mark` (NaN for none): the speedup tables' "above 1.13x".
double share_above(const std::vector<double>& values, double mark);
SimSummary summarize(const std::vector<SimRow>& rows);
// Header + one line per row (every row of the grid, skipped ones with empty times).
std::string sim_csv(const std::vector<SimRow>& rows);
// A histogram of the auto/baseline speedups, hand-written SVG.
std::string speedup_svg(const std::vector<SimRow>& rows, const SimSummary& s,
                        const std::string& title);

}  // namespace parm::perfmodel
