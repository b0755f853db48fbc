// The rendezvous (model.h: step_sync, step_sync_world) measured where it happens: inside the
// MoE layer. Where ranks share cores, a rank that reaches a collective step waits for peers
// that were descheduled during the computation before it, so the layer's time outside its
// compute steps grows with that computation; collectives timed back to back never see it.
// The bench-layer --sweep split (docs/perfmodel.md, "Issue 20, ninth round") put the
// sweeps' common factor there: the compute steps ran at about their price, the rest at
// 1.5-6x.
#pragma once

#include <functional>
#include <string>

#include "layer/shape.h"
#include "parm/topology.h"
#include "perfmodel/calibrate.h"

namespace parm::perfmodel {

// The layer calibrate times for the rendezvous on `layout`: a sweep-sized layer whose
// compute steps dominate (the term is per us of compute): M = 256, H = 1024, E = 2 N_EP,
// k = 1, f = 1, T = 1024 rounded up to a multiple of N_MP x E.
MoeShape rendezvous_calibration_shape(const Layout& layout);

// Measures the rendezvous' per_compute on this topology (collective): S1 unfused on
// rendezvous_calibration_shape, forward + backward, median over options.iters of the slowest
// rank, its compute steps by the executor's step timers; per_compute =
// rendezvous_per_compute (model.h) against the layer priced by cal.profile (whose other terms
// must be calibrated already) without a rendezvous, and set as the per_compute of both
// step_sync and step_sync_world (their us 0; source "measured (per_compute inside the layer;
// ...)", "emulated" on emulated nodes), with the sample layer.rendezvous.per_compute
// (calibrate_rendezvous.cpp says what it did to the sweeps). On a device other than the CPU,
// or where the layout has no collective step, both stay as they are (0, assumed).
void calibrate_rendezvous(Topology& topo, const CalibrateOptions& options, Calibration& cal,
                          const std::function<void(const std::string&)>& log);

}  // namespace parm::perfmodel
