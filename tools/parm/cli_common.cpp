#include "cli_common.h"

#include <mpi.h>

#include <algorithm>

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

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

std::vector<double> max_over_ranks(const std::vector<double>& values) {
  std::vector<double> out(values.size());
  MPI_Allreduce(values.data(), out.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_MAX,
                MPI_COMM_WORLD);
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace parm::cli
