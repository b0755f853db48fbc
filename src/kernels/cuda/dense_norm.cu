// LayerNorm and the row-wise softmax on the GPU: one group of 16 threads per row, summing in
// the CPU's order (dense_rows.cuh), so that mean, rstd, y, the softmax and their adjoints
// take the CPU kernels' bits where the CPU rounds every operation on its own. The weight
// gradients of layernorm_backward are column sums in a fixed chunked order (not the CPU's
// row-by-row order, which would leave most of the GPU idle; dense_columns.cuh).
#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/dense_rows.cuh"
#include "kernels/cuda/dense_scratch.h"
#include "kernels/cuda/dense_checks.h"
#include "kernels/cuda/dense_columns.cuh"

namespace parm::cuda {
namespace {

using namespace dense;
using namespace dense_math;

__global__ void layernorm_forward_kernel(const float* x, const float* __restrict__ gamma,
                                         const float* __restrict__ beta, float* y, float* mean,
                                         float* rstd, int64_t rows, int64_t cols, float eps) {
  const int lane = group_lane();
  const unsigned mask = group_mask();
  for (int64_t r = group_index(); r < rows; r += group_stride()) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    auto value = [&](int64_t c) { return xr[c]; };
    const float mu =
        mul_nc(group_sum(lane_partial(cols, lane, value), cols, mask, value), inv_count(cols));
    auto square = [&](int64_t c) { return centred_square(xr[c], mu); };
    const float rs = rstd_of(group_sum(lane_partial(cols, lane, square), cols, mask, square), cols,
                             eps);
    __syncwarp(mask);  // y may alias x: every read of the row is done
    for (int64_t c = lane; c < cols; c += kLanes) yr[c] = layernorm_y(xr[c], mu, rs, gamma[c], beta[c]);
    if (lane == 0) {
      mean[r] = mu;
      rstd[r] = rs;
    }
  }
}

__global__ void layernorm_dx_kernel(const float* dy, const float* x, const float* __restrict__ gamma,
                                    const float* __restrict__ mean, const float* __restrict__ rstd,
                                    float* dx, int64_t rows, int64_t cols) {
  const int lane = group_lane();
  const unsigned mask = group_mask();
  for (int64_t r = group_index(); r < rows; r += group_stride()) {
    const float* dyr = dy + r * cols;
    const float* xr = x + r * cols;
    float* dxr = dx + r * cols;
    const float mu = mean[r];
    const float rs = rstd[r];
    auto g = [&](int64_t c) { return mul_nc(dyr[c], gamma[c]); };
    auto gx = [&](int64_t c) { return mul_nc(mul_nc(dyr[c], gamma[c]), xhat(xr[c], mu, rs)); };
    const float mean_g =
        mul_nc(group_sum(lane_partial(cols, lane, g), cols, mask, g), inv_count(cols));
    const float mean_gx =
        mul_nc(group_sum(lane_partial(cols, lane, gx), cols, mask, gx), inv_count(cols));
    __syncwarp(mask);  // dx may alias dy
    for (int64_t c = lane; c < cols; c += kLanes)
      dxr[c] = layernorm_dx(dyr[c], gamma[c], xhat(xr[c], mu, rs), rs, mean_g, mean_gx);
  }
}

// The weight gradients' summands of element i of row r: dy xhat (dgamma) and dy (dbeta).
struct LayerNormParamGrads {
  const float* dy;
  const float* x;
  const float* mean;
  const float* rstd;
  __device__ void operator()(int64_t r, int64_t, int64_t i, float* v) const {
    v[0] = mul_nc(dy[i], xhat(x[i], mean[r], rstd[r]));
    v[1] = dy[i];
  }
};

__global__ void softmax_forward_kernel(const float* x, float* y, int64_t rows, int64_t cols) {
  for (int64_t r = group_index(); r < rows; r += group_stride())
    softmax_row(x + r * cols, y + r * cols, cols, cols, 1.0f);
}

__global__ void softmax_backward_kernel(const float* y, const float* dy, float* dx, int64_t rows,
                                        int64_t cols) {
  for (int64_t r = group_index(); r < rows; r += group_stride())
    softmax_backward_row(y + r * cols, dy + r * cols, dx + r * cols, cols, cols, 1.0f);
}

}  // namespace

void layernorm_forward(const float* x, const float* gamma, const float* beta, float* y,
                       float* mean, float* rstd, int64_t rows, int64_t cols, float eps) {
  check_sizes(rows >= 0 && cols > 0, "layernorm_forward", "rows, cols", {rows, cols},
              "rows >= 0, cols > 0");
  if (rows == 0) return;
  layernorm_forward_kernel<<<row_group_blocks(rows), kThreads, 0, stream()>>>(
      x, gamma, beta, y, mean, rstd, rows, cols, eps);
  PARM_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t rows,
                        int64_t cols) {
  check_sizes(rows >= 0 && cols > 0, "layernorm_backward", "rows, cols", {rows, cols},
              "rows >= 0, cols > 0");
  if (rows == 0) return;
  // The column sums first: they read dy, which dx may overwrite.
  column_sums<2>(LayerNormParamGrads{dy, x, mean, rstd}, rows, cols, dgamma, dbeta);
  cudaStream_t s = stream();
  layernorm_dx_kernel<<<row_group_blocks(rows), kThreads, 0, s>>>(dy, x, gamma, mean, rstd, dx,
                                                                  rows, cols);
  PARM_CUDA_CHECK_LAUNCH();
}

void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols) {
  check_sizes(rows >= 0 && cols >= 0, "softmax_forward", "rows, cols", {rows, cols},
              "rows >= 0, cols >= 0");
  if (rows == 0 || cols == 0) return;
  softmax_forward_kernel<<<row_group_blocks(rows), kThreads, 0, stream()>>>(x, y, rows, cols);
  PARM_CUDA_CHECK_LAUNCH();
}

void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols) {
  check_sizes(rows >= 0 && cols >= 0, "softmax_backward", "rows, cols", {rows, cols},
              "rows >= 0, cols >= 0");
  if (rows == 0 || cols == 0) return;
  softmax_backward_kernel<<<row_group_blocks(rows), kThreads, 0, stream()>>>(y, dy, dx, rows,
                                                                             cols);
  PARM_CUDA_CHECK_LAUNCH();
}

}  // namespace parm::cuda
