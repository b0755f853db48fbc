#include "perfmodel/calibrate.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <ctime>
#include <set>
#include <fstream>
#include <thread>

#include <fmt/ranges.h>

#include "comm/fused.h"
#include "comm/process.h"
#include "kernels/cpu/kernels.h"
#include "parm/error.h"
#include "parm/stats.h"
#include "parm/rng.h"
#include "parm/timer.h"
#include "perfmodel/bench_device.h"
#include "perfmodel/calibrate_layer.h"
#include "perfmodel/calibrate_rendezvous.h"
#include "perfmodel/fit.h"
#include "perfmodel/model.h"

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

// Three variants run(0), run(1), run(2) timed as time_all_ranks does, their iterations
// interleaved (so that load changes hit them alike); the three medians of the slowest rank.
template <typename Fn>
std::array<double, 3> time_three_interleaved(Communicator& world, int warmup, int iters,
                                             Fn&& run) {
  std::array<std::vector<double>, 3> t;
  for (int it = 0; it < warmup + iters; ++it)
    for (int v = 0; v < 3; ++v) {
      world.barrier();
      const double t0 = now_us();
      run(v);
      const double dt = now_us() - t0;
      if (it >= warmup) t[static_cast<size_t>(v)].push_back(dt);
    }
  std::array<double, 3> out;
  for (size_t v = 0; v < 3; ++v) out[v] = median(max_over_ranks(world, std::move(t[v])));
  return out;
}

// Times `fn` on every rank at once (after a world barrier), warmup + iters times; returns
// the median over iterations of the slowest rank's time.
template <typename Fn>
double time_all_ranks(Communicator& world, int warmup, int iters, Fn&& fn) {
  std::vector<double> t;
  for (int it = 0; it < warmup + iters; ++it) {
    world.barrier();
    const double t0 = now_us();
    fn();
    const double dt = now_us() - t0;
    if (it >= warmup) t.push_back(dt);
  }
  return median(max_over_ranks(world, t));
}

// Times `fn` as time_all_ranks does, each sample repeating it back to back for about
// `window_us` (CalibrateOptions::compute_window_us) and returning the time of one call: the
// repeat count comes from one timed warm-up call, the slowest rank's, so every rank runs as
// many (at most 1000). window_us 0: one call per sample, after one warm-up call.
template <typename Fn>
double time_all_ranks_windowed(Communicator& world, int iters, double window_us, Fn&& fn) {
  if (window_us <= 0.0) return time_all_ranks(world, 1, iters, fn);
  fn();  // first call: oneDNN creates its kernels, caches warm up
  world.barrier();
  const double t0 = now_us();
  fn();
  const double once = max_over_ranks(world, std::vector<double>{now_us() - t0}).at(0);
  const int reps = static_cast<int>(std::clamp(std::ceil(window_us / std::max(once, 1.0)), 1.0,
                                               1000.0));
  return time_all_ranks(world, 0, iters, [&] {
           for (int r = 0; r < reps; ++r) fn();
         }) /
         reps;
}

void run_op(Communicator& c, CommOp op, size_t count, const float* send, float* recv) {
  switch (op) {
    case CommOp::kAllReduce: c.allreduce(recv, count); break;
    case CommOp::kAllGather: c.allgather(send, recv, count); break;
    case CommOp::kReduceScatter: c.reduce_scatter(send, recv, count); break;
    case CommOp::kAllToAll: c.alltoall(send, recv, count); break;
    default: PARM_CHECK(false, "op {} is not calibrated", comm_op_name(op));
  }
}

std::vector<int64_t> sizes(const CalibrateOptions& o) {
  std::vector<int64_t> s;
  for (int64_t b = o.min_bytes; b <= o.max_bytes; b *= 4) s.push_back(b);
  return s;
}

// A buffer of n floats on `dev`, every value `v`.
std::unique_ptr<BenchBuffer> filled(BenchDevice& dev, size_t n, float v) {
  auto b = std::make_unique<BenchBuffer>(dev, n * sizeof(float));
  if (v != 0.0f) {
    const std::vector<float> host(n, v);
    dev.upload(b->get(), host.data(), n, Precision::kFp32);
  }
  return b;
}

