// Test inputs: n values drawn N(0, 1) from Rng(seed, stream).
#pragma once

#include <cstdint>
#include <vector>

#include "parm/rng.h"

namespace parm::test {

inline std::vector<float> normal_values(int64_t n, uint64_t seed, uint64_t stream) {
  Rng rng(seed, stream);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = rng.normal();
  return v;
}

}  // namespace parm::test
