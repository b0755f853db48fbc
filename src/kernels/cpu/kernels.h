// CPU kernels over raw row-major fp32 pointers. The caller owns all memory. Shapes are
// given in the comments as (rows, cols). Functions say whether they overwrite or
// accumulate (+=) their outputs.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cpu/bf16_buffer.h"

namespace parm::cpu {

// ---- GEMM (oneDNN) ---------------------------------------------------------------------
// C (m, n) = op(A) (m, k) * op(B) (k, n)            when accumulate == false (overwrite)
// C (m, n) += op(A) (m, k) * op(B) (k, n)           when accumulate == true
// op(X) = X or X^T. Row-major with leading dimensions lda/ldb/ldc (elements per stored row):
// A is stored (m, k) when !trans_a, else (k, m); B is stored (k, n) when !trans_b, else (n, k).
// m, n or k may be 0 (k == 0: C is zeroed, or left alone when accumulating).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
          int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate);
// Contiguous convenience form (lda/ldb/ldc implied by the shapes).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
          const float* b, float* c, bool accumulate);
// Which oneDNN entry point gemm() calls: kAuto picks one per shape (a fixed rule, the same
// on every rank; see gemm.cpp), the others force one.
enum class GemmPath { kAuto, kSgemm, kMatmul };
// As the contiguous gemm(), with `prefer` taking the place of the per-shape rule (a path
// forced process-wide by set_gemm_path still wins). The MoE layer prefers kSgemm: it
// allocates nothing per call and needs no per-shape primitive, where a matmul primitive's
// execute allocates its argument map inside oneDNN and a new row count (the experts' filled
// rows change every step) would need a new primitive; on those shapes it is as fast.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
          const float* b, float* c, bool accumulate, GemmPath prefer);
// Name of the GEMM backend, e.g. "oneDNN 2.6.3 (cpu, avx2)".
const char* gemm_backend();
// Forces one path for every gemm() call (benchmarks, tests); kAuto restores the defaults.
// Process-wide.
void set_gemm_path(GemmPath path);
GemmPath gemm_path();
// Threads gemm() may use when called from the calling thread. Default: 1, unless the
// environment sets OMP_NUM_THREADS, which is then obeyed. set_gemm_threads(n >= 1) overrides
// both for all threads. oneDNN runs on OpenMP here: this sets the calling thread's OpenMP
// thread count, which other OpenMP code in that thread would see too.
void set_gemm_threads(int num_threads);
int gemm_threads();

// ---- bf16 GEMM (bf16 operands, fp32 accumulation and output) ------------------------------
// bf16 values are stored as uint16_t (the upper half of the fp32 bit pattern) and rounded from
// fp32 to nearest even. The GEMM reads its operands packed, so that a weight packed once
// serves every call of a step:
//   packed A: op(A) (m, k), rows padded to a multiple of 16 and columns to a multiple of
//             32 with zeros, as 16 x 32 tiles of 1 KiB each (bf16_packed_a_size(m, k)
//             values);
//   packed B: op(B) (k, n) as 16-column panels, each (k / 2, 16, 2): pairs of consecutive k
//             side by side (the AMX / VNNI layout), k padded to 32 and n to 16 with zeros.
// The kernel runs on the calling thread: AMX tiles where the CPU and OS offer them, else
// AVX512-BF16, else the operands widened to fp32 for the fp32 GEMM (same contract, at the
// fp32 GEMM's rate and on its threads). Packed operands at a 64-byte boundary (a
// Bf16Buffer's data, and offsets into it at tile boundaries) run up to 1.8x faster on AMX
// than misaligned ones (bf16_buffer.h).
int64_t bf16_packed_a_size(int64_t m, int64_t k);
int64_t bf16_packed_b_size(int64_t k, int64_t n);
// Rounds op(A) (fp32 (m, k), stored as for gemm(): (k, m) when trans) into packed A.
// Overwrites all bf16_packed_a_size(m, k) values of `packed`.
void bf16_pack_a(bool trans, int64_t m, int64_t k, const float* a, int64_t lda, uint16_t* packed);
// Rounds op(B) (fp32 (k, n), stored (n, k) when trans) into packed B. Overwrites all
// bf16_packed_b_size(k, n) values of `packed`.
void bf16_pack_b(bool trans, int64_t k, int64_t n, const float* b, int64_t ldb, uint16_t* packed);
// Rows k0 .. k0 + rows - 1 of op(B) (fp32, not transposed; b points at row k0) into packed B
// of the whole (k, n) operand, the rest of `packed` untouched: B packed a block of rows at a
// time while each block is still in cache. k0 a multiple of 32, rows even unless the block
// ends at k (that block also writes the padding up to round_up(k, 32)).
// Packed A needs no such call: its 16-row blocks are independent, so bf16_pack_a of rows
// i0 .. i0 + 15 (i0 a multiple of 16) at packed + i0 * round_up(k, 32) writes that block.
void bf16_pack_b_rows(int64_t k0, int64_t rows, int64_t k, int64_t n, const float* b,
                      int64_t ldb, uint16_t* packed);
