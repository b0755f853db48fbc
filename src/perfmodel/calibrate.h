// Calibration: measures this machine's collectives (on an intra-node and an inter-node
// group), the fused collectives, the GEMM rate over expert and gate shapes and the memory
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
  int64_t min_bytes = 4096;     // collective buffer sizes (nccl-tests convention), per rank
  int64_t max_bytes = 8 << 20;
  int iters = 10;               // timed iterations per size (median of the max over ranks)
  int warmup = 2;
  int chunks = 4;               // pipeline depth of the fused collectives measured
  // GEMM shapes: rows R x model dim M x expert hidden shard Hl (and the gate's E).
  std::vector<int64_t> gemm_rows = {64, 256, 1024};
  std::vector<int64_t> gemm_model_dims = {256, 512, 1024};
  std::vector<int64_t> gemm_hidden = {256, 512, 1024};
  std::vector<int64_t> gate_experts = {8, 16, 64};
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

// `log` receives progress lines (on every rank; print them on rank 0 only).
Calibration calibrate(Topology& topo, const CalibrateOptions& options,
                      const std::function<void(const std::string&)>& log);

// hostname, cores, CPU model (/proc/cpuinfo), MPI library, oneDNN, parm version.
nlohmann::json describe_machine();

}  // namespace parm::perfmodel
