// calibrate's fused-collective terms (model.h's fused step): the transport's eager limit and
// the pipeline's overlap and per-piece cost, fitted from the fused collectives timed against
// their unfused stages.
#pragma once

#include "parm/topology.h"
#include "perfmodel/bench_device.h"
#include "perfmodel/calibrate.h"
#include "perfmodel/calibrate_timing.h"
#include "perfmodel/profile.h"

namespace parm::perfmodel {

// Sets ff's eager limit (model.h) and its source: o.eager_limit_bytes when given (>= 0), else
// Open MPI's default for the transport the nodes use, less the header the limit counts.
void set_eager_limit(const CalibrateOptions& o, bool nodes_emulated, FusedFit& ff);

// Times fused dispatch and combine on topo's (ep, esp) over collective_sizes(o), each against
// its two stages run unfused, and fits cal.profile.fused's overlap and per_piece_us
// (fit.h fit_overlap); the other collective terms must be calibrated already (it prices the
// stages). Where N_EP or N_ESP is 1, nothing is timed: the fit is reset but for the eager
// limit, its source "assumed". Collective over topo's world.
void calibrate_fused(Topology& topo, const CalibrateOptions& o, BenchDevice& dev,
                     Calibration& cal, const Logger& log);

}  // namespace parm::perfmodel