// Rows k0 .. k0 + rows - 1 of A stored (k, m) (fp32; a points at row k0), whose transpose
// op(A) (m, k) is packed, into packed A of the whole operand, the rest of `packed`
// untouched: a transposed A packed a block of rows at a time while each block is in cache.
// k0 a multiple of 32, rows too unless the block ends at k (that block also writes the
// padding up to round_up(k, 32)); the padding rows up to round_up(m, 16) are written.
void bf16_pack_at_rows(int64_t k0, int64_t rows, int64_t m, int64_t k, const float* a,
                       int64_t lda, uint16_t* packed);
// w (rows, cols) fp32 as packed B of w (k = rows, n = cols) into `packed` and as packed B of
// w^T (k = cols, n = rows) into `packed_t`, 32 rows at a time: the rows are read from memory
// once and packed twice while in cache. A weight that serves both x w and dy w^T packs here.
// Overwrites bf16_packed_b_size(rows, cols) and bf16_packed_b_size(cols, rows) values.
void bf16_pack_b_both(int64_t rows, int64_t cols, const float* w, uint16_t* packed,
                      uint16_t* packed_t);
// C (m, n) = A B (accumulate == false) or C += A B, packed operands, C fp32 row-major (ldc).
void gemm_bf16_packed(int64_t m, int64_t n, int64_t k, const uint16_t* a, const uint16_t* b,
                      float* c, int64_t ldc, bool accumulate);
// gemm()'s contract with both operands rounded to bf16 first (packed into per-thread scratch
// that grows to the largest operands seen, so repeated shapes allocate nothing).
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
               int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate);
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
               const float* b, float* c, bool accumulate);
// gemm_bf16 with B already packed (bf16_pack_b / bf16_pack_b_both of op(B) (k, n)): only A
// is rounded and packed per call, into the same per-thread scratch. The same bits as
// gemm_bf16 over the fp32 B that was packed.
void gemm_bf16_packed_b(bool trans_a, int64_t m, int64_t n, int64_t k, const float* a,
                        int64_t lda, const uint16_t* packed_b, float* c, int64_t ldc,
                        bool accumulate);
// Which bf16 kernel runs: kAuto (chosen by asking the CPU at run time: AMX when usable, else
// AVX512-BF16's vdpbf16ps where present, else kFp32), or one forced process-wide (tests,
// benchmarks; PARM_BF16_KERNEL=auto|amx|avx512|fp32|portable, read at the first bf16 call,
// sets the initial value). kFp32: the packed operands widened back to fp32 (exactly) and
// multiplied by gemm(), the fastest where the CPU has no bf16 units. kPortable: a scalar
// loop in the AMX kernel's order, the reference, ~20x slower than fp32. kFp32 and kPortable
// also pack with scalar loops instead of AVX512-BF16, as a CPU without it does. Forcing kAmx
// or kAvx512 where this CPU lacks it throws InvalidConfig.
enum class Bf16Kernel { kAuto, kAmx, kAvx512, kPortable, kFp32 };
void set_bf16_kernel(Bf16Kernel kernel);
// The kernel gemm_bf16 runs now, in words.
const char* bf16_kernel_name();
// The CPU's bf16 features, e.g. "avx512_bf16 yes, amx_bf16 yes (tiles granted)".
const char* cpu_bf16_capability();
// The implementation oneDNN picks for a bf16 x bf16 -> fp32 matmul on this CPU, e.g.
// "brg:avx512_core_amx_bf16" (for `parm info`: what oneDNN would run here).
std::string onednn_bf16_matmul_impl();

