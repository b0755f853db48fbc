#include "perfmodel/calibrate_layer.h"

#include <algorithm>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "moe/layer_check.h"
#include "moe/moe_layer.h"
#include "moe/reference_moe.h"
#include "parm/error.h"
#include "parm/stats.h"
#include "parm/timer.h"
#include "perfmodel/fit.h"
#include "perfmodel/measured_steps.h"
#include "perfmodel/model.h"

namespace parm::perfmodel {

namespace {

// The largest per-peer message of an inter-node alltoall of a fused step of `p` (bytes: bus
// bytes / (n - 1)), 0 if none.
double inter_fused_message(const Prediction& p, const Target& target) {
  double m = 0.0;
  for (const auto& s : p.steps)
    if (s.kind == schedule::StepKind::kFusedDispatch || s.kind == schedule::StepKind::kFusedCombine)
      for (const auto* parts : {&s.fwd_parts, &s.bwd_parts})
        for (const auto& part : *parts)
          if (part.link == Link::kInter && part.op == CommOp::kAllToAll)
            m = std::max(m, peer_message_bytes(group_span(target, part.group), part.bus_bytes));
  return m;
}

double total_us(const Profile& prof, const MoeShape& shape, const Target& target,
                schedule::Kind kind, bool fuse, int chunks) {
  const auto sc = schedule::build({shape, target.layout, 0, fuse, chunks}, kind);
  return predict(prof, sc, shape, target).total_us();
}

// The schedule whose fused steps carry an inter-node EP part on layout l: S1 where the ESP
// group has more than one rank (both steps fused), else S2 with its MP allgather joined to the
// combine (N_MP > 1); none (false) otherwise.
bool fused_kind(const Layout& l, schedule::Kind& kind) {
  if (l.ep < 2) return false;
  if (l.esp > 1) {
    kind = schedule::Kind::kS1;
    return true;
  }
  kind = schedule::Kind::kS2;
  return l.mp > 1;
}

// The profile a layer calibration prices against: compute scale 1, no eager gains, no
// rendezvous, no per-piece cost (each measured, or priced, on its own).
Profile plain_layer_profile(const Profile& prof) {
  Profile p = prof;
  p.layer_compute.scale = 1.0;
  p.fused.eager_gain = p.fused.eager_gain_mixed = 0.0;
  p.step_sync = p.step_sync_world = p.step_sync_intra = SyncFit{};
  p.fused.per_piece_us = 0.0;
  return p;
}

}  // namespace

LayerTimes time_layer_pair(Topology& topo, const MoeShape& shape, schedule::Kind kind,
                           const CalibrateOptions& o, bool fused_too) {
  const Layout& l = topo.layout();
  Communicator& world = topo.host_comm(Group::kWorld);
  const ref::MoeParams<float> params = ref::init_params<float>(shape, 1);
  const int group = group_coord(l, Group::kMp, topo.world_rank()).index;
  std::vector<float> x = check_input(shape, 1, group), dout = check_dout(shape, 1, group);
  const Tensor xt = Tensor::view(x.data(), {shape.tokens, shape.model_dim});
  const Tensor dt = Tensor::view(dout.data(), {shape.tokens, shape.model_dim});
  const size_t variants = fused_too ? 2 : 1;
  std::array<std::unique_ptr<MoeLayer>, 2> layers;
  for (int v = 0; v < static_cast<int>(variants); ++v) {
    layers[static_cast<size_t>(v)] = std::make_unique<MoeLayer>(topo, shape, kind, v == 1, o.chunks);
    layers[static_cast<size_t>(v)]->load_whole(params);
  }
  std::array<std::vector<double>, 2> t;
  std::vector<double> compute;
  const schedule::Schedule& sc = layers[0]->schedule();
  for (int it = 0; it < o.warmup + o.iters; ++it)
    for (size_t v = 0; v < variants; ++v) {
      layers[v]->zero_grad();
      world.barrier();
      const double t0 = now_us();
      layers[v]->forward(xt);
      layers[v]->backward(dt, 0.01f);
      if (it < o.warmup) continue;
      t[v].push_back(now_us() - t0);
      if (v == 0) compute.push_back(compute_us_of(sc, last_pass_step_us(*layers[0])));
    }
  LayerTimes out;
  out.tokens = shape.tokens;
  out.compute_us = median(max_over_ranks(world, compute));
  for (size_t v = 0; v < variants; ++v) {
    const std::vector<double> slowest = max_over_ranks(world, t[v]);
    (v == 0 ? out.unfused_us : out.fused_us) = median(slowest);
    if (slowest.size() < 2) continue;
    std::array<std::vector<double>, 2> half;
    for (size_t i = 0; i < slowest.size(); ++i) half[i % 2].push_back(slowest[i]);
    for (size_t h = 0; h < 2; ++h)
      (v == 0 ? out.unfused_half_us : out.fused_half_us)[h] = median(half[h]);
  }
  return out;
}

namespace {

// The share of the eligible bytes time that fusion saved in a measured layer pair, for the
// span class of its EP group (mixed: some rank has an EP peer on its own node):
//     gain = (p_fused0 - p_unfused - (t_fused - t_unfused)) / S,  bounded to [0, 1]
// with S what that share at 1 would save. Returns false (and says why) where nothing of the
// layer is eligible.
bool gain_of(const Profile& base, const MoeShape& shape, const Target& here, schedule::Kind kind,
             int W, const LayerTimes& t, bool mixed, double& gain, std::string& why,
             const std::function<void(const std::string&)>& log) {
  Profile prof = base;
  prof.fused.eager_gain = prof.fused.eager_gain_mixed = 0.0;
  const double p_u = total_us(prof, shape, here, kind, false, W);
  const double p_f0 = total_us(prof, shape, here, kind, true, W);
  (mixed ? prof.fused.eager_gain_mixed : prof.fused.eager_gain) = 1.0;
  const double eligible = p_f0 - total_us(prof, shape, here, kind, true, W);
  const double m = inter_fused_message(
      predict(prof, schedule::build({shape, here.layout, 0, true, W}, kind), shape, here), here);
  if (eligible <= 0.0) {
    why = fmt::format("no inter-node part of the calibration layer above the limit (message "
                      "{:.0f} bytes)", m);
    return false;
  }
  if (!eager_gain_measurable(eligible, t.unfused_us)) {
    why = fmt::format("what gain 1 saves, {:.3f} ms, is under {:.0f}% of the measured layer's "
                      "{:.3f} ms: timing noise would decide it", eligible / 1e3,
                      100 * kMinEligibleShare, t.unfused_us / 1e3);
    log("  " + why);
    return false;
  }
  const double raw = (p_f0 - p_u - (t.fused_us - t.unfused_us)) / eligible;
  gain = std::clamp(raw, 0.0, 1.0);
  const Layout& l = here.layout;
  log(fmt::format(
      "  {} fused, mp={} ep={} esp={} (EP peers {}), T={} ({:.0f} bytes per inter-node peer "
      "message, pieces {:.0f}; eager limit {:.0f}): measured unfused {:.3f} ms, fused {:.3f} "
      "ms; priced without the gain {:.3f} / {:.3f} ms, at gain 1 {:.3f} ms less: eager gain{} "
      "{:.3f} ({:.3f} before bounding to [0, 1])",
      schedule::kind_name(kind), l.mp, l.ep, l.esp,
      mixed ? "on this node and others" : "all on other nodes", t.tokens, m, m / W,
      prof.fused.eager_limit_bytes, t.unfused_us / 1e3, t.fused_us / 1e3, p_u / 1e3, p_f0 / 1e3,
      eligible / 1e3, mixed ? " (mixed)" : "", gain, raw));
  return true;
}

// The layout, beside `here`'s, whose EP group spans the nodes with peers on a rank's own node
// too: EP = 2 x nodes, ESP = ranks per node / 2 (N_MP = ESP, or 2 where ESP = 1). False where
// the nodes hold an odd number of ranks.
bool mixed_layout(const Topology& topo, TopologyOptions& out) {
  const int world = topo.layout().world, nodes = topo.num_nodes();
  if (nodes < 2 || world % nodes != 0 || (world / nodes) % 2 != 0) return false;
  out.ep = 2 * nodes;
  out.esp = world / nodes / 2;
  out.mp = out.esp > 1 ? out.esp : 2;
  out.pp = 1;
  out.order = kDefaultOrder;
  return true;
}

}  // namespace

bool eager_gain_measurable(double eligible_us, double unfused_us) {
  return eligible_us > 0.0 && unfused_us > 0.0 && eligible_us >= kMinEligibleShare * unfused_us;
}

MoeShape eager_calibration_shape(const Layout& l, double eager_limit_bytes) {
  PARM_CHECK(eager_limit_bytes > 0.0, "eager calibration shape for an eager limit of {} bytes",
             eager_limit_bytes);
  const int64_t E = 2 * static_cast<int64_t>(l.ep);
  const int64_t step = static_cast<int64_t>(l.mp) * E;
  // S1: T / N_MP tokens per rank, C1 = T / (N_MP E) slots per expert at k = f = 1; an EP peer
  // gets its E / N_EP experts' slots, (E / N_EP) C1 M floats.
  const double per_token = static_cast<double>(E / l.ep) * 256.0 * sizeof(float) /
                           static_cast<double>(step);
  int64_t T = step;
  while (static_cast<double>(T) * per_token < 2.0 * eager_limit_bytes) T += step;
  return MoeShape::of(T, 256, 256, E, 1, "1");
}

std::optional<MoeShape> overlap_calibration_shape(const Profile& prof, const Target& here,
                                                  int chunks) {
  const Layout& l = here.layout;
  schedule::Kind kind = schedule::Kind::kS1;
  if (!fused_kind(l, kind) || chunks < 2) return std::nullopt;
  const double limit = prof.fused.eager_limit_bytes > 0.0 ? prof.fused.eager_limit_bytes : 65536.0;
  const MoeShape first = eager_calibration_shape(l, chunks * limit);
  Profile p = plain_layer_profile(prof);
  for (int64_t f = 1; f <= kOverlapShapeGrowth; f *= 2) {
    const MoeShape shape = MoeShape::of(first.tokens * f, first.model_dim, first.hidden,
                                        first.experts, first.topk, "1");
    const double unfused = total_us(p, shape, here, kind, false, chunks);
    p.fused.overlap = 0.0;
    const double at0 = total_us(p, shape, here, kind, true, chunks);
    p.fused.overlap = 1.0;
    const double at1 = total_us(p, shape, here, kind, true, chunks);
    if (at0 - at1 >= kMinEligibleShare * unfused) return shape;
  }
  return std::nullopt;
}

bool bound_unmeasured_overlap(FusedFit& ff, const FusedAlone& alone, double fused_us,
                              double unfused_us, int chunks) {
  if (alone.sizes_with_gain > 0 || alone.overlap_in_layer || fused_us < unfused_us) return false;
  ff.overlap = 0.0;
  ff.per_piece_us =
      overlap_per_piece_us(alone.measured, alone.unfused, alone.pipelined, chunks, 0.0);
  if (!alone.measured.empty())
    ff.r2 = overlap_r2(alone.measured, alone.unfused, alone.pipelined, chunks, 0.0,
                       ff.per_piece_us);
  ff.source += fmt::format(
      "; overlap 0, not the fallback 1: measured nowhere, and the calibration layer ran fused "
      "at {:.3f}x unfused (per piece refitted at 0)",
      unfused_us > 0.0 ? fused_us / unfused_us : 0.0);
  return true;
}

double layer_overlap(double measured_us, const std::function<double(double)>& priced_us) {
  // Priced beyond measured: decreasing in ov (more overlap, a cheaper fused layer).
  auto excess = [&](double ov) { return priced_us(ov) - measured_us; };
  if (excess(0.0) <= 0.0) return 0.0;
  if (excess(1.0) >= 0.0) return 1.0;
  double lo = 0.0, hi = 1.0;
  for (int i = 0; i < 50; ++i) {
    const double mid = 0.5 * (lo + hi);
    (excess(mid) > 0.0 ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

double supported_layer_overlap(const LayerTimes& t,
                               const std::function<double(double)>& priced_us) {
  if (std::min({t.unfused_half_us[0], t.unfused_half_us[1], t.fused_half_us[0],
                t.fused_half_us[1]}) <= 0.0)
    return layer_overlap(t.fused_us - t.unfused_us, priced_us);
  return std::min(layer_overlap(t.fused_half_us[0] - t.unfused_half_us[0], priced_us),
                  layer_overlap(t.fused_half_us[1] - t.unfused_half_us[1], priced_us));
}

void calibrate_overlap_in_layer(Topology& topo, const CalibrateOptions& o, Calibration& cal,
                                const std::function<void(const std::string&)>& log) {
  FusedFit& ff = cal.profile.fused;
  const FusedAlone& alone = cal.fused_alone;
  if (topo.device() != Device::kCpu ||
      topo.comm(Group::kWorld).memory_space() != MemorySpace::kHost)
    return;
  const Target here = target_of(topo);
  const int W = o.chunks;
  schedule::Kind kind = schedule::Kind::kS1;
  const bool has_fused = fused_kind(here.layout, kind);
  const std::optional<MoeShape> found = overlap_calibration_shape(cal.profile, here, W);
  if (!has_fused || !found) {
    log(fmt::format("  overlap in the layer: not measured (no layer up to {}x the tokens of the "
                    "first where overlap 1 would save {:.0f}% of it); the fused collectives "
                    "alone's {:.3f} stays, {}",
                    kOverlapShapeGrowth, 100 * kMinEligibleShare, ff.overlap, ff.source));
    return;
  }
  const MoeShape& shape = *found;
  const LayerTimes t = time_layer_pair(topo, shape, kind, o, true);
  const std::string name = fmt::format("layer.overlap.{}", schedule::kind_name(kind));
  const double x = static_cast<double>(shape.tokens);
  cal.samples.push_back({name, x, t.unfused_us});
  cal.samples.push_back({name + "+fused", x, t.fused_us});
  const Profile plain = plain_layer_profile(cal.profile);
  const double unfused = total_us(plain, shape, here, kind, false, W);
  auto per_piece = [&](double ov) {
    return overlap_per_piece_us(alone.measured, alone.unfused, alone.pipelined, W, ov);
  };
  // The fused layer's price at overlap ov, the per-piece cost refitted to the fused
  // collectives alone at that overlap.
  auto fused_at = [&](double ov) {
    Profile p = plain;
    p.fused.overlap = ov;
    p.fused.per_piece_us = per_piece(ov);
    return total_us(p, shape, here, kind, true, W);
  };
  const auto priced = [&](double v) { return fused_at(v) - unfused; };
  const double ov = supported_layer_overlap(t, priced);
  ff.overlap = ov;
  ff.per_piece_us = per_piece(ov);
  cal.fused_alone.overlap_in_layer = true;
  ff.source = fmt::format(
      "{} (overlap in the layer, {} T={} M={} H={} E={} k=1; per piece from the fused "
      "collectives alone at that overlap, where {} of their sizes had a gain to measure)",
      topo.nodes_emulated() ? "emulated" : "measured", schedule::kind_name(kind), shape.tokens,
      shape.model_dim, shape.hidden, shape.experts, alone.sizes_with_gain);
  if (!alone.measured.empty())
    ff.r2 = overlap_r2(alone.measured, alone.unfused, alone.pipelined, W, ov, ff.per_piece_us);
  cal.samples.push_back({"layer.overlap", x, ov});
  const Layout& l = here.layout;
  log(fmt::format(
      "  overlap in the layer: {} mp={} ep={} esp={} T={} M={} H={} E={} k=1 f=1, measured "
      "unfused {:.3f} ms, fused {:.3f} ms (even rounds {:.3f} / {:.3f}, odd {:.3f} / {:.3f}); "
      "priced unfused {:.3f} ms, fused at overlap 0 / 1 {:.3f} / {:.3f} ms: overlap {:.3f} "
      "(all rounds {:.3f}; the smaller of the halves'), per piece {:.2f} us",
      schedule::kind_name(kind), l.mp, l.ep, l.esp, shape.tokens, shape.model_dim, shape.hidden,
      shape.experts, t.unfused_us / 1e3, t.fused_us / 1e3, t.unfused_half_us[0] / 1e3,
      t.fused_half_us[0] / 1e3, t.unfused_half_us[1] / 1e3, t.fused_half_us[1] / 1e3,
      unfused / 1e3, fused_at(0.0) / 1e3, fused_at(1.0) / 1e3, ov,
      layer_overlap(t.fused_us - t.unfused_us, priced), ff.per_piece_us));
}

void calibrate_fused_layer(Topology& topo, const TopologyOptions& topo_options,
                           const CalibrateOptions& o, Calibration& cal,
                           const std::function<void(const std::string&)>& log) {
  FusedFit& ff = cal.profile.fused;
  ff.eager_gain = ff.eager_gain_mixed = 0.0;
  const Layout& l = topo.layout();
  const Target here = target_of(topo);
  auto no_gain = [&](const std::string& why) {
    ff.eager_gain_source = ff.eager_gain_mixed_source = "assumed 0 (" + why + ")";
    log(fmt::format("  eager gain: not measured ({}); 0", why));
  };
  // The layer here runs on the CPU over host memory (a topology that stages "device" buffers
  // refuses the layer's host buffers).
  if (topo.device() != Device::kCpu ||
      topo.comm(Group::kWorld).memory_space() != MemorySpace::kHost) {
    cal.profile.layer_compute.source = "assumed 1 (measured on the CPU over host memory only)";
    return no_gain("measured on the CPU over host memory only");
  }
  // Without an eager limit the shape still needs one to size itself: Open MPI's TCP default.
  const double size_limit = ff.eager_limit_bytes > 0.0 ? ff.eager_limit_bytes : 65536.0;
  const MoeShape shape = eager_calibration_shape(l, size_limit);
  const int W = o.chunks;
  schedule::Kind kind = schedule::Kind::kS1;
  const bool has_fused = fused_kind(l, kind);
  const LayerTimes t = time_layer_pair(topo, shape, kind, o, true);
  const std::string name = fmt::format("layer.{}", schedule::kind_name(kind));
  const double x = static_cast<double>(shape.tokens);
  cal.samples.push_back({name, x, t.unfused_us});
  cal.samples.push_back({name + "+fused", x, t.fused_us});
  cal.samples.push_back({name + ".compute", x, t.compute_us});
  const std::string source = topo.nodes_emulated() ? "emulated" : "measured";
  // Before the gains are fitted against it: the overlap they price with. Only where the EP
  // group crosses nodes: within one node the stages share one link class, the model's
  // pipeline never gains, and the fallback prices nothing.
  if (has_fused && group_link(here, Group::kEp) == Link::kInter &&
      bound_unmeasured_overlap(ff, cal.fused_alone, t.fused_us, t.unfused_us, W))
    log(fmt::format("  overlap: measured nowhere, and this layer ran fused at {:.3f}x unfused "
                    "({:.3f} / {:.3f} ms): 0, not the fallback 1; per piece {:.2f} us at 0",
                    t.fused_us / t.unfused_us, t.fused_us / 1e3, t.unfused_us / 1e3,
                    ff.per_piece_us));

  // The compute scale: the measured compute steps over their price at scale 1 (the same
  // steps, balanced router).
  Profile prof = cal.profile;
  prof.layer_compute.scale = 1.0;
  const schedule::Schedule sc = schedule::build({shape, l, 0, false, W}, kind);
  const Prediction p1 = predict(prof, sc, shape, here);
  const double priced = compute_steps_us(p1);
  // Recorded (the sample and the log), not applied: on this small layer the ratio came out
  // 0.59-0.66 on all four quiet cluster sweeps of 2026-12-02, and pricing those sweeps with
  // it put the median error at 29-44% against 13-18% at 1, with no better choice
  // (docs/perfmodel.md, "Issue 20, fifth round"): a layer this small runs from cache and
  // does not stand for the sweep's layers. The scale stays 1, assumed; a profile or cluster
  // file may still state one.
  const double ratio = priced > 0.0 ? t.compute_us / priced : 1.0;
  cal.samples.push_back({name + ".compute_over_price", x, ratio});
  ComputeScale& cs = cal.profile.layer_compute;
  cs.scale = 1.0;
  cs.source = fmt::format("assumed 1 (the calibration layer measured {:.3f}, not applied)", ratio);
  prof.layer_compute = cs;
  log(fmt::format("  layer {} T={} M=256 H=256 E={} k=1 f=1: compute steps {:.3f} ms measured "
                  "(slowest rank), {:.3f} ms priced from the products and kernels timed alone: "
                  "ratio {:.3f}, recorded, not applied (compute scale 1)",
                  schedule::kind_name(kind), shape.tokens, shape.experts, t.compute_us / 1e3,
                  priced / 1e3, ratio));

  if (ff.eager_limit_bytes <= 0.0) return no_gain("no eager limit");
  if (W < 2) return no_gain("one chunk: nothing is cut into pieces");
  // One share per span class of the EP group (model.h): [0] all peers on other nodes, [1]
  // mixed. This layout measures its own class; a second layout the mixed one.
  const std::array<double*, 2> share{&ff.eager_gain, &ff.eager_gain_mixed};
  const std::array<std::string*, 2> share_source{&ff.eager_gain_source,
                                                 &ff.eager_gain_mixed_source};
  const std::array<const char*, 2> key{"eager_gain", "eager_gain_mixed"};
  std::array<bool, 2> have{false, false};
  std::array<std::string, 2> why{"no inter-node EP group of that span in the layouts measured",
                                 "no inter-node EP group of that span in the layouts measured"};
  auto record = [&](bool mixed, double g) {
    *share[mixed] = g;
    *share_source[mixed] = source;
    have[mixed] = true;
  };
  double g = 0.0;
  if (has_fused && group_link(here, Group::kEp) == Link::kInter) {
    const bool mixed = group_span(here, Group::kEp).intra_share > 0.0;
    if (gain_of(prof, shape, here, kind, W, t, mixed, g, why[mixed], log)) record(mixed, g);
  }
  TopologyOptions mo = topo_options;
  if (!have[1] && mixed_layout(topo, mo)) {
    auto mt = Topology::create(mo);
    const Target mhere = target_of(*mt);
    schedule::Kind mk = schedule::Kind::kS1;
    if (fused_kind(mt->layout(), mk) && group_link(mhere, Group::kEp) == Link::kInter &&
        group_span(mhere, Group::kEp).intra_share > 0.0) {
      const MoeShape ms = eager_calibration_shape(mt->layout(), size_limit);
      const LayerTimes mtimes = time_layer_pair(*mt, ms, mk, o, true);
      const std::string mname = fmt::format("layer.mixed.{}", schedule::kind_name(mk));
      cal.samples.push_back({mname, static_cast<double>(ms.tokens), mtimes.unfused_us});
      cal.samples.push_back({mname + "+fused", static_cast<double>(ms.tokens), mtimes.fused_us});
      if (gain_of(prof, ms, mhere, mk, W, mtimes, true, g, why[1], log)) record(true, g);
    }
  }
  for (int c = 0; c < 2; ++c) {
    if (have[c]) continue;
    const int other = 1 - c;
    if (have[other]) {
      *share[c] = *share[other];
      *share_source[c] = fmt::format("assumed (copied from {}: {})", key[other], why[c]);
      log(fmt::format("  {}: not measured ({}); copied from {}", key[c], why[c], key[other]));
    } else {
      *share_source[c] = "assumed 0 (" + why[c] + ")";
      log(fmt::format("  {}: not measured ({}); 0", key[c], why[c]));
    }
  }
}

}  // namespace parm::perfmodel
