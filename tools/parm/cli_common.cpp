#include "cli_common.h"

#include <algorithm>

#include "comm/process.h"

namespace parm::cli {

void LayoutFlags::add_to(CLI::App* app) {
  app->add_option("--mp", mp, "model (tensor) parallel size N_MP")->check(CLI::PositiveNumber);
  app->add_option("--ep", ep, "expert parallel size N_EP")->check(CLI::PositiveNumber);
  app->add_option("--esp", esp, "expert sharding size N_ESP")->check(CLI::PositiveNumber);
  app->add_option("--ranks-per-node", ranks_per_node,
                  "emulate nodes of this many consecutive ranks (default: detect shared memory)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--timeout", timeout_s,
                  "seconds before a stuck communication aborts the job")
      ->check(CLI::PositiveNumber);
}

TopologyOptions LayoutFlags::topology() const {
  TopologyOptions o;
  o.mp = mp;
  o.ep = ep;
  o.esp = esp;
  o.ranks_per_node = ranks_per_node;
  o.timeout_s = timeout_s;
  return o;
}

int world_rank() { return process::world_rank(); }

int world_size() { return process::world_size(); }

}  // namespace parm::cli