// ---- Row-wise softmax ------------------------------------------------------------------
// y (rows, cols) = softmax(x) per row; overwrites y (may alias x).
void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols);
// dx (rows, cols) = y * (dy - sum(dy * y)) per row; overwrites dx (may alias dy).
void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols);

// One head's attention scores p (L, L), in place: row i = softmax(scale * its first n_i
// entries), n_i = i + 1 when causal, else L; entries n_i.. set to 0 (softmax_attention.cpp).
// AVX-512 where the CPU has it, within a few ulp of the _reference form (per row: scale,
// softmax_forward, zero the rest). The backward pass: ds (L, L) in place = scale *
// softmax_backward(p row, ds row) over the first n_i entries, the rest 0.
void attention_softmax_forward(float* p, int64_t L, float scale, bool causal);
void attention_softmax_forward_reference(float* p, int64_t L, float scale, bool causal);
void attention_softmax_backward(const float* p, float* ds, int64_t L, float scale, bool causal);
void attention_softmax_backward_reference(const float* p, float* ds, int64_t L, float scale,
                                          bool causal);
// The AVX-512 path one row at a time (the form before rows were taken in groups, whose bits
// the grouped path keeps; tests compare the two with memcmp). Scalar without AVX-512.
void attention_softmax_forward_one_row_at_a_time(float* p, int64_t L, float scale, bool causal);
void attention_softmax_backward_one_row_at_a_time(const float* p, float* ds, int64_t L,
                                                  float scale, bool causal);
// model::cross_entropy's contract (model/blocks.h) with the targets already checked to lie
// in [0, vocab): the loss sum (in double) over the n rows of logits (n, vocab); with dlogits,
// dlogits = scale * (softmax - onehot(target)), overwritten (may alias logits). The
// exponentials are fp32 (within 2 ulp), their sums double.
double cross_entropy_rows(const float* logits, const int32_t* targets, float* dlogits, int64_t n,
                          int64_t vocab, float scale);
// The same loss over a vocabulary cut into column blocks, one block of `cols` columns here
// (model/vocab_parallel.h), in three passes between which the caller reduces each row's
// numbers over the blocks:
//   ce_row_max   row_max (n) = the max of each row of logits (n, cols)   [then: max]
//   ce_row_sums  stats (n, 2) = (the sum of exp(x - row_max) over the row, in double lanes;
//                the logit at targets[r] when 0 <= targets[r] < cols, else 0)  [then: sum]
//   ce_finish    returns the sum over rows of log(stats[r][0]) + row_max[r] - stats[r][1];
//                with dlogits, dlogits = scale * (exp(x - row_max) / stats[r][0] - [c ==
//                targets[r]]), overwritten (may alias logits).
// A target outside [0, cols) is another block's. With one block (the reductions the
// identity) they give cross_entropy_rows's bits.
void ce_row_max(const float* logits, int64_t n, int64_t cols, float* row_max);
void ce_row_sums(const float* logits, const float* row_max, const int32_t* targets, int64_t n,
                 int64_t cols, double* stats);
double ce_finish(const float* logits, const float* row_max, const double* stats,
                 const int32_t* targets, float* dlogits, int64_t n, int64_t cols, float scale);

// ---- Top-k per row ---------------------------------------------------------------------
// idx (rows, k), val (rows, k): the k largest values of each row of x (rows, cols), largest
// first; ties go to the lower column index. Overwrites idx and val. Requires 1 <= k <= cols.
void topk(const float* x, int64_t rows, int64_t cols, int k, int32_t* idx, float* val);

