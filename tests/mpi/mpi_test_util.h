// Helpers for multi-rank tests.
#pragma once

#include <mpi.h>

#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "moe/reference_moe.h"
#include "parm/error.h"
#include "parm/topology.h"
#include "schedule/schedule.h"

namespace parm::test {

inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Every valid (mp, ep, esp) for the current world size.
inline std::vector<TopologyOptions> all_layouts(double timeout_s = 60.0) {
  std::vector<TopologyOptions> out;
  const int p = world_size();
  for (int mp = 1; mp <= p; ++mp)
    for (int ep = 1; ep <= p; ++ep)
      for (int esp = 1; esp * ep <= p; ++esp)
        if (p % mp == 0 && p % (ep * esp) == 0) {
          TopologyOptions o;
          o.mp = mp;
          o.ep = ep;
          o.esp = esp;
          o.timeout_s = timeout_s;
          out.push_back(o);
        }
  return out;
}

// One layer configuration of a sweep: a layout of this world size, a schedule, fused or not.
struct LayerCase {
  TopologyOptions layout;
  schedule::Kind kind = schedule::Kind::kS1;
  bool fuse = false;
  std::string where;  // "mp=2 ep=1 esp=2 s1 fused", for messages
};

// Every (layout, schedule, fuse) of this world size that can run `s`.
inline std::vector<LayerCase> layer_cases(const MoeShape& s, double timeout_s = 120.0) {
  using schedule::Kind;
  std::vector<LayerCase> out;
  for (const TopologyOptions& o : all_layouts(timeout_s)) {
    if (s.experts % o.ep != 0 || s.hidden % o.esp != 0 || s.tokens % o.mp != 0) continue;
    for (Kind kind : {Kind::kBaseline, Kind::kS1, Kind::kS2})
      for (bool fuse : {false, true}) {
        try {
          schedule::validate({s, make_layout(world_size(), o.mp, o.ep, o.esp), 0}, kind);
        } catch (const InvalidConfig&) {
          continue;
        }
        out.push_back({o, kind, fuse,
                       fmt::format("mp={} ep={} esp={} {}{}", o.mp, o.ep, o.esp,
                                   schedule::kind_name(kind), fuse ? " fused" : "")});
      }
  }
  return out;
}

// The topology of one layout, with a test-sized watchdog.
inline std::unique_ptr<Topology> make_topology(int mp, int ep, int esp, double timeout_s = 120.0) {
  TopologyOptions o;
  o.mp = mp;
  o.ep = ep;
  o.esp = esp;
  o.timeout_s = timeout_s;
  return Topology::create(o);
}

// True on every rank when `ok` is true on every rank (so all ranks agree on the outcome).
inline bool all_ranks(bool ok) {
  int v = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return v == 1;
}

}  // namespace parm::test
