// Scaled dot-product attention per (sequence, head), with GEMMs over strided head columns.
// The causal form computes the full L x L scores and masks them (simple; L is small here).
#include <cmath>
#include <cstring>

#include "kernels/cpu/kernels.h"
#include "model/blocks.h"

namespace parm::model {

void attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v,
                       float* probs, float* out) {
  const int64_t L = s.seq_len, D = s.head_dim, W = s.width();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t off = b * L * W + h * D;    // (L, D) block of head h, row stride W
      float* p = probs + (b * s.heads + h) * L * L;  // (L, L)
      dense_gemm(s.precision, false, true, L, L, D, q + off, W, k + off, W, p, L, false);  // q k^T
      cpu::attention_softmax_forward(p, L, scale, s.causal);  // query i sees keys <= i if causal
      dense_gemm(s.precision, false, false, L, D, L, p, L, v + off, W, out + off, W, false);  // p v
    }
}

void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                        const float* probs, const float* dout, float* dq, float* dk, float* dv,
                        float* dscores) {
  const int64_t L = s.seq_len, D = s.head_dim, W = s.width();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t off = b * L * W + h * D;
      const float* p = probs + (b * s.heads + h) * L * L;  // (L, L)
      float* ds = dscores;                                 // (L, L)
      // dv = p^T dout; dp = dout v^T
      dense_gemm(s.precision, true, false, L, D, L, p, L, dout + off, W, dv + off, W, false);
      dense_gemm(s.precision, false, true, L, L, D, dout + off, W, v + off, W, ds, L, false);
      // Through the softmax (masked entries have p = 0 and get no gradient), then the scale.
      cpu::attention_softmax_backward(p, ds, L, scale, s.causal);
      // dq = ds k; dk = ds^T q
      dense_gemm(s.precision, false, false, L, D, L, ds, L, k + off, W, dq + off, W, false);
      dense_gemm(s.precision, true, false, L, D, L, ds, L, q + off, W, dk + off, W, false);
    }
}

}  // namespace parm::model
