// Per-element and per-row maths of the dense CUDA kernels (dense_kernels.h), as
// __host__ __device__ inline functions: the kernels call them on the GPU, and g++ compiles the
// same code for the CPU unit tests (tests/unit/test_cuda_dense_math.cpp), which check them
// against the CPU kernels. No CUDA headers.
//
// Contraction: nvcc fuses a * b + c into one FMA (one rounding) where the baseline CPU code
// rounds the product first; mul_nc (kernels/math/moe_math.h) rounds a product on its own (__fmul_rn on
// the GPU, which nvcc never contracts), so the functions below compute the CPU source's
// expressions in its order. Division and sqrt are IEEE-rounded on both sides (the build does
// not use --use_fast_math). The exponential is moe_math.h's exp_f32, the CPU kernels' exp
// (no clone of it fuses a product: the CPU library is built with -ffp-contract=off).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/expert_math.h"
#include "kernels/cuda/gemm_args.h"
#include "kernels/math/float_bits.h"
#include "kernels/math/moe_math.h"

namespace parm::cuda::dense_math {

using math::exp_f32;
using math::mul_nc;

// ---- The CPU's ordered row sums (kernels/cpu/vec_math.h sum_f32, layernorm.cpp) ----------
// The CPU sums a row of n values in kLanes lanes: lane j adds elements j, j + kLanes, ... of
// the first lane_span(n) elements in order; then the lanes are added in order 0..kLanes-1,
// then the tail elements lane_span(n) .. n-1 one by one. The GPU runs lane j on thread j of
// a group of kLanes threads, and every thread of the group then adds the lanes and the tail
// (dense_rows.cuh group_sum): the CPU's order, and so its sums' bits.
using math::kLanes;
PARM_HD inline int64_t lane_span(int64_t n) { return n - n % kLanes; }

// Lane `lane` of the sum of f(c) over c < n.
template <class F>
PARM_HD inline float lane_partial(int64_t n, int lane, F f) {
  float acc = 0.0f;
  for (int64_t c = lane; c < lane_span(n); c += kLanes) acc += f(c);
  return acc;
}
// The whole sum from the kLanes lane partials.
template <class F>
PARM_HD inline float finish_lanes(const float* lanes, int64_t n, F f) {
  float s = 0.0f;
  for (int j = 0; j < kLanes; ++j) s += lanes[j];
  for (int64_t c = lane_span(n); c < n; ++c) s += f(c);
  return s;
}

// ---- LayerNorm (kernels/cpu/layernorm.cpp) -------------------------------------------------
// mean = sum(x) * (1 / cols); var = sum((x - mean)^2) * (1 / cols) (biased, two passes);
// rstd = 1 / sqrt(var + eps).
PARM_HD inline float inv_count(int64_t cols) { return 1.0f / static_cast<float>(cols); }
PARM_HD inline float centred_square(float x, float mean) {
  const float d = x - mean;
  return mul_nc(d, d);
}
PARM_HD inline float rstd_of(float sum_sq, int64_t cols, float eps) {
  return 1.0f / sqrtf(mul_nc(sum_sq, inv_count(cols)) + eps);
}
PARM_HD inline float xhat(float x, float mean, float rstd) { return mul_nc(x - mean, rstd); }
// y = (x - mean) * rstd * gamma + beta
PARM_HD inline float layernorm_y(float x, float mean, float rstd, float gamma, float beta) {
  return mul_nc(xhat(x, mean, rstd), gamma) + beta;
}
// dx = rstd (dy gamma - mean_g - xhat mean_gx), mean_g = mean(dy gamma),
// mean_gx = mean(dy gamma xhat).
PARM_HD inline float layernorm_dx(float dy, float gamma, float xh, float rstd, float mean_g,
                                  float mean_gx) {
  return mul_nc(rstd, mul_nc(dy, gamma) - mean_g - mul_nc(xh, mean_gx));
}

// ---- Attention (model/attention.cpp) ---------------------------------------------------------
// Keys that query row i of an (L, L) score block sees: j < keys_seen(i); the rest is masked
// (probability 0, no gradient).
PARM_HD inline int64_t keys_seen(int64_t i, int64_t seq_len, bool causal) {
  return causal ? i + 1 : seq_len;
}

// The attention's products batched per head over the sequences of the batch: for head h,
// sequence b's (L, D) block of q, k, v, out (and dq, dk, dv) starts at
// b * head_stride + head_offset(h) with row stride ld, and its (L, L) block of probs (and of
// the scores) at b * probs_stride + probs_offset(h). One cuBLAS strided-batched call per head
// covers the batch: the stride between sequences is a constant for a fixed head, while the
// (sequence, head) pairs together have no single stride.
struct HeadBatch {
  int64_t ld = 0;            // W = heads * D: row stride of q, k, v, out
  int64_t head_stride = 0;   // L * W: from one sequence's rows to the next
  int64_t probs_stride = 0;  // heads * L * L: from one sequence's probs to the next
  int64_t head_offset(int64_t h, int64_t head_dim) const { return h * head_dim; }
  int64_t probs_offset(int64_t h, int64_t seq_len) const { return h * seq_len * seq_len; }
};
inline HeadBatch head_batch(int64_t seq_len, int64_t heads, int64_t head_dim) {
  HeadBatch hb;
  hb.ld = heads * head_dim;
  hb.head_stride = seq_len * hb.ld;
  hb.probs_stride = heads * seq_len * seq_len;
  return hb;
}

// A row-major product with leading dimensions (cpu::gemm's strided form) as cuBLAS's
// column-major call: column_major_gemm (gemm_args.h) with the stored row lengths as the
// leading dimensions.
inline ColumnMajorGemm column_major_gemm_ld(bool trans_a, bool trans_b, int64_t m, int64_t n,
                                            int64_t k, int64_t lda, int64_t ldb, int64_t ldc) {
  ColumnMajorGemm g = column_major_gemm(trans_a, trans_b, m, n, k);
  g.ld_first = ldb < 1 ? 1 : ldb;
  g.ld_second = lda < 1 ? 1 : lda;
  g.ldc = ldc < 1 ? 1 : ldc;
  return g;
}

// ---- Cross-entropy (model/loss.cpp) ----------------------------------------------------------
// log-sum-exp of a row as a running (max, sum of exp(x - max)) pair: each thread folds in its
// elements, then the pairs merge in a fixed tree. The sum is kept in double (the CPU sums in
// double); each exponential is taken in fp32 of x - max (the CPU: double of that fp32
// difference), within 2 ulp of the CPU's term.
struct LogSumExp {
  float max = -INFINITY;
  double sum = 0.0;  // of exp(x - max)
};
PARM_HD inline void lse_add(LogSumExp& a, float x) {
  if (x == -INFINITY) return;  // adds exp(-inf) = 0 (and -inf - -inf would be NaN)
  if (x > a.max) {
    a.sum = a.sum * static_cast<double>(expert_math::exp_f32(a.max - x)) + 1.0;  // exp(-inf) = 0 at the start
    a.max = x;
  } else {
    a.sum += static_cast<double>(expert_math::exp_f32(x - a.max));
  }
}
PARM_HD inline LogSumExp lse_merge(const LogSumExp& a, const LogSumExp& b) {
  if (b.max == -INFINITY) return a;
  if (a.max == -INFINITY) return b;
  LogSumExp r;
  if (a.max >= b.max) {
    r.max = a.max;
    r.sum = a.sum + b.sum * static_cast<double>(expert_math::exp_f32(b.max - a.max));
  } else {
    r.max = b.max;
    r.sum = b.sum + a.sum * static_cast<double>(expert_math::exp_f32(a.max - b.max));
  }
  return r;
}
// log(sum exp(x)) = log(sum) + max.
PARM_HD inline double lse_value(const LogSumExp& a) {
  return ::log(a.sum) + static_cast<double>(a.max);
}
// dlogits of one element: scale * exp(x - log_z), minus scale at the target.
PARM_HD inline float ce_grad(float x, double log_z, float scale, bool is_target) {
  const float p = static_cast<float>(::exp(static_cast<double>(x) - log_z));
  const float d = mul_nc(scale, p);
  return is_target ? d - scale : d;
}

// ---- AdamW (train/optimizer.cpp AdamW::step) ------------------------------------------------
// The per-call scalars, derived as the CPU derives them (host only).
struct AdamWScalars {
  float beta1 = 0, beta2 = 0, grad_scale = 1, step_size = 0, inv_sqrt_bc2 = 1, eps = 0,
        decay = 1;
};
inline AdamWScalars adamw_scalars(double lr, double beta1, double beta2, double eps,
                                  double weight_decay, int64_t step, double grad_scale,
                                  bool decays) {
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  AdamWScalars s;
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.grad_scale = static_cast<float>(grad_scale);
  s.step_size = static_cast<float>(lr / bc1);
  s.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  s.eps = static_cast<float>(eps);
  s.decay = decays ? static_cast<float>(1.0 - lr * weight_decay) : 1.0f;
  return s;
}
// One element: g scaled, then m, v, w in the CPU's expression order.
PARM_HD inline void adamw_update(float& w, float g, float& m, float& v, const AdamWScalars& s) {
  const float gj = mul_nc(g, s.grad_scale);
  m = mul_nc(s.beta1, m) + mul_nc(1.0f - s.beta1, gj);
  v = mul_nc(s.beta2, v) + mul_nc(mul_nc(1.0f - s.beta2, gj), gj);
  const float denom = mul_nc(sqrtf(v), s.inv_sqrt_bc2) + s.eps;
  w = mul_nc(w, s.decay) - mul_nc(s.step_size, m) / denom;
}

}  // namespace parm::cuda::dense_math
