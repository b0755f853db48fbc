// LayerNorm over the last dimension, with the statistics saved for the backward pass.
// AVX-512, 16 columns at a time, where the CPU has it, else the scalar loops. Both keep the
// same 16 partial sums per row and add them in the same order, and round every element's
// expression in the same order (this file is compiled with -ffp-contract=off, so neither
// fuses a multiply into an add), so they give the same bits: the scalar loops are the
// oracle. The 16 partial sums are added in lane order (the order the CUDA kernels reproduce,
// kernels/cuda/dense_math.h), straight from the register (avx512.h: lane_sum_avx512): going through
// memory made the forward pass slower than GCC's own loops.
// (GCC's own vectorisation of the backward pass shuffled the lanes of every block with
// permutes and ran it at a third of this speed.)
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/avx512.h"
#include "kernels/cpu/vec_math.h"
#include "parm/error.h"


namespace parm::cpu {
namespace {

constexpr int kL = detail::kLanes;

static_assert(kL == 16, "lane_sum_avx512 adds 16 lanes");

// The 16 lanes added in lane order, then the tail elements `tail(c)` for c in [c0, cols).
template <typename Tail>
float finish_sum(const float (&acc)[kL], int64_t c0, int64_t cols, Tail&& tail) {
  float s = 0.0f;
  for (int j = 0; j < kL; ++j) s += acc[j];
  for (int64_t c = c0; c < cols; ++c) s += tail(c);
  return s;
}

// One row's statistics and output; writes its mean and rstd.
void layernorm_row_scalar(const float* xr, const float* gamma, const float* beta, float* yr,
                          int64_t cols, float inv_cols, float eps, float* mu_out, float* rs_out) {
  float acc[kL] = {};
  int64_t c = 0;
  for (; c + kL <= cols; c += kL)
    for (int j = 0; j < kL; ++j) acc[j] += xr[c + j];
  const float mu = finish_sum(acc, c, cols, [&](int64_t i) { return xr[i]; }) * inv_cols;
  // Two passes: the variance of centred values does not cancel catastrophically.
  for (int j = 0; j < kL; ++j) acc[j] = 0.0f;
  for (c = 0; c + kL <= cols; c += kL)
    for (int j = 0; j < kL; ++j) {
      const float d = xr[c + j] - mu;
      acc[j] += d * d;
    }
  float var = finish_sum(acc, c, cols, [&](int64_t i) { return (xr[i] - mu) * (xr[i] - mu); });
  var *= inv_cols;  // biased variance, as in the usual LayerNorm definition
  const float rs = 1.0f / std::sqrt(var + eps);
  for (c = 0; c < cols; ++c) yr[c] = (xr[c] - mu) * rs * gamma[c] + beta[c];
  *mu_out = mu;
  *rs_out = rs;
}

void layernorm_backward_row_scalar(const float* dyr, const float* xr, const float* gamma, float mu,
                                   float rs, float* dxr, float* dgamma, float* dbeta, int64_t cols,
                                   float inv_cols, bool accumulate) {
  float acc_g[kL] = {};
  float acc_gx[kL] = {};
  int64_t c = 0;
  for (; c + kL <= cols; c += kL)
    for (int j = 0; j < kL; ++j) {
      const float xhat = (xr[c + j] - mu) * rs;
      const float g = dyr[c + j] * gamma[c + j];
      acc_g[j] += g;
      acc_gx[j] += g * xhat;
    }
  const float sum_g = finish_sum(acc_g, c, cols, [&](int64_t i) { return dyr[i] * gamma[i]; });
  const float sum_gx = finish_sum(acc_gx, c, cols, [&](int64_t i) {
    return dyr[i] * gamma[i] * ((xr[i] - mu) * rs);
  });
  const float mean_g = sum_g * inv_cols;
  const float mean_gx = sum_gx * inv_cols;
  for (c = 0; c < cols; ++c) {
    dgamma[c] += dyr[c] * ((xr[c] - mu) * rs);
    dbeta[c] += dyr[c];
  }
  // Last, so that dx may alias dy.
  for (c = 0; c < cols; ++c) {
    const float xhat = (xr[c] - mu) * rs;
    const float d = rs * (dyr[c] * gamma[c] - mean_g - xhat * mean_gx);
    dxr[c] = accumulate ? dxr[c] + d : d;
  }
}

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_ps and warn about it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// The scalar row, 16 columns at a time, for R rows at once (row i at x + i * cols): each
// row's sums end in serial adds, and R rows' chains overlap. The last cols % 16 columns go as
// the scalar loops do them.
template <int R>
PARM_AVX512 void layernorm_rows_avx512(const float* x, const float* gamma, const float* beta,
                                       float* y, int64_t cols, float inv_cols, float eps,
                                       float* mean, float* rstd) {
  const int64_t body = cols / kL * kL;
  __m512 s[R];
  for (int i = 0; i < R; ++i) s[i] = _mm512_setzero_ps();
  for (int64_t c = 0; c < body; c += kL)
    for (int i = 0; i < R; ++i) s[i] = _mm512_add_ps(s[i], _mm512_loadu_ps(x + i * cols + c));
  float mu[R];
  __m512 vmu[R], q[R];
  for (int i = 0; i < R; ++i) {
    const float* xr = x + i * cols;
    float sum = detail::lane_sum_avx512(s[i]);
    for (int64_t c = body; c < cols; ++c) sum += xr[c];
    mu[i] = sum * inv_cols;
    vmu[i] = _mm512_set1_ps(mu[i]);
    q[i] = _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < body; c += kL)
    for (int i = 0; i < R; ++i) {
      const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i * cols + c), vmu[i]);
      q[i] = _mm512_add_ps(q[i], _mm512_mul_ps(d, d));
    }
  for (int i = 0; i < R; ++i) {
    const float* xr = x + i * cols;
    float* yr = y + i * cols;
    float var = detail::lane_sum_avx512(q[i]);
    for (int64_t c = body; c < cols; ++c) var += (xr[c] - mu[i]) * (xr[c] - mu[i]);
    var *= inv_cols;
    const float rs = 1.0f / std::sqrt(var + eps);
    const __m512 vrs = _mm512_set1_ps(rs);
    for (int64_t c = 0; c < body; c += kL) {
      const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(xr + c), vmu[i]), vrs);
      _mm512_storeu_ps(yr + c, _mm512_add_ps(_mm512_mul_ps(xhat, _mm512_loadu_ps(gamma + c)),
                                             _mm512_loadu_ps(beta + c)));
    }
    for (int64_t c = body; c < cols; ++c) yr[c] = (xr[c] - mu[i]) * rs * gamma[c] + beta[c];
    mean[i] = mu[i];
    rstd[i] = rs;
  }
}