struct Logger {
  const std::function<void(const std::string&)>& log;
  template <typename... Args>
  void operator()(fmt::format_string<Args...> f, Args&&... args) const {
    log(fmt::format(f, std::forward<Args>(args)...));
  }
};

// One group calibrated: a layout whose group g has the span wanted.
struct GroupShape {
  int mp = 1, ep = 1, esp = 1;
  Group group = Group::kWorld;
};

// The groups that pin down the collective terms (model.h), for nodes of R ranks:
//   intra: groups of 2 and of R ranks inside a node (mp) -> alpha, alpha_per_rank, beta;
//   inter: one rank per node (ep over esp = R: every rank of a node sends across its link
//          at once, link_share R, intra_share 0) and the whole world (n = world, R ranks of
//          a node in each instance: both shares between 0 and R) -> alpha(n) at two sizes
//          and the link's beta.
std::vector<GroupShape> shapes_to_measure(int world, int per_node, int nodes) {
  std::vector<GroupShape> out;
  for (int s : {2, per_node})
    if (s >= 2 && per_node % s == 0 && (out.empty() || out.back().mp != s))
      out.push_back({s, 1, 1, Group::kMp});
  if (nodes >= 2) {
    out.push_back({1, nodes, per_node, Group::kEp});
    if (world > nodes) out.push_back({1, 1, 1, Group::kWorld});
  }
  return out;
}

struct ShapeSamples {
  GroupSpan span;
  std::vector<double> bus, us;
};

// alpha(n) = alpha_us + alpha_per_rank_us (n - 2) through the latencies fitted per group size.
void fit_alpha_over_sizes(const std::vector<ShapeSamples>& shapes,
                          const std::vector<double>& alpha_of_shape, CommFit& e) {
  std::vector<double> xs, ys;
  for (size_t i = 0; i < shapes.size(); ++i) {
    xs.push_back(shapes[i].span.size - 2.0);
    ys.push_back(alpha_of_shape[i]);
    e.group_sizes.push_back(shapes[i].span.size);
  }
  std::sort(e.group_sizes.begin(), e.group_sizes.end());
  e.group_sizes.erase(std::unique(e.group_sizes.begin(), e.group_sizes.end()),
                      e.group_sizes.end());
  if (e.group_sizes.size() >= 2) {
    const LineFit f = fit_line(xs, ys);
    e.alpha_us = f.intercept;
    e.alpha_per_rank_us = f.slope;
    return;
  }
  double sum = 0.0;
  for (double y : ys) sum += y;
  e.alpha_us = sum / static_cast<double>(ys.size());
  e.alpha_per_rank_us = 0.0;
  e.alpha_per_rank_source = fmt::format("assumed 0 (measured at one group size, {})",
                                        e.group_sizes.empty() ? 0 : e.group_sizes[0]);
}

// Fits one (link, op) entry from the samples of its groups: the bytes term of model.h
// (intra: beta * bus; inter: beta_intra * intra_share * bus, known from the intra fit, plus
// beta * link_share * bus), one slope pooled over the groups with a latency per group, then
// the latencies over the group sizes.
void fit_link_op(Link link, CommOp op, const std::vector<ShapeSamples>& shapes,
                 const std::string& source, Profile& prof) {
  const double beta_intra = prof.collective(Link::kIntra, op).beta_us_per_byte;
  std::vector<std::vector<double>> xs, ys;
  std::vector<std::vector<bool>> above;  // inter: the per-peer message above the eager limit
  for (const auto& sh : shapes) {
    std::vector<double> x, y;
    std::vector<bool> a;
    for (size_t i = 0; i < sh.bus.size(); ++i) {
      const double known = link == Link::kInter ? beta_intra * sh.span.intra_share * sh.bus[i] : 0.0;
      x.push_back(link == Link::kInter ? sh.span.link_share * sh.bus[i] : sh.bus[i]);
      y.push_back(sh.us[i] - known);
      a.push_back(link == Link::kInter && sh.span.size > 1 &&
                  above_eager_limit(prof.fused, peer_message_bytes(sh.span, sh.bus[i])));
    }
    xs.push_back(std::move(x));
    ys.push_back(std::move(y));
    above.push_back(std::move(a));
  }
  const PooledFit pf = fit_anchored_pooled(xs, ys, above);
  CommFit& e = prof.collective(link, op);
  e = CommFit{};
  e.beta_us_per_byte = pf.slope;
  e.source = source;
  e.alpha_per_rank_source = source;
  if (link == Link::kInter) {
    e.handshake_us = pf.step;
    e.handshake_source =
        pf.step_fitted
            ? source + " (the step at the eager limit)"
            : fmt::format("assumed 0 (the timings do not pin a step at the eager limit, {:.0f} "
                          "bytes: they need sizes below it and two above it in one group)",
                          prof.fused.eager_limit_bytes);
  } else {
    e.handshake_source = "not priced on an intra-node link";
  }
  fit_alpha_over_sizes(shapes, pf.intercepts, e);
  // r2 of the final formula over every sample.
  std::vector<double> meas, pred;
  for (const auto& sh : shapes)
    for (size_t i = 0; i < sh.bus.size(); ++i) {
      meas.push_back(sh.us[i]);
      pred.push_back(collective_us(prof, op, sh.span, sh.bus[i]));
    }
  e.r2 = r_squared(meas, pred);
  e.samples = static_cast<int64_t>(meas.size());
}

