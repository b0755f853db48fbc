// The NCCL backend's kernels: the rank-ordered block sum and the MP interleave.
#include "comm/cuda/nccl_kernels.h"

#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace parm::cuda {
namespace {

constexpr int kThreads = 256;

// One thread per (r, i), grid-stride; the n blocks are added in order q = 0, 1, ..., n-1.
template <typename T>
__global__ void ordered_block_sum_kernel(const T* blocks, size_t block_stride, const T* own,
                                         int own_index, int n, size_t rows, size_t row_stride,
                                         size_t len, T* dst, size_t dst_row_stride) {
  const size_t total = rows * len;
  const size_t step = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t k = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += step) {
    const size_t r = k / len, i = k - r * len;
    const size_t off = r * row_stride + i;
    T acc = own_index == 0 ? own[off] : blocks[off];
    for (int q = 1; q < n; ++q) {
      const T b = q == own_index ? own[off] : blocks[static_cast<size_t>(q) * block_stride + off];
      acc = static_cast<T>(acc + b);  // kU8: int promotion, then wraps mod 256
    }
    dst[r * dst_row_stride + i] = acc;
  }
}

template <typename T>
void launch_sum(const void* blocks, size_t block_stride, const void* own, int own_index, int n,
                size_t rows, size_t row_stride, size_t len, void* dst, size_t dst_row_stride,
                cudaStream_t stream) {
  const long long total = static_cast<long long>(rows * len);
  ordered_block_sum_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
      static_cast<const T*>(blocks), block_stride, static_cast<const T*>(own), own_index, n,
      rows, row_stride, len, static_cast<T*>(dst), dst_row_stride);
  PARM_CUDA_CHECK_LAUNCH();
}

__global__ void mp_interleave_kernel(const float* stage, size_t stage_stride, const float* own,
                                     int own_index, int n, size_t rows, size_t row_stride,
                                     size_t base, size_t len, size_t chunk, float* full) {
  const size_t total = rows * len;
  const size_t step = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t k = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += step) {
    const size_t r = k / len, i = k - r * len;
    const size_t x = r * row_stride + base + i;
    const size_t o = x / chunk, f = x - o * chunk;
    float* dst = full + o * static_cast<size_t>(n) * chunk + f;
    for (int q = 0; q < n; ++q) {
      const float v = q == own_index ? own[x] : stage[static_cast<size_t>(q) * stage_stride + x];
      dst[static_cast<size_t>(q) * chunk] = v;
    }
  }
}

}  // namespace

void ordered_block_sum(DType dtype, const void* blocks, size_t block_stride, const void* own,
                       int own_index, int num_blocks, size_t rows, size_t row_stride,
                       size_t len, void* dst, size_t dst_row_stride, CUstream_st* stream) {
  if (rows == 0 || len == 0 || num_blocks <= 0) return;
  const auto launch = [&](auto element) {  // element: a value of the type to sum
    launch_sum<decltype(element)>(blocks, block_stride, own, own_index, num_blocks, rows,
                                  row_stride, len, dst, dst_row_stride, stream);
  };
  switch (dtype) {
    case DType::kF32: return launch(float{});
    case DType::kF64: return launch(double{});
    case DType::kI32: return launch(int32_t{});
    case DType::kI64: return launch(int64_t{});
    case DType::kU8: return launch(uint8_t{});
  }
}

void mp_interleave(const float* stage, size_t stage_stride, const float* own, int own_index,
                   int n, size_t rows, size_t row_stride, size_t base, size_t len,
                   size_t chunk, float* full, CUstream_st* stream) {
  if (rows == 0 || len == 0 || n <= 0) return;
  const long long total = static_cast<long long>(rows * len);
  mp_interleave_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(
      stage, stage_stride, own, own_index, n, rows, row_stride, base, len, chunk, full);
  PARM_CUDA_CHECK_LAUNCH();
}

}  // namespace parm::cuda