// ---- SwiGLU (the gated experts: act = silu(a) * g) -------------------------------------
// AVX-512 where the CPU has it, with the bits of the scalar loops (swiglu.cpp).
// act = silu(a) g over n elements (a = x W1, g = x W3). Overwrites act (may alias g).
void swiglu_forward(const float* a, const float* g, float* act, int64_t n);
// Its adjoint: da = dact g silu'(a), dg = dact silu(a). Overwrites da and dg (da may alias
// dact; dg may not alias a, g or dact).
void swiglu_backward(const float* a, const float* g, const float* dact, float* da, float* dg,
                     int64_t n);

// ---- GeLU (tanh form, as GPT-2) --------------------------------------------------------
// AVX-512 where the CPU has it, with the bits of the scalar loops (gelu.cpp).
// y = gelu(x), n elements; overwrites y (may alias x).
void gelu_forward(const float* x, float* y, int64_t n);
// dx = gelu'(x) * dy; overwrites dx (may alias dy).
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n);
// Fused: pre (rows, cols) = x + bias (cols) in place, then act = gelu(pre); overwrites act.
void bias_gelu_forward(float* pre, const float* bias, float* act, int64_t rows, int64_t cols);
// act (rows, cols) = gelu(x + bias (cols)), x left as it is: the backward pass recomputes
// x + bias (cheaper than writing it back). Overwrites act.
void bias_gelu(const float* x, const float* bias, float* act, int64_t rows, int64_t cols);
// Its adjoint, one pass: dx (rows, cols) = gelu'(x + bias) * dact (overwrites; may alias
// dact) and dbias (cols) += the column sums of dx, summed row by row (the same bits as
// gelu_backward at x + bias followed by bias_backward).
void bias_gelu_backward(const float* x, const float* bias, const float* dact, float* dx,
                        float* dbias, int64_t rows, int64_t cols);
// g (rows, cols) = gelu'(x + bias): the factor bias_gelu_backward multiplies dact by (the
// same bits). Overwrites g.
void bias_gelu_grad(const float* x, const float* bias, float* g, int64_t rows, int64_t cols);
// The same two at the bf16 path's accuracy (its products round act and dpre to bf16, 2^-9
// relative): on AVX-512 a degree-5 2^x and a 14-bit reciprocal instead of the fp32 path's
// exp and division, values within kGeluBf16Error relative of bias_gelu's and gradients
// within kGeluBf16Error absolute (|gelu'| <= 1.13), about 2x faster; without AVX-512
// exactly bias_gelu / bias_gelu_backward. dbias is summed row by row as there.
inline constexpr float kGeluBf16Error = 1e-4f;
void bias_gelu_bf16(const float* x, const float* bias, float* act, int64_t rows, int64_t cols);
void bias_gelu_backward_bf16(const float* x, const float* bias, const float* dact, float* dx,
                             float* dbias, int64_t rows, int64_t cols);
// The same two with their output also rounded into packed A (kernels.h's bf16 layout,
// bf16_packed_a_size(rows, cols) values at `packed`, padding included): the bits of
// bias_gelu_bf16 (or bias_gelu_backward_bf16) followed by bf16_pack_a(false, rows, cols, out,
// cols, packed). With AVX512-BF16 each 32 values are rounded from the registers that hold
// them, instead of read back from the fp32 output in a second pass.
void bias_gelu_pack_a_bf16(const float* x, const float* bias, float* act, int64_t rows,
                           int64_t cols, uint16_t* packed);
void bias_gelu_backward_pack_a_bf16(const float* x, const float* bias, const float* dact,
                                    float* dx, float* dbias, int64_t rows, int64_t cols,
                                    uint16_t* packed);