// Measures every op on every group shape (each its own topology over the same ranks) and
// fits the intra entries, then the inter ones (which use the intra beta).
void calibrate_collectives(Topology& topo, const TopologyOptions& topo_options,
                           const CalibrateOptions& o, BenchDevice& dev, Calibration& cal,
                           const Logger& log, bool& has_intra, bool& has_inter) {
  const Target here = target_of(topo);
  const int world = here.layout.world, nodes = topo.num_nodes();
  const int per_node = world % nodes == 0 ? world / nodes : 0;
  std::array<std::vector<ShapeSamples>, kNumLinks * kModelOps.size()> by_entry;
  auto entry = [](Link l, size_t o) { return static_cast<size_t>(l) * kModelOps.size() + o; };
  for (const GroupShape& gs : shapes_to_measure(world, per_node, nodes)) {
    TopologyOptions to = topo_options;
    to.mp = gs.mp;
    to.ep = gs.ep;
    to.esp = gs.esp;
    auto t = Topology::create(to);
    const GroupSpan sp = group_span(target_of(*t), gs.group);
    Communicator& c = t->comm(gs.group);
    Communicator& w = t->host_comm(Group::kWorld);
    const int n = c.size();
    log("  {} group {} ({} ranks; intra share {:.3f}, link share {:.3f}):", link_name(sp.link),
        group_name(gs.group), n, sp.intra_share, sp.link_share);
    for (size_t oi = 0; oi < kModelOps.size(); ++oi) {
      const CommOp op = kModelOps[oi];
      ShapeSamples ss;
      ss.span = sp;
      for (int64_t bytes : sizes(o)) {
        const size_t elems = static_cast<size_t>(bytes) / sizeof(float);
        const size_t count = op == CommOp::kAllReduce ? elems : elems / static_cast<size_t>(n);
        if (count == 0) continue;
        const size_t total = op == CommOp::kAllReduce ? count : count * static_cast<size_t>(n);
        const auto send = filled(dev, total, 1.0f), recv = filled(dev, total, 0.0f);
        // The two smallest sizes anchor the latency (fit_anchored_pooled): a median of 5
        // there once put the intra allreduce at 312 us beside 84-106 us for the other ops
        // on the same link (and 162 us beside 154-187 on the same cluster at 10 Gbit/s),
        // and that latency, paid twice by S1's tiny l_aux and gate-gradient allreduces, made
        // the baseline look faster where S1 was measured so. They cost microseconds: 3x the
        // iterations.
        const int iters = bytes <= 4 * o.min_bytes ? 3 * o.iters : o.iters;
        const double us = time_all_ranks(w, o.warmup, iters, [&] {
          run_op(c, op, count, send->f(), recv->f());
          dev.sync();
        });
        const double real = static_cast<double>(total * sizeof(float));
        const double bus = bus_bytes(op, n, op == CommOp::kAllReduce ? real : real / n);
        ss.bus.push_back(bus);
        ss.us.push_back(us);
        cal.samples.push_back(
            {fmt::format("{}.{}.n{}", link_name(sp.link), comm_op_name(op), n), bus, us});
      }
      if (ss.bus.size() >= 2) by_entry[entry(sp.link, oi)].push_back(std::move(ss));
    }
  }
  const std::string inter_source = topo.nodes_emulated() ? "emulated" : "measured";
  for (Link link : {Link::kIntra, Link::kInter}) {
    std::vector<size_t> fitted;
    std::vector<double> alphas;
    for (size_t oi = 0; oi < kModelOps.size(); ++oi) {
      const auto& shapes = by_entry[entry(link, oi)];
      if (shapes.empty()) continue;
      (link == Link::kIntra ? has_intra : has_inter) = true;
      fit_link_op(link, kModelOps[oi], shapes,
                  link == Link::kIntra ? std::string("measured") : inter_source, cal.profile);
      fitted.push_back(oi);
      alphas.push_back(cal.profile.collective(link, kModelOps[oi]).alpha_us);
    }
    if (fitted.empty()) continue;
    // One latency of a pair for every op on this link (fit.h: pair_latency).
    const double pair_us = pair_latency(alphas);
    log("  {:<5} latency of a pair, every op: {:.2f} us (median of the ops' {:.2f} us)",
        link_name(link), pair_us, fmt::join(alphas, ", "));
    for (size_t j = 0; j < fitted.size(); ++j) {
      const size_t oi = fitted[j];
      CommFit& e = cal.profile.collective(link, kModelOps[oi]);
      e.alpha_us = pair_us;
      std::vector<double> meas, pred;
      for (const auto& sh : by_entry[entry(link, oi)])
        for (size_t i = 0; i < sh.bus.size(); ++i) {
          meas.push_back(sh.us[i]);
          pred.push_back(collective_us(cal.profile, kModelOps[oi], sh.span, sh.bus[i]));
        }
      e.r2 = r_squared(meas, pred);
      log("  {:<5} {:<14} alpha {:8.2f} us + {:7.2f} us/rank beyond 2  beta {:.3e} us/B "
          "({:7.3f} GB/s{}){}  r2 {:.4f}  [{} samples, sizes {}]",
          link_name(link), comm_op_name(kModelOps[oi]), e.alpha_us, e.alpha_per_rank_us,
          e.beta_us_per_byte, e.beta_us_per_byte > 0 ? 1e-3 / e.beta_us_per_byte : 0.0,
          link == Link::kInter ? " per node link" : " bus",
          link == Link::kInter ? fmt::format("  handshake {:.2f} us ({})", e.handshake_us,
                                             e.handshake_source)
                               : std::string(),
          e.r2, e.samples, fmt::join(e.group_sizes, ","));
    }
  }
}

