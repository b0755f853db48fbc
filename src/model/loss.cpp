#include <algorithm>
#include <cmath>

#include "model/blocks.h"
#include "parm/error.h"

namespace parm::model {

double cross_entropy(const float* logits, const int32_t* targets, float* dlogits, int64_t n,
                     int64_t vocab, float scale) {
  double loss = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    const float* x = logits + r * vocab;
    const int32_t y = targets[r];
    PARM_CHECK(y >= 0 && y < vocab, "target {} of counted row {} is outside the vocabulary "
               "[0, {})", y, r, vocab);
    float mx = x[0];
    for (int64_t c = 1; c < vocab; ++c) mx = std::max(mx, x[c]);
    double sum = 0.0;
    for (int64_t c = 0; c < vocab; ++c) sum += std::exp(static_cast<double>(x[c] - mx));
    const double log_z = std::log(sum) + static_cast<double>(mx);
    loss += log_z - static_cast<double>(x[y]);
    if (dlogits != nullptr) {
      float* d = dlogits + r * vocab;
      for (int64_t c = 0; c < vocab; ++c)
        d[c] = scale * static_cast<float>(std::exp(static_cast<double>(x[c]) - log_z));
      d[y] -= scale;
    }
  }
  return loss;
}

}  // namespace parm::model
