#include <cstring>

#include "model/blocks.h"
#include "parm/error.h"

namespace parm::model {

void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* out,
                       int64_t batch, int64_t seq_len, int64_t model_dim, int64_t vocab) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t l = 0; l < seq_len; ++l) {
      const int64_t t = b * seq_len + l;
      const int32_t tok = tokens[t];
      PARM_CHECK(tok >= 0 && tok < vocab, "token {} at (sequence {}, position {}) is outside the "
                 "vocabulary [0, {})", tok, b, l, vocab);
      const float* e = wte + tok * model_dim;
      const float* p = wpe + l * model_dim;
      float* o = out + t * model_dim;
      for (int64_t c = 0; c < model_dim; ++c) o[c] = e[c] + p[c];
    }
}

void embedding_backward(const int32_t* tokens, const float* dout, float* dwte, float* dwpe,
                        int64_t batch, int64_t seq_len, int64_t model_dim) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t l = 0; l < seq_len; ++l) {
      const int64_t t = b * seq_len + l;
      const float* d = dout + t * model_dim;
      float* de = dwte + static_cast<int64_t>(tokens[t]) * model_dim;
      float* dp = dwpe + l * model_dim;
      for (int64_t c = 0; c < model_dim; ++c) {
        de[c] += d[c];
        dp[c] += d[c];
      }
    }
}

}  // namespace parm::model