PARM_AVX512 void layernorm_forward_avx512(const float* x, const float* gamma, const float* beta,
                                          float* y, float* mean, float* rstd, int64_t rows,
                                          int64_t cols, float inv_cols, float eps) {
  constexpr int kRows = 4;
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows)
    layernorm_rows_avx512<kRows>(x + r * cols, gamma, beta, y + r * cols, cols, inv_cols, eps,
                                 mean + r, rstd + r);
  for (; r < rows; ++r)
    layernorm_rows_avx512<1>(x + r * cols, gamma, beta, y + r * cols, cols, inv_cols, eps,
                             mean + r, rstd + r);
}

PARM_AVX512 void layernorm_backward_row_avx512(const float* dyr, const float* xr,
                                               const float* gamma, float mu, float rs, float* dxr,
                                               float* dgamma, float* dbeta, int64_t cols,
                                               float inv_cols, bool accumulate) {
  const int64_t body = cols / kL * kL;
  const __m512 vmu = _mm512_set1_ps(mu), vrs = _mm512_set1_ps(rs);
  __m512 sg = _mm512_setzero_ps(), sgx = _mm512_setzero_ps();
  for (int64_t c = 0; c < body; c += kL) {
    const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(xr + c), vmu), vrs);
    const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(dyr + c), _mm512_loadu_ps(gamma + c));
    sg = _mm512_add_ps(sg, g);
    sgx = _mm512_add_ps(sgx, _mm512_mul_ps(g, xhat));
  }
  float sum_g = detail::lane_sum_avx512(sg), sum_gx = detail::lane_sum_avx512(sgx);
  for (int64_t c = body; c < cols; ++c) {
    const float g = dyr[c] * gamma[c];
    sum_g += g;
    sum_gx += g * ((xr[c] - mu) * rs);
  }
  const float mean_g = sum_g * inv_cols;
  const float mean_gx = sum_gx * inv_cols;
  const __m512 vmg = _mm512_set1_ps(mean_g), vmgx = _mm512_set1_ps(mean_gx);
  // One pass: dy is read before dx is written, block by block, so dx may alias dy.
  for (int64_t c = 0; c < body; c += kL) {
    const __m512 dy = _mm512_loadu_ps(dyr + c);
    const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(xr + c), vmu), vrs);
    _mm512_storeu_ps(dgamma + c, _mm512_add_ps(_mm512_loadu_ps(dgamma + c), _mm512_mul_ps(dy, xhat)));
    _mm512_storeu_ps(dbeta + c, _mm512_add_ps(_mm512_loadu_ps(dbeta + c), dy));
    const __m512 g = _mm512_mul_ps(dy, _mm512_loadu_ps(gamma + c));
    const __m512 d =
        _mm512_mul_ps(vrs, _mm512_sub_ps(_mm512_sub_ps(g, vmg), _mm512_mul_ps(xhat, vmgx)));
    _mm512_storeu_ps(dxr + c, accumulate ? _mm512_add_ps(_mm512_loadu_ps(dxr + c), d) : d);
  }
  for (int64_t c = body; c < cols; ++c) {
    const float xhat = (xr[c] - mu) * rs;
    const float dy = dyr[c];
    dgamma[c] += dy * xhat;
    dbeta[c] += dy;
    const float d = rs * (dy * gamma[c] - mean_g - xhat * mean_gx);
    dxr[c] = accumulate ? dxr[c] + d : d;
  }
}
#pragma GCC diagnostic pop


