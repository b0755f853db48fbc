// `parm calibrate --out profile.json`: measures this machine's collectives (intra- and
// inter-node groups), fused collectives, GEMM rates and memory bandwidth, fits the cost
// model's parameters by least squares, prints r^2 per entry and writes the profile.
// Run under MPI (scripts/parmrun -n 4 -- calibrate --out profile.json). --device cuda
// measures cuBLAS products, the CUDA kernels and collectives over device buffers (NCCL, or
// MPI staged through host memory) instead, and the profile records "device": "cuda".
#include <nlohmann/json.hpp>

#include <cstdio>

#include "cli_common.h"
#include "parm/error.h"
#include "parm/fileio.h"
#include "parm/timer.h"
#include "perfmodel/calibrate.h"

namespace parm::cli {
namespace {

struct CalibrateFlags {
  LayoutFlags layout;
  perfmodel::CalibrateOptions options;
  std::string out;
  std::string samples;
  std::string device = "cpu", precision = "fp32", comm = "auto";
};

void print_table(const perfmodel::Profile& p) {
  using namespace perfmodel;
  std::printf("\n%-26s %10s %14s %12s %8s %7s  %s\n", "entry", "alpha_us", "beta_us/B",
              "rate", "r2", "samples", "source");
  for (Link link : {Link::kIntra, Link::kInter})
    for (CommOp op : kModelOps) {
      const CommFit& f = p.collective(link, op);
      std::printf("%-26s %10.2f %14.4e %9.2f GB/s %8.4f %7lld  %s\n",
                  fmt::format("{}.{}", link_name(link), comm_op_name(op)).c_str(), f.alpha_us,
                  f.beta_us_per_byte, f.beta_us_per_byte > 0 ? 1e-3 / f.beta_us_per_byte : 0.0,
                  f.r2, static_cast<long long>(f.samples), f.source.c_str());
      std::printf("%-26s %10.2f %14s %12s %8s %7s  %s\n", "  + per rank beyond 2",
                  f.alpha_per_rank_us, "-", "-", "", "", f.alpha_per_rank_source.c_str());
      if (link == Link::kInter)
        std::printf("%-26s %10.2f %14s %12s %8s %7s  %s\n", "  + handshake above limit",
                    f.handshake_us, "-", "-", "", "", f.handshake_source.c_str());
    }
  std::printf("%-26s %10.2f %14s %9.3f ovl  %8.4f %7lld  %s\n", "fused (per piece, overlap)",
              p.fused.per_piece_us, "-", p.fused.overlap, p.fused.r2,
              static_cast<long long>(p.fused.samples), p.fused.source.c_str());
  std::printf("%-26s %10.0f %14s %12s %8s %7s  %s\n", "fused eager limit (bytes)",
              p.fused.eager_limit_bytes, "-", "-", "", "", p.fused.eager_limit_source.c_str());
  std::printf("%-26s %10.3f %14s %12s %8s %7s  %s\n", "fused eager gain (share)",
              p.fused.eager_gain, "-", "-", "", "", p.fused.eager_gain_source.c_str());
  std::printf("%-26s %10.3f %14s %12s %8s %7s  %s\n", "fused eager gain, mixed",
              p.fused.eager_gain_mixed, "-", "-", "", "", p.fused.eager_gain_mixed_source.c_str());
  std::printf("%-26s %10.3f %14s %12s %8s %7s  %s\n", "layer compute scale", p.layer_compute.scale,
              "-", "-", "", "", p.layer_compute.source.c_str());
  for (const auto& [name, f] : {std::pair{"step sync (+ per compute)", &p.step_sync},
                                std::pair{"step sync within a node", &p.step_sync_intra}})
    std::printf("%-26s %10.2f %14s %7.4f/us  %8.4f %7lld  %s%s\n", name, f->us, "-",
                f->per_compute, f->r2, static_cast<long long>(f->samples), f->source.c_str(),
                f->compute_cap_us > 0.0
                    ? fmt::format("; compute capped at {:.1f} ms", f->compute_cap_us / 1e3).c_str()
                    : "");
  for (int c = 0; c < kNumGemmClasses; ++c) {
    const GemmFit& f = p.gemm[static_cast<size_t>(c)];
    std::printf("%-26s %10.2f %14s %6.2f GFLOP/s %8.4f %7lld  %s\n",
                fmt::format("gemm.{}", gemm_class_name(static_cast<GemmClass>(c))).c_str(),
                f.alpha_us, "-", f.gflops, f.r2, static_cast<long long>(f.samples),
                f.source.c_str());
  }
  for (int c = 0; c < kNumMemClasses; ++c) {
    const MemFit& f = p.mem[static_cast<size_t>(c)];
    std::printf("%-26s %10.2f %14s %9.2f GB/s %8.4f %7lld  %s\n",
                fmt::format("memory.{}", mem_class_name(static_cast<MemClass>(c))).c_str(),
                f.alpha_us, "-", f.gbps, f.r2, static_cast<long long>(f.samples),
                f.source.c_str());
  }
}

int run_calibrate(CalibrateFlags f) {
  // Bad flags (a device this build cannot run among them) are refused before any work.
  f.options.device = parse_device(f.device);
  f.options.precision = parse_precision(f.precision);
  const CommBackend comm = parse_comm_backend(f.comm);
  PARM_CONFIG_CHECK(f.options.device == Device::kCuda || comm == CommBackend::kAuto,
                    "calibrate --comm {}: --comm chooses what moves device buffers; pass it "
                    "with --device cuda",
                    f.comm);
  perfmodel::check_calibrate_options(f.options);
  const int world = world_size();
  const bool root = world_rank() == 0;
  PARM_CONFIG_CHECK(world >= 2,
                    "calibrate needs at least 2 ranks to measure collectives; run it as "
                    "`scripts/parmrun -n 4 -- calibrate --out {}`",
                    f.out);
  auto say = [&](const std::string& s) {
    if (root) {
      std::printf("%s\n", s.c_str());
      std::fflush(stdout);
    }
  };
  f.layout.refuse_pp("calibrate");
  TopologyOptions o = f.layout.topology();
  o.device = f.options.device;
  o.comm = comm;
  int detected_nodes = 1;
  if (o.ranks_per_node == 0) {
    auto probe = Topology::create({.timeout_s = o.timeout_s});
    detected_nodes = probe->num_nodes();
    // One machine has no inter-node group: emulate two nodes so that the inter-node entries
    // are measured (over shared memory) on groups the layout calls inter-node.
    if (detected_nodes == 1 && world % 2 == 0) {
      o.ranks_per_node = world / 2;
      say(fmt::format(
          "# one node detected (all {} ranks share memory): there is no real inter-node group "
          "here. Emulating 2 nodes of {} ranks (--ranks-per-node {}); the inter entries are "
          "measured over shared memory and marked \"emulated\". On a real cluster run this "
          "across nodes.",
          world, o.ranks_per_node, o.ranks_per_node));
    } else if (detected_nodes == 1) {
      say("# one node detected and an odd world size: the inter entries copy the intra ones "
          "(source \"assumed\")");
    }
  }
  if (o.mp == 1 && o.ep == 1 && o.esp == 1) {
    // Default layout: ESP (= MP) inside a node, EP across nodes: the paper's layout.
    const int per_node = o.ranks_per_node > 0 ? o.ranks_per_node
                         : detected_nodes > 1 && world % detected_nodes == 0
                             ? world / detected_nodes
                             : world;
    o.esp = o.mp = per_node;
    o.ep = world / per_node;
  }
  auto topo = Topology::create(o);
  const Layout& l = topo->layout();
  say(fmt::format("# parm calibrate: {} ranks, {} node(s){}, layout mp={} ep={} esp={}, device "
                  "{} ({} collectives), products at {}",
                  l.world, topo->num_nodes(), topo->nodes_emulated() ? " (emulated)" : "", l.mp,
                  l.ep, l.esp, device_name(o.device), topo->comm_backend(), f.precision));
  const double t0 = now_us();
  const auto cal = perfmodel::calibrate(*topo, o, f.options, say);
  if (!root) return 0;
  print_table(cal.profile);
  perfmodel::write_profile(cal.profile, f.out);
  std::printf("\nwrote %s (%.0f s)\n", f.out.c_str(), (now_us() - t0) / 1e6);
  if (!f.samples.empty()) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& s : cal.samples) a.push_back({{"entry", s.entry}, {"x", s.x}, {"us", s.us}});
    write_file_atomic(f.samples, a.dump(1) + "\n");
  }
  return 0;
}

}  // namespace

