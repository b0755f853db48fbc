// The fused collectives measured where they run: inside the MoE layer. A fused collective
// timed alone (calibrate_fused) meets ranks that all wait in MPI; in the layer a rank reaches
// its exchange while its peers still compute, and a message above the transport's eager limit
// then waits for the receiver's handshake, while the fused pipeline's smaller pieces travel at
// once. And ranks that wait in MPI take cycles from those that compute where ranks share
// cores. This runs the real executor on S1 unfused and S1 fused, measures what fusion saves and
// how long the compute steps take, and records them as the profile's fused.eager_gain (model.h,
// eager_saving_us) and layer_compute.scale.
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "shape/shape.h"
#include "parm/topology.h"
#include "perfmodel/calibrate.h"
#include "perfmodel/model.h"
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
  // The same medians over the even and over the odd rounds (0 with fewer than 2 rounds).
  std::array<double, 2> unfused_half_us{}, fused_half_us{};
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

// The fused overlap measured inside the layer (issue 42), replacing the fused collectives
// alone's (calibrate_fused), which keep the per-piece cost. Alone they rarely measure it: on
// both emulated clusters of issue 42 most calibrations had no size whose pipeline the model
// prices below its parts in sequence (their latencies outweigh the bytes that could overlap;
// fit_overlap then keeps 1, measured nowhere), the others one or two that set it to 0. And
// ranks that share cores overlap a pipeline's stages in the layer as they can: on 2 x 2 at
// 1 Gbit/s fused S1 ran 0.86-0.99x plain S1; on 2 x 4 at 10 Gbit/s 1.00-1.10x, where overlap 1
// priced it 0.91x. The layer: overlap_calibration_shape's; `kind` unfused and fused timed as
// time_layer_pair, then
//     overlap = the ov in [0, 1] where p_fused(ov) - p_unfused = t_fused - t_unfused
// (layer_overlap), the smaller of the even and the odd rounds' (supported_layer_overlap), p
// priced by plain_layer_profile with per_piece_us refitted to the fused
// collectives alone at ov (fit.h overlap_per_piece_us); 0 where fusion measured above its
// price at 0, 1 where below it at 1. Sets fused.overlap, per_piece_us, r2 (over the sizes
// alone) and source "measured (overlap in the layer, ...)". Nothing on a device other than
// the CPU or where no layer qualifies (logged: the fused collectives alone's fit stays).
void calibrate_overlap_in_layer(Topology& topo, const CalibrateOptions& options,
                                Calibration& cal,
                                const std::function<void(const std::string&)>& log);
// The layer for it on `here`: eager_calibration_shape at chunks x the eager limit (pieces at
// least twice the limit: no eager effect), its tokens doubled up to kOverlapShapeGrowth times
// until overlap 1 would save kMinEligibleShare of the unfused layer's price (at compute
// scale 1, no gains, rendezvous or per-piece cost). nullopt where none does, without a fused
// schedule on the layout or with chunks < 2.
inline constexpr int64_t kOverlapShapeGrowth = 16;
std::optional<MoeShape> overlap_calibration_shape(const Profile& profile, const Target& here,
                                                  int chunks);
// The overlap measured nowhere (issue 42): the fused collectives alone had no size with a gain
// (fit_overlap's fallback, 1) and no overlap layer ran. The calibration layer's own fused and
// unfused timings (calibrate_fused_layer, timed for the eager gain) then decide between the
// bounds. A fused layer that ran no faster than the unfused one earns no pipelining credit:
// overlap 0, its per-piece cost refitted to the fused collectives alone at 0
// (overlap_per_piece_us). One that ran faster keeps 1. Derivation: on the emulated 2 x 4 at
// 10 Gbit/s both calibrations that fell to 1 timed the layer fused at 1.06-1.09x unfused, and
// their sweeps measured fused S1 no faster than plain S1 on any esp 2 layer, while 1 priced
// its collectives 16-17 ms below (sweep k: "always s1" beat auto by 1.6%); on 2 x 2 at 1
// Gbit/s the three calibrations timed it at 0.69-0.72x and fused S1 was the fastest on 11 of
// 12 esp 2 layers, as 1 priced it. Applied where the EP group crosses nodes (within one node
// the model's pipeline never gains and the overlap prices nothing). Returns whether it set
// the overlap; a measured one is never changed.
bool bound_unmeasured_overlap(FusedFit& ff, const FusedAlone& alone, double fused_us,
                              double unfused_us, int chunks);
// The ov in [0, 1] where priced_us(ov) (what fusion adds to the layer's price at overlap ov,
// decreasing in ov) equals measured_us (what it added measured), by bisection: 0 where fusion
// measured at or above its price at 0, 1 where at or below it at 1.
double layer_overlap(double measured_us, const std::function<double(double)>& priced_us);
// The overlap both halves of the rounds support (calibrate_overlap_in_layer): the smaller of
// layer_overlap over the even and over the odd rounds' fused - unfused (over all rounds where
// the halves were not timed). A credit that one half of the same timing does not give is
// noise: on 2 x 4 at 10 Gbit/s the layer (T 65536, 1.45 s a pass) measured fusion 3.5% faster
// once, which set 0.414, and fused S1 then ran slower than plain S1 on the sweep's esp 2 layers
// where it was chosen ("always s1" 0.982 of auto, sweep q); 0-0.09 in three other calibrations.
double supported_layer_overlap(const LayerTimes& t,
                               const std::function<double(double)>& priced_us);

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