void check_shape(const char* op, int64_t rows, int64_t cols) {
  PARM_CHECK(rows >= 0 && cols > 0, "{}: bad shape ({}, {}): rows >= 0 and cols > 0", op, rows,
             cols);
}

void forward_rows(bool vector, const float* x, const float* gamma, const float* beta, float* y,
                  float* mean, float* rstd, int64_t rows, int64_t cols, float eps) {
  check_shape("layernorm_forward", rows, cols);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  if (vector) {
    layernorm_forward_avx512(x, gamma, beta, y, mean, rstd, rows, cols, inv_cols, eps);
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    layernorm_row_scalar(x + r * cols, gamma, beta, y + r * cols, cols, inv_cols, eps, &mean[r],
                         &rstd[r]);
}

// With xhat = (x - mean) rstd and g = dy gamma:
//   dx = rstd (g - mean_c(g) - xhat mean_c(g xhat)),  dgamma += sum_r dy xhat,  dbeta += sum_r dy.
void backward_rows(bool vector, const float* dy, const float* x, const float* gamma,
                   const float* mean, const float* rstd, float* dx, float* dgamma, float* dbeta,
                   int64_t rows, int64_t cols, bool accumulate) {
  check_shape(accumulate ? "layernorm_backward_add" : "layernorm_backward", rows, cols);
  PARM_CHECK(!accumulate || dx != dy || rows == 0,
             "layernorm_backward_add: dx (rows {}, cols {}) aliases dy; it adds into dx", rows,
             cols);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = r * cols;
    if (vector)
      layernorm_backward_row_avx512(dy + o, x + o, gamma, mean[r], rstd[r], dx + o, dgamma, dbeta,
                                    cols, inv_cols, accumulate);
    else
      layernorm_backward_row_scalar(dy + o, x + o, gamma, mean[r], rstd[r], dx + o, dgamma, dbeta,
                                    cols, inv_cols, accumulate);
  }
}

}  // namespace

void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd, int64_t rows, int64_t cols, float eps) {
  forward_rows(detail::have_avx512f(), x, gamma, beta, y, mean, rstd, rows, cols, eps);
}

void layernorm_forward_reference(const float* x, const float* gamma, const float* beta, float* y,
                                 float* mean, float* rstd, int64_t rows, int64_t cols, float eps) {
  forward_rows(false, x, gamma, beta, y, mean, rstd, rows, cols, eps);
}

void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t rows,
                        int64_t cols) {
  backward_rows(detail::have_avx512f(), dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, cols,
                false);
}

void layernorm_backward_reference(const float* dy, const float* x, const float* gamma,
                                  const float* mean, const float* rstd, float* dx, float* dgamma,
                                  float* dbeta, int64_t rows, int64_t cols) {
  backward_rows(false, dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, cols, false);
}

void layernorm_backward_add(const float* dy, const float* x, const float* gamma,
                            const float* mean, const float* rstd, float* dx, float* dgamma,
                            float* dbeta, int64_t rows, int64_t cols) {
  backward_rows(detail::have_avx512f(), dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, cols,
                true);
}

void layernorm_backward_add_reference(const float* dy, const float* x, const float* gamma,
                                      const float* mean, const float* rstd, float* dx,
                                      float* dgamma, float* dbeta, int64_t rows, int64_t cols) {
  backward_rows(false, dy, x, gamma, mean, rstd, dx, dgamma, dbeta, rows, cols, true);
}

}  // namespace parm::cpu