Command add_calibrate(CLI::App& root) {
  auto* app = root.add_subcommand(
      "calibrate", "measure collectives, GEMMs and memory bandwidth; fit the cost profile");
  auto f = std::make_shared<CalibrateFlags>();
  f->layout.add_to(app);
  auto& o = f->options;
  app->add_option("--out", f->out, "profile file to write (JSON)")->required();
  app->add_option("--min-bytes", o.min_bytes, "smallest collective buffer per rank");
  app->add_option("--max-bytes", o.max_bytes, "largest collective buffer per rank (x4 steps)");
  app->add_option("--iters", o.iters, "timed iterations per collective size");
  app->add_option("--warmup", o.warmup, "untimed iterations per collective size");
  app->add_option("--chunks", o.chunks, "pipeline depth of the fused collectives measured");
  app->add_option("--eager-limit-bytes", o.eager_limit_bytes,
                  "largest message the inter-node transport sends eagerly (default: Open MPI's, "
                  "64 KiB over TCP, 4 KiB on emulated nodes; 0: fusion's rendezvous saving not "
                  "priced)");
  app->add_option("--gemm-rows", o.gemm_rows, "GEMM rows (expert tokens) measured")
      ->delimiter(',');
  app->add_option("--gemm-model-dims", o.gemm_model_dims, "GEMM model dims M measured")
      ->delimiter(',');
  app->add_option("--gemm-hidden", o.gemm_hidden, "GEMM hidden shards H/N_ESP measured")
      ->delimiter(',');
  app->add_option("--gemm-iters", o.gemm_iters, "timed iterations per GEMM shape");
  app->add_option("--compute-window-us", o.compute_window_us,
                  "each timed product / kernel sample repeats it for this long (0: one call)");
  app->add_option("--samples", f->samples, "also write every raw sample to this JSON file");
  app->add_option("--device", f->device,
                  "where the products, kernels and collectives' buffers are measured: cpu or "
                  "cuda (the profile records it; --schedule auto refuses a profile of another "
                  "device)");
  app->add_option("--precision", f->precision,
                  "the products' precision: fp32, or bf16 (bf16 operands, fp32 accumulation)");
  app->add_option("--comm", f->comm,
                  "with --device cuda, what moves the device buffers: auto, nccl, or mpi "
                  "(staged through host memory)");
  return {app, [f] { return run_calibrate(*f); }};
}

}  // namespace parm::cli