// g (rows, cols) = gelu'(x + bias) at the bf16 path's accuracy: the factor
// bias_gelu_backward_bf16 multiplies dact by (the same bits; NaN where x + bias is NaN).
void bias_gelu_grad_bf16(const float* x, const float* bias, float* g, int64_t rows, int64_t cols);
// The experts' GeLU steps, on one block of rows k0 .. k0 + rows - 1 of an expert's k rows (k0
// a multiple of 32; 32 rows unless the block ends at k):
// - forward: act = gelu(x + bias) (x (rows, cols) fp32) as packed A of (rows, cols) at
//   packed_a (bf16_packed_a_size(rows, cols) values, padding included) and as k block k0 of
//   packed A of act^T (cols, k) at packed_at (as bf16_pack_at_rows); x is then overwritten
//   with gelu'(x + bias): the bits of bias_gelu_bf16 followed by those packs, and of
//   bias_gelu_grad_bf16. The backward step then recomputes no 2^t.
// - backward: dpre = grad dact (grad (rows, cols): what the forward step left in x; dact
//   (rows, cols) fp32, read only), dbias (cols) += its column sums row by row, dpre as packed
//   A (row block at packed_a) and as rows k0 .. of packed B of (k, cols) (as
//   bf16_pack_b_rows): the bits of bias_gelu_backward_bf16 followed by those packs (NaN where
//   x + bias was NaN).
// With AVX512-BF16 each value is rounded into every layout from the registers that hold it,
// with no fp32 block written (the forward stages act's bf16 pairs in `scratch` for its
// transpose); otherwise through `scratch` in fp32. scratch: gelu_pack_scratch_size(cols)
// floats, overwritten.
int64_t gelu_pack_scratch_size(int64_t cols);
void bias_gelu_pack_both_bf16(float* x, const float* bias, int64_t k0, int64_t rows, int64_t k,
                              int64_t cols, uint16_t* packed_a, uint16_t* packed_at,
                              float* scratch);
void gelu_grad_pack_both_bf16(const float* grad, const float* dact, float* dbias, int64_t k0,
                              int64_t rows, int64_t k, int64_t cols, uint16_t* packed_a,
                              uint16_t* packed_b, float* scratch);

// ---- Bias ------------------------------------------------------------------------------
// y (rows, cols) += bias (cols) for every row.
void add_bias(float* y, const float* bias, int64_t rows, int64_t cols);
// out (n) = a + b element by element; out may alias a or b.
void add(const float* a, const float* b, float* out, int64_t n);
// dbias (cols) += column sums of dy (rows, cols).
void bias_backward(const float* dy, float* dbias, int64_t rows, int64_t cols);

// ---- LayerNorm -------------------------------------------------------------------------
// y (rows, cols) = (x - mean) * rstd * gamma + beta; writes mean (rows) and rstd (rows) for
// the backward pass. Overwrites y, mean, rstd. AVX-512 where the CPU has it, the same bits as
// layernorm_forward_reference (the scalar loops); likewise the backward pass.
void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y,
                       float* mean, float* rstd, int64_t rows, int64_t cols, float eps);
void layernorm_forward_reference(const float* x, const float* gamma, const float* beta, float* y,
                                 float* mean, float* rstd, int64_t rows, int64_t cols, float eps);
// Overwrites dx (rows, cols; may alias dy); accumulates (+=) dgamma (cols) and dbeta (cols).
void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t rows,
                        int64_t cols);
void layernorm_backward_reference(const float* dy, const float* x, const float* gamma,
                                  const float* mean, const float* rstd, float* dx, float* dgamma,
                                  float* dbeta, int64_t rows, int64_t cols);
// The same with the input gradient added into dx (+=; a residual stream's gradient), each
// element as dx + g: the bits of layernorm_backward into a scratch g followed by add(dx, g,
// dx), in one pass. dx must not alias dy.
void layernorm_backward_add(const float* dy, const float* x, const float* gamma,
                            const float* mean, const float* rstd, float* dx, float* dgamma,
                            float* dbeta, int64_t rows, int64_t cols);
void layernorm_backward_add_reference(const float* dy, const float* x, const float* gamma,
                                      const float* mean, const float* rstd, float* dx,
                                      float* dgamma, float* dbeta, int64_t rows, int64_t cols);

