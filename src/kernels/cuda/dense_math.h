// Per-element and per-row maths of the dense CUDA kernels (dense_kernels.h), as
// __host__ __device__ inline functions: the kernels call them on the GPU, and g++ compiles the
// same code for the CPU unit tests (tests/unit/test_cuda_dense_math.cpp), which check them
// against the CPU kernels. No CUDA headers.
//
// Contraction: nvcc fuses a * b + c into one FMA (one rounding) where the CPU kernels round
// the product first. mul_rn / add_rn / div_rn / sqrt_rn round each operation on its own
// (__fmul_rn etc. on the GPU, which nvcc never contracts), so the functions below give the
// CPU's bits where the CPU code computes the same expression in the same order.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/gemm_args.h"
#include "kernels/cuda/host_device.h"

namespace parm::cuda::dense_math {

PARM_HD inline float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
PARM_HD inline float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
PARM_HD inline float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
PARM_HD inline float sqrt_rn(float a) {
#ifdef __CUDA_ARCH__
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// ---- The CPU's ordered row sums (kernels/cpu/vec_math.h sum_f32, layernorm.cpp) ----------
// The CPU sums a row of n values in kLanes lanes: lane j adds elements j, j + kLanes, ... of
// the first lane_span(n) elements in order; then the lanes are added in order 0..kLanes-1,
// then the tail elements lane_span(n) .. n-1 one by one. The GPU runs lane j on thread j of
// a group of kLanes threads and the rest on the group's first thread: the CPU's order, and
// so its bits.
inline constexpr int kLanes = 16;
PARM_HD inline int64_t lane_span(int64_t n) { return n - n % kLanes; }

// Lane `lane` of the sum of f(c) over c < n.
template <class F>
PARM_HD inline float lane_partial(int64_t n, int lane, F f) {
  float acc = 0.0f;
  for (int64_t c = lane; c < lane_span(n); c += kLanes) acc = add_rn(acc, f(c));
  return acc;
}
// The whole sum from the kLanes lane partials.
template <class F>
PARM_HD inline float finish_lanes(const float* lanes, int64_t n, F f) {
  float s = 0.0f;
  for (int j = 0; j < kLanes; ++j) s = add_rn(s, lanes[j]);
  for (int64_t c = lane_span(n); c < n; ++c) s = add_rn(s, f(c));
  return s;
}

// ---- LayerNorm (kernels/cpu/layernorm.cpp) -------------------------------------------------
// mean = sum(x) * (1 / cols); var = sum((x - mean)^2) * (1 / cols) (biased, two passes);
// rstd = 1 / sqrt(var + eps).
PARM_HD inline float inv_count(int64_t cols) { return div_rn(1.0f, static_cast<float>(cols)); }
PARM_HD inline float centred_square(float x, float mean) {
  const float d = x - mean;
  return mul_rn(d, d);
}
PARM_HD inline float rstd_of(float sum_sq, int64_t cols, float eps) {
  return div_rn(1.0f, sqrt_rn(add_rn(mul_rn(sum_sq, inv_count(cols)), eps)));
}
PARM_HD inline float xhat(float x, float mean, float rstd) { return mul_rn(x - mean, rstd); }
// y = (x - mean) * rstd * gamma + beta
PARM_HD inline float layernorm_y(float x, float mean, float rstd, float gamma, float beta) {
  return add_rn(mul_rn(xhat(x, mean, rstd), gamma), beta);
}
// dx = rstd (dy gamma - mean_g - xhat mean_gx), mean_g = mean(dy gamma),
// mean_gx = mean(dy gamma xhat).
PARM_HD inline float layernorm_dx(float dy, float gamma, float xh, float rstd, float mean_g,
                                  float mean_gx) {
  return mul_rn(rstd, mul_rn(dy, gamma) - mean_g - mul_rn(xh, mean_gx));
}

// ---- exp as the CPU kernels compute it (kernels/cpu/vec_math.h exp_f32) ---------------------
// The same steps with each operation rounded on its own, so the GPU's softmax takes the CPU's
// exponentials (within 2 ulp of exp). NaN stays NaN; exp(-inf) = 0, exp(+inf) = +inf.
PARM_HD inline float exp_cpu(float x) {
  constexpr float kLo = -104.0f;
  constexpr float kHi = 89.0f;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;
  const bool nan = (float_to_bits(x) & 0x7fffffffu) > 0x7f800000u;
  const float xc = nan ? (float_to_bits(x) >> 31 ? kLo : kHi) : (x < kLo ? kLo : (x > kHi ? kHi : x));
  const float n = add_rn(mul_rn(xc, kLog2e), kRound) - kRound;
  float r = xc - mul_rn(n, kLn2Hi);
  r = r - mul_rn(n, kLn2Lo);
  float p = add_rn(1.0f / 5040.0f, mul_rn(r, 1.0f / 40320.0f));
  p = add_rn(1.0f / 720.0f, mul_rn(r, p));
  p = add_rn(1.0f / 120.0f, mul_rn(r, p));
  p = add_rn(1.0f / 24.0f, mul_rn(r, p));
  p = add_rn(1.0f / 6.0f, mul_rn(r, p));
  p = add_rn(0.5f, mul_rn(r, p));
  p = add_rn(1.0f, mul_rn(r, p));
  p = add_rn(1.0f, mul_rn(r, p));
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1;
  const int32_t n2 = ni - n1;
  const float s1 = bits_to_float(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = bits_to_float(static_cast<uint32_t>(n2 + 127) << 23);
  const float y = mul_rn(mul_rn(p, s1), s2);
  return nan ? bits_to_float(float_to_bits(y) | 0x7fc00000u) : y;
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
PARM_HD inline float exp_f(float x) {
#ifdef __CUDA_ARCH__
  return expf(x);
#else
  return std::exp(x);
#endif
}
PARM_HD inline double exp_d(double x) {
#ifdef __CUDA_ARCH__
  return ::exp(x);
#else
  return std::exp(x);
#endif
}
PARM_HD inline double log_d(double x) {
#ifdef __CUDA_ARCH__
  return ::log(x);
#else
  return std::log(x);
#endif
}
PARM_HD inline void lse_add(LogSumExp& a, float x) {
  if (x == -INFINITY) return;  // adds exp(-inf) = 0 (and -inf - -inf would be NaN)
  if (x > a.max) {
    a.sum = a.sum * static_cast<double>(exp_f(a.max - x)) + 1.0;  // exp(-inf) = 0 at the start
    a.max = x;
  } else {
    a.sum += static_cast<double>(exp_f(x - a.max));
  }
}
PARM_HD inline LogSumExp lse_merge(const LogSumExp& a, const LogSumExp& b) {
  if (b.max == -INFINITY) return a;
  if (a.max == -INFINITY) return b;
  LogSumExp r;
  if (a.max >= b.max) {
    r.max = a.max;
    r.sum = a.sum + b.sum * static_cast<double>(exp_f(b.max - a.max));
  } else {
    r.max = b.max;
    r.sum = b.sum + a.sum * static_cast<double>(exp_f(a.max - b.max));
  }
  return r;
}
// log(sum exp(x)) = log(sum) + max.
PARM_HD inline double lse_value(const LogSumExp& a) {
  return log_d(a.sum) + static_cast<double>(a.max);
}
// dlogits of one element: scale * exp(x - log_z), minus scale at the target.
PARM_HD inline float ce_grad(float x, double log_z, float scale, bool is_target) {
  const float p = static_cast<float>(exp_d(static_cast<double>(x) - log_z));
  const float d = mul_rn(scale, p);
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
  const float gj = mul_rn(g, s.grad_scale);
  m = add_rn(mul_rn(s.beta1, m), mul_rn(1.0f - s.beta1, gj));
  v = add_rn(mul_rn(s.beta2, v), mul_rn(mul_rn(1.0f - s.beta2, gj), gj));
  const float denom = add_rn(mul_rn(sqrt_rn(v), s.inv_sqrt_bc2), s.eps);
  w = mul_rn(w, s.decay) - div_rn(mul_rn(s.step_size, m), denom);
}

}  // namespace parm::cuda::dense_math
