// Device versions of the dense transformer's kernels: one function per CPU function that the
// model and the optimizer call, with the CPU function's name, arguments and contract
// (kernels/cpu/kernels.h, model/blocks.h, train/optimizer.cpp), so that a call site swaps
// parm::cpu::X / parm::model::X for parm::cuda::X. Differences from the CPU contracts:
//   - every pointer is device memory (index arrays and tokens too); every function queues
//     its work on cuda::stream() and returns without waiting for the device;
//   - a kernel cannot throw: a token or target outside the vocabulary is recorded in a
//     device flag that check_index_errors() reads later (it throws the CPU's message);
//   - results that the CPU returns (the cross-entropy loss) go to a device scalar;
//   - scratch comes from a workspace this module owns (grow-only device memory, grown and
//     freed stream-ordered: no host wait; dense_scratch.h).
// Every sum is deterministic: a fixed order that depends only on the shapes, never float
// atomics. The per-element maths is in dense_math.h, shared with the CPU unit tests.
// CUDA builds only; no CUDA headers here. One host thread per process drives these (the
// workspace and the flags are the process's, as the compute stream is).
#pragma once

#include <cstdint>

#include "parm/device.h"
#include "shape/attention_shape.h"

namespace parm::cuda {

// ---- fp32 <-> bf16 -----------------------------------------------------------------------
// y (n) = bf16(x (n)), rounded to nearest even (expert_kernels.cu defines it; the rounding is
// expert_math.h f32_to_bf16, the CPU's). Overwrites y.
void to_bf16(const float* x, uint16_t* y, int64_t n);
// y (n) = x (n) widened to fp32 (exact). Overwrites y.
void from_bf16(const uint16_t* x, float* y, int64_t n);

// ---- Dense products (model::dense_gemm, model::linear_*) --------------------------------
// cpu::gemm's row-major contract with leading dimensions, in fp32 (no TF32) or, at kBf16,
// with both operands rounded to bf16 first (into the workspace) and fp32 accumulation and
// output, as model::dense_gemm. gemm.h's gemm is the contiguous fp32 / pre-rounded form.
void dense_gemm(Precision p, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                bool accumulate);
void dense_gemm(Precision p, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                const float* a, const float* b, float* c, bool accumulate);
// y (T, out) = x w + b (b may be null). Overwrites y.
void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t rows,
                    int64_t in, int64_t out, Precision p = Precision::kFp32);
// dw += x^T dy; db += column sums of dy (db may be null); dx = dy w^T (overwritten, or
// accumulated when accumulate_dx; dx may be null: skipped).
void linear_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                     float* db, int64_t rows, int64_t in, int64_t out, bool accumulate_dx,
                     Precision p = Precision::kFp32);

// ---- Bias and GeLU (cpu:: contracts) ------------------------------------------------------
// y (rows, cols) += bias (cols) on every row.
void add_bias(float* y, const float* bias, int64_t rows, int64_t cols);
// dbias (cols) += column sums of dy (rows, cols), each column summed in a fixed order.
void bias_backward(const float* dy, float* dbias, int64_t rows, int64_t cols);
// act = gelu(x + bias), x left as it is. Overwrites act.
void bias_gelu(const float* x, const float* bias, float* act, int64_t rows, int64_t cols);
// dx = gelu'(x + bias) * dact (overwrites; may alias dact); dbias += column sums of dx.
void bias_gelu_backward(const float* x, const float* bias, const float* dact, float* dx,
                        float* dbias, int64_t rows, int64_t cols);
// pre (rows, cols) += bias in place, then act = gelu(pre). Overwrites act.
void bias_gelu_forward(float* pre, const float* bias, float* act, int64_t rows, int64_t cols);
// y = gelu(x) (may alias x); dx = gelu'(x) * dy (may alias dy). Overwrite.
void gelu_forward(const float* x, float* y, int64_t n);
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n);

// ---- LayerNorm (cpu:: contracts) ----------------------------------------------------------
// Each row's sums run in the CPU's order (16 lanes, lanes added in order, then the tail;
// dense_math.h), so mean is the CPU's to the bit. Overwrites y, mean, rstd.
void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y,
                       float* mean, float* rstd, int64_t rows, int64_t cols, float eps);
// Overwrites dx (may alias dy); dgamma, dbeta += their column sums (fixed order).
void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t rows,
                        int64_t cols);

// ---- Row-wise softmax (cpu:: contracts) ----------------------------------------------------
void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols);
void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols);

// ---- Rows (cpu:: contracts; idx is device int64) -----------------------------------------
void gather_rows(const float* src, int64_t cols, const int64_t* idx, int64_t n, float* dst);
// Repeated indices add up in i order (a stable sort by destination row, then one pass per
// row: the CPU's order, no atomics).
void scatter_add_rows(const float* src, int64_t cols, const int64_t* idx, const float* scale,
                      int64_t n, float* dst);

