// The optimizer's device kernels: AdamW over a flat buffer (train::AdamW::step's maths and
// bits, dense_math.h adamw_update) and the sum of squares of the global gradient norm.
#include "kernels/cuda/dense_common.cuh"
#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/dense_math.h"
#include "kernels/cuda/dense_scratch.h"
#include "kernels/cuda/dense_checks.h"

namespace parm::cuda {
namespace {

using namespace dense;

__global__ void adamw_kernel(float* __restrict__ w, const float* __restrict__ g,
                             float* __restrict__ m, float* __restrict__ v, int64_t n,
                             const dense_math::AdamWScalars s) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    float wi = w[i], mi = m[i], vi = v[i];
    dense_math::adamw_update(wi, g[i], mi, vi, s);
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
  }
}

// Blocks of the sum of squares: a function of n only, so the order of the sum is too.
constexpr int64_t kSquareBlocks = 512;
unsigned square_blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < kSquareBlocks ? b : kSquareBlocks);
}

// partial[block] = sum of x[i]^2 (exact products in double) over the block's grid-stride
// elements, each thread in order, then a fixed tree.
__global__ void square_partials_kernel(const float* __restrict__ x, int64_t n,
                                       double* __restrict__ partial) {
  __shared__ double s[kThreads];
  double acc = 0.0;
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    const double xi = x[i];
    acc += xi * xi;
  }
  const int tid = static_cast<int>(threadIdx.x);
  s[tid] = acc;
  __syncthreads();
  for (int k = kThreads / 2; k > 0; k /= 2) {
    if (tid < k) s[tid] += s[tid + k];
    __syncthreads();
  }
  if (tid == 0) partial[blockIdx.x] = s[0];
}

__global__ void add_partials_kernel(const double* __restrict__ partial, int64_t count,
                                    double* out) {
  double acc = 0.0;
  for (int64_t i = 0; i < count; ++i) acc += partial[i];
  *out += acc;
}

}  // namespace

void adamw_step(float* params, const float* grads, float* m, float* v, int64_t n, double lr,
                double beta1, double beta2, double eps, double weight_decay, int64_t step,
                double grad_scale, bool decay) {
  check_sizes(n >= 0 && step >= 1, "adamw_step", "n, step", {n, step},
              "n >= 0, step >= 1 (steps count from 1)");
  if (n == 0) return;
  const dense_math::AdamWScalars s = dense_math::adamw_scalars(lr, beta1, beta2, eps, weight_decay,
                                                               step, grad_scale, decay);
  adamw_kernel<<<grid_for(n), kThreads, 0, stream()>>>(params, grads, m, v, n, s);
  PARM_CUDA_CHECK_LAUNCH();
}

void sum_squares(const float* x, int64_t n, double* out) {
  check_sizes(n >= 0, "sum_squares", "n", {n}, "n >= 0");
  if (n == 0) return;
  const unsigned blocks = square_blocks(n);
  double* partial = scratch_as<double>(Slot::kPartials, blocks);
  square_partials_kernel<<<blocks, kThreads, 0, stream()>>>(x, n, partial);
  PARM_CUDA_CHECK_LAUNCH();
  add_partials_kernel<<<1, 1, 0, stream()>>>(partial, blocks, out);
  PARM_CUDA_CHECK_LAUNCH();
}

}  // namespace parm::cuda
