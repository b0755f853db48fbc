#include "perfmodel/calibrate.h"

#include <unistd.h>

#include <cmath>
#include <ctime>
#include <fstream>
#include <thread>

#include "comm/process.h"
#include "kernels/cpu/kernels.h"
#include "parm/error.h"
#include "perfmodel/calibrate_collectives.h"
#include "perfmodel/calibrate_compute.h"
#include "perfmodel/calibrate_fused.h"
#include "perfmodel/calibrate_layer.h"
#include "perfmodel/calibrate_rendezvous.h"
#include "perfmodel/calibrate_timing.h"

namespace parm::perfmodel {

nlohmann::json describe_machine() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string cpu = "unknown";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);)
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 1);
      cpu.erase(0, cpu.find_first_not_of(" \t"));
      break;
    }
  const std::string mpi_line = process::mpi_library();
  char date[32] = {};
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return {{"hostname", host},
          {"cores", static_cast<int>(std::thread::hardware_concurrency())},
          {"cpu_model", cpu},
          {"mpi_library", mpi_line},
          {"onednn", cpu::gemm_backend()},
          {"bf16_gemm", cpu::bf16_kernel_name()},
          {"cpu_bf16", cpu::cpu_bf16_capability()},
          {"gemm_threads_per_rank", cpu::gemm_threads()},
          {"parm_version", PARM_VERSION},
          {"created_utc", date}};
}

namespace {

// The rendezvous (model.h: step_sync, step_sync_world) is not timed alone: back-to-back
// timings never see it, and a line over the compute before a collective came out as noise
// here (docs/perfmodel.md). It is 0 until calibrate_rendezvous measures its terms inside
// the layer.
void calibrate_step_sync(Calibration& cal, const Logger& log) {
  for (SyncFit* f :
       {&cal.profile.step_sync, &cal.profile.step_sync_world, &cal.profile.step_sync_intra}) {
    *f = SyncFit{};
    f->source = "assumed 0 (not measured in the layer)";
  }
  log("  not measured alone; step_sync, step_sync_world and step_sync_intra 0 until the layer "
      "measures them (docs/perfmodel.md)");
}

}  // namespace

Calibration calibrate(Topology& topo, const TopologyOptions& topo_options,
                      const CalibrateOptions& o,
                      const std::function<void(const std::string&)>& log_fn) {
  check_calibrate_options(o);
  auto dev = make_bench_device(o.device);
  return calibrate(topo, topo_options, o, *dev, log_fn);
}

namespace {

// What calibrate(..., dev, ...) checks: everything but the device, which `dev` is.
void check_measure_options(const CalibrateOptions& o) {
  // Sizes go up in x4 steps and the fit anchors at the faster of the two smallest (a delayed
  // smallest sample is dropped), so a line needs a third size: max >= 16 x min.
  PARM_CONFIG_CHECK(o.min_bytes >= 64 && o.max_bytes >= 16 * o.min_bytes,
                    "calibrate: --min-bytes {} must be >= 64 and --max-bytes {} at least 16 "
                    "times it (three sizes in x4 steps: the fit needs several sizes), e.g. "
                    "--min-bytes 4096 --max-bytes 65536",
                    o.min_bytes, o.max_bytes);
  PARM_CONFIG_CHECK(o.iters >= 1 && o.warmup >= 0 && o.gemm_iters >= 1,
                    "calibrate: --iters {} and --gemm-iters {} must be >= 1, --warmup {} >= 0",
                    o.iters, o.gemm_iters, o.warmup);
  PARM_CONFIG_CHECK(o.chunks >= 1, "calibrate: --chunks {} must be at least 1", o.chunks);
  PARM_CONFIG_CHECK(o.eager_limit_bytes >= 0.0 || o.eager_limit_bytes == -1.0,
                    "calibrate: --eager-limit-bytes {} must be at least 0 (0: not priced)",
                    o.eager_limit_bytes);
  PARM_CONFIG_CHECK(std::isfinite(o.compute_window_us) && o.compute_window_us >= 0.0 &&
                        o.compute_window_us <= 1e7,
                    "calibrate: --compute-window-us {} must be between 0 (one call per "
                    "sample) and 1e7 (10 s)",
                    o.compute_window_us);
  check_gemm_shapes(o);
}

}  // namespace

void check_calibrate_options(const CalibrateOptions& o) {
  check_measure_options(o);
  check_device(o.device, o.precision);
}

