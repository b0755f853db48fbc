// Options and helpers shared by the `parm` subcommands.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parm/stats.h"
#include "parm/topology.h"

namespace parm::cli {

// --mp --ep --esp --pp --order --ranks-per-node --timeout
struct LayoutFlags {
  int mp = 1, ep = 1, esp = 1, pp = 1;
  std::string order = kDefaultOrder;
  int ranks_per_node = 0;
  double timeout_s = 300.0;

  void add_to(CLI::App* app);
  TopologyOptions topology() const;
  // The layout these flags give on `world` ranks (validated: refuses a bad layout or order).
  Layout layout(int world) const;
  // The commands that run one MoE layer (or its collectives) on every rank: a pp > 1 has no
  // meaning there (the layer lives inside one stage), so it is refused before any work.
  void refuse_pp(const char* command) const;
};

// A subcommand: its CLI11 app and what runs when it was chosen (returns the exit code).
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command add_info(CLI::App& root);
Command add_bench_comm(CLI::App& root);
Command add_bench_layer(CLI::App& root);
Command add_check_layer(CLI::App& root);
Command add_calibrate(CLI::App& root);
Command add_plan(CLI::App& root);
Command add_simulate(CLI::App& root);
Command add_train(CLI::App& root);
Command add_tokenizer(CLI::App& root);
Command add_prepare_data(CLI::App& root);
Command add_generate(CLI::App& root);

int world_rank();
int world_size();

}  // namespace parm::cli
