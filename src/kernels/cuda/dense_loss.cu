// Cross-entropy fused with the softmax over the vocabulary (model::cross_entropy on the
// device): one block per row folds the row into a running log-sum-exp (dense_math.h), merges
// the threads' pairs in a fixed tree, and writes the row's loss and, when asked, its dlogits
// (in place when dlogits is logits: every read of the row precedes the first write). The
// per-row losses then add up in a fixed order into the device scalar.
#include "kernels/cuda/dense_common.cuh"
#include "kernels/cuda/dense_index_errors.h"
#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/dense_math.h"
#include "kernels/cuda/dense_scratch.h"
#include "kernels/cuda/dense_checks.h"

namespace parm::cuda {
namespace {

using namespace dense;
using dense_math::LogSumExp;

__global__ void cross_entropy_rows_kernel(const float* logits, const int32_t* __restrict__ targets,
                                          float* dlogits, int64_t n, int64_t vocab, float scale,
                                          double* __restrict__ row_loss,
                                          unsigned long long* record) {
  __shared__ float s_max[kThreads];
  __shared__ double s_sum[kThreads];
  const int tid = static_cast<int>(threadIdx.x);
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* x = logits + r * vocab;
    const int32_t y = targets[r];
    if (y < 0 || y >= vocab) {  // the same branch for the whole block
      if (tid == 0) {
        row_loss[r] = 0.0;
        atomicMin(record, (static_cast<unsigned long long>(r) << 32) | static_cast<uint32_t>(y));
      }
      if (dlogits != nullptr)
        for (int64_t c = tid; c < vocab; c += blockDim.x) dlogits[r * vocab + c] = 0.0f;
      continue;
    }
    LogSumExp a;
    for (int64_t c = tid; c < vocab; c += blockDim.x) dense_math::lse_add(a, x[c]);
    s_max[tid] = a.max;
    s_sum[tid] = a.sum;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s /= 2) {
      if (tid < s) {
        const LogSumExp m = dense_math::lse_merge({s_max[tid], s_sum[tid]},
                                                  {s_max[tid + s], s_sum[tid + s]});
        s_max[tid] = m.max;
        s_sum[tid] = m.sum;
      }
      __syncthreads();
    }
    const double log_z = dense_math::lse_value({s_max[0], s_sum[0]});
    const float xy = x[y];
    __syncthreads();  // every read of the row and of the tree is done
    if (tid == 0) row_loss[r] = log_z - static_cast<double>(xy);
    if (dlogits != nullptr) {
      float* d = dlogits + r * vocab;
      for (int64_t c = tid; c < vocab; c += blockDim.x)
        d[c] = dense_math::ce_grad(x[c], log_z, scale, c == y);
    }
  }
}

// *out += the sum of v (n): per-thread sums in thread order, then a fixed tree (one block).
__global__ void sum_doubles_kernel(const double* __restrict__ v, int64_t n, double* out) {
  __shared__ double s[kThreads];
  const int tid = static_cast<int>(threadIdx.x);
  double acc = 0.0;
  for (int64_t i = tid; i < n; i += blockDim.x) acc += v[i];
  s[tid] = acc;
  __syncthreads();
  for (int k = kThreads / 2; k > 0; k /= 2) {
    if (tid < k) s[tid] += s[tid + k];
    __syncthreads();
  }
  if (tid == 0) *out += s[0];
}

// ---- The vocabulary-parallel passes: one block per row, the threads' partial results merged
// in a fixed tree (the same bits on every run).
__global__ void ce_row_max_kernel(const float* __restrict__ logits, int64_t n, int64_t cols,
                                  float* __restrict__ row_max) {
  __shared__ float s[kThreads];
  const int tid = static_cast<int>(threadIdx.x);
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* x = logits + r * cols;
    float m = -INFINITY;
    for (int64_t c = tid; c < cols; c += blockDim.x) m = fmaxf(m, x[c]);
    s[tid] = m;
    __syncthreads();
    for (int k = kThreads / 2; k > 0; k /= 2) {
      if (tid < k) s[tid] = fmaxf(s[tid], s[tid + k]);
      __syncthreads();
    }
    if (tid == 0) row_max[r] = s[0];
    __syncthreads();
  }
}

__global__ void ce_row_sums_kernel(const float* __restrict__ logits,
                                   const float* __restrict__ row_max,
                                   const int32_t* __restrict__ targets, int64_t n, int64_t cols,
                                   double* __restrict__ stats) {
  __shared__ double s[kThreads];
  const int tid = static_cast<int>(threadIdx.x);
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* x = logits + r * cols;
    const float mx = row_max[r];
    double acc = 0.0;
    for (int64_t c = tid; c < cols; c += blockDim.x)
      acc += static_cast<double>(expert_math::exp_f32(x[c] - mx));
    s[tid] = acc;
    __syncthreads();
    for (int k = kThreads / 2; k > 0; k /= 2) {
      if (tid < k) s[tid] += s[tid + k];
      __syncthreads();
    }
    if (tid == 0) {
      const int32_t y = targets[r];
      stats[2 * r] = s[0];
      stats[2 * r + 1] = y >= 0 && y < cols ? static_cast<double>(x[y]) : 0.0;
    }
    __syncthreads();
  }
}