// ---- Embedding (model:: contracts; tokens is device int32) --------------------------------
// wte holds rows [vocab_begin, vocab_end) of the whole table (vocabulary-parallel): a token
// outside them gives a zero row. A token outside [0, vocab) gives a zero row and is recorded
// for check_index_errors().
void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* out,
                       int64_t batch, int64_t seq_len, int64_t model_dim, int64_t vocab,
                       int64_t vocab_begin, int64_t vocab_end);
// dwte (rows [vocab_begin, vocab_end)) += dout rows at their tokens, dwpe += every row at its
// position, each row of dwte and dwpe summed in token order (the CPU's order: the same
// bits). Tokens outside [vocab_begin, vocab_end) add nothing to dwte.
void embedding_backward(const int32_t* tokens, const float* dout, float* dwte, float* dwpe,
                        int64_t batch, int64_t seq_len, int64_t model_dim, int64_t vocab_begin,
                        int64_t vocab_end);

// ---- Attention core (model:: contracts) -----------------------------------------------------
// Per head, one cuBLAS strided-batched product over the batch for each of q k^T, p v (and
// the four backward products), and one fused kernel per pass for the scale, the causal mask
// and the softmax (forward) or its adjoint (backward). Not a flash kernel: the contract keeps
// probs (B, heads, L, L) for the backward pass, as the CPU oracle does (so that every tensor
// can be checked against it), and at GPT-2's lengths (L <= 1024, D = 64) the products are
// tensor-core GEMMs (K = D or L) while the fused softmax reads and writes each score once per
// pass: what a flash kernel would save is that traffic, 8 L^2 bytes per head and sequence per
// pass, and the probs' memory. s.precision kBf16: bf16 operands (rounded into the
// workspace), fp32 results. AttentionShape is shape/attention_shape.h's, shared with the CPU
// functions (model/blocks.h).
// dscores: the CPU's (L, L) scratch, not used here (may be null): one head's scores for the
// whole batch, (B, L, L), live in the workspace.
void attention_forward(const AttentionShape& s, const float* q, const float* k,
                       const float* v, float* probs, float* out);
void attention_backward(const AttentionShape& s, const float* q, const float* k,
                        const float* v, const float* probs, const float* dout, float* dq,
                        float* dk, float* dv, float* dscores);

// ---- Cross-entropy fused with the softmax over the vocabulary ------------------------------
// model::cross_entropy over device memory: logits (n, V), targets (n). *loss_sum (a device
// double) += the sum over rows of -log softmax[target] (log-sum-exp in double, as the CPU);
// when dlogits is not null, dlogits = scale * (softmax - onehot(target)), overwritten (may
// alias logits: in place). A target outside [0, V) adds nothing, gets a zero dlogits row and
// is recorded for check_index_errors().
void cross_entropy(const float* logits, const int32_t* targets, float* dlogits, int64_t n,
                   int64_t vocab, float scale, double* loss_sum);
// The vocabulary-parallel cross-entropy's three passes (cpu::ce_row_max, ce_row_sums,
// ce_finish: kernels/cpu/kernels.h) over device memory, one block per row; targets are
// column ids of this block of the vocabulary, -1 where another rank holds the target.
// ce_finish adds the loss sum into *loss_sum (a device double).
void ce_row_max(const float* logits, int64_t n, int64_t cols, float* row_max);
void ce_row_sums(const float* logits, const float* row_max, const int32_t* targets, int64_t n,
                 int64_t cols, double* stats);
void ce_finish(const float* logits, const float* row_max, const double* stats,
               const int32_t* targets, float* dlogits, int64_t n, int64_t cols, float scale,
               double* loss_sum);

// Throws parm::Error with the CPU's message (position, token or target, vocabulary) for the
// first bad index recorded since the last call, then clears the record. Waits for the device.
void check_index_errors();

// ---- Optimizer (train::AdamW::step, train::global_grad_norm) -------------------------------
// One AdamW update of n fp32 values (a flat buffer), element by element as train::AdamW::step
// (the same bits: the scalars derived on the host as the CPU does, no contracted
// multiply-adds; dense_math.h). step counts from 1 (AdamW::steps_taken() after its
// increment). decay: whether these parameters decay (model::Param::weight_decay: matrices
// yes, biases and gains no); then w is first multiplied by 1 - lr * weight_decay.
// Overwrites params, m, v.
void adamw_step(float* params, const float* grads, float* m, float* v, int64_t n, double lr,
                double beta1, double beta2, double eps, double weight_decay, int64_t step,
                double grad_scale, bool decay);
// *out (device double) += sum of x[i]^2 in double, in a fixed order (global norm).
void sum_squares(const float* x, int64_t n, double* out);

}  // namespace parm::cuda
