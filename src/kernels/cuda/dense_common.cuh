// Launch helpers shared by the dense kernels' .cu files (private to src/kernels/cuda/dense_*).
#pragma once

#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace parm::cuda::dense {

constexpr int kThreads = 256;

__device__ inline int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t thread_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Rows handled at once by a block of the 16-lane row kernels (dense_math.h kLanes): a group
// of 16 consecutive threads per row, sixteen rows per 256-thread block.
constexpr int kRowGroups = kThreads / 16;
// The shuffle mask of the calling thread's group of 16 (its half of the warp).
__device__ inline unsigned group_mask() { return 0xffffu << (threadIdx.x & 16u); }
__device__ inline int group_lane() { return static_cast<int>(threadIdx.x & 15u); }
// The calling thread's group over the grid, and the number of groups (a row loop's stride).
__device__ inline int64_t group_index() { return thread_index() / 16; }
__device__ inline int64_t group_stride() { return thread_stride() / 16; }

// Blocks of a 16-lane row kernel over `rows` rows (a grid-stride loop covers the rest).
inline unsigned row_group_blocks(int64_t rows) { return grid_for(rows, kRowGroups); }

}  // namespace parm::cuda::dense
