#include "perfmodel/calibrate_rendezvous.h"

#include <fmt/format.h>

#include "perfmodel/calibrate_layer.h"
#include "perfmodel/model.h"
#include "schedule/schedule.h"

namespace parm::perfmodel {

MoeShape rendezvous_calibration_shape(const Layout& l) {
  const int64_t E = 2 * static_cast<int64_t>(l.ep);
  const int64_t step = static_cast<int64_t>(l.mp) * E;
  const int64_t T = (1024 + step - 1) / step * step;
  return MoeShape::of(T, 256, 1024, E, 1, "1");
}

void calibrate_rendezvous(Topology& topo, const CalibrateOptions& o, Calibration& cal,
                          const std::function<void(const std::string&)>& log) {
  // The layer here runs on the CPU over host memory (as calibrate_fused_layer).
  if (topo.device() != Device::kCpu ||
      topo.comm(Group::kWorld).memory_space() != MemorySpace::kHost) {
    log("  rendezvous in the layer: not measured (the CPU over host memory only); 0");
    return;
  }
  const Layout& l = topo.layout();
  const Target here = target_of(topo);
  const MoeShape shape = rendezvous_calibration_shape(l);
  const schedule::Kind kind = schedule::Kind::kS1;
  const schedule::Schedule sc = schedule::build({shape, l, 0, false, o.chunks}, kind);
  // The prices without a rendezvous (and at the compute scale 1: the compute steps are
  // measured apart), then with per_compute 1 on every collective step: R1.
  Profile p0 = cal.profile;
  p0.step_sync = p0.step_sync_world = SyncFit{};
  p0.layer_compute.scale = 1.0;
  const Prediction pr0 = predict(p0, sc, shape, here);
  Profile p1 = p0;
  p1.step_sync.per_compute = p1.step_sync_world.per_compute = 1.0;
  const double r1 = predict(p1, sc, shape, here).total_us() - pr0.total_us();
  if (r1 <= 0.0) {
    log("  rendezvous in the layer: not measured (no collective step after computation); 0");
    return;
  }
  const LayerTimes t = time_layer_pair(topo, shape, kind, o, false);
  const double priced_compute = compute_steps_us(pr0);
  const double pc =
      rendezvous_per_compute(t.unfused_us, t.compute_us, pr0.total_us(), priced_compute, r1);
  const double x = static_cast<double>(shape.tokens);
  cal.samples.push_back({"layer.rendezvous", x, t.unfused_us});
  cal.samples.push_back({"layer.rendezvous.compute", x, t.compute_us});
  cal.samples.push_back({"layer.rendezvous.per_compute", x, pc});
  // Recorded (the sample, the source and the log), not applied: measured under the load of
  // the moment it came out 0.24-1.52 on the four clusters (2026-12-02, other sessions
  // running), and priced with it the quiet sweeps' median error fell on two (2 x 2 10 Gbit/s
  // 23.8 -> 9.2%, one machine 23.4 -> 18.3%) and rose on two (2 x 2 1 Gbit/s 17.1 -> 27.0%,
  // 2 x 4 23.9 -> 86.2%; docs/perfmodel.md, "Issue 20, ninth round"). Quiet, each sweep run
  // right after its own calibration (two sets of four), its value lowered the error on six
  // and raised it on two (2 x 2 1 Gbit/s 14.0 -> 29.2%, 2 x 4 24.5 -> 70.2% at 1.77): one
  // layer's value is not stable enough to price every layer. A profile, a cluster file or
  // reprice.py --rendezvous-per-compute may state one.
  const std::string source = topo.nodes_emulated() ? "emulated" : "measured";
  for (SyncFit* f : {&cal.profile.step_sync, &cal.profile.step_sync_world}) {
    *f = SyncFit{};
    f->samples = o.iters;
    f->source = fmt::format("assumed 0 (the layer {} per_compute {:.3f}, not applied)", source, pc);
  }
  log(fmt::format(
      "  layer {} T={} M={} H={} E={} k=1 f=1, mp={} ep={} esp={}: measured {:.3f} ms, of it "
      "compute steps {:.3f} ms (slowest rank); priced without the rendezvous {:.3f} ms, compute "
      "{:.3f} ms; rest measured / priced {:.3f} / {:.3f} ms; the rendezvous at per_compute 1 "
      "{:.3f} ms: per_compute {:.3f}, recorded, not applied (0)",
      schedule::kind_name(kind), shape.tokens, shape.model_dim, shape.hidden, shape.experts,
      l.mp, l.ep, l.esp, t.unfused_us / 1e3, t.compute_us / 1e3, pr0.total_us() / 1e3,
      priced_compute / 1e3, (t.unfused_us - t.compute_us) / 1e3,
      (pr0.total_us() - priced_compute) / 1e3, r1 / 1e3, pc));
}

}  // namespace parm::perfmodel
