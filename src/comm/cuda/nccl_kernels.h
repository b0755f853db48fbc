// Kernels of the NCCL backend (nccl_kernels.cu) behind plain C++ declarations: callers need
// no CUDA header. Every pointer is device memory; counts, strides and offsets are in
// elements; the work is queued on `stream` (a cudaStream_t) and nothing waits for it.
#pragma once

#include <cstddef>

#include "parm/comm.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace parm::cuda {

// The ordered block sum of reduce_scatter and the fused combine. For r < rows, i < len:
//   dst[r * dst_row_stride + i] = ((b_0 + b_1) + b_2) + ... + b_{n-1}
//   b_q = own[r * row_stride + i]                          when q == own_index,
//         blocks[q * block_stride + r * row_stride + i]    otherwise,
// group-rank order exactly as the CPU sums (floats added in the element type, no FMA, no
// reassociation), so the result is bit-identical to MpiCommunicator's. `own` may be null
// when own_index is outside [0, n). dst may be `own` itself (each element reads its inputs
// before writing), never a part of `blocks`. Every DType is supported; kU8 wraps mod 256.
void ordered_block_sum(DType dtype, const void* blocks, size_t block_stride, const void* own,
                       int own_index, int num_blocks, size_t rows, size_t row_stride,
                       size_t len, void* dst, size_t dst_row_stride, CUstream_st* stream);

// The interleave of the fused combine's MP AllGather. For r < rows, i < len, q < n, with
// x = r * row_stride + base + i (a position in one rank's combine output, seen as
// (outer, chunk)):
//   full[(x / chunk) * n * chunk + q * chunk + x % chunk] = src_q[x]
//   src_q = own when q == own_index, stage + q * stage_stride otherwise
// (`own` may be null when own_index is outside [0, n): every source is then staged).
// chunk must be > 0 when rows * len > 0. `full` may be `own` itself when n == 1.
void mp_interleave(const float* stage, size_t stage_stride, const float* own, int own_index,
                   int n, size_t rows, size_t row_stride, size_t base, size_t len,
                   size_t chunk, float* full, CUstream_st* stream);

}  // namespace parm::cuda