__global__ void ce_finish_kernel(const float* logits, const float* __restrict__ row_max,
                                 const double* __restrict__ stats,
                                 const int32_t* __restrict__ targets, float* dlogits, int64_t n,
                                 int64_t cols, float scale, double* __restrict__ row_loss) {
  const int tid = static_cast<int>(threadIdx.x);
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float mx = row_max[r];
    const double sum = stats[2 * r];
    if (tid == 0) row_loss[r] = ::log(sum) + static_cast<double>(mx) - stats[2 * r + 1];
    if (dlogits == nullptr) continue;
    const float* x = logits + r * cols;
    float* d = dlogits + r * cols;
    const int32_t y = targets[r];
    const float k = static_cast<float>(static_cast<double>(scale) / sum);
    // Each element read, then written, by the same thread: in place is safe.
    for (int64_t c = tid; c < cols; c += blockDim.x) {
      const float g = dense_math::mul_nc(expert_math::exp_f32(x[c] - mx), k);
      d[c] = c == y ? g - scale : g;
    }
  }
}

}  // namespace

void cross_entropy(const float* logits, const int32_t* targets, float* dlogits, int64_t n,
                   int64_t vocab, float scale, double* loss_sum) {
  check_sizes(n >= 0 && n <= INT32_MAX && vocab > 0 && vocab <= INT32_MAX, "cross_entropy",
              "rows, vocabulary", {n, vocab}, "0 <= rows < 2^31, 0 < vocabulary < 2^31");
  note_target_launch(vocab);
  if (n == 0) return;
  double* row_loss = scratch_as<double>(Slot::kRowLoss, n);
  unsigned long long* record = index_records() + static_cast<int>(IndexKind::kTarget);
  const unsigned blocks = static_cast<unsigned>(n < 65535 ? n : 65535);
  cross_entropy_rows_kernel<<<blocks, kThreads, 0, stream()>>>(logits, targets, dlogits, n, vocab,
                                                               scale, row_loss, record);
  PARM_CUDA_CHECK_LAUNCH();
  sum_doubles_kernel<<<1, kThreads, 0, stream()>>>(row_loss, n, loss_sum);
  PARM_CUDA_CHECK_LAUNCH();
}

namespace {

void check_ce_shape(int64_t n, int64_t cols, const char* op) {
  check_sizes(n >= 0 && n <= INT32_MAX && cols > 0 && cols <= INT32_MAX, op, "rows, columns",
              {n, cols}, "0 <= rows < 2^31, 0 < columns < 2^31");
}

unsigned row_blocks(int64_t n) { return static_cast<unsigned>(n < 65535 ? n : 65535); }

}  // namespace

void ce_row_max(const float* logits, int64_t n, int64_t cols, float* row_max) {
  check_ce_shape(n, cols, "ce_row_max");
  if (n == 0) return;
  ce_row_max_kernel<<<row_blocks(n), kThreads, 0, stream()>>>(logits, n, cols, row_max);
  PARM_CUDA_CHECK_LAUNCH();
}

void ce_row_sums(const float* logits, const float* row_max, const int32_t* targets, int64_t n,
                 int64_t cols, double* stats) {
  check_ce_shape(n, cols, "ce_row_sums");
  if (n == 0) return;
  ce_row_sums_kernel<<<row_blocks(n), kThreads, 0, stream()>>>(logits, row_max, targets, n, cols,
                                                               stats);
  PARM_CUDA_CHECK_LAUNCH();
}

void ce_finish(const float* logits, const float* row_max, const double* stats,
               const int32_t* targets, float* dlogits, int64_t n, int64_t cols, float scale,
               double* loss_sum) {
  check_ce_shape(n, cols, "ce_finish");
  if (n == 0) return;
  double* row_loss = scratch_as<double>(Slot::kRowLoss, n);
  ce_finish_kernel<<<row_blocks(n), kThreads, 0, stream()>>>(logits, row_max, stats, targets,
                                                             dlogits, n, cols, scale, row_loss);
  PARM_CUDA_CHECK_LAUNCH();
  sum_doubles_kernel<<<1, kThreads, 0, stream()>>>(row_loss, n, loss_sum);
  PARM_CUDA_CHECK_LAUNCH();
}

}  // namespace parm::cuda
