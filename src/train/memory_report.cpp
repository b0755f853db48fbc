#include "train/memory_report.h"

#include <fmt/format.h>

namespace parm::train {

MemoryPeaks rank_memory_peaks(Device device) {
  const MemoryCounters c = memory_counters(device != Device::kCpu);
  MemoryPeaks m{};
  for (int i = 0; i < kNumMemoryKinds; ++i)
    m[static_cast<size_t>(i)] = static_cast<double>(c.peak[static_cast<size_t>(i)]);
  m[kNumMemoryKinds] = static_cast<double>(c.peak_total);
  return m;
}

MemoryPeaks max_memory_peaks(Communicator& world, Device device) {
  MemoryPeaks m = rank_memory_peaks(device);
  world.allreduce(m.data(), m.size(), ReduceOp::kMax);
  return m;
}

std::vector<MemoryPeaks> all_memory_peaks(Communicator& world, Device device) {
  const MemoryPeaks mine = rank_memory_peaks(device);
  std::vector<MemoryPeaks> all(static_cast<size_t>(world.size()));
  world.allgather(mine.data(), all.data(), mine.size(), DType::kF64);
  return all;
}

std::string memory_peaks_text(const MemoryPeaks& m) {
  const double mib = 1024.0 * 1024.0;
  return fmt::format("params {:.2f} grads {:.2f} optim {:.2f} acts {:.2f} other {:.2f} "
                     "peak {:.2f}",
                     m[0] / mib, m[1] / mib, m[2] / mib, m[3] / mib, m[4] / mib,
                     m[kNumMemoryKinds] / mib);
}

}  // namespace parm::train
