#include "parm/rng.h"

#include <cmath>

namespace parm {
namespace {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

}  // namespace

std::array<uint32_t, 4> Rng::block(uint64_t counter) const {
  std::array<uint32_t, 4> c = {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32),
                               static_cast<uint32_t>(stream_),
                               static_cast<uint32_t>(stream_ >> 32)};
  uint32_t k0 = static_cast<uint32_t>(key_), k1 = static_cast<uint32_t>(key_ >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kM0, c[0], hi0, lo0);
    mulhilo(kM1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

uint32_t Rng::next_u32() {
  const uint64_t p = position_++;
  if (p / 4 != cached_counter_) {  // one Philox block serves four draws
    cached_ = block(p / 4);
    cached_counter_ = p / 4;
  }
  return cached_[p % 4];
}

float Rng::uniform() { return static_cast<float>(next_u32() >> 8) * (1.0f / 16777216.0f); }

float Rng::normal() {
  // Two uniforms per normal keeps the mapping position -> value simple.
  const double u1 = (static_cast<double>(next_u32()) + 1.0) / 4294967297.0;  // (0, 1)
  const double u2 = static_cast<double>(next_u32()) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

void fill_uniform(Tensor& t, uint64_t seed, uint64_t stream, float lo, float hi) {
  Rng rng(seed, stream);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = lo + (hi - lo) * rng.uniform();
}

void fill_normal(Tensor& t, uint64_t seed, uint64_t stream, float mean, float stddev) {
  Rng rng(seed, stream);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = mean + stddev * rng.normal();
}

}  // namespace parm
