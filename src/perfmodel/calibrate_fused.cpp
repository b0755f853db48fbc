#include "perfmodel/calibrate_fused.h"

#include <array>

#include "comm/fused.h"
#include "comm/fused_plan.h"
#include "parm/error.h"
#include "perfmodel/fit.h"
#include "perfmodel/model.h"

namespace parm::perfmodel {

// Open MPI's limit counts the message's header (ob1's match header is 14 bytes), so a payload
// of exactly the limit goes by rendezvous: the payload limit is taken 64 bytes below.
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

// The stages' measured times t_i give the model's per-piece times c_i (piece_cost: alpha_i and
// the piece's handshake, plus 1/W of the rest), hence its unfused and pipelined totals
// (model.h); the overlap is the median over sizes of (unfused - t_fused) / (unfused -
// pipelined) in [0, 1], per_piece_us the median of what is left, per piece beyond the first.
// The fused call and its stages are timed interleaved, so that load changes hit them alike.
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
  for (int64_t bytes : collective_sizes(o)) {
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
      // Dispatch: a (N_EP, block) -> b (N_ESP, N_EP, block); combine: b -> a.
      float* in = dispatch ? a : b;
      float* out = dispatch ? b : a;
      const fused_plan::Description& d = fused_plan::describe(
          dispatch ? fused_plan::Pipeline::kDispatch : fused_plan::Pipeline::kCombine);
      PARM_CHECK(d.num_stages == 2, "calibrate times the two stages of fused {}, not {}", d.name,
                 d.num_stages);
      auto stage = [&](int j) -> const fused_plan::Stage& {
        return d.stages[static_cast<size_t>(j)];
      };
      auto comm_of = [&](const fused_plan::Stage& st) -> Communicator& {
        return st.group == fused_plan::Role::kEp ? ep : esp;
      };
      const auto [f, p1, p2] = time_three_interleaved(world, o.warmup, o.iters, [&](int v) {
        if (v == 0) {
          if (dispatch) fused_dispatch(ep, esp, in, out, block, W);
          else fused_combine(esp, ep, in, out, block, W);
        } else {  // stage 0: in -> mid, stage 1: mid -> out
          const fused_plan::Stage& st = stage(v - 1);
          fused_plan::run_unfused_stage(st, comm_of(st), v == 1 ? in : mid, v == 1 ? mid : out,
                                        n_ep, block);
        }
        dev.sync();
      });
      const std::array<double, 2> part_us = {p1, p2};
      std::vector<double> c, alphas;
      std::vector<Link> links;
      double bus = 0.0;
      bool eager_regime = false;
      for (int j = 0; j < 2; ++j) {
        const fused_plan::Stage& st = stage(j);
        const bool on_ep = st.group == fused_plan::Role::kEp;
        const GroupSpan& span = on_ep ? ep_span : esp_span;
        const double stage_bus =
            fused_plan::stage_bus_bytes(st, on_ep ? n_ep : n_esp, n_ep, block);
        const PieceCost pc =
            piece_cost(prof, st.records, span, stage_bus, part_us[static_cast<size_t>(j)], W);
        c.push_back(pc.piece_us);
        alphas.push_back(pc.latency_us);
        links.push_back(span.link);
        bus += stage_bus;
        // An inter-node part whose whole per-peer message waits for its receiver (above the
        // eager limit) while its pieces' do not: fusion saves that wait as well, a saving the
        // model prices apart (eager_saving_us, its share fitted in the layer) and the overlap
        // must not take for its own.
        const double m = peer_message_bytes(span, stage_bus);
        eager_regime = eager_regime || (span.link == Link::kInter && pieces_go_eager(ff, m, W));
      }
      const double s0 = fused_us(c, alphas, links, W, 0.0);  // the stages in sequence
      const double s1 = fused_us(c, alphas, links, W, 1.0);
      log("    {} {:.0f} bus bytes: fused {:.1f} us, parts {:.1f} us; priced in sequence {:.1f}, "
          "pipelined {:.1f}{}",
          dispatch ? "dispatch" : "combine", bus, f, p1 + p2, s0, s1,
          eager_regime ? "  (pieces eager, the whole not: left to the eager gain)" : "");
      if (!eager_regime) {
        meas.push_back(f);
        serial.push_back(s0);
        piped.push_back(s1);
      }
      cal.samples.push_back({dispatch ? "fused.dispatch" : "fused.combine", bus, f});
      cal.samples.push_back({dispatch ? "fused.dispatch_parts" : "fused.combine_parts", 0.0,
                             p1 + p2});
    }
  }
  const OverlapFit of = fit_overlap(meas, serial, piped, W);
  cal.fused_alone = {meas, serial, piped, of.sizes_used};
  ff.overlap = of.overlap;
  ff.per_piece_us = of.per_piece_us;
  std::vector<double> ratios(meas.size());
  for (size_t i = 0; i < meas.size(); ++i) ratios[i] = meas[i] / serial[i];
  ff.r2 = overlap_r2(meas, serial, piped, W, ff.overlap, ff.per_piece_us);
  ff.samples = static_cast<int64_t>(meas.size());
  ff.source = topo.nodes_emulated() ? "emulated" : "measured";
  log("  fused dispatch+combine on ep ({} ranks, {}) x esp ({} ranks, {}), {} chunks: overlap "
      "{:.3f} (median of {} sizes {:.3f}, bounded to [0, 1]), per piece {:.2f} us, r2 {:.4f}  "
      "[{} samples outside the eager regime]; fused / parts in sequence: median {:.3f}",
      n_ep, link_name(ep_link), n_esp, link_name(esp_link), W, ff.overlap, of.sizes_used, of.raw,
      ff.per_piece_us, ff.r2, ff.samples, ratios.empty() ? 0.0 : median(ratios));
}

}  // namespace parm::perfmodel
