// The attention core on the GPU (model::attention_forward / attention_backward): per head, one
// cuBLAS strided-batched product over the batch for each product of the CPU loop
// (dense_math.h HeadBatch), and the scale, the mask and the softmax (or its adjoint) in one
// 16-lane row kernel (dense_rows.cuh) over the rows of every head at once (forward) or of
// one head (backward, whose scores live in the workspace). Why not a flash kernel: see
// dense_kernels.h.
#include <cmath>

#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/dense_rows.cuh"
#include "kernels/cuda/dense_scratch.h"
#include "kernels/cuda/dense_checks.h"

namespace parm::cuda {
namespace {

using namespace dense;
using dense_math::keys_seen;

int to_int(int64_t v, const char* what) { return cublas_int(v, "attention", what); }

// An operand of the products: fp32 data, or its bf16 copy; offsets count elements.
struct Operand {
  const void* base = nullptr;
  bool bf16 = false;
  const void* at(int64_t offset) const {
    return static_cast<const char*>(base) + offset * (bf16 ? 2 : 4);
  }
};

// x itself at fp32; at bf16 its rounding (n elements) in the workspace slot.
Operand operand(Precision p, const float* x, int64_t n, Slot slot) {
  if (p != Precision::kBf16) return {x, false};
  uint16_t* h = scratch_as<uint16_t>(slot, n);
  to_bf16(x, h, n);
  return {h, true};
}

// One row-major product per sequence, C_b (m, n) = op(A_b) op(B_b) (overwrites), where X_b
// starts at x + b * stride_x, with leading dimensions lda, ldb, ldc.
void batched_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
                  int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b,
                  float* c, int64_t ldc, int64_t stride_c, int64_t batch, bool bf16) {
  const ColumnMajorGemm g = dense_math::column_major_gemm_ld(trans_a, trans_b, m, n, k, lda, ldb,
                                                             ldc);
  const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const float alpha = 1.0f, beta = 0.0f;
  PARM_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      context().cublas, g.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N,
      g.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N, to_int(g.m, "n"), to_int(g.n, "m"),
      to_int(g.k, "k"), &alpha, b, t, to_int(g.ld_first, "ldb"), stride_b, a, t,
      to_int(g.ld_second, "lda"), stride_a, &beta, c, CUDA_R_32F, to_int(g.ldc, "ldc"), stride_c,
      to_int(batch, "batch"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Rows of probs (B, heads, L, L), in place: scale, mask and softmax (row r is query r mod L).
__global__ void masked_softmax_kernel(float* probs, int64_t rows, int64_t seq_len, bool causal,
                                      float scale) {
  for (int64_t r = group_index(); r < rows; r += group_stride()) {
    float* row = probs + r * seq_len;
    softmax_row(row, row, keys_seen(r % seq_len, seq_len, causal), seq_len, scale);
  }
}

// One head's dscores (B, L, L), in place: through the softmax of its probs (row i of
// sequence b at probs_head + b * probs_stride + i * L), then the scale; masked entries 0.
__global__ void masked_softmax_backward_kernel(const float* probs_head, int64_t probs_stride,
                                               float* dscores, int64_t rows, int64_t seq_len,
                                               bool causal, float scale) {
  for (int64_t r = group_index(); r < rows; r += group_stride()) {
    const int64_t b = r / seq_len, i = r % seq_len;
    float* ds = dscores + r * seq_len;
    softmax_backward_row(probs_head + b * probs_stride + i * seq_len, ds, ds,
                         keys_seen(i, seq_len, causal), seq_len, scale);
  }
}

void check_shape(const AttentionShape& s, const char* op) {
  check_sizes(s.batch >= 0 && s.seq_len >= 0 && s.heads >= 0 && s.head_dim > 0, op,
              "B, L, heads, D", {s.batch, s.seq_len, s.heads, s.head_dim},
              "B, L, heads >= 0, D > 0");
}

}  // namespace

void attention_forward(const AttentionShape& s, const float* q, const float* k,
                       const float* v, float* probs, float* out) {
  check_shape(s, "attention_forward");
  const int64_t B = s.batch, L = s.seq_len, H = s.heads, D = s.head_dim, W = s.width();
  if (B == 0 || L == 0 || H == 0) return;
  const dense_math::HeadBatch hb = dense_math::head_batch(L, H, D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));  // as the CPU computes it
  const int64_t act = B * L * W;
  const Operand q_op = operand(s.precision, q, act, Slot::kAttnQ);
  const Operand k_op = operand(s.precision, k, act, Slot::kAttnK);
  const Operand v_op = operand(s.precision, v, act, Slot::kAttnV);
  const bool bf16 = s.precision == Precision::kBf16;
  for (int64_t h = 0; h < H; ++h)  // scores = q k^T, per sequence
    batched_gemm(false, true, L, L, D, q_op.at(hb.head_offset(h, D)), hb.ld, hb.head_stride,
                 k_op.at(hb.head_offset(h, D)), hb.ld, hb.head_stride,
                 probs + hb.probs_offset(h, L), L, hb.probs_stride, B, bf16);
  const int64_t rows = B * H * L;
  masked_softmax_kernel<<<row_group_blocks(rows), kThreads, 0, stream()>>>(probs, rows, L,
                                                                           s.causal, scale);
  PARM_CUDA_CHECK_LAUNCH();
  const Operand p_op = operand(s.precision, probs, rows * L, Slot::kAttnP);
  for (int64_t h = 0; h < H; ++h)  // out = p v
    batched_gemm(false, false, L, D, L, p_op.at(hb.probs_offset(h, L)), L, hb.probs_stride,
                 v_op.at(hb.head_offset(h, D)), hb.ld, hb.head_stride,
                 out + hb.head_offset(h, D), hb.ld, hb.head_stride, B, bf16);
}

void attention_backward(const AttentionShape& s, const float* q, const float* k,
                        const float* v, const float* probs, const float* dout, float* dq,
                        float* dk, float* dv, float* /*dscores: the workspace's instead*/) {
  check_shape(s, "attention_backward");
  const int64_t B = s.batch, L = s.seq_len, H = s.heads, D = s.head_dim, W = s.width();
  if (B == 0 || L == 0 || H == 0) return;
  const dense_math::HeadBatch hb = dense_math::head_batch(L, H, D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t act = B * L * W;
  const bool bf16 = s.precision == Precision::kBf16;
  const Operand q_op = operand(s.precision, q, act, Slot::kAttnQ);
  const Operand k_op = operand(s.precision, k, act, Slot::kAttnK);
  const Operand v_op = operand(s.precision, v, act, Slot::kAttnV);
  const Operand dout_op = operand(s.precision, dout, act, Slot::kAttnDout);
  const Operand p_op = operand(s.precision, probs, B * H * L * L, Slot::kAttnP);
  float* ds = scratch_as<float>(Slot::kAttnScores, B * L * L);  // one head's (B, L, L)
  const int64_t ds_stride = L * L;
  for (int64_t h = 0; h < H; ++h) {
    const int64_t off = hb.head_offset(h, D);
    const int64_t poff = hb.probs_offset(h, L);
    // dv = p^T dout; dp = dout v^T
    batched_gemm(true, false, L, D, L, p_op.at(poff), L, hb.probs_stride, dout_op.at(off), hb.ld,
                 hb.head_stride, dv + off, hb.ld, hb.head_stride, B, bf16);
    batched_gemm(false, true, L, L, D, dout_op.at(off), hb.ld, hb.head_stride, v_op.at(off),
                 hb.ld, hb.head_stride, ds, L, ds_stride, B, bf16);
    masked_softmax_backward_kernel<<<row_group_blocks(B * L), kThreads, 0, stream()>>>(
        probs + poff, hb.probs_stride, ds, B * L, L, s.causal, scale);
    PARM_CUDA_CHECK_LAUNCH();
    const Operand ds_op = operand(s.precision, ds, B * L * L, Slot::kAttnScores16);
    // dq = ds k; dk = ds^T q
    batched_gemm(false, false, L, D, L, ds_op.at(0), L, ds_stride, k_op.at(off), hb.ld,
                 hb.head_stride, dq + off, hb.ld, hb.head_stride, B, bf16);
    batched_gemm(true, false, L, D, L, ds_op.at(0), L, ds_stride, q_op.at(off), hb.ld,
                 hb.head_stride, dk + off, hb.ld, hb.head_stride, B, bf16);
  }
}

}  // namespace parm::cuda