// ---- AdamW -----------------------------------------------------------------------------
// The update's scalars, in fp32 (derived in double by the caller: model/dense_ops.h).
struct AdamWScalars {
  float beta1 = 0.9f, beta2 = 0.95f;
  float grad_scale = 1.0f;    // g' = g * grad_scale
  float step_size = 0.0f;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2 = 1.0f;  // 1 / sqrt(1 - beta2^t)
  float eps = 1e-8f;
  float decay = 1.0f;         // 1 - lr * weight_decay, or 1
};
// Over n elements, each rounded in this order: g' = g * grad_scale; m = b1 m + (1 - b1) g';
// v = b2 v + (1 - b2) g' g'; w = w decay - step_size m / (sqrt(v) inv_sqrt_bc2 + eps).
// Overwrites w, m, v. AVX-512 where the CPU has it, the same bits as adamw_reference (the
// scalar loop).
void adamw(const AdamWScalars& s, float* w, const float* g, float* m, float* v, int64_t n);
void adamw_reference(const AdamWScalars& s, float* w, const float* g, float* m, float* v,
                     int64_t n);

// ---- Sum of squares (the gradient norm) ------------------------------------------------
// x[0]^2 + ... + x[n-1]^2 in double: element i is added into partial sum i mod 32, and the 32
// partial sums are added in order at the end. AVX-512 where the CPU has it, the same bits as
// sum_of_squares_reference (the scalar loop).
double sum_of_squares(const float* x, int64_t n);
double sum_of_squares_reference(const float* x, int64_t n);

// ---- Streaming writes --------------------------------------------------------------------
// For buffers written now and read only after much other traffic (the AllToAll's send
// buffers: the dispatched rows, the experts' outputs and their gradients): dst's cache lines
// are written without being read first (x86 non-temporal stores where dst is 16-byte
// aligned; a plain copy elsewhere), which halves the memory traffic of the write. The values
// are the plain copy's (scale_stream: each element w * src[i], rounded once). Call
// stream_fence() after the last write of a buffer and before anything reads it.
void copy_stream(float* dst, const float* src, int64_t n);
void scale_stream(float* dst, const float* src, float w, int64_t n);
void stream_fence();
// Whether a buffer of `bytes` is written with the streaming writes: one too large to still
// be in cache when it is read, stream_min_bytes() and more (smaller ones are read from
// cache). The threshold is kStreamMinBytes unless PARM_STREAM_MIN_BYTES (a byte count, read
// once; a count larger than any buffer turns the streaming writes off) says otherwise;
// a value that is not a count throws InvalidConfig naming it.
inline constexpr int64_t kStreamMinBytes = int64_t{8} << 20;
int64_t stream_min_bytes();
inline bool streamed(int64_t bytes) { return bytes >= stream_min_bytes(); }

// ---- Row gather / scatter-add ----------------------------------------------------------
// dst (n, cols): row i = src row idx[i] (idx[i] < 0: a zero row). Overwrites dst.
void gather_rows(const float* src, int64_t cols, const int64_t* idx, int64_t n, float* dst);
// dst row idx[i] += scale[i] * src row i for i < n (scale may be null: 1). idx[i] < 0 is
// skipped. Accumulates into dst; repeated indices add up.
void scatter_add_rows(const float* src, int64_t cols, const int64_t* idx, const float* scale,
                      int64_t n, float* dst);
// dst (cols) += scale[i] * src row idx[i], for i = 0 .. n - 1 in that order (scale may be null:
// 1; idx[i] < 0 is skipped): the combine's weighted sum of a token's rows and the dispatch's
// adjoint. Every element rounds as the plain loop does.
void gather_add_rows(const float* src, int64_t cols, const int64_t* idx, const float* scale,
                     int64_t n, float* dst);
// sum_i a[i] b[i] over n floats, in 16 lanes (element i into lane i % 16) added in lane order
// at the end: the same bits on every rank, run and instruction set.
float dot_lanes(const float* a, const float* b, int64_t n);

}  // namespace parm::cpu
