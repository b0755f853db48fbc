// calibrate's collective terms (model.h's collective formula): every op timed on the groups
// that pin the terms down, then alpha(n), beta and the inter-node handshake fitted per
// (link, op).
#pragma once

#include "parm/topology.h"
#include "perfmodel/bench_device.h"
#include "perfmodel/calibrate.h"
#include "perfmodel/calibrate_timing.h"

namespace parm::perfmodel {

// Times allreduce, allgather, reduce_scatter and alltoall over collective_sizes(o) on each
// group that pins down a term (intra-node groups of 2 and of a node's ranks; across nodes,
// one rank per node and the whole world), each a topology of its own over topo's ranks
// (topo_options with other mp / ep / esp). Fits cal.profile's intra entries, then the inter
// ones (which subtract the intra beta's part and step by the handshake at the eager limit:
// cal.profile.fused's limit must be set), then gives every op of a link its pair latency
// (fit.h pair_latency). A link class the layout lacks copies the other's fit, its source
// "assumed". Appends every timing to cal.samples. Collective over topo's world.
void calibrate_collectives(Topology& topo, const TopologyOptions& topo_options,
                           const CalibrateOptions& o, BenchDevice& dev, Calibration& cal,
                           const Logger& log);

}  // namespace parm::perfmodel