// The largest message the inter-node transport sends eagerly (model.h): given, or Open MPI's
// default for the transport the nodes use. Open MPI's limit counts the message's header (ob1's
// match header is 14 bytes): a payload of exactly 64 KiB goes by rendezvous over TCP (its
// alltoall timed 0.96-1.23 ms there against 0.42-0.69 at 60 KiB on the emulated 2 x 2
// cluster), so the payload limit is taken 64 bytes below.
constexpr double kEagerHeaderBytes = 64.0;
void set_eager_limit(const CalibrateOptions& o, bool nodes_emulated, FusedFit& ff) {
  if (o.eager_limit_bytes >= 0.0) {
    ff.eager_limit_bytes = o.eager_limit_bytes;
    ff.eager_limit_source = "given (--eager-limit-bytes)";
  } else if (nodes_emulated) {
    ff.eager_limit_bytes = 4096.0 - kEagerHeaderBytes;
    ff.eager_limit_source =
        "assumed (Open MPI's btl_vader_eager_limit default, 4096, less 64 bytes for the header it "
        "counts: emulated nodes share memory)";
  } else {
    ff.eager_limit_bytes = 65536.0 - kEagerHeaderBytes;
    ff.eager_limit_source =
        "assumed (Open MPI's btl_tcp_eager_limit default, 65536, less 64 bytes for the header it "
        "counts: nodes exchange over TCP)";
  }
}

