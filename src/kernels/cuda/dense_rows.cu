// Row movement on the GPU: gather_rows, scatter_add_rows and the embedding's forward and
// backward. The scatter-adds are deterministic without atomics: a stable radix sort (CUB) of
// the source rows by destination row, then one block per destination row adds its sources in
// their original order onto the row's old value, the CPU's order (and so its bits, where the
// CPU rounds the product w * src on its own).
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/dense_common.cuh"
#include "kernels/cuda/dense_index_errors.h"
#include "kernels/cuda/dense_kernels.h"
#include "kernels/cuda/dense_math.h"
#include "kernels/cuda/dense_scratch.h"
#include "kernels/cuda/dense_checks.h"

namespace parm::cuda {
namespace {

using namespace dense;

__global__ void gather_rows_kernel(const float* __restrict__ src, int64_t cols,
                                   const int64_t* __restrict__ idx, int64_t n,
                                   float* __restrict__ dst) {
  for (int64_t e = thread_index(); e < n * cols; e += thread_stride()) {
    const int64_t i = e / cols, c = e % cols;
    const int64_t r = idx[i];
    dst[e] = r < 0 ? 0.0f : src[r * cols + c];
  }
}

// keys[i] = destination row of source row i (negative: skipped), values[i] = i. Tokens
// outside [0, limit) become -1.
// key: the token's row in the rows [begin, end) held here, -1 (skipped) outside them.
__global__ void token_keys_kernel(const int32_t* __restrict__ tokens, int64_t n, int64_t begin,
                                  int64_t end, int64_t* __restrict__ keys,
                                  int32_t* __restrict__ values) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    const int64_t t = tokens[i];
    keys[i] = t >= begin && t < end ? t - begin : -1;
    values[i] = static_cast<int32_t>(i);
  }
}
__global__ void iota_kernel(int32_t* __restrict__ values, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) values[i] = static_cast<int32_t>(i);
}

// Block i: when sorted position i starts a run of equal keys k >= 0, dst row k += the source
// rows of the run (in sorted order, which the stable sort keeps as the original order), each
// times scale[source] (scale null: 1).
__global__ void sorted_run_add_kernel(const int64_t* __restrict__ keys,
                                      const int32_t* __restrict__ sources, int64_t n,
                                      const float* __restrict__ src, const float* __restrict__ scale,
                                      int64_t cols, float* __restrict__ dst) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int64_t key = keys[i];
    if (key < 0 || (i > 0 && keys[i - 1] == key)) continue;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      float acc = dst[key * cols + c];
      for (int64_t j = i; j < n && keys[j] == key; ++j) {
        const float s = src[static_cast<int64_t>(sources[j]) * cols + c];
        acc += scale == nullptr ? s : dense_math::mul_nc(scale[sources[j]], s);
      }
      dst[key * cols + c] = acc;
    }
  }
}

// keys (n) and values (n) in the sort slots sorted by key, stably; returns the sorted arrays.
struct Sorted {
  const int64_t* keys;
  const int32_t* values;
};
Sorted sort_by_row(int64_t* keys_in, int32_t* values_in, int64_t n) {
  int64_t* keys_out = keys_in + n;
  int32_t* values_out = values_in + n;
  size_t temp_bytes = 0;
  PARM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, values_in,
                                                  values_out, n, 0, 64, stream()));
  void* temp = scratch(Slot::kSortTemp, temp_bytes);
  PARM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, values_in,
                                                  values_out, n, 0, 64, stream()));
  return {keys_out, values_out};
}

void run_add(const Sorted& s, int64_t n, const float* src, const float* scale, int64_t cols,
             float* dst) {
  const unsigned blocks = static_cast<unsigned>(n < 65535 ? n : 65535);
  sorted_run_add_kernel<<<blocks, kThreads, 0, stream()>>>(s.keys, s.values, n, src, scale, cols,
                                                           dst);
  PARM_CUDA_CHECK_LAUNCH();
}

void check_rows(int64_t n, const char* op) {
  check_sizes(n >= 0 && n <= INT32_MAX, op, "rows", {n}, "0 <= rows < 2^31");
}

__global__ void embedding_forward_kernel(const int32_t* __restrict__ tokens,
                                         const float* __restrict__ wte,
                                         const float* __restrict__ wpe, float* __restrict__ out,
                                         int64_t rows, int64_t seq_len, int64_t model_dim,
                                         int64_t vocab, int64_t vocab_begin, int64_t vocab_end,
                                         unsigned long long* record) {
  for (int64_t e = thread_index(); e < rows * model_dim; e += thread_stride()) {
    const int64_t t = e / model_dim, c = e % model_dim;
    const int32_t tok = tokens[t];
    if (tok < 0 || tok >= vocab) {
      out[e] = 0.0f;
      if (c == 0)
        atomicMin(record, (static_cast<unsigned long long>(t) << 32) | static_cast<uint32_t>(tok));
      continue;
    }
    if (tok < vocab_begin || tok >= vocab_end) {  // another MP rank's row
      out[e] = 0.0f;
      continue;
    }
    out[e] = wte[(tok - vocab_begin) * model_dim + c] + wpe[(t % seq_len) * model_dim + c];
  }
}

