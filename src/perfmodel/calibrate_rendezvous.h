// The rendezvous (model.h: step_sync, step_sync_world) measured where it happens: inside the
// MoE layer. Where ranks share cores, a rank that reaches a collective step waits for peers
// that were descheduled during the computation before it, so the layer's time outside its
// compute steps grows with that computation; collectives timed back to back never see it.
// The bench-layer --sweep split (docs/perfmodel.md, "Issue 20, ninth round") put the
// sweeps' common factor there: the compute steps ran at about their price, the rest at
// 1.5-6x.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "shape/shape.h"
#include "parm/topology.h"
#include "perfmodel/calibrate.h"
#include "perfmodel/calibrate_layer.h"

namespace parm::perfmodel {

// The layer calibrate times for the rendezvous on `layout`: a sweep-sized layer whose time
// outside its compute steps is mostly waiting, not bytes (the term is what is left of that
// time beyond its price, so an error in the bytes' price must stay small next to it): M =
// 64, H = `hidden` (4096: the expert products of M 256 H 1024 with a quarter of their bytes on
// the wire; twelfth round), E = 2 N_EP, k = 1, f = 1, T = 1024 rounded up to N_MP x E.
// Timed at each kRendezvousHidden, 4x the compute apart with the same steps and bytes: the
// two smaller sizes part the fixed cost per step from the share of the compute, the largest
// (a sweep layer's compute per step; timed with a third of the iterations) finds where the
// wait stops growing with the compute (model.h: fit_rendezvous, compute_cap_us).
inline constexpr int64_t kRendezvousHidden[3] = {1024, 4096, 16384};  // small, large, largest
MoeShape rendezvous_calibration_shape(const Layout& layout, int64_t hidden = 4096);

// calibrate times the rendezvous layer (at each size) three times, spread across the
// calibration (first, after the GEMM and memory kernels, last), and fits the medians of each
// size (model.h: fit_rendezvous). One timing alone caught slow phases of shared cores: on 2 x
// 2 at 1 Gbit/s one calibration measured 1.076 where two earlier the same day measured 0.062
// and 0.257, and its sweep's error rose from 15.9% at 0 to 23.4% (docs/perfmodel.md, "Issue
// 20, twelfth round").
struct RendezvousLayerTime {
  int64_t hidden = 0;  // of rendezvous_calibration_shape
  LayerTimes times;
};

// One timing of rendezvous_calibration_shape(hidden)'s layer (collective): S1 unfused,
// forward + backward, median over options.iters (a third of them, at least 3, at the largest
// size) of the slowest rank, its compute steps by the
// executor's step timers. Priced later (calibrate_rendezvous), so it may run before any
// other term is measured. nullopt (and nothing run) on a device other than the CPU or over
// other than host memory: the term is measured only there.
std::optional<RendezvousLayerTime> time_rendezvous_layer(Topology& topo,
                                                         const CalibrateOptions& options,
                                                         int64_t hidden);

// The layout for the rendezvous of steps within a node (model.h: step_sync_intra), beside
// the job's own: mp 2, ep 2, esp 1 (the layer's world is two consecutive ranks; the rest is
// data parallel), taken where the job spans nodes of an even number of ranks each and every
// group of that layout lies within a node. False otherwise (one node: the job's own layout
// measures every step).
bool intra_rendezvous_layout(const Topology& topo, const TopologyOptions& job, TopologyOptions& out);

// Sets the rendezvous' us, per_compute and compute_cap_us from `timings`
// (time_rendezvous_layer's, at each size): each one's excess, rendezvous at per_compute 1
// and compute per step that pays it against the layer priced by
// cal.profile (whose other terms must be calibrated already) without a rendezvous, then
// fit_rendezvous (model.h), set on both step_sync and step_sync_world (source "measured
// (inside the layer at H 1024, 4096 and 16384, medians of N timings each: ...)", "emulated" on
// emulated nodes), with the samples layer.rendezvous.excess / .at_one (one per timing, x the
// hidden size) and layer.rendezvous.us.applied / .per_compute.applied / .compute_cap_us.applied.
// With no timings
// (another device), or where the layout has no collective step after computation, both stay as
// they are (0, assumed).
// With `intra` (the topology of intra_rendezvous_layout) and its timings, step_sync_intra
// is measured first on it (every collective step there lies within a node), and the job's
// own timings then price their steps within a node at it and set step_sync and
// step_sync_world from the rest; without, all three get the job's value.
void calibrate_rendezvous(Topology& topo, const CalibrateOptions& options,
                          const std::vector<RendezvousLayerTime>& timings, Calibration& cal,
                          const std::function<void(const std::string&)>& log,
                          Topology* intra = nullptr,
                          const std::vector<RendezvousLayerTime>& intra_timings = {});

}  // namespace parm::perfmodel