// Fused dispatch and combine on (ep, esp), each against its two parts run one after the
// other, all interleaved in one loop (so that load changes hit them alike). The parts'
// measured times t_i give the model's per-piece times c_i (piece_cost: alpha_i and the
// piece's handshake, plus 1/W of the rest), hence its unfused and pipelined totals (model.h); the
// overlap is the median over sizes of (unfused - t_fused) / (unfused - pipelined) in [0, 1],
// per_piece_us the median of what is left, per piece beyond the first.
void calibrate_fused(Topology& topo, const CalibrateOptions& o, BenchDevice& dev,
                     Calibration& cal, const Logger& log) {
  Communicator& ep = topo.comm(Group::kEp);
  Communicator& esp = topo.comm(Group::kEsp);
  Communicator& world = topo.host_comm(Group::kWorld);
  FusedFit& ff = cal.profile.fused;
  if (ep.size() < 2 || esp.size() < 2) {
    const FusedFit limit = ff;
    ff = FusedFit{};
    ff.eager_limit_bytes = limit.eager_limit_bytes;
    ff.eager_limit_source = limit.eager_limit_source;
    ff.source = "assumed (no layout with N_EP > 1 and N_ESP > 1 to measure it on)";
    log("  fused: not measured (needs --ep > 1 and --esp > 1); overlap assumed 1");
    return;
  }
  const Target here = target_of(topo);
  const GroupSpan ep_span = group_span(here, Group::kEp), esp_span = group_span(here, Group::kEsp);
  const Link ep_link = ep_span.link, esp_link = esp_span.link;
  const Profile& prof = cal.profile;
  const int n_ep = ep.size(), n_esp = esp.size(), W = o.chunks;
  std::vector<double> meas, serial, piped;
  for (int64_t bytes : sizes(o)) {
    // block: elements one EP rank sends to one EP peer; the dispatch input is (N_EP, block).
    const size_t block = static_cast<size_t>(bytes) / sizeof(float) / static_cast<size_t>(n_ep);
    if (block < static_cast<size_t>(W)) continue;
    const size_t row = static_cast<size_t>(n_ep) * block;
    const auto a_buf = filled(dev, row, 1.0f), mid_buf = filled(dev, row, 0.0f);
    const auto b_buf = filled(dev, static_cast<size_t>(n_esp) * row, 1.0f);
    float* a = a_buf->f();
    float* mid = mid_buf->f();
    float* b = b_buf->f();
    for (bool dispatch : {true, false}) {
      const auto [f, p1, p2] = time_three_interleaved(world, o.warmup, o.iters, [&](int op) {
        if (dispatch) {
          if (op == 0) fused_dispatch(ep, esp, a, b, block, W);
          if (op == 1) ep.alltoall(a, mid, block);
          if (op == 2) esp.allgather(mid, b, row);
        } else {
          if (op == 0) fused_combine(esp, ep, b, a, block, W);
          if (op == 1) esp.reduce_scatter(b, mid, row);
          if (op == 2) ep.alltoall(mid, a, block);
        }
        dev.sync();
      });
      // Stages in pipeline order: dispatch = ep alltoall, esp allgather; combine = esp
      // reduce_scatter, ep alltoall.
      const CommOp op_a = dispatch ? CommOp::kAllToAll : CommOp::kReduceScatter;
      const CommOp op_b = dispatch ? CommOp::kAllGather : CommOp::kAllToAll;
      const GroupSpan& span_a = dispatch ? ep_span : esp_span;
      const GroupSpan& span_b = dispatch ? esp_span : ep_span;
      const double bb = static_cast<double>(block * sizeof(float));
      const double bus_ep = bus_bytes(CommOp::kAllToAll, n_ep, bb);
      const double bus_esp =
          bus_bytes(dispatch ? CommOp::kAllGather : CommOp::kReduceScatter, n_esp, n_ep * bb);
      const PieceCost c1 = piece_cost(prof, op_a, span_a, dispatch ? bus_ep : bus_esp, p1, W);
      const PieceCost c2 = piece_cost(prof, op_b, span_b, dispatch ? bus_esp : bus_ep, p2, W);
      const std::vector<double> c = {c1.piece_us, c2.piece_us};
      const std::vector<Link> links = dispatch ? std::vector<Link>{ep_link, esp_link}
                                               : std::vector<Link>{esp_link, ep_link};
      meas.push_back(f);
      const std::vector<double> alphas = {c1.latency_us, c2.latency_us};
      serial.push_back(fused_us(c, alphas, links, W, 0.0));  // the parts in sequence
      piped.push_back(fused_us(c, alphas, links, W, 1.0));
      cal.samples.push_back({dispatch ? "fused.dispatch" : "fused.combine", bus_ep + bus_esp, f});
      cal.samples.push_back({dispatch ? "fused.dispatch_parts" : "fused.combine_parts", 0.0,
                             p1 + p2});
    }
  }
  const OverlapFit of = fit_overlap(meas, serial, piped, W);
  ff.overlap = of.overlap;
  ff.per_piece_us = of.per_piece_us;
  std::vector<double> pred(meas.size()), ratios(meas.size());
  for (size_t i = 0; i < meas.size(); ++i) {
    pred[i] = serial[i] - ff.overlap * (serial[i] - piped[i]) + (W - 1) * ff.per_piece_us;
    ratios[i] = meas[i] / serial[i];
  }
  ff.r2 = r_squared(meas, pred);
  ff.samples = static_cast<int64_t>(meas.size());
  ff.source = topo.nodes_emulated() ? "emulated" : "measured";
  log("  fused dispatch+combine on ep ({} ranks, {}) x esp ({} ranks, {}), {} chunks: overlap "
      "{:.3f} (median of {} sizes {:.3f}, bounded to [0, 1]), per piece {:.2f} us, r2 {:.4f}  "
      "[{} samples]; fused / parts in sequence: median {:.3f}",
      n_ep, link_name(ep_link), n_esp, link_name(esp_link), W, ff.overlap, of.sizes_used, of.raw,
      ff.per_piece_us, ff.r2, ff.samples, ratios.empty() ? 0.0 : median(ratios));
}

