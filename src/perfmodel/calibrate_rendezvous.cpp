#include "perfmodel/calibrate_rendezvous.h"

#include <algorithm>

#include <fmt/format.h>

#include "parm/stats.h"
#include "perfmodel/calibrate_layer.h"
#include "perfmodel/model.h"
#include "schedule/schedule.h"

namespace parm::perfmodel {

MoeShape rendezvous_calibration_shape(const Layout& l, int64_t hidden) {
  const int64_t E = 2 * static_cast<int64_t>(l.ep);
  const int64_t step = static_cast<int64_t>(l.mp) * E;
  const int64_t T = (1024 + step - 1) / step * step;
  return MoeShape::of(T, 64, hidden, E, 1, "1");
}

std::optional<RendezvousLayerTime> time_rendezvous_layer(Topology& topo,
                                                         const CalibrateOptions& o,
                                                         int64_t hidden) {
  // The layer here runs on the CPU over host memory (as calibrate_fused_layer).
  if (topo.device() != Device::kCpu ||
      topo.comm(Group::kWorld).memory_space() != MemorySpace::kHost)
    return std::nullopt;
  CalibrateOptions opts = o;
  if (hidden == kRendezvousHidden[2]) opts.iters = std::max(3, o.iters / 3);
  return RendezvousLayerTime{
      hidden, time_layer_pair(topo, rendezvous_calibration_shape(topo.layout(), hidden),
                              schedule::Kind::kS1, opts, false)};
}

bool intra_rendezvous_layout(const Topology& topo, const TopologyOptions& job,
                             TopologyOptions& out) {
  const int world = topo.layout().world, nodes = topo.num_nodes();
  if (nodes < 2 || world % nodes != 0 || (world / nodes) % 2 != 0) return false;
  out = job;
  out.mp = 2;
  out.ep = 2;
  out.esp = 1;
  out.pp = 1;
  out.order = kDefaultOrder;
  const Layout l = make_layout(world, out.mp, out.ep, out.esp, out.pp, out.order);
  std::vector<int> node_of(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) node_of[static_cast<size_t>(r)] = topo.node_of(r);
  for (Group g : {Group::kMp, Group::kEp})
    for (int r = 0; r < world; ++r)
      if (!group_is_intra_node(l, g, r, node_of)) return false;
  return true;
}

namespace {

// Which steps a per_compute of 1 is put on: those across the nodes, those within a node, or
// both (the measurement of one layout, where nothing else is known).
enum class Priced { kInter, kIntra, kBoth };

// The rendezvous' terms (model.h: fit_rendezvous) from the timings of the rendezvous layer
// on `topo` against cal.profile's prices, with the terms on the steps `which` names and the
// profile's own values elsewhere (0 for every line that is measured here). nullopt where the
// layer has no such step after computation or a size was not timed.
std::optional<RendezvousTerms> terms_of(Topology& topo, const CalibrateOptions& o,
                                        const std::vector<RendezvousLayerTime>& timings,
                                        const Profile& base, Priced which, Calibration& cal,
                                        const std::string& label,
                                        const std::function<void(const std::string&)>& log) {
  const Layout& l = topo.layout();
  const Target here = target_of(topo);
  const schedule::Kind kind = schedule::Kind::kS1;
  // The prices without the rendezvous being measured (and at the compute scale 1: the
  // compute steps are measured apart).
  Profile p0 = base;
  p0.layer_compute.scale = 1.0;
  if (which != Priced::kIntra) p0.step_sync = p0.step_sync_world = SyncFit{};
  if (which != Priced::kInter) p0.step_sync_intra = SyncFit{};
  // The layer priced with (us, per_compute) set to `t` on its steps, less none.
  auto priced_with = [&](const schedule::Schedule& sc, const MoeShape& shape, SyncFit t) {
    Profile p1 = p0;
    if (which != Priced::kIntra) p1.step_sync = p1.step_sync_world = t;
    if (which != Priced::kInter) p1.step_sync_intra = t;
    return predict(p1, sc, shape, here);
  };
  std::vector<RendezvousTiming> at[3];  // by kRendezvousHidden
  double steps = 0.0;
  for (size_t i = 0; i < timings.size(); ++i) {
    const MoeShape shape = rendezvous_calibration_shape(l, timings[i].hidden);
    const schedule::Schedule sc = schedule::build({shape, l, 0, false, o.chunks}, kind);
    const Prediction pr0 = predict(p0, sc, shape, here);
    SyncFit one;
    one.per_compute = 1.0;
    const Prediction at_one = priced_with(sc, shape, one);
    const double r1 = at_one.total_us() - pr0.total_us();
    // The compute before each step that pays it: that step's rendezvous at per_compute 1.
    std::vector<double> step_compute;
    for (const StepCost& c : at_one.steps)
      for (double v : {c.fwd_sync_us, c.bwd_sync_us})
        if (v > 0.0) step_compute.push_back(v);
    one = SyncFit{};
    one.us = 1.0;
    steps = priced_with(sc, shape, one).total_us() - pr0.total_us();
    if (r1 <= 0.0 || steps <= 0.0) return std::nullopt;
    const LayerTimes& t = timings[i].times;
    const double priced_compute = compute_steps_us(pr0);
    RendezvousTiming rt =
        rendezvous_timing(t.unfused_us, t.compute_us, pr0.total_us(), priced_compute, r1);
    for (double c : step_compute)
      rt.step_compute_us.push_back(priced_compute > 0.0 ? c * t.compute_us / priced_compute : 0.0);
    const auto size = std::find(std::begin(kRendezvousHidden), std::end(kRendezvousHidden),
                                timings[i].hidden);
    if (size == std::end(kRendezvousHidden)) continue;
    at[size - std::begin(kRendezvousHidden)].push_back(rt);
    const double x = static_cast<double>(timings[i].hidden);
    cal.samples.push_back({"layer.rendezvous" + label, x, t.unfused_us});
    cal.samples.push_back({"layer.rendezvous" + label + ".compute", x, t.compute_us});
    cal.samples.push_back({"layer.rendezvous" + label + ".excess", x, rt.excess_us});
    cal.samples.push_back({"layer.rendezvous" + label + ".at_one", x, rt.at_one_us});
    log(fmt::format(
        "  layer {} T={} M={} H={} E={} k=1 f=1, mp={} ep={} esp={}: measured {:.3f} ms, of it "
        "compute steps {:.3f} ms (slowest rank); priced without the rendezvous {:.3f} ms, "
        "compute {:.3f} ms; rest measured / priced {:.3f} / {:.3f} ms: excess {:.3f} ms over "
        "{:.0f} steps, the rendezvous at per_compute 1 {:.3f} ms (per_compute alone {:.3f})",
        schedule::kind_name(kind), shape.tokens, shape.model_dim, shape.hidden, shape.experts,
        l.mp, l.ep, l.esp, t.unfused_us / 1e3, t.compute_us / 1e3, pr0.total_us() / 1e3,
        priced_compute / 1e3, (t.unfused_us - t.compute_us) / 1e3,
        (pr0.total_us() - priced_compute) / 1e3, rt.excess_us / 1e3, steps,
        rt.at_one_us / 1e3,
        rendezvous_per_compute(t.unfused_us, t.compute_us, pr0.total_us(), priced_compute, r1)));
  }
  if (at[0].empty() || at[1].empty()) return std::nullopt;
  return fit_rendezvous(at[0], at[1], steps, at[2]);
}

std::string cap_text(const RendezvousTerms& t) {
  return t.compute_cap_us > 0.0 ? fmt::format("min(C, {:.1f} ms)", t.compute_cap_us / 1e3)
                                : std::string("C");
}

void set_sync(SyncFit& f, const RendezvousTerms& t, int64_t samples, const std::string& source) {
  f = SyncFit{};
  f.us = t.us;
  f.per_compute = t.per_compute;
  f.compute_cap_us = t.compute_cap_us;
  f.samples = samples;
  f.source = source;
}

}  // namespace

void calibrate_rendezvous(Topology& topo, const CalibrateOptions& o,
                          const std::vector<RendezvousLayerTime>& timings, Calibration& cal,
                          const std::function<void(const std::string&)>& log, Topology* intra,
                          const std::vector<RendezvousLayerTime>& intra_timings) {
  if (timings.empty()) {
    log("  rendezvous in the layer: not measured (the CPU over host memory only); 0");
    return;
  }
  const std::string source = topo.nodes_emulated() ? "emulated" : "measured";
  // Fitted through the medians of timings spread across the calibration. Until issue 42 only
  // per_compute was fitted, at one size, from the smallest (then the median) of three
  // timings: on 2 x 4 ranks of 2 shared cores the rendezvous within a node was mostly a fixed
  // cost per step (the layers of a sweep with four times the compute waited no longer), and
  // per_compute alone overpriced S1 by 14% there (docs/perfmodel.md, "Issue 42"). A profile,
  // a cluster file or reprice.py --rendezvous-per-compute may state other values.
  auto why = [&](const char* where, const RendezvousTerms& t, size_t n) {
    return fmt::format("{} (inside a layer{} at H {}, {} and {}, medians of {} timings each: "
                       "us {:.1f} per step + per_compute {:.3f} x {})",
                       source, where, kRendezvousHidden[0], kRendezvousHidden[1],
                       kRendezvousHidden[2], n / 3, t.us, t.per_compute, cap_text(t));
  };
  const int64_t samples = o.iters * static_cast<int64_t>(timings.size());
  bool have_intra = false;
  if (intra != nullptr && !intra_timings.empty()) {
    if (const auto t = terms_of(*intra, o, intra_timings, cal.profile, Priced::kIntra, cal,
                                ".intra", log)) {
      set_sync(cal.profile.step_sync_intra, *t, samples,
               why(" whose groups lie within a node", *t, intra_timings.size()));
      cal.samples.push_back({"layer.rendezvous.intra.us.applied", 0.0, t->us});
      cal.samples.push_back({"layer.rendezvous.intra.per_compute.applied", 0.0, t->per_compute});
      cal.samples.push_back(
          {"layer.rendezvous.intra.compute_cap_us.applied", 0.0, t->compute_cap_us});
      log(fmt::format("  within a node: us {:.1f} per step + per_compute {:.3f} x {} (applied "
                      "to the steps whose groups lie within a node)", t->us, t->per_compute,
                      cap_text(*t)));
      have_intra = true;
    }
  }
  const auto t = terms_of(topo, o, timings, cal.profile,
                          have_intra ? Priced::kInter : Priced::kBoth, cal, "", log);
  if (!t) {
    log("  rendezvous in the layer: not measured (no collective step after computation); 0");
    return;
  }
  cal.samples.push_back({"layer.rendezvous.us.applied", 0.0, t->us});
  cal.samples.push_back({"layer.rendezvous.per_compute.applied", 0.0, t->per_compute});
  cal.samples.push_back({"layer.rendezvous.compute_cap_us.applied", 0.0, t->compute_cap_us});
  set_sync(cal.profile.step_sync, *t, samples, why("", *t, timings.size()));
  set_sync(cal.profile.step_sync_world, *t, samples, why("", *t, timings.size()));
  if (!have_intra) set_sync(cal.profile.step_sync_intra, *t, samples, why("", *t, timings.size()));
  log(fmt::format("  us {:.1f} per step + per_compute {:.3f} x {} (applied to {})", t->us,
                  t->per_compute, cap_text(*t),
                  have_intra ? "the steps across the nodes" : "every step"));
}

}  // namespace parm::perfmodel
