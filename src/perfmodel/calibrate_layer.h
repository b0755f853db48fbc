// The fused collectives measured where they run: inside the MoE layer. A fused collective
// timed alone (calibrate_fused) meets ranks that all wait in MPI; in the layer a rank reaches
// its exchange while its peers still compute, and a message above the transport's eager limit
// then waits for the receiver's handshake, while the fused pipeline's smaller pieces travel at
// once. And ranks that wait in MPI take cycles from those that compute where ranks share
// cores. This runs the real executor on S1 unfused and S1 fused, measures what fusion saves and
// how long the compute steps take, and records them as the profile's fused.eager_gain (model.h,
// eager_saving_us) and layer_compute.scale.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "shape/shape.h"
#include "parm/topology.h"
#include "perfmodel/calibrate.h"
#include "schedule/schedule.h"

namespace parm::perfmodel {

// The layer shape calibrate runs on `layout`: S1's fused dispatch sends each EP peer a
// message of about 2 x eager_limit_bytes (above the limit, its pieces at most the limit for
// chunks >= 2): M = H = 256, E = 2 N_EP, k = 1, f = 1, T the smallest multiple of N_MP x E
// that reaches it.
MoeShape eager_calibration_shape(const Layout& layout, double eager_limit_bytes);

// One layer measured by calibrate: `kind` unfused (and fused), forward + backward.
struct LayerTimes {
  double unfused_us = 0.0, fused_us = 0.0;  // fused_us: 0 when not timed
  double compute_us = 0.0;  // the unfused layer's compute steps (measured_steps.h)
  int64_t tokens = 0;
};
// Interleaved rounds of forward + backward of `kind` unfused and (fused_too) fused on topo
// (collective), so that a load change hits both alike: medians over o.iters of the slowest
// rank, after o.warmup rounds.
LayerTimes time_layer_pair(Topology& topo, const MoeShape& shape, schedule::Kind kind,
                           const CalibrateOptions& o, bool fused_too);

// The smallest share of the measured unfused layer that the eligible bytes time (what gain 1
// saves) must reach for a gain to be measured there: the gain is a difference of two layer
// timings over it, and two timings of one layer in one sweep differ by 2% at the median and up
// to 8-16% (docs/perfmodel.md, sixth round), which below this share moves the gain by more
// than 0.3.
inline constexpr double kMinEligibleShare = 0.1;
// True when eligible_us >= kMinEligibleShare * unfused_us (both > 0).
bool eager_gain_measurable(double eligible_us, double unfused_us);

// Measures layer_compute.scale and fused.eager_gain on this topology (collective) and writes
// them, with their sources, into cal.profile (whose other terms must be calibrated already:
// it prices both schedules). Interleaved rounds of forward + backward, median over
// options.iters of the slowest rank, of S1 (S2 where N_ESP = 1) unfused and fused:
//     ratio = t_compute / p_compute   (recorded; the scale stays 1, assumed)
// (the unfused layer's compute steps, measured by their own timers, over their price), then
// with that scale
//     gain = (p_fused0 - p_unfused - (t_fused - t_unfused)) / S,  bounded to [0, 1]
// p: the model's prices with gain 0, t: measured, S: what gain 1 would save (the eligible
// inter-node parts' bytes time). One gain per span of the EP group (model.h): this layout's
// gives the share of its span; where that is eager_gain (every EP peer on another node), a
// second layout, topo_options with EP = 2 x nodes and ESP = ranks per node / 2 (N_MP = ESP,
// or 2 with S2 where ESP = 1), gives eager_gain_mixed. A share not measured copies the other
// ("assumed (copied from ...)"), or is 0 where neither is: where eager_gain_measurable
// fails, without an inter-node EP group with a fused step, with chunks < 2 or no eager limit;
// neither on a device other than the CPU (scale 1, gains 0, "assumed").
void calibrate_fused_layer(Topology& topo, const TopologyOptions& topo_options,
                           const CalibrateOptions& options, Calibration& cal,
                           const std::function<void(const std::string&)>& log);

}  // namespace parm::perfmodel
