#include "cli_common.h"

#include <algorithm>

#include "comm/process.h"
#include "parm/error.h"

namespace parm::cli {

void LayoutFlags::add_to(CLI::App* app) {
  app->add_option("--mp", mp, "model (tensor) parallel size N_MP")->check(CLI::PositiveNumber);
  app->add_option("--ep", ep, "expert parallel size N_EP")->check(CLI::PositiveNumber);
  app->add_option("--esp", esp, "expert sharding size N_ESP")->check(CLI::PositiveNumber);
  app->add_option("--pp", pp, "pipeline parallel size N_PP (stages)")->check(CLI::PositiveNumber);
  app->add_option("--order", order,
                  "nesting of the groups, innermost first: mp, esp, ep, dp, pp joined by '-' "
                  "(docs/layout.md)")
      ->default_str(kDefaultOrder);
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
  o.pp = pp;
  o.order = order;
  o.ranks_per_node = ranks_per_node;
  o.timeout_s = timeout_s;
  return o;
}

Layout LayoutFlags::layout(int world) const {
  return make_layout(world, mp, ep, esp, pp, order);
}

void LayoutFlags::refuse_pp(const char* command) const {
  PARM_CONFIG_CHECK(pp == 1,
                    "{} runs one MoE layer on every rank, inside one pipeline stage: --pp {} has "
                    "no meaning there; valid --pp: 1 (pipeline stages are for `parm train`)",
                    command, pp);
}

int world_rank() { return process::world_rank(); }

int world_size() { return process::world_size(); }

}  // namespace parm::cli
