#include "model/init.h"

#include "parm/error.h"
#include "parm/rng.h"

namespace parm::model {

uint64_t param_stream(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

void init_param_normal(Param& p, uint64_t seed, float mean, float stddev) {
  PARM_CHECK_EQ(p.value.numel(), shape_numel(local_shape(p.whole_shape, p.splits)));
  if (stddev == 0.0f) {
    p.value.fill(mean);
    return;
  }
  const uint64_t stream = param_stream(p.name);
  float* out = p.value.data();
  for_each_shard_run(p.whole_shape, p.splits, [&](int64_t lo, int64_t wo, int64_t n) {
    Rng rng(seed, stream);
    rng.skip(2 * static_cast<uint64_t>(wo));  // Rng::normal takes two 32-bit draws
    for (int64_t i = 0; i < n; ++i) out[lo + i] = mean + stddev * rng.normal();
  });
}

}  // namespace parm::model
