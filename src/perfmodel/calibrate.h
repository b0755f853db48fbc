// Calibration: measures this machine's collectives (on intra-node groups of 2 and of a
// node's ranks, on a group of one rank per node and on the whole world when there are
// several nodes: the terms of model.h's collective formula), the fused collectives, the GEMM rate over expert and gate shapes and the memory
// bandwidth of the copy and GeLU kernels, and fits the profile's entries by least squares.
// Collective over the topology's world: every rank calls it with the same options.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "parm/topology.h"
#include "perfmodel/profile.h"

namespace parm::perfmodel {

struct CalibrateOptions {
  int64_t min_bytes = 4096;     // collective buffer sizes (nccl-tests convention), per rank,
  int64_t max_bytes = 4 << 20;  // in x4 steps
  int iters = 5;                // timed iterations per size (median of the max over ranks)
  int warmup = 1;
  int chunks = 4;               // pipeline depth of the fused collectives measured
  // GEMM shapes: rows R x model dim M x expert hidden shard Hl (and the gate's E).
  std::vector<int64_t> gemm_rows = {64, 512};
  std::vector<int64_t> gemm_model_dims = {256, 1024};
  std::vector<int64_t> gemm_hidden = {256, 1024};
  std::vector<int64_t> gate_experts = {8, 64};
  int gemm_iters = 3;
};

// One measured sample, kept for the report.
struct CalibrationSample {
  std::string entry;  // "intra.alltoall", "gemm.expert_nn", "fused.dispatch", ...
  double x = 0.0;     // bus bytes, flops or bytes
  double us = 0.0;    // median over iterations of the max over ranks
};

struct Calibration {
  Profile profile;
  std::vector<CalibrationSample> samples;
};

// `log` receives progress lines (on every rank; print them on rank 0 only). topo_options:
// those `topo` was made with (the groups measured are topologies over the same ranks with
// other mp / ep / esp).
Calibration calibrate(Topology& topo, const TopologyOptions& topo_options,
                      const CalibrateOptions& options,
                      const std::function<void(const std::string&)>& log);

// hostname, cores, CPU model (/proc/cpuinfo), MPI library, oneDNN, parm version.
nlohmann::json describe_machine();

}  // namespace parm::perfmodel
