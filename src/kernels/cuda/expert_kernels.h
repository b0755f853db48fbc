// CUDA kernels of the MoE experts (and the pointer-array helper of GroupedGemm), behind a
// plain C++ interface: raw row-major device pointers, shapes as (rows, cols), bf16 as
// uint16_t. Every function queues its work on cuda::stream() and returns without waiting.
// The per-element maths (GeLU, its derivative, fp32 -> bf16) is in expert_math.h, shared
// with the CPU unit tests. CUDA builds only; no CUDA headers here.
//
// Column sums are deterministic: each column is summed in a fixed order that depends only on
// (rows, cols) (fixed chunks of rows, a fixed tree inside a chunk, chunks in order), never
// with atomics; they need scratch of column_sum_scratch_floats(rows, cols) floats.
#pragma once

#include <cstdint>

namespace parm::cuda {

// Rows summed by one block of the column-sum kernels (a partial sum per chunk and column).
inline constexpr int64_t kColumnSumChunkRows = 256;
inline int64_t column_sum_scratch_floats(int64_t rows, int64_t cols) {
  return ((rows + kColumnSumChunkRows - 1) / kColumnSumChunkRows) * cols;
}

// act (rows, cols) = gelu(pre + bias (cols)); pre is left as it is (the backward pass
// recomputes pre + bias, as the CPU kernel parm::cpu::bias_gelu). Overwrites act and, when
// act_bf16 is not null, act_bf16 (rows, cols) = bf16(act).
void bias_gelu(const float* pre, const float* bias, float* act, uint16_t* act_bf16, int64_t rows,
               int64_t cols);

// Its adjoint: dpre (rows, cols) = gelu'(pre + bias) * dact (overwrites; may alias dact), and
// dpre_bf16 = bf16(dpre) when not null (overwrites); dbias (cols) += column sums of dpre.
// scratch: column_sum_scratch_floats(rows, cols) floats.
void bias_gelu_backward(const float* pre, const float* bias, const float* dact, float* dpre,
                        uint16_t* dpre_bf16, float* dbias, float* scratch, int64_t rows,
                        int64_t cols);

// y (rows, cols) += bias (cols) on every row.
void add_bias(float* y, const float* bias, int64_t rows, int64_t cols);

// dbias (cols) += column sums of dy (rows, cols). scratch as bias_gelu_backward.
void bias_backward(const float* dy, float* dbias, float* scratch, int64_t rows, int64_t cols);

// y (n) = bf16(x (n)), rounded to nearest even. Overwrites y.
void to_bf16(const float* x, uint16_t* y, int64_t n);

// x[i] = 0.01 * (i mod 97) - 0.48: ordinary magnitudes for timing runs (no zeros or
// denormals that could change a rate). Overwrites x.
void fill_pattern(float* x, int64_t n);

// One contiguous piece of a row gather or scatter: dst[0, copy) = src[0, copy) (and
// dst_bf16[0, copy) = bf16 of it when dst_bf16 is not null), then dst[copy, copy + zero) = 0.
// Counts are in elements.
struct SegmentCopy {
  const float* src = nullptr;
  float* dst = nullptr;
  uint16_t* dst_bf16 = nullptr;
  int64_t copy = 0;
  int64_t zero = 0;
};
// Runs `count` segment copies (their destinations must not overlap each other or any
// source), kMaxSegmentsPerLaunch per kernel launch; the table travels as the kernel's
// argument, so nothing is copied to the device first.
inline constexpr int kMaxSegmentsPerLaunch = 64;
void copy_segments(const SegmentCopy* segments, int64_t count);

// device[i] = host[i] for i < count: the operand-pointer arrays of a grouped cuBLAS call,
// written by a kernel whose arguments carry them (no host buffer to keep alive, no host
// wait), so a later call on the stream may rewrite them.
void store_pointers(const void* const* host, int64_t count, void** device);

}  // namespace parm::cuda
