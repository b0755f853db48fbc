// `parm simulate`: the cost model over a grid of layer configurations on a described cluster.
// Writes DIR/results.csv (every configuration's predicted times, choice and speedup),
// DIR/summary.json (printed too) and DIR/speedup.svg (the speedup distribution).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

#include "cli_common.h"
#include "parm/error.h"
#include "parm/fileio.h"
#include "perfmodel/simulate.h"

namespace parm::cli {
namespace {

struct SimulateFlags {
  std::string cluster, grid, out, order;
};

int run_simulate(const SimulateFlags& f) {
  const auto cluster = perfmodel::read_cluster(f.cluster);
  auto grid = perfmodel::read_grid(f.grid);
  if (!f.order.empty()) {
    make_layout(1, 1, 1, 1, 1, f.order);  // the names; each layout checks the rest
    grid.order = f.order;
  }
  if (world_rank() != 0) return 0;
  std::error_code ec;
  std::filesystem::create_directories(f.out, ec);
  PARM_CONFIG_CHECK(!ec, "--out {}: cannot create the directory: {}", f.out, ec.message());
  const auto rows = perfmodel::simulate(cluster, grid);
  const auto s = perfmodel::summarize(rows);
  const std::string csv = f.out + "/results.csv", js = f.out + "/summary.json",
                    svg = f.out + "/speedup.svg";
  write_file_atomic(csv, perfmodel::sim_csv(rows));
  nlohmann::json doc = s.to_json();
  doc["cluster"] = {{"file", f.cluster}, {"name", cluster.name}, {"nodes", cluster.nodes},
                    {"devices_per_node", cluster.devices_per_node}};
  doc["grid"] = {{"file", f.grid}, {"name", grid.name}, {"chunks", grid.chunks},
                 {"order", grid.order}};
  doc["baseline_rule"] =
      "speedup = baseline / auto where the baseline exists (N_MP = 1, N_ESP = 1 or N_ESP = "
      "N_MP); other layouts get no speedup and are left out of its statistics";
  write_file_atomic(js, doc.dump(2) + "\n");
  write_file_atomic(svg, perfmodel::speedup_svg(
                             rows, s,
                             fmt::format("{}: auto vs baseline over {} ({} configurations)",
                                         cluster.name, grid.name, s.with_baseline)));
  std::printf("# parm simulate: cluster %s (%d node(s) x %d devices), grid %s (%zu "
              "configurations, %d chunks, order %s)\n",
              cluster.name.c_str(), cluster.nodes, cluster.devices_per_node, grid.name.c_str(),
              grid.configs.size(), grid.chunks, grid.order.c_str());
  std::printf("%s", s.str().c_str());
  std::printf("wrote %s, %s, %s\n", csv.c_str(), js.c_str(), svg.c_str());
  return 0;
}

}  // namespace

Command add_simulate(CLI::App& root) {
  auto* app = root.add_subcommand(
      "simulate", "predict every schedule over a grid of layers on a described cluster");
  auto f = std::make_shared<SimulateFlags>();
  app->add_option("--cluster", f->cluster, "cluster file (configs/clusters/*.json)")->required();
  app->add_option("--grid", f->grid, "grid file (configs/grids/*.json)")->required();
  app->add_option("--out", f->out, "output directory")->required();
  app->add_option("--order", f->order,
                  "nesting of the groups, innermost first (docs/layout.md); overrides the "
                  "grid's \"order\" (default mp-esp-ep-dp-pp)");
  return {app, [f] { return run_simulate(*f); }};
}

}  // namespace parm::cli
