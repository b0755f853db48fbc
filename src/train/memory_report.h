// The memory a run reports: each rank's peak bytes by kind (parameters, gradients, optimizer
// state, activations, other) from the allocator's own counters (parm/memory.h), in the
// memory space the model lives in (the GPU's on --device cuda, else the host's).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "parm/memory.h"
#include "parm/topology.h"

namespace parm::train {

// The peaks of each kind, then the peak of all kinds together (bytes).
using MemoryPeaks = std::array<double, kNumMemoryKinds + 1>;

// This rank's peaks so far, in the memory space of `device`.
MemoryPeaks rank_memory_peaks(Device device);
// The max over the world's ranks of each (collective).
MemoryPeaks max_memory_peaks(Communicator& world, Device device);
// Every rank's, by world rank (collective; the result on every rank).
std::vector<MemoryPeaks> all_memory_peaks(Communicator& world, Device device);

// "params 1.2 grads 1.2 optim 2.4 acts 30.1 other 3.3 peak 38.0" (MiB).
std::string memory_peaks_text(const MemoryPeaks& m);

}  // namespace parm::train
