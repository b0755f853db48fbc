// The dense building blocks of the transformer, as forward/backward pairs over raw row-major
// fp32 pointers that the caller owns (llm.c style). Shapes are in the comments as
// (rows, ..., cols); T = B * L token rows. Each function says whether it overwrites or
// accumulates (+=) each output. Nothing here communicates: the tensor-parallel all-reduces
// sit in the model (model/tp.h), between these calls.
#pragma once

#include <cstdint>

#include "parm/device.h"
#include "shape/attention_shape.h"

namespace parm::model {

// ---- Linear: y = x W (+ b), W stored (in, out) ----------------------------------------

// y (T, out) = x (T, in) w (in, out) + b (out); b may be null. Overwrites y.
// p: precision of the products (dense_gemm).
void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t rows,
                    int64_t in, int64_t out, Precision p = Precision::kFp32);
// dw (in, out) += x^T dy; db (out) += column sums of dy (db may be null);
// dx (T, in) = dy w^T, overwritten, or accumulated when accumulate_dx (dx may be null: skip).
void linear_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                     float* db, int64_t rows, int64_t in, int64_t out, bool accumulate_dx,
                     Precision p = Precision::kFp32);

// The model's dense products: cpu::gemm at fp32; cpu::gemm_bf16 at kBf16 (bf16 operands,
// fp32 accumulation and output, as the expert products). Contracts as cpu::gemm.
void dense_gemm(Precision p, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                bool accumulate);
void dense_gemm(Precision p, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                const float* a, const float* b, float* c, bool accumulate);

// ---- Token + position embedding ----------------------------------------------------------

// Vocabulary-parallel (model/vocab_parallel.h): wte holds rows [vocab_begin, vocab_end) of
// the whole (V, M) table. out (B*L, M): row b*L + l = wte[tokens[b*L + l] - vocab_begin] +
// wpe[l] when this rank holds the token's row, else 0 (so that the sum over the ranks that
// hold [0, V) between them is the unsplit wte[token] + wpe[l], bit for bit). wpe (L, M).
// Throws parm::Error naming the position for a token outside [0, V). Overwrites out.
void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* out,
                       int64_t batch, int64_t seq_len, int64_t model_dim, int64_t vocab,
                       int64_t vocab_begin, int64_t vocab_end);
// dwte (vocab_end - vocab_begin, M) += dout rows at their tokens that this rank holds;
// dwpe (L, M) += every dout row at its position.
void embedding_backward(const int32_t* tokens, const float* dout, float* dwte, float* dwpe,
                        int64_t batch, int64_t seq_len, int64_t model_dim, int64_t vocab_begin,
                        int64_t vocab_end);

// ---- Multi-head self-attention core (the heads this rank holds) ---------------------------

// AttentionShape (shape/attention_shape.h): B, L, the heads held here, D, causal, precision.

// q, k, v, out (B*L, heads*D): head h is columns [h*D, (h+1)*D).
// probs (B, heads, L, L): softmax(q k^T / sqrt(D)) with the causal mask (masked entries 0).
// out = probs v per head. Overwrites probs and out.
void attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v,
                       float* probs, float* out);
// dq, dk, dv (B*L, heads*D) from dout (B*L, heads*D); overwrites them. dscores (L, L) scratch.
void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                        const float* probs, const float* dout, float* dq, float* dk, float* dv,
                        float* dscores);

// ---- Cross-entropy over selected rows ------------------------------------------------------

// logits (n, V), targets (n) all in [0, V). Returns the sum over rows of -log softmax[target]
// (in double). When dlogits is non-null: dlogits (n, V) = scale * (softmax - onehot(target)),
// overwritten (may alias logits). Throws parm::Error for a target outside [0, V).
double cross_entropy(const float* logits, const int32_t* targets, float* dlogits, int64_t n,
                     int64_t vocab, float scale);

}  // namespace parm::model