// dwpe row l += dout rows b * L + l for b = 0 .. B-1, in order.
__global__ void position_grad_kernel(const float* __restrict__ dout, float* __restrict__ dwpe,
                                     int64_t batch, int64_t seq_len, int64_t model_dim) {
  for (int64_t e = thread_index(); e < seq_len * model_dim; e += thread_stride()) {
    float acc = dwpe[e];
    for (int64_t b = 0; b < batch; ++b) acc += dout[b * seq_len * model_dim + e];
    dwpe[e] = acc;
  }
}

}  // namespace

void gather_rows(const float* src, int64_t cols, const int64_t* idx, int64_t n, float* dst) {
  check_sizes(n >= 0 && cols >= 0, "gather_rows", "n, cols", {n, cols}, "n >= 0, cols >= 0");
  if (n == 0 || cols == 0) return;
  gather_rows_kernel<<<grid_for(n * cols), kThreads, 0, stream()>>>(src, cols, idx, n, dst);
  PARM_CUDA_CHECK_LAUNCH();
}

void scatter_add_rows(const float* src, int64_t cols, const int64_t* idx, const float* scale,
                      int64_t n, float* dst) {
  check_sizes(cols >= 0, "scatter_add_rows", "cols", {cols}, "cols >= 0");
  check_rows(n, "scatter_add_rows");
  if (n == 0 || cols == 0) return;
  int64_t* keys = scratch_as<int64_t>(Slot::kSortKeys, 2 * n);
  int32_t* values = scratch_as<int32_t>(Slot::kSortValues, 2 * n);
  PARM_CUDA_CHECK(cudaMemcpyAsync(keys, idx, static_cast<size_t>(n) * sizeof(int64_t),
                                  cudaMemcpyDeviceToDevice, stream()));
  iota_kernel<<<grid_for(n), kThreads, 0, stream()>>>(values, n);
  PARM_CUDA_CHECK_LAUNCH();
  run_add(sort_by_row(keys, values, n), n, src, scale, cols, dst);
}

void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, float* out,
                       int64_t batch, int64_t seq_len, int64_t model_dim, int64_t vocab,
                       int64_t vocab_begin, int64_t vocab_end) {
  check_sizes(batch >= 0 && seq_len >= 0 && model_dim >= 0 && vocab > 0 && vocab <= INT32_MAX &&
                  vocab_begin >= 0 && vocab_begin <= vocab_end && vocab_end <= vocab,
              "embedding_forward", "B, L, M, V, rows begin, rows end",
              {batch, seq_len, model_dim, vocab, vocab_begin, vocab_end},
              "B, L, M >= 0, 0 < V < 2^31, 0 <= begin <= end <= V");
  const int64_t rows = batch * seq_len;
  check_rows(rows, "embedding_forward");
  note_token_launch(seq_len, vocab);
  if (rows == 0 || model_dim == 0) return;
  unsigned long long* record = index_records() + static_cast<int>(IndexKind::kToken);
  embedding_forward_kernel<<<grid_for(rows * model_dim), kThreads, 0, stream()>>>(
      tokens, wte, wpe, out, rows, seq_len, model_dim, vocab, vocab_begin, vocab_end, record);
  PARM_CUDA_CHECK_LAUNCH();
}

void embedding_backward(const int32_t* tokens, const float* dout, float* dwte, float* dwpe,
                        int64_t batch, int64_t seq_len, int64_t model_dim, int64_t vocab_begin,
                        int64_t vocab_end) {
  check_sizes(batch >= 0 && seq_len >= 0 && model_dim >= 0, "embedding_backward", "B, L, M",
              {batch, seq_len, model_dim}, "B, L, M >= 0");
  const int64_t rows = batch * seq_len;
  check_rows(rows, "embedding_backward");
  if (rows == 0 || model_dim == 0) return;
  int64_t* keys = scratch_as<int64_t>(Slot::kSortKeys, 2 * rows);
  int32_t* values = scratch_as<int32_t>(Slot::kSortValues, 2 * rows);
  // Rows past the last embedding_forward's vocabulary (its bad tokens) are skipped as well.
  const int64_t end = vocab_end < last_token_vocab() ? vocab_end : last_token_vocab();
  token_keys_kernel<<<grid_for(rows), kThreads, 0, stream()>>>(tokens, rows, vocab_begin, end,
                                                               keys, values);
  PARM_CUDA_CHECK_LAUNCH();
  run_add(sort_by_row(keys, values, rows), rows, dout, nullptr, model_dim, dwte);
  position_grad_kernel<<<grid_for(seq_len * model_dim), kThreads, 0, stream()>>>(
      dout, dwpe, batch, seq_len, model_dim);
  PARM_CUDA_CHECK_LAUNCH();
}

}  // namespace parm::cuda