// The rendezvous (model.h: step_sync, step_sync_world) is not measured here: it is set to 0,
// and calibrate_rendezvous measures its per_compute inside the layer and applies it (last, as
// it prices the layer with every other term). Measured as a line over the compute before a
// collective (8 x a d^3 GEMM then a 4 KiB alltoall against both timed apart), it came out as
// noise on this machine: a point after
// 2.4 ms of compute at 80 us below one after 0.3 ms at 302 us, slopes 0-0.48 minutes apart,
// negative points under load. Priced with the four quiet sweeps' own calibrated lines, it
// made the choice worse on all four (selection, distinct: 2 x 2 1 Gbit/s 21% -> 38% without
// it, 10 Gbit/s 35% -> 75%, one machine 33% -> 75%, 2 x 4 50% -> 70%; docs/perfmodel.md):
// a fixed cost per collective step falls on the schedule with more (small) collective steps,
// S1, which the sweeps measured fastest. A cluster file may still state one.
void calibrate_step_sync(Calibration& cal, const Logger& log) {
  for (SyncFit* f : {&cal.profile.step_sync, &cal.profile.step_sync_world}) {
    *f = SyncFit{};
    f->source = "assumed 0 (not measured in the layer)";
  }
  log("  not measured alone; step_sync and step_sync_world 0 until the layer measures them "
      "(docs/perfmodel.md)");
}

