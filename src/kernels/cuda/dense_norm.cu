// LayerNorm and the row-wise softmax on the GPU: one group of 16 threads per row, summing in
// the CPU's order (dense_rows.cuh), so that mean, rstd, y, the softmax and their adjoints
// take the CPU kernels' bits where the CPU rounds every operation on its own. The weight
// gradients of layernorm_backward are column sums in a fixed chunked order (not the CPU's
// row-by-row order, which would leave most of the GPU idle).
#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/dense_rows.cuh"
#include "kernels/cuda/dense_scratch.h"
#include "kernels/cuda/dense_checks.h"

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
        mul_rn(group_sum(lane_partial(cols, lane, value), cols, mask, value), inv_count(cols));
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
    auto g = [&](int64_t c) { return mul_rn(dyr[c], gamma[c]); };
    auto gx = [&](int64_t c) { return mul_rn(mul_rn(dyr[c], gamma[c]), xhat(xr[c], mu, rs)); };
    const float mean_g =
        mul_rn(group_sum(lane_partial(cols, lane, g), cols, mask, g), inv_count(cols));
    const float mean_gx =
        mul_rn(group_sum(lane_partial(cols, lane, gx), cols, mask, gx), inv_count(cols));
    __syncwarp(mask);  // dx may alias dy
    for (int64_t c = lane; c < cols; c += kLanes)
      dxr[c] = layernorm_dx(dyr[c], gamma[c], xhat(xr[c], mu, rs), rs, mean_g, mean_gx);
  }
}

// The weight gradients' column sums: partial_gamma / partial_beta (chunks, cols) hold the sums
// of dy xhat and dy over each chunk of kColumnSumChunkRows rows (block y = chunk; each thread
// sums rows y, y + 8, ... of its column in order, then a fixed tree adds the 8 sums).
constexpr int kColTile = 32;
constexpr int kRowThreads = 8;
static_assert(kColTile * kRowThreads == kThreads, "column-sum block size");

__global__ void layernorm_param_partials_kernel(const float* __restrict__ dy,
                                                const float* __restrict__ x,
                                                const float* __restrict__ mean,
                                                const float* __restrict__ rstd,
                                                float* partial_gamma, float* partial_beta,
                                                int64_t rows, int64_t cols) {
  __shared__ float tile_g[kRowThreads][kColTile + 1];
  __shared__ float tile_b[kRowThreads][kColTile + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kColumnSumChunkRows;
  const int64_t r1 = r0 + kColumnSumChunkRows < rows ? r0 + kColumnSumChunkRows : rows;
  float sg = 0.0f, sb = 0.0f;
  if (col < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowThreads) {
      const float d = dy[r * cols + col];
      sg = add_rn(sg, mul_rn(d, xhat(x[r * cols + col], mean[r], rstd[r])));
      sb = add_rn(sb, d);
    }
  tile_g[threadIdx.y][threadIdx.x] = sg;
  tile_b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  for (int s = kRowThreads / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.y) < s) {
      tile_g[threadIdx.y][threadIdx.x] += tile_g[threadIdx.y + s][threadIdx.x];
      tile_b[threadIdx.y][threadIdx.x] += tile_b[threadIdx.y + s][threadIdx.x];
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && col < cols) {
    partial_gamma[static_cast<int64_t>(blockIdx.y) * cols + col] = tile_g[0][threadIdx.x];
    partial_beta[static_cast<int64_t>(blockIdx.y) * cols + col] = tile_b[0][threadIdx.x];
  }
}

// out (cols) += the chunk partials of each column, in chunk order (both outputs at once).
__global__ void column_finish2_kernel(const float* __restrict__ pa, const float* __restrict__ pb,
                                      int64_t chunks, int64_t cols, float* out_a, float* out_b) {
  for (int64_t c = thread_index(); c < cols; c += thread_stride()) {
    float sa = 0.0f, sb = 0.0f;
    for (int64_t j = 0; j < chunks; ++j) {
      sa += pa[j * cols + c];
      sb += pb[j * cols + c];
    }
    out_a[c] += sa;
    out_b[c] += sb;
  }
}

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
  const int64_t chunks = (rows + kColumnSumChunkRows - 1) / kColumnSumChunkRows;
  float* pg = dense::scratch_as<float>(Slot::kPartials, chunks * cols);
  float* pb = dense::scratch_as<float>(Slot::kPartials2, chunks * cols);
  cudaStream_t s = stream();
  // The column sums first: they read dy, which dx may overwrite.
  const dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile),
                  static_cast<unsigned>(chunks));
  layernorm_param_partials_kernel<<<grid, dim3(kColTile, kRowThreads), 0, s>>>(dy, x, mean, rstd,
                                                                               pg, pb, rows, cols);
  PARM_CUDA_CHECK_LAUNCH();
  column_finish2_kernel<<<grid_for(cols), kThreads, 0, s>>>(pg, pb, chunks, cols, dgamma, dbeta);
  PARM_CUDA_CHECK_LAUNCH();
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
