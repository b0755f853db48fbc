// Counter-based RNG (Philox-4x32-10): the numbers depend only on (seed, stream, position),
// so every rank draws the same values for the same (seed, stream) with no communication,
// and a rank can jump straight to the slice it owns.
#pragma once

#include <array>
#include <cstdint>

#include "parm/tensor.h"

namespace parm {

class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream) : key_{seed}, stream_(stream) {}

  // The 4 x 32-bit block at `counter` (pure function of seed, stream, counter).
  std::array<uint32_t, 4> block(uint64_t counter) const;

  // Sequential draws; `skip(n)` advances by n uniform draws.
  uint32_t next_u32();
  float uniform();   // [0, 1)
  float normal();    // standard normal (Box-Muller over two uniforms)
  void skip(uint64_t n) { position_ += n; }
  uint64_t position() const { return position_; }

 private:
  uint64_t key_;
  uint64_t stream_;
  uint64_t position_ = 0;  // in units of 32-bit draws
  uint64_t cached_counter_ = ~uint64_t{0};
  std::array<uint32_t, 4> cached_{};
};

// Fill helpers: element i of the tensor gets draw i of (seed, stream).
void fill_uniform(Tensor& t, uint64_t seed, uint64_t stream, float lo, float hi);
void fill_normal(Tensor& t, uint64_t seed, uint64_t stream, float mean, float stddev);

}  // namespace parm
