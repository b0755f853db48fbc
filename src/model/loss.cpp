#include "kernels/cpu/kernels.h"
#include "model/blocks.h"
#include "parm/error.h"

namespace parm::model {

double cross_entropy(const float* logits, const int32_t* targets, float* dlogits, int64_t n,
                     int64_t vocab, float scale) {
  for (int64_t r = 0; r < n; ++r)  // every target checked before any work
    PARM_CHECK(targets[r] >= 0 && targets[r] < vocab, "target {} of counted row {} is outside "
               "the vocabulary [0, {})", targets[r], r, vocab);
  return cpu::cross_entropy_rows(logits, targets, dlogits, n, vocab, scale);
}

}  // namespace parm::model
