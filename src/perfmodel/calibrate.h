// Calibration: measures this machine's collectives (calibrate_collectives.h), the fused
// collectives (calibrate_fused.h), the GEMM rate over expert and gate shapes and the memory
// bandwidth of the copy and GeLU kernels (calibrate_compute.h), then the layer itself
// (calibrate_layer.h, calibrate_rendezvous.h), and fits the profile's entries. Collective
// over the topology's world: every rank calls it with the same options.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/fused_plan.h"
#include "parm/topology.h"
#include "perfmodel/bench_device.h"
#include "perfmodel/profile.h"

namespace parm::perfmodel {

struct CalibrateOptions {
  int64_t min_bytes = 4096;     // collective buffer sizes (nccl-tests convention), per rank,
  int64_t max_bytes = 1 << 20;  // in x4 steps: the range of a layer's collectives
  int iters = 15;  // timed iterations per size (median of the max over ranks); fewer leave
                   // the pair latencies to noise (docs/perfmodel.md, `parm calibrate`)
  int warmup = 1;
  int chunks = fused_plan::kDefaultChunks;  // pipeline depth of the fused collectives measured
  // The largest message the inter-node transport sends eagerly (bytes; model.h,
  // eager_saving_us). < 0: assumed from Open MPI's defaults, 64 KiB over TCP between nodes
  // (btl_tcp_eager_limit), 4 KiB where emulated nodes exchange over shared memory
  // (btl_vader_eager_limit); 0: not priced.
  double eager_limit_bytes = -1.0;
  // GEMM shapes: rows R x model dim M x expert hidden shard Hl (and the gate's E), the range
  // of a layer's products (2-270 MFLOP); larger products run slower per flop under load and
  // would bend the rate of every smaller one.
  std::vector<int64_t> gemm_rows = {32, 256};
  std::vector<int64_t> gemm_model_dims = {128, 512};
  std::vector<int64_t> gemm_hidden = {128, 1024};
  std::vector<int64_t> gate_experts = {8, 64};
  int gemm_iters = 3;
  // Each timed sample of a product or memory-bound kernel repeats it back to back for at
  // least this long on every rank (0: one call per sample). With more ranks than cores a
  // single 30-300 us call after a barrier mostly runs alone, at the rate of a rank alone; a
  // window longer than the scheduler's slice measures the rate the ranks get when all compute.
  double compute_window_us = 20000.0;
  // Where the products, kernels and collectives' buffers are measured (make_bench_device's
  // device, recorded as the profile's "device"; the topology must move that device's
  // memory) and the products' precision (fp32, or bf16 operands with fp32 accumulation;
  // recorded as machine.gemm_precision).
  Device device = Device::kCpu;
  Precision precision = Precision::kFp32;
};

// One measured sample, kept for the report.
struct CalibrationSample {
  std::string entry;  // "intra.alltoall", "gemm.expert_nn", "fused.dispatch", ...
  double x = 0.0;     // bus bytes, flops or bytes
  double us = 0.0;    // median over iterations of the max over ranks
};

// The fused collectives timed alone (calibrate_fused), per size outside the eager regime:
// measured, the model's parts in sequence and pipelined (fit.h fit_overlap's inputs), and the
// sizes whose pipeline the model prices below the sequence (fit_overlap's sizes_used).
struct FusedAlone {
  std::vector<double> measured, unfused, pipelined;
  int64_t sizes_with_gain = 0;
  // The overlap was measured in the layer (calibrate_overlap_in_layer), not fit_overlap's.
  bool overlap_in_layer = false;
};

struct Calibration {
  Profile profile;
  std::vector<CalibrationSample> samples;
  FusedAlone fused_alone;
};

// `log` receives progress lines (on every rank; print them on rank 0 only). topo_options:
// those `topo` was made with (the groups measured are topologies over the same ranks with
// other mp / ep / esp).
// Measures on make_bench_device(options.device).
Calibration calibrate(Topology& topo, const TopologyOptions& topo_options,
                      const CalibrateOptions& options,
                      const std::function<void(const std::string&)>& log);
// Measures on `dev` (tests pass a stand-in; options.device is not consulted); the profile
// records dev.device().
Calibration calibrate(Topology& topo, const TopologyOptions& topo_options,
                      const CalibrateOptions& options, BenchDevice& dev,
                      const std::function<void(const std::string&)>& log);
// Refuses (parm::InvalidConfig, before any work) options calibrate cannot measure: sizes,
// iterations, GEMM shapes, and a device this build or machine cannot run (check_device:
// --device cuda in a build without CUDA or on a machine without a GPU).
void check_calibrate_options(const CalibrateOptions& options);

// hostname, cores, CPU model (/proc/cpuinfo), MPI library, oneDNN, parm version.
nlohmann::json describe_machine();

}  // namespace parm::perfmodel