Calibration calibrate(Topology& topo, const TopologyOptions& topo_options,
                      const CalibrateOptions& o, BenchDevice& dev,
                      const std::function<void(const std::string&)>& log_fn) {
  check_measure_options(o);
  // The collectives move the bench device's buffers: comm(g) must take that memory.
  const MemorySpace want =
      dev.device() == Device::kCuda ? MemorySpace::kDevice : MemorySpace::kHost;
  PARM_CONFIG_CHECK(topo.comm(Group::kWorld).memory_space() == want,
                    "calibrate on device {}: the topology's communicators move {} memory, the "
                    "device's buffers are {} memory (create the topology with device {})",
                    device_name(dev.device()),
                    memory_space_name(topo.comm(Group::kWorld).memory_space()),
                    memory_space_name(want), device_name(dev.device()));
  const Layout& l = topo.layout();
  PARM_CONFIG_CHECK(l.world >= 2,
                    "calibrate needs at least 2 ranks to measure collectives (run it under "
                    "`scripts/parmrun -n 4 -- calibrate ...`)");
  Logger log{log_fn};
  Calibration cal;
  cal.profile.machine = describe_machine();
  // What is measured below: the products and kernels of `dev`, and the collectives over its
  // memory (MPI over host memory; on a GPU, NCCL or MPI staged through host memory).
  cal.profile.device = dev.device();
  cal.profile.machine["device"] = dev.describe();
  cal.profile.machine["comm"] = topo.comm_backend();
  cal.profile.machine["gemm_precision"] = precision_name(o.precision);
  cal.profile.machine["ranks"] = l.world;
  cal.profile.machine["nodes"] = topo.num_nodes();
  cal.profile.machine["nodes_emulated"] = topo.nodes_emulated();
  cal.profile.machine["layout"] = {{"mp", l.mp}, {"ep", l.ep}, {"esp", l.esp}};
  cal.profile.machine["fused_chunks"] = o.chunks;

  // The rendezvous layer, timed first, midway and last, so that a slow phase of the shared
  // cores during one timing does not set the term (calibrate_rendezvous.h); priced at the end.
  std::vector<RendezvousLayerTime> rendezvous, rendezvous_intra;
  // Where the job spans nodes, also a layout whose groups stay within a node: its steps'
  // rendezvous (step_sync_intra) is measured there (calibrate_rendezvous.h).
  TopologyOptions intra_options;
  std::unique_ptr<Topology> intra;
  if (intra_rendezvous_layout(topo, topo_options, intra_options))
    intra = Topology::create(intra_options);
  auto time_rendezvous = [&] {
    for (int64_t hidden : kRendezvousHidden) {
      if (auto t = time_rendezvous_layer(topo, o, hidden)) rendezvous.push_back(*t);
      if (intra)
        if (auto t = time_rendezvous_layer(*intra, o, hidden)) rendezvous_intra.push_back(*t);
    }
  };
  time_rendezvous();
  // The eager limit first: the inter-node collectives' handshake is fitted as a step there.
  set_eager_limit(o, topo.nodes_emulated(), cal.profile.fused);
  log("collectives ({} to {} bytes per rank, x4 steps; {} iters):", o.min_bytes, o.max_bytes,
      o.iters);
  calibrate_collectives(topo, topo_options, o, dev, cal, log);
  log("fused collectives ({} chunks):", o.chunks);
  calibrate_fused(topo, o, dev, cal, log);
  log("collective after computation:");
  calibrate_step_sync(cal, log);
  log("GEMM on {} at {} (all ranks at once, as in the layer):", device_name(dev.device()),
      precision_name(o.precision));
  calibrate_gemm(topo.host_comm(Group::kWorld), o, dev, cal, log);
  log("memory-bound kernels on {}:", device_name(dev.device()));
  calibrate_memory(topo.host_comm(Group::kWorld), o, dev, cal, log);
  time_rendezvous();
  // Last: it prices the layer with every term above.
  const FusedFit& ff = cal.profile.fused;
  log("fused collectives in the layer (eager limit {:.0f} bytes, {}):", ff.eager_limit_bytes,
      ff.eager_limit_source);
  calibrate_overlap_in_layer(topo, o, cal, log_fn);
  calibrate_fused_layer(topo, topo_options, o, cal, log_fn);
  time_rendezvous();
  // Last: the eager shares above are measured against prices without a rendezvous (as the
  // sweeps that decided to apply it were priced: calibrate_rendezvous.cpp).
  log("collective after computation, inside the layer:");
  calibrate_rendezvous(topo, o, rendezvous, cal, log_fn, intra.get(), rendezvous_intra);
  return cal;
}

}  // namespace parm::perfmodel
