#include <cstring>

#include "model/blocks.h"
#include "parm/error.h"

namespace parm::model {

void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* out,
                       int64_t batch, int64_t seq_len, int64_t model_dim, int64_t vocab,
                       int64_t vocab_begin, int64_t vocab_end) {
  PARM_CHECK(vocab_begin >= 0 && vocab_begin <= vocab_end && vocab_end <= vocab,
             "embedding rows [{}, {}) of a vocabulary of {}", vocab_begin, vocab_end, vocab);
  for (int64_t t = 0; t < batch * seq_len; ++t)  // every token checked before any work
    PARM_CHECK(tokens[t] >= 0 && tokens[t] < vocab, "token {} at (sequence {}, position {}) is "
               "outside the vocabulary [0, {})", tokens[t], t / seq_len, t % seq_len, vocab);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t l = 0; l < seq_len; ++l) {
      const int64_t t = b * seq_len + l;
      const int64_t tok = tokens[t];
      float* o = out + t * model_dim;
      if (tok < vocab_begin || tok >= vocab_end) {
        std::memset(o, 0, static_cast<size_t>(model_dim) * sizeof(float));
        continue;
      }
      const float* e = wte + (tok - vocab_begin) * model_dim;
      const float* p = wpe + l * model_dim;
      for (int64_t c = 0; c < model_dim; ++c) o[c] = e[c] + p[c];
    }
}

void embedding_backward(const int32_t* tokens, const float* dout, float* dwte, float* dwpe,
                        int64_t batch, int64_t seq_len, int64_t model_dim, int64_t vocab_begin,
                        int64_t vocab_end) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t l = 0; l < seq_len; ++l) {
      const int64_t t = b * seq_len + l;
      const float* d = dout + t * model_dim;
      const int64_t tok = tokens[t];
      float* dp = dwpe + l * model_dim;
      for (int64_t c = 0; c < model_dim; ++c) dp[c] += d[c];
      if (tok < vocab_begin || tok >= vocab_end) continue;
      float* de = dwte + (tok - vocab_begin) * model_dim;
      for (int64_t c = 0; c < model_dim; ++c) de[c] += d[c];
    }
}

}  // namespace parm::model
