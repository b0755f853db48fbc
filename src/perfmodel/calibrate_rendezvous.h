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
// 64, H = 4096 (the expert products of M 256 H 1024 with a quarter of their bytes on the
// wire; twelfth round), E = 2 N_EP, k = 1, f = 1, T = 1024 rounded up to N_MP x E.
MoeShape rendezvous_calibration_shape(const Layout& layout);

// calibrate times the rendezvous layer three times, spread across the calibration (first,
// after the GEMM and memory kernels, last), and applies the smallest of their per_compute.
// One timing alone caught slow phases of shared cores: on 2 x 2 at 1 Gbit/s one calibration
// measured 1.076 where two earlier the same day measured 0.062 and 0.257, and its sweep's
// error rose from 15.9% at 0 to 23.4% (docs/perfmodel.md, "Issue 20, twelfth round").

// One timing of rendezvous_calibration_shape's layer (collective): S1 unfused, forward +
// backward, median over options.iters of the slowest rank, its compute steps by the
// executor's step timers. Priced later (calibrate_rendezvous), so it may run before any
// other term is measured. nullopt (and nothing run) on a device other than the CPU or over
// other than host memory: the term is measured only there.
std::optional<LayerTimes> time_rendezvous_layer(Topology& topo, const CalibrateOptions& options);

// Sets the rendezvous' per_compute from `timings` (time_rendezvous_layer's):
// each one's rendezvous_per_compute (model.h) against the layer priced by cal.profile (whose
// other terms must be calibrated already) without a rendezvous, then the smallest, set as the
// per_compute of both step_sync and step_sync_world (their us 0; source "measured
// (per_compute inside the layer, smallest of N timings: a, b, c; no fixed cost per step)",
// "emulated" on emulated nodes), with the samples layer.rendezvous.per_compute (one per
// timing) and layer.rendezvous.per_compute.applied (calibrate_rendezvous.cpp says what it did
// to the sweeps). With no timings (another device), or where the layout has no collective step
// after computation, both stay as they are (0, assumed).
void calibrate_rendezvous(Topology& topo, const CalibrateOptions& options,
                          const std::vector<LayerTimes>& timings, Calibration& cal,
                          const std::function<void(const std::string&)>& log);

}  // namespace parm::perfmodel
