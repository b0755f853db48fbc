// Deterministic column sums of the dense kernels (private to src/kernels/cuda/dense_*): each
// column summed over fixed chunks of kChunkRows rows (a thread per column and row
// phase adds its rows in order, then a fixed tree adds the phases), then the chunk partials
// in chunk order; no atomics, so the bits depend only on (rows, cols). Up to two sums per
// pass (LayerNorm's dgamma and dbeta).
#pragma once

#include <cstdint>

#include "kernels/cuda/dense_common.cuh"
#include "kernels/cuda/dense_scratch.h"

namespace parm::cuda::dense {

constexpr int64_t kChunkRows = 256;  // rows of one chunk partial
constexpr int kColTile = 32;    // consecutive columns of a block: coalesced rows
constexpr int kRowThreads = 8;  // row phases of a block
static_assert(kColTile * kRowThreads == kThreads, "column-sum block size");
static_assert(kChunkRows % kRowThreads == 0, "column-sum chunk");

// partial[k] (chunks, cols), k < kSums: the sums over each chunk of the values that
// value(r, c, i, v) puts in v[0 .. kSums) for element i = r * cols + c (value may also write
// element i elsewhere: it is called once per element).
template <int kSums, class Value>
__global__ void column_partials_kernel(Value value, float* partial0, float* partial1,
                                       int64_t rows, int64_t cols) {
  __shared__ float tile[kSums][kRowThreads][kColTile + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kChunkRows;
  const int64_t r1 = r0 + kChunkRows < rows ? r0 + kChunkRows : rows;
  float sum[kSums] = {};
  if (col < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowThreads) {
      float v[kSums];
      value(r, col, r * cols + col, v);
#pragma unroll
      for (int k = 0; k < kSums; ++k) sum[k] += v[k];
    }
#pragma unroll
  for (int k = 0; k < kSums; ++k) tile[k][threadIdx.y][threadIdx.x] = sum[k];
  __syncthreads();
  for (int s = kRowThreads / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.y) < s)
#pragma unroll
      for (int k = 0; k < kSums; ++k)
        tile[k][threadIdx.y][threadIdx.x] += tile[k][threadIdx.y + s][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && col < cols) {
    const int64_t at = static_cast<int64_t>(blockIdx.y) * cols + col;
    partial0[at] = tile[0][0][threadIdx.x];
    if constexpr (kSums > 1) partial1[at] = tile[1][0][threadIdx.x];
  }
}

// out0 (cols) += the chunk partials of partial0 in chunk order (and out1 of partial1 when
// kSums is 2).
template <int kSums>
__global__ void column_finish_kernel(const float* __restrict__ partial0,
                                     const float* __restrict__ partial1, int64_t chunks,
                                     int64_t cols, float* out0, float* out1) {
  for (int64_t c = thread_index(); c < cols; c += thread_stride()) {
    float s0 = 0.0f, s1 = 0.0f;
    for (int64_t j = 0; j < chunks; ++j) {
      s0 += partial0[j * cols + c];
      if constexpr (kSums > 1) s1 += partial1[j * cols + c];
    }
    out0[c] += s0;
    if constexpr (kSums > 1) out1[c] += s1;
  }
}

// out0 (and out1) (cols) += the column sums of value's values over (rows, cols), with scratch
// from the workspace slots kPartials (and kPartials2).
template <int kSums, class Value>
void column_sums(Value value, int64_t rows, int64_t cols, float* out0, float* out1) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
  float* p0 = scratch_as<float>(Slot::kPartials, chunks * cols);
  float* p1 = kSums > 1 ? scratch_as<float>(Slot::kPartials2, chunks * cols) : nullptr;
  const dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile),
                  static_cast<unsigned>(chunks));
  cudaStream_t s = stream();
  column_partials_kernel<kSums><<<grid, dim3(kColTile, kRowThreads), 0, s>>>(value, p0, p1, rows,
                                                                              cols);
  PARM_CUDA_CHECK_LAUNCH();
  column_finish_kernel<kSums><<<grid_for(cols), kThreads, 0, s>>>(p0, p1, chunks, cols, out0, out1);
  PARM_CUDA_CHECK_LAUNCH();
}

}  // namespace parm::cuda::dense
