// The dense kernels that work element by element (bf16 widening, bias, GeLU and its fused
// bias forms) and the bias gradients, deterministic column sums (dense_columns.cuh).
#include "kernels/cuda/dense_columns.cuh"
#include "kernels/cuda/dense_common.cuh"
#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/expert_math.h"

namespace parm::cuda {
namespace {

using dense::kThreads;
using dense::thread_index;
using dense::thread_stride;

__global__ void from_bf16_kernel(const uint16_t* __restrict__ x, float* __restrict__ y,
                                 int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) y[i] = expert_math::bf16_to_f32(x[i]);
}

// pre[i] += bias[i mod cols]; act[i] = gelu(pre[i]).
__global__ void bias_gelu_forward_kernel(float* __restrict__ pre, const float* __restrict__ bias,
                                         float* __restrict__ act, int64_t n, int64_t cols) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    const float p = pre[i] + bias[i % cols];
    pre[i] = p;
    act[i] = expert_math::gelu(p);
  }
}

__global__ void add_bias_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t n,
                                int64_t cols) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) y[i] += bias[i % cols];
}

// act[i] = gelu(x[i] + bias[i mod cols]), x kept.
__global__ void bias_gelu_kernel(const float* __restrict__ x, const float* __restrict__ bias,
                                 float* __restrict__ act, int64_t n, int64_t cols) {
  for (int64_t i = thread_index(); i < n; i += thread_stride())
    act[i] = expert_math::gelu(x[i] + bias[i % cols]);
}

// The bias gradient's summand: dy itself.
struct Identity {
  const float* dy;
  __device__ void operator()(int64_t, int64_t, int64_t i, float* v) const { v[0] = dy[i]; }
};

// bias_gelu_backward's summand, written to dx on the way (dx may alias dact: element i is
// read, then written, by one thread).
struct BiasGeluGrad {
  const float* x;
  const float* bias;
  const float* dact;
  float* dx;
  __device__ void operator()(int64_t, int64_t c, int64_t i, float* v) const {
    const float d = expert_math::gelu_grad(x[i] + bias[c]) * dact[i];
    dx[i] = d;
    v[0] = d;
  }
};

// x may alias y (each element read, then written, by one thread).
__global__ void gelu_forward_kernel(const float* x, float* y, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) y[i] = expert_math::gelu(x[i]);
}

// dy may alias dx.
__global__ void gelu_backward_kernel(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride())
    dx[i] = expert_math::gelu_grad(x[i]) * dy[i];
}

}  // namespace

void from_bf16(const uint16_t* x, float* y, int64_t n) {
  if (n <= 0) return;
  from_bf16_kernel<<<grid_for(n), kThreads, 0, stream()>>>(x, y, n);
  PARM_CUDA_CHECK_LAUNCH();
}

void bias_gelu_forward(float* pre, const float* bias, float* act, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  bias_gelu_forward_kernel<<<grid_for(n), kThreads, 0, stream()>>>(pre, bias, act, n, cols);
  PARM_CUDA_CHECK_LAUNCH();
}

void gelu_forward(const float* x, float* y, int64_t n) {
  if (n <= 0) return;
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, stream()>>>(x, y, n);
  PARM_CUDA_CHECK_LAUNCH();
}

void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) {
  if (n <= 0) return;
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, stream()>>>(x, dy, dx, n);
  PARM_CUDA_CHECK_LAUNCH();
}

// Weak: the experts' kernels of this tree (expert_kernels.cu) may define this same function
// with the same contract; where they do, the linker takes theirs.
__attribute__((weak)) void add_bias(float* y, const float* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  add_bias_kernel<<<grid_for(n), kThreads, 0, stream()>>>(y, bias, n, cols);
  PARM_CUDA_CHECK_LAUNCH();
}

void bias_gelu(const float* x, const float* bias, float* act, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  bias_gelu_kernel<<<grid_for(n), kThreads, 0, stream()>>>(x, bias, act, n, cols);
  PARM_CUDA_CHECK_LAUNCH();
}

void bias_backward(const float* dy, float* dbias, int64_t rows, int64_t cols) {
  dense::column_sums<1>(Identity{dy}, rows, cols, dbias, nullptr);
}

void bias_gelu_backward(const float* x, const float* bias, const float* dact, float* dx,
                        float* dbias, int64_t rows, int64_t cols) {
  dense::column_sums<1>(BiasGeluGrad{x, bias, dact, dx}, rows, cols, dbias, nullptr);
}

}  // namespace parm::cuda