void calibrate_gemm(Communicator& world, const CalibrateOptions& o, BenchDevice& dev,
                    Calibration& cal, const Logger& log) {
  struct Shape {
    bool ta, tb;
    int64_t m, n, k;
  };
  std::array<std::vector<Shape>, kNumGemmClasses> shapes;
  for (int64_t R : o.gemm_rows)
    for (int64_t M : o.gemm_model_dims)
      for (int64_t hl : o.gemm_hidden) {
        // The expert products of moe/experts.cpp.
        shapes[0].push_back({false, false, R, hl, M});
        shapes[0].push_back({false, false, R, M, hl});
        shapes[1].push_back({true, false, hl, M, R});
        shapes[1].push_back({true, false, M, hl, R});
        shapes[2].push_back({false, true, R, hl, M});
        shapes[2].push_back({false, true, R, M, hl});
      }
  for (int64_t R : o.gemm_rows)
    for (int64_t M : o.gemm_model_dims)
      for (int64_t E : o.gate_experts) {
        // The gate's products of moe/gate.cpp (R = 4x the expert rows: a gate sees T rows).
        const int64_t T = 4 * R;
        shapes[3].push_back({false, false, T, E, M});
        shapes[3].push_back({true, false, M, E, T});
        shapes[3].push_back({false, true, T, M, E});
      }
  Rng rng(7, 0);
  for (int c = 0; c < kNumGemmClasses; ++c) {
    std::vector<double> xs, ys;
    for (const Shape& s : shapes[static_cast<size_t>(c)]) {
      std::vector<float> a(static_cast<size_t>(s.m * s.k)), b(static_cast<size_t>(s.k * s.n));
      for (auto& v : a) v = static_cast<float>(rng.normal());
      for (auto& v : b) v = static_cast<float>(rng.normal());
      // Operands at the precision measured (bf16: half the bytes), C fp32.
      const size_t operand_bytes = o.precision == Precision::kBf16 ? 2 : sizeof(float);
      BenchBuffer da(dev, a.size() * operand_bytes), db(dev, b.size() * operand_bytes);
      dev.upload(da.get(), a.data(), a.size(), o.precision);
      dev.upload(db.get(), b.data(), b.size(), o.precision);
      const auto out = filled(dev, static_cast<size_t>(s.m * s.n), 0.0f);
      const bool acc = s.ta;  // the weight gradients accumulate, as in the executor
      const double us = time_all_ranks_windowed(world, o.gemm_iters, o.compute_window_us, [&] {
        dev.gemm(s.ta, s.tb, s.m, s.n, s.k, da.get(), db.get(), out->f(), acc, o.precision);
        dev.sync();
      });
      const double flops = 2.0 * static_cast<double>(s.m * s.n * s.k);
      xs.push_back(flops);
      ys.push_back(us);
      cal.samples.push_back({fmt::format("gemm.{}", gemm_class_name(static_cast<GemmClass>(c))),
                             flops, us});
    }
    // Relative errors: the shapes span three decades of flops, and in absolute least squares
    // a few percent of misfit on the largest set a latency of 0.6 ms (expert_tn, a quiet
    // calibration) that every one of a layer's 30-300 us products then paid.
    LineFit f = fit_line_relative(xs, ys);
    if (f.slope <= 0.0) {
      // Times that do not grow with the flops (noise over too small shapes): a rate through
      // the origin is still a rate.
      log("  warning: the {} GEMM times do not grow with their flops; fitting a rate through "
          "the origin (pass larger --gemm-rows for a better fit)",
          gemm_class_name(static_cast<GemmClass>(c)));
      f = fit_through_origin(xs, ys);
    }
    GemmFit& g = cal.profile.gemm_fit(static_cast<GemmClass>(c));
    g.alpha_us = f.intercept;
    g.gflops = 1e-3 / f.slope;
    g.r2 = f.r2;
    g.samples = f.samples;
    g.source = "measured";
    log("  gemm {:<10} alpha {:8.2f} us  rate {:7.2f} GFLOP/s per rank  r2 {:.4f}  [{} shapes]",
        gemm_class_name(static_cast<GemmClass>(c)), g.alpha_us, g.gflops, g.r2, g.samples);
  }
}

constexpr int64_t kMemMaxRows = 2048;  // x 256 floats: 2 MiB

void calibrate_memory(Communicator& world, const CalibrateOptions& o, BenchDevice& dev,
                      Calibration& cal, const Logger& log) {
  const int64_t cols = 256;
  for (MemClass mc : {MemClass::kCopy, MemClass::kGelu}) {
    std::vector<double> xs, ys;
    // Buffers of 64 KiB .. 2 MiB: the sizes of one layer's copies and GeLU calls (a token
    // buffer or one expert's activation is at most 1-2 MiB in the grids measured here).
    // Larger buffers leave the cache: with 4 ranks on 2 cores, 8-16 MiB ran at 0.3-0.7 GB/s
    // and 4 MiB at 2.3 against 5-13 GB/s up to 2 MiB, and, being the largest x, they set the
    // fitted slope: every copy of the layer was priced 10-15x too slow.
    for (int64_t rows = 64; rows <= kMemMaxRows; rows *= 2) {
      const size_t n = static_cast<size_t>(rows * cols);
      const auto src = filled(dev, n, 0.5f), dst = filled(dev, n, 0.0f),
                 bias = filled(dev, static_cast<size_t>(cols), 0.1f);
      // Both read n floats and write n: a gather of rows (dispatch, layout gathers), and the
      // experts' bias + GeLU (x W1 read, act written).
      const double bytes = 2.0 * static_cast<double>(n) * sizeof(float);
      double us = 0.0;
      if (mc == MemClass::kCopy) {
        us = time_all_ranks_windowed(world, o.iters, o.compute_window_us, [&] {
          dev.copy_rows(src->f(), dst->f(), rows, cols);
          dev.sync();
        });
      } else {
        us = time_all_ranks_windowed(world, o.iters, o.compute_window_us, [&] {
          dev.bias_gelu(src->f(), bias->f(), dst->f(), rows, cols);
          dev.sync();
        });
      }
      xs.push_back(bytes);
      ys.push_back(us);
      cal.samples.push_back({fmt::format("memory.{}", mem_class_name(mc)), bytes, us});
    }
    LineFit f = fit_line(xs, ys);
    if (f.slope <= 0.0) f = fit_through_origin(xs, ys);  // as for the GEMMs
    MemFit& m = cal.profile.mem_fit(mc);
    m.alpha_us = f.intercept;
    m.gbps = 1e-3 / f.slope;
    m.r2 = f.r2;
    m.samples = f.samples;
    m.source = "measured";
    log("  memory {:<6} alpha {:8.2f} us  {:7.2f} GB/s per rank  r2 {:.4f}  [{} sizes]",
        mem_class_name(mc), m.alpha_us, m.gbps, m.r2, m.samples);
  }
}

