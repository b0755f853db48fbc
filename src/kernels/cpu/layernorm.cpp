// LayerNorm over the last dimension, with the statistics saved for the backward pass.
#include <cmath>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vec_math.h"
#include "parm/error.h"

namespace parm::cpu {

PARM_SIMD_CLONES
void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd, int64_t rows, int64_t cols, float eps) {
  PARM_CHECK(rows >= 0 && cols > 0, "layernorm_forward: bad shape ({}, {})", rows, cols);
  constexpr int kL = detail::kLanes;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    const float mu = detail::sum_f32(xr, cols) * inv_cols;
    // Two passes: the variance of centred values does not cancel catastrophically.
    float acc[kL] = {};
    int64_t c = 0;
    for (; c + kL <= cols; c += kL)
      for (int j = 0; j < kL; ++j) {
        const float d = xr[c + j] - mu;
        acc[j] += d * d;
      }
    float var = 0.0f;
    for (int j = 0; j < kL; ++j) var += acc[j];
    for (; c < cols; ++c) var += (xr[c] - mu) * (xr[c] - mu);
    var *= inv_cols;  // biased variance, as in the usual LayerNorm definition
    const float rs = 1.0f / std::sqrt(var + eps);
    for (c = 0; c < cols; ++c) yr[c] = (xr[c] - mu) * rs * gamma[c] + beta[c];
    mean[r] = mu;
    rstd[r] = rs;
  }
}

// With xhat = (x - mean) rstd and g = dy gamma:
//   dx = rstd (g - mean_c(g) - xhat mean_c(g xhat)),  dgamma += sum_r dy xhat,  dbeta += sum_r dy.
PARM_SIMD_CLONES
void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t rows,
                        int64_t cols) {
  PARM_CHECK(rows >= 0 && cols > 0, "layernorm_backward: bad shape ({}, {})", rows, cols);
  constexpr int kL = detail::kLanes;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * cols;
    const float* xr = x + r * cols;
    float* dxr = dx + r * cols;
    const float mu = mean[r];
    const float rs = rstd[r];
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
    float sum_g = 0.0f;
    float sum_gx = 0.0f;
    for (int j = 0; j < kL; ++j) {
      sum_g += acc_g[j];
      sum_gx += acc_gx[j];
    }
    for (; c < cols; ++c) {
      const float xhat = (xr[c] - mu) * rs;
      const float g = dyr[c] * gamma[c];
      sum_g += g;
      sum_gx += g * xhat;
    }
    const float mean_g = sum_g * inv_cols;
    const float mean_gx = sum_gx * inv_cols;
    for (c = 0; c < cols; ++c) {
      dgamma[c] += dyr[c] * ((xr[c] - mu) * rs);
      dbeta[c] += dyr[c];
    }
    // Last, so that dx may alias dy. Separate loops keep the alias checks few enough for
    // the compiler to vectorise both.
    for (c = 0; c < cols; ++c) {
      const float xhat = (xr[c] - mu) * rs;
      dxr[c] = rs * (dyr[c] * gamma[c] - mean_g - xhat * mean_gx);
    }
  }
}

}  // namespace parm::cpu
