#include "perfmodel/calibrate_timing.h"

namespace parm::perfmodel {

std::vector<int64_t> collective_sizes(const CalibrateOptions& o) {
  std::vector<int64_t> s;
  for (int64_t b = o.min_bytes; b <= o.max_bytes; b *= 4) s.push_back(b);
  return s;
}

std::unique_ptr<BenchBuffer> filled(BenchDevice& dev, size_t n, float v) {
  auto b = std::make_unique<BenchBuffer>(dev, n * sizeof(float));
  if (v != 0.0f) {
    const std::vector<float> host(n, v);
    dev.upload(b->get(), host.data(), n, Precision::kFp32);
  }
  return b;
}

}  // namespace parm::perfmodel