// The GEMM fits are lines in the flop count: they need two different row counts (each
// class's shapes then differ in flops) and positive sizes.
void check_gemm_shapes(const CalibrateOptions& o) {
  const auto positive = [](const std::vector<int64_t>& v) {
    return !v.empty() && std::all_of(v.begin(), v.end(), [](int64_t x) { return x >= 1; });
  };
  PARM_CONFIG_CHECK(positive(o.gemm_rows) && positive(o.gemm_model_dims) &&
                        positive(o.gemm_hidden) && positive(o.gate_experts),
                    "calibrate: --gemm-rows {}, --gemm-model-dims {} and --gemm-hidden {} must "
                    "be lists of sizes >= 1",
                    fmt::join(o.gemm_rows, ","), fmt::join(o.gemm_model_dims, ","),
                    fmt::join(o.gemm_hidden, ","));
  const std::set<int64_t> rows(o.gemm_rows.begin(), o.gemm_rows.end());
  PARM_CONFIG_CHECK(rows.size() >= 2,
                    "calibrate: --gemm-rows {} needs at least two different row counts (the GEMM "
                    "rate is a line fitted over sizes), e.g. --gemm-rows 64,256,1024",
                    fmt::join(o.gemm_rows, ","));
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
  std::vector<LayerTimes> rendezvous;
  auto time_rendezvous = [&] {
    if (auto t = time_rendezvous_layer(topo, o)) rendezvous.push_back(*t);
  };
  time_rendezvous();
  // The eager limit first: the inter-node collectives' handshake is fitted as a step there.
  set_eager_limit(o, topo.nodes_emulated(), cal.profile.fused);
  bool has_intra = false, has_inter = false;
  log("collectives ({} to {} bytes per rank, x4 steps; {} iters):", o.min_bytes, o.max_bytes,
      o.iters);
  calibrate_collectives(topo, topo_options, o, dev, cal, log, has_intra, has_inter);
  // A machine with only one kind of link: the other is copied and marked "assumed".
  if (!has_intra || !has_inter) {
    const Link have = has_intra ? Link::kIntra : Link::kInter;
    const Link miss = has_intra ? Link::kInter : Link::kIntra;
    log("  no {}-node group in this layout: the {} entries copy the {} fit (source \"assumed\")",
        link_name(miss), link_name(miss), link_name(have));
    for (CommOp op : kModelOps) {
      CommFit f = cal.profile.collective(have, op);
      f.source = fmt::format("assumed (copied from {}: no {}-node group measured)",
                             link_name(have), link_name(miss));
      cal.profile.collective(miss, op) = f;
    }
  }
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
  calibrate_fused_layer(topo, topo_options, o, cal, log_fn);
  time_rendezvous();
  // Last: the eager shares above are measured against prices without a rendezvous (as the
  // sweeps that decided to apply it were priced: calibrate_rendezvous.cpp).
  log("collective after computation, inside the layer:");
  calibrate_rendezvous(topo, o, rendezvous, cal, log_fn);
  return cal;
}

}  // namespace parm::perfmodel
