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

// Device values in fp32 or bf16 (uint16_t, the upper half of an fp32).
struct Values {
  const void* data = nullptr;
  bool bf16 = false;
};
inline Values f32_values(const float* p) { return Values{p, false}; }
inline Values bf16_values(const uint16_t* p) { return Values{p, true}; }

// The local experts' row blocks, for kernels that cover every expert in one launch (a
// launch per kMaxExpertsPerLaunch experts): expert e's filled rows, rows[e] of them with cols
// values each, start at element at[e] of every row buffer the call is given (or e * stride
// when `at` is null: one block per expert); its bias (and bias gradient) is at e * cols. rows
// and at are host memory, read when the call is made; every count fits an int32 and no two
// experts' rows overlap (the callers check).
inline constexpr int64_t kMaxExpertsPerLaunch = 256;
struct ExpertRows {
  const int64_t* rows = nullptr;  // (experts)
  int64_t experts = 0;
  int64_t stride = 0;
  int64_t cols = 0;
  const int64_t* at = nullptr;    // (experts) or null
};
// Scratch floats of the column sums over the experts of `r`: the chunk partials of the
// experts of one launch, each expert's at (its index in the launch) x the largest count.
inline int64_t column_sum_scratch_floats(const ExpertRows& r) {
  int64_t most = 0;
  for (int64_t e = 0; e < r.experts; ++e) most = r.rows[e] > most ? r.rows[e] : most;
  const int64_t launch = r.experts < kMaxExpertsPerLaunch ? r.experts : kMaxExpertsPerLaunch;
  return launch * column_sum_scratch_floats(most, r.cols);
}

// For every expert e and each of its filled rows: act = gelu(pre + bias[e]) (pre fp32 or
// bf16; pre is left as it is: the backward pass recomputes pre + bias, as the CPU kernel
// parm::cpu::bias_gelu). Overwrites act (fp32) and act_bf16 = bf16(act), each when not null.
// Rows past rows[e] are not touched.
void bias_gelu(Values pre, const float* bias, float* act, uint16_t* act_bf16, const ExpertRows& r);

// Its adjoint: dpre = gelu'(pre + bias[e]) * dact over every expert's filled rows (pre and
// dact fp32 or bf16), written to dpre (fp32; may alias an fp32 dact) and dpre_bf16 =
// bf16(dpre), each when not null (overwrites); dbias[e] (cols) += the column sums of the
// fp32 dpre. scratch: column_sum_scratch_floats(r) floats.
void bias_gelu_backward(Values pre, const float* bias, Values dact, float* dpre,
                        uint16_t* dpre_bf16, float* dbias, float* scratch, const ExpertRows& r);

// dbias[e] (cols) += the column sums of dy (fp32) over expert e's filled rows, for every
// expert. scratch as bias_gelu_backward.
void bias_backward(const float* dy, float* dbias, float* scratch, const ExpertRows& r);

// One expert of `rows` rows (the functions above with a single expert; scratch:
// column_sum_scratch_floats(rows, cols) floats).
ExpertRows one_expert(const int64_t* rows, int64_t cols);

// y (n) = bf16(x (n)), rounded to nearest even. Overwrites y.
void to_bf16(const float* x, uint16_t* y, int64_t n);

// x[i] = 0.01 * (i mod 97) - 0.48: ordinary magnitudes for timing runs (no zeros or
// denormals that could change a rate). Overwrites x.
void fill_pattern(float* x, int64_t n);

// One contiguous piece of a row gather or scatter: v[i] = src[i] (or bf16 src_bf16[i] when
// that is not null) + bias[i mod cols] (when bias is not null; the piece starts at a row) for
// i in [0, copy); dst[i] = v[i] and dst_bf16[i] = bf16(v[i]), each when not null; then
// dst[copy, copy + zero) = 0 (when dst is not null). Counts are in elements.
struct SegmentCopy {
  const float* src = nullptr;
  const uint16_t* src_bf16 = nullptr;
  const float* bias = nullptr;
  int64_t cols = 0;
  float* dst = nullptr;
  uint16_t* dst_bf16 = nullptr;
  int64_t copy = 0;
  int64_t zero = 0;
};
// Runs `count` segment copies (their destinations must not overlap each other or any
// source), kMaxSegmentsPerLaunch per kernel launch; the table travels as the kernel's
// argument, so nothing is copied to the device first.
inline constexpr int kMaxSegmentsPerLaunch = 48;
void copy_segments(const SegmentCopy* segments, int64_t count);

// device[i] = host[i] for i < count: the operand-pointer arrays of a grouped cuBLAS call,
// written by a kernel whose arguments carry them (no host buffer to keep alive, no host
// wait), so a later call on the stream may rewrite them.
void store_pointers(const void* const* host, int64_t count, void** device);

}  // namespace parm::cuda
